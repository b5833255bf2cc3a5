//! `fold_rope`: a rope that only a cache write reads is folded into the write, which computes
//! exactly what the unfused pair computed (the same interpreter function); every other form is
//! left alone with its named reason.

use std::collections::HashMap;

use super::*;
use rocmforge::interp::run_with_state;
use rocmforge::ir::{NodeId, Tensor};
use rocmforge::passes::{FoldRope, Pass, RopeFoldRefusal};

/// k [1, hkv, s, d] roped at `pos` (i32 [s]) and written at `start` along axis 2 of a cache
/// [1, hkv, max, d]; the write is the output. Returns the graph and the rope node.
fn roped_write(hkv: usize, s: usize, d: usize, max: usize, dt: DType) -> (Graph, NodeId) {
    let mut g = Graph::new("roped_write");
    let cache = g.state("k_cache", dt, &[1, hkv, max, d]).unwrap();
    let k = g.input("k", dt, &[1, hkv, s, d]).unwrap();
    let pos = g.input("pos", DType::I32, &[s]).unwrap();
    let start = g.input("start", DType::I32, &[1]).unwrap();
    let r = g.rope_at(k, pos, 10_000.0).unwrap();
    let w = g.cache_write(cache, r, start, 2).unwrap();
    g.add_output(w).unwrap();
    (g, r)
}

fn i32s(v: impl IntoIterator<Item = i64>) -> Tensor {
    let v: Vec<i64> = v.into_iter().collect();
    Tensor::from_i64(DType::I32, vec![v.len()], v).unwrap()
}

/// Fused and unfused from a cache that starts NaN everywhere (an unwritten cache): the written
/// rows and the untouched NaN tail agree bit for bit.
fn compare(g: &Graph, fused: &Graph, start: usize, s: usize, seed: u64) {
    let cache = g.ty(g.find("k_cache").unwrap()).clone();
    let nan = Tensor::from_f64(
        cache.dtype,
        cache.shape.clone(),
        &vec![f64::NAN; cache.shape.numel()],
    )
    .unwrap();
    let states: HashMap<String, Tensor> = [("k_cache".to_string(), nan)].into();
    let mut b = Bindings::random(g, seed);
    b.inputs.insert("start".into(), i32s([start as i64]));
    // Positions near the cache end: the rows written are the last ones.
    b.inputs
        .insert("pos".into(), i32s((start..start + s).map(|p| p as i64)));
    let weights = HashMap::new();
    let (want, want_next) = run_with_state(g, &b, &weights, &states).unwrap();
    let (got, got_next) = run_with_state(fused, &b, &weights, &states).unwrap();
    let bits = |t: &Tensor| t.to_bytes();
    assert_eq!(bits(&got[0]), bits(&want[0]), "output");
    assert_eq!(
        bits(&got_next["k_cache"]),
        bits(&want_next["k_cache"]),
        "state"
    );
    // The rotation happened: the written rows are not the raw values.
    let raw = b.inputs["k"].to_f64_vec();
    let row = cache.shape.dims()[3];
    let first = start * row;
    let written = &got_next["k_cache"].to_f64_vec()[first..first + row];
    if start > 0 {
        assert_ne!(written, &raw[..row], "the values were not rotated");
    }
}

#[test]
fn a_rope_only_a_cache_write_reads_is_folded() {
    // GQA layouts' K/V head counts (9/3 → 3, 4/1 → 1, 1/1 → 1) and head sizes 64/80/128, one
    // and several new rows, positions ending at the cache end.
    let mut checked = 0;
    for (hkv, d) in [(3, 64), (1, 80), (1, 128), (3, 80)] {
        for (s, max) in [(1, 37), (5, 40)] {
            for dt in [DType::F32, DType::F16] {
                let (g, _) = roped_write(hkv, s, d, max, dt);
                let mut fused = g.clone();
                let report = FoldRope.run(&mut fused);
                fused.validate().unwrap();
                assert_eq!(report.rewrites.len(), 1, "{report}");
                assert!(report.skipped.is_empty(), "{report}");
                let ropes = fused
                    .node_ids()
                    .filter(|&id| matches!(fused.op(id), Op::Rope { .. }))
                    .count();
                assert_eq!(ropes, 0, "the rope is gone");
                let w = fused.outputs()[0];
                assert_eq!(fused.node(w).name, g.node(g.outputs()[0]).name);
                assert_eq!(
                    fused.op(w),
                    &Op::CacheWrite {
                        axis: 2,
                        rope: Some(10_000.0)
                    }
                );
                assert_eq!(fused.operands(w).len(), 4);
                compare(&g, &fused, max - s, s, 7 + checked);
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 16);
}

#[test]
fn the_default_pipeline_folds_it_and_the_graph_file_keeps_it() {
    let (g, _) = roped_write(3, 2, 64, 16, DType::F32);
    let (fused, reports) = optimize(&g).unwrap();
    let fold = reports.iter().find(|r| r.pass == "fold_rope").unwrap();
    assert_eq!(fold.rewrites.len(), 1, "{fold}");
    compare(&g, &fused, 14, 2, 3);
    // The folded write survives the graph file (its theta as `rope_theta`).
    let text = rocmforge::ir::format::to_json_string(&fused).unwrap();
    assert!(text.contains("rope_theta"), "{text}");
    let back = rocmforge::ir::format::from_json_str(&text).unwrap();
    compare(&g, &back, 3, 2, 4);
}

fn refused(g: &Graph) -> Vec<&'static str> {
    let mut fused = g.clone();
    let report = FoldRope.run(&mut fused);
    assert!(report.rewrites.is_empty(), "{report}");
    assert_eq!(
        rocmforge::ir::format::to_json_string(&fused).unwrap(),
        rocmforge::ir::format::to_json_string(g).unwrap(),
        "a refusal leaves the graph as it was"
    );
    report.skipped.iter().map(|s| s.code).collect()
}

#[test]
fn a_rope_read_elsewhere_is_not_folded() {
    // Read by another node.
    let (mut g, r) = roped_write(1, 1, 64, 8, DType::F32);
    let other = g.unary(UnaryOp::Gelu, r).unwrap();
    g.add_output(other).unwrap();
    assert_eq!(refused(&g), [RopeFoldRefusal::RopeHasOtherReaders.code()]);
    // A graph output.
    let (mut g, r) = roped_write(1, 1, 64, 8, DType::F32);
    g.add_output(r).unwrap();
    assert_eq!(refused(&g), ["rope_has_other_readers"]);
}

#[test]
fn a_rope_at_an_offset_is_not_folded() {
    let mut g = Graph::new("offset");
    let cache = g.state("k_cache", DType::F32, &[1, 1, 8, 64]).unwrap();
    let k = g.input("k", DType::F32, &[1, 1, 1, 64]).unwrap();
    let start = g.input("start", DType::I32, &[1]).unwrap();
    let r = g.rope(k, 10_000.0, 3).unwrap();
    let w = g.cache_write(cache, r, start, 2).unwrap();
    g.add_output(w).unwrap();
    assert_eq!(refused(&g), ["rope_offset_without_positions"]);
}

#[test]
fn a_write_that_already_rotates_is_not_rotated_twice() {
    let mut g = Graph::new("twice");
    let cache = g.state("k_cache", DType::F32, &[1, 1, 8, 64]).unwrap();
    let k = g.input("k", DType::F32, &[1, 1, 1, 64]).unwrap();
    let pos = g.input("pos", DType::I32, &[1]).unwrap();
    let start = g.input("start", DType::I32, &[1]).unwrap();
    let r = g.rope_at(k, pos, 10_000.0).unwrap();
    let w = g.cache_write_rope(cache, r, start, pos, 2, 500.0).unwrap();
    g.add_output(w).unwrap();
    assert_eq!(refused(&g), ["already_roped"]);
}
