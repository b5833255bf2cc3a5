//! Structural checks shared by the rewrites.

use crate::ir::{BinaryOp, Graph, NodeId, NodeSet, Op, Shape};

/// A rope at a positions operand (offset 0): its (x, positions, theta, factors).
pub(crate) fn rope_at_positions(g: &Graph, id: NodeId) -> Option<(NodeId, NodeId, f64, Vec<f64>)> {
    let Op::Rope {
        theta,
        offset: 0,
        factors,
    } = g.op(id)
    else {
        return None;
    };
    let ops = g.operands(id);
    Some((ops[0], *ops.get(1)?, *theta, factors.clone()))
}

/// For the append forms: whether k's rope (theta, factors, positions operand) rotates as q's
/// (`append`, at `positions`), else the refusal (`rope_params_differ`, `positions_differ`).
pub(crate) fn k_rotates_as_q(
    append: &crate::ir::Append,
    positions: NodeId,
    (k_theta, k_factors, k_pos): (f64, &[f64], NodeId),
) -> Result<(), (&'static str, String)> {
    if !append.rotates_like(k_theta, k_factors) {
        return Err((
            "rope_params_differ",
            format!(
                "q rotates with theta {} and {} factors, k with theta {k_theta} and {} factors",
                append.theta,
                append.factors.len(),
                k_factors.len()
            ),
        ));
    }
    if k_pos != positions {
        return Err((
            "positions_differ",
            "q and k are rotated at different positions operands".into(),
        ));
    }
    Ok(())
}

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

/// The value of a single-value constant as its dtype holds it: an f16 `1/√80` is 0.11181640625,
/// an f32 `-1e39` is −∞. The graph computes with that value, so a fused op must too. Where the
/// dtype holds exactly what f32 makes of the written value (every f32 constant that stays
/// finite), the written value is returned: readers of f64 attributes (the interpreter, kernels)
/// round them to f32, which gives that same number.
pub(crate) fn held_scalar_value(g: &Graph, id: NodeId) -> Option<f64> {
    let dtype = g.ty(id).dtype;
    let v = scalar_value(g, id)?;
    if !dtype.is_float() {
        return Some(v);
    }
    let as_f32 = v as f32;
    let held = dtype.round_f32(as_f32);
    Some(if held == as_f32 && held.is_finite() {
        v
    } else {
        f64::from(held)
    })
}

/// Whether `id` feeds `user` and nothing else (no other operand slot, not a graph output).
pub(crate) fn only_feeds(g: &Graph, id: NodeId, user: NodeId) -> bool {
    g.use_count(id) == 1 && g.consumers(id) == [user]
}

/// The nodes some graph output depends on. Rewrites leave the nodes they bypass in the graph
/// until `dead_code` runs (a recognised softmax leaves its exp, max and sum); a matcher that
/// counted those as consumers would refuse what the live graph allows, and name nodes that feed
/// nothing.
pub(crate) struct Live(NodeSet);

impl Live {
    pub(crate) fn of(g: &Graph) -> Live {
        let mut live = NodeSet::default();
        // A cache write (contiguous or paged) is live even when no output reads it: it gives
        // its state's next value.
        let mut stack: Vec<NodeId> = g.outputs().to_vec();
        stack.extend(
            g.node_ids()
                .filter(|&id| matches!(g.op(id), Op::CacheWrite { .. } | Op::PagedCacheWrite)),
        );
        while let Some(id) = stack.pop() {
            if live.insert(id) {
                stack.extend(g.operands(id));
            }
        }
        Live(live)
    }

    pub(crate) fn contains(&self, id: NodeId) -> bool {
        self.0.contains(&id)
    }

    /// The live consumers of `id` other than `user`.
    pub(crate) fn other_consumers(&self, g: &Graph, id: NodeId, user: NodeId) -> Vec<NodeId> {
        g.consumers(id)
            .into_iter()
            .filter(|&c| c != user && self.contains(c))
            .collect()
    }

    /// [`Graph::use_count`] over the live graph: operand slots of live nodes that read `id`,
    /// plus one per graph output it is.
    pub(crate) fn uses(&self, g: &Graph, id: NodeId) -> usize {
        let slots: usize = g
            .consumers(id)
            .into_iter()
            .filter(|&c| self.contains(c))
            .map(|c| g.operands(c).iter().filter(|&&o| o == id).count())
            .sum();
        slots + g.outputs().iter().filter(|&&o| o == id).count()
    }

    /// [`only_feeds`] over the live graph: `id` is read by one operand slot of `user`, by no
    /// other live node, and is not a graph output.
    pub(crate) fn only_feeds(&self, g: &Graph, id: NodeId, user: NodeId) -> bool {
        self.contains(user) && self.uses(g, id) == 1 && g.consumers(id).contains(&user)
    }
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
