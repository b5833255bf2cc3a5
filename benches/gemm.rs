//! The CUDA-core GEMM kernels on the best GPU: the small-M (decode) kernel in GB/s of the
//! bytes it must move (B once, A, the result: `batch·(N·K + M·K + M·N)·|dtype|`), the
//! register-blocked kernel in TF/s (`2·batch·M·N·K`). Time is taken between stream
//! synchronisations over `ITERS` runs after a warm-up. Without a GPU there is nothing to time.
//!
//! `cargo bench --bench gemm`; `ROCMFORGE_BENCH_FILTER` and `ROCMFORGE_BENCH_JSON` as described
//! in benches/common/summary.rs.

#[path = "../tests/common/gemm_cases.rs"]
mod gemm_cases;
// This bench prints only its table: `table_only` has nothing to skip here.
#[allow(dead_code)]
#[path = "common/summary.rs"]
mod summary;
#[path = "common/timing.rs"]
mod timing;

use gemm_cases::Case;
use rocmforge::compile::CompileOptions;
use rocmforge::interp::Bindings;
use rocmforge::ir::{DType, Graph};
use rocmforge::runtime::Device;

const ITERS: u64 = 50;

fn cases() -> Vec<Case> {
    let case = |dtype, m, n, k, nk| Case {
        dtype,
        batch: 1,
        m,
        n,
        k,
        nk,
        bias_silu: false,
    };
    let mut v = Vec::new();
    for dtype in [DType::F16, DType::BF16, DType::F32] {
        for m in [1, 16] {
            for (n, k) in [(4096, 4096), (11008, 4096), (4096, 11008), (1536, 576)] {
                v.push(case(dtype, m, n, k, true));
            }
            v.push(case(dtype, m, 4096, 4096, false));
        }
    }
    for nk in [false, true] {
        v.push(case(DType::F32, 4096, 4096, 4096, nk));
        v.push(case(DType::F32, 4096, 384, 1536, nk));
        v.push(case(DType::F32, 1024, 1024, 1024, nk));
    }
    v
}

fn main() {
    let (device, notes) = Device::best().unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(2)
    });
    if !device.is_gpu() {
        eprintln!("no GPU ({}): nothing to time", notes.join("; "));
        return;
    }
    println!("device: {}", device.label());
    let options = CompileOptions {
        poison: false,
        progress: false,
        fuse: false,
        ..CompileOptions::default()
    };
    let mut rows = Vec::new();
    println!("{:<40} {:>10} {:>10} {:>10}", "case", "µs", "GB/s", "TF/s");
    for case in cases() {
        let name = case.name();
        if !summary::selected(&name) {
            continue;
        }
        let g: Graph = case.graph();
        let compiled = match Graph::compile_with(&g, &device, &options) {
            Ok(c) => c,
            Err(e) => {
                println!("{name:<40} compile failed: {e}");
                continue;
            }
        };
        let inputs = Bindings::random(&g, 1);
        let secs = timing::time_runs(&compiled, &inputs, ITERS).as_secs_f64() / ITERS as f64;
        let size = case.dtype.size_bytes() as f64;
        let (b, m, n, k) = (
            case.batch as f64,
            case.m as f64,
            case.n as f64,
            case.k as f64,
        );
        let gbs = b * (n * k + m * k + m * n) * size / secs / 1e9;
        let tfs = 2.0 * b * m * n * k / secs / 1e12;
        println!("{name:<40} {:>10.1} {gbs:>10.1} {tfs:>10.2}", secs * 1e6);
        rows.push(serde_json::json!({"case": name, "seconds": secs, "gb_s": gbs, "tf_s": tfs}));
    }
    summary::write_json(&device, rows);
}
