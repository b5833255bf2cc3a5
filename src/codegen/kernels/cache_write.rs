//! The in-place cache write. Its result is its state's buffer (aliased in `lower`); the kernel
//! copies the values into the window its `start` operand names. A window outside the state is
//! `InterpError::CacheWriteOutOfRange` on the CPU; on a GPU the kernel writes nothing and
//! reports the start in a status buffer ([`IndexCheck`] with `write_rows`), read after the run,
//! so a bad position is never a silent write past the state. With a folded rope the kernel
//! rotates the values as it writes them, as the rope kernel (`rope.hip`) would have: each thread
//! its element of a pair (c, c + D/2), the angle as `rope_parts.hip` computes it.

use std::collections::HashMap;

use serde::Serialize;

use crate::arch::Target;
use crate::codegen::ctype::{ctype, f64_literal};
use crate::codegen::kernel::finish;
use crate::codegen::limits::launch_1d;
use crate::codegen::plan::{Buffer, BufferId, BufferRole, IndexCheck, KernelPlan};
use crate::codegen::CodegenError;
use crate::ir::{DType, Graph, NodeId, TensorType};

#[derive(Serialize)]
struct Context {
    ctype: &'static str,
    values_shape: String,
    state_shape: String,
    axis: usize,
    /// Elements of the values; threads (at least one, which checks an empty write).
    n: usize,
    threads: usize,
    /// Rows written, the state's rows along the axis, elements per row after the axis.
    len: usize,
    size: usize,
    inner: usize,
    /// The largest valid start, `size - len` (no wrap: inference keeps `len ≤ size`).
    max_start: usize,
    /// A folded rope: its theta (a C double literal) and the values' rows `s` and row length
    /// `d` (`[.., s, d]`, positions `[s]`).
    rope: Option<RopeContext>,
    load_pre: &'static str,
    load_post: &'static str,
    store_pre: &'static str,
    store_post: &'static str,
}

#[derive(Serialize)]
struct RopeContext {
    theta: String,
    /// The inverse frequency of each pair as C double literals (`ir::rope_inv_freq`).
    inv_freq: Vec<String>,
    s: usize,
    d: usize,
    half: usize,
}

/// Appends the kernel of cache write `id` (operands state, values, start, and the positions
/// of a folded rope) and its check.
pub(crate) fn cache_write(
    g: &Graph,
    id: NodeId,
    (axis, rope): (i64, Option<f64>),
    ops: &[NodeId],
    buf: &HashMap<NodeId, BufferId>,
    target: &Target,
    plan: &mut KernelPlan,
) -> Result<(), CodegenError> {
    let name = &g.node(id).name;
    let (state, values) = (g.ty(ops[0]), g.ty(ops[1]));
    let ax = state.shape.axis(axis).expect("checked by inference");
    let dims = state.shape.dims();
    let (size, len) = (dims[ax], values.shape.dims()[ax]);
    let inner: usize = dims[ax + 1..].iter().product();
    let n = values.shape.numel();
    let status = plan.buffers.len();
    plan.buffers.push(Buffer {
        id: status,
        name: name.clone(),
        ty: TensorType::new(DType::I64, vec![2]),
        role: BufferRole::Status,
    });
    plan.checks.push(IndexCheck {
        node: name.clone(),
        table_rows: size,
        status,
        write_rows: Some(len),
    });
    let rope = match rope {
        Some(theta) => {
            let vd = values.shape.dims();
            // Inference holds the values at rank ≥ 2 with an even last axis.
            let (s, d) = (vd[vd.len() - 2], vd[vd.len() - 1]);
            Some(RopeContext {
                theta: f64_literal(theta).ok_or(CodegenError::NonFinite {
                    node: name.clone(),
                    what: "theta",
                    value: theta,
                })?,
                inv_freq: super::rope::inv_freq_literals(theta, d, &[], name)?,
                s: s.max(1),
                d: d.max(2),
                half: (d / 2).max(1),
            })
        }
        None => None,
    };
    let c = ctype(state.dtype);
    let mut args = vec![buf[&ops[1]], buf[&ops[2]]];
    if rope.is_some() {
        args.push(buf[&ops[3]]);
    }
    args.extend([status, buf[&id]]);
    let ctx = Context {
        ctype: c.storage,
        values_shape: values.shape.to_string(),
        state_shape: state.shape.to_string(),
        axis: ax,
        n,
        threads: n.max(1),
        len: len.max(1),
        size,
        inner: inner.max(1),
        // An empty write is rendered with len 1 for the index split (no element reaches it);
        // its bound is still that of its true length.
        max_start: size - len,
        rope,
        load_pre: c.load_pre,
        load_post: c.load_post,
        store_pre: c.store_pre,
        store_post: c.store_post,
    };
    plan.kernels.push(finish(
        "cache_write",
        "cache_write.hip",
        ctx,
        launch_1d(name, target, n.max(1))?,
        args,
        name,
    )?);
    Ok(())
}
