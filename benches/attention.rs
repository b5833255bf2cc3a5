//! Fused FlashAttention against the unfused kernels (QKᵀ, scale/mask, softmax, ·V) on the best
//! device. Time is taken between stream synchronisations (launches enqueued, then the stream
//! synchronised), never from an unsynchronised host clock. Throughput counts 4·B·H·S²·D FLOPs
//! (half for causal). On a CPU-only machine the same bench runs smaller shapes through the
//! interpreter.
//!
//! `cargo bench --bench attention`; `ROCMFORGE_BENCH_FILTER`, `ROCMFORGE_BENCH_TABLE_ONLY` and
//! `ROCMFORGE_BENCH_JSON` as described in benches/common/summary.rs.

#[path = "../tests/common/attention_graphs.rs"]
mod attention_graphs;
#[path = "common/summary.rs"]
mod summary;
#[path = "common/timing.rs"]
mod timing;

use std::time::Duration;

use attention_graphs::{build, Mask, Scale, Spec};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rocmforge::compile::{CompileOptions, Compiled};
use rocmforge::interp::Bindings;
use rocmforge::ir::{DType, Graph};
use rocmforge::runtime::Device;
use timing::time_runs;

struct Case {
    b: usize,
    h: usize,
    s: usize,
    d: usize,
    causal: bool,
    dtype: DType,
}

impl Case {
    fn flops(&self) -> f64 {
        let full = 4.0 * (self.b * self.h * self.s * self.s * self.d) as f64;
        if self.causal {
            full / 2.0
        } else {
            full
        }
    }
    fn name(&self) -> String {
        format!(
            "B{}_H{}_S{}_D{}_{}{}",
            self.b,
            self.h,
            self.s,
            self.d,
            self.dtype,
            if self.causal { "_causal" } else { "" }
        )
    }
    fn spec(&self) -> Spec {
        Spec {
            dtype: self.dtype,
            mask: if self.causal {
                Mask::Causal
            } else {
                Mask::None
            },
            scale: Scale::MulScores,
            ..Spec::new(self.b, self.h, self.s, self.d)
        }
    }
}

fn cases(gpu: bool) -> Vec<Case> {
    let shapes: Vec<(usize, usize, usize, usize)> = if gpu {
        vec![
            (16, 16, 512, 64),
            (16, 16, 2048, 64),
            (4, 16, 8192, 64),
            (16, 16, 512, 128),
            (16, 16, 2048, 128),
            (4, 16, 8192, 128),
        ]
    } else {
        vec![(1, 4, 128, 64), (2, 8, 256, 64)]
    };
    let dtypes = if gpu {
        vec![DType::F16, DType::F32]
    } else {
        vec![DType::F32]
    };
    let mut out = Vec::new();
    for (b, h, s, d) in shapes {
        for &dtype in &dtypes {
            for causal in [false, true] {
                out.push(Case {
                    b,
                    h,
                    s,
                    d,
                    causal,
                    dtype,
                });
            }
        }
    }
    out
}

struct Row {
    case: String,
    flops: f64,
    fused_s: f64,
    unfused_s: f64,
    fused_bytes: usize,
    unfused_bytes: usize,
}

fn bench(c: &mut Criterion) {
    let device = timing::bench_device();
    let options = timing::bench_options();
    let mut rows = Vec::new();
    let mut group = c.benchmark_group("attention");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    for case in cases(device.is_gpu()) {
        if !summary::selected(&case.name()) {
            continue;
        }
        let g = build(&case.spec());
        let inputs = Bindings::random(&g, 1);
        let fused = Graph::compile_with(&g, &device, &options).expect("compile fused");
        let unfused = match Graph::compile_with(
            &g,
            &device,
            &CompileOptions {
                fuse: false,
                ..options.clone()
            },
        ) {
            Ok(u) => u,
            Err(e) => {
                eprintln!("{}: unfused does not fit: {e}", case.name());
                continue;
            }
        };
        group.throughput(Throughput::Elements(case.flops() as u64));
        for (variant, compiled) in [("fused", &fused), ("unfused", &unfused)]
            .into_iter()
            .filter(|_| !summary::table_only())
        {
            group.bench_with_input(BenchmarkId::new(variant, case.name()), &(), |bch, _| {
                bch.iter_custom(|iters| time_runs(compiled, &inputs, iters))
            });
        }
        // The summary table: the best of three 5-run timings per variant.
        let best = |c: &Compiled| {
            (0..3)
                .map(|_| time_runs(c, &inputs, 5).as_secs_f64() / 5.0)
                .fold(f64::INFINITY, f64::min)
        };
        let bytes = |c: &Compiled| c.memory.as_ref().map_or(0, |m| m.planned_bytes);
        rows.push(Row {
            case: case.name(),
            flops: case.flops(),
            fused_s: best(&fused),
            unfused_s: best(&unfused),
            fused_bytes: bytes(&fused),
            unfused_bytes: bytes(&unfused),
        });
    }
    group.finish();
    print_table(&device, &rows);
}

fn print_table(device: &Device, rows: &[Row]) {
    println!("\nattention on {}", device.label());
    println!(
        "{:<34} {:>10} {:>10} {:>9} {:>9} {:>8} {:>12} {:>12}",
        "case",
        "fused ms",
        "unfused ms",
        "fused TF",
        "unfus TF",
        "speedup",
        "fused mem",
        "unfused mem"
    );
    for r in rows {
        println!(
            "{:<34} {:>10.3} {:>10.3} {:>9.2} {:>9.2} {:>7.2}x {:>10.1}MB {:>10.1}MB",
            r.case,
            r.fused_s * 1e3,
            r.unfused_s * 1e3,
            r.flops / r.fused_s / 1e12,
            r.flops / r.unfused_s / 1e12,
            r.unfused_s / r.fused_s,
            r.fused_bytes as f64 / 1e6,
            r.unfused_bytes as f64 / 1e6
        );
    }
    let json: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| serde_json::json!({"case": r.case, "flops": r.flops, "fused_ms": r.fused_s * 1e3, "unfused_ms": r.unfused_s * 1e3, "fused_bytes": r.fused_bytes, "unfused_bytes": r.unfused_bytes}))
        .collect();
    summary::write_json(device, json);
}

criterion_group!(benches, bench);
criterion_main!(benches);
