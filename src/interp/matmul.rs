//! Batched matmul with broadcast batch dims, on ndarray's GEMM (matrixmultiply kernels), split
//! over threads by batch and by row blocks.

use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2};
use rayon::prelude::*;

use crate::ir::{try_collect, Shape, Tensor, TensorError, TensorType};

use super::strided::Offsets;

/// Below this many multiply-adds a GEMM is not worth splitting across threads.
const PARALLEL_MIN_FLOPS: usize = 1 << 18;

pub fn matmul(a: &Tensor, b: &Tensor, out: &TensorType) -> Result<Tensor, TensorError> {
    let (ad, bd, od) = (a.shape().dims(), b.shape().dims(), out.shape.dims());
    let (m, k, n) = (ad[ad.len() - 2], ad[ad.len() - 1], bd[bd.len() - 1]);
    let batch_shape = Shape(od[..od.len() - 2].to_vec());
    let a_batch = Shape(ad[..ad.len() - 2].to_vec());
    let b_batch = Shape(bd[..bd.len() - 2].to_vec());
    let batches = batch_shape.numel();
    let a_off = try_collect(batches, Offsets::broadcast(&a_batch, &batch_shape))?;
    let b_off = try_collect(batches, Offsets::broadcast(&b_batch, &batch_shape))?;
    let (av, bv) = (
        a.as_f32().expect("float operands"),
        b.as_f32().expect("float operands"),
    );

    let mut c = try_collect(
        out.shape.numel(),
        std::iter::repeat_n(0.0f32, out.shape.numel()),
    )?;
    if m * n == 0 {
        return Tensor::from_f32(out.dtype, out.shape.clone(), c);
    }
    // Row blocks per batch: enough tasks to keep every thread busy when batches are few.
    let threads = rayon::current_num_threads().max(1);
    let blocks_per_batch = if batches >= threads || m * n * k < PARALLEL_MIN_FLOPS {
        1
    } else {
        threads.div_ceil(batches).min(m)
    };
    let rows_per_block = m.div_ceil(blocks_per_batch);
    c.par_chunks_mut(m * n).enumerate().for_each(|(bi, cb)| {
        let a_mat = &av[a_off[bi] * m * k..][..m * k];
        let b_mat =
            ArrayView2::from_shape((k, n), &bv[b_off[bi] * k * n..][..k * n]).expect("k×n view");
        cb.par_chunks_mut(rows_per_block * n)
            .enumerate()
            .for_each(|(blk, rows)| {
                let r0 = blk * rows_per_block;
                let rcount = rows.len() / n;
                let a_rows = ArrayView2::from_shape((rcount, k), &a_mat[r0 * k..(r0 + rcount) * k])
                    .expect("rows×k view");
                let mut c_rows = ArrayViewMut2::from_shape((rcount, n), rows).expect("rows×n view");
                general_mat_mul(1.0, &a_rows, &b_mat, 0.0, &mut c_rows);
            });
    });
    Tensor::from_f32(out.dtype, out.shape.clone(), c)
}
