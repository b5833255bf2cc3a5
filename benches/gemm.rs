//! Linear layers as the models lower them, `x [M,K] @ permute(W [N,K])` with the weight stored
//! `[N,K]` as in Hugging Face and GGUF files, compiled through the public API on the best device:
//! whatever kernels the compiler picks for that graph (a layout copy and a matmul, or one GEMM
//! reading the weight in place) are what is timed. Shapes are the (N, K) of all-MiniLM-L6-v2 and
//! SmolLM2-135M at M ∈ {1, 16, 32, 128, 4096}, in f16, bf16 and f32, plus bias + GELU in the
//! epilogue for MiniLM's FFN-up shape; and SmolLM2's decode projections on its GGUF's quantized
//! weights (Q4_1 576 → 1536 and 1536 → 576, Q4_0 576 → 1536, the Q8_0 LM head 576 → 49152) at
//! M 1, 8, 16 and 32 in f16 and f32 (`_q4_1`, `_q8_0`: the weight stays in its blocks; up to M 8
//! the GEMV with 8-bit activations and int8 dot products reads it, at 16 the small-M kernel
//! dequantizes it in registers, at 32 in two row groups); and Q4_K/Q6_K (Q4_K_M files) at SmolLM2's down projection
//! and Llama-3.2-1B's projections, M 1 and 4, f16 (`_q4_k`, `_q6_k`: the K-quant GEMV with
//! 8-bit activations; `ROCMFORGE_BENCH_QUANT_SPLIT=on|off` quantizes their activations in a
//! kernel of their own, or in every block of the GEMV, whatever the size of W: one executable
//! times both forms). Throughput counts 2·M·N·K FLOPs; the table also gives the
//! bytes a run moves at least (W, A and the result once) and bytes / time in GB/s, which a
//! decode GEMV should bring near the device's DRAM bandwidth.
//!
//! Time is taken between stream synchronisations (launches enqueued on one stream, then that
//! stream synchronised). On a CPU-only machine the same bench runs the interpreter at M ≤ 16 on
//! MiniLM's shapes.
//!
//! `cargo bench --bench gemm`; `ROCMFORGE_BENCH_FILTER`, `ROCMFORGE_BENCH_TABLE_ONLY` and
//! `ROCMFORGE_BENCH_JSON` as described in benches/common/summary.rs (torch_compare.py --gemm
//! reads the JSON).

#[path = "../tests/common/linear_graphs.rs"]
mod linear_graphs;
#[path = "../tests/common/quant_cases.rs"]
mod quant_cases;
#[path = "common/summary.rs"]
mod summary;
#[path = "common/timing.rs"]
mod timing;

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use linear_graphs::linear;
use rocmforge::interp::Bindings;
use rocmforge::ir::{DType, Graph, GraphError, QuantScheme};
use rocmforge::runtime::Device;
use timing::{kernel_families, seconds_per_run, time_runs};

/// One linear layer of a model: its output features N and input features K.
struct Layer {
    model: &'static str,
    layer: &'static str,
    n: usize,
    k: usize,
}

/// all-MiniLM-L6-v2: hidden 384, intermediate 1536.
const MINILM: [Layer; 3] = [
    Layer {
        model: "minilm",
        layer: "qkvo",
        n: 384,
        k: 384,
    },
    Layer {
        model: "minilm",
        layer: "ffn_up",
        n: 1536,
        k: 384,
    },
    Layer {
        model: "minilm",
        layer: "ffn_down",
        n: 384,
        k: 1536,
    },
];

/// SmolLM2-135M: hidden 576, intermediate 1536, 9 query heads and 3 key/value heads of 64,
/// vocabulary 49152. q and o share (576, 576); k and v (192, 576); gate and up (1536, 576).
const SMOLLM2: [Layer; 5] = [
    Layer {
        model: "smollm2",
        layer: "q_o",
        n: 576,
        k: 576,
    },
    Layer {
        model: "smollm2",
        layer: "kv",
        n: 192,
        k: 576,
    },
    Layer {
        model: "smollm2",
        layer: "gate_up",
        n: 1536,
        k: 576,
    },
    Layer {
        model: "smollm2",
        layer: "down",
        n: 576,
        k: 1536,
    },
    Layer {
        model: "smollm2",
        layer: "lm_head",
        n: 49152,
        k: 576,
    },
];

/// The layer that also gets the bias + GELU epilogue: BERT's FFN up-projection.
const EPILOGUE_LAYER: (&str, &str) = ("minilm", "ffn_up");

struct Case {
    model: &'static str,
    layer: &'static str,
    m: usize,
    n: usize,
    k: usize,
    dtype: DType,
    /// `gelu(x·Wᵀ + b)` instead of `x·Wᵀ`.
    bias_gelu: bool,
    /// W stored in blocks of this scheme (the graph reads it as `x·Wᵀ`, no epilogue).
    quant: Option<QuantScheme>,
}

impl Case {
    fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }

    /// Bytes a run must move at least: W once (its blocks, when quantized), A and the result
    /// once. Decode GEMVs are bound by this, so bytes / time against the device's DRAM
    /// bandwidth says how far a kernel is from its limit.
    fn bytes(&self) -> f64 {
        let elem = self.dtype.size_bytes();
        let w = match self.quant {
            Some(q) => self.n * (self.k / q.block_elems()) * q.block_bytes(),
            None => self.n * self.k * elem,
        };
        (w + self.m * self.k * elem + self.m * self.n * elem) as f64
    }

    /// `M128_N1536_K384_f16` (`_bias_gelu` with the epilogue): what ROCMFORGE_BENCH_FILTER
    /// matches and torch_compare.py reads back.
    fn name(&self) -> String {
        format!(
            "M{}_N{}_K{}_{}{}{}",
            self.m,
            self.n,
            self.k,
            self.dtype,
            if self.bias_gelu { "_bias_gelu" } else { "" },
            self.quant.map(|q| format!("_{q}")).unwrap_or_default()
        )
    }

    /// The graph a model's frontend builds for this layer.
    fn graph(&self) -> Result<Graph, GraphError> {
        if let Some(scheme) = self.quant {
            return Ok(quant_cases::QuantCase {
                scheme,
                dtype: self.dtype,
                m: self.m,
                n: self.n,
                k: self.k,
                bias: false,
            }
            .graph());
        }
        linear(
            &self.name(),
            self.m,
            self.n,
            self.k,
            self.dtype,
            self.bias_gelu,
        )
    }
}

fn cases(gpu: bool) -> Vec<Case> {
    let (ms, dtypes, layers): (&[usize], &[DType], Vec<&Layer>) = if gpu {
        (
            // 32: a batched decode step's rows, on the GEMV's row groups where the tiled grid is
            // small (issue 26), the tiled kernel elsewhere.
            &[1, 16, 32, 128, 4096],
            &[DType::F16, DType::BF16, DType::F32],
            MINILM.iter().chain(&SMOLLM2).collect(),
        )
    } else {
        // The interpreter's matmul is a plain loop: small shapes keep the bench to a minute.
        (&[1, 16], &[DType::F32, DType::F16], MINILM.iter().collect())
    };
    let mut out = Vec::new();
    for &dtype in dtypes {
        for layer in &layers {
            for &m in ms {
                for bias_gelu in [false, true] {
                    if bias_gelu && (layer.model, layer.layer) != EPILOGUE_LAYER {
                        continue;
                    }
                    out.push(Case {
                        model: layer.model,
                        layer: layer.layer,
                        m,
                        n: layer.n,
                        k: layer.k,
                        dtype,
                        bias_gelu,
                        quant: None,
                    });
                }
            }
        }
    }
    if gpu {
        // SmolLM2's GGUF: Q4_1 layer matrices, the Q8_0 embedding tied as the LM head.
        let quantized = [
            ("gate_up", 1536, 576, QuantScheme::Q4_1),
            ("gate_up", 1536, 576, QuantScheme::Q4_0),
            ("down", 576, 1536, QuantScheme::Q4_1),
            ("lm_head", 49152, 576, QuantScheme::Q8_0),
        ];
        for dtype in [DType::F16, DType::F32] {
            for (layer, n, k, scheme) in quantized {
                // M 1 and 8: the int8-activation GEMV (Q4_0/Q4_1/Q8_0); 16 the f32 one; 32 the
                // f32 one in two row groups (issue 26; the LM head: dequantize + the tiled kernel).
                for m in [1, 8, 16, 32] {
                    out.push(Case {
                        model: "smollm2",
                        layer,
                        m,
                        n,
                        k,
                        dtype,
                        bias_gelu: false,
                        quant: Some(scheme),
                    });
                }
            }
        }
        // Q4_K_M files: Q4_K and Q6_K (the K-quant GEMV with 8-bit activations up to M 4).
        // SmolLM2's down projection (its other matrices have K 576, not whole super-blocks:
        // llama-quantize falls back to Q5_0/Q8_0 there) and Llama-3.2-1B's projections.
        let kquant = [
            ("smollm2", "down", 576, 1536),
            ("llama-1b", "qo", 2048, 2048),
            ("llama-1b", "kv", 512, 2048),
            ("llama-1b", "gate_up", 8192, 2048),
            ("llama-1b", "down", 2048, 8192),
            ("llama-1b", "lm_head", 128256, 2048),
        ];
        for (model, layer, n, k) in kquant {
            for scheme in [QuantScheme::Q4K, QuantScheme::Q6K] {
                for m in [1, 4] {
                    out.push(Case {
                        model,
                        layer,
                        m,
                        n,
                        k,
                        dtype: DType::F16,
                        bias_gelu: false,
                        quant: Some(scheme),
                    });
                }
            }
        }
    }
    out
}

struct Row {
    case: Case,
    seconds: f64,
    /// The plan's kernels by family, in launch order (`copy+matmul`), or `interpreter`.
    kernels: String,
}

fn bench(c: &mut Criterion) {
    let device = timing::bench_device();
    let gpu = device.is_gpu();
    let options = timing::bench_options();
    let (target, repeats) = if gpu {
        (Duration::from_millis(2), 5)
    } else {
        (Duration::ZERO, 3)
    };
    let mut rows = Vec::new();
    let mut group = c.benchmark_group("gemm");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_secs(1));
    for case in cases(gpu) {
        let name = case.name();
        if !summary::selected(&name) {
            continue;
        }
        let g = case.graph().expect("a linear layer's graph");
        let inputs = Bindings::random(&g, 1);
        let compiled = match Graph::compile_with(&g, &device, &options) {
            Ok(c) => c,
            Err(e) => {
                // A shape the device cannot hold is reported and skipped, not fatal.
                eprintln!("{name}: {e}");
                continue;
            }
        };
        if !summary::table_only() {
            group.throughput(Throughput::Elements(case.flops() as u64));
            group.bench_with_input(BenchmarkId::new("ours", &name), &(), |b, _| {
                b.iter_custom(|iters| time_runs(&compiled, &inputs, iters))
            });
        }
        rows.push(Row {
            seconds: seconds_per_run(&compiled, &inputs, target, repeats),
            kernels: kernel_families(&compiled),
            case,
        });
    }
    group.finish();
    print_table(&device, &rows);
}

fn print_table(device: &Device, rows: &[Row]) {
    println!("\ngemm on {}", device.label());
    println!(
        "{:<30} {:<18} {:>10} {:>9} {:>12} {:>8}  kernels",
        "case", "layer", "ms", "TFLOP/s", "bytes", "GB/s"
    );
    for r in rows {
        println!(
            "{:<30} {:<18} {:>10.4} {:>9.3} {:>12} {:>8.1}  {}",
            r.case.name(),
            format!("{} {}", r.case.model, r.case.layer),
            r.seconds * 1e3,
            r.case.flops() / r.seconds / 1e12,
            r.case.bytes(),
            r.case.bytes() / r.seconds / 1e9,
            r.kernels
        );
    }
    let json: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            serde_json::json!({
                "case": r.case.name(),
                "model": r.case.model,
                "layer": r.case.layer,
                "m": r.case.m,
                "n": r.case.n,
                "k": r.case.k,
                "dtype": r.case.dtype.to_string(),
                "bias_gelu": r.case.bias_gelu,
                "quant": r.case.quant.map(|q| q.name()),
                "flops": r.case.flops(),
                "bytes": r.case.bytes(),
                "gb_per_s": r.case.bytes() / r.seconds / 1e9,
                "ms": r.seconds * 1e3,
                "kernels": r.kernels,
            })
        })
        .collect();
    summary::write_json(device, json);
}

criterion_group!(benches, bench);
criterion_main!(benches);
