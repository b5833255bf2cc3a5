//! Gemm: the operands are gathered through their views into contiguous matrices, multiplied by
//! the MatMul reference (so a Gemm's product is bit for bit the MatMul it replaced), the
//! epilogue is evaluated by the fused-expression reference, and the result is scattered through
//! the out view. A prologue normalises the gathered A's rows over K by the norm reference
//! itself (`reduce::norm`), so a Gemm with a folded norm reads bit for bit what the unfused
//! norm node stored. Paired columns (`Gemm::paired`) split the product into its even and odd
//! columns, the epilogue's `$0` and `$1`.

use crate::ir::gemm::{Axis, Operand};
use crate::ir::{Gemm, NormKind, Shape, Tensor, TensorError, TensorType};

use super::elementwise::fused;
use super::matmul::matmul;
use super::reduce::norm;
use super::strided::{pick, Offsets};

fn offsets(axes: &[Axis]) -> Offsets {
    let sizes: Vec<usize> = axes.iter().map(|a| a.size).collect();
    let strides: Vec<usize> = axes.iter().map(|a| a.stride).collect();
    Offsets::new(&sizes, &strides, 0)
}

/// The elements of `x` read through `view` as a contiguous `shape` tensor.
fn gather(
    x: &Tensor,
    g: &Gemm,
    view: &crate::ir::View,
    operand: Operand,
    shape: Shape,
) -> Result<Tensor, TensorError> {
    let ty = TensorType::new(x.dtype(), shape);
    crate::ir::check_host_size(&ty)?;
    pick(x, &ty, offsets(&view.axes(&g.dims, operand)))
}

pub fn gemm(g: &Gemm, args: &[&Tensor], out: &TensorType) -> Result<Tensor, TensorError> {
    let [nb, m, n, k] = g.dims.sizes().expect("checked by shape inference");
    let mut a = gather(args[0], g, &g.a, Operand::A, Shape(vec![nb, m, k]))?;
    if let Some(p) = &g.prologue {
        // Rows over K's flat index: the last axis of the gathered [nb, m, k].
        let params = &args[g.prologue_slots()];
        let bias = match p.norm {
            NormKind::Rms => None,
            NormKind::Layer => Some(params[1]),
        };
        a = norm(&a, params[0], bias, p.eps, p.norm == NormKind::Rms)?;
    }
    let b = gather(args[1], g, &g.b, Operand::B, Shape(vec![nb, k, n]))?;
    let product = matmul(&a, &b, &TensorType::new(a.dtype(), Shape(vec![nb, m, n])))?;
    let out_dims = g.out_dims();
    let n_out = if g.paired { n / 2 } else { n };
    let problem = Shape(vec![nb, m, n_out]);
    let value = match &g.epilogue {
        None => product,
        Some(expr) => {
            let mut ins = if g.paired {
                // The even and the odd columns of the product: `$0` and `$1`.
                let cols = |first: usize| {
                    let at: Vec<usize> = (0..nb * m)
                        .flat_map(|r| (0..n_out).map(move |j| r * n + 2 * j + first))
                        .collect();
                    let ty = TensorType::new(product.dtype(), problem.clone());
                    pick(&product, &ty, at.into_iter())
                };
                vec![cols(0)?, cols(1)?]
            } else {
                vec![product]
            };
            for (x, view) in args[2..].iter().zip(&g.extras) {
                // The zip stops at the extras: the prologue's parameters come after them.
                let axes = view.axes(&out_dims, Operand::Out);
                let ty = TensorType::new(x.dtype(), problem.clone());
                crate::ir::check_host_size(&ty)?;
                ins.push(pick(x, &ty, offsets(&axes))?);
            }
            let refs: Vec<&Tensor> = ins.iter().collect();
            fused(expr, &refs)?
        }
    };
    // Scatter: element i of the problem (row-major) goes to the out view's i-th offset, which
    // shape inference has checked to be a bijection onto the result.
    let mut at = vec![0usize; value.len()];
    for (i, o) in offsets(&g.out.axes(&out_dims, Operand::Out)).enumerate() {
        at[o] = i;
    }
    pick(&value, out, at.into_iter())
}
