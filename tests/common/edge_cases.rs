//! Graphs and data at the edges of the op semantics, shared by the host runs of the generated
//! kernels (tests/hiprtc.rs) and the GPU trials (tests/gpu/): zero-size dimensions in every
//! op, values at the limits of every dtype through every elementwise row, fused expressions
//! whose intermediates overflow or wrap, causal offsets near the i64 limits, gathers out of
//! range. References are the interpreter or values computed here by hand.
#![allow(dead_code)]

use rocmforge::interp::Bindings;
use rocmforge::ir::{
    BinaryOp, DType, Expr, Graph, NodeId, Op, ReduceOp, Sample, Shape, Tensor, UnaryOp,
};

const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// Float inputs at the edges: NaN, infinities, signed zeros, f16's largest value and just past
/// it, values past i32 and i64, denormals, f32's largest.
pub const FLOAT_EDGES: [f32; 24] = [
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    0.0,
    -0.0,
    1.0,
    -1.5,
    0.5,
    2.5,
    65504.0,
    65520.0,
    70000.0,
    -70000.0,
    3.0e9,
    -3.0e9,
    2_147_483_648.0,
    -2_147_483_904.0,
    9.3e18,
    -9.3e18,
    1e30,
    -1e30,
    1e-40,
    3.4e38,
    0.1,
];

/// Integer inputs at the edges of i64 and i32 (an i32 input wraps them, as a cast does).
pub const INT_EDGES: [i64; 16] = [
    i64::MIN,
    i64::MIN + 1,
    -4_294_967_296,
    -2_147_483_649,
    i32::MIN as i64,
    -3,
    -1,
    0,
    1,
    2,
    7,
    i32::MAX as i64,
    2_147_483_648,
    4_294_967_297,
    i64::MAX - 1,
    i64::MAX,
];

/// The edge values of `dt` in `shape` (one axis, or a column).
fn edges_as(dt: DType, shape: &[usize]) -> Tensor {
    if dt.is_float() {
        Tensor::from_f32(dt, shape.to_vec(), FLOAT_EDGES.to_vec()).unwrap()
    } else {
        Tensor::from_i64(dt, shape.to_vec(), INT_EDGES.to_vec()).unwrap()
    }
}

fn edges(dt: DType) -> Tensor {
    let n = if dt.is_float() {
        FLOAT_EDGES.len()
    } else {
        INT_EDGES.len()
    };
    edges_as(dt, &[n])
}

/// A graph and the data to run it on.
pub struct Case {
    pub graph: Graph,
    pub bindings: Bindings,
}

/// Every elementwise row on edge values, per dtype: unary ops on `x`, binary ops and `where` on
/// every pair (`x` as a column against `y`), every cast.
pub fn elementwise_edges() -> Vec<Case> {
    let mut cases = Vec::new();
    for dt in [DType::F32, DType::F16, DType::BF16, DType::I32, DType::I64] {
        let mut g = Graph::new(format!("edges_{dt}"));
        let n = if dt.is_float() {
            FLOAT_EDGES.len()
        } else {
            INT_EDGES.len()
        };
        let x = g.input("x", dt, &[n, 1]).unwrap();
        let y = g.input("y", dt, &[n]).unwrap();
        let mut outs = Vec::new();
        for u in UnaryOp::ALL {
            if dt.is_float() || u.accepts_int() {
                outs.push(g.unary(u, x).unwrap());
            }
        }
        for b in BinaryOp::ALL {
            if dt.is_float() || !b.float_only() {
                outs.push(g.binary(b, x, y).unwrap());
            }
        }
        let c = g.less(x, y).unwrap();
        outs.push(g.where_(c, x, y).unwrap());
        for to in DType::ALL {
            outs.push(g.cast(x, to).unwrap());
        }
        g.set_outputs(&outs).unwrap();
        let bindings = Bindings::default()
            .with_input("x", edges_as(dt, &[n, 1]))
            .with_input("y", edges(dt));
        cases.push(Case { graph: g, bindings });
    }
    cases
}

/// The least value of an integer dtype, as a constant holds it.
fn int_min(dt: DType) -> f64 {
    if dt == DType::I32 {
        f64::from(i32::MIN)
    } else {
        i64::MIN as f64
    }
}

fn c(v: f64, dt: DType) -> Box<Expr> {
    Box::new(Expr::constant(v, dt))
}
fn input(i: usize) -> Box<Expr> {
    Box::new(Expr::Input(i))
}
fn bin(op: BinaryOp, a: Box<Expr>, b: Box<Expr>) -> Box<Expr> {
    Box::new(Expr::Binary(op, a, b))
}
/// A FusedElementwise node computing `e` (built with the boxed helpers above).
#[allow(clippy::boxed_local)]
fn fused(g: &mut Graph, e: Box<Expr>, operands: &[NodeId]) -> NodeId {
    g.add_op(Op::FusedElementwise(*e), operands).unwrap()
}

/// Fused expressions whose intermediates leave their dtype's range: each op rounds (f16 to
/// inf) or wraps (i32, i64) as the unfused ops would, constants are the dtype's values, float
/// to integer conversions saturate, NaN goes through maximum and minimum.
pub fn fused_edges() -> Vec<Case> {
    let mut cases = Vec::new();
    for dt in FLOATS {
        let mut g = Graph::new(format!("fused_edges_{dt}"));
        let n = FLOAT_EDGES.len();
        let x = g.input("x", dt, &[n]).unwrap();
        let sq = bin(BinaryOp::Mul, input(0), input(0));
        let outs = vec![
            // x·x overflows f16 (and bf16 at 1e30) before the division would bring it back.
            fused(&mut g, bin(BinaryOp::Div, sq, c(1000.0, dt)), &[x]),
            fused(
                &mut g,
                bin(
                    BinaryOp::Sub,
                    bin(BinaryOp::Add, input(0), c(60000.0, dt)),
                    c(60000.0, dt),
                ),
                &[x],
            ),
            // 0.1 as the dtype holds it.
            fused(&mut g, bin(BinaryOp::Mul, input(0), c(0.1, dt)), &[x]),
            fused(
                &mut g,
                bin(BinaryOp::Maximum, input(0), c(f64::NAN, dt)),
                &[x],
            ),
            fused(&mut g, bin(BinaryOp::Minimum, c(-1.0, dt), input(0)), &[x]),
            fused(
                &mut g,
                Box::new(Expr::Cast(
                    DType::I32,
                    bin(BinaryOp::Mul, input(0), c(1e3, dt)),
                )),
                &[x],
            ),
            fused(
                &mut g,
                Box::new(Expr::Cast(
                    DType::I64,
                    bin(BinaryOp::Mul, input(0), c(1e3, dt)),
                )),
                &[x],
            ),
        ];
        g.set_outputs(&outs).unwrap();
        let bindings = Bindings::default().with_input("x", edges(dt));
        cases.push(Case { graph: g, bindings });
    }
    for dt in [DType::I32, DType::I64] {
        let mut g = Graph::new(format!("fused_edges_{dt}"));
        let n = INT_EDGES.len();
        let x = g.input("x", dt, &[n, 1]).unwrap();
        let y = g.input("y", dt, &[n]).unwrap();
        let sum = || bin(BinaryOp::Add, input(0), input(1));
        let outs = vec![
            // The sum wraps before the comparison reads it.
            fused(&mut g, bin(BinaryOp::Less, sum(), c(0.0, dt)), &[x, y]),
            fused(
                &mut g,
                bin(
                    BinaryOp::Mul,
                    bin(BinaryOp::Mul, input(0), input(1)),
                    c(3.0, dt),
                ),
                &[x, y],
            ),
            fused(
                &mut g,
                Box::new(Expr::Unary(
                    UnaryOp::Abs,
                    Box::new(Expr::Unary(UnaryOp::Neg, sum())),
                )),
                &[x, y],
            ),
            // The largest i32 as a constant (an integer constant out of its dtype's range is a
            // graph error, see ir::scalar::check_constant); i64::MIN must stay signed.
            fused(
                &mut g,
                bin(BinaryOp::Greater, input(0), c(f64::from(i32::MAX), dt)),
                &[x],
            ),
            fused(
                &mut g,
                bin(
                    BinaryOp::Greater,
                    input(0),
                    c(
                        if dt == DType::I32 {
                            f64::from(i32::MIN)
                        } else {
                            i64::MIN as f64
                        },
                        dt,
                    ),
                ),
                &[y],
            ),
            fused(
                &mut g,
                bin(BinaryOp::Sub, c(int_min(dt), dt), input(0)),
                &[y],
            ),
            fused(&mut g, Box::new(Expr::Cast(DType::F16, sum())), &[x, y]),
        ];
        g.set_outputs(&outs).unwrap();
        let bindings = Bindings::default()
            .with_input("x", edges_as(dt, &[n, 1]))
            .with_input("y", edges(dt));
        cases.push(Case { graph: g, bindings });
    }
    cases
}

/// Every op with a zero-size dimension somewhere (empty results, empty operands, a matmul
/// with an empty contraction, attention with no queries, no keys, a head size of 0). Their
/// results are compared with the interpreter's; reductions over an empty axis are separate
/// ([`empty_axis_reductions`]), with PyTorch's values.
pub fn empty_graphs() -> Vec<Graph> {
    let mut graphs = Vec::new();
    for dt in [DType::F32, DType::F16] {
        let mut g = Graph::new(format!("empty_elementwise_{dt}"));
        let x = g.input("x", dt, &[0, 5]).unwrap();
        let y = g.input("y", dt, &[5]).unwrap();
        let mut outs = vec![x];
        for u in [UnaryOp::Exp, UnaryOp::Neg, UnaryOp::Gelu] {
            outs.push(g.unary(u, x).unwrap());
        }
        let s = g.add(x, y).unwrap();
        let m = g.mul(s, x).unwrap();
        outs.push(g.tanh(m).unwrap());
        let lt = g.less(x, y).unwrap();
        outs.push(g.where_(lt, x, y).unwrap());
        outs.push(g.cast(x, DType::I32).unwrap());
        g.set_outputs(&outs).unwrap();
        graphs.push(g);

        let mut g = Graph::new(format!("empty_reduce_softmax_norms_{dt}"));
        let x = g.input("x", dt, &[0, 4, 8]).unwrap();
        let mut outs = Vec::new();
        for op in ReduceOp::ALL {
            // The reduced axis is full; the kept one is empty: an empty result.
            outs.push(g.reduce(op, x, &[2], false).unwrap());
        }
        outs.push(g.softmax(x, -1).unwrap());
        outs.push(g.softmax(x, 0).unwrap());
        let w = g.weight("w", dt, &[8]).unwrap();
        let b = g.weight("b", dt, &[8]).unwrap();
        outs.push(g.layer_norm(x, w, b, 1e-5).unwrap());
        outs.push(g.rms_norm(x, w, 1e-6).unwrap());
        let z = g.input("z", dt, &[3, 0]).unwrap();
        let w0 = g.weight("w0", dt, &[0]).unwrap();
        let b0 = g.weight("b0", dt, &[0]).unwrap();
        outs.push(g.softmax(z, -1).unwrap());
        outs.push(g.layer_norm(z, w0, b0, 1e-5).unwrap());
        outs.push(g.rms_norm(z, w0, 1e-6).unwrap());
        let r = g.input("r", dt, &[1, 2, 0, 8]).unwrap();
        outs.push(g.rope(r, 10000.0, 3).unwrap());
        let r2 = g.input("r2", dt, &[1, 2, 4, 0]).unwrap();
        outs.push(g.rope(r2, 10000.0, 3).unwrap());
        g.set_outputs(&outs).unwrap();
        graphs.push(g);

        let mut g = Graph::new(format!("empty_matmul_{dt}"));
        let a0 = g.input("a0", dt, &[0, 5]).unwrap();
        let b0 = g.input("b0", dt, &[5, 3]).unwrap();
        let ak = g.input("ak", dt, &[4, 0]).unwrap();
        let bk = g.input("bk", dt, &[0, 3]).unwrap();
        let bn = g.input("bn", dt, &[5, 0]).unwrap();
        let a5 = g.input("a5", dt, &[4, 5]).unwrap();
        let ab = g.input("ab", dt, &[0, 4, 5]).unwrap();
        let bias = g.input("bias", dt, &[3]).unwrap();
        let m1 = g.matmul(a0, b0).unwrap();
        // An empty contraction: a [4, 3] result of zeros, then a bias through the epilogue.
        let m2 = g.matmul(ak, bk).unwrap();
        let mk = g.matmul(ak, bk).unwrap();
        let e = g.add(mk, bias).unwrap();
        let m3 = g.matmul(a5, bn).unwrap();
        let m4 = g.matmul(ab, b0).unwrap();
        g.set_outputs(&[m1, m2, e, m3, m4]).unwrap();
        graphs.push(g);

        // Attention: no queries, no keys (zeros, as a row with no visible key), a head size of
        // 0 (every score 0: the mean of V), no value columns, no batch, no heads.
        for (name, b, hq, hkv, sq, sk, d, dv, causal) in [
            ("sq0", 2, 2, 1, 0, 5, 16, 16, None),
            ("sk0", 2, 2, 1, 3, 0, 16, 16, None),
            ("sk0_causal", 1, 2, 2, 3, 0, 32, 32, Some(0)),
            ("d0", 1, 2, 1, 3, 5, 0, 16, None),
            ("d0_causal", 1, 2, 2, 4, 6, 0, 8, Some(-1)),
            ("dv0", 1, 2, 1, 3, 5, 16, 0, None),
            ("b0", 0, 2, 1, 3, 5, 16, 16, None),
            ("h0", 1, 0, 1, 3, 5, 16, 16, None),
        ] {
            let mut g = Graph::new(format!("empty_attention_{name}_{dt}"));
            let q = g.input("q", dt, &[b, hq, sq, d]).unwrap();
            let k = g.input("k", dt, &[b, hkv, sk, d]).unwrap();
            let v = g.input("v", dt, &[b, hkv, sk, dv]).unwrap();
            let o = g.flash_attention(q, k, v, None, 0.5, causal).unwrap();
            g.add_output(o).unwrap();
            graphs.push(g);
        }
        let mut g = Graph::new(format!("empty_attention_sk0_masked_{dt}"));
        let q = g.input("q", dt, &[1, 2, 3, 16]).unwrap();
        let k = g.input("k", dt, &[1, 2, 0, 16]).unwrap();
        let v = g.input("v", dt, &[1, 2, 0, 16]).unwrap();
        let m = g.input("m", DType::Bool, &[1, 1, 3, 0]).unwrap();
        let o = g.flash_attention(q, k, v, Some(m), 0.5, None).unwrap();
        g.add_output(o).unwrap();
        graphs.push(g);
    }
    let mut g = Graph::new("empty_layout");
    let x = g.input("x", DType::F32, &[2, 0, 3]).unwrap();
    let full = g.input("full", DType::F32, &[2, 3, 3]).unwrap();
    let p = g.permute(x, &[2, 0, 1]).unwrap();
    let e = g.expand(x, &[4, 2, 0, 3]).unwrap();
    let s = g.slice(full, 1, 1, 1).unwrap();
    let c1 = g.concat(&[x, x], 1).unwrap();
    // An empty part among full ones: only the full parts are copied.
    let c2 = g.concat(&[full, x, full], 1).unwrap();
    let r = g.reshape(x, &[0, 3]).unwrap();
    let w = g.weight("w", DType::F32, &[0, 3]).unwrap();
    let mask = g.causal_mask(0, 4, 0).unwrap();
    let mask2 = g.causal_mask(3, 0, 0).unwrap();
    g.set_outputs(&[p, e, s, c1, c2, r, w, mask, mask2])
        .unwrap();
    graphs.push(g);

    let mut g = Graph::new("empty_gather");
    let table = g.weight("table", DType::F32, &[4, 3]).unwrap();
    let none = g.input("none", DType::I64, &[0]).unwrap();
    let g1 = g.gather(table, none).unwrap();
    // Rows of no elements: nothing is copied, yet every index is checked.
    let thin = g.weight("thin", DType::F32, &[4, 0]).unwrap();
    let ids = g
        .input_sampled(
            "ids",
            DType::I32,
            &[2, 3],
            Sample::Range { low: 0, high: 4 },
        )
        .unwrap();
    let g2 = g.gather(thin, ids).unwrap();
    let g3 = g.gather(table, ids).unwrap();
    g.set_outputs(&[g1, g2, g3]).unwrap();
    graphs.push(g);
    graphs
}

/// Reductions over an empty axis, with the values PyTorch gives (and the interpreter): a sum is
/// 0, a max -inf, a mean NaN. Returns the graph and each output's expected values.
pub fn empty_axis_reductions() -> Vec<(Graph, Vec<Vec<f64>>)> {
    let mut cases = Vec::new();
    for dt in FLOATS {
        let mut g = Graph::new(format!("empty_axis_reductions_{dt}"));
        let x = g.input("x", dt, &[3, 0, 2]).unwrap();
        let mut outs = Vec::new();
        let mut want = Vec::new();
        for op in ReduceOp::ALL {
            let v = match op {
                ReduceOp::Sum => 0.0,
                ReduceOp::Max => f64::NEG_INFINITY,
                ReduceOp::Mean => f64::NAN,
            };
            outs.push(g.reduce(op, x, &[1], false).unwrap());
            want.push(vec![v; 6]);
            outs.push(g.reduce(op, x, &[1], true).unwrap());
            want.push(vec![v; 6]);
            outs.push(g.reduce(op, x, &[0, 1, 2], false).unwrap());
            want.push(vec![v]);
        }
        g.set_outputs(&outs).unwrap();
        cases.push((g, want));
    }
    cases
}

/// Offsets at and near the i64 limits, and around the edges of a mask of `sq` rows and `sk`
/// columns.
pub fn extreme_offsets(sq: usize, sk: usize) -> Vec<i64> {
    let (sq, sk) = (sq as i64, sk as i64);
    vec![
        i64::MIN,
        i64::MIN + 1,
        -sq - 1,
        -sq,
        -sq + 1,
        -1,
        0,
        sk - 1,
        sk,
        sk + 1,
        i64::MAX - 1,
        i64::MAX,
    ]
}

/// Causal masks [sq, sk] with every offset of [`extreme_offsets`], and each mask as the
/// definition gives it (key k visible from query q when k ≤ q + offset), in i128.
pub fn causal_masks(sq: usize, sk: usize) -> (Graph, Vec<Vec<f64>>) {
    let mut g = Graph::new("causal_offsets");
    let mut outs = Vec::new();
    let mut want = Vec::new();
    for off in extreme_offsets(sq, sk) {
        outs.push(g.causal_mask(sq, sk, off).unwrap());
        want.push(
            (0..sq)
                .flat_map(|q| {
                    (0..sk).map(move |k| f64::from(u8::from(k as i128 <= q as i128 + off as i128)))
                })
                .collect(),
        );
    }
    g.set_outputs(&outs).unwrap();
    (g, want)
}

/// A causal FlashAttention with offset `offset`, for comparing an extreme offset with the
/// in-range one that gives the same mask.
pub fn causal_attention(dt: DType, sq: usize, sk: usize, d: usize, offset: i64) -> Graph {
    let mut g = Graph::new(format!("causal_attention_{dt}_{offset}"));
    let q = g.input("q", dt, &[1, 2, sq, d]).unwrap();
    let k = g.input("k", dt, &[1, 2, sk, d]).unwrap();
    let v = g.input("v", dt, &[1, 2, sk, d]).unwrap();
    let o = g
        .flash_attention(q, k, v, None, 0.25, Some(offset))
        .unwrap();
    g.add_output(o).unwrap();
    g
}

/// A gather of `ids` (as `idt`) from a `[rows, row]` table.
pub fn gather_case(idt: DType, ids: &[i64], rows: usize, row: usize) -> Case {
    let mut g = Graph::new(format!("gather_{idt}_{rows}x{row}"));
    let table = g.weight("table", DType::F32, &[rows, row]).unwrap();
    let idx = g.input("ids", idt, &[ids.len()]).unwrap();
    let out = g.gather(table, idx).unwrap();
    // A second gather after it: the first failing one is reported, as the interpreter would.
    let out2 = g.gather(table, idx).unwrap();
    g.set_outputs(&[out, out2]).unwrap();
    let bindings = Bindings::default().with_input(
        "ids",
        Tensor::from_i64(idt, Shape::new(vec![ids.len()]), ids.to_vec()).unwrap(),
    );
    Case { graph: g, bindings }
}

/// Gathers with indices out of range: the first bad index is at position 3 (negative), another
/// further on; past the end; all bad in a table with no rows; a bad index into rows of no
/// elements. Each with i32 and i64 indices.
pub fn gathers_out_of_range() -> Vec<Case> {
    let mut cases = Vec::new();
    for idt in [DType::I32, DType::I64] {
        cases.push(gather_case(idt, &[0, 4, 2, -1, 3, 9, 1], 5, 3));
        cases.push(gather_case(idt, &[4, 5], 5, 3));
        cases.push(gather_case(idt, &[0], 0, 2));
        cases.push(gather_case(idt, &[1, 7, 0], 5, 0));
        cases.push(gather_case(idt, &[i32::MIN as i64, 0], 5, 2));
    }
    cases.push(gather_case(DType::I64, &[2, i64::MAX, i64::MIN], 5, 2));
    cases
}

/// ULPs of `dt` at `v`: the spacing of representable values there.
fn ulp(dt: DType, v: f64) -> f64 {
    let mantissa = match dt {
        DType::F16 => 10,
        DType::BF16 => 7,
        _ => 23,
    };
    let min_exp = match dt {
        DType::F16 => -14,
        _ => -126,
    };
    let e = if v == 0.0 {
        min_exp
    } else {
        (v.abs().log2().floor() as i32).max(min_exp)
    };
    2f64.powi(e - mantissa)
}

/// `got` against `want`, element by element: integers exactly, floats within `ulps` units in
/// the last place of their dtype (0 for exact), NaN only where NaN is wanted, infinities
/// exactly.
pub fn compare(got: &Tensor, want: &Tensor, ulps: f64, what: &str) -> Result<(), String> {
    if got.ty() != want.ty() {
        return Err(format!("{what}: {} vs {}", got.ty(), want.ty()));
    }
    let dt = want.dtype();
    for (i, (a, b)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
        let ok = if dt.is_float() {
            (a.is_nan() && b.is_nan())
                || *a == b
                || (a.is_finite()
                    && b.is_finite()
                    && (a - b).abs() <= ulps * ulp(dt, a.abs().max(b.abs())))
        } else {
            *a == b
        };
        if !ok {
            return Err(format!("{what}: element {i} is {a}, want {b}"));
        }
    }
    Ok(())
}

/// `got` against hand-computed values (NaN where NaN is wanted).
pub fn compare_values(got: &Tensor, want: &[f64], what: &str) -> Result<(), String> {
    let g = got.to_f64_vec();
    if g.len() != want.len() {
        return Err(format!("{what}: {} values, want {}", g.len(), want.len()));
    }
    for (i, (a, b)) in g.iter().zip(want).enumerate() {
        if !((a.is_nan() && b.is_nan()) || a == b) {
            return Err(format!("{what}: element {i} is {a}, want {b}"));
        }
    }
    Ok(())
}

/// Edge values of `dt` (constants folded in tests/interp.rs, kernel inputs in tests/gpu/): signed zeros, infinities, NaN, the f16 limit and its
/// overflow, values past every integer type, and the integer types' own limits.
pub fn edge_values(dt: DType) -> Vec<f64> {
    match dt {
        DType::F32 | DType::F16 | DType::BF16 => vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            0.5,
            2.5,
            -2.5,
            1e-8,
            1e-45,
            65504.0,
            65519.0,
            65520.0,
            -65520.0,
            70000.0,
            3e9,
            -3e9,
            1e19,
            3.0e38,
            f64::from(f32::MAX),
            1e39,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ],
        DType::I32 => [0, 1, -1, 7, -7, 65536, i32::MAX - 1, i32::MAX, i32::MIN]
            .map(f64::from)
            .to_vec(),
        DType::I64 => [
            0i64,
            1,
            -1,
            7,
            1 << 31,
            -(1 << 31) - 1,
            1 << 32,
            1 << 53,
            -(1 << 53),
            1 << 62,
            i64::MIN,
        ]
        .map(|v| v as f64)
        .to_vec(),
        DType::Bool => vec![0.0, 1.0],
    }
}
