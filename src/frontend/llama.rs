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
pub use super::nn::Heads;
use super::nn::{self, SwiGlu};
use super::ModelError;
use crate::ir::{DType, Graph, GraphError, NodeId, Op, Sample, Tensor};

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
        let c = &self.config;
        let (h, heads) = (c.hidden_size, c.heads());
        let mut g = Graph::new(if dt == DType::F32 {
            "llama".to_string()
        } else {
            format!("llama_{dt}")
        });
        g.description = format!(
            "{} ({} layers, hidden {h}, {} heads, {} K/V heads)",
            self.path.display(),
            c.num_hidden_layers,
            heads.q,
            heads.kv
        );
        let ids = g.input_sampled(
            "input_ids",
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
            x = self.layer(&mut g, x, l, s, dt, step)?;
        }
        if logits == Logits::Last {
            let last = g.slice(x, 1, s as i64 - 1, s as i64)?;
            x = g.reshape(last, &[1, h as i64])?;
        }
        let x = nn::rms_norm(&mut g, x, "output_norm.weight", h, c.rms_norm_eps, dt)?;
        let head = if c.tie_word_embeddings {
            table
        } else {
            g.weight(lm_head(c), dt, &[c.vocab_size, h])?
        };
        let head_t = g.permute(head, &[1, 0])?;
        let mut out = g.matmul(x, head_t)?;
        if dt != DType::F32 {
            out = g.cast(out, DType::F32)?;
        }
        g.rename(out, "logits")?;
        g.set_outputs(&[out])?;
        Ok(g)
    }

    /// Decoder layer `l` on `x` `[1, s, hidden]`, as transformers' `LlamaDecoderLayer`.
    fn layer(
        &self,
        g: &mut Graph,
        x: NodeId,
        l: usize,
        s: usize,
        dt: DType,
        step: &mut dyn AttentionStep,
    ) -> Result<NodeId, GraphError> {
        let c = &self.config;
        let (h, heads) = (c.hidden_size, c.heads());
        let w = |name: &str| format!("blk.{l}.{name}.weight");
        let a = nn::rms_norm(g, x, &w("attn_norm"), h, c.rms_norm_eps, dt)?;
        let (qd, kvd) = (heads.q * heads.dim, heads.kv * heads.dim);
        let q = nn::linear(g, a, &w("attn_q"), h, qd, dt)?;
        let k = nn::linear(g, a, &w("attn_k"), h, kvd, dt)?;
        let v = nn::linear(g, a, &w("attn_v"), h, kvd, dt)?;
        let q = nn::split_heads(g, q, 1, s, heads.q, heads.dim)?;
        let k = nn::split_heads(g, k, 1, s, heads.kv, heads.dim)?;
        let v = nn::split_heads(g, v, 1, s, heads.kv, heads.dim)?;
        let q = step.rope(g, q, c.rope_theta)?;
        let k = step.rope(g, k, c.rope_theta)?;
        let ctx = step.attend(g, l, q, k, v, heads, dt)?;
        let o = nn::linear(g, ctx, &w("attn_output"), qd, h, dt)?;
        let r = g.add(x, o)?;
        let m = nn::rms_norm(g, r, &w("ffn_norm"), h, c.rms_norm_eps, dt)?;
        let mlp = SwiGlu {
            gate: &w("ffn_gate"),
            up: &w("ffn_up"),
            down: &w("ffn_down"),
            hidden: h,
            ffn: c.intermediate_size,
        };
        let f = nn::swiglu(g, m, &mlp, dt)?;
        g.add(r, f)
    }

    /// The weights `graph` reads, dequantized from the mapped file now, converted to each
    /// weight node's dtype, Q and K rows in transformers' order.
    pub fn weights_for(&self, graph: &Graph) -> Result<HashMap<String, Tensor>, ModelError> {
        let mut out = HashMap::new();
        for id in graph.node_ids() {
            if let Op::Weight { .. } = graph.op(id) {
                let n = graph.node(id);
                out.insert(n.name.clone(), self.weight(&n.name, n.ty.dtype)?);
            }
        }
        Ok(out)
    }

    /// Weight `name` as a PyTorch-shaped tensor of `dtype`.
    pub fn weight(&self, name: &str, dtype: DType) -> Result<Tensor, ModelError> {
        let (info, _) = self.gguf.raw(name)?;
        let shape = info.shape();
        let mut values = self.gguf.dequantize(name)?;
        let heads = if name.ends_with(".attn_q.weight") {
            Some(self.config.num_attention_heads)
        } else if name.ends_with(".attn_k.weight") {
            Some(self.config.num_key_value_heads)
        } else {
            None
        };
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
    let d = rows / heads;
    let half = d / 2;
    let mut out = vec![0.0f32; values.len()];
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
