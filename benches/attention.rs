//! Fused FlashAttention against the unfused kernels (QKᵀ, scale/mask, softmax, ·V) on the best
//! device. Time is taken between stream synchronisations (launches enqueued, then the stream
//! synchronised), never from an unsynchronised host clock; on a GPU each variant's device time
//! (the plan's kernels with the host out of the way, `Prepared::profile`) is reported beside it,
//! which is what a decode row's kernel costs when launch latency is larger than the kernel.
//! Throughput counts 4·B·Hq·Sq·Sk·D FLOPs (half for causal). Every row also carries the bytes
//! attention cannot avoid moving (Q, K, V read once, O written once) and the time they take at
//! the H100 SXM's memory bandwidth: the floor a decode row (Sq = 1) is measured against.
//!
//! Cases: prefill (Sq = Sk, causal and not) in f16 and f32, bf16 beside f16 from S = 2048, head
//! sizes 96 and 256 at S = 2048; decode with grouped-query attention (9 query heads over 3 K/V
//! heads, SmolLM2's grouping), Sq = 1 over Sk ∈ {512, 4096} keys, unmasked (a causal mask at
//! offset Sk − 1 lets the one query see every key, so it is the same attention). Names read
//! `B16_H16_S2048_D64_f16_causal` and `B1_H9x3_Sq1_Sk4096_D64_f16`:
//! `ROCMFORGE_BENCH_FILTER=Sq1_` selects the decode rows, `x3_` the GQA ones.
//! On a CPU-only machine the same bench runs a few small shapes through the interpreter.
//!
//! `cargo bench --bench attention`; `ROCMFORGE_BENCH_FILTER`, `ROCMFORGE_BENCH_TABLE_ONLY` and
//! `ROCMFORGE_BENCH_JSON` as described in benches/common/summary.rs (torch_compare.py reads the
//! JSON).

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
use timing::{kernel_families, seconds_per_run, time_runs};

/// HBM3 bandwidth of the H100 SXM5 80GB, the GPU the numbers in docs/performance.md come from:
/// 3.35 TB/s, "GPU memory bandwidth" in NVIDIA's H100 Tensor Core GPU datasheet (H100 SXM
/// column; the PCIe card's HBM2e is 2 TB/s). A floor for that GPU only: on another device the
/// floor column still divides by this.
const H100_SXM_BYTES_PER_S: f64 = 3.35e12;

struct Case {
    b: usize,
    hq: usize,
    hkv: usize,
    sq: usize,
    sk: usize,
    d: usize,
    causal: bool,
    dtype: DType,
}

impl Case {
    /// Prefill: Sq = Sk, one K/V head per query head.
    fn square(b: usize, h: usize, s: usize, d: usize, dtype: DType, causal: bool) -> Case {
        Case {
            b,
            hq: h,
            hkv: h,
            sq: s,
            sk: s,
            d,
            causal,
            dtype,
        }
    }

    /// One new token over `sk` cached keys, `hq` query heads sharing `hkv` K/V heads.
    fn decode(b: usize, (hq, hkv): (usize, usize), sk: usize, d: usize, dtype: DType) -> Case {
        Case {
            b,
            hq,
            hkv,
            sq: 1,
            sk,
            d,
            causal: false,
            dtype,
        }
    }

    fn flops(&self) -> f64 {
        let full = 4.0 * (self.b * self.hq * self.sq * self.sk * self.d) as f64;
        if self.causal {
            full / 2.0
        } else {
            full
        }
    }

    /// Q and O ([B, Hq, Sq, D]) and K and V ([B, Hkv, Sk, D]), each moved once.
    fn qkvo_bytes(&self) -> f64 {
        let q = self.b * self.hq * self.sq * self.d;
        let kv = self.b * self.hkv * self.sk * self.d;
        (2 * (q + kv) * self.dtype.size_bytes()) as f64
    }

    /// `B16_H16_S2048_D64_f16_causal` for prefill; `H9x3` for grouped heads, `Sq1_Sk4096` where
    /// the lengths differ. What ROCMFORGE_BENCH_FILTER matches.
    fn name(&self) -> String {
        let heads = if self.hq == self.hkv {
            format!("H{}", self.hq)
        } else {
            format!("H{}x{}", self.hq, self.hkv)
        };
        let lengths = if self.sq == self.sk {
            format!("S{}", self.sq)
        } else {
            format!("Sq{}_Sk{}", self.sq, self.sk)
        };
        format!(
            "B{}_{heads}_{lengths}_D{}_{}{}",
            self.b,
            self.d,
            self.dtype,
            if self.causal { "_causal" } else { "" }
        )
    }

    fn spec(&self) -> Spec {
        Spec {
            hkv: self.hkv,
            sq: self.sq,
            sk: self.sk,
            dtype: self.dtype,
            mask: if self.causal {
                Mask::Causal
            } else {
                Mask::None
            },
            scale: Scale::MulScores,
            ..Spec::new(self.b, self.hq, self.sq, self.d)
        }
    }
}

fn cases(gpu: bool) -> Vec<Case> {
    let mut out = Vec::new();
    if !gpu {
        // The interpreter's attention is plain loops: small shapes keep the bench to a minute.
        for (b, h, s, d) in [(1, 4, 128, 64), (2, 8, 256, 64)] {
            for causal in [false, true] {
                out.push(Case::square(b, h, s, d, DType::F32, causal));
            }
        }
        out.push(Case::decode(1, (9, 3), 512, 64, DType::F32));
        return out;
    }
    for (b, h, s, d) in [
        (16, 16, 512, 64),
        (16, 16, 2048, 64),
        (4, 16, 8192, 64),
        (16, 16, 512, 128),
        (16, 16, 2048, 128),
        (4, 16, 8192, 128),
        (16, 16, 2048, 96),
        (16, 16, 2048, 256),
    ] {
        let dtypes: &[DType] = match d {
            // The head sizes outside {64, 128} check that the per-head-size configurations
            // exist, on the tensor-core dtype.
            96 | 256 => &[DType::F16],
            _ if s >= 2048 => &[DType::F16, DType::BF16, DType::F32],
            _ => &[DType::F16, DType::F32],
        };
        for &dtype in dtypes {
            for causal in [false, true] {
                out.push(Case::square(b, h, s, d, dtype, causal));
            }
        }
    }
    for b in [1, 8] {
        for sk in [512, 4096] {
            for dtype in [DType::F16, DType::F32] {
                out.push(Case::decode(b, (9, 3), sk, 64, dtype));
            }
        }
    }
    out
}

/// How one variant (fused or unfused) measured.
struct Timing {
    /// Host time per run, launches through synchronisation.
    seconds: f64,
    /// The plan's kernels alone on the device's clock (median of profiled runs); None on the
    /// CPU, which has no kernels.
    device_seconds: Option<f64>,
    /// What the memory plan allocates per run.
    planned_bytes: usize,
    kernels: String,
}

fn measure(c: &Compiled, inputs: &Bindings, gpu: bool) -> Timing {
    let (target, repeats) = if gpu {
        (Duration::from_millis(2), 5)
    } else {
        (Duration::ZERO, 3)
    };
    Timing {
        seconds: seconds_per_run(c, inputs, target, repeats),
        device_seconds: gpu.then(|| device_seconds(c, inputs, repeats)).flatten(),
        planned_bytes: c.memory().map_or(0, |m| m.planned_bytes),
        kernels: kernel_families(c),
    }
}

/// The median over `repeats` profiled runs of their span (first kernel's start to last one's
/// end); a profile the device refuses is reported and leaves the column empty.
fn device_seconds(c: &Compiled, inputs: &Bindings, repeats: usize) -> Option<f64> {
    let mut p = c.prepare(inputs).expect("prepare");
    let mut spans = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        match p.profile() {
            Ok(profile) => spans.push(profile.span.as_secs_f64()),
            Err(e) => {
                eprintln!("profile: {e}");
                return None;
            }
        }
    }
    spans.sort_by(f64::total_cmp);
    Some(spans[spans.len() / 2])
}

struct Row {
    case: Case,
    fused: Timing,
    unfused: Timing,
}

fn bench(c: &mut Criterion) {
    let device = timing::bench_device();
    let gpu = device.is_gpu();
    let options = timing::bench_options();
    let mut rows = Vec::new();
    let mut group = c.benchmark_group("attention");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    for case in cases(gpu) {
        let name = case.name();
        if !summary::selected(&name) {
            continue;
        }
        let g = build(&case.spec());
        let inputs = Bindings::random(&g, 1);
        let unfused_options = CompileOptions {
            fuse: false,
            ..options.clone()
        };
        let compile = |o: &CompileOptions, variant: &str| {
            Graph::compile_with(&g, &device, o)
                .map_err(|e| eprintln!("{name}: {variant} does not compile here: {e}"))
                .ok()
        };
        // A shape the device cannot hold (the unfused S² scores at S = 8192 in f32) is
        // reported and skipped, not fatal.
        let (Some(fused), Some(unfused)) = (
            compile(&options, "fused"),
            compile(&unfused_options, "unfused"),
        ) else {
            continue;
        };
        group.throughput(Throughput::Elements(case.flops() as u64));
        for (variant, compiled) in [("fused", &fused), ("unfused", &unfused)]
            .into_iter()
            .filter(|_| !summary::table_only())
        {
            group.bench_with_input(BenchmarkId::new(variant, &name), &(), |bch, _| {
                bch.iter_custom(|iters| time_runs(compiled, &inputs, iters))
            });
        }
        rows.push(Row {
            fused: measure(&fused, &inputs, gpu),
            unfused: measure(&unfused, &inputs, gpu),
            case,
        });
    }
    group.finish();
    print_table(&device, &rows);
}

fn print_table(device: &Device, rows: &[Row]) {
    let ms = |s: f64| s * 1e3;
    let opt_ms = |s: Option<f64>| s.map_or("-".to_string(), |s| format!("{:.4}", ms(s)));
    println!("\nattention on {}", device.label());
    println!(
        "{:<30} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>10} {:>10}  fused kernels",
        "case",
        "fused ms",
        "fus dev",
        "unfus ms",
        "fused TF",
        "unfus TF",
        "speedup",
        "QKVO MB",
        "floor ms",
        "dev/floor",
        "fused mem",
        "unfus mem"
    );
    for r in rows {
        let floor = r.case.qkvo_bytes() / H100_SXM_BYTES_PER_S;
        println!(
            "{:<30} {:>9.4} {:>9} {:>9.4} {:>8.2} {:>8.2} {:>7.2}x {:>9.2} {:>9.4} {:>9} {:>8.1}MB {:>8.1}MB  {}",
            r.case.name(),
            ms(r.fused.seconds),
            opt_ms(r.fused.device_seconds),
            ms(r.unfused.seconds),
            r.case.flops() / r.fused.seconds / 1e12,
            r.case.flops() / r.unfused.seconds / 1e12,
            r.unfused.seconds / r.fused.seconds,
            r.case.qkvo_bytes() / 1e6,
            ms(floor),
            r.fused
                .device_seconds
                .map_or("-".to_string(), |d| format!("{:.1}x", d / floor)),
            r.fused.planned_bytes as f64 / 1e6,
            r.unfused.planned_bytes as f64 / 1e6,
            r.fused.kernels
        );
    }
    println!(
        "fus dev: the fused plan's kernels on the device's clock; floor: Q, K, V, O moved once at \
         the H100 SXM's {:.2} TB/s; dev/floor: how far the fused kernels are from it.",
        H100_SXM_BYTES_PER_S / 1e12
    );
    let json: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            let c = &r.case;
            serde_json::json!({
                "case": c.name(),
                "b": c.b,
                "hq": c.hq,
                "hkv": c.hkv,
                "sq": c.sq,
                "sk": c.sk,
                "d": c.d,
                "dtype": c.dtype.to_string(),
                "causal": c.causal,
                "flops": c.flops(),
                "qkvo_bytes": c.qkvo_bytes(),
                "floor_bytes_per_s": H100_SXM_BYTES_PER_S,
                "floor_ms": ms(c.qkvo_bytes() / H100_SXM_BYTES_PER_S),
                "fused_ms": ms(r.fused.seconds),
                "unfused_ms": ms(r.unfused.seconds),
                "fused_device_ms": r.fused.device_seconds.map(ms),
                "unfused_device_ms": r.unfused.device_seconds.map(ms),
                "fused_bytes": r.fused.planned_bytes,
                "unfused_bytes": r.unfused.planned_bytes,
                "fused_kernels": r.fused.kernels,
                "unfused_kernels": r.unfused.kernels,
            })
        })
        .collect();
    summary::write_json(device, json);
}

criterion_group!(benches, bench);
criterion_main!(benches);
