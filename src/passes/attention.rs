//! Attention fusion: softmax(scale·Q·Kᵀ + mask)·V → FlashAttention.
//!
//! Anchor: a MatMul whose left operand is (through an optional Cast) a Softmax. Walking up:
//! - the softmax is over the key axis (the last), and nothing else;
//! - between the softmax and Q·Kᵀ, in any order: casts; `add` of a float mask that broadcasts
//!   to the scores without changing their shape; `where(cond, S, fill)` with fill −∞ or the
//!   dtype's minimum, where cond is a CausalMask (or a constant lower-triangular bool) of the
//!   scores' [Sq, Sk] → causal, or any other bool mask → boolean mask (for a finite fill, an
//!   additive f32 `where(cond, 0, f32::MIN)`, which keeps a fully masked row uniform as the
//!   unfused graph has it); `mul` by a scalar constant (div is already mul) → scale, refused
//!   above an additive mask (it would scale the mask);
//! - Q·Kᵀ is a MatMul of Q (optionally `mul` by a scalar constant) and Kᵀ: a Permute that swaps
//!   exactly the last two axes (any other permutation refused), or K already stored [.., D, Sk]
//!   (a transpose is inserted), optionally scaled;
//! - K and V expanded over a head-group axis (Reshape → Expand → Reshape, LLaMA's repeat_kv)
//!   are read un-expanded (GQA/MQA) when both carry the same group count;
//! - rank 4 [B, H, S, D] directly, rank 3 [B·H, S, D] through reshapes.
//!
//! Refused: any intermediate (scores, scaled, masked, probabilities, casts) used elsewhere;
//! batch dims that broadcast between Q, K and V; mixed dtypes; a scale that is not a constant
//! scalar; a permutation of K other than the last-two swap.

use super::matchers::{binary, only_feeds, replace_node, scalar_value, single_operand};
use super::{Pass, PassReport};
use crate::ir::{DType, Graph, MaskKind, NodeId, Op, Shape};

pub struct FuseAttention;

type Reason = (&'static str, String);

fn reason<T>(code: &'static str, detail: impl Into<String>) -> Result<T, Reason> {
    Err((code, detail.into()))
}

impl Pass for FuseAttention {
    fn name(&self) -> &'static str {
        "fuse_attention"
    }

    fn run(&self, g: &mut Graph) -> PassReport {
        let mut report = PassReport::new(self.name());
        let Ok(order) = g.topo_order() else {
            return report;
        };
        for id in order {
            if !g.contains(id)
                || !matches!(g.op(id), Op::MatMul)
                || softmax_of(g, g.operands(id)[0]).is_none()
            {
                continue;
            }
            let name = g.node(id).name.clone();
            match find(g, id).and_then(|m| build(g, id, m)) {
                Ok(what) => report.rewrote(&name, what),
                Err((code, detail)) => report.skip(&name, code, detail),
            }
        }
        report
    }
}

/// The Softmax behind `p`, looking through one Cast.
fn softmax_of(g: &Graph, p: NodeId) -> Option<NodeId> {
    let p = match g.op(p) {
        Op::Cast { .. } => single_operand(g, p),
        _ => p,
    };
    matches!(g.op(p), Op::Softmax { .. }).then_some(p)
}

/// What the walk found.
struct Match {
    q: NodeId,
    k: NodeId,
    v: NodeId,
    /// K is stored [.., D, Sk] and needs a transpose.
    k_transposed: bool,
    scale: f64,
    mask: Option<MaskSource>,
    causal: Option<i64>,
    group: Option<usize>,
}

enum MaskSource {
    Additive(NodeId),
    /// True where keys are visible; `true` in the second field: true where masked.
    Boolean(NodeId, bool),
    /// A bool mask with a finite (dtype-minimum) fill: becomes an f32 additive mask.
    BooleanFill(NodeId, bool),
}

fn find(g: &Graph, pv: NodeId) -> Result<Match, Reason> {
    let [p_in, v] = g.operands(pv)[..] else {
        unreachable!("matmul has two operands")
    };
    let sm = softmax_of(g, p_in).expect("anchor checked");
    let Op::Softmax { axis } = g.op(sm) else {
        unreachable!()
    };
    let rank = g.ty(sm).shape.rank();
    if g.ty(sm).shape.axis(*axis) != Some(rank - 1) {
        return reason(
            "softmax_axis",
            format!("softmax over axis {axis}, not the key axis ({})", rank - 1),
        );
    }
    // The chain from the softmax down to Q·Kᵀ; each link must feed only the next.
    let mut chain = vec![pv, p_in];
    if p_in != sm {
        chain.push(sm);
    }
    let scores_shape = g.ty(sm).shape.clone();
    let (mut scale, mut mask, mut causal) = (1.0f64, None::<MaskSource>, None::<i64>);
    let mut cur = single_operand(g, sm);
    // A scale above a mask scales the mask too: fine for −∞ fills and a positive scale,
    // wrong for an additive mask or a finite fill.
    let (mut scale_above_mask, mut scale_above_positive) = (false, true);
    let qk = loop {
        chain.push(cur);
        match g.op(cur).clone() {
            Op::MatMul => break cur,
            Op::Cast { to } if to.is_float() => cur = single_operand(g, cur),
            Op::Binary(crate::ir::BinaryOp::Mul) => {
                let [a, b] = g.operands(cur)[..] else {
                    unreachable!()
                };
                let (c, rest) = match (scalar_value(g, a), scalar_value(g, b)) {
                    (_, Some(c)) => (c, a),
                    (Some(c), None) => (c, b),
                    (None, None) => {
                        return reason(
                            "scale_not_constant_scalar",
                            format!("%{} multiplies the scores by a tensor", g.node(cur).name),
                        )
                    }
                };
                // Peeling downward, a scale met before any mask sits above the masks.
                if mask.is_none() && causal.is_none() {
                    scale_above_mask = true;
                    scale_above_positive &= c > 0.0;
                }
                scale *= c;
                cur = rest;
            }
            Op::Binary(crate::ir::BinaryOp::Add) => {
                let [a, b] = g.operands(cur)[..] else {
                    unreachable!()
                };
                let (s, m) = if leads_to_scores(g, a) {
                    (a, b)
                } else {
                    (b, a)
                };
                if mask.is_some() {
                    return reason("two_masks", "more than one mask is applied to the scores");
                }
                if scale_above_mask {
                    return reason(
                        "scale_after_mask",
                        format!(
                            "the scores are scaled after the additive mask %{} is added",
                            g.node(m).name
                        ),
                    );
                }
                if !g.ty(m).dtype.is_float()
                    || !g.ty(m).shape.broadcasts_to(&scores_shape)
                    || g.ty(m).shape.rank() > 4
                {
                    return reason(
                        "mask_broadcast",
                        format!("mask {} would change the scores {}", g.ty(m), scores_shape),
                    );
                }
                mask = Some(MaskSource::Additive(m));
                cur = s;
            }
            Op::Where => {
                let [c, a, b] = g.operands(cur)[..] else {
                    unreachable!()
                };
                // where(keep, S, fill), or masked_fill's where(masked, fill, S).
                let (s, fill, negate) = if leads_to_scores(g, a) {
                    (a, b, false)
                } else if leads_to_scores(g, b) {
                    (b, a, true)
                } else {
                    return reason(
                        "not_attention",
                        format!("neither branch of %{} is the scores", g.node(cur).name),
                    );
                };
                let dt = g.ty(cur).dtype;
                let Some(f) = scalar_value(g, fill) else {
                    return reason(
                        "fill_not_scalar",
                        format!("%{} fills masked scores with a tensor", g.node(cur).name),
                    );
                };
                let neg_inf = f == f64::NEG_INFINITY;
                if scale_above_mask && !(neg_inf && scale_above_positive) {
                    return reason(
                        "scale_after_mask",
                        format!(
                            "the scores are scaled after %{} masks them",
                            g.node(cur).name
                        ),
                    );
                }
                if !neg_inf && f > dt.min_value() {
                    return reason(
                        "fill_not_neg_inf",
                        format!("masked scores are filled with {f}, not −∞ or the {dt} minimum"),
                    );
                }
                if !g.ty(c).shape.broadcasts_to(&scores_shape) || g.ty(c).shape.rank() > 4 {
                    return reason(
                        "mask_broadcast",
                        format!("mask {} would change the scores {}", g.ty(c), scores_shape),
                    );
                }
                let causal_off = if negate {
                    None
                } else {
                    causal_offset(g, c, &scores_shape)
                };
                if let Some(off) = causal_off {
                    if causal.is_some() {
                        return reason("two_masks", "two causal masks");
                    }
                    if !neg_inf && off < 0 {
                        return reason("fill_changes_masked_rows", "a finite fill leaves fully masked rows uniform, causal attention gives zeros");
                    }
                    causal = Some(off);
                } else {
                    if mask.is_some() {
                        return reason("two_masks", "more than one mask is applied to the scores");
                    }
                    mask = Some(if neg_inf {
                        MaskSource::Boolean(c, negate)
                    } else {
                        MaskSource::BooleanFill(c, negate)
                    });
                }
                cur = s;
            }
            _ => {
                return reason(
                    "not_attention",
                    format!(
                        "the softmax input is not built from Q·Kᵀ (found {})",
                        g.op(cur).name()
                    ),
                )
            }
        }
    };
    // Every mask was checked against the softmax's shape; that must be the scores' own shape,
    // or some mask broadcast the scores to a larger one.
    if g.ty(qk).shape != scores_shape {
        return reason(
            "mask_broadcast",
            format!(
                "the masks broadcast the scores {} to {}",
                g.ty(qk).shape,
                scores_shape
            ),
        );
    }
    for w in chain.windows(2) {
        if !only_feeds(g, w[1], w[0]) {
            return reason(
                "intermediate_has_other_consumers",
                format!("%{} is also used outside the attention", g.node(w[1]).name),
            );
        }
    }

    let [qa, kb] = g.operands(qk)[..] else {
        unreachable!()
    };
    let (q, sq) = strip_scale(g, qa, qk);
    scale *= sq;
    let (kb, sk1) = strip_scale(g, kb, qk);
    let (k, k_transposed) = match g.op(kb) {
        Op::Permute { perm } => {
            let r = perm.len();
            let swap: Vec<usize> = (0..r)
                .map(|i| {
                    if i + 2 == r {
                        r - 1
                    } else if i + 1 == r {
                        r - 2
                    } else {
                        i
                    }
                })
                .collect();
            if *perm != swap {
                return reason(
                    "k_permutation",
                    format!("K is permuted by {perm:?}, not a swap of the last two axes"),
                );
            }
            (single_operand(g, kb), false)
        }
        _ => (kb, true),
    };
    let (k, sk2) = if k_transposed {
        (k, 1.0)
    } else {
        strip_scale(g, k, kb)
    };
    scale *= sk1 * sk2;
    if !scale.is_finite() {
        return reason("scale_not_constant_scalar", "the scale is not finite");
    }

    let (mut k, mut v, mut group) = (k, v, None);
    if !k_transposed {
        if let (Some((kk, n1)), Some((vv, n2))) = (unexpand_kv(g, k), unexpand_kv(g, v)) {
            if n1 == n2 {
                (k, v, group) = (kk, vv, Some(n1));
            }
        }
    }
    let dts = [g.ty(q).dtype, g.ty(k).dtype, g.ty(v).dtype];
    if dts.iter().any(|&d| d != dts[0]) {
        return reason(
            "mixed_dtypes",
            format!("q, k, v are {}, {}, {}", dts[0], dts[1], dts[2]),
        );
    }
    check_batch(g, q, k, v, k_transposed, group)?;
    Ok(Match {
        q,
        k,
        v,
        k_transposed,
        scale,
        mask,
        causal,
        group,
    })
}

/// `x · c` with c a scalar constant, absorbed when the product only feeds `user`.
fn strip_scale(g: &Graph, id: NodeId, user: NodeId) -> (NodeId, f64) {
    if let Some((a, b)) = binary(g, id, crate::ir::BinaryOp::Mul) {
        if only_feeds(g, id, user) {
            if let Some(c) = scalar_value(g, b) {
                return (a, c);
            }
            if let Some(c) = scalar_value(g, a) {
                return (b, c);
            }
        }
    }
    (id, 1.0)
}

/// Whether `id` is (through scales, masks and casts, a few levels deep) the Q·Kᵀ product.
fn leads_to_scores(g: &Graph, id: NodeId) -> bool {
    fn walk(g: &Graph, id: NodeId, depth: usize) -> bool {
        if depth == 0 {
            return false;
        }
        match g.op(id) {
            Op::MatMul => true,
            Op::Cast { .. } => walk(g, single_operand(g, id), depth - 1),
            Op::Binary(crate::ir::BinaryOp::Mul | crate::ir::BinaryOp::Add) => {
                g.operands(id).into_iter().any(|o| walk(g, o, depth - 1))
            }
            Op::Where => walk(g, g.operands(id)[1], depth - 1),
            _ => false,
        }
    }
    walk(g, id, 8)
}

/// The offset of a causal mask over the scores' [Sq, Sk]: a CausalMask node, or a constant
/// bool lower-triangular matrix.
fn causal_offset(g: &Graph, c: NodeId, scores: &Shape) -> Option<i64> {
    let r = scores.rank();
    let (sq, sk) = (scores.dims()[r - 2], scores.dims()[r - 1]);
    let shape = &g.ty(c).shape;
    let lead_ones = shape.dims().iter().rev().skip(2).all(|&d| d == 1);
    if shape.rank() < 2 || !lead_ones || shape.dims()[shape.rank() - 2..] != [sq, sk] {
        return None;
    }
    match g.op(c) {
        Op::CausalMask { offset, .. } => Some(*offset),
        Op::Constant {
            dtype: DType::Bool,
            values,
            ..
        } if values.len() == sq * sk => {
            let row_count = |q: usize| {
                values[q * sk..(q + 1) * sk]
                    .iter()
                    .filter(|&&v| v != 0.0)
                    .count()
            };
            let q0 = (0..sq).find(|&q| row_count(q) > 0)?;
            let off = row_count(q0) as i64 - 1 - q0 as i64;
            let ok = (0..sq).all(|q| {
                (0..sk).all(|k| (values[q * sk + k] != 0.0) == (k as i64 <= q as i64 + off))
            });
            ok.then_some(off)
        }
        _ => None,
    }
}

/// LLaMA's repeat_kv read backwards: `reshape(expand(reshape(kv)))` that inserts a head-group
/// axis after the KV-head axis, expands only it, and merges it back. Returns kv and the group.
fn unexpand_kv(g: &Graph, id: NodeId) -> Option<(NodeId, usize)> {
    let Op::Reshape { .. } = g.op(id) else {
        return None;
    };
    let e = single_operand(g, id);
    let Op::Expand { .. } = g.op(e) else {
        return None;
    };
    let r = single_operand(g, e);
    let Op::Reshape { .. } = g.op(r) else {
        return None;
    };
    let kv = single_operand(g, r);
    let (kvs, rs, es, out) = (
        g.ty(kv).shape.dims(),
        g.ty(r).shape.dims(),
        g.ty(e).shape.dims(),
        g.ty(id).shape.dims(),
    );
    let [b, h, s, d] = kvs[..] else { return None };
    let n = *es.get(2)?;
    let ok = rs == [b, h, 1, s, d] && es == [b, h, n, s, d] && out == [b, h * n, s, d] && n >= 1;
    ok.then_some((kv, n))
}

fn check_batch(
    g: &Graph,
    q: NodeId,
    k: NodeId,
    v: NodeId,
    k_transposed: bool,
    group: Option<usize>,
) -> Result<(), Reason> {
    let (qs, ks, vs) = (
        g.ty(q).shape.dims(),
        g.ty(k).shape.dims(),
        g.ty(v).shape.dims(),
    );
    let r = qs.len();
    if !(3..=4).contains(&r) || ks.len() != r || vs.len() != r {
        return reason(
            "rank",
            format!(
                "q, k, v of ranks {}, {}, {}: only [B, H, S, D] and [B·H, S, D] fuse",
                r,
                ks.len(),
                vs.len()
            ),
        );
    }
    let n = group.unwrap_or(1);
    let mut kb = ks[..r - 2].to_vec();
    let mut vb = vs[..r - 2].to_vec();
    if r == 4 {
        kb[1] *= n;
        vb[1] *= n;
    }
    if qs[..r - 2] != kb[..] || qs[..r - 2] != vb[..] {
        return reason(
            "batch_broadcast",
            format!(
                "batch dims of q {:?}, k {:?}, v {:?} differ",
                &qs[..r - 2],
                &ks[..r - 2],
                &vs[..r - 2]
            ),
        );
    }
    let (kd, ksk) = if k_transposed {
        (ks[r - 2], ks[r - 1])
    } else {
        (ks[r - 1], ks[r - 2])
    };
    if kd != qs[r - 1] || ksk != vs[r - 2] {
        return reason(
            "shape_mismatch",
            format!(
                "q·kᵀ contracts D {} with {}, p·v Sk {} with {}",
                qs[r - 1],
                kd,
                ksk,
                vs[r - 2]
            ),
        );
    }
    Ok(())
}

fn build(g: &mut Graph, pv: NodeId, m: Match) -> Result<String, Reason> {
    let err = |e: crate::ir::GraphError| ("build_failed", e.to_string());
    let rank = g.ty(m.q).shape.rank();
    let mut k = m.k;
    if m.k_transposed {
        k = g.transpose_last(k).map_err(err)?;
    }
    // masked_fill's condition is true where masked: the kept keys are its negation.
    let keep = |g: &mut Graph, c: NodeId, negate: bool| -> Result<NodeId, crate::ir::GraphError> {
        if !negate {
            return Ok(c);
        }
        let no = g.constant(DType::Bool, &[], vec![0.0])?;
        g.equal(c, no)
    };
    let mut mask = match m.mask {
        None => None,
        Some(MaskSource::Additive(x)) => Some(x),
        Some(MaskSource::Boolean(c, negate)) => Some(keep(g, c, negate).map_err(err)?),
        Some(MaskSource::BooleanFill(c, negate)) => {
            let c = keep(g, c, negate).map_err(err)?;
            // In f32 (where kernels add the mask) the f32 minimum swamps any score, so a fully
            // masked row stays uniform as with the original fill; an f16 minimum would not.
            let zero = g.scalar(0.0, DType::F32).map_err(err)?;
            let fill = g.scalar(DType::F32.min_value(), DType::F32).map_err(err)?;
            Some(g.where_(c, zero, fill).map_err(err)?)
        }
    };
    let (mut q, mut v) = (m.q, m.v);
    if rank == 3 {
        let lift = |g: &mut Graph, x: NodeId| {
            let mut dims: Vec<i64> = vec![1];
            dims.extend(g.ty(x).shape.dims().iter().map(|&d| d as i64));
            g.reshape(x, &dims)
        };
        q = lift(g, q).map_err(err)?;
        k = lift(g, k).map_err(err)?;
        v = lift(g, v).map_err(err)?;
    }
    if let Some(mm) = mask {
        let mr = g.ty(mm).shape.rank();
        if mr < 4 && rank == 3 {
            let mut dims: Vec<i64> = vec![1; 4 - mr];
            dims.extend(g.ty(mm).shape.dims().iter().map(|&d| d as i64));
            mask = Some(g.reshape(mm, &dims).map_err(err)?);
        }
    }
    let fa = g
        .flash_attention(q, k, v, mask, m.scale, m.causal)
        .map_err(err)?;
    let out = if rank == 3 {
        let dims: Vec<i64> = g.ty(pv).shape.dims().iter().map(|&d| d as i64).collect();
        g.reshape(fa, &dims).map_err(err)?
    } else {
        fa
    };
    if g.ty(out) != g.ty(pv) {
        return reason(
            "dtype_changes",
            format!("fused result {} differs from {}", g.ty(out), g.ty(pv)),
        );
    }
    let (hq, hkv) = {
        let s = g.ty(q).shape.dims().to_vec();
        (s[1], g.ty(k).shape.dims()[1])
    };
    let mut what = format!("flash_attention (scale {:.6}", m.scale);
    if let Some(off) = m.causal {
        what.push_str(&format!(", causal offset {off}"));
    }
    if let Some(mm) = mask {
        let kind = if g.ty(mm).dtype == DType::Bool {
            MaskKind::Boolean
        } else {
            MaskKind::Additive
        };
        what.push_str(&format!(", {kind:?} mask {}", g.ty(mm).shape).to_lowercase());
    }
    if m.group.is_some() {
        what.push_str(&format!(", GQA {hq} query / {hkv} kv heads"));
    }
    what.push(')');
    replace_node(g, pv, out);
    Ok(what)
}
