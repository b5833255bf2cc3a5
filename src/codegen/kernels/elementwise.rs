//! Elementwise ops and fused elementwise chains: one thread per result element, each operand
//! read directly (same shape) or through its broadcast offset; the expression is rendered to
//! C by `expr_c` (one row per op).

use std::collections::HashMap;

use serde::Serialize;

use crate::arch::Target;
use crate::codegen::ctype::ctype;
use crate::codegen::expr_c::{describe, render};
use crate::codegen::kernel::finish;
use crate::codegen::limits::launch_1d;
use crate::codegen::plan::{BufferId, Kernel};
use crate::codegen::CodegenError;
use crate::ir::{Expr, Graph, NodeId, Shape, TensorType};

/// One operand as the template reads it.
#[derive(Serialize)]
struct Arg {
    ctype: &'static str,
    vtype: &'static str,
    shape: String,
    load: String,
}

/// One strided axis of the result (innermost first, size-1 axes skipped) with each
/// operand's stride along it.
#[derive(Serialize)]
struct Axis {
    size: usize,
    strides: Vec<usize>,
}

#[derive(Serialize)]
struct Context {
    what: String,
    n: usize,
    out_shape: String,
    out_ctype: &'static str,
    args: Vec<Arg>,
    axes: Vec<Axis>,
    /// Some operand is broadcast (then `axes` give the offsets).
    broadcast: bool,
    lines: Vec<String>,
    store: String,
}

/// Strided axes, innermost first, skipping size-1 axes.
fn axes(shape: &Shape, strides: &[Vec<usize>]) -> Vec<Axis> {
    (0..shape.rank())
        .rev()
        .filter(|&a| shape.dims()[a] > 1)
        .map(|a| Axis {
            size: shape.dims()[a],
            strides: strides.iter().map(|s| s[a]).collect(),
        })
        .collect()
}

/// Loads of operand `k`: direct when its shape is the result's, else through its offset.
fn operand_load(k: usize, t: &TensorType, out: &Shape) -> String {
    let c = ctype(t.dtype);
    let idx = if t.shape == *out {
        "i".to_string()
    } else {
        format!("o{k}")
    };
    format!("{}in{k}[{idx}]{}", c.load_pre, c.load_post)
}

pub(crate) fn kernel(
    g: &Graph,
    id: NodeId,
    expr: &Expr,
    ops: &[NodeId],
    buf: &HashMap<NodeId, BufferId>,
    target: &Target,
) -> Result<Kernel, CodegenError> {
    let name = &g.node(id).name;
    let out = g.ty(id);
    let ins: Vec<TensorType> = ops.iter().map(|&o| g.ty(o).clone()).collect();
    let vars: Vec<String> = (0..ops.len()).map(|k| format!("x{k}")).collect();
    let code = render(expr, &vars, &ins, "t", name)?;
    let oc = ctype(out.dtype);
    let strides: Vec<Vec<usize>> = ins
        .iter()
        .map(|t| {
            if t.shape == out.shape {
                vec![0; out.shape.rank()]
            } else {
                t.shape.broadcast_strides(&out.shape)
            }
        })
        .collect();
    let needs_axes = ins.iter().any(|t| t.shape != out.shape);
    let args: Vec<Arg> = ins
        .iter()
        .enumerate()
        .map(|(k, t)| Arg {
            ctype: ctype(t.dtype).storage,
            vtype: ctype(t.dtype).value,
            shape: t.shape.to_string(),
            load: operand_load(k, t, &out.shape),
        })
        .collect();
    let ctx = Context {
        what: describe(expr),
        n: out.shape.numel(),
        out_shape: out.shape.to_string(),
        out_ctype: oc.storage,
        args,
        axes: if needs_axes {
            axes(&out.shape, &strides)
        } else {
            vec![]
        },
        broadcast: needs_axes,
        lines: code.lines,
        store: format!("{}{}{}", oc.store_pre, code.value, oc.store_post),
    };
    let mut all: Vec<BufferId> = ops.iter().map(|o| buf[o]).collect();
    all.push(buf[&id]);
    let launch = launch_1d(name, target, out.shape.numel())?;
    finish("elementwise", "elementwise.hip", ctx, launch, all, name)
}
