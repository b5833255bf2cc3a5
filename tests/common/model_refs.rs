//! The model tests' reference files: where the committed tiny models live, the readers of the
//! JSON references transformers wrote (`reference.json`, `hf-reference.json`), and the
//! relative L2 distance logits are held to.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use serde_json::Value;

/// `tests/data/models/<name>`: the tiny model `name` (`scripts/make-test-models` makes it).
pub fn tiny_model_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/models")
        .join(name)
}

/// The JSON file at `path`; the error names the file.
pub fn read_json(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// A JSON array of token ids; panics on anything else.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// A JSON array of numbers; panics on anything else.
pub fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// The token ids of a JSON array, skipping what is not one; empty where `v` is not an array
/// (for trials that report a mismatch rather than panic).
pub fn ids_lenient(v: &Value) -> Vec<u32> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_u64())
                .map(|x| x as u32)
                .collect()
        })
        .unwrap_or_default()
}

/// The numbers of a JSON array, skipping what is not one; empty where `v` is not an array.
pub fn floats_lenient(v: &Value) -> Vec<f64> {
    v.as_array()
        .map(|a| a.iter().filter_map(|x| x.as_f64()).collect())
        .unwrap_or_default()
}

/// ‖got − want‖ / ‖want‖; a NaN result (a NaN anywhere, or both zero) is infinitely far.
/// Panics where the lengths differ.
pub fn rel_l2(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let num: f64 = got.iter().zip(want).map(|(a, b)| (a - b).powi(2)).sum();
    let den: f64 = want.iter().map(|b| b * b).sum();
    let e = (num / den).sqrt();
    if e.is_nan() {
        f64::INFINITY
    } else {
        e
    }
}

/// [`rel_l2`], with lengths that differ infinitely far instead of a panic.
pub fn rel_l2_or_inf(got: &[f64], want: &[f64]) -> f64 {
    if got.len() != want.len() {
        return f64::INFINITY;
    }
    rel_l2(got, want)
}
