//! LLaMA-family decoders (SmolLM2, Llama 3, Mistral, Qwen2/2.5, Qwen3, Phi-3) from one GGUF
//! file, one lowering with the families' differences as data ([`LlamaConfig`]): the
//! configuration from the `{arch}.*` metadata, the tokenizer from `tokenizer.ggml.*`, the weights dequantized when a
//! graph is bound, and the forward pass lowered as transformers' `LlamaForCausalLM` computes
//! it: embeddings, per layer RMSNorm → Q/K/V → RoPE → causal GQA attention → output projection
//! → residual, RMSNorm → SwiGLU MLP → residual; a final RMSNorm and the LM head (the embedding
//! table when the file has no `output.weight`).
//!
//! For the `llama` architecture llama.cpp's converter stores the rows of the Q and K projections
//! permuted so that its interleaved ("GPT-J") rope rotates adjacent pairs; the IR's rope is transformers'
//! rotate-half, so the rows are put back in transformers' order when the weights are read
//! (transformers' GGUF loader does the same, `reverse_permute`).

mod config;
mod lower;
mod weights;

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::gguf::Gguf;
use super::gguf_tokenizer::GgufTokenizer;
pub use super::nn::Heads;
use super::ModelError;
use crate::ir::{DType, Op};

use config::config_error;

pub use config::{Family, LlamaConfig};
pub use lower::{io, paged_io, AttentionStep, KvCache, Paged, PagedPrefill, PoolShape, Prefill};
pub use weights::unpermute_rows;

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
pub(super) fn file_tensor(node: &str) -> &str {
    node.strip_suffix(BLOCKS_SUFFIX).unwrap_or(node)
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
pub(super) fn lm_head(c: &LlamaConfig) -> &'static str {
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
                &format!("{}.block_count", config.family.name()),
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
                &format!("{}.vocab_size", config.family.name()),
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
}
