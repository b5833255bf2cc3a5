//! The LLaMA-family architectures through the one lowering, each from a tiny GGUF written here
//! (tests/common/tiny_gguf.rs, f32 weights), checked against an independent f64 forward pass
//! written below from the file's tensors as llama.cpp lays them out: for `llama` (and Mistral)
//! the Q/K rows stay as the converter permuted them and the reference ropes adjacent pairs
//! (llama.cpp's interleaved rope), for `qwen2`/`qwen3`/`phi3` it ropes the halves (NEOX); Llama
//! 3's frequency factors divide each pair's frequency; Qwen2's biases, Qwen3's per-head Q/K
//! RMSNorm, Phi-3's fused Q/K/V and gate/up tensors and partial rotary, Mistral's sliding window
//! are each written out. Prefill logits run on the interpreter; greedy tokens run through the KV
//! cache on the CPU device.

use std::path::PathBuf;

use rocmforge::frontend::llama::{Family, Logits, Precision};
use rocmforge::frontend::{LlamaModel, ModelError};
use rocmforge::generate::{GenerateOptions, Generator};
use rocmforge::interp::{run, Bindings};
use rocmforge::runtime::Device;

#[path = "common/kernel_compile.rs"]
mod kernel_compile;
#[path = "common/model_refs.rs"]
mod model_refs;
#[path = "common/needs.rs"]
mod needs;
#[path = "common/tiny_gguf.rs"]
mod tiny_gguf;
use model_refs::rel_l2;
use tiny_gguf::{tiny_family, GgufFile, Kv, RawTensor, TinyFamily, TINY_VOCAB};

/// A prompt long enough for positions to matter and for a window of 3 to cut keys off.
const PROMPT: [u32; 9] = [260, 113, 261, 5, 77, 200, 34, 2, 150];

fn write(name: &str, file: &GgufFile) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rocmforge-families-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!("{name}.gguf"));
    std::fs::write(&p, file.to_bytes()).unwrap();
    p
}

/// Tensor `name` of `file` (f32) as f64 values.
fn tensor(file: &GgufFile, name: &str) -> Vec<f64> {
    let t: &RawTensor = file
        .tensors
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no tensor {name}"));
    assert_eq!(t.type_id, 0);
    t.bytes
        .chunks(4)
        .map(|b| f64::from(f32::from_le_bytes(b.try_into().unwrap())))
        .collect()
}

/// `x · Wᵀ` for `w` `[dout, din]` row-major.
fn linear(x: &[f64], w: &[f64], din: usize) -> Vec<f64> {
    w.chunks(din)
        .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
        .collect()
}

fn rms_norm(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let r = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(v, w)| v * r * w).collect()
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// Rope of one head `x` at position `pos` over its first `rd` dimensions: pairs `(2i, 2i+1)`
/// when `interleaved` (llama.cpp's rope on its permuted rows), else `(i, i + rd/2)`; pair `i`
/// at frequency `theta^(−2i/rd) / factors[i]`.
fn rope(x: &mut [f64], pos: usize, rd: usize, theta: f64, factors: &[f64], interleaved: bool) {
    for i in 0..rd / 2 {
        let f = factors.get(i).copied().unwrap_or(1.0);
        let angle = pos as f64 * theta.powf(-2.0 * i as f64 / rd as f64) / f;
        let (s, c) = angle.sin_cos();
        let (a, b) = if interleaved {
            (2 * i, 2 * i + 1)
        } else {
            (i, i + rd / 2)
        };
        let (xa, xb) = (x[a], x[b]);
        x[a] = xa * c - xb * s;
        x[b] = xb * c + xa * s;
    }
}

/// The f64 forward pass of `file` (shaped by `f`) over `ids`: logits at every position.
fn reference(f: &TinyFamily, file: &GgufFile, ids: &[u32]) -> Vec<Vec<f64>> {
    let (h, d, hq, hkv) = (f.hidden, f.head_dim, f.heads, f.kv);
    let (qd, kvd, ffn) = (hq * d, hkv * d, f.ffn);
    let eps = 1e-6;
    let rd = f.rotary_dim.unwrap_or(d);
    let factors: Vec<f64> = f
        .rope_freqs
        .as_ref()
        .map(|v| v.iter().map(|&x| f64::from(x)).collect())
        .unwrap_or_default();
    let interleaved = f.arch == "llama";
    let window = f.window.filter(|&w| w > 0).map(|w| w as usize);
    let table = tensor(file, "token_embd.weight");
    let mut xs: Vec<Vec<f64>> = ids
        .iter()
        .map(|&id| table[id as usize * h..][..h].to_vec())
        .collect();
    let s = ids.len();
    for l in 0..f.layers {
        let n = |t: &str| format!("blk.{l}.{t}");
        let w = |t: &str| tensor(file, &n(t));
        let mut qs = Vec::new();
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        for (pos, x) in xs.iter().enumerate() {
            let a = rms_norm(x, &w("attn_norm.weight"), eps);
            let (mut q, mut k, mut v) = if f.fused {
                let qkv = linear(&a, &w("attn_qkv.weight"), h);
                (
                    qkv[..qd].to_vec(),
                    qkv[qd..qd + kvd].to_vec(),
                    qkv[qd + kvd..].to_vec(),
                )
            } else {
                (
                    linear(&a, &w("attn_q.weight"), h),
                    linear(&a, &w("attn_k.weight"), h),
                    linear(&a, &w("attn_v.weight"), h),
                )
            };
            if f.bias {
                for (y, name) in [(&mut q, "q"), (&mut k, "k"), (&mut v, "v")] {
                    let b = w(&format!("attn_{name}.bias"));
                    y.iter_mut().zip(b).for_each(|(y, b)| *y += b);
                }
            }
            for (y, name) in [(&mut q, "q"), (&mut k, "k")] {
                for head in y.chunks_mut(d) {
                    if f.qk_norm {
                        let normed = rms_norm(head, &w(&format!("attn_{name}_norm.weight")), eps);
                        head.copy_from_slice(&normed);
                    }
                    rope(head, pos, rd, 10000.0, &factors, interleaved);
                }
            }
            qs.push(q);
            ks.push(k);
            vs.push(v);
        }
        let mut next = Vec::new();
        for i in 0..s {
            let mut ctx = vec![0.0; qd];
            for head in 0..hq {
                let kvh = head / (hq / hkv);
                let q = &qs[i][head * d..][..d];
                let visible: Vec<usize> = (0..=i)
                    .filter(|&j| window.is_none_or(|w| i - j < w))
                    .collect();
                let scores: Vec<f64> = visible
                    .iter()
                    .map(|&j| {
                        let k = &ks[j][kvh * d..][..d];
                        q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() / (d as f64).sqrt()
                    })
                    .collect();
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for (p, &j) in e.iter().zip(&visible) {
                    let v = &vs[j][kvh * d..][..d];
                    for c in 0..d {
                        ctx[head * d + c] += p / z * v[c];
                    }
                }
            }
            let o = linear(&ctx, &w("attn_output.weight"), qd);
            let r: Vec<f64> = xs[i].iter().zip(&o).map(|(a, b)| a + b).collect();
            let m = rms_norm(&r, &w("ffn_norm.weight"), eps);
            let (gate, up) = if f.fused {
                let gu = linear(&m, &w("ffn_up.weight"), h);
                (gu[..ffn].to_vec(), gu[ffn..].to_vec())
            } else {
                (
                    linear(&m, &w("ffn_gate.weight"), h),
                    linear(&m, &w("ffn_up.weight"), h),
                )
            };
            let act: Vec<f64> = gate.iter().zip(&up).map(|(g, u)| silu(*g) * u).collect();
            let down = linear(&act, &w("ffn_down.weight"), ffn);
            next.push(r.iter().zip(&down).map(|(a, b)| a + b).collect());
        }
        xs = next;
    }
    let head = if f.tied {
        table
    } else {
        tensor(file, "output.weight")
    };
    xs.iter()
        .map(|x| {
            linear(
                &rms_norm(x, &tensor(file, "output_norm.weight"), eps),
                &head,
                h,
            )
        })
        .collect()
}

/// Top token and its lead over the second.
fn top(v: &[f64]) -> (u32, f64) {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[b].total_cmp(&v[a]));
    (idx[0] as u32, v[idx[0]] - v[idx[1]])
}

/// Loads `f`'s file, checks the configuration read from it, the interpreter's prefill logits
/// at every position against the reference (relative L2 ≤ 1e-5), and greedy tokens through the
/// KV cache on the CPU device against the reference's argmax by full recomputation, for as long
/// as the reference's lead is clear (at least 4 tokens must be).
fn check(name: &str, f: &TinyFamily, family: Family) {
    let file = tiny_family(f);
    let p = write(name, &file);
    let m = LlamaModel::load(&p).unwrap();
    let c = &m.config;
    assert_eq!(c.family, family);
    assert_eq!(c.head_dim, f.head_dim);
    assert_eq!(c.rotary_dim, f.rotary_dim.unwrap_or(f.head_dim));
    assert_eq!(c.attention_bias, f.bias);
    assert_eq!(c.qk_norm, f.qk_norm);
    assert_eq!((c.fused_qkv, c.fused_gate_up), (f.fused, f.fused));
    assert_eq!(c.tie_word_embeddings, f.tied);
    assert_eq!(
        c.sliding_window,
        f.window.filter(|&w| w > 0).map(|w| w as usize)
    );
    assert_eq!(
        c.rope_factors.len(),
        f.rope_freqs.as_ref().map_or(0, Vec::len)
    );

    let want = reference(f, &file, &PROMPT);
    let g = m.graph(PROMPT.len(), Logits::All).unwrap();
    let b = Bindings {
        weights: m.weights_for(&g).unwrap(),
        inputs: m.inputs(&PROMPT).into_iter().collect(),
        ..Bindings::default()
    };
    let got = run(&g, &b).unwrap().remove(0).to_f64_vec();
    let flat: Vec<f64> = want.iter().flatten().copied().collect();
    let err = rel_l2(&got, &flat);
    assert!(err <= 1e-5, "{name}: prefill logits rel L2 {err}");

    let options = GenerateOptions {
        precision: Precision::F32,
        max_context: 32,
        replay: false,
        logits: false,
    };
    let mut generator = Generator::new(m, &Device::cpu(), options).unwrap();
    let mut ids = PROMPT.to_vec();
    let mut expect = Vec::new();
    for _ in 0..8 {
        let last = reference(f, &file, &ids).pop().unwrap();
        let (t, lead) = top(&last);
        let scale = last.iter().fold(0.0f64, |a, b| a.max(b.abs()));
        if lead < 1e-4 * scale {
            break;
        }
        expect.push(t);
        ids.push(t);
    }
    assert!(
        expect.len() >= 4,
        "{name}: reference leads too small: {expect:?}"
    );
    let out = generator.generate(&PROMPT, expect.len(), |_| true).unwrap();
    assert_eq!(
        out.ids, expect,
        "{name}: greedy tokens through the KV cache"
    );

    // `generate --model FILE` with no other flags (the device the machine has; the CPU here).
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rocmforge"))
        .args(["generate", "--model"])
        .arg(&p)
        .arg("hello world")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{name}: generate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_file(&p).ok();
}

/// Llama 3: rope frequency factors (`rope_freqs.weight`, as the converter computes them from
/// `rope_scaling` of type llama3: 1 for high frequencies, the factor for low ones, smooth
/// between), an untied LM head, GQA, Q/K rows permuted by the converter.
#[test]
fn llama3_rope_factors_and_untied_head() {
    let mut f = TinyFamily::new("llama");
    f.tied = false;
    f.rope_freqs = Some(vec![1.0, 1.0, 1.0, 1.5, 2.75, 5.0, 8.0, 8.0]);
    check("llama3", &f, Family::Llama);
}

/// Qwen2: biases on Q, K and V, halves roped (no permutation).
#[test]
fn qwen2_qkv_bias() {
    let mut f = TinyFamily::new("qwen2");
    f.bias = true;
    check("qwen2", &f, Family::Qwen2);
}

/// Qwen3: per-head RMSNorm on Q and K, and a head size (24) that is not hidden / heads.
#[test]
fn qwen3_qk_norm_and_explicit_head_size() {
    let mut f = TinyFamily::new("qwen3");
    f.qk_norm = true;
    f.head_dim = 24;
    f.tied = false;
    check("qwen3", &f, Family::Qwen3);
}

/// Mistral (a `llama` file): a sliding window of 3, shorter than the prompt, in the prefill's
/// mask and in every KV step's. With Q/K/V biases too, which the converter permutes with the
/// rows of a `llama` file's Q and K (no Mistral has them; other `llama`-converted models do).
#[test]
fn mistral_sliding_window() {
    let mut f = TinyFamily::new("llama");
    f.window = Some(3);
    f.bias = true;
    check("mistral", &f, Family::Llama);
}

/// Phi-3: one Q/K/V tensor, one gate/up tensor, rope over the first 8 of 16 head dimensions,
/// `sliding_window` 0 meaning none (as its converter writes it), multi-head (no GQA).
#[test]
fn phi3_fused_tensors_and_partial_rotary() {
    let mut f = TinyFamily::new("phi3");
    f.fused = true;
    f.kv = 4;
    f.rotary_dim = Some(8);
    f.window = Some(0);
    check("phi3", &f, Family::Phi3);
}

/// Linear rope scaling (`rope.scaling.type` linear with a factor) is every pair's factor: the
/// same logits as `rope_freqs.weight` of that factor throughout.
#[test]
fn linear_rope_scaling_is_a_uniform_factor() {
    let mut f = TinyFamily::new("qwen2");
    f.rope_freqs = Some(vec![4.0; 8]);
    let with_freqs = tiny_family(&f);
    f.rope_freqs = None;
    let mut linear = tiny_family(&f);
    linear.set("qwen2.rope.scaling.type", Kv::Str("linear".into()));
    linear.set("qwen2.rope.scaling.factor", Kv::F32(4.0));
    let want = reference(
        &TinyFamily {
            rope_freqs: Some(vec![4.0; 8]),
            ..f.clone()
        },
        &with_freqs,
        &PROMPT,
    );
    let p = write("linear", &linear);
    let m = LlamaModel::load(&p).unwrap();
    assert_eq!(m.config.rope_factors, vec![4.0; 8]);
    let g = m.graph(PROMPT.len(), Logits::All).unwrap();
    let b = Bindings {
        weights: m.weights_for(&g).unwrap(),
        inputs: m.inputs(&PROMPT).into_iter().collect(),
        ..Bindings::default()
    };
    let got = run(&g, &b).unwrap().remove(0).to_f64_vec();
    let flat: Vec<f64> = want.iter().flatten().copied().collect();
    assert!(rel_l2(&got, &flat) <= 1e-5);
    std::fs::remove_file(&p).ok();
}

/// What the lowering does not implement is a typed error naming the key or tensor; an
/// architecture it does not know names itself and the ones it does.
#[test]
fn unknown_architectures_and_scalings_are_typed_errors() {
    let f = TinyFamily::new("qwen2");
    let load = |file: &GgufFile, name: &str| {
        let p = write(name, file);
        let r = LlamaModel::load(&p).map(|_| ());
        std::fs::remove_file(&p).ok();
        r.unwrap_err()
    };
    let mut gemma = tiny_family(&TinyFamily::new("gemma2"));
    gemma.set("general.architecture", Kv::Str("gemma2".into()));
    match load(&gemma, "gemma") {
        ModelError::Unsupported {
            field,
            value,
            supported,
        } => {
            assert_eq!(
                (field.as_str(), value.as_str()),
                ("general.architecture", "gemma2")
            );
            for a in ["llama", "qwen2", "qwen3", "phi3"] {
                assert!(supported.contains(a), "{supported}");
            }
        }
        e => panic!("{e}"),
    }
    let mut yarn = tiny_family(&f);
    yarn.set("qwen2.rope.scaling.type", Kv::Str("yarn".into()));
    assert!(matches!(load(&yarn, "yarn"),
        ModelError::Unsupported { field, value, .. } if field == "qwen2.rope.scaling.type" && value == "yarn"));
    let mut longrope = tiny_family(&TinyFamily {
        fused: true,
        ..TinyFamily::new("phi3")
    });
    longrope.tensors.push(RawTensor {
        name: "rope_factors_long.weight".into(),
        shape: vec![8],
        type_id: 0,
        bytes: [1.0f32; 8].iter().flat_map(|x| x.to_le_bytes()).collect(),
    });
    assert!(matches!(load(&longrope, "longrope"),
        ModelError::Unsupported { field, .. } if field == "rope_factors_long.weight"));
    let wrong_freqs = tiny_family(&TinyFamily {
        rope_freqs: Some(vec![1.0; 5]),
        ..f.clone()
    });
    assert!(matches!(load(&wrong_freqs, "freqs"),
        ModelError::TensorShape { name, expected, found } if name == "rope_freqs.weight" && expected == [8] && found == [5]));
    let zero_freqs = tiny_family(&TinyFamily {
        rope_freqs: Some(vec![0.0; 8]),
        ..f.clone()
    });
    assert!(matches!(load(&zero_freqs, "zero"),
        ModelError::Setting { field, .. } if field == "rope_freqs.weight"));
    let mut too_wide = tiny_family(&f);
    too_wide.set("qwen2.rope.dimension_count", Kv::U32(18));
    assert!(matches!(load(&too_wide, "wide"),
        ModelError::Setting { field, .. } if field == "qwen2.rope.dimension_count"));
    // A bias that is missing from one layer is a missing tensor, named.
    let mut no_bias = tiny_family(&TinyFamily {
        bias: true,
        ..f.clone()
    });
    no_bias.tensors.retain(|t| t.name != "blk.1.attn_k.bias");
    let e = load(&no_bias, "nobias");
    assert!(e.to_string().contains("blk.1.attn_k.bias"), "{e}");
    assert_eq!(TINY_VOCAB, 262);
}

/// The rope kernels of a Llama 3 decode step and prompt (frequency factors, a sliding window's
/// mask beside them) carry the file's factors (folded into their inverse-frequency table), and
/// compile for gfx90a and gfx1030 through hiprtc without spills or scratch (skipped without hiprtc
/// unless ROCMFORGE_REQUIRE_HIPRTC=1). NVIDIA's compile of rope kernels is in
/// tests/decode_kernels.rs.
#[test]
fn rope_factor_kernels_compile_for_amd() {
    use rocmforge::arch::Target;
    use rocmforge::codegen::{generate_with, CodegenOptions};
    use rocmforge::passes::optimize;
    use rocmforge::runtime::{AmdCompiler, Hiprtc};

    let mut f = TinyFamily::new("llama");
    f.rope_freqs = Some(vec![1.0, 1.0, 1.0, 1.5, 2.75, 5.0, 8.0, 8.0]);
    f.window = Some(3);
    let p = write("llama3-kernels", &tiny_family(&f));
    let m = LlamaModel::load(&p).unwrap();
    std::fs::remove_file(&p).ok();
    let graphs = [
        m.kv_graph(1, 32, Precision::F32, false).unwrap(),
        m.graph(PROMPT.len(), Logits::Last).unwrap(),
    ];
    let rtc = match Hiprtc::load() {
        Ok(r) => Some(AmdCompiler::Hiprtc(r)),
        Err(e) => {
            assert!(
                std::env::var("ROCMFORGE_REQUIRE_HIPRTC").map_or(true, |v| v != "1"),
                "ROCMFORGE_REQUIRE_HIPRTC=1 but no hiprtc: {e}"
            );
            eprintln!("skipped compiling: no hiprtc ({e})");
            None
        }
    };
    for arch in ["gfx90a", "gfx1030"] {
        let target = Target::parse(arch).unwrap();
        let mut set = kernel_compile::KernelSet::new();
        for g in &graphs {
            let (fused, _) = optimize(g).unwrap();
            let plan = generate_with(&fused, &target, &CodegenOptions::default()).unwrap();
            for k in plan.kernels.iter().filter(|k| k.family == "rope") {
                let source = plan.source(k);
                assert!(
                    source.contains("_inv_freq[i]") && source.contains("with Llama 3 factors"),
                    "{source}"
                );
                set.entry(k.entry.clone())
                    .or_insert((source, k.body.clone(), g.name.clone()));
            }
        }
        assert!(!set.is_empty(), "{arch}: no rope kernel");
        if let Some(rtc) = &rtc {
            kernel_compile::amd(rtc, arch, &set).unwrap();
        }
    }
}
