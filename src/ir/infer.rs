//! The shape and dtype rule of every op: given the operand types, the result type or why there
//! is none.

use super::dtype::DType;
use super::expr::Expr;
use super::gemm::Gemm;
use super::op::Op;
use super::scalar::check_constant;
use super::shape::{normalize_axis, Shape, TensorType};
use super::values::{Append, Attention, BinaryOp, Init, MaskKind};

/// Why an op cannot be applied to its operands. The graph wraps it with the node's name.
#[derive(Debug, Clone, PartialEq)]
pub enum InferError {
    Shape(String),
    DType(String),
    Attribute(String),
    Overflow(String),
    /// A sliding window breaking [`super::values::check_window`]'s rules.
    Window(super::values::WindowError),
}

fn shape_err<T>(msg: impl Into<String>) -> Result<T, InferError> {
    Err(InferError::Shape(msg.into()))
}
fn dtype_err<T>(msg: impl Into<String>) -> Result<T, InferError> {
    Err(InferError::DType(msg.into()))
}
fn attr_err<T>(msg: impl Into<String>) -> Result<T, InferError> {
    Err(InferError::Attribute(msg.into()))
}

/// The result type of `op` applied to operands of types `ins`. The caller has checked arity.
pub fn infer(op: &Op, ins: &[&TensorType]) -> Result<TensorType, InferError> {
    let ty = infer_unchecked(op, ins)?;
    if ty.shape.checked_numel(ty.dtype).is_none() {
        return Err(InferError::Overflow(format!(
            "{} elements of {} do not fit in memory addressing",
            ty.shape
                .0
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join("×"),
            ty.dtype
        )));
    }
    Ok(ty)
}

fn infer_unchecked(op: &Op, ins: &[&TensorType]) -> Result<TensorType, InferError> {
    match op {
        Op::Input {
            dtype,
            shape,
            sample,
        } => {
            sample.check(*dtype).map_err(InferError::Attribute)?;
            Ok(TensorType::new(*dtype, shape.clone()))
        }
        Op::State { dtype, shape } => Ok(TensorType::new(*dtype, shape.clone())),
        Op::Weight {
            dtype,
            shape,
            init,
            quant,
        } => {
            if let Some(q) = quant {
                if !dtype.is_float() {
                    return attr_err(format!("a {q} weight holds floats, not {dtype}"));
                }
                if *init != Init::Normal {
                    return attr_err(format!(
                        "a {q} weight without data is drawn as random blocks; init {init:?} \
                         does not apply"
                    ));
                }
                if shape.rank() == 0 {
                    return attr_err(format!("a {q} weight needs at least one axis"));
                }
                q.layout(shape)
                    .map_err(|e| InferError::Attribute(e.to_string()))?;
            }
            Ok(TensorType::new(*dtype, shape.clone()))
        }
        Op::Constant {
            dtype,
            shape,
            values,
        } => {
            let n = shape
                .checked_numel(*dtype)
                .ok_or_else(|| InferError::Overflow(format!("constant of shape {shape}")))?;
            if values.len() != 1 && values.len() != n {
                return attr_err(format!(
                    "constant of shape {shape} needs 1 or {n} values, got {}",
                    values.len()
                ));
            }
            for (i, &v) in values.iter().enumerate() {
                check_constant(*dtype, v)
                    .map_err(|e| InferError::Attribute(format!("value {i}: {e}")))?;
            }
            Ok(TensorType::new(*dtype, shape.clone()))
        }
        Op::CausalMask { sq, sk, .. } => Ok(TensorType::new(DType::Bool, vec![*sq, *sk])),
        Op::Reshape { shape } => reshape(ins[0], shape),
        Op::Permute { perm } => {
            let x = ins[0];
            if !is_permutation(perm, x.shape.rank()) {
                return attr_err(format!(
                    "perm {perm:?} is not a permutation of the {} axes of {}",
                    x.shape.rank(),
                    x.shape
                ));
            }
            let dims = perm.iter().map(|&p| x.shape.0[p]).collect::<Vec<_>>();
            Ok(TensorType::new(x.dtype, dims))
        }
        Op::Expand { shape } => {
            let target = Shape(shape.clone());
            if !ins[0].shape.broadcasts_to(&target) {
                return shape_err(format!("{} does not broadcast to {target}", ins[0].shape));
            }
            Ok(TensorType::new(ins[0].dtype, target))
        }
        Op::Concat { axis } => {
            let first = ins[0];
            let ax = axis_of(*axis, &first.shape)?;
            let mut dims = first.shape.0.clone();
            dims[ax] = 0;
            for t in ins {
                if t.dtype != first.dtype {
                    return dtype_err(format!("operands mix {} and {}", first.dtype, t.dtype));
                }
                let same_rest = t.shape.rank() == first.shape.rank()
                    && (0..first.shape.rank()).all(|i| i == ax || t.shape.0[i] == first.shape.0[i]);
                if !same_rest {
                    return shape_err(format!(
                        "{} and {} differ outside axis {axis}",
                        first.shape, t.shape
                    ));
                }
                dims[ax] = dims[ax]
                    .checked_add(t.shape.0[ax])
                    .ok_or_else(|| InferError::Overflow("concatenated axis".into()))?;
            }
            Ok(TensorType::new(first.dtype, dims))
        }
        Op::Slice { axis, start, end } => {
            let x = ins[0];
            let ax = axis_of(*axis, &x.shape)?;
            let (s, e) = slice_bounds(*start, *end, x.shape.0[ax])?;
            let mut dims = x.shape.0.clone();
            dims[ax] = e - s;
            Ok(TensorType::new(x.dtype, dims))
        }
        Op::Gather => {
            let (table, idx) = (ins[0], ins[1]);
            if !idx.dtype.is_int() {
                return dtype_err(format!("indices must be i32 or i64, got {}", idx.dtype));
            }
            if table.shape.rank() == 0 {
                return shape_err("the table of a gather must have at least one axis");
            }
            let mut dims = idx.shape.0.clone();
            dims.extend_from_slice(&table.shape.0[1..]);
            Ok(TensorType::new(table.dtype, dims))
        }
        Op::Binary(b) => {
            let (x, y) = (ins[0], ins[1]);
            if x.dtype != y.dtype {
                return dtype_err(format!("operands mix {} and {}", x.dtype, y.dtype));
            }
            if b.float_only() && !x.dtype.is_float() {
                return dtype_err(format!(
                    "{} needs float operands, got {}",
                    b.name(),
                    x.dtype
                ));
            }
            if x.dtype == DType::Bool && *b != BinaryOp::Equal {
                return dtype_err(format!("{} is not defined on bool", b.name()));
            }
            let shape = broadcast(&x.shape, &y.shape)?;
            let dtype = if b.is_comparison() {
                DType::Bool
            } else {
                x.dtype
            };
            Ok(TensorType::new(dtype, shape))
        }
        Op::Where => {
            let (c, x, y) = (ins[0], ins[1], ins[2]);
            if c.dtype != DType::Bool {
                return dtype_err(format!("condition must be bool, got {}", c.dtype));
            }
            if x.dtype != y.dtype {
                return dtype_err(format!("branches mix {} and {}", x.dtype, y.dtype));
            }
            let shape = broadcast(&broadcast(&c.shape, &x.shape)?, &y.shape)?;
            Ok(TensorType::new(x.dtype, shape))
        }
        Op::Unary(u) => {
            let x = ins[0];
            if !(x.dtype.is_float() || (u.accepts_int() && x.dtype.is_int())) {
                return dtype_err(format!("{} is not defined on {}", u.name(), x.dtype));
            }
            Ok(x.clone())
        }
        Op::Cast { to } => Ok(TensorType::new(*to, ins[0].shape.clone())),
        Op::Reduce { axes, keepdim, .. } => {
            let x = ins[0];
            require_float(x)?;
            let axes = reduce_axes(axes, &x.shape)?;
            let dims = x
                .shape
                .0
                .iter()
                .enumerate()
                .filter_map(|(i, &d)| match (axes.contains(&i), *keepdim) {
                    (false, _) => Some(d),
                    (true, true) => Some(1),
                    (true, false) => None,
                })
                .collect::<Vec<_>>();
            Ok(TensorType::new(x.dtype, dims))
        }
        Op::Softmax { axis } => {
            require_float(ins[0])?;
            axis_of(*axis, &ins[0].shape)?;
            Ok(ins[0].clone())
        }
        Op::LayerNorm { eps } | Op::RmsNorm { eps } => {
            let x = ins[0];
            require_float(x)?;
            if !(eps.is_finite() && *eps >= 0.0) {
                return attr_err(format!("eps must be finite and ≥ 0, got {eps}"));
            }
            let Some(&d) = x.shape.0.last() else {
                return shape_err("normalisation needs at least one axis");
            };
            for p in &ins[1..] {
                require_float(p)?;
                if p.shape.0 != [d] {
                    return shape_err(format!(
                        "parameter of shape {} must be [{d}] (the last axis of {})",
                        p.shape, x.shape
                    ));
                }
            }
            Ok(x.clone())
        }
        Op::Rope {
            theta,
            offset,
            factors,
        } => {
            let x = rope_at(*theta, *offset, ins[0], ins.get(1).copied())?;
            let half = x.shape.0[x.shape.rank() - 1] / 2;
            if !factors.is_empty() && factors.len() != half {
                return attr_err(format!(
                    "rope needs one frequency factor per pair ({half}), got {}",
                    factors.len()
                ));
            }
            if let Some(f) = factors.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
                return attr_err(format!("rope frequency factors must be positive, got {f}"));
            }
            Ok(x)
        }
        Op::MatMul => matmul(ins[0], ins[1]),
        Op::FlashAttention(att) => flash_attention(att, ins),
        Op::Gemm(g) => gemm(g, ins),
        Op::FusedElementwise(expr) => {
            // Sizes are checked before the (recursive) typing walk.
            expr.check(ins.len()).map_err(InferError::Attribute)?;
            expr.ty(ins)
        }
        Op::CacheWrite { axis, rope } => {
            if let Some(theta) = rope {
                // The values are rotated as `Op::Rope` at the positions operand rotates them.
                rope_at(*theta, 0, ins[1], Some(ins[3]))?;
            }
            cache_write(*axis, &ins[..3])
        }
        Op::PagedCacheWrite => paged_cache_write(ins),
        Op::PagedAttention {
            scale,
            window,
            append,
        } => {
            // Paged attention is always causal.
            super::values::check_window(*window, true).map_err(InferError::Window)?;
            match append {
                None => paged_attention(*scale, ins),
                Some(ap) => paged_append(*scale, ap, ins),
            }
        }
        Op::ArgMax { axis } => {
            let x = ins[0];
            require_float(x)?;
            let ax = axis_of(*axis, &x.shape)?;
            if x.shape.0[ax] == 0 {
                return shape_err(format!("argmax over the empty axis {axis} of {}", x.shape));
            }
            let mut dims = x.shape.0.clone();
            dims.remove(ax);
            Ok(TensorType::new(DType::I32, dims))
        }
    }
}

/// A cache write: `values` of the state's dtype and rank, equal to it on every axis but
/// `axis`, where it is no longer; `start` one i32. Where it lands is data, checked when run.
/// Rope's rule (`Op::Rope`, and a cache write's rope): `x` float `[.., S, D]`, D even, theta
/// positive, and positions (i32 `[S]`) or an offset, not both. The result has `x`'s type.
fn rope_at(
    theta: f64,
    offset: i64,
    x: &TensorType,
    positions: Option<&TensorType>,
) -> Result<TensorType, InferError> {
    if let Some(pos) = positions {
        if pos.dtype != DType::I32 {
            return dtype_err(format!("rope positions must be i32, got {}", pos.dtype));
        }
        let s = x.shape.rank().checked_sub(2).map(|a| x.shape.0[a]);
        if Some(pos.shape.0.as_slice()) != s.as_ref().map(std::slice::from_ref) {
            return shape_err(format!(
                "rope positions {} must be [S], one per row of {}",
                pos.shape, x.shape
            ));
        }
        if offset != 0 {
            return attr_err("rope takes an offset or positions, not both");
        }
    }
    require_float(x)?;
    if !(theta.is_finite() && theta > 0.0) {
        return attr_err(format!("theta must be positive, got {theta}"));
    }
    if x.shape.rank() < 2 || !x.shape.0[x.shape.rank() - 1].is_multiple_of(2) {
        return shape_err(format!(
            "rope needs [.., S, D] with D even, got {}",
            x.shape
        ));
    }
    Ok(x.clone())
}

fn cache_write(axis: i64, ins: &[&TensorType]) -> Result<TensorType, InferError> {
    let (state, values, start) = (ins[0], ins[1], ins[2]);
    if values.dtype != state.dtype {
        return dtype_err(format!(
            "values ({}) must have the state's dtype ({})",
            values.dtype, state.dtype
        ));
    }
    if start.dtype != DType::I32 || start.shape.numel() != 1 {
        return dtype_err(format!(
            "start must be one i32, got {}{}",
            start.dtype, start.shape
        ));
    }
    let ax = axis_of(axis, &state.shape)?;
    let fits = values.shape.rank() == state.shape.rank()
        && (0..state.shape.rank()).all(|i| {
            if i == ax {
                values.shape.0[i] <= state.shape.0[i]
            } else {
                values.shape.0[i] == state.shape.0[i]
            }
        });
    if !fits {
        return shape_err(format!(
            "values {} must match the state {} on every axis but {axis}, and be no longer on it",
            values.shape, state.shape
        ));
    }
    Ok(state.clone())
}

/// A paged cache write (`Op::PagedCacheWrite`): pool `[N, Hkv, BS, D]`, values `[B, Hkv, s, D]`
/// of the pool's dtype, slots i32 `[B, s]`. Where the rows land is data, checked when run.
fn paged_cache_write(ins: &[&TensorType]) -> Result<TensorType, InferError> {
    let (pool, values, slots) = (ins[0], ins[1], ins[2]);
    // A KV cache: float rows (so the kernels and the CPU device move one kind of element).
    require_float(pool)?;
    if values.dtype != pool.dtype {
        return dtype_err(format!(
            "values ({}) must have the pool's dtype ({})",
            values.dtype, pool.dtype
        ));
    }
    if slots.dtype != DType::I32 {
        return dtype_err(format!("slots must be i32, got {}", slots.dtype));
    }
    if pool.shape.rank() != 4 || values.shape.rank() != 4 {
        return shape_err(format!(
            "the pool must be [blocks, Hkv, block_size, D] and the values [B, Hkv, s, D], got {} \
             and {}",
            pool.shape, values.shape
        ));
    }
    let [_, hkv, _, d] = dims4(pool);
    let [b, vh, s, vd] = dims4(values);
    if vh != hkv || vd != d {
        return shape_err(format!(
            "values {} must have the pool's heads and row size ({hkv}, {d})",
            values.shape
        ));
    }
    if slots.shape.0 != [b, s] {
        return shape_err(format!(
            "slots {} must be [{b}, {s}], one per new row",
            slots.shape
        ));
    }
    Ok(pool.clone())
}

/// Paged decode attention (`Op::PagedAttention`): q `[B, Hq, s, D]`, pools `[N, Hkv, BS, D]`
/// and `[N, Hkv, BS, Dv]` of q's dtype, block table i32 `[B, max_blocks]`, kv_len i32 `[B]`.
fn paged_attention(scale: f64, ins: &[&TensorType]) -> Result<TensorType, InferError> {
    let (q, k, v, table, kv_len) = (ins[0], ins[1], ins[2], ins[3], ins[4]);
    for t in [q, k, v] {
        require_float(t)?;
        if t.shape.rank() != 4 {
            return shape_err(format!(
                "q must be [B, Hq, s, D] and the pools [blocks, Hkv, block_size, D], got {}",
                t.shape
            ));
        }
    }
    if q.dtype != k.dtype || q.dtype != v.dtype {
        return dtype_err(format!("q, k, v mix {}, {}, {}", q.dtype, k.dtype, v.dtype));
    }
    if !(scale as f32).is_finite() {
        return attr_err(format!("scale must be finite as an f32, got {scale}"));
    }
    let [b, hq, s, d] = dims4(q);
    let [n, hkv, bs, dk] = dims4(k);
    let [nv, hv, bsv, dv] = dims4(v);
    let grouped = if hkv == 0 { hq == 0 } else { hq % hkv == 0 };
    if hkv != hv || !grouped {
        return shape_err(format!(
            "query heads ({hq}) must be a multiple of key/value heads ({hkv}, {hv})"
        ));
    }
    if n != nv || bs != bsv || d != dk {
        return shape_err(format!(
            "the k pool {} and v pool {} must share blocks and block size, and q {} and k share D",
            k.shape, v.shape, q.shape
        ));
    }
    for (what, t) in [("block table", table), ("kv_len", kv_len)] {
        if t.dtype != DType::I32 {
            return dtype_err(format!("the {what} must be i32, got {}", t.dtype));
        }
    }
    if table.shape.rank() != 2 || table.shape.0[0] != b {
        return shape_err(format!(
            "the block table {} must be [{b}, max_blocks]",
            table.shape
        ));
    }
    if kv_len.shape.0 != [b] {
        return shape_err(format!(
            "kv_len {} must be [{b}], one per sequence",
            kv_len.shape
        ));
    }
    Ok(TensorType::new(q.dtype, vec![b, hq, s, dv]))
}

/// The append form of paged attention (`ir::Append`): q is this step's rows before rope,
/// `[1, Hq, B·s, D]` with B the block table's rows; positions i32 `[B·s]` rotate q and k_new as
/// `Op::Rope` would; k_new `[1, Hkv, B·s, D]`, v_new `[1, Hkv, B·s, Dv]` and slots i32
/// `[1, B·s]` are what the paged cache writes of the pools take. The rest is the base form's
/// rule on q seen as `[B, Hq, s, D]`.
fn paged_append(scale: f64, ap: &Append, ins: &[&TensorType]) -> Result<TensorType, InferError> {
    let (q, k, v, table) = (ins[0], ins[1], ins[2], ins[3]);
    let (pos, k_new, v_new, slots) = (ins[5], ins[6], ins[7], ins[8]);
    for t in [q, k, v] {
        if t.shape.rank() != 4 {
            return shape_err(format!(
                "an appending paged attention's q must be [1, Hq, B·s, D] and the pools \
                 [blocks, Hkv, block_size, D], got {}",
                t.shape
            ));
        }
    }
    if table.shape.rank() != 2 {
        return shape_err(format!(
            "the block table {} must be [B, max_blocks]",
            table.shape
        ));
    }
    let [one, hq, rows, d] = dims4(q);
    let b = table.shape.0[0];
    if one != 1 || (b == 0 && rows != 0) || (b != 0 && rows % b != 0) {
        return shape_err(format!(
            "an appending paged attention's q {} must be [1, Hq, B·s, D] with B = {b} (the \
             block table's rows)",
            q.shape
        ));
    }
    let s = rows.checked_div(b).unwrap_or(0);
    let seen = TensorType::new(q.dtype, vec![b, hq, s, d]);
    let mut base: Vec<&TensorType> = ins[..5].to_vec();
    base[0] = &seen;
    let out = paged_attention(scale, &base)?;
    append_rope(ap, q, k_new, pos, d)?;
    let [_, hkv, _, dv] = dims4(v);
    for (what, t, want) in [
        ("k_new", k_new, [1, hkv, rows, d]),
        ("v_new", v_new, [1, hkv, rows, dv]),
    ] {
        if t.dtype != q.dtype {
            return dtype_err(format!("{what} must be {}, got {}", q.dtype, t.dtype));
        }
        if t.shape.0 != want {
            return shape_err(format!("{what} {} must be {want:?}", t.shape));
        }
    }
    if slots.dtype != DType::I32 {
        return dtype_err(format!("slots must be i32, got {}", slots.dtype));
    }
    if slots.shape.0 != [1, rows] {
        return shape_err(format!(
            "slots {} must be [1, {rows}], one per new row",
            slots.shape
        ));
    }
    Ok(out)
}

fn require_float(t: &TensorType) -> Result<(), InferError> {
    if t.dtype.is_float() {
        Ok(())
    } else {
        dtype_err(format!("expected a float tensor, got {}", t.dtype))
    }
}

fn axis_of(axis: i64, shape: &Shape) -> Result<usize, InferError> {
    normalize_axis(axis, shape.rank())
        .ok_or_else(|| InferError::Attribute(format!("axis {axis} is out of range for {shape}")))
}

fn broadcast(a: &Shape, b: &Shape) -> Result<Shape, InferError> {
    Shape::broadcast(a, b).ok_or_else(|| InferError::Shape(format!("{a} and {b} do not broadcast")))
}

pub(crate) fn is_permutation(perm: &[usize], rank: usize) -> bool {
    let mut seen = vec![false; rank];
    perm.len() == rank
        && perm
            .iter()
            .all(|&p| p < rank && !std::mem::replace(&mut seen[p], true))
}

/// Normalised, sorted, distinct reduction axes.
pub(crate) fn reduce_axes(axes: &[i64], shape: &Shape) -> Result<Vec<usize>, InferError> {
    if axes.is_empty() {
        return attr_err("a reduction needs at least one axis");
    }
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let ax = axis_of(a, shape)?;
        if out.contains(&ax) {
            return attr_err(format!("axis {a} is listed twice"));
        }
        out.push(ax);
    }
    out.sort_unstable();
    Ok(out)
}

/// Resolves slice bounds (negative counts from the end) to `0 ≤ start ≤ end ≤ dim`.
pub(crate) fn slice_bounds(start: i64, end: i64, dim: usize) -> Result<(usize, usize), InferError> {
    // Typed shapes keep every dimension within i64; a negative bound is only added to it.
    let d = i64::try_from(dim).map_err(|_| InferError::Overflow(format!("axis of size {dim}")))?;
    let s = if start < 0 { start + d } else { start };
    let e = if end < 0 { end + d } else { end };
    if !(0 <= s && s <= e && e <= d) {
        return attr_err(format!(
            "slice {start}..{end} is out of bounds for an axis of size {dim}"
        ));
    }
    Ok((s as usize, e as usize))
}

fn reshape(x: &TensorType, spec: &[i64]) -> Result<TensorType, InferError> {
    let total = x.shape.numel();
    let mut infer_at = None;
    let mut dims = Vec::with_capacity(spec.len());
    for (i, &d) in spec.iter().enumerate() {
        match d {
            -1 if infer_at.is_none() => infer_at = Some(i),
            -1 => return attr_err("reshape may infer at most one axis (-1)"),
            d if d < 0 => return attr_err(format!("reshape dimension {d} is negative")),
            _ => {}
        }
        dims.push(usize::try_from(d).unwrap_or(1));
    }
    // The known dimensions' product; a zero makes it zero whatever the others are.
    let known = if dims.contains(&0) {
        0
    } else {
        dims.iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| InferError::Overflow(format!("reshape to {spec:?}")))?
    };
    if let Some(i) = infer_at {
        if known == 0 || !total.is_multiple_of(known) {
            return shape_err(format!("cannot reshape {} to {spec:?}", x.shape));
        }
        dims[i] = total / known;
    } else if known != total {
        return shape_err(format!(
            "cannot reshape {} ({total} elements) to {spec:?} ({known} elements)",
            x.shape
        ));
    }
    Ok(TensorType::new(x.dtype, dims))
}

fn matmul(a: &TensorType, b: &TensorType) -> Result<TensorType, InferError> {
    if a.dtype != b.dtype {
        return dtype_err(format!("operands mix {} and {}", a.dtype, b.dtype));
    }
    require_float(a)?;
    let (ra, rb) = (a.shape.rank(), b.shape.rank());
    if ra < 2 || rb < 2 {
        return shape_err(format!(
            "matmul needs operands of rank ≥ 2, got {} and {}",
            a.shape, b.shape
        ));
    }
    let (m, k) = (a.shape.0[ra - 2], a.shape.0[ra - 1]);
    let (k2, n) = (b.shape.0[rb - 2], b.shape.0[rb - 1]);
    if k != k2 {
        return shape_err(format!(
            "contraction sizes differ: {} × {} ({k} vs {k2})",
            a.shape, b.shape
        ));
    }
    let batch = broadcast(
        &Shape(a.shape.0[..ra - 2].to_vec()),
        &Shape(b.shape.0[..rb - 2].to_vec()),
    )?;
    let mut dims = batch.0;
    dims.extend([m, n]);
    Ok(TensorType::new(a.dtype, dims))
}

/// A Gemm: A and B of one float dtype, each view inside its tensor, the result view writing
/// every element of the result exactly once, and the epilogue typed over `$0` (the product in
/// A's dtype) and the extra operands, all at the problem's shape.
fn gemm(g: &Gemm, ins: &[&TensorType]) -> Result<TensorType, InferError> {
    use super::gemm::Operand;
    let (a, b) = (ins[0], ins[1]);
    if a.dtype != b.dtype {
        return dtype_err(format!("operands mix {} and {}", a.dtype, b.dtype));
    }
    require_float(a)?;
    let params = g.prologue_slots();
    if ins.len() != params.end {
        return attr_err(format!(
            "{} epilogue views and {} prologue parameters for {} operands after A and B",
            g.extras.len(),
            params.len(),
            ins.len() - 2
        ));
    }
    let Some([nb, m, n, k]) = g.dims.sizes() else {
        return Err(InferError::Overflow("the problem's size overflows".into()));
    };
    if let Some(p) = &g.prologue {
        if !(p.eps.is_finite() && p.eps >= 0.0) {
            return attr_err(format!(
                "prologue eps must be finite and ≥ 0, got {}",
                p.eps
            ));
        }
        for t in &ins[params] {
            require_float(t)?;
            if t.shape.0 != [k] {
                return shape_err(format!(
                    "prologue parameter of shape {} must be [{k}] (K)",
                    t.shape
                ));
            }
        }
    }
    let extras = &ins[2..2 + g.extras.len()];
    let numel = |t: &TensorType| t.shape.checked_numel(t.dtype).unwrap_or(usize::MAX);
    g.a.check(&g.dims, Operand::A, numel(a), "a")
        .map_err(InferError::Shape)?;
    g.b.check(&g.dims, Operand::B, numel(b), "b")
        .map_err(InferError::Shape)?;
    if g.paired {
        // Paired columns: N's last sub-axis holds whole pairs, and the epilogue combines them.
        if g.dims.n.last().is_none_or(|&l| l % 2 != 0) {
            return shape_err(format!(
                "paired columns need N's last sub-axis even, got n={:?}",
                g.dims.n
            ));
        }
        if g.epilogue.is_none() {
            return attr_err("paired columns without an epilogue to combine them");
        }
    }
    let out_dims = g.out_dims();
    for (i, (v, t)) in g.extras.iter().zip(extras).enumerate() {
        v.check(&out_dims, Operand::Out, numel(t), &format!("extra {i}"))
            .map_err(InferError::Shape)?;
    }
    let out_numel = g
        .shape
        .dims()
        .iter()
        .try_fold(1usize, |p, &d| p.checked_mul(d));
    let n_out = if g.paired { n / 2 } else { n };
    let problem = nb.checked_mul(m).and_then(|x| x.checked_mul(n_out));
    if out_numel.is_none() || out_numel != problem {
        return shape_err(format!(
            "the result {} does not hold the {nb}×{m}×{n_out} products",
            g.shape
        ));
    }
    g.out
        .check(&out_dims, Operand::Out, out_numel.unwrap_or(0), "out")
        .map_err(InferError::Shape)?;
    if !g
        .out
        .is_bijection(&out_dims, Operand::Out, out_numel.unwrap_or(0))
    {
        return shape_err(format!(
            "the out view does not write each element of {} exactly once",
            g.shape
        ));
    }
    let problem_shape = Shape(vec![nb, m, n_out]);
    let dtype = match &g.epilogue {
        None if g.extras.is_empty() => a.dtype,
        None => return attr_err("epilogue operands without an epilogue"),
        Some(e) => {
            // `$0` the product (paired: `$0`, `$1` the pair's products), then the extras.
            let products = g.first_extra_var();
            e.check(extras.len() + products)
                .map_err(InferError::Attribute)?;
            let typed: Vec<TensorType> = std::iter::repeat_n(a.dtype, products)
                .chain(extras.iter().map(|t| t.dtype))
                .map(|dt| TensorType::new(dt, problem_shape.clone()))
                .collect();
            let refs: Vec<&TensorType> = typed.iter().collect();
            e.ty(&refs)?.dtype
        }
    };
    Ok(TensorType::new(dtype, g.shape.clone()))
}

fn flash_attention(att: &Attention, ins: &[&TensorType]) -> Result<TensorType, InferError> {
    let (q, k, v) = (ins[0], ins[1], ins[2]);
    for t in [q, k, v] {
        require_float(t)?;
        if t.shape.rank() != 4 {
            return shape_err(format!("q, k and v must be [B, H, S, D], got {}", t.shape));
        }
    }
    if q.dtype != k.dtype || q.dtype != v.dtype {
        return dtype_err(format!("q, k, v mix {}, {}, {}", q.dtype, k.dtype, v.dtype));
    }
    // Scores are scaled in f32 on every path.
    if !(att.scale as f32).is_finite() {
        return attr_err(format!("scale must be finite as an f32, got {}", att.scale));
    }
    att.check_window().map_err(InferError::Window)?;
    let [b, hq, sq, d] = dims4(q);
    let [bk, hkv, sk, dk] = dims4(k);
    let [bv, hv, skv, dv] = dims4(v);
    if b != bk || b != bv {
        return shape_err(format!("batch sizes differ: {b}, {bk}, {bv}"));
    }
    // No heads at all is an empty result; otherwise query heads are groups of key/value heads.
    let grouped = if hkv == 0 { hq == 0 } else { hq % hkv == 0 };
    if hkv != hv || !grouped {
        return shape_err(format!(
            "query heads ({hq}) must be a multiple of key/value heads ({hkv}, {hv})"
        ));
    }
    if sk != skv || d != dk {
        return shape_err(format!(
            "k {} and v {} must share Sk, and q {} and k share D",
            k.shape, v.shape, q.shape
        ));
    }
    match (att.mask, ins.get(3)) {
        (MaskKind::None, _) => {}
        (kind, Some(m)) => {
            let ok_dtype = match kind {
                MaskKind::Boolean => m.dtype == DType::Bool,
                _ => m.dtype.is_float(),
            };
            if !ok_dtype {
                return dtype_err(format!("a {kind:?} mask cannot be {}", m.dtype));
            }
            let scores = Shape::new(vec![b, hq, sq, sk]);
            if m.shape.rank() > 4 || !m.shape.broadcasts_to(&scores) {
                return shape_err(format!(
                    "mask {} does not broadcast to the scores {scores}",
                    m.shape
                ));
            }
        }
        (_, None) => return attr_err("mask kind given but no mask operand"),
    }
    if let Some(slot) = att.kv_len_slot() {
        let kv = ins[slot];
        if kv.dtype != DType::I32 {
            return dtype_err(format!("kv_len must be i32, got {}", kv.dtype));
        }
        if kv.shape.0 != [1] && kv.shape.0 != [b] {
            return shape_err(format!(
                "kv_len {} must be [1] or [{b}] (one per batch)",
                kv.shape
            ));
        }
        if att.causal_offset != 0 {
            return attr_err("with kv_len the causal offset is kv_len − Sq, not an attribute");
        }
    }
    if let Some(ap) = &att.append {
        append(att, ap, ins, [b, hkv, sq, d, dv])?;
    }
    Ok(TensorType::new(q.dtype, vec![b, hq, sq, dv]))
}

/// The append operands of an appending FlashAttention (`ir::Append`): positions rotate q and
/// k_new as `Op::Rope` would; k_new and v_new are this step's rows of the caches (Sq of them);
/// start is one i32.
fn append(
    att: &Attention,
    ap: &Append,
    ins: &[&TensorType],
    [b, hkv, sq, d, dv]: [usize; 5],
) -> Result<(), InferError> {
    if !att.kv_len {
        return attr_err("an appending attention needs kv_len");
    }
    let base = att.base_operands();
    let (pos, k_new, v_new, start) = (ins[base], ins[base + 1], ins[base + 2], ins[base + 3]);
    append_rope(ap, ins[0], k_new, pos, d)?;
    for (what, t, want) in [
        ("k_new", k_new, [b, hkv, sq, d]),
        ("v_new", v_new, [b, hkv, sq, dv]),
    ] {
        if t.dtype != ins[0].dtype {
            return dtype_err(format!("{what} must be {}, got {}", ins[0].dtype, t.dtype));
        }
        if t.shape.0 != want {
            return shape_err(format!("{what} {} must be {want:?}", t.shape));
        }
    }
    if start.dtype != DType::I32 || start.shape.numel() != 1 {
        return shape_err(format!(
            "start must be one i32, got {} {}",
            start.dtype, start.shape
        ));
    }
    Ok(())
}

fn dims4(t: &TensorType) -> [usize; 4] {
    [t.shape.0[0], t.shape.0[1], t.shape.0[2], t.shape.0[3]]
}

// Typing a fused expression applies each of its ops' own shape rule (`infer`), so it lives here
// rather than in `expr.rs`: `op` holds `Expr`, and `expr` stays below `op` and `infer`.
impl Expr {
    /// The op this expression node applies, for typing through `infer`.
    fn op(&self) -> Option<Op> {
        match self {
            Expr::Input(_) | Expr::Const(..) => None,
            Expr::Unary(u, _) => Some(Op::Unary(*u)),
            Expr::Binary(b, ..) => Some(Op::Binary(*b)),
            Expr::Where(..) => Some(Op::Where),
            Expr::Cast(to, _) => Some(Op::Cast { to: *to }),
        }
    }

    /// The type of this expression over operands of types `ins`.
    pub fn ty(&self, ins: &[&TensorType]) -> Result<TensorType, InferError> {
        match self {
            Expr::Input(i) => ins.get(*i).map(|t| (*t).clone()).ok_or_else(|| {
                InferError::Attribute(format!(
                    "expression reads ${i}, but the node has {} operands",
                    ins.len()
                ))
            }),
            Expr::Const(_, dt) => Ok(TensorType::new(*dt, vec![])),
            _ => {
                let kids = self
                    .children()
                    .into_iter()
                    .map(|c| c.ty(ins))
                    .collect::<Result<Vec<_>, _>>()?;
                let refs: Vec<&TensorType> = kids.iter().collect();
                infer(&self.op().expect("interior node"), &refs)
            }
        }
    }
}

/// The append form's rope (either attention): q and k_new rotated at `pos` with `ap`'s theta,
/// and its factors one per pair of the head size `d` (or none), each finite and positive.
fn append_rope(
    ap: &Append,
    q: &TensorType,
    k_new: &TensorType,
    pos: &TensorType,
    d: usize,
) -> Result<(), InferError> {
    rope_at(ap.theta, 0, q, Some(pos))?;
    rope_at(ap.theta, 0, k_new, Some(pos))?;
    if !ap.factors.is_empty() && ap.factors.len() != d / 2 {
        return attr_err(format!(
            "append rope needs one frequency factor per pair ({}), got {}",
            d / 2,
            ap.factors.len()
        ));
    }
    if let Some(f) = ap.factors.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
        return attr_err(format!("rope frequency factors must be positive, got {f}"));
    }
    Ok(())
}
