//! Rotary embedding and flash attention, parallel over rows and over (batch, head).

use rayon::prelude::*;

use super::{val, Buf, CpuError, Scratch};
use crate::interp::InterpError;
use crate::ir::scalar::round_float;
use crate::ir::{Attention, DType, MaskKind, Shape, TensorType};

pub struct RopeStep {
    /// `theta^(−2i/D)` per pair, in f64 as the interpreter.
    inv_freq: Vec<f64>,
    offset: i64,
    s: usize,
    d: usize,
}

impl RopeStep {
    pub fn new(
        theta: f64,
        offset: i64,
        factors: &[f64],
        shape: &Shape,
        positions: bool,
    ) -> RopeStep {
        let dims = shape.dims();
        let (s, d) = (dims[dims.len() - 2], dims[dims.len() - 1]);
        RopeStep {
            inv_freq: (0..d / 2)
                .map(|i| {
                    theta.powf(-2.0 * i as f64 / d as f64) / factors.get(i).copied().unwrap_or(1.0)
                })
                .collect(),
            offset: if positions { 0 } else { offset },
            s,
            d,
        }
    }

    pub fn run(&self, x: &[f32], pos: Option<&[i64]>, dt: DType, out: &mut [f32]) {
        let (d, half) = (self.d.max(1), self.d / 2);
        out.par_chunks_mut(d)
            .zip(x.par_chunks(d))
            .enumerate()
            .for_each(|(r, (dst, row))| {
                let p = match pos {
                    Some(p) => p[r % self.s.max(1)] as f64,
                    None => (r % self.s.max(1)) as f64 + self.offset as f64,
                };
                for (i, f) in self.inv_freq.iter().enumerate() {
                    let (sin, cos) = (p * f).sin_cos();
                    let (a, b) = (f64::from(row[i]), f64::from(row[i + half]));
                    dst[i] = round_float(dt, (a * cos - b * sin) as f32);
                    dst[i + half] = round_float(dt, (b * cos + a * sin) as f32);
                }
            });
    }
}

pub struct AttentionStep {
    att: Attention,
    b: usize,
    hq: usize,
    hkv: usize,
    sq: usize,
    sk: usize,
    d: usize,
    dv: usize,
    /// Mask strides as if broadcast to [B, Hq, Sq, Sk].
    mask: Option<[usize; 4]>,
    /// The append form: q is rotated at the positions operand first (into the scratch, after
    /// the per-head rows), then attends over the caches as the cache writes left them.
    rope: Option<RopeStep>,
}

impl AttentionStep {
    pub fn new(att: &Attention, ins: &[&TensorType]) -> AttentionStep {
        let q = ins[0].shape.dims();
        let k = ins[1].shape.dims();
        let dv = ins[2].shape.dims()[3];
        let scores = Shape::new(vec![q[0], q[1], q[2], k[2]]);
        let mask = (att.mask != MaskKind::None).then(|| {
            let m = &ins[3].shape;
            let padded = Shape(
                std::iter::repeat_n(1, 4 - m.rank())
                    .chain(m.dims().iter().copied())
                    .collect(),
            );
            let s = padded.broadcast_strides(&scores);
            [s[0], s[1], s[2], s[3]]
        });
        let rope = att
            .append
            .as_ref()
            .map(|ap| RopeStep::new(ap.theta, 0, &ap.factors, &ins[0].shape, true));
        AttentionStep {
            rope,
            att: att.clone(),
            b: q[0],
            hq: q[1],
            hkv: k[1],
            sq: q[2],
            sk: k[2],
            d: q[3],
            dv,
            mask,
        }
    }

    /// Query rows a (batch, head) task takes at a time: one score row and one accumulator
    /// each when decoding, a block through two products (QKᵀ, then P·V) in a prefill.
    fn rows_per_block(&self) -> usize {
        if self.sq >= BLOCKED_FROM {
            self.sq.min(QUERY_BLOCK)
        } else {
            1
        }
    }

    /// Per (batch, head) task: its block's scores, accumulators and row scales.
    fn task_len(&self) -> usize {
        let r = self.rows_per_block();
        r * (self.sk + self.dv + 1)
    }

    pub fn scratch(&self) -> Scratch {
        Scratch {
            f: vec![0.0; self.b * self.hq * self.task_len() + self.q_len()],
            q: Vec::new(),
        }
    }

    /// Elements of the rotated q kept in the scratch (none without append).
    fn q_len(&self) -> usize {
        if self.rope.is_some() {
            self.b * self.hq * self.sq * self.d
        } else {
            0
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        node: &str,
        args: &[usize],
        fixed: &[Option<Buf>],
        bufs: &[Buf],
        scr: &mut Scratch,
        dt: DType,
        out: &mut [f32],
    ) -> Result<(), CpuError> {
        let (q, k, v) = (
            val(fixed, bufs, args[0]).f(),
            val(fixed, bufs, args[1]).f(),
            val(fixed, bufs, args[2]).f(),
        );
        let mask = self.mask.map(|s| (val(fixed, bufs, args[3]), s));
        let heads_len = scr.f.len() - self.q_len();
        let (heads_scr, q_scr) = scr.f.split_at_mut(heads_len);
        let q = match &self.rope {
            Some(r) => {
                let positions = val(fixed, bufs, args[self.att.base_operands()]).i();
                r.run(q, Some(positions), dt, q_scr);
                &*q_scr
            }
            None => q,
        };
        // Valid keys per batch, checked as the interpreter checks them.
        let kv = if let Some(slot) = self.att.kv_len_slot() {
            let given = val(fixed, bufs, args[slot]).i();
            for b in 0..self.b {
                let v = given[if given.len() == 1 { 0 } else { b }];
                if usize::try_from(v).ok().filter(|&n| n <= self.sk).is_none() {
                    return Err(InterpError::KvLenOutOfRange {
                        node: node.to_string(),
                        kv_len: v,
                        keys: self.sk,
                    }
                    .into());
                }
            }
            Some(given)
        } else {
            None
        };
        if out.is_empty() {
            return Ok(());
        }
        let group = (self.hq / self.hkv.max(1)).max(1);
        let (sq, sk, d, dv) = (self.sq, self.sk, self.d, self.dv);
        let scale = self.att.scale as f32;
        let blocked = self.rows_per_block() > 1;
        let task_len = self.task_len();
        out.par_chunks_mut(sq * dv)
            .zip(heads_scr.par_chunks_mut(task_len))
            .enumerate()
            .for_each(|(bh, (out_bh, tmp))| {
                let (bi, h) = (bh / self.hq, bh % self.hq);
                let kvh = h / group;
                let (valid, offset) = match kv {
                    Some(g) => {
                        let n = g[if g.len() == 1 { 0 } else { bi }] as usize;
                        (n, n as i64 - sq as i64)
                    }
                    None => (sk, self.att.causal_offset),
                };
                let head = Head {
                    q: &q[(bi * self.hq + h) * sq * d..][..sq * d],
                    k: &k[(bi * self.hkv + kvh) * sk * d..][..sk * d],
                    v: &v[(bi * self.hkv + kvh) * sk * dv..][..sk * dv],
                    bi,
                    h,
                    valid,
                    offset,
                };
                if blocked {
                    self.head_blocked(&head, mask.as_ref(), scale, dt, tmp, out_bh);
                } else {
                    self.head_rows(&head, mask.as_ref(), scale, dt, tmp, out_bh);
                }
            });
        Ok(())
    }

    /// Scaled, masked scores of query row `i` (`row[j]` holds q·kⱼ on entry, keys `j <
    /// valid`), exponentiated in place against their maximum; returns their sum, or `None`
    /// when every key is masked (the row's output is zeros).
    fn softmax_row(
        &self,
        head: &Head,
        mask: Option<&(&Buf, [usize; 4])>,
        i: usize,
        row: &mut [f32],
    ) -> Option<f32> {
        // Keys past i + offset are masked by causality: scores from `end` on are −∞.
        let end = if self.att.causal {
            usize::try_from(i as i128 + i128::from(head.offset) + 1)
                .unwrap_or(0)
                .min(row.len())
        } else {
            row.len()
        };
        if let Some((m, ms)) = mask {
            let base = head.bi * ms[0] + head.h * ms[1] + i * ms[2];
            match (m, self.att.mask, ms[3]) {
                // A float mask's row along the keys is one slice (the common padding mask).
                (Buf::F(v), MaskKind::Additive, 1) => row[..end]
                    .iter_mut()
                    .zip(&v[base..base + end])
                    .for_each(|(x, &mv)| *x += mv),
                _ => {
                    for (j, x) in row[..end].iter_mut().enumerate() {
                        let mv = m.get(base + j * ms[3]);
                        match self.att.mask {
                            MaskKind::Additive => *x += mv,
                            MaskKind::Boolean if mv == 0.0 => *x = f32::NEG_INFINITY,
                            MaskKind::Boolean | MaskKind::None => {}
                        }
                    }
                }
            }
        }
        // Keys at or before i + offset − window are out of the sliding window (validation
        // ties a window to causal): −∞ before the maximum, so they weigh exp(−∞) = 0.
        if let (true, Some(w)) = (self.att.causal, self.att.window) {
            let begin = usize::try_from(i as i128 + i128::from(head.offset) + 1 - i128::from(w))
                .unwrap_or(0)
                .min(end);
            row[..begin].fill(f32::NEG_INFINITY);
        }
        row[end..].fill(0.0);
        let row = &mut row[..end];
        let max = row.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
        if max == f32::NEG_INFINITY {
            return None;
        }
        row.iter_mut().for_each(|x| *x -= max);
        super::fastmath::exp_in_place(row);
        Some(row.iter().sum())
    }

    /// One query row at a time (decode: a row or a few): scores by dot products, then the
    /// weighted sum of V's rows.
    fn head_rows(
        &self,
        head: &Head,
        mask: Option<&(&Buf, [usize; 4])>,
        scale: f32,
        dt: DType,
        tmp: &mut [f32],
        out: &mut [f32],
    ) {
        let (d, dv, valid) = (self.d, self.dv, head.valid);
        let (scores, acc) = tmp.split_at_mut(self.sk);
        let acc = &mut acc[..dv];
        for i in 0..self.sq {
            let qi = &head.q[i * d..][..d];
            for (j, s) in scores[..valid].iter_mut().enumerate() {
                *s = dot(qi, &head.k[j * d..][..d]) * scale;
            }
            let oi = &mut out[i * dv..][..dv];
            let Some(sum) = self.softmax_row(head, mask, i, &mut scores[..valid]) else {
                oi.fill(0.0);
                continue;
            };
            acc.fill(0.0);
            for (j, &p) in scores[..valid].iter().enumerate() {
                if p != 0.0 {
                    let vj = &head.v[j * dv..][..dv];
                    acc.iter_mut().zip(vj).for_each(|(a, &x)| *a += p * x);
                }
            }
            let inv = 1.0 / sum;
            oi.iter_mut()
                .zip(acc.iter())
                .for_each(|(o, a)| *o = round_float(dt, a * inv));
        }
    }

    /// Blocks of query rows through two products: S = Q·Kᵀ·scale for the block, the softmax
    /// of each row in place, then P·V — the FLOPs in `matrixmultiply`'s kernels instead of
    /// dot products one key at a time.
    fn head_blocked(
        &self,
        head: &Head,
        mask: Option<&(&Buf, [usize; 4])>,
        scale: f32,
        dt: DType,
        tmp: &mut [f32],
        out: &mut [f32],
    ) {
        let (d, dv, sk, valid) = (self.d, self.dv, self.sk, head.valid);
        let rows = self.rows_per_block();
        let (scores, rest) = tmp.split_at_mut(rows * sk);
        let (acc, sums) = rest.split_at_mut(rows * dv);
        for q0 in (0..self.sq).step_by(rows) {
            let qn = rows.min(self.sq - q0);
            if valid == 0 {
                out[q0 * dv..(q0 + qn) * dv].fill(0.0);
                continue;
            }
            // SAFETY: Q's rows q0..q0+qn (d values each, row stride d) lie in `head.q`; Kᵀ
            // reads K's first `valid` rows (≤ sk) of `head.k` at (1, d); S holds qn rows of
            // `valid` values at row stride sk ≥ valid in `scores` (rows·sk long).
            unsafe {
                matrixmultiply::sgemm(
                    qn,
                    d,
                    valid,
                    scale,
                    head.q.as_ptr().add(q0 * d),
                    d as isize,
                    1,
                    head.k.as_ptr(),
                    1,
                    d as isize,
                    0.0,
                    scores.as_mut_ptr(),
                    sk as isize,
                    1,
                );
            }
            for r in 0..qn {
                let row = &mut scores[r * sk..][..valid];
                sums[r] = match self.softmax_row(head, mask, q0 + r, row) {
                    Some(sum) => 1.0 / sum,
                    None => 0.0, // every key masked: the row's output is zeros
                };
            }
            // SAFETY: P is qn rows of `valid` values at stride sk in `scores`; V's first
            // `valid` rows of dv values lie in `head.v`; the result is qn×dv in `acc`
            // (rows·dv long).
            unsafe {
                matrixmultiply::sgemm(
                    qn,
                    valid,
                    dv,
                    1.0,
                    scores.as_ptr(),
                    sk as isize,
                    1,
                    head.v.as_ptr(),
                    dv as isize,
                    1,
                    0.0,
                    acc.as_mut_ptr(),
                    dv as isize,
                    1,
                );
            }
            for r in 0..qn {
                let inv = sums[r];
                let o = &mut out[(q0 + r) * dv..][..dv];
                for (o, &a) in o.iter_mut().zip(&acc[r * dv..][..dv]) {
                    *o = if inv == 0.0 {
                        0.0
                    } else {
                        round_float(dt, a * inv)
                    };
                }
            }
        }
    }
}

/// Query rows from which a head's rows go through the two products (below, a decode step's
/// row or few, dot products one key at a time cost less than the products' packing).
const BLOCKED_FROM: usize = 8;
/// Query rows of a block: the scores of 128 rows over a 2k context are 1 MiB of scratch per
/// (batch, head); fewer, larger products pay for their packing better.
const QUERY_BLOCK: usize = 128;

/// One (batch, head) task's operands: its Q rows, its K/V head's rows, the valid keys and
/// the causal offset.
struct Head<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    bi: usize,
    h: usize,
    valid: usize,
    offset: i64,
}
/// f32 dot product with 8 independent sums (so it vectorises).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut s = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            s[l] += x[l] * y[l];
        }
    }
    let mut t = (s[0] + s[4]) + (s[1] + s[5]) + ((s[2] + s[6]) + (s[3] + s[7]));
    for (x, y) in ra.iter().zip(rb) {
        t += x * y;
    }
    t
}
