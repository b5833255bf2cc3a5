//! The decode GEMV on Q4_0, Q4_1, Q8_0 and the K-quants Q4_K, Q5_K, Q6_K with 8-bit activations
//! (`gemm_quant_dot.hip`): A's rows are quantized once per block into shared memory (an int8
//! per value, a scale and the exact sum per 32), then W's quants meet them in 4-way int8 dot
//! products (`rf_dot4_i8`: the arch row's [`crate::arch::Dot4`]), scaled per block in f32.
//! llama.cpp's mmvq (`vec_dot_q4_1_q8_1` and kin) is the idea.
//!
//! How it keeps DRAM busy (issue 25): W's bytes are read once for all M rows of A; each lane
//! loads `Config::unroll` pieces of each of its rows before it uses the first, and issues the
//! first step's loads before the activation stage, so they are in flight while A is
//! quantized; the grid is at most `MAX_GRID` blocks, each striding over groups of rows, so
//! that on a large N (the LM head) a block quantizes A once for many rows instead of once per
//! 8 rows. The activation stage itself takes runs of 8 values per thread (4 lanes per group of
//! 32, two shuffle steps per reduction), several runs' loads in flight at once. Before (tenth
//! session): one value per thread and round, five shuffle steps per reduction, and a block
//! per 8 rows: that stage, not W's bytes, set the time (M 4 cost 4× M 1).
//!
//! Where it is chosen (over [`super::quant::kernel`], which dequantizes to f32 and runs
//! f32 multiply-adds): the three legacy schemes, M ≤ [`MAX_M`], and A's int8 tile (M·K·1.25
//! bytes) within the target's static shared memory. Both kernels read W's bytes once;
//! per 8 bytes of Q4 quants (16 values) and row of A this one runs 4 dot products and 2
//! multiply-adds where the f32 kernel runs 16 multiply-adds and 8 conversions, so it wins at any
//! M. The bound is the activation stage: each block quantizes all M rows (M·K values) for its
//! rows of W; past M 8 that stage costs about as much as the block's dot products, and the tile
//! grows past what leaves room for occupancy.
//! The result differs from the f32 product by A's rounding to 8 bits: per element at most
//! Σ over K's groups of d/2 · Σ|w| (d = max|x|/127 of the group), which the tests hold it to.
//! The offset (Q4_0's −8) and min (Q4_1) terms take the sum of the rounded values, not of A's:
//! the product is then exactly Σ w·(d·q), so the bound holds with W's values as they are.
//!
//! K-quants (256-value super-blocks of 8 sub-blocks of 32, each with its 6-bit scale and min,
//! Q6_K 16 sub-blocks of 16 with 8-bit scales): a lane takes 32 values of a super-block per
//! piece, 16 bytes of quants in one load (Q4_K/Q5_K; Q6_K's 210-byte blocks are only 2-byte
//! aligned: 2-byte loads), unpacks the two sub-block scales the piece spans once, and runs 8 dot
//! products per row of A. The activation groups of 32 are the sub-blocks: Q4_K/Q5_K's min terms
//! take half a sub-block's d·Σq per piece (the two pieces of a sub-block add up to it); Q6_K's
//! −32 offset is taken off the quant bytes before the dot products (values −32..31 fit an int8).
//! These are chosen by default ([`by_default`]): the f32 reader decodes them value by value.

use serde::Serialize;

use super::super::super::limits::{int_index, launch as checked_launch};
use super::super::super::plan::{BufferId, Kernel, KernelPlan};
use super::super::super::CodegenError;
use super::Problem;
use crate::arch::Target;
use crate::codegen::kernel::finish;
use crate::codegen::QuantSplit;
use crate::ir::quant::BLOCK_ELEMS;
use crate::ir::{DType, QuantScheme, TensorType};

/// The most rows of A the kernel takes (see the module comment).
pub const MAX_M: usize = 8;
/// The most rows of A the kernel takes on K-quant weights.
const MAX_M_SUPER: usize = 4;
/// Waves per block: each takes its own rows of W. 8 rather than 4: the activation stage (each
/// block's, on the critical path where a block takes one group of rows) has twice the threads,
/// and a block serves twice the rows with it (H200, 2026-11-28: Llama-1B's down projection
/// M 1 Q4_K 910 → 1250 GB/s, gate_up M 4 532 → 796; docs/performance.md).
const WAVES: usize = 8;
/// Rows of W per wave at most.
const MAX_COLS: usize = 2;
/// Blocks that keep a large GPU busy: one row per wave while the grid is smaller.
const FILL_BLOCKS: usize = 512;
/// Pieces of W a lane loads before it uses the first (`Config::unroll` × `Config::cols`) where
/// a block takes one group of rows: only the first step's loads overlap the activation stage
/// there, so each lane issues many. Where blocks stride over several groups, [`IN_FLIGHT_STRIDING`]:
/// fewer registers, more blocks resident (measured on the H200's LM head: Q6_K M 1 1965 → 2257
/// GB/s, Q4_K 2501 → 2718; the down projection lost 1250 → 1108 at 2).
const IN_FLIGHT: usize = 4;
/// Pieces in flight a lane where blocks stride over several groups of rows (see [`IN_FLIGHT`]).
const IN_FLIGHT_STRIDING: usize = 2;
/// Blocks at most (times the batch): past it, each block takes several groups of rows, so
/// that the activations it quantizes serve them all (on the LM head, 8 groups a block: a
/// block per group measured 1729 GB/s against 2620 with 4 waves).
const MAX_GRID: usize = 1024;
/// Runs of 8 activation values a thread loads before it rounds them.
const RUNS_IN_FLIGHT: usize = 4;
/// Bytes of W from which, by default ([`QuantSplit::Auto`]), A is quantized once by a kernel of
/// its own (`gemm_quant_act.hip`, into a workspace the GEMV then reads from L2) instead of by
/// every block of the GEMV. What the split saves is the per-block stage repeated by every block
/// (up to `MAX_GRID` of them, each quantizing all M·K values before its first dot product, a
/// barrier behind it; the ncu profile of the LM head, 128256 × 2048 Q4_K, showed the SMs ~65%
/// busy issuing); what it costs is one launch more, ~4–6 µs all in per kernel of a replayed
/// decode plan (docs/performance.md, sixteenth session), partly hidden on sm_90 where the GEMV
/// launches as a programmatic dependent and asks L2 for its first rows while it waits. So it
/// pays only where W's own streaming time is well above a launch: 16 MiB is ~5 µs at the
/// H100's 3.35 TB/s. Below it fall every projection of Llama-3.2-1B (≤ 9.4 MB in Q4_K) and
/// all of SmolLM2's (≤ 0.6 MB), where the grid is at most about one round of resident blocks
/// and the stage runs once per SM anyway; above it the LM heads (74 MB for Llama-3.2-1B's in
/// Q4_K) and 8B-class FFN projections (33 MB), where the grid strides and the blocks' stages
/// repeat. Not yet placed by measurement: `ROCMFORGE_BENCH_QUANT_SPLIT=on|off` runs the gemm
/// bench's rows both ways.
pub(crate) const SPLIT_MIN_WEIGHT_BYTES: usize = 16 << 20;

/// How the kernel reads a scheme's blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reader {
    /// A legacy 32-value block in this many pieces of 8 bytes of quants.
    Legacy(usize),
    /// A 256-value K-quant super-block in 8 pieces of 32 values (16 bytes of quants each, the
    /// sub-block scales unpacked per piece).
    Super,
}

/// The reader of `scheme`'s blocks, when the kernel reads them.
fn reader(scheme: QuantScheme) -> Option<Reader> {
    match scheme {
        QuantScheme::Q4_0 | QuantScheme::Q4_1 => Some(Reader::Legacy(2)),
        QuantScheme::Q8_0 => Some(Reader::Legacy(4)),
        QuantScheme::Q4K | QuantScheme::Q5K | QuantScheme::Q6K => Some(Reader::Super),
        QuantScheme::Q5_0
        | QuantScheme::Q5_1
        | QuantScheme::Iq4Nl
        | QuantScheme::Q2K
        | QuantScheme::Q3K
        | QuantScheme::Q8K
        | QuantScheme::Mxfp4
        | QuantScheme::Mxfp6E2m3
        | QuantScheme::Mxfp6E3m2 => None,
    }
}

/// Whether this kernel is chosen for `scheme` whatever `CodegenOptions::int8_gemv` says: the
/// K-quants, whose alternative is the f32 reader's element-by-element decoding (each value's
/// 6-bit scale and min unpacked again, the quants read byte by byte).
pub(crate) fn by_default(scheme: QuantScheme) -> bool {
    reader(scheme) == Some(Reader::Super)
}

/// The most rows of A the kernel takes on `scheme`: [`MAX_M`] for the legacy schemes, 4 for the
/// K-quants (decode sizes; past them the f32 reader, whose spills are known, as before).
fn max_m(scheme: QuantScheme) -> usize {
    match reader(scheme) {
        Some(Reader::Super) => MAX_M_SUPER,
        Some(Reader::Legacy(_)) | None => MAX_M,
    }
}

/// Shared memory of the activation stage: M·K int8 values, a scale and a sum per 32; with a
/// prologue also its rows' statistics (2 floats a row) and a float per wave for the reductions
/// (counted for the narrowest wave, 32 lanes, and the most threads a block has, 1024).
fn shared_bytes(p: &Problem) -> usize {
    let norm = if p.prologue.is_some() {
        4 * (2 * p.m + 1024 / 32)
    } else {
        0
    };
    // The scales in pairs of groups (16 bytes), a last half pair where M·K / 32 is odd.
    p.m * p.k + 16 * (p.m * (p.k / BLOCK_ELEMS)).div_ceil(2) + norm
}

/// Whether this kernel computes the Gemm `p` on a `scheme` weight that the fused kernels read
/// (`quant::reads_blocks` said so): a scheme it reads, M within its bound, K whole blocks,
/// the tile fits.
pub(crate) fn takes(p: &Problem, scheme: QuantScheme, target: &Target) -> bool {
    reader(scheme).is_some()
        && (1..=max_m(scheme)).contains(&p.m)
        && p.k.is_multiple_of(scheme.block_elems())
        && shared_bytes(p) <= target.caps.static_shared_bytes as usize
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Config {
    /// Rows of W (columns of the result) per wave.
    pub cols: usize,
    pub waves: usize,
    /// Pieces per lane and row in one step (all loaded before the first is used).
    pub unroll: usize,
    /// Blocks along N: they stride over the groups of `waves` × `cols` rows.
    pub grid: usize,
}

/// The kernel's shape for `p`, with `pieces` pieces per row of W, on `wave`-wide waves.
fn config(p: &Problem, pieces: usize, wave: usize) -> Config {
    let blocks = |cols: usize| p.batch.saturating_mul(p.n.div_ceil(cols * WAVES));
    let cols = if blocks(MAX_COLS) >= FILL_BLOCKS {
        MAX_COLS
    } else {
        1
    };
    let groups = p.n.div_ceil(cols * WAVES);
    let grid = groups.min((MAX_GRID / p.batch.max(1)).max(1));
    let in_flight = if grid < groups {
        IN_FLIGHT_STRIDING
    } else {
        IN_FLIGHT
    };
    let unroll = pieces.div_ceil(wave).clamp(1, (in_flight / cols).max(1));
    Config {
        cols,
        waves: WAVES,
        unroll,
        grid,
    }
}

#[derive(Serialize)]
struct Context<'a> {
    p: &'a Problem,
    c: &'a Config,
    scheme: &'static str,
    threads: usize,
    /// A quantized by the node's first kernel into the workspace (`split`), whose scales start
    /// at float `ds_at`; else by every block into shared memory.
    split: bool,
    ds_at: usize,
    block_elems: usize,
    /// Pieces per 32 values: 8 bytes of quants each for the legacy schemes, 1 (32 values) for
    /// the K-quants.
    ppb: usize,
    /// A K-quant super-block reader.
    kq: bool,
    runs_in_flight: usize,
    block_bytes: usize,
    weight_bytes: usize,
    dense_bytes: usize,
}

/// Whether A gets a kernel of its own for `p` on a `scheme` weight (see
/// [`SPLIT_MIN_WEIGHT_BYTES`]). A persistent plan keeps A's quantization inside the GEMV unless
/// the caller forces the split: in one kernel the split is one more step and a wait per GEMV,
/// and with it the persistent kernel's scalar registers spilled on gfx90a, gfx942 and gfx1030.
pub(crate) fn splits(p: &Problem, scheme: QuantScheme, choice: QuantSplit) -> bool {
    match choice {
        QuantSplit::On => true,
        QuantSplit::Off => false,
        QuantSplit::Auto if p.persistent => false,
        QuantSplit::Auto => {
            let bytes =
                p.n.saturating_mul(p.k / scheme.block_elems())
                    .saturating_mul(scheme.block_bytes());
            bytes >= SPLIT_MIN_WEIGHT_BYTES
        }
    }
}

/// The quantize kernel's context (`gemm_quant_act.hip`).
#[derive(Serialize)]
struct ActContext<'a> {
    p: &'a Problem,
    scheme: &'static str,
    threads: usize,
    runs_in_flight: usize,
    ds_at: usize,
}

/// The kernel(s) for `p` on a `scheme` weight; `None` where [`takes`] refuses it. `args` are the
/// node's (A, B, the extras, the prologue's weight and bias, the result). Where A gets a kernel
/// of its own ([`splits`]), that kernel and its workspace are added to `plan` here (the node's
/// first kernel: it reads A and the prologue's operands, writes the workspace) and the GEMV
/// returned reads the workspace in A's place; both are the node's, so a listing of the plan
/// shows the two launches under the one Gemm.
pub(crate) fn kernel(
    p: &Problem,
    scheme: QuantScheme,
    node: &str,
    args: Vec<BufferId>,
    target: &Target,
    split: QuantSplit,
    plan: &mut KernelPlan,
) -> Result<Option<Kernel>, CodegenError> {
    let Some(r) = reader(scheme).filter(|_| takes(p, scheme, target)) else {
        return Ok(None);
    };
    let (ppb, kq) = match r {
        Reader::Legacy(ppb) => (ppb, false),
        Reader::Super => (1, true),
    };
    let c = config(p, p.k / BLOCK_ELEMS * ppb, target.wave_size as usize);
    let threads = c.waves * target.wave_size as usize;
    let launch = checked_launch(node, target, [c.grid, p.batch, 1], threads)?;
    fn ctx<'a>(
        p: &'a Problem,
        c: &'a Config,
        scheme: QuantScheme,
        (threads, ppb, kq): (usize, usize, bool),
        (split, ds_at): (bool, usize),
    ) -> Context<'a> {
        Context {
            p,
            c,
            scheme: scheme.name(),
            threads,
            split,
            ds_at,
            block_elems: scheme.block_elems(),
            ppb,
            kq,
            runs_in_flight: RUNS_IN_FLIGHT,
            block_bytes: scheme.block_bytes(),
            weight_bytes: p.n * (p.k / scheme.block_elems()) * scheme.block_bytes(),
            dense_bytes: p.n * p.k * p.input.size_bytes(),
        }
    }
    let shape = (threads, ppb, kq);
    if !splits(p, scheme, split) {
        let ctx = ctx(p, &c, scheme, shape, (false, 0));
        return finish("gemm_quant", "gemm_quant_dot.hip", ctx, launch, args, node).map(Some);
    }
    // The workspace: batch·M·K int8 values, then two floats per 32 (K is whole groups of 32).
    let too_large = || CodegenError::Unsupported {
        node: node.to_string(),
        reason: "the quantized activations' workspace is too large to address".into(),
    };
    let values = p
        .batch
        .checked_mul(p.m)
        .and_then(|x| x.checked_mul(p.k))
        .ok_or_else(too_large)?;
    let ds_at = values / 4;
    let floats = ds_at.checked_add(values / 16).ok_or_else(too_large)?;
    int_index(node, "the quantized activations' workspace", floats)?;
    let ws = plan.add_typed_workspace(
        &format!("{node}:activations"),
        TensorType::new(DType::F32, vec![floats]),
    );
    // One run of 8 values a thread, as many blocks as that takes: the kernel is on the critical
    // path, so its values are spread wide rather than loaded several a thread (and 4 runs in
    // flight, 32 floats, spilled inside the persistent kernel's 64-register bound on sm_90a).
    // As many threads a block as the GEMV's at most (a persistent plan's blocks are as wide as
    // its widest step), fewer where A is short.
    let wave = target.wave_size as usize;
    let runs = p.m * p.k / 8;
    let act_threads = runs.next_multiple_of(wave).clamp(wave, threads);
    let act_blocks = runs.div_ceil(act_threads);
    let act_launch = checked_launch(node, target, [act_blocks, p.batch, 1], act_threads)?;
    // A, then the prologue's weight and bias (after the extras in the node's operands).
    let extras = p.extras.len();
    let last = args.len() - 1;
    let mut act_args = vec![args[0]];
    act_args.extend_from_slice(&args[2 + extras..last]);
    act_args.push(ws);
    let act = ActContext {
        p,
        scheme: scheme.name(),
        threads: act_threads,
        runs_in_flight: 1,
        ds_at,
    };
    plan.kernels.push(finish(
        "gemm_quant_act",
        "gemm_quant_act.hip",
        act,
        act_launch,
        act_args,
        node,
    )?);
    // The GEMV: the workspace in A's place, no prologue (applied above).
    let dot_p = Problem {
        prologue: None,
        ..p.clone()
    };
    let mut dot_args = vec![ws];
    dot_args.extend_from_slice(&args[1..2 + extras]);
    dot_args.push(args[last]);
    let ctx = ctx(&dot_p, &c, scheme, shape, (true, ds_at));
    finish(
        "gemm_quant",
        "gemm_quant_dot.hip",
        ctx,
        launch,
        dot_args,
        node,
    )
    .map(Some)
}
