//! The offline AMD compiler (a system clang with the ROCm device libraries): every generated
//! kernel of every example graph, fused and unfused, and of the op zoo compiles for gfx90a,
//! gfx942, gfx1100 and gfx1201 with 0 spills, 0 scratch, LDS within the target's limit and the
//! target's wave size. The resource reports, with LLVM's occupancy, are snapshots. The MMA probe
//! kernel of every matrix atom of those targets compiles with the atom's instruction in the ISA
//! and no spills.
//!
//! Each kernel is compiled once per target (kernels are named by the hash of their body, so
//! a kernel shared by several graphs is one compile), many to a clang run. Without clang these tests are reported as
//! ignored, with the reason; `ROCMFORGE_REQUIRE_CLANG=1` (set by `.ci/run`) turns that into a
//! failure.

#[path = "common/attention_graphs.rs"]
mod attention_graphs;
#[path = "common/files.rs"]
mod files;
#[path = "common/gemm_cases.rs"]
mod gemm_cases;
#[path = "common/op_zoo.rs"]
mod op_zoo;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use libtest_mimic::{Arguments, Failed, Trial};
use rayon::prelude::*;
use rocmforge::arch::{compiler_options, Platform, Target};
use rocmforge::codegen::{generate_with, mma_probe_kernel, prelude, CodegenOptions};
use rocmforge::ir::{format, Graph};
use rocmforge::passes::PassManager;
use rocmforge::runtime::{
    occupancy_table, parse_code_object, AmdClang, AmdClangError, Hiprtc, KernelResources,
};

const TARGETS: [&str; 4] = ["gfx90a", "gfx942", "gfx1100", "gfx1201"];

type Row = (KernelResources, u32);
type Rows = Result<HashMap<String, Row>, String>;

/// Kernels per clang run: each run costs mostly the HIP headers and device libraries, so
/// batches make the whole set about twenty times cheaper than one kernel per run.
const BATCH: usize = 24;

/// One set of graphs as the suites compile it: the op zoo as built, each example graph after
/// the default pipeline (fused) or clean-up only (unfused).
struct GraphSet {
    name: String,
    graphs: Vec<Graph>,
}

fn graph_sets() -> Result<Vec<GraphSet>, String> {
    let mut sets = vec![GraphSet {
        name: "op_zoo".into(),
        graphs: op_zoo::zoo(),
    }];
    for path in files::graph_files() {
        for fused in [true, false] {
            let mut g = format::load(&path).map_err(|e| e.to_string())?;
            PassManager::pipeline(fused)
                .run(&mut g)
                .map_err(|e| e.to_string())?;
            sets.push(GraphSet {
                name: set_name(&path, fused),
                graphs: vec![g],
            });
        }
    }
    Ok(sets)
}

fn set_name(path: &Path, fused: bool) -> String {
    format!(
        "{}::{}",
        path.file_stem().unwrap().to_string_lossy(),
        if fused { "fused" } else { "unfused" }
    )
}

/// The distinct kernels of a set on `target` as (entry, body, node), sorted by entry.
fn kernels(set: &GraphSet, target: &Target) -> Result<Vec<(String, String, String)>, String> {
    let mut unique: HashMap<String, (String, String)> = HashMap::new();
    for g in &set.graphs {
        let plan = generate_with(g, target, &CodegenOptions::default())
            .map_err(|e| format!("{}: {e}", g.name))?;
        for k in plan.kernels {
            unique.entry(k.entry).or_insert((k.body, k.node));
        }
    }
    let mut v: Vec<_> = unique.into_iter().map(|(e, (b, n))| (e, b, n)).collect();
    v.sort();
    Ok(v)
}

/// Compiles every kernel of every set once per target, in batches, the first time a trial
/// asks for that target.
struct Compiler {
    clang: AmdClang,
    per_target: Mutex<HashMap<String, Arc<OnceLock<Rows>>>>,
}

impl Compiler {
    fn rows(&self, target: &Target) -> Rows {
        let cell = {
            let mut m = self.per_target.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(m.entry(target.arch.clone()).or_default())
        };
        cell.get_or_init(|| self.compile_everything(target)).clone()
    }

    fn compile_everything(&self, target: &Target) -> Rows {
        let mut all: HashMap<String, String> = HashMap::new();
        for set in graph_sets()? {
            for (entry, body, _) in kernels(&set, target)? {
                all.entry(entry).or_insert(body);
            }
        }
        let mut all: Vec<(String, String)> = all.into_iter().collect();
        all.sort();
        let prelude = prelude(target);
        let options = compiler_options(Platform::Amd);
        let batches: Vec<Result<Vec<(String, Row)>, String>> = all
            .par_chunks(BATCH)
            .map(|chunk| {
                let pairs: Vec<(&str, &str)> = chunk
                    .iter()
                    .map(|(e, b)| (e.as_str(), b.as_str()))
                    .collect();
                let rows = self
                    .clang
                    .compile_batch(&prelude, &pairs, target, &options)
                    .map_err(|e| e.to_string())?;
                Ok(chunk.iter().map(|(e, _)| e.clone()).zip(rows).collect())
            })
            .collect();
        let mut out = HashMap::new();
        let mut failures = Vec::new();
        for b in batches {
            match b {
                Ok(rows) => out.extend(rows),
                Err(e) => failures.push(e),
            }
        }
        if failures.is_empty() {
            Ok(out)
        } else {
            Err(failures.join("\n"))
        }
    }
}

/// The problems of one compiled kernel on `target`, if any.
fn problems(target: &Target, r: &KernelResources) -> Option<String> {
    problems_with(target, r, false)
}

/// [`problems`], SGPRs spilled into VGPR lanes (no memory traffic) not one where
/// `sgpr_spills_allowed`.
fn problems_with(
    target: &Target,
    r: &KernelResources,
    sgpr_spills_allowed: bool,
) -> Option<String> {
    let mut p = Vec::new();
    if r.vgpr_spills > 0 || (r.sgpr_spills > 0 && !sgpr_spills_allowed) {
        p.push(format!(
            "spills {} VGPRs, {} SGPRs",
            r.vgpr_spills, r.sgpr_spills
        ));
    }
    if r.scratch_bytes > 0 {
        p.push(format!("uses {} B of scratch", r.scratch_bytes));
    }
    if r.lds_bytes > u64::from(target.caps.static_shared_bytes) {
        p.push(format!(
            "uses {} B of LDS, over the {} B a workgroup has",
            r.lds_bytes, target.caps.static_shared_bytes
        ));
    }
    if r.wave_size != u64::from(target.wave_size) {
        p.push(format!(
            "runs wave{} instead of wave{}",
            r.wave_size, target.wave_size
        ));
    }
    (!p.is_empty()).then(|| format!("{} on {}: {}", r.name, target.arch, p.join(", ")))
}

/// The set's kernels compiled for `arch`: checked for spills, scratch, LDS and wave size, and
/// (for example graphs) their report compared with its snapshot.
fn check_set(c: &Compiler, set_name: &str, arch: &str) -> Result<(), Failed> {
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let sets = graph_sets()?;
    let set = sets
        .iter()
        .find(|s| s.name == set_name)
        .ok_or(format!("no graph set {set_name}"))?;
    let compiled = c.rows(&target)?;
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for (entry, _, node) in kernels(set, &target)? {
        let (r, occ) = compiled
            .get(&entry)
            .ok_or(format!("{entry} was not compiled"))?
            .clone();
        if let Some(p) = problems(&target, &r) {
            failures.push(format!("{p} (%{node})"));
        }
        rows.push((node, r, occ));
    }
    if !failures.is_empty() {
        return Err(failures.join("\n").into());
    }
    if set.name == "op_zoo" {
        return Ok(());
    }
    let (graph, mode) = set.name.split_once("::").expect("graph::mode");
    let table = occupancy_table(&rows);
    std::panic::catch_unwind(|| {
        files::snapshot_settings().bind(|| {
            insta::assert_snapshot!(format!("resources_clang__{graph}__{mode}__{arch}"), table)
        })
    })
    .map_err(|_| {
        Failed::from(format!(
            "resource report of {graph} ({mode}, {arch}) differs from its snapshot"
        ))
    })
}

/// The probe of every atom of `arch`: its instruction is in the ISA, and it does not spill.
fn mma_probes(c: &Compiler, arch: &str) -> Result<(), Failed> {
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    if target.caps.mma.is_empty() {
        return Err(format!("{arch} has no matrix atoms to probe").into());
    }
    for atom in target.caps.mma {
        let probe = mma_probe_kernel(&target, atom).map_err(|e| e.to_string())?;
        let asm = c
            .clang
            .assembly(
                &probe.source,
                &probe.entry,
                &target,
                &compiler_options(Platform::Amd),
            )
            .map_err(|e| e.to_string())?;
        if !atom.mnemonics.iter().any(|m| asm.contains(m)) {
            return Err(format!(
                "{} on {arch}: none of {:?} in the ISA",
                probe.entry, atom.mnemonics
            )
            .into());
        }
        let out = c
            .clang
            .compile(
                &probe.source,
                &probe.entry,
                &target,
                &compiler_options(Platform::Amd),
            )
            .map_err(|e| e.to_string())?;
        let info = parse_code_object(&out.code_object).map_err(|e| e.to_string())?;
        let r = info
            .kernels
            .iter()
            .find(|k| k.name == probe.entry)
            .ok_or(format!("{} not in its code object", probe.entry))?;
        if let Some(p) = problems(&target, r) {
            return Err(p.into());
        }
    }
    Ok(())
}

/// The matrix-core GEMM kernels of every Gemm case (f16 and bf16) on `arch`: no spills, no
/// scratch, LDS within the target's, its wave size; the atom's instruction in the ISA of each;
/// the resource report a snapshot.
fn gemm_mma(c: &Compiler, arch: &str) -> Result<(), Failed> {
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let options = compiler_options(Platform::Amd);
    let prelude = prelude(&target);
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for dt in [rocmforge::ir::DType::F16, rocmforge::ir::DType::BF16] {
        let atom = target
            .caps
            .mma
            .iter()
            .filter(|a| a.input == dt)
            .max_by_key(|a| a.m * a.n * a.k)
            .ok_or(format!("{arch} has no {dt} atom"))?;
        for (i, g) in gemm_cases::cases(dt, true).into_iter().enumerate() {
            let plan = rocmforge::codegen::generate(&g, &target).map_err(|e| e.to_string())?;
            let k = &plan.kernels[0];
            if k.family != "gemm_mma" {
                return Err(format!("{}: not on the matrix cores on {arch}", g.name).into());
            }
            // The ISA of the first case of each dtype (a disassembly costs a compile).
            if i == 0 {
                let source = format!("{prelude}\n{}", k.body);
                let asm = c
                    .clang
                    .assembly(&source, &k.entry, &target, &options)
                    .map_err(|e| e.to_string())?;
                if !atom.mnemonics.iter().any(|m| asm.contains(m)) {
                    return Err(
                        format!("{} on {arch}: none of {:?}", g.name, atom.mnemonics).into(),
                    );
                }
            }
            let mut r = c
                .clang
                .compile_batch(&prelude, &[(&k.entry, &k.body)], &target, &options)
                .map_err(|e| e.to_string())?;
            let (r, occ) = r.remove(0);
            if let Some(p) = problems(&target, &r) {
                failures.push(format!("{p} ({})", g.name));
            }
            rows.push((g.name.clone(), r, occ));
        }
    }
    if !failures.is_empty() {
        return Err(failures.join("\n").into());
    }
    let table = occupancy_table(&rows);
    std::panic::catch_unwind(|| {
        files::snapshot_settings()
            .bind(|| insta::assert_snapshot!(format!("resources_clang__gemm_mma__{arch}"), table))
    })
    .map_err(|_| Failed::from(format!("resource report of gemm_mma ({arch}) differs")))
}

/// The persistent kernel (`codegen::Persistent::On`) of the decode example graphs, fused, on
/// `arch`: it compiles, with no scratch, no VGPR spills, LDS within the target's and its wave
/// size; SGPRs spilled into VGPR lanes are printed, not refused (the one persistent kernel holds
/// every step's uniform values: docs/decisions.md, "The persistent decode kernel"). The
/// resource table is the snapshot.
fn persistent_decode(c: &Compiler, arch: &str) -> Result<(), Failed> {
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let options = compiler_options(Platform::Amd);
    let prelude = prelude(&target);
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for name in ["decode_step", "gqa_decode", "gqa_decode_f16"] {
        let path = files::graph_files()
            .into_iter()
            .find(|p| p.file_stem().is_some_and(|s| s == name))
            .ok_or(format!("no graph {name}"))?;
        let mut g = format::load(&path).map_err(|e| e.to_string())?;
        PassManager::pipeline(true)
            .run(&mut g)
            .map_err(|e| e.to_string())?;
        let codegen = CodegenOptions {
            persistent: rocmforge::codegen::Persistent::On,
            ..CodegenOptions::default()
        };
        let plan = generate_with(&g, &target, &codegen).map_err(|e| e.to_string())?;
        if plan.kernels.len() != 1 {
            return Err(format!("{name}: {} kernels", plan.kernels.len()).into());
        }
        let k = &plan.kernels[0];
        let mut r = c
            .clang
            .compile_batch(&prelude, &[(&k.entry, &k.body)], &target, &options)
            .map_err(|e| e.to_string())?;
        let (r, occ) = r.remove(0);
        if let Some(p) = problems_with(&target, &r, true) {
            failures.push(p);
        } else if r.sgpr_spills > 0 {
            eprintln!(
                "{name} on {arch}: the persistent kernel spills {} SGPRs into VGPR lanes",
                r.sgpr_spills
            );
        }
        rows.push((name.to_string(), r, occ));
    }
    if !failures.is_empty() {
        return Err(failures.join("\n").into());
    }
    let table = occupancy_table(&rows);
    std::panic::catch_unwind(|| {
        files::snapshot_settings().bind(|| {
            insta::assert_snapshot!(format!("resources_clang__persistent_decode__{arch}"), table)
        })
    })
    .map_err(|_| {
        Failed::from(format!(
            "resource report of persistent_decode ({arch}) differs"
        ))
    })
}

/// The matrix-core attention kernels (f16 and bf16; head sizes 64, 96, 128, 256; causal with an
/// offset, padding and boolean masks; GQA) on `arch`: no spills, no scratch, LDS within the
/// target's, its wave size, the atom's instruction in the ISA; which kernel each case gets (the
/// atom, or the scalar kernel where no configuration fits the registers) and its resources are
/// the snapshot.
fn attention_mma(c: &Compiler, arch: &str) -> Result<(), Failed> {
    use attention_graphs::{build, Mask, Spec};
    use rocmforge::ir::DType;
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let options = compiler_options(Platform::Amd);
    let prelude = prelude(&target);
    let mut cases = Vec::new();
    for d in [64, 96, 128, 256] {
        for (dtype, mask) in [(DType::F16, Mask::Causal), (DType::BF16, Mask::Padding)] {
            cases.push((d, dtype, mask));
        }
    }
    cases.push((64, DType::F16, Mask::BoolNegInf));
    let mut kernels = Vec::new();
    for (d, dtype, mask) in cases {
        let mut g = build(&Spec {
            hkv: 2,
            sk: 300,
            dtype,
            mask,
            cast_softmax: true,
            offset: 223,
            ..Spec::new(2, 6, 77, d)
        });
        PassManager::default_pipeline()
            .run(&mut g)
            .map_err(|e| e.to_string())?;
        let plan = rocmforge::codegen::generate(&g, &target).map_err(|e| e.to_string())?;
        let k = plan
            .kernels
            .into_iter()
            .find(|k| k.family == "flash_attention")
            .ok_or(format!("d {d} {dtype} {mask:?}: attention did not fuse"))?;
        let atom = target
            .caps
            .mma
            .iter()
            .find(|a| k.body.contains(&format!("{}_mma(", a.prefix())));
        if d == 64 && atom.is_none() {
            return Err(format!("d 64 {dtype} {mask:?} on {arch}: not on the matrix cores").into());
        }
        let what = format!(
            "d{d}_{dtype}_{mask:?} ({})",
            atom.map_or("scalar", |a| a.name)
        );
        kernels.push((what, atom, k));
    }
    // The ISA of the first kernel (a disassembly costs a compile).
    let (what, atom, k) = &kernels[0];
    let atom = atom.ok_or(format!("{what}: not on the matrix cores"))?;
    let asm = c
        .clang
        .assembly(
            &format!("{prelude}\n{}", k.body),
            &k.entry,
            &target,
            &options,
        )
        .map_err(|e| e.to_string())?;
    if !atom.mnemonics.iter().any(|m| asm.contains(m)) {
        return Err(format!("{what} on {arch}: none of {:?}", atom.mnemonics).into());
    }
    let pairs: Vec<(&str, &str)> = kernels
        .iter()
        .map(|(_, _, k)| (k.entry.as_str(), k.body.as_str()))
        .collect();
    let compiled = c
        .clang
        .compile_batch(&prelude, &pairs, &target, &options)
        .map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for ((what, _, _), (r, occ)) in kernels.into_iter().zip(compiled) {
        if let Some(p) = problems(&target, &r) {
            failures.push(format!("{p} ({what})"));
        }
        rows.push((what, r, occ));
    }
    if !failures.is_empty() {
        return Err(failures.join("\n").into());
    }
    let table = occupancy_table(&rows);
    std::panic::catch_unwind(|| {
        files::snapshot_settings().bind(|| {
            insta::assert_snapshot!(format!("resources_clang__attention_mma__{arch}"), table)
        })
    })
    .map_err(|_| Failed::from(format!("resource report of attention_mma ({arch}) differs")))
}

/// Bad input to the compiler is a typed error, not a crash: a target that is not AMD, and
/// source that does not compile (the log names the problem).
fn errors_are_typed(c: &Compiler) -> Result<(), Failed> {
    let nv = Target::parse("sm_90").map_err(|e| e.to_string())?;
    match c.clang.compile("", "k", &nv, &[]) {
        Err(AmdClangError::NotAmd { arch }) if arch == "sm_90" => {}
        other => return Err(format!("sm_90: {other:?}").into()),
    }
    let t = Target::parse("gfx942").map_err(|e| e.to_string())?;
    let bad = "extern \"C\" __global__ void k(float* x) { x[0] = undeclared; }";
    match c.clang.compile(bad, "k", &t, &[]) {
        Err(AmdClangError::Compile {
            kernel,
            target,
            log,
        }) if kernel == "k" && target == "gfx942" && log.contains("undeclared") => {}
        other => return Err(format!("bad source: {other:?}").into()),
    }
    Ok(())
}

/// `rocmforge compile --target gfx942 --report` compiles with clang where hiprtc cannot (ROCm
/// 5.2's aborted the process on gfx942), and forcing hiprtc there is an error, not a crash.
fn cli_report_for_a_target_hiprtc_lacks() -> Result<(), Failed> {
    let run = |extra: &[&str]| -> Result<(std::process::ExitStatus, String, String), Failed> {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_rocmforge"))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args([
                "compile",
                "graphs/attention.json",
                "--target",
                "gfx942",
                "--report",
            ])
            .args(extra)
            .output()
            .map_err(|e| e.to_string())?;
        Ok((
            out.status,
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    };
    let (status, stdout, stderr) = run(&[])?;
    if !status.success() || !stdout.contains("clang") || !stdout.contains(" occ ") {
        return Err(format!("auto: {status}\n{stdout}\n{stderr}").into());
    }
    if !stdout.lines().any(|l| l.starts_with("rf_flash_attention_")) {
        return Err(format!("no kernel rows:\n{stdout}").into());
    }
    let (status, stdout, stderr) = run(&["--compiler", "hiprtc"])?;
    if status.code() != Some(1) || !stderr.starts_with("error: ") {
        return Err(format!("forced hiprtc: {status}\n{stdout}\n{stderr}").into());
    }
    Ok(())
}

/// The prelude of a target hiprtc cannot compile for (the generated MFMA/WMMA fragment helpers
/// are in it), for review like the others; it needs no compiler.
fn prelude_snapshot(arch: &str) -> Result<(), Failed> {
    let t = Target::parse(arch).map_err(|e| e.to_string())?;
    let p = prelude(&t);
    if !t
        .caps
        .mma
        .iter()
        .all(|a| p.contains(&format!("{}_mma(", a.prefix())))
    {
        return Err(format!("{arch}: a matrix atom has no helpers in the prelude").into());
    }
    std::panic::catch_unwind(|| {
        files::snapshot_settings().bind(|| insta::assert_snapshot!(format!("prelude__{arch}"), p))
    })
    .map_err(|_| Failed::from(format!("the prelude of {arch} differs from its snapshot")))
}

#[path = "amd_offline/sweep.rs"]
mod sweep;
use sweep::{register_sweep, SWEEP_PLAN};

fn main() {
    let args = Arguments::from_args();
    let required = std::env::var("ROCMFORGE_REQUIRE_CLANG").is_ok_and(|v| v == "1");
    let compiler = AmdClang::probe().map(|clang| {
        Arc::new(Compiler {
            clang,
            per_target: Mutex::new(HashMap::new()),
        })
    });
    type Body = Box<dyn FnOnce(&Compiler) -> Result<(), Failed> + Send>;
    let trial = |name: String, body: Body| -> Trial {
        match &compiler {
            Ok(c) => {
                let c = Arc::clone(c);
                Trial::test(name, move || body(&c))
            }
            Err(e) if required => {
                let msg = format!("ROCMFORGE_REQUIRE_CLANG=1 but {e}");
                Trial::test(name, move || Err(msg.clone().into()))
            }
            Err(e) => Trial::test(name, || Ok(()))
                .with_ignored_flag(true)
                .with_kind(format!("ignored: {e}")),
        }
    };
    let mut trials = vec![
        trial(
            "offline::errors_are_typed".into(),
            Box::new(errors_are_typed),
        ),
        trial(
            "offline::cli_report_for_a_target_hiprtc_lacks".into(),
            Box::new(|_| cli_report_for_a_target_hiprtc_lacks()),
        ),
    ];
    for arch in ["gfx942", "gfx1100", "gfx1201"] {
        trials.push(Trial::test(format!("prelude::{arch}"), move || {
            prelude_snapshot(arch)
        }));
    }
    for (family, arches) in SWEEP_PLAN {
        for &arch in arches {
            trials.push(trial(
                format!("offline::{arch}::attention_register_sweep::{family:?}").to_lowercase(),
                Box::new(move |c| register_sweep(c, arch, family)),
            ));
        }
    }
    for arch in TARGETS {
        trials.push(trial(
            format!("offline::{arch}::mma_probes"),
            Box::new(move |c| mma_probes(c, arch)),
        ));
        trials.push(trial(
            format!("offline::{arch}::gemm_mma"),
            Box::new(move |c| gemm_mma(c, arch)),
        ));
        trials.push(trial(
            format!("offline::{arch}::attention_mma"),
            Box::new(move |c| attention_mma(c, arch)),
        ));
        trials.push(trial(
            format!("offline::{arch}::persistent_decode"),
            Box::new(move |c| persistent_decode(c, arch)),
        ));
        trials.push(trial(
            format!("offline::{arch}::every_op_and_dtype"),
            Box::new(move |c| check_set(c, "op_zoo", arch)),
        ));
        for path in files::graph_files() {
            for fused in [true, false] {
                let set = set_name(&path, fused);
                trials.push(trial(
                    format!("offline::{arch}::{set}"),
                    Box::new(move |c| check_set(c, &set, arch)),
                ));
            }
        }
    }
    libtest_mimic::run(&args, trials).exit();
}
