//! The CPU interpreter: one reference implementation per op, run over the same graph every
//! other path compiles. Floats are computed in f32 (sums in f64) and rounded to the node's dtype
//! on output, so an f16 graph here rounds exactly where a kernel storing f16 would.

mod attention;
mod elementwise;
mod gemm;
mod layout;
mod matmul;
mod paged;
mod reduce;
mod state;
mod strided;

use std::collections::HashMap;

use thiserror::Error;

use crate::ir::{
    check_host_size, normalize_axis, random_input, random_weight, reduce_axes, Graph, GraphError,
    Node, NodeMap, Op, QuantError, QuantTensor, Tensor, TensorError, TensorType,
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

    /// A cache write whose rows `start..start + len` leave the state's `size` along its axis.
    #[error(
        "node `{node}`: writing {len} row(s) at {start} leaves a state of {size} along the axis"
    )]
    CacheWriteOutOfRange {
        node: String,
        start: i64,
        len: usize,
        size: usize,
    },

    /// An attention's number of valid keys outside `0..=keys`.
    #[error("node `{node}`: kv_len {kv_len} is outside 0..={keys} (the keys of its k and v)")]
    KvLenOutOfRange {
        node: String,
        kv_len: i64,
        keys: usize,
    },

    /// A paged cache write's slot at or past the pool's `slots` rows (blocks × block size).
    #[error("node `{node}`: slot {slot} is outside a pool of {slots} rows")]
    PagedSlotOutOfRange {
        node: String,
        slot: i64,
        slots: usize,
    },

    /// A block table entry, among those a sequence's kv_len reads, that names no block of the
    /// pool.
    #[error(
        "node `{node}`: sequence {sequence}'s block table entry {slot} is block {block}, \
         outside a pool of {blocks} blocks"
    )]
    PagedBlockOutOfRange {
        node: String,
        sequence: usize,
        slot: usize,
        block: i64,
        blocks: usize,
    },

    #[error("no value given for state `{name}` ({ty})")]
    MissingState { name: String, ty: TensorType },

    #[error("a value is given for state `{name}`, but the graph has no state of that name")]
    UnknownState { name: String },

    /// Blocks bound to a quantized weight that are not what it declares, dense data bound to a
    /// quantized weight, or blocks bound to a dense one.
    #[error("weight `{name}`: {source}")]
    QuantBinding {
        name: String,
        #[source]
        source: QuantError,
    },

    /// Host data for the node (its value, or random data drawn for it) is larger than the host
    /// may hold or than the allocator gives.
    #[error("node `{node}`: {source}")]
    Host {
        node: String,
        #[source]
        source: TensorError,
    },
}

/// Data for a run: inputs by name, weights by name (a weight left out is drawn from the
/// seeded RNG, as its `init` says).
#[derive(Clone, Debug, Default)]
pub struct Bindings {
    pub inputs: HashMap<String, Tensor>,
    pub weights: HashMap<String, Tensor>,
    /// Blocks of quantized weights (`Op::Weight` with `quant`), by name.
    pub quantized: HashMap<String, QuantTensor>,
    pub seed: u64,
    /// Inputs [`Bindings::random`] could not draw (too large for the host), with why; every run
    /// with these bindings reports the first through [`Bindings::check_against`].
    pub undrawn: Vec<(String, TensorError)>,
}

impl Bindings {
    /// Seeded random data for every input of `graph`, as each input's `sample` says, or the
    /// first input that cannot be drawn (larger than `ir::MAX_HOST_ELEMENTS`, or than the host
    /// can allocate).
    pub fn try_random(graph: &Graph, seed: u64) -> Result<Bindings, InterpError> {
        let b = Bindings::random(graph, seed);
        match b.undrawn.into_iter().next() {
            Some((node, source)) => Err(InterpError::Host { node, source }),
            None => Ok(Bindings {
                undrawn: vec![],
                ..b
            }),
        }
    }

    /// As [`Bindings::try_random`], but an input that cannot be drawn is left unbound and
    /// recorded in `undrawn`, so that running with these bindings reports it (a typed error,
    /// never an allocation abort).
    pub fn random(graph: &Graph, seed: u64) -> Bindings {
        let mut inputs = HashMap::new();
        let mut undrawn = Vec::new();
        for id in graph.node_ids() {
            let node = graph.node(id);
            if let Op::Input { sample, .. } = &node.op {
                match random_input(&node.name, &node.ty, sample, seed) {
                    Ok(t) => {
                        inputs.insert(node.name.clone(), t);
                    }
                    Err(e) => undrawn.push((node.name.clone(), e)),
                }
            }
        }
        Bindings {
            inputs,
            weights: HashMap::new(),
            quantized: HashMap::new(),
            seed,
            undrawn,
        }
    }

    pub fn with_input(mut self, name: &str, t: Tensor) -> Bindings {
        self.inputs.insert(name.to_string(), t);
        self
    }

    /// Refuses bindings that name nothing in `graph`, so a misspelt name is not silently unused.
    pub fn check_against(&self, graph: &Graph) -> Result<(), InterpError> {
        if let Some((node, source)) = self.undrawn.first() {
            return Err(InterpError::Host {
                node: node.clone(),
                source: source.clone(),
            });
        }
        for name in self.inputs.keys() {
            match graph.find(name).map(|id| graph.op(id)) {
                Some(Op::Input { .. }) => {}
                _ => return Err(InterpError::UnknownBinding { name: name.clone() }),
            }
        }
        for name in self.weights.keys().chain(self.quantized.keys()) {
            match graph.find(name).map(|id| graph.op(id)) {
                Some(Op::Weight { .. }) => {}
                _ => return Err(InterpError::UnknownBinding { name: name.clone() }),
            }
        }
        Ok(())
    }
}

/// Runs `graph` and returns its outputs in order. States start from zeros (a fresh session's
/// first run); [`run_with_state`] gives them values and returns the next ones.
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
    run_with_data(graph, bindings, weights, &HashMap::new())
}

/// As [`run_with_weights`], with the blocks of quantized weights not in `bindings` looked up in
/// `quantized`. A quantized weight is dequantized when the run reaches it, every run (nothing
/// is cached: the interpreter holds no f32 copy of the weights between runs), and dropped after
/// its last reader, as every value is. Every state starts zeroed.
pub fn run_with_data(
    graph: &Graph,
    bindings: &Bindings,
    weights: &HashMap<String, Tensor>,
    quantized: &HashMap<String, QuantTensor>,
) -> Result<Vec<Tensor>, InterpError> {
    let states = state::zeros(graph)?;
    Ok(run_with_state_data(graph, bindings, weights, quantized, &states)?.0)
}

/// Runs `graph` with each state's value given by name in `states` (every state of the graph,
/// nothing else), and returns the outputs in order and each state's next value: what its cache
/// write made of it, or the value given when nothing writes it.
pub fn run_with_state(
    graph: &Graph,
    bindings: &Bindings,
    weights: &HashMap<String, Tensor>,
    states: &HashMap<String, Tensor>,
) -> Result<(Vec<Tensor>, HashMap<String, Tensor>), InterpError> {
    run_with_state_data(graph, bindings, weights, &HashMap::new(), states)
}

/// [`run_with_state`] with quantized weights' blocks (see [`run_with_data`]).
pub fn run_with_state_data(
    graph: &Graph,
    bindings: &Bindings,
    weights: &HashMap<String, Tensor>,
    quantized: &HashMap<String, QuantTensor>,
    states: &HashMap<String, Tensor>,
) -> Result<(Vec<Tensor>, HashMap<String, Tensor>), InterpError> {
    bindings.check_against(graph)?;
    graph.check_state_writes()?;
    state::check_against(graph, states)?;
    let mut next_states: HashMap<String, Tensor> = HashMap::new();
    let order = graph.topo_order()?;
    let mut remaining: NodeMap<usize> = order
        .iter()
        .map(|&id| (id, graph.consumers(id).len()))
        .collect();
    let mut values: NodeMap<Tensor> = NodeMap::default();
    for id in order {
        let node = graph.node(id);
        let host = |source| InterpError::Host {
            node: node.name.clone(),
            source,
        };
        // Every value is checked against the host limit before it is computed.
        check_host_size(&node.ty).map_err(host)?;
        let operands = graph.operands(id);
        let args: Vec<&Tensor> = operands.iter().map(|o| &values[o]).collect();
        let value = eval(node, &args, bindings, (weights, quantized), states)?;
        debug_assert_eq!(value.ty(), node.ty, "node {}", node.name);
        if let Op::CacheWrite { .. } | Op::PagedCacheWrite = node.op {
            // Checked above: the first operand is a state.
            let state = graph.node(operands[0]).name.clone();
            next_states.insert(state, value.clone());
        }
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
    // Each output's value moves out at its last mention; an output listed twice is copied.
    let mut mentions: NodeMap<usize> = NodeMap::default();
    for &o in graph.outputs() {
        *mentions.entry(o).or_insert(0) += 1;
    }
    let mut result = Vec::with_capacity(graph.outputs().len());
    for o in graph.outputs() {
        let left = mentions.get_mut(o).expect("counted above");
        *left -= 1;
        result.push(if *left > 0 {
            values[o].clone()
        } else {
            values.remove(o).expect("outputs are kept")
        });
    }
    // A state nothing writes keeps its value.
    for (name, t) in states {
        if !next_states.contains_key(name) {
            next_states.insert(name.clone(), t.clone());
        }
    }
    Ok((result, next_states))
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

/// The value of quantized weight `node`: its blocks (bound, the model's, or seeded random
/// ones), dequantized in f32 and rounded to its dtype.
fn quantized_weight(
    node: &Node,
    scheme: crate::ir::QuantScheme,
    bindings: &Bindings,
    quantized: &HashMap<String, QuantTensor>,
) -> Result<Tensor, InterpError> {
    let name = &node.name;
    let err = |source| InterpError::QuantBinding {
        name: name.clone(),
        source,
    };
    if let Some(t) = bindings.weights.get(name) {
        return Err(err(QuantError::Mismatch {
            expected: format!("{scheme}{}", node.ty.shape),
            got: format!("dense {}", t.ty()),
        }));
    }
    let drawn;
    let q = match bindings.quantized.get(name).or_else(|| quantized.get(name)) {
        Some(q) => q,
        None => {
            drawn = crate::ir::random_quant(name, scheme, &node.ty.shape, bindings.seed)
                .map_err(err)?;
            &drawn
        }
    };
    q.check(scheme, &node.ty.shape).map_err(err)?;
    q.to_tensor(node.ty.dtype).map_err(err)
}

/// Whether `op` computes its value from its operands (so an empty value needs no computing).
/// Sources produce data from bindings or attributes; a gather checks its indices even when the
/// rows it picks are empty, a cache write checks where it writes (paged ones too), and a paged
/// attention checks its lengths and block tables.
fn computes(op: &Op) -> bool {
    !op.is_source()
        && !matches!(
            op,
            Op::Gather | Op::CacheWrite { .. } | Op::PagedCacheWrite | Op::PagedAttention { .. }
        )
}

/// Evaluates one node on its operand values.
fn eval(
    node: &Node,
    args: &[&Tensor],
    bindings: &Bindings,
    (weights, quantized): (&HashMap<String, Tensor>, &HashMap<String, QuantTensor>),
    states: &HashMap<String, Tensor>,
) -> Result<Tensor, InterpError> {
    let ty = &node.ty;
    let host = |source| InterpError::Host {
        node: node.name.clone(),
        source,
    };
    // An empty result is well defined whatever the operands are, and computing it could loop
    // over the non-empty axes of an empty tensor ([2^40, 0] has no elements but 2^40 rows).
    if computes(&node.op) && ty.shape.numel() == 0 {
        return Tensor::from_elements(ty.dtype, ty.shape.clone(), 0, std::iter::empty())
            .map_err(host);
    }
    let axis =
        |a: i64| normalize_axis(a, args[0].shape().rank()).expect("checked by shape inference");
    let value = match &node.op {
        Op::Input { .. } => {
            return bound(&node.name, ty, bindings.inputs.get(&node.name))?.ok_or_else(|| {
                InterpError::MissingInput {
                    name: node.name.clone(),
                    ty: ty.clone(),
                }
            })
        }
        Op::Weight {
            quant: Some(scheme),
            ..
        } => return quantized_weight(node, *scheme, bindings, quantized),
        Op::Weight { init, .. } => {
            let blocks = bindings.quantized.get(&node.name);
            if let Some(q) = blocks.or_else(|| quantized.get(&node.name)) {
                return Err(InterpError::QuantBinding {
                    name: node.name.clone(),
                    source: QuantError::Mismatch {
                        expected: format!("dense {ty}"),
                        got: q.describe(),
                    },
                });
            }
            match bound(
                &node.name,
                ty,
                bindings
                    .weights
                    .get(&node.name)
                    .or_else(|| weights.get(&node.name)),
            )? {
                Some(t) => Ok(t),
                None => random_weight(&node.name, ty, init, bindings.seed),
            }
        }
        Op::State { .. } => {
            // Checked against the graph by `state::check_against`.
            return bound(&node.name, ty, states.get(&node.name))?.ok_or_else(|| {
                InterpError::MissingState {
                    name: node.name.clone(),
                    ty: ty.clone(),
                }
            });
        }
        Op::CacheWrite { axis: a, rope } => {
            // A folded rope: the values rotated exactly as the `Op::Rope` it replaced.
            let rotated = match rope {
                Some(theta) => {
                    Some(attention::rope(args[1], *theta, 0, &[], Some(args[3])).map_err(host)?)
                }
                None => None,
            };
            let values = rotated.as_ref().unwrap_or(args[1]);
            return state::cache_write(&node.name, args[0], values, args[2], axis(*a));
        }
        Op::PagedCacheWrite => {
            return paged::paged_cache_write(&node.name, args[0], args[1], args[2]);
        }
        Op::PagedAttention {
            scale,
            window,
            append,
        } => {
            // The append form's q is this step's rows before rope, `[1, Hq, B·s, D]`: rotated
            // at the positions operand, then seen per sequence. k and v are the pools as this
            // step's writes left them (k_new, v_new and slots are what a kernel reads instead
            // of the pools' new rows: the same values).
            let seen;
            let q = match append {
                Some(ap) => {
                    let host = |source| InterpError::Host {
                        node: node.name.clone(),
                        source,
                    };
                    let roped = attention::rope(args[0], ap.theta, 0, &ap.factors, Some(args[5]))
                        .map_err(host)?;
                    seen = paged::per_sequence(&roped, ty.shape.dims()[0]).map_err(host)?;
                    &seen
                }
                None => args[0],
            };
            return paged::paged_attention(
                &node.name,
                (*scale, *window),
                (q, args[1], args[2]),
                (args[3], args[4]),
                ty,
            );
        }
        Op::ArgMax { axis: a } => reduce::argmax(args[0], axis(*a), ty),
        Op::Constant { values, .. } => Tensor::constant(ty, values),
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
        Op::Gather => return layout::gather_rows(&node.name, args[0], args[1], ty),
        Op::Binary(op) => elementwise::binary(*op, args[0], args[1], ty),
        Op::Where => elementwise::where_(args[0], args[1], args[2], ty),
        Op::Unary(op) => elementwise::unary(*op, args[0]),
        Op::Cast { to } => args[0].try_cast(*to),
        Op::Reduce { op, axes, .. } => {
            let axes = reduce_axes(axes, args[0].shape()).expect("checked by shape inference");
            reduce::reduce(*op, args[0], &axes, ty)
        }
        Op::Softmax { axis: a } => reduce::softmax(args[0], axis(*a)),
        Op::LayerNorm { eps } => reduce::norm(args[0], args[1], Some(args[2]), *eps, false),
        Op::RmsNorm { eps } => reduce::norm(args[0], args[1], None, *eps, true),
        Op::Rope {
            theta,
            offset,
            factors,
        } => attention::rope(args[0], *theta, *offset, factors, args.get(1).copied()),
        Op::MatMul => matmul::matmul(args[0], args[1], ty),
        Op::Gemm(g) => gemm::gemm(g, args, ty),
        Op::FusedElementwise(expr) => elementwise::fused(expr, args),
        Op::FlashAttention(att) => {
            let has_mask = att.mask != crate::ir::MaskKind::None;
            let mask = if has_mask { Some(args[3]) } else { None };
            let kv_len = match att.kv_len_slot() {
                Some(slot) => Some(state::kv_len(&node.name, args[slot], args[1])?),
                None => None,
            };
            // The append form rotates q at the positions operand first; k and v are the
            // caches as this step's writes left them (its k_new, v_new and start are what a
            // kernel reads instead of the caches' new rows: the same values).
            let roped;
            let q = match &att.append {
                Some(ap) => {
                    let positions = args[att.base_operands()];
                    roped = attention::rope(args[0], ap.theta, 0, &ap.factors, Some(positions))
                        .map_err(host)?;
                    &roped
                }
                None => args[0],
            };
            attention::flash_attention(att, (q, args[1], args[2]), mask, kv_len.as_deref(), ty)
        }
    };
    value.map_err(host)
}
