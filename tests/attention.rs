//! FlashAttention in the interpreter equals the unfused composition (MatMul, scale, mask,
//! Softmax, MatMul) built in the same graph, for causal, additive-mask, boolean-mask and GQA
//! cases, within f32 relative L2 error 1e-6.

mod common;

use common::*;
use rocmforge::interp::{run, Bindings};
use rocmforge::ir::{DType, Graph, NodeId, Tensor};

#[derive(Clone, Copy, Debug)]
enum Mask {
    None,
    /// Additive `[B, 1, 1, Sk]` padding mask (0 or a large negative).
    Padding,
    /// Additive mask of random values, `[Sq, Sk]`.
    Dense,
    /// Boolean `[B, 1, Sq, Sk]`, some query rows entirely false.
    Boolean,
}

struct Case {
    b: usize,
    hq: usize,
    hkv: usize,
    sq: usize,
    sk: usize,
    d: usize,
    causal: Option<i64>,
    mask: Mask,
}

fn mask_tensor(c: &Case, seed: u64) -> Option<Tensor> {
    let mut r = rng(seed);
    use rand::Rng;
    match c.mask {
        Mask::None => None,
        Mask::Padding => {
            let mut v = Vec::new();
            for _ in 0..c.b {
                let keep = r.random_range(1..=c.sk);
                v.extend((0..c.sk).map(|j| if j < keep { 0.0 } else { -1e9 }));
            }
            Some(Tensor::from_f64(DType::F32, vec![c.b, 1, 1, c.sk], &v).unwrap())
        }
        Mask::Dense => Some(random_tensor(&mut r, DType::F32, &[c.sq, c.sk]).0),
        Mask::Boolean => {
            let v: Vec<bool> = (0..c.b * c.sq * c.sk)
                .map(|i| {
                    let q = (i / c.sk) % c.sq;
                    q != 1 && r.random_bool(0.7) // query row 1 sees no key at all
                })
                .collect();
            Some(Tensor::from_bool(vec![c.b, 1, c.sq, c.sk], &v).unwrap())
        }
    }
}

/// Reshape → Expand → Reshape over a head-group axis, as LLaMA's repeat_kv.
fn repeat_kv(g: &mut Graph, x: NodeId, c: &Case, d: usize) -> NodeId {
    let n = c.hq / c.hkv;
    let r = g
        .reshape(x, &[c.b as i64, c.hkv as i64, 1, c.sk as i64, d as i64])
        .unwrap();
    let e = g.expand(r, &[c.b, c.hkv, n, c.sk, d]).unwrap();
    g.reshape(e, &[c.b as i64, c.hq as i64, c.sk as i64, d as i64])
        .unwrap()
}

fn check(c: Case, seed: u64) {
    let mut g = Graph::new("fa_vs_unfused");
    let q = g.input("q", DType::F32, &[c.b, c.hq, c.sq, c.d]).unwrap();
    let k = g.input("k", DType::F32, &[c.b, c.hkv, c.sk, c.d]).unwrap();
    let v = g.input("v", DType::F32, &[c.b, c.hkv, c.sk, c.d]).unwrap();
    let mask_t = mask_tensor(&c, seed + 100);
    let mask = mask_t
        .as_ref()
        .map(|m| g.input("mask", m.dtype(), m.shape().dims()).unwrap());
    let scale = 1.0 / (c.d as f64).sqrt();

    let fused = g.flash_attention(q, k, v, mask, scale, c.causal).unwrap();

    let (kr, vr) = if c.hq == c.hkv {
        (k, v)
    } else {
        (repeat_kv(&mut g, k, &c, c.d), repeat_kv(&mut g, v, &c, c.d))
    };
    let kt = g.transpose_last(kr).unwrap();
    let s = g.matmul(q, kt).unwrap();
    let sc = g.scalar(scale, DType::F32).unwrap();
    let mut s = g.mul(s, sc).unwrap();
    let ninf = g.scalar(f64::NEG_INFINITY, DType::F32).unwrap();
    if let Some(m) = mask {
        s = match c.mask {
            Mask::Boolean => g.where_(m, s, ninf).unwrap(),
            _ => g.add(s, m).unwrap(),
        };
    }
    if let Some(off) = c.causal {
        let cm = g.causal_mask(c.sq, c.sk, off).unwrap();
        s = g.where_(cm, s, ninf).unwrap();
    }
    let p = g.softmax(s, -1).unwrap();
    let unfused = g.matmul(p, vr).unwrap();
    g.set_outputs(&[fused, unfused]).unwrap();
    g.validate().unwrap();

    let mut b = Bindings::random(&g, seed);
    if let Some(m) = mask_t {
        b.inputs.insert("mask".into(), m);
    }
    let out = run(&g, &b).unwrap();
    let (f, u) = (out[0].to_f64_vec(), out[1].to_f64_vec());
    assert!(f.iter().all(|x| x.is_finite()), "fused output has NaN/inf");
    let err = rel_l2(&f, &u);
    assert!(
        err <= 1e-6,
        "rel L2 {err:e} for {:?}",
        (c.b, c.hq, c.hkv, c.sq, c.sk, c.d, c.causal, c.mask)
    );
}

#[test]
fn plain_attention_equals_composition() {
    check(
        Case {
            b: 2,
            hq: 3,
            hkv: 3,
            sq: 17,
            sk: 17,
            d: 8,
            causal: None,
            mask: Mask::None,
        },
        1,
    );
    check(
        Case {
            b: 1,
            hq: 1,
            hkv: 1,
            sq: 1,
            sk: 1,
            d: 1,
            causal: None,
            mask: Mask::None,
        },
        2,
    );
}

#[test]
fn causal_attention_equals_composition() {
    check(
        Case {
            b: 2,
            hq: 2,
            hkv: 2,
            sq: 17,
            sk: 17,
            d: 16,
            causal: Some(0),
            mask: Mask::None,
        },
        3,
    );
    // Decoding-style: queries are the last Sq of Sk positions.
    check(
        Case {
            b: 1,
            hq: 2,
            hkv: 2,
            sq: 5,
            sk: 9,
            d: 8,
            causal: Some(4),
            mask: Mask::None,
        },
        4,
    );
    // Sq > Sk with offset 0: the first queries after Sk see keys up to their own index.
    check(
        Case {
            b: 1,
            hq: 2,
            hkv: 2,
            sq: 9,
            sk: 5,
            d: 8,
            causal: Some(-2),
            mask: Mask::None,
        },
        5,
    );
}

#[test]
fn additive_masks_equal_composition() {
    check(
        Case {
            b: 3,
            hq: 4,
            hkv: 4,
            sq: 17,
            sk: 17,
            d: 8,
            causal: None,
            mask: Mask::Padding,
        },
        6,
    );
    check(
        Case {
            b: 2,
            hq: 2,
            hkv: 2,
            sq: 3,
            sk: 17,
            d: 4,
            causal: None,
            mask: Mask::Dense,
        },
        7,
    );
}

#[test]
fn boolean_mask_with_fully_masked_rows_equals_composition() {
    check(
        Case {
            b: 2,
            hq: 2,
            hkv: 2,
            sq: 5,
            sk: 17,
            d: 8,
            causal: None,
            mask: Mask::Boolean,
        },
        8,
    );
}

#[test]
fn gqa_and_mqa_equal_composition() {
    check(
        Case {
            b: 2,
            hq: 6,
            hkv: 2,
            sq: 17,
            sk: 17,
            d: 8,
            causal: Some(0),
            mask: Mask::None,
        },
        9,
    );
    check(
        Case {
            b: 1,
            hq: 4,
            hkv: 1,
            sq: 7,
            sk: 7,
            d: 16,
            causal: None,
            mask: Mask::Padding,
        },
        10,
    );
}

#[test]
fn flash_attention_shape_errors_are_typed() {
    let mut g = Graph::new("bad");
    let q = g.input("q", DType::F32, &[1, 6, 4, 8]).unwrap();
    let k = g.input("k", DType::F32, &[1, 4, 4, 8]).unwrap();
    let v = g.input("v", DType::F32, &[1, 4, 4, 8]).unwrap();
    let err = g.flash_attention(q, k, v, None, 1.0, None).unwrap_err();
    assert_eq!(
        err.kind(),
        "shape_mismatch",
        "6 query heads over 4 kv heads: {err}"
    );
    let m = g.input("m", DType::F32, &[3, 4]).unwrap();
    let k2 = g.input("k2", DType::F32, &[1, 2, 4, 8]).unwrap();
    let err = g
        .flash_attention(q, k2, k2, Some(m), 1.0, None)
        .unwrap_err();
    assert_eq!(
        err.kind(),
        "shape_mismatch",
        "mask [3, 4] over [1, 6, 4, 4]: {err}"
    );
}
