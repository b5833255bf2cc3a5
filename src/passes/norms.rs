//! Decomposed LayerNorm and RMSNorm → their ops.
//!
//! Core, over the last axis (axis compared, never a wildcard):
//!   RMSNorm:   x · rsqrt(mean(x², -1, keepdim) + eps)        or  x / sqrt(mean(x²) + eps)
//!   LayerNorm: c · rsqrt(mean(c², -1, keepdim) + eps), c = x − mean(x, -1, keepdim)   (or / sqrt)
//! with x² as pow(x, 2) or x·x and eps a scalar constant; then an optional affine: · w, + b with
//! w, b of shape [D]. Missing w/b become ones/zeros constants. LayerNorm is tried first (its
//! core is also an RMSNorm of c). Must not match: a mean over another axis; an intermediate used
//! outside the pattern; a weight or bias that is not [D].

use super::matchers::{
    binary, either_order, keepdim_reduce, only_feeds, replace_node, scalar_value, single_operand,
};
use super::{Pass, PassReport};
use crate::ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceOp, UnaryOp};

pub struct RecognizeNorms;

impl Pass for RecognizeNorms {
    fn name(&self) -> &'static str {
        "recognize_norms"
    }

    fn run(&self, g: &mut Graph) -> PassReport {
        let mut report = PassReport::new(self.name());
        let Ok(order) = g.topo_order() else {
            return report;
        };
        for id in order {
            if !g.contains(id) {
                continue;
            }
            let Some(core) = inverse_rms(g, id) else {
                continue;
            };
            let name = g.node(id).name.clone();
            let result = match layer_norm_input(g, &core) {
                Some(x) => rewrite(g, id, &core, x, true),
                None => rewrite(g, id, &core, core.numer, false),
            };
            match result {
                Ok(what) => report.rewrote(&name, what),
                Err((code, detail)) => report.skip(&name, code, detail),
            }
        }
        report
    }
}

/// `numer · rsqrt(mean(sq) + eps)` (or `/ sqrt`), where `sq` squares `numer`.
struct Core {
    numer: NodeId,
    eps: f64,
    /// The nodes between the mean and the anchor, which must have no other use.
    chain: Vec<NodeId>,
    mean: NodeId,
    square: NodeId,
    axis: usize,
}

fn square_of(g: &Graph, id: NodeId) -> Option<NodeId> {
    if let Some((x, two)) = binary(g, id, BinaryOp::Pow) {
        return (scalar_value(g, two) == Some(2.0)).then_some(x);
    }
    binary(g, id, BinaryOp::Mul).and_then(|(a, b)| (a == b).then_some(a))
}

/// `add(v, eps)` with eps a scalar constant, either order.
fn plus_eps(g: &Graph, id: NodeId) -> Option<(NodeId, f64)> {
    let pair = binary(g, id, BinaryOp::Add)?;
    either_order(pair, |c| scalar_value(g, c)).map(|(eps, v)| (v, eps))
}

fn inverse_rms(g: &Graph, id: NodeId) -> Option<Core> {
    // numer · rsqrt(...) either order, or numer / sqrt(...).
    let (numer, root, root_op) = if let Some(pair) = binary(g, id, BinaryOp::Mul) {
        let (r, n) = either_order(pair, |c| {
            matches!(g.op(c), Op::Unary(UnaryOp::Rsqrt)).then_some(c)
        })?;
        (n, r, UnaryOp::Rsqrt)
    } else {
        let (n, s) = binary(g, id, BinaryOp::Div)?;
        (n, s, UnaryOp::Sqrt)
    };
    if g.op(root) != &Op::Unary(root_op) {
        return None;
    }
    let add = single_operand(g, root);
    let (mean, eps) = plus_eps(g, add)?;
    let (ReduceOp::Mean, square, axis) = keepdim_reduce(g, mean)? else {
        return None;
    };
    if square_of(g, square)? != numer {
        return None;
    }
    Some(Core {
        numer,
        eps,
        chain: vec![square, mean, add, root],
        mean,
        square,
        axis,
    })
}

/// For a LayerNorm core, the x of `numer = x − mean(x)`.
fn layer_norm_input(g: &Graph, core: &Core) -> Option<NodeId> {
    let (x, mu) = binary(g, core.numer, BinaryOp::Sub)?;
    let (ReduceOp::Mean, mx, axis) = keepdim_reduce(g, mu)? else {
        return None;
    };
    (mx == x && axis == core.axis && only_feeds(g, mu, core.numer)).then_some(x)
}

type Reason = (&'static str, String);

/// A [D] parameter applied to `id` by its only consumer `op` (either operand order).
fn affine(g: &Graph, id: NodeId, op: BinaryOp, d: usize) -> Option<(NodeId, NodeId)> {
    let [user] = g.consumers(id)[..] else {
        return None;
    };
    if g.use_count(id) != 1 {
        return None;
    }
    let pair = binary(g, user, op)?;
    let (_, p) = either_order(pair, |c| (c == id).then_some(()))?;
    (g.ty(p).shape.dims() == [d] && g.ty(p).dtype == g.ty(id).dtype).then_some((user, p))
}

fn rewrite(
    g: &mut Graph,
    anchor: NodeId,
    core: &Core,
    x: NodeId,
    layer: bool,
) -> Result<String, Reason> {
    let xt = g.ty(x).clone();
    let rank = xt.shape.rank();
    if core.axis + 1 != rank {
        return Err((
            "axis_not_last",
            format!("normalises over axis {} of {}", core.axis, xt.shape),
        ));
    }
    // Each link of the chain feeds only the next (the square may read numer twice).
    let links = [core.square, core.mean, core.chain[2], core.chain[3], anchor];
    for w in links.windows(2) {
        if !only_feeds(g, w[0], w[1]) {
            return Err((
                "other_consumers",
                format!("%{} is used outside the norm", g.node(w[0]).name),
            ));
        }
    }
    let numer_uses = g.use_count(core.numer);
    let square_reads = if g.operands(core.square).len() == 2
        && matches!(g.op(core.square), Op::Binary(BinaryOp::Mul))
    {
        2
    } else {
        1
    };
    if layer && numer_uses != square_reads + 1 {
        return Err((
            "other_consumers",
            format!("%{} is used outside the norm", g.node(core.numer).name),
        ));
    }
    let d = xt.shape.dims()[rank - 1];
    let (mut end, mut w, mut b) = (anchor, None, None);
    if let Some((user, p)) = affine(g, end, BinaryOp::Mul, d) {
        end = user;
        w = Some(p);
        if layer {
            if let Some((user, p)) = affine(g, end, BinaryOp::Add, d) {
                end = user;
                b = Some(p);
            }
        }
    }
    if g.ty(end) != &xt {
        return Err((
            "shape_changes",
            format!(
                "the norm's result {} is not the shape of its input {}",
                g.ty(end),
                xt
            ),
        ));
    }
    let dt: DType = xt.dtype;
    let mut param = |v: f64, given: Option<NodeId>| {
        given.unwrap_or_else(|| g.constant(dt, &[d], vec![v]).expect("[D] splat"))
    };
    let (w, b) = (param(1.0, w), param(0.0, b));
    let new = if layer {
        g.layer_norm(x, w, b, core.eps)
    } else {
        g.rms_norm(x, w, core.eps)
    }
    .map_err(|e| ("shape_changes", e.to_string()))?;
    replace_node(g, end, new);
    Ok(format!(
        "{} over the last axis, eps {}",
        if layer { "layer_norm" } else { "rms_norm" },
        core.eps
    ))
}
