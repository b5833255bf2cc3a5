//! SmolLM2-135M generation on a GPU against the PyTorch reference in
//! ../shared/reference/smollm2: f32 greedy decoding through the KV cache, and the f16 and
//! quantized (Q4_1/Q8_0 blocks) paths on the prompt's top-1 and teacher-forced next tokens.
//! Ignored, with the reason, when the model file or the reference is not here.

use std::path::{Path, PathBuf};

use libtest_mimic::Failed;
use rocmforge::codegen::Persistent;
use rocmforge::compile::{CompileOptions, Executable, Session, SessionOptions};
use rocmforge::frontend::llama::{io, Precision};
use rocmforge::frontend::LlamaModel;
use rocmforge::generate::{GenerateOptions, Generator};
use rocmforge::ir::{DType, Graph, Tensor};
use rocmforge::runtime::Device;
use serde_json::Value;

use crate::common::nan_max::{max_abs, max_abs_diff, nan_max};

/// `shared/reference/smollm2/reference.json` beside the repository or one of its parents
/// (ROCMFORGE_SMOLLM2_REFERENCE names it directly).
fn reference_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ROCMFORGE_SMOLLM2_REFERENCE") {
        return Some(PathBuf::from(p));
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::env::current_dir()
        .ok()
        .into_iter()
        .chain([root.to_path_buf()])
        .flat_map(|d| d.ancestors().map(Path::to_path_buf).collect::<Vec<_>>())
        .map(|d| d.join("shared/reference/smollm2/reference.json"))
        .find(|p| p.is_file())
}

/// Why the llama trials cannot run here, if they cannot.
pub fn missing() -> Option<String> {
    let p = crate::common::smollm2::gguf_path();
    if !p.is_file() {
        return Some(format!(
            "SmolLM2 not found at {} (scripts/fetch-models, or ROCMFORGE_SMOLLM2)",
            p.display()
        ));
    }
    if reference_path().is_none() {
        return Some("shared/reference/smollm2/reference.json not found".into());
    }
    None
}

fn reference() -> Result<Vec<Value>, Failed> {
    let p = reference_path().ok_or("no reference.json")?;
    let v: Value = serde_json::from_str(&std::fs::read_to_string(p)?)?;
    Ok(v["cases"].as_array().ok_or("no cases")?.clone())
}

fn ids(v: &Value) -> Result<Vec<u32>, Failed> {
    Ok(serde_json::from_value(v.clone())?)
}

/// Every prompt's 24 greedy tokens through the cache (f32), exactly.
pub fn f32_greedy(d: &Device) -> Result<(), Failed> {
    let options = GenerateOptions {
        precision: Precision::F32,
        max_context: 256,
        replay: true,
        logits: false,
    };
    let mut g = Generator::load(&crate::common::smollm2::gguf_path(), d, options)?;
    for case in reference()? {
        let want = ids(&case["greedy_24_ids"])?;
        let out = g.generate(&ids(&case["input_ids"])?, 24, |_| true)?;
        if out.ids != want {
            return Err(format!("{}: {:?}, want {want:?}", case["prompt"], out.ids).into());
        }
    }
    Ok(())
}

fn ints(dtype: DType, dims: &[usize], v: Vec<i64>) -> Tensor {
    Tensor::from_i64(dtype, dims.to_vec(), v).expect("sized here")
}

/// Runs a step of `s` tokens at `start` (ids right-padded), `kv_len` keys; the logits of row
/// `last`.
fn step(
    sess: &mut Session<'_>,
    s: usize,
    ids: &[u32],
    start: usize,
    kv_len: usize,
    last: usize,
) -> Result<Vec<f64>, Failed> {
    let mut padded: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
    padded.resize(s, 0);
    sess.set_input(io::INPUT_IDS, &ints(DType::I64, &[1, s], padded))?;
    let positions = (start as i64..(start + s) as i64).collect();
    sess.set_input(io::POSITIONS, &ints(DType::I32, &[s], positions))?;
    sess.set_input(io::START, &ints(DType::I32, &[1], vec![start as i64]))?;
    sess.set_input(io::KV_LEN, &ints(DType::I32, &[1], vec![kv_len as i64]))?;
    sess.set_input(io::LAST, &ints(DType::I32, &[1], vec![last as i64]))?;
    sess.run()?;
    Ok(sess.output(io::LOGITS)?.to_f64_vec())
}

fn top2(v: &[f64]) -> (usize, f64) {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[b].total_cmp(&v[a]));
    (idx[0], v[idx[0]] - v[idx[1]])
}

/// Prefill (bucket 32) and decode plans of `p` with their logits.
fn plans(m: &LlamaModel, d: &Device, p: Precision) -> Result<(Executable, Executable), Failed> {
    let prefill = m.kv_graph(32, 64, p, true)?;
    let decode = m.kv_graph(1, 64, p, true)?;
    let options = CompileOptions {
        weights: m.weights_for(&decode)?,
        quantized: m.quantized_for(&decode)?,
        progress: false,
        ..CompileOptions::default()
    };
    Ok((
        Graph::compile_with(prefill, d, &options)?,
        Graph::compile_with(decode, d, &options)?,
    ))
}

/// The logits after the prompt and after each of the reference's greedy tokens fed back
/// (teacher forcing), with the caches poisoned first.
fn forced(pre: &Executable, dec: &Executable, case: &Value) -> Result<Vec<Vec<f64>>, Failed> {
    let prompt = ids(&case["input_ids"])?;
    let greedy = ids(&case["greedy_24_ids"])?;
    let mut p = pre.session()?;
    let mut s = dec.session_sharing(&SessionOptions::default(), &p)?;
    p.poison_state()?;
    let n = prompt.len();
    let mut out = vec![step(&mut p, 32, &prompt, 0, 32, n - 1)?];
    for (i, &t) in greedy.iter().enumerate().take(greedy.len() - 1) {
        out.push(step(&mut s, 1, &[t], n + i, n + i + 1, 0)?);
    }
    Ok(out)
}

/// f16 or quantized: the prompt's top-1 is the reference's, and teacher-forced, the next token
/// is the reference's greedy one wherever the f32 plan's top-1/top-2 margin exceeds 0.5 (the
/// f32 path is the reference's to 1e-3; the reference's own margin, `last_logits_top8`, checks
/// the prompt position).
pub fn reduced(d: &Device, p: Precision) -> Result<(), Failed> {
    let m = LlamaModel::load(&crate::common::smollm2::gguf_path())?;
    let (pre32, dec32) = plans(&m, d, Precision::F32)?;
    let (pre, dec) = plans(&m, d, p)?;
    for case in reference()? {
        let top8: Vec<(usize, f64)> = serde_json::from_value(case["last_logits_top8"].clone())?;
        let greedy = ids(&case["greedy_24_ids"])?;
        let want32 = forced(&pre32, &dec32, &case)?;
        let got = forced(&pre, &dec, &case)?;
        let (t0, _) = top2(&got[0]);
        if t0 != top8[0].0 {
            return Err(format!(
                "{p:?} {}: prompt top-1 {t0}, want {}",
                case["prompt"], top8[0].0
            )
            .into());
        }
        let (mut clear, mut agree) = (0, 0);
        for (i, (g, w)) in got.iter().zip(&want32).enumerate() {
            let (wt, margin) = top2(w);
            if wt != greedy[i] as usize {
                return Err(format!("f32 step {i}: {wt}, reference {}", greedy[i]).into());
            }
            if margin > 0.5 {
                clear += 1;
                let (gt, _) = top2(g);
                if gt != wt {
                    return Err(format!(
                        "{p:?} {}: step {i}: {gt}, want {wt} (f32 margin {margin:.2})",
                        case["prompt"]
                    )
                    .into());
                }
                agree += 1;
            }
        }
        eprintln!(
            "{p:?} {}: {agree}/{clear} clear steps agree",
            case["prompt"]
        );
    }
    Ok(())
}

/// The tiny LLaMA of tests/common/tiny_gguf.rs (every tensor type the reader supports, Q/K
/// rows permuted as llama.cpp stores them) written to a temporary file.
fn tiny_model() -> Result<LlamaModel, Failed> {
    // A file of its own per call: trials run in parallel.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("rocmforge-gpu-llama-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let p = dir.join(format!("tiny-{call}.gguf"));
    std::fs::write(&p, crate::common::tiny_gguf::tiny_llama().to_bytes())?;
    let m = LlamaModel::load(&p)?;
    std::fs::remove_file(&p).ok();
    Ok(m)
}

/// Prefill (bucket 16) and decode plans of the tiny model on `d`, context 48; the decode plan
/// as one persistent kernel where `persistent` says so.
fn tiny_plans(
    m: &LlamaModel,
    d: &Device,
    p: Precision,
    persistent: Persistent,
) -> Result<(Executable, Executable), Failed> {
    let prefill = m.kv_graph(16, 48, p, true)?;
    let decode = m.kv_graph(1, 48, p, true)?;
    let options = CompileOptions {
        weights: m.weights_for(&decode)?,
        quantized: m.quantized_for(&decode)?,
        progress: false,
        ..CompileOptions::default()
    };
    let decode_options = CompileOptions {
        persistent,
        ..options.clone()
    };
    Ok((
        Graph::compile_with(prefill, d, &options)?,
        Graph::compile_with(decode, d, &decode_options)?,
    ))
}

/// The prompt prefilled into `a`'s and `b`'s poisoned caches, then 12 decode steps each fed the
/// top token of `b`'s last logits: every step's logits of `a` and of `b`.
#[allow(clippy::type_complexity)]
fn side_by_side(
    (a_pre, a_dec): (&Executable, &Executable),
    (b_pre, b_dec): (&Executable, &Executable),
    prompt: &[u32],
) -> Result<(Vec<Vec<f64>>, Vec<Vec<f64>>), Failed> {
    let n = prompt.len();
    let mut aps = a_pre.session()?;
    // Replayed decode sessions (the default), as `generate` runs them.
    let mut ads = a_dec.session_sharing(&SessionOptions::default(), &aps)?;
    let mut bps = b_pre.session()?;
    let mut bds = b_dec.session_sharing(&SessionOptions::default(), &bps)?;
    aps.poison_state()?;
    bps.poison_state()?;
    let mut got = vec![step(&mut aps, 16, prompt, 0, 16, n - 1)?];
    let mut want = vec![step(&mut bps, 16, prompt, 0, 16, n - 1)?];
    for i in 0..12 {
        let (t, _) = top2(want.last().expect("one"));
        let t = t as u32;
        got.push(step(&mut ads, 1, &[t], n + i, n + i + 1, 0)?);
        want.push(step(&mut bds, 1, &[t], n + i, n + i + 1, 0)?);
    }
    // Past the cache's 48 rows: the op's own check, as on the CPU.
    match step(&mut ads, 1, &[0], 48, 49, 0) {
        Err(e) if e.message().is_some_and(|m| m.contains("48")) => {}
        other => return Err(format!("write past the end: {other:?}").into()),
    }
    Ok((got, want))
}

/// The tiny model through the KV cache on the GPU against the interpreter, in f32, f16 and
/// quantized (blocks kept; f32 and f16 activations): a padded prefill with poisoned caches,
/// then decode steps fed the interpreter's tokens; the logits of every step within the dtype's
/// tolerance, the f32 tokens exactly. Then the f32 generator on both devices gives the same
/// tokens, and a cache write past the end is the interpreter's error.
pub fn tiny(d: &Device) -> Result<(), Failed> {
    // Shared with every trial, exclusive to the memory check (it measures the device's memory).
    let _shared = crate::harness::MEMORY
        .read()
        .unwrap_or_else(|p| p.into_inner());
    let m = tiny_model()?;
    let prompt: Vec<u32> = m.tokenizer.encode("hello world, hello")?;
    let cpu = Device::cpu();
    for (p, tol) in [
        (Precision::F32, 1e-3),
        // The GPU's decode GEMV rounds activations to 8 bits (the int8 GEMV, as llama.cpp's
        // mmvq): 0.5% of the logits' scale where the f32 path is within 0.1%.
        (Precision::quantized(DType::F32), 1e-2),
        (Precision::F16, 0.05),
        (Precision::quantized(DType::F16), 0.05),
    ] {
        let (gp, gd) = tiny_plans(&m, d, p, Persistent::Off)?;
        let (cp, cd) = tiny_plans(&m, &cpu, p, Persistent::Off)?;
        let (got, want) = side_by_side((&gp, &gd), (&cp, &cd), &prompt)
            .map_err(|e| format!("{p:?}: {}", e.message().unwrap_or("failed")))?;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            // NaN-keeping maxima: `fold(_, f64::max)` drops NaN, and NaN logits passed.
            let scale = nan_max(max_abs(w), 1.0);
            let worst = max_abs_diff(g, w);
            if worst.is_nan() || scale.is_nan() || worst > tol * scale {
                return Err(format!("{p:?}: step {i}: max |Δ| {worst} (scale {scale})").into());
            }
            if p == Precision::F32 && top2(g).0 != top2(w).0 {
                return Err(format!("{p:?}: step {i}: token differs").into());
            }
        }
    }
    let options = GenerateOptions {
        precision: Precision::F32,
        max_context: 48,
        replay: true,
        logits: false,
    };
    let mut on_gpu = Generator::new(tiny_model()?, d, options.clone())?;
    let mut on_cpu = Generator::new(tiny_model()?, &cpu, options)?;
    let a = on_gpu.generate(&prompt, 20, |_| true)?;
    let b = on_cpu.generate(&prompt, 20, |_| true)?;
    if a.ids != b.ids {
        return Err(format!("generator: GPU {:?}, CPU {:?}", a.ids, b.ids).into());
    }
    eprintln!("tiny generator: {:?} ({:?})", a.ids, a.stats);
    Ok(())
}

/// The tiny model's decode steps as one persistent kernel against the per-kernel plan on the
/// same device, in f32, f16 and quantized: the same prompt prefilled into two poisoned caches,
/// then 12 replayed decode steps fed the same tokens; every step's logits bitwise equal (each
/// task runs its kernel's own body, so the order of operations is the same), and the plan is
/// one kernel.
pub fn tiny_persistent(d: &Device) -> Result<(), Failed> {
    // Shared with every trial, exclusive to the memory check (it measures the device's memory).
    let _shared = crate::harness::MEMORY
        .read()
        .unwrap_or_else(|p| p.into_inner());
    let m = tiny_model()?;
    let prompt: Vec<u32> = m.tokenizer.encode("hello world, hello")?;
    for p in [
        Precision::F32,
        Precision::quantized(DType::F32),
        Precision::F16,
        Precision::quantized(DType::F16),
    ] {
        let (pp, pd) = tiny_plans(&m, d, p, Persistent::On)?;
        let (kp, kd) = tiny_plans(&m, d, p, Persistent::Off)?;
        let kernels = pd.plan().map(|p| p.kernels.len());
        if kernels != Some(1) {
            return Err(format!("{p:?}: the persistent plan has {kernels:?} kernels").into());
        }
        let (got, want) = side_by_side((&pp, &pd), (&kp, &kd), &prompt)
            .map_err(|e| format!("{p:?}: {}", e.message().unwrap_or("failed")))?;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let same =
                g.len() == w.len() && g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits());
            if !same {
                let worst = max_abs_diff(g, w);
                return Err(format!("{p:?}: step {i}: not bitwise equal (max |Δ| {worst})").into());
            }
        }
    }
    Ok(())
}

/// A persistent decode kernel whose last step waits for itself (`Persistent::NeverReady`, a
/// dependency that can never be met) ends in the typed stall error within its bounded wait,
/// instead of hanging the GPU; the session runs again (and fails again) afterwards.
pub fn tiny_persistent_stall(d: &Device) -> Result<(), Failed> {
    // Shared with every trial, exclusive to the memory check (it measures the device's memory).
    let _shared = crate::harness::MEMORY
        .read()
        .unwrap_or_else(|p| p.into_inner());
    let m = tiny_model()?;
    let prompt: Vec<u32> = m.tokenizer.encode("hello")?;
    let n = prompt.len();
    let (pp, pd) = tiny_plans(&m, d, Precision::F32, Persistent::NeverReady)?;
    let mut pps = pp.session()?;
    let mut pds = pd.session_sharing(&SessionOptions { replay: true }, &pps)?;
    step(&mut pps, 16, &prompt, 0, 16, n - 1)?;
    for round in 0..2 {
        let t = std::time::Instant::now();
        match step(&mut pds, 1, &[1], n + round, n + round + 1, 0) {
            Err(e) if e.message().is_some_and(|m| m.contains("waited in vain")) => {}
            other => return Err(format!("round {round}: {other:?}").into()),
        }
        let s = t.elapsed().as_secs_f64();
        eprintln!("persistent stall reported after {s:.2} s");
        if s > 30.0 {
            return Err(format!("round {round}: the stall took {s:.1} s to report").into());
        }
    }
    Ok(())
}
