//! The broadcasting loops of elementwise ops; the value of each op on one element is in
//! `ir::scalar`, shared with constant folding.

use crate::ir::scalar::{binary_f32, binary_i64, unary_f32, unary_i64};
use crate::ir::{infer, BinaryOp, DType, Data, Expr, Op, Shape, Tensor, TensorType, UnaryOp};

use super::strided::{gather, offsets};

fn broadcast_read(t: &Tensor, out: &Shape) -> Data {
    if t.shape() == out {
        return t.data().clone();
    }
    gather(
        t.data(),
        &offsets(out.dims(), &t.shape().broadcast_strides(out), 0),
    )
}

pub fn unary(op: UnaryOp, x: &Tensor) -> Tensor {
    match x.data() {
        Data::Float(v) => {
            let out = v.iter().map(|&a| unary_f32(op, a)).collect();
            Tensor::from_f32(x.dtype(), x.shape().clone(), out).expect("same shape")
        }
        Data::Int(v) => {
            let out = v.iter().map(|&a| unary_i64(op, a)).collect();
            Tensor::from_i64(x.dtype(), x.shape().clone(), out).expect("same shape")
        }
    }
}

pub fn binary(op: BinaryOp, a: &Tensor, b: &Tensor, out: &TensorType) -> Tensor {
    let (da, db) = (broadcast_read(a, &out.shape), broadcast_read(b, &out.shape));
    match (da, db) {
        (Data::Float(x), Data::Float(y)) => {
            let vals: Vec<f32> = x
                .iter()
                .zip(&y)
                .map(|(&p, &q)| binary_f32(op, p, q))
                .collect();
            if op.is_comparison() {
                let ints = vals.iter().map(|&v| v as i64).collect();
                Tensor::from_i64(DType::Bool, out.shape.clone(), ints).expect("same shape")
            } else {
                Tensor::from_f32(out.dtype, out.shape.clone(), vals).expect("same shape")
            }
        }
        (Data::Int(x), Data::Int(y)) => {
            let vals = x
                .iter()
                .zip(&y)
                .map(|(&p, &q)| binary_i64(op, p, q))
                .collect();
            Tensor::from_i64(out.dtype, out.shape.clone(), vals).expect("same shape")
        }
        (Data::Float(_), Data::Int(_)) | (Data::Int(_), Data::Float(_)) => {
            unreachable!("shape inference refuses mixed dtypes")
        }
    }
}

pub fn where_(cond: &Tensor, a: &Tensor, b: &Tensor, out: &TensorType) -> Tensor {
    let c = match broadcast_read(cond, &out.shape) {
        Data::Int(c) => c,
        Data::Float(_) => unreachable!("shape inference requires a bool condition"),
    };
    match (broadcast_read(a, &out.shape), broadcast_read(b, &out.shape)) {
        (Data::Float(x), Data::Float(y)) => {
            let vals = c
                .iter()
                .zip(x.iter().zip(&y))
                .map(|(&c, (&p, &q))| if c != 0 { p } else { q })
                .collect();
            Tensor::from_f32(out.dtype, out.shape.clone(), vals).expect("same shape")
        }
        (Data::Int(x), Data::Int(y)) => {
            let vals = c
                .iter()
                .zip(x.iter().zip(&y))
                .map(|(&c, (&p, &q))| if c != 0 { p } else { q })
                .collect();
            Tensor::from_i64(out.dtype, out.shape.clone(), vals).expect("same shape")
        }
        (Data::Float(_), Data::Int(_)) | (Data::Int(_), Data::Float(_)) => {
            unreachable!("shape inference requires branches of one dtype")
        }
    }
}

/// A fused expression, evaluated node by node with the same functions (and the same rounding)
/// as the unfused ops it replaced.
pub fn fused(expr: &Expr, args: &[&Tensor]) -> Tensor {
    match expr {
        Expr::Input(i) => args[*i].clone(),
        Expr::Const(v, dt) => Tensor::from_f64(*dt, Shape::scalar(), &[*v]).expect("one value"),
        Expr::Unary(op, a) => unary(*op, &fused(a, args)),
        Expr::Cast(to, a) => fused(a, args).cast(*to),
        Expr::Binary(op, a, b) => {
            let (x, y) = (fused(a, args), fused(b, args));
            let ty = infer(&Op::Binary(*op), &[&x.ty(), &y.ty()])
                .expect("typed when the node was built");
            binary(*op, &x, &y, &ty)
        }
        Expr::Where(c, a, b) => {
            let (c, x, y) = (fused(c, args), fused(a, args), fused(b, args));
            let ty = infer(&Op::Where, &[&c.ty(), &x.ty(), &y.ty()])
                .expect("typed when the node was built");
            where_(&c, &x, &y, &ty)
        }
    }
}
