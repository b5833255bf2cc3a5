//! The value types that ops carry as attributes (elementwise and reduction op kinds, sampling
//! and init rules, attention attributes). They sit below `op`, `expr`, `scalar` and `random`,
//! which all name them, and import only `dtype`, so none of those files imports another through
//! them (no circle in `ir`).

use serde::{Deserialize, Serialize};

use super::dtype::DType;

/// Declares an op family: the enum, `ALL` (every variant, in declaration order), `NAMES` (their
/// names in files, in the same order) and `name`. One list makes all four, so a variant added to
/// the family cannot be missing from `ALL` or from the op names (`OpKind`).
macro_rules! op_family {
    ($(#[$meta:meta])* $family:ident { $($(#[$vmeta:meta])* $variant:ident => $name:literal,)* }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $family {
            $($(#[$vmeta])* $variant,)*
        }

        impl $family {
            pub const ALL: [$family; [$($name,)*].len()] = [$($family::$variant,)*];
            pub const NAMES: [&'static str; [$($name,)*].len()] = [$($name,)*];

            pub fn name(self) -> &'static str {
                match self {
                    $($family::$variant => $name,)*
                }
            }

            /// The member called `name` in files, if any.
            pub fn from_name(name: &str) -> Option<$family> {
                match name {
                    $($name => Some($family::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

op_family! {
    /// Binary elementwise ops, with numpy broadcasting.
    BinaryOp {
        Add => "add",
        Sub => "sub",
        Mul => "mul",
        Div => "div",
        Pow => "pow",
        Maximum => "maximum",
        Minimum => "minimum",
        Equal => "equal",
        Less => "less",
        Greater => "greater",
    }
}

impl BinaryOp {
    /// Comparisons produce bool.
    pub fn is_comparison(self) -> bool {
        matches!(self, BinaryOp::Equal | BinaryOp::Less | BinaryOp::Greater)
    }

    /// Ops only defined on floating-point operands.
    pub fn float_only(self) -> bool {
        matches!(self, BinaryOp::Div | BinaryOp::Pow)
    }
}

op_family! {
    /// Unary elementwise ops.
    UnaryOp {
        Neg => "neg",
        Abs => "abs",
        Exp => "exp",
        Log => "log",
        Sqrt => "sqrt",
        Rsqrt => "rsqrt",
        Recip => "recip",
        Tanh => "tanh",
        Erf => "erf",
        Sigmoid => "sigmoid",
        Silu => "silu",
        /// `0.5·x·(1 + erf(x/√2))`
        Gelu => "gelu",
        /// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`
        GeluTanh => "gelu_tanh",
        /// `ln(1 + eˣ)`, computed as `max(x, 0) + ln(1 + e^(−|x|))` so it never overflows
        Softplus => "softplus",
    }
}

impl UnaryOp {
    /// Ops that are also defined on integers.
    pub fn accepts_int(self) -> bool {
        matches!(self, UnaryOp::Neg | UnaryOp::Abs)
    }
}

op_family! {
    /// Reductions over a list of axes.
    ReduceOp {
        Sum => "reduce_sum",
        Max => "reduce_max",
        Mean => "reduce_mean",
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
    /// A sliding window (needs `causal`): key `k` is visible from query `q` only when also
    /// `q + offset − window < k`, so a query sees itself and the `window − 1` keys before it
    /// (`offset` the causal offset, or `kv_len − Sq` with kv_len). This is transformers'
    /// Mistral mask (`sliding_window_overlay`: `q_idx − kv_idx < sliding_window`) and
    /// llama.cpp's (`is_masked_swa`: masked when `p1 − p0 ≥ n_swa`). The kernels never read
    /// K/V tiles wholly before the window's start. See [`Attention::check_window`].
    pub window: Option<u32>,
    pub mask: MaskKind,
    /// A last operand `kv_len` (i32, one element or one per batch) gives the number of valid
    /// keys: keys at index ≥ kv_len are invisible (never read by the kernels), and a causal
    /// mask is offset by kv_len − Sq (the queries are the last Sq of the kv_len positions).
    pub kv_len: bool,
    /// The decode form that also appends this step's K/V rows (`passes/decode_append.rs`):
    /// see [`Append`]. Needs `kv_len`.
    pub append: Option<Append>,
}

impl Attention {
    /// Operands before the append operands: q, k, v, the mask if any, kv_len if any.
    pub fn base_operands(&self) -> usize {
        let mask = match self.mask {
            MaskKind::None => 0,
            MaskKind::Additive | MaskKind::Boolean => 1,
        };
        3 + mask + usize::from(self.kv_len)
    }

    /// Where the kv_len operand is, when there is one.
    pub fn kv_len_slot(&self) -> Option<usize> {
        self.kv_len.then(|| self.base_operands() - 1)
    }

    /// The window attribute's rules: see [`check_window`].
    pub fn check_window(&self) -> Result<(), WindowError> {
        check_window(self.window, self.causal)
    }
}

/// Why a sliding-window attribute is invalid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    /// A window of 0 keys would hide every key, the query's own included: no model means that,
    /// and a row with no visible key is the safe softmax's zeros, not an attention.
    #[error("a sliding window must hold at least one key (the query's own), got 0")]
    Zero,
    /// The window's lower bound is defined from the causal diagonal (`q + offset − window`);
    /// without the causal upper bound it would show every later key, which is no model's mask
    /// (Mistral's, Gemma's and Qwen's windows are all causal), and the kernels' key range
    /// `[window start, causal end)` needs both ends.
    #[error("a sliding window needs a causal attention")]
    NotCausal,
}

/// The rules of a sliding window (FlashAttention's and PagedAttention's, which is always
/// causal): at least one key, and causal.
pub fn check_window(window: Option<u32>, causal: bool) -> Result<(), WindowError> {
    match window {
        None => Ok(()),
        Some(0) => Err(WindowError::Zero),
        Some(_) if !causal => Err(WindowError::NotCausal),
        Some(_) => Ok(()),
    }
}

/// Whether key `k` is visible from query `q` with causal offset `offset` and sliding window
/// `window`: `q + offset − window < k ≤ q + offset` (no lower bound without a window). Exact in
/// i128 for every offset, so no value wraps or panics. The one definition the interpreter and
/// the kernels' host-side tests share.
pub fn window_visible(q: usize, k: usize, offset: i64, window: Option<u32>) -> bool {
    // usize positions fit i128; so does their sum with any i64 and any u32.
    let (q, k) = (q as i128, k as i128);
    let end = q + i128::from(offset);
    k <= end && window.is_none_or(|w| k > end - i128::from(w))
}

/// The append form of a FlashAttention: after its base operands come `positions` (i32 `[Sq]`),
/// `k_new` `[B, Hkv, Sq, D]` (before rope), `v_new` `[B, Hkv, Sq, Dv]` and `start` (i32, one
/// element), and k and v are the caches as this step's cache writes leave them (rows
/// `start..start + Sq` hold `rope(k_new)` and `v_new`). Its value is attention of
/// `rope(q, positions)` over those caches: the queries are rotated here (pairs `i, i + D/2`
/// at `theta^(−2i/D)/factors[i]`, as [`crate::ir::Op::Rope`]), so a kernel can rotate q on load
/// and take the step's rows from `k_new`/`v_new` (k rotated with the same parameters) instead
/// of from the caches. `Op::PagedAttention` takes the same attributes for its paged form
/// (operands positions, k_new, v_new, slots; see there).
#[derive(Clone, Debug, PartialEq)]
pub struct Append {
    pub theta: f64,
    /// One divisor per pair, or empty (none).
    pub factors: Vec<f64>,
}

impl Append {
    /// Operands after the base ones: positions, k_new, v_new, start (slots in the paged form).
    pub const OPERANDS: usize = 4;
    /// The most query rows per K/V head (heads per group × Sq) the append form is made for:
    /// the decode kernel's bound (`codegen::kernels::attention::decode::MAX_ROWS`, a test
    /// there holds them equal); more is prefill, which the other kernels serve.
    pub const MAX_ROWS: usize = 16;

    /// Whether a rope of `theta` and `factors` rotates as this form does (attributes compared
    /// bit for bit, never as wildcards).
    pub fn rotates_like(&self, theta: f64, factors: &[f64]) -> bool {
        self.theta.to_bits() == theta.to_bits()
            && self.factors.len() == factors.len()
            && self
                .factors
                .iter()
                .zip(factors)
                .all(|(x, y)| x.to_bits() == y.to_bits())
    }
}
