//! Where a LLaMA-family model's weights come from: one GGUF file, or a Hugging Face directory's
//! safetensors (one file or shards). The lowering names weights as GGUF does (`blk.N.attn_q.weight`);
//! a directory's tensors are found under transformers' names through [`hf_name`], so both
//! formats share the graph and only this mapping differs.

use super::super::checkpoint::Checkpoint;
use super::super::gguf::Gguf;
use super::super::ModelError;
use crate::ir::QuantScheme;

/// A weight as stored: its block scheme (none for floats), its logical shape, its bytes.
pub(super) type Stored<'a> = (Option<QuantScheme>, Vec<usize>, &'a [u8]);

pub(super) enum Source {
    Gguf(Gguf),
    Hf(Checkpoint),
}

/// transformers' name of the lowering's weight `name` (GGUF-style), or `None` for a name no
/// LLaMA-family checkpoint has. `fused_gate_up`: Phi-3's `gate_up_proj` is the lowering's
/// `ffn_up` (gate rows first, as both store it).
pub fn hf_name(name: &str, fused_gate_up: bool) -> Option<String> {
    let top = match name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output.weight" => Some("lm_head.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        _ => None,
    };
    if let Some(t) = top {
        return Some(t.into());
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (module, kind) = rest.rsplit_once('.')?;
    let hf = match module {
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_qkv" => "self_attn.qkv_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" if fused_gate_up => "mlp.gate_up_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{kind}"))
}

impl Source {
    /// The stored name of the lowering's weight `name`.
    fn stored(&self, name: &str, fused_gate_up: bool) -> Result<String, ModelError> {
        match self {
            Source::Gguf(_) => Ok(name.into()),
            Source::Hf(c) => {
                hf_name(name, fused_gate_up).ok_or_else(|| ModelError::MissingTensor {
                    path: c.dir().display().to_string(),
                    name: format!("{name} (no transformers name)"),
                })
            }
        }
    }

    /// The shape of weight `name` as stored (PyTorch order).
    pub(super) fn shape(&self, name: &str, fused_gate_up: bool) -> Result<Vec<usize>, ModelError> {
        let stored = self.stored(name, fused_gate_up)?;
        match self {
            Source::Gguf(g) => Ok(g.raw(&stored)?.0.shape()),
            Source::Hf(c) => {
                c.info(&stored)
                    .map(|i| i.shape.clone())
                    .ok_or_else(|| ModelError::MissingTensor {
                        path: c.dir().display().to_string(),
                        name: stored,
                    })
            }
        }
    }

    /// The values of weight `name` as f32 (dequantized, or widened from bf16/f16).
    pub(super) fn values(&self, name: &str, fused_gate_up: bool) -> Result<Vec<f32>, ModelError> {
        let stored = self.stored(name, fused_gate_up)?;
        match self {
            Source::Gguf(g) => g.dequantize(&stored),
            Source::Hf(c) => {
                let shape = self.shape(name, fused_gate_up)?;
                let t = c.tensor(&stored, &shape)?;
                Ok(t.as_f32()
                    .expect("safetensors tensors come out f32")
                    .to_vec())
            }
        }
    }

    /// The block quantization weight `name` is stored in: a GGUF tensor's type, or a
    /// safetensors U8 tensor marked as blocks (`safetensors::QUANT_KEY`).
    pub(super) fn scheme(&self, name: &str, fused_gate_up: bool) -> Option<QuantScheme> {
        match self {
            Source::Gguf(g) => g.tensor_info(name).and_then(|t| t.ggml_type.quant_scheme()),
            Source::Hf(c) => c.info(&hf_name(name, fused_gate_up)?)?.quant,
        }
    }

    /// Whether any weight is stored in blocks (what `--dtype q4` keeps).
    pub(super) fn holds_blocks(&self) -> bool {
        match self {
            Source::Gguf(g) => g.tensor_names().any(|n| {
                g.tensor_info(n)
                    .and_then(|t| t.ggml_type.quant_scheme())
                    .is_some()
            }),
            Source::Hf(c) => c
                .names()
                .any(|n| c.info(n).is_some_and(|i| i.quant.is_some())),
        }
    }

    /// The header entry's scheme and shape, and the stored bytes, of weight `name`'s blocks.
    pub(super) fn blocks(&self, name: &str, fused_gate_up: bool) -> Result<Stored<'_>, ModelError> {
        let stored = self.stored(name, fused_gate_up)?;
        match self {
            Source::Gguf(g) => {
                let (info, bytes) = g.raw(&stored)?;
                Ok((info.ggml_type.quant_scheme(), info.shape(), bytes))
            }
            Source::Hf(c) => {
                let (info, bytes) = c.raw(&stored).ok_or_else(|| ModelError::MissingTensor {
                    path: c.dir().display().to_string(),
                    name: stored,
                })?;
                Ok((info.quant, info.shape.clone(), bytes))
            }
        }
    }

    /// The GGUF file, for what only it has (blocks, metadata).
    pub(super) fn gguf(&self) -> Option<&Gguf> {
        match self {
            Source::Gguf(g) => Some(g),
            Source::Hf(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_transformers() {
        let cases = [
            ("token_embd.weight", "model.embed_tokens.weight"),
            ("output.weight", "lm_head.weight"),
            ("blk.3.attn_q.bias", "model.layers.3.self_attn.q_proj.bias"),
            (
                "blk.0.attn_k_norm.weight",
                "model.layers.0.self_attn.k_norm.weight",
            ),
            (
                "blk.1.ffn_norm.weight",
                "model.layers.1.post_attention_layernorm.weight",
            ),
            ("blk.1.ffn_up.weight", "model.layers.1.mlp.up_proj.weight"),
        ];
        for (ours, theirs) in cases {
            assert_eq!(hf_name(ours, false).as_deref(), Some(theirs), "{ours}");
        }
        assert_eq!(
            hf_name("blk.2.ffn_up.weight", true).as_deref(),
            Some("model.layers.2.mlp.gate_up_proj.weight")
        );
        assert_eq!(hf_name("rope_freqs.weight", false), None);
        assert_eq!(hf_name("blk.0.attn_sinks.weight", false), None);
    }
}
