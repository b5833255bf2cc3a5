//! Decomposed activations → their ops.
//!
//! - SiLU: `x · sigmoid(x)` (either order) → silu(x).
//! - GELU, erf form: a product whose factors are exactly {x, 0.5, 1 + erf(x · 1/√2)} (in any
//!   nesting and order; `x / √2` is already `x · 1/√2` after canonicalisation) → gelu(x).
//! - GELU, tanh form: factors {x, 0.5, 1 + tanh(√(2/π) · (x + 0.044715 · x³))}, with x³ as
//!   pow(x, 3) or x·x·x → gelu_tanh(x).
//!
//! Constants are compared to 1e-6 relative. Must not match: another x inside than outside, other
//! constants, a factor used outside the product.

use super::matchers::{
    approx, binary, either_order, only_feeds, replace_node, scalar_value, single_operand,
};
use super::{Pass, PassReport};
use crate::ir::{BinaryOp, Graph, NodeId, Op, UnaryOp};

pub struct RecognizeActivations;

const FRAC_1_SQRT_2: f64 = std::f64::consts::FRAC_1_SQRT_2;
const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;

impl Pass for RecognizeActivations {
    fn name(&self) -> &'static str {
        "recognize_activations"
    }

    fn run(&self, g: &mut Graph) -> PassReport {
        let mut report = PassReport::new(self.name());
        let Ok(order) = g.topo_order() else {
            return report;
        };
        for id in order {
            if !g.contains(id) || !matches!(g.op(id), Op::Binary(BinaryOp::Mul)) {
                continue;
            }
            let name = g.node(id).name.clone();
            if let Some(x) = silu_input(g, id) {
                if let Ok(new) = g.silu(x) {
                    replace_node(g, id, new);
                    report.rewrote(&name, "x·sigmoid(x) → silu");
                }
                continue;
            }
            // Only the top of a product is an anchor: a mul feeding another mul is a factor.
            let feeds_mul = g.use_count(id) == 1
                && g.consumers(id)
                    .first()
                    .is_some_and(|&c| matches!(g.op(c), Op::Binary(BinaryOp::Mul)));
            if feeds_mul {
                continue;
            }
            match gelu_input(g, id) {
                Some((x, op)) if g.ty(x) == g.ty(id) => {
                    if let Ok(new) = g.unary(op, x) {
                        replace_node(g, id, new);
                        report.rewrote(&name, format!("decomposed GELU → {}", op.name()));
                    }
                }
                _ => {}
            }
        }
        report
    }
}

fn silu_input(g: &Graph, id: NodeId) -> Option<NodeId> {
    let pair = binary(g, id, BinaryOp::Mul)?;
    let (x, other) = either_order(pair, |s| match g.op(s) {
        Op::Unary(UnaryOp::Sigmoid) => Some(single_operand(g, s)),
        _ => None,
    })?;
    let sig = if pair.0 == other { pair.1 } else { pair.0 };
    (x == other && only_feeds(g, sig, id)).then_some(x)
}

/// The most leaves a product may have for the activation patterns to look at it (a GELU has at
/// most five): a longer product is no activation, and is not walked whole.
const MAX_FACTORS: usize = 8;

/// The leaves of the product rooted at `id`, left to right, descending through single-use muls;
/// `None` when there are more than [`MAX_FACTORS`]. Walked with an explicit stack.
fn factors(g: &Graph, id: NodeId) -> Option<Vec<NodeId>> {
    let mut out = Vec::new();
    let mut stack = vec![(id, true)];
    let mut products = 0;
    while let Some((n, root)) = stack.pop() {
        let descend = matches!(g.op(n), Op::Binary(BinaryOp::Mul)) && (root || g.use_count(n) == 1);
        if descend {
            // A product of k leaves has k − 1 muls.
            products += 1;
            if products >= MAX_FACTORS {
                return None;
            }
            stack.extend(g.operands(n).into_iter().rev().map(|o| (o, false)));
        } else {
            out.push(n);
        }
    }
    Some(out)
}

/// `1 + f(...)` either order: the operand of `f`.
fn one_plus(g: &Graph, id: NodeId, f: UnaryOp) -> Option<NodeId> {
    let pair = binary(g, id, BinaryOp::Add)?;
    let (_, t) = either_order(pair, |c| (scalar_value(g, c) == Some(1.0)).then_some(()))?;
    (g.op(t) == &Op::Unary(f) && g.use_count(t) == 1).then(|| single_operand(g, t))
}

/// Splits a product's leaves into (scalar constant product, non-constant leaves).
fn split(g: &Graph, leaves: &[NodeId]) -> (f64, Vec<NodeId>) {
    let mut c = 1.0;
    let mut rest = Vec::new();
    for &l in leaves {
        match scalar_value(g, l) {
            Some(v) => c *= v,
            None => rest.push(l),
        }
    }
    (c, rest)
}

fn gelu_input(g: &Graph, id: NodeId) -> Option<(NodeId, UnaryOp)> {
    let leaves = factors(g, id)?;
    let (c, rest) = split(g, &leaves);
    if !approx(c, 0.5) || rest.len() != 2 {
        return None;
    }
    for (x, bracket) in [(rest[0], rest[1]), (rest[1], rest[0])] {
        if g.use_count(bracket) != 1 {
            continue;
        }
        if let Some(arg) = one_plus(g, bracket, UnaryOp::Erf) {
            let Some(inner) = factors(g, arg) else {
                continue;
            };
            let (k, xs) = split(g, &inner);
            if approx(k, FRAC_1_SQRT_2) && xs == [x] {
                return Some((x, UnaryOp::Gelu));
            }
        }
        if let Some(arg) = one_plus(g, bracket, UnaryOp::Tanh) {
            if tanh_argument_is(g, arg, x) {
                return Some((x, UnaryOp::GeluTanh));
            }
        }
    }
    None
}

/// `√(2/π) · (x + 0.044715 · x³)` in any product nesting.
fn tanh_argument_is(g: &Graph, arg: NodeId, x: NodeId) -> bool {
    let Some(outer) = factors(g, arg) else {
        return false;
    };
    let (k, rest) = split(g, &outer);
    let [sum] = rest[..] else { return false };
    if !approx(k, SQRT_2_OVER_PI) {
        return false;
    }
    let Some(pair) = binary(g, sum, BinaryOp::Add) else {
        return false;
    };
    let Some((_, cubic)) = either_order(pair, |c| (c == x).then_some(())) else {
        return false;
    };
    let Some(cube) = factors(g, cubic) else {
        return false;
    };
    let (k3, xs) = split(g, &cube);
    if !approx(k3, 0.044715) {
        return false;
    }
    match xs[..] {
        [a, b, c] => a == x && b == x && c == x,
        [p] => binary(g, p, BinaryOp::Pow)
            .is_some_and(|(base, e)| base == x && scalar_value(g, e) == Some(3.0)),
        _ => false,
    }
}
