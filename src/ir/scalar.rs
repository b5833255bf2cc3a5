//! The value of each elementwise op on one element: one row per op. The interpreter applies
//! these over tensors; constant folding applies them to constants; codegen has the matching row
//! of C for each.

use super::{BinaryOp, UnaryOp};

const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// The value of a unary op on one float.
pub fn unary_f32(op: UnaryOp, x: f32) -> f32 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => x.sqrt().recip(),
        UnaryOp::Recip => x.recip(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Erf => libm::erff(x),
        UnaryOp::Sigmoid => sigmoid(x),
        UnaryOp::Silu => x * sigmoid(x),
        UnaryOp::Gelu => 0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2)),
        UnaryOp::GeluTanh => {
            0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
        }
    }
}

fn sigmoid(x: f32) -> f32 {
    // Split by sign so exp never overflows.
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// The value of a unary op on one integer (only Neg and Abs are typed for integers).
pub fn unary_i64(op: UnaryOp, x: i64) -> i64 {
    match op {
        UnaryOp::Neg => x.wrapping_neg(),
        UnaryOp::Abs => x.wrapping_abs(),
        UnaryOp::Exp
        | UnaryOp::Log
        | UnaryOp::Sqrt
        | UnaryOp::Rsqrt
        | UnaryOp::Recip
        | UnaryOp::Tanh
        | UnaryOp::Erf
        | UnaryOp::Sigmoid
        | UnaryOp::Silu
        | UnaryOp::Gelu
        | UnaryOp::GeluTanh => unary_f32(op, x as f32) as i64,
    }
}

/// The value of a binary op on two floats; comparisons give 1.0 or 0.0.
pub fn binary_f32(op: BinaryOp, a: f32, b: f32) -> f32 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Pow => a.powf(b),
        // NaN propagates, as in torch.maximum/minimum.
        BinaryOp::Maximum => {
            if a.is_nan() || b.is_nan() {
                f32::NAN
            } else {
                a.max(b)
            }
        }
        BinaryOp::Minimum => {
            if a.is_nan() || b.is_nan() {
                f32::NAN
            } else {
                a.min(b)
            }
        }
        BinaryOp::Equal => f32::from(u8::from(a == b)),
        BinaryOp::Less => f32::from(u8::from(a < b)),
        BinaryOp::Greater => f32::from(u8::from(a > b)),
    }
}

/// The value of a binary op on two integers (Div and Pow are typed for floats only).
pub fn binary_i64(op: BinaryOp, a: i64, b: i64) -> i64 {
    match op {
        BinaryOp::Add => a.wrapping_add(b),
        BinaryOp::Sub => a.wrapping_sub(b),
        BinaryOp::Mul => a.wrapping_mul(b),
        BinaryOp::Div => a.checked_div(b).unwrap_or(0),
        BinaryOp::Pow => (a as f64).powf(b as f64) as i64,
        BinaryOp::Maximum => a.max(b),
        BinaryOp::Minimum => a.min(b),
        BinaryOp::Equal => i64::from(a == b),
        BinaryOp::Less => i64::from(a < b),
        BinaryOp::Greater => i64::from(a > b),
    }
}
