//! Gather (embedding lookup) with its index check in the same kernel. On the CPU an index
//! outside the table is `InterpError::IndexOutOfRange` naming the first such index; on a GPU
//! thread 0 of the gather kernel's first block scans the indices and records the first failing
//! position and the index found there in a status buffer, so the runtime can raise the same
//! error after the run ([`IndexCheck`]). (The check used to be a one-thread kernel of its own:
//! a launch, ~3–6 µs, for a few loads.)

use std::collections::HashMap;

use serde::Serialize;

use crate::arch::Target;
use crate::codegen::ctype::ctype;
use crate::codegen::kernel::finish;
use crate::codegen::limits::launch;
use crate::codegen::plan::{Buffer, BufferId, BufferRole, IndexCheck, KernelPlan};
use crate::codegen::CodegenError;
use crate::ir::{DType, Graph, NodeId, TensorType};

/// The gather's template context.
#[derive(Serialize)]
struct Context {
    ctype: &'static str,
    itype: &'static str,
    /// Elements per table row; the rows one index selects (its row times the indexed axis'
    /// inner rows); result rows; indices; threads of the launch.
    row: usize,
    per_index: usize,
    rows: usize,
    count: usize,
    threads: usize,
    /// Threads per block.
    block: usize,
    /// What an out-of-range index writes: NaN for floats, 0 for integers.
    bad: String,
}

/// Threads per block: 128, the most any decode step's kernel takes, so that a persistent decode
/// kernel (whose blocks are as large as its largest step's) stays at 128 threads. A gather is
/// one load and one store per thread: the block size does not show in its time.
const BLOCK: usize = 128;

/// Appends the gather kernel of node `id`, which checks its indices (none when there are no
/// indices).
pub(crate) fn gather(
    g: &Graph,
    id: NodeId,
    ops: &[NodeId],
    buf: &HashMap<NodeId, BufferId>,
    target: &Target,
    plan: &mut KernelPlan,
) -> Result<(), CodegenError> {
    let name = &g.node(id).name;
    let (table, indices) = (g.ty(ops[0]), g.ty(ops[1]));
    let count = indices.shape.numel();
    if count == 0 {
        return Ok(());
    }
    let rows = table.shape.dims()[0];
    let row: usize = table.shape.dims()[1..].iter().product();
    // One thread per output element, or one per index when rows are empty: every index is
    // checked either way. count × row is the output's element count, checked by inference.
    let per_index = row.max(1);
    let threads = count * per_index;
    let status = plan.buffers.len();
    plan.buffers.push(Buffer {
        id: status,
        name: name.clone(),
        ty: TensorType::new(DType::I64, vec![2]),
        role: BufferRole::Status,
    });
    plan.checks.push(IndexCheck {
        node: name.clone(),
        table_rows: rows,
        status,
        write_rows: None,
    });
    let c = ctype(table.dtype);
    let bad = if table.dtype.is_float() {
        format!("{}NAN{}", c.store_pre, c.store_post)
    } else {
        "0".into()
    };
    let itype = ctype(indices.dtype).storage;
    let ctx = Context {
        ctype: c.storage,
        itype,
        row,
        per_index,
        rows,
        count,
        threads,
        block: BLOCK,
        bad,
    };
    plan.kernels.push(finish(
        "gather",
        "gather.hip",
        ctx,
        launch(name, target, [threads.div_ceil(BLOCK), 1, 1], BLOCK)?,
        vec![buf[&ops[0]], buf[&ops[1]], status, buf[&id]],
        name,
    )?);
    Ok(())
}
