//! The register-tiled f32 FlashAttention on CUDA cores (`kernel_templates/flash_attention_simt.hip`):
//! the FA2 loop with both products as register-blocked SIMT GEMMs. A block of `threads` takes
//! `bm` query rows of one (batch, head); Q stays in shared memory, K/V tiles of `bn` keys pass
//! through it. Threads form row groups of `tpr` lanes: a thread owns `tm` rows (strided by the
//! number of row groups) and, of S = Q·Kᵀ, `tn` keys (strided by `tpr`); of O, `dvc` chunks of
//! four columns (strided by `4·tpr`). Row max and sum combine a row group's lanes by shuffles,
//! so `tpr` is at most the target's wave size.

use serde::Serialize;

use super::super::super::plan::{BufferId, Kernel, Launch};
use super::super::super::CodegenError;
use super::Problem;
use crate::arch::tuning::{Family, Tuned};
use crate::arch::Platform;
use crate::arch::Target;
use crate::codegen::kernel::finish;
use crate::ir::DType;

/// The largest head size (D or Dv) the kernel takes: beyond it no tile fits both 48 KiB of
/// shared memory and the register budget, and the scalar kernel runs instead.
pub(crate) const MAX_HEAD: usize = 256;

/// Accumulator registers of O a thread may hold (`tm · 4 · dvc`); beyond it the kernel spills.
const MAX_O_REGS: usize = 64;

/// One tiling of the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Config {
    /// Query rows per block.
    pub bm: usize,
    /// Keys per K/V tile.
    pub bn: usize,
    /// Rows and keys of a thread's S tile.
    pub tm: usize,
    pub tn: usize,
    pub threads: usize,
}

impl Config {
    /// Lanes sharing a row.
    pub fn tpr(&self) -> usize {
        self.bn / self.tn
    }

    /// Row groups: threads per block over lanes per row.
    pub fn row_groups(&self) -> usize {
        self.bm / self.tm
    }
}

/// The tilings tried, best first, as (lanes per row, keys per lane, row groups, rows per
/// thread): the 4×4 S tiles give four FMAs per float read from shared memory; smaller ones
/// are for large heads, whose Q tile alone fills most of 48 KiB.
const SHAPES: [(usize, usize, usize, usize); 7] = [
    (8, 4, 32, 4),
    (8, 4, 16, 4),
    (8, 2, 16, 4),
    (8, 2, 16, 3),
    (8, 2, 16, 2),
    (4, 2, 16, 2),
    (4, 2, 16, 1),
];

/// Shared-memory layout of a configuration, in floats. Rows of Q, K and P are padded so that
/// their length in 16-byte units is odd: the lanes of a row group read consecutive rows with
/// 16-byte loads, which then fall in distinct banks. V rows hold every chunk a lane reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Layout {
    /// D rounded up to 4 (Q and K columns the loops read; the extra ones are zero).
    pub d4: usize,
    /// Row length of Q and K.
    pub qs: usize,
    /// Row length of V: `dvc` chunks of 4 columns for each of the `tpr` lanes.
    pub vcols: usize,
    /// Chunks of 4 O columns per lane.
    pub dvc: usize,
    /// Row length of P.
    pub ps: usize,
}

/// `n` rounded up to 4 and then to an odd number of 4-float units.
fn odd_units(n: usize) -> usize {
    let n4 = n.div_ceil(4) * 4;
    if (n4 / 4).is_multiple_of(2) {
        n4 + 4
    } else {
        n4
    }
}

impl Layout {
    /// Head sizes are at most [`MAX_HEAD`] (checked by [`candidates`]), so none of this overflows.
    pub fn new(c: &Config, p: &Problem) -> Layout {
        let d4 = p.d.div_ceil(4) * 4;
        let dvc = p.dv.div_ceil(4 * c.tpr());
        Layout {
            d4,
            qs: odd_units(p.d),
            vcols: dvc * 4 * c.tpr(),
            dvc,
            ps: odd_units(c.bn),
        }
    }

    pub fn shared_bytes(&self, c: &Config) -> usize {
        4 * (c.bm * self.qs + c.bn * self.qs + c.bn * self.vcols + c.bm * self.ps)
    }
}

/// The configurations that fit the problem and the target, best first: f32 storage, head
/// sizes from 1 to [`MAX_HEAD`], at least one query and one key (empty problems are the
/// scalar kernel's), lanes per row within a wave, shared memory within what a block may
/// declare statically, and O within [`MAX_O_REGS`] registers.
pub(crate) fn candidates(p: &Problem, target: &Target) -> Vec<Config> {
    if p.dtype != DType::F32
        || !(1..=MAX_HEAD).contains(&p.d)
        || !(1..=MAX_HEAD).contains(&p.dv)
        || p.sq == 0
        || p.sk == 0
    {
        return Vec::new();
    }
    let shared = target
        .limits()
        .shared_bytes
        .min(target.caps.static_shared_bytes);
    let threads = target.limits().block_threads;
    SHAPES
        .iter()
        .map(|&(tpr, tn, rg, tm)| Config {
            bm: rg * tm,
            bn: tpr * tn,
            tm,
            tn,
            threads: tpr * rg,
        })
        .filter(|c| {
            let l = Layout::new(c, p);
            c.tpr() <= target.wave_size as usize
                && c.threads <= threads as usize
                && l.shared_bytes(c) <= shared as usize
                && c.tm * 4 * l.dvc <= MAX_O_REGS
                && fits_registers(c, &l, target)
        })
        .collect()
}

/// Registers per lane a configuration needs besides its tiles: addresses, loop counters, the
/// softmax statistics and the mask's row offsets (calibrated below).
const FIXED_REGS: usize = 48;

/// A conservative estimate of the VGPRs a configuration takes on AMD, or `None` where the
/// target's compiler is not calibrated (NVIDIA: ptxas is not in CI, and the ptxas-checked
/// limits above stand).
///
/// O (`tm · 4 · dvc`) and S (`tm · tn`) live through the key loop; the Q·Kᵀ loop reads `tm + tn`
/// 16-byte fragments per step of 4 columns, and the AMD compilers (hiprtc 5.2, clang-19) keep
/// the fragments of every step they unroll in flight: 4 steps (the `#pragma unroll 4`) where
/// the D/4 steps divide by 4, all of them where they do not (the loop is then unrolled
/// completely, its loads hoisted). Calibration, `attention_register_sweep` (tests/amd_offline/sweep.rs),
/// measured VGPRs (+ spilled) on gfx906 and gfx1030 (hiprtc 5.2) and gfx90a, against this
/// estimate:
///
/// | D / Dv   | bm bn tm tn thr | dvc | steps held | estimate | gfx906     | gfx1030    | gfx90a    |
/// | 40 / 40  | 64 32 4 4 128   | 2   | 10         | 416      | 256 + 157  | 256 + 161  | 412       |
/// | 40 / 24  | 64 32 4 4 128   | 1   | 10         | 400      | 256 + 134  | 256 + 135  | 390       |
/// | 24 / 40  | 128 32 4 4 256  | 2   | 6          | 288      | 256 + 20   | 256 + 14   | 274       |
/// | 200/200  | 16 8 1 2 64     | 13  | 50         | 702      | 256 + 266  | 256 + 249  | 512 + 8   |
/// | 32 / 127 | 64 32 4 4 128   | 4   | 4          | 256      | 247        | 244        | 270       |
/// | 17 / 17  | 128 32 4 4 256  | 1   | 5          | 240      | 220        | 217        | 220       |
/// | 64 / 64  | 64 32 4 4 128   | 2   | 4          | 224      | 218        | 213        | 248       |
/// | 128/128  | 48 16 3 2 128   | 4   | 4          | 182      | 235        | 234        | 246       |
///
/// Below about 200 the compilers take registers they need not (no occupancy is asked of them
/// under `__launch_bounds__`), so the estimate is meant to bound only the cases that spill.
pub(crate) fn register_estimate(c: &Config, l: &Layout, target: &Target) -> Option<usize> {
    match target.platform {
        Platform::Nvidia => None,
        Platform::Amd => {
            let steps = l.d4 / 4;
            let held = if steps.is_multiple_of(4) { 4 } else { steps };
            Some(c.tm * 4 * l.dvc + c.tm * c.tn + (c.tm + c.tn) * 4 * held + FIXED_REGS)
        }
    }
}

/// Whether a configuration's estimated registers fit the target's budget for its block size.
fn fits_registers(c: &Config, l: &Layout, target: &Target) -> bool {
    register_estimate(c, l, target).is_none_or(|r| {
        r <= target
            .caps
            .registers
            .budget(c.threads as u32, target.wave_size) as usize
    })
}

/// The configuration for a problem: the first candidate, if any fits.
pub(crate) fn choose(p: &Problem, target: &Target) -> Option<Config> {
    candidates(p, target).into_iter().next()
}

/// The launch geometry: grid x over (batch, head), y over query tiles.
pub(crate) fn launch(
    c: &Config,
    p: &Problem,
    node: &str,
    target: &Target,
) -> Result<Launch, CodegenError> {
    p.query_tiles_launch(c.bm, c.threads, node, target)
}

/// The kernel's `__launch_bounds__`. On NVIDIA with an explicit minimum of one block per SM:
/// without it ptxas caps these kernels at 128 registers and spills some tilings (measured with
/// ptxas 12.9 for sm_90), where up to 255 are allowed. HIP reads a second argument as waves
/// per execution unit, so AMD gets the thread count alone.
fn launch_bounds(c: &Config, target: &Target) -> String {
    match target.platform {
        Platform::Nvidia => format!("{}, 1", c.threads),
        Platform::Amd => c.threads.to_string(),
    }
}

#[derive(Serialize)]
struct Context<'a> {
    #[serde(flatten)]
    p: &'a Problem,
    #[serde(flatten)]
    c: Config,
    #[serde(flatten)]
    l: Layout,
    tpr: usize,
    rg: usize,
    launch_bounds: String,
    /// The scale times log2(e), as a C float literal: scores go to the log2 domain in one multiply.
    scale_log2e: String,
    /// Q and K rows (`vec_qk`), V and O rows (`vec_v`) move in 16-byte units: D (Dv) is a
    /// multiple of 4, so every row starts 16-byte aligned.
    vec_qk: bool,
    vec_v: bool,
    /// K/V tiles arrive by `cp.async` (where the target has it and both move in 16-byte units).
    async_copy: bool,
}

/// The kernel, or `None` where no configuration fits (the scalar kernel runs instead).
pub(crate) fn kernel(
    p: &Problem,
    node: &str,
    args: Vec<BufferId>,
    target: &Target,
    tuned: &Tuned,
) -> Result<Option<Kernel>, CodegenError> {
    let cands = candidates(p, target);
    let key = p.tune_key(Family::AttentionSimt);
    let (Some(c), site) = tuned.pick(key, &cands, choose(p, target)) else {
        return Ok(None);
    };
    let launch = launch(&c, p, node, target)?;
    let vec_qk = p.d.is_multiple_of(4);
    let vec_v = p.dv.is_multiple_of(4);
    let ctx = Context {
        p,
        c,
        l: Layout::new(&c, p),
        tpr: c.tpr(),
        rg: c.row_groups(),
        launch_bounds: launch_bounds(&c, target),
        scale_log2e: p.scale_log2e(),
        vec_qk,
        vec_v,
        async_copy: target.caps.async_copy.has_cp_async() && vec_qk && vec_v,
    };
    let mut k = finish(
        "flash_attention",
        "flash_attention_simt.hip",
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
    use crate::arch::arches;
    use crate::ir::MaskKind;

    fn problem(d: usize, dv: usize, dtype: DType) -> Problem {
        Problem {
            b: 2,
            hq: 6,
            hkv: 2,
            group: 3,
            sq: 77,
            sk: 131,
            d,
            dv,
            dtype,
            scale: 0.125,
            scale_f: "0.125f".into(),
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
            keys: "131".into(),
            ctype: "float",
            load_pre: "",
            load_post: "",
            store_pre: "",
            store_post: "",
        }
    }

    fn targets() -> Vec<Target> {
        arches().map(|a| Target::parse(a.name).unwrap()).collect()
    }

    /// The choice per head size, with its shared memory worked out by hand: 4 bytes × (Q rows ×
    /// Q row + K rows × K row + V rows × V row + P rows × P row).
    #[test]
    fn choice_per_head_size_by_hand() {
        let sm90 = Target::parse("sm_90").unwrap();
        let cases = [
            // D = 1: rows of one 16-byte unit; V rows of 8 lanes × one chunk.
            (
                1,
                1,
                (128, 32, 4, 4, 256),
                4 * (128 * 4 + 32 * 4 + 32 * 32 + 128 * 36),
            ),
            (
                32,
                32,
                (128, 32, 4, 4, 256),
                4 * (128 * 36 + 32 * 36 + 32 * 32 + 128 * 36),
            ),
            (
                64,
                64,
                (64, 32, 4, 4, 128),
                4 * (64 * 68 + 32 * 68 + 32 * 64 + 64 * 36),
            ),
            // Dv = 80 is 2.5 chunks of 32 columns: lanes read 3, V rows hold 96.
            (
                80,
                80,
                (64, 16, 4, 2, 128),
                4 * (64 * 84 + 16 * 84 + 16 * 96 + 64 * 20),
            ),
            (
                128,
                128,
                (48, 16, 3, 2, 128),
                4 * (48 * 132 + 16 * 132 + 16 * 128 + 48 * 20),
            ),
            (
                160,
                160,
                (32, 16, 2, 2, 128),
                4 * (32 * 164 + 16 * 164 + 16 * 160 + 32 * 20),
            ),
            (
                256,
                256,
                (16, 8, 1, 2, 64),
                4 * (16 * 260 + 8 * 260 + 8 * 256 + 16 * 12),
            ),
            // A large D with a small Dv: the Q tile still decides, O registers do not.
            (
                256,
                64,
                (32, 8, 2, 2, 64),
                4 * (32 * 260 + 8 * 260 + 8 * 64 + 32 * 12),
            ),
        ];
        for (d, dv, (bm, bn, tm, tn, threads), bytes) in cases {
            let p = problem(d, dv, DType::F32);
            let c = choose(&p, &sm90).unwrap_or_else(|| panic!("D = {d} has a configuration"));
            assert_eq!(
                c,
                Config {
                    bm,
                    bn,
                    tm,
                    tn,
                    threads
                },
                "D = {d}, Dv = {dv}"
            );
            assert_eq!(
                Layout::new(&c, &p).shared_bytes(&c),
                bytes,
                "D = {d}, Dv = {dv}"
            );
        }
    }

    /// Every candidate on every target keeps the kernel's invariants: lanes of a row a power of
    /// two within one wave (the shuffles), tiles of whole 16-byte units, rows padded to an odd
    /// number of them, V rows covering every lane's chunks, the block within the target's
    /// threads and static shared memory, and at most 64 O registers.
    #[test]
    fn candidates_keep_the_kernels_invariants_on_every_target() {
        for target in targets() {
            for d in [
                1, 2, 3, 5, 16, 32, 48, 64, 72, 80, 96, 100, 112, 128, 160, 192, 255, 256,
            ] {
                for dv in [d, 64, 1] {
                    let p = problem(d, dv, DType::F32);
                    let all = candidates(&p, &target);
                    // On NVIDIA every head size has a tiling; on AMD the register filter may
                    // leave none (the scalar kernel runs then: `none_fits_only_by_registers`).
                    if target.platform == Platform::Nvidia {
                        assert!(!all.is_empty(), "{target}: D {d}, Dv {dv}");
                    }
                    assert_eq!(choose(&p, &target), all.first().copied());
                    for c in all {
                        let l = Layout::new(&c, &p);
                        let what = format!("{target}: D {d}, Dv {dv}: {c:?}");
                        assert!(c.tpr().is_power_of_two(), "{what}");
                        assert!(c.tpr() <= target.wave_size as usize, "{what}");
                        assert_eq!(c.threads, c.tpr() * c.row_groups(), "{what}");
                        assert_eq!(c.bm, c.tm * c.row_groups(), "{what}");
                        assert_eq!(c.bn % 4, 0, "{what}");
                        for row in [l.qs, l.ps] {
                            assert_eq!(row % 4, 0, "{what}");
                            assert_eq!((row / 4) % 2, 1, "{what}");
                        }
                        assert!(l.qs >= l.d4 && l.d4 >= d && l.d4 < d + 4, "{what}");
                        assert!(l.ps >= c.bn, "{what}");
                        assert!(l.vcols >= dv && l.vcols < dv + 4 * c.tpr(), "{what}");
                        assert!(c.threads <= 1024, "{what}");
                        assert!(l.shared_bytes(&c) <= 48 * 1024, "{what}");
                        assert!(c.tm * 4 * l.dvc <= MAX_O_REGS, "{what}");
                    }
                }
            }
        }
    }

    /// The estimate worked by hand for the cases of its calibration table (the sizes that
    /// spilled with hiprtc 5.2): O + S + in-flight Q·Kᵀ fragments + fixed registers.
    #[test]
    fn register_estimate_by_hand() {
        let gfx1030 = Target::parse("gfx1030").unwrap();
        let c = |bm, bn, tm, tn, threads| Config {
            bm,
            bn,
            tm,
            tn,
            threads,
        };
        for (d, dv, config, regs) in [
            // D 40: 10 steps of 4 columns, all held: 32 + 16 + 8·4·10 + 48.
            (40, 40, c(64, 32, 4, 4, 128), 416),
            (40, 24, c(64, 32, 4, 4, 128), 400),
            (24, 40, c(128, 32, 4, 4, 256), 288),
            // D 200: 50 steps: 52 + 2 + 3·4·50 + 48.
            (200, 200, c(16, 8, 1, 2, 64), 702),
            // D 64: 16 steps, 4 of them held: 32 + 16 + 8·4·4 + 48.
            (64, 64, c(64, 32, 4, 4, 128), 224),
        ] {
            let p = problem(d, dv, DType::F32);
            let l = Layout::new(&config, &p);
            assert_eq!(
                register_estimate(&config, &l, &gfx1030),
                Some(regs),
                "D {d}, Dv {dv}"
            );
        }
        let sm90 = Target::parse("sm_90").unwrap();
        let p = problem(40, 40, DType::F32);
        let config = c(64, 32, 4, 4, 128);
        assert_eq!(
            register_estimate(&config, &Layout::new(&config, &p), &sm90),
            None
        );
    }

    /// For every arch row and every D (and Dv = D, 1, 24, 256) in 1..=256: every candidate's
    /// estimate fits the target's budget for its block size, so neither `choose` nor the tuner
    /// (which picks among `candidates`) can take a configuration that spills; where none is
    /// left, the reason is the registers alone (some shape fits every other limit) and the
    /// attention kernel falls back to the scalar one (`lower`: `simt::kernel` is `None`).
    #[test]
    fn every_candidate_fits_the_register_budget_or_none_fits_only_by_registers() {
        for target in targets() {
            let regs = target.caps.registers;
            for d in 1..=MAX_HEAD {
                for dv in [d, 1, 24, 256] {
                    let p = problem(d, dv, DType::F32);
                    let all = candidates(&p, &target);
                    for c in &all {
                        let l = Layout::new(c, &p);
                        if let Some(r) = register_estimate(c, &l, &target) {
                            let budget = regs.budget(c.threads as u32, target.wave_size);
                            assert!(
                                r <= budget as usize,
                                "{target}: D {d}, Dv {dv}: {c:?} estimates {r} > {budget}"
                            );
                        }
                    }
                    if all.is_empty() {
                        assert_eq!(target.platform, Platform::Amd, "D {d}, Dv {dv}");
                        let shared = target
                            .limits()
                            .shared_bytes
                            .min(target.caps.static_shared_bytes)
                            as usize;
                        let by_other_limits = SHAPES.iter().any(|&(tpr, tn, rg, tm)| {
                            let c = Config {
                                bm: rg * tm,
                                bn: tpr * tn,
                                tm,
                                tn,
                                threads: tpr * rg,
                            };
                            let l = Layout::new(&c, &p);
                            l.shared_bytes(&c) <= shared && c.tm * 4 * l.dvc <= MAX_O_REGS
                        });
                        assert!(by_other_limits, "{target}: D {d}, Dv {dv}");
                    }
                }
            }
        }
    }

    /// The configurations that spilled with hiprtc 5.2 are no longer chosen on the targets
    /// that spilled them, and the case (D 40, Dv 24) still runs on this kernel.
    #[test]
    fn the_spilling_configurations_are_not_chosen() {
        for arch in ["gfx906", "gfx1030"] {
            let t = Target::parse(arch).unwrap();
            for (d, dv) in [(40, 40), (40, 24), (24, 40)] {
                let c = choose(&problem(d, dv, DType::F32), &t)
                    .unwrap_or_else(|| panic!("{arch}: D {d}, Dv {dv} has a tiling"));
                assert!(c.tm * c.tn < 16, "{arch}: D {d}, Dv {dv}: {c:?}");
            }
            assert_eq!(choose(&problem(200, 200, DType::F32), &t), None, "{arch}");
        }
    }

    /// Other storage types, head sizes of 0 or past the largest, and empty problems are left
    /// to the other kernels.
    #[test]
    fn declines_what_it_does_not_compute() {
        for target in targets() {
            for (d, dv, dtype) in [
                (64, 64, DType::F16),
                (64, 64, DType::BF16),
                (0, 64, DType::F32),
                (64, 0, DType::F32),
                (257, 64, DType::F32),
                (64, 257, DType::F32),
            ] {
                assert_eq!(
                    choose(&problem(d, dv, dtype), &target),
                    None,
                    "{d} {dv} {dtype}"
                );
            }
            for (sq, sk) in [(0, 5), (5, 0)] {
                let p = Problem {
                    sq,
                    sk,
                    ..problem(64, 64, DType::F32)
                };
                assert_eq!(choose(&p, &target), None);
            }
        }
    }
}
