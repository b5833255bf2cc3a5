//! Q, K and V behind Q·Kᵀ and the PV matmul.
//!
//! Q·Kᵀ is `matmul(Q, Kᵀ)`, each side optionally scaled by a scalar constant (read as its
//! dtype holds it, absorbed only where the product feeds nothing else). Kᵀ is:
//! - `permute(K, swap of the last two axes)`: K is [.., Sk, D];
//! - `permute(X, [0, 2, 3, 1])` (old GPT-2; generally the head-split permutation, axes r−3 and
//!   r−2 swapped, followed by the last-two swap): K is `permute(X, [0, 2, 1, 3])`;
//! - anything that is not a permute, or the identity permute: K stored [.., D, Sk].
//!
//! Any other permutation is refused: it reads another head's or batch's K, which the fused op's
//! per-head attention would not. K and V expanded alike over a head-group axis by
//! Reshape → Expand → Reshape (LLaMA's repeat_kv) may be read un-expanded (GQA/MQA). Refused:
//! batch axes that broadcast (between Q, K and the scores, or between the probabilities and V),
//! mixed dtypes, ranks other than 3 and 4.

use super::scores::Scores;
use super::{reason, Reason};
use crate::ir::{BinaryOp, Graph, NodeId, Op};
use crate::passes::matchers::{held_scalar_value, single_operand, Live};

/// How K is laid out, and what the rewrite does to read it as [.., Sk, D].
pub(super) enum KLayout {
    /// Already [.., Sk, D].
    Rows,
    /// Stored [.., D, Sk]: transposed.
    Columns,
    /// Stored before the head split: permuted by this permutation.
    HeadSplit(Vec<usize>),
}

pub(super) struct Operands {
    pub q: NodeId,
    pub k: NodeId,
    pub layout: KLayout,
    pub v: NodeId,
    /// The scale constants on Q and K.
    pub scale: f64,
    /// Q's batch axes.
    pub batch: Vec<usize>,
    /// K and V before a repeat_kv that expanded both by the same group, and the group.
    pub unexpanded: Option<(NodeId, NodeId, usize)>,
}

pub(super) fn read(g: &Graph, live: &Live, pv: NodeId, s: &Scores) -> Result<Operands, Reason> {
    let ([qa, kb], [_, v]) = (&g.operands(s.qk)[..], &g.operands(pv)[..]) else {
        return reason("not_attention", "a matmul without two operands");
    };
    let (qa, kb, v) = (*qa, *kb, *v);
    let (q, scale_q) = strip_scale(g, live, qa, s.qk);
    let (kt, scale_kt) = strip_scale(g, live, kb, s.qk);
    let (k, layout, scale_k) = k_layout(g, live, kt)?;
    let dts = [g.ty(q).dtype, g.ty(k).dtype, g.ty(v).dtype];
    if dts.iter().any(|&d| d != dts[0]) {
        return reason(
            "mixed_dtypes",
            format!("q, k, v are {}, {}, {}", dts[0], dts[1], dts[2]),
        );
    }
    let qs = g.ty(q).shape.dims().to_vec();
    let ks = rows_shape(g.ty(k).shape.dims(), &layout);
    let vs = g.ty(v).shape.dims().to_vec();
    let (r, vr) = (qs.len(), vs.len());
    if !(3..=4).contains(&r) || ks.len() != r || !(3..=4).contains(&vr) {
        return reason(
            "rank",
            format!(
                "q, k, v of ranks {r}, {}, {vr}: only [B, H, S, D] and [B·H, S, D] fuse",
                ks.len()
            ),
        );
    }
    let batch = |d: &[usize]| d[..d.len().saturating_sub(2)].to_vec();
    let scores_batch = batch(g.ty(s.qk).shape.dims());
    if batch(&qs) != scores_batch || batch(&ks) != scores_batch {
        return reason(
            "batch_broadcast",
            format!(
                "batch axes of q {:?} and k {:?} differ: the matmul broadcasts them",
                batch(&qs),
                batch(&ks)
            ),
        );
    }
    let p_batch = batch(g.ty(s.p).shape.dims());
    if batch(&vs) != p_batch {
        return reason(
            "batch_broadcast",
            format!(
                "batch axes of the probabilities {p_batch:?} and v {:?} differ: the matmul \
                 broadcasts them",
                batch(&vs)
            ),
        );
    }
    if qs[r - 1] != ks[r - 1] || ks[r - 2] != vs[vr - 2] {
        return reason(
            "shape_mismatch",
            format!(
                "q·kᵀ contracts D {} with {}, p·v Sk {} with {}",
                qs[r - 1],
                ks[r - 1],
                ks[r - 2],
                vs[vr - 2]
            ),
        );
    }
    let unexpanded = match (&layout, r, vr) {
        (KLayout::Rows, 4, 4) => match (unexpand_kv(g, k), unexpand_kv(g, v)) {
            (Some((kk, n1)), Some((vv, n2))) if n1 == n2 => Some((kk, vv, n1)),
            _ => None,
        },
        _ => None,
    };
    Ok(Operands {
        q,
        k,
        layout,
        v,
        scale: scale_q * scale_kt * scale_k,
        batch: batch(&qs),
        unexpanded,
    })
}

/// `x · c` or `x / c` with c a finite scalar constant, absorbed when the product only feeds
/// `user` and has x's shape.
fn strip_scale(g: &Graph, live: &Live, id: NodeId, user: NodeId) -> (NodeId, f64) {
    if !live.only_feeds(g, id, user) {
        return (id, 1.0);
    }
    let held = |x: NodeId| held_scalar_value(g, x);
    let found = match (g.op(id), &g.operands(id)[..]) {
        (Op::Binary(BinaryOp::Mul), &[a, b]) => {
            held(b).map(|c| (a, c)).or_else(|| held(a).map(|c| (b, c)))
        }
        (Op::Binary(BinaryOp::Div), &[a, b]) => held(b).map(|c| (a, 1.0 / c)),
        _ => None,
    };
    match found {
        Some((x, c)) if c.is_finite() && g.ty(x).shape == g.ty(id).shape => (x, c),
        _ => (id, 1.0),
    }
}

/// K and its layout behind Kᵀ, with a scale between the permute and K.
fn k_layout(g: &Graph, live: &Live, kt: NodeId) -> Result<(NodeId, KLayout, f64), Reason> {
    let Op::Permute { perm } = g.op(kt) else {
        return Ok((kt, KLayout::Columns, 1.0));
    };
    let r = perm.len();
    let identity: Vec<usize> = (0..r).collect();
    let swap_last = |p: &[usize]| {
        let mut p = p.to_vec();
        if r >= 2 {
            p.swap(r - 2, r - 1);
        }
        p
    };
    // Kᵀ = transpose_last(permute(X, rows)).
    let rows = swap_last(perm);
    let head_split = (r >= 3).then(|| {
        let mut p = identity.clone();
        p.swap(r - 3, r - 2);
        p
    });
    let layout = if *perm == identity {
        KLayout::Columns
    } else if rows == identity {
        KLayout::Rows
    } else if Some(&rows) == head_split.as_ref() {
        KLayout::HeadSplit(rows)
    } else {
        let mut accepted = format!("{:?}", swap_last(&identity));
        if let Some(h) = &head_split {
            accepted.push_str(&format!(" or, for the head-split K, {:?}", swap_last(h)));
        }
        return reason(
            "k_permutation",
            format!(
                "K is permuted by {perm:?}, which reads another head's or batch's keys: Kᵀ \
                 must be {accepted}"
            ),
        );
    };
    let (k, scale) = strip_scale(g, live, single_operand(g, kt), kt);
    Ok((k, layout, scale))
}

/// K's shape as [.., Sk, D] once the rewrite has laid it out.
fn rows_shape(dims: &[usize], layout: &KLayout) -> Vec<usize> {
    match layout {
        KLayout::Rows => dims.to_vec(),
        KLayout::Columns => {
            let mut d = dims.to_vec();
            let r = d.len();
            if r >= 2 {
                d.swap(r - 2, r - 1);
            }
            d
        }
        KLayout::HeadSplit(perm) => perm.iter().map(|&p| dims[p]).collect(),
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
    let ok = rs == [b, h, 1, s, d]
        && es == [b, h, n, s, d]
        && Some(out) == h.checked_mul(n).map(|hn| vec![b, hn, s, d]).as_deref()
        && n >= 1;
    ok.then_some((kv, n))
}
