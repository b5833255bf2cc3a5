//! Elementwise ops rendered as C: one row per op. Floats compute in f32, integers and bools in
//! `long long`; an explicit cast to f16/bf16 rounds through the storage type, as the op does.

use super::ctype::f32_literal;
use crate::ir::{BinaryOp, DType, Expr, Op, TensorType, UnaryOp};

fn unary_float(op: UnaryOp, x: &str) -> String {
    match op {
        UnaryOp::Neg => format!("(-{x})"),
        UnaryOp::Abs => format!("fabsf({x})"),
        UnaryOp::Exp => format!("expf({x})"),
        UnaryOp::Log => format!("logf({x})"),
        UnaryOp::Sqrt => format!("sqrtf({x})"),
        UnaryOp::Rsqrt => format!("rsqrtf({x})"),
        UnaryOp::Recip => format!("(1.0f / {x})"),
        UnaryOp::Tanh => format!("tanhf({x})"),
        UnaryOp::Erf => format!("erff({x})"),
        UnaryOp::Sigmoid => format!("rf_sigmoid({x})"),
        UnaryOp::Silu => format!("rf_silu({x})"),
        UnaryOp::Gelu => format!("rf_gelu({x})"),
        UnaryOp::GeluTanh => format!("rf_gelu_tanh({x})"),
    }
}

fn unary_int(op: UnaryOp, x: &str) -> String {
    match op {
        UnaryOp::Neg => format!("(-{x})"),
        UnaryOp::Abs => format!("llabs({x})"),
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
        | UnaryOp::GeluTanh => {
            format!("(long long)({})", unary_float(op, &format!("(float)({x})")))
        }
    }
}

fn binary(op: BinaryOp, a: &str, b: &str, float: bool) -> String {
    match op {
        BinaryOp::Add => format!("({a} + {b})"),
        BinaryOp::Sub => format!("({a} - {b})"),
        BinaryOp::Mul => format!("({a} * {b})"),
        BinaryOp::Div if float => format!("({a} / {b})"),
        BinaryOp::Div => format!("({b} == 0 ? 0LL : {a} / {b})"),
        BinaryOp::Pow if float => format!("powf({a}, {b})"),
        BinaryOp::Pow => format!("(long long)pow((double)({a}), (double)({b}))"),
        BinaryOp::Maximum if float => format!("rf_max({a}, {b})"),
        BinaryOp::Minimum if float => format!("rf_min({a}, {b})"),
        BinaryOp::Maximum => format!("({a} > {b} ? {a} : {b})"),
        BinaryOp::Minimum => format!("({a} < {b} ? {a} : {b})"),
        BinaryOp::Equal => format!("({a} == {b} ? 1LL : 0LL)"),
        BinaryOp::Less => format!("({a} < {b} ? 1LL : 0LL)"),
        BinaryOp::Greater => format!("({a} > {b} ? 1LL : 0LL)"),
    }
}

fn cast(x: &str, from: DType, to: DType) -> String {
    match (from.is_float(), to) {
        (_, DType::F32) if from.is_float() => x.to_string(),
        (_, DType::F16) => format!("rf_h2f(rf_f2h((float)({x})))"),
        (_, DType::BF16) => format!("rf_b2f(rf_f2b((float)({x})))"),
        (false, DType::F32) => format!("(float)({x})"),
        (_, DType::Bool) => format!("({x} != 0 ? 1LL : 0LL)"),
        (_, DType::I32) => format!("(long long)(int)({x})"),
        (_, DType::I64) => format!("(long long)({x})"),
        (true, DType::F32) => unreachable!("matched above"),
    }
}

/// C for `expr`, reading operand `i` as the variable `vars[i]` of type `ins[i]`. Returns the code
/// and the expression's type.
pub(crate) fn render(expr: &Expr, vars: &[String], ins: &[TensorType]) -> (String, TensorType) {
    let refs: Vec<&TensorType> = ins.iter().collect();
    let ty = expr
        .ty(&refs)
        .expect("the expression was typed when its node was built");
    let code = match expr {
        Expr::Input(i) => vars[*i].clone(),
        Expr::Const(v, dt) if dt.is_float() => f32_literal(*v),
        Expr::Const(v, _) => format!("{}LL", *v as i64),
        Expr::Unary(u, a) => {
            let (c, t) = render(a, vars, ins);
            if t.dtype.is_float() {
                unary_float(*u, &c)
            } else {
                unary_int(*u, &c)
            }
        }
        Expr::Binary(b, x, y) => {
            let ((cx, tx), (cy, _)) = (render(x, vars, ins), render(y, vars, ins));
            binary(*b, &cx, &cy, tx.dtype.is_float())
        }
        Expr::Where(c, x, y) => {
            let ((cc, _), (cx, _), (cy, _)) = (
                render(c, vars, ins),
                render(x, vars, ins),
                render(y, vars, ins),
            );
            format!("({cc} != 0 ? {cx} : {cy})")
        }
        Expr::Cast(to, a) => {
            let (c, t) = render(a, vars, ins);
            cast(&c, t.dtype, *to)
        }
    };
    (code, ty)
}

/// The expression a single elementwise op computes over its operands.
pub(crate) fn op_expr(op: &Op, arity: usize) -> Option<Expr> {
    let i = |k: usize| Box::new(Expr::Input(k));
    Some(match op {
        Op::Unary(u) => Expr::Unary(*u, i(0)),
        Op::Binary(b) => Expr::Binary(*b, i(0), i(1)),
        Op::Where if arity == 3 => Expr::Where(i(0), i(1), i(2)),
        Op::Cast { to } => Expr::Cast(*to, i(0)),
        Op::FusedElementwise(e) => e.clone(),
        _ => return None,
    })
}
