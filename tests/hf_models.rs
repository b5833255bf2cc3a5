//! The tiny LLaMA-family models as Hugging Face directories (`tests/data/models/<name>/hf/`:
//! config.json, model.safetensors or the index's shards, tokenizer.json and the settings files;
//! qwen2's weights in bf16, mistral's in six shards, the rest f32), written by
//! `scripts/make-test-models` step 5 with `hf-reference.json` from transformers on the saved
//! directory read back in f32. Checked here: the format found, the family, the tokenizer's ids,
//! the last-position logits on the interpreter (relative L2 ≤ 1e-4), greedy tokens through the
//! KV cache on the CPU device while transformers' lead is clear, `generate --model DIR` with no
//! flags, and the typed errors of broken directories (a copy of one, damaged a file at a time).

use std::path::{Path, PathBuf};
use std::process::Command;

use rocmforge::frontend::llama::{Family, Logits, Precision};
use rocmforge::frontend::{Format, LlamaModel, ModelError};
use rocmforge::generate::{GenerateOptions, Generator};
use rocmforge::interp::{run, Bindings};
use rocmforge::runtime::Device;
use serde_json::Value;

#[path = "common/model_refs.rs"]
mod model_refs;
use model_refs::{floats, ids, read_json, rel_l2, tiny_model_dir};

/// The model `name`'s directory and its reference (committed: missing files fail the test).
fn model(name: &str) -> (PathBuf, Value) {
    let dir = tiny_model_dir(name);
    let r = read_json(&dir.join("hf-reference.json"))
        .unwrap_or_else(|e| panic!("{e} (scripts/make-test-models step 5 makes it)"));
    (dir.join("hf"), r)
}

/// Everything for model `name` of `family`, stored in `shards` safetensors files.
fn check(name: &str, family: Family, model_type: &str, shards: usize) {
    let (dir, r) = model(name);
    let m = LlamaModel::load(&dir).unwrap();
    assert_eq!(
        m.format,
        Format::HfDirectory {
            model_type: model_type.into(),
            shards
        },
        "{name}"
    );
    assert_eq!(m.config.family, family, "{name}");
    assert!(m.gguf().is_none(), "{name}");
    let want = floats(&r["last_logits"]);
    assert_eq!(m.config.vocab_size, want.len(), "{name}");

    // tokenizer.json gives transformers' ids for the prompt.
    let prompt = ids(&r["ids"]);
    let text = r["prompt"].as_str().unwrap();
    assert_eq!(
        m.tokenizer.encode(text).unwrap(),
        prompt,
        "{name}: token ids"
    );

    // The interpreter, weights read from the safetensors (bf16 upcast exactly, as the
    // reference's were).
    let g = m.graph(prompt.len(), Logits::Last).unwrap();
    let b = Bindings {
        weights: m.weights_for(&g).unwrap(),
        inputs: m.inputs(&prompt).into_iter().collect(),
        ..Bindings::default()
    };
    let got = run(&g, &b).unwrap().remove(0).to_f64_vec();
    let err = rel_l2(&got, &want);
    eprintln!("{name} (hf): rel L2 {err:.2e}");
    assert!(err <= 1e-4, "{name}: last-position logits rel L2 {err}");

    // Greedy through the KV cache while transformers' lead is clear of f32 noise.
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
    let mut gen = Generator::new(m, &Device::cpu(), options).unwrap();
    let out = gen.generate(&prompt, clear, |_| true).unwrap();
    assert_eq!(out.ids, greedy[..clear], "{name}: greedy tokens");

    // `generate --model DIR` with no other flags says what it found.
    let out = Command::new(env!("CARGO_BIN_EXE_rocmforge"))
        .args(["generate", "--model"])
        .arg(&dir)
        .args([text, "--max-tokens", "4"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{name}: generate failed: {stderr}");
    assert!(
        stderr.contains(&format!(
            "Hugging Face directory ({shards} safetensors file"
        )),
        "{name}: {stderr}"
    );
}

#[test]
fn llama3_tiny() {
    check("llama3-tiny", Family::Llama, "llama", 1);
}

#[test]
fn qwen2_tiny_bf16() {
    check("qwen2-tiny", Family::Qwen2, "qwen2", 1);
}

#[test]
fn qwen3_tiny() {
    check("qwen3-tiny", Family::Qwen3, "qwen3", 1);
}

#[test]
fn mistral_tiny_sharded() {
    check("mistral-tiny", Family::Llama, "mistral", 6);
}

#[test]
fn phi3_tiny() {
    check("phi3-tiny", Family::Phi3, "phi3", 1);
}

/// A scratch copy of llama3-tiny's (or mistral's sharded) directory to damage.
fn scratch_copy(name: &str, tag: &str) -> PathBuf {
    let (src, _) = model(name);
    let dst = std::env::temp_dir().join(format!("rocmforge-hf-{tag}-{}", std::process::id()));
    std::fs::remove_dir_all(&dst).ok();
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    dst
}

fn load_err(dir: &Path) -> ModelError {
    match LlamaModel::load(dir) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e,
    }
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let path = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    f(v.as_object_mut().unwrap());
    std::fs::write(&path, serde_json::to_string(&v).unwrap()).unwrap();
}

/// Each broken directory is a typed error that names what is wrong, and nothing panics.
#[test]
fn broken_directories_are_clear_errors() {
    // No config.json.
    let dir = scratch_copy("llama3-tiny", "noconfig");
    std::fs::remove_file(dir.join("config.json")).unwrap();
    let e = load_err(&dir);
    assert!(matches!(e, ModelError::MissingFile { .. }), "{e}");
    assert!(e.to_string().contains("config.json"), "{e}");
    std::fs::remove_dir_all(&dir).ok();

    // An architecture we do not lower.
    let dir = scratch_copy("llama3-tiny", "arch");
    edit_config(&dir, |c| {
        c.insert("model_type".into(), "gpt_neox".into());
        c.insert(
            "architectures".into(),
            serde_json::json!(["GPTNeoXForCausalLM"]),
        );
    });
    let e = load_err(&dir);
    assert!(
        e.to_string().contains("gpt_neox") || e.to_string().contains("GPTNeoX"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).ok();

    // A hidden size the tensors do not back.
    let dir = scratch_copy("llama3-tiny", "hidden");
    edit_config(&dir, |c| {
        c.insert("hidden_size".into(), 96.into());
    });
    let e = load_err(&dir);
    assert!(
        matches!(
            e,
            ModelError::TensorShape { .. }
                | ModelError::ConfigMismatch { .. }
                | ModelError::Config { .. }
        ),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).ok();

    // Fewer layers in the config than the checkpoint holds.
    let dir = scratch_copy("llama3-tiny", "layers");
    edit_config(&dir, |c| {
        c.insert("num_hidden_layers".into(), 1.into());
    });
    let e = load_err(&dir);
    assert!(e.to_string().contains("num_hidden_layers"), "{e}");
    std::fs::remove_dir_all(&dir).ok();

    // A truncated safetensors file.
    let dir = scratch_copy("llama3-tiny", "trunc");
    let st = dir.join("model.safetensors");
    let bytes = std::fs::read(&st).unwrap();
    std::fs::write(&st, &bytes[..bytes.len() / 2]).unwrap();
    let e = load_err(&dir);
    assert!(e.to_string().contains("model.safetensors"), "{e}");
    std::fs::remove_dir_all(&dir).ok();

    // A shard the index names is missing.
    let dir = scratch_copy("mistral-tiny", "shard");
    std::fs::remove_file(dir.join("model-00003-of-00006.safetensors")).unwrap();
    let e = load_err(&dir);
    assert!(
        e.to_string().contains("model-00003-of-00006.safetensors"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).ok();

    // No tokenizer.json.
    let dir = scratch_copy("llama3-tiny", "tok");
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    let e = load_err(&dir);
    assert!(e.to_string().contains("tokenizer.json"), "{e}");
    std::fs::remove_dir_all(&dir).ok();

    // A directory that is not a model at all: the CLI says so and exits non-zero.
    let empty = std::env::temp_dir().join(format!("rocmforge-hf-empty-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rocmforge"))
        .args(["generate", "--model"])
        .arg(&empty)
        .arg("hello")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("config.json"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    std::fs::remove_dir_all(&empty).ok();

    // `embed` given a decoder (directory or GGUF file) says it takes encoders and points to
    // `generate`.
    let (hf, _) = model("llama3-tiny");
    for path in [hf.clone(), hf.parent().unwrap().join("f32.gguf")] {
        let out = Command::new(env!("CARGO_BIN_EXE_rocmforge"))
            .args(["embed", "--model"])
            .arg(&path)
            .arg("hello")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains("rocmforge generate"),
            "{}: {stderr}",
            path.display()
        );
    }
}

/// A directory whose linear weights are MXFP6 blocks (`scripts/quantize-safetensors.py`: U8
/// tensors marked in the safetensors metadata): on the interpreter, the blocks dequantized by
/// `ir::quant` give transformers' logits on the weights the script dequantized in numpy
/// (`hf-mxfp6_*-reference.json`) within f32 noise, so the decoding is the OCP format's; the
/// quantization itself moved the logits (against the float directory's reference) by far more.
fn check_mxfp6(name: &str, dir_name: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/models")
        .join(name);
    let dir = root.join(dir_name);
    let r: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join(format!("{dir_name}-reference.json"))).unwrap(),
    )
    .unwrap();
    let m = LlamaModel::load(&dir).unwrap();
    assert!(m.holds_blocks(), "{dir_name}");
    let prompt = ids(&r["ids"]);
    let want = floats(&r["last_logits"]);
    let g = m.graph(prompt.len(), Logits::Last).unwrap();
    let b = Bindings {
        weights: m.weights_for(&g).unwrap(),
        inputs: m.inputs(&prompt).into_iter().collect(),
        ..Bindings::default()
    };
    let got = run(&g, &b).unwrap().remove(0).to_f64_vec();
    let err = rel_l2(&got, &want);
    let (_, float_ref) = model(name);
    let moved = rel_l2(&want, &floats(&float_ref["last_logits"]));
    eprintln!("{name} {dir_name}: rel L2 {err:.2e}; quantization moved the logits {moved:.2e}");
    assert!(err <= 1e-4, "{name} {dir_name}: rel L2 {err}");
    assert!(
        moved > 100.0 * err.max(1e-6),
        "{name}: the blocks changed nothing ({moved})"
    );

    // The blocks kept (`--dtype q4`): a graph with quantized weights, bound from the U8 bytes.
    let q = m
        .kv_graph(
            1,
            16,
            Precision::quantized(rocmforge::ir::DType::F32),
            false,
        )
        .unwrap();
    let quant = m.quantized_for(&q).unwrap();
    assert!(!quant.is_empty(), "{dir_name}: no weight bound as blocks");
    let out = Command::new(env!("CARGO_BIN_EXE_rocmforge"))
        .args(["generate", "--dtype", "q4", "--max-tokens", "3", "--model"])
        .arg(&dir)
        .arg(r["prompt"].as_str().unwrap())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success()
            && stderr.contains("quantized blocks")
            && !stderr.contains("note: --dtype q4"),
        "{stderr}"
    );
}

#[test]
fn llama3_tiny_mxfp6_e2m3_blocks() {
    check_mxfp6("llama3-tiny", "hf-mxfp6_e2m3");
}

#[test]
fn qwen3_tiny_mxfp6_e3m2_blocks() {
    check_mxfp6("qwen3-tiny", "hf-mxfp6_e3m2");
}

/// A full-size directory where one is named (`ROCMFORGE_LARGE_HF=DIR`, with transformers'
/// reference at `DIR/../reference.json`, as `scripts/tiny_models.py gguf-source
/// llama3-1b-shape DIR OUT` writes them: Llama-3.2-1B's shapes, random weights, 4.9 GB f32):
/// the prompt's last-position logits on the interpreter within 1e-4 of transformers'. Skipped,
/// saying so, when none is named.
#[test]
fn a_full_size_directory_matches_transformers_where_one_is_named() {
    let Some(dir) = std::env::var_os("ROCMFORGE_LARGE_HF").map(PathBuf::from) else {
        eprintln!("skipped: ROCMFORGE_LARGE_HF names no directory");
        return;
    };
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("../reference.json")).unwrap())
            .unwrap();
    let prompt = ids(&r["ids"]);
    let want = floats(&r["last_logits"]);
    let t = std::time::Instant::now();
    let m = LlamaModel::load(&dir).unwrap();
    eprintln!("{}: {}", dir.display(), m.format);
    let g = m.graph(prompt.len(), Logits::Last).unwrap();
    let b = Bindings {
        weights: m.weights_for(&g).unwrap(),
        inputs: m.inputs(&prompt).into_iter().collect(),
        ..Bindings::default()
    };
    let got = run(&g, &b).unwrap().remove(0).to_f64_vec();
    let err = rel_l2(&got, &want);
    eprintln!("rel L2 {err:.2e} in {:.1} s", t.elapsed().as_secs_f64());
    assert!(err <= 1e-4, "rel L2 {err}");
}
