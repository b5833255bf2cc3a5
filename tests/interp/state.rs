//! Issue 15, items 4 and 5 in the interpreter: states and the cache write, rope at positions
//! from data, attention over `kv_len` valid keys, argmax; each against an f64 reference written
//! here, with the typed errors of out-of-range writes and bad operands, and one decode step of a
//! GQA layer run token by token through its cache against the same layer over the whole prompt.

use std::collections::HashMap;

use super::common::*;
use super::decode_step::SMALL;
use rocmforge::interp::{self, Bindings, InterpError};
use rocmforge::ir::{format, to_text, DType, Graph, GraphError, NodeId, Tensor};

fn i32s(v: &[i64]) -> Tensor {
    Tensor::from_i64(DType::I32, vec![v.len()], v.to_vec()).unwrap()
}

/// Runs `g` with `inputs` and `states` by name; outputs and next states.
fn run_state(
    g: &Graph,
    inputs: Vec<(&str, Tensor)>,
    states: Vec<(&str, Tensor)>,
) -> Result<(Vec<Tensor>, HashMap<String, Tensor>), InterpError> {
    let mut b = Bindings::default();
    for (n, t) in inputs {
        b.inputs.insert(n.into(), t);
    }
    let states: HashMap<String, Tensor> = states.into_iter().map(|(n, t)| (n.into(), t)).collect();
    interp::run_with_state(g, &b, &HashMap::new(), &states)
}

/// A graph writing `values` of shape `vshape` into state `s` of `sshape` along `axis`.
fn write_graph(dtype: DType, sshape: &[usize], vshape: &[usize], axis: i64) -> Graph {
    let mut g = Graph::new("write");
    let s = g.state("s", dtype, sshape).unwrap();
    let v = g.input("v", dtype, vshape).unwrap();
    let start = g.input("start", DType::I32, &[1]).unwrap();
    let w = g.cache_write(s, v, start, axis).unwrap();
    g.set_outputs(&[w]).unwrap();
    g
}

#[test]
fn cache_write_places_values_at_start_along_the_axis() {
    let mut r = rng(150);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (sshape, vshape, axis, start) in [
            ([2usize, 7, 3], [2usize, 2, 3], 1i64, 4usize),
            ([2, 7, 3], [2, 7, 3], 1, 0),
            ([3, 5, 9], [3, 5, 1], -1, 8),
            ([5, 1, 3], [2, 1, 3], 0, 3),
        ] {
            let g = write_graph(dtype, &sshape, &vshape, axis);
            let (st, sv) = random_tensor(&mut r, dtype, &sshape);
            let (vt, vv) = random_tensor(&mut r, dtype, &vshape);
            let ax = if axis < 0 { 2 } else { axis as usize };
            let (outs, next) = run_state(
                &g,
                vec![("v", vt), ("start", i32s(&[start as i64]))],
                vec![("s", st)],
            )
            .unwrap();
            let want: Vec<f64> = (0..sv.len())
                .map(|i| {
                    let idx = unravel(i, &sshape);
                    let row = idx[ax];
                    if row >= start && row < start + vshape[ax] {
                        let mut vi = idx.clone();
                        vi[ax] = row - start;
                        vv[ravel(&vi, &vshape)]
                    } else {
                        sv[i]
                    }
                })
                .collect();
            assert_eq!(outs[0].to_f64_vec(), want, "{dtype} {sshape:?} at {start}");
            assert_eq!(next["s"], outs[0], "the write's result is the next state");
        }
    }
}

#[test]
fn cache_write_outside_the_state_is_a_typed_error() {
    let g = write_graph(DType::F32, &[1, 7, 2], &[1, 2, 2], 1);
    for start in [-1i64, 6, 7, i64::from(i32::MAX), i64::from(i32::MIN)] {
        let err = run_state(
            &g,
            vec![
                ("v", Tensor::zeros(&g.ty(g.find("v").unwrap()).clone())),
                ("start", i32s(&[start])),
            ],
            vec![("s", Tensor::zeros(&g.ty(g.find("s").unwrap()).clone()))],
        )
        .unwrap_err();
        assert!(
            matches!(
                &err,
                InterpError::CacheWriteOutOfRange { start: s, len: 2, size: 7, .. } if *s == start
            ),
            "start {start}: {err}"
        );
    }
    // The last valid start writes the last rows.
    let ok = run_state(
        &g,
        vec![
            (
                "v",
                Tensor::from_f64(DType::F32, vec![1, 2, 2], &[1.0; 4]).unwrap(),
            ),
            ("start", i32s(&[5])),
        ],
        vec![("s", Tensor::zeros(&g.ty(g.find("s").unwrap()).clone()))],
    )
    .unwrap();
    assert_eq!(ok.0[0].to_f64_vec(), [vec![0.0; 10], vec![1.0; 4]].concat());
}

#[test]
fn cache_write_operands_are_checked() {
    let mut g = Graph::new("bad");
    let s = g.state("s", DType::F32, &[4, 8]).unwrap();
    let x = g.input("x", DType::F32, &[4, 8]).unwrap();
    let start = g.input("start", DType::I32, &[1]).unwrap();
    let fstart = g.input("fstart", DType::F32, &[1]).unwrap();
    let two = g.input("two", DType::I32, &[2]).unwrap();
    let v16 = g.input("v16", DType::F16, &[4, 2]).unwrap();
    let long = g.input("long", DType::F32, &[4, 9]).unwrap();
    let wrong_rows = g.input("rows", DType::F32, &[3, 2]).unwrap();
    let v = g.input("v", DType::F32, &[4, 2]).unwrap();
    let kind = |r: Result<NodeId, GraphError>| r.unwrap_err().kind();
    assert_eq!(kind(g.cache_write(s, v, fstart, 1)), "dtype_mismatch");
    assert_eq!(kind(g.cache_write(s, v, two, 1)), "dtype_mismatch");
    assert_eq!(kind(g.cache_write(s, v16, start, 1)), "dtype_mismatch");
    assert_eq!(kind(g.cache_write(s, long, start, 1)), "shape_mismatch");
    assert_eq!(
        kind(g.cache_write(s, wrong_rows, start, 1)),
        "shape_mismatch"
    );
    assert_eq!(kind(g.cache_write(s, v, start, 2)), "bad_attribute");

    // Writing a value that is not a state: refused by validation, and by the interpreter.
    let mut g2 = g.clone();
    let w = g2.cache_write(x, v, start, 1).unwrap();
    g2.set_outputs(&[w]).unwrap();
    let err = g2.validate().unwrap_err();
    assert_eq!(err.kind(), "state_write", "{err}");
    let b = Bindings::random(&g2, 1);
    assert!(matches!(
        interp::run(&g2, &b),
        Err(InterpError::Graph(GraphError::StateWrite { .. }))
    ));

    // A state read by anything besides its write cannot be written in place.
    let mut g3 = g.clone();
    let w = g3.cache_write(s, v, start, 1).unwrap();
    let also = g3.add(s, x).unwrap();
    g3.set_outputs(&[w, also]).unwrap();
    assert_eq!(g3.validate().unwrap_err().kind(), "state_write");
    let mut g4 = g.clone();
    let w = g4.cache_write(s, v, start, 1).unwrap();
    g4.set_outputs(&[w, s]).unwrap();
    assert_eq!(g4.validate().unwrap_err().kind(), "state_write");
}

#[test]
fn states_are_given_by_name_and_checked() {
    let g = write_graph(DType::F32, &[2, 5], &[2, 1], 1);
    let v = Tensor::zeros(&g.ty(g.find("v").unwrap()).clone());
    let s = Tensor::zeros(&g.ty(g.find("s").unwrap()).clone());
    let inputs = || vec![("v", v.clone()), ("start", i32s(&[0]))];
    assert!(matches!(
        run_state(&g, inputs(), vec![]),
        Err(InterpError::MissingState { ref name, .. }) if name == "s"
    ));
    assert!(matches!(
        run_state(&g, inputs(), vec![("s", s.clone()), ("t", s.clone())]),
        Err(InterpError::UnknownState { ref name }) if name == "t"
    ));
    assert!(matches!(
        run_state(&g, inputs(), vec![("v", s.clone()), ("s", s.clone())]),
        Err(InterpError::UnknownState { ref name }) if name == "v"
    ));
    let wrong = Tensor::zeros(&rocmforge::ir::TensorType::new(DType::F32, vec![2, 6]));
    assert!(matches!(
        run_state(&g, inputs(), vec![("s", wrong)]),
        Err(InterpError::BindingType { .. })
    ));
    // A plain run starts from zeros.
    let mut b = Bindings::default();
    b.inputs.insert(
        "v".into(),
        Tensor::from_f64(DType::F32, vec![2, 1], &[3.0, 4.0]).unwrap(),
    );
    b.inputs.insert("start".into(), i32s(&[2]));
    let out = interp::run(&g, &b).unwrap().remove(0);
    assert_eq!(
        out.to_f64_vec(),
        [0.0, 0.0, 3.0, 0.0, 0.0, 0.0, 0.0, 4.0, 0.0, 0.0]
    );
    // A state nothing writes keeps its value.
    let mut g2 = Graph::new("read_only");
    let s2 = g2.state("kept", DType::F32, &[3]).unwrap();
    let n = g2.neg(s2).unwrap();
    g2.set_outputs(&[n]).unwrap();
    let kept = Tensor::from_f64(DType::F32, vec![3], &[1.0, 2.0, 3.0]).unwrap();
    let (outs, next) = run_state(&g2, vec![], vec![("kept", kept.clone())]).unwrap();
    assert_eq!(outs[0].to_f64_vec(), [-1.0, -2.0, -3.0]);
    assert_eq!(next["kept"], kept);
}

/// Rotate-half rope at explicit positions, in f64.
fn rope_ref(x: &[f64], dims: &[usize], pos: &[i64], theta: f64) -> Vec<f64> {
    let (s, d) = (dims[dims.len() - 2], dims[dims.len() - 1]);
    let half = d / 2;
    let mut out = x.to_vec();
    for (r, row) in x.chunks(d).enumerate() {
        let p = pos[r % s] as f64;
        for i in 0..half {
            let a = p * theta.powf(-2.0 * i as f64 / d as f64);
            let (sn, cs) = a.sin_cos();
            out[r * d + i] = row[i] * cs - row[i + half] * sn;
            out[r * d + i + half] = row[i + half] * cs + row[i] * sn;
        }
    }
    out
}

#[test]
fn rope_reads_positions_from_data() {
    let mut r = rng(151);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let dims = [2usize, 3, 5, 18];
        let (x, xv) = random_tensor(&mut r, dtype, &dims);
        let pos = [7i64, 0, 4095, 3, 8191];
        let out = run_op(&[&x, &i32s(&pos)], |g, i| {
            g.rope_at(i[0], i[1], 100000.0).unwrap()
        });
        let want: Vec<f64> = rope_ref(&xv, &dims, &pos, 100000.0)
            .into_iter()
            .map(|v| f64::from(dtype.round_f32(v as f32)))
            .collect();
        assert_close(&out.to_f64_vec(), &want, dtype, &format!("rope {dtype}"));
    }
    // Positions offset..offset+S give the attribute form exactly.
    let (x, _) = random_tensor(&mut r, DType::F32, &[1, 2, 4, 8]);
    let at = run_op(&[&x, &i32s(&[11, 12, 13, 14])], |g, i| {
        g.rope_at(i[0], i[1], 10000.0).unwrap()
    });
    let attr = run_op(&[&x], |g, i| g.rope(i[0], 10000.0, 11).unwrap());
    assert_eq!(at, attr);
}

#[test]
fn rope_positions_are_checked() {
    let mut g = Graph::new("bad");
    let x = g.input("x", DType::F32, &[1, 2, 4, 8]).unwrap();
    let p3 = g.input("p3", DType::I32, &[3]).unwrap();
    let p64 = g.input("p64", DType::I64, &[4]).unwrap();
    let pf = g.input("pf", DType::F32, &[4]).unwrap();
    let p = g.input("p", DType::I32, &[4]).unwrap();
    assert_eq!(g.rope_at(x, p3, 1e4).unwrap_err().kind(), "shape_mismatch");
    assert_eq!(g.rope_at(x, p64, 1e4).unwrap_err().kind(), "dtype_mismatch");
    assert_eq!(g.rope_at(x, pf, 1e4).unwrap_err().kind(), "dtype_mismatch");
    let both = g.add_op(
        rocmforge::ir::Op::Rope {
            theta: 1e4,
            offset: 2,
            factors: Vec::new(),
        },
        &[x, p],
    );
    assert_eq!(both.unwrap_err().kind(), "bad_attribute");
}

/// Attention in f64: batch `b` sees its first `lens[b]` keys; causal puts the queries at the
/// last Sq of those positions.
#[allow(clippy::too_many_arguments)]
fn attention_ref(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    [b, hq, sq, d]: [usize; 4],
    [hkv, sk, dv]: [usize; 3],
    lens: &[usize],
    causal: bool,
    scale: f64,
) -> Vec<f64> {
    let mut out = vec![0.0; b * hq * sq * dv];
    for bi in 0..b {
        for h in 0..hq {
            let kh = h / (hq / hkv);
            for i in 0..sq {
                let qrow = &q[((bi * hq + h) * sq + i) * d..][..d];
                let last = lens[bi] as i64 - sq as i64 + i as i64;
                let keys: Vec<usize> = (0..lens[bi])
                    .filter(|&j| !causal || j as i64 <= last)
                    .collect();
                let scores: Vec<f64> = keys
                    .iter()
                    .map(|&j| {
                        let krow = &k[((bi * hkv + kh) * sk + j) * d..][..d];
                        scale * qrow.iter().zip(krow).map(|(a, c)| a * c).sum::<f64>()
                    })
                    .collect();
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let sum: f64 = e.iter().sum();
                for c in 0..dv {
                    let o = &mut out[((bi * hq + h) * sq + i) * dv + c];
                    *o = keys
                        .iter()
                        .zip(&e)
                        .map(|(&j, p)| p * v[((bi * hkv + kh) * sk + j) * dv + c])
                        .sum::<f64>()
                        / if sum > 0.0 { sum } else { 1.0 };
                }
            }
        }
    }
    out
}

/// `t` with every key row at index ≥ `lens[b]` of batch `b` set to NaN ([B, H, Sk, D]).
fn poison_tail(t: &Tensor, lens: &[usize]) -> Tensor {
    let dims = t.shape().dims().to_vec();
    let mut v = t.to_f64_vec();
    for (i, x) in v.iter_mut().enumerate() {
        let idx = unravel(i, &dims);
        if idx[2] >= lens[idx[0]] {
            *x = f64::NAN;
        }
    }
    Tensor::from_f64(t.dtype(), dims, &v).unwrap()
}

#[test]
fn attention_sees_only_kv_len_keys() {
    let mut r = rng(152);
    let (hq, hkv, sk, d, dv) = (9, 3, 37, 20, 12);
    for (b, sq, lens, causal) in [
        (1usize, 1usize, vec![1usize], true),
        (1, 1, vec![37], true),
        (1, 1, vec![17], false),
        (2, 3, vec![5, 37], true),
        (2, 3, vec![3, 30], false),
        (3, 2, vec![2, 9, 36], true),
        (1, 4, vec![4], true),
    ] {
        for dtype in [DType::F32, DType::F16] {
            let (q, qv) = random_tensor(&mut r, dtype, &[b, hq, sq, d]);
            let (k, kv) = random_tensor(&mut r, dtype, &[b, hkv, sk, d]);
            let (v, vv) = random_tensor(&mut r, dtype, &[b, hkv, sk, dv]);
            let lens_t = if lens.len() == 1 && b == 1 {
                i32s(&[lens[0] as i64])
            } else {
                i32s(&lens.iter().map(|&l| l as i64).collect::<Vec<_>>())
            };
            let scale = 1.0 / (d as f64).sqrt();
            let run = |k: &Tensor, v: &Tensor| {
                run_op(&[&q, k, v, &lens_t], |g, i| {
                    g.flash_attention_len((i[0], i[1], i[2]), i[3], scale, causal)
                        .unwrap()
                })
            };
            let got = run(&k, &v);
            let want: Vec<f64> = attention_ref(
                &qv,
                &kv,
                &vv,
                [b, hq, sq, d],
                [hkv, sk, dv],
                &lens,
                causal,
                scale,
            );
            let what = format!("{dtype} b{b} sq{sq} lens {lens:?} causal {causal}");
            let tol = if dtype == DType::F32 { 1e-6 } else { 2e-3 };
            let err = rel_l2(&got.to_f64_vec(), &want);
            assert!(err <= tol, "{what}: relative L2 {err:e}");
            // The tail of the cache holds poison: nothing changes.
            let poisoned = run(&poison_tail(&k, &lens), &poison_tail(&v, &lens));
            assert_eq!(
                poisoned.to_f64_vec(),
                got.to_f64_vec(),
                "{what}: a poisoned tail changed the output"
            );
        }
    }
}

#[test]
fn kv_len_is_checked() {
    let mut g = Graph::new("kv");
    let q = g.input("q", DType::F32, &[2, 4, 1, 8]).unwrap();
    let k = g.input("k", DType::F32, &[2, 2, 9, 8]).unwrap();
    let l3 = g.input("l3", DType::I32, &[3]).unwrap();
    let lf = g.input("lf", DType::F32, &[1]).unwrap();
    let l = g.input("l", DType::I32, &[2]).unwrap();
    assert_eq!(
        g.flash_attention_len((q, k, k), l3, 1.0, false)
            .unwrap_err()
            .kind(),
        "shape_mismatch"
    );
    assert_eq!(
        g.flash_attention_len((q, k, k), lf, 1.0, false)
            .unwrap_err()
            .kind(),
        "dtype_mismatch"
    );
    let o = g.flash_attention_len((q, k, k), l, 1.0, true).unwrap();
    g.set_outputs(&[o]).unwrap();
    for bad in [[-1i64, 3], [3, 10]] {
        let mut b = Bindings::random(&g, 3);
        b.inputs.insert("l".into(), i32s(&bad));
        for n in ["l3", "lf"] {
            b.inputs.remove(n);
        }
        let mut g2 = g.clone();
        for n in ["l3", "lf"] {
            let id = g2.find(n).unwrap();
            g2.remove_node(id);
        }
        let err = interp::run(&g2, &b).unwrap_err();
        let v = if bad[0] < 0 { bad[0] } else { bad[1] };
        assert!(
            matches!(err, InterpError::KvLenOutOfRange { kv_len, keys: 9, .. } if kv_len == v),
            "{bad:?}: {err}"
        );
    }
    // kv_len 0 sees no key: zeros, as a row with no visible key.
    let mut g2 = g.clone();
    for n in ["l3", "lf"] {
        let id = g2.find(n).unwrap();
        g2.remove_node(id);
    }
    let mut b = Bindings::random(&g2, 4);
    b.inputs.insert("l".into(), i32s(&[0, 9]));
    let out = interp::run(&g2, &b).unwrap().remove(0).to_f64_vec();
    assert!(out[..32].iter().all(|&x| x == 0.0));
    assert!(out[32..].iter().any(|&x| x != 0.0));
}

#[test]
fn argmax_takes_the_first_maximum_and_the_first_nan() {
    let mut r = rng(153);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (dims, axis) in [
            (vec![3usize, 33], -1i64),
            (vec![3, 33], 0),
            (vec![2, 5, 7], 1),
            (vec![1], 0),
        ] {
            let (x, xv) = random_tensor(&mut r, dtype, &dims);
            let out = run_op(&[&x], |g, i| g.argmax(i[0], axis).unwrap());
            let ax = if axis < 0 {
                dims.len() - 1
            } else {
                axis as usize
            };
            let mut out_dims = dims.clone();
            out_dims.remove(ax);
            assert_eq!(out.dtype(), DType::I32);
            assert_eq!(out.shape().dims(), &out_dims[..]);
            let got = out.to_f64_vec();
            for (o, &g) in got.iter().enumerate() {
                let oi = unravel(o, &out_dims);
                let at = |j: usize| {
                    let mut idx = oi.clone();
                    idx.insert(ax, j);
                    xv[ravel(&idx, &dims)]
                };
                let mut best = 0;
                for j in 1..dims[ax] {
                    if at(j) > at(best) {
                        best = j;
                    }
                }
                assert_eq!(g, best as f64, "{dtype} {dims:?} axis {axis} row {o}");
            }
        }
    }
    // Ties go to the first index; a NaN beats every number and the first NaN wins
    // (torch.argmax); -inf rows pick index 0.
    let rows = [
        vec![1.0, 3.0, 3.0, 2.0, 3.0],
        vec![1.0, f64::NAN, 9.0, f64::NAN, f64::INFINITY],
        vec![f64::INFINITY, 0.0, f64::INFINITY, 1.0, 2.0],
        vec![f64::NEG_INFINITY; 5],
        vec![-0.0, 0.0, -1.0, -0.0, 0.0],
    ];
    let x = Tensor::from_f64(DType::F32, vec![5, 5], &rows.concat()).unwrap();
    let out = run_op(&[&x], |g, i| g.argmax(i[0], 1).unwrap());
    assert_eq!(out.to_f64_vec(), [1.0, 1.0, 0.0, 0.0, 0.0]);
    let mut g = Graph::new("bad");
    let e = g.input("e", DType::F32, &[3, 0]).unwrap();
    let n = g.input("n", DType::I32, &[3]).unwrap();
    assert_eq!(g.argmax(e, 1).unwrap_err().kind(), "shape_mismatch");
    assert_eq!(g.argmax(n, 0).unwrap_err().kind(), "dtype_mismatch");
    assert_eq!(g.argmax(e, 2).unwrap_err().kind(), "bad_attribute");
}

/// Decoding a prompt token by token through the cache gives, at every step, the logits and
/// token of the same layer run over the prompt at once; a cache whose unwritten tail is NaN
/// gives the same; and a write at the end of the context is the typed error.
#[test]
fn decode_steps_through_the_cache_equal_a_prefill() {
    let layer = SMALL;
    let step = layer.decode_step();
    step.validate().unwrap();
    let t_len = 11;
    let mut r = rng(154);
    let (x_all, _) = random_tensor(&mut r, DType::F32, &[1, t_len, layer.hidden]);
    let mut weights = HashMap::new();
    for (name, shape) in [
        ("w_q", [layer.hidden, layer.hq * layer.d]),
        ("w_k", [layer.hidden, layer.hkv * layer.d]),
        ("w_v", [layer.hidden, layer.hkv * layer.d]),
        ("w_out", [layer.hq * layer.d, layer.vocab]),
    ] {
        weights.insert(
            name.to_string(),
            random_tensor(&mut r, DType::F32, &shape).0,
        );
    }
    let prefill = layer.prefill(t_len);
    let mut pb = Bindings::default();
    pb.inputs.insert("x".into(), x_all.clone());
    let want = interp::run_with_weights(&prefill, &pb, &weights).unwrap();
    let (want_logits, want_tokens) = (want[0].to_f64_vec(), want[1].to_f64_vec());

    let cache_ty = step.ty(step.find("k_cache").unwrap()).clone();
    let nan = Tensor::from_f64(
        DType::F32,
        cache_ty.shape.clone(),
        &vec![f64::NAN; cache_ty.shape.numel()],
    )
    .unwrap();
    for start_states in [Tensor::zeros(&cache_ty), nan] {
        let mut states: HashMap<String, Tensor> = ["k_cache", "v_cache"]
            .iter()
            .map(|n| (n.to_string(), start_states.clone()))
            .collect();
        let xs = x_all.to_f64_vec();
        for t in 0..t_len {
            let x = Tensor::from_f64(
                DType::F32,
                vec![1, 1, layer.hidden],
                &xs[t * layer.hidden..][..layer.hidden],
            )
            .unwrap();
            let mut b = Bindings::default();
            b.inputs.insert("x".into(), x);
            b.inputs.insert("pos".into(), i32s(&[t as i64]));
            b.inputs.insert("kv_len".into(), i32s(&[t as i64 + 1]));
            let (outs, next) = interp::run_with_state(&step, &b, &weights, &states).unwrap();
            let got = outs[0].to_f64_vec();
            let want_t = &want_logits[t * layer.vocab..][..layer.vocab];
            let err = rel_l2(&got, want_t);
            assert!(err < 1e-5, "step {t}: logits relative L2 {err:e}");
            assert_eq!(outs[1].to_f64_vec(), [want_tokens[t]], "step {t}: token");
            states = next;
        }
    }
    // The last position of the context is writable; the one after it is not.
    let states: HashMap<String, Tensor> = ["k_cache", "v_cache"]
        .iter()
        .map(|n| (n.to_string(), Tensor::zeros(&cache_ty)))
        .collect();
    let last = layer.max_ctx as i64 - 1;
    for (pos, ok) in [(last, true), (last + 1, false)] {
        let mut b = Bindings::random(&step, 5);
        b.inputs.insert("pos".into(), i32s(&[pos]));
        b.inputs.insert("kv_len".into(), i32s(&[last + 1]));
        let r = interp::run_with_state(&step, &b, &weights, &states);
        assert_eq!(r.is_ok(), ok, "pos {pos}: {:?}", r.err());
        if !ok {
            assert!(matches!(
                r.unwrap_err(),
                InterpError::CacheWriteOutOfRange { start, len: 1, .. } if start == pos
            ));
        }
    }
}

#[test]
fn the_decode_step_graph_file_is_the_builders_graph_and_round_trips() {
    let built = SMALL.decode_step();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("graphs/decode_step.json");
    let text = format::to_json_string(&built).unwrap();
    if std::env::var_os("ROCMFORGE_WRITE_EXAMPLES").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    let loaded = format::load(&path).unwrap();
    assert_eq!(to_text(&loaded).unwrap(), to_text(&built).unwrap());
    assert_eq!(format::to_json_string(&loaded).unwrap(), text);
    let again = format::from_json_str(&text).unwrap();
    assert_eq!(to_text(&again).unwrap(), to_text(&built).unwrap());
}
