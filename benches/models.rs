//! Models compiled for the best device, fused and unfused: per-iteration latency of the example
//! graphs `bert_layer.json` and `llama_block.json`, and of all-MiniLM-L6-v2 (when
//! `scripts/fetch-models` has put it in the model cache) at sequence 128, batch 1 and 32, f32 and
//! f16 (batch 1, f32 only on the CPU interpreter). Time is taken between stream
//! synchronisations.
//!
//! Same environment as the attention bench (benches/common/summary.rs); torch_compare.py --models
//! reads its JSON. `ROCMFORGE_BENCH_BREAKDOWN=1` also prints, per case, where the fused model's
//! device time goes: each kernel family's count and summed device time (`Prepared::profile`:
//! the run queued behind a hold, a marker around every kernel), the median of five profiled
//! runs by their sum; the JSON rows then carry it too.

#[path = "common/summary.rs"]
mod summary;
#[path = "common/timing.rs"]
mod timing;

use std::path::Path;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use rocmforge::compile::{CompileOptions, Compiled, Profile};
use rocmforge::frontend::{self, BertEncoder};
use rocmforge::interp::Bindings;
use rocmforge::ir::{format, DType, Graph, Tensor};
use timing::{time_runs, time_session, Drive};

/// One model to time: its graph, weights (empty for the example graphs) and inputs.
struct Case {
    name: String,
    graph: Graph,
    weights: std::collections::HashMap<String, Tensor>,
    inputs: Bindings,
}

fn cases(gpu: bool) -> Vec<Case> {
    let mut out = Vec::new();
    for name in ["bert_layer", "llama_block"] {
        let graph = format::load(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("graphs/{name}.json")),
        )
        .expect("example graph");
        let inputs = Bindings::random(&graph, 1);
        out.push(Case {
            name: name.into(),
            graph,
            weights: Default::default(),
            inputs,
        });
    }
    let dir = frontend::model_cache_dir(frontend::MINILM);
    if !dir.join("model.safetensors").exists() {
        eprintln!("all-MiniLM-L6-v2 not in the model cache (scripts/fetch-models): not timed");
        return out;
    }
    let enc = BertEncoder::load(&dir).expect("all-MiniLM-L6-v2");
    let configs: &[(usize, DType)] = if gpu {
        &[
            (1, DType::F32),
            (32, DType::F32),
            (1, DType::F16),
            (32, DType::F16),
        ]
    } else {
        &[(1, DType::F32)]
    };
    for &(batch, dtype) in configs {
        let graph = enc.graph_typed(batch, 128, dtype).expect("MiniLM graph");
        let weights = enc.weights_for(&graph).expect("MiniLM weights");
        // Random token ids, every position a token (no padding): what the PyTorch side runs.
        let mut inputs = Bindings::random(&graph, 1);
        inputs.inputs.insert(
            "attention_mask".into(),
            Tensor::from_f32(DType::F32, vec![batch, 128], vec![1.0; batch * 128]).unwrap(),
        );
        out.push(Case {
            name: format!("minilm_B{batch}_S128_{dtype}"),
            graph,
            weights,
            inputs,
        });
    }
    out
}

struct Row {
    case: String,
    /// Warm session, kernels launched one by one from the host.
    fused_s: f64,
    /// Warm session replaying its captured graph: launches only, and with inputs written and
    /// outputs read back every step.
    replay_s: Option<f64>,
    replay_io_s: Option<f64>,
    kernels: usize,
    unfused_s: f64,
    /// The fused model's kernel times, with ROCMFORGE_BENCH_BREAKDOWN=1 on a GPU.
    profile: Option<Profile>,
}

fn breakdown() -> bool {
    std::env::var("ROCMFORGE_BENCH_BREAKDOWN").is_ok_and(|v| v == "1")
}

/// Of five profiled runs, the one whose kernel sum is the median.
fn median_profile(c: &Compiled, inputs: &Bindings) -> Profile {
    let mut p = c.prepare(inputs).expect("prepare");
    let mut runs: Vec<Profile> = (0..5).map(|_| p.profile().expect("profile")).collect();
    runs.sort_by_key(Profile::total);
    runs.swap_remove(runs.len() / 2)
}

/// The profile as JSON: the sums, and per family its kernel count and device ms.
fn profile_json(p: &Profile) -> serde_json::Value {
    let families: serde_json::Map<String, serde_json::Value> = p
        .by_family()
        .iter()
        .map(|f| {
            let v = serde_json::json!({"kernels": f.kernels, "ms": f.time.as_secs_f64() * 1e3});
            (f.family.to_string(), v)
        })
        .collect();
    serde_json::json!({
        "kernels": p.kernels.len(),
        "kernel_sum_ms": p.total().as_secs_f64() * 1e3,
        "span_ms": p.span.as_secs_f64() * 1e3,
        "families": families,
    })
}

fn bench(c: &mut Criterion) {
    let device = timing::bench_device();
    let mut group = c.benchmark_group("models");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    let mut rows = Vec::new();
    if breakdown() && !device.is_gpu() {
        eprintln!("ROCMFORGE_BENCH_BREAKDOWN: no kernels to time here (the interpreter runs)");
    }
    for case in cases(device.is_gpu()) {
        if !summary::selected(&case.name) {
            continue;
        }
        let compile = |fuse: bool| {
            let options = CompileOptions {
                fuse,
                weights: case.weights.clone(),
                ..timing::bench_options()
            };
            Graph::compile_with(&case.graph, &device, &options).expect("compile")
        };
        let (fused, unfused) = (compile(true), compile(false));
        for (variant, compiled) in [("fused", &fused), ("unfused", &unfused)]
            .into_iter()
            .filter(|_| !summary::table_only())
        {
            group.bench_with_input(BenchmarkId::new(variant, &case.name), &(), |b, _| {
                b.iter_custom(|iters| time_runs(compiled, &case.inputs, iters))
            });
        }
        let iters = if device.is_gpu() { 50 } else { 1 };
        // The median of 5, the statistic benches/torch_compare.py takes for torch (comparing our
        // best run with torch's median flattered ours).
        let best = |c: &Compiled, drive: Drive| {
            let mut times: Vec<f64> = (0..5)
                .map(|_| time_session(c, &case.inputs, iters, drive).as_secs_f64() / iters as f64)
                .collect();
            times.sort_by(f64::total_cmp);
            times[times.len() / 2]
        };
        let plain = Drive {
            replay: false,
            io: false,
        };
        let gpu = device.is_gpu();
        rows.push(Row {
            case: case.name.clone(),
            fused_s: best(&fused, plain),
            replay_s: gpu.then(|| {
                best(
                    &fused,
                    Drive {
                        replay: true,
                        io: false,
                    },
                )
            }),
            replay_io_s: gpu.then(|| {
                best(
                    &fused,
                    Drive {
                        replay: true,
                        io: true,
                    },
                )
            }),
            kernels: fused.plan().map_or(0, |p| p.kernels.len()),
            unfused_s: best(&unfused, plain),
            profile: (breakdown() && device.is_gpu()).then(|| median_profile(&fused, &case.inputs)),
        });
    }
    group.finish();
    println!("\nmodels on {}", device.label());
    let ms = |x: Option<f64>| x.map_or("n/a".to_string(), |s| format!("{:.3}", s * 1e3));
    println!(
        "{:<26} {:>8} {:>10} {:>10} {:>12} {:>11} {:>8}",
        "case", "kernels", "fused ms", "replay ms", "replay+io ms", "unfused ms", "speedup"
    );
    for r in &rows {
        println!(
            "{:<26} {:>8} {:>10.3} {:>10} {:>12} {:>11.3} {:>7.2}x",
            r.case,
            r.kernels,
            r.fused_s * 1e3,
            ms(r.replay_s),
            ms(r.replay_io_s),
            r.unfused_s * 1e3,
            r.unfused_s / r.fused_s
        );
    }
    println!(
        "fused: a warm session launching each kernel from the host; replay: the same session \
         replaying its captured graph; +io: with inputs written and outputs read every step."
    );
    // Per kernel: a step's time over its kernels, launched from the host and replayed, and what
    // replay saves per kernel. (The device-time breakdown times each kernel between markers,
    // which adds to every kernel, so it is not subtracted here.)
    if device.is_gpu() {
        println!(
            "\n{:<26} {:>8} {:>16} {:>17} {:>18}",
            "case", "kernels", "us/kernel plain", "us/kernel replay", "saved us/kernel"
        );
        for r in &rows {
            let Some(replay) = r.replay_s else { continue };
            let per = |t: f64| t / r.kernels.max(1) as f64 * 1e6;
            println!(
                "{:<26} {:>8} {:>16.2} {:>17.2} {:>18.2}",
                r.case,
                r.kernels,
                per(r.fused_s),
                per(replay),
                per(r.fused_s - replay)
            );
        }
    }
    for r in &rows {
        if let Some(p) = &r.profile {
            println!(
                "\n{}, fused: device time by kernel family\n{}",
                r.case,
                p.family_table()
            );
        }
    }
    let json: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            let mut row = serde_json::json!({
                "case": r.case, "kernels": r.kernels, "fused_ms": r.fused_s * 1e3,
                "replay_ms": r.replay_s.map(|s| s * 1e3),
                "replay_io_ms": r.replay_io_s.map(|s| s * 1e3),
                "unfused_ms": r.unfused_s * 1e3,
            });
            if let Some(p) = &r.profile {
                row["breakdown"] = profile_json(p);
            }
            row
        })
        .collect();
    summary::write_json(&device, json);
}

criterion_group!(benches, bench);
criterion_main!(benches);
