//! Decomposed softmax → Softmax.
//!
//! Matches, over one axis `a` (attributes compared, never wildcards):
//!   e = exp(x − reduce_max(x, [a], keepdim))   or   e = exp(x)
//!   div(e, reduce_sum(e, [a], keepdim))
//! Must not match: max and sum over different axes; reductions without keepdim (they would
//! broadcast against the wrong axis); an intermediate (the exp, the max, the sum, the shift)
//! used outside the pattern (by a live node: nodes an earlier rewrite left dead do not count).
//! The unshifted form becomes the safe Softmax, which equals it wherever it did not overflow.

use super::matchers::{binary, keepdim_reduce, replace_node, single_operand, Live};
use super::{Pass, PassReport};
use crate::ir::{BinaryOp, Graph, NodeId, Op, ReduceOp, UnaryOp};

pub struct RecognizeSoftmax;

impl Pass for RecognizeSoftmax {
    fn name(&self) -> &'static str {
        "recognize_softmax"
    }

    fn run(&self, g: &mut Graph) -> PassReport {
        let mut report = PassReport::new(self.name());
        let Ok(order) = g.topo_order() else {
            return report;
        };
        let mut live = Live::of(g);
        for id in order {
            if !g.contains(id) || !live.contains(id) {
                continue;
            }
            let Some((e, s)) = binary(g, id, BinaryOp::Div) else {
                continue;
            };
            if !matches!(g.op(e), Op::Unary(UnaryOp::Exp)) {
                continue;
            }
            let name = g.node(id).name.clone();
            match check(g, &live, id, e, s) {
                Ok((x, axis)) => {
                    let rank = g.ty(x).shape.rank() as i64;
                    let Ok(sm) = g.softmax(x, axis as i64 - rank) else {
                        continue;
                    };
                    replace_node(g, id, sm);
                    live = Live::of(g);
                    report.rewrote(&name, format!("exp/sum over axis {axis} → softmax"));
                }
                Err((code, detail)) => report.skip(&name, code, detail),
            }
        }
        report
    }
}

type Reason = (&'static str, String);

fn check(
    g: &Graph,
    live: &Live,
    div: NodeId,
    e: NodeId,
    s: NodeId,
) -> Result<(NodeId, usize), Reason> {
    let Some((ReduceOp::Sum, sum_in, axis)) = keepdim_reduce(g, s) else {
        return Err((
            "not_a_sum",
            "the denominator is not a keepdim sum over one axis".into(),
        ));
    };
    if sum_in != e {
        return Err((
            "not_a_sum",
            "the denominator sums something other than the numerator".into(),
        ));
    }
    // The exp feeds exactly the sum and the division.
    if live.uses(g, e) != 2 || g.is_output(e) || !live.only_feeds(g, s, div) {
        return Err((
            "other_consumers",
            format!(
                "%{} or %{} is used outside the softmax",
                g.node(e).name,
                g.node(s).name
            ),
        ));
    }
    let t = single_operand(g, e);
    let Some((x, m)) = binary(g, t, BinaryOp::Sub) else {
        return Ok((t, axis)); // exp(x) / sum(exp(x))
    };
    match keepdim_reduce(g, m) {
        Some((ReduceOp::Max, mx, max_axis)) if mx == x => {
            if max_axis != axis {
                return Err((
                    "axis_mismatch",
                    format!("max over axis {max_axis}, sum over axis {axis}"),
                ));
            }
            if !live.only_feeds(g, t, e) || !live.only_feeds(g, m, t) {
                return Err((
                    "other_consumers",
                    "the max or the shifted scores are used elsewhere".into(),
                ));
            }
            Ok((x, axis))
        }
        _ => Ok((t, axis)), // exp(x − y) for some other y: softmax of (x − y)
    }
}
