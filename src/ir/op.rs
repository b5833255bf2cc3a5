//! The operations of the graph. Each op is defined here once: its name in files and dumps, its
//! attributes (written and parsed by the same table), and its arity. Its shape rule is in
//! `infer.rs`, its interpreter semantics in `crate::interp`, and its kernel in `crate::codegen`;
//! all of those match over `Op` exhaustively, so a new op that misses a face does not compile.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeSet;
use std::fmt;

use super::expr::Expr;
use super::gemm::{Gemm, View};
use super::quant::QuantScheme;
use super::scalar::Element;
use super::{DType, Shape};

/// Binary elementwise ops, with numpy broadcasting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Maximum,
    Minimum,
    Equal,
    Less,
    Greater,
}

impl BinaryOp {
    pub const ALL: [BinaryOp; 10] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
        BinaryOp::Equal,
        BinaryOp::Less,
        BinaryOp::Greater,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Pow => "pow",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
            BinaryOp::Equal => "equal",
            BinaryOp::Less => "less",
            BinaryOp::Greater => "greater",
        }
    }

    /// Comparisons produce bool.
    pub fn is_comparison(self) -> bool {
        matches!(self, BinaryOp::Equal | BinaryOp::Less | BinaryOp::Greater)
    }

    /// Ops only defined on floating-point operands.
    pub fn float_only(self) -> bool {
        matches!(self, BinaryOp::Div | BinaryOp::Pow)
    }
}

/// Unary elementwise ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Recip,
    Tanh,
    Erf,
    Sigmoid,
    Silu,
    /// `0.5·x·(1 + erf(x/√2))`
    Gelu,
    /// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`
    GeluTanh,
}

impl UnaryOp {
    pub const ALL: [UnaryOp; 13] = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Recip,
        UnaryOp::Tanh,
        UnaryOp::Erf,
        UnaryOp::Sigmoid,
        UnaryOp::Silu,
        UnaryOp::Gelu,
        UnaryOp::GeluTanh,
    ];

    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Recip => "recip",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Erf => "erf",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Silu => "silu",
            UnaryOp::Gelu => "gelu",
            UnaryOp::GeluTanh => "gelu_tanh",
        }
    }

    /// Ops that are also defined on integers.
    pub fn accepts_int(self) -> bool {
        matches!(self, UnaryOp::Neg | UnaryOp::Abs)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Max,
    Mean,
}

impl ReduceOp {
    pub const ALL: [ReduceOp; 3] = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Mean];

    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "reduce_sum",
            ReduceOp::Max => "reduce_max",
            ReduceOp::Mean => "reduce_mean",
        }
    }
}

/// How random data is drawn for a graph input when the caller gives none (`rocmforge run`).
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Sample {
    /// Standard normal.
    #[default]
    Normal,
    /// A 0/1 mask over the last axis: each row keeps a random prefix (at least one element).
    PaddingMask,
    /// Uniform integers in `[low, high)`.
    Range { low: i64, high: i64 },
}

impl Sample {
    /// Why this sample cannot be drawn for `dtype`: a range must be non-empty and hold only
    /// values of the dtype (i32 ranges within i32, bool within 0..2; float ranges must be
    /// non-empty as f64 too), so no drawn value ever wraps or leaves `[low, high)`.
    pub fn check(&self, dtype: DType) -> Result<(), String> {
        let Sample::Range { low, high } = *self else {
            return Ok(());
        };
        if low >= high {
            return Err(format!("the range {low}..{high} is empty"));
        }
        let (min, max_excl): (i128, i128) = match dtype {
            DType::I32 => (i128::from(i32::MIN), i128::from(i32::MAX) + 1),
            DType::Bool => (0, 2),
            DType::I64 => (i128::from(i64::MIN), i128::from(i64::MAX) + 1),
            DType::F32 | DType::F16 | DType::BF16 => {
                return if (low as f64) < (high as f64) {
                    Ok(())
                } else {
                    Err(format!(
                        "the range {low}..{high} is empty once its bounds are floats"
                    ))
                };
            }
        };
        if i128::from(low) < min || i128::from(high) > max_excl {
            return Err(format!(
                "the range {low}..{high} holds values that are not {dtype}"
            ));
        }
        Ok(())
    }
}

/// How a weight is initialised when its data is not supplied.
#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Init {
    /// Normal with standard deviation 1/√(first dim) (fan-in of an `[in, out]` matrix).
    #[default]
    Normal,
    Ones,
    Zeros,
}

/// The mask operand of a FlashAttention node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MaskKind {
    /// No mask operand.
    #[default]
    None,
    /// A float mask added to the scaled scores.
    Additive,
    /// A bool mask: false positions are excluded.
    Boolean,
}

/// Attributes of a FlashAttention node.
#[derive(Clone, Debug, PartialEq)]
pub struct Attention {
    /// Multiplies Q·Kᵀ before masking and softmax.
    pub scale: f64,
    /// Key `k` is visible from query `q` only when `k ≤ q + causal_offset`.
    pub causal: bool,
    pub causal_offset: i64,
    pub mask: MaskKind,
    /// A last operand `kv_len` (i32, one element or one per batch) gives the number of valid
    /// keys: keys at index ≥ kv_len are invisible (never read by the kernels), and a causal
    /// mask is offset by kv_len − Sq (the queries are the last Sq of the kv_len positions).
    pub kv_len: bool,
}

/// An operation. Operands are the node's incoming edges, in slot order.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    // Sources.
    Input {
        dtype: DType,
        shape: Shape,
        sample: Sample,
    },
    /// A named parameter; its data is bound at run time (or drawn from a seeded RNG). With
    /// `quant`, its data is blocks of that scheme (`ir::quant`, last axis along the blocks) and
    /// its value, which every shape rule, the interpreter and the passes see, is the blocks
    /// dequantized in f32 and rounded to `dtype`.
    Weight {
        dtype: DType,
        shape: Shape,
        init: Init,
        quant: Option<QuantScheme>,
    },
    /// A scalar or small tensor; `values` holds one value (splat) or one per element.
    Constant {
        dtype: DType,
        shape: Shape,
        values: Vec<f64>,
    },
    /// A named persistent tensor that a session keeps across runs (a KV cache, sized by a
    /// maximum context). Its value in a run is the one the previous run left (the
    /// [`Op::CacheWrite`] that reads it gives the next run's value).
    State {
        dtype: DType,
        shape: Shape,
    },
    /// Bool `[sq, sk]`, true where `k ≤ q + offset`.
    CausalMask {
        sq: usize,
        sk: usize,
        offset: i64,
    },

    // Layout.
    /// At most one entry may be -1 (inferred).
    Reshape {
        shape: Vec<i64>,
    },
    Permute {
        perm: Vec<usize>,
    },
    /// numpy broadcast to `shape`.
    Expand {
        shape: Vec<usize>,
    },
    Concat {
        axis: i64,
    },
    /// Elements `start..end` (step 1) along `axis`; negative bounds count from the end.
    Slice {
        axis: i64,
        start: i64,
        end: i64,
    },
    /// `table[indices]` along the first axis of `table` (embedding lookup).
    Gather,

    // Elementwise.
    Binary(BinaryOp),
    /// `cond ? a : b`, broadcast over all three.
    Where,
    Unary(UnaryOp),
    Cast {
        to: DType,
    },

    // Reductions and normalisations.
    Reduce {
        op: ReduceOp,
        axes: Vec<i64>,
        keepdim: bool,
    },
    /// Safe softmax: a row whose inputs are all −∞ gives zeros.
    Softmax {
        axis: i64,
    },
    /// Over the last axis: `(x − mean)/√(var + eps)·weight + bias`.
    LayerNorm {
        eps: f64,
    },
    /// Over the last axis: `x/√(mean(x²) + eps)·weight`.
    RmsNorm {
        eps: f64,
    },
    /// Rotary embedding, rotate-half form (LLaMA), over `[.., S, D]` with positions `offset..offset+S`,
    /// or, with a second operand (i32 `[S]`), the positions that operand holds (`offset` then 0).
    Rope {
        theta: f64,
        offset: i64,
    },

    // Contractions.
    /// Batched `[.., M, K] × [.., K, N]`, batch dims broadcast.
    MatMul,
    /// Fused `softmax(scale·Q·Kᵀ + mask)·V` with GQA: q `[B,Hq,Sq,D]`, k `[B,Hkv,Sk,D]`,
    /// v `[B,Hkv,Sk,Dv]`, optional mask broadcastable to `[B,Hq,Sq,Sk]`.
    FlashAttention(Attention),
    /// A batched matrix product read and written through strided views, with an elementwise
    /// epilogue (`ir::gemm`): made by the GEMM pass from a MatMul and the layout ops and
    /// elementwise ops around it. Operands: A, B, then the epilogue's.
    Gemm(Box<Gemm>),
    /// A chain of elementwise ops evaluated in one pass over the result, operands broadcast.
    FusedElementwise(Expr),

    // State.
    /// Operands (state, values, start): the state with `values` written at
    /// `start..start + len` along `axis` (start: i32, one element). Functional here and in the
    /// interpreter; in codegen the result's buffer is the state's, written in place. The state
    /// operand must be an [`Op::State`] read by nothing else (checked by `Graph::validate`).
    CacheWrite {
        axis: i64,
    },

    // Index reductions.
    /// Index (i32) of the largest element along `axis`, the axis removed; ties go to the first
    /// index, and a NaN counts as larger than every number (the first NaN wins), as torch.argmax.
    ArgMax {
        axis: i64,
    },
}

/// How many operands an op takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arity {
    Exact(usize),
    AtLeast(usize),
    /// From the first to the second, both included (optional trailing operands).
    Between(usize, usize),
}

impl Arity {
    pub fn accepts(self, n: usize) -> bool {
        match self {
            Arity::Exact(k) => n == k,
            Arity::AtLeast(k) => n >= k,
            Arity::Between(lo, hi) => lo <= n && n <= hi,
        }
    }
}

impl fmt::Display for Arity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Arity::Exact(k) => write!(f, "{k}"),
            Arity::AtLeast(k) => write!(f, "at least {k}"),
            Arity::Between(lo, hi) => write!(f, "{lo} to {hi}"),
        }
    }
}

/// Why an op could not be parsed from its name and attributes.
#[derive(Debug, Clone, PartialEq)]
pub enum OpParseError {
    UnknownOp,
    Attribute(String),
}

/// Names of the ops that are not a Binary/Unary/Reduce family member.
const STRUCTURAL_OPS: [&str; 22] = [
    "input",
    "weight",
    "state",
    "constant",
    "causal_mask",
    "reshape",
    "permute",
    "expand",
    "concat",
    "slice",
    "gather",
    "where",
    "cast",
    "softmax",
    "layer_norm",
    "rms_norm",
    "rope",
    "matmul",
    "flash_attention",
    "fused_elementwise",
    "cache_write",
    "argmax",
];

impl Op {
    /// Every op name the file format accepts.
    pub fn all_names() -> Vec<&'static str> {
        let mut names: Vec<&'static str> = STRUCTURAL_OPS.to_vec();
        names.extend(BinaryOp::ALL.iter().map(|o| o.name()));
        names.extend(UnaryOp::ALL.iter().map(|o| o.name()));
        names.extend(ReduceOp::ALL.iter().map(|o| o.name()));
        names
    }

    pub fn name(&self) -> &'static str {
        match self {
            Op::Input { .. } => "input",
            Op::Weight { .. } => "weight",
            Op::State { .. } => "state",
            Op::Constant { .. } => "constant",
            Op::CausalMask { .. } => "causal_mask",
            Op::Reshape { .. } => "reshape",
            Op::Permute { .. } => "permute",
            Op::Expand { .. } => "expand",
            Op::Concat { .. } => "concat",
            Op::Slice { .. } => "slice",
            Op::Gather => "gather",
            Op::Binary(b) => b.name(),
            Op::Where => "where",
            Op::Unary(u) => u.name(),
            Op::Cast { .. } => "cast",
            Op::Reduce { op, .. } => op.name(),
            Op::Softmax { .. } => "softmax",
            Op::LayerNorm { .. } => "layer_norm",
            Op::RmsNorm { .. } => "rms_norm",
            Op::Rope { .. } => "rope",
            Op::MatMul => "matmul",
            Op::FlashAttention(_) => "flash_attention",
            Op::Gemm(_) => "gemm",
            Op::FusedElementwise(_) => "fused_elementwise",
            Op::CacheWrite { .. } => "cache_write",
            Op::ArgMax { .. } => "argmax",
        }
    }

    pub fn arity(&self) -> Arity {
        match self {
            Op::Input { .. }
            | Op::Weight { .. }
            | Op::State { .. }
            | Op::Constant { .. }
            | Op::CausalMask { .. } => Arity::Exact(0),
            Op::Reshape { .. }
            | Op::Permute { .. }
            | Op::Expand { .. }
            | Op::Slice { .. }
            | Op::Unary(_)
            | Op::Cast { .. }
            | Op::Reduce { .. }
            | Op::Softmax { .. }
            | Op::ArgMax { .. } => Arity::Exact(1),
            Op::Rope { .. } => Arity::Between(1, 2),
            Op::Concat { .. } | Op::FusedElementwise(_) => Arity::AtLeast(1),
            Op::Gemm(_) => Arity::AtLeast(2),
            Op::Gather | Op::Binary(_) | Op::RmsNorm { .. } | Op::MatMul => Arity::Exact(2),
            Op::Where | Op::LayerNorm { .. } | Op::CacheWrite { .. } => Arity::Exact(3),
            Op::FlashAttention(a) => {
                let mask = match a.mask {
                    MaskKind::None => 0,
                    MaskKind::Additive | MaskKind::Boolean => 1,
                };
                Arity::Exact(3 + mask + usize::from(a.kv_len))
            }
        }
    }

    /// Sources have no operands and produce data from attributes or bindings.
    pub fn is_source(&self) -> bool {
        matches!(self.arity(), Arity::Exact(0))
    }

    /// Ops made by fusion passes (drawn highlighted in pictures).
    pub fn is_fused(&self) -> bool {
        matches!(
            self,
            Op::FlashAttention(_) | Op::FusedElementwise(_) | Op::Gemm(_)
        )
    }

    /// The op's attributes in a fixed order, as written to files and dumps. Attributes equal to
    /// their default are left out.
    pub fn attrs(&self) -> Vec<(&'static str, Value)> {
        let mut a: Vec<(&'static str, Value)> = Vec::new();
        match self {
            Op::Input {
                dtype,
                shape,
                sample,
            } => {
                a.push(("dtype", json(dtype)));
                a.push(("shape", json(&shape.0)));
                if *sample != Sample::Normal {
                    a.push(("sample", json(sample)));
                }
            }
            Op::State { dtype, shape } => {
                a.push(("dtype", json(dtype)));
                a.push(("shape", json(&shape.0)));
            }
            Op::Weight {
                dtype,
                shape,
                init,
                quant,
            } => {
                a.push(("dtype", json(dtype)));
                a.push(("shape", json(&shape.0)));
                if *init != Init::Normal {
                    a.push(("init", json(init)));
                }
                if let Some(q) = quant {
                    a.push(("quant", json(q)));
                }
            }
            Op::Constant {
                dtype,
                shape,
                values,
            } => {
                a.push(("dtype", json(dtype)));
                if shape.rank() > 0 {
                    a.push(("shape", json(&shape.0)));
                }
                let vals: Vec<Value> = values.iter().map(|v| number_value(*v)).collect();
                if vals.len() == 1 {
                    a.push(("value", vals[0].clone()));
                } else {
                    a.push(("value", Value::Array(vals)));
                }
            }
            Op::CausalMask { sq, sk, offset } => {
                a.push(("sq", json(sq)));
                a.push(("sk", json(sk)));
                if *offset != 0 {
                    a.push(("offset", json(offset)));
                }
            }
            Op::Reshape { shape } => a.push(("shape", json(shape))),
            Op::Permute { perm } => a.push(("perm", json(perm))),
            Op::Expand { shape } => a.push(("shape", json(shape))),
            Op::Concat { axis } | Op::CacheWrite { axis } | Op::ArgMax { axis } => {
                a.push(("axis", json(axis)))
            }
            Op::Slice { axis, start, end } => {
                a.push(("axis", json(axis)));
                a.push(("start", json(start)));
                a.push(("end", json(end)));
            }
            Op::Gather | Op::Binary(_) | Op::Where | Op::Unary(_) | Op::MatMul => {}
            Op::Cast { to } => a.push(("to", json(to))),
            Op::Reduce { axes, keepdim, .. } => {
                a.push(("axes", json(axes)));
                if *keepdim {
                    a.push(("keepdim", json(keepdim)));
                }
            }
            Op::Softmax { axis } => a.push(("axis", json(axis))),
            Op::LayerNorm { eps } | Op::RmsNorm { eps } => a.push(("eps", json(eps))),
            Op::Rope { theta, offset } => {
                a.push(("theta", json(theta)));
                if *offset != 0 {
                    a.push(("offset", json(offset)));
                }
            }
            Op::FlashAttention(att) => {
                a.push(("scale", json(&att.scale)));
                if att.causal {
                    a.push(("causal", json(&att.causal)));
                }
                if att.causal_offset != 0 {
                    a.push(("causal_offset", json(&att.causal_offset)));
                }
                if att.mask != MaskKind::None {
                    a.push(("mask", json(&att.mask)));
                }
                if att.kv_len {
                    a.push(("kv_len", json(&att.kv_len)));
                }
            }
            Op::FusedElementwise(expr) => a.push(("expr", expr.to_json())),
            Op::Gemm(g) => {
                a.push(("dims", json(&g.dims)));
                a.push(("a", json(&g.a)));
                a.push(("b", json(&g.b)));
                a.push(("out", json(&g.out)));
                if !g.extras.is_empty() {
                    a.push(("extras", json(&g.extras)));
                }
                if let Some(e) = &g.epilogue {
                    a.push(("epilogue", e.to_json()));
                }
                a.push(("shape", json(&g.shape.0)));
            }
        }
        a
    }

    /// Builds an op from its name and attributes (the inverse of [`Op::name`] + [`Op::attrs`]).
    /// Unknown attribute names are refused, so a misspelt attribute is never silently ignored.
    pub fn parse(name: &str, attrs: &Map<String, Value>) -> Result<Op, OpParseError> {
        let mut a = AttrReader::new(attrs);
        let op = match name {
            "input" => Op::Input {
                dtype: a.req("dtype")?,
                shape: Shape(a.req("shape")?),
                sample: a.opt("sample")?.unwrap_or_default(),
            },
            "state" => Op::State {
                dtype: a.req("dtype")?,
                shape: Shape(a.req("shape")?),
            },
            "weight" => Op::Weight {
                dtype: a.req("dtype")?,
                shape: Shape(a.req("shape")?),
                init: a.opt("init")?.unwrap_or_default(),
                quant: a.opt("quant")?,
            },
            "constant" => Op::Constant {
                dtype: a.opt("dtype")?.unwrap_or(DType::F32),
                shape: Shape(a.opt("shape")?.unwrap_or_default()),
                values: a.values("value")?,
            },
            "causal_mask" => Op::CausalMask {
                sq: a.req("sq")?,
                sk: a.req("sk")?,
                offset: a.opt("offset")?.unwrap_or(0),
            },
            "reshape" => Op::Reshape {
                shape: a.req("shape")?,
            },
            "permute" => Op::Permute {
                perm: a.req("perm")?,
            },
            "expand" => Op::Expand {
                shape: a.req("shape")?,
            },
            "concat" => Op::Concat {
                axis: a.req("axis")?,
            },
            "slice" => Op::Slice {
                axis: a.req("axis")?,
                start: a.req("start")?,
                end: a.req("end")?,
            },
            "gather" => Op::Gather,
            "where" => Op::Where,
            "cast" => Op::Cast { to: a.req("to")? },
            "softmax" => Op::Softmax {
                axis: a.req("axis")?,
            },
            "layer_norm" => Op::LayerNorm {
                eps: a.opt("eps")?.unwrap_or(1e-5),
            },
            "rms_norm" => Op::RmsNorm {
                eps: a.opt("eps")?.unwrap_or(1e-6),
            },
            "rope" => Op::Rope {
                theta: a.opt("theta")?.unwrap_or(10000.0),
                offset: a.opt("offset")?.unwrap_or(0),
            },
            "matmul" => Op::MatMul,
            "fused_elementwise" => Op::FusedElementwise(a.expr("expr")?),
            "gemm" => Op::Gemm(Box::new(Gemm {
                dims: a.req("dims")?,
                a: a.req("a")?,
                b: a.req("b")?,
                out: a.req("out")?,
                extras: a.opt("extras")?.unwrap_or_default(),
                epilogue: a.opt_expr("epilogue")?,
                shape: Shape(a.req("shape")?),
            })),
            "flash_attention" => Op::FlashAttention(Attention {
                scale: a.req("scale")?,
                causal: a.opt("causal")?.unwrap_or(false),
                causal_offset: a.opt("causal_offset")?.unwrap_or(0),
                mask: a.opt("mask")?.unwrap_or_default(),
                kv_len: a.opt("kv_len")?.unwrap_or(false),
            }),
            "cache_write" => Op::CacheWrite {
                axis: a.req("axis")?,
            },
            "argmax" => Op::ArgMax {
                axis: a.req("axis")?,
            },
            other => {
                if let Some(b) = BinaryOp::ALL.iter().find(|b| b.name() == other) {
                    Op::Binary(*b)
                } else if let Some(u) = UnaryOp::ALL.iter().find(|u| u.name() == other) {
                    Op::Unary(*u)
                } else if let Some(r) = ReduceOp::ALL.iter().find(|r| r.name() == other) {
                    Op::Reduce {
                        op: *r,
                        axes: a.req("axes")?,
                        keepdim: a.opt("keepdim")?.unwrap_or(false),
                    }
                } else {
                    return Err(OpParseError::UnknownOp);
                }
            }
        };
        a.finish()?;
        Ok(op)
    }

    /// `name[attr=value, ...]`, the op as the text printer shows it.
    pub fn display(&self) -> String {
        // A source's dtype and shape are its type, which every dump prints beside it.
        let mut attrs = self.attrs();
        if self.is_source() {
            attrs.retain(|(k, _)| *k != "dtype" && *k != "shape");
        }
        if attrs.is_empty() {
            return self.name().to_string();
        }
        let body: Vec<String> = attrs
            .iter()
            .map(|(k, v)| match (self, *k) {
                (Op::FusedElementwise(e), "expr") => format!("{e}"),
                (Op::Gemm(g), "epilogue") => match &g.epilogue {
                    Some(e) => format!("epilogue={e}"),
                    None => String::new(),
                },
                (Op::Gemm(g), view @ ("a" | "b" | "out")) => {
                    let v = match view {
                        "a" => &g.a,
                        "b" => &g.b,
                        _ => &g.out,
                    };
                    format!("{view}={}", view_text(v))
                }
                (Op::Gemm(g), "extras") => format!(
                    "extras=[{}]",
                    g.extras
                        .iter()
                        .map(view_text)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                (Op::Gemm(g), "dims") if g.dims.batch.is_empty() => {
                    format!("m={:?}, n={:?}, k={:?}", g.dims.m, g.dims.n, g.dims.k)
                }
                (Op::Gemm(g), "dims") => format!(
                    "batch={:?}, m={:?}, n={:?}, k={:?}",
                    g.dims.batch, g.dims.m, g.dims.n, g.dims.k
                ),
                _ => format!("{k}={}", compact_value(v)),
            })
            .collect();
        format!("{}[{}]", self.name(), body.join(", "))
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display())
    }
}

fn json<T: Serialize + ?Sized>(v: &T) -> Value {
    serde_json::to_value(v).expect("attribute types serialise to JSON")
}

/// JSON has no infinities or NaN: those are written as strings.
fn number_value(v: f64) -> Value {
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
pub(super) fn parse_number(v: &Value) -> Result<f64, String> {
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

/// A Gemm view as dumps show it: strides per sub-axis, `batch|rows|cols`.
fn view_text(v: &View) -> String {
    let list = |s: &[usize]| {
        s.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    if v.batch.is_empty() {
        format!("({}|{})", list(&v.rows), list(&v.cols))
    } else {
        format!("({}|{}|{})", list(&v.batch), list(&v.rows), list(&v.cols))
    }
}

/// Short rendering of an attribute value for dumps; long constant lists are elided.
fn compact_value(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(items) if items.len() > 8 => {
            let head: Vec<String> = items[..4].iter().map(compact_value).collect();
            format!("[{}, … {} values]", head.join(", "), items.len())
        }
        Value::Array(items) => {
            let parts: Vec<String> = items.iter().map(compact_value).collect();
            format!("[{}]", parts.join(", "))
        }
        other => other.to_string(),
    }
}

/// Reads attributes by name, remembering which were used so unknown ones can be refused.
struct AttrReader<'a> {
    map: &'a Map<String, Value>,
    used: BTreeSet<&'static str>,
}

impl<'a> AttrReader<'a> {
    fn new(map: &'a Map<String, Value>) -> Self {
        AttrReader {
            map,
            used: BTreeSet::new(),
        }
    }

    fn opt<T: DeserializeOwned>(&mut self, key: &'static str) -> Result<Option<T>, OpParseError> {
        self.used.insert(key);
        match self.map.get(key) {
            None => Ok(None),
            Some(v) => serde_json::from_value(v.clone())
                .map(Some)
                .map_err(|e| OpParseError::Attribute(format!("attribute `{key}`: {e}"))),
        }
    }

    fn req<T: DeserializeOwned>(&mut self, key: &'static str) -> Result<T, OpParseError> {
        self.opt(key)?
            .ok_or_else(|| OpParseError::Attribute(format!("missing attribute `{key}`")))
    }

    fn values(&mut self, key: &'static str) -> Result<Vec<f64>, OpParseError> {
        self.used.insert(key);
        let bad = |why: String| {
            OpParseError::Attribute(format!(
                "attribute `{key}` must be a number, \"inf\", \"-inf\", \"nan\" or a flat list \
                 of them: {why}"
            ))
        };
        match self.map.get(key) {
            None => Err(OpParseError::Attribute(format!(
                "missing attribute `{key}`"
            ))),
            Some(Value::Array(items)) => {
                items.iter().map(|v| parse_number(v).map_err(bad)).collect()
            }
            Some(v) => Ok(vec![parse_number(v).map_err(bad)?]),
        }
    }

    fn opt_expr(&mut self, key: &'static str) -> Result<Option<Expr>, OpParseError> {
        match self.map.get(key) {
            None => {
                self.used.insert(key);
                Ok(None)
            }
            Some(_) => self.expr(key).map(Some),
        }
    }

    fn expr(&mut self, key: &'static str) -> Result<Expr, OpParseError> {
        self.used.insert(key);
        let v = self
            .map
            .get(key)
            .ok_or_else(|| OpParseError::Attribute(format!("missing attribute `{key}`")))?;
        Expr::from_json(v).map_err(|e| OpParseError::Attribute(format!("attribute `{key}`: {e}")))
    }

    fn finish(self) -> Result<(), OpParseError> {
        let unknown: Vec<&str> = self
            .map
            .keys()
            .map(String::as_str)
            .filter(|k| !self.used.contains(k))
            .collect();
        if unknown.is_empty() {
            Ok(())
        } else {
            Err(OpParseError::Attribute(format!(
                "unknown attribute(s): {}",
                unknown.join(", ")
            )))
        }
    }
}
