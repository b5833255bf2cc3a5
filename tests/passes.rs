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

#[path = "passes/refused.rs"]
mod refused;

// ---- recognition ----------------------------------------------------------------------------

fn count(g: &Graph, pred: impl Fn(&Op) -> bool) -> usize {
    g.node_ids().filter(|&id| pred(g.op(id))).count()
}

#[path = "passes/recognition.rs"]
mod recognition;

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

#[path = "passes/property.rs"]
mod property;

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

#[path = "passes/decode_append.rs"]
mod decode_append;
#[path = "passes/merge.rs"]
mod merge;
#[path = "common/norm_cases.rs"]
mod norm_cases;
#[path = "passes/norm_gemv.rs"]
mod norm_gemv;
#[path = "passes/paged_append.rs"]
mod paged_append;
#[path = "passes/rope_fold.rs"]
mod rope_fold;
