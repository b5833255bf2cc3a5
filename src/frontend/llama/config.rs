//! `LlamaConfig` from the GGUF metadata of a LLaMA-family decoder (`llama`, which Mistral files
//! are too, `qwen2`, `qwen3`, `phi3`): sizes bounded, the differences between the families read
//! as data (Q/K/V biases, Q/K norms, fused tensors, rope scaling, partial rotary, sliding
//! window) from the keys and tensors present, and what this lowering does not implement refused
//! by name.

use serde::Serialize;

use super::super::gguf::Gguf;
use super::super::nn::Heads;
use super::super::ModelError;

/// The GGUF architectures (`general.architecture`) this lowering reads, each with how
/// llama.cpp's converter stored it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Family {
    /// LLaMA 1–3, SmolLM, Mistral (its converter writes `llama`): Q and K rows permuted for
    /// llama.cpp's interleaved rope.
    Llama,
    /// Qwen2/2.5: biases on Q, K and V.
    Qwen2,
    /// Qwen3: an RMSNorm over each Q and K head before rope; an explicit head size.
    Qwen3,
    /// Phi-3: Q/K/V in one tensor, gate and up in one tensor.
    Phi3,
}

impl Family {
    const ALL: [(&'static str, Family); 4] = [
        ("llama", Family::Llama),
        ("qwen2", Family::Qwen2),
        ("qwen3", Family::Qwen3),
        ("phi3", Family::Phi3),
    ];

    /// The metadata key prefix (`general.architecture`'s value).
    pub fn name(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Phi3 => "phi3",
        }
    }

    /// Whether llama.cpp's converter permuted the rows of Q and K (it does for the
    /// architectures it ropes GPT-J style; the others are rotate-half already, as ours).
    pub fn permutes_qk(self) -> bool {
        match self {
            Family::Llama => true,
            Family::Qwen2 | Family::Qwen3 | Family::Phi3 => false,
        }
    }
}

/// The configuration of a LLaMA-family decoder, read from the GGUF metadata.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LlamaConfig {
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    /// `attention.key_length` where given (Qwen3), else hidden size / heads.
    pub head_dim: usize,
    /// `{arch}.context_length`: the longest sequence the model was trained for.
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    /// The leading dimensions of each head that rope rotates (`rope.dimension_count`; Phi-3's
    /// partial rotary); the rest pass through.
    pub rotary_dim: usize,
    /// One divisor per rotated pair (`rotary_dim / 2`): Llama 3's `rope_freqs.weight` times a
    /// linear scaling factor; empty when the frequencies are unscaled.
    pub rope_factors: Vec<f64>,
    /// Keys more than this many positions before a query are masked (Mistral).
    pub sliding_window: Option<usize>,
    /// True when the file has no `output.weight` and the embedding table is the LM head.
    pub tie_word_embeddings: bool,
    /// Q, K and V have biases (`attn_{q,k,v}.bias`, Qwen2).
    pub attention_bias: bool,
    /// Q and K heads are RMS-normalised before rope (`attn_{q,k}_norm.weight`, Qwen3).
    pub qk_norm: bool,
    /// Q, K and V are one tensor `attn_qkv.weight` (Phi-3).
    pub fused_qkv: bool,
    /// Gate and up are one tensor `ffn_up.weight` of twice the FFN rows, gate first (Phi-3).
    pub fused_gate_up: bool,
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

/// `key` as a size within `1..=max`, or `default` when absent.
fn size_or(g: &Gguf, key: &str, max: usize, default: usize) -> Result<usize, ModelError> {
    match g.get(key) {
        Some(_) => size(g, key, max),
        None => Ok(default),
    }
}

impl LlamaConfig {
    /// The configuration from `g`'s metadata (keys under the architecture's prefix `{arch}.`).
    /// Required: the architecture (one of [`Family`]), the layer count, the hidden and FFN
    /// sizes, the head count, the context length and the RMS norm epsilon. As llama.cpp does,
    /// an absent `head_count_kv` means as many K/V heads as query heads, an absent
    /// `rope.freq_base` 10000, an absent vocab size the number of tokens, a scaling factor
    /// without a type linear scaling. Rope scaling other than linear and Llama 3's frequency
    /// factors (YaRN, LongRoPE) is refused.
    pub fn from_gguf(g: &Gguf) -> Result<LlamaConfig, ModelError> {
        let arch = g.str("general.architecture")?;
        let Some(&(_, family)) = Family::ALL.iter().find(|(n, _)| *n == arch) else {
            return Err(ModelError::Unsupported {
                field: "general.architecture".into(),
                value: arch.into(),
                supported: Family::ALL.map(|(n, _)| n).join(", "),
            });
        };
        let key = |k: &str| format!("{arch}.{k}");
        // Far above any LLaMA-class model and far below what would make building the graph
        // or binding its weights a denial of service (the tensors present are checked next).
        let hidden = size(g, &key("embedding_length"), 1 << 16)?;
        let layers = size(g, &key("block_count"), 1 << 10)?;
        let ffn = size(g, &key("feed_forward_length"), 1 << 18)?;
        let heads = size(g, &key("attention.head_count"), 1 << 10)?;
        let ctx = size(g, &key("context_length"), 1 << 24)?;
        let kv = size_or(g, &key("attention.head_count_kv"), 1 << 10, heads)?;
        if !heads.is_multiple_of(kv) {
            return config_error(
                g,
                &key("attention.head_count_kv"),
                format!("{kv} K/V heads do not divide {heads} query heads"),
            );
        }
        let head_dim = match g.get(&key("attention.key_length")) {
            Some(_) => size(g, &key("attention.key_length"), 1 << 12)?,
            None => {
                if !hidden.is_multiple_of(heads) {
                    return config_error(
                        g,
                        &key("attention.head_count"),
                        format!("{heads} heads do not divide embedding_length {hidden}"),
                    );
                }
                hidden / heads
            }
        };
        if g.get(&key("attention.value_length")).is_some()
            && g.u32(&key("attention.value_length"))? as usize != head_dim
        {
            return Err(ModelError::Unsupported {
                field: key("attention.value_length"),
                value: g.u32(&key("attention.value_length"))?.to_string(),
                supported: format!("the key length {head_dim}"),
            });
        }
        let rotary_dim = size_or(g, &key("rope.dimension_count"), 1 << 12, head_dim)?;
        if !rotary_dim.is_multiple_of(2) || rotary_dim > head_dim {
            let field = if g.get(&key("rope.dimension_count")).is_some() {
                key("rope.dimension_count")
            } else {
                key("attention.head_count")
            };
            return config_error(
                g,
                &field,
                format!("rope over {rotary_dim} of {head_dim} head dimensions: it needs an even count, at most the head size"),
            );
        }
        let eps = f64::from(g.f32(&key("attention.layer_norm_rms_epsilon"))?);
        if !(eps > 0.0 && eps < 1.0) {
            return config_error(
                g,
                &key("attention.layer_norm_rms_epsilon"),
                format!("{eps} is not in (0, 1)"),
            );
        }
        let theta = match g.get(&key("rope.freq_base")) {
            Some(_) => f64::from(g.f32(&key("rope.freq_base"))?),
            None => 10000.0,
        };
        if !(theta.is_finite() && theta > 1.0) {
            return config_error(g, &key("rope.freq_base"), format!("{theta} is not above 1"));
        }
        let rope_factors = rope_factors(g, arch, rotary_dim)?;
        let window = match g.get(&key("attention.sliding_window")) {
            // Phi-3's converter writes 0 for "no window".
            Some(_) => match g.u32(&key("attention.sliding_window"))? {
                0 => None,
                w => Some(w as usize),
            },
            None => None,
        };
        let tokens = g.strings("tokenizer.ggml.tokens").map(<[String]>::len).ok();
        let vocab = match (g.get(&key("vocab_size")), tokens) {
            (Some(_), _) => size(g, &key("vocab_size"), 1 << 24)?,
            (None, Some(n)) => n,
            (None, None) => size(g, &key("vocab_size"), 1 << 24)?,
        };
        let has = |t: &str| g.tensor_info(t).is_some();
        Ok(LlamaConfig {
            family,
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
            rotary_dim,
            rope_factors,
            sliding_window: window,
            tie_word_embeddings: !has("output.weight"),
            attention_bias: has("blk.0.attn_q.bias"),
            qk_norm: has("blk.0.attn_q_norm.weight"),
            fused_qkv: has("blk.0.attn_qkv.weight"),
            // Only Phi-3's converter fuses them; elsewhere a missing gate is a missing tensor.
            fused_gate_up: family == Family::Phi3 && !has("blk.0.ffn_gate.weight"),
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

/// The per-pair frequency divisors: `rope_freqs.weight` (Llama 3's `rope_scaling` of type
/// `llama3`, which llama.cpp's converter turns into this tensor) times a linear scaling factor
/// (`rope.scaling.factor`, or the older `rope.scale_linear`); empty when both are absent or 1.
/// Other scaling types are refused by name, as are LongRoPE's `rope_factors_{long,short}`.
fn rope_factors(g: &Gguf, arch: &str, rotary_dim: usize) -> Result<Vec<f64>, ModelError> {
    let key = |k: &str| format!("{arch}.{k}");
    if g.get(&key("rope.scaling.type")).is_some() {
        let t = g.str(&key("rope.scaling.type"))?;
        if t != "none" && t != "linear" {
            return Err(ModelError::Unsupported {
                field: key("rope.scaling.type"),
                value: t.into(),
                supported: "none, linear (and Llama 3's rope_freqs.weight)".into(),
            });
        }
    }
    for t in ["rope_factors_long.weight", "rope_factors_short.weight"] {
        if g.tensor_info(t).is_some() {
            return Err(ModelError::Unsupported {
                field: t.into(),
                value: "LongRoPE scaling".into(),
                supported: "none, linear (and Llama 3's rope_freqs.weight)".into(),
            });
        }
    }
    let mut linear = 1.0;
    for k in ["rope.scaling.factor", "rope.scale_linear"] {
        if g.get(&key(k)).is_some() {
            let f = f64::from(g.f32(&key(k))?);
            // llama.cpp reads 0 as "not set".
            if f != 0.0 {
                if !(f.is_finite() && f > 0.0) {
                    return config_error(g, &key(k), format!("{f} is not a positive factor"));
                }
                linear = f;
            }
        }
    }
    let half = rotary_dim / 2;
    let mut factors = match g.tensor_info("rope_freqs.weight") {
        Some(info) => {
            if info.shape() != [half] {
                return Err(ModelError::TensorShape {
                    name: "rope_freqs.weight".into(),
                    expected: vec![half],
                    found: info.shape(),
                });
            }
            let f: Vec<f64> = g
                .dequantize("rope_freqs.weight")?
                .into_iter()
                .map(f64::from)
                .collect();
            if let Some(bad) = f.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
                return config_error(
                    g,
                    "rope_freqs.weight",
                    format!("{bad} is not a positive frequency factor"),
                );
            }
            f
        }
        None => Vec::new(),
    };
    if linear != 1.0 {
        if factors.is_empty() {
            factors = vec![1.0; half];
        }
        factors.iter_mut().for_each(|f| *f *= linear);
    }
    Ok(factors)
}
