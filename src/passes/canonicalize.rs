//! Canonical forms, so later patterns have one shape to match:
//! - `div(x, c)` with `c` a constant splat → `mul(x, 1/c)`;
//! - `permute(permute(x, p), q)` → `permute(x, p∘q)` (or `x` when that is the identity), except
//!   when `q` swaps just the last two axes: such a transpose is the operand layout of the matmul
//!   reading it (Kᵀ in attention), which attention fusion and GEMM codegen look for;
//! - `reshape(reshape(x))` → one reshape;
//! - no-op `reshape`/`expand` (same shape), `cast` (same dtype), `permute` (identity) removed.

use super::matchers::{replace_node, single_operand, splat_value};
use super::{Pass, PassReport};
use crate::ir::{BinaryOp, DType, Graph, NodeId, Op};

pub struct Canonicalize;

impl Pass for Canonicalize {
    fn name(&self) -> &'static str {
        "canonicalize"
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
            let name = g.node(id).name.clone();
            if let Some(what) = rewrite(g, id) {
                report.rewrote(&name, what);
            }
        }
        report
    }
}

fn rewrite(g: &mut Graph, id: NodeId) -> Option<String> {
    match g.op(id).clone() {
        Op::Binary(BinaryOp::Div) => {
            let ops = g.operands(id);
            let cty = g.ty(ops[1]).clone();
            // The divisor at the value its dtype holds.
            let c = f64::from(cty.dtype.round_f32(splat_value(g, ops[1])? as f32));
            if c == 0.0 || !c.is_finite() || !g.ty(id).dtype.is_float() {
                return None;
            }
            // In f16/bf16 the reciprocal is rounded to the dtype, so `x * (1/c)` would differ
            // from `x / c` by up to half an f16 ulp of the scale: only an exactly representable
            // reciprocal (a power of two) is rewritten there. f32 keeps the rewrite (GELU's
            // `x / √2` is recognised through it), at most one f32 rounding apart.
            if cty.dtype != DType::F32
                && f64::from(cty.dtype.round_f32((1.0 / c) as f32)) != 1.0 / c
            {
                return None;
            }
            let recip = g
                .constant(cty.dtype, cty.shape.dims(), vec![1.0 / c])
                .ok()?;
            let mul = g.mul(ops[0], recip).ok()?;
            replace_node(g, id, mul);
            Some(format!("div by {c} → mul by {}", 1.0 / c))
        }
        Op::Permute { perm } => {
            let x = single_operand(g, id);
            if perm.iter().enumerate().all(|(i, &p)| i == p) {
                return remove_noop(g, id, x, "identity permute removed");
            }
            let Op::Permute { perm: inner } = g.op(x).clone() else {
                return None;
            };
            let r = perm.len();
            let is_transpose = r >= 2
                && perm[r - 2] == r - 1
                && perm[r - 1] == r - 2
                && perm[..r - 2].iter().enumerate().all(|(i, &p)| i == p);
            if is_transpose {
                return None;
            }
            let composed: Vec<usize> = perm.iter().map(|&p| inner[p]).collect();
            let src = single_operand(g, x);
            if composed.iter().enumerate().all(|(i, &p)| i == p) {
                return remove_noop(g, id, src, "permute of its inverse permute removed");
            }
            let new = g.permute(src, &composed).ok()?;
            replace_node(g, id, new);
            Some(format!("permute of permute → permute {composed:?}"))
        }
        Op::Reshape { .. } => {
            let x = single_operand(g, id);
            if g.ty(x).shape == g.ty(id).shape {
                return remove_noop(g, id, x, "no-op reshape removed");
            }
            let Op::Reshape { .. } = g.op(x) else {
                return None;
            };
            let src = single_operand(g, x);
            let dims: Vec<i64> = g.ty(id).shape.dims().iter().map(|&d| d as i64).collect();
            if g.ty(src).shape == g.ty(id).shape {
                return remove_noop(
                    g,
                    id,
                    src,
                    "reshape chain back to the original shape removed",
                );
            }
            let new = g.reshape(src, &dims).ok()?;
            replace_node(g, id, new);
            Some(format!(
                "reshape chain → one reshape to {}",
                g.ty(new).shape
            ))
        }
        Op::Expand { .. } => {
            let x = single_operand(g, id);
            (g.ty(x).shape == g.ty(id).shape)
                .then(|| remove_noop(g, id, x, "no-op expand removed"))?
        }
        Op::Cast { to } => {
            let x = single_operand(g, id);
            (g.ty(x).dtype == to).then(|| remove_noop(g, id, x, "no-op cast removed"))?
        }
        _ => None,
    }
}

fn remove_noop(g: &mut Graph, id: NodeId, replacement: NodeId, what: &str) -> Option<String> {
    if g.ty(id) != g.ty(replacement) {
        return None;
    }
    // An output that is a plain input stays a separate node: the output keeps its name.
    if g.is_output(id) && matches!(g.op(replacement), Op::Input { .. } | Op::Weight { .. }) {
        return None;
    }
    replace_node(g, id, replacement);
    Some(what.to_string())
}
