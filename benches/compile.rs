//! Compile time, cold against warm: each model compiled for the best device with an empty kernel
//! cache over a fresh directory (every kernel compiled: cold), then again through a new cache
//! over the same directory (every kernel read from disk: a warm start, as after a restart), and
//! the ratio. Wall-clock seconds of `Graph::compile_with` (passes, codegen, kernels compiled or
//! loaded, weights uploaded), the median of three for each (the statistic every bench takes). The device (its context) is opened
//! before timing, in both cases.
//!
//! Same environment as the other benches (benches/common/summary.rs): `ROCMFORGE_BENCH_FILTER`,
//! `ROCMFORGE_BENCH_JSON`. Without a GPU there are no kernels: it says so and times nothing.

#[path = "common/summary.rs"]
#[allow(dead_code)] // table_only: this bench prints a table only
mod summary;
#[path = "common/timing.rs"]
mod timing;

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use rocmforge::compile::CompileOptions;
use rocmforge::frontend::{self, BertEncoder};
use rocmforge::ir::{format, DType, Graph, Tensor};
use rocmforge::runtime::{Device, DiskCache, KernelCache};

struct Case {
    name: String,
    graph: Graph,
    weights: HashMap<String, Tensor>,
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for name in ["bert_layer", "llama_block"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("graphs/{name}.json"));
        out.push(Case {
            name: name.into(),
            graph: format::load(&path).expect("example graph"),
            weights: HashMap::new(),
        });
    }
    let dir = frontend::model_cache_dir(frontend::MINILM);
    if !dir.join("model.safetensors").exists() {
        eprintln!("all-MiniLM-L6-v2 not in the model cache (scripts/fetch-models): not timed");
        return out;
    }
    let enc = BertEncoder::load(&dir).expect("all-MiniLM-L6-v2");
    for (batch, dtype) in [(1, DType::F16), (32, DType::F16)] {
        let graph = enc.graph_typed(batch, 128, dtype).expect("MiniLM graph");
        let weights = enc.weights_for(&graph).expect("MiniLM weights");
        out.push(Case {
            name: format!("minilm_B{batch}_S128_{dtype}"),
            graph,
            weights,
        });
    }
    out
}

/// Seconds to compile `case` on a device with a fresh in-memory cache over `dir`, and how many
/// kernels were compiled and read from disk.
fn compile_once(spec: &str, dir: &Path, case: &Case) -> (f64, usize, usize) {
    let device = Device::open_with_cache(
        spec,
        KernelCache::with_disk(Some(DiskCache::new(dir.to_path_buf()))),
    )
    .expect("device");
    let options = CompileOptions {
        weights: case.weights.clone(),
        ..timing::bench_options()
    };
    let t = Instant::now();
    let c = Graph::compile_with(&case.graph, &device, &options).expect("compile");
    let s = t.elapsed().as_secs_f64();
    (s, c.stats.compiled, c.stats.from_disk)
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return; // `cargo test` runs bench targets without --bench: nothing to check here.
    }
    let device = timing::bench_device();
    if !device.is_gpu() {
        eprintln!("compile bench: no GPU, so no kernels to compile; nothing timed");
        return;
    }
    let spec = device.spec().to_string();
    println!(
        "\n{:<22} {:>8} {:>9} {:>8} {:>9} {:>9}",
        "case", "kernels", "cold s", "from disk", "warm s", "warm/cold"
    );
    let mut rows = Vec::new();
    for case in cases() {
        if !summary::selected(&case.name) {
            continue;
        }
        let (mut colds, mut warms) = (Vec::new(), Vec::new());
        let (mut kernels, mut disk) = (0, 0);
        for _ in 0..3 {
            let dir = tempdir(&case.name);
            let (c, compiled, _) = compile_once(&spec, &dir, &case);
            let (w, again, from_disk) = compile_once(&spec, &dir, &case);
            assert_eq!(again, 0, "{}: a warm start compiled kernels", case.name);
            colds.push(c);
            warms.push(w);
            (kernels, disk) = (compiled, from_disk);
            let _ = std::fs::remove_dir_all(&dir);
        }
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (cold, warm) = (median(colds), median(warms));
        println!(
            "{:<22} {:>8} {:>9.3} {:>8} {:>9.4} {:>9.4}",
            case.name,
            kernels,
            cold,
            disk,
            warm,
            warm / cold
        );
        rows.push(serde_json::json!({
            "case": case.name, "kernels": kernels, "cold_s": cold, "from_disk": disk,
            "warm_s": warm, "warm_over_cold": warm / cold,
        }));
    }
    summary::write_json(&device, rows);
}

/// A fresh, empty cache directory for one measurement.
fn tempdir(name: &str) -> std::path::PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!(
        "rocmforge-compile-bench-{}-{name}-{nanos}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}
