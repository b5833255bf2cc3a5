//! Every LLaMA-family architecture on the GPU, from the committed tiny models
//! (`tests/data/models/<name>/`, `scripts/make-test-models`): the Hugging Face directory in f32
//! and f16 against transformers' logits (`hf-reference.json`) and, in f32, its greedy tokens
//! while transformers' lead is clear; each GGUF quantized file with its blocks kept on the
//! device against the interpreter on the same file (and the MXFP6 directories of
//! `scripts/quantize-safetensors.py`). Through `Generator`, as `generate` runs them:
//! the prompt's plan, then replayed decode steps.

use std::path::Path;

use libtest_mimic::{Failed, Trial};
use rocmforge::frontend::llama::{Logits, Precision};
use rocmforge::frontend::LlamaModel;
use rocmforge::generate::{GenerateOptions, Generator};
use rocmforge::interp::{run, Bindings};
use rocmforge::ir::DType;
use rocmforge::runtime::Device;

use crate::common::model_refs::{
    floats_lenient, ids_lenient, read_json, rel_l2_or_inf, tiny_model_dir,
};
use crate::harness::push;

const MODELS: [&str; 5] = [
    "llama3-tiny",
    "qwen2-tiny",
    "qwen3-tiny",
    "mistral-tiny",
    "phi3-tiny",
];

fn argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in l.iter().enumerate() {
        if *v > l[best] || l[best].is_nan() {
            best = i;
        }
    }
    best as u32
}

/// Runs `path` on `d` at precision `p` over `prompt` for `tokens` greedy tokens; returns the
/// prompt's last-position logits and the tokens.
fn generate(
    path: &Path,
    d: &Device,
    p: Precision,
    prompt: &[u32],
    tokens: usize,
) -> Result<(Vec<f64>, Vec<u32>), Failed> {
    let m = LlamaModel::load(path)?;
    let options = GenerateOptions {
        precision: p,
        max_context: 64,
        replay: true,
        logits: true,
    };
    let mut g = Generator::new(m, d, options)?;
    let mut first: Option<Vec<f64>> = None;
    let mut sampler = |l: &[f32]| {
        if first.is_none() {
            first = Some(l.iter().map(|&x| f64::from(x)).collect());
        }
        argmax(l)
    };
    let out = g.generate_until(prompt, tokens, Some(&mut sampler), false, |_| true)?;
    Ok((first.ok_or("no logits came back")?, out.ids))
}

/// The directory of `name` at `p` against transformers within `tol` (relative L2); greedy too
/// when `greedy`.
fn hf_matches(name: &str, d: &Device, p: Precision, tol: f64, greedy: bool) -> Result<(), Failed> {
    let dir = tiny_model_dir(name);
    let r = read_json(&dir.join("hf-reference.json"))?;
    let prompt = ids_lenient(&r["ids"]);
    let want = floats_lenient(&r["last_logits"]);
    let want_ids = ids_lenient(&r["greedy"]);
    let leads = floats_lenient(&r["greedy_leads"]);
    // Tokens whose lead over the runner-up is clear of this precision's noise.
    let scale = want.iter().fold(0.0f64, |a, b| a.max(b.abs()));
    let clear = leads.iter().take_while(|&&l| l > 1e-2 * scale).count();
    let (got, tokens) = generate(&dir.join("hf"), d, p, &prompt, clear.max(1))?;
    let err = rel_l2_or_inf(&got, &want);
    if err > tol {
        return Err(format!("{name} {p:?}: last-position logits rel L2 {err:.3e} > {tol}").into());
    }
    if greedy && tokens[..clear] != want_ids[..clear] {
        return Err(format!(
            "{name}: greedy {:?}, transformers {:?}",
            &tokens[..clear],
            &want_ids[..clear]
        )
        .into());
    }
    Ok(())
}

/// `file` of model `name` with its blocks on the device against the interpreter on the same
/// file (weights dequantized to f32) within `tol`.
fn quantized_matches(
    name: &str,
    file: &str,
    reference: &str,
    d: &Device,
    tol: f64,
) -> Result<(), Failed> {
    let dir = tiny_model_dir(name);
    let r = read_json(&dir.join(reference))?;
    let prompt = ids_lenient(&r["ids"]);
    let path = dir.join(file);
    let m = LlamaModel::load(&path)?;
    let g = m.graph(prompt.len(), Logits::Last)?;
    let b = Bindings {
        weights: m.weights_for(&g)?,
        inputs: m.inputs(&prompt).into_iter().collect(),
        ..Bindings::default()
    };
    let want = run(&g, &b)?.remove(0).to_f64_vec();
    let (got, _) = generate(&path, d, Precision::quantized(DType::F16), &prompt, 2)?;
    let err = rel_l2_or_inf(&got, &want);
    if err > tol {
        return Err(format!("{name} {file}: rel L2 {err:.3e} to the interpreter > {tol}").into());
    }
    Ok(())
}

pub fn trials(device: &Device, ignored: &Option<String>, trials: &mut Vec<Trial>) {
    for name in MODELS {
        // f32: accumulation order only. f16: weights and activations rounded to 11 bits
        // (measured ≤ 1e-2 on the tiny models' SmolLM2-sized cousins; logits that do not
        // correspond are ~1.4 apart).
        for (p, tol, greedy) in [(Precision::F32, 1e-4, true), (Precision::F16, 2e-2, false)] {
            let d = device.clone();
            push(
                trials,
                ignored,
                format!("families::hf_{}_{:?}", name.replace('-', "_"), p.dtype),
                Box::new(move || hf_matches(name, &d, p, tol, greedy)),
            );
        }
        // The quantized files' blocks on the device (int8 activations in the GEMVs: ~0.5% of
        // the logits' scale, f16 activations elsewhere).
        for file in ["Q8_0.gguf", "Q4_K_M.gguf", "Q6_K.gguf"] {
            let d = device.clone();
            push(
                trials,
                ignored,
                format!(
                    "families::{}_{}_blocks_match_the_interpreter",
                    name.replace('-', "_"),
                    file.trim_end_matches(".gguf")
                ),
                Box::new(move || quantized_matches(name, file, "reference.json", &d, 3e-2)),
            );
        }
    }
    let d = device.clone();
    push(
        trials,
        ignored,
        "families::llama3_kquant_Q4_K_M_blocks_match_the_interpreter".into(),
        Box::new(move || {
            quantized_matches("llama3-kquant", "Q4_K_M.gguf", "reference.json", &d, 3e-2)
        }),
    );
    // MXFP6 blocks from a safetensors directory (`scripts/quantize-safetensors.py`).
    for (name, dir) in [
        ("llama3-tiny", "hf-mxfp6_e2m3"),
        ("qwen3-tiny", "hf-mxfp6_e3m2"),
    ] {
        let d = device.clone();
        push(
            trials,
            ignored,
            format!(
                "families::{}_{}_blocks_match_the_interpreter",
                name.replace('-', "_"),
                dir.replace('-', "_")
            ),
            Box::new(move || {
                let reference = format!("{dir}-reference.json");
                quantized_matches(name, dir, &reference, &d, 3e-2)
            }),
        );
    }
}
