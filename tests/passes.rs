//! The passes: every attention form models export fuses into exactly the expected
//! FlashAttention and computes what the unfused graph computes; every unsafe form is refused
//! with its reason; recognition and clean-up passes rewrite what they claim and nothing else.

mod common;

use common::attention_graphs::{build, Mask, Scale, Spec};
use common::rel_l2;
use rocmforge::interp::{run, Bindings};
use rocmforge::ir::{Attention, DType, Graph, MaskKind, Op, UnaryOp};
use rocmforge::passes::{optimize, PassReport};

#[path = "common/accuracy.rs"]
mod accuracy;
use accuracy::tolerance;

/// Optimises `g`, checks fused = unfused in the interpreter, returns the fused graph and reports.
fn fuse_and_compare(g: &Graph, seed: u64) -> (Graph, Vec<PassReport>) {
    let (fused, reports) = optimize(g).unwrap();
    let b = Bindings::random(g, seed);
    let want = run(g, &b).unwrap();
    let got = run(&fused, &b).unwrap();
    for (w, o) in want.iter().zip(&got) {
        assert_eq!(w.ty(), o.ty());
        let (w, o) = (w.to_f64_vec(), o.to_f64_vec());
        assert!(o.iter().all(|x| !x.is_nan()), "fused output has NaN");
        assert!(w.iter().all(|x| !x.is_nan()), "unfused output has NaN");
        let err = rel_l2(&o, &w);
        let dt = g.ty(g.outputs()[0]).dtype;
        assert!(
            err <= tolerance(dt),
            "fused vs unfused rel L2 {err:e} ({dt})"
        );
    }
    (fused, reports)
}

fn attention_nodes(g: &Graph) -> Vec<(Attention, Vec<Vec<usize>>)> {
    g.node_ids()
        .filter_map(|id| match g.op(id) {
            Op::FlashAttention(a) => Some((
                a.clone(),
                g.operands(id)
                    .iter()
                    .map(|&o| g.ty(o).shape.dims().to_vec())
                    .collect(),
            )),
            _ => None,
        })
        .collect()
}

/// Fuses the graph of `spec` and checks it against the reference the design defines: the f32
/// interpreter. For f32 that is the unfused graph itself; for f16/bf16 it is the same attention
/// built in f32 and run on the same (already rounded) inputs, since the unfused low-precision
/// graph rounds every intermediate and is the less accurate of the two.
fn fuse_spec(spec: &Spec, seed: u64) -> Graph {
    if spec.dtype == DType::F32 {
        return fuse_and_compare(&build(spec), seed).0;
    }
    let g = build(spec);
    let (fused, _) = optimize(&g).unwrap();
    let b = Bindings::random(&g, seed);
    let reference = build(&Spec {
        dtype: DType::F32,
        cast_softmax: false,
        ..*spec
    });
    let mut rb = Bindings::default();
    for (name, t) in &b.inputs {
        let t32 = if t.dtype().is_float() {
            t.cast(DType::F32)
        } else {
            t.clone()
        };
        rb.inputs.insert(name.clone(), t32);
    }
    let want = run(&reference, &rb).unwrap()[0].to_f64_vec();
    let got = run(&fused, &b).unwrap()[0].to_f64_vec();
    assert!(got.iter().all(|x| !x.is_nan()), "fused output has NaN");
    let err = rel_l2(&got, &want);
    assert!(
        err <= tolerance(spec.dtype),
        "fused {} vs f32 reference: rel L2 {err:e} for {spec:?}",
        spec.dtype
    );
    fused
}

/// Exactly one FlashAttention with the expected attributes and K/V heads.
fn assert_fused(spec: &Spec, mask: MaskKind, causal: bool) -> Graph {
    let fused = fuse_spec(spec, 7);
    let fa = attention_nodes(&fused);
    assert_eq!(
        fa.len(),
        1,
        "expected one flash_attention for {spec:?}:\n{}",
        rocmforge::ir::to_text(&fused).unwrap()
    );
    let (att, shapes) = &fa[0];
    assert!(
        // One f32 rounding apart at most: what f32 kernels make of either is the same number.
        (att.scale - spec.held_scale_value()).abs() <= 1.2e-7 * spec.scale_value(),
        "scale {} for {spec:?}",
        att.scale
    );
    assert_eq!(att.mask, mask, "{spec:?}");
    assert_eq!(att.causal, causal, "{spec:?}");
    if causal {
        assert_eq!(att.causal_offset, spec.offset);
    }
    if !spec.rank3 {
        assert_eq!(shapes[1][1], spec.hkv, "k must be read un-expanded");
        assert_eq!(shapes[0][1], spec.hq);
    }
    assert!(
        !fused
            .node_ids()
            .any(|id| matches!(fused.op(id), Op::Softmax { .. })),
        "softmax left behind"
    );
    fused
}

fn assert_refused(g: &Graph, code: &str) {
    let (fused, reports) = optimize(g).unwrap();
    assert!(
        attention_nodes(&fused).is_empty(),
        "must not fuse:\n{}",
        rocmforge::ir::to_text(&fused).unwrap()
    );
    let skipped: Vec<_> = reports
        .iter()
        .filter(|r| r.pass == "fuse_attention")
        .flat_map(|r| r.skipped.clone())
        .collect();
    assert!(
        skipped.iter().any(|s| s.code == code),
        "expected reason {code}, got {skipped:?}"
    );
    // Left alone, the graph still computes the same thing.
    let b = Bindings::random(g, 1);
    let (w, o) = (run(g, &b).unwrap(), run(&fused, &b).unwrap());
    assert!(rel_l2(&o[0].to_f64_vec(), &w[0].to_f64_vec()) <= 1e-5);
}

// ---- every variant fuses -----------------------------------------------------------------

#[test]
fn scale_forms_fuse() {
    for scale in [
        Scale::MulScores,
        Scale::MulScoresLeft,
        Scale::DivScores,
        Scale::OnQ,
        Scale::SqrtOnBoth,
    ] {
        let spec = Spec {
            scale,
            ..Spec::new(2, 3, 17, 8)
        };
        assert_fused(&spec, MaskKind::None, false);
    }
}

#[test]
fn no_scale_fuses_with_scale_one() {
    let spec = Spec {
        scale: Scale::None,
        ..Spec::new(1, 2, 9, 16)
    };
    let (fused, _) = fuse_and_compare(&build(&spec), 3);
    let fa = attention_nodes(&fused);
    assert_eq!(fa.len(), 1);
    assert_eq!(fa[0].0.scale, 1.0);
}

#[test]
fn k_already_transposed_fuses() {
    let spec = Spec {
        k_pretransposed: true,
        ..Spec::new(2, 2, 13, 8)
    };
    assert_fused(&spec, MaskKind::None, false);
}

#[test]
fn additive_masks_of_broadcastable_shapes_fuse() {
    for mask in [Mask::Padding, Mask::Dense2d, Mask::PerHead] {
        let spec = Spec {
            mask,
            ..Spec::new(2, 3, 11, 8)
        };
        assert_fused(&spec, MaskKind::Additive, false);
    }
}

#[test]
fn boolean_masks_fuse() {
    let spec = Spec {
        mask: Mask::BoolNegInf,
        ..Spec::new(2, 2, 9, 8)
    };
    assert_fused(&spec, MaskKind::Boolean, false);
    // A finite dtype-min fill keeps fully masked rows uniform: it becomes an additive mask.
    let spec = Spec {
        mask: Mask::BoolMin,
        ..Spec::new(2, 2, 9, 8)
    };
    assert_fused(&spec, MaskKind::Additive, false);
}

#[test]
fn causal_masks_fuse() {
    for mask in [Mask::Causal, Mask::CausalTril] {
        let spec = Spec {
            mask,
            ..Spec::new(1, 2, 16, 8)
        };
        assert_fused(&spec, MaskKind::None, true);
        let spec = Spec {
            mask,
            sq: 4,
            sk: 12,
            offset: 8,
            ..Spec::new(1, 2, 16, 8)
        };
        assert_fused(&spec, MaskKind::None, true);
    }
}

#[test]
fn casts_around_softmax_are_absorbed() {
    for dtype in [DType::F16, DType::BF16] {
        let spec = Spec {
            dtype,
            cast_softmax: true,
            mask: Mask::Padding,
            ..Spec::new(2, 2, 16, 8)
        };
        let fused = assert_fused(&spec, MaskKind::Additive, false);
        assert!(
            !fused
                .node_ids()
                .any(|id| matches!(fused.op(id), Op::Cast { .. })),
            "casts left behind"
        );
    }
}

#[test]
fn gqa_and_mqa_read_unexpanded_kv() {
    let spec = Spec {
        hq: 6,
        hkv: 2,
        mask: Mask::Causal,
        ..Spec::new(2, 6, 10, 8)
    };
    assert_fused(&spec, MaskKind::None, true);
    let spec = Spec {
        hq: 4,
        hkv: 1,
        ..Spec::new(1, 4, 7, 16)
    };
    assert_fused(&spec, MaskKind::None, false);
}

#[test]
fn three_d_batched_form_fuses() {
    let spec = Spec {
        rank3: true,
        ..Spec::new(2, 3, 9, 8)
    };
    assert_fused(&spec, MaskKind::None, false);
    let spec = Spec {
        rank3: true,
        mask: Mask::BoolNegInf,
        ..Spec::new(2, 3, 9, 8)
    };
    assert_fused(&spec, MaskKind::Boolean, false);
}

#[test]
fn fully_masked_rows_give_zeros_fused_and_unfused() {
    // Sq > Sk with a negative causal offset: the first query rows see no key.
    let spec = Spec {
        mask: Mask::Causal,
        sq: 8,
        sk: 5,
        offset: -3,
        ..Spec::new(1, 2, 8, 4)
    };
    let g = build(&spec);
    let (fused, _) = fuse_and_compare(&g, 5);
    assert_eq!(attention_nodes(&fused).len(), 1);
    let out = run(&fused, &Bindings::random(&g, 5))
        .unwrap()
        .remove(0)
        .to_f64_vec();
    let row = 4; // D
    assert!(
        out[..3 * row].iter().all(|&x| x == 0.0),
        "rows 0..3 of head 0 see no key"
    );
    // A boolean mask input whose row is all false (random bools make some).
    let spec = Spec {
        mask: Mask::BoolNegInf,
        ..Spec::new(1, 1, 6, 4)
    };
    let g = build(&spec);
    let mut b = Bindings::random(&g, 2);
    let mut vals = vec![true; 36];
    vals[6..12].iter_mut().for_each(|v| *v = false);
    b.inputs.insert(
        "mask".into(),
        rocmforge::ir::Tensor::from_bool(vec![1, 1, 6, 6], &vals).unwrap(),
    );
    let (fused, _) = optimize(&g).unwrap();
    let (w, o) = (
        run(&g, &b).unwrap()[0].to_f64_vec(),
        run(&fused, &b).unwrap()[0].to_f64_vec(),
    );
    assert!(
        o[4..8].iter().all(|&x| x == 0.0) && w[4..8].iter().all(|&x| x == 0.0),
        "{:?} / {:?}",
        &o[4..8],
        &w[4..8]
    );
    assert!(rel_l2(&o, &w) <= 1e-5);
}

// ---- and every unsafe form is refused, with its reason -------------------------------------

#[test]
fn scores_or_probabilities_used_elsewhere_do_not_fuse() {
    for which in ["scores", "probs"] {
        let mut g = build(&Spec::new(1, 2, 8, 4));
        let out = g.find("out").unwrap();
        let p = g.operands(out)[0];
        let node = if which == "probs" {
            p
        } else {
            g.operands(p)[0]
        };
        g.add_output(node).unwrap();
        assert_refused(&g, "intermediate_has_other_consumers");
    }
}

#[test]
fn softmax_over_another_axis_does_not_fuse() {
    let mut g = Graph::new("axis");
    let q = g.input("q", DType::F32, &[1, 2, 8, 8]).unwrap();
    let k = g.input("k", DType::F32, &[1, 2, 8, 8]).unwrap();
    let v = g.input("v", DType::F32, &[1, 2, 8, 8]).unwrap();
    let kt = g.transpose_last(k).unwrap();
    let s = g.matmul(q, kt).unwrap();
    let p = g.softmax(s, -2).unwrap();
    let o = g.matmul(p, v).unwrap();
    g.add_output(o).unwrap();
    assert_refused(&g, "softmax_axis");
}

#[test]
fn k_permutation_other_than_last_swap_does_not_fuse() {
    // [B, H, S, D] with B = H: swapping B and H too still type-checks.
    let mut g = Graph::new("perm");
    let q = g.input("q", DType::F32, &[2, 2, 8, 8]).unwrap();
    let k = g.input("k", DType::F32, &[2, 2, 8, 8]).unwrap();
    let v = g.input("v", DType::F32, &[2, 2, 8, 8]).unwrap();
    let kt = g.permute(k, &[1, 0, 3, 2]).unwrap();
    let s = g.matmul(q, kt).unwrap();
    let p = g.softmax(s, -1).unwrap();
    let o = g.matmul(p, v).unwrap();
    g.add_output(o).unwrap();
    assert_refused(&g, "k_permutation");
}

#[test]
fn non_constant_scale_does_not_fuse() {
    let mut g = Graph::new("scale");
    let q = g.input("q", DType::F32, &[1, 2, 8, 4]).unwrap();
    let k = g.input("k", DType::F32, &[1, 2, 8, 4]).unwrap();
    let v = g.input("v", DType::F32, &[1, 2, 8, 4]).unwrap();
    let t = g.input("temperature", DType::F32, &[1]).unwrap();
    let kt = g.transpose_last(k).unwrap();
    let s = g.matmul(q, kt).unwrap();
    let s = g.mul(s, t).unwrap();
    let p = g.softmax(s, -1).unwrap();
    let o = g.matmul(p, v).unwrap();
    g.add_output(o).unwrap();
    assert_refused(&g, "scale_not_constant_scalar");
}

#[test]
fn mask_that_broadcasts_the_scores_does_not_fuse() {
    let mut g = Graph::new("bcast");
    let q = g.input("q", DType::F32, &[1, 2, 8, 4]).unwrap();
    let k = g.input("k", DType::F32, &[1, 2, 8, 4]).unwrap();
    let v = g.input("v", DType::F32, &[1, 2, 8, 4]).unwrap();
    let m = g.input("mask", DType::F32, &[3, 1, 1, 8]).unwrap(); // batch 3 over batch 1
    let kt = g.transpose_last(k).unwrap();
    let s = g.matmul(q, kt).unwrap();
    let s = g.add(s, m).unwrap();
    let p = g.softmax(s, -1).unwrap();
    let o = g.matmul(p, v).unwrap();
    g.add_output(o).unwrap();
    assert_refused(&g, "mask_broadcast");
}

#[test]
fn v_broadcast_over_batch_does_not_fuse() {
    let mut g = Graph::new("vb");
    let q = g.input("q", DType::F32, &[2, 2, 8, 4]).unwrap();
    let k = g.input("k", DType::F32, &[2, 2, 8, 4]).unwrap();
    let v = g.input("v", DType::F32, &[1, 2, 8, 4]).unwrap();
    let kt = g.transpose_last(k).unwrap();
    let s = g.matmul(q, kt).unwrap();
    let p = g.softmax(s, -1).unwrap();
    let o = g.matmul(p, v).unwrap();
    g.add_output(o).unwrap();
    assert_refused(&g, "batch_broadcast");
}

#[test]
fn scale_after_additive_mask_does_not_fuse() {
    let mut g = Graph::new("late_scale");
    let q = g.input("q", DType::F32, &[1, 2, 8, 4]).unwrap();
    let k = g.input("k", DType::F32, &[1, 2, 8, 4]).unwrap();
    let v = g.input("v", DType::F32, &[1, 2, 8, 4]).unwrap();
    let m = g.input("mask", DType::F32, &[8, 8]).unwrap();
    let kt = g.transpose_last(k).unwrap();
    let s = g.matmul(q, kt).unwrap();
    let s = g.add(s, m).unwrap();
    let c = g.scalar(0.5, DType::F32).unwrap();
    let s = g.mul(s, c).unwrap();
    let p = g.softmax(s, -1).unwrap();
    let o = g.matmul(p, v).unwrap();
    g.add_output(o).unwrap();
    assert_refused(&g, "scale_after_mask");
}

fn where_attention(fill: f64, masked_fill: bool) -> Graph {
    let mut g = Graph::new("where");
    let q = g.input("q", DType::F32, &[1, 2, 8, 4]).unwrap();
    let k = g.input("k", DType::F32, &[1, 2, 8, 4]).unwrap();
    let v = g.input("v", DType::F32, &[1, 2, 8, 4]).unwrap();
    let m = g.input("mask", DType::F32, &[1, 1, 8, 8]).unwrap();
    let kt = g.transpose_last(k).unwrap();
    let s = g.matmul(q, kt).unwrap();
    let f = g.scalar(fill, DType::F32).unwrap();
    let zero = g.scalar(0.0, DType::F32).unwrap();
    let s = if masked_fill {
        // scores.masked_fill(mask == 0, fill)
        let c = g.equal(m, zero).unwrap();
        g.where_(c, f, s).unwrap()
    } else {
        let c = g.greater(m, zero).unwrap();
        g.where_(c, s, f).unwrap()
    };
    let p = g.softmax(s, -1).unwrap();
    let o = g.matmul(p, v).unwrap();
    g.add_output(o).unwrap();
    g
}

#[test]
fn masked_fill_form_fuses_as_a_boolean_mask() {
    for fill in [f64::NEG_INFINITY, DType::F32.min_value()] {
        let g = where_attention(fill, true);
        let mut b = Bindings::random(&g, 4);
        // A 0/1 mask with a fully masked query row.
        let vals: Vec<f64> = (0..64)
            .map(|i| {
                if i / 8 == 2 {
                    0.0
                } else {
                    f64::from(u8::from(i % 3 != 0))
                }
            })
            .collect();
        b.inputs.insert(
            "mask".into(),
            rocmforge::ir::Tensor::from_f64(DType::F32, vec![1, 1, 8, 8], &vals).unwrap(),
        );
        let (fused, _) = optimize(&g).unwrap();
        assert_eq!(
            attention_nodes(&fused).len(),
            1,
            "{}",
            rocmforge::ir::to_text(&fused).unwrap()
        );
        let (w, o) = (
            run(&g, &b).unwrap()[0].to_f64_vec(),
            run(&fused, &b).unwrap()[0].to_f64_vec(),
        );
        assert!(rel_l2(&o, &w) <= 1e-5, "fill {fill}: {}", rel_l2(&o, &w));
    }
}

#[test]
fn where_with_another_fill_does_not_fuse() {
    for masked_fill in [false, true] {
        let (fused, reports) = optimize(&where_attention(-1e4, masked_fill)).unwrap();
        assert!(attention_nodes(&fused).is_empty());
        assert!(
            reports
                .iter()
                .flat_map(|r| &r.skipped)
                .any(|s| s.code == "fill_not_neg_inf"),
            "{reports:?}"
        );
    }
}

// ---- recognition ----------------------------------------------------------------------------

fn count(g: &Graph, pred: impl Fn(&Op) -> bool) -> usize {
    g.node_ids().filter(|&id| pred(g.op(id))).count()
}

#[test]
fn decomposed_softmax_is_recognised_on_its_axis_only() {
    use rocmforge::ir::ReduceOp;
    for (shift, max_axis, sum_axis, fuses) in [
        (true, -1, -1, true),
        (false, -1, -1, true),
        (true, 1, 1, true),
        (true, 0, -1, false),
    ] {
        let mut g = Graph::new("sm");
        let x = g.input("x", DType::F32, &[3, 5, 7]).unwrap();
        let t = if shift {
            let m = g.reduce(ReduceOp::Max, x, &[max_axis], true).unwrap();
            g.sub(x, m).unwrap()
        } else {
            x
        };
        let e = g.exp(t).unwrap();
        let s = g.reduce(ReduceOp::Sum, e, &[sum_axis], true).unwrap();
        let y = g.div(e, s).unwrap();
        g.add_output(y).unwrap();
        let (fused, reports) = fuse_and_compare(&g, 1);
        assert_eq!(
            count(&fused, |o| matches!(o, Op::Softmax { .. })),
            usize::from(fuses),
            "{shift} {max_axis} {sum_axis}"
        );
        if !fuses {
            assert!(reports
                .iter()
                .flat_map(|r| &r.skipped)
                .any(|s| s.code == "axis_mismatch"));
        }
    }
}

#[test]
fn dead_consumers_do_not_block_softmax_recognition() {
    use rocmforge::ir::ReduceOp;
    use rocmforge::passes::{Pass, RecognizeSoftmax};
    let mut g = Graph::new("sm_dead");
    let x = g.input("x", DType::F32, &[3, 7]).unwrap();
    let m = g.reduce(ReduceOp::Max, x, &[-1], true).unwrap();
    let t = g.sub(x, m).unwrap();
    let e = g.exp(t).unwrap();
    let s = g.reduce(ReduceOp::Sum, e, &[-1], true).unwrap();
    let y = g.div(e, s).unwrap();
    // Left over from an earlier rewrite: reads the exp and the max, feeds no output.
    let dead = g.mul(e, m).unwrap();
    g.rename(dead, "dead").unwrap();
    g.add_output(y).unwrap();
    let mut r = g.clone();
    let report = RecognizeSoftmax.run(&mut r);
    assert_eq!(report.rewrites.len(), 1, "{report}");
    let b = Bindings::random(&g, 1);
    let (w, o) = (run(&g, &b).unwrap(), run(&r, &b).unwrap());
    assert!(rel_l2(&o[0].to_f64_vec(), &w[0].to_f64_vec()) <= 1e-6);
}

#[test]
fn decomposed_layer_norm_and_rms_norm_are_recognised() {
    use rocmforge::ir::ReduceOp;
    for (square_by_pow, affine) in [(true, true), (false, true), (true, false)] {
        let mut g = Graph::new("ln");
        let x = g.input("x", DType::F32, &[4, 33]).unwrap();
        let mu = g.reduce(ReduceOp::Mean, x, &[-1], true).unwrap();
        let c = g.sub(x, mu).unwrap();
        let sq = if square_by_pow {
            let two = g.scalar(2.0, DType::F32).unwrap();
            g.pow(c, two).unwrap()
        } else {
            g.mul(c, c).unwrap()
        };
        let var = g.reduce(ReduceOp::Mean, sq, &[-1], true).unwrap();
        let eps = g.scalar(1e-5, DType::F32).unwrap();
        let ve = g.add(var, eps).unwrap();
        let r = g.rsqrt(ve).unwrap();
        let mut y = g.mul(c, r).unwrap();
        if affine {
            let w = g.weight("w", DType::F32, &[33]).unwrap();
            let b = g.weight("b", DType::F32, &[33]).unwrap();
            y = g.mul(y, w).unwrap();
            y = g.add(y, b).unwrap();
        }
        g.add_output(y).unwrap();
        let (fused, _) = fuse_and_compare(&g, 2);
        assert_eq!(
            count(&fused, |o| matches!(o, Op::LayerNorm { .. })),
            1,
            "{}",
            rocmforge::ir::to_text(&fused).unwrap()
        );
    }
    let g = rocmforge::ir::format::load(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/graphs/llama_block.json"
    )))
    .unwrap();
    let (fused, _) = fuse_and_compare(&g, 3);
    assert_eq!(count(&fused, |o| matches!(o, Op::RmsNorm { .. })), 2);
}

#[test]
fn silu_and_gelu_forms_are_recognised() {
    // x·sigmoid(x), both orders
    for left in [true, false] {
        let mut g = Graph::new("silu");
        let x = g.input("x", DType::F32, &[5, 17]).unwrap();
        let s = g.sigmoid(x).unwrap();
        let y = if left {
            g.mul(x, s).unwrap()
        } else {
            g.mul(s, x).unwrap()
        };
        g.add_output(y).unwrap();
        let (fused, _) = fuse_and_compare(&g, 4);
        assert_eq!(count(&fused, |o| *o == Op::Unary(UnaryOp::Silu)), 1);
    }
    // 0.5·x·(1 + erf(x/√2)) in HF's order, and x·0.5·(...)
    for nest in 0..2 {
        let mut g = Graph::new("gelu");
        let x = g.input("x", DType::F32, &[5, 17]).unwrap();
        let r2 = g.scalar(2f64.sqrt(), DType::F32).unwrap();
        let xs = g.div(x, r2).unwrap();
        let e = g.erf(xs).unwrap();
        let one = g.scalar(1.0, DType::F32).unwrap();
        let br = g.add(one, e).unwrap();
        let half = g.scalar(0.5, DType::F32).unwrap();
        let y = if nest == 0 {
            let hx = g.mul(x, half).unwrap();
            g.mul(hx, br).unwrap()
        } else {
            let hb = g.mul(half, br).unwrap();
            g.mul(x, hb).unwrap()
        };
        g.add_output(y).unwrap();
        let (fused, _) = fuse_and_compare(&g, 5);
        assert_eq!(
            count(&fused, |o| *o == Op::Unary(UnaryOp::Gelu)),
            1,
            "{}",
            rocmforge::ir::to_text(&fused).unwrap()
        );
    }
    // tanh form with pow(x, 3)
    let mut g = Graph::new("gelu_tanh");
    let x = g.input("x", DType::F32, &[5, 17]).unwrap();
    let three = g.scalar(3.0, DType::F32).unwrap();
    let x3 = g.pow(x, three).unwrap();
    let c2 = g.scalar(0.044715, DType::F32).unwrap();
    let t = g.mul(c2, x3).unwrap();
    let inner = g.add(x, t).unwrap();
    let c1 = g
        .scalar((2.0 / std::f64::consts::PI).sqrt(), DType::F32)
        .unwrap();
    let arg = g.mul(c1, inner).unwrap();
    let th = g.tanh(arg).unwrap();
    let one = g.scalar(1.0, DType::F32).unwrap();
    let br = g.add(one, th).unwrap();
    let half = g.scalar(0.5, DType::F32).unwrap();
    let hx = g.mul(half, x).unwrap();
    let y = g.mul(hx, br).unwrap();
    g.add_output(y).unwrap();
    let (fused, _) = fuse_and_compare(&g, 6);
    assert_eq!(count(&fused, |o| *o == Op::Unary(UnaryOp::GeluTanh)), 1);
}

// ---- clean-up -------------------------------------------------------------------------------

#[test]
fn cleanup_passes_do_what_they_say() {
    use rocmforge::passes::PassManager;
    let mut g = Graph::new("clean");
    let x = g.input("x", DType::F32, &[2, 3, 4]).unwrap();
    let p1 = g.permute(x, &[1, 0, 2]).unwrap();
    let p2 = g.permute(p1, &[1, 0, 2]).unwrap(); // identity overall
    let r1 = g.reshape(p2, &[6, 4]).unwrap();
    let r2 = g.reshape(r1, &[24]).unwrap();
    let noop = g.cast(r2, DType::F32).unwrap();
    let two = g.scalar(2.0, DType::F32).unwrap();
    let four = g.scalar(4.0, DType::F32).unwrap();
    let sqrt4 = g.sqrt(four).unwrap(); // folds to 2
    let a = g.div(noop, sqrt4).unwrap();
    let b = g.div(noop, two).unwrap(); // same as a after folding: CSE
    let y = g.add(a, b).unwrap();
    let _dead = g.exp(x).unwrap();
    g.add_output(y).unwrap();
    let mut c = g.clone();
    PassManager::cleanup().run(&mut c).unwrap();
    let text = rocmforge::ir::to_text(&c).unwrap();
    assert_eq!(count(&c, |o| matches!(o, Op::Permute { .. })), 0, "{text}");
    assert_eq!(count(&c, |o| matches!(o, Op::Reshape { .. })), 1, "{text}");
    assert_eq!(
        count(&c, |o| matches!(o, Op::Cast { .. } | Op::Unary(_))),
        0,
        "{text}"
    );
    assert_eq!(
        count(&c, |o| matches!(
            o,
            Op::Binary(rocmforge::ir::BinaryOp::Div)
        )),
        0,
        "{text}"
    );
    assert_eq!(
        count(&c, |o| matches!(
            o,
            Op::Binary(rocmforge::ir::BinaryOp::Mul)
        )),
        1,
        "CSE merges the two halves: {text}"
    );
    let b = Bindings::random(&g, 9);
    assert_eq!(run(&g, &b).unwrap(), run(&c, &b).unwrap());
}

#[test]
fn elementwise_chains_fuse_and_stop_at_shared_values() {
    let mut g = Graph::new("ew");
    let x = g.input("x", DType::F32, &[4, 9]).unwrap();
    let w = g.weight("w", DType::F32, &[9, 9]).unwrap();
    let bias = g.weight("bias", DType::F32, &[9]).unwrap();
    let mm = g.matmul(x, w).unwrap();
    let h = g.add(mm, bias).unwrap();
    let a = g.tanh(h).unwrap();
    let shared = g.exp(a).unwrap(); // two consumers: ends a group
    let y1 = g.neg(shared).unwrap();
    let y1 = g.tanh(y1).unwrap();
    let y2 = g.mul(shared, x).unwrap();
    g.set_outputs(&[y1, y2]).unwrap();
    let (fused, reports) = fuse_and_compare(&g, 11);
    let groups: Vec<_> = fused
        .node_ids()
        .filter_map(|id| match fused.op(id) {
            Op::FusedElementwise(e) => Some(e.to_string()),
            _ => None,
        })
        .collect();
    // The chain on the product became the matmul's epilogue (the GEMM pass runs after).
    let epilogues: Vec<_> = fused
        .node_ids()
        .filter_map(|id| match fused.op(id) {
            Op::Gemm(gm) => gm.epilogue.as_ref().map(|e| e.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(epilogues, ["exp(tanh(add($0, $1)))"], "{groups:?}");
    assert_eq!(groups, ["tanh(neg($0))"]);
    let ew = reports
        .iter()
        .find(|r| r.pass == "fuse_elementwise")
        .unwrap();
    assert!(
        ew.rewrites.iter().any(|r| r.what.contains("epilogue of %")),
        "{ew}"
    );
}

// ---- property: fused = unfused over random attention shapes and forms ------------------------

mod property {
    use super::*;
    use proptest::prelude::*;

    fn spec_strategy() -> impl Strategy<Value = Spec> {
        (
            (
                1usize..3,
                1usize..4,
                1usize..4,
                1usize..13,
                1usize..13,
                prop::sample::select(vec![1usize, 2, 4, 8, 16]),
            ),
            prop::sample::select(vec![
                Mask::None,
                Mask::Padding,
                Mask::Dense2d,
                Mask::PerHead,
                Mask::BoolNegInf,
                Mask::BoolMin,
                Mask::Causal,
                Mask::CausalTril,
            ]),
            prop::sample::select(vec![
                Scale::MulScores,
                Scale::MulScoresLeft,
                Scale::DivScores,
                Scale::OnQ,
                Scale::SqrtOnBoth,
                Scale::None,
            ]),
            prop::sample::select(vec![DType::F32, DType::F16, DType::BF16]),
            (
                any::<bool>(),
                any::<bool>(),
                any::<bool>(),
                -3i64..4,
                any::<bool>(),
            ),
        )
            .prop_map(
                |(
                    (b, hkv, group, sq, sk, d),
                    mask,
                    scale,
                    dtype,
                    (pre_t, rank3, cast, offset, view),
                )| {
                    let gqa = group > 1;
                    Spec {
                        b,
                        hq: hkv * group,
                        hkv,
                        sq,
                        sk,
                        d,
                        dtype,
                        scale,
                        mask,
                        k_pretransposed: pre_t && !gqa,
                        cast_softmax: cast && dtype != DType::F32,
                        // 3-D scores take the 4-D masks only through the 4-D view.
                        rank3: rank3
                            && !gqa
                            && (view || !matches!(mask, Mask::PerHead | Mask::Padding)),
                        view,
                        // A negative offset with a finite fill is refused by design; keep those ≥ 0.
                        offset,
                    }
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn fused_equals_unfused(spec in spec_strategy(), seed in 0u64..1000) {
            let fused = fuse_spec(&spec, seed);
            prop_assert_eq!(attention_nodes(&fused).len(), 1, "{:?}", spec);
        }
    }
}

// ---- the example models ---------------------------------------------------------------------

fn load_example(name: &str) -> Graph {
    rocmforge::ir::format::load(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("graphs")
            .join(name),
    )
    .unwrap()
}

#[test]
fn bert_layer_ends_with_one_padding_masked_flash_attention() {
    let (fused, _) = fuse_and_compare(&load_example("bert_layer.json"), 21);
    let fa = attention_nodes(&fused);
    assert_eq!(fa.len(), 1);
    assert_eq!(fa[0].0.mask, MaskKind::Additive);
    assert!(!fa[0].0.causal);
    assert_eq!(
        fa[0].1[3],
        vec![2, 1, 1, 128],
        "the padding mask stays [B, 1, 1, Sk]"
    );
    assert_eq!(count(&fused, |o| matches!(o, Op::LayerNorm { .. })), 2);
}

#[test]
fn llama_block_ends_with_causal_gqa_attention_rmsnorm_rope_and_swiglu() {
    let (fused, _) = fuse_and_compare(&load_example("llama_block.json"), 22);
    let fa = attention_nodes(&fused);
    assert_eq!(fa.len(), 1);
    assert!(fa[0].0.causal && fa[0].0.causal_offset == 0 && fa[0].0.mask == MaskKind::None);
    assert_eq!(
        (fa[0].1[0][1], fa[0].1[1][1], fa[0].1[2][1]),
        (9, 3, 3),
        "9 query heads over 3 KV heads"
    );
    assert_eq!(count(&fused, |o| matches!(o, Op::RmsNorm { .. })), 2);
    assert_eq!(count(&fused, |o| matches!(o, Op::Rope { .. })), 2);
    // SwiGLU's product is the gate projection's epilogue, reading the up projection's Gemm.
    let swiglu = fused.node_ids().any(|id| {
        matches!(fused.op(id), Op::Gemm(gm) if gm.epilogue.as_ref().is_some_and(|e| e.to_string() == "mul(silu($0), $1)"))
            && matches!(fused.op(fused.operands(id)[2]), Op::Gemm(_))
    });
    assert!(swiglu, "{}", rocmforge::ir::to_text(&fused).unwrap());
}

// ---- attention graphs as models and adversaries write them -------------------------------------

#[path = "passes/attention_graphs_seen_as_they_are.rs"]
mod attention_graphs_seen_as_they_are;

#[path = "passes/gemm.rs"]
mod gemm;

/// Long chains, the shapes a hostile corpus sends: `Unary` (four unary ops in turn, all of
/// which fuse), `Shared` (binary ops that each read the chain and the input, so every group has
/// two operands) and `Alternating` (tanh and softmax in turn: nothing fuses, every node is a
/// kernel).
#[derive(Clone, Copy, Debug)]
enum LongChain {
    Unary,
    Shared,
    Alternating,
}

fn long_chain(n: usize, kind: LongChain) -> Graph {
    let mut g = Graph::new("long_chain");
    let x = g.input("x", DType::F32, &[4]).unwrap();
    let mut prev = x;
    for i in 0..n {
        prev = match kind {
            LongChain::Unary => match i % 4 {
                0 => g.neg(prev),
                1 => g.tanh(prev),
                2 => g.abs(prev),
                _ => g.sigmoid(prev),
            },
            LongChain::Shared if i % 2 == 0 => g.add(prev, x),
            LongChain::Shared => g.mul(prev, x),
            LongChain::Alternating if i % 2 == 0 => g.tanh(prev),
            LongChain::Alternating => g.softmax(prev, -1),
        }
        .unwrap();
    }
    g.add_output(prev).unwrap();
    g
}

/// Node visits (`ir::work`) of the default pipeline and of codegen for gfx90a on a chain.
fn chain_visits(n: usize, kind: LongChain) -> u64 {
    use rocmforge::arch::Target;
    use rocmforge::ir::work::node_visits;
    let g = long_chain(n, kind);
    let before = node_visits();
    let (fused, _) = optimize(&g).unwrap();
    rocmforge::codegen::generate(&fused, &Target::parse("gfx90a").unwrap()).unwrap();
    node_visits() - before
}

// Work, not time: ten times the nodes must cost about ten times the node visits (a pass that
// rescans the graph per node or per rewrite costs a hundred times), and a bounded number per
// node. 10k and 100k nodes keep the quadratic case's count far from the linear one's.
#[test]
fn passes_and_codegen_do_linear_work_on_long_chains() {
    for kind in [LongChain::Unary, LongChain::Shared, LongChain::Alternating] {
        let small = chain_visits(10_000, kind);
        let large = chain_visits(100_000, kind);
        let ratio = large as f64 / small as f64;
        assert!(
            (9.0..=11.0).contains(&ratio),
            "{kind:?}: 10k nodes {small} visits, 100k nodes {large} visits (×{ratio:.2})"
        );
        let per_node = large / 100_000;
        assert!(per_node <= 400, "{kind:?}: {per_node} visits per node");
    }
}

// A chain of 200k unary ops fuses into groups of exactly `MAX_OPS` ops (the last one shorter),
// in order, and the fused graph computes what the chain computes, bit for bit (the interpreter
// applies the same f32 ops in the same order either way).
#[test]
fn a_200k_node_chain_fuses_into_full_groups_and_computes_the_same() {
    use rocmforge::ir::expr::MAX_OPS;
    let n = 200_000;
    let g = long_chain(n, LongChain::Unary);
    let (fused, _) = optimize(&g).unwrap();
    let sizes: Vec<usize> = fused
        .node_ids()
        .filter_map(|id| match fused.op(id) {
            Op::FusedElementwise(e) => Some(e.op_count()),
            _ => None,
        })
        .collect();
    assert_eq!(sizes.len(), n.div_ceil(MAX_OPS));
    assert_eq!(sizes.iter().sum::<usize>(), n);
    assert!(sizes.iter().filter(|&&s| s != MAX_OPS).count() <= 1);
    assert_eq!(fused.node_count(), sizes.len() + 1);
    let b = Bindings::random(&g, 5);
    assert_eq!(run(&g, &b).unwrap(), run(&fused, &b).unwrap());
}
