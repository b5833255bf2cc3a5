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

#[test]
fn layer_norm_and_rms_norm_match_reference() {
    let mut r = rng(6);
    for dtype in FLOATS {
        for &n in &SIZES {
            let shape = [3, n];
            let (x, xv) = random_tensor(&mut r, dtype, &shape);
            let (w, wv) = random_tensor(&mut r, dtype, &[n]);
            let (b, bv) = random_tensor(&mut r, dtype, &[n]);
            let eps = 1e-5;
            let ln = run_op(&[&x, &w, &b], |g, i| {
                g.layer_norm(i[0], i[1], i[2], eps).unwrap()
            });
            let rms = run_op(&[&x, &w], |g, i| g.rms_norm(i[0], i[1], eps).unwrap());
            let (mut want_ln, mut want_rms) = (vec![], vec![]);
            for row in xv.chunks(n) {
                let mean = row.iter().sum::<f64>() / n as f64;
                let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
                let ms = row.iter().map(|v| v * v).sum::<f64>() / n as f64;
                for j in 0..n {
                    want_ln.push(round_to(
                        dtype,
                        (row[j] - mean) / (var + eps).sqrt() * wv[j] + bv[j],
                    ));
                    want_rms.push(round_to(dtype, row[j] / (ms + eps).sqrt() * wv[j]));
                }
            }
            // n = 1 makes LayerNorm's output exactly its bias.
            assert_close(
                &ln.to_f64_vec(),
                &want_ln,
                dtype,
                &format!("layer_norm {dtype} n={n}"),
            );
            assert_close(
                &rms.to_f64_vec(),
                &want_rms,
                dtype,
                &format!("rms_norm {dtype} n={n}"),
            );
        }
    }
}

#[test]
fn rope_matches_reference() {
    let mut r = rng(7);
    for dtype in FLOATS {
        for (s, d, offset) in [(1usize, 2usize, 0i64), (3, 8, 5), (17, 64, 0)] {
            let shape = [2, s, d];
            let (x, xv) = random_tensor(&mut r, dtype, &shape);
            let theta = 10000.0;
            let out = run_op(&[&x], |g, i| g.rope(i[0], theta, offset).unwrap());
            let mut want = vec![0.0; xv.len()];
            for (i, w) in want.iter_mut().enumerate() {
                let idx = unravel(i, &shape);
                let (pos, j) = (idx[1] as f64 + offset as f64, idx[2]);
                let half = d / 2;
                let f = pos * theta.powf(-2.0 * (j % half) as f64 / d as f64);
                let base = i - j;
                let v = if j < half {
                    xv[base + j] * f.cos() - xv[base + j + half] * f.sin()
                } else {
                    xv[base + j] * f.cos() + xv[base + j - half] * f.sin()
                };
                *w = round_to(dtype, v);
            }
            assert_close(
                &out.to_f64_vec(),
                &want,
                dtype,
                &format!("rope {dtype} s={s} d={d}"),
            );
        }
    }
}

#[test]
fn matmul_broadcasts_batches_and_matches_reference() {
    let mut r = rng(8);
    let cases: Vec<(Vec<usize>, Vec<usize>)> = vec![
        (vec![1, 1], vec![1, 1]),
        (vec![3, 17], vec![17, 1]),
        (vec![3, 1, 17, 5], vec![4, 5, 9]),
        (vec![2, 64, 64], vec![64, 3]),
        (vec![64, 17], vec![2, 3, 17, 64]),
    ];
    for dtype in FLOATS {
        for (sa, sb) in &cases {
            let (a, av) = random_tensor(&mut r, dtype, sa);
            let (b, bv) = random_tensor(&mut r, dtype, sb);
            let out = run_op(&[&a, &b], |g, i| g.matmul(i[0], i[1]).unwrap());
            let os = out.shape().dims().to_vec();
            let (m, n, k) = (os[os.len() - 2], os[os.len() - 1], sa[sa.len() - 1]);
            let want: Vec<f64> = (0..out.len())
                .map(|i| {
                    let idx = unravel(i, &os);
                    let (row, col) = (idx[idx.len() - 2], idx[idx.len() - 1]);
                    let batch = &idx[..idx.len() - 2];
                    let sum: f64 = (0..k)
                        .map(|kk| {
                            let mut ia: Vec<usize> = batch.to_vec();
                            ia.extend([row, kk]);
                            let mut ib: Vec<usize> = batch.to_vec();
                            ib.extend([kk, col]);
                            a_at(&av, sa, &ia) * a_at(&bv, sb, &ib)
                        })
                        .sum();
                    round_to(dtype, sum)
                })
                .collect();
            assert_eq!(os.len(), sa.len().max(sb.len()));
            let _ = (m, n);
            let tol = if dtype == DType::F32 { 1e-5 } else { 1e-2 };
            assert!(
                rel_l2(&out.to_f64_vec(), &want) < tol,
                "matmul {dtype} {sa:?}×{sb:?}"
            );
        }
    }
}

fn a_at(v: &[f64], shape: &[usize], out_idx: &[usize]) -> f64 {
    v[broadcast_index(out_idx, shape)]
}

#[test]
fn layout_ops_match_reference() {
    let mut r = rng(9);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let shape = [2, 3, 17];
        let (x, xv) = random_tensor(&mut r, dtype, &shape);

        let p = run_op(&[&x], |g, i| g.permute(i[0], &[2, 0, 1]).unwrap());
        assert_eq!(p.shape().dims(), &[17, 2, 3]);
        let want: Vec<f64> = (0..xv.len())
            .map(|i| {
                let o = unravel(i, &[17, 2, 3]);
                xv[ravel(&[o[1], o[2], o[0]], &shape)]
            })
            .collect();
        assert_eq!(p.to_f64_vec(), want);

        let rs = run_op(&[&x], |g, i| g.reshape(i[0], &[6, -1]).unwrap());
        assert_eq!(rs.shape().dims(), &[6, 17]);
        assert_eq!(rs.to_f64_vec(), xv);

        let (row, rv) = random_tensor(&mut r, dtype, &[3, 1]);
        let e = run_op(&[&row], |g, i| g.expand(i[0], &[4, 3, 5]).unwrap());
        let want: Vec<f64> = (0..60).map(|i| rv[unravel(i, &[4, 3, 5])[1]]).collect();
        assert_eq!(e.to_f64_vec(), want);

        let s = run_op(&[&x], |g, i| g.slice(i[0], -1, 3, -2).unwrap());
        assert_eq!(s.shape().dims(), &[2, 3, 12]);
        let want: Vec<f64> = (0..72)
            .map(|i| {
                let o = unravel(i, &[2, 3, 12]);
                xv[ravel(&[o[0], o[1], o[2] + 3], &shape)]
            })
            .collect();
        assert_eq!(s.to_f64_vec(), want);

        let (y, yv) = random_tensor(&mut r, dtype, &[2, 1, 17]);
        let c = run_op(&[&x, &y], |g, i| g.concat(&[i[0], i[1]], 1).unwrap());
        assert_eq!(c.shape().dims(), &[2, 4, 17]);
        let want: Vec<f64> = (0..136)
            .map(|i| {
                let o = unravel(i, &[2, 4, 17]);
                if o[1] < 3 {
                    xv[ravel(&o, &shape)]
                } else {
                    yv[ravel(&[o[0], 0, o[2]], &[2, 1, 17])]
                }
            })
            .collect();
        assert_eq!(c.to_f64_vec(), want);
    }
}

#[test]
fn gather_looks_up_rows_and_refuses_out_of_range_indices() {
    let mut r = rng(10);
    let (table, tv) = random_tensor(&mut r, DType::F32, &[5, 3]);
    for dtype in [DType::I32, DType::I64] {
        let idx = Tensor::from_i64(dtype, vec![2, 2], vec![4, 0, 0, 2]).unwrap();
        let out = run_op(&[&table, &idx], |g, i| g.gather(i[0], i[1]).unwrap());
        assert_eq!(out.shape().dims(), &[2, 2, 3]);
        let want: Vec<f64> = [4usize, 0, 0, 2]
            .iter()
            .flat_map(|&row| tv[row * 3..row * 3 + 3].to_vec())
            .collect();
        assert_eq!(out.to_f64_vec(), want);
    }
    let mut g = Graph::new("bad_gather");
    let t = g.input("a", DType::F32, &[5, 3]).unwrap();
    let i = g.input("b", DType::I64, &[1]).unwrap();
    let o = g.gather(t, i).unwrap();
    g.add_output(o).unwrap();
    let bindings = rocmforge::interp::Bindings::default()
        .with_input("a", table)
        .with_input("b", Tensor::from_i64(DType::I64, vec![1], vec![5]).unwrap());
    let err = rocmforge::interp::run(&g, &bindings).unwrap_err();
    assert!(
        matches!(
            err,
            rocmforge::interp::InterpError::IndexOutOfRange {
                index: 5,
                size: 5,
                ..
            }
        ),
        "{err}"
    );
}

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

// ---- one semantics: constant folding against the interpreter, bit for bit ------------------

/// Bits of every element, with every NaN alike (payloads are not part of the semantics).
fn element_bits(t: &Tensor) -> Vec<u64> {
    match (t.as_f32(), t.as_i64()) {
        (Some(f), _) => f
            .iter()
            .map(|x| {
                if x.is_nan() {
                    u64::MAX
                } else {
                    u64::from(x.to_bits())
                }
            })
            .collect(),
        (_, Some(i)) => i.iter().map(|&x| x as u64).collect(),
        _ => unreachable!(),
    }
}

/// Builds `op` over every combination of edge constants, folds a copy, and checks that the
/// interpreter reads the same bits from the folded constants as it computes unfolded, and that
/// everything an f64 can hold was folded.
fn check_fold(
    what: &str,
    dts: &[DType],
    build: impl Fn(&mut Graph, &[rocmforge::ir::NodeId]) -> rocmforge::ir::NodeId,
) {
    use rocmforge::interp::{run, Bindings};
    use rocmforge::passes::{ConstantFold, PassManager};
    let mut g = Graph::new(what);
    let columns: Vec<Vec<f64>> = dts.iter().map(|&dt| edge_cases::edge_values(dt)).collect();
    let mut combos: Vec<Vec<usize>> = vec![vec![]];
    for c in &columns {
        combos = combos
            .into_iter()
            .flat_map(|p| {
                (0..c.len()).map(move |i| {
                    let mut p = p.clone();
                    p.push(i);
                    p
                })
            })
            .collect();
    }
    let mut outs = Vec::new();
    for combo in &combos {
        let operands: Vec<_> = combo
            .iter()
            .zip(dts)
            .zip(&columns)
            .map(|((&i, &dt), c)| g.constant(dt, &[], vec![c[i]]).unwrap())
            .collect();
        outs.push(build(&mut g, &operands));
    }
    g.set_outputs(&outs).unwrap();
    let mut folded = g.clone();
    PassManager::new()
        .with(ConstantFold)
        .run(&mut folded)
        .unwrap();
    let want = run(&g, &Bindings::default()).unwrap();
    let got = run(&folded, &Bindings::default()).unwrap();
    for (k, (w, f)) in want.iter().zip(&got).enumerate() {
        let args: Vec<f64> = combos[k].iter().zip(&columns).map(|(&i, c)| c[i]).collect();
        assert_eq!(
            element_bits(f),
            element_bits(w),
            "{what} {dts:?} on {args:?}: folded {f:?}, interpreted {w:?}"
        );
        let id = folded.outputs()[k];
        // An integer past 2^53 may not be an f64 (constants hold f64s): it stays unfolded.
        let exact = w
            .as_i64()
            .is_none_or(|i| i[0] != i64::MAX && (i[0] as f64) as i64 == i[0]);
        if exact {
            assert!(
                matches!(folded.op(id), rocmforge::ir::Op::Constant { .. }),
                "{what} {dts:?} on {args:?} was not folded"
            );
        }
    }
}

#[test]
fn constant_folding_matches_the_interpreter_bit_for_bit_on_edge_values() {
    use rocmforge::ir::Op;
    let ints = [DType::I32, DType::I64];
    for op in UnaryOp::ALL {
        let dts: Vec<DType> = FLOATS
            .into_iter()
            .chain(if matches!(op, UnaryOp::Neg | UnaryOp::Abs) {
                ints.to_vec()
            } else {
                vec![]
            })
            .collect();
        for dt in dts {
            check_fold(op.name(), &[dt], |g, x| g.unary(op, x[0]).unwrap());
        }
    }
    for op in BinaryOp::ALL {
        let mut dts = FLOATS.to_vec();
        if !op.float_only() {
            dts.extend(ints);
        }
        if op == BinaryOp::Equal {
            dts.push(DType::Bool);
        }
        for dt in dts {
            check_fold(op.name(), &[dt, dt], |g, x| {
                g.binary(op, x[0], x[1]).unwrap()
            });
        }
    }
    for from in DType::ALL {
        for to in DType::ALL {
            check_fold("cast", &[from], |g, x| {
                g.add_op(Op::Cast { to }, &[x[0]]).unwrap()
            });
        }
    }
}

#[test]
fn casts_follow_the_documented_table() {
    let cast = |dt: DType, v: Vec<f64>, to: DType| {
        let t = Tensor::from_f64(dt, vec![v.len()], &v).unwrap();
        run_op(&[&t], |g, i| g.cast(i[0], to).unwrap())
    };
    let (inf, nan) = (f64::INFINITY, f64::NAN);
    // Float → integer: toward zero, saturating, NaN → 0.
    let to_i32 = cast(
        DType::F32,
        vec![nan, inf, -inf, 3e9, -3e9, 2.9, -2.9, -0.0],
        DType::I32,
    );
    let (max, min) = (i64::from(i32::MAX), i64::from(i32::MIN));
    assert_eq!(to_i32.as_i64().unwrap(), &[0, max, min, max, min, 2, -2, 0]);
    let to_i64 = cast(DType::F16, vec![nan, inf, -inf, -65504.0], DType::I64);
    assert_eq!(to_i64.as_i64().unwrap(), &[0, i64::MAX, i64::MIN, -65504]);
    // Anything → bool: non-zero, NaN included.
    let to_bool = cast(DType::F32, vec![nan, -0.0, inf, 1e-45], DType::Bool);
    assert_eq!(to_bool.as_i64().unwrap(), &[1, 0, 1, 1]);
    // To f16: nearest, ties to even, overflow to ±∞.
    let to_f16 = cast(
        DType::F32,
        vec![65519.0, 65520.0, -65520.0, 1e-8],
        DType::F16,
    );
    assert_eq!(
        to_f16.as_f32().unwrap(),
        &[65504.0, f32::INFINITY, f32::NEG_INFINITY, 0.0]
    );
    // Integer → narrower integer wraps; integer → bf16 goes through f32, as PyTorch does:
    // 2^25 + 2^17 + 1 is 2^25 + 2^17 in f32, a tie that rounds to even 2^25 in bf16.
    let to_i32 = cast(
        DType::I64,
        vec![4294967301.0, 2147483648.0, -2147483649.0],
        DType::I32,
    );
    assert_eq!(to_i32.as_i64().unwrap(), &[5, min, max]);
    let to_bf16 = cast(DType::I64, vec![33685505.0], DType::BF16);
    assert_eq!(to_bf16.as_f32().unwrap(), &[33554432.0]);
}

#[test]
fn maximum_and_minimum_order_signed_zeros_and_propagate_nan() {
    let a = Tensor::from_f32(DType::F32, vec![4], vec![-0.0, 0.0, f32::NAN, 1.0]).unwrap();
    let b = Tensor::from_f32(DType::F32, vec![4], vec![0.0, -0.0, 1.0, f32::NAN]).unwrap();
    let max = run_op(&[&a, &b], |g, i| g.maximum(i[0], i[1]).unwrap());
    let min = run_op(&[&a, &b], |g, i| g.minimum(i[0], i[1]).unwrap());
    let (mx, mn) = (max.as_f32().unwrap(), min.as_f32().unwrap());
    // IEEE 754-2019 maximum/minimum: −0 < +0 whatever the operand order.
    assert_eq!(mx[0].to_bits(), 0f32.to_bits());
    assert_eq!(mx[1].to_bits(), 0f32.to_bits());
    assert_eq!(mn[0].to_bits(), (-0f32).to_bits());
    assert_eq!(mn[1].to_bits(), (-0f32).to_bits());
    assert!(mx[2].is_nan() && mx[3].is_nan() && mn[2].is_nan() && mn[3].is_nan());
}

#[test]
fn integer_arithmetic_wraps_at_the_dtype_width() {
    let a = Tensor::from_i64(
        DType::I32,
        vec![3],
        vec![i64::from(i32::MAX), i64::from(i32::MIN), 65536],
    )
    .unwrap();
    let b = Tensor::from_i64(DType::I32, vec![3], vec![1, -1, 65536]).unwrap();
    let add = run_op(&[&a, &b], |g, i| g.add(i[0], i[1]).unwrap());
    assert_eq!(
        add.as_i64().unwrap(),
        &[i64::from(i32::MIN), i64::from(i32::MAX), 131072]
    );
    let mul = run_op(&[&a, &b], |g, i| g.mul(i[0], i[1]).unwrap());
    assert_eq!(
        mul.as_i64().unwrap(),
        &[i64::from(i32::MAX), i64::from(i32::MIN), 0]
    );
    let neg = run_op(&[&a], |g, i| g.neg(i[0]).unwrap());
    assert_eq!(neg.as_i64().unwrap()[1], i64::from(i32::MIN));
    // Comparisons see the wrapped value: i32::MAX + 1 is negative.
    let zero = Tensor::from_i64(DType::I32, vec![], vec![0]).unwrap();
    let mut g = Graph::new("wrap");
    let (x, y, z) = (
        g.input("a", DType::I32, &[3]).unwrap(),
        g.input("b", DType::I32, &[3]).unwrap(),
        g.input("c", DType::I32, &[]).unwrap(),
    );
    let s = g.add(x, y).unwrap();
    let lt = g.less(s, z).unwrap();
    g.add_output(lt).unwrap();
    let out = run_with(
        &g,
        vec![("a", a.clone()), ("b", b.clone()), ("c", zero.clone())],
    );
    assert_eq!(out.as_i64().unwrap(), &[1, 0, 0]);
    // Fused, the sum still wraps before the comparison.
    let (fused, _) = rocmforge::passes::optimize(&g).unwrap();
    assert!(fused
        .node_ids()
        .any(|id| matches!(fused.op(id), rocmforge::ir::Op::FusedElementwise(_))));
    let out = run_with(&fused, vec![("a", a), ("b", b), ("c", zero)]);
    assert_eq!(out.as_i64().unwrap(), &[1, 0, 0]);
}

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

/// A Gemm reading a head-merged A (`[B, H, S, D]` as `[B·S, H·D]`) and a `[N, K]` weight
/// transposed, adding a broadcast bias and applying GELU, and writing the result head-split
/// (`[B, H', S, D']`), against f64 loops over the unfused definition.
#[test]
fn gemm_reads_and_writes_through_views_with_an_epilogue() {
    let mut r = rng(12);
    let (b, h, s, d, h2, d2) = (2, 3, 5, 4, 2, 3);
    let (k, n) = (h * d, h2 * d2);
    for dtype in FLOATS {
        let (o, ov) = random_tensor(&mut r, dtype, &[b, h, s, d]);
        let (w, wv) = random_tensor(&mut r, dtype, &[n, k]);
        let (bias, biasv) = random_tensor(&mut r, dtype, &[n]);
        let gemm = gemm_cases::heads_bias_gelu(b, h, s, d, h2, d2);
        let out = run_op(&[&o, &w, &bias], |g, i| {
            g.gemm(gemm.clone(), i[0], i[1], &[i[2]]).unwrap()
        });
        assert_eq!(out.shape().dims(), &[b, h2, s, d2]);
        let mut want = vec![0.0; out.len()];
        for bi in 0..b {
            for si in 0..s {
                for hj in 0..h2 {
                    for dj in 0..d2 {
                        let col = hj * d2 + dj;
                        let mut sum = 0.0;
                        for hi in 0..h {
                            for di in 0..d {
                                sum += ov[((bi * h + hi) * s + si) * d + di]
                                    * wv[col * k + hi * d + di];
                            }
                        }
                        let x = round_to(dtype, round_to(dtype, sum) + biasv[col]);
                        let gelu = unary_ref(UnaryOp::Gelu, x);
                        want[((bi * h2 + hj) * s + si) * d2 + dj] = round_to(dtype, gelu);
                    }
                }
            }
        }
        let tol = if dtype == DType::F32 { 1e-5 } else { 1e-2 };
        assert!(rel_l2(&out.to_f64_vec(), &want) < tol, "gemm {dtype}");
    }
}

/// A Gemm whose out view misses elements, or whose A view reads past its tensor, is refused
/// when the node is built.
#[test]
fn gemm_views_are_checked() {
    use rocmforge::ir::{Gemm, GemmDims, Shape, View};
    let mut g = Graph::new("bad_gemm");
    let a = g.input("a", DType::F32, &[4, 3]).unwrap();
    let b = g.input("b", DType::F32, &[3, 2]).unwrap();
    let dims = GemmDims {
        batch: vec![],
        m: vec![4],
        n: vec![2],
        k: vec![3],
    };
    let good = Gemm {
        dims: dims.clone(),
        a: View::contiguous(&dims, rocmforge::ir::gemm::Operand::A),
        b: View::contiguous(&dims, rocmforge::ir::gemm::Operand::B),
        out: View::contiguous(&dims, rocmforge::ir::gemm::Operand::Out),
        extras: vec![],
        epilogue: None,
        shape: Shape(vec![4, 2]),
    };
    assert!(g.gemm(good.clone(), a, b, &[]).is_ok());
    let mut overlapping = good.clone();
    overlapping.out.rows = vec![1];
    let err = g.gemm(overlapping, a, b, &[]).unwrap_err().to_string();
    assert!(err.contains("exactly once"), "{err}");
    let mut past = good.clone();
    past.a.rows = vec![4];
    let err = g.gemm(past, a, b, &[]).unwrap_err().to_string();
    assert!(err.contains("reaches element"), "{err}");
    let mut short = good;
    short.b.cols = vec![];
    let err = g.gemm(short, a, b, &[]).unwrap_err().to_string();
    assert!(err.contains("strides"), "{err}");
}

#[path = "common/decode_step.rs"]
mod decode_step;
#[path = "interp/state.rs"]
mod state;
/// Quantized weights: the value the interpreter computes with is the blocks dequantized in f32
/// and rounded to the weight's dtype, bit for bit what a dense weight holding those values gives.
mod quantized {
    use rocmforge::interp::{run, Bindings, InterpError};
    use rocmforge::ir::{
        random_input, random_quant, DType, Graph, GraphError, Op, QuantScheme, Sample, Shape,
        Tensor,
    };

    /// `silu(x · Wᵀ)` with W [n, k] quantized (`scheme`) or dense (`None`).
    fn layer(dtype: DType, scheme: Option<QuantScheme>, m: usize, n: usize, k: usize) -> Graph {
        let mut g = Graph::new("layer");
        let x = g.input("x", dtype, &[m, k]).unwrap();
        let w = match scheme {
            Some(s) => g.weight_quant("w", dtype, &[n, k], s).unwrap(),
            None => g.weight("w", dtype, &[n, k]).unwrap(),
        };
        let wt = g.permute(w, &[1, 0]).unwrap();
        let y = g.matmul(x, wt).unwrap();
        let y = g.unary(rocmforge::ir::UnaryOp::Silu, y).unwrap();
        g.add_output(y).unwrap();
        g
    }

    #[test]
    fn a_quantized_weight_is_its_dequantized_value_bit_for_bit() {
        for scheme in QuantScheme::ALL {
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                let (m, n, k) = (3, 17, 3 * scheme.block_elems());
                let blocks = random_quant("w", scheme, &Shape(vec![n, k]), 5).unwrap();
                let x = random_input(
                    "x",
                    &rocmforge::ir::TensorType::new(dtype, vec![m, k]),
                    &Sample::Normal,
                    1,
                )
                .unwrap();
                let q = layer(dtype, Some(scheme), m, n, k);
                let mut bq = Bindings::default().with_input("x", x.clone());
                bq.quantized.insert("w".into(), blocks.clone());
                let got = run(&q, &bq).unwrap().remove(0);
                let d = layer(dtype, None, m, n, k);
                let mut bd = Bindings::default().with_input("x", x);
                bd.weights
                    .insert("w".into(), blocks.to_tensor(dtype).unwrap());
                let want = run(&d, &bd).unwrap().remove(0);
                assert_eq!(got, want, "{scheme} {dtype}");
            }
        }
    }

    #[test]
    fn unbound_blocks_are_seeded() {
        let g = layer(DType::F32, Some(QuantScheme::Q4_1), 2, 5, 64);
        let b = Bindings::try_random(&g, 3).unwrap();
        let first = run(&g, &b).unwrap().remove(0);
        assert_eq!(first, run(&g, &b).unwrap().remove(0));
        let mut with = b.clone();
        with.quantized.insert(
            "w".into(),
            random_quant("w", QuantScheme::Q4_1, &Shape(vec![5, 64]), 3).unwrap(),
        );
        assert_eq!(first, run(&g, &with).unwrap().remove(0));
        assert!(first.to_f64_vec().iter().any(|&v| v != 0.0));
    }

    #[test]
    fn a_row_of_partial_blocks_is_a_typed_error() {
        let mut g = Graph::new("bad");
        let err = g
            .weight_quant("w", DType::F32, &[4, 40], QuantScheme::Q8_0)
            .unwrap_err();
        assert!(
            matches!(&err, GraphError::BadAttribute { reason, .. } if reason.contains("rows of 40")),
            "{err}"
        );
        let err = g
            .weight_quant("w", DType::I32, &[4, 32], QuantScheme::Q8_0)
            .unwrap_err();
        assert!(matches!(err, GraphError::BadAttribute { .. }), "{err}");
    }

    #[test]
    fn bindings_that_are_not_the_declared_blocks_are_refused() {
        let g = layer(DType::F32, Some(QuantScheme::Q4_0), 1, 3, 32);
        let x = Tensor::from_f32(DType::F32, vec![1, 32], vec![0.5; 32]).unwrap();
        let shape = Shape(vec![3, 32]);
        let bind = |q: Option<QuantScheme>, dense: bool| {
            let mut b = Bindings::default().with_input("x", x.clone());
            if let Some(s) = q {
                b.quantized
                    .insert("w".into(), random_quant("w", s, &shape, 0).unwrap());
            }
            if dense {
                b.weights.insert(
                    "w".into(),
                    Tensor::from_f32(DType::F32, vec![3, 32], vec![1.0; 96]).unwrap(),
                );
            }
            run(&g, &b)
        };
        assert!(bind(Some(QuantScheme::Q4_0), false).is_ok());
        for (q, dense) in [(Some(QuantScheme::Q8_0), false), (None, true)] {
            match bind(q, dense) {
                Err(InterpError::QuantBinding { name, .. }) if name == "w" => {}
                other => panic!("{q:?} dense={dense}: {other:?}"),
            }
        }
        // Blocks bound to a dense weight are refused too.
        let d = layer(DType::F32, None, 1, 3, 32);
        let mut b = Bindings::default().with_input("x", x);
        b.quantized.insert(
            "w".into(),
            random_quant("w", QuantScheme::Q4_0, &shape, 0).unwrap(),
        );
        assert!(matches!(run(&d, &b), Err(InterpError::QuantBinding { .. })));
    }

    #[test]
    fn the_file_format_keeps_the_scheme() {
        let g = layer(DType::F16, Some(QuantScheme::Q4_1), 2, 3, 64);
        let text = rocmforge::ir::format::to_json_string(&g).unwrap();
        assert!(text.contains("\"quant\": \"q4_1\""), "{text}");
        let back = rocmforge::ir::format::from_json_str(&text).unwrap();
        let w = back.find("w").unwrap();
        assert!(matches!(
            back.op(w),
            Op::Weight {
                quant: Some(QuantScheme::Q4_1),
                ..
            }
        ));
    }
}
