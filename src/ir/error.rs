//! Typed errors of graph construction, validation and loading. Each names the node, the op and
//! the types involved, so a user can find the line of the file at fault.

use thiserror::Error;

/// Why a graph (built, loaded or rewritten) is not valid.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum GraphError {
    #[error("node `{node}` is part of a cycle")]
    Cycle { node: String },

    #[error("node `{node}` uses `{input}`, which is not defined in the graph")]
    DanglingInput { node: String, input: String },

    #[error("node `{node}` ({op}) takes {expected} operand(s), got {got}")]
    Arity {
        node: String,
        op: String,
        expected: String,
        got: usize,
    },

    #[error("node `{node}` ({op}) on {inputs}: shape mismatch: {reason}")]
    ShapeMismatch {
        node: String,
        op: String,
        inputs: String,
        reason: String,
    },

    #[error("node `{node}` ({op}) on {inputs}: wrong dtype: {reason}")]
    DTypeMismatch {
        node: String,
        op: String,
        inputs: String,
        reason: String,
    },

    #[error("node `{node}` ({op}): invalid attribute: {reason}")]
    BadAttribute {
        node: String,
        op: String,
        reason: String,
    },

    #[error("node `{node}` ({op}): invalid sliding window: {error}")]
    BadWindow {
        node: String,
        op: String,
        error: super::values::WindowError,
    },

    #[error("node `{node}`: unknown op `{op}` (known ops: {known})")]
    UnknownOp {
        node: String,
        op: String,
        known: String,
    },

    #[error("node `{node}` ({op}): element count overflows: {reason}")]
    Overflow {
        node: String,
        op: String,
        reason: String,
    },

    #[error("node `{node}` (cache_write): {reason}")]
    StateWrite { node: String, reason: String },

    #[error("node name `{node}` is used twice")]
    DuplicateName { node: String },

    #[error("output `{name}` is not a node of the graph")]
    UnknownOutput { name: String },

    #[error("the graph has no outputs")]
    NoOutputs,

    #[error("no node with id {id} in the graph")]
    NoSuchNode { id: usize },

    #[error("stored type of node `{node}` is {stored}, but its op gives {inferred}")]
    StaleType {
        node: String,
        stored: String,
        inferred: String,
    },

    #[error("not valid JSON at line {line}, column {column}: {message}")]
    Json {
        line: usize,
        column: usize,
        message: String,
    },

    #[error("the graph file has no `version` field (this rocmforge writes version {supported})")]
    MissingVersion { supported: u32 },

    #[error(
        "graph file version {found} is not supported (this rocmforge reads version {supported})"
    )]
    UnsupportedVersion { found: String, supported: u32 },

    #[error("malformed graph file: {reason}")]
    Format { reason: String },

    #[error("cannot read `{path}`: {message}")]
    Io { path: String, message: String },

    #[error(transparent)]
    File(#[from] super::FileError),
}

impl GraphError {
    /// A stable snake_case name of the variant, for tests and machine-readable output.
    pub fn kind(&self) -> &'static str {
        match self {
            GraphError::Cycle { .. } => "cycle",
            GraphError::DanglingInput { .. } => "dangling_input",
            GraphError::Arity { .. } => "arity",
            GraphError::ShapeMismatch { .. } => "shape_mismatch",
            GraphError::DTypeMismatch { .. } => "dtype_mismatch",
            GraphError::BadAttribute { .. } => "bad_attribute",
            GraphError::BadWindow { .. } => "bad_window",
            GraphError::UnknownOp { .. } => "unknown_op",
            GraphError::Overflow { .. } => "overflow",
            GraphError::StateWrite { .. } => "state_write",
            GraphError::DuplicateName { .. } => "duplicate_name",
            GraphError::UnknownOutput { .. } => "unknown_output",
            GraphError::NoOutputs => "no_outputs",
            GraphError::NoSuchNode { .. } => "no_such_node",
            GraphError::StaleType { .. } => "stale_type",
            GraphError::Json { .. } => "json",
            GraphError::MissingVersion { .. } => "missing_version",
            GraphError::UnsupportedVersion { .. } => "unsupported_version",
            GraphError::Format { .. } => "format",
            GraphError::Io { .. } => "io",
            GraphError::File(_) => "file",
        }
    }
}
