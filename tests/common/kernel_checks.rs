//! Generated kernels checked without a GPU: results against the interpreter at the design's
//! tolerances, and compiled, with their resources checked: hiprtc and the offline
//! clang for AMD targets (no spills, no scratch, the target's wave size), NVRTC + ptxas for
//! sm_90 (no spill stores or loads, no stack frame). Shared by the kernel families' test targets.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use libtest_mimic::Failed;
use rocmforge::codegen::{prelude, Target};
use rocmforge::ir::{DType, Tensor};
use rocmforge::runtime::{parse_code_object, AmdClang, Hiprtc, KernelResources};

/// The design's tolerances: relative L2 error against the interpreter.
pub fn tolerance(dt: DType) -> f64 {
    match dt {
        DType::F16 => 2e-3,
        DType::BF16 => 1e-2,
        _ => 1e-5,
    }
}

/// Relative L2 error of `got` against `want`; any NaN (the poison, an unwritten element) fails.
pub fn rel_l2(got: &Tensor, want: &Tensor, what: &str) -> Result<f64, Failed> {
    if got.ty() != want.ty() {
        return Err(format!("{what}: {} vs {}", got.ty(), want.ty()).into());
    }
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let (mut num, mut den) = (0.0, 0.0);
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        if !a.is_finite() || !b.is_finite() {
            return Err(format!("{what}: element {i} is {a}, want {b}").into());
        }
        num += (a - b).powi(2);
        den += b * b;
    }
    Ok(if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    })
}

/// Unique kernels of one target: entry → (full source, body, the case that generated it).
pub type KernelSet = BTreeMap<String, (String, String, String)>;

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

fn verdict(failures: Vec<String>) -> Result<(), Failed> {
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n").into())
    }
}

/// Every kernel of `set` through hiprtc for `arch`.
pub fn compile_hiprtc(rtc: &Hiprtc, arch: &str, set: &KernelSet) -> Result<(), Failed> {
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let mut failures = Vec::new();
    for (entry, (src, _, case)) in set {
        let code = rtc
            .compile(src, entry, arch, &["-O3".to_string()])
            .map_err(|e| format!("{case}: {e}"))?;
        let info = parse_code_object(&code).map_err(|e| format!("{case}: {e}"))?;
        let r = info
            .kernels
            .iter()
            .find(|k| &k.name == entry)
            .ok_or(format!("{case}: {entry} not in its code object"))?;
        failures.extend(amd_problems(&target, r, case));
    }
    verdict(failures)
}

/// Every kernel of `set` through the offline clang for `arch`, in one batch.
pub fn compile_offline(clang: &AmdClang, arch: &str, set: &KernelSet) -> Result<(), Failed> {
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let pairs: Vec<(&str, &str)> = set
        .iter()
        .map(|(e, (_, body, _))| (e.as_str(), body.as_str()))
        .collect();
    let rows = clang
        .compile_batch(&prelude(&target), &pairs, &target, &["-O3".to_string()])
        .map_err(|e| e.to_string())?;
    verdict(
        rows.iter()
            .zip(set.values())
            .filter_map(|((r, _), (_, _, case))| amd_problems(&target, r, case))
            .collect(),
    )
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

/// Every kernel of `set` (generated for sm_90) through NVRTC and `ptxas -v`: no spill stores
/// or loads and no stack frame.
pub fn compile_nvrtc(ptxas: &Path, set: &KernelSet) -> Result<(), Failed> {
    let arch = "sm_90";
    let dir = std::env::temp_dir().join(format!(
        "rocmforge-ptx-{}-{}",
        std::process::id(),
        set.keys().next().map_or("empty", String::as_str)
    ));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let mut failures = Vec::new();
    for (entry, (src, _, case)) in set {
        let opts = cudarc::nvrtc::CompileOptions {
            arch: Some("sm_90"),
            ..Default::default()
        };
        // cudarc panics where it cannot load libnvrtc: that is a failure of this trial.
        let ptx = std::panic::catch_unwind(|| cudarc::nvrtc::compile_ptx_with_opts(src, opts))
            .map_err(|_| "libnvrtc could not be loaded (LD_LIBRARY_PATH)".to_string())?
            .map_err(|e| format!("{case}: NVRTC: {e}"))?;
        let file = dir.join(format!("{entry}.ptx"));
        std::fs::write(&file, ptx.to_src()).map_err(|e| e.to_string())?;
        let out = Command::new(ptxas)
            .args(["-v", "-arch=sm_90", "-o", "/dev/null"])
            .arg(&file)
            .output()
            .map_err(|e| e.to_string())?;
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        if !out.status.success() {
            failures.push(format!("{case}: ptxas failed:\n{log}"));
            continue;
        }
        if spills_or_stack(&log) {
            failures.push(format!("{case} spills on {arch}:\n{log}"));
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    verdict(failures)
}
