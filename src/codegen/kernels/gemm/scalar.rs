//! The CUDA-core GEMM: any dtype, any views. 64×64 output tiles per block of 16×16 threads, each
//! thread 4×4 outputs, K in steps of 16 through shared memory, f32 accumulation. It is the
//! kernel for f32 (exact f32, as PyTorch's default) and for problems no matrix-core kernel takes.

use serde::Serialize;

use super::super::super::limits::launch;
use super::super::super::lower::finish;
use super::super::super::plan::{BufferId, Kernel};
use super::super::super::{CodegenError, Target};
use super::Problem;

/// Tile sizes of this kernel (fixed: the template is written for them).
pub(crate) struct Config {
    pub block_m: usize,
    pub block_n: usize,
    pub threads: usize,
}

pub(crate) const CONFIG: Config = Config {
    block_m: 64,
    block_n: 64,
    threads: 256,
};

#[derive(Serialize)]
struct Context<'a> {
    p: &'a Problem,
}

pub(crate) fn kernel(
    p: &Problem,
    node: &str,
    args: Vec<BufferId>,
    target: &Target,
) -> Result<Kernel, CodegenError> {
    let c = &CONFIG;
    let grid = [p.n.div_ceil(c.block_n), p.m.div_ceil(c.block_m), p.batch];
    let launch = launch(node, target, grid, c.threads)?;
    let ctx = serde_json::to_value(Context { p }).expect("a context serialises");
    finish("gemm", "gemm_scalar.hip", ctx, launch, args, node)
}
