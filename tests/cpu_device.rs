//! The CPU device (`rocmforge::cpu`) against the interpreter on the same fused graphs: every
//! example graph and every op of the op zoo at odd sizes, after the default pass pipeline;
//! quantized weights in both precisions; the decode step with its KV cache over several runs;
//! thread counts 1 and 2; and no allocation in a warm run. Then the same at the session
//! level: executables compiled on device `cpu` (the fast executor) against device `interp` (the
//! reference), for the example graphs and a decode loop whose KV cache two sessions share.

#[path = "common/accuracy.rs"]
mod accuracy;
mod common;
#[path = "common/glu_cases.rs"]
mod glu_cases;
#[path = "common/norm_cases.rs"]
mod norm_cases;

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use accuracy::{rel_l2, tolerance};
use glu_cases::GluCase;
use rocmforge::compile::{CompileError, CompileOptions, Executable, SessionOptions};
use rocmforge::cpu::{CpuOptions, CpuPlan, Precision};
use rocmforge::interp::{self, Bindings};
use rocmforge::ir::{format, Graph, Op, Tensor};
use rocmforge::passes;
use rocmforge::runtime::Device;

/// Counts allocations made by the thread that set `COUNTING` (and by rayon's workers while
/// it is set): a warm run must make none.
struct Counting;
static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);
/// Tests run one at a time, so the count is the warm run's alone.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

// SAFETY: every call is forwarded to the system allocator unchanged; the counter is atomic.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from `System.alloc` with this layout.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn exact(threads: usize) -> CpuOptions {
    CpuOptions {
        threads,
        precision: Precision::Exact,
    }
}

fn example(name: &str) -> Graph {
    let path = format!("{}/graphs/{name}.json", env!("CARGO_MANIFEST_DIR"));
    format::load(std::path::Path::new(&path)).unwrap()
}

fn fused(g: &Graph) -> Graph {
    passes::optimize(g).unwrap().0
}

/// Runs `g` on the CPU device with `b`'s inputs and weights.
fn cpu_run(g: &Graph, b: &Bindings, opts: CpuOptions) -> Vec<Tensor> {
    let plan = CpuPlan::new(g, b, opts).unwrap();
    let mut s = plan.session().unwrap();
    s.set_inputs(b).unwrap();
    s.run().unwrap();
    s.outputs().unwrap()
}

fn check(what: &str, got: &[Tensor], want: &[Tensor], scale: f64) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.ty(), w.ty(), "{what} output {i}");
        if w.dtype().is_float() {
            // NaN and infinities where the interpreter has them (the op zoo's log, pow, …),
            // then the relative L2 error of the finite rest.
            let (gv, wv) = (g.to_f64_vec(), w.to_f64_vec());
            for (j, (a, b)) in gv.iter().zip(&wv).enumerate() {
                if !b.is_finite() {
                    assert!(
                        a.is_nan() && b.is_nan() || a == b,
                        "{what} output {i}[{j}]: {a} vs {b}"
                    );
                }
            }
            let keep = |v: &[f64]| -> Vec<f64> {
                v.iter()
                    .zip(&wv)
                    .map(|(&x, b)| if b.is_finite() { x } else { 0.0 })
                    .collect()
            };
            let ft = |v: Vec<f64>| {
                Tensor::from_f64(rocmforge::ir::DType::F32, vec![v.len()], &v).unwrap()
            };
            let e = rel_l2(&ft(keep(&gv)), &ft(keep(&wv)))
                .unwrap_or_else(|e| panic!("{what} output {i}: {e}"));
            let tol = tolerance(w.dtype()) * scale;
            assert!(e <= tol, "{what} output {i}: rel L2 {e:e} > {tol:e}");
        } else {
            assert_eq!(g, w, "{what} output {i}");
        }
    }
}

/// The interpreter on the fused graph, the device with 1 and 2 threads; the two thread
/// counts bitwise equal (every reduction's order is fixed by the plan, not the threads).
fn against_interp(what: &str, g: &Graph, seed: u64) {
    let b = Bindings::random(g, seed);
    let want = interp::run(g, &b).unwrap();
    let one = cpu_run(g, &b, exact(1));
    check(&format!("{what} (1 thread)"), &one, &want, 1.0);
    let two = cpu_run(g, &b, exact(2));
    check(&format!("{what} (2 threads)"), &two, &want, 1.0);
}

#[test]
fn example_graphs_match_the_interpreter_after_the_passes() {
    let _serial = serial();
    for name in [
        "attention",
        "attention_causal",
        "attention_f16",
        "attention_padding_mask",
        "bert_layer",
        "gqa_attention",
        "gqa_decode",
        "gqa_decode_f16",
        "llama_block",
        "quant_linear",
        "quant_prefill_f16",
        "decode_step",
    ] {
        let g = fused(&example(name));
        against_interp(name, &g, 7);
    }
}

#[test]
fn every_op_of_the_zoo_matches_the_interpreter_unfused_and_fused() {
    let _serial = serial();
    for g in common::op_zoo::zoo() {
        against_interp(&format!("{} (unfused)", g.name), &g, 3);
        against_interp(&format!("{} (fused)", g.name), &fused(&g), 3);
    }
}

#[test]
fn quantized_gemv_on_the_blocks_is_within_8_bit_activation_error() {
    let _serial = serial();
    for name in ["quant_linear", "quant_prefill_f16", "llama_block"] {
        let g = fused(&example(name));
        let b = Bindings::random(&g, 11);
        let want = interp::run(&g, &b).unwrap();
        for threads in [1, 2] {
            let opts = CpuOptions {
                threads,
                precision: Precision::Q8Activations,
            };
            let got = cpu_run(&g, &b, opts);
            // 8-bit activations: about 0.4% per product, documented in `cpu::Precision`.
            for (i, (x, w)) in got.iter().zip(&want).enumerate() {
                if w.dtype().is_float() {
                    let e = rel_l2(x, w).unwrap();
                    assert!(e < 2e-2, "{name} output {i}: {e}");
                }
            }
        }
    }
}

/// Norms folded into their GEMVs (`passes::norm_gemv`): the device on the fused graph (the
/// prologue normalising the packed A rows) against the interpreter on the unfused graph, every
/// norm case (both norms, dense and quantized weights, shared norms, residual epilogues); the
/// quantized ones again with 8-bit activations.
#[test]
fn folded_norms_match_the_interpreter_on_the_unfused_graph() {
    let _serial = serial();
    for case in norm_cases::cases() {
        let (g, f) = (case.graph(), case.fused());
        assert!(!norm_cases::has_norm(&f), "{}", case.name());
        let b = Bindings::random(&g, 13);
        let want = interp::run(&g, &b).unwrap();
        for threads in [1, 2] {
            let got = cpu_run(&f, &b, exact(threads));
            check(&case.name(), &got, &want, 1.0);
            if case.scheme.is_some() {
                let opts = CpuOptions {
                    threads,
                    precision: Precision::Q8Activations,
                };
                for (x, w) in cpu_run(&f, &b, opts).iter().zip(&want) {
                    let e = rel_l2(x, w).unwrap();
                    assert!(e < 2e-2, "{} (8-bit activations): {e}", case.name());
                }
            }
        }
    }
}

/// Runs `steps` decode steps of `g` on the CPU device (one session: the caches stay in it)
/// and the same steps of `reference` through the interpreter's `run_with_state`: the
/// outputs and every state after every step must agree.
fn decode_steps_match(g: &Graph, reference: &Graph, steps: i64, seed: u64) {
    let plan = CpuPlan::new(g, &Bindings::random(g, 1), exact(2)).unwrap();
    let mut s = plan.session().unwrap();
    let mut states: HashMap<String, Tensor> = HashMap::new();
    for id in g.node_ids() {
        if let Op::State { .. } = g.op(id) {
            states.insert(g.node(id).name.clone(), Tensor::zeros(g.ty(id)));
        }
    }
    for step in 0..steps {
        let mut b = Bindings::random(g, seed + step as u64);
        b.seed = 1;
        for (name, t) in b.inputs.iter_mut() {
            if name == "pos" {
                *t = Tensor::from_i64(t.dtype(), t.shape().clone(), vec![step]).unwrap();
            } else if name == "kv_len" {
                *t = Tensor::from_i64(t.dtype(), t.shape().clone(), vec![step + 1]).unwrap();
            }
        }
        let (want, next) = interp::run_with_state(reference, &b, &HashMap::new(), &states).unwrap();
        s.set_inputs(&b).unwrap();
        s.run().unwrap();
        check(&format!("step {step}"), &s.outputs().unwrap(), &want, 1.0);
        for (name, t) in &next {
            let e = rel_l2(&s.state(name).unwrap(), t).unwrap();
            assert!(e <= 1e-5, "state {name} after step {step}: {e}");
        }
        states = next;
    }
}

/// Decoding step by step keeps the KV cache in the session as the interpreter's
/// `run_with_state` does.
#[test]
fn decode_steps_carry_the_cache_like_run_with_state() {
    let _serial = serial();
    let g = fused(&example("decode_step"));
    decode_steps_match(&g, &g, 6, 100);
}

/// The append form (`passes::DecodeAppend` in the default pipeline: q's rope and the step's
/// K/V rows taken into the attention) runs on the CPU device, step by step, as the interpreter
/// runs the unfused graph: outputs and both caches.
#[test]
fn decode_steps_in_the_append_form_match_the_unfused_step() {
    let _serial = serial();
    let plain = example("decode_step");
    let g = fused(&plain);
    let appending = g
        .node_ids()
        .filter(|&id| matches!(g.op(id), Op::FlashAttention(a) if a.append.is_some()))
        .count();
    assert_eq!(appending, 1);
    decode_steps_match(&g, &plain, 5, 300);
}

#[test]
fn errors_are_the_interpreters() {
    let _serial = serial();
    let g = fused(&example("decode_step"));
    let mut b = Bindings::random(&g, 1);
    let pos = b.inputs.get_mut("pos").unwrap();
    *pos = Tensor::from_i64(pos.dtype(), pos.shape().clone(), vec![1000]).unwrap();
    let plan = CpuPlan::new(&g, &b, exact(1)).unwrap();
    let mut s = plan.session().unwrap();
    s.set_inputs(&b).unwrap();
    let got = s.run().unwrap_err().to_string();
    let want = interp::run(&g, &b).unwrap_err().to_string();
    assert_eq!(got, want);
}

#[test]
fn a_warm_run_allocates_nothing() {
    let _serial = serial();
    for name in ["llama_block", "bert_layer", "decode_step", "quant_linear"] {
        let g = fused(&example(name));
        let b = Bindings::random(&g, 5);
        let plan = CpuPlan::new(&g, &b, CpuOptions::default()).unwrap();
        assert!(
            plan.fallbacks().is_empty(),
            "{name}: {:?}",
            plan.fallbacks()
        );
        let mut s = plan.session().unwrap();
        s.set_inputs(&b).unwrap();
        s.run().unwrap();
        ALLOCS.store(0, Ordering::SeqCst);
        COUNTING.store(true, Ordering::SeqCst);
        let r = s.run();
        COUNTING.store(false, Ordering::SeqCst);
        r.unwrap();
        let n = ALLOCS.load(Ordering::SeqCst);
        // The only allocations left are matrixmultiply's packing buffers, at most two per
        // dense sgemm call (one call per thread per batch of each f32 Gemm, two per block of
        // query rows of each prefill attention head); a graph whose
        // products are all Q8 GEMVs on blocks allocates nothing but, now and then, one block
        // of rayon's job queue (crossbeam's injector grows a block every 63 jobs injected
        // from outside the pool).
        let dense_calls: usize = g
            .node_ids()
            .filter_map(|id| match g.op(id) {
                Op::Gemm(gm) => {
                    let q = g
                        .operands(id)
                        .iter()
                        .any(|&o| matches!(g.op(o), Op::Weight { quant: Some(_), .. }));
                    (!q).then(|| gm.dims.sizes().unwrap()[0] * plan.threads())
                }
                // Prefill attention (8 query rows or more, `cpu::attention`) runs two
                // products per block of up to 128 query rows of each (batch, head).
                Op::FlashAttention(_) => {
                    let q = g.ty(g.operands(id)[0]).shape.dims().to_vec();
                    (q[2] >= 8).then(|| q[0] * q[1] * q[2].div_ceil(128) * 2)
                }
                _ => None,
            })
            .sum();
        eprintln!("{name}: {n} allocations in a warm run, {dense_calls} sgemm calls");
        assert!(
            n <= 2 * dense_calls + 1,
            "{name}: {n} allocations in a warm run"
        );
    }
}

fn compile_on(g: &Graph, device: &Device, seed: u64) -> Executable {
    let options = CompileOptions {
        seed,
        progress: false,
        ..CompileOptions::default()
    };
    Graph::compile_with(g, device, &options).unwrap()
}

/// Only the inputs of `b` (weights are fixed when compiled).
fn inputs_of(b: &Bindings) -> Bindings {
    Bindings {
        inputs: b.inputs.clone(),
        ..Bindings::default()
    }
}

/// An executable on `cpu` runs the fast executor's plan and one on `interp` the interpreter;
/// the outputs agree within the dtype tolerances, and the thread count changes no bit.
#[test]
fn executables_on_cpu_match_interp_for_the_example_graphs() {
    let _serial = serial();
    let interp = Device::interp();
    let (one, two) = (Device::cpu_threads(Some(1)), Device::cpu_threads(Some(2)));
    for name in [
        "attention",
        "attention_causal",
        "attention_f16",
        "attention_padding_mask",
        "bert_layer",
        "gqa_attention",
        "gqa_decode",
        "gqa_decode_f16",
        "llama_block",
        "quant_linear",
        "quant_prefill_f16",
        "decode_step",
    ] {
        let g = example(name);
        let b = inputs_of(&Bindings::random(&g, 9));
        let reference = compile_on(&g, &interp, 4);
        assert!(reference.cpu_plan().is_none(), "{name}: interp has no plan");
        let want = reference.run(&b).unwrap();
        let fast = compile_on(&g, &one, 4);
        let plan = fast
            .cpu_plan()
            .unwrap_or_else(|| panic!("{name}: no plan on cpu"));
        assert_eq!(plan.threads(), 1);
        assert_eq!(
            plan.precision(),
            Precision::Exact,
            "{name}: exact by default"
        );
        let got = fast.run(&b).unwrap();
        check(&format!("{name} on cpu"), &got, &want, 1.0);
        let got2 = compile_on(&g, &two, 4).run(&b).unwrap();
        assert_eq!(got, got2, "{name}: 1 and 2 threads differ");
        // `verify` still compares with the interpreter on the unfused graph.
        let (_, v) = fast.verify(&b).unwrap();
        assert_eq!(v.outputs.len(), want.len(), "{name}");
    }
}

/// A decode loop through sessions: a "prefill" session and a "decode" session of two
/// executables share one KV cache, alternating steps, on `cpu` and on `interp`; outputs and
/// cache agree at every step, and a reset zeroes the cache on both.
#[test]
fn a_decode_loop_sharing_the_kv_cache_matches_interp() {
    let _serial = serial();
    let g = example("decode_step");
    let mut runs = Vec::new();
    for device in [Device::interp(), Device::cpu_threads(Some(2))] {
        let a = compile_on(&g, &device, 1);
        let b = compile_on(&g, &device, 1);
        let mut first = a.session().unwrap();
        let mut second = b
            .session_sharing(&SessionOptions::default(), &first)
            .unwrap();
        let mut outs = Vec::new();
        for step in 0..6i64 {
            let mut inputs = inputs_of(&Bindings::random(&g, 100 + step as u64));
            for (name, t) in inputs.inputs.iter_mut() {
                if name == "pos" {
                    *t = Tensor::from_i64(t.dtype(), t.shape().clone(), vec![step]).unwrap();
                } else if name == "kv_len" {
                    *t = Tensor::from_i64(t.dtype(), t.shape().clone(), vec![step + 1]).unwrap();
                }
            }
            let s = if step % 2 == 0 {
                &mut first
            } else {
                &mut second
            };
            for (name, t) in &inputs.inputs {
                s.set_input(name, t).unwrap();
            }
            s.run().unwrap();
            let states: Vec<(String, Tensor)> = first
                .state_names()
                .into_iter()
                .map(|n| {
                    let t = second.state(&n).unwrap();
                    (n, t)
                })
                .collect();
            let s = if step % 2 == 0 { &first } else { &second };
            outs.push((s.outputs().unwrap(), states));
        }
        second.reset_state().unwrap();
        for n in first.state_names() {
            let t = first.state(&n).unwrap();
            assert!(t.to_f64_vec().iter().all(|&x| x == 0.0), "{n} not reset");
        }
        runs.push(outs);
    }
    let (want, got) = (&runs[0], &runs[1]);
    assert!(!want[0].1.is_empty(), "decode_step has states");
    for (step, ((go, gs), (wo, ws))) in got.iter().zip(want).enumerate() {
        check(&format!("step {step}"), go, wo, 1.0);
        for ((gn, g), (wn, w)) in gs.iter().zip(ws) {
            assert_eq!(gn, wn);
            let e = rel_l2(g, w).unwrap();
            assert!(e <= 1e-5, "state {gn} after step {step}: {e}");
        }
    }
}

/// States are not shared across the two CPU devices (their buffers differ in kind).
#[test]
fn states_of_interp_cannot_be_lent_to_cpu() {
    let _serial = serial();
    let g = example("decode_step");
    let on_interp = compile_on(&g, &Device::interp(), 1);
    let on_cpu = compile_on(&g, &Device::cpu_threads(Some(1)), 1);
    let s = on_interp.session().unwrap();
    match on_cpu.session_sharing(&SessionOptions::default(), &s) {
        Err(CompileError::StateMismatch { .. }) => {}
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("lent across devices"),
    }
}

/// The fast device reports what the interpreter reports for a cache write out of range.
#[test]
fn session_errors_on_cpu_are_the_interpreters() {
    let _serial = serial();
    let g = example("decode_step");
    let mut b = inputs_of(&Bindings::random(&g, 1));
    let pos = b.inputs.get_mut("pos").unwrap();
    *pos = Tensor::from_i64(pos.dtype(), pos.shape().clone(), vec![1000]).unwrap();
    let want = compile_on(&g, &Device::interp(), 1).run(&b).unwrap_err();
    let got = compile_on(&g, &Device::cpu_threads(Some(1)), 1)
        .run(&b)
        .unwrap_err();
    assert!(matches!(got, CompileError::Interp(_)), "{got}");
    assert_eq!(got.to_string(), want.to_string());
}

/// Seeded random blocks that `int` reads: `random_quant` of its source scheme; for Q5_0 a Q5_0
/// tensor kept as Q8_0 (as the loaders keep a Q5_0 file's), checked to be read as 5 bits.
fn int_blocks(
    int: rocmforge::cpu::quant::IntScheme,
    shape: &rocmforge::ir::Shape,
    seed: u64,
) -> rocmforge::ir::QuantTensor {
    use rocmforge::cpu::quant::IntScheme;
    use rocmforge::ir::{random_quant, QuantScheme};
    let w = if int == IntScheme::Q5_0 {
        let q5 = random_quant("w", QuantScheme::Q5_0, shape, seed).unwrap();
        q5.reblocked(QuantScheme::Q8_0).unwrap()
    } else {
        random_quant("w", int.source(), shape, seed).unwrap()
    };
    assert_eq!(IntScheme::for_blocks(&w), Some(int));
    w
}

/// Every quantized dot-product kernel this CPU can run against the portable one and against an
/// f64 sum of the dequantized weights times the dequantized activations (the same quantized
/// math, computed independently), for every scheme the GEMV reads, K not a multiple of the
/// SIMD width in blocks (1, 3, 7, 19 blocks; in super-blocks of 256 for the k-quants) and every
/// tile height; the x86 kernels bitwise equal to each other (the same integer sums, accumulated
/// in the same order).
#[test]
fn every_quantized_kernel_matches_the_reference_at_odd_sizes() {
    use rocmforge::cpu::quant::{quantize_row, IntScheme, Kernel, Q8Block, TILE};
    use rocmforge::ir::{DType, Shape};
    let kernels: Vec<Kernel> = Kernel::ALL.into_iter().filter(|k| k.supported()).collect();
    eprintln!("kernels tested: {kernels:?}");
    let mut schemes = 0;
    for int in IntScheme::ALL {
        schemes += 1;
        for blocks in [1usize, 3, 7, 19] {
            let kb = blocks * int.groups_per_block();
            let k = 32 * kb;
            let rows = 5;
            let w = int_blocks(int, &Shape(vec![rows, k]), kb as u64);
            let dense = w.to_tensor(DType::F32).unwrap();
            let dense = dense.as_f32().unwrap();
            let row_bytes = int.row_bytes(kb);
            // TILE activation rows of mixed magnitudes (one all zero: a zero scale).
            let mut a = vec![Q8Block::default(); TILE * kb];
            for t in 0..TILE {
                let x: Vec<f32> = (0..k)
                    .map(|i| {
                        if t == 2 {
                            0.0
                        } else {
                            (((i * 37 + t * 11) % 101) as f32 - 50.0) / (7.0 + t as f32)
                        }
                    })
                    .collect();
                quantize_row(&x, &mut a[t * kb..(t + 1) * kb]);
            }
            for r in 0..rows {
                let wr = &w.bytes()[r * row_bytes..(r + 1) * row_bytes];
                let want: Vec<f64> = (0..TILE)
                    .map(|t| {
                        (0..k)
                            .map(|i| {
                                let b = &a[t * kb + i / 32];
                                f64::from(dense[r * k + i])
                                    * f64::from(b.d)
                                    * f64::from(b.qs[i % 32])
                            })
                            .sum()
                    })
                    .collect();
                let mut first_x86: Option<Vec<Vec<f32>>> = None;
                for &kern in &kernels {
                    let mut per_height = Vec::new();
                    for h in 1..=TILE {
                        let mut out = vec![f32::NAN; h];
                        kern.dot_tile(int, wr, &a[..h * kb], kb, &mut out);
                        for (t, (&g, &e)) in out.iter().zip(&want).enumerate() {
                            let tol = 1e-5 * e.abs().max(1.0);
                            assert!(
                                (f64::from(g) - e).abs() <= tol,
                                "{kern:?} {int:?} kb {kb} row {r} height {h} token {t}: {g} vs {e}"
                            );
                            // The single-row entry point is the tile of height 1.
                            if h == 1 {
                                assert_eq!(g.to_bits(), kern.dot(int, wr, &a[..kb]).to_bits());
                            }
                        }
                        // A row's value does not depend on the tile it is computed in.
                        let single: Vec<f32> = (0..h)
                            .map(|t| kern.dot(int, wr, &a[t * kb..(t + 1) * kb]))
                            .collect();
                        assert_eq!(out, single, "{kern:?} {int:?} height {h}");
                        per_height.push(out);
                    }
                    if kern != Kernel::Portable {
                        match &first_x86 {
                            None => first_x86 = Some(per_height),
                            Some(f) => assert_eq!(f, &per_height, "{kern:?} vs the first x86"),
                        }
                    }
                }
            }
        }
    }
    assert_eq!(schemes, 6, "Q8_0, Q5_0, Q4_0, Q4_1, Q4_K and Q6_K");
}

/// The repacked layout (`Packed`: 8 rows interleaved per block, what the GEMV steps read) for
/// every kernel this CPU runs, every scheme, row counts that leave a partial last group and K of
/// 1 to 19 blocks (super-blocks for the k-quants), every tile height: against the portable kernel on the source rows and an f64
/// sum of the dequantized weights times the dequantized activations; rows past the weight's
/// last read 0; a row's value independent of the tile height; the x86 kernels bitwise equal;
/// and the shared form built once per source.
#[test]
fn repacked_groups_match_the_portable_kernel_and_the_f64_sum() {
    use rocmforge::cpu::quant::{quantize_row, IntScheme, Kernel, Packed, Q8Block, GROUP, TILE};
    use rocmforge::ir::{DType, Shape};
    let kernels: Vec<Kernel> = Kernel::ALL.into_iter().filter(|k| k.supported()).collect();
    eprintln!("kernels tested: {kernels:?}");
    let mut schemes = 0;
    for int in IntScheme::ALL {
        schemes += 1;
        for (rows, blocks) in [(1usize, 1usize), (5, 3), (8, 7), (13, 19), (17, 2)] {
            let kb = blocks * int.groups_per_block();
            let k = 32 * kb;
            let w = int_blocks(int, &Shape(vec![rows, k]), (rows * kb) as u64);
            let dense = w.to_tensor(DType::F32).unwrap();
            let dense = dense.as_f32().unwrap();
            let packed = Packed::new(int, &w, rows, kb);
            assert_eq!(packed.groups(), rows.div_ceil(GROUP));
            // Activation rows of mixed magnitudes, one all zero (a zero scale), one with ±127.
            let mut a = vec![Q8Block::default(); TILE * kb];
            for t in 0..TILE {
                let x: Vec<f32> = (0..k)
                    .map(|i| match t {
                        2 => 0.0,
                        3 => (if i % 3 == 0 { -1.0 } else { 1.0 }) * (1.0 + (i % 5) as f32),
                        _ => (((i * 37 + t * 11) % 101) as f32 - 50.0) / (7.0 + t as f32),
                    })
                    .collect();
                quantize_row(&x, &mut a[t * kb..(t + 1) * kb]);
            }
            let want = |r: usize, t: usize| -> f64 {
                (0..k)
                    .map(|i| {
                        let b = &a[t * kb + i / 32];
                        f64::from(dense[r * k + i]) * f64::from(b.d) * f64::from(b.qs[i % 32])
                    })
                    .sum()
            };
            let mut first_x86: Option<Vec<[f32; GROUP]>> = None;
            for &kern in &kernels {
                let mut all = Vec::new();
                for group in 0..packed.groups() {
                    let mut full = [[f32::NAN; GROUP]; TILE];
                    kern.dot_group(&packed, group, &a, &mut full);
                    for h in 1..=TILE {
                        let mut out = vec![[f32::NAN; GROUP]; h];
                        kern.dot_group(&packed, group, &a[..h * kb], &mut out);
                        assert_eq!(&out[..], &full[..h], "{kern:?} {int:?} height {h}");
                    }
                    for (t, o) in full.iter().enumerate() {
                        for (r, &g) in o.iter().enumerate() {
                            let row = group * GROUP + r;
                            let what = format!("{kern:?} {int:?} {rows}x{kb} row {row} t {t}");
                            if row >= rows {
                                assert_eq!(g, 0.0, "{what}: a padded row");
                                continue;
                            }
                            let e = want(row, t);
                            let tol = 1e-5 * e.abs().max(1.0);
                            assert!((f64::from(g) - e).abs() <= tol, "{what}: {g} vs {e}");
                            let p = packed.src_row(row);
                            let p = rocmforge::cpu::quant::dot_portable(
                                int,
                                p,
                                &a[t * kb..(t + 1) * kb],
                            );
                            assert!((f64::from(p) - e).abs() <= tol, "{what}: portable {p}");
                            if kern == Kernel::Portable {
                                assert_eq!(g.to_bits(), p.to_bits(), "{what}");
                            }
                        }
                    }
                    all.extend(full);
                }
                if kern != Kernel::Portable {
                    match &first_x86 {
                        None => first_x86 = Some(all),
                        Some(f) => assert_eq!(f, &all, "{kern:?} vs the first x86"),
                    }
                }
            }
            // One repacked form per source: a second request gets the first's.
            let s1 = Packed::shared(int, &w, rows, kb);
            let s2 = Packed::shared(int, &w, rows, kb);
            assert!(std::sync::Arc::ptr_eq(&s1, &s2));
        }
    }
    assert_eq!(schemes, 6, "Q8_0, Q5_0, Q4_0, Q4_1, Q4_K and Q6_K");
}

/// `y = x·Wᵀ` with quantized W on the blocks, for each kernel this CPU runs (forced on the
/// plan), M from a decode step's 1 to a prompt's tiles with a remainder, N and K odd
/// (K a whole number of blocks, not of SIMD widths; N not a whole number of 8-row groups; a
/// decode GEMV long enough to be split into tasks): against the interpreter within 8-bit
/// activation error, and threads 1 and 2 bitwise equal (each output is one dot, whoever
/// computes it).
#[test]
fn quantized_gemm_every_kernel_threads_and_odd_sizes() {
    use rocmforge::cpu::quant::IntScheme;
    use rocmforge::cpu::Kernel;
    use rocmforge::ir::{DType, QuantScheme, Shape};
    let _serial = serial();
    let legacy = [
        (1, 37, 96),
        (1, 1029, 64),
        (3, 203, 224),
        (9, 61, 32),
        (13, 5, 608),
    ];
    // K in whole super-blocks of 256.
    let kquant = [(1, 37, 256), (1, 1029, 512), (3, 203, 768), (13, 5, 256)];
    for int in IntScheme::ALL {
        let scheme = int.source();
        let sizes: &[(usize, usize, usize)] = if scheme.block_elems() == 256 {
            &kquant
        } else {
            &legacy
        };
        for &(m, n, k) in sizes {
            let mut g = Graph::new("qgemm");
            let x = g.input("x", DType::F32, &[m, k]).unwrap();
            let w = g.weight_quant("w", DType::F32, &[n, k], scheme).unwrap();
            let wt = g.transpose_last(w).unwrap();
            let y = g.matmul(x, wt).unwrap();
            g.set_outputs(&[y]).unwrap();
            let g = fused(&g);
            let mut b = Bindings::random(&g, (m * n + k) as u64);
            if int == IntScheme::Q5_0 {
                // A Q5_0 file's weight as the loaders keep it: Q8_0 blocks of 5-bit values.
                let q5 = rocmforge::ir::random_quant("w", QuantScheme::Q5_0, &Shape(vec![n, k]), 4)
                    .unwrap();
                b.quantized
                    .insert("w".into(), q5.reblocked(QuantScheme::Q8_0).unwrap());
            }
            let want = interp::run(&g, &b).unwrap();
            let mut results: Vec<(Kernel, Vec<Tensor>)> = Vec::new();
            for kernel in Kernel::ALL.into_iter().filter(|k| k.supported()) {
                let mut by_threads = Vec::new();
                for threads in [1, 2] {
                    let opts = CpuOptions {
                        threads,
                        precision: Precision::Q8Activations,
                    };
                    let mut plan = CpuPlan::new(&g, &b, opts).unwrap();
                    plan.set_kernel(kernel).unwrap();
                    // The product runs on the blocks (not a dense copy of the weight).
                    let fam = plan.step_families();
                    let path = format!("gemm {int:?} ");
                    assert!(fam.iter().any(|f| f.starts_with(&path)), "{fam:?}");
                    let mut s = plan.session().unwrap();
                    s.set_inputs(&b).unwrap();
                    s.run().unwrap();
                    let got = s.outputs().unwrap();
                    let e = rel_l2(&got[0], &want[0]).unwrap();
                    let what = format!("{int:?} {m}x{n}x{k} {kernel:?} {threads} threads");
                    assert!(e < 2e-2, "{what}: rel L2 {e}");
                    by_threads.push(got);
                }
                assert_eq!(
                    by_threads[0], by_threads[1],
                    "{int:?} {kernel:?}: 1 vs 2 threads"
                );
                results.push((kernel, by_threads.remove(0)));
            }
            let x86: Vec<_> = results
                .iter()
                .filter(|(k, _)| *k != Kernel::Portable)
                .collect();
            for w in x86.windows(2) {
                assert_eq!(w[0].1, w[1].1, "{int:?}: {:?} vs {:?}", w[0].0, w[1].0);
            }
        }
    }
}

/// `silu(RMSNorm(x)·W_gateᵀ) · (RMSNorm(x)·W_upᵀ)`: gate and up merged into one paired-column
/// Gemm (and the norm folded into it), run by the CPU device on the folded graph (one weight,
/// the rows interleaved, bound as a compile binds it) against the interpreter on the unfused
/// graph; quantized weights also through the 8-bit-activation dot products on the blocks.
#[test]
fn paired_gate_up_matches_the_interpreter_on_the_unfused_graph() {
    use rocmforge::ir::{DType, QuantScheme};
    let _serial = serial();
    for (dtype, scheme, m, n, k) in [
        (DType::F32, None, 1, 37, 40),
        (DType::F16, None, 3, 37, 24),
        (DType::BF16, None, 8, 5, 16),
        (DType::F32, Some(QuantScheme::Q4_1), 2, 37, 64),
        (DType::F16, Some(QuantScheme::Q8_0), 1, 9, 96),
    ] {
        let case = GluCase {
            dtype,
            scheme,
            m,
            n,
            k,
            norm: true,
        };
        let what = case.name();
        let g = case.graph();
        let (f, folds) = rocmforge::compile::optimise_folded(&g, true).unwrap();
        let gemms: Vec<bool> = f
            .node_ids()
            .filter_map(|id| match f.op(id) {
                Op::Gemm(gm) => Some(gm.paired),
                _ => None,
            })
            .collect();
        assert_eq!(gemms, [true], "{what}");
        let mut b = Bindings::random(&g, 21);
        for id in g.node_ids() {
            // The weights drawn once, so that the folded weight is made of what the
            // interpreter reads.
            let node = g.node(id);
            if let Op::Weight { quant, init, .. } = g.op(id) {
                match quant {
                    Some(s) => {
                        let q = rocmforge::ir::random_quant(&node.name, *s, &node.ty.shape, 21)
                            .unwrap();
                        b.quantized.insert(node.name.clone(), q);
                    }
                    None => {
                        let t =
                            rocmforge::ir::random_weight(&node.name, &node.ty, init, 21).unwrap();
                        b.weights.insert(node.name.clone(), t);
                    }
                }
            }
        }
        let want = interp::run(&g, &b).unwrap();
        let mut bf = b.clone();
        rocmforge::compile::fold::bind_folded(&folds, &mut bf.weights, &mut bf.quantized).unwrap();
        for threads in [1, 2] {
            let got = cpu_run(&f, &bf, exact(threads));
            check(&what, &got, &want, 1.0);
            if scheme.is_some() {
                let opts = CpuOptions {
                    threads,
                    precision: Precision::Q8Activations,
                };
                for (x, w) in cpu_run(&f, &bf, opts).iter().zip(&want) {
                    let e = rel_l2(x, w).unwrap();
                    assert!(e < 2e-2, "{what} (8-bit activations): {e}");
                }
            }
        }
    }
}
