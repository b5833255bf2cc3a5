//! What several commands share: opening the device, loading a graph file, the tuning line.

use std::path::Path;
use std::sync::OnceLock;

use rocmforge::compile::TuneStats;
use rocmforge::ir::{format, Graph, GraphError};
use rocmforge::runtime::Device;

/// What `--tune` did, in one line.
pub(crate) fn tuning_line(t: &TuneStats) -> String {
    format!(
        "tuning: {} problems with several candidates, {} from the cache, {} timed now \
         ({} candidate kernels, {:.1} ms)",
        t.problems,
        t.from_cache,
        t.timed,
        t.candidates_timed,
        t.time.as_secs_f64() * 1e3
    )
}

pub(crate) fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// `--threads N`, when given: the fast CPU device's worker count (over `ROCMFORGE_THREADS`).
pub(crate) static THREADS: OnceLock<usize> = OnceLock::new();

/// The device `spec` names, else `ROCMFORGE_DEVICE`'s, else the best one here. Without a GPU
/// that is the fast CPU device, said in one line with its thread count.
pub(crate) fn pick_device(spec: Option<&str>) -> Result<Device, String> {
    let d = match spec {
        Some(spec) => Device::open(spec).map_err(|e| e.to_string())?,
        None => {
            let (d, notes) = Device::best().map_err(|e| e.to_string())?;
            if !d.is_gpu() {
                for n in notes {
                    eprintln!("note: {n}");
                }
            }
            d
        }
    };
    // --threads applies to the fast CPU device whichever way it was named.
    let d = match THREADS.get() {
        Some(&n) if d.spec() == "cpu" && !d.is_interp() => Device::cpu_threads(Some(n)),
        _ => d,
    };
    if spec.is_none() && !d.is_gpu() {
        if d.is_interp() {
            eprintln!("note: running on the reference interpreter");
        } else {
            let threads = d
                .cpu_thread_count()
                .unwrap_or_else(rocmforge::cpu::physical_cores);
            let s = if threads == 1 { "" } else { "s" };
            eprintln!("note: no GPU available; running on the CPU ({threads} thread{s})");
        }
    }
    Ok(d)
}

pub(crate) fn load(path: &Path) -> Result<Graph, String> {
    format::load(path).map_err(|e| match e {
        // These name the file already.
        GraphError::File(_) | GraphError::Io { .. } => e.to_string(),
        _ => format!("{}: {e}", path.display()),
    })
}

/// The compile choices `run` and `embed` take from their flags (`--tune`, `--tf32`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Choices {
    pub(crate) tune: bool,
    pub(crate) f32_matmul: rocmforge::codegen::F32Matmul,
}

/// `--tf32` as the option it sets.
pub(crate) fn f32_matmul(tf32: bool) -> rocmforge::codegen::F32Matmul {
    if tf32 {
        rocmforge::codegen::F32Matmul::Tf32
    } else {
        rocmforge::codegen::F32Matmul::Exact
    }
}

/// The plan's notes (what was asked for and not done here, e.g. TF32 on a target without it),
/// on stderr so that a TF32 request that ran exact f32 is never silent.
pub(crate) fn print_plan_notes(compiled: &rocmforge::compile::Compiled) {
    for note in compiled
        .plan()
        .map(|p| p.notes.as_slice())
        .unwrap_or_default()
    {
        eprintln!("note: {note}");
    }
}
