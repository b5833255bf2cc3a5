//! Replay bundles emitted and replayed on the device.

use std::path::{Path, PathBuf};

use crate::common::*;
use crate::device::{hold_keeps_the_stream_until_released, profile_times_every_kernel};
use crate::harness::*;
use libtest_mimic::{Failed, Trial};
use rocmforge::compile::bundle;
use rocmforge::ir::{format, Graph, Tensor};
use rocmforge::runtime::Device;

/// A fresh, absent directory for a bundle: process id, a per-process counter (two trials whose
/// graphs share a name, `decode_step` and `decode_step_small`'s graph, ran in parallel in one
/// directory, one removing it while the other wrote) and the name.
pub fn bundle_dir(name: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "rocmforge-gpu-bundle-{}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        name.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Emits a bundle of `g` for the device's own target and replays it there: every computed
/// buffer must be compared and match the interpreter, every kernel loaded as `recompile` says.
pub fn bundle_replays(device: &Device, g: &Graph, recompile: bool) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let target = device.target().ok_or("no target")?.clone();
    let dir = bundle_dir(&format!("{}_{recompile}", g.name));
    let options = bundle::EmitOptions {
        seed: 5,
        ..bundle::EmitOptions::default()
    };
    let emitted = bundle::emit(g, &target, &dir, &options).map_err(|e| e.to_string())?;
    if emitted.plan.compiler.name.is_none() {
        return Err(format!("no code objects: {:?}", emitted.plan.compiler.missing).into());
    }
    let opened = bundle::Bundle::open(&dir, u64::MAX).map_err(|e| e.to_string())?;
    let report = opened
        .replay(device, &bundle::ReplayOptions { recompile })
        .map_err(|e| e.to_string())?;
    std::fs::remove_dir_all(&dir).ok();
    if let Some(m) = &report.first_mismatch {
        return Err(format!("{}: first mismatch {m:?}", g.name).into());
    }
    if !report.passed {
        return Err(format!("{}: index checks failed: {:?}", g.name, report.checks).into());
    }
    let computed = emitted
        .plan
        .buffers
        .iter()
        .filter(|b| b.role.is_computed())
        .count();
    let compared = report.buffers.iter().filter(|b| b.error.is_some()).count();
    if compared != computed {
        return Err(format!("{}: {compared} of {computed} buffers compared", g.name).into());
    }
    for k in &report.kernels {
        let from_code_object = k.loaded == bundle::KernelSource::CodeObject;
        if from_code_object == recompile {
            return Err(format!("{}: kernel {} loaded as {:?}", g.name, k.entry, k.loaded).into());
        }
    }
    Ok(())
}

/// A wrong value in `expected/` for the buffer a middle kernel writes: the replay must fail
/// and name that kernel and buffer first.
pub fn bundle_names_first_mismatch(device: &Device, g: &Graph) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let target = device.target().ok_or("no target")?.clone();
    let dir = bundle_dir(&format!("{}_mismatch", g.name));
    let emitted = bundle::emit(g, &target, &dir, &bundle::EmitOptions::default())
        .map_err(|e| e.to_string())?;
    let plan = &emitted.plan;
    let k = plan.kernels.len() / 2;
    let written = plan.kernels[k].args.last().ok_or("no args")?.buffer;
    let rel = plan.buffers[written]
        .expected
        .clone()
        .ok_or("no expected value")?;
    let b = &plan.buffers[written];
    let bytes = std::fs::read(dir.join(&rel)).map_err(|e| e.to_string())?;
    let ty = rocmforge::ir::TensorType::new(b.dtype, b.shape.clone());
    let mut values = Tensor::from_bytes(&ty, &bytes)
        .map_err(|e| e.to_string())?
        .to_f64_vec();
    // Far past any tolerance, whatever the buffer's scale.
    values[0] += 1.0 + 1e3 * values.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let wrong = Tensor::from_f64(b.dtype, b.shape.clone(), &values).map_err(|e| e.to_string())?;
    std::fs::write(dir.join(&rel), wrong.to_bytes()).map_err(|e| e.to_string())?;
    let report = bundle::Bundle::open(&dir, u64::MAX)
        .and_then(|b| b.replay(device, &bundle::ReplayOptions::default()))
        .map_err(|e| e.to_string())?;
    std::fs::remove_dir_all(&dir).ok();
    let m = report.first_mismatch.ok_or("the corrupted value passed")?;
    if report.passed
        || m.buffer != written
        || m.kernel
            .is_none_or(|i| plan.kernels[i].entry != plan.kernels[k].entry)
    {
        return Err(format!("want kernel {k} buffer {written}, got {m:?}").into());
    }
    Ok(())
}

/// A code object that is not one (refused before the driver sees it) is replaced by the
/// kernel's source compiled on the device, and the replay still matches.
pub fn bundle_falls_back_to_source(device: &Device, g: &Graph) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let target = device.target().ok_or("no target")?.clone();
    let dir = bundle_dir(&format!("{}_fallback", g.name));
    let emitted = bundle::emit(g, &target, &dir, &bundle::EmitOptions::default())
        .map_err(|e| e.to_string())?;
    let k = &emitted.plan.kernels[0];
    let co = k.code_object.as_ref().ok_or("no code objects")?;
    std::fs::write(dir.join(co), vec![b'x'; 4096]).map_err(|e| e.to_string())?;
    let report = bundle::Bundle::open(&dir, u64::MAX)
        .and_then(|b| b.replay(device, &bundle::ReplayOptions::default()))
        .map_err(|e| e.to_string())?;
    std::fs::remove_dir_all(&dir).ok();
    if !report.passed {
        return Err(format!("{:?}", report.first_mismatch).into());
    }
    match &report.kernels[0].loaded {
        bundle::KernelSource::Compiled { reason } if reason.contains("its code object") => Ok(()),
        other => Err(format!("kernel {} loaded as {other:?}", k.entry).into()),
    }
}

/// Replay bundles, and the profile trials registered between them.
pub fn trials(device: &Device, ignored: &Option<String>, trials: &mut Vec<Trial>) {
    // Replay bundles: the example graphs from their code objects (states and quantized weights
    // included), the decode step with its KV cache, the op zoo (odd sizes, every dtype, gathers
    // with index checks) recompiled from the bundle's sources.
    let d = device.clone();
    push(
        trials,
        ignored,
        "bundle::replay::decode_step_small".into(),
        Box::new(move || bundle_replays(&d, &decode_step::SMALL.decode_step(), false)),
    );
    for path in files::graph_files() {
        let (d, p) = (device.clone(), path.clone());
        push(
            trials,
            ignored,
            format!(
                "bundle::replay::{}",
                p.file_stem().unwrap().to_string_lossy()
            ),
            Box::new(move || {
                bundle_replays(&d, &format::load(&p).map_err(|e| e.to_string())?, false)
            }),
        );
    }
    for g in op_zoo::zoo() {
        let d = device.clone();
        push(
            trials,
            ignored,
            format!("bundle::replay_recompiled::{}", g.name),
            Box::new(move || bundle_replays(&d, &g, true)),
        );
    }
    let d = device.clone();
    push(
        trials,
        ignored,
        "profile::hold_keeps_the_stream_until_released".into(),
        Box::new(move || hold_keeps_the_stream_until_released(&d)),
    );
    let d = device.clone();
    push(
        trials,
        ignored,
        "bundle::unloadable_code_object_falls_back_to_source".into(),
        Box::new(move || {
            let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("graphs/attention_causal.json");
            bundle_falls_back_to_source(&d, &format::load(&p).map_err(|e| e.to_string())?)
        }),
    );
    let d = device.clone();
    push(
        trials,
        ignored,
        "profile::times_every_kernel_of_the_plan".into(),
        Box::new(move || profile_times_every_kernel(&d)),
    );
    let d = device.clone();
    push(
        trials,
        ignored,
        "bundle::first_mismatch_names_its_kernel".into(),
        Box::new(move || {
            let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("graphs/llama_block.json");
            bundle_names_first_mismatch(&d, &format::load(&p).map_err(|e| e.to_string())?)
        }),
    );
}
