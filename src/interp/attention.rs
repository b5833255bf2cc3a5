//! Attention-shaped ops: FlashAttention, the causal mask and rotary embeddings.

use rayon::prelude::*;

use crate::ir::{
    try_collect, window_visible, Attention, Element, MaskKind, Shape, Tensor, TensorError,
    TensorType,
};

/// Whether key `k` is visible from query `q` under a causal offset: `k ≤ q + offset`, compared
/// exactly (in i128) for every offset, so an offset near the i64 limits neither wraps nor
/// panics.
pub(crate) fn visible(q: usize, k: usize, offset: i64) -> bool {
    // usize positions fit i128; so does their sum with any i64.
    (k as i128) <= (q as i128) + i128::from(offset)
}

pub fn causal_mask(sq: usize, sk: usize, offset: i64) -> Result<Tensor, TensorError> {
    let values =
        (0..sq).flat_map(|q| (0..sk).map(move |k| Element::Int(i64::from(visible(q, k, offset)))));
    Tensor::from_elements(
        crate::ir::DType::Bool,
        Shape::new(vec![sq, sk]),
        sq * sk,
        values,
    )
}

/// `softmax(scale·Q·Kᵀ [+ mask] [causal [window]])·V` per (batch, head), with K/V head
/// `h / (Hq/Hkv)`; a window hides keys `j ≤ i + offset − window` ([`window_visible`]).
/// Softmax and the weighted sum run in f64; a query row with no visible key gives zeros.
/// With `kv_len` (valid keys per batch, checked to be at most Sk), keys from `kv_len[b]` on
/// are never read, and the causal offset is `kv_len[b] − Sq`.
pub fn flash_attention(
    att: &Attention,
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    mask: Option<&Tensor>,
    kv_len: Option<&[usize]>,
    out: &TensorType,
) -> Result<Tensor, TensorError> {
    let [b, hq, sq, d] = dims4(q.shape());
    let [_, hkv, sk, _] = dims4(k.shape());
    let dv = v.shape().dims()[3];
    let (qv, kv, vv) = (floats(q), floats(k), floats(v));

    // Mask strides as if broadcast to [B, Hq, Sq, Sk].
    let scores_shape = Shape::new(vec![b, hq, sq, sk]);
    let mask_view = mask.map(|m| {
        let padded = Shape(
            std::iter::repeat_n(1, 4 - m.shape().rank())
                .chain(m.shape().dims().iter().copied())
                .collect(),
        );
        (m, padded.broadcast_strides(&scores_shape))
    });

    let n = out.shape.numel();
    let mut o = try_collect(n, std::iter::repeat_n(0.0f32, n))?;
    if n == 0 {
        // No queries, heads or value columns: nothing to compute (and no chunks to split).
        return Tensor::from_f32(out.dtype, out.shape.clone(), o);
    }
    // A non-empty result has query heads, so key/value heads too (shape inference).
    let group = hq / hkv;
    o.par_chunks_mut(sq * dv)
        .enumerate()
        .for_each(|(bh, out_bh)| {
            let (bi, h) = (bh / hq, bh % hq);
            let kvh = h / group;
            let q_base = (bi * hq + h) * sq * d;
            let k_base = (bi * hkv + kvh) * sk * d;
            let v_base = (bi * hkv + kvh) * sk * dv;
            // Keys past the valid ones do not exist for this batch: never read, not scored.
            let (valid, offset) = match kv_len {
                Some(lens) => (lens[bi], lens[bi] as i64 - sq as i64),
                None => (sk, att.causal_offset),
            };
            let mut scores = vec![0.0f64; valid];
            for i in 0..sq {
                let qi = &qv[q_base + i * d..][..d];
                let mut max = f64::NEG_INFINITY;
                for (j, s) in scores.iter_mut().enumerate() {
                    let kj = &kv[k_base + j * d..][..d];
                    // Scores are f32 values, scaled and masked in f32 as the unfused graph and
                    // the kernels compute them, so a dtype-min additive mask swamps a score
                    // here exactly as it does there.
                    let dot = qi
                        .iter()
                        .zip(kj)
                        .map(|(&a, &c)| f64::from(a) * f64::from(c))
                        .sum::<f64>() as f32;
                    let mut x = f64::from(dot * att.scale as f32);
                    if let Some((mv, ms)) = &mask_view {
                        let mval = match mv.element(bi * ms[0] + h * ms[1] + i * ms[2] + j * ms[3])
                        {
                            Element::Float(f) => f64::from(f),
                            Element::Int(b) => b as f64,
                        };
                        match att.mask {
                            MaskKind::Additive => x = f64::from(x as f32 + mval as f32),
                            MaskKind::Boolean if mval == 0.0 => x = f64::NEG_INFINITY,
                            MaskKind::Boolean | MaskKind::None => {}
                        }
                    }
                    if att.causal && !window_visible(i, j, offset, att.window) {
                        x = f64::NEG_INFINITY;
                    }
                    *s = x;
                    max = max.max(x);
                }
                let oi = &mut out_bh[i * dv..][..dv];
                if max == f64::NEG_INFINITY {
                    oi.iter_mut().for_each(|x| *x = 0.0);
                    continue;
                }
                let mut sum = 0.0;
                scores.iter_mut().for_each(|s| {
                    *s = (*s - max).exp();
                    sum += *s;
                });
                let mut acc = vec![0.0f64; dv];
                for (j, &p) in scores.iter().enumerate() {
                    if p == 0.0 {
                        continue;
                    }
                    let vj = &vv[v_base + j * dv..][..dv];
                    acc.iter_mut()
                        .zip(vj)
                        .for_each(|(a, &x)| *a += p * f64::from(x));
                }
                oi.iter_mut()
                    .zip(&acc)
                    .for_each(|(x, a)| *x = (a / sum) as f32);
            }
        });
    Tensor::from_f32(out.dtype, out.shape.clone(), o)
}

/// Rotate-half rotary embedding over `[.., S, D]`: pairs `(i, i + D/2)` rotate by
/// `p(s)·theta^(−2i/D)/factors[i]` (no divisor when `factors` is empty), with
/// `p(s) = offset + s`, or `positions[s]` when given.
pub fn rope(
    x: &Tensor,
    theta: f64,
    offset: i64,
    factors: &[f64],
    positions: Option<&Tensor>,
) -> Result<Tensor, TensorError> {
    let positions = positions.map(|p| p.as_i64().expect("positions are i32 by inference"));
    let dims = x.shape().dims();
    let (s, d) = (dims[dims.len() - 2], dims[dims.len() - 1]);
    let half = d / 2;
    let inv_freq = crate::ir::rope_inv_freq(theta, d, factors);
    let src = floats(x);
    let mut out = try_collect(src.len(), std::iter::repeat_n(0.0f32, src.len()))?;
    for (r, (row, dst)) in src
        .chunks(d.max(1))
        .zip(out.chunks_mut(d.max(1)))
        .enumerate()
    {
        let pos = match positions {
            Some(p) => p[r % s.max(1)] as f64,
            None => (r % s.max(1)) as f64 + offset as f64,
        };
        for (i, &inv_freq) in inv_freq.iter().enumerate() {
            let (sin, cos) = (pos * inv_freq).sin_cos();
            let (a, b) = (f64::from(row[i]), f64::from(row[i + half]));
            dst[i] = (a * cos - b * sin) as f32;
            dst[i + half] = (b * cos + a * sin) as f32;
        }
    }
    Tensor::from_f32(x.dtype(), x.shape().clone(), out)
}

fn dims4(s: &Shape) -> [usize; 4] {
    let d = s.dims();
    [d[0], d[1], d[2], d[3]]
}

fn floats(t: &Tensor) -> &[f32] {
    t.as_f32().expect("shape inference requires float operands")
}
