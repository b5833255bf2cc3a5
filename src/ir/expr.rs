//! The expression of a FusedElementwise node: a tree over the node's operands (`$0`, `$1`, …)
//! and scalar constants, built from the elementwise ops. Its type follows from applying each
//! op's own shape rule to its sub-expressions, so it never defines semantics of its own.
//!
//! An expression is at most [`MAX_OPS`] ops over at most [`MAX_INPUTS`] operands: a kernel
//! passes each operand as a parameter and holds each op's value in registers, and the bound also
//! bounds the depth of the tree, so the recursive walks over it (typing, printing, the
//! interpreter, codegen) stay shallow. Shape inference refuses a larger expression, and
//! elementwise fusion stops growing one at the bound. The checks themselves walk iteratively.

use std::fmt;

use serde_json::Value;

use super::dtype::DType;
use super::scalar::{self, parse_number};
use super::values::{BinaryOp, UnaryOp};

/// The most ops one fused expression may apply.
pub const MAX_OPS: usize = 64;
/// The most operands one fused expression may read.
pub const MAX_INPUTS: usize = 16;

#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// Operand `i` of the fused node, broadcast to the result shape.
    Input(usize),
    /// A scalar constant.
    Const(f64, DType),
    Unary(UnaryOp, Box<Expr>),
    Binary(BinaryOp, Box<Expr>, Box<Expr>),
    Where(Box<Expr>, Box<Expr>, Box<Expr>),
    Cast(DType, Box<Expr>),
}

impl Expr {
    /// A constant holding `v` as `dtype` holds it (`ir::scalar::constant`): an f16 constant
    /// 0.1 holds 0.0999755859375, so a kernel's literal is the interpreter's value. (An f32
    /// constant keeps its f64 as written: every path reads it as `v as f32`.)
    pub fn constant(v: f64, dtype: DType) -> Expr {
        Expr::Const(narrowed(v, dtype), dtype)
    }

    /// Every node of the expression, parents before children, walked with an explicit stack.
    pub fn nodes(&self) -> impl Iterator<Item = &Expr> {
        let mut stack = vec![self];
        std::iter::from_fn(move || {
            let e = stack.pop()?;
            stack.extend(e.children().into_iter().rev());
            Some(e)
        })
    }

    /// Checks what shape inference needs before typing the expression: at most [`MAX_OPS`]
    /// ops and [`MAX_INPUTS`] operands, exactly `operands` operands read, and each constant a
    /// value its dtype holds.
    pub fn check(&self, operands: usize) -> Result<(), String> {
        let (mut ops, mut reads) = (0usize, 0usize);
        for e in self.nodes() {
            match e {
                Expr::Input(i) => reads = reads.max(i.saturating_add(1)),
                Expr::Const(v, dt) => {
                    scalar::check_constant(*dt, *v)?;
                    let held = narrowed(*v, *dt);
                    if held.to_bits() != v.to_bits() && !v.is_nan() {
                        return Err(format!(
                            "constant {v} is not a value of {dt} (it holds {held})"
                        ));
                    }
                }
                Expr::Unary(..) | Expr::Binary(..) | Expr::Where(..) | Expr::Cast(..) => {
                    ops += 1;
                    if ops > MAX_OPS {
                        return Err(format!(
                            "the expression applies more than {MAX_OPS} ops (ir::expr::MAX_OPS)"
                        ));
                    }
                }
            }
        }
        if operands > MAX_INPUTS {
            return Err(format!(
                "the node has {operands} operands, more than {MAX_INPUTS} (ir::expr::MAX_INPUTS)"
            ));
        }
        if reads != operands {
            return Err(format!(
                "the expression reads {reads} operand(s), the node has {operands}"
            ));
        }
        Ok(())
    }

    pub fn children(&self) -> Vec<&Expr> {
        match self {
            Expr::Input(_) | Expr::Const(..) => vec![],
            Expr::Unary(_, a) | Expr::Cast(_, a) => vec![a],
            Expr::Binary(_, a, b) => vec![a, b],
            Expr::Where(c, a, b) => vec![c, a, b],
        }
    }

    /// Highest operand index read, plus one.
    pub fn input_count(&self) -> usize {
        self.nodes()
            .filter_map(|e| match e {
                Expr::Input(i) => Some(i.saturating_add(1)),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }

    /// How many ops the expression applies.
    pub fn op_count(&self) -> usize {
        self.nodes()
            .filter(|e| !matches!(e, Expr::Input(_) | Expr::Const(..)))
            .count()
    }

    /// JSON form: `"$0"`, `{"const": 0.5, "dtype": "f32"}`, `["mul", a, b]`, `["cast", "f16", a]`.
    pub fn to_json(&self) -> Value {
        match self {
            Expr::Input(i) => Value::String(format!("${i}")),
            Expr::Const(v, dt) => {
                serde_json::json!({"const": scalar::number_value(*v), "dtype": dt.name()})
            }
            Expr::Unary(u, a) => Value::Array(vec![u.name().into(), a.to_json()]),
            Expr::Binary(b, x, y) => Value::Array(vec![b.name().into(), x.to_json(), y.to_json()]),
            Expr::Where(c, a, b) => {
                Value::Array(vec!["where".into(), c.to_json(), a.to_json(), b.to_json()])
            }
            Expr::Cast(to, a) => Value::Array(vec!["cast".into(), to.name().into(), a.to_json()]),
        }
    }

    pub fn from_json(v: &Value) -> Result<Expr, String> {
        match v {
            Value::String(s) => s
                .strip_prefix('$')
                .and_then(|n| n.parse().ok())
                .map(Expr::Input)
                .ok_or_else(|| format!("`{s}` is not an operand reference like \"$0\"")),
            Value::Object(m) => {
                let value = match m.get("const") {
                    Some(v @ (Value::Number(_) | Value::String(_))) => parse_number(v)?,
                    _ => return Err("a constant needs a numeric `const`".into()),
                };
                let dtype = m
                    .get("dtype")
                    .and_then(Value::as_str)
                    .and_then(DType::parse)
                    .ok_or("a constant needs a `dtype`")?;
                if m.len() != 2 {
                    return Err("a constant has exactly `const` and `dtype`".into());
                }
                scalar::check_constant(dtype, value)?;
                Ok(Expr::constant(value, dtype))
            }
            Value::Array(items) => {
                let name = items
                    .first()
                    .and_then(Value::as_str)
                    .ok_or("an op list starts with the op name")?;
                let arg = |i: usize| -> Result<Box<Expr>, String> {
                    items
                        .get(i)
                        .ok_or_else(|| format!("`{name}` is missing operand {i}"))
                        .and_then(Expr::from_json)
                        .map(Box::new)
                };
                let want = |n: usize| -> Result<(), String> {
                    if items.len() == n + 1 {
                        Ok(())
                    } else {
                        Err(format!(
                            "`{name}` takes {n} operand(s), got {}",
                            items.len() - 1
                        ))
                    }
                };
                if name == "where" {
                    want(3)?;
                    return Ok(Expr::Where(arg(1)?, arg(2)?, arg(3)?));
                }
                if name == "cast" {
                    want(2)?;
                    let to = items[1]
                        .as_str()
                        .and_then(DType::parse)
                        .ok_or("cast needs a dtype name")?;
                    return Ok(Expr::Cast(to, arg(2)?));
                }
                if let Some(u) = UnaryOp::ALL.iter().find(|u| u.name() == name) {
                    want(1)?;
                    return Ok(Expr::Unary(*u, arg(1)?));
                }
                if let Some(b) = BinaryOp::ALL.iter().find(|b| b.name() == name) {
                    want(2)?;
                    return Ok(Expr::Binary(*b, arg(1)?, arg(2)?));
                }
                Err(format!("`{name}` is not an elementwise op"))
            }
            other => Err(format!("{other} is not an expression")),
        }
    }
}

/// `v` as an f16/bf16 constant holds it; other dtypes' constants are kept as written.
fn narrowed(v: f64, dtype: DType) -> f64 {
    match dtype {
        DType::F16 | DType::BF16 => scalar::constant(dtype, v).exact_f64().unwrap_or(v),
        DType::F32 | DType::I32 | DType::I64 | DType::Bool => v,
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Input(i) => write!(f, "${i}"),
            Expr::Const(v, dt) => {
                let a = v.abs();
                if a != 0.0 && a.is_finite() && !(1e-4..1e6).contains(&a) {
                    write!(f, "{v:e}")?;
                } else {
                    write!(f, "{v}")?;
                }
                if *dt != DType::F32 {
                    write!(f, ":{dt}")?;
                }
                Ok(())
            }
            Expr::Unary(u, a) => write!(f, "{}({a})", u.name()),
            Expr::Binary(b, x, y) => write!(f, "{}({x}, {y})", b.name()),
            Expr::Where(c, a, b) => write!(f, "where({c}, {a}, {b})"),
            Expr::Cast(to, a) => write!(f, "cast<{to}>({a})"),
        }
    }
}
