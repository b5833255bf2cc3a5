//! The warpgroup GEMM (sm_90a): f16 or bf16 A and B, f32 accumulation by
//! `wgmma.mma_async` from shared memory. A block computes a `BM × BN` output tile; each of its
//! `BM / 64` warpgroups owns 64 rows and issues `m64n{BN}k16` for each 16-wide K step of a
//! stage. Stages of A and B (64 wide along K: one 128-byte line per row) arrive by 16-byte
//! `cp.async` into a ring of [`STAGES`] buffers in dynamic shared memory, `STAGES - 2` ahead
//! of use while one step's wgmma group stays in flight during the next, stored in the
//! 128-byte-swizzled K-major layout of the atom's rows (`arch::mma::wgmma`), whose descriptors
//! the kernel hands the tensor cores; the accumulators' places come from the atom's C layout,
//! and the epilogue (bias, activation, residual: the family's `Problem`) runs on them in
//! registers.
//!
//! Two kernels. Where the target has TMA and both operands are boxes a tensor map can describe
//! ([`operand_map`]), [`tma_kernel`]: warp-specialised, a producer warpgroup whose one thread
//! issues `cp.async.bulk.tensor` copies into an mbarrier ring, consumer warpgroups that wait
//! on the ring and hand each stage back (`gemm_wgmma_tma.hip`); the tensor maps are plan
//! buffers (`BufferRole::TensorMap`) that each session encodes. Otherwise [`kernel`]: every
//! thread both copies (16-byte `cp.async`) and multiplies, stages handed over at block
//! barriers, as in `mma.rs`. Neither schedules tiles persistently yet (see docs/decisions.md).

use serde::Serialize;

use super::super::super::limits::launch as checked_launch;
use super::super::super::plan::{BufferId, Kernel, KernelPlan};
use super::super::super::CodegenError;
use super::mma::{access, atom_for, pairs_in, BForm};
use super::Problem;
use crate::arch::mma::wgmma::{WgmmaAtom, WARPGROUP};
use crate::arch::tma::{TensorMapSpec, STRIDE_ALIGN};
use crate::arch::{AsyncCopy, Target};
use crate::codegen::kernel::finish;
use crate::codegen::{F32Matmul, TmaWidth};
use crate::ir::gemm::{Axis, Operand};
use crate::ir::{DType, Gemm};

/// Rows of the block tile: two consumer warpgroups of 64 rows.
const BM: usize = 128;
/// Columns of the block tile: the N of every wgmma (64 accumulator floats per thread).
const BN: usize = 128;
/// Stages in the shared-memory ring: three tiles in flight, one being multiplied and one still
/// read by the wgmma group left in flight from the step before (160 KiB of the 227).
pub(crate) const STAGES: usize = 5;
/// Smallest M and N the kernel is chosen for: below a full tile the mma.sync kernel's smaller
/// tiles waste less.
pub(crate) const MIN_MN: usize = 128;

#[derive(Serialize)]
struct Context<'a> {
    p: &'a Problem,
    atom_name: &'static str,
    bm: usize,
    bn: usize,
    bk: usize,
    stages: usize,
    threads: usize,
    warpgroups: usize,
    /// Bytes of one stage's A and B tiles.
    a_bytes: usize,
    b_bytes: usize,
    /// 16-byte chunks of A and B per thread and stage.
    a_iters: usize,
    b_iters: usize,
    /// The wgmma instruction and its accumulator floats per thread.
    instruction: String,
    acc_n: u32,
    /// Where the atom's C layout puts accumulator `e` of thread `lane` of a warpgroup.
    c_row: String,
    c_col: String,
    /// The swizzled byte offset of (`r`, `k`) in a tile, and the descriptor of an address `a`.
    smem_at: String,
    desc: String,
}

/// The atom for a problem on a target, if the target has warpgroup MMA for its input type.
fn wgmma_atom(p: &Problem, target: &Target) -> Option<&'static WgmmaAtom> {
    target
        .caps
        .wgmma
        .iter()
        .copied()
        .find(|a| a.input == p.input)
}

/// The kernel where the target has wgmma for the operands, both are read in 16-byte pieces
/// along K (A row-major, B with K contiguous per column) and M and N fill a tile; `None`
/// otherwise (the mma.sync kernel takes it).
pub(crate) fn kernel(
    p: &Problem,
    g: &Gemm,
    node: &str,
    args: Vec<BufferId>,
    target: &Target,
) -> Result<Option<Kernel>, CodegenError> {
    let Some(atom) = wgmma_atom(p, target) else {
        return Ok(None);
    };
    // The access analysis of the mma.sync kernel decides the same question: may A and B be
    // read in 16-byte pieces along K. It needs a fragment atom of the input type, which every
    // wgmma row also has.
    let Some(frag) = atom_for(p, target.caps, F32Matmul::Exact) else {
        return Ok(None);
    };
    let acc = access(g, frag, target.caps);
    if !(acc.a_vec && acc.b_vec && acc.b_form == BForm::Nk) || p.m < MIN_MN || p.n < MIN_MN {
        return Ok(None);
    }
    let c = atom.c(BN as u32).expect("BN is a modelled N");
    let smem = atom.smem;
    let bk = smem.k_tile() as usize;
    let warpgroups = BM / atom.m as usize;
    let threads = warpgroups * WARPGROUP as usize;
    let (a_bytes, b_bytes) = (BM * bk * 2, BN * bk * 2);
    let mut launch = checked_launch(
        node,
        target,
        [p.n.div_ceil(BN), p.m.div_ceil(BM), p.batch],
        threads,
    )?;
    // The ring, plus the slack that lets the kernel align its base to the swizzle atom.
    let shared = STAGES * (a_bytes + b_bytes) + smem.swizzle.atom_bytes() as usize;
    if shared > target.caps.shared_bytes_per_block as usize {
        return Ok(None);
    }
    launch.shared_bytes = shared as u32;
    let chunk = 16;
    let ctx = Context {
        p,
        atom_name: atom.name,
        bm: BM,
        bn: BN,
        bk,
        stages: STAGES,
        threads,
        warpgroups,
        a_bytes,
        b_bytes,
        a_iters: a_bytes / chunk / threads,
        b_iters: b_bytes / chunk / threads,
        instruction: atom.instruction(BN as u32),
        acc_n: c.elems(),
        c_row: c.row().c(),
        c_col: c.col().c(),
        smem_at: smem.offset_c("r", "k"),
        desc: smem.descriptor_c("a"),
    };
    finish("gemm_wgmma", "gemm_wgmma.hip", ctx, launch, args, node).map(Some)
}

/// Consumer warpgroups of the TMA kernel (64 rows of the tile each).
const TMA_CONSUMERS: usize = 2;
/// Tile widths the TMA kernel chooses among (the widest first: fewer tiles, less per-tile cost).
const TMA_BNS: [usize; 3] = [256, 128, 64];
/// Streaming multiprocessors the tile choice plans waves for: the H100 SXM's and the H200's
/// 132. Only the choice of width depends on it, never correctness.
const WAVE_SMS: usize = 132;
/// Shared memory the TMA ring may take (of the 227 KiB a block may opt into).
const TMA_RING_BYTES: usize = 192 * 1024;
/// Registers after `setmaxnreg`: the producer gives its back, the consumers take them
/// (128 × 40 + 256 × 232 = 64 512 of the SM's 65 536, one block an SM).
const PRODUCER_REGS: u32 = 40;
const CONSUMER_REGS: u32 = 232;

#[derive(Serialize)]
struct TmaContext<'a> {
    p: &'a Problem,
    atom_name: &'static str,
    bm: usize,
    bn: usize,
    bk: usize,
    stages: usize,
    threads: usize,
    consumers: usize,
    a_bytes: usize,
    b_bytes: usize,
    /// Dimensions of A's and B's maps (2, or 3 with a batch).
    a_rank: usize,
    b_rank: usize,
    instruction: String,
    acc_n: u32,
    c_row: String,
    c_col: String,
    desc: String,
    producer_regs: u32,
    consumer_regs: u32,
    /// Tiles along M and N, all tiles (batch included), and the persistent grid that takes them.
    tiles_m: usize,
    tiles_n: usize,
    tiles: usize,
    grid: usize,
    /// Accumulators 2h and 2h + 1 stored as one pair.
    c_pairs: bool,
}

/// Sub-axes (outer first) as one axis of `(size, stride)` where they are one: size-1 sub-axes
/// dropped, each remaining outer stride the inner one's size times its stride. `(1, 0)` for
/// none.
fn merged(axes: &[Axis]) -> Option<(u64, u64)> {
    let mut live = axes.iter().filter(|a| a.size != 1).rev();
    let Some(first) = live.next() else {
        return Some((1, 0));
    };
    let (mut size, stride) = (first.size, first.stride);
    for a in live {
        if a.stride != size.checked_mul(stride)? {
            return None;
        }
        size = size.checked_mul(a.size)?;
    }
    Some((size as u64, stride as u64))
}

/// The tensor map that reads `operand` of `g` (A, or B stored `[N, K]`) in boxes of 64 along K
/// by `rows` along M or N, and its rank; `None` where the view is not such a box: K not
/// contiguous, rows or batch sub-axes that do not merge into one axis each, strides not
/// multiples of 16 bytes, or a batch broadcast over some of its sub-axes but not all.
pub(crate) fn operand_map(
    g: &Gemm,
    operand: Operand,
    dtype: DType,
    rows: usize,
    bk: usize,
) -> Option<TensorMapSpec> {
    let view = match operand {
        Operand::A => &g.a,
        Operand::B => &g.b,
        Operand::Out => return None,
    };
    let all = view.axes(&g.dims, operand);
    let [nb, nr, _] = g.dims.of(operand).map(|d| d.len());
    let (batch, rest) = all.split_at(nb);
    let (row_axes, k_axes) = rest.split_at(nr);
    // For B the rows of the view are K and its columns N; the map's rows are N.
    let (k_axes, row_axes) = match operand {
        Operand::A => (k_axes, row_axes),
        _ => (row_axes, k_axes),
    };
    let (k, k_stride) = merged(k_axes)?;
    let (r, r_stride) = merged(row_axes)?;
    if k_stride != 1 {
        return None;
    }
    let esize = dtype.size_bytes() as u64;
    let mut dims = vec![k, r];
    let mut strides = vec![r_stride.checked_mul(esize)?];
    let mut boxes = vec![bk as u32, rows as u32];
    if batch.iter().any(|a| a.size != 1 && a.stride != 0) {
        let (b, b_stride) = merged(batch)?;
        dims.push(b);
        strides.push(b_stride.checked_mul(esize)?);
        boxes.push(1);
    }
    if strides.iter().any(|s| !s.is_multiple_of(STRIDE_ALIGN)) {
        return None;
    }
    TensorMapSpec::new(
        dtype,
        dims,
        strides,
        boxes,
        crate::arch::mma::wgmma::Swizzle::B128,
    )
    .ok()
}

/// The tile width with the least modelled time, the widest among equals: waves of tiles (one
/// block an SM) times a tile's time, taken as its width plus a fixed part worth 64 columns
/// (A's box, the ring's fill, the epilogue). A model to be replaced by measured defaults
/// (`TmaWidth::Fixed` measures each width).
pub(crate) fn tma_width(m: usize, n: usize) -> usize {
    let cost = |bn: usize| {
        let tiles = m.div_ceil(128).saturating_mul(n.div_ceil(bn));
        tiles.div_ceil(WAVE_SMS).saturating_mul(bn + 64)
    };
    let mut best = TMA_BNS[0];
    for &bn in &TMA_BNS[1..] {
        if cost(bn) < cost(best) {
            best = bn;
        }
    }
    best
}

/// The warp-specialised TMA kernel, with its two tensor maps added to `plan`, where the target
/// has TMA and wgmma for the operands, A and B are boxes a map describes and M and N fill a
/// tile; `None` otherwise.
pub(crate) fn tma_kernel(
    p: &Problem,
    g: &Gemm,
    node: &str,
    mut args: Vec<BufferId>,
    target: &Target,
    plan: &mut KernelPlan,
    width: TmaWidth,
) -> Result<Option<Kernel>, CodegenError> {
    let Some(atom) = wgmma_atom(p, target) else {
        return Ok(None);
    };
    if target.caps.async_copy != AsyncCopy::Tma
        || !target.caps.setmaxnreg
        || p.m < MIN_MN
        || p.n < MIN_MN
    {
        return Ok(None);
    }
    let smem = atom.smem;
    let bk = smem.k_tile() as usize;
    let bm = TMA_CONSUMERS * atom.m as usize;
    let bn = match width {
        TmaWidth::Fixed(bn) if TMA_BNS.contains(&bn) => bn,
        TmaWidth::Fixed(bn) => {
            return Err(CodegenError::Unsupported {
                node: node.to_string(),
                reason: format!("a TMA GEMM tile width of {bn} (one of {TMA_BNS:?})"),
            })
        }
        TmaWidth::Auto | TmaWidth::Off => tma_width(p.m, p.n),
    };
    let (Some(map_a), Some(map_b)) = (
        operand_map(g, Operand::A, p.input, bm, bk),
        operand_map(g, Operand::B, p.input, bn, bk),
    ) else {
        return Ok(None);
    };
    let Some(c) = atom.c(bn as u32) else {
        return Ok(None);
    };
    let (a_bytes, b_bytes) = (bm * bk * 2, bn * bk * 2);
    debug_assert_eq!(
        map_a.box_bytes() + map_b.box_bytes(),
        (a_bytes + b_bytes) as u64
    );
    let stage_bytes = a_bytes + b_bytes;
    let stages = (TMA_RING_BYTES / stage_bytes).min(p.k.div_ceil(bk)).max(2);
    let threads = (TMA_CONSUMERS + 1) * WARPGROUP as usize;
    let (tiles_m, tiles_n) = (p.m.div_ceil(bm), p.n.div_ceil(bn));
    // Tile indices are 32-bit in the kernel.
    let Some(tiles) = tiles_m
        .checked_mul(tiles_n)
        .and_then(|t| t.checked_mul(p.batch))
        .filter(|&t| i32::try_from(t).is_ok())
    else {
        return Ok(None);
    };
    // One block an SM (the ring takes most of its shared memory), each taking tiles `grid`
    // apart; on a GPU with fewer SMs the blocks past them wait for a free SM, which costs
    // time, not correctness.
    let grid = tiles.min(WAVE_SMS);
    let mut launch = checked_launch(node, target, [grid, 1, 1], threads)?;
    // The ring, the full and empty barriers (8 bytes each), and the alignment slack.
    let shared = stages * stage_bytes + 16 * stages + smem.swizzle.atom_bytes() as usize;
    if shared > target.caps.shared_bytes_per_block as usize {
        return Ok(None);
    }
    launch.shared_bytes = shared as u32;
    let ctx = TmaContext {
        p,
        atom_name: atom.name,
        bm,
        bn,
        bk,
        stages,
        threads,
        consumers: TMA_CONSUMERS,
        a_bytes,
        b_bytes,
        a_rank: map_a.dims.len(),
        b_rank: map_b.dims.len(),
        instruction: atom.instruction(bn as u32),
        acc_n: c.elems(),
        c_row: c.row().c(),
        c_col: c.col().c(),
        desc: smem.descriptor_c("a"),
        producer_regs: PRODUCER_REGS,
        consumer_regs: CONSUMER_REGS,
        tiles_m,
        tiles_n,
        tiles,
        grid,
        c_pairs: pairs_in(g, p, c.elem_bits.first()),
    };
    let (a, b) = (args[0], args[1]);
    args.push(plan.add_tensor_map(node, a, map_a));
    args.push(plan.add_tensor_map(node, b, map_b));
    finish(
        "gemm_wgmma_tma",
        "gemm_wgmma_tma.hip",
        ctx,
        launch,
        args,
        node,
    )
    .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each thread's chunks cover a stage exactly, and the ring fits the sm_90a row.
    /// The widths the model gives the shapes the bench measures.
    #[test]
    fn tile_widths_by_waves() {
        for (m, n, want) in [
            (4096, 384, 128),
            (4096, 576, 256),
            (4096, 1536, 128),
            (4096, 4096, 256),
            (4096, 49152, 256),
            (1000, 1000, 64),
            (128, 128, 64),
        ] {
            assert_eq!(tma_width(m, n), want, "{m} x {n}");
        }
    }

    /// Sub-axes merge into one axis only where they are contiguous with each other.
    #[test]
    fn sub_axes_merge_where_contiguous() {
        let ax = |size, stride| Axis { size, stride };
        assert_eq!(merged(&[]), Some((1, 0)));
        assert_eq!(merged(&[ax(4, 100), ax(25, 4)]), Some((100, 4)));
        assert_eq!(merged(&[ax(1, 7), ax(25, 4), ax(1, 0)]), Some((25, 4)));
        assert_eq!(merged(&[ax(4, 3200), ax(32, 1)]), None);
    }

    #[test]
    fn tiles_divide_among_threads_and_fit() {
        let t = Target::parse("sm_90a").unwrap();
        let atom = t.caps.wgmma[0];
        let bk = atom.smem.k_tile() as usize;
        let threads = BM / atom.m as usize * WARPGROUP as usize;
        assert_eq!((BM * bk * 2 / 16) % threads, 0);
        assert_eq!((BN * bk * 2 / 16) % threads, 0);
        let shared = STAGES * (BM + BN) * bk * 2 + 1024;
        assert!(shared <= t.caps.shared_bytes_per_block as usize);
        assert!(
            shared > t.caps.static_shared_bytes as usize,
            "needs the opt-in"
        );
    }
}
