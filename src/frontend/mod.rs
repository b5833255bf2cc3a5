//! Lowering real models into graphs: Hugging Face BERT-class encoders from config.json,
//! model.safetensors (memory-mapped) and tokenizer.json; LLaMA-class decoders from one GGUF file
//! (weights, tokenizer and configuration in its metadata) or a Hugging Face directory
//! (config.json, safetensors shards, tokenizer.json) through the same lowering.

mod bert;
mod bert_config;
pub mod checkpoint;
mod ggml_types;
pub mod gguf;
mod gguf_tokenizer;
mod hf_tokenizer;
pub mod llama;
pub mod nn;
mod safetensors;

use std::path::PathBuf;

use thiserror::Error;

use crate::ir::{DType, FileError, GraphError};

pub use bert::{BertEncoder, Encoded};
pub use bert_config::{BertConfig, Pooling, SETTINGS_FILE, TOKENIZER_FILE};
pub use ggml_types::GgmlType;
pub use gguf::{Gguf, GgufArray, GgufError, GgufTensor, GgufValue};
pub use gguf_tokenizer::GgufTokenizer;
pub use llama::{Format, LlamaConfig, LlamaModel};
pub use safetensors::{SafeTensors, TensorInfo, MAX_HEADER_BYTES, WEIGHTS_FILE};

/// The sentence-embedding model `scripts/fetch-models` installs and `rocmforge embed` uses.
pub const MINILM: &str = "all-MiniLM-L6-v2";

/// The decoder `scripts/fetch-models` installs: its directory in the model cache and the GGUF
/// file in it.
pub const SMOLLM2: &str = "SmolLM2-135M-Instruct";
pub const SMOLLM2_GGUF: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Where `scripts/fetch-models` puts model `name`: `$ROCMFORGE_MODELS/name`, else
/// `~/.cache/rocmforge/models/name`.
pub fn model_cache_dir(name: &str) -> PathBuf {
    std::env::var_os("ROCMFORGE_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_default()
                .join(".cache/rocmforge/models")
        })
        .join(name)
}

#[derive(Debug, Error)]
pub enum ModelError {
    #[error(
        "{dir}: missing {file} (is this a Hugging Face model directory? see scripts/fetch-models)"
    )]
    MissingFile { dir: String, file: String },
    #[error("cannot read {path}: {message}")]
    Io { path: String, message: String },
    #[error("{file}: {message}")]
    Json { file: String, message: String },
    #[error("config.json: `{field}`: {reason}")]
    Config { field: String, reason: String },
    #[error("config.json: `{field}` is {value}, but {file} holds `{tensor}` of shape {found:?}")]
    ConfigMismatch {
        field: String,
        value: usize,
        file: String,
        tensor: String,
        found: Vec<usize>,
    },
    #[error("{file}: `{field}`: {reason}")]
    Setting {
        file: String,
        field: String,
        reason: String,
    },
    #[error("{path}: not a valid safetensors file: {reason}")]
    Safetensors { path: String, reason: String },
    #[error("{path}: {error}")]
    Gguf {
        path: String,
        #[source]
        error: gguf::GgufError,
    },
    #[error("{path}: no tensor `{name}`")]
    MissingTensor { path: String, name: String },
    #[error("tensor `{name}` has shape {found:?}, the config implies {expected:?}")]
    TensorShape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("tensor `{name}` is {found}, expected a float tensor")]
    TensorDType { name: String, found: DType },
    #[error("`{field}` is `{value}`, which is not supported ({supported})")]
    Unsupported {
        field: String,
        value: String,
        supported: String,
    },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error(transparent)]
    File(#[from] FileError),
    #[error(transparent)]
    Graph(#[from] GraphError),
}
