//! Norms, RoPE, matmul, layout ops and gather against f64 references.

use super::*;

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
