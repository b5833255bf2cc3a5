//! Kernel families with typed template contexts: each owns its context, its `Config` where it
//! has a choice, the function that gives its launch geometry, and the choice among its
//! kernels for a problem. Families use the shared plumbing below them (`codegen/kernel.rs`,
//! `limits`, `ctype`, `plan`) and never `lower.rs`, which dispatches to them.

pub(crate) mod argmax;
pub(crate) mod attention;
pub(crate) mod cache_write;
pub(crate) mod causal_mask;
pub(crate) mod copy;
pub(crate) mod elementwise;
pub(crate) mod gather;
pub(crate) mod gemm;
pub(crate) mod matmul;
pub(crate) mod norm;
pub(crate) mod reduce;
pub(crate) mod rope;
pub(crate) mod softmax;
pub(crate) mod tile;
