//! The environment every bench reads, in one place: `ROCMFORGE_BENCH_FILTER` (run only the cases
//! whose name contains it), `ROCMFORGE_BENCH_TABLE_ONLY=1` (skip criterion's sampling, print only
//! the summary table) and `ROCMFORGE_BENCH_JSON=FILE` (also write that table as JSON, which
//! benches/torch_compare.py reads). The models bench alone also reads
//! `ROCMFORGE_BENCH_BREAKDOWN=1` (device time per kernel family; see benches/models.rs).

use rocmforge::runtime::Device;

/// Whether the case `name` passes `ROCMFORGE_BENCH_FILTER`.
pub fn selected(name: &str) -> bool {
    name.contains(&std::env::var("ROCMFORGE_BENCH_FILTER").unwrap_or_default())
}

pub fn table_only() -> bool {
    std::env::var("ROCMFORGE_BENCH_TABLE_ONLY").is_ok_and(|v| v == "1")
}

/// Writes `{"device": …, "rows": rows}` to `ROCMFORGE_BENCH_JSON`, when it is set.
pub fn write_json(device: &Device, rows: Vec<serde_json::Value>) {
    if let Ok(path) = std::env::var("ROCMFORGE_BENCH_JSON") {
        let doc = serde_json::json!({"device": device.label(), "rows": rows});
        std::fs::write(&path, serde_json::to_string_pretty(&doc).unwrap())
            .expect("write ROCMFORGE_BENCH_JSON");
    }
}
