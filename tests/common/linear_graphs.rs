//! A linear layer as the model frontends lower one (frontend/bert.rs `linear`): `x [M,K] @
//! permute(W [N,K])`, the weight stored `[N,K]` as Hugging Face and GGUF files store it,
//! optionally with bias + GELU after it. Shared by benches/gemm.rs and the GPU trials that check
//! those graphs against the interpreter.

use rocmforge::ir::{DType, Graph, GraphError};

/// `x·Wᵀ` (inputs `x`, weight `w`), or `gelu(x·Wᵀ + b)` when `bias_gelu` (weight `b`).
pub fn linear(
    name: &str,
    m: usize,
    n: usize,
    k: usize,
    dtype: DType,
    bias_gelu: bool,
) -> Result<Graph, GraphError> {
    let mut g = Graph::new(name);
    let x = g.input("x", dtype, &[m, k])?;
    let w = g.weight("w", dtype, &[n, k])?;
    let wt = g.permute(w, &[1, 0])?;
    let mut y = g.matmul(x, wt)?;
    if bias_gelu {
        let b = g.weight("b", dtype, &[n])?;
        let biased = g.add(y, b)?;
        y = g.gelu(biased)?;
    }
    g.add_output(y)?;
    Ok(g)
}
