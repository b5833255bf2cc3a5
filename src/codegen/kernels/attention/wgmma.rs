//! FlashAttention on Hopper's warpgroup MMA (`kernel_templates/flash_attention_wgmma.hip`,
//! sm_90a): f16 or bf16 q, k, v with f32 accumulation. A block takes `64 · warpgroups` query
//! rows of one (batch, head), each warpgroup 64 of them. Q and a ring of K/V tiles sit in
//! dynamic shared memory in the 128-byte-swizzled layout of the wgmma atom
//! (`arch::mma::wgmma`): 64-column panels of 128-byte lines, K-major for Q and K, and V read
//! as an N-major B through the transposed descriptor. S = Q·Kᵀ runs from shared memory; P
//! stays in registers, its accumulators being the A registers of P·V (`WGMMA_A_REGS`).
//!
//! What FlashAttention-3 adds and this kernel does not yet: TMA loads from a producer
//! warpgroup, ping-pong scheduling of two consumer warpgroups, and the softmax of one tile
//! overlapped with the next tile's QKᵀ (docs/decisions.md). Head sizes are whole 64-column
//! panels (64, 128, 192, 256); others take the mma.sync kernel.

use serde::Serialize;

use super::super::super::plan::{BufferId, Kernel};
use super::super::super::CodegenError;
use super::Problem;
use crate::arch::mma::wgmma::{WgmmaAtom, WARPGROUP};
use crate::arch::tuning::{Family, Tuned};
use crate::arch::Target;
use crate::codegen::kernel::finish;
use crate::codegen::WgmmaAttention;
use crate::ir::{DType, MaskKind};

/// Columns of a panel: one 128-byte swizzled line of 16-bit elements.
const PANEL: usize = 64;
/// Largest head size: O's accumulators of a 256-wide head take 128 registers a thread.
const MAX_HEAD: usize = 256;
/// Registers a thread may hold for S, O, P and the mask's values together: of the 255 a thread
/// can address, the rest go to addresses, statistics and loop state (ptxas -v, sm_90a: every
/// configuration chosen for the compile trials' cases at 0 spills; D 128 with 128-key tiles
/// and a mask, 224 by this count, spilled).
const MAX_FRAGMENT_REGS: usize = 215;
/// Registers an SM has: a block's threads share them (one block an SM).
const SM_REGS: usize = 65_536;
/// Registers a thread needs beyond its fragments (addresses, loop state, statistics).
const OVERHEAD_REGS: usize = 40;
/// Deepest K/V ring: two tiles in flight hide the copy behind the two products.
const MAX_STAGES: usize = 3;
/// Blocks below which fewer rows a block are preferred (about one block per SM of an H100).
const MIN_BLOCKS: usize = 132;

/// One tiling of the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Config {
    /// Warpgroups of 64 query rows.
    pub warpgroups: usize,
    /// Keys per K/V tile (the N of QKᵀ's wgmma, a power of two).
    pub block_n: usize,
    /// K/V tiles in the ring.
    pub stages: usize,
    /// The overlapped schedule (asked for by [`WgmmaAttention::Overlapped`]): tile t's QKᵀ is issued with tile t − 1's P·V, and t's softmax
    /// runs while that P·V is in flight (two P register sets; at least three stages, since
    /// V(t − 1) is still read while tile t + stages − 2 loads).
    pub overlap: bool,
}

impl Config {
    fn block_m(&self) -> usize {
        self.warpgroups * 64
    }
}

/// The atom for the problem's input type, where the target has warpgroup MMA.
fn atom_for(target: &Target, dtype: DType) -> Option<&'static WgmmaAtom> {
    target.caps.wgmma.iter().copied().find(|a| a.input == dtype)
}

/// Head sizes in whole panels (wgmma's N for P·V is Dv, up to 256).
fn fits(p: &Problem) -> bool {
    let ok = |x: usize| x > 0 && x <= MAX_HEAD && x.is_multiple_of(PANEL);
    ok(p.d) && ok(p.dv)
}

/// 32-bit registers a thread holds for S (`block_n / 2` floats), O (`dv / 2`), the packed P
/// (`block_n / 4`, twice when overlapped) and, with a mask operand, the mask values of a tile's
/// scores (the compiler loads them ahead of their use: `block_n / 2`).
fn fragment_regs(c: &Config, p: &Problem) -> usize {
    let mask = if p.mask == MaskKind::None {
        0
    } else {
        c.block_n / 2
    };
    let p_sets = if c.overlap { 2 } else { 1 };
    c.block_n / 2 + p.dv / 2 + p_sets * c.block_n / 4 + mask
}

/// Bytes of Q, of one K tile and of one ring stage (K and V).
fn bytes(c: &Config, p: &Problem) -> (usize, usize, usize) {
    let q = c.block_m() * p.d * 2;
    let k = c.block_n * p.d * 2;
    (q, k, k + c.block_n * p.dv * 2)
}

/// Dynamic shared memory a configuration asks for: Q, the ring, and the slack that lets the
/// kernel align its base to the swizzle atom.
fn shared_bytes(c: &Config, p: &Problem, atom: &WgmmaAtom) -> usize {
    let (q, _, stage) = bytes(c, p);
    q + c.stages * stage + atom.smem.swizzle.atom_bytes() as usize
}

/// Every configuration whose registers fit one block an SM and whose ring fits the target's
/// opt-in shared memory.
pub(crate) fn candidates(p: &Problem, atom: &WgmmaAtom, target: &Target) -> Vec<Config> {
    let budget = target.caps.shared_bytes_per_block as usize;
    let mut out = Vec::new();
    for warpgroups in [1, 2, 3] {
        let threads = warpgroups * WARPGROUP as usize;
        if threads > target.limits().block_threads as usize {
            continue;
        }
        for block_n in [128, 64] {
            for overlap in [false, true] {
                let min_stages = if overlap { 3 } else { 2 };
                for stages in (min_stages..=MAX_STAGES).rev() {
                    let c = Config {
                        warpgroups,
                        block_n,
                        stages,
                        overlap,
                    };
                    let regs = fragment_regs(&c, p);
                    if regs > MAX_FRAGMENT_REGS || (regs + OVERHEAD_REGS) * threads > SM_REGS {
                        continue;
                    }
                    if shared_bytes(&c, p, atom) <= budget {
                        out.push(c);
                        break;
                    }
                }
            }
        }
    }
    out
}

fn blocks(c: &Config, p: &Problem) -> usize {
    p.b.saturating_mul(p.hq)
        .saturating_mul(p.sq.div_ceil(c.block_m()))
}

/// Enough blocks first ([`MIN_BLOCKS`]); then 128-key tiles (half the rescales and barriers of
/// 64, FlashAttention-3's choice for D 64 and 128); then the most rows a block while the grid has
/// enough blocks (each K/V tile serves more rows), else the fewest (to fill the SMs); then the
/// deepest ring.
pub(crate) fn choose(cands: &[Config], p: &Problem, schedule: WgmmaAttention) -> Option<Config> {
    cands
        .iter()
        // Overlapped where asked for and a configuration allows it, else serial; the automatic
        // choice is serial until the two are measured against each other.
        .filter(|c| schedule == WgmmaAttention::Overlapped || !c.overlap)
        .max_by_key(|c| {
            let enough = blocks(c, p) >= MIN_BLOCKS;
            (
                c.overlap,
                enough,
                c.block_n,
                if enough {
                    c.warpgroups
                } else {
                    usize::MAX - c.warpgroups
                },
                c.stages,
            )
        })
        .copied()
}

#[derive(Serialize)]
struct Context<'a> {
    #[serde(flatten)]
    p: &'a Problem,
    warpgroups: usize,
    block_m: usize,
    block_n: usize,
    stages: usize,
    overlap: bool,
    threads: usize,
    dtype: String,
    atom_name: &'static str,
    /// S = Q·Kᵀ (m64n{block_n}k16, both from shared memory) and O += P·V (m64n{dv}k16, A from
    /// registers).
    instruction_s: String,
    instruction_o: String,
    /// Bytes of Q, of a Q panel (64 columns of every row of the block), of a K or V panel of a
    /// tile, of a tile of K, and of a ring stage.
    q_bytes: usize,
    q_panel: usize,
    kv_panel: usize,
    k_bytes: usize,
    stage_bytes: usize,
    /// Where the C layout puts accumulator `e` of thread `lane`, and which of the thread's two
    /// rows it is.
    c_row: String,
    c_col: String,
    c_slot: String,
    /// The column of O's accumulator `e` (its layout has more element bits than S's).
    c_col_o: String,
    /// The xor masks of the lanes that hold the other columns of a thread's rows.
    row_lanes: Vec<u32>,
    /// The swizzled byte offset of (`r`, `c % 64`) in a panel, and the descriptors (K-major;
    /// V's N-major with its panels `kv_panel` apart).
    smem_at: String,
    desc_k: String,
    desc_v: String,
    /// Two floats to one register of the input type.
    pack: &'static str,
    /// The scale folds into the exponent (no additive mask, positive and finite scale).
    fold: bool,
    scale_log2: String,
}

/// The kernel, or `None` where the target has no warpgroup MMA for the input type, the head
/// sizes are not whole panels or no configuration fits.
pub(crate) fn kernel(
    p: &Problem,
    node: &str,
    args: Vec<BufferId>,
    target: &Target,
    tuned: &Tuned,
    schedule: WgmmaAttention,
) -> Result<Option<Kernel>, CodegenError> {
    let Some(atom) = atom_for(target, p.dtype) else {
        return Ok(None);
    };
    if !fits(p) {
        return Ok(None);
    }
    let cands = candidates(p, atom, target);
    let key = p.tune_key(Family::AttentionWgmma);
    let (Some(c), site) = tuned.pick(key, &cands, choose(&cands, p, schedule)) else {
        return Ok(None);
    };
    let threads = c.warpgroups * WARPGROUP as usize;
    let mut launch = p.query_tiles_launch(c.block_m(), threads, node, target)?;
    launch.shared_bytes =
        u32::try_from(shared_bytes(&c, p, atom)).expect("bounded by the target's shared memory");
    let (s_layout, o_layout) = (
        atom.c(c.block_n as u32).expect("a modelled N"),
        atom.c(p.dv as u32),
    );
    // Dv 192 is a valid wgmma N the layout model does not cover (powers of two): the C layout of
    // its elements is the 256-wide one's prefix, the same formulas.
    let o_layout = o_layout.unwrap_or_else(|| atom.c(256).expect("a modelled N"));
    debug_assert_eq!(s_layout.row().c(), o_layout.row().c());
    let (q_bytes, k_bytes, stage_bytes) = bytes(&c, p);
    let kv_panel = c.block_n * PANEL * 2;
    let ctx = Context {
        p,
        warpgroups: c.warpgroups,
        block_m: c.block_m(),
        block_n: c.block_n,
        stages: c.stages,
        overlap: c.overlap,
        threads,
        dtype: p.dtype.to_string(),
        atom_name: atom.name,
        instruction_s: atom.instruction(c.block_n as u32),
        instruction_o: atom.instruction(p.dv as u32),
        q_bytes,
        q_panel: c.block_m() * PANEL * 2,
        kv_panel,
        k_bytes,
        stage_bytes,
        c_row: s_layout.row().c(),
        c_col: s_layout.col().c(),
        c_slot: s_layout.row_slot().c(),
        c_col_o: o_layout.col().c(),
        row_lanes: s_layout.row_lane_masks(),
        smem_at: atom.smem.offset_c("r", "c % 64"),
        desc_k: atom.smem.descriptor_c("a"),
        desc_v: atom.smem.descriptor_mn_c("a", kv_panel as u32),
        pack: if p.dtype == DType::BF16 {
            "rf_pack_bf16x2"
        } else {
            "rf_pack_f16x2"
        },
        fold: p.mask != MaskKind::Additive && p.scale.is_finite() && p.scale > 0.0,
        scale_log2: p.scale_log2e(),
    };
    let mut k = finish(
        "flash_attention",
        "flash_attention_wgmma.hip",
        ctx,
        launch,
        args,
        node,
    )?;
    k.tune = site;
    Ok(Some(k))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Graph, Op};

    /// The problem of a plain attention node (no mask, not causal) of these sizes.
    fn problem(dtype: DType, b: usize, hq: usize, sq: usize, d: usize) -> Problem {
        let mut g = Graph::new("attention");
        let q = g.input("q", dtype, &[b, hq, sq, d]).unwrap();
        let k = g.input("k", dtype, &[b, hq, sq, d]).unwrap();
        let v = g.input("v", dtype, &[b, hq, sq, d]).unwrap();
        let o = g.flash_attention(q, k, v, None, 0.125, None).unwrap();
        let Op::FlashAttention(att) = g.op(o).clone() else {
            unreachable!("a FlashAttention node")
        };
        Problem::new(&g, o, &att).unwrap()
    }

    fn chosen(d: usize, b: usize, hq: usize, sq: usize) -> Config {
        let t = Target::parse("sm_90a").unwrap();
        let p = problem(DType::F16, b, hq, sq, d);
        let atom = atom_for(&t, p.dtype).unwrap();
        choose(&candidates(&p, atom, &t), &p, WgmmaAttention::Auto).unwrap()
    }

    /// The H100's choices per head size at the benchmark's shape (B 16, H 16, S 2048), by hand
    /// from the budgets: D 64 fits three warpgroups (S 64 + O 32 + P 32 registers), D 128 two,
    /// D 256 two with 64-key tiles (O alone is 128 registers) and two stages (Q takes 64 KiB).
    #[test]
    fn configurations_per_head_size() {
        let cfg = |warpgroups, block_n, stages| Config {
            warpgroups,
            block_n,
            stages,
            overlap: false,
        };
        assert_eq!(chosen(64, 16, 16, 2048), cfg(3, 128, 3));
        assert_eq!(chosen(128, 16, 16, 2048), cfg(2, 128, 3));
        assert_eq!(chosen(256, 16, 16, 2048), cfg(2, 64, 2));
        // Two heads of 300 rows: too few blocks of 192 rows; one warpgroup a block.
        assert_eq!(chosen(64, 1, 2, 300).warpgroups, 1);
        // Overlapped: two P register sets leave two warpgroups at D 64; at D 256 the third
        // stage fits one warpgroup's Q only.
        let t = Target::parse("sm_90a").unwrap();
        let over = |d| {
            let p = problem(DType::F16, 16, 16, 2048, d);
            let atom = atom_for(&t, p.dtype).unwrap();
            choose(&candidates(&p, atom, &t), &p, WgmmaAttention::Overlapped).unwrap()
        };
        let cfg_o = |warpgroups, block_n, stages| Config {
            overlap: true,
            ..cfg(warpgroups, block_n, stages)
        };
        assert_eq!(over(64), cfg_o(2, 128, 3));
        assert_eq!(over(128), cfg_o(2, 128, 3));
        assert_eq!(over(256), cfg_o(1, 64, 3));
    }

    #[test]
    fn every_candidate_fits_and_other_targets_have_none() {
        let t = Target::parse("sm_90a").unwrap();
        for dtype in [DType::F16, DType::BF16] {
            let atom = atom_for(&t, dtype).unwrap();
            for d in [64, 128, 192, 256] {
                let p = problem(dtype, 2, 3, 77, d);
                let cs = candidates(&p, atom, &t);
                assert!(!cs.is_empty(), "{dtype} {d}");
                for c in &cs {
                    assert!(shared_bytes(c, &p, atom) <= t.caps.shared_bytes_per_block as usize);
                    let threads = c.warpgroups * 128;
                    assert!((fragment_regs(c, &p) + OVERHEAD_REGS) * threads <= SM_REGS);
                }
            }
        }
        for arch in ["sm_90", "sm_80", "gfx942", "gfx1100"] {
            assert!(
                atom_for(&Target::parse(arch).unwrap(), DType::F16).is_none(),
                "{arch}"
            );
        }
        assert!(atom_for(&t, DType::F32).is_none());
        for (d, ok) in [
            (64, true),
            (96, false),
            (192, true),
            (256, true),
            (320, false),
        ] {
            assert_eq!(fits(&problem(DType::F16, 1, 1, 8, d)), ok, "{d}");
        }
    }
}
