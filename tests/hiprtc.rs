//! Every generated kernel of every example graph, fused and unfused, compiles with a real AMD
//! compiler (hiprtc) for gfx90a and gfx1030, and none spills. The resource reports are
//! snapshots. So do the kernels of graphs at the edges: zero-size dimensions, hostile names
//! (whose kernels must be the plain graph's), edge values, extreme causal offsets, gathers.
//! The metadata reader is tested on a real code object and on truncated and corrupt ones.
//!
//! `host::` trials run the generated pointwise kernels on the CPU (compiled by the host's
//! clang++, see `common/host_kernels.rs`) against the interpreter and hand-computed values.
//!
//! Without hiprtc (or a host clang++) these tests are reported as ignored, with the reason.
//! `ROCMFORGE_REQUIRE_HIPRTC=1` (set by `.ci/run`) turns a missing hiprtc into a failure, so CI
//! always compiles them; `ROCMFORGE_REQUIRE_HOST_CXX=1` does the same for the host runs.

#[path = "common/files.rs"]
mod files;
#[path = "common/needs.rs"]
mod needs;

use needs::needs;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use libtest_mimic::{Arguments, Failed, Trial};
use rocmforge::arch::{compiler_options, Platform, Target};
use rocmforge::codegen::{generate_with, mma_probe_kernel, CodegenOptions};
use rocmforge::compile::report::{resource_report, ReportKernel};
use rocmforge::interp::{self, Bindings};
use rocmforge::ir::{format, Graph};
use rocmforge::passes::PassManager;
use rocmforge::runtime::{parse_code_object, report_table, AmdCompiler, Hiprtc, MetadataError};

#[path = "common/edge_cases.rs"]
mod edge_cases;
#[path = "common/gemm_cases.rs"]
mod gemm_cases;
#[path = "common/host_kernels.rs"]
mod host_kernels;
#[path = "common/op_zoo.rs"]
mod op_zoo;

const AMD_TARGETS: [&str; 2] = ["gfx90a", "gfx1030"];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// hiprtc as the library's resource report takes it (loaded once per test process; a second
/// handle on the library the trials' `Hiprtc` already opened).
fn report_compiler() -> Result<&'static AmdCompiler, Failed> {
    use std::sync::OnceLock;
    static RTC: OnceLock<Result<AmdCompiler, String>> = OnceLock::new();
    RTC.get_or_init(|| {
        Hiprtc::load()
            .map(AmdCompiler::Hiprtc)
            .map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| Failed::from(e.clone()))
}

/// Compiles every kernel of every graph for one target (unique entries once) the way
/// `rocmforge compile --report` does: bodies in batches of one program each behind one prelude
/// (a program's cost is mostly hiprtc's headers and device libraries: ROCm 5.2 takes seconds
/// for each), a batch that fails compiled kernel by kernel so the error names the kernel.
/// Returns (node, resources) per kernel, or the spills and failures.
fn compile_all(
    _rtc: &Hiprtc,
    graphs: &[rocmforge::ir::Graph],
    arch: &str,
) -> Result<Vec<(String, rocmforge::runtime::KernelResources)>, Failed> {
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let mut unique: HashMap<String, (String, String, String)> = HashMap::new();
    for g in graphs {
        let plan = generate_with(g, &target, &CodegenOptions::default())
            .map_err(|e| format!("{}: {e}", g.name))?;
        for k in &plan.kernels {
            unique
                .entry(k.entry.clone())
                .or_insert_with(|| (plan.source(k), k.body.clone(), k.node.clone()));
        }
    }
    let mut entries: Vec<_> = unique.into_iter().collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let kernels: Vec<ReportKernel> = entries
        .iter()
        .map(|(entry, (source, body, _))| ReportKernel {
            entry,
            source,
            body,
            label: entry,
        })
        .collect();
    let report = resource_report(&kernels, &target, report_compiler()?, &|_| {})
        .map_err(|e| e.to_string())?;
    let node: HashMap<&str, &str> = entries
        .iter()
        .map(|(entry, (_, _, node))| (entry.as_str(), node.as_str()))
        .collect();
    let compiled: Vec<Result<(String, rocmforge::runtime::KernelResources), String>> = report
        .rows
        .into_iter()
        .map(|row| {
            let n = node
                .get(row.label.as_str())
                .ok_or(format!("{} not a kernel of the graphs", row.label))?;
            Ok((n.to_string(), row.resources))
        })
        .collect();
    let rows = compiled.into_iter().collect::<Result<Vec<_>, _>>()?;
    let spilling: Vec<String> = rows
        .iter()
        .filter(|(_, r)| r.spills())
        .map(|(n, r)| format!("{} (%{n}): {r:?}", r.name))
        .collect();
    if !spilling.is_empty() {
        return Err(format!("kernels spill on {arch}:\n{}", spilling.join("\n")).into());
    }
    let wave = target.wave_size as u64;
    if let Some((_, bad)) = rows.iter().find(|(_, r)| r.wave_size != wave) {
        return Err(format!("{} reports wave {} on {arch}", bad.name, bad.wave_size).into());
    }
    Ok(rows)
}

fn compile_graph(rtc: &Hiprtc, path: &Path, fused: bool, arch: &str) -> Result<(), Failed> {
    let mut g = format::load(path).map_err(|e| e.to_string())?;
    PassManager::pipeline(fused)
        .run(&mut g)
        .map_err(|e| e.to_string())?;
    let rows = compile_all(rtc, &[g], arch)?;
    let name = path.file_stem().unwrap().to_string_lossy().into_owned();
    let mode = if fused { "fused" } else { "unfused" };
    let table = report_table(&rows);
    let result = std::panic::catch_unwind(|| {
        files::snapshot_settings()
            .bind(|| insta::assert_snapshot!(format!("resources__{name}__{mode}__{arch}"), table))
    });
    result.map_err(|_| {
        Failed::from(format!(
            "resource report of {name} ({mode}, {arch}) differs from its snapshot"
        ))
    })
}

/// The MMA probe kernel of every matrix atom of `arch` (the fragment helpers generated into its
/// prelude) compiles with hiprtc without spilling.
fn mma_probes(rtc: &Hiprtc, arch: &str) -> Result<(), Failed> {
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    for atom in target.caps.mma {
        let probe = mma_probe_kernel(&target, atom).map_err(|e| e.to_string())?;
        let code = rtc
            .compile(
                &probe.source,
                &probe.entry,
                arch,
                &compiler_options(Platform::Amd),
            )
            .map_err(|e| e.to_string())?;
        let info = parse_code_object(&code).map_err(|e| e.to_string())?;
        match info.kernels.iter().find(|k| k.name == probe.entry) {
            Some(k) if !k.spills() => {}
            Some(k) => return Err(format!("{} spills on {arch}: {k:?}", probe.entry).into()),
            None => return Err(format!("{} not in its code object", probe.entry).into()),
        }
    }
    Ok(())
}

fn metadata_reader_on_real_and_corrupt_input() -> Result<(), Failed> {
    let bytes = std::fs::read(root().join("tests/data/code_objects/add_gfx90a.co"))
        .map_err(|e| e.to_string())?;
    let info = parse_code_object(&bytes).map_err(|e| e.to_string())?;
    if !info.target.ends_with("gfx90a")
        || info.kernels.len() != 1
        || info.kernels[0].name != "add"
        || info.kernels[0].wave_size != 64
    {
        return Err(format!("unexpected metadata: {info:?}").into());
    }
    if info.kernels[0].vgprs == 0 || info.kernels[0].sgprs == 0 || info.kernels[0].lds_bytes != 1024
    {
        return Err(format!("implausible resources: {:?}", info.kernels[0]).into());
    }
    // Every truncation gives a typed error, or (when it only cuts bytes the reader never needs)
    // the same metadata; corruptions give an error or some parse, never a panic.
    for cut in (0..bytes.len()).step_by(7) {
        match parse_code_object(&bytes[..cut]) {
            Err(_) => {}
            Ok(same) if same == info => {}
            Ok(other) => {
                return Err(
                    format!("truncated to {cut} bytes, the metadata changed: {other:?}").into(),
                )
            }
        }
    }
    if parse_code_object(&bytes[..bytes.len() / 2]).is_ok() {
        return Err("a code object cut in half parsed".into());
    }
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..2000 {
        let mut b = bytes.clone();
        for _ in 0..4 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let i = (state % b.len() as u64) as usize;
            b[i] = (state >> 32) as u8;
        }
        let _ = parse_code_object(&b);
    }
    if parse_code_object(b"not an elf") != Err(MetadataError::NotElf) {
        return Err("plain text is not reported as NotElf".into());
    }
    Ok(())
}

/// The graphs at the edges whose kernels must compile: zero-size dimensions, edge values,
/// extreme offsets, gathers (fused and clean-up only).
fn edge_graphs() -> Vec<Graph> {
    let mut graphs = edge_cases::empty_graphs();
    graphs.extend(
        edge_cases::empty_axis_reductions()
            .into_iter()
            .map(|(g, _)| g),
    );
    graphs.extend(edge_cases::elementwise_edges().into_iter().map(|c| c.graph));
    graphs.extend(edge_cases::fused_edges().into_iter().map(|c| c.graph));
    graphs.push(edge_cases::causal_masks(5, 7).0);
    for off in edge_cases::extreme_offsets(5, 7) {
        for dt in [rocmforge::ir::DType::F32, rocmforge::ir::DType::F16] {
            graphs.push(edge_cases::causal_attention(dt, 5, 7, 32, off));
        }
    }
    graphs.extend(
        edge_cases::gathers_out_of_range()
            .into_iter()
            .map(|c| c.graph),
    );
    let mut out = Vec::new();
    for g in graphs {
        let mut f = g.clone();
        PassManager::default_pipeline().run(&mut f).unwrap();
        out.push(f);
        let mut u = g;
        PassManager::cleanup().run(&mut u).unwrap();
        out.push(u);
    }
    out
}

/// Hostile names change no kernel: every zoo graph renamed compiles to the entries of the
/// plain graph (and the sources compile).
fn hostile_names_compile_to_the_plain_kernels(rtc: &Hiprtc, arch: &str) -> Result<(), Failed> {
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let plain = op_zoo::zoo();
    let hostile: Vec<Graph> = plain.iter().map(op_zoo::with_hostile_names).collect();
    for (p, h) in plain.iter().zip(&hostile) {
        let entries = |g: &Graph| -> Result<Vec<String>, Failed> {
            let plan = rocmforge::codegen::generate(g, &target).map_err(|e| e.to_string())?;
            Ok(plan.kernels.iter().map(|k| k.entry.clone()).collect())
        };
        if entries(p)? != entries(h)? {
            return Err(format!("{}: hostile names changed the kernels", p.name).into());
        }
    }
    compile_all(rtc, &hostile, arch).map(|_| ())
}

/// The plan of `g` (fused or not) for the host runs.
fn host_plan(g: &Graph, fused: bool) -> Result<(Graph, rocmforge::codegen::KernelPlan), Failed> {
    let mut c = g.clone();
    PassManager::pipeline(fused)
        .run(&mut c)
        .map_err(|e| e.to_string())?;
    let plan = generate_with(
        &c,
        &Target::parse("gfx90a").map_err(|e| e.to_string())?,
        &CodegenOptions::default(),
    )
    .map_err(|e| e.to_string())?;
    Ok((c, plan))
}

/// Runs `g` on the host (fused and not) and compares every output with the interpreter's on
/// the same data, within `ulps` (float results of libm functions may differ in the last bit).
fn host_matches_interpreter(cxx: &Path, g: &Graph, b: &Bindings, ulps: f64) -> Result<(), Failed> {
    let b = host_kernels::with_weights(g, b.clone());
    let want = interp::run(g, &b).map_err(|e| format!("{}: interpreter: {e}", g.name))?;
    for fused in [true, false] {
        let (c, plan) = host_plan(g, fused)?;
        let got = host_kernels::run_plan(cxx, &c, &plan, &b)?
            .map_err(|e| format!("{}: host run failed: {e}", g.name))?;
        for ((o, gt), wt) in g.outputs().iter().zip(&got).zip(&want) {
            let what = format!("{} %{} (fused: {fused})", g.name, g.node(*o).name);
            edge_cases::compare(gt, wt, ulps, &what)?;
        }
    }
    Ok(())
}

fn host_op_zoo(cxx: &Path) -> Result<(), Failed> {
    let mut ran = 0;
    for g in op_zoo::zoo() {
        let (_, plan) = host_plan(&g, false)?;
        if host_kernels::is_pointwise(&plan) {
            host_matches_interpreter(cxx, &g, &Bindings::random(&g, 7), 4.0)?;
            ran += 1;
        }
    }
    // Elementwise, layout and integer graphs, in three and two dtypes.
    if ran != 8 {
        return Err(format!("{ran} zoo graphs are pointwise, expected 8").into());
    }
    Ok(())
}

fn host_edge_values(cxx: &Path) -> Result<(), Failed> {
    let cases = edge_cases::elementwise_edges()
        .into_iter()
        .chain(edge_cases::fused_edges());
    for c in cases {
        host_matches_interpreter(cxx, &c.graph, &c.bindings, 4.0)?;
    }
    Ok(())
}

fn host_empty_graphs(cxx: &Path) -> Result<(), Failed> {
    let mut ran = 0;
    // Attention has no pointwise kernel; its empty cases run in the GPU trials.
    let graphs = edge_cases::empty_graphs()
        .into_iter()
        .filter(|g| !g.name.starts_with("empty_attention"));
    for g in graphs {
        let (_, plan) = host_plan(&g, false)?;
        let (_, fused) = host_plan(&g, true)?;
        if host_kernels::is_pointwise(&plan) && host_kernels::is_pointwise(&fused) {
            host_matches_interpreter(cxx, &g, &Bindings::random(&g, 3), 4.0)?;
            ran += 1;
        }
    }
    if ran < 4 {
        return Err(format!("only {ran} empty graphs are pointwise").into());
    }
    Ok(())
}

/// Sum 0, max -inf, mean NaN: checked against those values, not the interpreter.
fn host_empty_axis_reductions(cxx: &Path) -> Result<(), Failed> {
    for (g, want) in edge_cases::empty_axis_reductions() {
        for fused in [true, false] {
            let (c, plan) = host_plan(&g, fused)?;
            let got = host_kernels::run_plan(cxx, &c, &plan, &Bindings::random(&g, 1))?
                .map_err(|e| e.to_string())?;
            for (i, (t, w)) in got.iter().zip(&want).enumerate() {
                edge_cases::compare_values(t, w, &format!("{} output {i}", g.name))?;
            }
        }
    }
    Ok(())
}

/// Causal masks with offsets at the i64 limits against the definition computed in i128.
fn host_causal_offsets(cxx: &Path) -> Result<(), Failed> {
    let (g, want) = edge_cases::causal_masks(5, 7);
    let (c, plan) = host_plan(&g, true)?;
    let got =
        host_kernels::run_plan(cxx, &c, &plan, &Bindings::default())?.map_err(|e| e.to_string())?;
    for ((t, w), off) in got.iter().zip(&want).zip(edge_cases::extreme_offsets(5, 7)) {
        edge_cases::compare_values(t, w, &format!("causal mask, offset {off}"))?;
    }
    Ok(())
}

/// A gather with an index out of range fails with the interpreter's error (the same node,
/// the first failing index, the table size); in range, it gives the interpreter's rows.
fn host_gathers(cxx: &Path) -> Result<(), Failed> {
    let mut cases = edge_cases::gathers_out_of_range();
    cases.push(edge_cases::gather_case(
        rocmforge::ir::DType::I32,
        &[4, 0, 3, 3],
        5,
        3,
    ));
    for c in cases {
        let b = host_kernels::with_weights(&c.graph, c.bindings.clone());
        let want = interp::run(&c.graph, &b);
        for fused in [true, false] {
            let (g, plan) = host_plan(&c.graph, fused)?;
            let got = host_kernels::run_plan(cxx, &g, &plan, &b)?;
            match (&got, &want) {
                (Err(e), Err(w)) if e == w => {}
                (Ok(got), Ok(want)) => {
                    for (t, w) in got.iter().zip(want) {
                        edge_cases::compare(t, w, 0.0, &c.graph.name)?;
                    }
                }
                _ => {
                    return Err(format!(
                        "{} (fused: {fused}): the kernels gave {:?}, the interpreter {:?}",
                        c.graph.name,
                        got.as_ref().err(),
                        want.as_ref().err()
                    )
                    .into())
                }
            }
        }
    }
    Ok(())
}

/// The matrix-core GEMM kernels of every Gemm case (f16 and bf16) compile for `arch` with no
/// spills, no scratch and LDS within the target's; their resource report is a snapshot.
fn gemm_mma(rtc: &Hiprtc, arch: &str) -> Result<(), Failed> {
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let graphs: Vec<Graph> = [rocmforge::ir::DType::F16, rocmforge::ir::DType::BF16]
        .into_iter()
        .flat_map(|dt| gemm_cases::cases(dt, true))
        .collect();
    for g in &graphs {
        let plan = rocmforge::codegen::generate(g, &target).map_err(|e| e.to_string())?;
        if plan.kernels.iter().any(|k| k.family != "gemm_mma") {
            return Err(format!("{}: not on the matrix cores on {arch}", g.name).into());
        }
    }
    let rows = compile_all(rtc, &graphs, arch)?;
    for (node, r) in &rows {
        if r.scratch_bytes > 0 || r.lds_bytes > u64::from(target.caps.static_shared_bytes) {
            return Err(format!("{} (%{node}) on {arch}: {r:?}", r.name).into());
        }
    }
    let table = report_table(&rows);
    std::panic::catch_unwind(|| {
        files::snapshot_settings()
            .bind(|| insta::assert_snapshot!(format!("resources__gemm_mma__{arch}"), table))
    })
    .map_err(|_| Failed::from(format!("resource report of gemm_mma ({arch}) differs")))
}

fn main() {
    let args = Arguments::from_args();
    const RTC: &str = "ROCMFORGE_REQUIRE_HIPRTC";
    const CXX: &str = "ROCMFORGE_REQUIRE_HOST_CXX";
    let rtc = Hiprtc::load().map(Arc::new);
    let cxx = host_kernels::host_cxx();
    let mut trials = vec![
        Trial::test(
            "metadata_reader_on_real_and_corrupt_input",
            metadata_reader_on_real_and_corrupt_input,
        ),
        needs(&rtc, RTC, "compile::gfx90a::mma_probes".into(), |rtc| {
            mma_probes(&rtc, "gfx90a")
        }),
        needs(&rtc, RTC, "compile::gfx90a::gemm_mma".into(), |rtc| {
            gemm_mma(&rtc, "gfx90a")
        }),
    ];
    type HostTrial = fn(&Path) -> Result<(), Failed>;
    let host_trials: [(&str, HostTrial); 6] = [
        ("host::op_zoo_pointwise_graphs", host_op_zoo),
        (
            "host::edge_values_in_every_elementwise_row",
            host_edge_values,
        ),
        ("host::zero_size_dims", host_empty_graphs),
        (
            "host::reductions_over_an_empty_axis",
            host_empty_axis_reductions,
        ),
        (
            "host::causal_offsets_near_the_i64_limits",
            host_causal_offsets,
        ),
        (
            "host::gather_out_of_range_is_the_interpreter_error",
            host_gathers,
        ),
    ];
    for (name, f) in host_trials {
        trials.push(needs(&cxx, CXX, name.into(), move |cxx| f(&cxx)));
    }
    let edge = Arc::new(edge_graphs());
    for arch in AMD_TARGETS {
        let edge = Arc::clone(&edge);
        trials.push(needs(
            &rtc,
            RTC,
            format!("compile::{arch}::edge_graphs"),
            move |rtc| compile_all(&rtc, &edge, arch).map(|_| ()),
        ));
        trials.push(needs(
            &rtc,
            RTC,
            format!("compile::{arch}::hostile_names"),
            move |rtc| hostile_names_compile_to_the_plain_kernels(&rtc, arch),
        ));
        trials.push(needs(
            &rtc,
            RTC,
            format!("compile::{arch}::every_op_and_dtype"),
            move |rtc| compile_all(&rtc, &op_zoo::zoo(), arch).map(|_| ()),
        ));
        for path in files::graph_files() {
            for fused in [true, false] {
                let name = format!(
                    "compile::{arch}::{}::{}",
                    path.file_stem().unwrap().to_string_lossy(),
                    if fused { "fused" } else { "unfused" }
                );
                let path = path.clone();
                trials.push(needs(&rtc, RTC, name, move |rtc| {
                    compile_graph(&rtc, &path, fused, arch)
                }));
            }
        }
    }
    libtest_mimic::run(&args, trials).exit();
}
