//! Gemm nodes for the matrix-core kernel, built directly with `Graph::gemm`: odd sizes (not
//! multiples of any tile), K not a multiple of 8 (element loads), B read as stored and
//! transposed, a head-merged A, a head-split result, bias + GELU and residual epilogues, a batch
//! with a broadcast B, and a large shape. Each is built for f16 and bf16.

#![allow(dead_code)]

use rocmforge::ir::gemm::Operand;
use rocmforge::ir::{BinaryOp, DType, Expr, Gemm, GemmDims, Graph, Shape, UnaryOp, View};

fn dims(batch: &[usize], m: &[usize], n: &[usize], k: &[usize]) -> GemmDims {
    GemmDims {
        batch: batch.to_vec(),
        m: m.to_vec(),
        n: n.to_vec(),
        k: k.to_vec(),
    }
}

fn plain(d: GemmDims, b: View, shape: &[usize]) -> Gemm {
    Gemm {
        a: View::contiguous(&d, Operand::A),
        out: View::contiguous(&d, Operand::Out),
        b,
        dims: d,
        extras: vec![],
        epilogue: None,
        shape: Shape(shape.to_vec()),
        prologue: None,
        paired: false,
    }
}

/// B stored `[N, K]` (a weight used transposed): K contiguous.
fn b_nk(k: usize) -> View {
    View {
        batch: vec![],
        rows: vec![1],
        cols: vec![k],
    }
}

/// B stored `[K, N]`: N contiguous.
fn b_kn(n: usize) -> View {
    View {
        batch: vec![],
        rows: vec![n],
        cols: vec![1],
    }
}

fn graph(name: String, dt: DType, gemm: Gemm, inputs: &[&[usize]]) -> Graph {
    let mut g = Graph::new(name);
    let ids: Vec<_> = inputs
        .iter()
        .enumerate()
        .map(|(i, s)| g.input(&format!("in{i}"), dt, s).expect("an input"))
        .collect();
    let out = g
        .gemm(gemm, ids[0], ids[1], &ids[2..])
        .expect("a valid gemm");
    g.set_outputs(&[out]).expect("an output");
    g
}

/// A plain `[M, K] · B` with B stored `[N, K]` (`nk`) or `[K, N]`.
/// A residual added to the product: `[m, k] · [n, k]ᵀ + R[m, n]`.
fn residual_case(name: String, dt: DType, m: usize, n: usize, k: usize) -> Graph {
    let d = dims(&[], &[m], &[n], &[k]);
    let mut res = plain(d.clone(), b_nk(k), &[m, n]);
    res.extras = vec![View::contiguous(&d, Operand::Out)];
    res.epilogue = Some(Expr::Binary(
        BinaryOp::Add,
        Box::new(Expr::Input(0)),
        Box::new(Expr::Input(1)),
    ));
    graph(name, dt, res, &[&[m, k], &[n, k], &[m, n]])
}

/// A batch of 3 `[m, k]` products with one B shared by every batch (batch stride 0), stored
/// `[N, K]` (`nk`) or `[K, N]`.
fn batched_shared_b_case(name: String, dt: DType, m: usize, n: usize, k: usize, nk: bool) -> Graph {
    let d = dims(&[3], &[m], &[n], &[k]);
    let (b, b_shape) = if nk {
        (b_nk(k), [n, k])
    } else {
        (b_kn(n), [k, n])
    };
    let mut bat = plain(d, b, &[3, m, n]);
    bat.b.batch = vec![0];
    graph(name, dt, bat, &[&[3, m, k], &b_shape])
}

pub fn plain_case(dt: DType, m: usize, n: usize, k: usize, nk: bool) -> Graph {
    let (b, b_shape) = if nk {
        (b_nk(k), [n, k])
    } else {
        (b_kn(n), [k, n])
    };
    let layout = if nk { "nk" } else { "kn" };
    graph(
        format!("gemm_{m}x{n}x{k}_{layout}_{dt}"),
        dt,
        plain(dims(&[], &[m], &[n], &[k]), b, &[m, n]),
        &[&[m, k], &b_shape],
    )
}

/// Every case, for one dtype; `large` adds M=4096, N=384, K=384 in both B layouts.
pub fn cases(dt: DType, large: bool) -> Vec<Graph> {
    let n = |s: &str| format!("gemm_{s}_{dt}");
    let mut v = vec![
        // Odd M and N, K = 40: A in 16-byte pieces; B [K, N] with N = 45 element by element.
        graph(
            n("odd_kn"),
            dt,
            plain(dims(&[], &[77], &[45], &[40]), b_kn(45), &[77, 45]),
            &[&[77, 40], &[40, 45]],
        ),
        // B transposed ([N, K], K = 40 contiguous): both operands in pieces.
        graph(
            n("odd_nk"),
            dt,
            plain(dims(&[], &[77], &[45], &[40]), b_nk(40), &[77, 45]),
            &[&[77, 40], &[45, 40]],
        ),
        // K = 36: no operand reads in pieces; the K tile is partial.
        graph(
            n("k36"),
            dt,
            plain(dims(&[], &[77], &[45], &[36]), b_nk(36), &[77, 45]),
            &[&[77, 36], &[45, 36]],
        ),
    ];
    // Head merge in, bias + GELU, head split out: A [B, H, S, D] read as [B*S, H*D]; B a
    // weight [N, K]; the result [B, H2, S, D2] written from rows (b, s) and columns (h2, d2).
    let (b, h, s, d, h2, d2) = (2, 4, 33, 16, 3, 24);
    let (k, nn) = (h * d, h2 * d2);
    let gelu = heads_bias_gelu(b, h, s, d, h2, d2);
    v.push(graph(
        n("heads_bias_gelu"),
        dt,
        gelu,
        &[&[b, h, s, d], &[nn, k], &[nn]],
    ));
    v.push(residual_case(n("residual"), dt, 130, 96, 72));
    // B [K, N] shared by every batch (70 rows: past the GEMV's row groups, which take up to 64
    // where the tiled grid is small).
    v.push(batched_shared_b_case(
        n("batched_shared_b"),
        dt,
        70,
        40,
        48,
        false,
    ));
    if large {
        v.push(plain_case(dt, 4096, 384, 384, true));
        v.push(plain_case(dt, 4096, 384, 384, false));
    }
    v
}

/// The Gemm of a head merge in, bias + GELU, head split out: A `[B, H, S, D]` read as
/// `[B·S, H·D]`, B a weight `[N, K]` read transposed, a bias `[N]`, and the result
/// `[B, H2, S, D2]` written from rows (b, s) and columns (h2, d2).
pub fn heads_bias_gelu(b: usize, h: usize, s: usize, d: usize, h2: usize, d2: usize) -> Gemm {
    let k = h * d;
    Gemm {
        dims: dims(&[], &[b, s], &[h2, d2], &[h, d]),
        a: View {
            batch: vec![],
            rows: vec![h * s * d, d],
            cols: vec![s * d, 1],
        },
        b: View {
            batch: vec![],
            rows: vec![d, 1],
            cols: vec![d2 * k, k],
        },
        out: View {
            batch: vec![],
            rows: vec![h2 * s * d2, d2],
            cols: vec![s * d2, 1],
        },
        extras: vec![View {
            batch: vec![],
            rows: vec![0, 0],
            cols: vec![d2, 1],
        }],
        epilogue: Some(Expr::Unary(
            UnaryOp::Gelu,
            Box::new(Expr::Binary(
                BinaryOp::Add,
                Box::new(Expr::Input(0)),
                Box::new(Expr::Input(1)),
            )),
        )),
        shape: Shape(vec![b, h2, s, d2]),
        prologue: None,
        paired: false,
    }
}

/// Gemm nodes the warpgroup kernel (sm_90a) takes: M and N of at least a tile, A and B read in
/// 16-byte pieces along K. Sizes no tile divides (1000³, 4097 × 576 × 576), M, N and K tails, a
/// K shorter than one stage, bias + GELU over head-merged and head-split views, a residual, a
/// batch with a broadcast weight; and cases it must leave to the other kernels (B stored
/// `[K, N]`, M below a tile). Each is built for f16 and bf16.
pub fn wgmma_cases(dt: DType) -> Vec<Graph> {
    let n = |s: &str| format!("gemm_wgmma_{s}_{dt}");
    let mut v = vec![
        plain_case(dt, 1000, 1000, 1000, true),
        plain_case(dt, 256, 128, 64, true),
        plain_case(dt, 130, 136, 40, true),
        // Left to the mma.sync kernel: B [K, N], and M below a tile.
        plain_case(dt, 1000, 1000, 1000, false),
        plain_case(dt, 100, 576, 576, true),
    ];
    let (b, h, s, d, h2, d2) = (2, 4, 100, 32, 6, 32);
    let (k, nn) = (h * d, h2 * d2);
    v.push(graph(
        n("heads_bias_gelu"),
        dt,
        heads_bias_gelu(b, h, s, d, h2, d2),
        &[&[b, h, s, d], &[nn, k], &[nn]],
    ));
    // SmolLM2-like K and N, M one past a tile multiple.
    v.push(residual_case(
        n("residual_4097x576x576"),
        dt,
        4097,
        576,
        576,
    ));
    // B [N, K] shared by every batch.
    v.push(batched_shared_b_case(
        n("batched_shared_b"),
        dt,
        200,
        136,
        72,
        true,
    ));
    v
}

/// The kernel family the sm_90a plan of a [`wgmma_cases`] graph must use: the TMA kernel
/// where A and B are boxes a tensor map describes, the cp.async warpgroup kernel where K's
/// sub-axes do not merge into one (the head-merged A), the mma.sync kernel for B `[K, N]` and
/// M below a tile.
pub fn wgmma_family(g: &Graph) -> &'static str {
    if g.name.contains("_kn_") || g.name.contains("gemm_100x") {
        "gemm_mma"
    } else if g.name.contains("heads_bias_gelu") {
        "gemm_wgmma"
    } else {
        "gemm_wgmma_tma"
    }
}
