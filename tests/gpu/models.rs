//! Real models on the device: the tiny llama and SmolLM2 (llama.rs), all-MiniLM-L6-v2 against PyTorch.

use std::path::{Path, PathBuf};

use crate::harness::*;
use libtest_mimic::{Failed, Trial};
use rocmforge::compile::CompileOptions;
use rocmforge::frontend::llama::Precision;
use rocmforge::interp::Bindings;
use rocmforge::ir::{DType, Graph};
use rocmforge::runtime::Device;

pub fn minilm_dir() -> Option<PathBuf> {
    let dir = rocmforge::frontend::model_cache_dir(rocmforge::frontend::MINILM);
    dir.join("model.safetensors").exists().then_some(dir)
}

/// all-MiniLM-L6-v2 compiled for the GPU in `dtype`, the reference sentences in one padded batch,
/// against PyTorch's f32 embeddings: cosine ≥ `min_cos` (0.9999 for f32, 0.999 for f16).
pub fn minilm_matches_reference(
    device: &Device,
    dir: &Path,
    dtype: DType,
    min_cos: f64,
) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let enc = rocmforge::frontend::BertEncoder::load(dir).map_err(|e| e.to_string())?;
    let r: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/reference/minilm/reference.json"),
        )
        .map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    let cases = r["cases"].as_array().ok_or("reference cases")?;
    let texts: Vec<&str> = cases
        .iter()
        .map(|c| c["text"].as_str().unwrap_or_default())
        .collect();
    let batch = enc.tokenize(&texts).map_err(|e| e.to_string())?;
    let g = enc
        .graph_typed(texts.len(), batch.seq_len, dtype)
        .map_err(|e| e.to_string())?;
    let weights = enc.weights_for(&g).map_err(|e| e.to_string())?;
    let c = Graph::compile_with(
        &g,
        device,
        &CompileOptions {
            weights,
            ..options()
        },
    )
    .map_err(|e| e.to_string())?;
    let fa = c
        .graph
        .node_ids()
        .filter(|&id| matches!(c.graph.op(id), rocmforge::ir::Op::FlashAttention(_)))
        .count();
    if fa != 6 {
        return Err(format!("{fa} fused attention layers, expected 6").into());
    }
    let mut b = Bindings::default();
    for (n, t) in enc.inputs(&batch) {
        b.inputs.insert(n, t);
    }
    let out = c.run(&b).map_err(|e| e.to_string())?.remove(0).to_f64_vec();
    for (i, case) in cases.iter().enumerate() {
        let want: Vec<f64> =
            serde_json::from_value(case["embedding"].clone()).map_err(|e| e.to_string())?;
        let got = &out[i * want.len()..(i + 1) * want.len()];
        let dot: f64 = got.iter().zip(&want).map(|(a, b)| a * b).sum();
        let cos = dot
            / (got.iter().map(|a| a * a).sum::<f64>().sqrt()
                * want.iter().map(|b| b * b).sum::<f64>().sqrt());
        if cos.is_nan() || cos < min_cos {
            return Err(format!("{dtype} {:?}: cosine {cos}", texts[i]).into());
        }
    }
    Ok(())
}

/// The tiny llama and SmolLM2 generation.
pub fn llama(device: &Device, ignored: &Option<String>, trials: &mut Vec<Trial>) {
    {
        let d = device.clone();
        push(
            trials,
            ignored,
            "llama::tiny_kv_cache_matches_the_interpreter".into(),
            Box::new(move || crate::llama::tiny(&d)),
        );
        let d = device.clone();
        push(
            trials,
            ignored,
            "llama::tiny_persistent_decode_equals_per_kernel".into(),
            Box::new(move || crate::llama::tiny_persistent(&d)),
        );
        let d = device.clone();
        push(
            trials,
            ignored,
            "llama::tiny_persistent_stall_is_a_typed_error".into(),
            Box::new(move || crate::llama::tiny_persistent_stall(&d)),
        );
    }
    // The batched generator (paged KV cache, sequences joining mid-way) against lone runs
    // through the contiguous caches, on this device (tests/common/batched_cases.rs).
    for name in ["llama3-tiny", "qwen3-tiny"] {
        let d = device.clone();
        push(
            trials,
            ignored,
            format!("serve::batched_matches_alone_{}", name.replace('-', "_")),
            Box::new(move || {
                crate::common::batched_cases::batch_matches_alone(name, &d, 1e-3);
                Ok(())
            }),
        );
    }
    // Prompts prefilled in chunks (the chunk plans: gathered pool rows through the prompt's
    // flash attention) against the same prompts whole, on this device; the chunked plans
    // replayed (captured on their first run, as `serve` runs them).
    for name in ["llama3-tiny", "qwen3-tiny"] {
        let d = device.clone();
        push(
            trials,
            ignored,
            format!("serve::chunked_matches_whole_{}", name.replace('-', "_")),
            Box::new(move || {
                for chunk in [5, 20] {
                    crate::common::batched_cases::chunked_matches_whole_replayed(
                        name, &d, chunk, 1e-3, true,
                    );
                }
                Ok(())
            }),
        );
    }
    // SmolLM2 generation against the PyTorch reference, where the model file is here.
    {
        let missing = crate::llama::missing();
        let d = device.clone();
        push_needing(
            trials,
            ignored,
            missing.clone(),
            REQUIRE_MODELS,
            "llama::f32_greedy_24_every_prompt".into(),
            Box::new(move || crate::llama::f32_greedy(&d)),
        );
        for (name, p) in [
            ("llama::f16_top1_and_teacher_forced", Precision::F16),
            (
                "llama::q4_f16_top1_and_teacher_forced",
                Precision::quantized(DType::F16),
            ),
        ] {
            let d = device.clone();
            push_needing(
                trials,
                ignored,
                missing.clone(),
                REQUIRE_MODELS,
                name.into(),
                Box::new(move || crate::llama::reduced(&d, p)),
            );
        }
    }
}

/// all-MiniLM-L6-v2 against PyTorch.
pub fn minilm(device: &Device, ignored: &Option<String>, trials: &mut Vec<Trial>) {
    for (dtype, min_cos) in [(DType::F32, 0.9999), (DType::F16, 0.999)] {
        let name = format!("minilm::{dtype}_matches_pytorch");
        let dir = minilm_dir();
        let missing = dir
            .is_none()
            .then(|| "all-MiniLM-L6-v2 not in the model cache (scripts/fetch-models)".to_string());
        let d = device.clone();
        push_needing(
            trials,
            ignored,
            missing,
            REQUIRE_MODELS,
            name,
            Box::new(move || {
                let dir = dir.ok_or("all-MiniLM-L6-v2 not in the model cache")?;
                minilm_matches_reference(&d, &dir, dtype, min_cos)
            }),
        );
    }
}
