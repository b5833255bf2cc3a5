//! Constant folding: elementwise ops, casts, reshapes and expands whose operands are all
//! constants become one constant. Splats stay splats, so folding `1/√d` or a broadcast fill
//! never materialises a large tensor.
//!
//! Values are computed with `ir::scalar`, the table the interpreter uses, on the values each
//! constant holds in its dtype (an f16 constant 65520 is +∞), so a folded constant is bit for bit
//! what the interpreter computes. A result an f64 cannot hold exactly (an i64 past 2^53) is left
//! unfolded rather than rounded.

use super::matchers::replace_node;
use super::{Pass, PassReport};
use crate::ir::scalar::{self, Element};
use crate::ir::{DType, Graph, NodeId, Op};

pub struct ConstantFold;

/// Values of a constant operand: one (splat) or one per element.
fn values(g: &Graph, id: NodeId) -> Option<&[f64]> {
    match g.op(id) {
        Op::Constant { values, .. } => Some(values),
        _ => None,
    }
}

impl Pass for ConstantFold {
    fn name(&self) -> &'static str {
        "constant_fold"
    }

    fn run(&self, g: &mut Graph) -> PassReport {
        let mut report = PassReport::new(self.name());
        let Ok(order) = g.topo_order() else {
            return report;
        };
        for id in order {
            let ops = g.operands(id);
            if ops.is_empty() || !ops.iter().all(|&o| values(g, o).is_some()) {
                continue;
            }
            let Some(folded) = fold(g, id, &ops) else {
                continue;
            };
            let ty = g.ty(id).clone();
            let Ok(c) = g.constant(ty.dtype, ty.shape.dims(), folded) else {
                continue;
            };
            let name = g.node(id).name.clone();
            let what = format!("folded {} of constants", g.op(id).name());
            replace_node(g, id, c);
            report.rewrote(&name, what);
        }
        report
    }
}

/// The folded values, each exactly the element the interpreter computes, or `None`.
fn fold(g: &Graph, id: NodeId, ops: &[NodeId]) -> Option<Vec<f64>> {
    let vals: Vec<&[f64]> = ops.iter().map(|&o| values(g, o)).collect::<Option<_>>()?;
    // Operand `i`'s single value, as its dtype holds it.
    let splat = |i: usize| -> Option<Element> {
        (vals[i].len() == 1).then(|| scalar::constant(g.ty(ops[i]).dtype, vals[i][0]))
    };
    let exact = |e: Element| e.exact_f64();
    let out: DType = g.ty(id).dtype;
    match g.op(id) {
        // Same dtype, same elements: the values carry over as they are.
        Op::Reshape { .. } => Some(vals[0].to_vec()),
        Op::Expand { .. } if vals[0].len() == 1 => Some(vals[0].to_vec()),
        Op::Cast { to } => {
            let from = g.ty(ops[0]).dtype;
            vals[0]
                .iter()
                .map(|&v| exact(scalar::cast(scalar::constant(from, v), *to)))
                .collect()
        }
        Op::Unary(u) => Some(vec![exact(scalar::unary(*u, out, splat(0)?))?]),
        Op::Binary(b) => Some(vec![exact(scalar::binary(*b, out, splat(0)?, splat(1)?))?]),
        _ => None,
    }
}
