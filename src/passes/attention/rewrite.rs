//! Replaces the PV matmul by a FlashAttention over Q, K, V viewed in the chosen batch axes.

use super::frame::source_node;
use super::operands::KLayout;
use super::scores::MaskSource;
use super::{reason, Match, Reason};
use crate::ir::{DType, Graph, GraphError, MaskKind, NodeId};
use crate::passes::matchers::replace_node;

fn failed(e: GraphError) -> Reason {
    ("build_failed", e.to_string())
}

/// `x` reshaped to `dims` unless it has that shape already.
fn view(g: &mut Graph, x: NodeId, dims: &[usize]) -> Result<NodeId, Reason> {
    if g.ty(x).shape.dims() == dims {
        return Ok(x);
    }
    let dims: Vec<i64> = dims
        .iter()
        .map(|&d| i64::try_from(d))
        .collect::<Result<_, _>>()
        .map_err(|e| ("build_failed", format!("a size does not fit an i64: {e}")))?;
    g.reshape(x, &dims).map_err(failed)
}

/// `x` [.., R, C] viewed as [B, H, R, C] in the frame.
fn in_frame(g: &mut Graph, x: NodeId, batch: [usize; 2]) -> Result<NodeId, Reason> {
    let d = g.ty(x).shape.dims();
    let r = d.len();
    let dims = [batch[0], batch[1], d[r - 2], d[r - 1]];
    view(g, x, &dims)
}

/// The mask the fused op reads, from the mask as the graph applies it.
fn mask_operand(g: &mut Graph, source: &MaskSource) -> Result<NodeId, GraphError> {
    // masked_fill's condition is true where masked: the kept keys are its negation.
    let keep = |g: &mut Graph, c: NodeId, negate: bool| -> Result<NodeId, GraphError> {
        if !negate {
            return Ok(c);
        }
        let no = g.constant(DType::Bool, &[], vec![0.0])?;
        g.equal(c, no)
    };
    match *source {
        MaskSource::Additive(x) => Ok(x),
        MaskSource::Boolean(c, negate) => keep(g, c, negate),
        MaskSource::BooleanFill(c, negate) => {
            let c = keep(g, c, negate)?;
            // In f32 (where kernels add the mask) the f32 minimum swamps any score, so a fully
            // masked row stays uniform as with the original fill; an f16 minimum would not.
            let zero = g.scalar(0.0, DType::F32)?;
            let fill = g.scalar(DType::F32.min_value(), DType::F32)?;
            g.where_(c, zero, fill)
        }
    }
}

pub(super) fn build(g: &mut Graph, pv: NodeId, m: &Match) -> Result<String, Reason> {
    let (ops, frame) = (&m.operands, &m.frame);
    let k = match (frame.group, &ops.layout) {
        (Some((k, _, _)), _) => k,
        (None, KLayout::Rows) => ops.k,
        (None, KLayout::Columns) => g.transpose_last(ops.k).map_err(failed)?,
        (None, KLayout::HeadSplit(perm)) => g.permute(ops.k, perm).map_err(failed)?,
    };
    let mask = match &m.scores.mask {
        Some(applied) => Some(mask_operand(g, &applied.source).map_err(failed)?),
        None => None,
    };
    let q = in_frame(g, ops.q, frame.batch)?;
    let (k, v) = match frame.group {
        Some((_, v, _)) => (k, v),
        None => (
            in_frame(g, k, frame.batch)?,
            in_frame(g, ops.v, frame.batch)?,
        ),
    };
    let mask = match (mask, &frame.mask_view) {
        (Some(x), Some(dims)) => Some(view(g, x, dims)?),
        (mask, _) => mask,
    };
    let fa = g
        .flash_attention(q, k, v, mask, m.scale, m.scores.causal)
        .map_err(failed)?;
    let want = g.ty(pv).shape.dims().to_vec();
    let out = view(g, fa, &want)?;
    if g.ty(out) != g.ty(pv) {
        return reason(
            "dtype_changes",
            format!("fused result {} differs from {}", g.ty(out), g.ty(pv)),
        );
    }
    let mut what = format!("flash_attention (scale {:.6}", m.scale);
    if let Some(off) = m.scores.causal {
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
    if frame.group.is_some() {
        let (hq, hkv) = (g.ty(q).shape.dims()[1], g.ty(k).shape.dims()[1]);
        what.push_str(&format!(", GQA {hq} query / {hkv} kv heads"));
    }
    if let (Some(applied), true) = (&m.scores.mask, frame.regrouped) {
        what.push_str(&format!(
            ", heads regrouped as in %{}'s view {}",
            g.node(source_node(&applied.source)).name,
            applied.view
        ));
    }
    what.push(')');
    replace_node(g, pv, out);
    Ok(what)
}
