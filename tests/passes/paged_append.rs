//! `paged_append`: a batched paged decode attention whose q is this step's roped rows (seen per
//! sequence as the LLaMA lowering sees them) and whose pools are this step's paged cache writes
//! becomes the append form, which computes what the unfused graph computes (output and both
//! next pools, bit for bit in the interpreter); every other form is left alone with its named
//! reason.

use std::collections::HashMap;

use super::*;
use rocmforge::interp::run_with_state;
use rocmforge::ir::{NodeId, Tensor};
use rocmforge::passes::{PagedAppend, Pass};

#[path = "../common/paged_cases.rs"]
mod paged_cases;
use paged_cases::PagedCase;

fn ints(dims: &[usize], v: Vec<i64>) -> Tensor {
    Tensor::from_i64(DType::I32, dims.to_vec(), v).unwrap()
}

fn fuse(g: &Graph) -> (Graph, PassReport) {
    let mut fused = g.clone();
    let report = PagedAppend.run(&mut fused);
    fused.validate().unwrap();
    (fused, report)
}

/// A case of `b` sequences of `s` rows over 3 K/V heads of 16 (GQA 9/3), blocks of 4, sequence
/// lengths `lens`; sequences 0 and 1 share their first block (full, written by neither).
fn case(lens: &[usize], s: usize, dtype: DType) -> PagedCase {
    PagedCase {
        b: lens.len(),
        hq: 9,
        hkv: 3,
        s,
        d: 16,
        block_size: 4,
        num_blocks: lens.iter().map(|l| l.div_ceil(4)).sum::<usize>() + 2,
        max_blocks: lens.iter().max().unwrap().div_ceil(4) + 1,
        kv_len: lens.to_vec(),
        share_prefix: true,
        dtype,
    }
}

/// The tables (a shared first block for sequences 0 and 1, then fresh blocks in order), slots
/// where the table puts this step's rows (−1 for `padding`), positions, kv_len; pools random.
fn compare(c: &PagedCase, g: &Graph, fused: &Graph, padding: &[(usize, usize)], seed: u64) {
    let (bs, mb) = (c.block_size, c.max_blocks);
    let mut table = vec![-1i64; c.b * mb];
    let mut next = 1;
    for (b, &len) in c.kv_len.iter().enumerate() {
        for j in 0..len.div_ceil(bs) {
            table[b * mb + j] = if j == 0 && b < 2 {
                0
            } else {
                next += 1;
                next - 1
            };
        }
    }
    let (mut pos, mut slots) = (vec![], vec![]);
    for (b, &len) in c.kv_len.iter().enumerate() {
        for i in 0..c.s {
            let j = len - c.s + i;
            pos.push(j as i64);
            let slot = table[b * mb + j / bs] * bs as i64 + (j % bs) as i64;
            slots.push(if padding.contains(&(b, i)) { -1 } else { slot });
        }
    }
    let rows = c.b * c.s;
    let mut bd = Bindings::random(g, seed);
    bd.inputs.insert("positions".into(), ints(&[rows], pos));
    bd.inputs.insert("slots".into(), ints(&[1, rows], slots));
    bd.inputs.insert("table".into(), ints(&[c.b, mb], table));
    let lens = c.kv_len.iter().map(|&l| l as i64).collect();
    bd.inputs.insert("kv_len".into(), ints(&[c.b], lens));
    let mut states = HashMap::new();
    for name in ["k_pool", "v_pool"] {
        let ty = g.ty(g.find(name).unwrap()).clone();
        let v: Vec<f64> = (0..ty.shape.numel())
            .map(|i| ((i as u64 * 7919 + seed) % 1000) as f64 / 500.0 - 1.0)
            .collect();
        states.insert(
            name.to_string(),
            Tensor::from_f64(ty.dtype, ty.shape.clone(), &v).unwrap(),
        );
    }
    let w = HashMap::new();
    let (want, want_next) = run_with_state(g, &bd, &w, &states).unwrap();
    let (got, got_next) = run_with_state(fused, &bd, &w, &states).unwrap();
    assert_eq!(got[0].to_bytes(), want[0].to_bytes(), "output");
    for name in ["k_pool", "v_pool"] {
        assert_eq!(
            got_next[name].to_bytes(),
            want_next[name].to_bytes(),
            "{name}"
        );
    }
}

fn llama3_factors(d: usize) -> Vec<f64> {
    (0..d / 2).map(|i| 1.0 + (i as f64) / 4.0).collect()
}

#[test]
fn batched_paged_steps_become_the_append_form() {
    // One sequence (q is the rope itself), several of one row (a permute), several of more
    // rows (reshape then permute), with and without Llama 3's factors, f32 and f16.
    let shapes: [(&[usize], usize); 4] = [
        (&[7], 1),
        (&[9, 6, 3], 1),
        (&[9, 6, 3, 13, 5], 1),
        (&[9, 7, 5], 2),
    ];
    for (i, (lens, s)) in shapes.into_iter().enumerate() {
        for dt in [DType::F32, DType::F16] {
            let c = case(lens, s, dt);
            let factors = if i % 2 == 1 {
                llama3_factors(c.d)
            } else {
                vec![]
            };
            let g = c.append_graph(dt, factors.clone());
            let (fused, report) = fuse(&g);
            let what = format!("{lens:?} s{s} {dt:?}");
            assert_eq!(report.rewrites.len(), 1, "{what}: {report}");
            let att = fused.outputs()[0];
            let Op::PagedAttention {
                append: Some(ap), ..
            } = fused.op(att)
            else {
                panic!("{what}: the output is not an appending paged attention")
            };
            assert_eq!(ap.factors, factors, "{what}");
            // q is the rows before rope: its rope and view are gone; k's rope stays (read by
            // its write, which the kernel realises).
            assert_eq!(fused.operands(att)[0], fused.find("q").unwrap(), "{what}");
            let left =
                |op: fn(&Op) -> bool| fused.node_ids().filter(|&id| op(fused.op(id))).count();
            assert_eq!(left(|o| matches!(o, Op::Rope { .. })), 1, "{what}");
            assert_eq!(left(|o| matches!(o, Op::Permute { .. })), 0, "{what}");
            let padding: &[(usize, usize)] = if s == 2 { &[(2, 0)] } else { &[] };
            compare(&c, &g, &fused, padding, i as u64 + 3);
        }
    }
}

fn refused(g: &Graph, code: &str) {
    let (fused, report) = fuse(g);
    assert!(report.rewrites.is_empty(), "{code}: {report}");
    assert!(
        report.skipped.iter().any(|s| s.code == code),
        "expected {code}, got {report}"
    );
    assert_eq!(fused.node_count(), g.node_count(), "{code}");
}

/// The case's append graph with `edit` applied to it (given the attention's operands).
fn edited(c: &PagedCase, edit: impl FnOnce(&mut Graph, &[NodeId])) -> Graph {
    let mut g = c.append_graph(DType::F32, vec![]);
    let att = g.outputs()[0];
    let ops = g.operands(att).clone();
    edit(&mut g, &ops);
    g.validate().unwrap();
    g
}

/// Replaces the attention with one of operands `ops` (the same attributes).
fn reattend(g: &mut Graph, ops: &[NodeId]) {
    let att = g.outputs()[0];
    let op = g.op(att).clone();
    let new = g.add_op(op, ops).unwrap();
    g.replace_all_uses(att, new).unwrap();
    g.remove_node(att);
    g.set_outputs(&[new]).unwrap();
}

#[test]
fn every_other_form_is_refused_with_its_reason() {
    let c = case(&[9, 6, 3], 1, DType::F32);
    // More query rows per K/V head than the kernel serves: 3 heads × 6 rows.
    refused(
        &case(&[9, 7, 8], 6, DType::F32).append_graph(DType::F32, vec![]),
        "queries_above_decode_bound",
    );
    // q not roped: the attention reads the permuted rows before rope.
    refused(
        &edited(&c, |g, ops| {
            let q = g.find("q").unwrap();
            let p = g.permute(q, &[2, 1, 0, 3]).unwrap();
            let mut o = ops.to_vec();
            o[0] = p;
            reattend(g, &o);
        }),
        "q_not_roped",
    );
    // q's view with another reader.
    refused(
        &edited(&c, |g, ops| {
            g.add_output(ops[0]).unwrap();
        }),
        "q_rope_has_other_readers",
    );
    // A pool that is the state itself, not this step's write.
    refused(
        &edited(&c, |g, ops| {
            let mut o = ops.to_vec();
            let vw = ops[2];
            o[2] = g.operands(vw)[0];
            reattend(g, &o);
            g.remove_node(vw);
        }),
        "pool_not_written_here",
    );
    // The k write read elsewhere too.
    refused(
        &edited(&c, |g, ops| {
            g.add_output(ops[1]).unwrap();
        }),
        "pool_has_other_readers",
    );
    // The v write at other slots.
    refused(
        &edited(&c, |g, ops| {
            let other = g.input("other_slots", DType::I32, &[1, 3]).unwrap();
            let vw = ops[2];
            let (vp, vn) = (g.operands(vw)[0], g.operands(vw)[1]);
            g.remove_node(vw);
            let w = g.paged_cache_write(vp, vn, other).unwrap();
            let mut o = ops.to_vec();
            o[2] = w;
            reattend(g, &o);
        }),
        "slots_differ",
    );
    // k written unrotated.
    refused(
        &edited(&c, |g, ops| {
            let kw = ops[1];
            let (kp, slots) = (g.operands(kw)[0], g.operands(kw)[2]);
            let kr = g.operands(kw)[1];
            g.remove_node(kw);
            g.remove_node(kr);
            let kn = g.find("k_new").unwrap();
            let w = g.paged_cache_write(kp, kn, slots).unwrap();
            let mut o = ops.to_vec();
            o[1] = w;
            reattend(g, &o);
        }),
        "k_not_roped",
    );
    // k rotated with another theta, or at other positions.
    for (code, other_theta) in [("rope_params_differ", true), ("positions_differ", false)] {
        refused(
            &edited(&c, |g, ops| {
                let kw = ops[1];
                let (kp, slots) = (g.operands(kw)[0], g.operands(kw)[2]);
                let kr = g.operands(kw)[1];
                g.remove_node(kw);
                g.remove_node(kr);
                let kn = g.find("k_new").unwrap();
                let pos = if other_theta {
                    g.find("positions").unwrap()
                } else {
                    g.input("other_positions", DType::I32, &[3]).unwrap()
                };
                let theta = if other_theta { 500_000.0 } else { 10_000.0 };
                let r = g.rope_scaled(kn, Some(pos), theta, 0, vec![]).unwrap();
                let w = g.paged_cache_write(kp, r, slots).unwrap();
                let mut o = ops.to_vec();
                o[1] = w;
                reattend(g, &o);
            }),
            code,
        );
    }
}
