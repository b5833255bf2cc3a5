//! GPU tests: every example graph, the op zoo and random attention shapes against the
//! interpreter within the dtype tolerances; concurrency stress; a planted bug caught by
//! poisoning; memory back to its baseline; the disk cache across processes. They run under the
//! default parallel harness. Where no GPU is found, each is reported ignored, with the reason.
//!
//! Edge cases (issue 11): every op with a zero-size dimension, attention with no queries, no
//! keys or a head size of 0, reductions over an empty axis, causal offsets near the i64
//! limits, gathers out of range (the CPU's typed error), edge values through every elementwise
//! row, hostile node names, and launches past the device's limits.
//!
//! GEMM (issue 12): the small-M and CUDA-core kernels at odd and model sizes (`gemm::`).
//!
//! Decode attention (issue 13): the flash-decoding pair at decode shapes (`decode::`).
//!
//! Sessions (issue 14): warm sessions, replay on and off, sessions on threads, no allocation in
//! a warm run, inputs changed in place over a loop, captured graphs keeping buffers (`session::`).
//! The HIP runtime path (issue 14, `hip::`): on an NVIDIA GPU, `tests/hipshim/hipshim.c` is
//! built with the system C compiler and `hip:0` opened through it (HIP's NVIDIA platform over
//! the CUDA driver and NVRTC); a selection of the trials above runs on that device. This checks
//! our HIP plumbing (loading, entry points, marshalling, streams, memory, events), not AMD
//! hardware or ISA. No `cc`, or no NVIDIA GPU: those trials are ignored with the reason.
//! State and decode ops (issue 15, `decops::`): attention bounded by `kv_len` from data over
//! caches whose tail past it is NaN (decode pair and prefill kernels, odd sizes, GQA, one
//! kv_len per batch), a cache write past the cache reported as the interpreter's error, argmax
//! with ties and NaN; `graph::decode_step` runs the example decode step.

#[path = "common/files.rs"]
mod files;

#[path = "common/attention_graphs.rs"]
mod attention_graphs;
#[path = "common/attention_mma_trials.rs"]
mod attention_mma_trials;
#[path = "common/decode_cases.rs"]
mod decode_cases;
#[path = "common/decode_step.rs"]
mod decode_step;
#[path = "common/edge_cases.rs"]
mod edge_cases;
#[path = "common/gemm_cases.rs"]
mod gemm_cases;
#[path = "common/gemm_graphs.rs"]
mod gemm_graphs;
#[path = "common/gemm_small_cases.rs"]
mod gemm_small_cases;
#[path = "common/hipshim.rs"]
mod hipshim;
#[path = "common/kv_cases.rs"]
mod kv_cases;
#[path = "common/linear_graphs.rs"]
mod linear_graphs;
#[path = "common/llama_trials.rs"]
mod llama_trials;
#[path = "common/op_zoo.rs"]
mod op_zoo;
#[path = "common/poison_trials.rs"]
mod poison_trials;
#[path = "common/quant_cases.rs"]
mod quant_cases;
#[path = "common/session_trials.rs"]
mod session_trials;
#[path = "common/smollm2.rs"]
mod smollm2;
#[path = "common/tiny_gguf.rs"]
mod tiny_gguf;

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use attention_graphs::{build, promoted_to_f32, Chain, Mask, Scale, Spec, Step};
use libtest_mimic::{Arguments, Failed, Trial};
use rocmforge::arch::Platform;
use rocmforge::codegen::mma::MmaAtom;
use rocmforge::codegen::mma_probe_kernel;
use rocmforge::compile::{bundle, CompileError, CompileOptions, Poison};
use rocmforge::frontend::llama::Precision;
use rocmforge::interp::{run, Bindings};
use rocmforge::ir::{format, DType, Graph, Tensor};
use rocmforge::runtime::{Device, DiskCache, HipLibraries, KernelCache};

/// Held shared by every trial, exclusively by the memory check: device-wide memory is only
/// measured while nothing else runs.
static MEMORY: RwLock<()> = RwLock::new(());

fn tolerance(dt: DType) -> f64 {
    match dt {
        DType::F16 => 2e-3,
        DType::BF16 => 1e-2,
        _ => 1e-5,
    }
}

fn options() -> CompileOptions {
    CompileOptions {
        poison: Poison::On,
        progress: false,
        ..CompileOptions::default()
    }
}

/// Relative L2 error of `got` against `want`; NaN must sit exactly where the reference has it,
/// and an output still holding the poison where the reference is finite fails.
fn compare(got: &Tensor, want: &Tensor, what: &str) -> Result<f64, Failed> {
    if got.ty() != want.ty() {
        return Err(format!("{what}: {} vs {}", got.ty(), want.ty()).into());
    }
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let mut num = 0.0;
    let mut den = 0.0;
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        match (a.is_nan(), b.is_nan()) {
            (true, true) => continue,
            (true, false) => {
                return Err(
                    format!("{what}: element {i} is NaN (unwritten or wrong), want {b}").into(),
                )
            }
            (false, true) => return Err(format!("{what}: element {i} is {a}, want NaN").into()),
            _ => {}
        }
        if a.is_infinite() || b.is_infinite() {
            if a != b {
                return Err(format!("{what}: element {i} is {a}, want {b}").into());
            }
            continue;
        }
        num += (a - b).powi(2);
        den += b * b;
    }
    Ok(if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    })
}

/// `b` with the weights `Graph::compile` draws for `g` (seed 0), for the interpreter.
fn with_weights(g: &Graph, b: &Bindings) -> Bindings {
    let mut wb = b.clone();
    for id in g.node_ids() {
        let n = g.node(id);
        match g.op(id) {
            rocmforge::ir::Op::Weight {
                quant: Some(scheme),
                ..
            } => {
                wb.quantized.insert(
                    n.name.clone(),
                    rocmforge::ir::random_quant(&n.name, *scheme, &n.ty.shape, 0)
                        .expect("a test graph's weights fit"),
                );
            }
            rocmforge::ir::Op::Weight { init, .. } => {
                wb.weights.insert(
                    n.name.clone(),
                    rocmforge::ir::random_weight(&n.name, &n.ty, init, 0)
                        .expect("a test graph's weights fit"),
                );
            }
            _ => {}
        }
    }
    wb
}

fn check_graph(device: &Device, g: &Graph, fuse: bool, seed: u64) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let c = Graph::compile_with(g, device, &CompileOptions { fuse, ..options() })
        .map_err(|e| e.to_string())?;
    let b = Bindings::random(g, seed);
    let got = c.run(&b).map_err(|e| e.to_string())?;
    let want = run(g, &with_weights(g, &b)).map_err(|e| e.to_string())?;
    for ((o, gt), wt) in g.outputs().iter().zip(&got).zip(&want) {
        let what = format!(
            "{} %{} ({})",
            g.name,
            g.node(*o).name,
            if fuse { "fused" } else { "unfused" }
        );
        let err = compare(gt, wt, &what)?;
        let tol = tolerance(wt.dtype());
        if err > tol {
            return Err(format!("{what}: relative L2 {err:e} > {tol:e}").into());
        }
    }
    Ok(())
}

/// A linear layer on a quantized weight against the interpreter (which dequantizes the same
/// blocks): the weight's device buffer is its blocks, and the plan is the fused small-M kernel
/// up to M 16, the dequantize kernel and a dense GEMM past it.
fn check_quant(device: &Device, case: quant_cases::QuantCase) -> Result<(), Failed> {
    use rocmforge::codegen::BufferRole;
    let g = case.graph();
    {
        let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
        let c = Graph::compile_with(&g, device, &options()).map_err(|e| e.to_string())?;
        let plan = c.plan().ok_or("no kernel plan on a GPU")?;
        let w = plan
            .buffers
            .iter()
            .find(|b| b.name == "w")
            .ok_or("no buffer w")?;
        if w.role != BufferRole::QuantWeight(case.scheme) {
            return Err(format!("{}: w is {:?}", case.name(), w.role).into());
        }
        let families: Vec<&str> = plan.kernels.iter().map(|k| k.family).collect();
        let fused = families == ["gemm_quant"];
        let dequantized = families.first() == Some(&"dequantize") && families.len() == 2;
        if (case.m <= 16 && !fused) || (case.m > 16 && !dequantized) {
            return Err(format!("{}: kernels {families:?}", case.name()).into());
        }
    }
    check_graph(device, &g, true, 21)
}

/// Blocks the caller binds (`CompileOptions::quantized`) are the ones the kernels read.
fn quant_bound_blocks(device: &Device) -> Result<(), Failed> {
    use rocmforge::ir::{random_quant, QuantScheme, Shape};
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    for m in [1, 40] {
        let case = quant_cases::QuantCase {
            scheme: QuantScheme::Q4_1,
            dtype: DType::F32,
            m,
            n: 577,
            k: 576,
            bias: false,
        };
        let g = case.graph();
        let blocks = random_quant("w", case.scheme, &Shape(vec![case.n, case.k]), 99)
            .map_err(|e| e.to_string())?;
        let mut opts = options();
        opts.quantized.insert("w".into(), blocks.clone());
        let c = Graph::compile_with(&g, device, &opts).map_err(|e| e.to_string())?;
        let mut b = Bindings::random(&g, 4);
        let got = c.run(&b).map_err(|e| e.to_string())?.remove(0);
        b.quantized.insert("w".into(), blocks);
        let want = run(&g, &b).map_err(|e| e.to_string())?.remove(0);
        let err = compare(&got, &want, &case.name())?;
        if err > tolerance(DType::F32) {
            return Err(format!("{}: relative L2 {err:e}", case.name()).into());
        }
    }
    Ok(())
}

/// Fused low-precision attention against the f32 graph on the same rounded inputs.
fn check_attention(device: &Device, spec: Spec, seed: u64) -> Result<(), Failed> {
    check_attention_with(device, spec, seed, options())
}

fn check_attention_with(
    device: &Device,
    spec: Spec,
    seed: u64,
    opts: CompileOptions,
) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let g = build(&spec);
    let c = Graph::compile_with(&g, device, &opts).map_err(|e| e.to_string())?;
    let b = Bindings::random(&g, seed);
    let got = c.run(&b).map_err(|e| e.to_string())?.remove(0);
    let reference = build(&Spec {
        dtype: DType::F32,
        cast_softmax: false,
        ..spec
    });
    let mut rb = Bindings::default();
    for (n, t) in &b.inputs {
        rb.inputs.insert(
            n.clone(),
            if t.dtype().is_float() {
                t.cast(DType::F32)
            } else {
                t.clone()
            },
        );
    }
    let want = run(&reference, &rb).map_err(|e| e.to_string())?.remove(0);
    let err = compare(&got.cast(DType::F32), &want, &format!("{spec:?}"))?;
    if err > tolerance(spec.dtype) {
        return Err(format!("{spec:?}: relative L2 {err:e}").into());
    }
    Ok(())
}

/// Runs `g`'s first output on `b` and compares it with the f32 reference `want` within
/// `dtype`'s tolerance; returns it and a description naming the case and the plan's kernels.
fn first_output_within_tolerance(
    device: &Device,
    g: &Graph,
    b: &Bindings,
    want: &Tensor,
    name: &str,
    dtype: DType,
) -> Result<(Tensor, String), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let c = Graph::compile_with(g, device, &options()).map_err(|e| e.to_string())?;
    let got = c.run(b).map_err(|e| e.to_string())?.remove(0);
    let what = format!(
        "{name} ({:?})",
        c.plan()
            .map(|p| p.kernels.iter().map(|k| k.family).collect::<Vec<_>>())
    );
    let err = compare(&got.cast(DType::F32), want, &what)?;
    if err > tolerance(dtype) {
        return Err(format!("{what}: relative L2 {err:e}").into());
    }
    Ok((got, what))
}

/// A decode-shaped FlashAttention node against the f32 interpreter, outputs and the split-K
/// workspace poisoned; rows with no visible key must be zeros. Which cases lower to the decode
/// pair is checked without a GPU (`plan::gpu_cases_take_decode` in tests/decode_kernels.rs).
fn check_decode(device: &Device, case: decode_cases::Case, seed: u64) -> Result<(), Failed> {
    let g = case.graph();
    let b = case.bindings(seed);
    let (got, what) = first_output_within_tolerance(
        device,
        &g,
        &b,
        &case.reference(&b),
        &case.name(),
        case.dtype,
    )?;
    if case.mask == decode_cases::Mask::EmptyRow && !decode_cases::batch0_zero(&got, &case) {
        return Err(format!("{what}: rows with no visible key are not zeros").into());
    }
    Ok(())
}

/// Attention over `kv_len` valid keys of a cache whose tail is NaN, against the f32
/// interpreter (which never reads the tail): any read of the tail by a kernel is NaN and fails.
fn check_kv(device: &Device, case: kv_cases::KvCase, seed: u64) -> Result<(), Failed> {
    let g = case.graph();
    let b = case.bindings(seed);
    first_output_within_tolerance(
        device,
        &g,
        &b,
        &case.reference(&b),
        &case.name(),
        case.dtype,
    )?;
    Ok(())
}

/// The example decode step with its position at the last row of the cache (runs) and one past
/// it: the run fails with the interpreter's `CacheWriteOutOfRange`, not a write past the state.
fn check_cache_write_bounds(device: &Device) -> Result<(), Failed> {
    use rocmforge::interp::InterpError;
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("graphs/decode_step.json");
    let g = format::load(&path).map_err(|e| e.to_string())?;
    let c = Graph::compile_with(&g, device, &options()).map_err(|e| e.to_string())?;
    let size = g.ty(g.find("k_cache").ok_or("no k_cache")?).shape.dims()[2] as i64;
    let i32s = |v: i64| Tensor::from_i64(DType::I32, vec![1], vec![v]).expect("an i32");
    for (pos, ok) in [(size - 1, true), (size, false), (-1, false)] {
        let b = Bindings::random(&g, 21)
            .with_input("pos", i32s(pos))
            .with_input("kv_len", i32s(size));
        let want = run(&g, &with_weights(&g, &b));
        match (c.run(&b), want) {
            (Ok(got), Ok(want)) if ok => {
                let err = compare(&got[0], &want[0], "decode_step logits")?;
                if err > tolerance(DType::F32) || got[1] != want[1] {
                    return Err(format!(
                        "pos {pos}: logits error {err:e}, tokens {:?} vs {:?}",
                        got[1], want[1]
                    )
                    .into());
                }
            }
            (
                Err(CompileError::Interp(InterpError::CacheWriteOutOfRange { start, .. })),
                Err(_),
            ) if !ok && start == pos => {}
            (got, want) => {
                return Err(format!(
                    "pos {pos}: run {:?}, interpreter {:?}",
                    got.err(),
                    want.err()
                )
                .into())
            }
        }
    }
    Ok(())
}

/// Argmax on the device: rows with ties, NaN, ±inf, longer than a block, exactly the
/// interpreter's indices.
fn check_argmax(device: &Device) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let mut g = Graph::new(format!("argmax_{dtype}"));
        let x = g.input("x", dtype, &[7, 1001]).map_err(|e| e.to_string())?;
        let rows = g.argmax(x, -1).map_err(|e| e.to_string())?;
        let cols = g.argmax(x, 0).map_err(|e| e.to_string())?;
        g.set_outputs(&[rows, cols]).map_err(|e| e.to_string())?;
        let mut vals: Vec<f64> = (0..7 * 1001).map(|i| ((i * 37) % 101) as f64).collect();
        vals[1001 + 650] = f64::NAN;
        vals[1001 + 990] = f64::NAN;
        vals[2 * 1001 + 3] = f64::INFINITY;
        vals[2 * 1001 + 999] = f64::INFINITY;
        vals[3 * 1001..4 * 1001].iter_mut().for_each(|v| *v = 5.0);
        vals[4 * 1001..5 * 1001]
            .iter_mut()
            .for_each(|v| *v = f64::NEG_INFINITY);
        let t = Tensor::from_f64(dtype, vec![7, 1001], &vals).map_err(|e| e.to_string())?;
        let b = Bindings::default().with_input("x", t);
        let c = Graph::compile_with(&g, device, &options()).map_err(|e| e.to_string())?;
        let got = c.run(&b).map_err(|e| e.to_string())?;
        let want = run(&g, &b).map_err(|e| e.to_string())?;
        if got != want {
            return Err(format!("{dtype}: device {:?}, interpreter {:?}", got[0], want[0]).into());
        }
    }
    Ok(())
}

/// f32 attention for the CUDA-core kernel (`attention/simt.rs`): every head size it tiles
/// differently (1, 32, 64, 80, 128, 256), sizes past its tiles, additive and boolean masks,
/// causal offsets either way (with Sq > Sk and a negative offset the first rows see no key and
/// must be zeros), GQA with three query heads per K/V head, and single-query decode.
fn f32_attention_specs() -> Vec<(&'static str, Spec)> {
    let spec = |(b, hq, hkv): (usize, usize, usize), (sq, sk, d), mask, offset| Spec {
        hkv,
        sk,
        mask,
        offset,
        ..Spec::new(b, hq, sq, d)
    };
    vec![
        (
            "d1_padding_gqa",
            spec((2, 3, 1), (67, 45, 1), Mask::Padding, 0),
        ),
        (
            "d32_causal_sq_lt_sk",
            spec((1, 4, 4), (200, 333, 32), Mask::Causal, 133),
        ),
        (
            "d64_causal_sq_gt_sk_empty_rows",
            spec((2, 6, 2), (301, 77, 64), Mask::Causal, -20),
        ),
        (
            "d64_decode_gqa",
            spec((1, 3, 1), (1, 513, 64), Mask::None, 0),
        ),
        (
            "d80_bool_gqa",
            spec((1, 3, 1), (129, 257, 80), Mask::BoolNegInf, 0),
        ),
        (
            "d128_dense",
            spec((1, 2, 2), (97, 1000, 128), Mask::Dense2d, 0),
        ),
        (
            "d128_causal_gqa",
            spec((1, 6, 2), (300, 300, 128), Mask::Causal, 0),
        ),
        (
            "d256_per_head_gqa",
            spec((1, 3, 1), (33, 150, 256), Mask::PerHead, 0),
        ),
    ]
}

/// An attention written step by step must fuse, and the fused kernels must match the
/// interpreter: the graph itself for f32, the graph computed in f32 for f16/bf16.
fn check_chain(device: &Device, g: &Graph, seed: u64) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let (fused, _) = rocmforge::passes::optimize(g).map_err(|e| e.to_string())?;
    if !fused
        .node_ids()
        .any(|id| matches!(fused.op(id), rocmforge::ir::Op::FlashAttention(_)))
    {
        return Err(format!("{}: did not fuse", g.name).into());
    }
    let c = Graph::compile_with(g, device, &options()).map_err(|e| e.to_string())?;
    let b = Bindings::random(g, seed);
    let got = c.run(&b).map_err(|e| e.to_string())?.remove(0);
    let dt = got.dtype();
    let want = if dt == DType::F32 {
        run(g, &b).map_err(|e| e.to_string())?.remove(0)
    } else {
        let mut wide = Bindings::default();
        for (n, t) in &b.inputs {
            let t = if t.dtype().is_float() {
                t.cast(DType::F32)
            } else {
                t.clone()
            };
            wide.inputs.insert(n.clone(), t);
        }
        run(&promoted_to_f32(g), &wide)
            .map_err(|e| e.to_string())?
            .remove(0)
    };
    let err = compare(&got.cast(DType::F32), &want, &g.name)?;
    if err > tolerance(dt) {
        return Err(format!("{}: relative L2 {err:e}", g.name).into());
    }
    Ok(())
}

/// Attention forms fused since issue 11: fairseq's scores viewed 4-D for the key padding mask,
/// a split other than [B, H] with a mask over part of it, old GPT-2's head-split K, f16 scale
/// constants at their f16 value with an f32 mask, a written-out softmax left dead.
fn chains() -> Vec<(&'static str, Graph)> {
    use Step::*;
    let bmm = |dtype: DType, [b, h, s, d]: [usize; 4], steps: Vec<Step>| {
        let mut c = Chain::new(dtype, [b, h, s, d], steps);
        c.q = vec![b * h, s, d];
        c.k = vec![b * h, s, d];
        c.v = vec![b * h, s, d];
        c.k_perm = vec![0, 2, 1];
        c.build()
    };
    let (ninf, f32_) = (f64::NEG_INFINITY, DType::F32);
    vec![
        (
            "fairseq_f32",
            bmm(
                f32_,
                [2, 3, 7, 8],
                vec![
                    Mul(1.0 / 8f64.sqrt()),
                    Reshape(vec![2, 3, 7, 7]),
                    MaskedFill(vec![2, 1, 1, 7], ninf),
                    Reshape(vec![6, 7, 7]),
                    Softmax(-1),
                ],
            ),
        ),
        (
            "fairseq_f16",
            bmm(
                DType::F16,
                [2, 4, 100, 64],
                vec![
                    Mul(0.125),
                    Reshape(vec![2, 4, 100, 100]),
                    MaskedFill(vec![2, 1, 1, 100], ninf),
                    Reshape(vec![8, 100, 100]),
                    Cast(f32_),
                    Softmax(-1),
                    Cast(DType::F16),
                ],
            ),
        ),
        (
            "regrouped_view_f32",
            bmm(
                f32_,
                [2, 3, 33, 16],
                vec![
                    Mul(0.25),
                    Reshape(vec![3, 2, 33, 33]),
                    Add(vec![1, 2, 1, 33]),
                    Reshape(vec![6, 33, 33]),
                    Softmax(-1),
                ],
            ),
        ),
        ("gpt2_head_split_bf16", {
            let mut c = Chain::new(
                DType::BF16,
                [2, 4, 64, 64],
                vec![
                    Div(8.0),
                    Causal(0, ninf),
                    Cast(f32_),
                    Softmax(-1),
                    Cast(DType::BF16),
                ],
            );
            c.k = vec![2, 64, 4, 64];
            c.k_perm = vec![0, 2, 3, 1];
            c.build()
        }),
        (
            "f16_scale_held_f32_mask",
            Chain::new(
                DType::F16,
                [2, 4, 33, 80],
                vec![
                    Mul(1.0 / 80f64.sqrt()),
                    Cast(f32_),
                    Add(vec![2, 1, 1, 33]),
                    Softmax(-1),
                    Cast(DType::F16),
                ],
            )
            .build(),
        ),
        (
            "written_softmax_f32",
            Chain::new(f32_, [2, 2, 16, 32], vec![Mul(0.2), WrittenSoftmax(true)]).build(),
        ),
    ]
}

fn stress(device_spec: &str) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    // A device of its own, no disk store: every key it needs is compiled here, once.
    let device = Device::open_with_cache(device_spec, KernelCache::with_disk(None))
        .map_err(|e| e.to_string())?;
    let mix: Vec<Graph> = [
        "attention_causal",
        "gqa_attention",
        "llama_block",
        "attention_padding_mask",
    ]
    .iter()
    .map(|n| {
        format::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("graphs/{n}.json")))
            .unwrap()
    })
    .collect();
    let single: Vec<Vec<Tensor>> = mix
        .iter()
        .map(|g| {
            Graph::compile_with(g, &device, &options())
                .and_then(|c| c.run(&Bindings::random(g, 5)))
                .map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    let unique = device.cache().compiles();
    let mix = Arc::new(mix);
    let single = Arc::new(single);
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let (device, mix, single) = (device.clone(), Arc::clone(&mix), Arc::clone(&single));
            std::thread::spawn(move || -> Result<(), String> {
                for it in 0..25 {
                    let k = (t + it) % mix.len();
                    let c = Graph::compile_with(&mix[k], &device, &options())
                        .map_err(|e| e.to_string())?;
                    let out = c
                        .run(&Bindings::random(&mix[k], 5))
                        .map_err(|e| e.to_string())?;
                    if out != single[k] {
                        return Err(format!(
                            "thread {t} iteration {it}: {} differs from the single-threaded run",
                            mix[k].name
                        ));
                    }
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| "a stress thread panicked")??;
    }
    if device.cache().compiles() != unique {
        return Err(format!("{} compiles for {unique} keys", device.cache().compiles()).into());
    }
    Ok(())
}

fn planted_bug_is_caught(device: &Device) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let mut g = Graph::new("planted");
    let x = g.input("x", DType::F32, &[1000]).unwrap();
    let y = g.tanh(x).unwrap();
    g.add_output(y).unwrap();
    // The planted bug: the bounds check stops one element early.
    let rewrite: rocmforge::compile::KernelRewrite = Arc::new(|k| {
        k.body = k
            .body
            .replace("if (i >= 1000LL) return;", "if (i >= 999LL) return;");
    });
    let c = Graph::compile_with(
        &g,
        device,
        &CompileOptions {
            rewrite_kernels: Some(rewrite),
            ..options()
        },
    )
    .map_err(|e| e.to_string())?;
    let out = c
        .run(&Bindings::random(&g, 1))
        .map_err(|e| e.to_string())?
        .remove(0);
    let v = out.as_f32().unwrap();
    if !v[999].is_nan() || v[..999].iter().any(|x| x.is_nan()) {
        return Err(format!(
            "poison did not expose the skipped element: last = {}",
            v[999]
        )
        .into());
    }
    let want = run(&g, &Bindings::random(&g, 1)).unwrap().remove(0);
    if compare(&out, &want, "planted").is_ok() {
        return Err("the comparison accepted an unwritten element".into());
    }
    Ok(())
}

/// One matrix atom of the device's target, run by its probe kernel (one wave, two accumulating
/// MMAs through the generated fragment helpers) on integer matrices: every product and sum is
/// exact in f16, bf16 and f32, so the result must equal the f64 product exactly. A wrong
/// fragment layout puts some element in the wrong place and fails this.
fn mma_atom_probe(device: &Device, atom: &'static MmaAtom) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let target = device.target().ok_or("the device has no codegen target")?;
    let probe = mma_probe_kernel(target, atom).map_err(|e| e.to_string())?;
    let options: Vec<String> = match target.platform {
        Platform::Amd => vec!["-O3".into()],
        Platform::Nvidia => vec![],
    };
    let image = device
        .compile_source(&probe.source, &probe.entry, &options)
        .map_err(|e| e.to_string())?;
    let kernel = device
        .load_kernel(&image, &probe.entry)
        .map_err(|e| e.to_string())?;
    let (m, n, k) = (probe.m, probe.n, probe.k);
    let a: Vec<f64> = (0..m * k).map(|i| ((i * 7 + 3) % 9) as f64 - 4.0).collect();
    let b: Vec<f64> = (0..k * n).map(|i| ((i * 5 + 1) % 7) as f64 - 3.0).collect();
    let bt: Vec<f64> = (0..n * k).map(|x| b[(x % k) * n + x / k]).collect();
    let bits = |v: &[f64]| -> Vec<u8> {
        v.iter()
            .flat_map(|&x| match atom.input {
                DType::BF16 => half::bf16::from_f64(x).to_bits().to_le_bytes(),
                _ => half::f16::from_f64(x).to_bits().to_le_bytes(),
            })
            .collect()
    };
    let e = |e: rocmforge::runtime::RuntimeError| e.to_string();
    let stream = device.new_stream().map_err(e)?;
    let (da, db, dbt) = (
        stream.upload(&bits(&a)).map_err(e)?,
        stream.upload(&bits(&b)).map_err(e)?,
        stream.upload(&bits(&bt)).map_err(e)?,
    );
    let dc = stream.alloc(m * n * 4, true).map_err(e)?;
    stream
        .launch(
            &kernel,
            [1, 1, 1],
            [probe.lanes, 1, 1],
            0,
            &[&da, &db, &dbt, &dc],
        )
        .map_err(e)?;
    let out = stream.download(&dc).map_err(e)?;
    for r in 0..m {
        for c in 0..n {
            let want: f64 = (0..k).map(|x| a[r * k + x] * b[x * n + c]).sum();
            let at = 4 * (r * n + c);
            let got = f32::from_le_bytes([out[at], out[at + 1], out[at + 2], out[at + 3]]);
            if f64::from(got) != want {
                return Err(format!("{}: C[{r}][{c}] = {got}, want {want}", atom.name).into());
            }
        }
    }
    Ok(())
}

fn memory_returns_to_baseline(device: &Device) -> Result<(), Failed> {
    let _exclusive = MEMORY.write().unwrap_or_else(|p| p.into_inner());
    let before = device.memory().in_use();
    // Every example graph and every zoo graph: compiled, run, dropped, and back to baseline.
    let mut graphs: Vec<Graph> = files::graph_files()
        .iter()
        .map(|p| format::load(p).unwrap())
        .collect();
    graphs.extend(op_zoo::zoo());
    for g in &graphs {
        {
            let c = Graph::compile_with(g, device, &options()).map_err(|e| e.to_string())?;
            c.run(&Bindings::random(g, 2)).map_err(|e| e.to_string())?;
        }
        let after = device.memory().in_use();
        if after != before {
            return Err(format!(
                "{}: device memory {before} B before, {after} B after",
                g.name
            )
            .into());
        }
    }
    // An over-budget allocation is a typed error and leaves the model usable.
    let g = &graphs
        .iter()
        .find(|g| g.name == "bert_layer")
        .expect("bert_layer.json");
    let c = Graph::compile_with(*g, device, &options()).map_err(|e| e.to_string())?;
    device
        .memory()
        .set_budget(Some(device.memory().in_use() + 1024));
    let refused = c.run(&Bindings::random(g, 2));
    device.memory().set_budget(None);
    if !matches!(
        refused,
        Err(rocmforge::compile::CompileError::Runtime(
            rocmforge::runtime::RuntimeError::OverBudget { .. }
        ))
    ) {
        return Err(format!("a run past the budget was not refused: {:?}", refused.err()).into());
    }
    c.run(&Bindings::random(g, 2))
        .map_err(|e| format!("unusable after a refused run: {e}"))?;
    drop(c);
    if device.memory().in_use() != before {
        return Err("memory not back to baseline after the budget check".into());
    }
    Ok(())
}

/// In a child process: compile one graph with the disk cache at ROCMFORGE_CACHE_DIR and print
/// how many kernels were compiled and how many came from disk.
fn child_compile() {
    let spec = std::env::var("ROCMFORGE_GPU_CHILD_DEVICE").unwrap();
    let device = Device::open(&spec).unwrap();
    let g = format::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("graphs/llama_block.json"))
        .unwrap();
    let c = Graph::compile_with(&g, &device, &options()).unwrap();
    println!("compiled={} disk={}", c.stats.compiled, c.stats.from_disk);
}

fn disk_cache_across_processes(spec: &str) -> Result<(), Failed> {
    let dir = std::env::temp_dir().join(format!("rocmforge-gpu-cache-{}", std::process::id()));
    let child = || -> Result<(usize, usize), Failed> {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .env("ROCMFORGE_GPU_CHILD_DEVICE", spec)
            .env("ROCMFORGE_CACHE_DIR", &dir)
            .output()
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let line = text
            .lines()
            .find(|l| l.starts_with("compiled="))
            .ok_or(format!(
                "child said: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            ))?;
        let nums: Vec<usize> = line
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|s| s.parse().ok())
            .collect();
        Ok((nums[0], nums[1]))
    };
    let (c1, d1) = child()?;
    let (c2, d2) = child()?;
    if c1 == 0 || d1 != 0 || c2 != 0 || d2 != c1 {
        return Err(format!(
            "first process compiled {c1} (disk {d1}); second compiled {c2} (disk {d2})"
        )
        .into());
    }
    // Corrupt one entry: it is rebuilt, the others load.
    let entries = DiskCache::new(dir.clone())
        .list()
        .map_err(|e| e.to_string())?
        .entries;
    let victim = &entries[0].file;
    let bytes = std::fs::read(victim).map_err(|e| e.to_string())?;
    std::fs::write(victim, &bytes[..bytes.len() / 2]).map_err(|e| e.to_string())?;
    let (c3, d3) = child()?;
    std::fs::remove_dir_all(&dir).ok();
    if c3 != 1 || d3 != c1 - 1 {
        return Err(
            format!("after corrupting one entry: compiled {c3}, disk {d3} (of {c1})").into(),
        );
    }
    Ok(())
}

/// A graph with an input no kernel reads (the passes remove it): it runs on the device, its
/// output matches the interpreter, and the unused input is still part of the interface (a run
/// that leaves it out or binds the wrong type is refused with a typed error).
fn unused_input_runs(device: &Device) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let g = format::from_json_str(
        r#"{"version": 1, "name": "unused_input", "nodes": [
        {"name": "x", "op": "input", "dtype": "f32", "shape": [3, 40]},
        {"name": "unused", "op": "input", "dtype": "f32", "shape": [7]},
        {"name": "o", "op": "tanh", "inputs": ["x"]}], "outputs": ["o"]}"#,
    )
    .map_err(|e| e.to_string())?;
    let c = Graph::compile_with(&g, device, &options()).map_err(|e| e.to_string())?;
    let b = Bindings::random(&g, 6);
    let got = c.run(&b).map_err(|e| e.to_string())?;
    let want = run(&g, &b).map_err(|e| e.to_string())?;
    let err = compare(&got[0], &want[0], "unused_input %o")?;
    if err > tolerance(DType::F32) {
        return Err(format!("unused_input: relative L2 {err:e}").into());
    }
    let mut missing = b.clone();
    missing.inputs.remove("unused");
    match c.run(&missing) {
        Err(rocmforge::compile::CompileError::Interp(
            rocmforge::interp::InterpError::MissingInput { name, .. },
        )) if name == "unused" => Ok(()),
        other => Err(format!("run without `unused`: {:?}", other.map(|_| "ran")).into()),
    }
}

/// `verify` on the device: NaN and ±inf where the interpreter has them count as equal, and the
/// error is over the finite values.
fn verify_with_non_finite_outputs(device: &Device) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let g = format::from_json_str(
        r#"{"version": 1, "name": "non_finite", "nodes": [
        {"name": "x", "op": "input", "dtype": "f32", "shape": [5, 64]},
        {"name": "zero", "op": "constant", "dtype": "f32", "value": 0.0},
        {"name": "ln", "op": "log", "inputs": ["x"]},
        {"name": "q", "op": "div", "inputs": ["x", "zero"]}], "outputs": ["ln", "q"]}"#,
    )
    .map_err(|e| e.to_string())?;
    let c = Graph::compile_with(&g, device, &options()).map_err(|e| e.to_string())?;
    let b = Bindings::random(&g, 8);
    let (_, v) = c.verify(&b).map_err(|e| e.to_string())?;
    let negatives = b.inputs["x"]
        .to_f64_vec()
        .iter()
        .filter(|x| **x < 0.0)
        .count();
    let counts: Vec<usize> = v.outputs.iter().map(|o| o.non_finite).collect();
    if counts != [negatives, 5 * 64] || v.max_error() > tolerance(DType::F32) {
        return Err(format!(
            "non-finite counts {counts:?} (want [{negatives}, 320]), error {:e}",
            v.max_error()
        )
        .into());
    }
    Ok(())
}

/// A device number past the last GPU is "no device", not a driver error or a panic.
fn ordinal_past_the_last_gpu(device: &Device) -> Result<(), Failed> {
    let kind = device.spec().split(':').next().unwrap_or_default();
    let spec = format!("{kind}:2147483647");
    match Device::open(&spec) {
        Err(rocmforge::runtime::RuntimeError::NoDevice { reason, .. })
            if reason.contains("GPU(s) present") =>
        {
            Ok(())
        }
        other => Err(format!("{spec}: {:?}", other.map(|d| d.label().to_string())).into()),
    }
}

fn minilm_dir() -> Option<PathBuf> {
    let dir = rocmforge::frontend::model_cache_dir(rocmforge::frontend::MINILM);
    dir.join("model.safetensors").exists().then_some(dir)
}

/// all-MiniLM-L6-v2 compiled for the GPU in `dtype`, the reference sentences in one padded batch,
/// against PyTorch's f32 embeddings: cosine ≥ `min_cos` (0.9999 for f32, 0.999 for f16).
fn minilm_matches_reference(
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

/// Runs `g` on the device with `b` (fused and not) and returns each mode's outputs.
fn run_both(device: &Device, g: &Graph, b: &Bindings) -> Result<Vec<Vec<Tensor>>, Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    [true, false]
        .iter()
        .map(|&fuse| {
            let c = Graph::compile_with(g, device, &CompileOptions { fuse, ..options() })
                .map_err(|e| format!("{}: {e}", g.name))?;
            c.run(b)
                .map_err(|e| format!("{} (fused: {fuse}): {e}", g.name).into())
        })
        .collect()
}

/// Reductions over an empty axis give PyTorch's values: sum 0, max -inf, mean NaN.
fn empty_axis_reductions(device: &Device) -> Result<(), Failed> {
    for (g, want) in edge_cases::empty_axis_reductions() {
        for outs in run_both(device, &g, &Bindings::random(&g, 1))? {
            for (i, (t, w)) in outs.iter().zip(&want).enumerate() {
                edge_cases::compare_values(t, w, &format!("{} output {i}", g.name))?;
            }
        }
    }
    Ok(())
}

/// Attention with no keys writes zeros (no key is visible); with a head size of 0 every score
/// is 0, so each row is the mean of V. Both by hand, in f32.
fn attention_without_keys_or_head_size(device: &Device) -> Result<(), Failed> {
    for (name, want_mean) in [
        ("empty_attention_sk0_f32", false),
        ("empty_attention_d0_f32", true),
    ] {
        let g = edge_cases::empty_graphs()
            .into_iter()
            .find(|g| g.name == name)
            .ok_or(format!("no graph {name}"))?;
        let b = Bindings::random(&g, 5);
        let q = g.ty(g.find("q").unwrap()).shape.dims().to_vec();
        let v = &b.inputs["v"];
        let vd = v.shape().dims().to_vec();
        let (hq, sq, hkv, sk, dv) = (q[1], q[2], vd[1], vd[2], vd[3]);
        let vv = v.to_f64_vec();
        let mut want = Vec::new();
        for bi in 0..q[0] {
            for h in 0..hq {
                let kvh = h / (hq / hkv);
                for _ in 0..sq {
                    for c in 0..dv {
                        want.push(if want_mean {
                            (0..sk)
                                .map(|j| vv[((bi * hkv + kvh) * sk + j) * dv + c])
                                .sum::<f64>()
                                / sk as f64
                        } else {
                            0.0
                        });
                    }
                }
            }
        }
        for outs in run_both(device, &g, &b)? {
            let want = Tensor::from_f64(DType::F32, outs[0].shape().clone(), &want)
                .map_err(|e| e.to_string())?;
            let err = compare(&outs[0], &want, name)?;
            if err > 1e-5 {
                return Err(format!("{name}: relative L2 {err:e}").into());
            }
        }
    }
    Ok(())
}

/// A gather with an index out of range fails on the GPU with the CPU's error, naming the same
/// node, the same (first) index and the table size; in range, the rows agree.
fn gathers_fail_as_on_the_cpu(device: &Device) -> Result<(), Failed> {
    let cpu = Device::cpu();
    let mut cases = edge_cases::gathers_out_of_range();
    cases.push(edge_cases::gather_case(DType::I64, &[4, 0, 3, 3], 5, 3));
    for c in cases {
        for fuse in [true, false] {
            let opts = CompileOptions { fuse, ..options() };
            let on = |d: &Device| {
                let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
                Graph::compile_with(&c.graph, d, &opts).and_then(|m| m.run(&c.bindings))
            };
            let (gpu, want) = (on(device), on(&cpu));
            match (&gpu, &want) {
                (Err(g), Err(w)) if g.to_string() == w.to_string() => {}
                (Ok(g), Ok(w)) if g == w => {}
                _ => {
                    return Err(format!(
                        "{} (fused: {fuse}): GPU {:?}, CPU {:?}",
                        c.graph.name,
                        gpu.as_ref().err().map(|e| e.to_string()),
                        want.as_ref().err().map(|e| e.to_string())
                    )
                    .into())
                }
            }
            if let Err(e) = &gpu {
                if !matches!(
                    e,
                    rocmforge::compile::CompileError::Interp(
                        rocmforge::interp::InterpError::IndexOutOfRange { .. }
                    )
                ) {
                    return Err(format!("{}: {e:?} is not IndexOutOfRange", c.graph.name).into());
                }
            }
        }
    }
    Ok(())
}

/// Causal masks and causal attention with offsets at the i64 limits: masks against the
/// definition (in i128), attention against the interpreter with the in-range offset that
/// gives the same mask.
fn causal_offsets_near_the_limits(device: &Device) -> Result<(), Failed> {
    let (g, want) = edge_cases::causal_masks(5, 7);
    for outs in run_both(device, &g, &Bindings::default())? {
        for ((t, w), off) in outs
            .iter()
            .zip(&want)
            .zip(edge_cases::extreme_offsets(5, 7))
        {
            edge_cases::compare_values(t, w, &format!("causal mask, offset {off}"))?;
        }
    }
    for (dt, d) in [(DType::F32, 32), (DType::F16, 32), (DType::F16, 24)] {
        for off in edge_cases::extreme_offsets(70, 90) {
            let g = edge_cases::causal_attention(dt, 70, 90, d, off);
            let same = edge_cases::causal_attention(dt, 70, 90, d, off.clamp(-70, 90));
            let b = Bindings::random(&g, 9);
            let want = run(&same, &b).map_err(|e| e.to_string())?.remove(0);
            for outs in run_both(device, &g, &b)? {
                let err = compare(&outs[0], &want, &g.name)?;
                if err > tolerance(dt) {
                    return Err(format!("{}: relative L2 {err:e}", g.name).into());
                }
            }
        }
    }
    Ok(())
}

/// Edge values (NaN, infinities, values past f16, i32 and i64) through every elementwise row
/// and through fused expressions whose intermediates overflow or wrap: the interpreter's
/// results, within a few ulps for libm functions.
fn edge_values(device: &Device, case: &edge_cases::Case) -> Result<(), Failed> {
    let want = run(&case.graph, &case.bindings).map_err(|e| e.to_string())?;
    for outs in run_both(device, &case.graph, &case.bindings)? {
        for ((o, t), w) in case.graph.outputs().iter().zip(&outs).zip(&want) {
            let what = format!("{} %{}", case.graph.name, case.graph.node(*o).name);
            edge_cases::compare(t, w, 16.0, &what)?;
        }
    }
    Ok(())
}

/// A launch past the device's own limits is refused with a typed error before it reaches the
/// driver: a grid of 2³²−1 blocks in x, a block of 2048 threads.
fn launch_past_the_device_limits(device: &Device) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let mut g = Graph::new("launch_limits");
    let x = g.input("x", DType::F32, &[256]).unwrap();
    let y = g.neg(x).unwrap();
    g.add_output(y).unwrap();
    let target = device.target().ok_or("no target")?.clone();
    let plan = rocmforge::codegen::generate(&g, &target).map_err(|e| e.to_string())?;
    let k = &plan.kernels[0];
    let opts: Vec<String> = match target.platform {
        rocmforge::arch::Platform::Amd => vec!["-O3".into()],
        rocmforge::arch::Platform::Nvidia => vec![],
    };
    let image = device
        .compile_source(&plan.source(k), &k.entry, &opts)
        .map_err(|e| e.to_string())?;
    let loaded = device
        .load_kernel(&image, &k.entry)
        .map_err(|e| e.to_string())?;
    let stream = device.new_stream().map_err(|e| e.to_string())?;
    let a = stream.alloc(1024, true).map_err(|e| e.to_string())?;
    let o = stream.alloc(1024, true).map_err(|e| e.to_string())?;
    for (grid, block, what) in [
        ([u32::MAX, 1, 1], [256, 1, 1], "grid.x"),
        ([1, 1, 1], [2048, 1, 1], "block.x"),
    ] {
        match stream.launch(&loaded, grid, block, 0, &[&a, &o]) {
            Err(rocmforge::runtime::RuntimeError::LaunchLimit { what: w, .. }) if w == what => {}
            other => return Err(format!("{grid:?} {block:?}: {other:?}").into()),
        }
    }
    stream
        .launch(&loaded, [1, 1, 1], [256, 1, 1], 0, &[&a, &o])
        .map_err(|e| format!("a launch within the limits: {e}"))?;
    stream.synchronize().map_err(|e| e.to_string())?;
    Ok(())
}

/// Elementwise ops and casts at their edge values (±0, ±∞, NaN, f16's limit and overflow,
/// values past every integer type, the integer limits) on the device, fused and unfused, bit for
/// bit against the interpreter (`ir::scalar`, docs/ops.md "Scalar semantics"). Only ops IEEE
/// specifies exactly are compared: transcendental functions may differ in the last place.
fn elementwise_edges_bit_for_bit(device: &Device, dt: DType, fuse: bool) -> Result<(), Failed> {
    use rocmforge::ir::{BinaryOp, Op, UnaryOp};
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let values = edge_cases::edge_values(dt);
    let k = values.len();
    let mut g = Graph::new(format!("edges_{dt}"));
    let a = g.input("a", dt, &[k, 1]).map_err(|e| e.to_string())?;
    let b = g.input("b", dt, &[1, k]).map_err(|e| e.to_string())?;
    let mut outs = Vec::new();
    let mut add = |g: &mut Graph, op: Op, ins: &[rocmforge::ir::NodeId]| {
        if let Ok(id) = g.add_op(op, ins) {
            outs.push(id);
        }
    };
    for u in [UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Sqrt, UnaryOp::Recip] {
        add(&mut g, Op::Unary(u), &[a]);
    }
    for op in [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
        BinaryOp::Equal,
        BinaryOp::Less,
        BinaryOp::Greater,
    ] {
        add(&mut g, Op::Binary(op), &[a, b]);
    }
    for to in DType::ALL {
        add(&mut g, Op::Cast { to }, &[a]);
        // Fused: the sum is stored to its dtype (wrapped, rounded) before the cast.
        if let Ok(s) = g.add(a, b) {
            add(&mut g, Op::Cast { to }, &[s]);
        }
    }
    // Fused: a wrapped integer sum compared with zero.
    if dt.is_int() {
        let zero = g.scalar(0.0, dt).map_err(|e| e.to_string())?;
        let s = g.add(a, b).map_err(|e| e.to_string())?;
        add(&mut g, Op::Binary(BinaryOp::Less), &[s, zero]);
    }
    g.set_outputs(&outs).map_err(|e| e.to_string())?;
    let bindings = Bindings::default()
        .with_input(
            "a",
            Tensor::from_f64(dt, vec![k, 1], &values).map_err(|e| e.to_string())?,
        )
        .with_input(
            "b",
            Tensor::from_f64(dt, vec![1, k], &values).map_err(|e| e.to_string())?,
        );
    let c = Graph::compile_with(&g, device, &CompileOptions { fuse, ..options() })
        .map_err(|e| e.to_string())?;
    let got = c.run(&bindings).map_err(|e| e.to_string())?;
    let want = run(&g, &bindings).map_err(|e| e.to_string())?;
    let bits = |t: &Tensor| -> Vec<u64> {
        match (t.as_f32(), t.as_i64()) {
            (Some(f), _) => f
                .iter()
                .map(|x| {
                    if x.is_nan() {
                        u64::MAX
                    } else {
                        u64::from(x.to_bits())
                    }
                })
                .collect(),
            (_, Some(i)) => i.iter().map(|&x| x as u64).collect(),
            _ => vec![],
        }
    };
    for ((o, gt), wt) in g.outputs().iter().zip(&got).zip(&want) {
        let (gb, wb) = (bits(gt), bits(wt));
        if let Some(i) = (0..wb.len()).find(|&i| gb.get(i) != Some(&wb[i])) {
            return Err(format!(
                "{} ({}): element {i} of {}: device {:?}, interpreter {:?} (edge values {values:?})",
                g.node(*o).op,
                if fuse { "fused" } else { "unfused" },
                wt.shape(),
                gt.to_f64_vec().get(i),
                wt.to_f64_vec()[i]
            )
            .into());
        }
    }
    Ok(())
}

/// The linear-layer graphs benches/gemm.rs times, at sizes no tile divides (M = 1 and 17,
/// MiniLM's and SmolLM2's K), against the interpreter: the bench times kernels that compute
/// the right thing.
fn linear_layer_matches_interpreter(
    device: &Device,
    (m, n, k): (usize, usize, usize),
    dtype: DType,
    bias_gelu: bool,
) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let g =
        linear_graphs::linear("linear", m, n, k, dtype, bias_gelu).map_err(|e| e.to_string())?;
    let c = Graph::compile_with(&g, device, &options()).map_err(|e| e.to_string())?;
    let (_, v) = c
        .verify(&Bindings::random(&g, 12))
        .map_err(|e| e.to_string())?;
    if v.max_error() > tolerance(dtype) {
        return Err(format!("M{m} N{n} K{k} {dtype}: relative L2 {:e}", v.max_error()).into());
    }
    Ok(())
}

/// A held stream starts nothing queued behind the hold until it is released: a marker queued
/// behind it is not reached while held (the event itself is asked), and is once the hold is
/// released. A hold never released gives up at its limit and says so: synchronising the stream
/// returns once it has.
fn hold_keeps_the_stream_until_released(device: &Device) -> Result<(), Failed> {
    use std::time::Duration;
    // Alone on the device: CUDA runs every stream's host functions on one driver thread, so
    // another trial's hold queued ahead of this one delays when this one starts waiting (seen
    // on the H100 under the parallel harness: the 10 s hold reported expired).
    let _alone = MEMORY.write().unwrap_or_else(|p| p.into_inner());
    let stream = device.new_stream().map_err(|e| e.to_string())?;
    let err = |e: rocmforge::runtime::RuntimeError| Failed::from(e.to_string());
    let mut hold = stream.hold(Duration::from_secs(10)).map_err(err)?;
    let behind = stream.mark().map_err(err)?;
    if behind.reached().map_err(err)? {
        return Err("a marker behind a held stream was reached before the release".into());
    }
    hold.release();
    stream.synchronize().map_err(err)?;
    if !behind.reached().map_err(err)? || hold.expired() {
        return Err(format!(
            "after the release: reached {:?}, expired {}",
            behind.reached(),
            hold.expired()
        )
        .into());
    }
    let unreleased = stream.hold(Duration::from_millis(5)).map_err(err)?;
    let after = stream.mark().map_err(err)?;
    stream.synchronize().map_err(err)?;
    if !unreleased.expired() || !after.reached().map_err(err)? {
        return Err("a 5 ms hold never released did not give up".into());
    }
    Ok(())
}

/// `Prepared::profile` on the fused BERT layer: one time per kernel of the plan, in its order,
/// each positive, their sum within the span, the span within a plain run's host-timed pass
/// (which adds launch latency), and the profiled run's outputs still the interpreter's.
fn profile_times_every_kernel(device: &Device) -> Result<(), Failed> {
    use std::time::{Duration, Instant};
    // Alone on the device: while the profiled stream is held, another thread's device-wide
    // synchronising call (freeing memory, loading a module) waits for it, and a lock that thread
    // holds can keep this host from enqueueing; the hold then gives up after its limit (seen
    // once on the H100 under the parallel harness: ProfileHoldExpired).
    let _alone = MEMORY.write().unwrap_or_else(|p| p.into_inner());
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("graphs/bert_layer.json");
    let g = format::load(&path).map_err(|e| e.to_string())?;
    let c = Graph::compile_with(&g, device, &options()).map_err(|e| e.to_string())?;
    let plan = c.plan().ok_or("a GPU compile has a plan")?;
    let b = Bindings::random(&g, 5);
    let mut p = c.prepare(&b).map_err(|e| e.to_string())?;
    let profile = p.profile().map_err(|e| e.to_string())?;
    let order: Vec<(&str, &str)> = profile
        .kernels
        .iter()
        .map(|k| (k.entry.as_str(), k.family))
        .collect();
    let want: Vec<(&str, &str)> = plan
        .kernels
        .iter()
        .map(|k| (k.entry.as_str(), k.family))
        .collect();
    if order != want {
        return Err(format!("profile kernels {order:?}, plan {want:?}").into());
    }
    if let Some(k) = profile.kernels.iter().find(|k| k.time.is_zero()) {
        return Err(format!("kernel {} ({}) timed at zero", k.index, k.entry).into());
    }
    // Event stamps are about half a microsecond apart at best: one of rounding per kernel.
    let slack = Duration::from_micros(plan.kernels.len() as u64);
    if profile.total() > profile.span + slack {
        return Err(format!("sum {:?} past span {:?}", profile.total(), profile.span).into());
    }
    let families: usize = profile.by_family().iter().map(|f| f.kernels).sum();
    if families != plan.kernels.len() {
        return Err(format!(
            "families count {families} of {} kernels",
            plan.kernels.len()
        )
        .into());
    }
    let mut walls: Vec<Duration> = (0..5)
        .map(|_| {
            let t = Instant::now();
            p.launch()
                .and_then(|_| p.synchronize())
                .map(|_| t.elapsed())
        })
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    walls.sort();
    if profile.span > walls[2] * 2 {
        return Err(format!("span {:?}, a host-timed pass {:?}", profile.span, walls[2]).into());
    }
    let got = p.outputs().map_err(|e| e.to_string())?;
    let want = run(&g, &with_weights(&g, &b)).map_err(|e| e.to_string())?;
    for (i, (x, y)) in got.iter().zip(&want).enumerate() {
        let err = compare(x, y, &format!("output {i}"))?;
        if err > tolerance(x.ty().dtype) {
            return Err(format!("output {i} after profiling: relative L2 {err:e}").into());
        }
    }
    Ok(())
}

type Body = Box<dyn FnOnce() -> Result<(), Failed> + Send>;

/// A trial, or the same trial marked ignored with `ignored` as the reason.
/// A fresh, absent directory for a bundle.
fn bundle_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "rocmforge-gpu-bundle-{}-{}",
        std::process::id(),
        name.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Emits a bundle of `g` for the device's own target and replays it there: every computed
/// buffer must be compared and match the interpreter, every kernel loaded as `recompile` says.
fn bundle_replays(device: &Device, g: &Graph, recompile: bool) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let target = device.target().ok_or("no target")?.clone();
    let dir = bundle_dir(&format!("{}_{recompile}", g.name));
    let options = bundle::EmitOptions {
        seed: 5,
        ..bundle::EmitOptions::default()
    };
    let emitted = bundle::emit(g, &target, &dir, &options).map_err(|e| e.to_string())?;
    if emitted.plan.compiler.name.is_none() {
        return Err(format!("no code objects: {:?}", emitted.plan.compiler.missing).into());
    }
    let opened = bundle::Bundle::open(&dir, u64::MAX).map_err(|e| e.to_string())?;
    let report = opened
        .replay(device, &bundle::ReplayOptions { recompile })
        .map_err(|e| e.to_string())?;
    std::fs::remove_dir_all(&dir).ok();
    if let Some(m) = &report.first_mismatch {
        return Err(format!("{}: first mismatch {m:?}", g.name).into());
    }
    if !report.passed {
        return Err(format!("{}: index checks failed: {:?}", g.name, report.checks).into());
    }
    let computed = emitted
        .plan
        .buffers
        .iter()
        .filter(|b| b.role.is_computed())
        .count();
    let compared = report.buffers.iter().filter(|b| b.error.is_some()).count();
    if compared != computed {
        return Err(format!("{}: {compared} of {computed} buffers compared", g.name).into());
    }
    for k in &report.kernels {
        let from_code_object = k.loaded == bundle::KernelSource::CodeObject;
        if from_code_object == recompile {
            return Err(format!("{}: kernel {} loaded as {:?}", g.name, k.entry, k.loaded).into());
        }
    }
    Ok(())
}

/// A wrong value in `expected/` for the buffer a middle kernel writes: the replay must fail
/// and name that kernel and buffer first.
fn bundle_names_first_mismatch(device: &Device, g: &Graph) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let target = device.target().ok_or("no target")?.clone();
    let dir = bundle_dir(&format!("{}_mismatch", g.name));
    let emitted = bundle::emit(g, &target, &dir, &bundle::EmitOptions::default())
        .map_err(|e| e.to_string())?;
    let plan = &emitted.plan;
    let k = plan.kernels.len() / 2;
    let written = plan.kernels[k].args.last().ok_or("no args")?.buffer;
    let rel = plan.buffers[written]
        .expected
        .clone()
        .ok_or("no expected value")?;
    let b = &plan.buffers[written];
    let bytes = std::fs::read(dir.join(&rel)).map_err(|e| e.to_string())?;
    let ty = rocmforge::ir::TensorType::new(b.dtype, b.shape.clone());
    let mut values = Tensor::from_bytes(&ty, &bytes)
        .map_err(|e| e.to_string())?
        .to_f64_vec();
    // Far past any tolerance, whatever the buffer's scale.
    values[0] += 1.0 + 1e3 * values.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let wrong = Tensor::from_f64(b.dtype, b.shape.clone(), &values).map_err(|e| e.to_string())?;
    std::fs::write(dir.join(&rel), wrong.to_bytes()).map_err(|e| e.to_string())?;
    let report = bundle::Bundle::open(&dir, u64::MAX)
        .and_then(|b| b.replay(device, &bundle::ReplayOptions::default()))
        .map_err(|e| e.to_string())?;
    std::fs::remove_dir_all(&dir).ok();
    let m = report.first_mismatch.ok_or("the corrupted value passed")?;
    if report.passed
        || m.buffer != written
        || m.kernel
            .is_none_or(|i| plan.kernels[i].entry != plan.kernels[k].entry)
    {
        return Err(format!("want kernel {k} buffer {written}, got {m:?}").into());
    }
    Ok(())
}

/// A code object that is not one (refused before the driver sees it) is replaced by the
/// kernel's source compiled on the device, and the replay still matches.
fn bundle_falls_back_to_source(device: &Device, g: &Graph) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let target = device.target().ok_or("no target")?.clone();
    let dir = bundle_dir(&format!("{}_fallback", g.name));
    let emitted = bundle::emit(g, &target, &dir, &bundle::EmitOptions::default())
        .map_err(|e| e.to_string())?;
    let k = &emitted.plan.kernels[0];
    let co = k.code_object.as_ref().ok_or("no code objects")?;
    std::fs::write(dir.join(co), vec![b'x'; 4096]).map_err(|e| e.to_string())?;
    let report = bundle::Bundle::open(&dir, u64::MAX)
        .and_then(|b| b.replay(device, &bundle::ReplayOptions::default()))
        .map_err(|e| e.to_string())?;
    std::fs::remove_dir_all(&dir).ok();
    if !report.passed {
        return Err(format!("{:?}", report.first_mismatch).into());
    }
    match &report.kernels[0].loaded {
        bundle::KernelSource::Compiled { reason } if reason.contains("its code object") => Ok(()),
        other => Err(format!("kernel {} loaded as {other:?}", k.entry).into()),
    }
}

/// A device handle of its own over the GPU `spec`, with a kernel and tune cache in `dir` only
/// (no results of earlier runs, no memory of other trials).
fn device_with_cache_in(spec: &str, dir: &Path) -> Result<Device, Failed> {
    Ok(Device::open_with_cache(
        spec,
        KernelCache::with_disk(Some(DiskCache::new(dir.into()))),
    )
    .map_err(|e| e.to_string())?)
}

fn tune_options() -> CompileOptions {
    CompileOptions {
        tune: true,
        ..options()
    }
}

/// The kernels of a compile with their tuned choice: (node, candidate index) per tunable kernel.
fn tuned_choices(c: &rocmforge::compile::Compiled) -> Vec<(String, usize)> {
    c.plan()
        .map(|p| {
            p.kernels
                .iter()
                .filter_map(|k| k.tune.as_ref().map(|t| (k.node.clone(), t.chosen)))
                .collect()
        })
        .unwrap_or_default()
}

/// Tuning `g` (odd sizes) on a fresh tune cache: every problem with several candidates is timed
/// (no cache yet) and a candidate chosen; the result matches the reference (`check` runs it on
/// the tuned compile); a second compile on a new device handle over the same directory (a
/// restart) reads every choice from disk without timing and generates the same kernels; the
/// entries are listed as tuning entries.
fn tune_then_reload(
    device: &Device,
    g: &Graph,
    check: &dyn Fn(&Device) -> Result<(), Failed>,
) -> Result<(), Failed> {
    // No hold on MEMORY here: these device handles count their own memory, apart from the
    // shared device the memory check measures, and `check` may take the lock itself.
    let dir = std::env::temp_dir().join(format!(
        "rocmforge-gpu-tune-{}-{}",
        g.name,
        std::process::id()
    ));
    std::fs::remove_dir_all(&dir).ok();
    let result = (|| -> Result<(), Failed> {
        let first = device_with_cache_in(device.spec(), &dir)?;
        let c1 = Graph::compile_with(g, &first, &tune_options()).map_err(|e| e.to_string())?;
        let t1 = &c1.stats.tuning;
        if t1.problems == 0 || t1.timed != t1.problems || t1.from_cache != 0 {
            return Err(format!("{}: first compile tuned {t1:?}", g.name).into());
        }
        if t1.candidates_timed <= t1.problems {
            return Err(format!("{}: fewer than two candidates timed: {t1:?}", g.name).into());
        }
        let chosen = tuned_choices(&c1);
        if chosen.is_empty() {
            return Err(format!("{}: no tunable kernel in the plan", g.name).into());
        }
        check(&first)?;
        let tuning_entries = DiskCache::new(dir.clone())
            .list()
            .map_err(|e| e.to_string())?
            .entries
            .into_iter()
            .filter(|e| matches!(e.kind, rocmforge::runtime::EntryKind::Tuning { .. }) && e.valid)
            .count();
        if tuning_entries != t1.problems {
            return Err(format!(
                "{}: {tuning_entries} tuning entries on disk for {} problems",
                g.name, t1.problems
            )
            .into());
        }
        let second = device_with_cache_in(device.spec(), &dir)?;
        let c2 = Graph::compile_with(g, &second, &tune_options()).map_err(|e| e.to_string())?;
        let t2 = &c2.stats.tuning;
        if t2.timed != 0 || t2.candidates_timed != 0 || t2.from_cache != t1.problems {
            return Err(format!("{}: second compile {t2:?} after {t1:?}", g.name).into());
        }
        if tuned_choices(&c2) != chosen {
            return Err(format!(
                "{}: reloaded choices {:?} differ from the tuned {chosen:?}",
                g.name,
                tuned_choices(&c2)
            )
            .into());
        }
        check(&second)
    })();
    std::fs::remove_dir_all(&dir).ok();
    result
}

/// An f16 GEMM at odd sizes on the matrix cores (where the device has an atom), tuned.
fn tune_gemm(device: &Device) -> Result<(), Failed> {
    let g = gemm_cases::plain_case(DType::F16, 77, 130, 72, true);
    let check = |d: &Device| -> Result<(), Failed> {
        let c = Graph::compile_with(&g, d, &tune_options()).map_err(|e| e.to_string())?;
        let b = Bindings::random(&g, 5);
        let got = c.run(&b).map_err(|e| e.to_string())?.remove(0);
        let want = run(&g, &with_weights(&g, &b))
            .map_err(|e| e.to_string())?
            .remove(0);
        let err = compare(&got, &want, &g.name)?;
        if err > tolerance(DType::F16) {
            return Err(format!("{} tuned: relative L2 {err:e}", g.name).into());
        }
        Ok(())
    };
    tune_then_reload(device, &g, &check)
}

/// f16 causal GQA attention at odd sizes (77 queries, 93 keys, 6 query heads on 2 K/V heads),
/// tuned.
fn tune_attention(device: &Device) -> Result<(), Failed> {
    let spec = Spec {
        dtype: DType::F16,
        hkv: 2,
        sk: 93,
        mask: Mask::Causal,
        ..Spec::new(2, 6, 77, 64)
    };
    let mut g = build(&spec);
    rocmforge::passes::PassManager::default_pipeline()
        .run(&mut g)
        .map_err(|e| e.to_string())?;
    g.name = "tune_attention".into();
    let check = |d: &Device| check_attention_with(d, spec, 9, tune_options());
    tune_then_reload(device, &g, &check)
}

/// The rocmforge binary: where cargo built it, else staged beside the test binaries
/// (`cp target/release/rocmforge .gpu/bin/`).
fn rocmforge_binary() -> Option<PathBuf> {
    [
        PathBuf::from(env!("CARGO_BIN_EXE_rocmforge")),
        PathBuf::from(".gpu/bin/rocmforge"),
    ]
    .into_iter()
    .find(|p| p.is_file())
}

/// `rocmforge run --tune` with `RUST_LOG=rocmforge=debug`: the first run times the candidates
/// and logs the stages, the second reads the choices from the cache, `cache ls` lists them
/// and `cache clear` removes them.
fn tune_cli(device: &Device, exe: &Path) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let dir = std::env::temp_dir().join(format!("rocmforge-gpu-tune-cli-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    let graph = Path::new(env!("CARGO_MANIFEST_DIR")).join("graphs/attention_f16.json");
    let cmd = |args: &[&str]| -> Result<(String, String), Failed> {
        let out = std::process::Command::new(exe)
            .args(args)
            .env("ROCMFORGE_CACHE_DIR", &dir)
            .env("RUST_LOG", "rocmforge=debug")
            .output()
            .map_err(|e| e.to_string())?;
        let (o, e) = (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        if !out.status.success() {
            return Err(format!("rocmforge {args:?} failed:\n{o}\n{e}").into());
        }
        Ok((o, e))
    };
    let graph_arg = graph.to_string_lossy().into_owned();
    let run_args = [
        "run",
        graph_arg.as_str(),
        "--tune",
        "--verify",
        "--device",
        device.spec(),
    ];
    let result = (|| -> Result<(), Failed> {
        let (out, err) = cmd(&run_args)?;
        // "tuning: N problems with several candidates, F from the cache, T timed now (...)"
        let numbers = |text: &str| -> Option<Vec<usize>> {
            let line = text.lines().find(|l| l.starts_with("tuning: "))?;
            Some(
                line.split(|c: char| !c.is_ascii_digit())
                    .filter_map(|s| s.parse().ok())
                    .take(3)
                    .collect(),
            )
        };
        let first = numbers(&out).ok_or(format!("no tuning line in:\n{out}"))?;
        if first.len() != 3 || first[0] == 0 || first[1] != 0 || first[2] != first[0] {
            return Err(format!("first --tune run: {first:?}\n{out}").into());
        }
        for stage in [
            "pass done",
            "codegen done",
            "kernel: compiled",
            "tuning: timed",
            "weights uploaded",
        ] {
            if !err.contains(stage) {
                return Err(format!("RUST_LOG=rocmforge=debug lacks `{stage}`:\n{err}").into());
            }
        }
        let (out2, err2) = cmd(&run_args)?;
        let second = numbers(&out2).ok_or(format!("no tuning line in:\n{out2}"))?;
        if second != vec![first[0], first[0], 0] || err2.contains("tuning: timed") {
            return Err(format!("second --tune run: {second:?}\n{out2}").into());
        }
        let (ls, _) = cmd(&["cache", "ls"])?;
        let listed = ls.lines().filter(|l| l.contains(" tuning ")).count();
        if listed != first[0] || !ls.contains("attention_mma") && !ls.contains("attention_simt") {
            return Err(format!("cache ls lists {listed} tuning entries:\n{ls}").into());
        }
        cmd(&["cache", "clear"])?;
        let (ls, _) = cmd(&["cache", "ls"])?;
        if ls.contains(" tuning ") {
            return Err(format!("tuning entries left after cache clear:\n{ls}").into());
        }
        Ok(())
    })();
    std::fs::remove_dir_all(&dir).ok();
    result
}

/// A trial on the shim-backed HIP device.
type HipTrial = Box<dyn FnOnce(&Device) -> Result<(), Failed> + Send>;

/// The HIP device path through `tests/hipshim` (`hip::`): the shim's own device facts, every
/// example graph, the op zoo, attention, GEMM and decode cases, the target's matrix atoms,
/// launch limits, poisoning, stream holds and event timing, and memory back to its baseline;
/// each against the interpreter as on `cuda:0`. A shim that cannot be built for want of tools
/// makes them ignored with the reason; one that fails to build or open fails each.
fn hip_trials(
    trials: &mut Vec<Trial>,
    main_device: &Device,
    shim: &Option<hipshim::Shim>,
    hip: &Result<Device, hipshim::Unavailable>,
) {
    let mut add = |name: &str, f: HipTrial| {
        let name = format!("hip::{name}");
        match hip {
            Ok(d) => {
                let d = d.clone();
                trials.push(Trial::test(name, move || f(&d)));
            }
            Err(hipshim::Unavailable::Skip(why)) => {
                push(trials, &Some(why.clone()), name, Box::new(|| Ok(())))
            }
            Err(hipshim::Unavailable::Broken(why)) => {
                let why = why.clone();
                trials.push(Trial::test(name, move || Err(why.into())));
            }
        }
    };
    let cuda_arch = main_device.target().map(|t| t.arch.clone());
    add(
        "device::is_the_nvidia_platform_of_this_gpu",
        Box::new(move |d| {
            let t = d.target().ok_or("no target")?;
            if d.spec() != "hip:0"
                || t.platform != Platform::Nvidia
                || Some(&t.arch) != cuda_arch.as_ref()
                || !d.label().contains("libhipshim.so")
            {
                return Err(
                    format!("{} (target {}), cuda arch {cuda_arch:?}", d.label(), t.arch).into(),
                );
            }
            Ok(())
        }),
    );
    let shim_files = shim.clone();
    add(
        "shim::graph_capture_replays",
        Box::new(move |_| match &shim_files {
            Some(s) => hipshim::graph_check(s).map_err(Failed::from),
            None => Err("no shim was built".into()),
        }),
    );
    let library = shim.as_ref().map(|s| s.library.clone());
    add(
        "device::ordinal_past_the_last_gpu",
        Box::new(move |_| {
            let libraries = HipLibraries {
                runtime: library.clone(),
                hiprtc: library,
            };
            match Device::open_hip(i32::MAX as usize, &libraries, KernelCache::with_disk(None)) {
                Err(rocmforge::runtime::RuntimeError::NoDevice { reason, .. })
                    if reason.contains("GPU(s) present") =>
                {
                    Ok(())
                }
                other => Err(format!("{:?}", other.map(|d| d.label().to_string())).into()),
            }
        }),
    );
    for path in files::graph_files() {
        for fuse in [true, false] {
            let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
            let path = path.clone();
            add(
                &format!("graph::{stem}::{}", if fuse { "fused" } else { "unfused" }),
                Box::new(move |d| {
                    check_graph(d, &format::load(&path).map_err(|e| e.to_string())?, fuse, 3)
                }),
            );
        }
    }
    for g in op_zoo::zoo() {
        add(
            &format!("zoo::{}", g.name),
            Box::new(move |d| check_graph(d, &g, true, 4)),
        );
    }
    // The SIMT and matrix-core attention kernels: GQA, masks, causal offsets, odd sizes.
    let attention = [
        (
            2,
            6,
            2,
            17,
            33,
            64,
            DType::F32,
            Mask::Causal,
            Scale::DivScores,
        ),
        (
            2,
            4,
            4,
            200,
            200,
            128,
            DType::F16,
            Mask::Padding,
            Scale::OnQ,
        ),
        (
            1,
            6,
            2,
            77,
            300,
            64,
            DType::BF16,
            Mask::Causal,
            Scale::MulScores,
        ),
    ];
    for (i, (b, hq, hkv, sq, sk, d, dtype, mask, scale)) in attention.into_iter().enumerate() {
        let spec = Spec {
            hkv,
            sk,
            dtype,
            mask,
            scale,
            cast_softmax: dtype != DType::F32,
            offset: if sq < sk { (sk - sq) as i64 } else { 0 },
            ..Spec::new(b, hq, sq, d)
        };
        add(
            &format!("attention::{i}::{dtype}::{mask:?}"),
            Box::new(move |dev| check_attention(dev, spec, 10 + i as u64)),
        );
    }
    for dtype in [DType::F16, DType::BF16, DType::F32] {
        add(
            &format!("gemm::linear_M17_N384_K1536_{dtype}_bias_gelu"),
            Box::new(move |d| linear_layer_matches_interpreter(d, (17, 384, 1536), dtype, true)),
        );
    }
    for g in gemm_cases::cases(DType::F16, false).into_iter().take(4) {
        add(
            &format!("gemm_mma::{}", g.name),
            Box::new(move |d| check_graph(d, &g, false, 12)),
        );
    }
    for (i, case) in decode_cases::gpu_cases()
        .into_iter()
        .enumerate()
        .step_by(41)
        .take(4)
    {
        add(
            &format!("decode::{}", case.name()),
            Box::new(move |d| check_decode(d, case, 300 + i as u64)),
        );
    }
    if let Ok(d) = hip {
        for &atom in d.target().map_or(&[][..], |t| t.caps.mma) {
            add(
                &format!("mma::{}::exact_product", atom.name),
                Box::new(move |d| mma_atom_probe(d, atom)),
            );
        }
    }
    let device_trials: [(&str, DeviceTrial); 5] = [
        (
            "launch::past_the_device_limits_is_refused",
            launch_past_the_device_limits,
        ),
        ("poison::planted_bug_is_caught", planted_bug_is_caught),
        (
            "profile::hold_keeps_the_stream_until_released",
            hold_keeps_the_stream_until_released,
        ),
        (
            "profile::times_every_kernel_of_the_plan",
            profile_times_every_kernel,
        ),
        ("memory::returns_to_baseline", memory_returns_to_baseline),
    ];
    for (name, f) in device_trials {
        add(name, Box::new(f));
    }
    // Sessions and hipGraph replay through the HIP runtime's entry points.
    for name in session_trials::GRAPHS {
        add(
            &format!("session::warm_matches_run::{name}"),
            Box::new(move |d| session_trials::warm_session_matches_run(d, name)),
        );
    }
    let session_device_trials: [(&str, DeviceTrial); 4] = [
        ("session::device_scalar_loop::replay", |d| {
            session_trials::device_scalar_loop(d, true)
        }),
        ("session::device_scalar_loop::plain", |d| {
            session_trials::device_scalar_loop(d, false)
        }),
        (
            "session::warm_runs_allocate_nothing",
            session_trials::warm_runs_allocate_nothing,
        ),
        (
            "session::buffers_outlive_the_graph",
            session_trials::buffers_outlive_the_graph,
        ),
    ];
    for (name, f) in session_device_trials {
        add(name, Box::new(f));
    }
}

/// Runs on any machine with `cc`, GPU or not: the shim exports every entry point rocmforge
/// binds as the HIP runtime (a missing one fails the open before `hipInit` is called) and as
/// hiprtc. Without a CUDA driver the open stops at `hipInit` with the shim's reason.
fn hip_shim_binds() -> Result<(), Failed> {
    let shim = match hipshim::compile("binds") {
        Ok(s) => s,
        Err(hipshim::Unavailable::Skip(_)) => return Ok(()),
        Err(hipshim::Unavailable::Broken(why)) => return Err(why.into()),
    };
    let result = (|| -> Result<(), Failed> {
        let libraries = HipLibraries {
            runtime: Some(shim.library.clone()),
            hiprtc: Some(shim.library.clone()),
        };
        match Device::open_hip(0, &libraries, KernelCache::with_disk(None)) {
            Ok(_) => {}
            Err(rocmforge::runtime::RuntimeError::NoDevice { reason, .. })
                if reason.contains("hipInit failed") && reason.contains("no CUDA driver") => {}
            Err(e) => return Err(e.to_string().into()),
        }
        rocmforge::runtime::Hiprtc::load_from(Some(&shim.library))
            .map(|_| ())
            .map_err(|e| e.to_string().into())
    })();
    hipshim::remove(Some(shim));
    result
}

type DeviceTrial = fn(&Device) -> Result<(), Failed>;

fn push(trials: &mut Vec<Trial>, ignored: &Option<String>, name: String, f: Body) {
    trials.push(match ignored {
        None => Trial::test(name, f),
        Some(why) => Trial::test(name, || Ok(()))
            .with_ignored_flag(true)
            .with_kind(format!("ignored: {why}")),
    });
}

fn main() {
    if std::env::var("ROCMFORGE_GPU_CHILD_DEVICE").is_ok() {
        child_compile();
        return;
    }
    let args = Arguments::from_args();
    // A ROCMFORGE_DEVICE that cannot be opened fails the run rather than skipping every trial.
    let (device, notes) = Device::best().unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(1)
    });
    let ignored = if device.is_gpu() {
        None
    } else {
        Some(format!("no GPU: {}", notes.join("; ")))
    };
    let mut trials: Vec<Trial> = Vec::new();
    for path in files::graph_files() {
        for fuse in [true, false] {
            let (d, p) = (device.clone(), path.clone());
            let name = format!(
                "graph::{}::{}",
                p.file_stem().unwrap().to_string_lossy(),
                if fuse { "fused" } else { "unfused" }
            );
            push(
                &mut trials,
                &ignored,
                name,
                Box::new(move || {
                    check_graph(&d, &format::load(&p).map_err(|e| e.to_string())?, fuse, 3)
                }),
            );
        }
    }
    for g in op_zoo::zoo() {
        let d = device.clone();
        push(
            &mut trials,
            &ignored,
            format!("zoo::{}", g.name),
            Box::new(move || check_graph(&d, &g, true, 4)),
        );
    }
    // Gemm kernels reading and writing the layouts around them in place, at odd sizes.
    for dt in [DType::F32, DType::F16, DType::BF16] {
        for g in gemm_graphs::layouts(dt) {
            let d = device.clone();
            let name = format!("gemm_layouts::{}", g.name);
            push(
                &mut trials,
                &ignored,
                name,
                Box::new(move || check_graph(&d, &g, true, 6)),
            );
        }
    }
    // Gemm nodes on the matrix cores (where the device has an atom for the dtype): odd sizes,
    // element loads, both B layouts, head merge/split views, epilogues, a batch, a large shape;
    // poisoned outputs against the interpreter.
    for dt in [DType::F16, DType::BF16] {
        for g in gemm_cases::cases(dt, true) {
            let d = device.clone();
            push(
                &mut trials,
                &ignored,
                format!("gemm_mma::{}", g.name),
                Box::new(move || check_graph(&d, &g, false, 12)),
            );
        }
    }
    // Hostile names compile to the plain graph's kernels and run like any graph.
    for g in op_zoo::zoo() {
        let d = device.clone();
        let name = format!("names::hostile::{}", g.name);
        let h = op_zoo::with_hostile_names(&g);
        push(
            &mut trials,
            &ignored,
            name,
            Box::new(move || check_graph(&d, &h, true, 4)),
        );
    }
    for g in edge_cases::empty_graphs() {
        for fuse in [true, false] {
            let d = device.clone();
            let name = format!(
                "zero_size::{}::{}",
                g.name,
                if fuse { "fused" } else { "unfused" }
            );
            let g = g.clone();
            push(
                &mut trials,
                &ignored,
                name,
                Box::new(move || check_graph(&d, &g, fuse, 6)),
            );
        }
    }
    let tune_trials: [(&str, DeviceTrial); 2] = [
        ("tune::gemm_f16_odd_sizes", tune_gemm),
        ("tune::attention_f16_gqa_causal_odd_sizes", tune_attention),
    ];
    for (name, f) in tune_trials {
        let d = device.clone();
        push(&mut trials, &ignored, name.into(), Box::new(move || f(&d)));
    }
    {
        let d = device.clone();
        let exe = rocmforge_binary();
        let why = ignored.clone().or_else(|| {
            exe.is_none().then(|| {
                "the rocmforge binary is not here (stage it: cp target/release/rocmforge .gpu/bin/)"
                    .to_string()
            })
        });
        push(
            &mut trials,
            &why,
            "tune::cli_run_tune_and_cache_ls".into(),
            Box::new(move || tune_cli(&d, exe.as_deref().expect("checked above"))),
        );
    }
    {
        let d = device.clone();
        push(
            &mut trials,
            &ignored,
            "llama::tiny_kv_cache_matches_the_interpreter".into(),
            Box::new(move || llama_trials::tiny(&d)),
        );
    }
    // SmolLM2 generation against the PyTorch reference, where the model file is here.
    {
        let why = ignored.clone().or_else(llama_trials::missing);
        let d = device.clone();
        push(
            &mut trials,
            &why,
            "llama::f32_greedy_24_every_prompt".into(),
            Box::new(move || llama_trials::f32_greedy(&d)),
        );
        for (name, p) in [
            ("llama::f16_top1_and_teacher_forced", Precision::F16),
            (
                "llama::q4_f16_top1_and_teacher_forced",
                Precision::quantized(DType::F16),
            ),
        ] {
            let d = device.clone();
            push(
                &mut trials,
                &why,
                name.into(),
                Box::new(move || llama_trials::reduced(&d, p)),
            );
        }
    }
    // Linear layers on quantized weights at odd sizes, f32 and f16, both sides of the small-M
    // bound, SmolLM2's shapes and a 49152-like LM head.
    for case in quant_cases::gpu_cases() {
        let d = device.clone();
        push(
            &mut trials,
            &ignored,
            format!("quant::{}", case.name()),
            Box::new(move || check_quant(&d, case)),
        );
    }
    let edge_trials: [(&str, DeviceTrial); 6] = [
        ("quant::bound_blocks", quant_bound_blocks),
        (
            "zero_size::reductions_over_an_empty_axis",
            empty_axis_reductions,
        ),
        (
            "zero_size::attention_without_keys_or_head_size_by_hand",
            attention_without_keys_or_head_size,
        ),
        (
            "gather::out_of_range_is_the_cpu_error",
            gathers_fail_as_on_the_cpu,
        ),
        (
            "causal::offsets_near_the_i64_limits",
            causal_offsets_near_the_limits,
        ),
        (
            "launch::past_the_device_limits_is_refused",
            launch_past_the_device_limits,
        ),
    ];
    for (name, f) in edge_trials {
        let d = device.clone();
        push(&mut trials, &ignored, name.into(), Box::new(move || f(&d)));
    }
    for case in edge_cases::elementwise_edges()
        .into_iter()
        .chain(edge_cases::fused_edges())
    {
        let d = device.clone();
        let name = format!("semantics::{}", case.graph.name);
        push(
            &mut trials,
            &ignored,
            name,
            Box::new(move || edge_values(&d, &case)),
        );
    }
    for dt in DType::ALL {
        for fuse in [true, false] {
            let d = device.clone();
            push(
                &mut trials,
                &ignored,
                format!(
                    "semantics::{dt}_edge_values_bit_for_bit::{}",
                    if fuse { "fused" } else { "unfused" }
                ),
                Box::new(move || elementwise_edges_bit_for_bit(&d, dt, fuse)),
            );
        }
    }
    let shapes = [
        (1, 1, 1, 1, 1, 1, DType::F32, Mask::None, Scale::MulScores),
        (
            2,
            6,
            2,
            17,
            33,
            64,
            DType::F32,
            Mask::Causal,
            Scale::DivScores,
        ),
        (3, 4, 4, 9, 9, 32, DType::F16, Mask::Padding, Scale::OnQ),
        (
            1,
            9,
            3,
            128,
            128,
            64,
            DType::F16,
            Mask::Causal,
            Scale::MulScores,
        ),
        (
            2,
            2,
            1,
            31,
            47,
            128,
            DType::BF16,
            Mask::BoolNegInf,
            Scale::SqrtOnBoth,
        ),
        (2, 3, 3, 5, 70, 16, DType::BF16, Mask::Dense2d, Scale::None),
        (
            1,
            8,
            2,
            100,
            100,
            80,
            DType::F32,
            Mask::BoolMin,
            Scale::MulScoresLeft,
        ),
        (
            4,
            2,
            2,
            64,
            64,
            64,
            DType::F16,
            Mask::CausalTril,
            Scale::MulScores,
        ),
        // Tensor-core kernel (f16/bf16, D a multiple of 16): several key tiles, a partial last
        // tile and partial query blocks, masks, causal offsets, GQA and single-row decode.
        (
            2,
            4,
            4,
            200,
            200,
            128,
            DType::F16,
            Mask::Padding,
            Scale::OnQ,
        ),
        (
            1,
            6,
            2,
            77,
            300,
            64,
            DType::BF16,
            Mask::Causal,
            Scale::MulScores,
        ),
        (
            3,
            8,
            1,
            1,
            129,
            32,
            DType::F16,
            Mask::None,
            Scale::DivScores,
        ),
        (
            1,
            2,
            2,
            130,
            65,
            96,
            DType::F16,
            Mask::BoolMin,
            Scale::MulScores,
        ),
    ];
    for (i, (b, hq, hkv, sq, sk, d, dtype, mask, scale)) in shapes.into_iter().enumerate() {
        let spec = Spec {
            b,
            hq,
            hkv,
            sq,
            sk,
            d,
            dtype,
            mask,
            scale,
            cast_softmax: dtype != DType::F32,
            offset: if sq < sk { (sk - sq) as i64 } else { 0 },
            ..Spec::new(b, hq, sq, d)
        };
        let dev = device.clone();
        push(
            &mut trials,
            &ignored,
            format!("attention::{i}::{dtype}::{mask:?}"),
            Box::new(move || check_attention(&dev, spec, 10 + i as u64)),
        );
    }
    attention_mma_trials::trials(&device, &ignored, &mut trials);
    poison_trials::trials(&device, &ignored, &mut trials);
    for (i, (name, spec)) in f32_attention_specs().into_iter().enumerate() {
        let dev = device.clone();
        push(
            &mut trials,
            &ignored,
            format!("attention_f32::{name}"),
            Box::new(move || check_attention(&dev, spec, 70 + i as u64)),
        );
    }
    for (i, (name, g)) in chains().into_iter().enumerate() {
        let d = device.clone();
        push(
            &mut trials,
            &ignored,
            format!("attention_chain::{name}"),
            Box::new(move || check_chain(&d, &g, 40 + i as u64)),
        );
    }
    for (dtype, min_cos) in [(DType::F32, 0.9999), (DType::F16, 0.999)] {
        let name = format!("minilm::{dtype}_matches_pytorch");
        match minilm_dir() {
            Some(dir) => {
                let d = device.clone();
                push(
                    &mut trials,
                    &ignored,
                    name,
                    Box::new(move || minilm_matches_reference(&d, &dir, dtype, min_cos)),
                );
            }
            None if ignored.is_none() => trials.push(
                Trial::test(name, || Ok(()))
                    .with_ignored_flag(true)
                    .with_kind(
                        "ignored: all-MiniLM-L6-v2 not in the model cache (scripts/fetch-models)",
                    ),
            ),
            None => push(&mut trials, &ignored, name, Box::new(|| Ok(()))),
        }
    }

    // The matrix atoms of the device's target, each through its probe kernel.
    match device.target().map(|t| t.caps.mma) {
        Some(atoms) => {
            for &atom in atoms {
                let d = device.clone();
                push(
                    &mut trials,
                    &ignored,
                    format!("mma::{}::exact_product", atom.name),
                    Box::new(move || mma_atom_probe(&d, atom)),
                );
            }
        }
        None => push(
            &mut trials,
            &ignored,
            "mma::atoms_of_the_device".into(),
            Box::new(|| Ok(())),
        ),
    }

    // The graphs benches/gemm.rs times, at sizes no tile divides.
    for (m, n, k) in [
        (1, 384, 384),
        (17, 1536, 384),
        (17, 384, 1536),
        (17, 192, 576),
    ] {
        for dtype in [DType::F16, DType::BF16, DType::F32] {
            for bias_gelu in [false, true] {
                let d = device.clone();
                push(
                    &mut trials,
                    &ignored,
                    format!(
                        "gemm::linear_M{m}_N{n}_K{k}_{dtype}{}",
                        if bias_gelu { "_bias_gelu" } else { "" }
                    ),
                    Box::new(move || {
                        linear_layer_matches_interpreter(&d, (m, n, k), dtype, bias_gelu)
                    }),
                );
            }
        }
    }
    // Sessions: warm runs against run and the interpreter, replay, threads, drop order.
    for name in session_trials::GRAPHS {
        let d = device.clone();
        push(
            &mut trials,
            &ignored,
            format!("session::warm_matches_run::{name}"),
            Box::new(move || session_trials::warm_session_matches_run(&d, name)),
        );
    }
    for replay in [true, false] {
        let d = device.clone();
        push(
            &mut trials,
            &ignored,
            format!(
                "session::device_scalar_loop::{}",
                if replay { "replay" } else { "plain" }
            ),
            Box::new(move || session_trials::device_scalar_loop(&d, replay)),
        );
    }
    let session_device_trials: [(&str, DeviceTrial); 3] = [
        (
            "session::many_sessions_on_threads",
            session_trials::sessions_on_threads,
        ),
        (
            "session::warm_runs_allocate_nothing",
            session_trials::warm_runs_allocate_nothing,
        ),
        (
            "session::buffers_outlive_the_graph",
            session_trials::buffers_outlive_the_graph,
        ),
    ];
    for (name, f) in session_device_trials {
        let d = device.clone();
        push(&mut trials, &ignored, name.into(), Box::new(move || f(&d)));
    }
    // Replay bundles: the example graphs from their code objects (states and quantized weights
    // included), the decode step with its KV cache, the op zoo (odd sizes, every dtype, gathers
    // with index checks) recompiled from the bundle's sources.
    let d = device.clone();
    push(
        &mut trials,
        &ignored,
        "bundle::replay::decode_step_small".into(),
        Box::new(move || bundle_replays(&d, &decode_step::SMALL.decode_step(), false)),
    );
    for path in files::graph_files() {
        let (d, p) = (device.clone(), path.clone());
        push(
            &mut trials,
            &ignored,
            format!(
                "bundle::replay::{}",
                p.file_stem().unwrap().to_string_lossy()
            ),
            Box::new(move || {
                bundle_replays(&d, &format::load(&p).map_err(|e| e.to_string())?, false)
            }),
        );
    }
    for g in op_zoo::zoo() {
        let d = device.clone();
        push(
            &mut trials,
            &ignored,
            format!("bundle::replay_recompiled::{}", g.name),
            Box::new(move || bundle_replays(&d, &g, true)),
        );
    }
    let d = device.clone();
    push(
        &mut trials,
        &ignored,
        "profile::hold_keeps_the_stream_until_released".into(),
        Box::new(move || hold_keeps_the_stream_until_released(&d)),
    );
    let d = device.clone();
    push(
        &mut trials,
        &ignored,
        "bundle::unloadable_code_object_falls_back_to_source".into(),
        Box::new(move || {
            let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("graphs/attention_causal.json");
            bundle_falls_back_to_source(&d, &format::load(&p).map_err(|e| e.to_string())?)
        }),
    );
    let d = device.clone();
    push(
        &mut trials,
        &ignored,
        "profile::times_every_kernel_of_the_plan".into(),
        Box::new(move || profile_times_every_kernel(&d)),
    );
    let d = device.clone();
    push(
        &mut trials,
        &ignored,
        "bundle::first_mismatch_names_its_kernel".into(),
        Box::new(move || {
            let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("graphs/llama_block.json");
            bundle_names_first_mismatch(&d, &format::load(&p).map_err(|e| e.to_string())?)
        }),
    );

    let spec = device.spec().to_string();
    let s2 = spec.clone();
    push(
        &mut trials,
        &ignored,
        "stress::16_threads_x_25_iterations".into(),
        Box::new(move || stress(&s2)),
    );
    let d = device.clone();
    push(
        &mut trials,
        &ignored,
        "run::unused_input_is_bound_but_not_uploaded".into(),
        Box::new(move || unused_input_runs(&d)),
    );
    let d = device.clone();
    push(
        &mut trials,
        &ignored,
        "verify::nan_and_inf_at_the_same_places".into(),
        Box::new(move || verify_with_non_finite_outputs(&d)),
    );
    let d = device.clone();
    push(
        &mut trials,
        &ignored,
        "device::ordinal_past_the_last_gpu".into(),
        Box::new(move || ordinal_past_the_last_gpu(&d)),
    );
    let d = device.clone();
    push(
        &mut trials,
        &ignored,
        "poison::planted_bug_is_caught".into(),
        Box::new(move || planted_bug_is_caught(&d)),
    );
    let d = device.clone();
    push(
        &mut trials,
        &ignored,
        "memory::returns_to_baseline".into(),
        Box::new(move || memory_returns_to_baseline(&d)),
    );
    push(
        &mut trials,
        &ignored,
        "cache::disk_across_processes".into(),
        Box::new(move || disk_cache_across_processes(&spec)),
    );
    // The GEMM kernels (issue 12): small-M decode (M ≤ 16) and the CUDA-core kernel, at odd and
    // model sizes, both weight layouts, bias + SiLU, batches, every float dtype.
    for case in gemm_small_cases::small_m()
        .into_iter()
        .chain(gemm_small_cases::large_m())
    {
        let d = device.clone();
        push(
            &mut trials,
            &ignored,
            format!("gemm::{}", case.name()),
            Box::new(move || check_graph(&d, &case.graph(), false, 8)),
        );
    }
    for (i, case) in decode_cases::gpu_cases().into_iter().enumerate() {
        let d = device.clone();
        push(
            &mut trials,
            &ignored,
            format!("decode::{}", case.name()),
            Box::new(move || check_decode(&d, case, 300 + i as u64)),
        );
    }
    for (i, case) in kv_cases::gpu_cases().into_iter().enumerate() {
        let d = device.clone();
        push(
            &mut trials,
            &ignored,
            format!("decops::kv::{}", case.name()),
            Box::new(move || check_kv(&d, case, 500 + i as u64)),
        );
    }
    let d = device.clone();
    push(
        &mut trials,
        &ignored,
        "decops::cache_write_bounds".into(),
        Box::new(move || check_cache_write_bounds(&d)),
    );
    let d = device.clone();
    push(
        &mut trials,
        &ignored,
        "decops::argmax".into(),
        Box::new(move || check_argmax(&d)),
    );
    let (shim, hip) = hipshim::device(&device);
    hip_trials(&mut trials, &device, &shim, &hip);
    trials.push(Trial::test(
        "hip::shim::exports_every_entry_point_rocmforge_binds",
        hip_shim_binds,
    ));
    let conclusion = libtest_mimic::run(&args, trials);
    hipshim::remove(shim);
    conclusion.exit();
}
