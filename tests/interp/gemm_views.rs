//! Gemm reading and writing through views, with an epilogue, and the checks on those views.

use super::*;

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
        prologue: None,
        paired: false,
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

/// A Gemm with a prologue normalises A's rows over K's flat index before the product (here a
/// head-merged A, so K is (head, d) read across heads), the normalised value rounded to A's
/// dtype, against f64 loops over that definition; RMSNorm and LayerNorm.
#[test]
fn gemm_prologue_normalises_a_rows_over_k() {
    use rocmforge::ir::{NormKind, Prologue};
    let mut r = rng(13);
    let (b, h, s, d, h2, d2) = (2, 3, 5, 4, 2, 3);
    let (k, n) = (h * d, h2 * d2);
    for dtype in FLOATS {
        for norm in [NormKind::Rms, NormKind::Layer] {
            let (o, ov) = random_tensor(&mut r, dtype, &[b, h, s, d]);
            let (w, wv) = random_tensor(&mut r, dtype, &[n, k]);
            let (bias, biasv) = random_tensor(&mut r, dtype, &[n]);
            let (nw, nwv) = random_tensor(&mut r, dtype, &[k]);
            let (nb, nbv) = random_tensor(&mut r, dtype, &[k]);
            let mut gemm = gemm_cases::heads_bias_gelu(b, h, s, d, h2, d2);
            let eps = 1e-5;
            gemm.prologue = Some(Prologue { norm, eps });
            let layer = norm == NormKind::Layer;
            let ins: Vec<&Tensor> = if layer {
                vec![&o, &w, &bias, &nw, &nb]
            } else {
                vec![&o, &w, &bias, &nw]
            };
            let out = run_op(&ins, |g, i| {
                let mut extras = vec![i[2], i[3]];
                if layer {
                    extras.push(i[4]);
                }
                g.gemm(gemm.clone(), i[0], i[1], &extras).unwrap()
            });
            let mut want = vec![0.0; out.len()];
            for bi in 0..b {
                for si in 0..s {
                    let row: Vec<f64> = (0..k)
                        .map(|kk| ov[((bi * h + kk / d) * s + si) * d + kk % d])
                        .collect();
                    let mean = if layer {
                        row.iter().sum::<f64>() / k as f64
                    } else {
                        0.0
                    };
                    let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / k as f64;
                    let inv = 1.0 / (var + eps).sqrt();
                    let a: Vec<f64> = (0..k)
                        .map(|kk| {
                            let v = (row[kk] - mean) * inv * nwv[kk];
                            round_to(dtype, if layer { v + nbv[kk] } else { v })
                        })
                        .collect();
                    for hj in 0..h2 {
                        for dj in 0..d2 {
                            let col = hj * d2 + dj;
                            let sum: f64 = (0..k).map(|kk| a[kk] * wv[col * k + kk]).sum();
                            let x = round_to(dtype, round_to(dtype, sum) + biasv[col]);
                            let gelu = unary_ref(UnaryOp::Gelu, x);
                            want[((bi * h2 + hj) * s + si) * d2 + dj] = round_to(dtype, gelu);
                        }
                    }
                }
            }
            let tol = if dtype == DType::F32 { 1e-5 } else { 1e-2 };
            let err = rel_l2(&out.to_f64_vec(), &want);
            assert!(err < tol, "gemm {dtype} {norm:?}: {err:e}");
        }
    }
}

/// A prologue's parameters are checked when the node is built: one `[K]` tensor per
/// parameter, a finite eps.
#[test]
fn gemm_prologue_parameters_are_checked() {
    use rocmforge::ir::{NormKind, Prologue};
    let (b, h, s, d, h2, d2) = (1, 2, 3, 4, 1, 3);
    let k = h * d;
    let mut gemm = gemm_cases::heads_bias_gelu(b, h, s, d, h2, d2);
    gemm.prologue = Some(Prologue {
        norm: NormKind::Layer,
        eps: 1e-5,
    });
    let mut g = Graph::new("bad_prologue");
    let o = g.input("o", DType::F32, &[b, h, s, d]).unwrap();
    let w = g.input("w", DType::F32, &[h2 * d2, k]).unwrap();
    let bias = g.input("bias", DType::F32, &[h2 * d2]).unwrap();
    let nw = g.input("nw", DType::F32, &[k]).unwrap();
    let short = g.input("short", DType::F32, &[k - 1]).unwrap();
    // LayerNorm without its bias; a bias of the wrong length; then the right operands.
    assert!(g.gemm(gemm.clone(), o, w, &[bias, nw]).is_err());
    assert!(g.gemm(gemm.clone(), o, w, &[bias, nw, short]).is_err());
    let mut nan = gemm.clone();
    nan.prologue = Some(Prologue {
        norm: NormKind::Layer,
        eps: f64::NAN,
    });
    assert!(g.gemm(nan, o, w, &[bias, nw, nw]).is_err());
    assert!(g.gemm(gemm, o, w, &[bias, nw, nw]).is_ok());
}
