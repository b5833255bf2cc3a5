//! Attention fusion: softmax(scale·Q·Kᵀ + mask)·V → FlashAttention.
//!
//! Anchor: a MatMul whose left operand is, through casts and views, a Softmax. The fused op
//! computes the scores, scale and masks in f32 and rounds only its result, so what lies between
//! the two matmuls must be something it computes exactly (or, for f16/bf16, up to the rounding
//! the design's tolerance allows):
//! - `scores`: the links from the PV matmul down to Q·Kᵀ. The softmax is over the key (last)
//!   axis; the rest are casts, views (reshapes that only regroup the axes before [Sq, Sk]), the
//!   scale (`mul`/`div` by a scalar constant, at the value its dtype holds), an additive float
//!   mask, and `where` masks (−∞ or dtype-minimum fill; a causal one from a CausalMask or a
//!   constant lower triangle). A cast is only a widening to f32 or the narrowing of f32 back
//!   to the attention dtype; a scale above an additive mask or a finite fill would scale it.
//! - `operands`: Q·Kᵀ is a MatMul of Q (optionally scaled) and Kᵀ: a permute swapping K's last
//!   two axes, the transpose of the head-split K (old GPT-2's `permute(0, 2, 3, 1)`), or K stored
//!   [.., D, Sk]; K and V expanded over a head-group axis (LLaMA's repeat_kv) are read
//!   un-expanded; Q, K and V share their batch axes (rank 4 [B, H, S, D] or 3 [B·H, S, D]).
//! - `frame`: the fused op's [B, H] is Q's batch axes, or the view a mask that broadcasts over
//!   only some batch axes is applied in, so every mask means in the fused op what it meant.
//!
//! Refused, each with its own reason code (docs/passes.md): any link used by another live node
//! or a graph output (dead nodes earlier rewrites left do not count); any attribute (softmax
//! axis, permutation, scale, fill, offset) other than the one the fused op assumes.

mod frame;
mod operands;
mod rewrite;
mod scores;

use super::matchers::{single_operand, Live};
use super::{Pass, PassReport};
use crate::ir::{Graph, NodeId, Op};

pub struct FuseAttention;

/// A refusal: its stable code and what was wrong, naming nodes and shapes.
type Reason = (&'static str, String);

fn reason<T>(code: &'static str, detail: impl Into<String>) -> Result<T, Reason> {
    Err((code, detail.into()))
}

impl Pass for FuseAttention {
    fn name(&self) -> &'static str {
        "fuse_attention"
    }

    fn run(&self, g: &mut Graph) -> PassReport {
        let mut report = PassReport::new(self.name());
        let Ok(order) = g.topo_order() else {
            return report;
        };
        let mut live = Live::of(g);
        for id in order {
            // A dead anchor is no candidate: nothing reads what it computes.
            if !g.contains(id) || !live.contains(id) || !is_candidate(g, id) {
                continue;
            }
            let name = g.node(id).name.clone();
            match find(g, &live, id).and_then(|m| rewrite::build(g, id, &m)) {
                Ok(what) => {
                    report.rewrote(&name, what);
                    live = Live::of(g);
                }
                Err((code, detail)) => report.skip(&name, code, detail),
            }
        }
        report
    }
}

/// A MatMul whose left operand is, through casts and reshapes, a Softmax.
fn is_candidate(g: &Graph, id: NodeId) -> bool {
    if !matches!(g.op(id), Op::MatMul) {
        return false;
    }
    let Some(&(mut p)) = g.operands(id).first() else {
        return false;
    };
    loop {
        match g.op(p) {
            Op::Softmax { .. } => return true,
            Op::Cast { .. } | Op::Reshape { .. } => p = single_operand(g, p),
            _ => return false,
        }
    }
}

/// Everything the rewrite needs, each part checked.
struct Match {
    scores: scores::Scores,
    operands: operands::Operands,
    frame: frame::Frame,
    /// The scale constants on the scores, Q and K, multiplied.
    scale: f64,
}

fn find(g: &Graph, live: &Live, pv: NodeId) -> Result<Match, Reason> {
    let scores = scores::read(g, live, pv)?;
    let operands = operands::read(g, live, pv, &scores)?;
    let frame = frame::choose(g, &scores, &operands)?;
    let parts = [operands.q, operands.k, operands.v, scores.p, pv];
    if let Some(&x) = parts.iter().find(|&&x| g.ty(x).shape.numel() == 0) {
        // No elements need no kernel, and zero heads have no fused form (a head count divides).
        return reason(
            "empty",
            format!("%{} {} holds no elements", g.node(x).name, g.ty(x).shape),
        );
    }
    let scale = scores.scale * operands.scale;
    if !scale.is_finite() {
        return reason(
            "scale_not_finite",
            format!("the scale constants multiply to {scale}"),
        );
    }
    Ok(Match {
        scores,
        operands,
        frame,
        scale,
    })
}
