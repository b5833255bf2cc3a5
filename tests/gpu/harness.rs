//! What every GPU trial shares: tolerances, compile options, the comparison with the
//! interpreter, and how a trial is registered (run, ignored with the reason, or failed where a
//! variable requires it).

use std::sync::RwLock;

use libtest_mimic::{Failed, Trial};
use rocmforge::compile::{CompileOptions, Poison};
use rocmforge::interp::{run, Bindings};
use rocmforge::ir::{Graph, Tensor};
use rocmforge::runtime::Device;

use crate::common::row_error::rows_within;

/// Held shared by every trial, exclusively by the memory check: device-wide memory is only
/// measured while nothing else runs.
pub static MEMORY: RwLock<()> = RwLock::new(());

pub use crate::common::accuracy::tolerance;

pub fn options() -> CompileOptions {
    CompileOptions {
        poison: Poison::On,
        progress: false,
        ..CompileOptions::default()
    }
}

/// Relative L2 error of `got` against `want` over the whole tensor; every row (the last axis)
/// is bounded too, within `ROW_FACTOR * tol` (`common::row_error::rows_within`).
/// NaN must sit exactly where the reference has it, infinities must match, and an output still
/// holding the poison where the reference is finite fails. Integer and boolean outputs must be
/// equal, element for element.
pub fn compare(got: &Tensor, want: &Tensor, tol: f64, what: &str) -> Result<f64, Failed> {
    if got.ty() != want.ty() {
        return Err(format!("{what}: {} vs {}", got.ty(), want.ty()).into());
    }
    if !want.dtype().is_float() {
        if got == want {
            return Ok(0.0);
        }
        let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
        let i = (0..g.len()).find(|&i| g[i] != w[i]).unwrap_or(0);
        return Err(format!(
            "{what}: {} output differs: element {i} is {:?}, want {:?}",
            want.dtype(),
            got.element(i),
            want.element(i)
        )
        .into());
    }
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let (mut num, mut den) = (0.0, 0.0);
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        match (a.is_nan(), b.is_nan()) {
            (true, true) => continue,
            (true, false) => {
                return Err(
                    format!("{what}: element {i} is NaN (unwritten or wrong), want {b}").into(),
                )
            }
            (false, true) => return Err(format!("{what}: element {i} is {a}, want NaN").into()),
            _ => {}
        }
        if a.is_infinite() || b.is_infinite() {
            if a != b {
                return Err(format!("{what}: element {i} is {a}, want {b}").into());
            }
            continue;
        }
        num += (a - b).powi(2);
        den += b * b;
    }
    rows_within(got, want, tol).map_err(|e| format!("{what}: {e}"))?;
    Ok(if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    })
}

/// `b` with the weights `Graph::compile` draws for `g` (seed 0), for the interpreter.
pub fn with_weights(g: &Graph, b: &Bindings) -> Bindings {
    let mut wb = b.clone();
    for id in g.node_ids() {
        let n = g.node(id);
        match g.op(id) {
            rocmforge::ir::Op::Weight {
                quant: Some(scheme),
                ..
            } => {
                wb.quantized.insert(
                    n.name.clone(),
                    rocmforge::ir::random_quant(&n.name, *scheme, &n.ty.shape, 0)
                        .expect("a test graph's weights fit"),
                );
            }
            rocmforge::ir::Op::Weight { init, .. } => {
                wb.weights.insert(
                    n.name.clone(),
                    rocmforge::ir::random_weight(&n.name, &n.ty, init, 0)
                        .expect("a test graph's weights fit"),
                );
            }
            _ => {}
        }
    }
    wb
}

/// `g` compiled as users get it (the default options: on sm_90a the warpgroup GEMM, its TMA
/// kernel's width by the model) against the interpreter.
pub fn check_graph(device: &Device, g: &Graph, fuse: bool, seed: u64) -> Result<(), Failed> {
    check_graph_with(device, g, fuse, seed, Some(Default::default()))
}

/// [`check_graph`] with the sm_90a warpgroup GEMM as `wgmma` says (its TMA kernel's width
/// choice), or off (the mma.sync kernel) where `None`.
pub fn check_graph_with(
    device: &Device,
    g: &Graph,
    fuse: bool,
    seed: u64,
    wgmma: Option<rocmforge::codegen::TmaWidth>,
) -> Result<(), Failed> {
    let options = CompileOptions {
        fuse,
        wgmma_gemm: wgmma.is_some(),
        wgmma_tma: wgmma.unwrap_or_default(),
        ..options()
    };
    check_graph_options(device, g, seed, &options)
}

/// `g` compiled with `options` against the interpreter.
pub fn check_graph_options(
    device: &Device,
    g: &Graph,
    seed: u64,
    options: &CompileOptions,
) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let fuse = options.fuse;
    let c = Graph::compile_with(g, device, options).map_err(|e| e.to_string())?;
    let b = Bindings::random(g, seed);
    let got = c.run(&b).map_err(|e| e.to_string())?;
    let want = run(g, &with_weights(g, &b)).map_err(|e| e.to_string())?;
    // A plan with the int8 GEMV rounds activations to 8 bits (as llama.cpp's mmvq does): its
    // outputs are held to that kernel's relative L2 bound (tests/common/int8_gemv.rs), not
    // the dtype's.
    let int8 = c
        .plan()
        .is_some_and(|p| p.kernels.iter().any(|k| k.body.contains("rf_dot4_i8")));
    for ((o, gt), wt) in g.outputs().iter().zip(&got).zip(&want) {
        let what = format!(
            "{} %{} ({})",
            g.name,
            g.node(*o).name,
            if fuse { "fused" } else { "unfused" }
        );
        let tol = if int8 {
            crate::common::int8_gemv::REL_L2
        } else {
            tolerance(wt.dtype())
        };
        let err = compare(gt, wt, tol, &what)?;
        if err > tol {
            return Err(format!("{what}: relative L2 {err:e} > {tol:e}").into());
        }
    }
    Ok(())
}

/// Graph `g` compiled with f32 matmuls at TF32 (`F32Matmul::Tf32`) against the exact f32
/// interpreter within [`TF32_REL_L2`]: on a device whose target has a TF32 atom every Gemm must
/// run on it (the plan holds a TF32 kernel and no fallback note), so an exact kernel cannot pass
/// in its place; elsewhere the plan must say it falls back.
pub fn check_graph_tf32(device: &Device, g: &Graph, seed: u64) -> Result<(), Failed> {
    use crate::common::accuracy::TF32_REL_L2;
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let target = device.target().ok_or("the device has no codegen target")?;
    let options = CompileOptions {
        fuse: false,
        f32_matmul: rocmforge::codegen::F32Matmul::Tf32,
        ..options()
    };
    let c = Graph::compile_with(g, device, &options).map_err(|e| e.to_string())?;
    let plan = c.plan().ok_or("no kernel plan")?;
    let has_tf32 = target
        .caps
        .mma
        .iter()
        .any(|a| a.precision == rocmforge::arch::mma::Precision::Tf32);
    let tf32_kernels = plan
        .kernels
        .iter()
        .filter(|k| k.body.contains("at TF32 precision"))
        .count();
    if has_tf32 && (tf32_kernels == 0 || !plan.notes.is_empty()) {
        return Err(format!("{}: not on the TF32 atom ({:?})", g.name, plan.notes).into());
    }
    if !has_tf32 && plan.notes.is_empty() {
        return Err(format!("{}: fell back to exact f32 without a note", g.name).into());
    }
    let b = Bindings::random(g, seed);
    let got = c.run(&b).map_err(|e| e.to_string())?;
    let want = run(g, &with_weights(g, &b)).map_err(|e| e.to_string())?;
    for ((o, gt), wt) in g.outputs().iter().zip(&got).zip(&want) {
        let what = format!("{} %{} (tf32)", g.name, g.node(*o).name);
        let err = compare(gt, wt, TF32_REL_L2, &what)?;
        if err > TF32_REL_L2 {
            return Err(format!("{what}: relative L2 {err:e} > {TF32_REL_L2:e}").into());
        }
    }
    Ok(())
}

pub type Body = Box<dyn FnOnce() -> Result<(), Failed> + Send>;

pub type DeviceTrial = fn(&Device) -> Result<(), Failed>;

/// Set to 1 where a GPU must be found (`.gpu/run` on the GPU machine sets it): a trial that
/// would be ignored for want of a GPU fails instead, so a machine whose GPU did not open cannot
/// report a green run of nothing.
pub const REQUIRE_GPU: &str = "ROCMFORGE_REQUIRE_GPU";
/// Set to 1 where the models must be there (CI, after scripts/fetch-models).
pub const REQUIRE_MODELS: &str = "ROCMFORGE_REQUIRE_MODELS";

/// Whether the environment variable `require` is set to 1.
pub fn required(require: &str) -> bool {
    std::env::var(require).is_ok_and(|v| v == "1")
}

/// A trial that cannot run here, for the reason `why`: it fails when `require` is set to 1,
/// and is reported ignored, with the reason, otherwise.
pub fn unavailable(name: String, why: &str, require: &str) -> Trial {
    if required(require) {
        let msg = format!("{require}=1 but {why}");
        Trial::test(name, move || Err(msg.into()))
    } else {
        Trial::test(name, || Ok(()))
            .with_ignored_flag(true)
            .with_kind(format!("ignored: {why}"))
    }
}

/// A GPU trial: it runs, or where no GPU was found (`ignored` holds why) it is ignored, or
/// fails under `ROCMFORGE_REQUIRE_GPU=1`.
pub fn push(trials: &mut Vec<Trial>, ignored: &Option<String>, name: String, f: Body) {
    trials.push(match ignored {
        None => Trial::test(name, f),
        Some(why) => unavailable(name, why, REQUIRE_GPU),
    });
}

/// A GPU trial that also needs something else (`missing` says what is not here, if anything):
/// no GPU is judged as in [`push`]; a GPU without the thing is ignored, or fails when `require`
/// is set to 1.
pub fn push_needing(
    trials: &mut Vec<Trial>,
    ignored: &Option<String>,
    missing: Option<String>,
    require: &str,
    name: String,
    f: Body,
) {
    match (ignored, missing) {
        (None, Some(why)) => trials.push(unavailable(name, &why, require)),
        _ => push(trials, ignored, name, f),
    }
}
