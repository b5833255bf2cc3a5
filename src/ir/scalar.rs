//! The one scalar semantics of rocmforge: what every elementwise op, cast, constant and stored
//! element is on one element. The interpreter applies these over tensors and constant folding
//! applies them to constants, so a folded constant is bit for bit what the interpreter computes;
//! codegen's C rows (`codegen/expr_c.rs`) implement the same table, which `docs/ops.md` spells out.
//!
//! Host tensors hold floats (f32, f16, bf16) as an f32 that is a value of their dtype, and
//! integers and bools as an i64 that is a value of theirs (bools 0 or 1). Every result is stored
//! to its dtype at once:
//! - to f16/bf16: round to nearest, ties to even; overflow gives ±inf; NaN stays NaN;
//! - to i32: two's complement wrap (the low 32 bits), as C and PyTorch do for integer overflow;
//! - float to integer: truncate toward zero, saturate at the dtype's limits (±inf too), NaN → 0
//!   (Rust's `as`, CUDA's `__float2int_rz`, the GPUs' `cvt.rzi`/`v_cvt_i32_f32`);
//! - integer to f16/bf16: to f32 first (nearest, ties to even), then to the dtype, as PyTorch does;
//! - anything to bool: non-zero is true (NaN is true).

use serde_json::Value;

use super::dtype::DType;
use super::values::{BinaryOp, UnaryOp};

const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// 2^63: the f64 nearest `i64::MAX`, and the first value past every i64.
const TWO_POW_63: f64 = 9.223_372_036_854_776e18;

/// One element as host tensors hold it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Element {
    /// A float of an f32, f16 or bf16 tensor.
    Float(f32),
    /// An integer or bool (0 or 1) of an i32, i64 or bool tensor.
    Int(i64),
}

impl Element {
    /// The element's value as an f64, when the f64 holds it exactly (every float does; integers
    /// beyond 2^53 in magnitude may not).
    pub fn exact_f64(self) -> Option<f64> {
        match self {
            Element::Float(x) => Some(f64::from(x)),
            Element::Int(i) => {
                let f = i as f64;
                // 2^63 is the f64 nearest i64::MAX but not equal to it; `as` saturates it back.
                (f != TWO_POW_63 && f as i64 == i).then_some(f)
            }
        }
    }

    /// The raw bits, for bit-for-bit comparisons (a float's f32 bits, an integer's i64 bits).
    pub fn bits(self) -> u64 {
        match self {
            Element::Float(x) => u64::from(x.to_bits()),
            Element::Int(i) => i as u64,
        }
    }
}

/// A float stored to the float dtype `dtype` (identity for f32).
pub fn round_float(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::F16 => half::f16::from_f32(x).to_f32(),
        DType::BF16 => half::bf16::from_f32(x).to_f32(),
        DType::F32 | DType::I32 | DType::I64 | DType::Bool => x,
    }
}

/// An integer stored to the integer or bool dtype `dtype`: i32 wraps, bool is "non-zero".
pub fn wrap_int(dtype: DType, x: i64) -> i64 {
    match dtype {
        DType::I32 => i64::from(x as i32),
        DType::Bool => i64::from(x != 0),
        DType::I64 | DType::F32 | DType::F16 | DType::BF16 => x,
    }
}

/// A float converted to `to` (the `cast` op on a float operand).
pub fn cast_float(x: f32, to: DType) -> Element {
    match to {
        DType::F32 | DType::F16 | DType::BF16 => Element::Float(round_float(to, x)),
        // `as` truncates toward zero, saturates and maps NaN to 0.
        DType::I32 => Element::Int(i64::from(x as i32)),
        DType::I64 => Element::Int(x as i64),
        DType::Bool => Element::Int(i64::from(x != 0.0)),
    }
}

/// An integer or bool converted to `to` (the `cast` op on an integer operand).
pub fn cast_int(x: i64, to: DType) -> Element {
    match to {
        DType::F32 | DType::F16 | DType::BF16 => Element::Float(round_float(to, x as f32)),
        DType::I32 | DType::I64 | DType::Bool => Element::Int(wrap_int(to, x)),
    }
}

/// An element converted to `to`.
pub fn cast(x: Element, to: DType) -> Element {
    match x {
        Element::Float(f) => cast_float(f, to),
        Element::Int(i) => cast_int(i, to),
    }
}

/// The element a constant value (as graph files and `Op::Constant` hold it, an f64) stands for
/// in a tensor of `dtype`: floats go to f32 (nearest) and then to the dtype; integers are taken
/// as they are (shape inference refuses integer constants that are not integers of their
/// dtype, see [`check_constant`]).
pub fn constant(dtype: DType, v: f64) -> Element {
    if dtype.is_float() {
        Element::Float(round_float(dtype, v as f32))
    } else {
        Element::Int(wrap_int(dtype, v as i64))
    }
}

/// Why `v` cannot be a constant of `dtype`: integers must be integers within the dtype's range
/// (and exactly an f64), bools 0 or 1. Floats may be anything (they round to their dtype).
pub fn check_constant(dtype: DType, v: f64) -> Result<(), String> {
    let (lo, hi) = match dtype {
        DType::F32 | DType::F16 | DType::BF16 => return Ok(()),
        DType::I32 => (f64::from(i32::MIN), f64::from(i32::MAX)),
        // i64::MAX is not an f64; 2^63 is the first value past it.
        DType::I64 => (i64::MIN as f64, TWO_POW_63),
        DType::Bool => (0.0, 1.0),
    };
    let in_range = if dtype == DType::I64 {
        lo <= v && v < hi
    } else {
        lo <= v && v <= hi
    };
    if v.fract() == 0.0 && in_range {
        Ok(())
    } else {
        Err(format!("{v} is not a value of {dtype}"))
    }
}

/// The raw value of a unary op on one float, before storing to a dtype.
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
        // The naive ln(1 + eˣ) overflows to inf from x ≈ 89 and loses everything below
        // x ≈ −17; split off max(x, 0) so the exponent is never positive. `f32::max` drops a
        // NaN operand, but the ln_1p term keeps it, so NaN stays NaN (as `fmaxf` in the C row).
        UnaryOp::Softplus => x.max(0.0) + (-x.abs()).exp().ln_1p(),
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

/// The raw value of a unary op on one integer, before wrapping to a dtype. Shape inference types
/// only Neg and Abs for integers; they wrap (`-i64::MIN` is `i64::MIN`).
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
        | UnaryOp::GeluTanh
        | UnaryOp::Softplus => unary_f32(op, x as f32) as i64,
    }
}

/// The raw value of a binary op on two floats; comparisons give 1.0 or 0.0.
pub fn binary_f32(op: BinaryOp, a: f32, b: f32) -> f32 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Pow => a.powf(b),
        BinaryOp::Maximum => ieee_maximum(a, b),
        BinaryOp::Minimum => ieee_minimum(a, b),
        BinaryOp::Equal => f32::from(u8::from(a == b)),
        BinaryOp::Less => f32::from(u8::from(a < b)),
        BinaryOp::Greater => f32::from(u8::from(a > b)),
    }
}

/// IEEE 754-2019 `maximum`: NaN if either is NaN (as torch.maximum), and −0 < +0 (so the
/// result does not depend on operand order, which `f32::max` leaves open).
fn ieee_maximum(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else if a > b || (a == b && b.is_sign_negative()) {
        a
    } else {
        b
    }
}

/// IEEE 754-2019 `minimum`: NaN if either is NaN, and −0 < +0.
fn ieee_minimum(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else if a < b || (a == b && a.is_sign_negative()) {
        a
    } else {
        b
    }
}

/// The raw value of a binary op on two integers, before wrapping to a dtype. Shape inference
/// types Div and Pow for floats only; they are defined here all the same (division by zero is
/// 0, as the C row has it).
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

/// A unary op on an element of dtype `dtype` (the result has the same dtype), stored.
pub fn unary(op: UnaryOp, dtype: DType, x: Element) -> Element {
    match x {
        Element::Float(f) => Element::Float(round_float(dtype, unary_f32(op, f))),
        Element::Int(i) => Element::Int(wrap_int(dtype, unary_i64(op, i))),
    }
}

/// A binary op on two elements of one dtype, stored to the result dtype `out` (bool for
/// comparisons, else the operands' dtype).
pub fn binary(op: BinaryOp, out: DType, a: Element, b: Element) -> Element {
    match (a, b) {
        (Element::Float(x), Element::Float(y)) => {
            let v = binary_f32(op, x, y);
            if op.is_comparison() {
                Element::Int(i64::from(v != 0.0))
            } else {
                Element::Float(round_float(out, v))
            }
        }
        (Element::Int(x), Element::Int(y)) => Element::Int(wrap_int(out, binary_i64(op, x, y))),
        (Element::Float(_), Element::Int(_)) | (Element::Int(_), Element::Float(_)) => {
            unreachable!("shape inference refuses operands of two dtypes")
        }
    }
}

/// `where(c, a, b)`: `a` where `c` is true (non-zero).
pub fn select(c: Element, a: Element, b: Element) -> Element {
    let take_a = match c {
        Element::Int(i) => i != 0,
        Element::Float(f) => f != 0.0,
    };
    if take_a {
        a
    } else {
        b
    }
}

// Defined here rather than in `dtype.rs` because it is a cast of this file; `dtype` stays below
// `scalar` (no circle).
impl DType {
    /// An f32 stored to this dtype, read back as an f32: floats round (`round_float`), integer
    /// and bool dtypes convert as a cast does (truncate, saturate, NaN → 0; bool is non-zero).
    pub fn round_f32(self, v: f32) -> f32 {
        match cast_float(v, self) {
            Element::Float(f) => f,
            Element::Int(i) => i as f32,
        }
    }
}

/// JSON has no infinities or NaN: those are written as strings.
pub fn number_value(v: f64) -> Value {
    if v.is_finite() {
        serde_json::Number::from_f64(v)
            .map(Value::Number)
            .unwrap_or(Value::Null)
    } else if v.is_nan() {
        Value::String("nan".into())
    } else if v > 0.0 {
        Value::String("inf".into())
    } else {
        Value::String("-inf".into())
    }
}

/// A constant value from a file: a number, a bool, "inf", "-inf" or "nan". Values are held as
/// f64, so an integer the f64 cannot hold exactly (past 2^53) is refused rather than rounded.
pub fn parse_number(v: &Value) -> Result<f64, String> {
    match v {
        Value::Number(n) => {
            let exact = if let Some(i) = n.as_i64() {
                Element::Int(i).exact_f64()
            } else if let Some(u) = n.as_u64() {
                // Past i64::MAX: exact only when the f64 converts back to the same integer.
                let f = u as f64;
                (f < 1.844_674_407_370_955_2e19 && f as u64 == u).then_some(f)
            } else {
                n.as_f64()
            };
            exact.ok_or_else(|| {
                format!("{n} is not exactly an f64 (integer constants are exact up to 2^53)")
            })
        }
        Value::Bool(b) => Ok(f64::from(u8::from(*b))),
        Value::String(s) => match s.as_str() {
            "inf" | "+inf" => Ok(f64::INFINITY),
            "-inf" => Ok(f64::NEG_INFINITY),
            "nan" => Ok(f64::NAN),
            _ => Err(format!("\"{s}\" is not a number")),
        },
        other => Err(format!("{other} is not a number")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn casts_saturate_truncate_and_map_nan_to_zero() {
        let i32_of = |x: f32| cast_float(x, DType::I32);
        assert_eq!(i32_of(f32::NAN), Element::Int(0));
        assert_eq!(i32_of(f32::INFINITY), Element::Int(i64::from(i32::MAX)));
        assert_eq!(i32_of(f32::NEG_INFINITY), Element::Int(i64::from(i32::MIN)));
        assert_eq!(i32_of(3e9), Element::Int(i64::from(i32::MAX)));
        assert_eq!(i32_of(-2.9), Element::Int(-2));
        assert_eq!(cast_float(f32::NAN, DType::Bool), Element::Int(1));
        assert_eq!(cast_float(-0.0, DType::Bool), Element::Int(0));
        assert_eq!(cast_int(1 << 40, DType::I32), Element::Int(0));
        assert_eq!(
            cast_float(65520.0, DType::F16),
            Element::Float(f32::INFINITY)
        );
        assert_eq!(cast_float(65519.0, DType::F16), Element::Float(65504.0));
    }

    #[test]
    fn integer_constants_must_be_values_of_their_dtype() {
        assert!(check_constant(DType::I32, 2147483647.0).is_ok());
        assert!(check_constant(DType::I32, 2147483648.0).is_err());
        assert!(check_constant(DType::I64, -TWO_POW_63).is_ok());
        assert!(check_constant(DType::I64, TWO_POW_63).is_err());
        assert!(check_constant(DType::I64, 0.5).is_err());
        assert!(check_constant(DType::I64, f64::NAN).is_err());
        assert!(check_constant(DType::Bool, 2.0).is_err());
        assert!(check_constant(DType::F16, 1e10).is_ok());
    }

    #[test]
    fn maximum_orders_signed_zeros_and_propagates_nan() {
        let max = |a, b| binary_f32(BinaryOp::Maximum, a, b);
        let min = |a, b| binary_f32(BinaryOp::Minimum, a, b);
        assert!(max(-0.0, 0.0).is_sign_positive() && max(0.0, -0.0).is_sign_positive());
        assert!(min(-0.0, 0.0).is_sign_negative() && min(0.0, -0.0).is_sign_negative());
        assert!(max(f32::NAN, 1.0).is_nan() && min(1.0, f32::NAN).is_nan());
    }

    #[test]
    fn exact_f64_refuses_integers_an_f64_cannot_hold() {
        assert_eq!(Element::Int(1 << 53).exact_f64(), Some(9007199254740992.0));
        assert_eq!(Element::Int((1 << 53) + 1).exact_f64(), None);
        assert_eq!(Element::Int(i64::MAX).exact_f64(), None);
        assert_eq!(Element::Int(i64::MIN).exact_f64(), Some(i64::MIN as f64));
    }
}
