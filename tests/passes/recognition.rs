//! Recognition of decomposed softmax, layer and RMS norms, SiLU and GELU.

use super::*;

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
