//! The matrix-core GEMM: f16 or bf16 A and B, f32 accumulation, on any matrix atom of the
//! target (`codegen/mma`); f32 A and B on the target's TF32 atom where the caller opts in
//! (`CodegenOptions::f32_matmul`): staged as f32 (tiles of 16-byte rows twice as many bytes
//! per element, so half the K per step), rounded to TF32 as fragments load. A block computes a `bm × bn` output tile in steps of `bk` along K,
//! staged through shared memory; each warp owns a `bm / warps_m × bn / warps_n` sub-tile of atom
//! tiles and indexes its fragments only through the atom's helpers.
//!
//! What differs per target comes from its table and its atom, not from the vendor:
//! - staging: where the row has `cp.async`, a `stages`-deep pipeline of 16-byte asynchronous
//!   copies; elsewhere two shared-memory buffers, the next tile loaded into registers while
//!   the current one is computed;
//! - fragment loads: by `ldmatrix` where the atom's helpers have it (A and B pairs), from
//!   tiles whose 16-byte chunks are XOR-swizzled by row; otherwise by the atom's element
//!   loads, from tiles whose rows are padded by 16 bytes. Both keep the rows a fragment load
//!   reads on distinct banks.
//!
//! Views are read in place: in 16-byte pieces where the operand's contiguous sub-axis allows
//! ([`vectorizable`]), element by element (with bounds) otherwise.

use serde::Serialize;

use super::super::super::limits::launch as checked_launch;
use super::super::super::mma::{ldmatrix_a, ldmatrix_pairs, Bit, MmaAtom};
use super::super::super::plan::{BufferId, Kernel, Launch};
use super::super::super::CodegenError;
use super::super::tile::TileLayout;
use super::Problem;
use crate::arch::mma::Precision;
use crate::arch::tuning::{Family, TuneKey, TuneProblem, Tuned};
use crate::arch::Arch;
use crate::arch::Target;
use crate::codegen::kernel::finish;
use crate::codegen::F32Matmul;
use crate::ir::gemm::{Axis, Operand};
use crate::ir::Gemm;

/// Bytes of a tile row along K per block step: four 16-byte chunks, so K = 32 for 16-bit
/// operands and 16 for f32 (both multiples of every atom's K).
const ROW_BYTES: usize = 64;
/// Bytes of one global load / cp.async piece.
const PIECE_BYTES: usize = 16;
/// The most accumulator floats a lane may hold: beyond it the fragments and addresses of a
/// step no longer fit the register file without spilling.
const MAX_ACC_PER_LANE: u32 = 64;
/// Deepest cp.async pipeline tried: past four stages the latency is hidden on every target
/// and the shared memory is better spent on a larger tile.
const MAX_STAGES: usize = 4;
/// Blocks below which a smaller tile is preferred: about one block per SM or CU of the large
/// GPUs (H100 SXM 132 SMs, MI250X 110 CUs per die). The target rows describe processors, not
/// products (an sm_90 has 114 or 132 SMs), so the count is not read from them.
const MIN_BLOCKS: usize = 128;

/// One tiling of the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Config {
    pub bm: usize,
    pub bn: usize,
    pub bk: usize,
    pub warps_m: usize,
    pub warps_n: usize,
    /// Shared-memory buffers of A and B tiles (2 without cp.async: one computed, one filled).
    pub stages: usize,
}

/// How B sits in shared memory (and, when vectorized, how it is read from global memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum BForm {
    /// Row n holds K contiguous (`B[k][n] = t[n*ld + k]`).
    Nk,
    /// Row k holds N contiguous (`B[k][n] = t[k*ld + n]`).
    Kn,
}

/// The memory access choices of one problem on one target (independent of the tiling).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Access {
    pub a_vec: bool,
    pub b_vec: bool,
    pub b_form: BForm,
    /// Tiles filled by cp.async (else through registers).
    pub cp_async: bool,
    /// Fragments loaded by ldmatrix from swizzled tiles (else the atom's element loads from
    /// padded tiles).
    pub ldmatrix: bool,
    /// Bytes of an A or B element: 2 (f16, bf16) or 4 (f32 on a TF32 atom).
    pub elem_bytes: usize,
}

impl Access {
    /// Elements of a 16-byte piece.
    pub(crate) fn chunk(&self) -> usize {
        PIECE_BYTES / self.elem_bytes
    }

    /// K per block step.
    pub(crate) fn bk(&self) -> usize {
        ROW_BYTES / self.elem_bytes
    }
}

/// Whether a view of `elem_bytes` elements reads in 16-byte pieces along sub-axis `inner`:
/// stride 1 and a size divisible by a piece's `16 / elem_bytes` elements there, and every other
/// stride divisible by it (size-1 sub-axes never move). Then that many indices along `inner`
/// from a multiple of it are consecutive elements at a 16-byte aligned address (buffers are
/// allocated aligned).
pub(crate) fn vectorizable(axes: &[Axis], inner: Option<usize>, elem_bytes: usize) -> bool {
    in_pieces(axes, inner, PIECE_BYTES / elem_bytes)
}

/// Whether `width` indices along sub-axis `inner`, from a multiple of `width`, are `width`
/// consecutive elements at an offset that is a multiple of `width`.
fn in_pieces(axes: &[Axis], inner: Option<usize>, width: usize) -> bool {
    let Some(inner) = inner else { return false };
    let a = axes[inner];
    a.stride == 1
        && a.size.is_multiple_of(width)
        && axes
            .iter()
            .enumerate()
            .all(|(i, x)| i == inner || x.size == 1 || x.stride.is_multiple_of(width))
}

/// Whether the epilogue stores accumulator elements 2h and 2h + 1 together: the atom puts
/// adjacent columns there (element bit 0 is column bit 0), the result is a 16- or 32-bit float,
/// and the out view holds column pairs adjacent and pair-aligned.
pub(crate) fn stores_pairs(g: &Gemm, atom: &MmaAtom, p: &Problem) -> bool {
    pairs_in(g, p, atom.c.elem_bits.first())
}

/// [`stores_pairs`] for any accumulator layout whose element bit 0 is `first`.
pub(crate) fn pairs_in(g: &Gemm, p: &Problem, first: Option<&Bit>) -> bool {
    let out = g.out.axes(&g.dims, Operand::Out);
    let n_inner = (!g.dims.n.is_empty()).then(|| out.len() - 1);
    first == Some(&Bit::Col(0))
        && matches!(p.c_t, "float" | "rf_half" | "rf_bf16")
        && in_pieces(&out, n_inner, 2)
}

/// The innermost sub-axis of K in A's and B's axis lists, and of N in B's.
fn inner_axes(g: &Gemm) -> (Option<usize>, Option<usize>, Option<usize>) {
    let (nb, nk, nn) = (g.dims.batch.len(), g.dims.k.len(), g.dims.n.len());
    let a_k = (nk > 0).then(|| nb + g.dims.m.len() + nk - 1);
    let b_k = (nk > 0).then(|| nb + nk - 1);
    let b_n = (nn > 0).then(|| nb + nk + nn - 1);
    (a_k, b_k, b_n)
}

pub(crate) fn access(g: &Gemm, atom: &MmaAtom, caps: &Arch) -> Access {
    let a_axes = g.a.axes(&g.dims, Operand::A);
    let b_axes = g.b.axes(&g.dims, Operand::B);
    let (a_k, b_k, b_n) = inner_axes(g);
    let eb = atom.input.size_bytes();
    let a_vec = vectorizable(&a_axes, a_k, eb);
    let (b_vec, b_form) = if vectorizable(&b_axes, b_k, eb) {
        (true, BForm::Nk)
    } else if vectorizable(&b_axes, b_n, eb) {
        (true, BForm::Kn)
    } else {
        // Element loads: keep the tile's rows along whichever of K and N is denser in memory.
        let k_unit = b_k.is_some_and(|i| b_axes[i].stride == 1);
        (false, if k_unit { BForm::Nk } else { BForm::Kn })
    };
    Access {
        a_vec,
        b_vec,
        b_form,
        cp_async: caps.async_copy.has_cp_async(),
        ldmatrix: ldmatrix_a(atom).is_some() && ldmatrix_pairs(atom).is_some(),
        elem_bytes: eb,
    }
}

/// The atom for a problem on a target: the largest whose input type is the operands' and whose
/// precision the caller allows (a TF32 atom only where `f32_matmul` opts in).
pub(crate) fn atom_for(
    p: &Problem,
    caps: &Arch,
    f32_matmul: F32Matmul,
) -> Option<&'static MmaAtom> {
    caps.mma
        .iter()
        .copied()
        .filter(|a| a.input == p.input && f32_matmul.admits(a))
        .max_by_key(|a| a.m * a.n * a.k)
}

fn tiles(c: &Config, acc: &Access) -> (TileLayout, TileLayout) {
    let tile = |rows, cols, k_rows| {
        if acc.elem_bytes == 4 {
            TileLayout::padded_f32(rows, cols, k_rows)
        } else {
            TileLayout::new(rows, cols, acc.ldmatrix)
        }
    };
    let a = tile(c.bm, c.bk, false);
    let b = match acc.b_form {
        BForm::Nk => tile(c.bn, c.bk, false),
        BForm::Kn => tile(c.bk, c.bn, true),
    };
    (a, b)
}

/// Bytes of shared memory a configuration declares (f32 tiles take four bytes an element).
pub(crate) fn shared_bytes(c: &Config, acc: &Access) -> usize {
    let (a, b) = tiles(c, acc);
    c.stages * (a.elems() + b.elems()) * acc.elem_bytes
}

/// Every configuration that fits the atom, the target's shared memory and the register
/// budget, largest tile first (fewer warps first among equal tiles).
pub(crate) fn candidates(atom: &MmaAtom, acc: &Access, caps: &Arch) -> Vec<Config> {
    let (am, an) = (atom.m as usize, atom.n as usize);
    let budget = caps.static_shared_bytes as usize;
    // B fragments by ldmatrix come in pairs of atom columns.
    let n_step = if acc.ldmatrix { 2 * an } else { an };
    let mut out = Vec::new();
    for (bm, bn) in [(128, 128), (128, 64), (64, 128), (64, 64)] {
        for (warps_m, warps_n) in [(2, 2), (2, 4), (4, 2)] {
            let (wm, wn) = (bm / warps_m, bn / warps_n);
            let threads = warps_m * warps_n * atom.lanes as usize;
            let frags = (wm / am) * (wn / an);
            // Every thread copies the same number of 16-byte chunks of each tile.
            let (bk, ce) = (acc.bk(), acc.chunk());
            let (a_chunks, b_chunks) = (bm * bk / ce, bk * bn / ce);
            if wm % am != 0
                || a_chunks % threads != 0
                || b_chunks % threads != 0
                || wn % n_step != 0
                || threads > 1024
                || frags as u32 * atom.c.elems() > MAX_ACC_PER_LANE
            {
                continue;
            }
            let mut c = Config {
                bm,
                bn,
                bk,
                warps_m,
                warps_n,
                stages: 2,
            };
            if acc.cp_async {
                let per_stage = shared_bytes(&Config { stages: 1, ..c }, acc);
                c.stages = (budget / per_stage).min(MAX_STAGES);
            }
            if c.stages >= 2 && shared_bytes(&c, acc) <= budget {
                out.push(c);
            }
        }
    }
    out.sort_by_key(|c| (std::cmp::Reverse(c.bm * c.bn), c.warps_m * c.warps_n));
    out
}

fn blocks(c: &Config, p: &Problem) -> usize {
    p.m.div_ceil(c.bm)
        .saturating_mul(p.n.div_ceil(c.bn))
        .saturating_mul(p.batch)
}

/// The largest tile that still gives [`MIN_BLOCKS`] blocks; when none does, the one that gives
/// the most (a small problem is spread as widely as the tiles allow); among those the smallest
/// tile (the least work past the edges), then the most warps (few blocks: each should hide its
/// own latency).
pub(crate) fn choose(cands: &[Config], p: &Problem) -> Option<Config> {
    cands
        .iter()
        .find(|c| blocks(c, p) >= MIN_BLOCKS)
        .or_else(|| {
            cands.iter().max_by_key(|c| {
                (
                    blocks(c, p),
                    std::cmp::Reverse(c.bm * c.bn),
                    c.warps_m * c.warps_n,
                )
            })
        })
        .copied()
}

/// The launch geometry of a configuration: the single source of it. Grid x runs over N tiles,
/// y over M tiles, z over the batch.
pub(crate) fn launch(
    c: &Config,
    atom: &MmaAtom,
    p: &Problem,
    node: &str,
    target: &Target,
) -> Result<Launch, CodegenError> {
    let threads = c.warps_m * c.warps_n * atom.lanes as usize;
    checked_launch(
        node,
        target,
        [p.n.div_ceil(c.bn), p.m.div_ceil(c.bm), p.batch],
        threads,
    )
}

#[derive(Serialize)]
struct Context<'a> {
    p: &'a Problem,
    /// The atom's helper prefix (`rf_m16n8k16_f16`).
    atom: String,
    atom_name: &'static str,
    c: Config,
    threads: usize,
    /// The warp tile and its atom tiles.
    wm: usize,
    wn: usize,
    fm: usize,
    fn_: usize,
    a_vec: bool,
    b_vec: bool,
    b_form: BForm,
    cp_async: bool,
    ldmatrix: bool,
    /// The epilogue stores column pairs ([`stores_pairs`]).
    c_pairs: bool,
    ta: TileLayout,
    tb: TileLayout,
    /// 16-byte chunks of a tile per thread.
    a_iters: usize,
    b_iters: usize,
    /// Elements of a 16-byte chunk (8 halves or 4 floats), the shared tiles' element type,
    /// and an operand element's zero.
    ce: usize,
    smem_t: &'static str,
    zero: &'static str,
    /// The operands are f32 multiplied at TF32 precision.
    tf32: bool,
}

/// The kernel for a problem whose operands the target's atom takes, or `None` where the target
/// has no such atom or no configuration fits.
pub(crate) fn kernel(
    p: &Problem,
    g: &Gemm,
    node: &str,
    args: Vec<BufferId>,
    target: &Target,
    tuned: &Tuned,
    f32_matmul: F32Matmul,
) -> Result<Option<Kernel>, CodegenError> {
    let Some(atom) = atom_for(p, target.caps, f32_matmul) else {
        return Ok(None);
    };
    let acc = access(g, atom, target.caps);
    let cands = candidates(atom, &acc, target.caps);
    let (Some(c), site) = tuned.pick(tune_key(p, &acc), &cands, choose(&cands, p)) else {
        return Ok(None);
    };
    let launch = launch(&c, atom, p, node, target)?;
    let threads = launch.block[0] as usize;
    let (ta, tb) = tiles(&c, &acc);
    let (wm, wn) = (c.bm / c.warps_m, c.bn / c.warps_n);
    let ce = acc.chunk();
    let (a_chunks, b_chunks) = (c.bm * c.bk / ce, c.bk * c.bn / ce);
    let f32_operands = acc.elem_bytes == 4;
    let ctx = Context {
        p,
        atom: atom.prefix(),
        atom_name: atom.name,
        c,
        threads,
        wm,
        wn,
        fm: wm / atom.m as usize,
        fn_: wn / atom.n as usize,
        a_vec: acc.a_vec,
        b_vec: acc.b_vec,
        b_form: acc.b_form,
        cp_async: acc.cp_async,
        ldmatrix: acc.ldmatrix,
        c_pairs: stores_pairs(g, atom, p),
        ta,
        tb,
        a_iters: a_chunks / threads,
        b_iters: b_chunks / threads,
        ce,
        smem_t: super::super::super::mma::stored_element(atom),
        zero: if f32_operands {
            "0.0f"
        } else {
            "(unsigned short)0"
        },
        tf32: atom.precision == Precision::Tf32,
    };
    let mut k = finish("gemm_mma", "gemm_mma.hip", ctx, launch, args, node)?;
    k.tune = site;
    Ok(Some(k))
}

/// What the tiling's speed depends on: sizes, dtype, how the operands are read, the epilogue.
fn tune_key(p: &Problem, acc: &Access) -> TuneKey {
    TuneKey {
        family: Family::GemmMma,
        problem: TuneProblem::Gemm {
            dtype: p.input,
            batch: p.batch,
            m: p.m,
            n: p.n,
            k: p.k,
            a_vec: acc.a_vec,
            b_vec: acc.b_vec,
            b_nk: acc.b_form == BForm::Nk,
            epilogue: p.epilogue,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::tile::CHUNK;
    use super::*;
    use crate::arch::arch;
    use crate::ir::{GemmDims, View};

    fn ax(v: &[(usize, usize)]) -> Vec<Axis> {
        v.iter()
            .map(|&(size, stride)| Axis { size, stride })
            .collect()
    }

    #[test]
    fn vector_reads_need_a_unit_stride_multiple_of_8_and_aligned_other_strides() {
        // [M=5, K=16] row-major: K is contiguous, the row stride 16.
        assert!(vectorizable(&ax(&[(5, 16), (16, 1)]), Some(1), 2));
        // K = 36: a piece would cross a row.
        assert!(!vectorizable(&ax(&[(5, 36), (36, 1)]), Some(1), 2));
        // K = 16 inside rows of 20: rows start off 16-byte alignment.
        assert!(!vectorizable(&ax(&[(5, 20), (16, 1)]), Some(1), 2));
        // A size-1 axis never moves, whatever its stride.
        assert!(vectorizable(&ax(&[(1, 3), (5, 16), (16, 1)]), Some(2), 2));
        // Broadcast (stride 0) is aligned.
        assert!(vectorizable(&ax(&[(4, 0), (16, 1)]), Some(1), 2));
        // The inner axis is strided.
        assert!(!vectorizable(&ax(&[(16, 1), (8, 16)]), Some(1), 2));
        assert!(!vectorizable(&ax(&[(16, 1)]), None, 2));
        // f32: pieces of 4. K = 36 is whole pieces of floats, rows of 20 floats are aligned.
        assert!(vectorizable(&ax(&[(5, 36), (36, 1)]), Some(1), 4));
        assert!(vectorizable(&ax(&[(5, 20), (16, 1)]), Some(1), 4));
        assert!(!vectorizable(&ax(&[(5, 18), (18, 1)]), Some(1), 4));
    }

    /// B `[K, N]` as stored.
    fn kn(n: usize) -> View {
        View {
            batch: vec![],
            rows: vec![n],
            cols: vec![1],
        }
    }

    fn gemm(m: usize, n: usize, k: usize, b: View) -> Gemm {
        let dims = GemmDims {
            batch: vec![],
            m: vec![m],
            n: vec![n],
            k: vec![k],
        };
        Gemm {
            a: View::contiguous(&dims, Operand::A),
            out: View::contiguous(&dims, Operand::Out),
            b,
            dims,
            extras: vec![],
            epilogue: None,
            shape: crate::ir::Shape(vec![m, n]),
            prologue: None,
            paired: false,
        }
    }

    /// Every tile layout of every candidate holds each element once, keeps each 16-byte chunk
    /// whole and aligned, and (swizzled) puts the 8 rows of one ldmatrix phase on 8 distinct
    /// 16-byte bank groups.
    #[test]
    fn tile_layouts_are_bijective_chunked_and_conflict_free() {
        for name in ["sm_90", "gfx942", "gfx1100"] {
            let caps = arch(name).unwrap();
            let atom = caps.mma[0];
            for form in [BForm::Nk, BForm::Kn] {
                let acc = Access {
                    a_vec: true,
                    b_vec: true,
                    b_form: form,
                    cp_async: caps.async_copy.has_cp_async(),
                    ldmatrix: ldmatrix_a(atom).is_some(),
                    elem_bytes: 2,
                };
                for c in candidates(atom, &acc, caps) {
                    let (ta, tb) = tiles(&c, &acc);
                    for t in [ta, tb] {
                        let mut seen = vec![false; t.elems()];
                        for r in 0..t.rows {
                            for col in (0..t.cols).step_by(CHUNK) {
                                let at = t.index(r, col);
                                assert_eq!(at % CHUNK, 0, "{t:?}");
                                for h in 0..CHUNK {
                                    assert_eq!(t.index(r, col + h), at + h);
                                    assert!(!std::mem::replace(&mut seen[at + h], true));
                                }
                            }
                        }
                        if acc.ldmatrix {
                            for r0 in (0..t.rows).step_by(8) {
                                for col in (0..t.cols).step_by(CHUNK) {
                                    let mut groups: Vec<usize> =
                                        (r0..r0 + 8).map(|r| t.index(r, col) / 8 % 8).collect();
                                    groups.sort();
                                    groups.dedup();
                                    assert_eq!(groups.len(), 8, "{t:?} rows {r0}.. col {col}");
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// The kernel's fragment loads on a swizzled tile, emulated: `ldmatrix.x4` (PTX ISA: register
    /// j of thread T holds elements 2(T%4) + {0, 1} of row T/4 of matrix j, `.trans` the
    /// transposed pair) from the addresses the helpers give, through the tile's index, yields the
    /// documented A and B fragments of every atom tile of every warp.
    #[test]
    fn ldmatrix_on_swizzled_tiles_loads_the_documented_fragments() {
        let caps = arch("sm_90").unwrap();
        let atom = caps.mma[0];
        let la = ldmatrix_a(atom).unwrap();
        let lb = ldmatrix_pairs(atom).unwrap();
        for form in [BForm::Nk, BForm::Kn] {
            let acc = Access {
                a_vec: true,
                b_vec: true,
                b_form: form,
                cp_async: true,
                ldmatrix: true,
                elem_bytes: 2,
            };
            for c in candidates(atom, &acc, caps) {
                let (ta, tb) = tiles(&c, &acc);
                // Each element holds its own (row, col) of the tile.
                let fill = |t: &TileLayout| {
                    let mut mem = vec![(usize::MAX, usize::MAX); t.elems()];
                    for r in 0..t.rows {
                        for col in 0..t.cols {
                            mem[t.index(r, col)] = (r, col);
                        }
                    }
                    mem
                };
                let (ma, mb) = (fill(&ta), fill(&tb));
                let (wm, wn) = (c.bm / c.warps_m, c.bn / c.warps_n);
                let (am, an, ak) = (atom.m as usize, atom.n as usize, atom.k as usize);
                for (wm0, wn0) in [(0, 0), (c.bm - wm, c.bn - wn)] {
                    for kk in (0..c.bk).step_by(ak) {
                        for i in 0..wm / am {
                            let addr = |l: u32| {
                                ta.index(
                                    wm0 + i * am + la.row.eval(l, 0) as usize,
                                    kk + la.col.eval(l, 0) as usize,
                                )
                            };
                            for t in 0..32u32 {
                                for e in 0..8u32 {
                                    let (j, h) = (e / 2, e % 2);
                                    let got =
                                        ma[addr(8 * j + t / 4) + 2 * (t % 4) as usize + h as usize];
                                    let (r, k) = atom.a.coord(t, e);
                                    assert_eq!(got, (wm0 + i * am + r as usize, kk + k as usize));
                                }
                            }
                        }
                        for j in (0..wn / an).step_by(2) {
                            for t in 0..32u32 {
                                for f in 0..2u32 {
                                    for e in 0..4u32 {
                                        let (q, h) = (2 * f + e / 2, e % 2);
                                        let (k, n) = atom.b.coord(t, e);
                                        let (k, n) = (
                                            kk + k as usize,
                                            wn0 + (j + f as usize) * an + n as usize,
                                        );
                                        let got = match form {
                                            BForm::Nk => {
                                                let l = 8 * q + t / 4;
                                                let at = tb.index(
                                                    wn0 + j * an + lb.nk_row.eval(l, 0) as usize,
                                                    kk + lb.nk_col.eval(l, 0) as usize,
                                                );
                                                let (rn, ck) =
                                                    mb[at + 2 * (t % 4) as usize + h as usize];
                                                (ck, rn)
                                            }
                                            BForm::Kn => {
                                                let l = 8 * q + 2 * (t % 4) + h;
                                                let at = tb.index(
                                                    kk + lb.kn_row.eval(l, 0) as usize,
                                                    wn0 + j * an + lb.kn_col.eval(l, 0) as usize,
                                                );
                                                mb[at + (t / 4) as usize]
                                            }
                                        };
                                        assert_eq!(got, (k, n), "{c:?} {form:?} thread {t}");
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn column_pairs_are_stored_together_where_the_atom_and_the_out_view_allow() {
        let sm90 = arch("sm_90").unwrap().mma[0];
        let p = Problem::empty_for_tests();
        assert!(stores_pairs(&gemm(7, 48, 40, kn(48)), sm90, &p));
        // N odd: the rows start at odd offsets.
        assert!(!stores_pairs(&gemm(7, 45, 40, kn(45)), sm90, &p));
        // The out view transposed (column stride 7).
        let mut t = gemm(7, 48, 40, kn(48));
        t.out = View {
            batch: vec![],
            rows: vec![1],
            cols: vec![7],
        };
        assert!(!stores_pairs(&t, sm90, &p));
        // MFMA's accumulator elements run down a column.
        let mfma = arch("gfx942").unwrap().mma[0];
        assert!(!stores_pairs(&gemm(7, 48, 40, kn(48)), mfma, &p));
        // An integer result has no pair store.
        let int = Problem {
            c_t: "long long",
            ..Problem::empty_for_tests()
        };
        assert!(!stores_pairs(&gemm(7, 48, 40, kn(48)), sm90, &int));
    }

    #[test]
    fn b_is_staged_along_its_contiguous_axis() {
        let caps = arch("sm_90").unwrap();
        let atom = caps.mma[0];
        // B [K, N] as is: N contiguous.
        let a = access(&gemm(7, 48, 40, kn(48)), atom, caps);
        assert_eq!((a.a_vec, a.b_vec, a.b_form), (true, true, BForm::Kn));
        assert!(a.cp_async && a.ldmatrix);
        // B stored [N, K] (a weight read transposed): K contiguous.
        let nk = View {
            batch: vec![],
            rows: vec![1],
            cols: vec![40],
        };
        let a = access(&gemm(7, 48, 40, nk), atom, caps);
        assert_eq!((a.b_vec, a.b_form), (true, BForm::Nk));
        // K = 36: neither operand reads in pieces; B keeps K along its rows.
        let nk36 = View {
            batch: vec![],
            rows: vec![1],
            cols: vec![36],
        };
        let a = access(&gemm(7, 48, 36, nk36), atom, caps);
        assert_eq!((a.a_vec, a.b_vec, a.b_form), (false, false, BForm::Nk));
        // On AMD: registers and the atom's element loads.
        let caps = arch("gfx942").unwrap();
        let a = access(&gemm(7, 48, 40, kn(48)), caps.mma[0], caps);
        assert!(!a.cp_async && !a.ldmatrix);
    }

    #[test]
    fn candidates_fit_the_shared_memory_the_registers_and_the_atom() {
        for name in ["sm_80", "sm_90", "gfx90a", "gfx942", "gfx1100", "gfx1201"] {
            let caps = arch(name).unwrap();
            for atom in caps.mma {
                for form in [BForm::Nk, BForm::Kn] {
                    let acc = Access {
                        a_vec: true,
                        b_vec: true,
                        b_form: form,
                        cp_async: caps.async_copy.has_cp_async(),
                        ldmatrix: ldmatrix_a(atom).is_some(),
                        elem_bytes: atom.input.size_bytes(),
                    };
                    let cs = candidates(atom, &acc, caps);
                    assert!(!cs.is_empty(), "{name} {}", atom.name);
                    for c in &cs {
                        let (wm, wn) = (c.bm / c.warps_m, c.bn / c.warps_n);
                        assert_eq!(wm % atom.m as usize, 0);
                        assert_eq!(wn % atom.n as usize, 0);
                        assert_eq!(c.bk % atom.k as usize, 0);
                        assert!(shared_bytes(c, &acc) <= caps.static_shared_bytes as usize);
                        let frags = (wm / atom.m as usize) * (wn / atom.n as usize);
                        assert!(frags as u32 * atom.c.elems() <= MAX_ACC_PER_LANE);
                        assert!((2..=MAX_STAGES).contains(&c.stages));
                        if !acc.cp_async {
                            assert_eq!(c.stages, 2, "{name}: two buffers without cp.async");
                        }
                        let threads = c.warps_m * c.warps_n * atom.lanes as usize;
                        assert_eq!(c.bm * c.bk / acc.chunk() % threads, 0);
                        assert_eq!(c.bk * c.bn / acc.chunk() % threads, 0);
                        // A tile row is 64 bytes whatever the element.
                        assert_eq!(c.bk * atom.input.size_bytes(), ROW_BYTES);
                    }
                }
            }
        }
        // The H100: 128x128x32 in 8 warps, 3 stages of 16 KiB (48 KiB, swizzled, no padding).
        let caps = arch("sm_90").unwrap();
        let acc = access(&gemm(64, 64, 64, kn(64)), caps.mma[0], caps);
        let cs = candidates(caps.mma[0], &acc, caps);
        assert_eq!(
            cs[0],
            Config {
                bm: 128,
                bn: 128,
                bk: 32,
                warps_m: 2,
                warps_n: 4,
                stages: 3
            }
        );
        assert_eq!(shared_bytes(&cs[0], &acc), 48 * 1024);
        // TF32 on the H100: f32 tiles of 16 K (64-byte rows), so 128x128 still fits two stages.
        let tf32 = &crate::arch::mma::atoms::M16N8K8_TF32;
        let acc = Access {
            elem_bytes: 4,
            ldmatrix: false,
            ..acc
        };
        let cs = candidates(tf32, &acc, caps);
        assert_eq!(
            (cs[0].bm, cs[0].bn, cs[0].bk, cs[0].stages),
            (128, 128, 16, 2)
        );
        // A: 128 rows of 16 + 4 floats; B [K, N]: 16 rows of 128 + 8; two stages, 4 bytes each.
        assert_eq!(shared_bytes(&cs[0], &acc), 2 * (128 * 20 + 16 * 136) * 4);
    }

    #[test]
    fn the_largest_atom_of_the_operand_type_is_chosen() {
        let p = |dt| Problem {
            input: dt,
            ..Problem::empty_for_tests()
        };
        let caps = arch("gfx942").unwrap();
        let exact = F32Matmul::Exact;
        assert_eq!(
            atom_for(&p(crate::ir::DType::BF16), caps, exact)
                .unwrap()
                .name,
            "mfma_32x32x8_bf16"
        );
        assert_eq!(
            atom_for(&p(crate::ir::DType::F16), caps, exact)
                .unwrap()
                .name,
            "mfma_32x32x8_f16"
        );
        assert!(atom_for(&p(crate::ir::DType::F16), arch("gfx1030").unwrap(), exact).is_none());
        // f32 takes a TF32 atom only when asked, and only where the target has one.
        assert!(atom_for(&p(crate::ir::DType::F32), caps, exact).is_none());
        let tf32 = F32Matmul::Tf32;
        assert_eq!(
            atom_for(&p(crate::ir::DType::F32), caps, tf32)
                .unwrap()
                .name,
            "mfma_32x32x4_xf32"
        );
        assert_eq!(
            atom_for(&p(crate::ir::DType::F32), arch("sm_80").unwrap(), tf32)
                .unwrap()
                .name,
            "m16n8k8_tf32"
        );
        for n in ["gfx90a", "gfx1100", "gfx1201", "sm_75"] {
            assert!(atom_for(&p(crate::ir::DType::F32), arch(n).unwrap(), tf32).is_none());
        }
        // Asking for TF32 changes nothing for 16-bit operands.
        assert_eq!(
            atom_for(&p(crate::ir::DType::F16), caps, tf32)
                .unwrap()
                .name,
            "mfma_32x32x8_f16"
        );
    }

    #[test]
    fn big_tiles_unless_they_leave_too_few_blocks() {
        let caps = arch("sm_90").unwrap();
        let acc = access(&gemm(64, 64, 64, kn(64)), caps.mma[0], caps);
        let cs = candidates(caps.mma[0], &acc, caps);
        let pick = |m, n, batch| {
            let c = choose(
                &cs,
                &Problem {
                    m,
                    n,
                    batch,
                    ..Problem::empty_for_tests()
                },
            )
            .unwrap();
            (c.bm, c.bn)
        };
        // 32 x 12 = 384 blocks of 128x128.
        assert_eq!(pick(4096, 1536, 1), (128, 128));
        // 32 x 3 = 96 blocks of 128x128 are too few; 128x64 gives 192.
        assert_eq!(pick(4096, 384, 1), (128, 64));
        // The batch counts: 4 x 3 x 8 = 96 blocks are too few, 4 x 3 x 16 = 192 are not.
        assert_eq!(pick(512, 384, 8), (128, 64));
        assert_eq!(pick(512, 384, 16), (128, 128));
        // Small: as many blocks as the smallest tile gives.
        assert_eq!(pick(77, 45, 1), (64, 64));
        // Every tile gives 3 blocks: the smallest wastes the least.
        assert_eq!(pick(50, 40, 3), (64, 64));
    }
}
