//! `rocmforge compile`: the pass pipeline, generated kernels, the resource report and bundles.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use rocmforge::arch::Target;
use rocmforge::codegen::{self, CodegenOptions, KernelPlan};
use rocmforge::compile::bundle::{self, EmitOptions, DEFAULT_MAX_BUNDLE_BYTES};
use rocmforge::compile::report::{self, ReportKernel};
use rocmforge::ir::{self, Graph};
use rocmforge::passes::{explain_text, PassManager};
use rocmforge::runtime::AmdCompilerChoice;

use crate::common::load;

pub(crate) struct CodegenArgs<'a> {
    pub(crate) target: Option<&'a str>,
    pub(crate) report: bool,
    pub(crate) compiler: AmdCompilerChoice,
    pub(crate) emit_dir: Option<&'a Path>,
    /// `--emit bundle`: the seed and size limit.
    pub(crate) bundle: Option<(u64, u64)>,
    /// `--megakernel`: the plan as one persistent kernel.
    pub(crate) megakernel: bool,
    /// `--tf32`: f32 matmuls at TF32 precision where the target has a TF32 atom.
    pub(crate) f32_matmul: codegen::F32Matmul,
}

impl CodegenArgs<'_> {
    /// The codegen options these arguments ask for.
    pub(crate) fn options(&self) -> CodegenOptions {
        CodegenOptions {
            persistent: if self.megakernel {
                codegen::Persistent::On
            } else {
                codegen::Persistent::Off
            },
            f32_matmul: self.f32_matmul,
            ..CodegenOptions::default()
        }
    }
}

/// Runs the default pipeline (clean-up only with `no_fuse`) on `graph`, printing the graph
/// after every pass that changed it (`dump`) and the passes' reasons (`explain`); the manager,
/// for its pass names.
pub(crate) fn optimise(
    graph: &mut Graph,
    dump: bool,
    explain: bool,
    no_fuse: bool,
) -> Result<PassManager, String> {
    let manager = PassManager::pipeline(!no_fuse);
    let reports = manager
        .run_observed(graph, |report, g| {
            if dump && report.changed() {
                outln!("// after {}", report.pass);
                out!("{}", ir::to_text(g).unwrap_or_else(|e| e.to_string()));
                outln!();
            }
        })
        .map_err(|e| e.to_string())?;
    if explain {
        out!("{}", explain_text(&reports));
    }
    // As a compile does (`compile::optimise`): concatenated weights become one weight bound
    // once, so the plan shown is the plan that runs (no concat kernels per run).
    rocmforge::compile::fold::fold_weight_concats(graph).map_err(|e| e.to_string())?;
    Ok(manager)
}

pub(crate) fn cmd_compile(
    file: &Path,
    dump: bool,
    explain: bool,
    no_fuse: bool,
    cg: CodegenArgs,
) -> Result<(), String> {
    let mut graph = load(file)?;
    // A bundle runs the passes itself, from the graph as given, as `run` does.
    let source = cg.bundle.is_some().then(|| graph.clone());
    let before = graph.node_count();
    let manager = optimise(&mut graph, dump, explain, no_fuse)?;
    if let (Some(source), Some(arch), Some(dir)) = (&source, cg.target, cg.emit_dir) {
        emit_bundle(source, arch, no_fuse, dir, &cg)?;
        if !cg.report {
            return Ok(());
        }
        let report_only = CodegenArgs {
            emit_dir: None,
            ..cg
        };
        return codegen_for(&graph, arch, &report_only);
    }
    if let Some(arch) = cg.target {
        return codegen_for(&graph, arch, &cg);
    }
    if !dump {
        out!("{}", ir::to_text(&graph).map_err(|e| e.to_string())?);
    }
    let fused = graph
        .node_ids()
        .filter(|&id| graph.op(id).is_fused())
        .count();
    eprintln!(
        "{}: {before} → {} nodes, {fused} fused node(s), passes: {}",
        graph.name,
        graph.node_count(),
        manager.names().join(", ")
    );
    Ok(())
}

pub(crate) fn emit_bundle(
    source: &Graph,
    arch: &str,
    no_fuse: bool,
    dir: &Path,
    cg: &CodegenArgs,
) -> Result<(), String> {
    let (seed, max_bytes) = cg.bundle.unwrap_or((0, DEFAULT_MAX_BUNDLE_BYTES));
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let options = EmitOptions {
        fuse: !no_fuse,
        seed,
        compiler: cg.compiler,
        max_bytes,
    };
    let emitted = bundle::emit(source, &target, dir, &options).map_err(|e| e.to_string())?;
    let plan = &emitted.plan;
    if let Some(why) = &plan.compiler.missing {
        eprintln!(
            "note: no compiler for {arch} here, so the bundle has sources only (no code \
             objects): {why}"
        );
    }
    eprintln!(
        "wrote a bundle to {}: {} kernel(s){}, {} buffer(s), {} bytes",
        dir.display(),
        plan.kernels.len(),
        plan.compiler
            .name
            .as_ref()
            .map(|c| format!(" compiled by {c}"))
            .unwrap_or_default(),
        plan.buffers.len(),
        emitted.bytes
    );
    Ok(())
}

pub(crate) fn codegen_for(graph: &Graph, arch: &str, cg: &CodegenArgs) -> Result<(), String> {
    // With --report, hiprtc's own list of targets decides first (see `report_target`).
    let target = if cg.report {
        report::report_target(arch, cg.compiler).map_err(|e| e.to_string())?
    } else {
        Target::parse(arch).map_err(|e| e.to_string())?
    };
    let options = cg.options();
    let plan = codegen::generate_with(graph, &target, &options).map_err(|e| e.to_string())?;
    if let Some(dir) = cg.emit_dir {
        let written = write_sources(&plan, dir)?;
        std::fs::write(dir.join("plan.txt"), plan.listing()).map_err(|e| e.to_string())?;
        eprintln!(
            "wrote {written} kernel source(s) for {} kernel(s) and plan.txt to {}",
            plan.kernels.len(),
            dir.display()
        );
    }
    if !cg.report {
        if cg.emit_dir.is_none() {
            out!("{}", plan.listing());
        }
        return Ok(());
    }
    resource_report(graph, &plan, &target, cg.compiler)
}

/// Writes one `.hip` file (prelude and body) per distinct kernel of `plan` into `dir`; how
/// many. Identical kernels share their entry (the hash of the body), and so their file: each
/// is written once, not once per launch.
pub(crate) fn write_sources(plan: &KernelPlan, dir: &Path) -> Result<usize, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut written = HashSet::new();
    for k in plan
        .kernels
        .iter()
        .filter(|k| written.insert(k.entry.as_str()))
    {
        let path = dir.join(format!("{}.hip", k.entry));
        std::fs::write(&path, plan.source(k))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(written.len())
}

/// `--report`: every distinct kernel compiled for `target`, its registers, LDS and spills.
pub(crate) fn resource_report(
    graph: &Graph,
    plan: &KernelPlan,
    target: &Target,
    choice: AmdCompilerChoice,
) -> Result<(), String> {
    let compiler = report::choose_amd_compiler(target, choice).map_err(|e| e.to_string())?;
    // One whole source (prelude and body) per entry, not per kernel: a plan of a million
    // identical kernels would otherwise hold a million copies of the prelude.
    // `resource_report` compiles each distinct kernel once.
    let mut sources: HashMap<&str, String> = HashMap::new();
    for k in &plan.kernels {
        sources
            .entry(k.entry.as_str())
            .or_insert_with(|| plan.source(k));
    }
    let kernels: Vec<ReportKernel> = plan
        .kernels
        .iter()
        .map(|k| ReportKernel {
            entry: &k.entry,
            source: &sources[k.entry.as_str()],
            body: &k.body,
            label: &k.node,
        })
        .collect();
    let bar = progress_bar(plan.kernels.len(), &target.arch);
    let report = report::resource_report(&kernels, target, &compiler, &|n| bar.inc(n as u64));
    bar.finish_and_clear();
    let report = report.map_err(|e| e.to_string())?;
    outln!(
        "{} on {} ({} kernel(s), {} distinct, {})",
        graph.name,
        target,
        plan.kernels.len(),
        report.rows.len(),
        report.compiler
    );
    out!("{}", report.table());
    let spilling = report.spilling();
    if !spilling.is_empty() {
        outln!(
            "warning: {} kernel(s) spill: {}",
            spilling.len(),
            spilling.join(", ")
        );
    }
    Ok(())
}

/// A bar of `kernels` compiles for `arch` on a terminal's stderr (hidden elsewhere).
fn progress_bar(kernels: usize, arch: &str) -> indicatif::ProgressBar {
    let target = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        indicatif::ProgressDrawTarget::stderr()
    } else {
        indicatif::ProgressDrawTarget::hidden()
    };
    let bar = indicatif::ProgressBar::with_draw_target(Some(kernels as u64), target);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "compiling {pos}/{len} kernels for {msg} [{elapsed_precise}] {wide_bar}",
    ) {
        bar.set_style(style);
    }
    bar.set_message(arch.to_string());
    bar
}
