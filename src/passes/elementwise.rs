//! Elementwise fusion: a chain of elementwise ops (unary, binary, where, cast, with
//! broadcasting) whose inner results have no other use becomes one FusedElementwise node holding
//! the expression. Scalar constants are inlined, at the value their dtype holds. A group is
//! grown from its last op up through operands that feed only it, nearest first, until it would
//! apply more than `ir::expr::MAX_OPS` ops or read more than `ir::expr::MAX_INPUTS` operands (a
//! kernel's parameters and registers); a value with several consumers ends a group (it is
//! computed once and read by each). A group that reads a MatMul used nowhere else is reported
//! as that MatMul's epilogue (bias, activation, residual), which the GEMM pass folds into its Gemm.
//!
//! Growing walks a worklist, not the call stack, so a chain of a million ops fuses into groups
//! without deep recursion; building a group's expression recurses at most `MAX_OPS` deep.

use std::collections::VecDeque;

use super::matchers::{only_feeds, replace_node, scalar_value};
use super::{Pass, PassReport};
use crate::ir::expr::{MAX_INPUTS, MAX_OPS};
use crate::ir::{Expr, Graph, NodeId, NodeSet, Op};

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
        let mut absorbed = NodeSet::default();
        for root in order {
            if absorbed.contains(&root) || !g.contains(root) || !is_elementwise(g.op(root)) {
                continue;
            }
            let members = group(g, root);
            if members.len() < 2 {
                continue;
            }
            let mut inputs: Vec<NodeId> = Vec::new();
            let expr = build(g, root, &members, &mut inputs);
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

/// A value the expression reads rather than computes: an operand of the fused node, unless it
/// is a scalar constant, which is inlined.
fn is_operand(g: &Graph, id: NodeId) -> bool {
    !(scalar_value(g, id).is_some()
        && matches!(g.op(id), Op::Constant { .. })
        && g.ty(id).shape.rank() == 0)
}

/// The ops fused with `root`: breadth first through operands that feed only the group, while
/// the group stays within `MAX_OPS` ops and `MAX_INPUTS` distinct operands.
fn group(g: &Graph, root: NodeId) -> NodeSet {
    let mut members = NodeSet::from_iter([root]);
    let mut leaves: NodeSet = g
        .operands(root)
        .into_iter()
        .filter(|&o| is_operand(g, o))
        .collect();
    let mut queue: VecDeque<(NodeId, NodeId)> =
        g.operands(root).into_iter().map(|o| (o, root)).collect();
    while let Some((id, user)) = queue.pop_front() {
        if members.len() >= MAX_OPS
            || members.contains(&id)
            || !is_elementwise(g.op(id))
            || !only_feeds(g, id, user)
        {
            continue;
        }
        // Absorbing `id` turns it from an operand into an op and adds its own operands.
        let operands = g.operands(id);
        let mut new_leaves: Vec<NodeId> = operands
            .iter()
            .copied()
            .filter(|&o| is_operand(g, o) && !leaves.contains(&o))
            .collect();
        new_leaves.sort_unstable();
        new_leaves.dedup();
        if leaves.len() - usize::from(leaves.contains(&id)) + new_leaves.len() > MAX_INPUTS {
            continue;
        }
        leaves.remove(&id);
        leaves.extend(new_leaves);
        members.insert(id);
        queue.extend(operands.into_iter().map(|o| (o, id)));
    }
    members
}

/// The expression computing `id` from the group `members`, numbering operands in the order
/// they are first read. Recursion is bounded by the group's size (at most `MAX_OPS`).
fn build(g: &Graph, id: NodeId, members: &NodeSet, inputs: &mut Vec<NodeId>) -> Expr {
    if !members.contains(&id) {
        if !is_operand(g, id) {
            if let (Some(v), Op::Constant { dtype, .. }) = (scalar_value(g, id), g.op(id)) {
                return Expr::constant(v, *dtype);
            }
        }
        let at = inputs.iter().position(|&i| i == id).unwrap_or_else(|| {
            inputs.push(id);
            inputs.len() - 1
        });
        return Expr::Input(at);
    }
    let ops = g.operands(id);
    let mut kid = |o: NodeId| Box::new(build(g, o, members, inputs));
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
        _ => unreachable!("only elementwise ops join a group"),
    }
}
