//! GEMMs on quantized weights (`Op::Weight` with `quant`, blocks as `ir::quant` defines them).
//!
//! - Decoding (M ≤ 16, up to 64 in groups of rows where the tiled kernels' grid would be small:
//!   `ir::gemm::runs_as_gemv`): [`kernel`], the small-M GEMM that reads B's blocks along K and
//!   dequantizes them in registers, accumulating in f32. B must be the weight itself read
//!   transposed (`x · Wᵀ` with W `[N, K]`, K along the blocks): [`reads_blocks`] says when.
//!   The weight's buffer holds only the blocks, so decoding moves 4.5 to 8.5 bits a weight.
//! - Everything else (prefill past the small-M bound, any other reader of a quantized weight):
//!   [`dequantize`] writes the values, in the weight's dtype, into a workspace that the memory
//!   plan reuses once its readers are done, and the reader runs as on a dense weight. Prefill
//!   is compute-bound: one pass over the weight (N·K/32 blocks read, N·K values written) costs
//!   little against a product of more rows, and the f16 product then runs on the matrix cores,
//!   which a CUDA-core kernel reading blocks would give up.

use serde::Serialize;

use super::super::super::limits::{launch as checked_launch, launch_1d};
use super::super::super::plan::{BufferId, Kernel, KernelPlan};
use super::super::super::{ctype::ctype, CodegenError};
use super::vectors::{vectorizes, Along};
use super::Problem;
use crate::arch::Target;
use crate::codegen::kernel::finish;
use crate::ir::gemm::Operand;
use crate::ir::quant::BLOCK_ELEMS;
use crate::ir::{Gemm, Graph, NodeId, Op, QuantScheme, Shape, TensorType};

/// Accumulators per thread (M × cols) at most, as in the dense small-M kernel.
const MAX_ACC: usize = 64;
/// Columns per block at most.
const MAX_COLS: usize = 4;
/// Waves per block at most.
const MAX_WAVES: usize = 4;
/// Quarter blocks each thread should have at least before another wave is added.
const PIECES_PER_THREAD: usize = 2;
/// Blocks that keep a large GPU busy: fewer columns per block while the grid is smaller.
const FILL_BLOCKS: usize = 512;
/// Values one thread dequantizes at a time: a quarter block.
const PIECE: usize = 8;

/// The most rows one block of the fused kernel computes on `scheme`'s blocks (more rows run
/// in groups of them, `Config::row_groups`): `ir::gemm::GEMV_GROUP_ROWS`, but Q5_K's reader at
/// 16 rows spills 4 bytes on sm_90 (ptxas 13.0: 80 registers, 8-byte stack frame,
/// `gemm_kernels` `compile::nvrtc::sm_90`), so 8 there; paired columns 8 (their combine and
/// epilogue also live at the end: bf16 with the norm spilled on gfx1100/gfx1201 at 16).
fn group_rows(scheme: QuantScheme, pair: bool) -> usize {
    match (scheme, pair) {
        (QuantScheme::Q5K, _) | (_, true) => 8,
        (_, false) => crate::ir::gemm::GEMV_GROUP_ROWS,
    }
}

/// The scheme of Gemm `id`'s B operand when the fused kernel reads it: B is a quantized weight
/// `[N, K]` read as `Wᵀ` (K along its blocks, contiguous; N the rows; no batch), read by no
/// other slot of the node, and the Gemm runs as a GEMV (`ir::gemm::runs_as_gemv`: the rule the
/// passes that fold a norm or pair columns read, so what they produce is read here; past it,
/// dequantize, then a dense GEMM).
pub(crate) fn reads_blocks(g: &Graph, id: NodeId, gemm: &Gemm) -> Option<QuantScheme> {
    let ops = g.operands(id);
    let w = *ops.get(1)?;
    let Op::Weight {
        quant: Some(scheme),
        ..
    } = g.op(w)
    else {
        return None;
    };
    if ops.iter().filter(|&&o| o == w).count() != 1 {
        return None;
    }
    let [batch, m, n, k] = gemm.dims.sizes()?;
    if !crate::ir::gemm::runs_as_gemv(batch, m, n) || g.ty(w).shape.dims() != [n, k] {
        return None;
    }
    // The view of W [N, K] read transposed: N's sub-axes outer, K's inner, both contiguous.
    let all: Vec<usize> = gemm.dims.n.iter().chain(&gemm.dims.k).copied().collect();
    let strides = Shape(all).strides();
    let (want_n, want_k) = strides.split_at(gemm.dims.n.len());
    let matches = |sizes: &[usize], got: &[usize], want: &[usize]| {
        sizes.len() == got.len()
            && sizes
                .iter()
                .zip(got.iter().zip(want))
                .all(|(&s, (g, w))| s == 1 || g == w)
    };
    let b = &gemm.b;
    (b.batch.iter().all(|&s| s == 0)
        && matches(&gemm.dims.n, &b.cols, want_n)
        && matches(&gemm.dims.k, &b.rows, want_k))
    .then_some(*scheme)
}

/// How one fused kernel is shaped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Config {
    /// Columns of the result (rows of W) per block.
    pub cols: usize,
    /// Waves per block, splitting K.
    pub waves: usize,
    /// Whether A is read 4 elements at a time along K.
    pub a_vec: bool,
    /// Rows of M per block (M itself where one group holds them) and groups of them (the
    /// last partial where `rows` does not divide M), as in `small_m::Config`.
    pub rows: usize,
    pub row_groups: usize,
}

pub(crate) fn config(p: &Problem, gemm: &Gemm, scheme: QuantScheme, target: &Target) -> Config {
    let wave = target.wave_size as usize;
    let pieces = p.k / PIECE;
    let (rows, row_groups) = super::small_m::split_rows(p.m, group_rows(scheme, p.pair));
    let blocks = |cols: usize| {
        p.batch
            .saturating_mul(p.n.div_ceil(cols))
            .saturating_mul(row_groups)
    };
    // Paired columns: a quarter of the sums per thread at most, the pair's combine and its
    // epilogue also live at the end (bf16 with the norm prologue spilled on gfx1100/gfx1201 at
    // 32 sums: M 16, 2 columns).
    let acc = if p.pair { MAX_ACC / 4 } else { MAX_ACC };
    let mut cols = MAX_COLS.min(acc / rows).max(1);
    // Paired columns: a block holds whole pairs, so an even count (rows 5 gave 3 columns, then
    // 1 where the grid was small: a pair split across blocks, as `small_m::config` once had).
    let least = if p.pair { 2 } else { 1 };
    if p.pair {
        cols -= cols % 2;
    }
    cols = cols.max(least);
    // In a persistent plan, fewer blocks fill it (`Problem::fill_blocks`).
    while cols > least && blocks(cols) < FILL_BLOCKS.min(p.fill_blocks) {
        cols /= 2;
        if p.pair {
            cols = (cols - cols % 2).max(least);
        }
    }
    Config {
        cols,
        waves: pieces
            .div_ceil(wave * PIECES_PER_THREAD)
            .clamp(1, MAX_WAVES),
        a_vec: vectorizes(&gemm.dims, &gemm.a, Operand::A, Along::Cols, 4),
        rows,
        row_groups,
    }
}

#[derive(Serialize)]
struct Context<'a> {
    p: &'a Problem,
    c: &'a Config,
    scheme: &'static str,
    threads: usize,
    /// Groups of 32 values per row of W.
    blocks: usize,
    /// Groups of 32 per block of the scheme (8 for the k-quants), which picks the reader.
    groups: usize,
    block_elems: usize,
    block_bytes: usize,
    /// Bytes of A's elements.
    a_bytes: usize,
    weight_bytes: usize,
    dense_bytes: usize,
}

/// The fused small-M kernel for `p` on a `scheme` weight (see [`reads_blocks`]).
pub(crate) fn kernel(
    p: &Problem,
    gemm: &Gemm,
    scheme: QuantScheme,
    node: &str,
    args: Vec<BufferId>,
    target: &Target,
) -> Result<Kernel, CodegenError> {
    let c = config(p, gemm, scheme, target);
    let threads = c.waves * target.wave_size as usize;
    // The row group x's fastest digit, as in `small_m::launch`: the groups reading the same
    // rows of W are adjacent in launch order.
    let x = p.n.div_ceil(c.cols).saturating_mul(c.row_groups);
    let launch = checked_launch(node, target, [x, p.batch, 1], threads)?;
    let blocks = p.k / BLOCK_ELEMS;
    let ctx = Context {
        p,
        c: &c,
        scheme: scheme.name(),
        threads,
        blocks,
        groups: scheme.block_elems() / BLOCK_ELEMS,
        block_elems: scheme.block_elems(),
        block_bytes: scheme.block_bytes(),
        a_bytes: p.input.size_bytes(),
        weight_bytes: p.n * (p.k / scheme.block_elems()) * scheme.block_bytes(),
        dense_bytes: p.n * p.k * p.input.size_bytes(),
    };
    finish("gemm_quant", "gemm_quant.hip", ctx, launch, args, node)
}

#[derive(Serialize)]
struct DequantizeContext {
    scheme: &'static str,
    elems: usize,
    blocks: usize,
    groups: usize,
    block_bytes: usize,
    ctype: &'static str,
    store_pre: &'static str,
    store_post: &'static str,
    threads: usize,
}

/// Appends to `plan` a workspace holding the values of quantized weight buffer `weight` (of
/// type `ty`) and the kernel that writes them; returns the workspace.
pub(crate) fn dequantize(
    plan: &mut KernelPlan,
    weight: BufferId,
    scheme: QuantScheme,
    ty: &TensorType,
    target: &Target,
) -> Result<BufferId, CodegenError> {
    let name = plan.buffers[weight].name.clone();
    let elems = ty.shape.numel();
    let blocks = elems / BLOCK_ELEMS;
    let launch = launch_1d(&name, target, blocks.saturating_mul(4))?;
    let c = ctype(ty.dtype);
    let ctx = DequantizeContext {
        scheme: scheme.name(),
        elems,
        blocks,
        groups: scheme.block_elems() / BLOCK_ELEMS,
        block_bytes: scheme.block_bytes(),
        ctype: c.storage,
        store_pre: c.store_pre,
        store_post: c.store_post,
        threads: launch.block[0] as usize,
    };
    let out = plan.add_typed_workspace(&format!("{name}:dequantized"), ty.clone());
    let k = finish(
        "dequantize",
        "dequantize.hip",
        ctx,
        launch,
        vec![weight, out],
        &name,
    )?;
    plan.kernels.push(k);
    Ok(out)
}
