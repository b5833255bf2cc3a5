//! Reductions and normalisations. Sums accumulate in f64 so the interpreter stays a tighter
//! reference than any f32 kernel it checks. Over an empty axis, as PyTorch: a sum is 0, a mean
//! NaN (0/0) and a max −∞.

use crate::ir::{try_collect, ReduceOp, Tensor, TensorError, TensorType};

use super::layout::keepdim_shape;
use super::strided::Offsets;

fn floats(t: &Tensor) -> &[f32] {
    t.as_f32().expect("shape inference requires float operands")
}

pub fn reduce(
    op: ReduceOp,
    x: &Tensor,
    axes: &[usize],
    out: &TensorType,
) -> Result<Tensor, TensorError> {
    let kept = keepdim_shape(x.shape(), axes);
    let n_out = kept.numel();
    let dst = Offsets::new(x.shape().dims(), &kept.broadcast_strides(x.shape()), 0);
    let count: usize = axes.iter().map(|&a| x.shape().dims()[a]).product();
    let init = match op {
        ReduceOp::Sum | ReduceOp::Mean => 0.0,
        ReduceOp::Max => f64::NEG_INFINITY,
    };
    let mut acc = try_collect(n_out, std::iter::repeat_n(init, n_out))?;
    for (&v, o) in floats(x).iter().zip(dst) {
        let v = f64::from(v);
        match op {
            ReduceOp::Sum | ReduceOp::Mean => acc[o] += v,
            ReduceOp::Max => {
                acc[o] = if v.is_nan() || acc[o].is_nan() {
                    f64::NAN
                } else {
                    acc[o].max(v)
                }
            }
        }
    }
    if op == ReduceOp::Mean {
        // An empty axis gives 0/0 = NaN, as torch.mean.
        let c = count as f64;
        acc.iter_mut().for_each(|a| *a /= c);
    }
    let values = try_collect(n_out, acc.iter().map(|&a| a as f32))?;
    Tensor::from_f32(out.dtype, out.shape.clone(), values)
}

/// Safe softmax along `axis`: a row whose inputs are all −∞ gives zeros.
pub fn softmax(x: &Tensor, axis: usize) -> Result<Tensor, TensorError> {
    let dims = x.shape().dims();
    let len = dims[axis];
    let inner: usize = dims[axis + 1..].iter().product();
    let outer: usize = dims[..axis].iter().product();
    let src = floats(x);
    let mut out = try_collect(src.len(), std::iter::repeat_n(0.0f32, src.len()))?;
    let mut row = try_collect(len, std::iter::repeat_n(0.0f64, len))?;
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| o * len * inner + j * inner + i;
            let max = (0..len)
                .map(|j| f64::from(src[at(j)]))
                .fold(f64::NEG_INFINITY, f64::max);
            if max == f64::NEG_INFINITY {
                continue; // fully masked row: zeros
            }
            let mut sum = 0.0;
            for (j, r) in row.iter_mut().enumerate() {
                *r = (f64::from(src[at(j)]) - max).exp();
                sum += *r;
            }
            for (j, r) in row.iter().enumerate() {
                out[at(j)] = (r / sum) as f32;
            }
        }
    }
    Tensor::from_f32(x.dtype(), x.shape().clone(), out)
}

/// LayerNorm (with bias) or RMSNorm (bias `None`) over the last axis.
pub fn norm(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    eps: f64,
    rms: bool,
) -> Result<Tensor, TensorError> {
    let d = *x
        .shape()
        .dims()
        .last()
        .expect("normalisation needs an axis");
    let (w, b) = (floats(weight), bias.map(floats));
    let src = floats(x);
    let mut out = try_collect(src.len(), std::iter::repeat_n(0.0f32, src.len()))?;
    for (row, dst) in src.chunks(d.max(1)).zip(out.chunks_mut(d.max(1))) {
        let n = d as f64;
        let mean = if rms {
            0.0
        } else {
            row.iter().map(|&v| f64::from(v)).sum::<f64>() / n
        };
        let var = row
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / n;
        let inv = (var + eps).sqrt().recip();
        for j in 0..d {
            let shifted = (f64::from(row[j]) - mean) * inv * f64::from(w[j]);
            dst[j] = (shifted + b.map_or(0.0, |b| f64::from(b[j]))) as f32;
        }
    }
    Tensor::from_f32(x.dtype(), x.shape().clone(), out)
}

/// Index of the largest element along `axis` (i32). Ties go to the first index; a NaN is
/// larger than every number, so the first NaN wins (torch.argmax's rule).
pub fn argmax(x: &Tensor, axis: usize, out: &TensorType) -> Result<Tensor, TensorError> {
    let dims = x.shape().dims();
    let len = dims[axis];
    let inner: usize = dims[axis + 1..].iter().product();
    let src = floats(x);
    let n = out.shape.numel();
    let values = (0..n).map(|r| {
        let (o, i) = (r / inner.max(1), r % inner.max(1));
        let at = |j: usize| src[(o * len + j) * inner + i];
        let mut best = 0;
        for j in 1..len {
            let (b, v) = (at(best), at(j));
            if !b.is_nan() && (v.is_nan() || v > b) {
                best = j;
            }
        }
        crate::ir::Element::Int(best as i64)
    });
    Tensor::from_elements(out.dtype, out.shape.clone(), n, values)
}
