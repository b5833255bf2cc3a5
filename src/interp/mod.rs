//! The CPU interpreter: one reference implementation per op, run over the same graph every
//! other path compiles. Floats are computed in f32 (sums in f64) and rounded to the node's dtype
//! on output, so an f16 graph here rounds exactly where a kernel storing f16 would.

mod attention;
mod elementwise;
mod layout;
mod matmul;
mod reduce;
mod strided;

use std::collections::HashMap;

use thiserror::Error;

use crate::ir::{
    normalize_axis, random_input, random_weight, reduce_axes, Graph, GraphError, Node, NodeId, Op,
    Tensor, TensorType,
};

#[derive(Debug, Error, Clone, PartialEq)]
pub enum InterpError {
    #[error(transparent)]
    Graph(#[from] GraphError),

    #[error("no data bound for input `{name}` ({ty})")]
    MissingInput { name: String, ty: TensorType },

    #[error("data bound to `{name}` is {got}, but the graph declares {expected}")]
    BindingType {
        name: String,
        expected: TensorType,
        got: TensorType,
    },

    #[error("`{name}` is bound but the graph has no input or weight of that name")]
    UnknownBinding { name: String },

    #[error("node `{node}`: index {index} is outside a table of {size} rows")]
    IndexOutOfRange {
        node: String,
        index: i64,
        size: usize,
    },
}

/// Data for a run: inputs by name, weights by name (a weight left out is drawn from the
/// seeded RNG, as its `init` says).
#[derive(Clone, Debug, Default)]
pub struct Bindings {
    pub inputs: HashMap<String, Tensor>,
    pub weights: HashMap<String, Tensor>,
    pub seed: u64,
}

impl Bindings {
    /// Seeded random data for every input of `graph`, as each input's `sample` says.
    pub fn random(graph: &Graph, seed: u64) -> Bindings {
        let inputs = graph
            .node_ids()
            .filter_map(|id| {
                let node = graph.node(id);
                match &node.op {
                    Op::Input { sample, .. } => Some((
                        node.name.clone(),
                        random_input(&node.name, &node.ty, sample, seed),
                    )),
                    _ => None,
                }
            })
            .collect();
        Bindings {
            inputs,
            weights: HashMap::new(),
            seed,
        }
    }

    pub fn with_input(mut self, name: &str, t: Tensor) -> Bindings {
        self.inputs.insert(name.to_string(), t);
        self
    }

    /// Refuses bindings that name nothing in `graph`, so a misspelt name is not silently unused.
    pub fn check_against(&self, graph: &Graph) -> Result<(), InterpError> {
        for name in self.inputs.keys() {
            match graph.find(name).map(|id| graph.op(id)) {
                Some(Op::Input { .. }) => {}
                _ => return Err(InterpError::UnknownBinding { name: name.clone() }),
            }
        }
        for name in self.weights.keys() {
            match graph.find(name).map(|id| graph.op(id)) {
                Some(Op::Weight { .. }) => {}
                _ => return Err(InterpError::UnknownBinding { name: name.clone() }),
            }
        }
        Ok(())
    }
}

/// Runs `graph` and returns its outputs in order.
pub fn run(graph: &Graph, bindings: &Bindings) -> Result<Vec<Tensor>, InterpError> {
    run_with_weights(graph, bindings, &HashMap::new())
}

/// As [`run`], with weights not in `bindings` looked up in `weights` (a compiled model's own,
/// borrowed rather than copied into every run's bindings).
pub fn run_with_weights(
    graph: &Graph,
    bindings: &Bindings,
    weights: &HashMap<String, Tensor>,
) -> Result<Vec<Tensor>, InterpError> {
    bindings.check_against(graph)?;
    let order = graph.topo_order()?;
    let mut remaining: HashMap<NodeId, usize> = order
        .iter()
        .map(|&id| (id, graph.consumers(id).len()))
        .collect();
    let mut values: HashMap<NodeId, Tensor> = HashMap::new();
    for id in order {
        let operands = graph.operands(id);
        let args: Vec<&Tensor> = operands.iter().map(|o| &values[o]).collect();
        let value = eval(graph.node(id), &args, bindings, weights)?;
        debug_assert_eq!(
            value.ty(),
            graph.node(id).ty,
            "node {}",
            graph.node(id).name
        );
        values.insert(id, value);
        // Free operands nobody else needs.
        let mut distinct = operands;
        distinct.sort_unstable();
        distinct.dedup();
        for o in distinct {
            let left = remaining.get_mut(&o).expect("operand is a node");
            *left -= 1;
            if *left == 0 && !graph.is_output(o) {
                values.remove(&o);
            }
        }
    }
    Ok(graph.outputs().iter().map(|o| values[o].clone()).collect())
}

fn bound(name: &str, ty: &TensorType, t: Option<&Tensor>) -> Result<Option<Tensor>, InterpError> {
    match t {
        None => Ok(None),
        Some(t) if t.ty() == *ty => Ok(Some(t.clone())),
        Some(t) => Err(InterpError::BindingType {
            name: name.to_string(),
            expected: ty.clone(),
            got: t.ty(),
        }),
    }
}

/// Evaluates one node on its operand values.
fn eval(
    node: &Node,
    args: &[&Tensor],
    bindings: &Bindings,
    weights: &HashMap<String, Tensor>,
) -> Result<Tensor, InterpError> {
    let ty = &node.ty;
    let axis =
        |a: i64| normalize_axis(a, args[0].shape().rank()).expect("checked by shape inference");
    Ok(match &node.op {
        Op::Input { .. } => {
            bound(&node.name, ty, bindings.inputs.get(&node.name))?.ok_or_else(|| {
                InterpError::MissingInput {
                    name: node.name.clone(),
                    ty: ty.clone(),
                }
            })?
        }
        Op::Weight { init, .. } => match bound(
            &node.name,
            ty,
            bindings
                .weights
                .get(&node.name)
                .or_else(|| weights.get(&node.name)),
        )? {
            Some(t) => t,
            None => random_weight(&node.name, ty, init, bindings.seed),
        },
        Op::Constant { values, .. } => {
            let n = ty.shape.numel();
            let full: Vec<f64> = if values.len() == n {
                values.clone()
            } else {
                vec![values[0]; n]
            };
            Tensor::from_f64(ty.dtype, ty.shape.clone(), &full).expect("constant length checked")
        }
        Op::CausalMask { sq, sk, offset } => attention::causal_mask(*sq, *sk, *offset),
        Op::Reshape { .. } => layout::reshape(args[0], ty),
        Op::Permute { perm } => layout::permute(args[0], perm, ty),
        Op::Expand { .. } => layout::expand(args[0], ty),
        Op::Concat { axis: a } => layout::concat(args, axis(*a), ty),
        Op::Slice {
            axis: a,
            start,
            end,
        } => layout::slice(args[0], axis(*a), *start, *end, ty),
        Op::Gather => layout::gather_rows(&node.name, args[0], args[1], ty)?,
        Op::Binary(op) => elementwise::binary(*op, args[0], args[1], ty),
        Op::Where => elementwise::where_(args[0], args[1], args[2], ty),
        Op::Unary(op) => elementwise::unary(*op, args[0]),
        Op::Cast { to } => args[0].cast(*to),
        Op::Reduce { op, axes, .. } => {
            let axes = reduce_axes(axes, args[0].shape()).expect("checked by shape inference");
            reduce::reduce(*op, args[0], &axes, ty)
        }
        Op::Softmax { axis: a } => reduce::softmax(args[0], axis(*a)),
        Op::LayerNorm { eps } => reduce::norm(args[0], args[1], Some(args[2]), *eps, false),
        Op::RmsNorm { eps } => reduce::norm(args[0], args[1], None, *eps, true),
        Op::Rope { theta, offset } => attention::rope(args[0], *theta, *offset),
        Op::MatMul => matmul::matmul(args[0], args[1], ty),
        Op::FusedElementwise(expr) => elementwise::fused(expr, args),
        Op::FlashAttention(att) => {
            attention::flash_attention(att, args[0], args[1], args[2], args.get(3).copied(), ty)
        }
    })
}
