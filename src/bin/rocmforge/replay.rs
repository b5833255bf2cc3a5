//! `rocmforge replay`: check or replay a bundle and compare every computed buffer.

use std::path::Path;

use rocmforge::codegen;
use rocmforge::compile::bundle::{self, Bundle, BundleError, ReplayOptions, ReplayReport};
use rocmforge::runtime::Device;

pub(crate) struct ReplayArgs<'a> {
    pub(crate) device: Option<&'a str>,
    pub(crate) json: bool,
    pub(crate) check: bool,
    pub(crate) recompile: bool,
    pub(crate) max_bytes: u64,
}

/// The exit status `rocmforge replay --help` documents for each error.
pub(crate) fn replay_exit_code(e: &BundleError) -> u8 {
    match e {
        BundleError::File(_)
        | BundleError::Json { .. }
        | BundleError::Version { .. }
        | BundleError::Malformed { .. }
        | BundleError::Size { .. }
        | BundleError::TooLarge { .. } => 3,
        BundleError::NoGpu { .. } | BundleError::TargetMismatch { .. } => 4,
        BundleError::Compile(_)
        | BundleError::NoCompiler { .. }
        | BundleError::CodeObject { .. }
        | BundleError::Write { .. }
        | BundleError::NotEmpty { .. }
        | BundleError::Runtime { .. } => 5,
    }
}

pub(crate) fn json_out(value: &impl serde::Serialize) -> Result<(), BundleError> {
    let text = serde_json::to_string_pretty(value).map_err(|e| BundleError::Malformed {
        reason: e.to_string(),
    })?;
    outln!("{text}");
    Ok(())
}

/// Checks or replays the bundle in `dir`; `Ok(false)` when the replay ran and did not match.
pub(crate) fn cmd_replay(dir: &Path, args: &ReplayArgs) -> Result<bool, BundleError> {
    let bundle = Bundle::open(dir, args.max_bytes)?;
    if args.check {
        let report = bundle.check()?;
        if args.json {
            json_out(&report)?;
        } else {
            outln!(
                "{}: consistent: {} kernel(s), {} code object(s), {} buffer(s), {} data and {} \
                 expected file(s), {} bytes",
                dir.display(),
                report.kernels,
                report.code_objects,
                report.buffers,
                report.data_files,
                report.expected_files,
                report.bytes
            );
        }
        return Ok(true);
    }
    let device = match args.device {
        Some(spec) => Device::open(spec),
        None => Device::best().map(|(d, _)| d),
    }
    .map_err(|e| BundleError::NoGpu {
        reason: e.to_string(),
    })?;
    let options = ReplayOptions {
        recompile: args.recompile,
    };
    let report = bundle.replay(&device, &options)?;
    if args.json {
        json_out(&report)?;
    } else {
        print_replay(&bundle, &report);
    }
    Ok(report.passed)
}

pub(crate) fn print_replay(bundle: &Bundle, r: &ReplayReport) {
    let plan = bundle.plan();
    outln!(
        "bundle: {} (graph {}, target {}, {} kernels, {} buffers)",
        bundle.dir().display(),
        codegen::display_name(&plan.graph),
        plan.target.arch,
        plan.kernels.len(),
        plan.buffers.len()
    );
    outln!("device: {}", r.device);
    for k in &r.kernels {
        if let bundle::KernelSource::Compiled { reason } = &k.loaded {
            outln!("kernel {} {}: compiled here ({reason})", k.index, k.entry);
        }
    }
    for b in &r.buffers {
        let error = b
            .error
            .map(|e| format!("rel-L2 {e:.3e}"))
            .unwrap_or_else(|| "not compared".into());
        outln!(
            "buffer {:>4} {:<6} {:<32} {error} (tolerance {:e}){}{}",
            b.id,
            b.dtype.to_string(),
            codegen::display_name(&b.name),
            b.tolerance,
            if b.passed { "" } else { "  MISMATCH" },
            b.note
                .as_ref()
                .filter(|_| !b.passed)
                .map(|n| format!(": {n}"))
                .unwrap_or_default()
        );
    }
    for c in &r.checks {
        if let Some(index) = c.failed_index {
            outln!(
                "check {}: index {index} outside its table",
                codegen::display_name(&c.node)
            );
        }
    }
    if let Some(m) = &r.first_mismatch {
        outln!(
            "first mismatch: kernel {} writes buffer {} ({})",
            match (m.kernel, &m.entry) {
                (Some(i), Some(e)) => format!("{i} ({e})"),
                _ => "(none)".into(),
            },
            m.buffer,
            codegen::display_name(&m.name)
        );
    }
    outln!(
        "result: {}",
        if r.passed {
            "every computed buffer matches the interpreter"
        } else {
            "MISMATCH"
        }
    );
}
