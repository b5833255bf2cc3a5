//! The op DAG: nodes carry an op, a unique name and their inferred type, their operands in
//! slot order (so `mul(x, x)` reads `x` twice) and their consumers.
//!
//! Nodes live in a petgraph `StableDiGraph`, which gives stable ids and reuses the slot of a
//! removed node for the next one added (so ids, and the dumps ordered by them, are the same
//! however a graph was edited). Its edges are not used: petgraph keeps a node's edges in a
//! singly linked list, so removing an edge costs the degree of its endpoints, and a pass that
//! removes the consumers of a value read a hundred thousand times (a shared constant or mask)
//! would be quadratic. Each node keeps its operands in a vector and its consumers in a map, so
//! every edit costs the node's own arity.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::NodeIndexable;

use super::error::GraphError;
use super::infer::{infer, InferError};
use super::op::Op;
use super::shape::TensorType;
use super::work;

pub type NodeId = NodeIndex<u32>;

/// A map keyed by node id, hashed by [`NodeIdHasher`].
pub type NodeMap<V> = HashMap<NodeId, V, BuildHasherDefault<NodeIdHasher>>;
/// A set of node ids, hashed by [`NodeIdHasher`].
pub type NodeSet = HashSet<NodeId, BuildHasherDefault<NodeIdHasher>>;

/// Hashes node ids with a multiplication. Ids are small integers the graph hands out in order,
/// never text from a file, so SipHash's defence against chosen keys buys nothing here, and it
/// cost a third of the time of the passes on a graph of a million nodes.
#[derive(Clone, Copy, Debug, Default)]
pub struct NodeIdHasher(u64);

impl Hasher for NodeIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        // Fibonacci hashing: the golden-ratio multiplier spreads consecutive ids over the high
        // bits, which the hash table reads first.
        self.0 = (self.0.rotate_left(26) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub name: String,
    pub op: Op,
    pub ty: TensorType,
}

/// A node with its edges.
#[derive(Clone, Debug)]
struct Slot {
    node: Node,
    /// Operands in slot order.
    operands: Vec<NodeId>,
    /// Each consumer, with the operand slots of it that read this node (so replacing a value
    /// rewrites those slots without scanning a concat of a hundred thousand operands).
    users: NodeMap<Slots>,
    /// The number of operand slots, over all consumers, that read this node.
    reads: usize,
}

/// Operand slots of one consumer; almost always one, kept without allocating.
#[derive(Clone, Debug)]
enum Slots {
    One(u32),
    Many(Vec<u32>),
}

impl Slots {
    fn len(&self) -> usize {
        match self {
            Slots::One(_) => 1,
            Slots::Many(v) => v.len(),
        }
    }

    fn to_vec(&self) -> Vec<u32> {
        match self {
            Slots::One(s) => vec![*s],
            Slots::Many(v) => v.clone(),
        }
    }

    fn push(&mut self, slot: u32) {
        match self {
            Slots::One(s) => *self = Slots::Many(vec![*s, slot]),
            Slots::Many(v) => v.push(slot),
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct Graph {
    /// A label for dumps and reports (the file's `name`).
    pub name: String,
    /// Free text carried through files (what the graph is, where it came from).
    pub description: String,
    g: StableDiGraph<Slot, ()>,
    names: HashMap<String, NodeId>,
    outputs: Vec<NodeId>,
    /// How many times each node appears in `outputs`, so output queries cost O(1) whatever the
    /// number of outputs (passes ask for every node they visit).
    output_uses: NodeMap<usize>,
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
        work::visit(1);
        &self.g[id].node
    }

    pub fn try_node(&self, id: NodeId) -> Result<&Node, GraphError> {
        work::visit(1);
        self.g
            .node_weight(id)
            .map(|s| &s.node)
            .ok_or(GraphError::NoSuchNode { id: id.index() })
    }

    pub fn contains(&self, id: NodeId) -> bool {
        self.g.contains_node(id)
    }

    pub fn ty(&self, id: NodeId) -> &TensorType {
        work::visit(1);
        &self.g[id].node.ty
    }

    pub fn op(&self, id: NodeId) -> &Op {
        work::visit(1);
        &self.g[id].node.op
    }

    pub fn find(&self, name: &str) -> Option<NodeId> {
        self.names.get(name).copied()
    }

    pub fn node_count(&self) -> usize {
        self.g.node_count()
    }

    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.g.node_indices().inspect(|_| work::visit(1))
    }

    pub fn outputs(&self) -> &[NodeId] {
        &self.outputs
    }

    /// Operands of `id` in slot order.
    pub fn operands(&self, id: NodeId) -> Vec<NodeId> {
        work::visit(1);
        self.g[id].operands.clone()
    }

    /// Distinct consumers of `id` (a node using it twice is listed once), in id order.
    pub fn consumers(&self, id: NodeId) -> Vec<NodeId> {
        work::visit(1);
        let mut out: Vec<NodeId> = self.g[id].users.keys().copied().collect();
        out.sort_unstable();
        out
    }

    /// How many uses `id` has: operand slots that read it, plus one per graph output it is.
    pub fn use_count(&self, id: NodeId) -> usize {
        work::visit(1);
        self.g[id].reads + self.output_uses.get(&id).copied().unwrap_or(0)
    }

    pub fn is_output(&self, id: NodeId) -> bool {
        self.output_uses.contains_key(&id)
    }

    /// Nodes in a topological order that keeps insertion order wherever the edges allow, so
    /// dumps read in the order a graph was written.
    pub fn topo_order(&self) -> Result<Vec<NodeId>, GraphError> {
        // Where every operand has a smaller index than its reader (a graph built or loaded in
        // order, before a pass reuses a freed slot), index order is the order the heap below
        // would give: the smallest node not yet ordered has all its operands ordered, so it is
        // the smallest ready one. Checking that costs one look per operand and no heap; the
        // passes and validation sort a million-node graph twenty-odd times.
        let mut ids = Vec::with_capacity(self.g.node_count());
        let mut in_index_order = true;
        for n in self.g.node_indices() {
            // A dangling operand (a removed node) also takes the path below, which names it.
            if self.g[n]
                .operands
                .iter()
                .any(|&o| o >= n || !self.g.contains_node(o))
            {
                in_index_order = false;
                break;
            }
            ids.push(n);
        }
        if in_index_order {
            work::visit(ids.len() as u64);
            return Ok(ids);
        }
        drop(ids);
        // Operands not yet ordered, by node index (vacant slots are never read).
        let mut indeg = vec![0usize; self.g.node_bound()];
        let mut ready: BinaryHeap<Reverse<NodeId>> = BinaryHeap::new();
        for n in self.g.node_indices() {
            let operands = &self.g[n].operands;
            // Only a removed node that still had a consumer leaves an operand dangling.
            if let Some(o) = operands.iter().find(|&&o| !self.g.contains_node(o)) {
                return Err(GraphError::DanglingInput {
                    node: self.g[n].node.name.clone(),
                    input: format!("#{} (a removed node)", o.index()),
                });
            }
            indeg[n.index()] = operands.len();
            if indeg[n.index()] == 0 {
                ready.push(Reverse(n));
            }
        }
        let mut order = Vec::with_capacity(self.g.node_count());
        while let Some(Reverse(n)) = ready.pop() {
            work::visit(1);
            order.push(n);
            for (&user, slots) in &self.g[n].users {
                let d = &mut indeg[user.index()];
                *d -= slots.len();
                if *d == 0 {
                    ready.push(Reverse(user));
                }
            }
        }
        if order.len() != self.g.node_count() {
            let stuck = self
                .g
                .node_indices()
                .find(|n| indeg[n.index()] > 0)
                .expect("a cycle leaves a node with operands left");
            return Err(GraphError::Cycle {
                node: self.g[stuck].node.name.clone(),
            });
        }
        Ok(order)
    }

    /// Checks the whole graph: acyclic, every node's arity and type consistent with its op, at
    /// least one output. (Names are unique by construction: `add_node` and `rename` refuse a
    /// name in use.)
    pub fn validate(&self) -> Result<(), GraphError> {
        let order = self.topo_order()?;
        for id in order {
            let node = &self.g[id].node;
            let ops = self.operands(id);
            let inferred = self.infer_for(&node.name, &node.op, &ops)?;
            if inferred != node.ty {
                return Err(GraphError::StaleType {
                    node: node.name.clone(),
                    stored: node.ty.to_string(),
                    inferred: inferred.to_string(),
                });
            }
        }
        if self.outputs.is_empty() {
            return Err(GraphError::NoOutputs);
        }
        self.check_state_writes()
    }

    /// Every cache write (contiguous or paged) writes a state that nothing else reads (so
    /// writing it in place is sound: no other reader can see the state before or after the
    /// write).
    pub fn check_state_writes(&self) -> Result<(), GraphError> {
        for id in self.node_ids() {
            if !matches!(self.op(id), Op::CacheWrite { .. } | Op::PagedCacheWrite) {
                continue;
            }
            let state = self.g[id].operands[0];
            let reason = if !matches!(self.op(state), Op::State { .. }) {
                format!(
                    "its first operand `{}` is a {}, not a state",
                    self.node(state).name,
                    self.op(state).name()
                )
            } else if self.use_count(state) != 1 {
                format!(
                    "its state `{}` has other uses (a cache write must be its only reader)",
                    self.node(state).name
                )
            } else {
                continue;
            };
            return Err(GraphError::StateWrite {
                node: self.node(id).name.clone(),
                reason,
            });
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
                InferError::Window(error) => GraphError::BadWindow {
                    node,
                    op: opn,
                    error,
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
        // Slots are numbered in u32 (no file can list 2^32 operands, but say so if one does).
        if u32::try_from(operands.len()).is_err() {
            return Err(GraphError::Arity {
                node: name,
                op: op.name().to_string(),
                expected: format!("at most {}", u32::MAX),
                got: operands.len(),
            });
        }
        let id = self.g.add_node(Slot {
            node: Node {
                name: name.clone(),
                op,
                ty,
            },
            operands: operands.to_vec(),
            users: NodeMap::default(),
            reads: 0,
        });
        for (slot, &o) in operands.iter().enumerate() {
            self.read(o, id, slot as u32);
        }
        self.names.insert(name, id);
        Ok(id)
    }

    /// Records that operand slot `slot` of `user` reads `id`.
    fn read(&mut self, id: NodeId, user: NodeId, slot: u32) {
        let node = &mut self.g[id];
        match node.users.get_mut(&user) {
            Some(slots) => slots.push(slot),
            None => {
                node.users.insert(user, Slots::One(slot));
            }
        }
        node.reads += 1;
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
        self.g[id].node.name = name.to_string();
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
                node: self.g[old].node.name.clone(),
                stored: old_ty.to_string(),
                inferred: new_ty.to_string(),
            });
        }
        if old == new {
            return Ok(());
        }
        let users = std::mem::take(&mut self.g[old].users);
        self.g[old].reads = 0;
        for (user, slots) in users {
            for slot in slots.to_vec() {
                self.g[user].operands[slot as usize] = new;
                self.read(new, user, slot);
            }
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

    /// Removes a node. The caller makes sure nothing still needs it: a consumer left behind
    /// keeps an operand that is no longer in the graph, which validation reports.
    pub fn remove_node(&mut self, id: NodeId) -> Option<Node> {
        let slot = self.g.remove_node(id)?;
        for &o in &slot.operands {
            if let Some(s) = self.g.node_weight_mut(o) {
                if let Some(slots) = s.users.remove(&id) {
                    s.reads -= slots.len();
                }
            }
        }
        self.names.remove(&slot.node.name);
        if self.output_uses.remove(&id).is_some() {
            self.outputs.retain(|&o| o != id);
        }
        Some(slot.node)
    }
}
