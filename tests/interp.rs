//! Every op of the interpreter against an independent reference written here in plain f64
//! loops, on random inputs of odd sizes, broadcast shapes and each dtype the op supports.

mod common;
#[path = "common/edge_cases.rs"]
mod edge_cases;
#[path = "common/gemm_cases.rs"]
mod gemm_cases;

use common::*;
use rocmforge::ir::{BinaryOp, DType, Graph, ReduceOp, Tensor, UnaryOp};

const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
const SIZES: [usize; 4] = [1, 3, 17, 64];

fn round_to(dtype: DType, v: f64) -> f64 {
    f64::from(dtype.round_f32(v as f32))
}

fn unary_ref(op: UnaryOp, x: f64) -> f64 {
    let erf = libm::erf;
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Recip => 1.0 / x,
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Erf => erf(x),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Silu => x / (1.0 + (-x).exp()),
        UnaryOp::Gelu => 0.5 * x * (1.0 + erf(x / 2f64.sqrt())),
        UnaryOp::GeluTanh => {
            0.5 * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
        }
        // The textbook form in f64 (exact enough for |x| < 700), not the split the IR uses.
        UnaryOp::Softplus => (1.0 + x.exp()).ln(),
    }
}

#[test]
fn unary_ops_match_reference() {
    let mut r = rng(1);
    for op in UnaryOp::ALL {
        for dtype in FLOATS {
            for &n in &SIZES {
                let shape = [n, 3];
                let (mut t, mut x) = random_tensor(&mut r, dtype, &shape);
                if matches!(
                    op,
                    UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Recip
                ) {
                    // Domain of these ops: strictly positive.
                    let pos: Vec<f64> = x.iter().map(|v| v.abs() + 0.25).collect();
                    t = Tensor::from_f64(dtype, shape.to_vec(), &pos).unwrap();
                    x = t.to_f64_vec();
                }
                let out = run_op(&[&t], |g, i| g.unary(op, i[0]).unwrap());
                assert_eq!(out.dtype(), dtype);
                let want: Vec<f64> = x
                    .iter()
                    .map(|&v| round_to(dtype, unary_ref(op, v)))
                    .collect();
                assert_close(
                    &out.to_f64_vec(),
                    &want,
                    dtype,
                    &format!("{} {dtype} n={n}", op.name()),
                );
            }
        }
    }
}

#[test]
fn unary_int_ops() {
    let t = Tensor::from_i64(DType::I32, vec![4], vec![-3, 0, 5, -7]).unwrap();
    let neg = run_op(&[&t], |g, i| g.neg(i[0]).unwrap());
    assert_eq!(neg.as_i64().unwrap(), &[3, 0, -5, 7]);
    let abs = run_op(&[&t], |g, i| g.abs(i[0]).unwrap());
    assert_eq!(abs.as_i64().unwrap(), &[3, 0, 5, 7]);
}

/// Softplus where the textbook form fails in f32: large |x| (eˣ overflows, or 1 + eˣ rounds to
/// 1), ±∞ and NaN. The reference is f64 with the series ln(1 + e) ≈ e − e²/2 for tiny e = eˣ,
/// written independently of the split `ir::scalar` uses.
#[test]
fn softplus_holds_at_the_edges() {
    let xs = [
        -100.0,
        -40.0,
        -17.0,
        -1.0,
        0.0,
        1e-3,
        1.0,
        17.0,
        88.0,
        100.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
    ];
    let t = Tensor::from_f64(DType::F32, vec![xs.len()], &xs).unwrap();
    let got = run_op(&[&t], |g, i| g.softplus(i[0]).unwrap()).to_f64_vec();
    for (&x, &y) in xs.iter().zip(&got) {
        let x = f64::from(x as f32);
        let want = if x.is_nan() {
            f64::NAN
        } else if x < -30.0 {
            let e = x.exp();
            e - e * e / 2.0
        } else {
            (1.0 + x.exp()).ln()
        };
        if want.is_nan() {
            assert!(y.is_nan(), "softplus({x}) = {y}, want NaN");
        } else if want.is_infinite() {
            assert_eq!(y, want, "softplus({x})");
        } else {
            // f32 rounding of the result, plus a few ulps for exp and ln_1p.
            let tol = 4.0 * f64::from(f32::EPSILON) * want.abs() + f64::from(f32::MIN_POSITIVE);
            assert!((y - want).abs() <= tol, "softplus({x}) = {y}, want {want}");
            assert!(y >= 0.0, "softplus({x}) = {y} is negative");
        }
    }
}

fn binary_ref(op: BinaryOp, a: f64, b: f64) -> f64 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Pow => a.powf(b),
        BinaryOp::Maximum => a.max(b),
        BinaryOp::Minimum => a.min(b),
        BinaryOp::Equal => f64::from(u8::from(a == b)),
        BinaryOp::Less => f64::from(u8::from(a < b)),
        BinaryOp::Greater => f64::from(u8::from(a > b)),
    }
}

/// Shape pairs that exercise numpy broadcasting, including rank extension and size-1 axes.
fn broadcast_cases(n: usize) -> Vec<(Vec<usize>, Vec<usize>)> {
    vec![
        (vec![n, 3], vec![n, 3]),
        (vec![2, 1, n], vec![n]),
        (vec![1, 4, 1], vec![n, 1, 5]),
        (vec![n, 3], vec![]),
    ]
}

#[test]
fn binary_ops_broadcast_and_match_reference() {
    let mut r = rng(2);
    for op in BinaryOp::ALL {
        for dtype in FLOATS {
            for &n in &SIZES {
                for (sa, sb) in broadcast_cases(n) {
                    let (ta, mut a) = random_tensor(&mut r, dtype, &sa);
                    let (mut tb, mut b) = random_tensor(&mut r, dtype, &sb);
                    if op == BinaryOp::Pow {
                        // Positive bases keep pow real.
                        a = a.iter().map(|v| v.abs() + 0.5).collect();
                        let ta2 = Tensor::from_f64(dtype, sa.clone(), &a).unwrap();
                        a = ta2.to_f64_vec();
                        let out = run_op(&[&ta2, &tb], |g, i| g.binary(op, i[0], i[1]).unwrap());
                        check_binary(op, dtype, &sa, &sb, &a, &b, &out);
                        continue;
                    }
                    if op.is_comparison() && !b.is_empty() {
                        // Make some elements equal so Equal is exercised on true cases.
                        b[0] = a[0];
                        tb = Tensor::from_f64(dtype, sb.clone(), &b).unwrap();
                    }
                    let out = run_op(&[&ta, &tb], |g, i| g.binary(op, i[0], i[1]).unwrap());
                    check_binary(op, dtype, &sa, &sb, &a, &b, &out);
                }
            }
        }
    }
}

fn check_binary(
    op: BinaryOp,
    dtype: DType,
    sa: &[usize],
    sb: &[usize],
    a: &[f64],
    b: &[f64],
    out: &Tensor,
) {
    let os = out.shape().dims().to_vec();
    let want: Vec<f64> = (0..out.len())
        .map(|i| {
            let idx = unravel(i, &os);
            let v = binary_ref(
                op,
                a[broadcast_index(&idx, sa)],
                b[broadcast_index(&idx, sb)],
            );
            if op.is_comparison() {
                v
            } else {
                round_to(dtype, v)
            }
        })
        .collect();
    if op.is_comparison() {
        assert_eq!(out.dtype(), DType::Bool);
    }
    let what = format!("{} {dtype} {sa:?}×{sb:?}", op.name());
    assert_close(
        &out.to_f64_vec(),
        &want,
        if op.is_comparison() {
            DType::I64
        } else {
            dtype
        },
        &what,
    );
}

#[test]
fn integer_binary_ops() {
    for dtype in [DType::I32, DType::I64] {
        let a = Tensor::from_i64(dtype, vec![2, 3], vec![1, -2, 3, 4, 5, -6]).unwrap();
        let b = Tensor::from_i64(dtype, vec![3], vec![2, -2, 0]).unwrap();
        let cases = [
            (BinaryOp::Add, vec![3, -4, 3, 6, 3, -6]),
            (BinaryOp::Sub, vec![-1, 0, 3, 2, 7, -6]),
            (BinaryOp::Mul, vec![2, 4, 0, 8, -10, 0]),
            (BinaryOp::Maximum, vec![2, -2, 3, 4, 5, 0]),
            (BinaryOp::Minimum, vec![1, -2, 0, 2, -2, -6]),
            (BinaryOp::Equal, vec![0, 1, 0, 0, 0, 0]),
            (BinaryOp::Less, vec![1, 0, 0, 0, 0, 1]),
            (BinaryOp::Greater, vec![0, 0, 1, 1, 1, 0]),
        ];
        for (op, want) in cases {
            let out = run_op(&[&a, &b], |g, i| g.binary(op, i[0], i[1]).unwrap());
            assert_eq!(
                out.as_i64().unwrap(),
                want.as_slice(),
                "{} {dtype}",
                op.name()
            );
        }
    }
}

#[test]
fn where_broadcasts_condition_and_branches() {
    let mut r = rng(3);
    for dtype in FLOATS {
        let cond_vals: Vec<bool> = (0..17).map(|i| i % 3 == 0).collect();
        let cond = Tensor::from_bool(vec![17, 1], &cond_vals).unwrap();
        let (a, av) = random_tensor(&mut r, dtype, &[17, 4]);
        let (b, bv) = random_tensor(&mut r, dtype, &[4]);
        let out = run_op(&[&cond, &a, &b], |g, i| g.where_(i[0], i[1], i[2]).unwrap());
        let want: Vec<f64> = (0..68)
            .map(|i| if cond_vals[i / 4] { av[i] } else { bv[i % 4] })
            .collect();
        assert_eq!(out.to_f64_vec(), want);
    }
}

#[test]
fn cast_rounds_and_truncates() {
    let t = Tensor::from_f32(
        DType::F32,
        vec![5],
        vec![1.7, -1.7, 0.0, 65519.0, 1.0 / 3.0],
    )
    .unwrap();
    let to_i = run_op(&[&t], |g, i| g.cast(i[0], DType::I32).unwrap());
    assert_eq!(to_i.as_i64().unwrap(), &[1, -1, 0, 65519, 0]);
    let to_b = run_op(&[&t], |g, i| g.cast(i[0], DType::Bool).unwrap());
    assert_eq!(to_b.as_i64().unwrap(), &[1, 1, 0, 1, 1]);
    let to_h = run_op(&[&t], |g, i| g.cast(i[0], DType::F16).unwrap());
    assert_eq!(
        to_h.as_f32().unwrap()[3],
        65504.0,
        "65519 rounds to f16 max"
    );
    assert_eq!(
        f64::from(to_h.as_f32().unwrap()[4]),
        f64::from(half::f16::from_f64(1.0 / 3.0).to_f32())
    );
    let ints = Tensor::from_i64(DType::I64, vec![2], vec![3, -4]).unwrap();
    let back = run_op(&[&ints], |g, i| g.cast(i[0], DType::BF16).unwrap());
    assert_eq!(back.as_f32().unwrap(), &[3.0, -4.0]);
}

fn reduce_ref(
    op: ReduceOp,
    x: &[f64],
    shape: &[usize],
    axes: &[usize],
    keepdim: bool,
) -> (Vec<usize>, Vec<f64>) {
    let kept: Vec<usize> = shape
        .iter()
        .enumerate()
        .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
        .collect();
    let n_out: usize = kept.iter().product();
    let mut acc = vec![
        if op == ReduceOp::Max {
            f64::NEG_INFINITY
        } else {
            0.0
        };
        n_out
    ];
    let mut count = vec![0usize; n_out];
    for (i, &v) in x.iter().enumerate() {
        let idx: Vec<usize> = unravel(i, shape)
            .iter()
            .enumerate()
            .map(|(a, &j)| if axes.contains(&a) { 0 } else { j })
            .collect();
        let o = ravel(&idx, &kept);
        match op {
            ReduceOp::Max => acc[o] = acc[o].max(v),
            ReduceOp::Sum | ReduceOp::Mean => acc[o] += v,
        }
        count[o] += 1;
    }
    if op == ReduceOp::Mean {
        acc.iter_mut()
            .zip(&count)
            .for_each(|(a, &c)| *a /= c as f64);
    }
    let out_shape = if keepdim {
        kept
    } else {
        shape
            .iter()
            .enumerate()
            .filter(|(i, _)| !axes.contains(i))
            .map(|(_, &d)| d)
            .collect()
    };
    (out_shape, acc)
}

#[test]
fn reductions_match_reference() {
    let mut r = rng(4);
    let axis_sets: [&[i64]; 4] = [&[-1], &[0], &[0, 2], &[1]];
    for op in ReduceOp::ALL {
        for dtype in FLOATS {
            for &n in &SIZES {
                let shape = [3, n, 5];
                let (t, x) = random_tensor(&mut r, dtype, &shape);
                for axes in axis_sets {
                    for keepdim in [false, true] {
                        let out = run_op(&[&t], |g, i| g.reduce(op, i[0], axes, keepdim).unwrap());
                        let norm: Vec<usize> = axes
                            .iter()
                            .map(|&a| if a < 0 { (a + 3) as usize } else { a as usize })
                            .collect();
                        let (os, want) = reduce_ref(op, &x, &shape, &norm, keepdim);
                        assert_eq!(out.shape().dims(), os.as_slice());
                        let want: Vec<f64> = want.iter().map(|&v| round_to(dtype, v)).collect();
                        assert_close(
                            &out.to_f64_vec(),
                            &want,
                            dtype,
                            &format!("{} {dtype} {axes:?}", op.name()),
                        );
                    }
                }
            }
        }
    }
}

fn softmax_ref(x: &[f64], shape: &[usize], axis: usize) -> Vec<f64> {
    let mut out = vec![0.0; x.len()];
    for i in 0..x.len() {
        let idx = unravel(i, shape);
        let row: Vec<f64> = (0..shape[axis])
            .map(|j| {
                let mut k = idx.clone();
                k[axis] = j;
                x[ravel(&k, shape)]
            })
            .collect();
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        if m == f64::NEG_INFINITY {
            continue;
        }
        let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
        out[i] = (x[i] - m).exp() / s;
    }
    out
}

#[test]
fn softmax_matches_reference_on_every_axis() {
    let mut r = rng(5);
    for dtype in FLOATS {
        for &n in &SIZES {
            let shape = [2, n, 7];
            let (t, x) = random_tensor(&mut r, dtype, &shape);
            for axis in [-1i64, 0, 1] {
                let out = run_op(&[&t], |g, i| g.softmax(i[0], axis).unwrap());
                let ax = if axis < 0 { 2 } else { axis as usize };
                let want: Vec<f64> = softmax_ref(&x, &shape, ax)
                    .iter()
                    .map(|&v| round_to(dtype, v))
                    .collect();
                assert_close(
                    &out.to_f64_vec(),
                    &want,
                    dtype,
                    &format!("softmax {dtype} axis {axis}"),
                );
            }
        }
    }
}

#[test]
fn softmax_fully_masked_rows_are_zero_and_large_inputs_do_not_overflow() {
    for dtype in FLOATS {
        // The largest magnitude each dtype holds well: exp of it overflows without the max shift.
        let big = if dtype == DType::F16 { 6e4 } else { 1e30 };
        let vals = vec![
            f64::NEG_INFINITY,
            f64::NEG_INFINITY,
            f64::NEG_INFINITY, // fully masked row
            big,
            big,
            -big,
            f64::NEG_INFINITY,
            0.0,
            f64::NEG_INFINITY,
        ];
        let t = Tensor::from_f64(dtype, vec![3, 3], &vals).unwrap();
        let out = run_op(&[&t], |g, i| g.softmax(i[0], -1).unwrap()).to_f64_vec();
        assert!(out.iter().all(|v| v.is_finite()), "{dtype}: {out:?}");
        assert_eq!(&out[0..3], &[0.0, 0.0, 0.0]);
        assert_eq!(&out[6..9], &[0.0, 1.0, 0.0]);
        if dtype == DType::F32 {
            assert_eq!(&out[3..6], &[0.5, 0.5, 0.0]);
        }
    }
}

#[path = "interp/ops.rs"]
mod ops;

#[test]
fn causal_mask_marks_visible_keys() {
    let mut g = Graph::new("mask");
    let m = g.causal_mask(3, 5, 1).unwrap();
    g.add_output(m).unwrap();
    let out = rocmforge::interp::run(&g, &Default::default())
        .unwrap()
        .remove(0);
    let want: Vec<i64> = (0..3)
        .flat_map(|q| (0..5).map(move |k| i64::from(k <= q + 1)))
        .collect();
    assert_eq!(out.dtype(), DType::Bool);
    assert_eq!(out.as_i64().unwrap(), want.as_slice());
}

#[test]
fn constants_splat_and_hold_infinities() {
    let mut g = Graph::new("c");
    let a = g
        .constant(DType::F32, &[2, 2], vec![f64::NEG_INFINITY])
        .unwrap();
    let b = g.constant(DType::F16, &[3], vec![1.0, 2.5, -0.1]).unwrap();
    g.set_outputs(&[a, b]).unwrap();
    let out = rocmforge::interp::run(&g, &Default::default()).unwrap();
    assert!(out[0]
        .as_f32()
        .unwrap()
        .iter()
        .all(|v| *v == f32::NEG_INFINITY));
    assert_eq!(
        out[1].as_f32().unwrap()[2],
        half::f16::from_f64(-0.1).to_f32()
    );
}

#[test]
fn missing_and_mistyped_inputs_are_errors() {
    use rocmforge::interp::{run, Bindings, InterpError};
    let mut g = Graph::new("x");
    let a = g.input("a", DType::F32, &[2]).unwrap();
    let n = g.neg(a).unwrap();
    g.add_output(n).unwrap();
    assert!(matches!(
        run(&g, &Bindings::default()),
        Err(InterpError::MissingInput { .. })
    ));
    let wrong = Bindings::default().with_input(
        "a",
        Tensor::from_f32(DType::F32, vec![3], vec![0.0; 3]).unwrap(),
    );
    assert!(matches!(
        run(&g, &wrong),
        Err(InterpError::BindingType { .. })
    ));
    let typo = Bindings::default().with_input(
        "A",
        Tensor::from_f32(DType::F32, vec![2], vec![0.0; 2]).unwrap(),
    );
    assert!(matches!(
        run(&g, &typo),
        Err(InterpError::UnknownBinding { .. })
    ));
}

#[path = "interp/folding.rs"]
mod folding;

#[path = "interp/degenerate.rs"]
mod degenerate;

#[path = "interp/gemm_views.rs"]
mod gemm_views;

#[path = "common/decode_step.rs"]
mod decode_step;
#[path = "interp/quantized.rs"]
mod quantized;
#[path = "interp/state.rs"]
mod state;
