//! Degenerate shapes: zero-size dimensions in every op, and limits of offsets and sizes.

use super::*;

// ---- degenerate shapes: zero-size dimensions in every op --------------------------------

#[test]
fn reductions_over_an_empty_axis_follow_pytorch() {
    for dt in FLOATS {
        let x = Tensor::from_f32(dt, vec![3, 0], vec![]).unwrap();
        for (op, want) in [
            (ReduceOp::Sum, 0.0),
            (ReduceOp::Max, f64::NEG_INFINITY),
            (ReduceOp::Mean, f64::NAN),
        ] {
            for keepdim in [false, true] {
                let out = run_op(&[&x], |g, i| g.reduce(op, i[0], &[1], keepdim).unwrap());
                let dims: &[usize] = if keepdim { &[3, 1] } else { &[3] };
                assert_eq!(out.shape().dims(), dims);
                for v in out.to_f64_vec() {
                    assert!(
                        v == want || (v.is_nan() && want.is_nan()),
                        "{} {dt} over an empty axis: {v}, want {want}",
                        op.name()
                    );
                }
            }
        }
        // Every axis of an empty tensor: a scalar.
        let e = Tensor::from_f32(dt, vec![0, 4], vec![]).unwrap();
        let mean = run_op(&[&e], |g, i| {
            g.reduce(ReduceOp::Mean, i[0], &[0, 1], false).unwrap()
        });
        assert!(mean.to_f64_vec()[0].is_nan());
        // A non-empty axis of an empty tensor: an empty result.
        let sum = run_op(&[&e], |g, i| {
            g.reduce(ReduceOp::Sum, i[0], &[1], false).unwrap()
        });
        assert_eq!(sum.shape().dims(), &[0]);
    }
}

fn zeros_f32(shape: &[usize]) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_f32(DType::F32, shape.to_vec(), vec![0.0; n]).unwrap()
}

#[test]
fn every_op_accepts_zero_size_dimensions() {
    let empty = zeros_f32(&[0, 3]);
    let row = Tensor::from_f32(DType::F32, vec![3], vec![1.0, 2.0, 3.0]).unwrap();
    let shape_of = |t: Tensor| t.shape().dims().to_vec();
    // Elementwise, broadcasting an empty axis.
    assert_eq!(
        shape_of(run_op(&[&empty, &row], |g, i| g.add(i[0], i[1]).unwrap())),
        [0, 3]
    );
    assert_eq!(
        shape_of(run_op(&[&empty], |g, i| g.exp(i[0]).unwrap())),
        [0, 3]
    );
    assert_eq!(
        shape_of(run_op(&[&empty], |g, i| g.cast(i[0], DType::I32).unwrap())),
        [0, 3]
    );
    let cond = Tensor::from_bool(vec![0, 1], &[]).unwrap();
    let w = run_op(&[&cond, &row, &row], |g, i| {
        g.where_(i[0], i[1], i[2]).unwrap()
    });
    assert_eq!(shape_of(w), [0, 3]);
    // Layout.
    assert_eq!(
        shape_of(run_op(&[&empty], |g, i| g.reshape(i[0], &[3, 0]).unwrap())),
        [3, 0]
    );
    assert_eq!(
        shape_of(run_op(&[&empty], |g, i| g.reshape(i[0], &[-1, 3]).unwrap())),
        [0, 3]
    );
    assert_eq!(
        shape_of(run_op(&[&empty], |g, i| g.permute(i[0], &[1, 0]).unwrap())),
        [3, 0]
    );
    let one = zeros_f32(&[1, 3]);
    assert_eq!(
        shape_of(run_op(&[&one], |g, i| g.expand(i[0], &[0, 3]).unwrap())),
        [0, 3]
    );
    assert_eq!(
        shape_of(run_op(&[&empty], |g, i| g.slice(i[0], 1, 1, 1).unwrap())),
        [0, 0]
    );
    let (a, b) = (
        zeros_f32(&[2, 0]),
        Tensor::from_f32(DType::F32, vec![2, 2], vec![1.0, 2.0, 3.0, 4.0]).unwrap(),
    );
    let cat = run_op(&[&a, &b, &a], |g, i| {
        g.concat(&[i[0], i[1], i[2]], 1).unwrap()
    });
    assert_eq!(cat.to_f64_vec(), vec![1.0, 2.0, 3.0, 4.0]);
    let table = zeros_f32(&[5, 0]);
    let idx = Tensor::from_i64(DType::I64, vec![2], vec![4, 0]).unwrap();
    assert_eq!(
        shape_of(run_op(&[&table, &idx], |g, i| g
            .gather(i[0], i[1])
            .unwrap())),
        [2, 0]
    );
    let no_idx = Tensor::from_i64(DType::I64, vec![0], vec![]).unwrap();
    assert_eq!(
        shape_of(run_op(&[&b, &no_idx], |g, i| g.gather(i[0], i[1]).unwrap())),
        [0, 2]
    );
    // Normalisations over an empty axis, and of no rows.
    assert_eq!(
        shape_of(run_op(&[&a], |g, i| g.softmax(i[0], -1).unwrap())),
        [2, 0]
    );
    let (w0, b0) = (zeros_f32(&[0]), zeros_f32(&[0]));
    let ln = run_op(&[&a, &w0, &b0], |g, i| {
        g.layer_norm(i[0], i[1], i[2], 1e-5).unwrap()
    });
    assert_eq!(shape_of(ln), [2, 0]);
    let w3 = zeros_f32(&[3]);
    assert_eq!(
        shape_of(run_op(&[&empty, &w3], |g, i| g
            .rms_norm(i[0], i[1], 1e-6)
            .unwrap())),
        [0, 3]
    );
    assert_eq!(
        shape_of(run_op(&[&zeros_f32(&[2, 0, 4])], |g, i| g
            .rope(i[0], 1e4, 0)
            .unwrap())),
        [2, 0, 4]
    );
    // Matmul: an empty contraction is zeros (as torch.matmul); empty rows or batches are empty.
    let mm = run_op(&[&a, &zeros_f32(&[0, 3])], |g, i| {
        g.matmul(i[0], i[1]).unwrap()
    });
    assert_eq!(
        (shape_of(mm.clone()), mm.to_f64_vec()),
        (vec![2, 3], vec![0.0; 6])
    );
    assert_eq!(
        shape_of(run_op(&[&empty, &zeros_f32(&[3, 4])], |g, i| g
            .matmul(i[0], i[1])
            .unwrap())),
        [0, 4]
    );
    assert_eq!(
        shape_of(run_op(
            &[&zeros_f32(&[0, 2, 3]), &zeros_f32(&[3, 4])],
            |g, i| g.matmul(i[0], i[1]).unwrap()
        )),
        [0, 2, 4]
    );
    // A fused chain over an empty tensor, and a constant with no elements.
    let mut g = Graph::new("fused_empty");
    let x = g.input("x", DType::F16, &[0, 3]).unwrap();
    let c = g.constant(DType::F16, &[0, 3], vec![2.0]).unwrap();
    let e = g.exp(x).unwrap();
    let m = g.mul(e, c).unwrap();
    let t = g.tanh(m).unwrap();
    g.add_output(t).unwrap();
    let (fused, _) = rocmforge::passes::optimize(&g).unwrap();
    assert!(fused
        .node_ids()
        .any(|id| matches!(fused.op(id), rocmforge::ir::Op::FusedElementwise(_))));
    let x0 = Tensor::from_f32(DType::F16, vec![0, 3], vec![]).unwrap();
    assert_eq!(shape_of(run_with(&fused, vec![("x", x0.clone())])), [0, 3]);
    assert_eq!(shape_of(run_with(&g, vec![("x", x0)])), [0, 3]);
    // Causal masks with no rows or columns.
    let mut g = Graph::new("mask");
    let m = g.causal_mask(0, 4, 0).unwrap();
    let m2 = g.causal_mask(3, 0, 0).unwrap();
    g.set_outputs(&[m, m2]).unwrap();
    let out = rocmforge::interp::run(&g, &Default::default()).unwrap();
    assert_eq!((out[0].len(), out[1].len()), (0, 0));
}

/// FlashAttention on q `[1, hq, sq, d]`, k `[1, hkv, sk, d]`, v `[1, hkv, sk, dv]` of the given
/// values (or ramps), causal or not.
fn attention(dims: [usize; 6], causal: Option<i64>) -> Tensor {
    let [hq, hkv, sq, sk, d, dv] = dims;
    let ramp = |shape: Vec<usize>| {
        let n: usize = shape.iter().product();
        Tensor::from_f32(
            DType::F32,
            shape,
            (0..n).map(|i| (i % 7) as f32 - 3.0).collect(),
        )
        .unwrap()
    };
    let (q, k, v) = (
        ramp(vec![1, hq, sq, d]),
        ramp(vec![1, hkv, sk, d]),
        ramp(vec![1, hkv, sk, dv]),
    );
    run_op(&[&q, &k, &v], |g, i| {
        g.flash_attention(i[0], i[1], i[2], None, 0.5, causal)
            .unwrap()
    })
}

#[test]
fn attention_with_no_queries_no_keys_or_no_head_size_is_pytorchs() {
    // No queries, no value columns, no heads: empty results.
    assert_eq!(
        attention([2, 1, 0, 4, 8, 8], None).shape().dims(),
        &[1, 2, 0, 8]
    );
    assert_eq!(
        attention([2, 1, 3, 4, 8, 0], Some(0)).shape().dims(),
        &[1, 2, 3, 0]
    );
    assert_eq!(
        attention([0, 0, 3, 4, 8, 8], None).shape().dims(),
        &[1, 0, 3, 8]
    );
    // No keys: softmax over nothing weighs nothing, so zeros (P·V with an empty contraction).
    let no_keys = attention([2, 1, 3, 0, 8, 5], None);
    assert_eq!(no_keys.shape().dims(), &[1, 2, 3, 5]);
    assert!(no_keys.to_f64_vec().iter().all(|&x| x == 0.0));
    // Head size 0: every score is 0, so each query averages V's rows.
    let d0 = attention([1, 1, 2, 4, 0, 3], None);
    let v: Vec<f64> = (0..12).map(|i| (i % 7) as f64 - 3.0).collect();
    let mean: Vec<f64> = (0..3)
        .map(|c| (0..4).map(|j| v[j * 3 + c]).sum::<f64>() / 4.0)
        .collect();
    let want: Vec<f64> = mean.iter().chain(&mean).copied().collect();
    assert_close(&d0.to_f64_vec(), &want, DType::F32, "attention with D = 0");
}

#[test]
fn causal_offsets_near_the_i64_limits_are_exact() {
    let mut g = Graph::new("masks");
    let all = g.causal_mask(2, 3, i64::MAX).unwrap();
    let none = g.causal_mask(2, 3, i64::MIN).unwrap();
    let edge = g.causal_mask(2, 3, -1).unwrap();
    g.set_outputs(&[all, none, edge]).unwrap();
    let out = rocmforge::interp::run(&g, &Default::default()).unwrap();
    assert_eq!(out[0].as_i64().unwrap(), &[1; 6]);
    assert_eq!(out[1].as_i64().unwrap(), &[0; 6]);
    assert_eq!(out[2].as_i64().unwrap(), &[0, 0, 0, 1, 0, 0]);
    // Attention: an offset past every key is no mask; one before every key masks all (zeros).
    let dims = [2, 1, 3, 4, 8, 5];
    assert_eq!(attention(dims, Some(i64::MAX)), attention(dims, None));
    assert!(attention(dims, Some(i64::MIN))
        .to_f64_vec()
        .iter()
        .all(|&x| x == 0.0));
}

#[test]
fn empty_results_of_huge_shapes_are_immediate() {
    // [2^40, 0, 2^20] holds nothing, but a softmax over axis 1 that walked its rows would run
    // for days; run it on a thread and give it ten seconds.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut g = Graph::new("huge_empty");
        let x = g.input("x", DType::F32, &[1 << 40, 0, 1 << 20]).unwrap();
        let s = g.softmax(x, 1).unwrap();
        let c = g.concat(&[s, s], 2).unwrap();
        let r = g.reduce(ReduceOp::Max, c, &[0], true).unwrap();
        g.add_output(r).unwrap();
        let b = rocmforge::interp::Bindings::random(&g, 0);
        let _ = tx.send(rocmforge::interp::run(&g, &b).map(|o| o[0].shape().dims().to_vec()));
    });
    let got = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("finished in time");
    assert_eq!(got, Ok(vec![1, 0, 1 << 21]));
}
