//! `rocmforge run`: a graph on seeded random inputs, with statistics of each output.

use std::path::Path;
use std::time::Instant;

use rocmforge::compile::CompileOptions;
use rocmforge::interp::Bindings;
use rocmforge::ir::{Graph, Tensor};

use crate::common::{load, pick_device, tuning_line};

/// Statistics of one output: mean and standard deviation of its finite values (none if it has
/// none), how many are NaN, how many ±inf.
pub(crate) struct Stats {
    mean_std: Option<(f64, f64)>,
    nans: usize,
    infs: usize,
}

pub(crate) fn stats(t: &Tensor) -> Stats {
    let v = t.to_f64_vec();
    let finite: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    let nans = v.iter().filter(|x| x.is_nan()).count();
    let n = finite.len() as f64;
    let mean_std = (!finite.is_empty()).then(|| {
        let mean = finite.iter().sum::<f64>() / n;
        let var = finite.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
        (mean, var.sqrt())
    });
    Stats {
        mean_std,
        nans,
        infs: v.len() - finite.len() - nans,
    }
}

pub(crate) fn cmd_run(
    file: &Path,
    seed: u64,
    values: usize,
    device: Option<&str>,
    verify: bool,
    no_fuse: bool,
    choices: crate::common::Choices,
) -> Result<(), String> {
    let crate::common::Choices { tune, f32_matmul } = choices;
    let graph = load(file)?;
    let device = pick_device(device)?;
    let options = CompileOptions {
        fuse: !no_fuse,
        seed,
        tune,
        f32_matmul,
        ..CompileOptions::default()
    };
    let compiled = Graph::compile_with(&graph, &device, &options).map_err(|e| e.to_string())?;
    crate::common::print_plan_notes(&compiled);
    let bindings = Bindings::random(&graph, seed);
    outln!(
        "graph:  {} ({} nodes, {} after passes)",
        graph.name,
        graph.node_count(),
        compiled.graph.node_count()
    );
    outln!("device: {}", device.label());
    let s = &compiled.stats;
    let how = if !device.is_gpu() {
        "no kernels".to_string()
    } else if s.compiled == 0 {
        format!(
            "{} kernels, all from cache ({} from disk)",
            s.kernels, s.from_disk
        )
    } else {
        format!(
            "{} kernels, {} compiled now (cold), {} from disk",
            s.kernels, s.compiled, s.from_disk
        )
    };
    outln!("compile: {:.3} ms ({how})", s.time.as_secs_f64() * 1e3);
    if tune {
        outln!("{}", tuning_line(&s.tuning));
    }
    if let Some(m) = compiled.memory() {
        outln!(
            "memory: {} B planned for intermediates ({} B without reuse)",
            m.planned_bytes,
            m.unplanned_bytes
        );
    }
    let start = Instant::now();
    let (outputs, check) = if verify {
        let (o, v) = compiled.verify(&bindings).map_err(|e| e.to_string())?;
        (o, Some(v))
    } else {
        (compiled.run(&bindings).map_err(|e| e.to_string())?, None)
    };
    let elapsed = start.elapsed();
    outln!(
        "time:   {:.3} ms{}",
        elapsed.as_secs_f64() * 1e3,
        if verify { " (run + interpreter)" } else { "" }
    );
    for (&id, t) in graph.outputs().iter().zip(&outputs) {
        let st = stats(t);
        let head: Vec<String> = t
            .to_f64_vec()
            .iter()
            .take(values)
            .map(|x| format!("{x:.6}"))
            .collect();
        outln!("output {}: {}", graph.node(id).name, t.ty());
        let count = |n: usize, what: &str| {
            if n > 0 {
                format!("  {what} {n}")
            } else {
                String::new()
            }
        };
        let moments = match st.mean_std {
            Some((mean, std)) => format!("mean {mean:.6}  std {std:.6}"),
            None => "no finite values".to_string(),
        };
        outln!(
            "  {moments}{}{}",
            count(st.nans, "NaN"),
            count(st.infs, "±inf")
        );
        outln!("  first [{}]", head.join(", "));
    }
    if let Some(v) = check {
        for o in &v.outputs {
            outln!(
                "verify {}: relative L2 error {:.3e} against the interpreter (unfused){}",
                o.name,
                o.error,
                if o.non_finite > 0 {
                    format!(
                        " over the finite values; {} NaN/±inf at the same places",
                        o.non_finite
                    )
                } else {
                    String::new()
                }
            );
        }
    }
    Ok(())
}
