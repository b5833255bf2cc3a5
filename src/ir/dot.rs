//! Graphviz DOT export. Sources are drawn as ellipses, ops as boxes, fused ops filled, and the
//! graph outputs with a double border.

use std::fmt::Write;

use super::{Graph, GraphError};

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// An op as a box shows it: attributes one per line when they would make a wide box (a gemm's
/// dims, views and epilogue), split at the commas between attributes, not inside them.
fn op_label(display: &str) -> String {
    const WIDE: usize = 48;
    let (Some(open), true) = (display.find('['), display.ends_with(']')) else {
        return escape(display);
    };
    if display.chars().count() <= WIDE {
        return escape(display);
    }
    let body = &display[open + 1..display.len() - 1];
    let (mut parts, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in body.char_indices() {
        match c {
            '[' | '(' | '{' => depth += 1,
            ']' | ')' | '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(body[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(body[start..].trim());
    let lines: Vec<String> = parts.iter().map(|p| escape(p)).collect();
    format!("{}\\n{}", escape(&display[..open]), lines.join("\\n"))
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
            op_label(&node.op.display()),
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
