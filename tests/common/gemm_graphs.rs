//! Matmuls among the layouts and epilogues the GEMM pass reads and writes in place, at sizes
//! no tile divides (M, N and K odd, heads of 3 and 5): a weight transpose, a head split after
//! a projection, a head merge before one, bias + GELU, a residual, SwiGLU, batched products
//! with B shared by the heads, and an expanded operand. The passes suite checks their Gemm
//! against the unfused graph in the interpreter, the GPU suite their kernels.
#![allow(dead_code)]

use rocmforge::ir::{DType, Graph, UnaryOp};

pub fn layouts(dt: DType) -> Vec<Graph> {
    let (b, s, h, d) = (2usize, 37usize, 3usize, 11usize);
    let hd = h * d;
    let si = |v: &[usize]| v.iter().map(|&x| x as i64).collect::<Vec<_>>();
    let mut graphs = Vec::new();

    // x · Wᵀ with W stored [out, in] (PyTorch's Linear), then the head split before attention.
    let mut g = Graph::new(format!("gemm_head_split_{dt}"));
    let x = g.input("x", dt, &[b, s, 45]).unwrap();
    let w = g.weight("w", dt, &[hd, 45]).unwrap();
    let bias = g.weight("bias", dt, &[hd]).unwrap();
    let wt = g.permute(w, &[1, 0]).unwrap();
    let y = g.matmul(x, wt).unwrap();
    let y = g.add(y, bias).unwrap();
    let y = g.reshape(y, &si(&[b, s, h, d])).unwrap();
    let y = g.permute(y, &[0, 2, 1, 3]).unwrap();
    g.set_outputs(&[y]).unwrap();
    graphs.push(g);

    // The head merge before the output projection, with the residual added.
    let mut g = Graph::new(format!("gemm_head_merge_residual_{dt}"));
    let ctx = g.input("ctx", dt, &[b, h, s, d]).unwrap();
    let res = g.input("res", dt, &[b, s, 29]).unwrap();
    let w = g.weight("w", dt, &[29, hd]).unwrap();
    let m = g.permute(ctx, &[0, 2, 1, 3]).unwrap();
    let m = g.reshape(m, &si(&[b, s, hd])).unwrap();
    let wt = g.permute(w, &[1, 0]).unwrap();
    let y = g.matmul(m, wt).unwrap();
    let y = g.add(y, res).unwrap();
    g.set_outputs(&[y]).unwrap();
    graphs.push(g);

    // Bias + GELU, then the down projection with its residual.
    let mut g = Graph::new(format!("gemm_mlp_{dt}"));
    let x = g.input("x", dt, &[b, s, 29]).unwrap();
    let up = g.weight("up", dt, &[29, 71]).unwrap();
    let up_b = g.weight("up_b", dt, &[71]).unwrap();
    let down = g.weight("down", dt, &[71, 29]).unwrap();
    let y = g.matmul(x, up).unwrap();
    let y = g.add(y, up_b).unwrap();
    let y = g.unary(UnaryOp::Gelu, y).unwrap();
    let y = g.matmul(y, down).unwrap();
    let y = g.add(y, x).unwrap();
    g.set_outputs(&[y]).unwrap();
    graphs.push(g);

    // SwiGLU: silu(x·W1ᵀ) · (x·W3ᵀ); one product is the other's epilogue operand.
    let mut g = Graph::new(format!("gemm_swiglu_{dt}"));
    let x = g.input("x", dt, &[s, 29]).unwrap();
    let w1 = g.weight("w1", dt, &[53, 29]).unwrap();
    let w3 = g.weight("w3", dt, &[53, 29]).unwrap();
    let t1 = g.permute(w1, &[1, 0]).unwrap();
    let t3 = g.permute(w3, &[1, 0]).unwrap();
    let gate = g.matmul(x, t1).unwrap();
    let gate = g.unary(UnaryOp::Silu, gate).unwrap();
    let up = g.matmul(x, t3).unwrap();
    let y = g.mul(gate, up).unwrap();
    g.set_outputs(&[y]).unwrap();
    graphs.push(g);

    // [B, H, S, D] · [B, 1, D, E]: the heads share B and join M; and an expanded A.
    let mut g = Graph::new(format!("gemm_batched_{dt}"));
    let q = g.input("q", dt, &[b, 5, s, d]).unwrap();
    let kv = g.input("kv", dt, &[b, 1, d, 13]).unwrap();
    let a = g.input("a", dt, &[s, d]).unwrap();
    let y1 = g.matmul(q, kv).unwrap();
    let ae = g.expand(a, &[b, 5, s, d]).unwrap();
    let y2 = g.matmul(ae, kv).unwrap();
    g.set_outputs(&[y1, y2]).unwrap();
    graphs.push(g);

    graphs
}
