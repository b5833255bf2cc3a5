//! Whether an ArgMax over a one-row GEMM result is computed by the small-M GEMV's tail
//! ([`super::small_m::kernel_with_argmax`]) instead of a kernel of its own: the decode LM head
//! and its token in one launch. Apart from both kernels' files so that neither imports the other.

use super::quant;
use crate::ir::{Graph, NodeId, Op};

/// Why an ArgMax is not folded into the small-M GEMM that computes its operand (the GEMM then
/// has its own kernel and the argmax `argmax_split`'s, as before).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ArgmaxRefusal {
    /// The operand is not a Gemm node.
    NotGemm,
    /// The GEMM reads quantized blocks: its kernel is the quantized GEMV, which has no tail.
    Quantized,
    /// Paired columns (a GLU): the result columns are combined in pairs.
    Paired,
    /// The argmax reduces more than the GEMM's one result row (batch · M > 1, or its axis is
    /// not the whole result).
    Rows,
    /// The result's column n is not stored at offset n (a transposed or scattered view).
    Layout,
    /// Another node reads the GEMM's result: it would be computed after that reader.
    OtherReader,
}

/// Whether ArgMax `id` (over `axis`) is computed by the kernel of the GEMM it reads (see
/// [`kernel_with_argmax`]); that GEMM, or why not. Graph outputs do not count as readers: the
/// fused kernel still writes the result (the logits a caller asks for).
pub(crate) fn argmax_fold(g: &Graph, id: NodeId, axis: i64) -> Result<NodeId, ArgmaxRefusal> {
    let src = g.operands(id)[0];
    let Op::Gemm(gemm) = &g.node(src).op else {
        return Err(ArgmaxRefusal::NotGemm);
    };
    if quant::reads_blocks(g, src, gemm).is_some() {
        return Err(ArgmaxRefusal::Quantized);
    }
    if gemm.paired {
        return Err(ArgmaxRefusal::Paired);
    }
    let ty = g.ty(src);
    let n: usize = gemm.dims.n.iter().product();
    let rows = gemm
        .dims
        .batch
        .iter()
        .chain(&gemm.dims.m)
        .product::<usize>();
    let len = ty.shape.axis(axis).map(|a| ty.shape.dims()[a]);
    if rows != 1 || len != Some(n) || ty.shape.numel() != n || n == 0 {
        return Err(ArgmaxRefusal::Rows);
    }
    // Row-major over N's sub-axes (size-1 sub-axes move nothing).
    let mut expect = 1;
    for (size, stride) in gemm.dims.n.iter().zip(&gemm.out.cols).rev() {
        if *size > 1 && *stride != expect {
            return Err(ArgmaxRefusal::Layout);
        }
        expect *= size;
    }
    if g.consumers(src).iter().any(|&c| c != id) {
        return Err(ArgmaxRefusal::OtherReader);
    }
    Ok(src)
}
