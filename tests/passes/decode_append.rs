//! `decode_append`: a decode attention whose q is roped at the step's positions and whose
//! caches are this step's cache writes becomes the append form, which computes what the unfused
//! graph computes (output and both next states, bit for bit in the interpreter); every other
//! form is left alone with its named reason.

use std::collections::HashMap;

use super::*;
use rocmforge::interp::run_with_state;
use rocmforge::ir::{NodeId, Tensor};
use rocmforge::passes::{DecodeAppend, FoldRope, Pass};

const THETA: f64 = 10_000.0;

/// One decode step as the LLaMA lowering makes it: q, k roped at `pos` (with `factors`), k and
/// v written at `start` into caches `[1, hkv, max, d]`, attention over the first kv_len keys.
#[derive(Clone)]
struct Step {
    hq: usize,
    hkv: usize,
    s: usize,
    d: usize,
    max: usize,
    dt: DType,
    factors: Vec<f64>,
}

impl Step {
    /// One decode step: 9 query heads over 3 K/V heads of 64, a cache of 32 rows, f32.
    fn decode(factors: Vec<f64>) -> Step {
        Step {
            hq: 9,
            hkv: 3,
            s: 1,
            d: 64,
            max: 32,
            dt: DType::F32,
            factors,
        }
    }

    fn graph(&self) -> Graph {
        self.graph_with(|g, _q, k, pos, start| {
            let theta = THETA;
            let kr = g
                .rope_scaled(k, Some(pos), theta, 0, self.factors.clone())
                .unwrap();
            let kc = g.find("k_cache").unwrap();
            (g.cache_write(kc, kr, start, 2).unwrap(), None)
        })
    }

    /// The step with k's write (and anything else) made by `k_write`, which returns the write
    /// and, optionally, a different q to attend with.
    fn graph_with(
        &self,
        k_write: impl FnOnce(&mut Graph, NodeId, NodeId, NodeId, NodeId) -> (NodeId, Option<NodeId>),
    ) -> Graph {
        let (dt, s, d) = (self.dt, self.s, self.d);
        let mut g = Graph::new("decode_step");
        g.state("k_cache", dt, &[1, self.hkv, self.max, d]).unwrap();
        let vc = g.state("v_cache", dt, &[1, self.hkv, self.max, d]).unwrap();
        let q = g.input("q", dt, &[1, self.hq, s, d]).unwrap();
        let k = g.input("k", dt, &[1, self.hkv, s, d]).unwrap();
        let v = g.input("v", dt, &[1, self.hkv, s, d]).unwrap();
        let pos = g.input("pos", DType::I32, &[s]).unwrap();
        let start = g.input("start", DType::I32, &[1]).unwrap();
        let kv_len = g.input("kv_len", DType::I32, &[1]).unwrap();
        let qr = g
            .rope_scaled(q, Some(pos), THETA, 0, self.factors.clone())
            .unwrap();
        let (kw, other_q) = k_write(&mut g, q, k, pos, start);
        let vw = g.cache_write(vc, v, start, 2).unwrap();
        let att = g
            .flash_attention_len(
                (other_q.unwrap_or(qr), kw, vw),
                kv_len,
                1.0 / (d as f64).sqrt(),
                true,
            )
            .unwrap();
        g.add_output(att).unwrap();
        g
    }
}

fn i32s(v: impl IntoIterator<Item = i64>) -> Tensor {
    let v: Vec<i64> = v.into_iter().collect();
    Tensor::from_i64(DType::I32, vec![v.len()], v).unwrap()
}

/// The unfused and the fused graph from caches holding earlier rows (random) before `start`
/// and NaN from it on (an unwritten tail): the output and both next states agree bit for bit,
/// and the output is finite (no NaN of the tail was read).
fn compare(g: &Graph, fused: &Graph, kv_len: usize, first_pos: i64, seed: u64) {
    let s = g.ty(g.find("q").unwrap()).shape.dims()[2];
    let start = kv_len - s;
    let mut states = HashMap::new();
    for (i, name) in ["k_cache", "v_cache"].into_iter().enumerate() {
        let ty = g.ty(g.find(name).unwrap()).clone();
        let dims = ty.shape.dims().to_vec();
        let row = dims[3];
        let per_head = dims[2] * row;
        let mut rng = seed.wrapping_mul(31).wrapping_add(i as u64 + 1);
        let values: Vec<f64> = (0..ty.shape.numel())
            .map(|e| {
                if (e % per_head) / row < start {
                    rng = rng
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    ((rng >> 40) as f64 / (1u64 << 24) as f64) * 2.0 - 1.0
                } else {
                    f64::NAN
                }
            })
            .collect();
        states.insert(
            name.to_string(),
            Tensor::from_f64(ty.dtype, ty.shape.clone(), &values).unwrap(),
        );
    }
    let mut b = Bindings::random(g, seed);
    b.inputs.insert("start".into(), i32s([start as i64]));
    b.inputs.insert("kv_len".into(), i32s([kv_len as i64]));
    b.inputs
        .insert("pos".into(), i32s((0..s as i64).map(|i| first_pos + i)));
    let weights = HashMap::new();
    let (want, want_next) = run_with_state(g, &b, &weights, &states).unwrap();
    let (got, got_next) = run_with_state(fused, &b, &weights, &states).unwrap();
    assert_eq!(got[0].to_bytes(), want[0].to_bytes(), "output");
    assert!(got[0].to_f64_vec().iter().all(|x| x.is_finite()), "output");
    for name in ["k_cache", "v_cache"] {
        assert_eq!(
            got_next[name].to_bytes(),
            want_next[name].to_bytes(),
            "{name}"
        );
    }
}

fn fuse(g: &Graph) -> (Graph, PassReport) {
    let mut fused = g.clone();
    FoldRope.run(&mut fused);
    fused.validate().unwrap();
    let report = DecodeAppend.run(&mut fused);
    fused.validate().unwrap();
    (fused, report)
}

/// Llama 3's frequency divisors: one per pair, growing with the pair.
fn llama3_factors(d: usize) -> Vec<f64> {
    (0..d / 2).map(|i| 1.0 + (i as f64) / 4.0).collect()
}

#[test]
fn a_decode_step_becomes_the_append_form() {
    let mut checked = 0u64;
    for (hq, hkv) in [(9, 3), (4, 1), (1, 1)] {
        for d in [64, 80, 128] {
            for kv_len in [1, 7, 65, 511] {
                for dt in [DType::F32, DType::F16] {
                    let factors = if checked % 3 == 1 {
                        llama3_factors(d)
                    } else {
                        Vec::new()
                    };
                    // One new row, or two where the cache has them (a short multi-token step).
                    let s = if kv_len >= 7 && checked.is_multiple_of(2) {
                        2
                    } else {
                        1
                    };
                    let step = Step {
                        hq,
                        hkv,
                        s,
                        d,
                        max: 512,
                        dt,
                        factors: factors.clone(),
                    };
                    let g = step.graph();
                    let (fused, report) = fuse(&g);
                    let what = format!("{hq}/{hkv} d{d} kv{kv_len} s{s} {dt:?} {factors:?}");
                    assert_eq!(report.rewrites.len(), 1, "{what}: {report}");
                    let att = fused.outputs()[0];
                    let Op::FlashAttention(a) = fused.op(att) else {
                        panic!("{what}: the output is not an attention")
                    };
                    let ap = a.append.as_ref().expect("the append form");
                    assert_eq!((ap.theta, &ap.factors), (THETA, &factors), "{what}");
                    // q is the input before rope; only k's rope with factors is left (read by
                    // its write, which the attention's kernel realises).
                    assert_eq!(fused.operands(att)[0], fused.find("q").unwrap(), "{what}");
                    let ropes = fused
                        .node_ids()
                        .filter(|&id| matches!(fused.op(id), Op::Rope { .. }))
                        .count();
                    assert_eq!(ropes, usize::from(!factors.is_empty()), "{what}");
                    // Positions far from the rows they land in: not starting at 0.
                    compare(&g, &fused, kv_len, 1000 + kv_len as i64, checked);
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 72);
}

#[test]
fn the_append_form_survives_the_graph_file() {
    let g = Step::decode(llama3_factors(64)).graph();
    let (fused, _) = fuse(&g);
    let text = rocmforge::ir::format::to_json_string(&fused).unwrap();
    assert!(text.contains("append_theta") && text.contains("append_factors"));
    let back = rocmforge::ir::format::from_json_str(&text).unwrap();
    compare(&g, &back, 20, 5, 1);
}

fn refused(g: &Graph) -> Vec<&'static str> {
    let (fused, report) = fuse(g);
    assert!(report.rewrites.is_empty(), "{report}");
    // Nothing changed: the same text as the graph with only the rope fold applied.
    let mut folded = g.clone();
    FoldRope.run(&mut folded);
    assert_eq!(
        rocmforge::ir::to_text(&fused),
        rocmforge::ir::to_text(&folded)
    );
    report.skipped.iter().map(|s| s.code).collect()
}

#[test]
fn other_forms_are_left_alone_with_their_reason() {
    let base = Step::decode(Vec::new());
    // Prefill: 3 heads × 6 positions = 18 query rows per K/V head.
    let prefill = Step {
        s: 6,
        ..base.clone()
    };
    assert_eq!(refused(&prefill.graph()), ["queries_above_decode_bound"]);
    // q not roped.
    let g = base.graph_with(|g, q, k, pos, start| {
        let kr = g.rope_at(k, pos, THETA).unwrap();
        let kc = g.find("k_cache").unwrap();
        (g.cache_write(kc, kr, start, 2).unwrap(), Some(q))
    });
    assert_eq!(refused(&g), ["q_not_roped"]);
    // k's rope at another theta.
    let g = base.graph_with(|g, _, k, pos, start| {
        let kr = g.rope_at(k, pos, 500_000.0).unwrap();
        let kc = g.find("k_cache").unwrap();
        (g.cache_write(kc, kr, start, 2).unwrap(), None)
    });
    assert_eq!(refused(&g), ["rope_params_differ"]);
    // k's rope at other positions.
    let g = base.graph_with(|g, _, k, _, start| {
        let other = g.input("pos_k", DType::I32, &[1]).unwrap();
        let kr = g.rope_at(k, other, THETA).unwrap();
        let kc = g.find("k_cache").unwrap();
        (g.cache_write(kc, kr, start, 2).unwrap(), None)
    });
    assert_eq!(refused(&g), ["positions_differ"]);
    // k written unrotated.
    let g = base.graph_with(|g, _, k, _, start| {
        let kc = g.find("k_cache").unwrap();
        (g.cache_write(kc, k, start, 2).unwrap(), None)
    });
    assert_eq!(refused(&g), ["k_not_roped"]);
    // k's cache not written this step: the state itself.
    let g = base.graph_with(|g, _, _, _, _| (g.find("k_cache").unwrap(), None));
    assert_eq!(refused(&g), ["cache_not_written_here"]);
    // The written cache read by something else too (an output).
    let mut g = base.graph();
    let kw = g.operands(g.outputs()[0])[1];
    g.add_output(kw).unwrap();
    assert_eq!(refused(&g), ["cache_has_other_readers"]);
    // Llama 3's factors on q but none on k.
    let g = Step::decode(llama3_factors(64)).graph_with(|g, _, k, pos, start| {
        let kr = g.rope_at(k, pos, THETA).unwrap();
        let kc = g.find("k_cache").unwrap();
        (g.cache_write(kc, kr, start, 2).unwrap(), None)
    });
    assert_eq!(refused(&g), ["rope_params_differ"]);
}
