//! Structural checks shared by the rewrites.

use crate::ir::{BinaryOp, Graph, NodeId, Op, Shape};

/// The value of a constant holding a single value (a scalar, or a splat of any shape).
pub(crate) fn splat_value(g: &Graph, id: NodeId) -> Option<f64> {
    match g.op(id) {
        Op::Constant { values, .. } if values.len() == 1 => Some(values[0]),
        Op::Constant { values, .. }
            if !values.is_empty() && values.iter().all(|v| v.to_bits() == values[0].to_bits()) =>
        {
            Some(values[0])
        }
        _ => None,
    }
}

/// The value of a constant with exactly one element (shape `[]`, `[1]`, `[1, 1]`, …): a scalar
/// that broadcasting cannot make change a result's shape.
pub(crate) fn scalar_value(g: &Graph, id: NodeId) -> Option<f64> {
    (g.ty(id).shape.numel() == 1)
        .then(|| splat_value(g, id))
        .flatten()
}

/// Whether `id` feeds `user` and nothing else (no other operand slot, not a graph output).
pub(crate) fn only_feeds(g: &Graph, id: NodeId, user: NodeId) -> bool {
    g.use_count(id) == 1 && g.consumers(id) == [user]
}

/// The operands of `id` when it is the binary op `op`.
pub(crate) fn binary(g: &Graph, id: NodeId, op: BinaryOp) -> Option<(NodeId, NodeId)> {
    match g.op(id) {
        Op::Binary(b) if *b == op => {
            let o = g.operands(id);
            Some((o[0], o[1]))
        }
        _ => None,
    }
}

/// For a commutative op: the operand pair with the one satisfying `first` first.
pub(crate) fn either_order<T>(
    pair: (NodeId, NodeId),
    mut first: impl FnMut(NodeId) -> Option<T>,
) -> Option<(T, NodeId)> {
    if let Some(t) = first(pair.0) {
        return Some((t, pair.1));
    }
    first(pair.1).map(|t| (t, pair.0))
}

pub(crate) fn single_operand(g: &Graph, id: NodeId) -> NodeId {
    g.operands(id)[0]
}

/// Whether two floats agree to a relative 1e-6 (constants written in decimal by hand).
pub(crate) fn approx(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * b.abs().max(1e-30)
}

/// Points every use of `old` at `new` and removes `old`. When `old` was a graph output, `new`
/// takes its name (unless `new` is an input or weight, whose names bind data, or already an
/// output), so a graph's outputs keep their names through rewrites.
pub(crate) fn replace_node(g: &mut Graph, old: NodeId, new: NodeId) {
    let name = g.node(old).name.clone();
    let takes_name = g.is_output(old)
        && !g.is_output(new)
        && !matches!(g.op(new), Op::Input { .. } | Op::Weight { .. });
    g.replace_all_uses(old, new)
        .expect("rewrites preserve the node's type");
    g.remove_node(old);
    if takes_name {
        g.rename(new, &name).expect("the old name was just freed");
    }
}

/// Normalised axis of a softmax/reduction over `shape`.
pub(crate) fn norm_axis(axis: i64, shape: &Shape) -> Option<usize> {
    shape.axis(axis)
}

/// For a single-axis reduction with keepdim: its op, input and axis.
pub(crate) fn keepdim_reduce(
    g: &Graph,
    id: NodeId,
) -> Option<(crate::ir::ReduceOp, NodeId, usize)> {
    match g.op(id) {
        Op::Reduce {
            op,
            axes,
            keepdim: true,
        } if axes.len() == 1 => {
            let x = single_operand(g, id);
            let ax = norm_axis(axes[0], &g.ty(x).shape)?;
            Some((*op, x, ax))
        }
        _ => None,
    }
}
