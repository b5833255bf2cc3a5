//! `LlamaConfig` from the GGUF `llama.*` metadata: sizes bounded, the architectures, rope
//! scaling and partial rotary this lowering does not implement refused by name.

use serde::Serialize;

use super::super::gguf::Gguf;
use super::super::nn::Heads;
use super::super::ModelError;

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

/// A metadata value of `g` that this lowering cannot use.
pub(super) fn config_error<T>(g: &Gguf, field: &str, reason: String) -> Result<T, ModelError> {
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
