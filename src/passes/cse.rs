//! Common-subexpression elimination: two nodes with the same op, attributes and operands are
//! one. Inputs and weights are never merged (their names are their data); operands of
//! commutative ops are compared as a set.

use std::collections::HashMap;

use super::matchers::replace_node;
use super::{Pass, PassReport};
use crate::ir::{BinaryOp, Graph, Op};

pub struct CommonSubexpressions;

fn commutative(op: &Op) -> bool {
    matches!(
        op,
        Op::Binary(
            BinaryOp::Add | BinaryOp::Mul | BinaryOp::Maximum | BinaryOp::Minimum | BinaryOp::Equal
        )
    )
}

impl Pass for CommonSubexpressions {
    fn name(&self) -> &'static str {
        "cse"
    }

    fn run(&self, g: &mut Graph) -> PassReport {
        let mut report = PassReport::new(self.name());
        let Ok(order) = g.topo_order() else {
            return report;
        };
        let mut seen: HashMap<(String, Vec<usize>), crate::ir::NodeId> = HashMap::new();
        for id in order {
            let node = g.node(id);
            // Sources named by the caller are distinct values whatever their type (two states
            // of one shape are two caches).
            if matches!(
                node.op,
                Op::Input { .. } | Op::Weight { .. } | Op::State { .. }
            ) {
                continue;
            }
            let mut operands: Vec<usize> = g.operands(id).iter().map(|o| o.index()).collect();
            if commutative(&node.op) {
                operands.sort_unstable();
            }
            // Debug prints f64 attributes exactly, so equal keys mean equal ops.
            let key = (format!("{:?}|{}", node.op, node.ty), operands);
            match seen.get(&key) {
                Some(&first) => {
                    let (dup, keep) = (node.name.clone(), g.node(first).name.clone());
                    if g.is_output(id) && g.is_output(first) {
                        continue; // two named outputs stay two nodes
                    }
                    replace_node(g, id, first);
                    report.rewrote(&dup, format!("same as %{keep}"));
                }
                None => {
                    seen.insert(key, id);
                }
            }
        }
        report
    }
}
