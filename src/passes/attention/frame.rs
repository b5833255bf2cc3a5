//! The fused op's batch axes [B, H], chosen so every mask means in it what it meant in the graph.
//!
//! Views of the scores only regroup their batch axes and keep rows in order, so one flat batch
//! index names the same Q rows, K, V and output rows in every view. The fused op takes Q's
//! batch axes (`[1, B·H]` for 3-D attention) — unless the mask broadcasts over only some batch
//! axes of the view it is applied in (fairseq's `[B, 1, 1, Sk]` on scores viewed `[B, H, Sq, Sk]`):
//! then it takes that view's, and Q, K and V are viewed alike. A mask that is constant over the
//! batch, or has one entry per batch index, means the same in any view (viewed to match).

use super::operands::Operands;
use super::scores::{MaskSource, Scores};
use super::{reason, Reason};
use crate::ir::{Graph, NodeId, Shape};

pub(super) struct Frame {
    pub batch: [usize; 2],
    /// K and V read un-expanded, and the group (GQA): only in Q's own batch axes.
    pub group: Option<(NodeId, NodeId, usize)>,
    /// The shape the mask is viewed as, when it is not read as it is.
    pub mask_view: Option<Vec<usize>>,
    /// Whether the batch axes are a mask's view rather than Q's own.
    pub regrouped: bool,
}

/// How a mask's batch axes relate to those of the scores it is applied to.
enum Spread {
    /// Size 1 on every batch axis.
    Uniform,
    /// The view's own batch axes.
    PerBatch,
    /// Broadcast over some of them.
    Partial,
}

pub(super) fn choose(g: &Graph, s: &Scores, ops: &Operands) -> Result<Frame, Reason> {
    let own = match ops.batch[..] {
        [bh] => [1, bh],
        [b, h] => [b, h],
        _ => {
            return reason(
                "rank",
                format!("q has batch axes {:?}: only one or two fuse", ops.batch),
            )
        }
    };
    let (batch, mask_view) = match &s.mask {
        None => (own, None),
        Some(m) => {
            let node = source_node(&m.source);
            let shape = &g.ty(node).shape;
            let (spread, tail) = spread(shape, &m.view);
            let view_batch = &m.view.dims()[..m.view.rank() - 2];
            match spread {
                Spread::Uniform if shape.rank() <= 4 => (own, None),
                Spread::Uniform => (own, Some(tail.to_vec())),
                Spread::PerBatch => {
                    let want = vec![own[0], own[1], tail[0], tail[1]];
                    let view = (shape.dims() != want).then_some(want);
                    (own, view)
                }
                Spread::Partial => match view_batch[..] {
                    [b, h] => ([b, h], None),
                    _ => {
                        return reason(
                            "rank",
                            format!(
                                "the mask {} broadcasts over some of the batch axes {:?} of the \
                                 scores it masks: the fused op has two",
                                m.view, view_batch
                            ),
                        )
                    }
                },
            }
        }
    };
    Ok(Frame {
        batch,
        group: ops.unexpanded.filter(|_| batch == own),
        mask_view,
        regrouped: batch != own,
    })
}

pub(super) fn source_node(m: &MaskSource) -> NodeId {
    match *m {
        MaskSource::Additive(x) | MaskSource::Boolean(x, _) | MaskSource::BooleanFill(x, _) => x,
    }
}

/// How `mask` spreads over the batch axes of `view` (which it broadcasts to unchanged), and
/// its last two sizes.
fn spread(mask: &Shape, view: &Shape) -> (Spread, [usize; 2]) {
    let rv = view.rank();
    let padded: Vec<usize> = std::iter::repeat_n(1, rv.saturating_sub(mask.rank()))
        .chain(mask.dims().iter().copied())
        .collect();
    let (batch, tail) = padded.split_at(rv - 2);
    let tail = [tail[0], tail[1]];
    let spread = if batch.iter().all(|&d| d == 1) {
        Spread::Uniform
    } else if batch == &view.dims()[..rv - 2] {
        Spread::PerBatch
    } else {
        Spread::Partial
    };
    (spread, tail)
}
