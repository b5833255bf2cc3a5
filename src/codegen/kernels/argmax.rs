//! ArgMax: one block per row, a fixed merge tree, so the index is the first of the maximum
//! whatever the schedule (deterministic, as the interpreter).

use std::collections::HashMap;

use serde::Serialize;

use crate::arch::Target;
use crate::codegen::ctype::ctype;
use crate::codegen::kernel::finish;
use crate::codegen::limits::{int_index, launch, BLOCK_1D};
use crate::codegen::plan::{BufferId, Kernel};
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
}

pub(crate) fn argmax(
    g: &Graph,
    id: NodeId,
    axis: i64,
    ops: &[NodeId],
    buf: &HashMap<NodeId, BufferId>,
    target: &Target,
) -> Result<Kernel, CodegenError> {
    let name = &g.node(id).name;
    let x = g.ty(ops[0]);
    let ax = x.shape.axis(axis).expect("checked by inference");
    let dims = x.shape.dims();
    let len = dims[ax];
    // Indices are i32 results and loop counters.
    int_index(name, "the argmax axis length", len)?;
    let rows = g.ty(id).shape.numel();
    let c = ctype(x.dtype);
    let ctx = Context {
        ctype: c.storage,
        load_pre: c.load_pre,
        load_post: c.load_post,
        len,
        inner: dims[ax + 1..].iter().product::<usize>().max(1),
        rows,
        threads: BLOCK_1D,
    };
    let launch = launch(name, target, [rows, 1, 1], BLOCK_1D)?;
    finish(
        "argmax",
        "argmax.hip",
        ctx,
        launch,
        vec![buf[&ops[0]], buf[&id]],
        name,
    )
}
