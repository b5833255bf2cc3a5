//! The matrix-core FlashAttention (`kernel_templates/flash_attention_mma.hip`), FlashAttention-2's
//! recipe on the target's MMA atom: f16 or bf16 q, k, v with f32 accumulation; f32 q, k, v on
//! the target's TF32 atom where the caller opts in (`CodegenOptions::f32_matmul`: tiles staged
//! as f32, four bytes an element, rounded to TF32 as fragments load; P through shared memory as
//! f32, since no TF32 atom's accumulators are its A layout). A block of
//! `warps` warps takes `block_m` query rows of one (batch, head), each warp `atoms` atom tiles of
//! rows, so every K/V fragment a warp reads from shared memory serves `atoms · M` rows. K/V
//! tiles of `block_n` keys pass through shared memory; scores, the online softmax (in the log2
//! domain, the scale folded into the exponent's FMA) and P·V stay in registers.
//!
//! What differs per target comes from its table and its atom ([`Access`]), not from the vendor:
//! - staging: `cp.async` into a ring of `stages` K and V buffers where the target has it, K and V
//!   in separate commit groups so that the next K loads while P·V runs and the next V while the
//!   next S is computed; elsewhere the same overlap through registers (one buffer each);
//! - fragments: by `ldmatrix` from XOR-swizzled tiles where the atom's helpers have it, else the
//!   atom's element loads from tiles whose rows are padded by 16 bytes;
//! - P: where the S accumulators are already the P·V A operand (`accumulators_feed_a`), P never
//!   leaves registers; elsewhere (MFMA, WMMA) each warp stores its P rows to shared memory and
//!   reloads them as A fragments.

use serde::Serialize;

use super::super::super::mma::{ldmatrix_pairs, MmaAtom};
use super::super::super::plan::{BufferId, Kernel, Launch};
use super::super::super::CodegenError;
use super::super::tile::TileLayout;
use super::Problem;
use crate::arch::mma::Precision;
use crate::arch::tuning::{Family, Tuned};
use crate::arch::Target;
use crate::codegen::kernel::finish;
use crate::codegen::mma::AtomHelpers;
use crate::codegen::F32Matmul;
use crate::ir::{DType, MaskKind};

/// Bytes of a 16-byte piece: the unit of staging copies and of the tiles' padding.
const PIECE_BYTES: usize = 16;

/// Elements of a 16-byte piece of the atom's operands (8 halves, 4 floats).
fn chunk(atom: &MmaAtom) -> usize {
    PIECE_BYTES / atom.input.size_bytes()
}
/// Largest head size the kernel takes: the O accumulators of one atom's rows of a 256-wide head
/// already fill half of a lane's registers.
const MAX_HEAD: usize = 256;
/// The most 32-bit registers per lane the fragments a warp holds at once may take (Q where kept,
/// O, S, staged tile chunks, mask row offsets): past it the kernel no longer fits 255 registers
/// with its addresses and softmax statistics (checked with `ptxas -v` for every configuration
/// chosen on sm_80 and sm_90).
const MAX_FRAGMENT_REGS: usize = 160;
/// The same with element loads instead of ldmatrix: a fragment gathered element by element holds
/// its pieces and their addresses in registers too, and RDNA's 256 VGPRs have no AGPRs to hold
/// accumulators (checked with clang-19 for gfx90a, gfx942, gfx1100 and gfx1201).
const MAX_FRAGMENT_REGS_ELEMENT_LOADS: usize = 112;
/// Deepest cp.async ring tried: with K and V in separate groups, three tiles in flight hide the
/// latency; the shared memory is better spent on wider tiles.
const MAX_STAGES: usize = 3;
/// Blocks below which a 64-row tile is preferred to a 128-row one: about one block per SM or CU
/// of the large GPUs (as the GEMM's `MIN_BLOCKS`).
const MIN_BLOCKS: usize = 128;

/// The memory-access choices of the kernel. [`Access::of`] reads them from the target's table
/// and atom; [`Access::PORTABLE`] turns them all off, which is what MFMA/WMMA targets get, so
/// that a test can run that structure on NVIDIA (`CodegenOptions::attention_access`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct AttentionAccess {
    /// K/V tiles by `cp.async` (else loaded into registers while the previous tile is computed,
    /// then stored).
    pub cp_async: bool,
    /// K and V fragments by `ldmatrix` from XOR-swizzled tiles (else the atom's element loads
    /// from padded tiles).
    pub ldmatrix: bool,
    /// P stays in registers, the S accumulators becoming the A operand of P·V (else it passes
    /// through shared memory).
    pub p_in_registers: bool,
}

impl AttentionAccess {
    /// Register staging, element loads and P through shared memory: what every target can do.
    pub const PORTABLE: AttentionAccess = AttentionAccess {
        cp_async: false,
        ldmatrix: false,
        p_in_registers: false,
    };

    /// The fastest choices the target and its atom allow.
    pub(crate) fn of(atom: &MmaAtom, target: &Target) -> AttentionAccess {
        AttentionAccess {
            cp_async: target.caps.async_copy.has_cp_async(),
            ldmatrix: ldmatrix_pairs(atom).is_some(),
            p_in_registers: atom.accumulators_feed_a(),
        }
    }

    /// These choices where `forced` turns some off (a forced choice never turns one on: the
    /// target might not have it).
    fn limited_by(self, forced: Option<AttentionAccess>) -> AttentionAccess {
        let Some(f) = forced else { return self };
        AttentionAccess {
            cp_async: self.cp_async && f.cp_async,
            ldmatrix: self.ldmatrix && f.ldmatrix,
            p_in_registers: self.p_in_registers && f.p_in_registers,
        }
    }
}

/// One tiling of the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Config {
    pub warps: usize,
    /// Atom row tiles per warp.
    pub atoms: usize,
    /// Query rows per block: `warps · atoms · M`.
    pub block_m: usize,
    /// Keys per K/V tile.
    pub block_n: usize,
    /// K and V buffers: tiles in flight with cp.async; 1 with register staging.
    pub stages: usize,
    /// Q fragments kept in registers for the whole kernel (else reloaded, from the L1/L2-resident
    /// Q rows, at every tile: the large head sizes need the registers for O).
    pub q_in_registers: bool,
}

/// The matrix atom the kernel runs on: of the target's atoms with the problem's input type and
/// f32 accumulation, the one whose lanes hold the fewest rows of C (each row a lane holds keeps
/// its own softmax statistics: MFMA 32x32x8 spreads 16 rows over a lane, 16x16x16 four), then
/// the largest.
pub(crate) fn atom_for(
    target: &Target,
    dtype: DType,
    f32_matmul: F32Matmul,
) -> Option<&'static MmaAtom> {
    target
        .caps
        .mma
        .iter()
        .copied()
        .filter(|a| a.input == dtype && a.acc == DType::F32 && f32_matmul.admits(a))
        .min_by_key(|a| (a.c.row_slots(), std::cmp::Reverse(a.m * a.n * a.k)))
}

/// Keys per step of the tile loops over N: B fragments by ldmatrix come in pairs of atom columns.
fn n_step(atom: &MmaAtom, acc: &AttentionAccess) -> usize {
    atom.n as usize * if acc.ldmatrix { 2 } else { 1 }
}

/// Whether the head sizes suit the atom and the kernel: D in whole atom K steps and 16-byte
/// chunks, Dv in whole steps of N, both within [`MAX_HEAD`].
fn fits(p: &Problem, atom: &MmaAtom, acc: &AttentionAccess) -> bool {
    let ok = |x: usize, step: usize| {
        x > 0 && x <= MAX_HEAD && x.is_multiple_of(step) && x.is_multiple_of(chunk(atom))
    };
    ok(p.d, atom.k as usize) && ok(p.dv, n_step(atom, acc))
}

/// The shared-memory tiles of a configuration: K [block_n][d] and V [block_n][dv], swizzled for
/// ldmatrix or padded for element loads. The swizzle permutes the 16-byte chunks of a row in
/// groups of 8, so it needs a power-of-two count of them; other rows (D 96: 12 chunks) are
/// padded, which also puts the 8 rows an ldmatrix phase reads on distinct banks (a row of
/// 13 chunks starts 5 chunks further along the 8 bank groups).
fn tiles(
    c: &Config,
    p: &Problem,
    atom: &MmaAtom,
    acc: &AttentionAccess,
) -> (TileLayout, TileLayout) {
    // K is read as Bᵀ (rows are N), V as B (rows are K).
    let tile = |cols: usize, k_rows: bool| {
        if !atom.packs_pairs() {
            // f32 (TF32): element loads only, from padded rows.
            return TileLayout::padded_f32(c.block_n, cols, k_rows);
        }
        let swizzle = acc.ldmatrix && (cols / chunk(atom)).is_power_of_two();
        TileLayout::new(c.block_n, cols, swizzle)
    };
    (tile(p.d, false), tile(p.dv, true))
}

/// Row length (elements) of the P tile: padded like the element-load tiles.
fn p_ld(c: &Config, atom: &MmaAtom) -> usize {
    c.block_n + chunk(atom)
}

/// Bytes of shared memory a configuration declares (f32 tiles and P take four bytes an element).
pub(crate) fn shared_bytes(
    c: &Config,
    p: &Problem,
    atom: &MmaAtom,
    acc: &AttentionAccess,
) -> usize {
    let (k, v) = tiles(c, p, atom, acc);
    let pt = if acc.p_in_registers {
        0
    } else {
        c.block_m * p_ld(c, atom)
    };
    (c.stages * (k.elems() + v.elems()) + pt) * atom.input.size_bytes()
}

/// 16-byte chunks of a K (or V) tile each thread stages through registers.
fn staged_chunks(c: &Config, cols: usize, atom: &MmaAtom) -> usize {
    (c.block_n * cols / chunk(atom)).div_ceil(c.warps * atom.lanes as usize)
}

/// 32-bit registers per lane of the fragments a warp holds at once.
fn fragment_regs(c: &Config, p: &Problem, atom: &MmaAtom, acc: &AttentionAccess) -> usize {
    let (an, ak) = (atom.n as usize, atom.k as usize);
    // 16-bit operands two per register, TF32 one.
    let a_regs = atom.regs(&atom.a) as usize;
    let q = if c.q_in_registers {
        c.atoms * (p.d / ak) * a_regs
    } else {
        a_regs
    };
    let o = c.atoms * (p.dv / an) * atom.c.elems() as usize;
    let s = c.atoms * (c.block_n / an) * atom.c.elems() as usize;
    let staged = if acc.cp_async {
        0
    } else {
        // Both tiles' chunks: the compiler keeps the next V's loads and this K's stores close.
        4 * (staged_chunks(c, p.d, atom) + staged_chunks(c, p.dv, atom))
    };
    // Element loads: the compiler gathers a step's B fragments (K's over the key tiles, V's over
    // the head) before their MMAs.
    let gathered = if acc.ldmatrix {
        0
    } else {
        atom.regs(&atom.b) as usize * (c.block_n / an).max(p.dv / an)
    };
    // The mask's offset (64-bit) of each row slot a lane holds.
    let mask_rows = if p.mask == MaskKind::None {
        0
    } else {
        2 * c.atoms * atom.c.row_slots() as usize
    };
    q + o + s + staged + gathered + mask_rows
}

fn register_budget(acc: &AttentionAccess) -> usize {
    if acc.ldmatrix {
        MAX_FRAGMENT_REGS
    } else {
        MAX_FRAGMENT_REGS_ELEMENT_LOADS
    }
}

/// Every configuration that fits the atom, the head sizes, the target's shared memory and the
/// register budget.
pub(crate) fn candidates(
    atom: &MmaAtom,
    p: &Problem,
    acc: &AttentionAccess,
    target: &Target,
) -> Vec<Config> {
    let budget = target.caps.static_shared_bytes as usize;
    let max_threads = target.limits().block_threads as usize;
    let (am, ak) = (atom.m as usize, atom.k as usize);
    let max_regs = register_budget(acc);
    let mut out = Vec::new();
    for warps in [4, 8] {
        for atoms in [1, 2] {
            let block_m = warps * atoms * am;
            if !(block_m == 64 || block_m == 128) || warps * atom.lanes as usize > max_threads {
                continue;
            }
            for block_n in [128, 64, 32, 16] {
                if block_n % n_step(atom, acc) != 0 || block_n % ak != 0 {
                    continue;
                }
                for q_in_registers in [true, false] {
                    let mut c = Config {
                        warps,
                        atoms,
                        block_m,
                        block_n,
                        stages: 1,
                        q_in_registers,
                    };
                    if fragment_regs(&c, p, atom, acc) > max_regs {
                        continue;
                    }
                    if acc.cp_async {
                        let one = shared_bytes(&c, p, atom, acc);
                        let fixed = shared_bytes(&Config { stages: 0, ..c }, p, atom, acc);
                        let per_stage = one - fixed;
                        c.stages =
                            (budget.saturating_sub(fixed) / per_stage.max(1)).clamp(1, MAX_STAGES);
                    }
                    if shared_bytes(&c, p, atom, acc) <= budget {
                        out.push(c);
                    }
                }
            }
        }
    }
    out
}

fn blocks(c: &Config, p: &Problem) -> usize {
    p.b.saturating_mul(p.hq)
        .saturating_mul(p.sq.div_ceil(c.block_m))
}

/// FlashAttention-2's choice: 128-row tiles unless they leave fewer than [`MIN_BLOCKS`] blocks
/// (then 64); key tiles of 64 where the registers and shared memory allow (wider tiles only
/// where they cost no other choice: they rescale less often, but hold more scores); then Q in
/// registers, the most atoms per warp (fragment reuse), the deepest ring, fewest warps.
pub(crate) fn choose(cands: &[Config], p: &Problem) -> Option<Config> {
    cands
        .iter()
        .max_by_key(|c| {
            let enough = blocks(c, p) >= MIN_BLOCKS;
            (
                enough,
                if enough {
                    c.block_m
                } else {
                    usize::MAX - c.block_m
                },
                c.block_n.min(64),
                c.q_in_registers,
                c.atoms,
                c.stages,
                c.block_n,
                std::cmp::Reverse(c.warps),
            )
        })
        .copied()
}

/// The launch geometry of a configuration, its single source: grid x over (batch, head), y over
/// query tiles.
pub(crate) fn launch(
    c: &Config,
    atom: &MmaAtom,
    p: &Problem,
    node: &str,
    target: &Target,
) -> Result<Launch, CodegenError> {
    p.query_tiles_launch(c.block_m, c.warps * atom.lanes as usize, node, target)
}

#[derive(Serialize)]
struct Context<'a> {
    #[serde(flatten)]
    p: &'a Problem,
    #[serde(flatten)]
    c: Config,
    #[serde(flatten)]
    acc: AttentionAccess,
    threads: usize,
    dtype: String,
    /// The atom's helper prefix (`rf_m16n8k16_f16`) and its shape.
    atom: String,
    am: u32,
    an: u32,
    ak: u32,
    /// Query rows per warp.
    rows_w: usize,
    /// Keys per step of the S and P·V loops over N.
    n_step: usize,
    tk: TileLayout,
    tv: TileLayout,
    p_ld: usize,
    /// Chunks of a K and of a V tile per thread (register staging).
    k_iters: usize,
    v_iters: usize,
    /// The scale folds into the exponent (`exp2(s·scale·log2e − m)` as one FMA): positive and
    /// finite with no additive mask, so the row maximum of the raw scores is the scaled one's.
    fold: bool,
    /// scale·log2(e) as a C float literal.
    scale_log2: String,
    /// Elements of a 16-byte chunk (8 halves, 4 floats) and the shared tiles' element type.
    ce: usize,
    st: &'static str,
    /// f32 operands multiplied at TF32 precision.
    tf32: bool,
}

/// The kernel, or `None` where the target has no suitable atom, the head sizes do not fit or no
/// configuration does. `forced` limits the access choices (tests).
pub(crate) fn kernel(
    p: &Problem,
    node: &str,
    args: Vec<BufferId>,
    target: &Target,
    forced: Option<AttentionAccess>,
    tuned: &Tuned,
    f32_matmul: F32Matmul,
) -> Result<Option<Kernel>, CodegenError> {
    let Some(atom) = atom_for(target, p.dtype, f32_matmul) else {
        return Ok(None);
    };
    let acc = AttentionAccess::of(atom, target).limited_by(forced);
    if !fits(p, atom, &acc) {
        return Ok(None);
    }
    let cands = candidates(atom, p, &acc, target);
    let key = p.tune_key(Family::AttentionMma);
    let (Some(c), site) = tuned.pick(key, &cands, choose(&cands, p)) else {
        return Ok(None);
    };
    let launch = launch(&c, atom, p, node, target)?;
    let (tk, tv) = tiles(&c, p, atom, &acc);
    let fold = p.mask != MaskKind::Additive && p.scale.is_finite() && p.scale > 0.0;
    let ctx = Context {
        p,
        c,
        acc,
        threads: launch.block[0] as usize,
        dtype: p.dtype.to_string(),
        atom: atom.prefix(),
        am: atom.m,
        an: atom.n,
        ak: atom.k,
        rows_w: c.atoms * atom.m as usize,
        n_step: n_step(atom, &acc),
        tk,
        tv,
        p_ld: p_ld(&c, atom),
        k_iters: staged_chunks(&c, p.d, atom),
        v_iters: staged_chunks(&c, p.dv, atom),
        fold,
        scale_log2: p.scale_log2e(),
        ce: chunk(atom),
        st: crate::codegen::mma::stored_element(atom),
        tf32: atom.precision == Precision::Tf32,
    };
    let mut k = finish(
        "flash_attention",
        "flash_attention_mma.hip",
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
    use super::super::KvLen;
    use super::*;

    fn problem(dtype: DType, b: usize, hq: usize, sq: usize, sk: usize, d: usize) -> Problem {
        Problem {
            b,
            hq,
            hkv: hq,
            group: 1,
            sq,
            sk,
            d,
            dv: d,
            dtype,
            scale: 0.125,
            scale_f: "1.25e-1f".into(),
            causal: false,
            offset: "0LL".into(),
            offset_text: 0,
            window: 0,
            mask: MaskKind::None,
            mask_ctype: "float",
            mask_load_pre: "",
            mask_load_post: "",
            ms: vec![0; 4],
            kv_len: KvLen::Static,
            keys: sk.to_string(),
            ctype: "rf_half",
            load_pre: "",
            load_post: "",
            store_pre: "",
            store_post: "",
        }
    }

    fn target(arch: &str) -> Target {
        Target::parse(arch).unwrap()
    }

    fn chosen(arch: &str, d: usize, forced: Option<AttentionAccess>) -> Config {
        let t = target(arch);
        let p = problem(DType::F16, 4, 16, 2048, 2048, d);
        let atom = atom_for(&t, p.dtype, F32Matmul::Exact).unwrap();
        let acc = AttentionAccess::of(atom, &t).limited_by(forced);
        choose(&candidates(atom, &p, &acc, &t), &p).unwrap()
    }

    /// The H100's configurations per head size, by hand from the budgets: 48 KiB of static
    /// shared memory (swizzled tiles, no padding) and 160 fragment registers per lane.
    #[test]
    fn fa2_configurations_per_head_size_on_sm_90() {
        let cfg = |warps, atoms, block_n, stages, q_in_registers| Config {
            warps,
            atoms,
            block_m: 128,
            block_n,
            stages,
            q_in_registers,
        };
        // D 64: 2 atoms (Q 32 + O 64 + S 64 = 160 registers), 16 KiB per K+V tile: 3 stages.
        assert_eq!(chosen("sm_90", 64, None), cfg(4, 2, 64, 3, true));
        // D 96: 2 atoms would take 48 + 96 + 64; one atom in 8 warps. Rows of 12 chunks are
        // padded to 13 (26 KiB per stage): one buffer each.
        assert_eq!(chosen("sm_90", 96, None), cfg(8, 1, 64, 1, true));
        // D 128: 32 KiB per stage of 64 keys: one K and one V buffer (FA2's own overlap).
        assert_eq!(chosen("sm_90", 128, None), cfg(8, 1, 64, 1, true));
        // D 256: O alone is 128 registers: Q reloaded per tile, 32-key tiles (32 KiB per stage).
        assert_eq!(chosen("sm_90", 256, None), cfg(8, 1, 32, 1, false));
        // Forced portable on sm_90 (the AMD structure): one buffer each, padded tiles, the P
        // tile, and the gathered fragments' registers (Q 16 + O 32 + S 32 + staged 16 +
        // gathered 16 = 112 for one atom of D 64 in 8 warps).
        let c = chosen("sm_90", 64, Some(AttentionAccess::PORTABLE));
        assert_eq!((c.stages, c.block_n, c.block_m, c.atoms), (1, 64, 128, 1));
        let p = problem(DType::F16, 4, 16, 2048, 2048, 64);
        assert!(
            shared_bytes(
                &c,
                &p,
                atom_for(&target("sm_90"), DType::F16, F32Matmul::Exact).unwrap(),
                &AttentionAccess::PORTABLE
            ) <= 48 * 1024
        );
    }

    #[test]
    fn small_problems_take_64_row_tiles() {
        let t = target("sm_90");
        let atom = atom_for(&t, DType::F16, F32Matmul::Exact).unwrap();
        let acc = AttentionAccess::of(atom, &t);
        // 2 heads x 8 tiles of 128 rows = 16 blocks: too few; 64-row tiles give 32.
        let p = problem(DType::F16, 1, 2, 1000, 1000, 64);
        let c = choose(&candidates(atom, &p, &acc, &t), &p).unwrap();
        assert_eq!(c.block_m, 64);
        // 8 x 16 x 8 = 1024 blocks of 128 rows.
        let p = problem(DType::F16, 8, 16, 1000, 1000, 64);
        assert_eq!(
            choose(&candidates(atom, &p, &acc, &t), &p).unwrap().block_m,
            128
        );
    }

    /// Every candidate of every target with atoms, head size and access choice fits the shared
    /// memory, the register budget and the thread limit, and tiles the atom exactly. Where none
    /// does the scalar kernel runs; the matrix-core kernel must exist for D 64 everywhere, and
    /// for every head size on NVIDIA and CDNA as the target's table has them.
    #[test]
    fn candidates_fit_every_target() {
        for arch in ["sm_80", "sm_90", "gfx90a", "gfx942", "gfx1100", "gfx1201"] {
            let t = target(arch);
            for dtype in [DType::F16, DType::BF16] {
                let atom = atom_for(&t, dtype, F32Matmul::Exact).unwrap();
                for forced in [None, Some(AttentionAccess::PORTABLE)] {
                    let acc = AttentionAccess::of(atom, &t).limited_by(forced);
                    for d in [64, 96, 128, 256] {
                        let p = problem(dtype, 2, 3, 77, 300, d);
                        assert!(fits(&p, atom, &acc), "{arch} {d}");
                        let cs = candidates(atom, &p, &acc, &t);
                        let required = d == 64
                            || (forced.is_none() && !arch.starts_with("gfx1") && d < 256)
                            || (arch.starts_with("sm") && forced.is_none());
                        assert!(!required || !cs.is_empty(), "{arch} {dtype} d {d} {acc:?}");
                        for c in &cs {
                            assert_eq!(c.block_m, c.warps * c.atoms * atom.m as usize);
                            assert_eq!(c.block_n % n_step(atom, &acc), 0);
                            assert_eq!(c.block_n % atom.k as usize, 0);
                            assert!(
                                shared_bytes(c, &p, atom, &acc)
                                    <= t.caps.static_shared_bytes as usize
                            );
                            assert!(fragment_regs(c, &p, atom, &acc) <= register_budget(&acc));
                            assert!((1..=MAX_STAGES).contains(&c.stages));
                            if !acc.cp_async {
                                assert_eq!(c.stages, 1, "{arch}: register staging has one buffer");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn access_follows_the_target_and_forcing_only_turns_choices_off() {
        let sm90 = target("sm_90");
        let atom = atom_for(&sm90, DType::F16, F32Matmul::Exact).unwrap();
        let all = AttentionAccess {
            cp_async: true,
            ldmatrix: true,
            p_in_registers: true,
        };
        assert_eq!(AttentionAccess::of(atom, &sm90), all);
        assert_eq!(
            AttentionAccess::of(atom, &sm90).limited_by(Some(AttentionAccess::PORTABLE)),
            AttentionAccess::PORTABLE
        );
        for arch in ["gfx90a", "gfx942", "gfx1100", "gfx1201"] {
            let t = target(arch);
            let atom = atom_for(&t, DType::BF16, F32Matmul::Exact).unwrap();
            assert_eq!(
                AttentionAccess::of(atom, &t).limited_by(Some(all)),
                AttentionAccess::PORTABLE,
                "{arch}"
            );
        }
        // No atom: sm_75 (m16n8k8 is not modelled), gfx1030, and f32 anywhere.
        assert!(atom_for(&target("sm_75"), DType::F16, F32Matmul::Exact).is_none());
        assert!(atom_for(&target("gfx1030"), DType::F16, F32Matmul::Exact).is_none());
        assert!(atom_for(&sm90, DType::F32, F32Matmul::Exact).is_none());
        assert_eq!(
            atom_for(&target("gfx942"), DType::F16, F32Matmul::Exact)
                .unwrap()
                .name,
            "mfma_16x16x16_f16"
        );
    }

    #[test]
    fn head_sizes_outside_the_atom_steps_or_past_256_do_not_fit() {
        let t = target("sm_90");
        let atom = atom_for(&t, DType::F16, F32Matmul::Exact).unwrap();
        let acc = AttentionAccess::of(atom, &t);
        for (d, ok) in [
            (64, true),
            (80, true),
            (72, false),
            (256, true),
            (272, false),
        ] {
            assert_eq!(
                fits(&problem(DType::F16, 1, 1, 8, 8, d), atom, &acc),
                ok,
                "{d}"
            );
        }
        // Dv in pairs of N tiles for ldmatrix.x4, single N tiles for element loads.
        let mut p = problem(DType::F16, 1, 1, 8, 8, 64);
        p.dv = 40;
        assert!(!fits(&p, atom, &acc));
        assert!(fits(&p, atom, &AttentionAccess::PORTABLE));
    }
}
