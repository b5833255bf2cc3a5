//! The forward pass lowered into a graph: embeddings, the layers (RMSNorm, Q/K/V, RoPE, GQA
//! attention through an `AttentionStep`: a whole prompt, or a step with a KV cache), the final
//! norm and the LM head.

use super::super::nn::{self, Heads, RopeSpec};
use super::{file_tensor, lm_head, LlamaModel, Logits, Precision, BLOCKS_SUFFIX};
use crate::ir::{DType, Graph, GraphError, NodeId, QuantScheme, Sample};

/// Where the logits are computed, inside a graph.
#[derive(Clone, Copy)]
pub(super) enum Head {
    All,
    Last,
    /// The row a graph input (i32 `[1]`) names.
    Row(NodeId),
    /// The last of each `seqs` runs of equal length the rows split into (each sequence's
    /// last token, in a [`Paged`] step), with their argmaxes.
    LastOfEach(usize),
}

/// The names of a KV-cache graph's inputs and outputs.
pub mod io {
    /// i64 `[1, s]`: this step's token ids.
    pub const INPUT_IDS: &str = "input_ids";
    /// i32 `[s]`: the position of each of this step's tokens.
    pub const POSITIONS: &str = "positions";
    /// i32 `[1]`: where this step's K/V rows are written in the caches.
    pub const START: &str = "start";
    /// i32 `[1]`: how many cache rows the attention reads (this step's included).
    pub const KV_LEN: &str = "kv_len";
    /// i32 `[1]`: the row of this step whose logits are computed (the last real token).
    pub const LAST: &str = "last";
    /// i32 `[1]`: the argmax of the logits (ties to the first).
    pub const TOKEN: &str = "token";
    /// f32 `[1, vocab]`, where asked for.
    pub const LOGITS: &str = "logits";

    /// The K cache of layer `l`.
    pub fn cache_k(l: usize) -> String {
        format!("cache.k.{l}")
    }

    /// The V cache of layer `l`.
    pub fn cache_v(l: usize) -> String {
        format!("cache.v.{l}")
    }
}

/// The names of a paged graph's inputs and outputs besides [`io`]'s (`input_ids` `[1, b·s]`,
/// `positions` `[b·s]`, `kv_len` `[b]`, `token` `[b]`, `logits` `[b, vocab]`).
pub mod paged_io {
    /// i32 `[1, b·s]`: the pool slot each new token's K/V row goes to (negative: padding, not
    /// written).
    pub const SLOTS: &str = "slots";
    /// i32 `[b, max_blocks]`: each sequence's blocks, in order.
    pub const BLOCK_TABLE: &str = "block_table";

    /// The K pool of layer `l`.
    pub fn pool_k(l: usize) -> String {
        format!("pool.k.{l}")
    }

    /// The V pool of layer `l`.
    pub fn pool_v(l: usize) -> String {
        format!("pool.v.{l}")
    }
}

/// The shape of a paged KV cache: every layer's K and V pools are `[num_blocks, Hkv,
/// block_size, D]`; a sequence holds at most `max_blocks` of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolShape {
    pub num_blocks: usize,
    pub block_size: usize,
    pub max_blocks: usize,
}

impl PoolShape {
    /// The `slots` input of a step of `rows` new rows (i32 `[1, rows]`).
    fn slots(&self, g: &mut Graph, rows: usize) -> Result<NodeId, GraphError> {
        g.input_sampled(
            paged_io::SLOTS,
            DType::I32,
            &[1, rows],
            Sample::Range {
                low: -1,
                high: (self.num_blocks * self.block_size) as i64,
            },
        )
    }

    /// Layer `layer`'s K and V pools with this step's rows `k`, `v` (`[1, Hkv, rows, D]`)
    /// written at `slots`: the pools' next values.
    fn write(
        &self,
        g: &mut Graph,
        layer: usize,
        (k, v): (NodeId, NodeId),
        slots: NodeId,
        heads: Heads,
        dt: DType,
    ) -> Result<(NodeId, NodeId), GraphError> {
        let shape = [self.num_blocks, heads.kv, self.block_size, heads.dim];
        let kp = g.state(&paged_io::pool_k(layer), dt, &shape)?;
        let vp = g.state(&paged_io::pool_v(layer), dt, &shape)?;
        Ok((
            g.paged_cache_write(kp, k, slots)?,
            g.paged_cache_write(vp, v, slots)?,
        ))
    }
}

/// A step of `seqs` sequences of `s` new tokens each through a paged KV cache: the tokens are
/// the rows of the step, sequence-major; each layer writes their K/V rows to the pool slots
/// `slots` names and attends, per sequence, over the first `kv_len[b]` keys its block table
/// reaches, the sequence's `s` queries being the last `s` of them. A decode step of `b`
/// sequences is `(b, 1)`; a prefill of one prompt left-padded to `s` rows is `(1, s)` with
/// padding slots negative (not written), so each real row sees exactly its causal prefix and
/// the last row is the prompt's last token.
pub struct Paged {
    pub seqs: usize,
    pub s: usize,
    pub pool: PoolShape,
    inputs: Option<(NodeId, NodeId, NodeId, NodeId)>,
}

impl Paged {
    pub fn new(seqs: usize, s: usize, pool: PoolShape) -> Paged {
        Paged {
            seqs,
            s,
            pool,
            inputs: None,
        }
    }

    /// `positions`, `slots`, `block_table` and `kv_len`, made on first use.
    fn inputs(&mut self, g: &mut Graph) -> Result<(NodeId, NodeId, NodeId, NodeId), GraphError> {
        if let Some(i) = self.inputs {
            return Ok(i);
        }
        let PoolShape {
            num_blocks,
            block_size,
            max_blocks,
        } = self.pool;
        let rows = self.seqs * self.s;
        let reach = (max_blocks * block_size) as i64;
        let positions = g.input_sampled(
            io::POSITIONS,
            DType::I32,
            &[rows],
            Sample::Range {
                low: 0,
                high: reach.max(1),
            },
        )?;
        let slots = self.pool.slots(g, rows)?;
        let table = g.input_sampled(
            paged_io::BLOCK_TABLE,
            DType::I32,
            &[self.seqs, max_blocks],
            Sample::Range {
                low: 0,
                high: num_blocks as i64,
            },
        )?;
        let kv_len = g.input_sampled(
            io::KV_LEN,
            DType::I32,
            &[self.seqs],
            Sample::Range {
                low: self.s as i64,
                high: reach + 1,
            },
        )?;
        self.inputs = Some((positions, slots, table, kv_len));
        Ok((positions, slots, table, kv_len))
    }

    /// `[1, H, b·s, D]` (rows sequence-major) as `[b, H, s, D]`, or back (`back`).
    fn per_sequence(
        &self,
        g: &mut Graph,
        x: NodeId,
        heads: usize,
        d: usize,
        back: bool,
    ) -> Result<NodeId, GraphError> {
        let (b, s) = (self.seqs as i64, self.s as i64);
        if b == 1 {
            return Ok(x);
        }
        if s == 1 {
            // Swapping the two axes of which one has a single element moves no data.
            return g.permute(x, &[2, 1, 0, 3]);
        }
        let (h, d) = (heads as i64, d as i64);
        if back {
            let p = g.permute(x, &[1, 0, 2, 3])?;
            g.reshape(p, &[1, h, b * s, d])
        } else {
            let r = g.reshape(x, &[h, b, s, d])?;
            g.permute(r, &[1, 0, 2, 3])
        }
    }
}

impl AttentionStep for Paged {
    fn rope(&mut self, g: &mut Graph, x: NodeId, spec: &RopeSpec) -> Result<NodeId, GraphError> {
        let (positions, _, _, _) = self.inputs(g)?;
        nn::rope(g, x, Some(positions), spec)
    }

    fn attend(
        &mut self,
        g: &mut Graph,
        layer: usize,
        q: NodeId,
        k: NodeId,
        v: NodeId,
        heads: Heads,
        window: Option<usize>,
        dt: DType,
    ) -> Result<NodeId, GraphError> {
        let (_, slots, table, kv_len) = self.inputs(g)?;
        // The rows go to their slots as they come: [1, Hkv, b·s, D] with slots [1, b·s].
        let (kp, vp) = self.pool.write(g, layer, (k, v), slots, heads, dt)?;
        let q = self.per_sequence(g, q, heads.q, heads.dim, false)?;
        let scale = 1.0 / (heads.dim as f64).sqrt();
        // The window where it hides a key of the table's reach (the paged kernels skip the
        // blocks before it).
        let reach = self.pool.max_blocks.saturating_mul(self.pool.block_size);
        let reach = i64::try_from(reach).unwrap_or(i64::MAX);
        let window = nn::window_u32(window, reach);
        let ctx = g.paged_attention_windowed((q, kp, vp), table, kv_len, scale, window)?;
        let ctx = self.per_sequence(g, ctx, heads.q, heads.dim, true)?;
        nn::merge_heads(g, ctx, 1, self.seqs * self.s, heads.q, heads.dim)
    }
}

/// A chunk of one sequence's prompt: `s` new tokens (left-padded; padding rows write no slot)
/// at the positions `positions` holds, whose K/V rows go to the pools at `slots`, attending
/// causally, as the last `s` of the `kv_len` keys, over the sequence's rows gathered from the
/// pools through its block table (`[1, max_blocks]`): those earlier chunks (or a shared prefix)
/// wrote, and this chunk's. The inputs are [`Paged`]'s for one sequence; the attention is the
/// prompt's flash attention over the gathered rows rather than `Op::PagedAttention`, whose
/// kernels serve a decode step's few query rows per K/V head, not a chunk's hundreds. The
/// gather copies the table's whole reach (`max_blocks · block_size` rows a layer), small next
/// to a chunk's matrix products.
pub struct PagedChunk(Paged);

impl PagedChunk {
    pub fn new(s: usize, pool: PoolShape) -> PagedChunk {
        PagedChunk(Paged::new(1, s, pool))
    }

    /// Pool `pool` (`[num_blocks, Hkv, block_size, D]`) read through `table` (`[1,
    /// max_blocks]`) as one sequence's contiguous cache `[1, Hkv, max_blocks · block_size, D]`.
    fn gathered(
        &self,
        g: &mut Graph,
        pool: NodeId,
        table: NodeId,
        heads: Heads,
    ) -> Result<NodeId, GraphError> {
        let PoolShape {
            block_size,
            max_blocks,
            ..
        } = self.0.pool;
        let (n, bs, hkv, d) = (
            max_blocks as i64,
            block_size as i64,
            heads.kv as i64,
            heads.dim as i64,
        );
        let ids = g.reshape(table, &[n])?;
        let blocks = g.gather(pool, ids)?;
        let heads_first = g.permute(blocks, &[1, 0, 2, 3])?;
        g.reshape(heads_first, &[1, hkv, n * bs, d])
    }
}

impl AttentionStep for PagedChunk {
    fn rope(&mut self, g: &mut Graph, x: NodeId, spec: &RopeSpec) -> Result<NodeId, GraphError> {
        self.0.rope(g, x, spec)
    }

    fn attend(
        &mut self,
        g: &mut Graph,
        layer: usize,
        q: NodeId,
        k: NodeId,
        v: NodeId,
        heads: Heads,
        window: Option<usize>,
        dt: DType,
    ) -> Result<NodeId, GraphError> {
        let (_, slots, table, kv_len) = self.0.inputs(g)?;
        // Written first: the gathered rows include this chunk's.
        let (kp, vp) = self.0.pool.write(g, layer, (k, v), slots, heads, dt)?;
        let kc = self.gathered(g, kp, table, heads)?;
        let vc = self.gathered(g, vp, table, heads)?;
        let scale = 1.0 / (heads.dim as f64).sqrt();
        let reach = self
            .0
            .pool
            .max_blocks
            .saturating_mul(self.0.pool.block_size);
        let reach = i64::try_from(reach).unwrap_or(i64::MAX);
        let ctx = match nn::window_u32(window, reach) {
            None => g.flash_attention_len((q, kc, vc), kv_len, scale, true)?,
            Some(w) => g.flash_attention_windowed((q, kc, vc), Some(kv_len), scale, 0, Some(w))?,
        };
        nn::merge_heads(g, ctx, 1, self.0.s, heads.q, heads.dim)
    }
}

/// A prompt of `s` tokens (right-padded) at positions `0..s`, attending causally over itself
/// as [`Prefill`] does, whose K/V rows also go to the paged pools at `slots` (i32 `[1, s]`;
/// negative: not written: padding, or rows a shared prefix already holds). The prompt is
/// computed whole even where its prefix is shared: the paged attention kernels serve a few
/// query rows per K/V head (decode), and the prefill's own attention needs no pool.
pub struct PagedPrefill {
    pub s: usize,
    pub pool: PoolShape,
    slots: Option<NodeId>,
}

impl PagedPrefill {
    pub fn new(s: usize, pool: PoolShape) -> PagedPrefill {
        PagedPrefill {
            s,
            pool,
            slots: None,
        }
    }
}

impl AttentionStep for PagedPrefill {
    fn rope(&mut self, g: &mut Graph, x: NodeId, spec: &RopeSpec) -> Result<NodeId, GraphError> {
        nn::rope(g, x, None, spec)
    }

    fn attend(
        &mut self,
        g: &mut Graph,
        layer: usize,
        q: NodeId,
        k: NodeId,
        v: NodeId,
        heads: Heads,
        window: Option<usize>,
        dt: DType,
    ) -> Result<NodeId, GraphError> {
        let slots = match self.slots {
            Some(s) => s,
            None => *self.slots.insert(self.pool.slots(g, self.s)?),
        };
        // Nothing in this graph reads the pools back: the writes are live as state updates.
        self.pool.write(g, layer, (k, v), slots, heads, dt)?;
        nn::causal_attention(g, q, k, v, heads, 1, self.s, self.s, 0, window, dt)
    }
}

/// A step of `s` tokens with a KV cache: each layer keeps `cache.k.{l}` / `cache.v.{l}`
/// (`[1, Hkv, max_context, D]` states), ropes at the positions `positions` holds, writes this
/// step's K/V at `start` and attends over the first `kv_len` cache rows, causally with this
/// step's queries the last `s` of them. The inputs are made at the first layer.
pub struct KvCache {
    pub s: usize,
    pub max_context: usize,
    inputs: Option<(NodeId, NodeId, NodeId)>,
}

impl KvCache {
    pub fn new(s: usize, max_context: usize) -> KvCache {
        KvCache {
            s,
            max_context,
            inputs: None,
        }
    }

    /// `positions`, `start` and `kv_len`, made on first use.
    fn inputs(&mut self, g: &mut Graph) -> Result<(NodeId, NodeId, NodeId), GraphError> {
        if let Some(i) = self.inputs {
            return Ok(i);
        }
        let max = self.max_context as i64;
        let positions = g.input_sampled(
            io::POSITIONS,
            DType::I32,
            &[self.s],
            Sample::Range { low: 0, high: max },
        )?;
        let start = g.input_sampled(
            io::START,
            DType::I32,
            &[1],
            Sample::Range {
                low: 0,
                high: (max - self.s as i64 + 1).max(1),
            },
        )?;
        let kv_len = g.input_sampled(
            io::KV_LEN,
            DType::I32,
            &[1],
            Sample::Range {
                low: self.s as i64,
                high: max + 1,
            },
        )?;
        self.inputs = Some((positions, start, kv_len));
        Ok((positions, start, kv_len))
    }
}

impl AttentionStep for KvCache {
    fn rope(&mut self, g: &mut Graph, x: NodeId, spec: &RopeSpec) -> Result<NodeId, GraphError> {
        let (positions, _, _) = self.inputs(g)?;
        nn::rope(g, x, Some(positions), spec)
    }

    fn attend(
        &mut self,
        g: &mut Graph,
        layer: usize,
        q: NodeId,
        k: NodeId,
        v: NodeId,
        heads: Heads,
        window: Option<usize>,
        dt: DType,
    ) -> Result<NodeId, GraphError> {
        let (_, start, kv_len) = self.inputs(g)?;
        let shape = [1, heads.kv, self.max_context, heads.dim];
        let kc = g.state(&io::cache_k(layer), dt, &shape)?;
        let vc = g.state(&io::cache_v(layer), dt, &shape)?;
        let kc = g.cache_write(kc, k, start, 2)?;
        let vc = g.cache_write(vc, v, start, 2)?;
        let ctx =
            nn::cached_attention(g, (q, kc, vc), kv_len, self.max_context, heads.dim, window)?;
        nn::merge_heads(g, ctx, 1, self.s, heads.q, heads.dim)
    }
}

/// How each layer rotates positions and attends, the part of the forward pass that differs
/// between a whole-prompt prefill and a decoder with a KV cache.
pub trait AttentionStep {
    /// Rope over `x` `[1, H, s, D]` (this step's tokens).
    fn rope(&mut self, g: &mut Graph, x: NodeId, spec: &RopeSpec) -> Result<NodeId, GraphError>;
    /// Attention of layer `layer` for this step's roped `q` `[1, Hq, s, D]`, roped `k` and
    /// `v` `[1, Hkv, s, D]`, keys limited to a sliding `window` where given; returns
    /// `[1, s, Hq·D]`.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &mut self,
        g: &mut Graph,
        layer: usize,
        q: NodeId,
        k: NodeId,
        v: NodeId,
        heads: Heads,
        window: Option<usize>,
        dt: DType,
    ) -> Result<NodeId, GraphError>;
}

/// A whole prompt of `s` tokens at positions `0..s`, attending causally over itself.
pub struct Prefill {
    pub s: usize,
}

impl AttentionStep for Prefill {
    fn rope(&mut self, g: &mut Graph, x: NodeId, spec: &RopeSpec) -> Result<NodeId, GraphError> {
        nn::rope(g, x, None, spec)
    }

    fn attend(
        &mut self,
        g: &mut Graph,
        _layer: usize,
        q: NodeId,
        k: NodeId,
        v: NodeId,
        heads: Heads,
        window: Option<usize>,
        dt: DType,
    ) -> Result<NodeId, GraphError> {
        nn::causal_attention(g, q, k, v, heads, 1, self.s, self.s, 0, window, dt)
    }
}

/// `llama_{dtype}[_quant]_{what}`: a step graph's name, which says its plan's precision.
fn graph_name(p: Precision, what: &str) -> String {
    let quant = if p.quantized { "_quant" } else { "" };
    format!("llama_{}{quant}_{what}", p.dtype)
}

impl LlamaModel {
    /// The forward pass over a prompt of `s` tokens (batch 1) in f32: input `input_ids` (i64
    /// `[1, s]`), output `logits` (f32).
    pub fn graph(&self, s: usize, logits: Logits) -> Result<Graph, GraphError> {
        self.graph_typed(s, logits, DType::F32)
    }

    /// As [`LlamaModel::graph`], computing in `dtype` (weights converted when bound); the
    /// logits come out in f32.
    pub fn graph_typed(&self, s: usize, logits: Logits, dt: DType) -> Result<Graph, GraphError> {
        self.graph_with(s, logits, dt, &mut Prefill { s })
    }

    /// The forward pass over `s` new tokens with each layer's rope and attention supplied by
    /// `step`: [`Prefill`] for a whole prompt; a KV-cache variant writes K/V into its cache and
    /// attends over it, with the rest of the model unchanged.
    pub fn graph_with(
        &self,
        s: usize,
        logits: Logits,
        dt: DType,
        step: &mut dyn AttentionStep,
    ) -> Result<Graph, GraphError> {
        let head = match logits {
            Logits::All => Head::All,
            Logits::Last => Head::Last,
        };
        let p = Precision {
            dtype: dt,
            quantized: false,
        };
        self.build(s, head, p, true, step)
    }

    /// A step of `s` tokens through the KV caches (see [`KvCache`] and [`io`]): inputs
    /// `input_ids`, `positions`, `start`, `kv_len` and `last` (the row whose logits are
    /// computed); outputs `token` (their argmax) and, when `with_logits`, `logits` `[1, vocab]`.
    /// A prefill of a prompt right-padded to `s` tokens runs with `kv_len = s` (each real row
    /// sees exactly its causal prefix) and `last` its last real row; a decode step is `s = 1`.
    pub fn kv_graph(
        &self,
        s: usize,
        max_context: usize,
        precision: Precision,
        with_logits: bool,
    ) -> Result<Graph, GraphError> {
        let name = graph_name(precision, &format!("s{s}_ctx{max_context}"));
        let step = &mut KvCache::new(s, max_context);
        self.row_graph(s, precision, with_logits, step, name)
    }

    /// The forward pass of `s` rows through `step` whose logits are computed at the row the
    /// input `last` names (i32 `[1]`), ending in their argmax `token`; the graph named `name`.
    fn row_graph(
        &self,
        s: usize,
        precision: Precision,
        with_logits: bool,
        step: &mut dyn AttentionStep,
        name: String,
    ) -> Result<Graph, GraphError> {
        let mut g = Graph::new(&name);
        let last = g.input_sampled(
            io::LAST,
            DType::I32,
            &[1],
            Sample::Range {
                low: 0,
                high: s as i64,
            },
        )?;
        let mut g = self.build_into(g, s, Head::Row(last), precision, with_logits, step)?;
        g.name = name;
        Ok(g)
    }

    /// A step of `seqs` sequences of `s` new tokens each through a paged KV cache of `pool`'s
    /// shape (see [`Paged`] and [`paged_io`]): inputs `input_ids` `[1, seqs·s]`, `positions`,
    /// `slots`, `block_table` and `kv_len`; outputs `token` (i32 `[seqs]`, the argmax of each
    /// sequence's last row) and, when `with_logits`, `logits` `[seqs, vocab]`. The pools are
    /// states named `pool.k.{l}` / `pool.v.{l}`, shared by every plan of the same pool.
    pub fn paged_graph(
        &self,
        seqs: usize,
        s: usize,
        pool: PoolShape,
        precision: Precision,
        with_logits: bool,
    ) -> Result<Graph, GraphError> {
        if seqs == 0 || s == 0 || pool.num_blocks == 0 || pool.block_size == 0 {
            return Err(GraphError::BadAttribute {
                node: "llama_paged".into(),
                op: "paged_graph".into(),
                reason: format!(
                    "a paged step needs at least one sequence, token, block and block row \
                     (got {seqs} sequences of {s} tokens, {pool:?})"
                ),
            });
        }
        let mut step = Paged::new(seqs, s, pool);
        let g = Graph::new("llama_paged");
        let mut g = self.build_into(
            g,
            seqs * s,
            Head::LastOfEach(seqs),
            precision,
            with_logits,
            &mut step,
        )?;
        g.name = graph_name(precision, &format!("paged_b{seqs}_s{s}"));
        Ok(g)
    }

    /// A chunk of `s` tokens of one sequence's prompt through [`PagedChunk`]: inputs
    /// `input_ids` `[1, s]`, `positions` `[s]`, `slots` `[1, s]`, `block_table` `[1,
    /// max_blocks]` and `kv_len` `[1]` (the sequence's rows once this chunk's are in); outputs
    /// `token` (`[1]`, the argmax of the last row) and, when `with_logits`, `logits` `[1,
    /// vocab]`. A chunk of fewer than `s` tokens is left-padded (padding slots negative), so
    /// the last row is its last token and every real row sees exactly its causal prefix.
    pub fn paged_chunk_graph(
        &self,
        s: usize,
        pool: PoolShape,
        precision: Precision,
        with_logits: bool,
    ) -> Result<Graph, GraphError> {
        if s == 0 || pool.num_blocks == 0 || pool.block_size == 0 || pool.max_blocks == 0 {
            return Err(GraphError::BadAttribute {
                node: "llama_paged_chunk".into(),
                op: "paged_chunk_graph".into(),
                reason: format!(
                    "a prompt chunk needs at least one token, block and block row (got {s} \
                     tokens, {pool:?})"
                ),
            });
        }
        let mut step = PagedChunk::new(s, pool);
        let g = Graph::new("llama_paged_chunk");
        let mut g =
            self.build_into(g, s, Head::LastOfEach(1), precision, with_logits, &mut step)?;
        g.name = graph_name(precision, &format!("paged_chunk_s{s}"));
        Ok(g)
    }

    /// A prompt of `s` tokens (right-padded) through [`PagedPrefill`]: inputs `input_ids`
    /// `[1, s]`, `slots` `[1, s]` and `last` (the row whose logits are computed); outputs
    /// `token` and, when `with_logits`, `logits` `[1, vocab]`, as [`LlamaModel::kv_graph`].
    pub fn paged_prefill_graph(
        &self,
        s: usize,
        pool: PoolShape,
        precision: Precision,
        with_logits: bool,
    ) -> Result<Graph, GraphError> {
        let name = graph_name(precision, &format!("paged_prefill_s{s}"));
        let step = &mut PagedPrefill::new(s, pool);
        self.row_graph(s, precision, with_logits, step, name)
    }

    pub(super) fn build(
        &self,
        s: usize,
        head: Head,
        p: Precision,
        with_logits: bool,
        step: &mut dyn AttentionStep,
    ) -> Result<Graph, GraphError> {
        let dt = p.dtype;
        let g = Graph::new(if dt == DType::F32 {
            "llama".to_string()
        } else {
            format!("llama_{dt}")
        });
        self.build_into(g, s, head, p, with_logits, step)
    }

    /// The forward pass into `g`. `with_logits` only matters for [`Head::Row`] and
    /// [`Head::LastOfEach`], whose graphs end in the argmax `token` (the other heads give the logits alone, as they always did).
    pub(super) fn build_into(
        &self,
        mut g: Graph,
        s: usize,
        head: Head,
        p: Precision,
        with_logits: bool,
        step: &mut dyn AttentionStep,
    ) -> Result<Graph, GraphError> {
        let dt = p.dtype;
        let c = &self.config;
        let (h, heads) = (c.hidden_size, c.heads());
        g.description = format!(
            "{} ({} layers, hidden {h}, {} heads, {} K/V heads)",
            self.path.display(),
            c.num_hidden_layers,
            heads.q,
            heads.kv
        );
        let ids = g.input_sampled(
            io::INPUT_IDS,
            DType::I64,
            &[1, s],
            Sample::Range {
                low: 0,
                high: c.vocab_size as i64,
            },
        )?;
        let table = g.weight("token_embd.weight", dt, &[c.vocab_size, h])?;
        let mut x = g.gather(table, ids)?;
        for l in 0..c.num_hidden_layers {
            x = self.layer(&mut g, x, l, s, p, step)?;
        }
        match head {
            Head::All => {}
            Head::Last => {
                let last = g.slice(x, 1, s as i64 - 1, s as i64)?;
                x = g.reshape(last, &[1, h as i64])?;
            }
            Head::Row(row) => {
                let rows = g.reshape(x, &[s as i64, h as i64])?;
                x = g.gather(rows, row)?;
            }
            Head::LastOfEach(seqs) => {
                let per = (s / seqs) as i64;
                let runs = g.reshape(x, &[seqs as i64, per, h as i64])?;
                let last = g.slice(runs, 1, per - 1, per)?;
                x = g.reshape(last, &[seqs as i64, h as i64])?;
            }
        }
        let x = nn::rms_norm(&mut g, x, "output_norm.weight", h, c.rms_norm_eps, dt)?;
        let head_w = if p.quantized && self.scheme_of(lm_head(c)).is_some() {
            // The tied table is read dense by the gather and as blocks by the LM head.
            let name = if c.tie_word_embeddings {
                format!("{}{BLOCKS_SUFFIX}", lm_head(c))
            } else {
                lm_head(c).to_string()
            };
            self.matrix(&mut g, &name, c.vocab_size, h, p)?
        } else if c.tie_word_embeddings {
            table
        } else {
            g.weight(lm_head(c), dt, &[c.vocab_size, h])?
        };
        let head_t = g.permute(head_w, &[1, 0])?;
        let mut out = g.matmul(x, head_t)?;
        if dt != DType::F32 {
            out = g.cast(out, DType::F32)?;
        }
        g.rename(out, io::LOGITS)?;
        if let Head::Row(_) | Head::LastOfEach(_) = head {
            let token = g.argmax(out, -1)?;
            g.rename(token, io::TOKEN)?;
            if with_logits {
                g.set_outputs(&[token, out])?;
            } else {
                g.set_outputs(&[token])?;
            }
        } else {
            g.set_outputs(&[out])?;
        }
        Ok(g)
    }

    /// The block quantization file tensor `name` is kept in on a device, if any: the file's,
    /// or the one that holds it exactly and reads faster ([`QuantScheme::kept_as`]: Q5_0 as
    /// Q8_0).
    pub(super) fn scheme_of(&self, name: &str) -> Option<QuantScheme> {
        self.source
            .scheme(file_tensor(name), self.config.fused_gate_up)
            .map(QuantScheme::kept_as)
    }

    /// Matrix `name` `[dout, din]`: its blocks where `p` keeps them and the file has them,
    /// else dense in `p.dtype`.
    pub(super) fn matrix(
        &self,
        g: &mut Graph,
        name: &str,
        dout: usize,
        din: usize,
        p: Precision,
    ) -> Result<NodeId, GraphError> {
        match self.scheme_of(name) {
            Some(scheme) if p.quantized => g.weight_quant(name, p.dtype, &[dout, din], scheme),
            _ => g.weight(name, p.dtype, &[dout, din]),
        }
    }

    /// `x · Wᵀ` for the bias-free linear layer `name` `[dout, din]`.
    pub(super) fn linear(
        &self,
        g: &mut Graph,
        x: NodeId,
        name: &str,
        din: usize,
        dout: usize,
        p: Precision,
    ) -> Result<NodeId, GraphError> {
        let w = self.matrix(g, name, dout, din, p)?;
        let wt = g.permute(w, &[1, 0])?;
        g.matmul(x, wt)
    }

    /// Decoder layer `l` on `x` `[1, s, hidden]`, as transformers' `LlamaDecoderLayer` with
    /// the family's differences as data: Q/K/V from one fused tensor (Phi-3) or three, with
    /// biases (Qwen2), Q and K heads RMS-normalised before rope (Qwen3), rope over the leading
    /// `rotary_dim` with frequency factors (Llama 3), attention in a sliding window (Mistral),
    /// gate and up from one fused tensor (Phi-3) or two.
    pub(super) fn layer(
        &self,
        g: &mut Graph,
        x: NodeId,
        l: usize,
        s: usize,
        p: Precision,
        step: &mut dyn AttentionStep,
    ) -> Result<NodeId, GraphError> {
        let c = &self.config;
        let dt = p.dtype;
        let (h, heads) = (c.hidden_size, c.heads());
        let w = |name: &str| format!("blk.{l}.{name}.weight");
        let a = nn::rms_norm(g, x, &w("attn_norm"), h, c.rms_norm_eps, dt)?;
        let (qd, kvd) = (heads.q * heads.dim, heads.kv * heads.dim);
        let (q, k, v) = if c.fused_qkv {
            let qkv = self.linear(g, a, &w("attn_qkv"), h, qd + 2 * kvd, p)?;
            let parts = nn::split_last(g, qkv, &[qd, kvd, kvd])?;
            (parts[0], parts[1], parts[2])
        } else {
            let q = self.linear(g, a, &w("attn_q"), h, qd, p)?;
            let k = self.linear(g, a, &w("attn_k"), h, kvd, p)?;
            let v = self.linear(g, a, &w("attn_v"), h, kvd, p)?;
            (q, k, v)
        };
        let (q, k, v) = if c.attention_bias {
            let b = |name: &str| format!("blk.{l}.{name}.bias");
            (
                nn::bias(g, q, &b("attn_q"), qd, dt)?,
                nn::bias(g, k, &b("attn_k"), kvd, dt)?,
                nn::bias(g, v, &b("attn_v"), kvd, dt)?,
            )
        } else {
            (q, k, v)
        };
        let mut q = nn::split_heads(g, q, 1, s, heads.q, heads.dim)?;
        let mut k = nn::split_heads(g, k, 1, s, heads.kv, heads.dim)?;
        let v = nn::split_heads(g, v, 1, s, heads.kv, heads.dim)?;
        if c.qk_norm {
            // Per head, over the head's dimensions (the last axis of [1, H, s, D]).
            q = nn::rms_norm(g, q, &w("attn_q_norm"), heads.dim, c.rms_norm_eps, dt)?;
            k = nn::rms_norm(g, k, &w("attn_k_norm"), heads.dim, c.rms_norm_eps, dt)?;
        }
        let spec = RopeSpec {
            theta: c.rope_theta,
            head_dim: heads.dim,
            rotary_dim: c.rotary_dim,
            factors: c.rope_factors.clone(),
        };
        let q = step.rope(g, q, &spec)?;
        let k = step.rope(g, k, &spec)?;
        let ctx = step.attend(g, l, q, k, v, heads, c.sliding_window, dt)?;
        let o = self.linear(g, ctx, &w("attn_output"), qd, h, p)?;
        let r = g.add(x, o)?;
        let m = nn::rms_norm(g, r, &w("ffn_norm"), h, c.rms_norm_eps, dt)?;
        // SwiGLU: down(silu(gate(m)) · up(m)).
        let ffn = c.intermediate_size;
        let (gate, up) = if c.fused_gate_up {
            let gu = self.linear(g, m, &w("ffn_up"), h, 2 * ffn, p)?;
            let parts = nn::split_last(g, gu, &[ffn, ffn])?;
            (parts[0], parts[1])
        } else {
            let gate = self.linear(g, m, &w("ffn_gate"), h, ffn, p)?;
            let up = self.linear(g, m, &w("ffn_up"), h, ffn, p)?;
            (gate, up)
        };
        let act = g.silu(gate)?;
        let hmul = g.mul(act, up)?;
        let f = self.linear(g, hmul, &w("ffn_down"), ffn, h, p)?;
        g.add(r, f)
    }
}
