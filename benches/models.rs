//! The example models compiled for the best device: per-iteration latency of `bert_layer.json`
//! and `llama_block.json`, fused and unfused. Time is taken between stream synchronisations.

#[path = "common/timing.rs"]
mod timing;

use std::path::Path;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use rocmforge::compile::CompileOptions;
use rocmforge::interp::Bindings;
use rocmforge::ir::{format, Graph};
use rocmforge::runtime::Device;
use timing::time_runs;

fn bench(c: &mut Criterion) {
    let (device, _) = Device::best();
    println!("device: {}", device.label());
    let mut group = c.benchmark_group("models");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    for name in ["bert_layer", "llama_block"] {
        let g = format::load(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("graphs/{name}.json")),
        )
        .expect("example graph");
        let inputs = Bindings::random(&g, 1);
        for fuse in [true, false] {
            let options = CompileOptions {
                fuse,
                poison: false,
                progress: false,
                ..CompileOptions::default()
            };
            let compiled = Graph::compile_with(&g, &device, &options).expect("compile");
            let variant = if fuse { "fused" } else { "unfused" };
            group.bench_with_input(BenchmarkId::new(variant, name), &(), |b, _| {
                b.iter_custom(|iters| time_runs(&compiled, &inputs, iters))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
