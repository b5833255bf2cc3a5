//! The intermediate representation: an op DAG over static tensor types.

mod attrs;
mod builders;
mod dot;
mod dtype;
mod error;
pub mod expr;
pub mod file;
pub mod format;
pub mod gemm;
mod graph;
pub mod hash;
mod infer;
pub mod kquant;
pub mod microscale;
pub mod op;
mod printer;
pub mod quant;
mod random;
pub mod scalar;
mod shape;
mod tensor;
mod values;
pub mod work;

pub use dot::to_dot;
pub use dtype::DType;
pub use error::GraphError;
pub use expr::Expr;
pub use file::{FileError, FileLimit};
pub use gemm::{Gemm, GemmDims, NormKind, Operand, Prologue, View};
pub use graph::{Graph, Node, NodeId, NodeIdHasher, NodeMap, NodeSet};
pub use hash::{fnv1a, fnv1a_128_hex, Fnv1a};
pub use infer::{infer, InferError};
pub use op::{rope_inv_freq, Arity, Op, OpKind};
pub use printer::{node_line, to_text};
pub use quant::{random_quant, QuantError, QuantScheme, QuantTensor};
pub use random::{random_input, random_weight, seeded_rng};
pub use scalar::Element;
pub use shape::{normalize_axis, Shape, TensorType, IN_PLACE_ALIGN_BYTES};
pub use tensor::{check_host_size, try_collect, Data, Tensor, TensorError, MAX_HOST_ELEMENTS};
pub use values::{
    check_window, window_visible, Append, Attention, BinaryOp, Init, MaskKind, ReduceOp, Sample,
    UnaryOp, WindowError,
};

pub(crate) use infer::{reduce_axes, slice_bounds};
