//! LLaMA-family decoders (SmolLM2, Llama 3, Mistral, Qwen2/2.5, Qwen3, Phi-3) from one GGUF
//! file or a Hugging Face directory, one lowering with the families' differences as data
//! ([`LlamaConfig`]): the configuration from the `{arch}.*` metadata or config.json
//! (`hf_config.rs`), the tokenizer from `tokenizer.ggml.*` or tokenizer.json, the weights
//! (`source.rs`: GGUF names mapped to transformers') dequantized when a graph is bound, and the forward pass lowered as transformers' `LlamaForCausalLM` computes
//! it: embeddings, per layer RMSNorm → Q/K/V → RoPE → causal GQA attention → output projection
//! → residual, RMSNorm → SwiGLU MLP → residual; a final RMSNorm and the LM head (the embedding
//! table when the file has no `output.weight`).
//!
//! For the `llama` architecture llama.cpp's converter stores the rows of the Q and K projections
//! permuted so that its interleaved ("GPT-J") rope rotates adjacent pairs; the IR's rope is transformers'
//! rotate-half, so the rows are put back in transformers' order when the weights are read
//! (transformers' GGUF loader does the same, `reverse_permute`). A Hugging Face checkpoint's rows
//! are already in that order and are read as stored.

mod config;
mod hf_config;
mod lower;
mod source;
mod weights;

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::bert_config::read_required;
use super::checkpoint::Checkpoint;
use super::gguf::Gguf;
use super::gguf_tokenizer::GgufTokenizer;
pub use super::nn::Heads;
use super::ModelError;
use super::{hf_tokenizer, SETTINGS_FILE};
use crate::ir::{DType, Op};

use config::config_error;
use source::Source;

pub use config::{Family, LlamaConfig};
pub use lower::{
    io, paged_io, AttentionStep, KvCache, Paged, PagedChunk, PagedPrefill, PoolShape, Prefill,
};
pub use source::hf_name;
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

/// What a model was loaded from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum Format {
    /// One GGUF file; `architecture` is its `general.architecture`.
    Gguf { architecture: String },
    /// A Hugging Face directory; `model_type` from its config.json, `shards` the number of
    /// safetensors files.
    HfDirectory { model_type: String, shards: usize },
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Format::Gguf { architecture } => write!(f, "GGUF file, architecture {architecture}"),
            Format::HfDirectory { model_type, shards } => write!(
                f,
                "Hugging Face directory ({shards} safetensors file{}), model_type {model_type}",
                if *shards == 1 { "" } else { "s" }
            ),
        }
    }
}

/// A LLaMA-class model loaded from a GGUF file or a Hugging Face directory: configuration,
/// tokenizer, and the graphs and weights of its forward pass.
pub struct LlamaModel {
    /// The GGUF file or the directory.
    pub path: PathBuf,
    pub config: LlamaConfig,
    pub tokenizer: GgufTokenizer,
    pub format: Format,
    source: Source,
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
    /// A GGUF file ([`LlamaModel::load_gguf`]) or, when `path` is a directory, a Hugging Face
    /// one ([`LlamaModel::load_hf`]).
    pub fn load(path: &Path) -> Result<LlamaModel, ModelError> {
        if path.is_dir() {
            LlamaModel::load_hf(path)
        } else {
            LlamaModel::load_gguf(path)
        }
    }

    /// Opens `path` (see [`Gguf::open`]), reads the configuration and the tokenizer, and checks
    /// that every weight the forward pass reads is present with the shape the configuration
    /// implies, before any is dequantized.
    pub fn load_gguf(path: &Path) -> Result<LlamaModel, ModelError> {
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
            format: Format::Gguf {
                architecture: gguf.str("general.architecture")?.to_string(),
            },
            source: Source::Gguf(gguf),
        };
        model.check_weights()?;
        Ok(model)
    }

    /// A Hugging Face directory: config.json ([`LlamaConfig::from_hf`]), the safetensors
    /// weights (one file or the index's shards, memory-mapped, bf16/f16/f32), tokenizer.json
    /// with the ids and template of the settings files; every weight the forward pass reads
    /// checked present with its shape before any is read. HF checkpoints keep transformers'
    /// rotate-half Q/K rows, the IR rope's layout: nothing is permuted.
    pub fn load_hf(dir: &Path) -> Result<LlamaModel, ModelError> {
        let bytes = read_required(dir, "config.json", SETTINGS_FILE)?;
        let json: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| ModelError::Json {
                file: "config.json".into(),
                message: e.to_string(),
            })?;
        let checkpoint = Checkpoint::open(dir)?;
        let config = LlamaConfig::from_hf(&json, &|n| checkpoint.info(n).is_some())?;
        // Layers present beyond the configured count would be silently ignored: refused.
        let layers = checkpoint
            .names()
            .filter_map(|n| {
                n.strip_prefix("model.layers.")?
                    .split('.')
                    .next()?
                    .parse()
                    .ok()
            })
            .map(|l: usize| l.saturating_add(1))
            .max()
            .unwrap_or(0);
        if layers > config.num_hidden_layers {
            return Err(ModelError::Config {
                field: "num_hidden_layers".into(),
                reason: format!(
                    "{}, but the checkpoint holds tensors of {layers} (model.layers.*)",
                    config.num_hidden_layers
                ),
            });
        }
        let tokenizer = hf_tokenizer::read(dir, &json)?;
        if tokenizer.vocab_size() > config.vocab_size {
            return Err(ModelError::Config {
                field: "vocab_size".into(),
                reason: format!(
                    "{} rows of embeddings, but tokenizer.json has {} tokens",
                    config.vocab_size,
                    tokenizer.vocab_size()
                ),
            });
        }
        let model = LlamaModel {
            path: dir.to_path_buf(),
            format: Format::HfDirectory {
                model_type: json["model_type"].as_str().unwrap_or("?").to_string(),
                shards: checkpoint.shard_count(),
            },
            config,
            tokenizer,
            source: Source::Hf(checkpoint),
        };
        model.check_weights()?;
        Ok(model)
    }

    /// Every weight the single-token graph reads is stored with the shape the configuration
    /// implies (the other graphs read the same weights).
    fn check_weights(&self) -> Result<(), ModelError> {
        let g = self.graph(1, Logits::Last)?;
        for id in g.node_ids() {
            if let Op::Weight { .. } = g.op(id) {
                let n = g.node(id);
                let found = self.source.shape(&n.name, self.config.fused_gate_up)?;
                if found != n.ty.shape.dims() {
                    return Err(ModelError::TensorShape {
                        name: n.name.clone(),
                        expected: n.ty.shape.dims().to_vec(),
                        found,
                    });
                }
            }
        }
        Ok(())
    }

    /// Whether any weight is stored in quantized blocks (GGUF types, or safetensors tensors
    /// marked as blocks), which `Precision::quantized` keeps on the device.
    pub fn holds_blocks(&self) -> bool {
        self.source.holds_blocks()
    }

    /// The GGUF file, when the model came from one.
    pub fn gguf(&self) -> Option<&Gguf> {
        self.source.gguf()
    }
}
