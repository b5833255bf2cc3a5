//! `rocmforge embed`: sentence embeddings with a BERT-class model directory.

use std::path::Path;
use std::time::Instant;

use rocmforge::compile::CompileOptions;
use rocmforge::frontend::BertEncoder;
use rocmforge::interp::Bindings;
use rocmforge::ir::{DType, Graph};
use serde::Serialize;

use crate::common::{pick_device, tuning_line};

pub(crate) fn cmd_embed(
    model: &Path,
    device: Option<&str>,
    values: usize,
    dtype: &str,
    texts: &[String],
    choices: crate::common::Choices,
    json: bool,
) -> Result<(), String> {
    let crate::common::Choices { tune, f32_matmul } = choices;
    let dtype = DType::parse(dtype).ok_or_else(|| format!("--dtype {dtype}: not a dtype"))?;
    let enc = BertEncoder::load(model).map_err(|e| e.to_string())?;
    let device = pick_device(device)?;
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let batch = enc.tokenize(&refs).map_err(|e| e.to_string())?;
    let graph = enc
        .graph_typed(texts.len(), batch.seq_len, dtype)
        .map_err(|e| e.to_string())?;
    let weights = enc.weights_for(&graph).map_err(|e| e.to_string())?;
    let options = CompileOptions {
        weights,
        tune,
        f32_matmul,
        ..CompileOptions::default()
    };
    let compiled = Graph::compile_with(&graph, &device, &options).map_err(|e| e.to_string())?;
    crate::common::print_plan_notes(&compiled);
    let mut bindings = Bindings::default();
    for (n, t) in enc.inputs(&batch) {
        bindings.inputs.insert(n, t);
    }
    let start = Instant::now();
    let out = compiled
        .run(&bindings)
        .map_err(|e| e.to_string())?
        .remove(0)
        .to_f64_vec();
    let h = enc.config.hidden_size;
    let rows: Vec<&[f64]> = out.chunks(h).collect();
    let cosine = |a: &[f64], b: &[f64]| {
        let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
        let n =
            (a.iter().map(|x| x * x).sum::<f64>() * b.iter().map(|x| x * x).sum::<f64>()).sqrt();
        dot / n.max(1e-30)
    };
    let similarity: Vec<Vec<f64>> = rows
        .iter()
        .map(|a| rows.iter().map(|b| cosine(a, b)).collect())
        .collect();
    if json {
        let report = EmbedReport {
            model: model.display().to_string(),
            device: device.label().to_string(),
            dtype: dtype.to_string(),
            texts: texts.to_vec(),
            seconds: start.elapsed().as_secs_f64(),
            embeddings: rows.iter().map(|r| r.to_vec()).collect(),
            similarity,
        };
        outln!(
            "{}",
            serde_json::to_string(&report).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    outln!(
        "model:  {} ({} layers, hidden {})",
        model.display(),
        enc.config.num_hidden_layers,
        enc.config.hidden_size
    );
    outln!("device: {}", device.label());
    if tune {
        outln!("{}", tuning_line(&compiled.stats.tuning));
    }
    outln!("dtype:  {dtype}");
    outln!(
        "batch:  {} texts, {} tokens each after padding; {:.3} ms",
        texts.len(),
        batch.seq_len,
        start.elapsed().as_secs_f64() * 1e3
    );
    for (i, (t, e)) in texts.iter().zip(&rows).enumerate() {
        let norm = e.iter().map(|x| x * x).sum::<f64>().sqrt();
        let head: Vec<String> = e.iter().take(values).map(|x| format!("{x:.6}")).collect();
        outln!("[{i}] {t:?}");
        outln!("    norm {norm:.6}  first [{}]", head.join(", "));
    }
    outln!("cosine similarity:");
    for row in &similarity {
        let line: Vec<String> = row.iter().map(|c| format!("{c:7.4}")).collect();
        outln!("  {}", line.join(" "));
    }
    Ok(())
}

/// `embed --json`.
#[derive(Serialize)]
pub(crate) struct EmbedReport {
    model: String,
    device: String,
    dtype: String,
    texts: Vec<String>,
    /// The batch's run, compile excluded.
    seconds: f64,
    embeddings: Vec<Vec<f64>>,
    similarity: Vec<Vec<f64>>,
}
