//! What every GPU trial shares: tolerances, compile options, the comparison with the interpreter, and how a trial is registered (run, ignored with the reason, or failed where a variable requires it).

use std::sync::RwLock;

use libtest_mimic::{Failed, Trial};
use rocmforge::compile::CompileOptions;
use rocmforge::interp::{run, Bindings};
use rocmforge::ir::{DType, Graph, Tensor};
use rocmforge::runtime::Device;

/// Held shared by every trial, exclusively by the memory check: device-wide memory is only
/// measured while nothing else runs.
pub static MEMORY: RwLock<()> = RwLock::new(());

pub fn tolerance(dt: DType) -> f64 {
    match dt {
        DType::F16 => 2e-3,
        DType::BF16 => 1e-2,
        _ => 1e-5,
    }
}

pub fn options() -> CompileOptions {
    CompileOptions {
        poison: true,
        progress: false,
        ..CompileOptions::default()
    }
}

/// Relative L2 error of `got` against `want`; NaN must sit exactly where the reference has it,
/// and an output still holding the poison where the reference is finite fails.
pub fn compare(got: &Tensor, want: &Tensor, what: &str) -> Result<f64, Failed> {
    if got.ty() != want.ty() {
        return Err(format!("{what}: {} vs {}", got.ty(), want.ty()).into());
    }
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let mut num = 0.0;
    let mut den = 0.0;
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

pub fn check_graph(device: &Device, g: &Graph, fuse: bool, seed: u64) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let c = Graph::compile_with(g, device, &CompileOptions { fuse, ..options() })
        .map_err(|e| e.to_string())?;
    let b = Bindings::random(g, seed);
    let got = c.run(&b).map_err(|e| e.to_string())?;
    let want = run(g, &with_weights(g, &b)).map_err(|e| e.to_string())?;
    for ((o, gt), wt) in g.outputs().iter().zip(&got).zip(&want) {
        let what = format!(
            "{} %{} ({})",
            g.name,
            g.node(*o).name,
            if fuse { "fused" } else { "unfused" }
        );
        let err = compare(gt, wt, &what)?;
        let tol = tolerance(wt.dtype());
        if err > tol {
            return Err(format!("{what}: relative L2 {err:e} > {tol:e}").into());
        }
    }
    Ok(())
}

pub type Body = Box<dyn FnOnce() -> Result<(), Failed> + Send>;

pub type DeviceTrial = fn(&Device) -> Result<(), Failed>;

pub fn push(trials: &mut Vec<Trial>, ignored: &Option<String>, name: String, f: Body) {
    trials.push(match ignored {
        None => Trial::test(name, f),
        Some(why) => Trial::test(name, || Ok(()))
            .with_ignored_flag(true)
            .with_kind(format!("ignored: {why}")),
    });
}
