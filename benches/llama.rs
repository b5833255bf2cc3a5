//! SmolLM2-135M (the real GGUF from `scripts/fetch-models`; without it the bench says so and
//! exits) on the best GPU, f16 and quantized (the file's Q4_1/Q8_0 blocks, f16 activations):
//!
//! - `prefill_1024`: ms for one 1024-token prefill through the KV cache (token id read back);
//! - `decode_ctxN` (N = 128, 512, 2048): ms per decode token with replay, after a prefill that
//!   filled the cache to N (two 1024-token chunks for 2048), each step as `rocmforge generate`
//!   runs it: inputs written, the replayed plan, the token read back.
//!
//! - `batched_bB` (B = 1, 8, 32, 64): ms per decode step of B sequences at once through the
//!   paged KV cache (`serve::batched`, what `rocmforge serve` runs), each after a 128-token
//!   prompt of its own; tokens/s = B / step time (`tokens_per_s` in the JSON).
//!
//! Each row also carries the plan's launches (`kernels`) and `kernels_per_token` (launches over
//! the tokens a run computes), which benches/llamacpp_compare.py prints beside llama.cpp.
//!
//! f16 rows are named as benches/llama_compare.py expects (`prefill_1024`, `decode_ctxN`); the
//! quantized rows end in `_q4`; `_mk` rows run the decode step as one persistent kernel
//! (`CodegenOptions::persistent`, issue 22's megakernel) in the same run. Medians over the runs; same environment as the other benches
//! (benches/common/summary.rs: `ROCMFORGE_BENCH_FILTER`, `ROCMFORGE_BENCH_JSON`).

#[allow(dead_code)] // table_only: this bench prints a table only
#[path = "common/summary.rs"]
mod summary;
#[path = "common/timing.rs"]
mod timing;

use std::path::PathBuf;
use std::time::Instant;

use rocmforge::codegen::Persistent;
use rocmforge::compile::{CompileOptions, Executable, Session, SessionOptions};
use rocmforge::frontend::llama::{io, Precision};
use rocmforge::frontend::{self, LlamaModel};
use rocmforge::ir::{DType, Graph, Tensor};
use rocmforge::runtime::Device;
use rocmforge::serve::batched::{kv_block_bytes, BatchOptions, BatchedGenerator};

const PREFILL: usize = 1024;
const BATCHES: [usize; 4] = [1, 8, 32, 64];
/// The prompt each sequence of a batched row starts from.
const BATCH_PROMPT: usize = 128;
const CONTEXTS: [usize; 3] = [128, 512, 2048];
/// Room for a decode step at position 2048.
const MAX_CONTEXT: usize = 2048 + 64;

fn ints(dtype: DType, dims: &[usize], v: Vec<i64>) -> Tensor {
    Tensor::from_i64(dtype, dims.to_vec(), v).expect("sized here")
}

/// One step of `s` tokens at `start` over `kv_len` keys; returns after the token is on the host.
fn step(sess: &mut Session<'_>, s: usize, start: usize, kv_len: usize) {
    let ids = (0..s as i64).map(|i| (i * 7919 + 13) % 49152).collect();
    sess.set_input(io::INPUT_IDS, &ints(DType::I64, &[1, s], ids))
        .unwrap();
    let positions = (start as i64..(start + s) as i64).collect();
    sess.set_input(io::POSITIONS, &ints(DType::I32, &[s], positions))
        .unwrap();
    sess.set_input(io::START, &ints(DType::I32, &[1], vec![start as i64]))
        .unwrap();
    sess.set_input(io::KV_LEN, &ints(DType::I32, &[1], vec![kv_len as i64]))
        .unwrap();
    sess.set_input(io::LAST, &ints(DType::I32, &[1], vec![s as i64 - 1]))
        .unwrap();
    sess.run().unwrap();
    sess.output(io::TOKEN).unwrap();
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median ms of `f` over `n` calls after two warm-ups.
fn time_ms(n: usize, mut f: impl FnMut()) -> f64 {
    f();
    f();
    median(
        (0..n)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect(),
    )
}

fn plans(
    m: &LlamaModel,
    d: &Device,
    p: Precision,
    persistent: Persistent,
) -> (Executable, Executable) {
    let prefill = m.kv_graph(PREFILL, MAX_CONTEXT, p, false).unwrap();
    let decode = m.kv_graph(1, MAX_CONTEXT, p, false).unwrap();
    // The warpgroup GEMM as ROCMFORGE_BENCH_WGMMA says (benches/common/timing.rs).
    let wgmma = timing::bench_options();
    let options = CompileOptions {
        weights: m.weights_for(&decode).unwrap(),
        quantized: m.quantized_for(&decode).unwrap(),
        progress: false,
        wgmma_gemm: wgmma.wgmma_gemm,
        wgmma_tma: wgmma.wgmma_tma,
        wgmma_attention: wgmma.wgmma_attention,
        ..CompileOptions::default()
    };
    // The decode plan alone as one persistent kernel (the `_mk` rows): the prefill's TMA GEMMs
    // take tensor maps, which the persistent kernel refuses.
    let decode_options = CompileOptions {
        persistent,
        ..options.clone()
    };
    (
        Graph::compile_with(prefill, d, &options).unwrap(),
        Graph::compile_with(decode, d, &decode_options).unwrap(),
    )
}

fn main() {
    let path = std::env::var_os("ROCMFORGE_SMOLLM2")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            frontend::model_cache_dir(frontend::SMOLLM2).join(frontend::SMOLLM2_GGUF)
        });
    if !path.is_file() {
        println!(
            "skipped: SmolLM2 not found at {} (run scripts/fetch-models)",
            path.display()
        );
        return;
    }
    let (device, notes) = Device::best().expect("a device");
    if !device.is_gpu() {
        println!(
            "skipped: no GPU ({}); the interpreter would take hours on a 1024-token prefill",
            notes.join("; ")
        );
        return;
    }
    let m = LlamaModel::load(&path).unwrap();
    println!("SmolLM2-135M on {}", device.label());
    println!("{:<22} {:>10}", "case", "ms");
    let mut rows = Vec::new();
    // ROCMFORGE_BENCH_MK=4x256,8x1024: the persistent rows shaped for R blocks per
    // multiprocessor and at most T tasks a step (`_mk4x256`, `_q4_mk4x256`, ...); unset, `_mk`
    // and `_q4_mk` (the default shape).
    let mut variants = vec![
        ("".to_string(), Precision::F16, Persistent::Off),
        (
            "_q4".to_string(),
            Precision::quantized(DType::F16),
            Persistent::Off,
        ),
    ];
    match std::env::var("ROCMFORGE_BENCH_MK") {
        Ok(list) => {
            // A trailing `t` (4x256t): the kernel keeps its timeline, printed after the row.
            let shapes = list.split(',').filter_map(|s| {
                let s = s.trim();
                let (s, timed) = match s.strip_suffix('t') {
                    Some(rest) => (rest, true),
                    None => (s, false),
                };
                let (r, t) = s.split_once('x')?;
                Some((r.parse::<u32>().ok()?, t.parse::<u32>().ok()?, timed))
            });
            for (resident, tasks, timed) in shapes {
                let shape = Persistent::Shaped {
                    resident,
                    tasks,
                    timed,
                };
                let name = format!("mk{resident}x{tasks}{}", if timed { "t" } else { "" });
                variants.push((format!("_{name}"), Precision::F16, shape));
                variants.push((
                    format!("_q4_{name}"),
                    Precision::quantized(DType::F16),
                    shape,
                ));
            }
        }
        Err(_) => {
            variants.push(("_mk".into(), Precision::F16, Persistent::On));
            variants.push((
                "_q4_mk".into(),
                Precision::quantized(DType::F16),
                Persistent::On,
            ));
        }
    }
    for (suffix, p, persistent) in variants {
        let names: Vec<String> = std::iter::once(format!("prefill_{PREFILL}{suffix}"))
            .chain(CONTEXTS.iter().map(|c| format!("decode_ctx{c}{suffix}")))
            .collect();
        if !names.iter().any(|n| summary::selected(n)) {
            continue;
        }
        let t0 = Instant::now();
        let (pre, dec) = plans(&m, &device, p, persistent);
        eprintln!("{p:?}: compiled in {:.1} s", t0.elapsed().as_secs_f64());
        let mut ps = pre.session_with(&SessionOptions { replay: false }).unwrap();
        let mut ds = dec
            .session_sharing(&SessionOptions { replay: true }, &ps)
            .unwrap();
        // Launches per run of each plan: for decode, the kernels every token costs.
        let (pre_kernels, dec_kernels) = (
            pre.plan().map(|p| p.kernels.len()),
            dec.plan().map(|p| p.kernels.len()),
        );
        let mut record = |case: String, ms: f64, kernels: Option<usize>, tokens: usize| {
            println!("{case:<22} {ms:>10.3}");
            rows.push(serde_json::json!({
                "case": case,
                "ms": ms,
                "dtype": p.dtype.to_string(),
                "quantized": p.quantized,
                "kernels": kernels,
                "kernels_per_token": kernels.map(|k| k as f64 / tokens as f64),
            }));
        };
        let case = format!("prefill_{PREFILL}{suffix}");
        if summary::selected(&case) {
            let ms = time_ms(10, || step(&mut ps, PREFILL, 0, PREFILL));
            record(case, ms, pre_kernels, PREFILL);
        }
        for ctx in CONTEXTS {
            let case = format!("decode_ctx{ctx}{suffix}");
            if !summary::selected(&case) {
                continue;
            }
            // The cache filled to ctx (the 1024-token plan in chunks), then steps at ctx.
            let mut filled = 0;
            while filled < ctx {
                step(&mut ps, PREFILL, filled, filled + PREFILL);
                filled += PREFILL;
            }
            let ms = time_ms(100, || step(&mut ds, 1, ctx, ctx + 1));
            record(case, ms, dec_kernels, 1);
            if let Ok(Some(timeline)) = ds.persistent_timeline() {
                print_timeline(&timeline);
            }
            // Where a decode step's time goes: each kernel's device time, run one by one
            // (ROCMFORGE_BENCH_BREAKDOWN=1; GPU only).
            if std::env::var("ROCMFORGE_BENCH_BREAKDOWN").is_ok_and(|v| v == "1") {
                if let Ok(profile) = ds.profile() {
                    eprintln!(
                        "decode_ctx{ctx}{suffix} kernel by kernel:\n{}",
                        profile.family_table()
                    );
                }
            }
        }
    }
    for (suffix, p) in [
        ("", Precision::F16),
        ("_q4", Precision::quantized(DType::F16)),
    ] {
        batched(&path, &device, p, suffix, &mut rows);
    }
    summary::write_json(&device, rows);
}

/// Where a timed persistent decode step's time went (the last run's in-kernel timeline), by
/// the kind of step (its node's name without the number): steps, the summed time from a step's
/// first task starting to its last ending, the summed gap from the previous step's end to its
/// start, and its tasks' mean wait and busy time.
fn print_timeline(t: &rocmforge::codegen::Timeline) {
    println!(
        "  kernel: {:.1} us from its first block's start to its last block's exit",
        (t.kernel_end - t.kernel_start) as f64 / 1e3
    );
    let timeline = &t.steps;
    let (Some(first), Some(last)) = (
        timeline.iter().map(|t| t.start).min(),
        timeline.iter().map(|t| t.end).max(),
    ) else {
        return;
    };
    println!(
        "  timeline: {} steps, {:.1} us from the first task's start to the last's end",
        timeline.len(),
        (last - first) as f64 / 1e3
    );
    let mut kinds: Vec<(String, usize, f64, f64, f64, f64)> = Vec::new();
    let mut prev_end = first;
    for t in timeline {
        // gemm x3 (Q/K/V merged), gemm x2 (gate/up), gemm (O, down, head), flash_attention, ...
        let parts = t.node.split('+').count();
        let base = t
            .node
            .split('+')
            .next()
            .unwrap_or("")
            .trim_end_matches(|c: char| c.is_ascii_digit() || c == '_');
        let kind = if parts > 1 {
            format!("{base} x{parts}")
        } else {
            base.to_string()
        };
        let span = (t.end - t.start) as f64 / 1e3;
        let gap = (t.start as f64 - prev_end as f64) / 1e3;
        prev_end = t.end;
        match kinds.iter_mut().find(|k| k.0 == kind) {
            Some(k) => {
                k.1 += 1;
                k.2 += span;
                k.3 += gap;
                k.4 += t.wait as f64 / 1e3;
                k.5 += t.busy as f64 / 1e3;
            }
            None => kinds.push((kind, 1, span, gap, t.wait as f64 / 1e3, t.busy as f64 / 1e3)),
        }
    }
    println!(
        "  {:<18} {:>6} {:>10} {:>10} {:>14} {:>14}",
        "step kind", "steps", "span us", "gap us", "wait us (sum)", "busy us (sum)"
    );
    for (kind, n, span, gap, wait, busy) in kinds {
        println!("  {kind:<18} {n:>6} {span:>10.1} {gap:>10.1} {wait:>14.1} {busy:>14.1}");
    }
}

/// The `batched_bB` rows of precision `p`.
fn batched(
    path: &std::path::Path,
    device: &Device,
    p: Precision,
    suffix: &str,
    rows: &mut Vec<serde_json::Value>,
) {
    let selected: Vec<usize> = BATCHES
        .into_iter()
        .filter(|b| summary::selected(&format!("batched_b{b}{suffix}")))
        .collect();
    let Some(&most) = selected.iter().max() else {
        return;
    };
    let steps = 50;
    let max_context = 512;
    let m = LlamaModel::load(path).unwrap();
    let block_size = 16;
    let block_bytes = kv_block_bytes(&m, block_size, p.dtype).unwrap();
    let options = BatchOptions {
        precision: p,
        max_context,
        block_size,
        kv_memory: most * max_context.div_ceil(block_size) * block_bytes,
        max_batch: most,
        replay: true,
        logits: false,
        prefill_chunk: 0,
        // ROCMFORGE_BENCH_MMA_GEMV=off for the CUDA-core GEMV (benches/common/timing.rs).
        tensor_core_gemv: timing::bench_options().mma_gemv,
    };
    let t0 = Instant::now();
    let vocab = m.config.vocab_size as u64;
    let mut bg =
        BatchedGenerator::new(m, device, options, rocmforge::cpu::Precision::Exact).unwrap();
    bg.warm(BATCH_PROMPT).unwrap();
    eprintln!(
        "{p:?}: batched plans compiled in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    for b in selected {
        // b distinct prompts, each started alone (the prefill), then decoded together.
        let mut batch: Vec<(u64, u32)> = (0..b as u64)
            .map(|seq| {
                let prompt: Vec<u32> = (0..BATCH_PROMPT as u64)
                    .map(|i| ((seq * 131 + i * 7919 + 13) % vocab) as u32)
                    .collect();
                (seq, bg.start(seq, &prompt, false).unwrap().token)
            })
            .collect();
        let ms = time_ms(steps, || {
            let next = bg.step(&batch, false).unwrap();
            for (slot, n) in batch.iter_mut().zip(next) {
                slot.1 = n.token;
            }
        });
        // Where a batched step's time goes (ROCMFORGE_BENCH_BREAKDOWN=1; GPU only).
        if std::env::var("ROCMFORGE_BENCH_BREAKDOWN").is_ok_and(|v| v == "1") {
            match bg.profile_step(bg.batch_bucket(b)) {
                Err(e) => eprintln!("batched_b{b}{suffix}: no breakdown: {e}"),
                Ok(profile) => {
                    eprintln!(
                        "batched_b{b}{suffix} kernel by kernel:\n{}",
                        profile.family_table()
                    );
                    let mut slowest: Vec<_> = profile.kernels.iter().collect();
                    slowest.sort_by_key(|k| std::cmp::Reverse(k.time));
                    for k in slowest.iter().take(12) {
                        eprintln!(
                            "  {:>9.1} us  {:<40} {}",
                            k.time.as_secs_f64() * 1e6,
                            k.entry,
                            k.node
                        );
                    }
                }
            }
        }
        for &(seq, _) in &batch {
            bg.finish(seq).unwrap();
        }
        let case = format!("batched_b{b}{suffix}");
        let kernels = bg.kernels_per_step(bg.batch_bucket(b));
        println!("{case:<22} {ms:>10.3}   {:>8.0} tok/s", b as f64 * 1e3 / ms);
        rows.push(serde_json::json!({
            "case": case,
            "ms": ms,
            "dtype": p.dtype.to_string(),
            "quantized": p.quantized,
            "batch": b,
            "tokens_per_s": b as f64 * 1e3 / ms,
            "kernels": kernels,
            "kernels_per_token": kernels.map(|k| k as f64 / b as f64),
        }));
    }
}
