//! Decode-shaped attention (few query rows, many keys, GQA) as one FlashAttention node, for
//! the flash-decoding kernels: the host runs and compiles in `tests/decode_kernels.rs`, the GPU
//! trials `decode::` in `tests/gpu/`. The reference is the interpreter on the same graph in
//! f32 (inputs cast), whose FlashAttention is checked against the unfused ops in
//! `tests/attention.rs`.
#![allow(dead_code)]

use rocmforge::interp::{self, Bindings};
use rocmforge::ir::{DType, Graph, Tensor};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mask {
    None,
    /// Additive [B, 1, 1, Sk] padding: batch i sees its first `sk - i·sk/3` keys, with a bias
    /// of -0.75 to 0.75 (so the mask's scale matters), -inf on the others.
    Padding,
    /// Boolean [B, 1, 1, Sk] padding where batch 0 sees no key at all: its rows have no
    /// visible key in any split and must come out as zeros.
    EmptyRow,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Case {
    pub b: usize,
    pub hq: usize,
    pub hkv: usize,
    pub sq: usize,
    pub sk: usize,
    pub d: usize,
    pub dv: usize,
    pub dtype: DType,
    /// The causal offset, if causal.
    pub causal: Option<i64>,
    pub mask: Mask,
}

impl Case {
    /// SmolLM2's shape (9 query heads over 3 K/V heads, D = 64) at one position.
    pub fn new(sq: usize, sk: usize, dtype: DType) -> Case {
        Case {
            b: 1,
            hq: 9,
            hkv: 3,
            sq,
            sk,
            d: 64,
            dv: 64,
            dtype,
            causal: None,
            mask: Mask::None,
        }
    }

    pub fn name(&self) -> String {
        let causal = match self.causal {
            Some(o) => format!("_causal{o}"),
            None => String::new(),
        };
        let mask = match self.mask {
            Mask::None => "",
            Mask::Padding => "_padding",
            Mask::EmptyRow => "_empty_row",
        };
        format!(
            "{}_b{}_h{}x{}_sq{}_sk{}_d{}x{}{causal}{mask}",
            self.dtype, self.b, self.hq, self.hkv, self.sq, self.sk, self.d, self.dv
        )
    }

    /// The graph in `dtype`: inputs q, k, v (and mask), output `out`.
    pub fn graph_in(&self, dtype: DType) -> Graph {
        let mut g = Graph::new("decode_attention");
        let q = g
            .input("q", dtype, &[self.b, self.hq, self.sq, self.d])
            .unwrap();
        let k = g
            .input("k", dtype, &[self.b, self.hkv, self.sk, self.d])
            .unwrap();
        let v = g
            .input("v", dtype, &[self.b, self.hkv, self.sk, self.dv])
            .unwrap();
        let mask = match self.mask {
            Mask::None => None,
            Mask::Padding => Some(g.input("mask", dtype, &[self.b, 1, 1, self.sk]).unwrap()),
            Mask::EmptyRow => Some(
                g.input("mask", DType::Bool, &[self.b, 1, 1, self.sk])
                    .unwrap(),
            ),
        };
        let scale = 1.0 / (self.d as f64).sqrt();
        let out = g
            .flash_attention(q, k, v, mask, scale, self.causal)
            .unwrap();
        g.rename(out, "out").unwrap();
        g.set_outputs(&[out]).unwrap();
        g
    }

    pub fn graph(&self) -> Graph {
        self.graph_in(self.dtype)
    }

    /// Random q, k, v and this case's mask, for the graph in `dtype`.
    pub fn bindings(&self, seed: u64) -> Bindings {
        let g = self.graph();
        let mut b = Bindings::random(&g, seed);
        let sk = self.sk;
        let visible = |batch: usize, key: usize| match self.mask {
            Mask::None => true,
            Mask::Padding => key < sk - batch * sk / 3,
            Mask::EmptyRow => batch > 0 && key < sk - (batch - 1) * sk / 4,
        };
        let values: Vec<f64> = (0..self.b)
            .flat_map(|i| (0..sk).map(move |j| (i, j)))
            .map(|(i, j)| match (self.mask, visible(i, j)) {
                (Mask::EmptyRow, seen) => f64::from(u8::from(seen)),
                (_, true) => (j % 7) as f64 * 0.25 - 0.75,
                (_, false) => f64::NEG_INFINITY,
            })
            .collect();
        if self.mask != Mask::None {
            let dtype = g.ty(g.find("mask").unwrap()).dtype;
            let t = Tensor::from_f64(dtype, vec![self.b, 1, 1, sk], &values).unwrap();
            b.inputs.insert("mask".into(), t);
        }
        b
    }

    /// The interpreter's output for `bindings`, computed in f32.
    pub fn reference(&self, bindings: &Bindings) -> Tensor {
        let mut rb = Bindings::default();
        for (n, t) in &bindings.inputs {
            let t = if t.dtype().is_float() {
                t.cast(DType::F32)
            } else {
                t.clone()
            };
            rb.inputs.insert(n.clone(), t);
        }
        interp::run(&self.graph_in(DType::F32), &rb)
            .unwrap()
            .remove(0)
    }
}

/// Whether the rows of batch 0 (all heads, all positions) are exactly zero in `t`.
pub fn batch0_zero(t: &Tensor, c: &Case) -> bool {
    let per_batch = c.hq * c.sq * c.dv;
    t.to_f64_vec()[..per_batch].iter().all(|&x| x == 0.0)
}

/// The GPU trial cases: Sq ∈ {1, 2, 3}, Sk ∈ {1, 17, 513, 4097}, GQA 9/3, 4/1 and 1/1,
/// D ∈ {64, 80, 128}, every float dtype, causal at offset Sk − Sq and smaller (a row with no
/// visible key at offset -1, no key visible at all at -Sq), padding masks and a batch that sees
/// no key.
pub fn gpu_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for dtype in [DType::F16, DType::BF16, DType::F32] {
        for sq in [1, 2, 3] {
            for sk in [1, 17, 513, 4097] {
                for (hq, hkv) in [(9, 3), (4, 1), (1, 1)] {
                    cases.push(Case {
                        hq,
                        hkv,
                        ..Case::new(sq, sk, dtype)
                    });
                }
            }
        }
        // 16 rows, the most one block holds: one position of 16 heads, four of 4.
        cases.push(Case {
            hq: 16,
            hkv: 1,
            ..Case::new(1, 4097, dtype)
        });
        cases.push(Case {
            hq: 8,
            hkv: 2,
            causal: Some(513 - 4),
            ..Case::new(4, 513, dtype)
        });
        for d in [80, 128] {
            cases.push(Case {
                d,
                dv: d,
                ..Case::new(1, 4097, dtype)
            });
            cases.push(Case {
                d,
                dv: d,
                hq: 4,
                hkv: 1,
                sq: 3,
                causal: Some(513 - 3),
                ..Case::new(3, 513, dtype)
            });
        }
        for sk in [17, 513, 4097] {
            let s = sk as i64;
            // At -1 the first position sees no key; at -3 none does (no split has a key).
            for offset in [s - 3, s / 2 - 3, -1, -3] {
                cases.push(Case {
                    causal: Some(offset),
                    ..Case::new(3, sk, dtype)
                });
            }
            for mask in [Mask::Padding, Mask::EmptyRow] {
                cases.push(Case {
                    b: 2,
                    mask,
                    ..Case::new(2, sk, dtype)
                });
                cases.push(Case {
                    b: 3,
                    hq: 4,
                    hkv: 1,
                    mask,
                    causal: Some(s - 1),
                    ..Case::new(1, sk, dtype)
                });
            }
        }
    }
    cases
}
