//! Compiles sets of generated kernels for AMD (hiprtc, the offline clang) and NVIDIA (NVRTC,
//! then `ptxas -v`) and reports what a kernel must not have: spills, scratch or a stack frame,
//! another wave size than the target's.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use std::sync::Arc;

use libtest_mimic::{Failed, Trial};
use rayon::prelude::*;
use rocmforge::arch::Target;
use rocmforge::compile::report::{resource_report, ReportKernel};
use rocmforge::runtime::{AmdClang, AmdCompiler, Hiprtc, KernelResources};

/// Kernels to compile: entry → (full source, body, the case it came from).
pub type KernelSet = BTreeMap<String, (String, String, String)>;

fn unique() -> usize {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// What is wrong with a compiled AMD kernel, if anything.
pub fn amd_problems(target: &Target, r: &KernelResources, case: &str) -> Option<String> {
    let mut p = Vec::new();
    if r.spills() {
        p.push(format!("spills ({r:?})"));
    }
    if r.scratch_bytes > 0 {
        p.push(format!("{} B of scratch", r.scratch_bytes));
    }
    if r.wave_size != u64::from(target.wave_size) {
        p.push(format!("wave{}", r.wave_size));
    }
    (!p.is_empty()).then(|| format!("{case} on {}: {}", target.arch, p.join(", ")))
}

/// Every kernel of `set` through `compiler` for `arch` (the library's resource report, as
/// `rocmforge compile --report` reads it): no spills, no scratch, the target's wave size.
pub fn amd(compiler: &AmdCompiler, arch: &str, set: &KernelSet) -> Result<(), Failed> {
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let kernels: Vec<ReportKernel> = set
        .iter()
        .map(|(entry, (source, body, case))| ReportKernel {
            entry,
            source,
            body,
            label: case,
        })
        .collect();
    let report =
        resource_report(&kernels, &target, compiler, &|_| {}).map_err(|e| e.to_string())?;
    let failures: Vec<String> = report
        .rows
        .iter()
        .filter_map(|row| amd_problems(&target, &row.resources, &row.label))
        .collect();
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n").into())
    }
}

/// ptxas: `ROCMFORGE_PTXAS`, else the one on the `PATH`.
pub fn ptxas() -> Result<PathBuf, String> {
    let p = std::env::var("ROCMFORGE_PTXAS").unwrap_or_else(|_| "ptxas".into());
    match Command::new(&p).arg("--version").output() {
        Ok(o) if o.status.success() => Ok(PathBuf::from(p)),
        _ => Err(format!("no ptxas ({p}); set ROCMFORGE_PTXAS")),
    }
}

/// Whether a `ptxas -v` log reports spill stores or loads, or a stack frame: the clauses of
/// `N bytes stack frame, N bytes spill stores, N bytes spill loads`, each with its own count.
pub fn spills_or_stack(log: &str) -> bool {
    log.lines()
        .flat_map(|l| l.split(','))
        .filter(|clause| {
            ["stack frame", "spill stores", "spill loads"]
                .iter()
                .any(|w| clause.contains(w))
        })
        .any(|clause| {
            let count = clause
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<u64>().ok());
            count != Some(0)
        })
}

/// Every kernel of `set` through NVRTC (PTX for `arch`) and `ptxas -v`: no spill stores or
/// loads and no stack frame. The kernels compile in parallel (rayon), as the AMD reports do.
/// With `ROCMFORGE_PTX_DIR` set, each kernel's PTX, cubin and `ptxas -v` log are kept there
/// (`<arch>/<entry>.{ptx,cubin,log}`, the case named in the log) for reading its registers and
/// instructions (nvdisasm); else they go to a temporary folder, removed after.
pub fn nvrtc(ptxas: &Path, arch: &'static str, set: &KernelSet) -> Result<(), Failed> {
    let keep = std::env::var_os("ROCMFORGE_PTX_DIR").map(|d| PathBuf::from(d).join(arch));
    let dir = keep.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("rocmforge-ptx-{}-{}", std::process::id(), unique()))
    });
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let kernels: Vec<_> = set.iter().collect();
    let results: Vec<Result<Option<String>, String>> = kernels
        .par_iter()
        .map(|(entry, (src, _, case))| {
            let opts = cudarc::nvrtc::CompileOptions {
                arch: Some(arch),
                ..Default::default()
            };
            // cudarc panics where it cannot load libnvrtc: that is a failure of this trial.
            let ptx = std::panic::catch_unwind(|| cudarc::nvrtc::compile_ptx_with_opts(src, opts))
                .map_err(|_| "libnvrtc could not be loaded (LD_LIBRARY_PATH)".to_string())?
                .map_err(|e| format!("{case}: NVRTC: {e}"))?;
            let file = dir.join(format!("{entry}.ptx"));
            std::fs::write(&file, ptx.to_src()).map_err(|e| e.to_string())?;
            let cubin = if keep.is_some() {
                dir.join(format!("{entry}.cubin"))
            } else {
                PathBuf::from("/dev/null")
            };
            let out = Command::new(ptxas)
                .args(["-v", &format!("-arch={arch}"), "-o"])
                .arg(&cubin)
                .arg(&file)
                .output()
                .map_err(|e| e.to_string())?;
            let log = String::from_utf8_lossy(&out.stderr).into_owned();
            if keep.is_some() {
                std::fs::write(
                    dir.join(format!("{entry}.log")),
                    format!("// {case}\n{log}"),
                )
                .map_err(|e| e.to_string())?;
            }
            Ok(if !out.status.success() {
                Some(format!("{case}: ptxas failed:\n{log}"))
            } else if spills_or_stack(&log) {
                Some(format!("{case} spills on {arch}:\n{log}"))
            } else if log.contains("wgmma.mma_async instructions are serialized") {
                // ptxas waits for every wgmma where it cannot prove the accumulators untouched
                // while in flight: correct, but the overlap the kernel was written for is gone.
                Some(format!(
                    "{case}: ptxas serialized the wgmma on {arch}:\n{log}"
                ))
            } else if log.contains("C7508") {
                // setmaxnreg that ptxas could not apply (the warpgroup GEMM's register split).
                Some(format!(
                    "{case}: ptxas ignored setmaxnreg on {arch}:\n{log}"
                ))
            } else {
                None
            })
        })
        .collect();
    if keep.is_none() {
        std::fs::remove_dir_all(&dir).ok();
    }
    let mut failures = Vec::new();
    for r in results {
        if let Some(f) = r? {
            failures.push(f);
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n").into())
    }
}

/// The compile trials of a kernel family's test target: the kernels `set` gives for each target,
/// through hiprtc (gfx90a, gfx1030), the offline clang (gfx942, gfx1100, gfx1201) and NVRTC +
/// ptxas (sm_90, sm_90a), each ignored (or failed, when its `ROCMFORGE_REQUIRE_*` is 1) without its tool.
pub fn compile_trials(set: fn(&str) -> Result<KernelSet, Failed>) -> Vec<Trial> {
    let rtc = Hiprtc::load().map(|r| Arc::new(AmdCompiler::Hiprtc(r)));
    let clang = AmdClang::probe().map(|c| Arc::new(AmdCompiler::Clang(c)));
    let mut trials = Vec::new();
    for arch in ["gfx90a", "gfx1030"] {
        trials.push(super::needs::needs(
            &rtc,
            "ROCMFORGE_REQUIRE_HIPRTC",
            format!("compile::hiprtc::{arch}"),
            move |rtc| amd(&rtc, arch, &set(arch)?),
        ));
    }
    for arch in ["gfx942", "gfx1100", "gfx1201"] {
        trials.push(super::needs::needs(
            &clang,
            "ROCMFORGE_REQUIRE_CLANG",
            format!("compile::offline::{arch}"),
            move |clang| amd(&clang, arch, &set(arch)?),
        ));
    }
    // sm_90a: the arch-specific Hopper row (what an H100 compiles for), whose plans may hold
    // wgmma kernels the portable sm_90 never gets. sm_90 compiles the kernels whose bodies
    // differ from sm_90a's (the mma.sync GEMMs where sm_90a has warpgroup ones, ...): a body
    // both plans share calls the same prelude functions and compiles to the same PTX, which
    // sm_90a's trial puts through ptxas already.
    trials.push(super::needs::needs(
        &ptxas(),
        "ROCMFORGE_REQUIRE_PTXAS",
        "compile::nvrtc::sm_90".to_string(),
        move |p| nvrtc(&p, "sm_90", &differing(set("sm_90")?, &set("sm_90a")?)),
    ));
    trials.push(super::needs::needs(
        &ptxas(),
        "ROCMFORGE_REQUIRE_PTXAS",
        "compile::nvrtc::sm_90a".to_string(),
        move |p| nvrtc(&p, "sm_90a", &set("sm_90a")?),
    ));
    trials
}

/// The TF32 kernels of `set(arch)` (f32 matmuls compiled with `F32Matmul::Tf32`) for the
/// targets that have a TF32 atom: NVRTC + `ptxas -v` for sm_80 and sm_90 (mma.sync m16n8k8
/// .tf32), the offline clang for gfx942 (the xf32 MFMA); no spills, no scratch or stack.
pub fn tf32_trials(set: fn(&str) -> Result<KernelSet, Failed>) -> Vec<Trial> {
    let clang = AmdClang::probe().map(|c| Arc::new(AmdCompiler::Clang(c)));
    let mut trials = Vec::new();
    for arch in ["sm_80", "sm_90"] {
        trials.push(super::needs::needs(
            &ptxas(),
            "ROCMFORGE_REQUIRE_PTXAS",
            format!("compile::nvrtc::{arch}::tf32"),
            move |p| nvrtc(&p, arch, &set(arch)?),
        ));
    }
    trials.push(super::needs::needs(
        &clang,
        "ROCMFORGE_REQUIRE_CLANG",
        "compile::offline::gfx942::tf32".to_string(),
        move |clang| amd(&clang, "gfx942", &set("gfx942")?),
    ));
    trials
}

/// The kernels of `set` whose bodies `other` does not hold.
pub fn differing(mut set: KernelSet, other: &KernelSet) -> KernelSet {
    let bodies: std::collections::HashSet<&str> =
        other.values().map(|(_, body, _)| body.as_str()).collect();
    set.retain(|_, (_, body, _)| !bodies.contains(body.as_str()));
    set
}
