//! Unfused attention written the ways models export it, for the fusion tests.
#![allow(dead_code)]

use rocmforge::ir::{DType, Graph, NodeId, Sample};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scale {
    /// `mul(scores, c)`
    MulScores,
    /// `mul(c, scores)`
    MulScoresLeft,
    /// `div(scores, √d)`
    DivScores,
    /// `mul(q, c)` before the matmul
    OnQ,
    /// `mul(q, √c)` and `mul(k, √c)`
    SqrtOnBoth,
    None,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mask {
    None,
    /// Additive float mask input of shape [B, 1, 1, Sk] built as (1 − m)·min from a [B, Sk] 0/1 mask.
    Padding,
    /// Additive float mask input [Sq, Sk].
    Dense2d,
    /// Additive float mask input [1, H, Sq, Sk].
    PerHead,
    /// Bool [B, 1, Sq, Sk] through where(mask, S, −∞).
    BoolNegInf,
    /// Bool [B, 1, Sq, Sk] through where(mask, S, dtype min).
    BoolMin,
    /// where(CausalMask, S, −∞)
    Causal,
    /// where(lower-triangular bool constant, S, −∞)
    CausalTril,
}

#[derive(Clone, Copy, Debug)]
pub struct Spec {
    pub b: usize,
    pub hq: usize,
    pub hkv: usize,
    pub sq: usize,
    pub sk: usize,
    pub d: usize,
    pub dtype: DType,
    pub scale: Scale,
    pub mask: Mask,
    /// K given already transposed, [.., D, Sk].
    pub k_pretransposed: bool,
    /// f16/bf16 scores cast to f32 for the softmax and back.
    pub cast_softmax: bool,
    /// The 3-D batched form [B·H, S, D] (no GQA).
    pub rank3: bool,
    /// The scores viewed in the other rank and back: 3-D scores viewed [B, H, Sq, Sk] around
    /// the mask (fairseq), 4-D scores viewed [B·H, Sq, Sk] around the scale.
    pub view: bool,
    /// Causal offset for the causal masks.
    pub offset: i64,
}

impl Spec {
    pub fn new(b: usize, h: usize, s: usize, d: usize) -> Spec {
        Spec {
            b,
            hq: h,
            hkv: h,
            sq: s,
            sk: s,
            d,
            dtype: DType::F32,
            scale: Scale::MulScores,
            mask: Mask::None,
            k_pretransposed: false,
            cast_softmax: false,
            rank3: false,
            view: false,
            offset: 0,
        }
    }
    pub fn scale_value(&self) -> f64 {
        1.0 / (self.d as f64).sqrt()
    }
    /// The scale the graph computes with: its constants as `dtype` holds them (a divisor is
    /// rewritten to a multiplier by the reciprocal before attention fusion reads it).
    pub fn held_scale_value(&self) -> f64 {
        let held = |v: f64| f64::from(self.dtype.round_f32(v as f32));
        match self.scale {
            Scale::SqrtOnBoth => held(self.scale_value().sqrt()).powi(2),
            Scale::None => 1.0,
            _ => held(self.scale_value()),
        }
    }
}

fn dims(spec: &Spec, h: usize, s: usize, last: usize) -> Vec<usize> {
    if spec.rank3 {
        vec![spec.b * h, s, last]
    } else {
        vec![spec.b, h, s, last]
    }
}

/// repeat_kv: [B, Hkv, S, D] → [B, Hq, S, D] by Reshape → Expand → Reshape.
pub fn repeat_kv(g: &mut Graph, x: NodeId, spec: &Spec, s: usize, d: usize) -> NodeId {
    let n = spec.hq / spec.hkv;
    let r = g
        .reshape(x, &[spec.b as i64, spec.hkv as i64, 1, s as i64, d as i64])
        .unwrap();
    let e = g.expand(r, &[spec.b, spec.hkv, n, s, d]).unwrap();
    g.reshape(e, &[spec.b as i64, spec.hq as i64, s as i64, d as i64])
        .unwrap()
}

/// The unfused graph; its output is named `out`.
pub fn build(spec: &Spec) -> Graph {
    let dt = spec.dtype;
    let mut g = Graph::new("attention_variant");
    let q = g
        .input("q", dt, &dims(spec, spec.hq, spec.sq, spec.d))
        .unwrap();
    let k = if spec.k_pretransposed {
        let mut kd = dims(spec, spec.hkv, spec.d, spec.sk);
        let n = kd.len();
        kd[n - 2] = spec.d;
        kd[n - 1] = spec.sk;
        g.input("k", dt, &kd).unwrap()
    } else {
        g.input("k", dt, &dims(spec, spec.hkv, spec.sk, spec.d))
            .unwrap()
    };
    let v = g
        .input("v", dt, &dims(spec, spec.hkv, spec.sk, spec.d))
        .unwrap();
    let (mut k, mut v) = (k, v);
    if spec.hq != spec.hkv {
        assert!(!spec.k_pretransposed && !spec.rank3);
        k = repeat_kv(&mut g, k, spec, spec.sk, spec.d);
        v = repeat_kv(&mut g, v, spec, spec.sk, spec.d);
    }
    let c = spec.scale_value();
    let (mut q, mut k) = (q, k);
    match spec.scale {
        Scale::OnQ => {
            let s = g.scalar(c, dt).unwrap();
            q = g.mul(q, s).unwrap();
        }
        Scale::SqrtOnBoth => {
            let s = g.scalar(c.sqrt(), dt).unwrap();
            q = g.mul(q, s).unwrap();
            k = g.mul(k, s).unwrap();
        }
        _ => {}
    }
    let kt = if spec.k_pretransposed {
        k
    } else {
        g.transpose_last(k).unwrap()
    };
    let mut s = g.matmul(q, kt).unwrap();
    let (bh, sq, sk) = ((spec.b * spec.hq) as i64, spec.sq as i64, spec.sk as i64);
    let heads = [spec.b as i64, spec.hq as i64, sq, sk];
    if spec.view && !spec.rank3 {
        s = g.reshape(s, &[bh, sq, sk]).unwrap();
    }
    s = match spec.scale {
        Scale::MulScores => {
            let c = g.scalar(c, dt).unwrap();
            g.mul(s, c).unwrap()
        }
        Scale::MulScoresLeft => {
            let c = g.scalar(c, dt).unwrap();
            g.mul(c, s).unwrap()
        }
        Scale::DivScores => {
            let c = g.scalar((spec.d as f64).sqrt(), dt).unwrap();
            g.div(s, c).unwrap()
        }
        _ => s,
    };
    if spec.view {
        // Into the 4-D view the masks are written for: back from 3-D, or 3-D scores viewed 4-D.
        s = g.reshape(s, &heads).unwrap();
    }
    let in_4d = !spec.rank3 || spec.view;
    let h = if in_4d { spec.hq } else { spec.b * spec.hq };
    let ninf = g.scalar(f64::NEG_INFINITY, dt).unwrap();
    s = match spec.mask {
        Mask::None => s,
        Mask::Padding => {
            let m = g
                .input_sampled("mask", dt, &[spec.b, spec.sk], Sample::PaddingMask)
                .unwrap();
            let m4 = g
                .reshape(m, &[spec.b as i64, 1, 1, spec.sk as i64])
                .unwrap();
            let one = g.scalar(1.0, dt).unwrap();
            let inv = g.sub(one, m4).unwrap();
            let big = g.scalar(dt.min_value(), dt).unwrap();
            let add = g.mul(inv, big).unwrap();
            g.add(s, add).unwrap()
        }
        Mask::Dense2d => {
            let m = g.input("mask", dt, &[spec.sq, spec.sk]).unwrap();
            g.add(s, m).unwrap()
        }
        Mask::PerHead => {
            let m = g.input("mask", dt, &[1, h, spec.sq, spec.sk]).unwrap();
            g.add(m, s).unwrap()
        }
        Mask::BoolNegInf | Mask::BoolMin => {
            let shape = if in_4d {
                vec![spec.b, 1, spec.sq, spec.sk]
            } else {
                vec![spec.b * spec.hq, spec.sq, spec.sk]
            };
            let m = g.input("mask", DType::Bool, &shape).unwrap();
            let fill = if spec.mask == Mask::BoolMin {
                g.scalar(dt.min_value(), dt).unwrap()
            } else {
                ninf
            };
            g.where_(m, s, fill).unwrap()
        }
        Mask::Causal => {
            let cm = g.causal_mask(spec.sq, spec.sk, spec.offset).unwrap();
            g.where_(cm, s, ninf).unwrap()
        }
        Mask::CausalTril => {
            let vals: Vec<f64> = (0..spec.sq)
                .flat_map(|i| {
                    (0..spec.sk)
                        .map(move |j| f64::from(u8::from(j as i64 <= i as i64 + spec.offset)))
                })
                .collect();
            let cm = g.constant(DType::Bool, &[spec.sq, spec.sk], vals).unwrap();
            g.where_(cm, s, ninf).unwrap()
        }
    };
    if spec.view && spec.rank3 {
        s = g.reshape(s, &[bh, sq, sk]).unwrap();
    }
    let p = if spec.cast_softmax {
        let up = g.cast(s, DType::F32).unwrap();
        let p = g.softmax(up, -1).unwrap();
        g.cast(p, dt).unwrap()
    } else {
        g.softmax(s, -1).unwrap()
    };
    let o = g.matmul(p, v).unwrap();
    g.rename(o, "out").unwrap();
    g.add_output(o).unwrap();
    g.validate().unwrap();
    g
}

/// One step of an attention written out by hand: applied to the scores before the softmax,
/// to the probabilities after it. Masks are inputs named `mask0`, `mask1`, … in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// `cast(x, to)`
    Cast(DType),
    /// `mul(x, c)`: c a scalar constant of x's dtype, written as this value (its dtype rounds it)
    Mul(f64),
    /// `mul(c, x)`
    MulLeft(f64),
    /// `div(x, c)`
    Div(f64),
    /// `add(x, mask)`: an additive mask input of x's dtype and this shape
    Add(Vec<usize>),
    /// `where(mask, x, fill)`: a bool mask input of this shape
    Where(Vec<usize>, f64),
    /// `where(mask, fill, x)`: masked_fill, the mask true where masked
    MaskedFill(Vec<usize>, f64),
    /// `where(CausalMask(Sq, Sk, offset), x, fill)`
    Causal(i64, f64),
    /// `reshape(x, shape)`
    Reshape(Vec<i64>),
    /// `softmax(x, axis)`
    Softmax(i64),
    /// `exp(x − reduce_max(x)) / reduce_sum(exp(...))` over the last axis, written out; `false`:
    /// without the max shift
    WrittenSoftmax(bool),
}

/// Attention written step by step: `Q·Kᵀ`, the steps, then `·V`. Kᵀ is `permute(k, k_perm)`.
#[derive(Clone, Debug)]
pub struct Chain {
    pub dtype: DType,
    pub q: Vec<usize>,
    pub k: Vec<usize>,
    pub v: Vec<usize>,
    pub k_perm: Vec<usize>,
    pub steps: Vec<Step>,
}

impl Chain {
    /// `[B, H, S, D]` attention in `dtype` with Kᵀ the swap of K's last two axes.
    pub fn new(dtype: DType, dims: [usize; 4], steps: Vec<Step>) -> Chain {
        let [b, h, s, d] = dims;
        Chain {
            dtype,
            q: vec![b, h, s, d],
            k: vec![b, h, s, d],
            v: vec![b, h, s, d],
            k_perm: vec![0, 1, 3, 2],
            steps,
        }
    }

    /// The unfused graph; its output is named `out`, the scores `scores`.
    pub fn build(&self) -> Graph {
        let dt = self.dtype;
        let mut g = Graph::new("attention_chain");
        let q = g.input("q", dt, &self.q).unwrap();
        let k = g.input("k", dt, &self.k).unwrap();
        let v = g.input("v", dt, &self.v).unwrap();
        let kt = g.permute(k, &self.k_perm).unwrap();
        let mut x = g.matmul(q, kt).unwrap();
        g.rename(x, "scores").unwrap();
        let mut masks = 0;
        let mut mask = |g: &mut Graph, dtype: DType, shape: &[usize]| {
            masks += 1;
            g.input(&format!("mask{}", masks - 1), dtype, shape)
                .unwrap()
        };
        for step in &self.steps {
            let xdt = g.ty(x).dtype;
            x = match step {
                Step::Cast(to) => g.cast(x, *to).unwrap(),
                Step::Mul(c) => {
                    let c = g.scalar(*c, xdt).unwrap();
                    g.mul(x, c).unwrap()
                }
                Step::MulLeft(c) => {
                    let c = g.scalar(*c, xdt).unwrap();
                    g.mul(c, x).unwrap()
                }
                Step::Div(c) => {
                    let c = g.scalar(*c, xdt).unwrap();
                    g.div(x, c).unwrap()
                }
                Step::Add(shape) => {
                    let m = mask(&mut g, xdt, shape);
                    g.add(x, m).unwrap()
                }
                Step::Where(shape, fill) => {
                    let m = mask(&mut g, DType::Bool, shape);
                    let f = g.scalar(*fill, xdt).unwrap();
                    g.where_(m, x, f).unwrap()
                }
                Step::MaskedFill(shape, fill) => {
                    let m = mask(&mut g, DType::Bool, shape);
                    let f = g.scalar(*fill, xdt).unwrap();
                    g.where_(m, f, x).unwrap()
                }
                Step::Causal(offset, fill) => {
                    let d = g.ty(x).shape.dims().to_vec();
                    let (sq, sk) = (d[d.len() - 2], d[d.len() - 1]);
                    let cm = g.causal_mask(sq, sk, *offset).unwrap();
                    let f = g.scalar(*fill, xdt).unwrap();
                    g.where_(cm, x, f).unwrap()
                }
                Step::Reshape(shape) => g.reshape(x, shape).unwrap(),
                Step::Softmax(axis) => g.softmax(x, *axis).unwrap(),
                Step::WrittenSoftmax(shifted) => {
                    use rocmforge::ir::ReduceOp;
                    let t = if *shifted {
                        let m = g.reduce(ReduceOp::Max, x, &[-1], true).unwrap();
                        g.sub(x, m).unwrap()
                    } else {
                        x
                    };
                    let e = g.exp(t).unwrap();
                    let s = g.reduce(ReduceOp::Sum, e, &[-1], true).unwrap();
                    g.div(e, s).unwrap()
                }
            };
        }
        let o = g.matmul(x, v).unwrap();
        g.rename(o, "out").unwrap();
        g.add_output(o).unwrap();
        g.validate().unwrap();
        g
    }
}

/// `g` with every f16/bf16 value computed in f32 instead: the reference the design compares
/// fused low-precision graphs with. Constants keep the value their own dtype held, so the
/// reference and the graph start from the same numbers.
pub fn promoted_to_f32(g: &Graph) -> Graph {
    use rocmforge::ir::Op;
    let wide = |d: DType| if d.is_float() { DType::F32 } else { d };
    let mut out = Graph::new(format!("{}_f32", g.name));
    let mut map = std::collections::HashMap::new();
    for id in g.topo_order().unwrap() {
        let op = match g.op(id).clone() {
            Op::Input {
                dtype,
                shape,
                sample,
            } => Op::Input {
                dtype: wide(dtype),
                shape,
                sample,
            },
            Op::Weight {
                dtype,
                shape,
                init,
                quant,
            } => Op::Weight {
                dtype: wide(dtype),
                shape,
                init,
                quant,
            },
            Op::Constant {
                dtype,
                shape,
                values,
            } => Op::Constant {
                dtype: wide(dtype),
                shape,
                values: if dtype.is_float() {
                    values
                        .iter()
                        .map(|&v| f64::from(dtype.round_f32(v as f32)))
                        .collect()
                } else {
                    values
                },
            },
            Op::Cast { to } => Op::Cast { to: wide(to) },
            op => op,
        };
        let operands: Vec<NodeId> = g.operands(id).iter().map(|o| map[o]).collect();
        let new = out.add_node(Some(&g.node(id).name), op, &operands).unwrap();
        map.insert(id, new);
    }
    let outputs: Vec<NodeId> = g.outputs().iter().map(|o| map[o]).collect();
    out.set_outputs(&outputs).unwrap();
    out
}
