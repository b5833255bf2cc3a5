//! The CPU device against the interpreter on the example graphs (fused by the default
//! pipeline): median wall time of a run, printed as a table. `cargo bench --bench cpu`.
//! The SmolLM2 rows time each quantized kernel the CPU runs; the whole model side by side with
//! llama.cpp is `benches/llamacpp_compare.py --cpu` (docs/performance.md).

use std::time::Instant;

use rocmforge::cpu::{CpuOptions, CpuPlan, Kernel, Precision};
use rocmforge::interp::{self, Bindings};
use rocmforge::ir::{format, DType, Graph, QuantScheme};
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

/// One SmolLM2-135M layer's projections (hidden 576, 9 query heads and 3 K/V heads of 64,
/// MLP 1536) as Q4_1 GEMMs over `rows` tokens, or the LM head (vocabulary 49152).
fn smollm2_linears(rows: usize, head: bool) -> Graph {
    let mut g = Graph::new("smollm2_linears");
    let x = g.input("x", DType::F32, &[rows, 576]).unwrap();
    let h = g.input("h", DType::F32, &[rows, 1536]).unwrap();
    let shapes: &[(&str, usize, usize)] = if head {
        &[("lm_head", 49152, 576)]
    } else {
        &[
            ("q", 576, 576),
            ("k", 192, 576),
            ("v", 192, 576),
            ("o", 576, 576),
            ("gate", 1536, 576),
            ("up", 1536, 576),
            ("down", 576, 1536),
        ]
    };
    let mut outs = Vec::new();
    for &(name, n, k) in shapes {
        let w = g
            .weight_quant(name, DType::F32, &[n, k], QuantScheme::Q4_1)
            .unwrap();
        let wt = g.transpose_last(w).unwrap();
        let a = if k == 576 { x } else { h };
        outs.push(g.matmul(a, wt).unwrap());
    }
    g.set_outputs(&outs).unwrap();
    passes::optimize(&g).unwrap().0
}

fn main() {
    // SmolLM2-135M's weight GEMMs (30 layers + the LM head), Q4_1, through the Q8 path: the
    // part of a decode step and of a 128-token prompt that dominates (attention, norms and
    // the rest are not in these rows).
    let opts = CpuOptions::default();
    let time = |rows: usize, head: bool, kernel: Kernel| {
        let g = smollm2_linears(rows, head);
        let b = Bindings::random(&g, 1);
        let mut plan = CpuPlan::new(&g, &b, opts).unwrap();
        plan.set_kernel(kernel).unwrap();
        let mut s = plan.session().unwrap();
        s.set_inputs(&b).unwrap();
        median_ms(|| s.run().unwrap(), 15)
    };
    // Every kernel this CPU runs (ROCMFORGE_CPU_KERNEL picks the one sessions use).
    for kernel in Kernel::ALL.into_iter().filter(|k| k.supported()) {
        let (layer1, head1) = (time(1, false, kernel), time(1, true, kernel));
        let decode_ms = 30.0 * layer1 + head1;
        println!(
            "[{}] SmolLM2-135M Q4_1 weight GEMVs, decode: layer {layer1:.3} ms, head (Q4_1) \
             {head1:.3} ms, 30 layers + head {decode_ms:.2} ms = {:.1} tokens/s ({} threads)",
            kernel.name(),
            1e3 / decode_ms,
            opts.threads
        );
        let layer128 = time(128, false, kernel);
        let prompt_ms = 30.0 * layer128 + head1;
        println!(
            "[{}] SmolLM2-135M Q4_1 weight GEMMs, prompt of 128: layer {layer128:.3} ms, \
             30 layers + head {prompt_ms:.1} ms = {:.1} tokens/s",
            kernel.name(),
            128e3 / prompt_ms
        );
    }

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
