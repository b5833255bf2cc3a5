//! The baseline matmul for a MatMul the GEMM pass left (the unfused pipeline): contiguous
//! operands with broadcast batch axes, the product stored as it is.

use std::collections::HashMap;

use serde::Serialize;

use crate::arch::Target;
use crate::codegen::ctype::ctype;
use crate::codegen::kernel::finish;
use crate::codegen::limits::{int_index, launch, BLOCK_1D};
use crate::codegen::plan::{BufferId, Kernel};
use crate::codegen::CodegenError;
use crate::ir::{Graph, NodeId, Shape};

/// Output rows and columns per block: 16×16 threads of 4×4 outputs each (`BLOCK_1D` threads).
/// The template reads it from the context, so this is the one place it is written.
pub(crate) const TILE: usize = 64;

/// A batch axis (innermost first, size-1 axes skipped) with its element strides in A and B.
#[derive(Serialize)]
struct BatchAxis {
    size: usize,
    a: usize,
    b: usize,
}

#[derive(Serialize)]
struct Context {
    batch: usize,
    m: usize,
    k: usize,
    n: usize,
    mn: usize,
    tile: usize,
    batch_axes: Vec<BatchAxis>,
    a_t: &'static str,
    b_t: &'static str,
    c_t: &'static str,
    a_load_pre: &'static str,
    a_load_post: &'static str,
    b_load_pre: &'static str,
    b_load_post: &'static str,
    store: String,
}

pub(crate) fn kernel(
    g: &Graph,
    mm: NodeId,
    buf: &HashMap<NodeId, BufferId>,
    target: &Target,
) -> Result<Kernel, CodegenError> {
    let node_name = g.node(mm).name.clone();
    let [a, b] = g.operands(mm)[..] else {
        return Err(CodegenError::Unsupported {
            node: node_name,
            reason: "a matmul takes two operands".into(),
        });
    };
    let (at, bt, ct) = (g.ty(a), g.ty(b), g.ty(mm));
    let (ad, bd, cd) = (at.shape.dims(), bt.shape.dims(), ct.shape.dims());
    let (m, k, n) = (ad[ad.len() - 2], ad[ad.len() - 1], bd[bd.len() - 1]);
    for (what, v) in [
        ("rows (M)", m),
        ("the contraction (K)", k),
        ("columns (N)", n),
    ] {
        int_index(&node_name, what, v)?;
    }
    let batch = Shape(cd[..cd.len() - 2].to_vec());
    let a_b = Shape(ad[..ad.len() - 2].to_vec()).broadcast_strides(&batch);
    let b_b = Shape(bd[..bd.len() - 2].to_vec()).broadcast_strides(&batch);
    let batch_axes: Vec<BatchAxis> = (0..batch.rank())
        .rev()
        .filter(|&i| batch.dims()[i] > 1)
        .map(|i| BatchAxis {
            size: batch.dims()[i],
            a: a_b[i] * m * k,
            b: b_b[i] * k * n,
        })
        .collect();
    let nb = batch.numel();
    let launch = launch(
        &node_name,
        target,
        [n.div_ceil(TILE), m.div_ceil(TILE), nb],
        BLOCK_1D,
    )?;
    let (ac, bc, oc) = (ctype(at.dtype), ctype(bt.dtype), ctype(ct.dtype));
    let ctx = Context {
        batch: nb,
        m,
        k,
        n,
        mn: m * n,
        tile: TILE,
        batch_axes,
        a_t: ac.storage,
        b_t: bc.storage,
        c_t: oc.storage,
        a_load_pre: ac.load_pre,
        a_load_post: ac.load_post,
        b_load_pre: bc.load_pre,
        b_load_post: bc.load_post,
        store: format!("{}acc_v{}", oc.store_pre, oc.store_post),
    };
    let args = vec![buf[&a], buf[&b], buf[&mm]];
    finish("matmul", "matmul.hip", ctx, launch, args, &node_name)
}
