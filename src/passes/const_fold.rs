//! Constant folding: elementwise ops, casts, reshapes and expands whose operands are all
//! constants become one constant. Splats stay splats, so folding `1/√d` or a broadcast fill
//! never materialises a large tensor.

use super::matchers::replace_node;
use super::{Pass, PassReport};
use crate::ir::scalar::{binary_f32, binary_i64, unary_f32, unary_i64};
use crate::ir::{Graph, NodeId, Op};

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
            let rounded: Vec<f64> = folded
                .iter()
                .map(|&v| {
                    if ty.dtype.is_float() {
                        f64::from(ty.dtype.round_f32(v as f32))
                    } else {
                        v
                    }
                })
                .collect();
            let Ok(c) = g.constant(ty.dtype, ty.shape.dims(), rounded) else {
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

fn fold(g: &Graph, id: NodeId, ops: &[NodeId]) -> Option<Vec<f64>> {
    let vals: Vec<&[f64]> = ops.iter().map(|&o| values(g, o)).collect::<Option<_>>()?;
    let splat = |i: usize| (vals[i].len() == 1).then(|| vals[i][0]);
    let int_in = |i: usize| !g.ty(ops[i]).dtype.is_float();
    match g.op(id) {
        Op::Reshape { .. } | Op::Expand { .. } if vals[0].len() == 1 => Some(vals[0].to_vec()),
        Op::Reshape { .. } => Some(vals[0].to_vec()),
        Op::Cast { to } => Some(
            vals[0]
                .iter()
                .map(|&v| match *to {
                    crate::ir::DType::Bool => f64::from(u8::from(v != 0.0)),
                    t if t.is_int() => v.trunc(),
                    _ => v,
                })
                .collect(),
        ),
        Op::Unary(u) => {
            let x = splat(0)?;
            Some(vec![if int_in(0) {
                unary_i64(*u, x as i64) as f64
            } else {
                f64::from(unary_f32(*u, x as f32))
            }])
        }
        Op::Binary(b) => {
            let (x, y) = (splat(0)?, splat(1)?);
            Some(vec![if int_in(0) {
                binary_i64(*b, x as i64, y as i64) as f64
            } else {
                f64::from(binary_f32(*b, x as f32, y as f32))
            }])
        }
        _ => None,
    }
}
