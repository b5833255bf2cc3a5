//! The op DAG: nodes carry an op, a unique name and their inferred type; edges run from operand
//! to consumer and carry the operand slot, so `mul(x, x)` is two edges.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::EdgeRef;
use petgraph::Direction;

use super::infer::{infer, InferError};
use super::op::{Attention, BinaryOp, Init, MaskKind, Op, ReduceOp, Sample, UnaryOp};
use super::{DType, GraphError, Shape, TensorType};

pub type NodeId = NodeIndex<u32>;

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub name: String,
    pub op: Op,
    pub ty: TensorType,
}

#[derive(Clone, Debug, Default)]
pub struct Graph {
    /// A label for dumps and reports (the file's `name`).
    pub name: String,
    /// Free text carried through files (what the graph is, where it came from).
    pub description: String,
    g: StableDiGraph<Node, u32>,
    names: HashMap<String, NodeId>,
    outputs: Vec<NodeId>,
    /// How many times each node appears in `outputs`, so output queries cost O(1) whatever the
    /// number of outputs (passes ask for every node they visit).
    output_uses: HashMap<NodeId, usize>,
    next_auto: usize,
}

/// Formats operand types for error messages: `(f32[2, 3], f32[3])`.
fn types_of(ins: &[&TensorType]) -> String {
    let parts: Vec<String> = ins.iter().map(|t| t.to_string()).collect();
    format!("({})", parts.join(", "))
}

impl Graph {
    pub fn new(name: impl Into<String>) -> Graph {
        Graph {
            name: name.into(),
            ..Graph::default()
        }
    }

    // ---- reading -------------------------------------------------------------------------

    pub fn node(&self, id: NodeId) -> &Node {
        &self.g[id]
    }

    pub fn try_node(&self, id: NodeId) -> Result<&Node, GraphError> {
        self.g
            .node_weight(id)
            .ok_or(GraphError::NoSuchNode { id: id.index() })
    }

    pub fn contains(&self, id: NodeId) -> bool {
        self.g.contains_node(id)
    }

    pub fn ty(&self, id: NodeId) -> &TensorType {
        &self.g[id].ty
    }

    pub fn op(&self, id: NodeId) -> &Op {
        &self.g[id].op
    }

    pub fn find(&self, name: &str) -> Option<NodeId> {
        self.names.get(name).copied()
    }

    pub fn node_count(&self) -> usize {
        self.g.node_count()
    }

    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.g.node_indices()
    }

    pub fn outputs(&self) -> &[NodeId] {
        &self.outputs
    }

    /// Operands of `id` in slot order.
    pub fn operands(&self, id: NodeId) -> Vec<NodeId> {
        let mut edges: Vec<(u32, NodeId)> = self
            .g
            .edges_directed(id, Direction::Incoming)
            .map(|e| (*e.weight(), e.source()))
            .collect();
        edges.sort_unstable();
        edges.into_iter().map(|(_, n)| n).collect()
    }

    /// Distinct consumers of `id` (a node using it twice is listed once).
    pub fn consumers(&self, id: NodeId) -> Vec<NodeId> {
        let mut out: Vec<NodeId> = self
            .g
            .edges_directed(id, Direction::Outgoing)
            .map(|e| e.target())
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// How many uses `id` has: operand slots that read it, plus one per graph output it is.
    pub fn use_count(&self, id: NodeId) -> usize {
        self.g.edges_directed(id, Direction::Outgoing).count()
            + self.output_uses.get(&id).copied().unwrap_or(0)
    }

    pub fn is_output(&self, id: NodeId) -> bool {
        self.output_uses.contains_key(&id)
    }

    /// Nodes in a topological order that keeps insertion order wherever the edges allow, so
    /// dumps read in the order a graph was written.
    pub fn topo_order(&self) -> Result<Vec<NodeId>, GraphError> {
        let mut indeg: HashMap<NodeId, usize> = self
            .g
            .node_indices()
            .map(|n| (n, self.g.edges_directed(n, Direction::Incoming).count()))
            .collect();
        let mut ready: BinaryHeap<Reverse<NodeId>> = indeg
            .iter()
            .filter(|(_, &d)| d == 0)
            .map(|(&n, _)| Reverse(n))
            .collect();
        let mut order = Vec::with_capacity(self.g.node_count());
        while let Some(Reverse(n)) = ready.pop() {
            order.push(n);
            for e in self.g.edges_directed(n, Direction::Outgoing) {
                let d = indeg.get_mut(&e.target()).expect("edge target is a node");
                *d -= 1;
                if *d == 0 {
                    ready.push(Reverse(e.target()));
                }
            }
        }
        if order.len() != self.g.node_count() {
            let stuck = self
                .g
                .node_indices()
                .filter(|n| indeg[n] > 0)
                .min()
                .expect("a cycle leaves a node with edges left");
            return Err(GraphError::Cycle {
                node: self.g[stuck].name.clone(),
            });
        }
        Ok(order)
    }

    /// Checks the whole graph: acyclic, every node's arity, operand slots and type consistent
    /// with its op, unique names, at least one output.
    pub fn validate(&self) -> Result<(), GraphError> {
        let order = self.topo_order()?;
        for id in order {
            let node = &self.g[id];
            let mut slots: Vec<u32> = self
                .g
                .edges_directed(id, Direction::Incoming)
                .map(|e| *e.weight())
                .collect();
            slots.sort_unstable();
            if slots.iter().enumerate().any(|(i, &s)| s as usize != i) {
                return Err(GraphError::Format {
                    reason: format!("node `{}` has operand slots {slots:?}", node.name),
                });
            }
            let ops = self.operands(id);
            let inferred = self.infer_for(&node.name, &node.op, &ops)?;
            if inferred != node.ty {
                return Err(GraphError::StaleType {
                    node: node.name.clone(),
                    stored: node.ty.to_string(),
                    inferred: inferred.to_string(),
                });
            }
            if self.names.get(&node.name) != Some(&id) {
                return Err(GraphError::DuplicateName {
                    node: node.name.clone(),
                });
            }
        }
        if self.outputs.is_empty() {
            return Err(GraphError::NoOutputs);
        }
        Ok(())
    }

    /// Infers the type `op` would have on `operands`, with errors naming `name`.
    pub fn infer_for(
        &self,
        name: &str,
        op: &Op,
        operands: &[NodeId],
    ) -> Result<TensorType, GraphError> {
        if !op.arity().accepts(operands.len()) {
            return Err(GraphError::Arity {
                node: name.to_string(),
                op: op.name().to_string(),
                expected: op.arity().to_string(),
                got: operands.len(),
            });
        }
        let mut tys = Vec::with_capacity(operands.len());
        for &o in operands {
            tys.push(&self.try_node(o)?.ty);
        }
        infer(op, &tys).map_err(|e| {
            let (node, opn, inputs) = (name.to_string(), op.name().to_string(), types_of(&tys));
            match e {
                InferError::Shape(reason) => GraphError::ShapeMismatch {
                    node,
                    op: opn,
                    inputs,
                    reason,
                },
                InferError::DType(reason) => GraphError::DTypeMismatch {
                    node,
                    op: opn,
                    inputs,
                    reason,
                },
                InferError::Attribute(reason) => GraphError::BadAttribute {
                    node,
                    op: opn,
                    reason,
                },
                InferError::Overflow(reason) => GraphError::Overflow {
                    node,
                    op: opn,
                    reason,
                },
            }
        })
    }

    // ---- building ------------------------------------------------------------------------

    /// Adds a node named `name` (or an automatic name when `None`), inferring its type.
    pub fn add_node(
        &mut self,
        name: Option<&str>,
        op: Op,
        operands: &[NodeId],
    ) -> Result<NodeId, GraphError> {
        let name = match name {
            Some(n) => {
                if self.names.contains_key(n) {
                    return Err(GraphError::DuplicateName {
                        node: n.to_string(),
                    });
                }
                n.to_string()
            }
            None => self.fresh_name(op.name()),
        };
        let ty = self.infer_for(&name, &op, operands)?;
        let id = self.g.add_node(Node {
            name: name.clone(),
            op,
            ty,
        });
        for (slot, &o) in operands.iter().enumerate() {
            self.g.add_edge(o, id, slot as u32);
        }
        self.names.insert(name, id);
        Ok(id)
    }

    /// Adds a node with an automatic name.
    pub fn add_op(&mut self, op: Op, operands: &[NodeId]) -> Result<NodeId, GraphError> {
        self.add_node(None, op, operands)
    }

    /// A name of the form `{base}_{n}` not yet used in the graph.
    pub fn fresh_name(&mut self, base: &str) -> String {
        loop {
            self.next_auto += 1;
            let candidate = format!("{base}_{}", self.next_auto);
            if !self.names.contains_key(&candidate) {
                return candidate;
            }
        }
    }

    /// Gives node `id` a new (unused) name.
    pub fn rename(&mut self, id: NodeId, name: &str) -> Result<(), GraphError> {
        let old = self.try_node(id)?.name.clone();
        if old == name {
            return Ok(());
        }
        if self.names.contains_key(name) {
            return Err(GraphError::DuplicateName {
                node: name.to_string(),
            });
        }
        self.names.remove(&old);
        self.names.insert(name.to_string(), id);
        self.g[id].name = name.to_string();
        Ok(())
    }

    pub fn add_output(&mut self, id: NodeId) -> Result<(), GraphError> {
        self.try_node(id)?;
        self.outputs.push(id);
        *self.output_uses.entry(id).or_insert(0) += 1;
        Ok(())
    }

    pub fn set_outputs(&mut self, ids: &[NodeId]) -> Result<(), GraphError> {
        for &id in ids {
            self.try_node(id)?;
        }
        self.outputs.clear();
        self.output_uses.clear();
        for &id in ids {
            self.add_output(id)?;
        }
        Ok(())
    }

    // ---- editing (used by passes) --------------------------------------------------------

    /// Points every use of `old` (operand slots and graph outputs) at `new`. The types must
    /// agree; `old` is left without consumers.
    pub fn replace_all_uses(&mut self, old: NodeId, new: NodeId) -> Result<(), GraphError> {
        let (old_ty, new_ty) = (
            self.try_node(old)?.ty.clone(),
            self.try_node(new)?.ty.clone(),
        );
        if old_ty != new_ty {
            return Err(GraphError::StaleType {
                node: self.g[old].name.clone(),
                stored: old_ty.to_string(),
                inferred: new_ty.to_string(),
            });
        }
        let uses: Vec<(petgraph::stable_graph::EdgeIndex<u32>, NodeId, u32)> = self
            .g
            .edges_directed(old, Direction::Outgoing)
            .map(|e| (e.id(), e.target(), *e.weight()))
            .collect();
        for (e, target, slot) in uses {
            self.g.remove_edge(e);
            self.g.add_edge(new, target, slot);
        }
        if let Some(k) = self.output_uses.remove(&old) {
            for o in &mut self.outputs {
                if *o == old {
                    *o = new;
                }
            }
            *self.output_uses.entry(new).or_insert(0) += k;
        }
        Ok(())
    }

    /// Removes a node and its edges. The caller makes sure nothing still needs it.
    pub fn remove_node(&mut self, id: NodeId) -> Option<Node> {
        let node = self.g.remove_node(id)?;
        self.names.remove(&node.name);
        if self.output_uses.remove(&id).is_some() {
            self.outputs.retain(|&o| o != id);
        }
        Some(node)
    }

    // ---- builder sugar -------------------------------------------------------------------

    pub fn input(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[usize],
    ) -> Result<NodeId, GraphError> {
        let op = Op::Input {
            dtype,
            shape: Shape::new(shape.to_vec()),
            sample: Sample::Normal,
        };
        self.add_node(Some(name), op, &[])
    }

    pub fn input_sampled(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[usize],
        sample: Sample,
    ) -> Result<NodeId, GraphError> {
        let op = Op::Input {
            dtype,
            shape: Shape::new(shape.to_vec()),
            sample,
        };
        self.add_node(Some(name), op, &[])
    }

    pub fn weight(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[usize],
    ) -> Result<NodeId, GraphError> {
        self.weight_init(name, dtype, shape, Init::Normal)
    }

    pub fn weight_init(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[usize],
        init: Init,
    ) -> Result<NodeId, GraphError> {
        let op = Op::Weight {
            dtype,
            shape: Shape::new(shape.to_vec()),
            init,
        };
        self.add_node(Some(name), op, &[])
    }

    pub fn scalar(&mut self, value: f64, dtype: DType) -> Result<NodeId, GraphError> {
        self.constant(dtype, &[], vec![value])
    }

    pub fn constant(
        &mut self,
        dtype: DType,
        shape: &[usize],
        values: Vec<f64>,
    ) -> Result<NodeId, GraphError> {
        let op = Op::Constant {
            dtype,
            shape: Shape::new(shape.to_vec()),
            values,
        };
        self.add_op(op, &[])
    }

    pub fn causal_mask(&mut self, sq: usize, sk: usize, offset: i64) -> Result<NodeId, GraphError> {
        self.add_op(Op::CausalMask { sq, sk, offset }, &[])
    }

    pub fn reshape(&mut self, x: NodeId, shape: &[i64]) -> Result<NodeId, GraphError> {
        self.add_op(
            Op::Reshape {
                shape: shape.to_vec(),
            },
            &[x],
        )
    }

    pub fn permute(&mut self, x: NodeId, perm: &[usize]) -> Result<NodeId, GraphError> {
        self.add_op(
            Op::Permute {
                perm: perm.to_vec(),
            },
            &[x],
        )
    }

    /// Swaps the last two axes.
    pub fn transpose_last(&mut self, x: NodeId) -> Result<NodeId, GraphError> {
        let r = self.try_node(x)?.ty.shape.rank();
        let mut perm: Vec<usize> = (0..r).collect();
        if r >= 2 {
            perm.swap(r - 1, r - 2);
        }
        self.permute(x, &perm)
    }

    pub fn expand(&mut self, x: NodeId, shape: &[usize]) -> Result<NodeId, GraphError> {
        self.add_op(
            Op::Expand {
                shape: shape.to_vec(),
            },
            &[x],
        )
    }

    pub fn concat(&mut self, xs: &[NodeId], axis: i64) -> Result<NodeId, GraphError> {
        self.add_op(Op::Concat { axis }, xs)
    }

    pub fn slice(
        &mut self,
        x: NodeId,
        axis: i64,
        start: i64,
        end: i64,
    ) -> Result<NodeId, GraphError> {
        self.add_op(Op::Slice { axis, start, end }, &[x])
    }

    pub fn gather(&mut self, table: NodeId, indices: NodeId) -> Result<NodeId, GraphError> {
        self.add_op(Op::Gather, &[table, indices])
    }

    pub fn binary(&mut self, op: BinaryOp, a: NodeId, b: NodeId) -> Result<NodeId, GraphError> {
        self.add_op(Op::Binary(op), &[a, b])
    }

    pub fn unary(&mut self, op: UnaryOp, x: NodeId) -> Result<NodeId, GraphError> {
        self.add_op(Op::Unary(op), &[x])
    }

    pub fn where_(&mut self, cond: NodeId, a: NodeId, b: NodeId) -> Result<NodeId, GraphError> {
        self.add_op(Op::Where, &[cond, a, b])
    }

    pub fn cast(&mut self, x: NodeId, to: DType) -> Result<NodeId, GraphError> {
        self.add_op(Op::Cast { to }, &[x])
    }

    pub fn reduce(
        &mut self,
        op: ReduceOp,
        x: NodeId,
        axes: &[i64],
        keepdim: bool,
    ) -> Result<NodeId, GraphError> {
        let op = Op::Reduce {
            op,
            axes: axes.to_vec(),
            keepdim,
        };
        self.add_op(op, &[x])
    }

    pub fn softmax(&mut self, x: NodeId, axis: i64) -> Result<NodeId, GraphError> {
        self.add_op(Op::Softmax { axis }, &[x])
    }

    pub fn layer_norm(
        &mut self,
        x: NodeId,
        w: NodeId,
        b: NodeId,
        eps: f64,
    ) -> Result<NodeId, GraphError> {
        self.add_op(Op::LayerNorm { eps }, &[x, w, b])
    }

    pub fn rms_norm(&mut self, x: NodeId, w: NodeId, eps: f64) -> Result<NodeId, GraphError> {
        self.add_op(Op::RmsNorm { eps }, &[x, w])
    }

    pub fn rope(&mut self, x: NodeId, theta: f64, offset: i64) -> Result<NodeId, GraphError> {
        self.add_op(Op::Rope { theta, offset }, &[x])
    }

    pub fn matmul(&mut self, a: NodeId, b: NodeId) -> Result<NodeId, GraphError> {
        self.add_op(Op::MatMul, &[a, b])
    }

    /// FlashAttention; the mask kind follows the mask operand's dtype.
    pub fn flash_attention(
        &mut self,
        q: NodeId,
        k: NodeId,
        v: NodeId,
        mask: Option<NodeId>,
        scale: f64,
        causal: Option<i64>,
    ) -> Result<NodeId, GraphError> {
        let mask_kind = match mask {
            None => MaskKind::None,
            Some(m) if self.try_node(m)?.ty.dtype == DType::Bool => MaskKind::Boolean,
            Some(_) => MaskKind::Additive,
        };
        let att = Attention {
            scale,
            causal: causal.is_some(),
            causal_offset: causal.unwrap_or(0),
            mask: mask_kind,
        };
        let mut operands = vec![q, k, v];
        operands.extend(mask);
        self.add_op(Op::FlashAttention(att), &operands)
    }
}

macro_rules! binary_builders {
    ($($fn_name:ident => $variant:ident),* $(,)?) => {
        impl Graph {
            $(
                pub fn $fn_name(&mut self, a: NodeId, b: NodeId) -> Result<NodeId, GraphError> {
                    self.binary(BinaryOp::$variant, a, b)
                }
            )*
        }
    };
}

macro_rules! unary_builders {
    ($($fn_name:ident => $variant:ident),* $(,)?) => {
        impl Graph {
            $(
                pub fn $fn_name(&mut self, x: NodeId) -> Result<NodeId, GraphError> {
                    self.unary(UnaryOp::$variant, x)
                }
            )*
        }
    };
}

binary_builders!(
    add => Add, sub => Sub, mul => Mul, div => Div, pow => Pow, maximum => Maximum,
    minimum => Minimum, equal => Equal, less => Less, greater => Greater,
);

unary_builders!(
    neg => Neg, abs => Abs, exp => Exp, log => Log, sqrt => Sqrt, rsqrt => Rsqrt, recip => Recip,
    tanh => Tanh, erf => Erf, sigmoid => Sigmoid, silu => Silu, gelu => Gelu, gelu_tanh => GeluTanh,
);
