//! The CPU device against the interpreter on the example graphs (fused by the default
//! pipeline): median wall time of a run, printed as a table. `cargo bench --bench cpu`.
//! The real-model rows (MiniLM seq 128, SmolLM2 Q4 decode/prompt) need the models in
//! `~/.cache/rocmforge/models` and the session integration; see the report of issue 24.

use std::time::Instant;

use rocmforge::cpu::{CpuOptions, CpuPlan, Precision};
use rocmforge::interp::{self, Bindings};
use rocmforge::ir::format;
use rocmforge::passes;

fn median_ms(mut f: impl FnMut(), reps: usize) -> f64 {
    f();
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(|a, b| a.total_cmp(b));
    t[t.len() / 2]
}

fn main() {
    println!("| graph | interp ms | cpu exact ms | cpu q8 ms | threads |");
    println!("| --- | --- | --- | --- | --- |");
    for name in [
        "bert_layer",
        "llama_block",
        "decode_step",
        "quant_linear",
        "quant_prefill_f16",
    ] {
        let path = format!("{}/graphs/{name}.json", env!("CARGO_MANIFEST_DIR"));
        let g = format::load(std::path::Path::new(&path)).unwrap();
        let g = passes::optimize(&g).unwrap().0;
        let b = Bindings::random(&g, 1);
        let interp_ms = median_ms(|| drop(interp::run(&g, &b).unwrap()), 7);
        let mut row = vec![format!("{interp_ms:.3}")];
        let mut threads = 0;
        for precision in [Precision::Exact, Precision::Q8Activations] {
            let opts = CpuOptions {
                precision,
                ..CpuOptions::default()
            };
            let plan = CpuPlan::new(&g, &b, opts).unwrap();
            threads = plan.threads();
            let mut s = plan.session().unwrap();
            s.set_inputs(&b).unwrap();
            row.push(format!("{:.3}", median_ms(|| s.run().unwrap(), 21)));
        }
        println!("| {name} | {} | {threads} |", row.join(" | "));
    }
}
