//! The text form of a graph, one line per node, used by every dump and snapshot:
//!
//! ```text
//! %scores = matmul(%q, %kt) : f32[1, 2, 8, 8]
//! %p = softmax[axis=-1](%scores) : f32[1, 2, 8, 8]
//! ```

use std::fmt::Write;

use super::{Graph, GraphError, NodeId};

/// One line for one node: name, op with attributes, operands, type.
pub fn node_line(g: &Graph, id: NodeId) -> String {
    let node = g.node(id);
    let operands: Vec<String> = g
        .operands(id)
        .into_iter()
        .map(|o| format!("%{}", g.node(o).name))
        .collect();
    format!(
        "%{} = {}({}) : {}",
        node.name,
        node.op.display(),
        operands.join(", "),
        node.ty
    )
}

/// The whole graph: a header, the nodes in topological order, then the outputs.
pub fn to_text(g: &Graph) -> Result<String, GraphError> {
    let mut out = String::new();
    let title = if g.name.is_empty() {
        "graph"
    } else {
        g.name.as_str()
    };
    let _ = writeln!(out, "graph {title} ({} nodes)", g.node_count());
    for id in g.topo_order()? {
        let _ = writeln!(out, "  {}", node_line(g, id));
    }
    let outs: Vec<String> = g
        .outputs()
        .iter()
        .map(|&o| format!("%{}", g.node(o).name))
        .collect();
    let _ = writeln!(out, "  return {}", outs.join(", "));
    Ok(out)
}
