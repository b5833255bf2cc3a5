//! The paged KV cache ops (`Op::PagedCacheWrite`, `Op::PagedAttention`), read and written
//! through slots and block tables directly, never gathered into a contiguous cache first, so
//! the tests that compare them with the contiguous ops on gathered data compare two different
//! computations.

use rayon::prelude::*;

use crate::ir::{try_collect, Tensor, TensorType};

use super::InterpError;
use crate::ir::window_visible;

/// `pool` (`[N, Hkv, BS, D]`) with row `(b, s)` of `values` (`[B, Hkv, s, D]`) written at slot
/// `slots[b, s]` (block `slot / BS`, row `slot % BS`) for every head. Negative slots are
/// padding; a slot at or past `N·BS` is an error naming it, and nothing is written.
pub(super) fn paged_cache_write(
    node: &str,
    pool: &Tensor,
    values: &Tensor,
    slots: &Tensor,
) -> Result<Tensor, InterpError> {
    let p = pool.shape().dims();
    let (n_blocks, hkv, bs, d) = (p[0], p[1], p[2], p[3]);
    let v = values.shape().dims();
    let (b, s) = (v[0], v[2]);
    let slots = slots.as_i64().expect("slots are i32 by inference");
    let capacity = n_blocks * bs;
    // Every slot is checked before any row is written: an error leaves no partial write.
    for &slot in slots {
        if slot >= 0 && slot as u64 >= capacity as u64 {
            return Err(InterpError::PagedSlotOutOfRange {
                node: node.to_string(),
                slot,
                slots: capacity,
            });
        }
    }
    let host = |source| InterpError::Host {
        node: node.to_string(),
        source,
    };
    let src = pool.as_f32().expect("pools are float by inference");
    let rows = values.as_f32().expect("values have the pool's dtype");
    let mut out = try_collect(src.len(), src.iter().copied()).map_err(host)?;
    // In (b, s) order, so of two rows naming one slot the later stays.
    for bi in 0..b {
        for si in 0..s {
            let Ok(slot) = usize::try_from(slots[bi * s + si]) else {
                continue;
            };
            let (block, row) = (slot / bs, slot % bs);
            for h in 0..hkv {
                let dst = ((block * hkv + h) * bs + row) * d;
                let from = ((bi * hkv + h) * s + si) * d;
                out[dst..dst + d].copy_from_slice(&rows[from..from + d]);
            }
        }
    }
    Tensor::from_f32(pool.dtype(), pool.shape().clone(), out).map_err(host)
}

/// Attention of q (`[B, Hq, s, D]`) over the keys each sequence's block table names: sequence
/// b's key j is row `j % BS` of block `table[b][j / BS]`, for `j < kv_len[b]`, causal with the
/// queries the last s of those positions, and with a sliding `window` query i sees only keys
/// `j > kv_len[b] − s + i − window` (the blocks wholly before the first row's window are neither
/// read nor checked: a server may have given them back). Scores are f32 values scaled in f32, softmax and the
/// weighted sum in f64, as `attention::flash_attention`; a row that sees no key gives zeros.
pub(super) fn paged_attention(
    node: &str,
    (scale, window): (f64, Option<u32>),
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    (table, kv_len): (&Tensor, &Tensor),
    out: &TensorType,
) -> Result<Tensor, InterpError> {
    let qd = q.shape().dims();
    let (b, hq, sq, d) = (qd[0], qd[1], qd[2], qd[3]);
    let kd = k.shape().dims();
    let (n_blocks, hkv, bs) = (kd[0], kd[1], kd[2]);
    let dv = v.shape().dims()[3];
    let max_blocks = table.shape().dims()[1];
    let table = table.as_i64().expect("the block table is i32 by inference");
    let lens = kv_len.as_i64().expect("kv_len is i32 by inference");
    let keys = max_blocks * bs;
    // Each sequence's length and the blocks it reads are checked before anything is computed.
    let mut valid = Vec::with_capacity(b);
    for (bi, &len) in lens.iter().enumerate() {
        let n = usize::try_from(len)
            .ok()
            .filter(|&n| n <= keys)
            .ok_or_else(|| InterpError::KvLenOutOfRange {
                node: node.to_string(),
                kv_len: len,
                keys,
            })?;
        // The first key any of the s queries sees: the first row's window start.
        let first = window.map_or(0, |w| {
            n.saturating_sub(sq)
                .saturating_add(1)
                .saturating_sub(w as usize)
        });
        let first_block = first / bs.max(1);
        for (slot, &block) in table[bi * max_blocks..][..n.div_ceil(bs.max(1))]
            .iter()
            .enumerate()
            .skip(first_block)
        {
            if usize::try_from(block).map_or(true, |x| x >= n_blocks) {
                return Err(InterpError::PagedBlockOutOfRange {
                    node: node.to_string(),
                    sequence: bi,
                    slot,
                    block,
                    blocks: n_blocks,
                });
            }
        }
        valid.push(n);
    }
    let host = |source| InterpError::Host {
        node: node.to_string(),
        source,
    };
    let n = out.shape.numel();
    let mut o = try_collect(n, std::iter::repeat_n(0.0f32, n)).map_err(host)?;
    if n == 0 {
        return Tensor::from_f32(out.dtype, out.shape.clone(), o).map_err(host);
    }
    let (qv, kv, vv) = (floats(q), floats(k), floats(v));
    // A non-empty result has query heads, so key/value heads too (shape inference).
    let group = hq / hkv;
    o.par_chunks_mut(sq * dv)
        .enumerate()
        .for_each(|(bh, out_bh)| {
            let (bi, h) = (bh / hq, bh % hq);
            let kvh = h / group;
            let len = valid[bi];
            let offset = len as i64 - sq as i64;
            // Where key j's row starts in a pool of row size `width`, through the table.
            let row = |j: usize, width: usize| {
                let block = table[bi * max_blocks + j / bs] as usize;
                ((block * hkv + kvh) * bs + j % bs) * width
            };
            let mut scores = vec![0.0f64; len];
            for i in 0..sq {
                let qi = &qv[((bi * hq + h) * sq + i) * d..][..d];
                let mut max = f64::NEG_INFINITY;
                for (j, sc) in scores.iter_mut().enumerate() {
                    *sc = if window_visible(i, j, offset, window) {
                        let kj = &kv[row(j, d)..][..d];
                        let dot = qi
                            .iter()
                            .zip(kj)
                            .map(|(&a, &c)| f64::from(a) * f64::from(c))
                            .sum::<f64>() as f32;
                        f64::from(dot * scale as f32)
                    } else {
                        f64::NEG_INFINITY
                    };
                    max = max.max(*sc);
                }
                let oi = &mut out_bh[i * dv..][..dv];
                if max == f64::NEG_INFINITY {
                    oi.iter_mut().for_each(|x| *x = 0.0);
                    continue;
                }
                let mut sum = 0.0;
                let mut acc = vec![0.0f64; dv];
                for (j, &sc) in scores.iter().enumerate() {
                    let p = (sc - max).exp();
                    if p == 0.0 {
                        continue;
                    }
                    sum += p;
                    let vj = &vv[row(j, dv)..][..dv];
                    acc.iter_mut()
                        .zip(vj)
                        .for_each(|(a, &x)| *a += p * f64::from(x));
                }
                oi.iter_mut()
                    .zip(&acc)
                    .for_each(|(x, a)| *x = (a / sum) as f32);
            }
        });
    Tensor::from_f32(out.dtype, out.shape.clone(), o).map_err(host)
}

/// This step's rows `[1, H, B·s, D]` (sequence-major) seen per sequence, `[B, H, s, D]`: the
/// append form's q as the base form takes it.
pub(super) fn per_sequence(rows: &Tensor, b: usize) -> Result<Tensor, crate::ir::TensorError> {
    let dims = rows.shape().dims();
    let (h, n, d) = (dims[1], dims[2], dims[3]);
    let s = n.checked_div(b).unwrap_or(0);
    let x = floats(rows);
    let mut out = try_collect(x.len(), std::iter::repeat_n(0.0f32, x.len()))?;
    for bi in 0..b {
        for hi in 0..h {
            for si in 0..s {
                let from = (hi * n + bi * s + si) * d;
                let to = ((bi * h + hi) * s + si) * d;
                out[to..to + d].copy_from_slice(&x[from..from + d]);
            }
        }
    }
    Tensor::from_f32(rows.dtype(), vec![b, h, s, d], out)
}

fn floats(t: &Tensor) -> &[f32] {
    t.as_f32()
        .expect("attention operands are float by inference")
}
