//! Kernel families with typed template contexts: each owns its `Config`, the function that
//! gives its launch geometry, and the choice among its kernels for a problem.

pub(crate) mod attention;
pub(crate) mod gemm;
