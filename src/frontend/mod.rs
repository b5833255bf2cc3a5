//! Lowering real models into graphs: Hugging Face BERT-class encoders from config.json,
//! model.safetensors (memory-mapped) and tokenizer.json.

mod bert;
mod safetensors;

use thiserror::Error;

use crate::ir::{DType, GraphError};

pub use bert::{BertConfig, BertEncoder, Encoded, Pooling};
pub use safetensors::{SafeTensors, TensorInfo};

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
    #[error("{path}: not a valid safetensors file: {reason}")]
    Safetensors { path: String, reason: String },
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
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error(transparent)]
    Graph(#[from] GraphError),
}
