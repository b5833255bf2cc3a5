//! Fused attention against the interpreter: random shapes, f32 attention on the CUDA-core kernel, attention written step by step.

use crate::common::attention_graphs::{build, promoted_to_f32, Chain, Mask, Scale, Spec, Step};
use crate::harness::*;
use libtest_mimic::{Failed, Trial};
use rocmforge::compile::CompileOptions;
use rocmforge::interp::{run, Bindings};
use rocmforge::ir::{DType, Graph, Tensor};
use rocmforge::runtime::Device;

/// Fused low-precision attention against the f32 graph on the same rounded inputs.
pub fn check_attention(device: &Device, spec: Spec, seed: u64) -> Result<(), Failed> {
    check_attention_with(device, spec, seed, options())
}

/// Fused attention compiled with `opts` against the f32 graph on the same rounded inputs;
/// returns the family and source of each kernel of the plan that ran, for trials that must
/// know which kernel computed the result.
pub fn check_attention_plan(
    device: &Device,
    spec: Spec,
    seed: u64,
    opts: CompileOptions,
) -> Result<Vec<(&'static str, String)>, Failed> {
    check_attention_plan_within(device, spec, seed, opts, tolerance(spec.dtype))
}

/// [`check_attention_plan`] held to relative L2 `tol` (TF32 runs: `TF32_REL_L2`).
pub fn check_attention_plan_within(
    device: &Device,
    spec: Spec,
    seed: u64,
    opts: CompileOptions,
    tol: f64,
) -> Result<Vec<(&'static str, String)>, Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let g = build(&spec);
    let c = Graph::compile_with(&g, device, &opts).map_err(|e| e.to_string())?;
    let b = Bindings::random(&g, seed);
    let got = c.run(&b).map_err(|e| e.to_string())?.remove(0);
    let kernels = c
        .plan()
        .map(|p| {
            p.kernels
                .iter()
                .map(|k| (k.family, k.body.clone()))
                .collect()
        })
        .unwrap_or_default();
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
    let err = compare(&got.cast(DType::F32), &want, tol, &format!("{spec:?}"))?;
    if err > tol {
        return Err(format!("{spec:?}: relative L2 {err:e}").into());
    }
    Ok(kernels)
}

/// [`check_attention_plan`] where the kernels that ran do not matter.
pub fn check_attention_with(
    device: &Device,
    spec: Spec,
    seed: u64,
    opts: CompileOptions,
) -> Result<(), Failed> {
    check_attention_plan(device, spec, seed, opts).map(|_| ())
}

/// Runs `g`'s first output on `b` and compares it with the f32 reference `want` within
/// `dtype`'s tolerance; returns it and a description naming the case and the plan's kernels.
pub fn first_output_within_tolerance(
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
    let err = compare(&got.cast(DType::F32), want, tolerance(dtype), &what)?;
    if err > tolerance(dtype) {
        return Err(format!("{what}: relative L2 {err:e}").into());
    }
    Ok((got, what))
}

/// f32 attention for the CUDA-core kernel (`attention/simt.rs`): every head size it tiles
/// differently (1, 32, 64, 80, 128, 256), sizes past its tiles, additive and boolean masks,
/// causal offsets either way (with Sq > Sk and a negative offset the first rows see no key and
/// must be zeros), GQA with three query heads per K/V head, and single-query decode.
pub fn f32_attention_specs() -> Vec<(&'static str, Spec)> {
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
pub fn check_chain(device: &Device, g: &Graph, seed: u64) -> Result<(), Failed> {
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
    let err = compare(&got.cast(DType::F32), &want, tolerance(dt), &g.name)?;
    if err > tolerance(dt) {
        return Err(format!("{}: relative L2 {err:e}", g.name).into());
    }
    Ok(())
}

/// Attention forms fused since issue 11: fairseq's scores viewed 4-D for the key padding mask,
/// a split other than [B, H] with a mask over part of it, old GPT-2's head-split K, f16 scale
/// constants at their f16 value with an f32 mask, a written-out softmax left dead.
pub fn chains() -> Vec<(&'static str, Graph)> {
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

/// Fused attention at random shapes, the MMA kernels, f32 attention and attention chains.
pub fn trials(device: &Device, ignored: &Option<String>, trials: &mut Vec<Trial>) {
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
            trials,
            ignored,
            format!("attention::{i}::{dtype}::{mask:?}"),
            Box::new(move || check_attention(&dev, spec, 10 + i as u64)),
        );
    }
    crate::attention_mma::trials(device, ignored, trials);
    for (i, (name, spec)) in f32_attention_specs().into_iter().enumerate() {
        let dev = device.clone();
        push(
            trials,
            ignored,
            format!("attention_f32::{name}"),
            Box::new(move || check_attention(&dev, spec, 70 + i as u64)),
        );
    }
    for (i, (name, g)) in chains().into_iter().enumerate() {
        let d = device.clone();
        push(
            trials,
            ignored,
            format!("attention_chain::{name}"),
            Box::new(move || check_chain(&d, &g, 40 + i as u64)),
        );
    }
}
