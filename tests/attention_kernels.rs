//! The CUDA-core f32 FlashAttention (`codegen/kernels/attention/simt.rs`) without a GPU:
//!
//! - `host::` runs it on the CPU (the generated AMD source compiled by the host's clang++, one
//!   fiber per GPU thread, see `common/host_kernels.rs`) against the interpreter at the f32
//!   tolerance, for wave64 (gfx90a) and wave32 (gfx1100) plans: sizes that are not multiples
//!   of the tiles, masks, causal offsets either way (rows with no visible key), GQA, and
//!   head sizes that take every tiling and both load paths (16-byte units and elements).
//! - `compile::` compiles every kernel of those cases and of the benchmark shapes with hiprtc
//!   (gfx90a, gfx1030), the offline clang (gfx942, gfx1100, gfx1201) and NVRTC + ptxas
//!   (sm_90): no spills, no scratch, the target's wave size.
//! - `compile::nvrtc::sm_90a::wgmma` compiles the sm_90a warpgroup FlashAttention (f16 and
//!   bf16; `codegen/kernels/attention/wgmma.rs`) for every head size, mask kind,
//!   configuration it chooses and schedule (serial, overlapped) with NVRTC + ptxas: no spills,
//!   no stack.
//!
//! Trials are reported ignored, with the reason, where their tool is missing; the
//! `ROCMFORGE_REQUIRE_*` variables of `tests/gemm_kernels.rs` turn that into a failure.

#[path = "common/accuracy.rs"]
mod accuracy;
#[path = "common/attention_graphs.rs"]
mod attention_graphs;
#[path = "common/host_kernels.rs"]
mod host_kernels;
#[path = "common/kernel_compile.rs"]
mod kernel_compile;
#[path = "common/needs.rs"]
mod needs;
#[path = "common/row_error.rs"]
mod row_error;

use std::path::Path;

use accuracy::{rel_l2, tolerance};
use attention_graphs::{build, Mask, Spec};
use kernel_compile::KernelSet;
use libtest_mimic::{Arguments, Failed, Trial};
use needs::needs;
use rocmforge::arch::Target;
use rocmforge::codegen::{generate_with, CodegenOptions, F32Matmul, WgmmaAttention};
use rocmforge::interp::{self, Bindings};
use rocmforge::ir::{DType, Graph};
use rocmforge::passes::PassManager;

/// The first line of the CUDA-core kernel's source: how a test knows which kernel it got.
const SIMT: &str = "// FlashAttention in f32 on CUDA cores";

/// A named f32 attention case.
fn case(
    name: &'static str,
    (b, hq, hkv): (usize, usize, usize),
    (sq, sk, d): (usize, usize, usize),
    mask: Mask,
    offset: i64,
) -> (&'static str, Spec) {
    (
        name,
        Spec {
            hkv,
            sk,
            mask,
            offset,
            ..Spec::new(b, hq, sq, d)
        },
    )
}

/// Small enough for the host (every GPU thread a fiber), each past its tiles.
fn host_cases() -> Vec<(&'static str, Spec)> {
    vec![
        case("gqa3_d64", (1, 3, 1), (37, 45, 64), Mask::None, 0),
        case(
            "causal_sq_lt_sk_d80",
            (1, 2, 2),
            (20, 70, 80),
            Mask::Causal,
            50,
        ),
        // Offset -5: the first five rows see no key and must be zeros.
        case(
            "causal_sq_gt_sk_d32",
            (1, 2, 1),
            (70, 20, 32),
            Mask::Causal,
            -5,
        ),
        case("padding_d1", (2, 1, 1), (9, 33, 1), Mask::Padding, 0),
        case("bool_d128", (1, 2, 1), (50, 17, 128), Mask::BoolNegInf, 0),
        case("dense_d256", (1, 1, 1), (19, 21, 256), Mask::Dense2d, 0),
        case("causal_d160", (1, 1, 1), (40, 37, 160), Mask::Causal, 2),
        case("per_head_d5", (1, 3, 3), (11, 40, 5), Mask::PerHead, 0),
        case(
            "causal_d7_dense_rows",
            (1, 1, 1),
            (33, 33, 7),
            Mask::Causal,
            0,
        ),
    ]
}

/// The benchmark shapes (`benches/attention.rs`) at their head sizes, causal and not, for the
/// compile checks: the sizes are constants of the kernel.
fn bench_cases() -> Vec<(&'static str, Spec)> {
    let mut v = Vec::new();
    for (name, s, d) in [
        ("bench_s512_d64", 512, 64),
        ("bench_s2048_d64", 2048, 64),
        ("bench_s512_d128", 512, 128),
        ("bench_s2048_d128", 2048, 128),
    ] {
        v.push(case(name, (16, 16, 16), (s, s, d), Mask::None, 0));
        v.push(case(name, (16, 16, 16), (s, s, d), Mask::Causal, 0));
    }
    v.push(case(
        "bench_s8192_d64",
        (4, 16, 16),
        (8192, 8192, 64),
        Mask::None,
        0,
    ));
    v
}

/// `spec`'s graph after the default passes: one FlashAttention node.
fn fused(spec: &Spec) -> Result<Graph, Failed> {
    let mut g = build(spec);
    PassManager::default_pipeline()
        .run(&mut g)
        .map_err(|e| e.to_string())?;
    Ok(g)
}

/// The attention kernel of `spec`'s graph for `arch`, with the plan's full source; an error
/// unless it is the CUDA-core kernel.
fn simt_kernel(name: &str, spec: &Spec, arch: &str) -> Result<(String, String, String), Failed> {
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let plan = generate_with(&fused(spec)?, &target, &CodegenOptions::default())
        .map_err(|e| format!("{name}: {e}"))?;
    let k = plan
        .kernels
        .iter()
        .find(|k| k.family == "flash_attention")
        .ok_or(format!("{name}: no attention kernel"))?;
    if !k.body.starts_with(SIMT) {
        return Err(format!("{name} on {arch}: not the CUDA-core kernel").into());
    }
    Ok((k.entry.clone(), plan.source(k), k.body.clone()))
}

fn host_run(cxx: &Path, name: &str, spec: &Spec, arch: &str) -> Result<(), Failed> {
    simt_kernel(name, spec, arch)?;
    let g = fused(spec)?;
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let plan = generate_with(&g, &target, &CodegenOptions::default()).map_err(|e| e.to_string())?;
    let b = Bindings::random(&g, 7);
    // The reference is the unfused graph: the interpreter's own FlashAttention plays no part.
    let want = interp::run(&build(spec), &b)
        .map_err(|e| e.to_string())?
        .remove(0);
    let got = host_kernels::run_plan(cxx, &g, &plan, &b)?
        .map_err(|e| e.to_string())?
        .remove(0);
    let err = rel_l2(&got, &want).map_err(|e| format!("{name}: {e}"))?;
    if err > tolerance(DType::F32) {
        return Err(format!("{name} on {arch}: relative L2 {err:e}").into());
    }
    row_error::rows_within(&got, &want, tolerance(DType::F32))
        .map_err(|e| format!("{name} on {arch}: {e}"))?;
    Ok(())
}

/// The unique CUDA-core kernels of every case for `arch`.
fn compile_set(arch: &str) -> Result<KernelSet, Failed> {
    let mut set = KernelSet::new();
    for (name, spec) in host_cases().into_iter().chain(bench_cases()) {
        let (entry, src, body) = simt_kernel(name, &spec, arch)?;
        set.entry(entry).or_insert((src, body, name.to_string()));
    }
    Ok(set)
}

/// The first line of the warpgroup kernel's source.
const WGMMA: &str = "// FlashAttention on Hopper's warpgroup MMA";

/// f16/bf16 cases the sm_90a warpgroup kernel takes: every panel head size, the masks (none,
/// causal with offsets either way, additive, boolean), GQA, sizes off the tiles, and the problem
/// sizes that choose one, two and three warpgroups a block.
fn wgmma_cases() -> Vec<(String, Spec)> {
    let mut out = Vec::new();
    let shapes = [
        (2, 12, 4, 701, 903, 64, Mask::None, 0),
        (2, 12, 4, 701, 903, 64, Mask::Causal, 202),
        (2, 12, 12, 555, 777, 128, Mask::BoolNegInf, 0),
        (2, 12, 4, 555, 777, 128, Mask::Causal, 222),
        (1, 12, 4, 333, 301, 256, Mask::Causal, -7),
        (1, 12, 4, 333, 301, 256, Mask::PerHead, 0),
        (1, 3, 1, 77, 45, 64, Mask::Causal, -20),
        (2, 3, 1, 50, 130, 128, Mask::Dense2d, 0),
        (1, 6, 2, 19, 1000, 256, Mask::Padding, 0),
        (1, 4, 2, 200, 200, 192, Mask::Causal, 0),
        (16, 16, 16, 2048, 2048, 64, Mask::None, 0),
        (16, 16, 16, 2048, 2048, 128, Mask::Causal, 0),
    ];
    for dtype in [DType::F16, DType::BF16] {
        for (b, hq, hkv, sq, sk, d, mask, offset) in shapes {
            out.push((
                format!("{dtype}_b{b}_h{hq}x{hkv}_s{sq}x{sk}_d{d}_{mask:?}_{offset}"),
                Spec {
                    hkv,
                    sk,
                    dtype,
                    mask,
                    offset,
                    cast_softmax: true,
                    ..Spec::new(b, hq, sq, d)
                },
            ));
        }
    }
    out
}

/// The warpgroup attention kernels of [`wgmma_cases`] for sm_90a; an error where a case gets
/// another kernel.
fn wgmma_set() -> Result<KernelSet, Failed> {
    let target = Target::parse("sm_90a").map_err(|e| e.to_string())?;
    let mut set = KernelSet::new();
    let schedules = [WgmmaAttention::Auto, WgmmaAttention::Overlapped];
    for ((name, spec), schedule) in wgmma_cases()
        .into_iter()
        .flat_map(|c| schedules.map(|s| (c.clone(), s)))
    {
        let options = CodegenOptions {
            wgmma_attention: schedule,
            ..CodegenOptions::default()
        };
        let plan =
            generate_with(&fused(&spec)?, &target, &options).map_err(|e| format!("{name}: {e}"))?;
        let name = format!("{name}_{schedule:?}");
        let k = plan
            .kernels
            .iter()
            .find(|k| k.family == "flash_attention")
            .ok_or(format!("{name}: no attention kernel"))?;
        if !k.body.starts_with(WGMMA) {
            return Err(format!("{name}: not the warpgroup kernel").into());
        }
        set.entry(k.entry.clone())
            .or_insert((plan.source(k), k.body.clone(), name));
    }
    Ok(set)
}

/// f32 cases with TF32 asked for: the head sizes the TF32 matrix-core kernel takes (64, 96,
/// 128), masks (none, causal with offsets either way, boolean, additive, padding), GQA and sizes
/// off the tiles; every one must be the matrix-core kernel on the TF32 atom of `arch`.
fn tf32_cases() -> Vec<(String, Spec)> {
    let shapes = [
        (2, 12, 4, 701, 903, 64, Mask::None, 0),
        (2, 12, 4, 701, 903, 64, Mask::Causal, 202),
        (2, 12, 4, 650, 517, 96, Mask::Padding, 0),
        (2, 12, 12, 555, 777, 128, Mask::BoolNegInf, 0),
        (2, 12, 4, 555, 777, 128, Mask::Causal, 222),
        (1, 3, 1, 77, 45, 64, Mask::Causal, -20),
        (2, 3, 1, 50, 130, 128, Mask::Dense2d, 0),
        (1, 6, 2, 19, 1000, 96, Mask::PerHead, 0),
    ];
    shapes
        .into_iter()
        .map(|(b, hq, hkv, sq, sk, d, mask, offset)| {
            (
                format!("f32_b{b}_h{hq}x{hkv}_s{sq}x{sk}_d{d}_{mask:?}_{offset}"),
                Spec {
                    hkv,
                    sk,
                    dtype: DType::F32,
                    mask,
                    offset,
                    ..Spec::new(b, hq, sq, d)
                },
            )
        })
        .collect()
}

fn tf32_set(arch: &str) -> Result<KernelSet, Failed> {
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let options = CodegenOptions {
        f32_matmul: F32Matmul::Tf32,
        ..CodegenOptions::default()
    };
    let mut set = KernelSet::new();
    for (name, spec) in tf32_cases() {
        let plan =
            generate_with(&fused(&spec)?, &target, &options).map_err(|e| format!("{name}: {e}"))?;
        let k = plan
            .kernels
            .iter()
            .find(|k| k.family == "flash_attention")
            .ok_or(format!("{name}: no attention kernel"))?;
        if !k.body.contains("at TF32 precision") {
            return Err(format!("{name} on {arch}: not the TF32 matrix-core kernel").into());
        }
        set.entry(k.entry.clone())
            .or_insert((plan.source(k), k.body.clone(), name));
    }
    Ok(set)
}

fn main() {
    let args = Arguments::from_args();
    let cxx = host_kernels::host_cxx();
    let mut trials: Vec<Trial> = kernel_compile::compile_trials(compile_set);
    trials.extend(kernel_compile::tf32_trials(tf32_set));
    trials.push(needs(
        &kernel_compile::ptxas(),
        "ROCMFORGE_REQUIRE_PTXAS",
        "compile::nvrtc::sm_90a::wgmma".to_string(),
        |p| kernel_compile::nvrtc(&p, "sm_90a", &wgmma_set()?),
    ));
    for arch in ["gfx90a", "gfx1100"] {
        for (name, spec) in host_cases() {
            trials.push(needs(
                &cxx,
                "ROCMFORGE_REQUIRE_HOST_CXX",
                format!("host::{arch}::{name}"),
                move |cxx| host_run(&cxx, name, &spec, arch),
            ));
        }
    }
    libtest_mimic::run(&args, trials).exit();
}
