//! ArgMax: one block per row, a fixed merge tree, so the index is the first of the maximum
//! whatever the schedule (deterministic, as the interpreter). A row longer than [`CHUNK`] (an LM
//! head's logits) is split over several blocks whose (value, index) partials the last block to
//! finish merges in split order (`argmax_split.hip`, flash_decode's counter protocol): one block
//! scanning 49152 logits took 32 us on an H100, latency-bound.

use std::collections::HashMap;

use serde::Serialize;

use crate::arch::Target;
use crate::codegen::ctype::ctype;
use crate::codegen::kernel::finish;
use crate::codegen::limits::{int_index, launch, BLOCK_1D};
use crate::codegen::plan::{BufferId, KernelPlan};
use crate::codegen::CodegenError;
use crate::ir::{Graph, NodeId};

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
