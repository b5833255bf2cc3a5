//! Elementwise fusion: a chain of elementwise ops (unary, binary, where, cast, with
//! broadcasting) whose inner results have no other use becomes one FusedElementwise node holding
//! the expression. Scalar constants are inlined. A group is grown from its last op up through
//! operands that feed only it; a value with several consumers ends a group (it is computed once
//! and read by each). A group that reads a MatMul used nowhere else is reported as that
//! MatMul's epilogue (bias, activation, residual), which codegen may fuse into the GEMM.

use std::collections::HashSet;

use super::matchers::{only_feeds, replace_node, scalar_value};
use super::{Pass, PassReport};
use crate::ir::{Expr, Graph, NodeId, Op};

pub struct FuseElementwise;

fn is_elementwise(op: &Op) -> bool {
    matches!(
        op,
        Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast { .. }
    )
}

impl Pass for FuseElementwise {
    fn name(&self) -> &'static str {
        "fuse_elementwise"
    }

    fn run(&self, g: &mut Graph) -> PassReport {
        let mut report = PassReport::new(self.name());
        let Ok(mut order) = g.topo_order() else {
            return report;
        };
        order.reverse();
        let mut absorbed: HashSet<NodeId> = HashSet::new();
        for root in order {
            if absorbed.contains(&root) || !g.contains(root) || !is_elementwise(g.op(root)) {
                continue;
            }
            let mut inputs: Vec<NodeId> = Vec::new();
            let mut members = Vec::new();
            let expr = grow(g, root, true, &mut inputs, &mut members);
            if expr.op_count() < 2 {
                continue;
            }
            let in_types: Vec<_> = inputs.iter().map(|&i| g.ty(i)).collect();
            if expr.ty(&in_types).as_ref() != Ok(g.ty(root)) {
                continue; // inlining a constant would change the result's shape
            }
            let name = g.node(root).name.clone();
            let epilogue = inputs
                .iter()
                .find(|&&i| matches!(g.op(i), Op::MatMul) && g.use_count(i) == 1)
                .map(|&i| format!(", epilogue of %{}", g.node(i).name))
                .unwrap_or_default();
            let text = format!(
                "{} ops → fused_elementwise {expr}{epilogue}",
                expr.op_count()
            );
            let Ok(fused) = g.add_op(Op::FusedElementwise(expr), &inputs) else {
                continue;
            };
            absorbed.extend(members);
            replace_node(g, root, fused);
            report.rewrote(&name, text);
        }
        report
    }
}

/// The expression computing `id`, absorbing operands that feed only this group.
fn grow(
    g: &Graph,
    id: NodeId,
    root: bool,
    inputs: &mut Vec<NodeId>,
    members: &mut Vec<NodeId>,
) -> Expr {
    let inner = root || (is_elementwise(g.op(id)) && g.use_count(id) == 1 && !g.is_output(id));
    if !inner {
        if let (Some(v), Op::Constant { dtype, .. }) = (scalar_value(g, id), g.op(id)) {
            if g.ty(id).shape.rank() == 0 {
                return Expr::Const(v, *dtype);
            }
        }
        let at = inputs.iter().position(|&i| i == id).unwrap_or_else(|| {
            inputs.push(id);
            inputs.len() - 1
        });
        return Expr::Input(at);
    }
    members.push(id);
    let ops = g.operands(id);
    let mut kid = |o: NodeId| {
        let absorb = is_elementwise(g.op(o)) && only_feeds(g, o, id);
        Box::new(if absorb {
            grow(g, o, true, inputs, members)
        } else {
            grow(g, o, false, inputs, members)
        })
    };
    match g.op(id).clone() {
        Op::Unary(u) => Expr::Unary(u, kid(ops[0])),
        Op::Cast { to } => Expr::Cast(to, kid(ops[0])),
        Op::Binary(b) => {
            let (x, y) = (kid(ops[0]), kid(ops[1]));
            Expr::Binary(b, x, y)
        }
        Op::Where => {
            let (c, x, y) = (kid(ops[0]), kid(ops[1]), kid(ops[2]));
            Expr::Where(c, x, y)
        }
        _ => unreachable!("only elementwise ops are grown"),
    }
}
