//! Dead-code elimination: removes every node no graph output depends on.

use super::matchers::Live;
use super::{Pass, PassReport};
use crate::ir::Graph;

pub struct DeadCode;

impl Pass for DeadCode {
    fn name(&self) -> &'static str {
        "dead_code"
    }

    fn run(&self, g: &mut Graph) -> PassReport {
        let mut report = PassReport::new(self.name());
        let live = Live::of(g);
        let dead: Vec<_> = g.node_ids().filter(|&id| !live.contains(id)).collect();
        if dead.is_empty() {
            return report;
        }
        let mut names: Vec<String> = dead.iter().map(|&id| g.node(id).name.clone()).collect();
        names.sort();
        for id in dead {
            g.remove_node(id);
        }
        report.rewrote(
            "graph",
            format!("removed {} dead node(s): {}", names.len(), names.join(", ")),
        );
        report
    }
}
