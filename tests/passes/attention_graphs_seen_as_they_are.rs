//! Attention written the ways models (and adversaries) write it, around casts, scale constants,
//! dead nodes, reshaped scores and permuted K (issue 11, items 1 and 2). Each graph either fuses
//! into one flash_attention that computes what the graph computes, or is refused with the code
//! that names what is wrong, and then still computes what it computed.

use super::*;
use crate::common::attention_graphs::{promoted_to_f32, Chain, Step};
use crate::common::unravel;
use rocmforge::ir::{to_text, Attention, Tensor};
use rocmforge::passes::{explain_text, FuseAttention, Pass, PassManager, RecognizeSoftmax};
use std::collections::HashSet;
use DType::{BF16, F16, F32};
use Step::*;

const NEG_INF: f64 = f64::NEG_INFINITY;

/// The least precise float dtype the graph computes in: the tolerance its fused form is held to.
fn precision(g: &Graph) -> DType {
    let dts: HashSet<DType> = g.node_ids().map(|id| g.ty(id).dtype).collect();
    [BF16, F16]
        .into_iter()
        .find(|d| dts.contains(d))
        .unwrap_or(F32)
}

fn first_output(g: &Graph, b: &Bindings) -> Vec<f64> {
    run(g, b).unwrap().remove(0).to_f64_vec()
}

/// `g` fuses into exactly one flash_attention whose result equals `g`'s on the interpreter:
/// `g` itself for f32 graphs, `g` computed in f32 on the same rounded inputs for f16/bf16 ones.
fn assert_fuses(g: &Graph, b: &Bindings) -> (Attention, Graph) {
    let (fused, reports) = optimize(g).unwrap();
    let mut fa = attention_nodes(&fused);
    assert_eq!(
        fa.len(),
        1,
        "expected one flash_attention:\n{}{}",
        explain_text(&reports),
        to_text(&fused).unwrap()
    );
    let dt = precision(g);
    let want = if dt == F32 {
        first_output(g, b)
    } else {
        let mut wide = Bindings::default();
        for (name, t) in &b.inputs {
            let t = if t.dtype().is_float() {
                t.cast(F32)
            } else {
                t.clone()
            };
            wide.inputs.insert(name.clone(), t);
        }
        first_output(&promoted_to_f32(g), &wide)
    };
    let got = first_output(&fused, b);
    assert!(got.iter().all(|x| !x.is_nan()), "fused output has NaN");
    let err = rel_l2(&got, &want);
    assert!(
        err <= tolerance(dt),
        "fused vs reference rel L2 {err:e} ({dt})\n{}",
        to_text(&fused).unwrap()
    );
    (fa.remove(0).0, fused)
}

/// `g` is left unfused with the reason `code`, and still computes what it computed (NaN where
/// it had NaN). Returns the `--explain` text.
fn assert_refuses(g: &Graph, b: &Bindings, code: &str) -> String {
    let (fused, reports) = optimize(g).unwrap();
    let explain = explain_text(&reports);
    assert!(
        attention_nodes(&fused).is_empty(),
        "must not fuse:\n{explain}"
    );
    let codes: Vec<&str> = reports
        .iter()
        .filter(|r| r.pass == "fuse_attention")
        .flat_map(|r| r.skipped.iter().map(|s| s.code))
        .collect();
    assert!(codes.contains(&code), "expected {code}, got:\n{explain}");
    let (w, o) = (first_output(g, b), first_output(&fused, b));
    let nan = |v: &[f64]| v.iter().map(|x| x.is_nan()).collect::<Vec<_>>();
    assert_eq!(nan(&w), nan(&o), "NaN positions differ");
    let keep = |v: &[f64]| {
        v.iter()
            .copied()
            .filter(|x| !x.is_nan())
            .collect::<Vec<_>>()
    };
    assert!(rel_l2(&keep(&o), &keep(&w)) <= 1e-6);
    explain
}

fn random(g: &Graph, seed: u64) -> Bindings {
    Bindings::random(g, seed)
}

fn bools(shape: &[usize], f: impl Fn(&[usize]) -> bool) -> Tensor {
    let n = shape.iter().product();
    let v: Vec<bool> = (0..n).map(|i| f(&unravel(i, shape))).collect();
    Tensor::from_bool(shape.to_vec(), &v).unwrap()
}

fn chain(dtype: DType, steps: Vec<Step>) -> Graph {
    Chain::new(dtype, [2, 2, 8, 8], steps).build()
}

fn scale8() -> Step {
    Mul(1.0 / 8f64.sqrt())
}

// ---- item 1: casts between the scores and the weighted matmul --------------------------------

#[test]
fn value_changing_casts_between_the_matmuls_are_refused() {
    use rocmforge::ir::DType::{Bool, I32};
    let cases = [
        (F32, vec![Cast(F16), Cast(F32), Softmax(-1)]),
        (F32, vec![scale8(), Cast(BF16), Cast(F32), Softmax(-1)]),
        (F16, vec![Cast(BF16), Softmax(-1), Cast(F16)]),
        (BF16, vec![Cast(F16), Softmax(-1), Cast(BF16)]),
        (
            F16,
            vec![
                Cast(F32),
                scale8(),
                Cast(BF16),
                Cast(F32),
                Softmax(-1),
                Cast(F16),
            ],
        ),
        (F32, vec![Cast(I32), Cast(F32), Softmax(-1)]),
        (F32, vec![Cast(Bool), Cast(F32), Softmax(-1)]),
        (F32, vec![scale8(), Softmax(-1), Cast(F16), Cast(F32)]),
        (F16, vec![Softmax(-1), Cast(BF16), Cast(F16)]),
        (BF16, vec![Softmax(-1), Cast(F32), Cast(F16), Cast(BF16)]),
    ];
    for (dt, steps) in cases {
        let g = chain(dt, steps.clone());
        let explain = assert_refuses(&g, &random(&g, 1), "cast_changes_values");
        assert!(explain.contains("cast"), "{dt} {steps:?}: {explain}");
    }
}

#[test]
fn widening_casts_and_their_narrowing_back_fuse_wherever_they_sit() {
    let cases = [
        (
            F16,
            vec![
                Cast(F32),
                scale8(),
                Add(vec![2, 1, 1, 8]),
                Softmax(-1),
                Cast(F16),
            ],
        ),
        (
            BF16,
            vec![
                scale8(),
                Add(vec![1, 1, 8, 8]),
                Cast(F32),
                Softmax(-1),
                Cast(BF16),
            ],
        ),
        (F16, vec![Cast(F32), Cast(F16), scale8(), Softmax(-1)]),
        (
            F16,
            vec![
                scale8(),
                Cast(F32),
                Where(vec![2, 1, 8, 8], NEG_INF),
                Softmax(-1),
                Cast(F16),
            ],
        ),
        (
            BF16,
            vec![
                Cast(F32),
                scale8(),
                Cast(BF16),
                Causal(0, NEG_INF),
                Softmax(-1),
            ],
        ),
        (F16, vec![scale8(), Softmax(-1), Cast(F32), Cast(F16)]),
        (
            BF16,
            vec![
                Cast(F32),
                scale8(),
                Softmax(-1),
                Cast(BF16),
                Cast(F32),
                Cast(BF16),
            ],
        ),
    ];
    for (dt, steps) in cases {
        let g = chain(dt, steps);
        let (_, fused) = assert_fuses(&g, &random(&g, 2));
        assert!(
            !fused
                .node_ids()
                .any(|id| matches!(fused.op(id), Op::Cast { .. })),
            "casts left behind:\n{}",
            to_text(&fused).unwrap()
        );
    }
}

#[test]
fn casts_on_q_k_v_and_the_result_stay_outside_the_fused_op() {
    for cast in ["q", "k", "v", "all"] {
        let mut g = Graph::new("cast_operands");
        let mut x = ["q", "k", "v"].map(|n| {
            let dt = if cast == n || cast == "all" { F16 } else { F32 };
            g.input(n, dt, &[2, 2, 8, 8]).unwrap()
        });
        for x in &mut x {
            if g.ty(*x).dtype == F16 {
                *x = g.cast(*x, F32).unwrap();
            }
        }
        let kt = g.transpose_last(x[1]).unwrap();
        let s = g.matmul(x[0], kt).unwrap();
        let c = g.scalar(0.25, F32).unwrap();
        let s = g.mul(s, c).unwrap();
        let p = g.softmax(s, -1).unwrap();
        let o = g.matmul(p, x[2]).unwrap();
        let o = g.cast(o, F16).unwrap();
        g.add_output(o).unwrap();
        let (att, fused) = assert_fuses(&g, &random(&g, 3));
        assert_eq!(att.scale, 0.25);
        let fa = fused
            .node_ids()
            .find(|&id| matches!(fused.op(id), Op::FlashAttention(_)))
            .unwrap();
        assert_eq!(fused.ty(fa).dtype, F32, "{cast}: the attention runs in f32");
    }
}

#[test]
fn scale_constants_are_used_at_the_value_their_dtype_holds() {
    let held = |dt: DType, v: f64| f64::from(dt.round_f32(v as f32));
    let c = 1.0 / 80f64.sqrt();
    for dt in [F16, BF16] {
        assert_ne!(held(dt, c), c, "1/√80 is not exact in {dt}");
        for step in [Mul(c), MulLeft(c)] {
            let g = Chain::new(dt, [1, 2, 8, 80], vec![step, Softmax(-1)]).build();
            let (att, _) = assert_fuses(&g, &random(&g, 4));
            assert_eq!(att.scale, held(dt, c), "{dt}");
        }
        // A divisor is read by the pass itself, before canonicalisation makes it a mul.
        let g = Chain::new(dt, [1, 2, 8, 80], vec![Div(80f64.sqrt()), Softmax(-1)]).build();
        let mut f = g.clone();
        let report = FuseAttention.run(&mut f);
        assert_eq!(report.rewrites.len(), 1, "{report}");
        assert_eq!(
            attention_nodes(&f)[0].0.scale,
            1.0 / held(dt, 80f64.sqrt()),
            "{dt}"
        );
        // And the whole pipeline keeps it: canonicalisation must not turn the divisor into a
        // reciprocal rounded to the dtype.
        let (f, _) = optimize(&g).unwrap();
        assert_eq!(
            attention_nodes(&f)[0].0.scale,
            1.0 / held(dt, 80f64.sqrt()),
            "{dt}: through the pipeline"
        );
    }
}

#[test]
fn fills_are_read_at_the_value_their_dtype_holds() {
    // −1e39 is −∞ in f32, −7e4 is −∞ in f16: a fully masked row gives zeros, not a uniform mean.
    for (dt, fill) in [(F32, -1e39), (F16, -7e4), (BF16, -3.4e38)] {
        let g = chain(
            dt,
            vec![scale8(), Where(vec![1, 1, 8, 8], fill), Softmax(-1)],
        );
        let b = random(&g, 5).with_input("mask0", bools(&[1, 1, 8, 8], |i| i[2] != 3));
        let (att, fused) = assert_fuses(&g, &b);
        assert_eq!(att.mask, MaskKind::Boolean, "{dt} {fill}");
        let out = first_output(&fused, &b);
        assert!(out[3 * 8..4 * 8].iter().all(|&x| x == 0.0), "{dt}: row 3");
    }
}

#[test]
fn fills_that_are_not_minus_infinity_or_the_dtype_minimum_are_refused() {
    for fill in [f64::NAN, f64::INFINITY, -1e4, 0.0] {
        let g = chain(
            F32,
            vec![scale8(), Where(vec![1, 1, 8, 8], fill), Softmax(-1)],
        );
        let b = random(&g, 6).with_input("mask0", bools(&[1, 1, 8, 8], |i| i[3] != 2));
        assert_refuses(&g, &b, "fill_not_neg_inf");
    }
}

// ---- item 1: where the scale and the masks sit --------------------------------------------

#[test]
fn a_scale_above_an_additive_mask_is_refused_wherever_the_other_masks_are() {
    let g = chain(
        F32,
        vec![
            Add(vec![1, 1, 8, 8]),
            Mul(0.5),
            Causal(0, NEG_INF),
            Softmax(-1),
        ],
    );
    assert_refuses(&g, &random(&g, 7), "scale_after_mask");
}

#[test]
fn a_scale_that_broadcasts_the_scores_is_refused() {
    let mut g = Graph::new("scale5d");
    let q = g.input("q", F32, &[1, 2, 8, 4]).unwrap();
    let k = g.input("k", F32, &[1, 2, 8, 4]).unwrap();
    let v = g.input("v", F32, &[1, 2, 8, 4]).unwrap();
    let kt = g.transpose_last(k).unwrap();
    let s = g.matmul(q, kt).unwrap();
    let c = g.constant(F32, &[1, 1, 1, 1, 1], vec![0.5]).unwrap();
    let s = g.mul(s, c).unwrap();
    let p = g.softmax(s, -1).unwrap();
    let o = g.matmul(p, v).unwrap();
    g.add_output(o).unwrap();
    assert_refuses(&g, &random(&g, 8), "scale_broadcast");
}

#[test]
fn finite_fills_combined_with_other_masks_are_refused() {
    let min = F32.min_value();
    // Rows 0..3 see keys 0..=i, all of them masked by the second mask, which leaves later keys
    // visible: unfused, those rows average over keys the fused op would drop or keep wrongly.
    let keep = |i: &[usize]| i[3] > i[2] || i[2] > 3;
    for steps in [
        vec![scale8(), Causal(0, min), Where(vec![1, 1, 8, 8], NEG_INF)],
        vec![scale8(), Where(vec![1, 1, 8, 8], NEG_INF), Causal(0, min)],
        vec![scale8(), Add(vec![1, 1, 8, 8]), Causal(0, min)],
        vec![scale8(), Causal(0, min), Add(vec![1, 1, 8, 8])],
        vec![scale8(), Causal(0, NEG_INF), Where(vec![1, 1, 8, 8], min)],
    ] {
        let mut steps = steps;
        steps.push(Softmax(-1));
        let g = chain(F32, steps.clone());
        let b = match g.ty(g.find("mask0").unwrap()).dtype {
            DType::Bool => random(&g, 9).with_input("mask0", bools(&[1, 1, 8, 8], keep)),
            _ => {
                let v: Vec<f64> = (0..64)
                    .map(|i| {
                        if keep(&[0, 0, i / 8, i % 8]) {
                            0.0
                        } else {
                            min
                        }
                    })
                    .collect();
                random(&g, 9).with_input(
                    "mask0",
                    Tensor::from_f64(F32, vec![1, 1, 8, 8], &v).unwrap(),
                )
            }
        };
        assert_refuses(&g, &b, "fill_changes_masked_rows");
    }
}

#[test]
fn a_finite_fill_below_a_causal_mask_fuses() {
    let min = F32.min_value();
    let g = chain(
        F32,
        vec![
            scale8(),
            Where(vec![1, 1, 8, 8], min),
            Causal(0, NEG_INF),
            Softmax(-1),
        ],
    );
    // Row 2 has every visible key masked: it averages its visible keys, fused and unfused.
    let b = random(&g, 10).with_input("mask0", bools(&[1, 1, 8, 8], |i| i[2] != 2));
    let (att, _) = assert_fuses(&g, &b);
    assert!(att.causal && att.mask == MaskKind::Additive);
}

// ---- item 2: dead nodes ----------------------------------------------------------------------

/// Names of the nodes no output depends on (computed here, not by the code under test).
fn dead_names(g: &Graph) -> Vec<String> {
    let mut live = HashSet::new();
    let mut stack = g.outputs().to_vec();
    while let Some(id) = stack.pop() {
        if live.insert(id) {
            stack.extend(g.operands(id));
        }
    }
    g.node_ids()
        .filter(|id| !live.contains(id))
        .map(|id| g.node(id).name.clone())
        .collect()
}

#[test]
fn a_written_out_softmax_left_dead_by_recognition_does_not_block_fusion() {
    for (dt, steps) in [
        (
            F32,
            vec![scale8(), Add(vec![2, 1, 1, 8]), WrittenSoftmax(true)],
        ),
        (F32, vec![scale8(), WrittenSoftmax(false)]),
        (
            F16,
            vec![
                scale8(),
                Cast(F32),
                Causal(0, NEG_INF),
                WrittenSoftmax(true),
                Cast(F16),
            ],
        ),
    ] {
        let g = chain(dt, steps);
        let mut recognised = g.clone();
        PassManager::new()
            .with(RecognizeSoftmax)
            .run(&mut recognised)
            .unwrap();
        assert!(
            !dead_names(&recognised).is_empty(),
            "recognition leaves dead nodes"
        );
        let report = FuseAttention.run(&mut recognised);
        assert_eq!(
            report.rewrites.len(),
            1,
            "the pass alone, dead nodes present: {report}"
        );
        assert_fuses(&g, &random(&g, 11));
    }
}

#[test]
fn explain_names_the_live_consumer_and_never_a_dead_one() {
    let mut g = chain(F32, vec![scale8(), WrittenSoftmax(true)]);
    let scores = g.find("scores").unwrap();
    let extra = g.exp(scores).unwrap();
    g.rename(extra, "extra").unwrap();
    g.add_output(extra).unwrap();
    let mut recognised = g.clone();
    PassManager::new()
        .with(RecognizeSoftmax)
        .run(&mut recognised)
        .unwrap();
    let dead = dead_names(&recognised);
    let explain = assert_refuses(&g, &random(&g, 12), "intermediate_has_other_consumers");
    let line = explain
        .lines()
        .find(|l| l.starts_with("attention"))
        .unwrap();
    assert!(
        line.contains("%scores") && line.contains("%extra"),
        "{line}"
    );
    for d in dead {
        assert!(
            !line.contains(&format!("%{d} ")) && !line.contains(&format!("%{d})")),
            "{d}: {line}"
        );
    }
}

// ---- item 2: reshaped scores -----------------------------------------------------------------

/// 3-D attention `[B·H, S, D]` (B = 2, H = 3, S = 7, D = 8) as `bmm(q, kᵀ)`, then `steps`.
fn bmm_attention(steps: Vec<Step>) -> Graph {
    let mut c = Chain::new(F32, [2, 3, 7, 8], steps);
    c.q = vec![6, 7, 8];
    c.k = vec![6, 7, 8];
    c.v = vec![6, 7, 8];
    c.k_perm = vec![0, 2, 1];
    c.build()
}

/// fairseq's MultiheadAttention: scaled 3-D scores viewed 4-D for the key padding mask and back.
fn fairseq(mask: Step) -> Graph {
    bmm_attention(vec![
        scale8(),
        Reshape(vec![2, 3, 7, 7]),
        mask,
        Reshape(vec![6, 7, 7]),
        Softmax(-1),
    ])
}

#[test]
fn fairseq_reshape_round_trip_fuses() {
    let padding = |i: &[usize]| i[0] == 1 && i[3] >= 4; // batch 1 pads its last 3 keys
    let g = fairseq(MaskedFill(vec![2, 1, 1, 7], NEG_INF));
    let b = random(&g, 13).with_input("mask0", bools(&[2, 1, 1, 7], padding));
    let (att, fused) = assert_fuses(&g, &b);
    assert_eq!(att.mask, MaskKind::Boolean);
    let fa = attention_nodes(&fused).remove(0);
    assert_eq!(fa.1[0], vec![2, 3, 7, 8], "Q viewed as [B, H, S, D]");
    // Softmax in the 4-D view, probabilities viewed back to 3-D.
    let g = bmm_attention(vec![
        scale8(),
        Reshape(vec![2, 3, 7, 7]),
        Where(vec![2, 1, 1, 7], NEG_INF),
        Softmax(-1),
        Reshape(vec![6, 7, 7]),
    ]);
    let b = random(&g, 14).with_input("mask0", bools(&[2, 1, 1, 7], |i| !padding(i)));
    assert_fuses(&g, &b);
}

#[test]
fn masks_apply_in_the_view_the_graph_applies_them_in() {
    // [6] split as [3, 2] rather than [2, 3]: the mask [1, 2, 1, 7] means what that split says.
    let g = bmm_attention(vec![
        scale8(),
        Reshape(vec![3, 2, 7, 7]),
        Add(vec![1, 2, 1, 7]),
        Reshape(vec![6, 7, 7]),
        Softmax(-1),
    ]);
    assert_fuses(&g, &random(&g, 15));
    // 4-D attention whose mask is added in a 3-D view, one mask row per (batch, head).
    let g = Chain::new(
        F32,
        [2, 3, 7, 8],
        vec![
            scale8(),
            Reshape(vec![6, 7, 7]),
            Add(vec![6, 1, 7]),
            Reshape(vec![2, 3, 7, 7]),
            Softmax(-1),
        ],
    )
    .build();
    assert_fuses(&g, &random(&g, 16));
}

#[test]
fn reshapes_that_move_scores_between_rows_or_keys_are_refused() {
    for steps in [
        // [B·H, Sq, Sk] → [B, H·Sq, Sk]: the mask then broadcasts over heads and rows together
        vec![
            Reshape(vec![2, 21, 7]),
            Add(vec![2, 1, 7]),
            Reshape(vec![6, 7, 7]),
        ],
        // softmax over Sq·Sk
        vec![Reshape(vec![6, 49])],
        // rows of all heads pooled: a mask over them is not per (batch, head) any more
        vec![
            Reshape(vec![42, 7]),
            Add(vec![1, 7]),
            Reshape(vec![6, 7, 7]),
        ],
    ] {
        let mut all = steps.clone();
        let back = matches!(all.last(), Some(Reshape(s)) if s.len() == 2);
        all.push(Softmax(-1));
        if back {
            all.push(Reshape(vec![6, 7, 7]));
        }
        let g = bmm_attention(all);
        assert_refuses(&g, &random(&g, 17), "scores_layout");
    }
}

// ---- item 2: permuted K ----------------------------------------------------------------------

#[test]
fn gpt2_head_split_k_permutation_fuses() {
    // Old GPT-2: k = x.view(B, S, H, D).permute(0, 2, 3, 1) is Kᵀ of the head-split K.
    let mut c = Chain::new(F32, [2, 3, 7, 8], vec![Div(8f64.sqrt()), Softmax(-1)]);
    c.k = vec![2, 7, 3, 8];
    c.k_perm = vec![0, 2, 3, 1];
    let g = c.build();
    let (att, fused) = assert_fuses(&g, &random(&g, 18));
    assert!((att.scale - 1.0 / 8f64.sqrt()).abs() < 1e-7);
    assert_eq!(attention_nodes(&fused)[0].1[1], vec![2, 3, 7, 8]);
}

#[test]
fn k_permutations_other_than_the_two_transposes_are_refused() {
    let perms = (0..256usize)
        .map(|i| vec![i / 64, i / 16 % 4, i / 4 % 4, i % 4])
        .filter(|p| HashSet::<&usize>::from_iter(p).len() == 4);
    for perm in perms {
        let mut c = Chain::new(F32, [4, 4, 4, 4], vec![scale8(), Softmax(-1)]);
        c.k_perm = perm.clone();
        let g = c.build();
        // The identity permute is K stored [.., D, Sk], read through a transpose.
        if perm == [0, 1, 3, 2] || perm == [0, 2, 3, 1] || perm == [0, 1, 2, 3] {
            assert_fuses(&g, &random(&g, 19));
        } else {
            assert_refuses(&g, &random(&g, 19), "k_permutation");
        }
    }
}

// ---- reading the chain ---------------------------------------------------------------------

#[test]
fn long_chains_are_followed_to_the_scores() {
    let mut steps = vec![scale8()];
    for _ in 0..6 {
        steps.extend([Cast(F32), Cast(F16)]);
    }
    steps.extend([Add(vec![1, 1, 8, 8]), Softmax(-1)]);
    let g = chain(F16, steps);
    assert_fuses(&g, &random(&g, 20));
}

#[test]
fn dividing_a_constant_by_the_scores_is_not_a_scale() {
    let mut g = Graph::new("recip");
    let q = g.input("q", F32, &[1, 2, 8, 4]).unwrap();
    let k = g.input("k", F32, &[1, 2, 8, 4]).unwrap();
    let v = g.input("v", F32, &[1, 2, 8, 4]).unwrap();
    let kt = g.transpose_last(k).unwrap();
    let s = g.matmul(q, kt).unwrap();
    let c = g.scalar(2.0, F32).unwrap();
    let s = g.div(c, s).unwrap();
    let p = g.softmax(s, -1).unwrap();
    let o = g.matmul(p, v).unwrap();
    g.add_output(o).unwrap();
    let explain = assert_refuses(&g, &random(&g, 21), "not_attention");
    assert!(explain.contains("div"), "{explain}");
}

// ---- property: random chains either fuse exactly or are refused --------------------------------

#[path = "attention_graphs_seen_as_they_are/random_chains.rs"]
mod random_chains;

#[test]
fn attention_without_elements_is_refused() {
    // Zero heads, zero keys, zero head size: nothing to fuse, and the graph still runs.
    for dims in [[2, 0, 4, 8], [2, 2, 0, 8], [2, 2, 4, 0]] {
        let g = Chain::new(F32, dims, vec![scale8(), Softmax(-1)]).build();
        assert_refuses(&g, &random(&g, 22), "empty");
    }
}
