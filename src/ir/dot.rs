//! Graphviz DOT export. Sources are drawn as ellipses, ops as boxes, fused ops filled, and the
//! graph outputs with a double border.

use std::fmt::Write;

use super::{Graph, GraphError};

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

pub fn to_dot(g: &Graph) -> Result<String, GraphError> {
    let mut out = String::new();
    let title = if g.name.is_empty() {
        "graph"
    } else {
        g.name.as_str()
    };
    let _ = writeln!(out, "digraph \"{}\" {{", escape(title));
    let _ = writeln!(out, "  rankdir=TB;");
    let _ = writeln!(out, "  node [fontname=\"Helvetica\", fontsize=10];");
    for id in g.topo_order()? {
        let node = g.node(id);
        let label = format!(
            "{}\\n{}\\n{}",
            escape(&node.name),
            escape(&node.op.display()),
            node.ty
        );
        let mut style = if node.op.is_source() {
            "shape=ellipse, color=gray40".to_string()
        } else if node.op.is_fused() {
            "shape=box, style=\"filled,bold\", fillcolor=\"#ffd27f\"".to_string()
        } else {
            "shape=box".to_string()
        };
        if g.is_output(id) {
            style.push_str(", peripheries=2");
        }
        let _ = writeln!(out, "  n{} [label=\"{}\", {}];", id.index(), label, style);
    }
    for id in g.node_ids() {
        let operands = g.operands(id);
        for (slot, o) in operands.iter().enumerate() {
            let label = if operands.len() > 1 {
                format!(" [label=\"{slot}\", fontsize=8]")
            } else {
                String::new()
            };
            let _ = writeln!(out, "  n{} -> n{}{};", o.index(), id.index(), label);
        }
    }
    let _ = writeln!(out, "}}");
    Ok(out)
}
