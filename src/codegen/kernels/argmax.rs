//! ArgMax: one block per row, a fixed merge tree, so the index is the first of the maximum
//! whatever the schedule (deterministic, as the interpreter). A row longer than [`CHUNK`] (an LM
//! head's logits) is split over several blocks whose (value, index) partials the last block to
//! finish merges in split order (`argmax_split.hip`, flash_decode's counter protocol): one block
//! scanning 49152 logits took 32 us on an H100, latency-bound. The argmax of a small-M GEMM's one
//! result row (an LM head's) is done by that GEMM's kernel instead ([`gemv_argmax`]).

use std::collections::HashMap;

use serde::Serialize;

use super::gemm::{small_m, Problem};
use crate::arch::Target;
use crate::codegen::ctype::ctype;
use crate::codegen::kernel::finish;
use crate::codegen::limits::{int_index, launch, BLOCK_1D};
use crate::codegen::plan::{BufferId, KernelPlan};
use crate::codegen::CodegenError;
use crate::ir::{Graph, NodeId, Op};

#[derive(Serialize)]
struct Context {
    ctype: &'static str,
    load_pre: &'static str,
    load_post: &'static str,
    /// The reduced axis' length, the elements after it (its stride), the rows (results).
    len: usize,
    inner: usize,
    rows: usize,
    threads: usize,
    /// Blocks per row and the elements each scans (split kernel only).
    splits: usize,
    chunk: usize,
}

/// Elements one block of the split kernel scans: 16 per thread, enough loads in flight per
/// thread to hide a DRAM access, few enough that a 49152-long row makes 12 blocks.
pub(crate) const CHUNK: usize = 16 * BLOCK_1D;

pub(crate) fn argmax(
    g: &Graph,
    id: NodeId,
    axis: i64,
    ops: &[NodeId],
    buf: &HashMap<NodeId, BufferId>,
    target: &Target,
    plan: &mut KernelPlan,
) -> Result<(), CodegenError> {
    let name = &g.node(id).name;
    let x = g.ty(ops[0]);
    let ax = x.shape.axis(axis).expect("checked by inference");
    let dims = x.shape.dims();
    let len = dims[ax];
    // Indices are i32 results and loop counters.
    int_index(name, "the argmax axis length", len)?;
    let rows = g.ty(id).shape.numel();
    let c = ctype(x.dtype);
    let splits = len.div_ceil(CHUNK).max(1);
    let ctx = Context {
        ctype: c.storage,
        load_pre: c.load_pre,
        load_post: c.load_post,
        len,
        inner: dims[ax + 1..].iter().product::<usize>().max(1),
        rows,
        threads: BLOCK_1D,
        splits,
        chunk: CHUNK,
    };
    if splits == 1 {
        let launch = launch(name, target, [rows, 1, 1], BLOCK_1D)?;
        let args = vec![buf[&ops[0]], buf[&id]];
        plan.kernels
            .push(finish("argmax", "argmax.hip", ctx, launch, args, name)?);
        return Ok(());
    }
    // Two f32 per (row, split): the split's value and its index's bits.
    let elems = rows
        .checked_mul(splits)
        .and_then(|x| x.checked_mul(2))
        .ok_or_else(|| CodegenError::Unsupported {
            node: name.clone(),
            reason: "the split argmax's workspace is too large to address".into(),
        })?;
    int_index(name, "the split argmax's workspace", elems)?;
    let launch = launch(name, target, [splits, rows, 1], BLOCK_1D)?;
    let ws = plan.add_workspace(name, elems);
    let counters = plan.add_counters(name, rows);
    let args = vec![buf[&ops[0]], ws, counters, buf[&id]];
    plan.kernels.push(finish(
        "argmax",
        "argmax_split.hip",
        ctx,
        launch,
        args,
        name,
    )?);
    Ok(())
}

/// ArgMax `id` computed by the kernel of the small-M GEMM `src` it reads
/// (`gemm::argmax_fold::argmax_fold` said yes): one launch for the LM head and the token instead of
/// two. The GEMM's kernel is emitted here, at the argmax, in its place (nothing between them
/// reads the GEMM's result: the fold checked it); it still writes the result.
pub(crate) fn gemv_argmax(
    g: &Graph,
    id: NodeId,
    src: NodeId,
    buf: &HashMap<NodeId, BufferId>,
    target: &Target,
    plan: &mut KernelPlan,
) -> Result<(), CodegenError> {
    let name = &g.node(id).name;
    let Op::Gemm(gemm) = &g.node(src).op else {
        return Err(CodegenError::Unsupported {
            node: name.clone(),
            reason: "the argmax fold's operand is not a gemm".into(),
        });
    };
    let p = Problem::new(g, src, gemm)?;
    // Indices are i32 results and loop counters.
    int_index(name, "the argmax axis length", p.n)?;
    let dtype = g.ty(g.operands(src)[0]).dtype;
    let blocks = small_m::blocks(&p, gemm, dtype, target);
    // Two f32 per block: its value and its index's bits.
    let ws = plan.add_workspace(name, 2 * blocks);
    let counters = plan.add_counters(name, 1);
    let mut args: Vec<BufferId> = g.operands(src).iter().map(|o| buf[o]).collect();
    args.extend([buf[&src], ws, counters, buf[&id]]);
    let k = small_m::kernel_with_argmax(
        &p,
        gemm,
        dtype,
        g.ty(src).dtype,
        &g.node(src).name,
        args,
        target,
    )?;
    plan.kernels.push(k);
    Ok(())
}
