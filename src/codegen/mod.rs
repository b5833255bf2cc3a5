//! Code generation: a fused graph becomes a [`KernelPlan`] of HIP kernels rendered from
//! `kernel_templates/`, with shapes, dtypes and tile sizes as compile-time constants. One kernel
//! source serves AMD (hiprtc) and NVIDIA (NVRTC); the per-platform prelude maps what differs.
//!
//! No text from the graph reaches a kernel body: bodies are built from shapes, dtypes and
//! numeric attributes alone (see `names.rs`), every launch is checked against the target's
//! limits and every value a kernel indexes with `int` against that range (`limits.rs`).

mod ctype;
mod expr_c;
mod kernel;
mod kernels;
mod limits;
mod lower;
pub mod mma;
mod mma_probe;
mod names;
mod persistent;
mod plan;
mod templates;

use thiserror::Error;

use crate::arch::{ArchError, Platform, Target, Tuned};
use crate::ir::{Graph, GraphError};

pub use kernels::attention::AttentionAccess;
pub use limits::{MAX_EXPR_OPS, MAX_KERNEL_ARGS};
pub use mma_probe::mma_probe_kernel;
pub use names::display_name;
pub use persistent::Persistent;
pub use plan::{
    Access, Buffer, BufferId, BufferRole, IndexCheck, Kernel, KernelPlan, Launch, PersistentLaunch,
    PlanOutput, StallCheck, StepTiming, Timeline, STATUS_BYTES,
};

#[derive(Debug, Error, Clone, PartialEq)]
pub enum CodegenError {
    #[error(transparent)]
    Arch(#[from] ArchError),
    #[error("node `{node}` cannot be compiled: {reason}")]
    Unsupported { node: String, reason: String },
    #[error("kernel template `{template}` failed to render: {message}")]
    Template { template: String, message: String },
    /// A launch dimension past what the target allows (a grid is never truncated to fit).
    #[error(
        "node `{node}`: its kernel needs {what} = {value}, past the target's limit of {limit}"
    )]
    LaunchLimit {
        node: String,
        what: String,
        value: u64,
        limit: u64,
    },
    /// A size the kernel holds in a 32-bit `int` (a loop bound, a row length) that does not fit.
    #[error("node `{node}`: {what} = {value} is past {limit}, the largest its kernel indexes with 32-bit ints")]
    IndexRange {
        node: String,
        what: String,
        value: u64,
        limit: u64,
    },
    #[error("node `{node}`: its kernel would take {args} buffer parameters, more than the {limit} codegen allows")]
    TooManyArgs {
        node: String,
        args: usize,
        limit: usize,
    },
    #[error("node `{node}`: its expression has more than {limit} operations")]
    ExpressionTooLarge { node: String, limit: usize },
    /// A float attribute that has no C literal (NaN or infinite where a finite value is needed).
    #[error("node `{node}`: attribute {what} = {value} is not a finite number")]
    NonFinite {
        node: String,
        what: &'static str,
        value: f64,
    },
    #[error(transparent)]
    Graph(#[from] GraphError),
}

/// Choices codegen makes beyond the graph: test knobs and tuned configurations. What a kernel
/// computes is the fused graph's (a matmul's epilogue is part of its Gemm node, made by the GEMM
/// pass), so the unfused baseline is the clean-up pipeline's graph lowered as it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodegenOptions {
    /// Limits the matrix-core attention's memory-access choices (`None`: the target's fastest).
    /// Tests set [`AttentionAccess::PORTABLE`] to run on NVIDIA the structure MFMA/WMMA targets
    /// get (register staging, element loads, P through shared memory); a choice the target
    /// lacks is never turned on.
    pub attention_access: Option<AttentionAccess>,
    /// Configurations chosen by timing (`compile::tune`); empty: every family's own choice.
    pub tuned: Tuned,
    /// Lower every slice as a copy kernel, none read in place as an alias of its operand's
    /// buffer: for replay bundles, whose format has no buffer offsets yet.
    pub copy_slices: bool,
    /// Decode GEMVs on Q4_0/Q4_1/Q8_0 blocks with 8-bit activations and 4-way int8 dot products
    /// (`kernels/gemm/quant_dot.rs`) instead of the f32 reader. Off by default: on the H100 at
    /// SmolLM2's sizes it measured 9.7 µs a GEMV against 6.5 µs for the f16 small-M kernel
    /// (decode step kernel by kernel, docs/performance.md): its per-block activation pass and
    /// reductions are latency the f32 reader does not pay. The K-quants (Q4_K, Q5_K, Q6_K) take
    /// that kernel whatever this says: their f32 reader decodes value by value.
    pub int8_gemv: bool,
    /// f16/bf16 GEMMs on the sm_90a warpgroup kernels (`kernels/gemm/wgmma.rs`) where the
    /// target has wgmma and the problem fills a tile. On by default since the TMA kernel
    /// (warp-specialised, persistent) measured faster than the mma.sync kernel at M 128 and
    /// 4096 on every model shape but one (H200, 2026-11-29, docs/performance.md); off: the
    /// mma.sync kernel, to measure one against the other.
    pub wgmma_gemm: bool,
    /// With `wgmma_gemm`: the TMA kernel's tile width, or the cp.async kernel instead of it.
    pub wgmma_tma: TmaWidth,
    /// f16/bf16 prefill attention on the sm_90a warpgroup kernel (`kernels/attention/wgmma.rs`)
    /// where the target has wgmma and the head sizes are whole 64-column panels, with its
    /// schedule; off: the mma.sync kernel (and `attention_access`, which shapes that kernel,
    /// turns it off too). `Auto` by default: on an H100 it took B16 H16 S2048 from 1.24 to
    /// 0.88 ms at D 64 and from 2.66 to 1.61 ms at D 128 (eighteenth session,
    /// docs/performance.md); the overlapped schedule measured slower than the serial one, so
    /// `Auto` is serial.
    pub wgmma_attention: WgmmaAttention,
    /// The whole plan as one persistent kernel (`persistent.rs`: the decode issue's
    /// megakernel); off by default: one launch per kernel.
    pub persistent: Persistent,
    /// How f32 GEMMs and f32 attention multiply: exact f32 on CUDA cores (the default), or on
    /// the target's TF32 matrix atom where the caller opts in and the target has one.
    pub f32_matmul: F32Matmul,
    /// Whether the GEMV with 8-bit activations quantizes A in a kernel of its own (once per
    /// launch, into a workspace) or in every block of the GEMV
    /// (`kernels/gemm/quant_dot.rs`, `SPLIT_MIN_WEIGHT_BYTES`).
    pub quant_split: QuantSplit,
    /// f16/bf16 GEMVs of more than `ir::gemm::GEMV_GROUP_ROWS` rows (a batched decode step of
    /// 17 to 64 sequences) on the target's `mma.sync` m16n8k16 atom instead of CUDA cores
    /// (`kernels/gemm/small_m.rs`, "tensor cores"): the norm prologue, paired columns and
    /// epilogues as the CUDA-core GEMV applies them; targets without that atom keep the CUDA
    /// cores whatever this says. On by default: on an H100 it took SmolLM2's batched step
    /// from 2.60 to 1.84 ms at 32 sequences and from 4.17 to 2.71 ms at 64 (twentieth session,
    /// docs/performance.md); off: the CUDA-core GEMV, to measure one against the other.
    pub mma_gemv: bool,
}

impl Default for CodegenOptions {
    fn default() -> Self {
        CodegenOptions {
            attention_access: None,
            tuned: Tuned::default(),
            copy_slices: false,
            int8_gemv: false,
            wgmma_gemm: true,
            wgmma_tma: TmaWidth::Auto,
            wgmma_attention: WgmmaAttention::Auto,
            persistent: Persistent::Off,
            f32_matmul: F32Matmul::Exact,
            quant_split: QuantSplit::Auto,
            mma_gemv: true,
        }
    }
}

/// How f32 matrix products are computed: the f32 GEMMs (`Op::Gemm` on f32 operands) and both
/// products of f32 attention (QKᵀ and P·V).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum F32Matmul {
    /// Exact f32 (CUDA cores / SIMD): within f32 rounding of the interpreter (relative L2
    /// ~1e-6). The default, and what every target without a TF32 atom runs whatever is asked.
    #[default]
    Exact,
    /// Operands rounded to TF32 (10-bit mantissa), products accumulated in f32, on the
    /// target's TF32 atom (`mma.sync m16n8k8 .tf32` on sm_80+, the xf32 MFMA on gfx942): each
    /// product is off by at most 2⁻¹⁰ relative, so results differ from exact f32 by about 1e-3
    /// relative. Opt-in only; targets without such an atom (gfx90a, RDNA, sm_75) keep exact f32
    /// and their plan says so (`KernelPlan::notes`).
    Tf32,
}

impl F32Matmul {
    /// Whether a matrix atom's precision is one this choice accepts: exact atoms always, a TF32
    /// atom only where TF32 was asked for.
    pub fn admits(self, atom: &crate::arch::mma::MmaAtom) -> bool {
        match atom.precision {
            crate::arch::mma::Precision::Exact => true,
            crate::arch::mma::Precision::Tf32 => self == F32Matmul::Tf32,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            F32Matmul::Exact => "exact",
            F32Matmul::Tf32 => "tf32",
        }
    }
}

/// Where the GEMV with 8-bit activations quantizes A ([`CodegenOptions::quant_split`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum QuantSplit {
    /// A kernel of its own where W is large enough for the launch to pay
    /// (`kernels/gemm/quant_dot.rs`, `SPLIT_MIN_WEIGHT_BYTES`), else every block.
    #[default]
    Auto,
    /// Always a kernel of its own (to measure one against the other; the tests' two-kernel
    /// cases).
    On,
    /// Always every block of the GEMV.
    Off,
}

/// Whether and how attention runs on the sm_90a warpgroup kernel (`kernels/attention/wgmma.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WgmmaAttention {
    /// The warpgroup kernel with the schedule its configuration choice picks (the default).
    #[default]
    Auto,
    /// Each tile's S = Q·Kᵀ, softmax and P·V in turn within a warpgroup.
    Serial,
    /// The next tile's QKᵀ in flight during this tile's softmax, the previous P·V during the
    /// next wait (FlashAttention-3's intra-warpgroup overlap), where a configuration allows it.
    Overlapped,
    /// No warpgroup attention: the mma.sync kernel.
    Off,
}

/// How the warpgroup GEMM picks its TMA kernel's tile width (`kernels/gemm/wgmma.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TmaWidth {
    /// The width with the least modelled time in waves of tiles.
    #[default]
    Auto,
    /// This width (64, 128 or 256; another is refused with a typed error).
    Fixed(usize),
    /// No TMA kernel: the cp.async warpgroup kernel (to measure one against the other).
    Off,
}

/// The kernels that compute `graph` on `target`.
pub fn generate(graph: &Graph, target: &Target) -> Result<KernelPlan, CodegenError> {
    generate_with(graph, target, &CodegenOptions::default())
}

pub fn generate_with(
    graph: &Graph,
    target: &Target,
    options: &CodegenOptions,
) -> Result<KernelPlan, CodegenError> {
    // Destructured so that an option added later has to be read here.
    let CodegenOptions {
        attention_access,
        tuned,
        copy_slices,
        int8_gemv,
        wgmma_gemm,
        wgmma_tma,
        wgmma_attention,
        persistent,
        f32_matmul,
        quant_split,
        mma_gemv,
    } = options;
    let plan = lower::generate(
        graph,
        target,
        &CodegenOptions {
            attention_access: *attention_access,
            tuned: tuned.clone(),
            copy_slices: *copy_slices,
            int8_gemv: *int8_gemv,
            wgmma_gemm: *wgmma_gemm,
            wgmma_tma: *wgmma_tma,
            wgmma_attention: *wgmma_attention,
            // Read by the families that shape their blocks for a persistent plan.
            persistent: *persistent,
            f32_matmul: *f32_matmul,
            quant_split: *quant_split,
            mma_gemv: *mma_gemv,
        },
    )?;
    persistent::fold(plan, *persistent)
}

/// The preludes' template context.
#[derive(serde::Serialize)]
struct PreludeContext<'a> {
    arch: &'a str,
    wave: u32,
    /// The target's 4-way int8 dot product (`arch::Dot4::name`), behind `rf_dot4_i8`.
    dot4: &'static str,
}

/// The prelude every kernel source starts with on `target`: platform mappings, then the
/// helpers all platforms share, then the fragment helpers of the target's matrix instructions
/// (generated from `mma::atoms`).
pub fn prelude(target: &Target) -> String {
    let name = match target.platform {
        Platform::Amd => "prelude_amd.hip",
        Platform::Nvidia => "prelude_nvidia.hip",
    };
    let ctx = minijinja::Value::from_serialize(PreludeContext {
        arch: &target.arch,
        wave: target.wave_size,
        dot4: target.caps.dot4.name(),
    });
    let mut s = templates::render(name, ctx.clone()).expect("preludes render (checked by tests)");
    s.push('\n');
    s.push_str(&templates::render("common.hip", ctx).expect("common prelude renders"));
    if !target.caps.mma.is_empty() {
        s.push_str(&format!(
            "\n// ---- matrix-core fragment helpers for {}, generated from codegen/mma/atoms.rs ----\n",
            target.caps.name
        ));
        for atom in target.caps.mma {
            s.push_str(&mma::fragment_helpers(atom));
        }
        s.push_str("// ---- end of the matrix-core fragment helpers ----\n");
    }
    s
}
