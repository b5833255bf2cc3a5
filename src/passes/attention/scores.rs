//! The links between the two matmuls, read from the PV matmul down to Q·Kᵀ.
//!
//! Above the softmax: casts and views of the probabilities. Below it, in any order: casts,
//! views, scales, one additive or boolean mask and one causal mask. What each link must not be:
//! - a cast other than a widening to f32 or a narrowing of f32 back to the attention dtype
//!   (f32 → f16 → f32 in an f32 attention, f16 ↔ bf16, to an integer or bool change values);
//! - a view that moves scores between rows or keys (only the axes before [Sq, Sk] regroup);
//! - a scale that is not a scalar constant, or that broadcasts the scores to another shape;
//! - a mask that broadcasts the scores to another shape; a `where` fill other than −∞ or the
//!   dtype minimum (read as the dtype holds it: an f32 −1e39 is −∞);
//! - a scale above an additive mask or a finite fill (it would scale the mask), or a negative
//!   scale above a −∞ fill;
//! - a finite-fill causal mask beside another mask, or a finite-fill mask above a causal one:
//!   rows the two mask together keep equal scores in the graph, so they average other keys than
//!   the fused op, which masks by −∞;
//! - a link with another live consumer, or that is a graph output.

use std::collections::HashMap;

use super::{reason, Reason};
use crate::ir::{BinaryOp, DType, Graph, NodeId, Op, Shape};
use crate::passes::matchers::{held_scalar_value, single_operand, Live};

/// A mask as the graph applies it.
pub(super) enum MaskSource {
    Additive(NodeId),
    /// A bool condition, true where keys are visible; `true` in the second field: true where
    /// masked (masked_fill), so the visible keys are its negation.
    Boolean(NodeId, bool),
    /// A bool condition with a finite (dtype-minimum) fill: the fused op adds an f32
    /// `where(cond, 0, f32::MIN)`, which swamps any score in f32 and so keeps a fully masked row
    /// uniform, as the graph's fill does.
    BooleanFill(NodeId, bool),
}

pub(super) struct AppliedMask {
    pub source: MaskSource,
    /// The shape of the scores where the mask is applied: it broadcasts in that view.
    pub view: Shape,
    /// How far down from the PV matmul it sits.
    depth: usize,
}

struct Causal {
    offset: i64,
    finite_fill: bool,
    depth: usize,
    node: NodeId,
}

pub(super) struct Scores {
    /// The Q·Kᵀ matmul.
    pub qk: NodeId,
    /// The probabilities as the PV matmul reads them.
    pub p: NodeId,
    pub scale: f64,
    pub mask: Option<AppliedMask>,
    pub causal: Option<i64>,
}

/// Reads the links below the PV matmul `pv`. The attention's dtype is V's: what the fused op
/// produces, so the only dtype a cast may narrow back to.
pub(super) fn read(g: &Graph, live: &Live, pv: NodeId) -> Result<Scores, Reason> {
    let [p, v] = g.operands(pv)[..] else {
        return reason("not_attention", "the matmul does not have two operands");
    };
    let dtype = g.ty(v).dtype;
    let mut walk = Walk {
        g,
        dtype,
        links: vec![pv],
        scale: 1.0,
        scales_positive: None,
        mask: None,
        causal: None,
        from_scores: FromScores::new(g),
    };
    let mut cur = p;
    let mut below_softmax = false;
    let qk = loop {
        walk.links.push(cur);
        cur = match g.op(cur) {
            Op::MatMul if below_softmax => break cur,
            Op::Softmax { axis } if !below_softmax => {
                let shape = &g.ty(cur).shape;
                let last = shape.rank().saturating_sub(1);
                if shape.axis(*axis) != Some(last) {
                    return reason(
                        "softmax_axis",
                        format!(
                            "%{} is over axis {axis}, not the key axis ({last})",
                            g.node(cur).name
                        ),
                    );
                }
                below_softmax = true;
                single_operand(g, cur)
            }
            Op::Cast { .. } => walk.cast(cur)?,
            Op::Reshape { .. } => walk.view(cur)?,
            Op::Binary(BinaryOp::Mul) if below_softmax => walk.mul(cur)?,
            Op::Binary(BinaryOp::Div) if below_softmax => walk.div(cur)?,
            Op::Binary(BinaryOp::Add) if below_softmax => walk.add(cur)?,
            Op::Where if below_softmax => walk.where_(cur)?,
            Op::Permute { .. } | Op::Expand { .. } => {
                return reason(
                    "scores_layout",
                    format!(
                        "%{} ({}) moves the scores {} to {}: only views that keep each row of \
                         scores whole fuse",
                        g.node(cur).name,
                        g.op(cur).name(),
                        g.ty(single_operand(g, cur)).shape,
                        g.ty(cur).shape
                    ),
                )
            }
            op => {
                return reason(
                    "not_attention",
                    format!(
                        "the {} is not built from Q·Kᵀ (found %{}, a {})",
                        if below_softmax {
                            "softmax input"
                        } else {
                            "matmul's left operand"
                        },
                        g.node(cur).name,
                        op.name()
                    ),
                )
            }
        };
    };
    walk.check_mask_pair()?;
    for w in walk.links.windows(2) {
        let (user, x) = (w[0], w[1]);
        if !live.only_feeds(g, x, user) {
            return reason(
                "intermediate_has_other_consumers",
                other_uses(g, live, x, user),
            );
        }
    }
    Ok(Scores {
        qk,
        p,
        scale: walk.scale,
        mask: walk.mask,
        causal: walk.causal.map(|c| c.offset),
    })
}

/// Says who else uses `x`: live consumers by name, or the graph's outputs.
fn other_uses(g: &Graph, live: &Live, x: NodeId, user: NodeId) -> String {
    let name = |id: NodeId| format!("%{}", g.node(id).name);
    let mut uses: Vec<String> = live
        .other_consumers(g, x, user)
        .into_iter()
        .map(name)
        .collect();
    if g.is_output(x) {
        uses.push("a graph output".into());
    }
    if uses.is_empty() {
        uses.push(format!("{} a second time", name(user)));
    }
    format!(
        "{} is also used by {}, outside the attention",
        name(x),
        uses.join(", ")
    )
}

/// The state of the walk down the links.
struct Walk<'g> {
    g: &'g Graph,
    /// The attention's dtype (V's).
    dtype: DType,
    /// From the PV matmul down; each must feed only the one before it.
    links: Vec<NodeId>,
    scale: f64,
    /// Whether every scale met so far (above the current link) was positive; None: none met.
    scales_positive: Option<bool>,
    mask: Option<AppliedMask>,
    causal: Option<Causal>,
    from_scores: FromScores<'g>,
}

impl Walk<'_> {
    fn name(&self, id: NodeId) -> String {
        format!("%{}", self.g.node(id).name)
    }

    fn depth(&self) -> usize {
        self.links.len()
    }

    /// Widening a float to f32 is exact; narrowing f32 to the attention dtype rounds as that
    /// dtype does anyway (the fused op keeps f32 and rounds its result). Any other cast changes
    /// values the fused op would not.
    fn cast(&self, id: NodeId) -> Result<NodeId, Reason> {
        let (g, t) = (self.g, self.dtype);
        let x = single_operand(g, id);
        let (from, to) = (g.ty(x).dtype, g.ty(id).dtype);
        let widens = from.is_float() && to == DType::F32;
        if !(from == to || widens || (from == DType::F32 && to == t)) {
            let allowed = if t == DType::F32 {
                "widening f16/bf16 to f32".to_string()
            } else {
                format!("widening to f32 and narrowing f32 back to {t}")
            };
            return reason(
                "cast_changes_values",
                format!(
                    "{} casts {from} → {to} between the matmuls of a {t} attention, which \
                     changes values the fused op keeps (it reads only {allowed})",
                    self.name(id)
                ),
            );
        }
        Ok(x)
    }

    /// A reshape that keeps [Sq, Sk] and the number of rows only regroups the batch axes: every
    /// row of scores stays whole and in order.
    fn view(&self, id: NodeId) -> Result<NodeId, Reason> {
        let g = self.g;
        let x = single_operand(g, id);
        let (from, to) = (&g.ty(x).shape, &g.ty(id).shape);
        if !keeps_rows(from, to) {
            return reason(
                "scores_layout",
                format!(
                    "{} reshapes the scores {from} to {to}, moving scores between rows or keys: \
                     only reshapes that regroup the axes before [Sq, Sk] fuse",
                    self.name(id)
                ),
            );
        }
        Ok(x)
    }

    fn mul(&mut self, id: NodeId) -> Result<NodeId, Reason> {
        let g = self.g;
        let [a, b] = g.operands(id)[..] else {
            return reason("not_attention", "mul without two operands");
        };
        let (c, rest) = match (held_scalar_value(g, a), held_scalar_value(g, b)) {
            (_, Some(c)) => (c, a),
            (Some(c), None) => (c, b),
            (None, None) => {
                return reason(
                    "scale_not_constant_scalar",
                    format!(
                        "{} multiplies the scores by a tensor, not a scalar constant",
                        self.name(id)
                    ),
                )
            }
        };
        self.scale_by(id, rest, c)
    }

    fn div(&mut self, id: NodeId) -> Result<NodeId, Reason> {
        let g = self.g;
        let [a, b] = g.operands(id)[..] else {
            return reason("not_attention", "div without two operands");
        };
        match (held_scalar_value(g, a), held_scalar_value(g, b)) {
            (_, Some(c)) => self.scale_by(id, a, 1.0 / c),
            (Some(_), None) => reason(
                "not_attention",
                format!(
                    "{} divides a constant by the scores (a div, not a scale)",
                    self.name(id)
                ),
            ),
            (None, None) => reason(
                "scale_not_constant_scalar",
                format!(
                    "{} divides the scores by a tensor, not a scalar constant",
                    self.name(id)
                ),
            ),
        }
    }

    fn scale_by(&mut self, id: NodeId, rest: NodeId, c: f64) -> Result<NodeId, Reason> {
        let g = self.g;
        if g.ty(id).shape != g.ty(rest).shape {
            return reason(
                "scale_broadcast",
                format!(
                    "{} broadcasts the scores {} to {}",
                    self.name(id),
                    g.ty(rest).shape,
                    g.ty(id).shape
                ),
            );
        }
        self.scale *= c;
        self.scales_positive = Some(self.scales_positive.unwrap_or(true) && c > 0.0);
        Ok(rest)
    }

    fn add(&mut self, id: NodeId) -> Result<NodeId, Reason> {
        let g = self.g;
        let [a, b] = g.operands(id)[..] else {
            return reason("not_attention", "add without two operands");
        };
        let (s, m) = if self.from_scores.check(a) {
            (a, b)
        } else if self.from_scores.check(b) {
            (b, a)
        } else {
            return reason(
                "not_attention",
                format!("neither operand of {} is built from Q·Kᵀ", self.name(id)),
            );
        };
        if self.mask.is_some() {
            return reason("two_masks", "more than one mask is applied to the scores");
        }
        if self.scales_positive.is_some() {
            return reason(
                "scale_after_mask",
                format!(
                    "the scores are scaled after the additive mask {} is added",
                    self.name(m)
                ),
            );
        }
        self.same_shape(id, s, &[m])?;
        self.mask = Some(AppliedMask {
            source: MaskSource::Additive(m),
            view: g.ty(s).shape.clone(),
            depth: self.depth(),
        });
        Ok(s)
    }

    fn where_(&mut self, id: NodeId) -> Result<NodeId, Reason> {
        let g = self.g;
        let [c, a, b] = g.operands(id)[..] else {
            return reason("not_attention", "where without three operands");
        };
        // where(keep, S, fill), or masked_fill's where(masked, fill, S).
        let (s, fill, negate) = if self.from_scores.check(a) {
            (a, b, false)
        } else if self.from_scores.check(b) {
            (b, a, true)
        } else {
            return reason(
                "not_attention",
                format!("neither branch of {} is built from Q·Kᵀ", self.name(id)),
            );
        };
        let dt = g.ty(id).dtype;
        let Some(f) = held_scalar_value(g, fill) else {
            return reason(
                "fill_not_scalar",
                format!("{} fills masked scores with a tensor", self.name(id)),
            );
        };
        let neg_inf = f == f64::NEG_INFINITY;
        // NaN is neither.
        let dtype_min = f.is_finite() && f <= dt.min_value();
        if !neg_inf && !dtype_min {
            return reason(
                "fill_not_neg_inf",
                format!(
                    "{} fills masked scores with {f} (as {dt} holds it), not −∞ or the {dt} minimum",
                    self.name(id)
                ),
            );
        }
        if let Some(positive) = self.scales_positive {
            if !(neg_inf && positive) {
                return reason(
                    "scale_after_mask",
                    format!(
                        "the scores are scaled after {} masks them (with {f})",
                        self.name(id)
                    ),
                );
            }
        }
        self.same_shape(id, s, &[c, fill])?;
        let view = g.ty(s).shape.clone();
        let depth = self.depth();
        let causal = (!negate).then(|| causal_offset(g, c, &view)).flatten();
        if let Some(offset) = causal {
            if self.causal.is_some() {
                return reason("two_masks", "two causal masks");
            }
            if !neg_inf && offset < 0 {
                return reason(
                    "fill_changes_masked_rows",
                    format!(
                        "{} fills with {f}: with offset {offset} the first rows are fully masked \
                         and stay uniform, where causal attention gives zeros",
                        self.name(id)
                    ),
                );
            }
            self.causal = Some(Causal {
                offset,
                finite_fill: !neg_inf,
                depth,
                node: id,
            });
        } else {
            if self.mask.is_some() {
                return reason("two_masks", "more than one mask is applied to the scores");
            }
            let source = if neg_inf {
                MaskSource::Boolean(c, negate)
            } else {
                MaskSource::BooleanFill(c, negate)
            };
            self.mask = Some(AppliedMask {
                source,
                view,
                depth,
            });
        }
        Ok(s)
    }

    /// The other operands of link `id` (the mask, a fill) must not broadcast the scores `s`
    /// to another shape.
    fn same_shape(&self, id: NodeId, s: NodeId, others: &[NodeId]) -> Result<(), Reason> {
        let g = self.g;
        if g.ty(id).shape == g.ty(s).shape {
            return Ok(());
        }
        let others: Vec<String> = others
            .iter()
            .map(|&o| format!("{} {}", self.name(o), g.ty(o).shape))
            .collect();
        reason(
            "mask_broadcast",
            format!(
                "{} with {} broadcasts the scores {} to {}",
                self.name(id),
                others.join(" and "),
                g.ty(s).shape,
                g.ty(id).shape
            ),
        )
    }

    /// Masks by −∞ combine freely. A finite fill keeps the rows it covers uniform over the keys
    /// it covers; beside another mask, the keys a row averages over differ from the fused op's.
    fn check_mask_pair(&self) -> Result<(), Reason> {
        let (Some(causal), Some(mask)) = (&self.causal, &self.mask) else {
            return Ok(());
        };
        if causal.finite_fill {
            return reason(
                "fill_changes_masked_rows",
                format!(
                    "the causal mask {} fills with a finite value beside another mask: rows the \
                     two mask together would average other keys than the fused op's",
                    self.name(causal.node)
                ),
            );
        }
        if matches!(mask.source, MaskSource::BooleanFill(..)) && mask.depth < causal.depth {
            return reason(
                "fill_changes_masked_rows",
                "a mask filling with the dtype minimum sits above the causal mask: rows it masks \
                 fully would average the causally masked keys too",
            );
        }
        Ok(())
    }
}

/// Whether `to` views `from` with every row of its last axis whole and in order: the same last
/// two axes and the same number of them.
fn keeps_rows(from: &Shape, to: &Shape) -> bool {
    fn split(s: &Shape) -> Option<(&[usize], &[usize])> {
        let r = s.rank().checked_sub(2)?;
        Some(s.dims().split_at(r))
    }
    let (Some((fb, ft)), Some((tb, tt))) = (split(from), split(to)) else {
        return false;
    };
    let count = |b: &[usize]| b.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    ft == tt && count(fb).is_some() && count(fb) == count(tb)
}

/// Whether a node is computed from a MatMul through links the walk reads (casts, views,
/// scales, masks), remembered per node so a long chain is read once.
struct FromScores<'g> {
    g: &'g Graph,
    known: HashMap<NodeId, bool>,
}

impl<'g> FromScores<'g> {
    fn new(g: &'g Graph) -> FromScores<'g> {
        FromScores {
            g,
            known: HashMap::new(),
        }
    }

    fn check(&mut self, id: NodeId) -> bool {
        let g = self.g;
        // Post-order without recursion: a node is decided once its operands are.
        let mut stack = vec![(id, false)];
        while let Some((x, operands_done)) = stack.pop() {
            if self.known.contains_key(&x) {
                continue;
            }
            let through = matches!(
                g.op(x),
                Op::Cast { .. }
                    | Op::Reshape { .. }
                    | Op::Where
                    | Op::Binary(BinaryOp::Mul | BinaryOp::Div | BinaryOp::Add)
            );
            if matches!(g.op(x), Op::MatMul) || !through {
                self.known.insert(x, matches!(g.op(x), Op::MatMul));
            } else if operands_done {
                let any = g
                    .operands(x)
                    .iter()
                    .any(|o| self.known.get(o) == Some(&true));
                self.known.insert(x, any);
            } else {
                stack.push((x, true));
                stack.extend(g.operands(x).into_iter().map(|o| (o, false)));
            }
        }
        self.known.get(&id) == Some(&true)
    }
}

/// The offset of a causal mask over the scores' [Sq, Sk]: a CausalMask node, or a constant
/// bool lower-triangular matrix (leading axes of size 1).
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
        } if Some(values.len()) == sq.checked_mul(sk) => {
            let row_count = |q: usize| {
                values[q * sk..(q + 1) * sk]
                    .iter()
                    .filter(|&&v| v != 0.0)
                    .count()
            };
            let q0 = (0..sq).find(|&q| row_count(q) > 0)?;
            // Both counts are below Sk and Sq, which index memory.
            let off = row_count(q0) as i64 - 1 - q0 as i64;
            let ok = (0..sq).all(|q| {
                (0..sk).all(|k| {
                    let visible = (q as i64)
                        .checked_add(off)
                        .is_some_and(|last| k as i64 <= last);
                    (values[q * sk + k] != 0.0) == visible
                })
            });
            ok.then_some(off)
        }
        _ => None,
    }
}
