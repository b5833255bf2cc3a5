//! The operations of the graph. Each op is defined here once: its kind and name in files and
//! dumps, its arity, and its attributes (written and parsed by one table in `attrs.rs`). Its shape rule is in
//! `infer.rs`, its interpreter semantics in `crate::interp`, and its kernel in `crate::codegen`;
//! all of those match over `Op` exhaustively, so a new op that misses a face does not compile.

use std::fmt;

use super::dtype::DType;
use super::expr::Expr;
use super::gemm::Gemm;
use super::quant::QuantScheme;
use super::shape::Shape;
// The attribute value types live in `values.rs` (below `expr`, `scalar` and `random`, which
// name them too); they are re-exported here, where the ops that carry them are.
pub use super::values::{Append, Attention, BinaryOp, Init, MaskKind, ReduceOp, Sample, UnaryOp};

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
    /// `factors`, when not empty, holds one divisor per pair (`D/2` of them): pair `i` rotates at
    /// `theta^(−2i/D)/factors[i]` (Llama 3's rope scaling, which GGUF files store as
    /// `rope_freqs.weight`).
    Rope {
        theta: f64,
        offset: i64,
        factors: Vec<f64>,
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
    /// With `rope` (theta), a fourth operand holds positions (i32 `[S]`) and the values are
    /// rotated first, exactly as [`Op::Rope`] at those positions would rotate them (`[.., S, D]`,
    /// pairs `i, i + D/2`), then written: the rope pass folds a rope that only a cache write reads
    /// into it (`passes/rope_fold.rs`), so its kernel rotates pairs as it writes.
    CacheWrite {
        axis: i64,
        rope: Option<f64>,
    },
    /// Operands (pool, values, slots): a paged K or V cache, pool `[num_blocks, Hkv, block_size,
    /// D]` (an [`Op::State`] read by nothing else, as a cache write's), with the new rows
    /// `values` `[B, Hkv, s, D]` written where `slots` (i32 `[B, s]`) says: slot
    /// `block·block_size + offset` is row `offset` of block `block`, for every head. A negative
    /// slot is padding and is not written; a slot past the pool is a run-time error in the
    /// interpreter (the kernels skip it: they cannot report). Two new rows that name the same
    /// slot leave the later one (in `(b, s)` order). The block size is the pool's axis 2.
    PagedCacheWrite,
    /// Decode attention through block tables: q `[B, Hq, s, D]`, k pool `[num_blocks, Hkv,
    /// block_size, D]`, v pool `[num_blocks, Hkv, block_size, Dv]`, block table i32
    /// `[B, max_blocks]`, kv_len i32 `[B]` → `[B, Hq, s, Dv]`. Sequence b's key j (j < kv_len[b])
    /// is row `j % block_size` of block `table[b][j / block_size]`; its queries are the last s
    /// of its kv_len positions (query i sees keys `j ≤ kv_len[b] − s + i`; one that sees none
    /// gives zeros, as the safe softmax). GQA: query head h reads K/V head `h / (Hq/Hkv)`.
    /// A kv_len outside `0..=max_blocks·block_size`, or a block id outside the pool among the
    /// blocks it reads, is a run-time error in the interpreter; the kernels clamp kv_len and
    /// skip such blocks. With a sliding `window` (as [`crate::ir::Attention::window`], at least
    /// 1), query i also sees only keys `j > kv_len[b] − s + i − window`; the kernels never read
    /// the blocks wholly before it.
    ///
    /// With `append` ([`Append`]: theta and per-pair factors; `passes/paged_append.rs`), the
    /// decode form that also appends this step's rows: q is this step's rows before rope in the
    /// order the writes take them, `[1, Hq, B·s, D]` (sequence-major, as `k_new`), and four
    /// operands follow kv_len: positions (i32 `[B·s]`), `k_new` `[1, Hkv, B·s, D]` (before
    /// rope), `v_new` `[1, Hkv, B·s, Dv]` and the writes' `slots` (i32 `[1, B·s]`); k and v are
    /// the pools as this step's paged cache writes of `rope(k_new)` and `v_new` at `slots` leave
    /// them. Its value is the attention above of `rope(q, positions)` seen as `[B, Hq, s, D]`.
    PagedAttention {
        scale: f64,
        window: Option<u32>,
        append: Option<Append>,
    },

    // Index reductions.
    /// Index (i32) of the largest element along `axis`, the axis removed; ties go to the first
    /// index, and a NaN counts as larger than every number (the first NaN wins), as torch.argmax.
    ArgMax {
        axis: i64,
    },
}

/// The inverse frequency of each rotated pair of [`Op::Rope`] over rows of `d`:
/// `theta^(−2i/d)/factors[i]` (no divisor past the end of `factors`). One definition, so the
/// interpreter and the kernels' host-computed tables (`codegen`, in f64) hold the same values.
pub fn rope_inv_freq(theta: f64, d: usize, factors: &[f64]) -> Vec<f64> {
    (0..d / 2)
        .map(|i| theta.powf(-2.0 * i as f64 / d as f64) / factors.get(i).copied().unwrap_or(1.0))
        .collect()
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

/// Declares [`OpKind`], one kind per variant of [`Op`], with the names the file format accepts
/// for it. One list makes the enum, `ALL` and `names`; [`Op::kind`] matches over `Op` without a
/// wildcard, so an op added to `Op` does not compile until it has a kind here, and then its name
/// is in every list made from this one (the unknown-op error, the fuzzer's vocabulary).
macro_rules! op_kinds {
    ($($kind:ident => $names:expr,)*) => {
        /// Which variant of [`Op`] an op is, without its attributes.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum OpKind {
            $($kind,)*
        }

        impl OpKind {
            pub const ALL: [OpKind; [$(OpKind::$kind,)*].len()] = [$(OpKind::$kind,)*];

            /// The names of this kind in files: one, or one per member of a family.
            pub fn names(self) -> &'static [&'static str] {
                match self {
                    $(OpKind::$kind => &$names,)*
                }
            }
        }
    };
}

op_kinds! {
    Input => ["input"],
    Weight => ["weight"],
    Constant => ["constant"],
    State => ["state"],
    CausalMask => ["causal_mask"],
    Reshape => ["reshape"],
    Permute => ["permute"],
    Expand => ["expand"],
    Concat => ["concat"],
    Slice => ["slice"],
    Gather => ["gather"],
    Binary => BinaryOp::NAMES,
    Where => ["where"],
    Unary => UnaryOp::NAMES,
    Cast => ["cast"],
    Reduce => ReduceOp::NAMES,
    Softmax => ["softmax"],
    LayerNorm => ["layer_norm"],
    RmsNorm => ["rms_norm"],
    Rope => ["rope"],
    MatMul => ["matmul"],
    FlashAttention => ["flash_attention"],
    Gemm => ["gemm"],
    FusedElementwise => ["fused_elementwise"],
    CacheWrite => ["cache_write"],
    PagedCacheWrite => ["paged_cache_write"],
    PagedAttention => ["paged_attention"],
    ArgMax => ["argmax"],
}

impl OpKind {
    /// The kind a file's op name stands for, if any.
    pub fn from_name(name: &str) -> Option<OpKind> {
        OpKind::ALL.into_iter().find(|k| k.names().contains(&name))
    }
}

impl Op {
    /// Every op name the file format accepts, kind by kind (the parser accepts exactly these).
    pub fn all_names() -> Vec<&'static str> {
        OpKind::ALL
            .iter()
            .flat_map(|k| k.names().iter().copied())
            .collect()
    }

    pub fn kind(&self) -> OpKind {
        match self {
            Op::Input { .. } => OpKind::Input,
            Op::Weight { .. } => OpKind::Weight,
            Op::Constant { .. } => OpKind::Constant,
            Op::State { .. } => OpKind::State,
            Op::CausalMask { .. } => OpKind::CausalMask,
            Op::Reshape { .. } => OpKind::Reshape,
            Op::Permute { .. } => OpKind::Permute,
            Op::Expand { .. } => OpKind::Expand,
            Op::Concat { .. } => OpKind::Concat,
            Op::Slice { .. } => OpKind::Slice,
            Op::Gather => OpKind::Gather,
            Op::Binary(_) => OpKind::Binary,
            Op::Where => OpKind::Where,
            Op::Unary(_) => OpKind::Unary,
            Op::Cast { .. } => OpKind::Cast,
            Op::Reduce { .. } => OpKind::Reduce,
            Op::Softmax { .. } => OpKind::Softmax,
            Op::LayerNorm { .. } => OpKind::LayerNorm,
            Op::RmsNorm { .. } => OpKind::RmsNorm,
            Op::Rope { .. } => OpKind::Rope,
            Op::MatMul => OpKind::MatMul,
            Op::FlashAttention(_) => OpKind::FlashAttention,
            Op::Gemm(_) => OpKind::Gemm,
            Op::FusedElementwise(_) => OpKind::FusedElementwise,
            Op::CacheWrite { .. } => OpKind::CacheWrite,
            Op::PagedCacheWrite => OpKind::PagedCacheWrite,
            Op::PagedAttention { .. } => OpKind::PagedAttention,
            Op::ArgMax { .. } => OpKind::ArgMax,
        }
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
            Op::PagedCacheWrite => "paged_cache_write",
            Op::PagedAttention { .. } => "paged_attention",
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
            Op::Where | Op::LayerNorm { .. } | Op::PagedCacheWrite => Arity::Exact(3),
            Op::PagedAttention { append, .. } => Arity::Exact(
                5 + if append.is_some() {
                    Append::OPERANDS
                } else {
                    0
                },
            ),
            Op::CacheWrite { rope, .. } => Arity::Exact(3 + usize::from(rope.is_some())),
            Op::FlashAttention(a) => Arity::Exact(
                a.base_operands()
                    + if a.append.is_some() {
                        Append::OPERANDS
                    } else {
                        0
                    },
            ),
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
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display())
    }
}
