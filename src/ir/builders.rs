//! The builder sugar over [`Graph::add_op`]: one method per op (and per elementwise op), as
//! models and tests write graphs. Each adds one node and returns its id; shape inference runs in
//! `add_op`, so these hold no rule of their own.

use super::dtype::DType;
use super::error::GraphError;
use super::gemm::Gemm;
use super::graph::{Graph, NodeId};
use super::op::Op;
use super::quant::QuantScheme;
use super::shape::Shape;
use super::values::{Attention, BinaryOp, Init, MaskKind, ReduceOp, Sample, UnaryOp};

impl Graph {
    pub fn input(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[usize],
    ) -> Result<NodeId, GraphError> {
        let op = Op::Input {
            dtype,
            shape: Shape::new(shape.to_vec()),
            sample: Sample::Normal,
        };
        self.add_node(Some(name), op, &[])
    }

    pub fn input_sampled(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[usize],
        sample: Sample,
    ) -> Result<NodeId, GraphError> {
        let op = Op::Input {
            dtype,
            shape: Shape::new(shape.to_vec()),
            sample,
        };
        self.add_node(Some(name), op, &[])
    }

    pub fn weight(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[usize],
    ) -> Result<NodeId, GraphError> {
        self.weight_init(name, dtype, shape, Init::Normal)
    }

    pub fn weight_init(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[usize],
        init: Init,
    ) -> Result<NodeId, GraphError> {
        let op = Op::Weight {
            dtype,
            shape: Shape::new(shape.to_vec()),
            init,
            quant: None,
        };
        self.add_node(Some(name), op, &[])
    }

    /// A weight stored as blocks of `scheme` whose value is `[rows.., K]` of `dtype`: the
    /// matrix of a GGUF tensor `ne0 = K, ne1 = N` is `[N, K]`, read as `x · Wᵀ`.
    pub fn weight_quant(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[usize],
        scheme: QuantScheme,
    ) -> Result<NodeId, GraphError> {
        let op = Op::Weight {
            dtype,
            shape: Shape::new(shape.to_vec()),
            init: Init::Normal,
            quant: Some(scheme),
        };
        self.add_node(Some(name), op, &[])
    }

    /// A persistent state named `name` (a KV cache), kept by a session across runs.
    pub fn state(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[usize],
    ) -> Result<NodeId, GraphError> {
        let op = Op::State {
            dtype,
            shape: Shape::new(shape.to_vec()),
        };
        self.add_node(Some(name), op, &[])
    }

    /// `state` with `values` written at `start` (one i32) along `axis`; the state's next value.
    pub fn cache_write(
        &mut self,
        state: NodeId,
        values: NodeId,
        start: NodeId,
        axis: i64,
    ) -> Result<NodeId, GraphError> {
        self.add_op(Op::CacheWrite { axis, rope: None }, &[state, values, start])
    }

    /// [`Graph::cache_write`] of `values` rotated as [`Graph::rope_at`] would rotate them (at
    /// `positions`, i32 `[S]`, with `theta`): one op, so one kernel, for both.
    pub fn cache_write_rope(
        &mut self,
        state: NodeId,
        values: NodeId,
        start: NodeId,
        positions: NodeId,
        axis: i64,
        theta: f64,
    ) -> Result<NodeId, GraphError> {
        self.add_op(
            Op::CacheWrite {
                axis,
                rope: Some(theta),
            },
            &[state, values, start, positions],
        )
    }

    pub fn argmax(&mut self, x: NodeId, axis: i64) -> Result<NodeId, GraphError> {
        self.add_op(Op::ArgMax { axis }, &[x])
    }

    pub fn scalar(&mut self, value: f64, dtype: DType) -> Result<NodeId, GraphError> {
        self.constant(dtype, &[], vec![value])
    }

    pub fn constant(
        &mut self,
        dtype: DType,
        shape: &[usize],
        values: Vec<f64>,
    ) -> Result<NodeId, GraphError> {
        let op = Op::Constant {
            dtype,
            shape: Shape::new(shape.to_vec()),
            values,
        };
        self.add_op(op, &[])
    }

    pub fn causal_mask(&mut self, sq: usize, sk: usize, offset: i64) -> Result<NodeId, GraphError> {
        self.add_op(Op::CausalMask { sq, sk, offset }, &[])
    }

    pub fn reshape(&mut self, x: NodeId, shape: &[i64]) -> Result<NodeId, GraphError> {
        self.add_op(
            Op::Reshape {
                shape: shape.to_vec(),
            },
            &[x],
        )
    }

    pub fn permute(&mut self, x: NodeId, perm: &[usize]) -> Result<NodeId, GraphError> {
        self.add_op(
            Op::Permute {
                perm: perm.to_vec(),
            },
            &[x],
        )
    }

    /// Swaps the last two axes.
    pub fn transpose_last(&mut self, x: NodeId) -> Result<NodeId, GraphError> {
        let r = self.try_node(x)?.ty.shape.rank();
        let mut perm: Vec<usize> = (0..r).collect();
        if r >= 2 {
            perm.swap(r - 1, r - 2);
        }
        self.permute(x, &perm)
    }

    pub fn expand(&mut self, x: NodeId, shape: &[usize]) -> Result<NodeId, GraphError> {
        self.add_op(
            Op::Expand {
                shape: shape.to_vec(),
            },
            &[x],
        )
    }

    pub fn concat(&mut self, xs: &[NodeId], axis: i64) -> Result<NodeId, GraphError> {
        self.add_op(Op::Concat { axis }, xs)
    }

    pub fn slice(
        &mut self,
        x: NodeId,
        axis: i64,
        start: i64,
        end: i64,
    ) -> Result<NodeId, GraphError> {
        self.add_op(Op::Slice { axis, start, end }, &[x])
    }

    pub fn gather(&mut self, table: NodeId, indices: NodeId) -> Result<NodeId, GraphError> {
        self.add_op(Op::Gather, &[table, indices])
    }

    pub fn binary(&mut self, op: BinaryOp, a: NodeId, b: NodeId) -> Result<NodeId, GraphError> {
        self.add_op(Op::Binary(op), &[a, b])
    }

    pub fn unary(&mut self, op: UnaryOp, x: NodeId) -> Result<NodeId, GraphError> {
        self.add_op(Op::Unary(op), &[x])
    }

    pub fn where_(&mut self, cond: NodeId, a: NodeId, b: NodeId) -> Result<NodeId, GraphError> {
        self.add_op(Op::Where, &[cond, a, b])
    }

    pub fn cast(&mut self, x: NodeId, to: DType) -> Result<NodeId, GraphError> {
        self.add_op(Op::Cast { to }, &[x])
    }

    pub fn reduce(
        &mut self,
        op: ReduceOp,
        x: NodeId,
        axes: &[i64],
        keepdim: bool,
    ) -> Result<NodeId, GraphError> {
        let op = Op::Reduce {
            op,
            axes: axes.to_vec(),
            keepdim,
        };
        self.add_op(op, &[x])
    }

    pub fn softmax(&mut self, x: NodeId, axis: i64) -> Result<NodeId, GraphError> {
        self.add_op(Op::Softmax { axis }, &[x])
    }

    pub fn layer_norm(
        &mut self,
        x: NodeId,
        w: NodeId,
        b: NodeId,
        eps: f64,
    ) -> Result<NodeId, GraphError> {
        self.add_op(Op::LayerNorm { eps }, &[x, w, b])
    }

    pub fn rms_norm(&mut self, x: NodeId, w: NodeId, eps: f64) -> Result<NodeId, GraphError> {
        self.add_op(Op::RmsNorm { eps }, &[x, w])
    }

    pub fn rope(&mut self, x: NodeId, theta: f64, offset: i64) -> Result<NodeId, GraphError> {
        self.add_op(
            Op::Rope {
                theta,
                offset,
                factors: Vec::new(),
            },
            &[x],
        )
    }

    /// Rope at the positions `positions` holds (i32 `[S]`).
    pub fn rope_at(
        &mut self,
        x: NodeId,
        positions: NodeId,
        theta: f64,
    ) -> Result<NodeId, GraphError> {
        self.add_op(
            Op::Rope {
                theta,
                offset: 0,
                factors: Vec::new(),
            },
            &[x, positions],
        )
    }

    /// Rope with one frequency divisor per pair (see [`Op::Rope`]), at positions
    /// `offset..offset+S` or at those `positions` holds.
    pub fn rope_scaled(
        &mut self,
        x: NodeId,
        positions: Option<NodeId>,
        theta: f64,
        offset: i64,
        factors: Vec<f64>,
    ) -> Result<NodeId, GraphError> {
        let op = Op::Rope {
            theta,
            offset,
            factors,
        };
        match positions {
            Some(p) => self.add_op(op, &[x, p]),
            None => self.add_op(op, &[x]),
        }
    }

    pub fn matmul(&mut self, a: NodeId, b: NodeId) -> Result<NodeId, GraphError> {
        self.add_op(Op::MatMul, &[a, b])
    }

    /// A Gemm reading `a` and `b` (then `extras`, the epilogue's operands) through the views
    /// in `gemm` (see `ir::gemm`).
    pub fn gemm(
        &mut self,
        gemm: Gemm,
        a: NodeId,
        b: NodeId,
        extras: &[NodeId],
    ) -> Result<NodeId, GraphError> {
        let mut operands = vec![a, b];
        operands.extend_from_slice(extras);
        self.add_op(Op::Gemm(Box::new(gemm)), &operands)
    }

    /// FlashAttention; the mask kind follows the mask operand's dtype.
    pub fn flash_attention(
        &mut self,
        q: NodeId,
        k: NodeId,
        v: NodeId,
        mask: Option<NodeId>,
        scale: f64,
        causal: Option<i64>,
    ) -> Result<NodeId, GraphError> {
        let mask_kind = match mask {
            None => MaskKind::None,
            Some(m) if self.try_node(m)?.ty.dtype == DType::Bool => MaskKind::Boolean,
            Some(_) => MaskKind::Additive,
        };
        let att = Attention {
            scale,
            causal: causal.is_some(),
            causal_offset: causal.unwrap_or(0),
            window: None,
            mask: mask_kind,
            kv_len: false,
            append: None,
        };
        let mut operands = vec![q, k, v];
        operands.extend(mask);
        self.add_op(Op::FlashAttention(att), &operands)
    }

    /// FlashAttention over the first `kv_len` keys (i32 `[1]` or `[B]`), causal with the
    /// queries the last Sq of those positions when `causal`.
    pub fn flash_attention_len(
        &mut self,
        (q, k, v): (NodeId, NodeId, NodeId),
        kv_len: NodeId,
        scale: f64,
        causal: bool,
    ) -> Result<NodeId, GraphError> {
        let att = Attention {
            scale,
            causal,
            causal_offset: 0,
            window: None,
            mask: MaskKind::None,
            kv_len: true,
            append: None,
        };
        self.add_op(Op::FlashAttention(att), &[q, k, v, kv_len])
    }

    /// Causal FlashAttention in a sliding `window` (`Attention::window`): with `kv_len` (i32
    /// `[1]` or `[B]`) over its first keys, the queries the last Sq of them; without, at
    /// `causal_offset`. No mask operand: the window is the attribute.
    pub fn flash_attention_windowed(
        &mut self,
        (q, k, v): (NodeId, NodeId, NodeId),
        kv_len: Option<NodeId>,
        scale: f64,
        causal_offset: i64,
        window: Option<u32>,
    ) -> Result<NodeId, GraphError> {
        let att = Attention {
            scale,
            causal: true,
            causal_offset,
            window,
            mask: MaskKind::None,
            kv_len: kv_len.is_some(),
            append: None,
        };
        let mut operands = vec![q, k, v];
        operands.extend(kv_len);
        self.add_op(Op::FlashAttention(att), &operands)
    }

    /// The paged pool `pool` (`[blocks, Hkv, block_size, D]`, a state) with `values`
    /// (`[B, Hkv, s, D]`) written at `slots` (i32 `[B, s]`, `block·block_size + offset`,
    /// negative = padding); the pool's next value ([`Op::PagedCacheWrite`]).
    pub fn paged_cache_write(
        &mut self,
        pool: NodeId,
        values: NodeId,
        slots: NodeId,
    ) -> Result<NodeId, GraphError> {
        self.add_op(Op::PagedCacheWrite, &[pool, values, slots])
    }

    /// Decode attention of q (`[B, Hq, s, D]`) over the K/V pools through `table` (i32
    /// `[B, max_blocks]`) and `kv_len` (i32 `[B]`) ([`Op::PagedAttention`]).
    pub fn paged_attention(
        &mut self,
        (q, k_pool, v_pool): (NodeId, NodeId, NodeId),
        table: NodeId,
        kv_len: NodeId,
        scale: f64,
    ) -> Result<NodeId, GraphError> {
        self.paged_attention_windowed((q, k_pool, v_pool), table, kv_len, scale, None)
    }

    /// [`Graph::paged_attention`] in a sliding `window` (`Op::PagedAttention`'s).
    pub fn paged_attention_windowed(
        &mut self,
        (q, k_pool, v_pool): (NodeId, NodeId, NodeId),
        table: NodeId,
        kv_len: NodeId,
        scale: f64,
        window: Option<u32>,
    ) -> Result<NodeId, GraphError> {
        self.add_op(
            Op::PagedAttention {
                scale,
                window,
                append: None,
            },
            &[q, k_pool, v_pool, table, kv_len],
        )
    }
}

macro_rules! binary_builders {
    ($($fn_name:ident => $variant:ident),* $(,)?) => {
        impl Graph {
            $(
                pub fn $fn_name(&mut self, a: NodeId, b: NodeId) -> Result<NodeId, GraphError> {
                    self.binary(BinaryOp::$variant, a, b)
                }
            )*
        }
    };
}

macro_rules! unary_builders {
    ($($fn_name:ident => $variant:ident),* $(,)?) => {
        impl Graph {
            $(
                pub fn $fn_name(&mut self, x: NodeId) -> Result<NodeId, GraphError> {
                    self.unary(UnaryOp::$variant, x)
                }
            )*
        }
    };
}

binary_builders!(
    add => Add, sub => Sub, mul => Mul, div => Div, pow => Pow, maximum => Maximum,
    minimum => Minimum, equal => Equal, less => Less, greater => Greater,
);

unary_builders!(
    neg => Neg, abs => Abs, exp => Exp, log => Log, sqrt => Sqrt, rsqrt => Rsqrt, recip => Recip,
    tanh => Tanh, erf => Erf, sigmoid => Sigmoid, silu => Silu, gelu => Gelu, gelu_tanh => GeluTanh,
    softplus => Softplus,
);
