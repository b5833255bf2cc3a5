//! Row kernels: broadcast elementwise programs, norms, softmax, gather, cache write, argmax.

use rayon::prelude::*;

use super::expr::{Program, Regs, CHUNK};
use super::{val, Buf, CpuError};
use crate::interp::InterpError;
use crate::ir::scalar::round_float;
use crate::ir::{DType, Shape, TensorType};

/// Elements per parallel task below which a kernel runs on one thread.
const GRAIN: usize = 1 << 14;

/// A compiled expression over broadcast operands, written contiguously.
pub struct Elementwise {
    program: Program,
    /// Per operand: strides as if broadcast to the output (0 on broadcast axes).
    strides: Vec<Vec<usize>>,
    dims: Vec<usize>,
}

impl Elementwise {
    pub fn new(program: Program, ins: &[&TensorType], out: &TensorType) -> Elementwise {
        let strides = ins
            .iter()
            .map(|t| t.shape.broadcast_strides(&out.shape))
            .collect();
        Elementwise {
            program,
            strides,
            dims: out.shape.dims().to_vec(),
        }
    }

    pub fn run(&self, args: &[usize], fixed: &[Option<Buf>], bufs: &[Buf], out: &mut Buf) {
        let ins: [Option<&Buf>; crate::ir::expr::MAX_INPUTS] =
            std::array::from_fn(|i| args.get(i).map(|&s| val(fixed, bufs, s)));
        let rank = self.dims.len();
        let last = if rank == 0 {
            1
        } else {
            self.dims[rank - 1].max(1)
        };
        let rows_per_task = (GRAIN / last).max(1);
        let work = |r0: usize, dst_f: Option<&mut [f32]>, dst_i: Option<&mut [i64]>| {
            let mut regs = Regs::new();
            let mut chunk_in = [[0.0f32; CHUNK]; crate::ir::expr::MAX_INPUTS];
            let mut res = [0.0f32; CHUNK];
            let n = dst_f
                .as_ref()
                .map_or_else(|| dst_i.as_ref().map_or(0, |d| d.len()), |d| d.len());
            let (mut dst_f, mut dst_i) = (dst_f, dst_i);
            for (ri, row0) in (0..n).step_by(last).enumerate() {
                let row = r0 + ri;
                // Each operand's offset of this row's first element.
                let mut base = [0usize; crate::ir::expr::MAX_INPUTS];
                let mut rem = row;
                for ax in (0..rank.saturating_sub(1)).rev() {
                    let idx = rem % self.dims[ax];
                    rem /= self.dims[ax];
                    for (b, st) in base.iter_mut().zip(&self.strides) {
                        *b += idx * st[ax];
                    }
                }
                let mut j = 0;
                while j < last {
                    let c = CHUNK.min(last - j);
                    for (i, st) in self.strides.iter().enumerate() {
                        let s = if rank == 0 { 0 } else { st[rank - 1] };
                        let src = ins[i].expect("one buffer per operand");
                        let at = base[i] + j * s;
                        match (src, s) {
                            (Buf::F(v), 1) => chunk_in[i][..c].copy_from_slice(&v[at..at + c]),
                            (Buf::F(v), 0) => chunk_in[i][..c].fill(v[at]),
                            (b, _) => {
                                for (t, x) in chunk_in[i][..c].iter_mut().enumerate() {
                                    *x = b.get(at + t * s);
                                }
                            }
                        }
                    }
                    self.program.eval(&mut regs, &chunk_in, c, &mut res);
                    let o = row0 + j;
                    if let Some(d) = dst_f.as_deref_mut() {
                        d[o..o + c].copy_from_slice(&res[..c]);
                    }
                    if let Some(d) = dst_i.as_deref_mut() {
                        for (x, &r) in d[o..o + c].iter_mut().zip(&res[..c]) {
                            *x = r as i64;
                        }
                    }
                    j += c;
                }
            }
        };
        match out {
            Buf::F(o) => o
                .par_chunks_mut(rows_per_task * last)
                .enumerate()
                .for_each(|(t, d)| work(t * rows_per_task, Some(d), None)),
            Buf::I(o) => o
                .par_chunks_mut(rows_per_task * last)
                .enumerate()
                .for_each(|(t, d)| work(t * rows_per_task, None, Some(d))),
        }
    }
}

/// LayerNorm (with bias) or RMSNorm over rows of `d`; moments in f64 as the interpreter.
#[allow(clippy::too_many_arguments)]
pub fn norm(
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    eps: f64,
    rms: bool,
    d: usize,
    dt: DType,
    out: &mut [f32],
) {
    let d = d.max(1);
    let rows_per_task = (GRAIN / d).max(1);
    out.par_chunks_mut(rows_per_task * d)
        .zip(x.par_chunks(rows_per_task * d))
        .for_each(|(o, x)| {
            for (row, dst) in x.chunks(d).zip(o.chunks_mut(d)) {
                let n = d as f64;
                let mean = if rms { 0.0 } else { sum_f64(row, |v| v) / n };
                let var = sum_f64(row, |v| (v - mean) * (v - mean)) / n;
                let inv = (var + eps).sqrt().recip() as f32;
                let mean = mean as f32;
                match b {
                    Some(b) => {
                        for j in 0..d {
                            dst[j] = round_float(dt, (row[j] - mean) * inv * w[j] + b[j]);
                        }
                    }
                    None => {
                        for j in 0..d {
                            dst[j] = round_float(dt, row[j] * inv * w[j]);
                        }
                    }
                }
            }
        });
}

/// Σ f(x) over `row` in f64, in eight interleaved partial sums so the loop vectorises (one
/// running sum is a chain of dependent adds); f64 keeps the result within f32 rounding of the
/// interpreter's sequential sum.
fn sum_f64(row: &[f32], f: impl Fn(f64) -> f64) -> f64 {
    let mut acc = [0.0f64; 8];
    let chunks = row.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f(f64::from(v));
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for &v in tail {
        s += f(f64::from(v));
    }
    s
}

/// Safe softmax over rows of `d` (a row of −∞ gives zeros).
pub fn softmax(x: &[f32], d: usize, dt: DType, out: &mut [f32]) {
    let d = d.max(1);
    let rows_per_task = (GRAIN / d).max(1);
    out.par_chunks_mut(rows_per_task * d)
        .zip(x.par_chunks(rows_per_task * d))
        .for_each(|(o, x)| {
            for (row, dst) in x.chunks(d).zip(o.chunks_mut(d)) {
                let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                if max == f32::NEG_INFINITY {
                    dst.fill(0.0);
                    continue;
                }
                for (o, &v) in dst.iter_mut().zip(row) {
                    *o = v - max;
                }
                super::fastmath::exp_in_place(dst);
                let sum = sum_f64(dst, |v| v);
                let inv = (1.0 / sum) as f32;
                dst.iter_mut().for_each(|o| *o = round_float(dt, *o * inv));
            }
        });
}

/// Rows of `table` picked by `idx`; an index outside the table is the interpreter's error.
pub fn gather(
    node: &str,
    table: &[f32],
    idx: &[i64],
    row: usize,
    rows: usize,
    out: &mut [f32],
) -> Result<(), CpuError> {
    for (i, &r) in idx.iter().enumerate() {
        let Some(r) = usize::try_from(r).ok().filter(|&r| r < rows) else {
            return Err(InterpError::IndexOutOfRange {
                node: node.to_string(),
                index: r,
                size: rows,
            }
            .into());
        };
        out[i * row..(i + 1) * row].copy_from_slice(&table[r * row..(r + 1) * row]);
    }
    Ok(())
}

/// Index of the largest element along an axis of `len` (inner stride `inner`): ties to the
/// first, the first NaN wins.
pub fn argmax(x: &Buf, len: usize, inner: usize, out: &mut [i64]) {
    let inner = inner.max(1);
    for (r, o) in out.iter_mut().enumerate() {
        let (outer, i) = (r / inner, r % inner);
        let at = |j: usize| x.get((outer * len + j) * inner + i);
        let mut best = 0;
        for j in 1..len {
            let (b, v) = (at(best), at(j));
            if !b.is_nan() && (v.is_nan() || v > b) {
                best = j;
            }
        }
        *o = best as i64;
    }
}

/// Where a cache write's values go in its state: the state is `outer × size × inner` around
/// the axis, the values `outer × len × inner`.
pub struct Window {
    outer: usize,
    size: usize,
    len: usize,
    inner: usize,
}

impl Window {
    /// Elements of the values written.
    pub fn values_len(&self) -> usize {
        self.outer * self.len * self.inner
    }

    pub fn new(state: &Shape, values: &Shape, axis: usize) -> Window {
        let d = state.dims();
        Window {
            outer: d[..axis].iter().product(),
            size: d[axis],
            len: values.dims()[axis],
            inner: d[axis + 1..].iter().product(),
        }
    }

    /// Writes `values` at `start` in place; outside the state is the interpreter's error and
    /// writes nothing.
    pub fn write<T: Copy>(
        &self,
        node: &str,
        state: &mut [T],
        values: &[T],
        start: i64,
    ) -> Result<(), CpuError> {
        let fits = usize::try_from(start)
            .ok()
            .and_then(|s| s.checked_add(self.len))
            .is_some_and(|e| e <= self.size);
        if !fits {
            return Err(InterpError::CacheWriteOutOfRange {
                node: node.to_string(),
                start,
                len: self.len,
                size: self.size,
            }
            .into());
        }
        let s = start as usize;
        let block = self.len * self.inner;
        for o in 0..self.outer {
            let dst = (o * self.size + s) * self.inner;
            state[dst..dst + block].copy_from_slice(&values[o * block..(o + 1) * block]);
        }
        Ok(())
    }
}
