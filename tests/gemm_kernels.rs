//! The GEMM kernels (`codegen/kernels/gemm`: the small-M decode kernel and the CUDA-core one)
//! without a GPU:
//!
//! - `host::` runs them on the CPU (the generated AMD source compiled by the host's clang++,
//!   one OS thread per GPU thread, see `common/host_kernels.rs`) against the interpreter at
//!   the dtype tolerances, for wave64 (gfx90a) and wave32 (gfx1030) plans; outputs start
//!   poisoned, so an element never written fails.
//! - `compile::` compiles them with hiprtc (gfx90a, gfx1030), the offline clang (gfx942,
//!   gfx1100, gfx1201) and NVRTC + ptxas (sm_90): no spills, no scratch, the target's wave size.
//! - `snapshot::` keeps one kernel of each as generated for sm_90.
//!
//! Each trial is reported ignored, with the reason, where its tool is missing;
//! `ROCMFORGE_REQUIRE_HIPRTC=1`, `ROCMFORGE_REQUIRE_CLANG=1`, `ROCMFORGE_REQUIRE_HOST_CXX=1` and
//! `ROCMFORGE_REQUIRE_PTXAS=1` turn that into a failure. NVRTC is found as cudarc finds it
//! (`LD_LIBRARY_PATH`), ptxas through `ROCMFORGE_PTXAS` or the `PATH`.

#[path = "common/accuracy.rs"]
mod accuracy;
#[path = "common/files.rs"]
mod files;
#[path = "common/gemm_small_cases.rs"]
mod gemm_small_cases;
#[path = "common/host_kernels.rs"]
mod host_kernels;
#[path = "common/kernel_compile.rs"]
mod kernel_compile;
#[path = "common/needs.rs"]
mod needs;

use needs::needs;
use std::collections::BTreeMap;
use std::path::Path;

use gemm_small_cases::Case;
use libtest_mimic::{Arguments, Failed, Trial};
use rocmforge::codegen::{generate_with, CodegenOptions, Kernel, Target};
use rocmforge::interp::{self, Bindings};
use rocmforge::ir::DType;

use accuracy::{rel_l2, tolerance};

/// The Gemm kernel of `case`'s graph for `arch` (the graph is one Gemm node).
fn gemm_kernel(case: &Case, arch: &str) -> Result<(Kernel, String), Failed> {
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let g = case.graph();
    let plan = generate_with(&g, &target, &CodegenOptions::default())
        .map_err(|e| format!("{}: {e}", case.name()))?;
    match plan.kernels.as_slice() {
        [k] if k.family.starts_with("gemm") => Ok((k.clone(), plan.source(k))),
        ks => Err(format!("{}: {} kernels, not one GEMM", case.name(), ks.len()).into()),
    }
}

/// Runs `case` on the host for `arch`'s plan and compares with the interpreter.
fn host_run(cxx: &Path, case: &Case, arch: &str) -> Result<(), Failed> {
    let g = case.graph();
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let plan = generate_with(&g, &target, &CodegenOptions::default()).map_err(|e| e.to_string())?;
    let b = Bindings::random(&g, 11);
    let want = interp::run(&g, &b).map_err(|e| e.to_string())?.remove(0);
    let got = host_kernels::run_plan(cxx, &g, &plan, &b)?
        .map_err(|e| e.to_string())?
        .remove(0);
    let err = rel_l2(&got, &want).map_err(|e| format!("{}: {e}", case.name()))?;
    let tol = tolerance(case.dtype);
    if err > tol {
        return Err(format!("{}: relative L2 {err:e} > {tol:e}", case.name()).into());
    }
    Ok(())
}

/// The cases the host runs (one OS thread per GPU thread is slow, so the sizes are small):
/// the odd small-M cases, a K long enough for every wave of a block to have chunks, and the
/// odd CUDA-core cases.
fn host_cases() -> Vec<Case> {
    let odd = |c: &Case| (c.n == 45 && (c.k == 40 || (c.k == 37 && !c.nk))) || c.n == 48;
    let mut v: Vec<Case> = gemm_small_cases::small_m()
        .into_iter()
        .filter(|c| odd(c) || (c.batch > 1 && c.n == 45))
        .collect();
    for dtype in [DType::F16, DType::BF16, DType::F32] {
        v.push(Case {
            dtype,
            batch: 1,
            m: 3,
            n: 5,
            k: 1600,
            nk: true,
            bias_silu: false,
        });
    }
    v.extend(
        gemm_small_cases::large_m()
            .into_iter()
            .filter(|c| c.batch * c.m * c.n * c.k <= 15_000_000),
    );
    v
}

/// The cases compiled for every target: each dtype and path of both kernels, once.
fn compile_cases() -> Vec<Case> {
    let mut v: Vec<Case> = gemm_small_cases::small_m()
        .into_iter()
        .filter(|c| [1, 16].contains(&c.m) && (c.n, c.k) != (1536, 576) && c.batch == 1)
        .collect();
    v.extend(
        gemm_small_cases::small_m()
            .into_iter()
            .filter(|c| c.batch > 1),
    );
    v.extend(gemm_small_cases::large_m());
    v
}

/// The unique kernels of the compile cases for `arch`: entry → (source, body, case).
fn compile_set(arch: &str) -> Result<kernel_compile::KernelSet, Failed> {
    let mut out = BTreeMap::new();
    for c in compile_cases() {
        let (k, src) = gemm_kernel(&c, arch)?;
        out.entry(k.entry.clone())
            .or_insert((src, k.body.clone(), c.name()));
    }
    Ok(out)
}

/// The body of one kernel of each family, as generated for sm_90.
fn snapshot(name: &'static str, case: Case) -> Result<(), Failed> {
    let (k, _) = gemm_kernel(&case, "sm_90")?;
    std::panic::catch_unwind(|| {
        files::snapshot_settings().bind(|| insta::assert_snapshot!(name, k.body))
    })
    .map_err(|_| Failed::from(format!("{name} differs from its snapshot")))
}

/// Whether `case`'s kernel for `arch` is one of the CUDA-core GEMMs the host runs.
fn on_cuda_cores(case: &Case, arch: &str) -> bool {
    let target = Target::parse(arch).expect("a known target");
    generate_with(&case.graph(), &target, &CodegenOptions::default())
        .map(|plan| {
            plan.kernels
                .iter()
                .all(|k| host_kernels::COOPERATIVE.contains(&k.family))
        })
        .unwrap_or(true)
}

fn main() {
    let args = Arguments::from_args();
    let cxx = host_kernels::host_cxx();
    let mut trials = kernel_compile::compile_trials(compile_set);
    for arch in ["gfx90a", "gfx1030"] {
        // f16/bf16 problems past the small-M bound go to the matrix cores on gfx90a (MFMA),
        // which the host cannot run; gfx1030 has no matrix atom, so they run there on the
        // CUDA-core kernel. The matrix-core kernel is checked on the GPU (tests/gpu.rs).
        for case in host_cases().into_iter().filter(|c| on_cuda_cores(c, arch)) {
            let name = format!("host::{arch}::{}", case.name());
            trials.push(needs(
                &cxx,
                "ROCMFORGE_REQUIRE_HOST_CXX",
                name,
                move |cxx| host_run(&cxx, &case, arch),
            ));
        }
    }
    trials.push(Trial::test("ptxas_log_parser", || {
        let clean = "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads";
        let spilled = "    40 bytes stack frame, 40 bytes spill stores, 36 bytes spill loads";
        let stack = "    16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads";
        match (
            kernel_compile::spills_or_stack(clean),
            kernel_compile::spills_or_stack(spilled),
            kernel_compile::spills_or_stack(stack),
        ) {
            (false, true, true) => Ok(()),
            got => Err(format!("parsed {got:?}, want (false, true, true)").into()),
        }
    }));
    let one = |dtype, m, n, k, nk| Case {
        dtype,
        batch: 1,
        m,
        n,
        k,
        nk,
        bias_silu: true,
    };
    trials.push(Trial::test("snapshot::gemm_small_m", move || {
        snapshot(
            "kernels__gemm_small_m__f16__sm_90",
            one(DType::F16, 3, 45, 40, true),
        )
    }));
    trials.push(Trial::test("snapshot::gemm_scalar", move || {
        snapshot(
            "kernels__gemm_scalar__f32__sm_90",
            one(DType::F32, 77, 45, 40, false),
        )
    }));
    libtest_mimic::run(&args, trials).exit();
}
