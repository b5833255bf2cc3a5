//! The tiny models `scripts/make-test-models` builds with transformers and llama.cpp's converter
//! and quantizer, one per LLaMA-family architecture, under `tests/data/models/<name>/`
//! (`f32.gguf`, `Q8_0.gguf`, `Q4_K_M.gguf`, ..., `reference.json`): the f32 file's last-position
//! logits on the interpreter against transformers' f32 logits (relative L2 ≤ 1e-4), greedy
//! tokens through the KV cache (CPU device) against transformers' while its lead is clear, the
//! quantized files' logits within each type's stated tolerance, and `generate --model FILE` with
//! no flags; and `llama3-kquant` (hidden 256) whose Q4_K_M file is all real Q4_K/Q6_K blocks.
//! The files are committed (5.4 MB, plus 0.86 MB for llama3-kquant's Q4_K_M;
//! `scripts/make-test-models` remakes them on a machine with torch and transformers: the GPU
//! machine's Python), so their absence is a failure.

use std::path::{Path, PathBuf};
use std::process::Command;

use rocmforge::frontend::llama::{Family, Logits, Precision};
use rocmforge::frontend::LlamaModel;
use rocmforge::generate::{GenerateOptions, Generator};
use rocmforge::interp::{run, Bindings};
use rocmforge::runtime::Device;
use serde_json::Value;

#[path = "common/model_refs.rs"]
mod model_refs;
use model_refs::{floats, ids, read_json, rel_l2, tiny_model_dir};

/// The model directory `name` (committed: missing files fail the test).
fn model_dir(name: &str) -> PathBuf {
    let dir = tiny_model_dir(name);
    assert!(
        dir.join("reference.json").exists() && dir.join("f32.gguf").exists(),
        "no model at {} (scripts/make-test-models makes it)",
        dir.display()
    );
    dir
}

fn reference(dir: &Path) -> Value {
    read_json(&dir.join("reference.json")).unwrap()
}

/// The last position's logits of `file` over `prompt` on the interpreter, weights dequantized
/// to f32.
fn last_logits(file: &Path, prompt: &[u32]) -> Vec<f64> {
    let m = LlamaModel::load(file).unwrap();
    let g = m.graph(prompt.len(), Logits::Last).unwrap();
    let b = Bindings {
        weights: m.weights_for(&g).unwrap(),
        inputs: m.inputs(prompt).into_iter().collect(),
        ..Bindings::default()
    };
    run(&g, &b).unwrap().remove(0).to_f64_vec()
}

// Quantization noise against transformers' f32 logits (the files' blocks are what llama.cpp's
// quantizer wrote; their dequantization is checked bit for bit against gguf-py in
// tests/quant_formats.rs). Measured on the five models (2026-11-26): at most 0.024 (Q8_0, and
// Q6_K, whose rows of 64 fall back to Q8_0), 0.156 (Q5_K_M), 0.158 (Q4_K_M), 0.41 (Q4_0);
// the tolerances leave ~1.5x of that. Logits that do not correspond at all (a tensor read with
// the wrong layout) are ~1.41 apart (two independent vectors of equal norm).
const QUANT_TOLERANCE: [(&str, f64); 5] = [
    ("Q8_0", 0.035),
    ("Q6_K", 0.035),
    ("Q5_K_M", 0.25),
    ("Q4_K_M", 0.25),
    ("Q4_0", 0.6),
];

/// Everything for model `name` of `family`.
fn check(name: &str, family: Family) {
    let dir = model_dir(name);
    let r = reference(&dir);
    let prompt = ids(&r["ids"]);
    let want = floats(&r["last_logits"]);
    let f32_file = dir.join("f32.gguf");
    let m = LlamaModel::load(&f32_file).unwrap();
    assert_eq!(m.config.family, family, "{name}");
    assert_eq!(m.config.vocab_size, want.len(), "{name}");
    // The tokenizer the converter wrote gives transformers' ids for the prompt.
    let text = r["prompt"].as_str().unwrap();
    assert_eq!(
        m.tokenizer.encode(text).unwrap(),
        prompt,
        "{name}: token ids"
    );

    let got = last_logits(&f32_file, &prompt);
    let err = rel_l2(&got, &want);
    eprintln!("{name} f32: rel L2 {err:.2e}");
    assert!(err <= 1e-4, "{name} f32: last-position logits rel L2 {err}");

    // Greedy through the KV cache, compared while transformers' lead of the top token is clear
    // of f32 noise (1e-3 of the largest logit).
    let greedy = ids(&r["greedy"]);
    let leads = floats(&r["greedy_leads"]);
    let scale = want.iter().fold(0.0f64, |a, b| a.max(b.abs()));
    let clear = leads.iter().take_while(|&&l| l > 1e-3 * scale).count();
    assert!(
        clear >= 1,
        "{name}: the first greedy token's lead is not clear"
    );
    let options = GenerateOptions {
        precision: Precision::F32,
        max_context: 64,
        replay: false,
        logits: false,
    };
    let mut g = Generator::new(m, &Device::cpu(), options).unwrap();
    let out = g.generate(&prompt, clear, |_| true).unwrap();
    assert_eq!(out.ids, greedy[..clear], "{name}: greedy tokens");

    for (ty, tol) in QUANT_TOLERANCE {
        let file = dir.join(format!("{ty}.gguf"));
        if !file.exists() {
            eprintln!("{name}: no {ty}.gguf");
            continue;
        }
        let err = rel_l2(&last_logits(&file, &prompt), &want);
        eprintln!("{name} {ty}: rel L2 {err:.2e} (tolerance {tol})");
        assert!(
            err <= tol,
            "{name} {ty}: last-position logits rel L2 {err} > {tol}"
        );
    }

    // `generate --model FILE` with no other flags.
    let out = Command::new(env!("CARGO_BIN_EXE_rocmforge"))
        .args(["generate", "--model"])
        .arg(&f32_file)
        .arg(text)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{name}: generate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn llama3_tiny() {
    check("llama3-tiny", Family::Llama);
}

#[test]
fn qwen2_tiny() {
    check("qwen2-tiny", Family::Qwen2);
}

#[test]
fn qwen3_tiny() {
    check("qwen3-tiny", Family::Qwen3);
}

#[test]
fn mistral_tiny() {
    check("mistral-tiny", Family::Llama);
}

#[test]
fn phi3_tiny() {
    check("phi3-tiny", Family::Phi3);
}

/// Llama 3 at hidden 256, ffn 512 (`llama3-kquant`): every matrix of its Q4_K_M file is in real
/// Q4_K or Q6_K blocks (at hidden 64 llama-quantize falls back to Q5_0/Q8_0), checked here with
/// our GGUF reader; its last-position logits on the interpreter against transformers' f32 logits
/// within a real 4-bit file's tolerance. Only the Q4_K_M file and the reference are committed (the f32 file
/// is 6 MB), so there is no f32 check here.
#[test]
fn llama3_kquant() {
    use rocmforge::frontend::gguf::Gguf;
    use rocmforge::ir::QuantScheme;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/models/llama3-kquant");
    let file = dir.join("Q4_K_M.gguf");
    assert!(
        file.exists() && dir.join("reference.json").exists(),
        "no model at {} (scripts/make-test-models makes it)",
        dir.display()
    );
    let gguf = Gguf::open(&file).unwrap();
    let mut counts = std::collections::BTreeMap::new();
    for name in gguf.tensor_names() {
        let t = gguf.tensor_info(name).unwrap();
        if t.dims.len() != 2 {
            continue;
        }
        let scheme = t.ggml_type.quant_scheme();
        assert!(
            matches!(scheme, Some(QuantScheme::Q4K | QuantScheme::Q6K)),
            "{name} is {:?}, not Q4_K/Q6_K",
            t.ggml_type
        );
        *counts.entry(format!("{scheme:?}")).or_insert(0) += 1;
    }
    eprintln!("llama3-kquant Q4_K_M: {counts:?}");
    assert_eq!(counts.len(), 2, "both Q4_K and Q6_K: {counts:?}");

    let r = reference(&dir);
    let prompt = ids(&r["ids"]);
    let want = floats(&r["last_logits"]);
    let m = LlamaModel::load(&file).unwrap();
    assert_eq!(m.config.family, Family::Llama);
    assert_eq!(m.config.hidden_size, 256);
    let text = r["prompt"].as_str().unwrap();
    assert_eq!(m.tokenizer.encode(text).unwrap(), prompt, "token ids");
    // Real 4-bit blocks here (the small models' Q4_K_M is mostly Q5_0/Q8_0 fallbacks): measured
    // 0.279 (2026-11-26; the f32 file, not committed, matched transformers to 8.9e-7 on the
    // interpreter, so this is the quantization's noise), near the small models' Q4_0 (0.41).
    // 0.4 leaves ~1.4x; unrelated logits are ~1.41 apart.
    let tol = 0.4;
    let interp = last_logits(&file, &prompt);
    let err = rel_l2(&interp, &want);
    eprintln!("llama3-kquant Q4_K_M: rel L2 {err:.2e} (tolerance {tol})");
    assert!(err <= tol, "last-position logits rel L2 {err} > {tol}");

    // The CPU device on the blocks (`--dtype q4`, 8-bit activations): every matrix is Q4_K or Q6_K, so every
    // product runs through the k-quant integer dot products with 8-bit activations (before
    // issue 25's CPU part they were dequantized to f32 at plan time, ~1e-6 from the
    // interpreter). The prompt's last logits (the first sampled token's) against the
    // interpreter's: within 8-bit activation error, and moved by it. Measured 2.28e-2 (the
    // portable, AVX2 and AVX-VNNI kernels alike: the activations' rounding through every layer,
    // against the 4-bit blocks' own 0.279 to transformers); 5e-2 leaves ~2x.
    let options = GenerateOptions {
        precision: Precision::quantized(rocmforge::ir::DType::F32),
        max_context: 64,
        replay: false,
        logits: true,
    };
    let q8 = rocmforge::cpu::Precision::Q8Activations;
    let mut g = Generator::new_with_cpu_precision(m, &Device::cpu(), options, q8).unwrap();
    let mut first: Option<Vec<f64>> = None;
    let mut sampler = |l: &[f32]| {
        first.get_or_insert_with(|| l.iter().map(|&x| f64::from(x)).collect());
        0
    };
    g.generate_with(&prompt, 1, Some(&mut sampler), |_| true)
        .unwrap();
    let cpu = first.expect("one sampled token");
    let err = rel_l2(&cpu, &interp);
    eprintln!(
        "llama3-kquant Q4_K_M on the CPU device's blocks: rel L2 {err:.2e} to the interpreter"
    );
    assert!(
        err <= 5e-2,
        "CPU device (8-bit activations) vs interpreter: {err}"
    );
    assert!(err > 1e-4, "the blocks did not take the 8-bit path ({err})");
    let err = rel_l2(&cpu, &want);
    eprintln!("llama3-kquant Q4_K_M on the CPU device's blocks: rel L2 {err:.2e} to transformers");
    assert!(err <= tol, "CPU device vs transformers: {err} > {tol}");
}
