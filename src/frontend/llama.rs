//! LLaMA-class decoders (SmolLM2 and its family) from one GGUF file: the configuration from the
//! `llama.*` metadata, the tokenizer from `tokenizer.ggml.*`, the weights dequantized when a
//! graph is bound, and the forward pass lowered as transformers' `LlamaForCausalLM` computes
//! it: embeddings, per layer RMSNorm → Q/K/V → RoPE → causal GQA attention → output projection
//! → residual, RMSNorm → SwiGLU MLP → residual; a final RMSNorm and the LM head (the embedding
//! table when the file has no `output.weight`).
//!
//! llama.cpp's converter stores the rows of the Q and K projections permuted so that its
//! interleaved ("GPT-J") rope rotates adjacent pairs; the IR's rope is transformers'
//! rotate-half, so the rows are put back in transformers' order when the weights are read
//! (transformers' GGUF loader does the same, `reverse_permute`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::gguf::Gguf;
use super::gguf_tokenizer::GgufTokenizer;
use super::nn;
pub use super::nn::Heads;
use super::ModelError;
use crate::ir::{
    DType, Graph, GraphError, NodeId, Op, QuantScheme, QuantTensor, Sample, Shape, Tensor,
};

/// The configuration of a LLaMA-class decoder, read from the GGUF metadata.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LlamaConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    /// `llama.context_length`: the longest sequence the model was trained for.
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    /// True when the file has no `output.weight` and the embedding table is the LM head.
    pub tie_word_embeddings: bool,
}

/// Where the logits are computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// At every position: `[1, S, vocab]`.
    All,
    /// At the last position only: `[1, vocab]` (the LM head reads one row).
    Last,
}

/// How the weights are held and what the activations compute in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Precision {
    /// The activations' dtype (and the dense weights'); the logits always come out in f32.
    pub dtype: DType,
    /// Keep the matrices the file stores block-quantized (Q4_0, Q4_1, Q8_0) in their blocks
    /// (`weight_quant`); otherwise every weight is dequantized once to `dtype`.
    pub quantized: bool,
}

impl Precision {
    pub const F32: Precision = Precision {
        dtype: DType::F32,
        quantized: false,
    };
    pub const F16: Precision = Precision {
        dtype: DType::F16,
        quantized: false,
    };

    /// The file's blocks kept, activations in `dtype`.
    pub fn quantized(dtype: DType) -> Precision {
        Precision {
            dtype,
            quantized: true,
        }
    }
}

/// The suffix of the weight node that reads the tied embedding table's blocks as the LM head:
/// the gather reads the same file tensor dense, and a graph names each weight once.
const BLOCKS_SUFFIX: &str = ".blocks";

/// The file tensor a weight node reads.
fn file_tensor(node: &str) -> &str {
    node.strip_suffix(BLOCKS_SUFFIX).unwrap_or(node)
}

/// Where the logits are computed, inside a graph.
#[derive(Clone, Copy)]
enum Head {
    All,
    Last,
    /// The row a graph input (i32 `[1]`) names.
    Row(NodeId),
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
    fn rope(&mut self, g: &mut Graph, x: NodeId, theta: f64) -> Result<NodeId, GraphError> {
        let (positions, _, _) = self.inputs(g)?;
        g.rope_at(x, positions, theta)
    }

    fn attend(
        &mut self,
        g: &mut Graph,
        layer: usize,
        q: NodeId,
        k: NodeId,
        v: NodeId,
        heads: Heads,
        dt: DType,
    ) -> Result<NodeId, GraphError> {
        let (_, start, kv_len) = self.inputs(g)?;
        let shape = [1, heads.kv, self.max_context, heads.dim];
        let kc = g.state(&io::cache_k(layer), dt, &shape)?;
        let vc = g.state(&io::cache_v(layer), dt, &shape)?;
        let kc = g.cache_write(kc, k, start, 2)?;
        let vc = g.cache_write(vc, v, start, 2)?;
        let scale = 1.0 / (heads.dim as f64).sqrt();
        let ctx = g.flash_attention_len((q, kc, vc), kv_len, scale, true)?;
        nn::merge_heads(g, ctx, 1, self.s, heads.q, heads.dim)
    }
}

/// A metadata value of `g` that this lowering cannot use.
fn config_error<T>(g: &Gguf, field: &str, reason: String) -> Result<T, ModelError> {
    Err(ModelError::Setting {
        file: g.path().display().to_string(),
        field: field.into(),
        reason,
    })
}

/// `key` as a size within `1..=max`.
fn size(g: &Gguf, key: &str, max: usize) -> Result<usize, ModelError> {
    let v = g.u32(key)? as usize;
    if v == 0 || v > max {
        return config_error(g, key, format!("{v} is outside 1..={max}"));
    }
    Ok(v)
}

impl LlamaConfig {
    /// The configuration from `g`'s metadata. Required: the architecture (`llama`), the layer
    /// count, the hidden and FFN sizes, the head count, the context length and the RMS norm
    /// epsilon. As llama.cpp does, an absent `head_count_kv` means as many K/V heads as query
    /// heads, an absent `rope.freq_base` means 10000, and an absent vocab size the number of
    /// tokens. Rope scaling of any kind, partial rotary dimensions and key/value lengths other
    /// than the head size are refused.
    pub fn from_gguf(g: &Gguf) -> Result<LlamaConfig, ModelError> {
        let arch = g.str("general.architecture")?;
        if arch != "llama" {
            return Err(ModelError::Unsupported {
                field: "general.architecture".into(),
                value: arch.into(),
                supported: "llama".into(),
            });
        }
        // Far above any LLaMA-class model and far below what would make building the graph
        // or binding its weights a denial of service (the tensors present are checked next).
        let hidden = size(g, "llama.embedding_length", 1 << 16)?;
        let layers = size(g, "llama.block_count", 1 << 10)?;
        let ffn = size(g, "llama.feed_forward_length", 1 << 18)?;
        let heads = size(g, "llama.attention.head_count", 1 << 10)?;
        let ctx = size(g, "llama.context_length", 1 << 24)?;
        let kv = match g.get("llama.attention.head_count_kv") {
            Some(_) => size(g, "llama.attention.head_count_kv", 1 << 10)?,
            None => heads,
        };
        if !hidden.is_multiple_of(heads) {
            return config_error(
                g,
                "llama.attention.head_count",
                format!("{heads} heads do not divide embedding_length {hidden}"),
            );
        }
        if !heads.is_multiple_of(kv) {
            return config_error(
                g,
                "llama.attention.head_count_kv",
                format!("{kv} K/V heads do not divide {heads} query heads"),
            );
        }
        let head_dim = hidden / heads;
        if !head_dim.is_multiple_of(2) {
            return config_error(
                g,
                "llama.attention.head_count",
                format!("a head size of {head_dim} is odd, rope needs pairs"),
            );
        }
        for key in [
            "llama.attention.key_length",
            "llama.attention.value_length",
            "llama.rope.dimension_count",
        ] {
            if g.get(key).is_some() && g.u32(key)? as usize != head_dim {
                return Err(ModelError::Unsupported {
                    field: key.into(),
                    value: g.u32(key)?.to_string(),
                    supported: format!("the head size {head_dim}"),
                });
            }
        }
        let eps = f64::from(g.f32("llama.attention.layer_norm_rms_epsilon")?);
        if !(eps > 0.0 && eps < 1.0) {
            return config_error(
                g,
                "llama.attention.layer_norm_rms_epsilon",
                format!("{eps} is not in (0, 1)"),
            );
        }
        let theta = match g.get("llama.rope.freq_base") {
            Some(_) => f64::from(g.f32("llama.rope.freq_base")?),
            None => 10000.0,
        };
        if !(theta.is_finite() && theta > 1.0) {
            return config_error(g, "llama.rope.freq_base", format!("{theta} is not above 1"));
        }
        if g.get("llama.rope.scaling.type").is_some() {
            let t = g.str("llama.rope.scaling.type")?;
            if t != "none" {
                return Err(ModelError::Unsupported {
                    field: "llama.rope.scaling.type".into(),
                    value: t.into(),
                    supported: "none".into(),
                });
            }
        }
        for key in ["llama.rope.scaling.factor", "llama.rope.scale_linear"] {
            if g.get(key).is_some() {
                let f = g.f32(key)?;
                if f != 0.0 && f != 1.0 {
                    return Err(ModelError::Unsupported {
                        field: key.into(),
                        value: f.to_string(),
                        supported: "1 (no rope scaling)".into(),
                    });
                }
            }
        }
        let tokens = g.strings("tokenizer.ggml.tokens").map(<[String]>::len).ok();
        let vocab = match (g.get("llama.vocab_size"), tokens) {
            (Some(_), _) => size(g, "llama.vocab_size", 1 << 24)?,
            (None, Some(n)) => n,
            (None, None) => size(g, "llama.vocab_size", 1 << 24)?,
        };
        Ok(LlamaConfig {
            vocab_size: vocab,
            hidden_size: hidden,
            intermediate_size: ffn,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            num_key_value_heads: kv,
            head_dim,
            max_position_embeddings: ctx,
            rms_norm_eps: eps,
            rope_theta: theta,
            tie_word_embeddings: g.tensor_info("output.weight").is_none(),
        })
    }

    pub fn heads(&self) -> Heads {
        Heads {
            q: self.num_attention_heads,
            kv: self.num_key_value_heads,
            dim: self.head_dim,
        }
    }
}

/// How each layer rotates positions and attends, the part of the forward pass that differs
/// between a whole-prompt prefill and a decoder with a KV cache.
pub trait AttentionStep {
    /// Rope over `x` `[1, H, s, D]` (this step's tokens).
    fn rope(&mut self, g: &mut Graph, x: NodeId, theta: f64) -> Result<NodeId, GraphError>;
    /// Attention of layer `layer` for this step's roped `q` `[1, Hq, s, D]`, roped `k` and
    /// `v` `[1, Hkv, s, D]`; returns `[1, s, Hq·D]`.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &mut self,
        g: &mut Graph,
        layer: usize,
        q: NodeId,
        k: NodeId,
        v: NodeId,
        heads: Heads,
        dt: DType,
    ) -> Result<NodeId, GraphError>;
}

/// A whole prompt of `s` tokens at positions `0..s`, attending causally over itself.
pub struct Prefill {
    pub s: usize,
}

impl AttentionStep for Prefill {
    fn rope(&mut self, g: &mut Graph, x: NodeId, theta: f64) -> Result<NodeId, GraphError> {
        g.rope(x, theta, 0)
    }

    fn attend(
        &mut self,
        g: &mut Graph,
        _layer: usize,
        q: NodeId,
        k: NodeId,
        v: NodeId,
        heads: Heads,
        dt: DType,
    ) -> Result<NodeId, GraphError> {
        nn::causal_attention(g, q, k, v, heads, 1, self.s, self.s, 0, dt)
    }
}

/// A LLaMA-class model loaded from a GGUF file: configuration, tokenizer, and the graphs and
/// weights of its forward pass.
pub struct LlamaModel {
    pub path: PathBuf,
    pub config: LlamaConfig,
    pub tokenizer: GgufTokenizer,
    gguf: Gguf,
}

/// The LM head's weight: `output.weight`, or the embedding table when they are tied.
fn lm_head(c: &LlamaConfig) -> &'static str {
    if c.tie_word_embeddings {
        "token_embd.weight"
    } else {
        "output.weight"
    }
}

impl LlamaModel {
    /// Opens `path` (see [`Gguf::open`]), reads the configuration and the tokenizer, and checks
    /// that every weight the forward pass reads is present with the shape the configuration
    /// implies, before any is dequantized.
    pub fn load(path: &Path) -> Result<LlamaModel, ModelError> {
        let gguf = Gguf::open(path)?;
        let config = LlamaConfig::from_gguf(&gguf)?;
        // The layers present, so a block count the tensors do not back is refused before a
        // graph of that many layers is built.
        let layers = gguf
            .tensor_names()
            .filter_map(|n| n.strip_prefix("blk.")?.split('.').next()?.parse().ok())
            .map(|l: usize| l.saturating_add(1))
            .max()
            .unwrap_or(0);
        if layers != config.num_hidden_layers {
            return config_error(
                &gguf,
                "llama.block_count",
                format!(
                    "{} layers, but the file holds tensors of {layers} (blk.*)",
                    config.num_hidden_layers
                ),
            );
        }
        let tokenizer = GgufTokenizer::from_gguf(&gguf)?;
        if tokenizer.vocab_size() > config.vocab_size {
            return config_error(
                &gguf,
                "llama.vocab_size",
                format!(
                    "{} rows of embeddings, but the tokenizer has {} tokens",
                    config.vocab_size,
                    tokenizer.vocab_size()
                ),
            );
        }
        let model = LlamaModel {
            path: path.to_path_buf(),
            config,
            tokenizer,
            gguf,
        };
        let g = model.graph(1, Logits::Last)?;
        for id in g.node_ids() {
            if let Op::Weight { .. } = g.op(id) {
                let n = g.node(id);
                let (info, _) = model.gguf.raw(&n.name)?;
                if info.shape() != n.ty.shape.dims() {
                    return Err(ModelError::TensorShape {
                        name: n.name.clone(),
                        expected: n.ty.shape.dims().to_vec(),
                        found: info.shape(),
                    });
                }
            }
        }
        Ok(model)
    }

    pub fn gguf(&self) -> &Gguf {
        &self.gguf
    }

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
        let mut step = KvCache::new(s, max_context);
        let mut g = Graph::new("llama_step");
        let last = g.input_sampled(
            io::LAST,
            DType::I32,
            &[1],
            Sample::Range {
                low: 0,
                high: s as i64,
            },
        )?;
        let mut g = self.build_into(g, s, Head::Row(last), precision, with_logits, &mut step)?;
        g.name = format!(
            "llama_{}{}_s{s}_ctx{max_context}",
            precision.dtype,
            if precision.quantized { "_quant" } else { "" }
        );
        Ok(g)
    }

    fn build(
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

    /// The forward pass into `g`. `with_logits` only matters for [`Head::Row`], whose graphs
    /// end in the argmax `token` (the other heads give the logits alone, as they always did).
    fn build_into(
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
        if let Head::Row(_) = head {
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

    /// The block quantization file tensor `name` is stored in, if any.
    fn scheme_of(&self, name: &str) -> Option<QuantScheme> {
        self.gguf
            .tensor_info(file_tensor(name))
            .and_then(|t| t.ggml_type.quant_scheme())
    }

    /// Matrix `name` `[dout, din]`: its blocks where `p` keeps them and the file has them,
    /// else dense in `p.dtype`.
    fn matrix(
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
    fn linear(
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

    /// Decoder layer `l` on `x` `[1, s, hidden]`, as transformers' `LlamaDecoderLayer`.
    fn layer(
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
        let q = self.linear(g, a, &w("attn_q"), h, qd, p)?;
        let k = self.linear(g, a, &w("attn_k"), h, kvd, p)?;
        let v = self.linear(g, a, &w("attn_v"), h, kvd, p)?;
        let q = nn::split_heads(g, q, 1, s, heads.q, heads.dim)?;
        let k = nn::split_heads(g, k, 1, s, heads.kv, heads.dim)?;
        let v = nn::split_heads(g, v, 1, s, heads.kv, heads.dim)?;
        let q = step.rope(g, q, c.rope_theta)?;
        let k = step.rope(g, k, c.rope_theta)?;
        let ctx = step.attend(g, l, q, k, v, heads, dt)?;
        let o = self.linear(g, ctx, &w("attn_output"), qd, h, p)?;
        let r = g.add(x, o)?;
        let m = nn::rms_norm(g, r, &w("ffn_norm"), h, c.rms_norm_eps, dt)?;
        // SwiGLU: down(silu(gate(m)) · up(m)).
        let ffn = c.intermediate_size;
        let gate = self.linear(g, m, &w("ffn_gate"), h, ffn, p)?;
        let up = self.linear(g, m, &w("ffn_up"), h, ffn, p)?;
        let act = g.silu(gate)?;
        let hmul = g.mul(act, up)?;
        let f = self.linear(g, hmul, &w("ffn_down"), ffn, h, p)?;
        g.add(r, f)
    }

    /// The weights `graph` reads, dequantized from the mapped file now, converted to each
    /// weight node's dtype, Q and K rows in transformers' order.
    pub fn weights_for(&self, graph: &Graph) -> Result<HashMap<String, Tensor>, ModelError> {
        let mut out = HashMap::new();
        for id in graph.node_ids() {
            if let Op::Weight { quant: None, .. } = graph.op(id) {
                let n = graph.node(id);
                out.insert(n.name.clone(), self.weight(&n.name, n.ty.dtype)?);
            }
        }
        Ok(out)
    }

    /// The blocks of the quantized weights `graph` reads, as the file stores them (Q and K
    /// rows put in transformers' order, whole rows of blocks moved), checked against each
    /// weight's scheme and shape.
    pub fn quantized_for(&self, graph: &Graph) -> Result<HashMap<String, QuantTensor>, ModelError> {
        let mut out = HashMap::new();
        for id in graph.node_ids() {
            if let Op::Weight {
                quant: Some(scheme),
                ..
            } = graph.op(id)
            {
                let n = graph.node(id);
                out.insert(
                    n.name.clone(),
                    self.blocks(&n.name, *scheme, n.ty.shape.dims())?,
                );
            }
        }
        Ok(out)
    }

    /// The blocks of weight node `name` (`[rows, K]` of `scheme`).
    fn blocks(
        &self,
        name: &str,
        scheme: QuantScheme,
        shape: &[usize],
    ) -> Result<QuantTensor, ModelError> {
        let file = file_tensor(name);
        let (info, bytes) = self.gguf.raw(file)?;
        if info.ggml_type.quant_scheme() != Some(scheme) || info.shape() != shape {
            return Err(ModelError::TensorShape {
                name: file.into(),
                expected: shape.to_vec(),
                found: info.shape(),
            });
        }
        let heads = self.permuted_heads(file);
        let bytes: Vec<u8> = match heads {
            Some(heads) => {
                let row_bytes = bytes.len() / shape[0];
                unpermute_rows_of(bytes, shape[0], row_bytes, heads)
            }
            None => bytes.to_vec(),
        };
        QuantTensor::new(scheme, Shape::new(shape.to_vec()), bytes).map_err(|e| {
            ModelError::Setting {
                file: self.path.display().to_string(),
                field: file.into(),
                reason: e.to_string(),
            }
        })
    }

    /// The head count of a Q or K projection (whose rows llama.cpp permuted).
    fn permuted_heads(&self, name: &str) -> Option<usize> {
        if name.ends_with(".attn_q.weight") {
            Some(self.config.num_attention_heads)
        } else if name.ends_with(".attn_k.weight") {
            Some(self.config.num_key_value_heads)
        } else {
            None
        }
    }

    /// Weight `name` as a PyTorch-shaped tensor of `dtype`.
    pub fn weight(&self, name: &str, dtype: DType) -> Result<Tensor, ModelError> {
        let (info, _) = self.gguf.raw(name)?;
        let shape = info.shape();
        let mut values = self.gguf.dequantize(name)?;
        let heads = self.permuted_heads(name);
        if let Some(heads) = heads {
            let expected = [heads * self.config.head_dim, self.config.hidden_size];
            if shape != expected {
                return Err(ModelError::TensorShape {
                    name: name.into(),
                    expected: expected.to_vec(),
                    found: shape,
                });
            }
            values = unpermute_rows(&values, expected[0], expected[1], heads);
        }
        if !dtype.is_float() {
            return Err(ModelError::TensorDType {
                name: name.into(),
                found: dtype,
            });
        }
        Ok(Tensor::from_f32(dtype, shape, values).expect("size checked when opened"))
    }

    /// The graph input for a prompt's token ids.
    pub fn inputs(&self, ids: &[u32]) -> Vec<(String, Tensor)> {
        let ids: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
        let t = Tensor::from_i64(DType::I64, vec![1, ids.len()], ids).expect("1×s ids");
        vec![("input_ids".into(), t)]
    }
}

/// Undoes llama.cpp's Q/K row permutation: within each head of `rows / heads` rows, the file
/// holds row `2i + j` where transformers holds row `j·(d/2) + i` (`j` ∈ {0, 1}, `i` < d/2).
pub fn unpermute_rows(values: &[f32], rows: usize, cols: usize, heads: usize) -> Vec<f32> {
    unpermute_rows_of(values, rows, cols, heads)
}

/// [`unpermute_rows`] over rows of `cols` elements of any type (values, or a row's blocks).
fn unpermute_rows_of<T: Copy + Default>(
    values: &[T],
    rows: usize,
    cols: usize,
    heads: usize,
) -> Vec<T> {
    let d = rows / heads;
    let half = d / 2;
    let mut out = vec![T::default(); values.len()];
    for h in 0..heads {
        for j in 0..2 {
            for i in 0..half {
                let to = h * d + j * half + i;
                let from = h * d + 2 * i + j;
                out[to * cols..(to + 1) * cols].copy_from_slice(&values[from * cols..][..cols]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The permutation llama.cpp's converter applies (`reshape(h, 2, d/2, ..).swapaxes(1, 2)`),
    /// written independently, is undone exactly.
    #[test]
    fn unpermute_undoes_the_converters_permutation() {
        let (heads, d, cols) = (3, 8, 2);
        let rows = heads * d;
        let hf: Vec<f32> = (0..rows * cols).map(|x| x as f32).collect();
        // Converter: new[h][i][j] = old[h][j][i] for the view [heads, 2, d/2] of the rows.
        let mut file = vec![0.0f32; hf.len()];
        for h in 0..heads {
            for j in 0..2 {
                for i in 0..d / 2 {
                    let old = h * d + j * (d / 2) + i;
                    let new = h * d + i * 2 + j;
                    file[new * cols..(new + 1) * cols]
                        .copy_from_slice(&hf[old * cols..(old + 1) * cols]);
                }
            }
        }
        assert_ne!(file, hf);
        assert_eq!(unpermute_rows(&file, rows, cols, heads), hf);
    }
}
