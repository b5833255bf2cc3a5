//! The CUDA-core GEMM: any float dtype, any views. Register-blocked: each thread computes 8×8
//! outputs from 16-byte reads of shared memory, K moves in steps of 8 through double-buffered
//! shared memory, f32 accumulation. It is the kernel for f32 (exact f32, as PyTorch's default)
//! and for the problems no matrix-core kernel takes. f32 operands are read from global memory
//! 16 bytes at a time where their view allows (`vectors`), element by element otherwise.

use serde::Serialize;

use super::super::super::limits::launch as checked_launch;
use super::super::super::plan::{BufferId, Kernel, Launch};
use super::super::super::CodegenError;
use super::vectors::{vectorizes, Along};
use super::Problem;
use crate::arch::Target;
use crate::codegen::kernel::finish;
use crate::ir::gemm::Operand;
use crate::ir::{DType, Gemm, View};

/// Output tiles, largest first: the largest whose grid still fills the GPU is taken.
const TILES: [(usize, usize); 3] = [(128, 128), (128, 64), (64, 64)];
/// Outputs per thread along M and along N (the template's quadrants are written for 8).
const PER_THREAD: usize = 8;
/// Elements of K per step.
const BLOCK_K: usize = 8;
/// Blocks that keep a large GPU busy (H100: 132 SMs, MI300X: 304 CUs, two blocks each of the
/// largest tile): below this, a smaller tile gives more blocks.
const FILL_BLOCKS: usize = 264;

/// How an operand's tile is read from global memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Load {
    /// 16 bytes along K.
    K,
    /// 16 bytes along the operand's other axis (M for A, N for B).
    X,
    /// Elements, consecutive threads along K (K innermost in memory).
    Ek,
    /// Elements, consecutive threads along M or N.
    Ex,
}

/// How one CUDA-core GEMM kernel is shaped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Config {
    pub block_m: usize,
    pub block_n: usize,
    pub block_k: usize,
    pub a_load: Load,
    pub b_load: Load,
}

impl Config {
    pub(crate) fn threads(&self) -> usize {
        (self.block_m / PER_THREAD) * (self.block_n / PER_THREAD)
    }
}

/// How `view` is read: `k` is the axis along K (A's columns, B's rows), `x` the other one.
fn load(gemm: &Gemm, view: &View, operand: Operand, dtype: DType, k: Along, x: Along) -> Load {
    let vectors = dtype == DType::F32;
    let along = |axis: Along, vec: usize| vectorizes(&gemm.dims, view, operand, axis, vec);
    if vectors && along(k, 4) {
        Load::K
    } else if vectors && along(x, 4) {
        Load::X
    } else if along(k, 1) {
        Load::Ek
    } else {
        Load::Ex
    }
}

/// The kernel's shape for `p`: the largest tile whose grid fills the GPU, each operand's load.
pub(crate) fn config(p: &Problem, gemm: &Gemm, dtype: DType) -> Config {
    let blocks = |(bm, bn): (usize, usize)| {
        p.batch
            .saturating_mul(p.m.div_ceil(bm))
            .saturating_mul(p.n.div_ceil(bn))
    };
    let (block_m, block_n) = TILES
        .into_iter()
        .find(|&t| blocks(t) >= FILL_BLOCKS)
        .unwrap_or(TILES[TILES.len() - 1]);
    Config {
        block_m,
        block_n,
        block_k: BLOCK_K,
        a_load: load(gemm, &gemm.a, Operand::A, dtype, Along::Cols, Along::Rows),
        b_load: load(gemm, &gemm.b, Operand::B, dtype, Along::Rows, Along::Cols),
    }
}

/// The launch of `c` for `p`: tiles of N along x, of M along y, the batch along z.
pub(crate) fn launch(
    c: &Config,
    p: &Problem,
    node: &str,
    target: &Target,
) -> Result<Launch, CodegenError> {
    let grid = [p.n.div_ceil(c.block_n), p.m.div_ceil(c.block_m), p.batch];
    checked_launch(node, target, grid, c.threads())
}

#[derive(Serialize)]
struct Context<'a> {
    p: &'a Problem,
    c: &'a Config,
    threads: usize,
}

pub(crate) fn kernel(
    p: &Problem,
    gemm: &Gemm,
    dtype: DType,
    node: &str,
    args: Vec<BufferId>,
    target: &Target,
) -> Result<Kernel, CodegenError> {
    let c = config(p, gemm, dtype);
    let launch = launch(&c, p, node, target)?;
    let ctx = Context {
        p,
        c: &c,
        threads: c.threads(),
    };
    finish("gemm", "gemm_scalar.hip", ctx, launch, args, node)
}
