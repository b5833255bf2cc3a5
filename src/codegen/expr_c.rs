//! Elementwise ops rendered as C: one row per op, each matching its row of `ir::scalar`.
//! Floats compute in f32, integers and bools in `long long`.
//!
//! An expression becomes one statement per op (`const float t3 = …;`), written in an explicit
//! post-order walk: nothing here recurses with the expression's depth, and the C has no
//! nesting deeper than one op. Each op's result is rounded to its dtype as the interpreter
//! rounds every node's value — an f16 product overflows to inf, an i32 sum wraps — so a
//! fused expression computes what the unfused ops it replaced compute. Integer arithmetic
//! wraps and float-to-integer conversions saturate (NaN to 0) through prelude helpers,
//! because C leaves both undefined.

use std::borrow::Cow;

use super::ctype::{f32_literal, i64_literal};
use super::limits::MAX_EXPR_OPS;
use super::CodegenError;
use crate::ir::{infer, BinaryOp, DType, Data, Expr, Op, Shape, Tensor, TensorType, UnaryOp};

fn unary_float(op: UnaryOp, x: &str) -> String {
    match op {
        UnaryOp::Neg => format!("(-{x})"),
        UnaryOp::Abs => format!("fabsf({x})"),
        UnaryOp::Exp => format!("expf({x})"),
        UnaryOp::Log => format!("logf({x})"),
        UnaryOp::Sqrt => format!("sqrtf({x})"),
        UnaryOp::Rsqrt => format!("(1.0f / sqrtf({x}))"),
        UnaryOp::Recip => format!("(1.0f / {x})"),
        UnaryOp::Tanh => format!("tanhf({x})"),
        UnaryOp::Erf => format!("erff({x})"),
        UnaryOp::Sigmoid => format!("rf_sigmoid({x})"),
        UnaryOp::Silu => format!("rf_silu({x})"),
        UnaryOp::Gelu => format!("rf_gelu({x})"),
        UnaryOp::GeluTanh => format!("rf_gelu_tanh({x})"),
        // Inline rather than a prelude helper: `x` is a temporary or a load, so repeating it is
        // free, and the preludes (and their snapshots) stay as they are.
        UnaryOp::Softplus => format!("(fmaxf({x}, 0.0f) + log1pf(expf(-fabsf({x}))))"),
    }
}

fn unary_int(op: UnaryOp, x: &str) -> String {
    match op {
        UnaryOp::Neg => format!("rf_neg_ll({x})"),
        UnaryOp::Abs => format!("rf_abs_ll({x})"),
        // Not typed for integers; kept as `ir::scalar` defines them: through f32, saturating.
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
        | UnaryOp::Softplus => {
            format!("rf_f2ll({})", unary_float(op, &format!("(float)({x})")))
        }
    }
}

fn binary_float(op: BinaryOp, a: &str, b: &str) -> String {
    match op {
        BinaryOp::Add => format!("({a} + {b})"),
        BinaryOp::Sub => format!("({a} - {b})"),
        BinaryOp::Mul => format!("({a} * {b})"),
        BinaryOp::Div => format!("({a} / {b})"),
        BinaryOp::Pow => format!("powf({a}, {b})"),
        BinaryOp::Maximum => format!("rf_max({a}, {b})"),
        BinaryOp::Minimum => format!("rf_min({a}, {b})"),
        BinaryOp::Equal => format!("({a} == {b} ? 1LL : 0LL)"),
        BinaryOp::Less => format!("({a} < {b} ? 1LL : 0LL)"),
        BinaryOp::Greater => format!("({a} > {b} ? 1LL : 0LL)"),
    }
}

fn binary_int(op: BinaryOp, a: &str, b: &str) -> String {
    match op {
        BinaryOp::Add => format!("rf_add_ll({a}, {b})"),
        BinaryOp::Sub => format!("rf_sub_ll({a}, {b})"),
        BinaryOp::Mul => format!("rf_mul_ll({a}, {b})"),
        BinaryOp::Div => format!("rf_div_ll({a}, {b})"),
        BinaryOp::Pow => format!("rf_d2ll(pow((double)({a}), (double)({b})))"),
        BinaryOp::Maximum => format!("({a} > {b} ? {a} : {b})"),
        BinaryOp::Minimum => format!("({a} < {b} ? {a} : {b})"),
        BinaryOp::Equal => format!("({a} == {b} ? 1LL : 0LL)"),
        BinaryOp::Less => format!("({a} < {b} ? 1LL : 0LL)"),
        BinaryOp::Greater => format!("({a} > {b} ? 1LL : 0LL)"),
    }
}

/// `x`, a value of dtype `from`, converted as `Tensor::cast` converts.
fn cast(x: &str, from: DType, to: DType) -> String {
    match to {
        DType::F32 if from.is_float() => x.to_string(),
        DType::F32 => format!("(float)({x})"),
        DType::F16 => format!("rf_h2f(rf_f2h((float)({x})))"),
        DType::BF16 => format!("rf_b2f(rf_f2b((float)({x})))"),
        DType::Bool => format!("({x} != 0 ? 1LL : 0LL)"),
        DType::I32 if from.is_float() => format!("(long long)rf_f2i({x})"),
        DType::I32 => format!("rf_wrap_i32({x})"),
        DType::I64 if from.is_float() => format!("rf_f2ll({x})"),
        DType::I64 => x.to_string(),
    }
}

/// `code`, a freshly computed value, rounded to `dt` as the interpreter stores a node of `dt`.
pub(crate) fn round_to(dt: DType, code: String) -> String {
    match dt {
        DType::F16 => format!("rf_h2f(rf_f2h({code}))"),
        DType::BF16 => format!("rf_b2f(rf_f2b({code}))"),
        DType::I32 => format!("rf_wrap_i32({code})"),
        DType::F32 | DType::I64 | DType::Bool => code,
    }
}

/// Float ops whose result is one of their operands (or its sign flipped), so already a value
/// of the operands' dtype: rounding it again would change nothing.
fn exact_on_floats(op: &Expr) -> bool {
    matches!(
        op,
        Expr::Unary(UnaryOp::Neg | UnaryOp::Abs, _)
            | Expr::Binary(BinaryOp::Maximum | BinaryOp::Minimum, ..)
    )
}

/// The C type a value of `dt` computes in.
fn value_type(dt: DType) -> &'static str {
    if dt.is_float() {
        "float"
    } else {
        "long long"
    }
}

/// A constant as the interpreter holds it (`Tensor::from_f64`: rounded to an f16, wrapped to
/// an i32, 0/1 for a bool), as a C literal.
fn constant(v: f64, dt: DType) -> String {
    let t = Tensor::from_f64(dt, Shape::scalar(), &[v]).expect("one value for a scalar");
    match t.into_data() {
        Data::Float(f) => f32_literal(f64::from(f[0])),
        Data::Int(i) => i64_literal(i[0]),
    }
}

/// An expression as C statements: `lines` compute it, `value` names the result.
pub(crate) struct Rendered {
    pub lines: Vec<String>,
    pub value: String,
}

/// Renders `expr` over operands read as the C variables `vars` of types `ins`; temporaries
/// are named `{prefix}{n}`. `node` names the node for errors.
pub(crate) fn render(
    expr: &Expr,
    vars: &[String],
    ins: &[TensorType],
    prefix: &str,
    node: &str,
) -> Result<Rendered, CodegenError> {
    // Post-order without recursion: a node is pushed once to visit its children and once more
    // to emit it; results wait on a stack in the order their parents take them.
    let mut todo: Vec<(&Expr, bool)> = vec![(expr, false)];
    let mut results: Vec<(String, TensorType)> = Vec::new();
    let mut lines: Vec<String> = Vec::new();
    let bad = |reason: String| CodegenError::Unsupported {
        node: node.to_string(),
        reason,
    };
    while let Some((e, children_done)) = todo.pop() {
        let kids = e.children();
        if !children_done && !kids.is_empty() {
            todo.push((e, true));
            // Reversed so the first child is emitted (and its result pushed) first.
            todo.extend(kids.iter().rev().map(|k| (*k, false)));
            continue;
        }
        let (code, ty) = match e {
            Expr::Input(i) => {
                let (var, ty) = vars
                    .get(*i)
                    .zip(ins.get(*i))
                    .ok_or_else(|| bad(format!("the expression reads ${i} of {}", ins.len())))?;
                results.push((var.clone(), ty.clone()));
                continue;
            }
            Expr::Const(v, dt) => {
                results.push((constant(*v, *dt), TensorType::new(*dt, vec![])));
                continue;
            }
            Expr::Unary(..) | Expr::Binary(..) | Expr::Where(..) | Expr::Cast(..) => {
                if lines.len() >= MAX_EXPR_OPS {
                    return Err(CodegenError::ExpressionTooLarge {
                        node: node.to_string(),
                        limit: MAX_EXPR_OPS,
                    });
                }
                let args = results.split_off(results.len() - kids.len());
                let op = match e {
                    Expr::Unary(u, _) => Op::Unary(*u),
                    Expr::Binary(b, ..) => Op::Binary(*b),
                    Expr::Where(..) => Op::Where,
                    Expr::Cast(to, _) => Op::Cast { to: *to },
                    Expr::Input(_) | Expr::Const(..) => unreachable!("leaves handled above"),
                };
                let types: Vec<&TensorType> = args.iter().map(|(_, t)| t).collect();
                let ty = infer(&op, &types).map_err(|err| bad(format!("{err:?}")))?;
                let arg_dtype = args[0].1.dtype;
                let v: Vec<&str> = args.iter().map(|(c, _)| c.as_str()).collect();
                let code = match e {
                    Expr::Unary(u, _) if arg_dtype.is_float() => unary_float(*u, v[0]),
                    Expr::Unary(u, _) => unary_int(*u, v[0]),
                    Expr::Binary(b, ..) if arg_dtype.is_float() => binary_float(*b, v[0], v[1]),
                    Expr::Binary(b, ..) => binary_int(*b, v[0], v[1]),
                    Expr::Where(..) => format!("({} != 0 ? {} : {})", v[0], v[1], v[2]),
                    Expr::Cast(to, _) => cast(v[0], arg_dtype, *to),
                    Expr::Input(_) | Expr::Const(..) => unreachable!("leaves handled above"),
                };
                // A where picks an operand and a cast converts exactly once: neither rounds
                // again. Every other op's result is a new value of its dtype.
                let keeps = matches!(e, Expr::Where(..) | Expr::Cast(..))
                    || (ty.dtype.is_float() && exact_on_floats(e));
                let code = if keeps {
                    code
                } else {
                    round_to(ty.dtype, code)
                };
                (code, ty)
            }
        };
        let name = format!("{prefix}{}", lines.len());
        lines.push(format!("const {} {name} = {code};", value_type(ty.dtype)));
        results.push((name, ty));
    }
    let (value, _) = results.pop().expect("the root leaves one result");
    Ok(Rendered { lines, value })
}

/// A one-line description of `expr` for a kernel comment: its text when short (the text is
/// written recursively, so long expressions are only counted), else its size.
pub(crate) fn describe(expr: &Expr) -> String {
    let mut ops = 0usize;
    let mut todo = vec![expr];
    while let Some(e) = todo.pop() {
        let kids = e.children();
        if !kids.is_empty() {
            ops += 1;
            if ops > 32 {
                return "an expression of more than 32 ops".into();
            }
        }
        todo.extend(kids);
    }
    expr.to_string()
}

/// The expression a single elementwise op computes over its operands (a fused node's own,
/// borrowed: cloning walks the whole tree).
pub(crate) fn op_expr(op: &Op, arity: usize) -> Option<Cow<'_, Expr>> {
    let i = |k: usize| Box::new(Expr::Input(k));
    Some(match op {
        Op::Unary(u) => Cow::Owned(Expr::Unary(*u, i(0))),
        Op::Binary(b) => Cow::Owned(Expr::Binary(*b, i(0), i(1))),
        Op::Where if arity == 3 => Cow::Owned(Expr::Where(i(0), i(1), i(2))),
        Op::Cast { to } => Cow::Owned(Expr::Cast(*to, i(0))),
        Op::FusedElementwise(e) => Cow::Borrowed(e),
        Op::Where
        | Op::Input { .. }
        | Op::Weight { .. }
        | Op::Constant { .. }
        | Op::CausalMask { .. }
        | Op::Reshape { .. }
        | Op::Permute { .. }
        | Op::Expand { .. }
        | Op::Concat { .. }
        | Op::Slice { .. }
        | Op::Gather
        | Op::Reduce { .. }
        | Op::Softmax { .. }
        | Op::LayerNorm { .. }
        | Op::RmsNorm { .. }
        | Op::Rope { .. }
        | Op::MatMul
        | Op::FlashAttention(_)
        | Op::Gemm(_)
        | Op::State { .. }
        | Op::CacheWrite { .. }
        | Op::PagedCacheWrite
        | Op::PagedAttention { .. }
        | Op::ArgMax { .. } => return None,
    })
}
