//! Every unsafe attention form is refused, with its reason.

use super::*;

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
