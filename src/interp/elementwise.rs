//! The broadcasting loops of elementwise ops; the value of each op on one element is in
//! `ir::scalar`, shared with constant folding, so a folded constant is what these compute.

use crate::ir::scalar;
use crate::ir::{infer, BinaryOp, Expr, Op, Shape, Tensor, TensorError, TensorType, UnaryOp};

use super::strided::broadcast_elements;

pub fn unary(op: UnaryOp, x: &Tensor) -> Result<Tensor, TensorError> {
    let dt = x.dtype();
    let values = (0..x.len()).map(|i| scalar::unary(op, dt, x.element(i)));
    Tensor::from_elements(dt, x.shape().clone(), x.len(), values)
}

pub fn binary(
    op: BinaryOp,
    a: &Tensor,
    b: &Tensor,
    out: &TensorType,
) -> Result<Tensor, TensorError> {
    let values = broadcast_elements(a, &out.shape)
        .zip(broadcast_elements(b, &out.shape))
        .map(|(x, y)| scalar::binary(op, out.dtype, x, y));
    Tensor::from_elements(out.dtype, out.shape.clone(), out.shape.numel(), values)
}

pub fn where_(
    cond: &Tensor,
    a: &Tensor,
    b: &Tensor,
    out: &TensorType,
) -> Result<Tensor, TensorError> {
    let values = broadcast_elements(cond, &out.shape)
        .zip(broadcast_elements(a, &out.shape))
        .zip(broadcast_elements(b, &out.shape))
        .map(|((c, x), y)| scalar::select(c, x, y));
    Tensor::from_elements(out.dtype, out.shape.clone(), out.shape.numel(), values)
}

/// A fused expression, evaluated node by node with the same functions (and the same rounding)
/// as the unfused ops it replaced. The recursion is as deep as the expression, which shape
/// inference bounds (`ir::expr::MAX_OPS`).
pub fn fused(expr: &Expr, args: &[&Tensor]) -> Result<Tensor, TensorError> {
    match expr {
        Expr::Input(i) => Ok(args[*i].clone()),
        Expr::Const(v, dt) => Tensor::from_f64(*dt, Shape::scalar(), &[*v]),
        Expr::Unary(op, a) => unary(*op, &fused(a, args)?),
        Expr::Cast(to, a) => fused(a, args)?.try_cast(*to),
        Expr::Binary(op, a, b) => {
            let (x, y) = (fused(a, args)?, fused(b, args)?);
            let ty = infer(&Op::Binary(*op), &[&x.ty(), &y.ty()])
                .expect("typed when the node was built");
            binary(*op, &x, &y, &ty)
        }
        Expr::Where(c, a, b) => {
            let (c, x, y) = (fused(c, args)?, fused(a, args)?, fused(b, args)?);
            let ty = infer(&Op::Where, &[&c.ty(), &x.ty(), &y.ty()])
                .expect("typed when the node was built");
            where_(&c, &x, &y, &ty)
        }
    }
}
