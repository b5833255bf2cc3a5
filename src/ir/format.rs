//! The graph file format: versioned JSON that a person can write by hand.
//!
//! ```json
//! { "format": "rocmforge-graph", "version": 1, "name": "attention",
//!   "nodes": [
//!     {"name": "q", "op": "input", "dtype": "f32", "shape": [1, 2, 8, 4]},
//!     {"name": "s", "op": "matmul", "inputs": ["q", "kt"]}
//!   ],
//!   "outputs": ["s"] }
//! ```
//! Each node has a unique `name`, an `op`, its `inputs` by name (in operand order) and the op's
//! attributes beside them. Nodes may be listed in any order; cycles are refused.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::path::Path;

use serde_json::{Map, Value};

use super::op::OpParseError;
use super::{FileLimit, Graph, GraphError, NodeId, Op};

pub const FORMAT_NAME: &str = "rocmforge-graph";
pub const FORMAT_VERSION: u32 = 1;

const TOP_LEVEL_KEYS: [&str; 6] = [
    "format",
    "version",
    "name",
    "description",
    "nodes",
    "outputs",
];

struct NodeSpec {
    name: String,
    op: Op,
    inputs: Vec<String>,
}

fn format_err<T>(reason: impl Into<String>) -> Result<T, GraphError> {
    Err(GraphError::Format {
        reason: reason.into(),
    })
}

/// Graph files are hand-written JSON; constants are their only bulk (weights come from the seed
/// or the model's own files), so anything past this is not a graph file.
pub const GRAPH_FILE: FileLimit = FileLimit {
    what: "graph file",
    max_bytes: 64 << 20,
};

/// Reads and validates a graph file: a regular file of at most [`GRAPH_FILE`] bytes (a FIFO, a
/// device or a directory is refused without being read).
pub fn load(path: &Path) -> Result<Graph, GraphError> {
    let text = super::file::read_text(path, GRAPH_FILE)?;
    let mut g = from_json_str(&text)?;
    if g.name.is_empty() {
        if let Some(stem) = path.file_stem() {
            g.name = stem.to_string_lossy().into_owned();
        }
    }
    Ok(g)
}

/// Parses and validates a graph from JSON text.
pub fn from_json_str(text: &str) -> Result<Graph, GraphError> {
    let value: Value = serde_json::from_str(text).map_err(|e| GraphError::Json {
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    })?;
    let Value::Object(top) = value else {
        return format_err("the top level must be a JSON object");
    };
    check_header(&top)?;
    let name = opt_string(&top, "name")?;
    let description = opt_string(&top, "description")?;

    let Some(Value::Array(raw_nodes)) = top.get("nodes") else {
        return format_err("`nodes` must be a list of node objects");
    };
    let specs = raw_nodes
        .iter()
        .enumerate()
        .map(|(i, v)| parse_node(i, v))
        .collect::<Result<Vec<_>, _>>()?;

    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, s) in specs.iter().enumerate() {
        if index.insert(s.name.as_str(), i).is_some() {
            return Err(GraphError::DuplicateName {
                node: s.name.clone(),
            });
        }
    }
    let mut operand_idx: Vec<Vec<usize>> = Vec::with_capacity(specs.len());
    for s in &specs {
        let mut ids = Vec::with_capacity(s.inputs.len());
        for inp in &s.inputs {
            match index.get(inp.as_str()) {
                Some(&j) => ids.push(j),
                None => {
                    return Err(GraphError::DanglingInput {
                        node: s.name.clone(),
                        input: inp.clone(),
                    })
                }
            }
        }
        operand_idx.push(ids);
    }

    let order = file_topo_order(&specs, &operand_idx)?;
    let mut g = Graph::new(name);
    g.description = description;
    let mut ids: Vec<Option<NodeId>> = vec![None; specs.len()];
    for i in order {
        let operands: Vec<NodeId> = operand_idx[i]
            .iter()
            .map(|&j| ids[j].expect("topological order adds operands first"))
            .collect();
        let s = &specs[i];
        ids[i] = Some(g.add_node(Some(&s.name), s.op.clone(), &operands)?);
    }

    let outputs = match top.get("outputs") {
        None => return Err(GraphError::NoOutputs),
        Some(Value::Array(a)) => a,
        Some(_) => return format_err("`outputs` must be a list of node names"),
    };
    if outputs.is_empty() {
        return Err(GraphError::NoOutputs);
    }
    for o in outputs {
        let Some(name) = o.as_str() else {
            return format_err("`outputs` must be a list of node names");
        };
        let id = g.find(name).ok_or_else(|| GraphError::UnknownOutput {
            name: name.to_string(),
        })?;
        g.add_output(id)?;
    }
    g.validate()?;
    Ok(g)
}

fn check_header(top: &Map<String, Value>) -> Result<(), GraphError> {
    if let Some(k) = top.keys().find(|k| !TOP_LEVEL_KEYS.contains(&k.as_str())) {
        return format_err(format!(
            "unknown top-level field `{k}` (expected {})",
            TOP_LEVEL_KEYS.join(", ")
        ));
    }
    match top.get("format") {
        None => {}
        Some(Value::String(s)) if s == FORMAT_NAME => {}
        Some(other) => {
            return format_err(format!("`format` is {other}, expected \"{FORMAT_NAME}\""))
        }
    }
    match top.get("version") {
        None => Err(GraphError::MissingVersion {
            supported: FORMAT_VERSION,
        }),
        Some(v) if v.as_u64() == Some(u64::from(FORMAT_VERSION)) => Ok(()),
        Some(v) => Err(GraphError::UnsupportedVersion {
            found: v.to_string(),
            supported: FORMAT_VERSION,
        }),
    }
}

fn opt_string(top: &Map<String, Value>, key: &str) -> Result<String, GraphError> {
    match top.get(key) {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => format_err(format!("`{key}` must be a string")),
    }
}

fn parse_node(i: usize, v: &Value) -> Result<NodeSpec, GraphError> {
    let Value::Object(map) = v else {
        return format_err(format!("node #{i} is not an object"));
    };
    let mut attrs = map.clone();
    let name = match attrs.remove("name") {
        Some(Value::String(s)) if !s.is_empty() => s,
        _ => return format_err(format!("node #{i} needs a non-empty string `name`")),
    };
    let op_name = match attrs.remove("op") {
        Some(Value::String(s)) => s,
        _ => return format_err(format!("node `{name}` needs a string `op`")),
    };
    let inputs = match attrs.remove("inputs") {
        None => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|x| x.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| GraphError::Format {
                reason: format!("node `{name}`: `inputs` must be a list of node names"),
            })?,
        Some(_) => {
            return format_err(format!(
                "node `{name}`: `inputs` must be a list of node names"
            ))
        }
    };
    let op = Op::parse(&op_name, &attrs).map_err(|e| match e {
        OpParseError::UnknownOp => GraphError::UnknownOp {
            node: name.clone(),
            op: op_name.clone(),
            known: Op::all_names().join(", "),
        },
        OpParseError::Attribute(reason) => GraphError::BadAttribute {
            node: name.clone(),
            op: op_name.clone(),
            reason,
        },
    })?;
    Ok(NodeSpec { name, op, inputs })
}

/// Kahn's algorithm over file positions, earliest first, so a file in order stays in order.
fn file_topo_order(specs: &[NodeSpec], operands: &[Vec<usize>]) -> Result<Vec<usize>, GraphError> {
    let n = specs.len();
    let mut indeg = vec![0usize; n];
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, ops) in operands.iter().enumerate() {
        indeg[i] = ops.len();
        for &j in ops {
            users[j].push(i);
        }
    }
    let mut ready: BinaryHeap<Reverse<usize>> =
        (0..n).filter(|&i| indeg[i] == 0).map(Reverse).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(Reverse(i)) = ready.pop() {
        order.push(i);
        for &u in &users[i] {
            indeg[u] -= 1;
            if indeg[u] == 0 {
                ready.push(Reverse(u));
            }
        }
    }
    if order.len() < n {
        let stuck = (0..n)
            .find(|&i| indeg[i] > 0)
            .expect("a cycle leaves a node unordered");
        return Err(GraphError::Cycle {
            node: specs[stuck].name.clone(),
        });
    }
    Ok(order)
}

/// The graph as a JSON object (nodes in topological order).
pub fn to_json_value(g: &Graph) -> Result<Value, GraphError> {
    let mut top = Map::new();
    top.insert("format".into(), FORMAT_NAME.into());
    top.insert("version".into(), FORMAT_VERSION.into());
    if !g.name.is_empty() {
        top.insert("name".into(), g.name.clone().into());
    }
    if !g.description.is_empty() {
        top.insert("description".into(), g.description.clone().into());
    }
    let nodes = g
        .topo_order()?
        .into_iter()
        .map(|id| Value::Object(node_object(g, id)))
        .collect();
    top.insert("nodes".into(), Value::Array(nodes));
    let outs = g
        .outputs()
        .iter()
        .map(|&o| Value::String(g.node(o).name.clone()))
        .collect();
    top.insert("outputs".into(), Value::Array(outs));
    Ok(Value::Object(top))
}

fn node_object(g: &Graph, id: NodeId) -> Map<String, Value> {
    let node = g.node(id);
    let mut m = Map::new();
    m.insert("name".into(), node.name.clone().into());
    m.insert("op".into(), node.op.name().into());
    let inputs: Vec<Value> = g
        .operands(id)
        .into_iter()
        .map(|o| Value::String(g.node(o).name.clone()))
        .collect();
    if !inputs.is_empty() {
        m.insert("inputs".into(), Value::Array(inputs));
    }
    for (k, v) in node.op.attrs() {
        m.insert(k.into(), v);
    }
    m
}

/// The graph as JSON text: header fields one per line, then one node per line, so files diff
/// well and read top to bottom.
pub fn to_json_string(g: &Graph) -> Result<String, GraphError> {
    let Value::Object(top) = to_json_value(g)? else {
        unreachable!("to_json_value returns an object")
    };
    let mut out = String::from("{\n");
    let n = top.len();
    for (i, (k, v)) in top.iter().enumerate() {
        out.push_str(&format!("  {}: ", Value::String(k.clone())));
        match (k.as_str(), v) {
            ("nodes", Value::Array(items)) => {
                out.push_str("[\n");
                for (j, item) in items.iter().enumerate() {
                    out.push_str("    ");
                    out.push_str(&spaced_json(item));
                    out.push_str(if j + 1 < items.len() { ",\n" } else { "\n" });
                }
                out.push_str("  ]");
            }
            _ => out.push_str(&spaced_json(v)),
        }
        out.push_str(if i + 1 < n { ",\n" } else { "\n" });
    }
    out.push_str("}\n");
    Ok(out)
}

/// Compact JSON with a space after `:` and `,`, as people write it by hand.
fn spaced_json(v: &Value) -> String {
    match v {
        Value::Array(items) => {
            let parts: Vec<String> = items.iter().map(spaced_json).collect();
            format!("[{}]", parts.join(", "))
        }
        Value::Object(m) => {
            let parts: Vec<String> = m
                .iter()
                .map(|(k, v)| format!("{}: {}", Value::String(k.clone()), spaced_json(v)))
                .collect();
            format!("{{{}}}", parts.join(", "))
        }
        other => other.to_string(),
    }
}

pub fn save(g: &Graph, path: &Path) -> Result<(), GraphError> {
    let text = to_json_string(g)?;
    std::fs::write(path, text).map_err(|e| GraphError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}
