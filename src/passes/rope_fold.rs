//! Rope folded into the cache write that stores its result.
//!
//! Matches `cache_write(state, rope(x, positions; theta), start)` (no rope yet on the write)
//! and makes it `cache_write(state, x, start, positions; rope = theta)`: one kernel rotates the
//! pairs as it writes them instead of a rope kernel writing a tensor the write copies. The
//! semantics are `Op::Rope`'s, evaluated by the same interpreter function.
//!
//! Must not match (each a named refusal in the report):
//! - `rope_has_other_readers`: the rotated values are read by another node or are a graph
//!   output (the fold would drop or recompute them);
//! - `rope_offset_without_positions`: a rope at `offset..offset + S` with no positions operand
//!   (the folded op takes its positions from an operand only);
//! - `already_roped`: the write already rotates (a second rope would be a different op).

use super::matchers::replace_node;
use super::{Pass, PassReport};
use crate::ir::{Graph, NodeId, Op};

pub struct FoldRope;

/// Why a cache write of a rope's result was left alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeFoldRefusal {
    RopeHasOtherReaders,
    RopeOffsetWithoutPositions,
    AlreadyRoped,
    /// The rope scales its frequencies (Llama 3): the cache write's rope has no factors yet.
    RopeHasFactors,
}

impl RopeFoldRefusal {
    /// The stable code in the report.
    pub fn code(self) -> &'static str {
        match self {
            RopeFoldRefusal::RopeHasOtherReaders => "rope_has_other_readers",
            RopeFoldRefusal::RopeOffsetWithoutPositions => "rope_offset_without_positions",
            RopeFoldRefusal::AlreadyRoped => "already_roped",
            RopeFoldRefusal::RopeHasFactors => "rope_has_factors",
        }
    }
}

/// What the fold takes from a match: (state, x, start, positions, axis, theta).
type Folded = (NodeId, NodeId, NodeId, NodeId, i64, f64);

/// Checks cache write `id` whose values are a rope: the operands of the folded write, or why not.
fn matched(g: &Graph, id: NodeId) -> Option<Result<Folded, (RopeFoldRefusal, String)>> {
    let Op::CacheWrite { axis, rope } = g.op(id) else {
        return None;
    };
    let ops = g.operands(id);
    let values = ops[1];
    let Op::Rope {
        theta,
        offset,
        factors,
    } = g.op(values)
    else {
        return None;
    };
    let rope_name = &g.node(values).name;
    if !factors.is_empty() {
        return Some(Err((
            RopeFoldRefusal::RopeHasFactors,
            format!(
                "`{rope_name}` scales its frequencies ({} factors); the cache write's rope has none",
                factors.len()
            ),
        )));
    }
    if rope.is_some() {
        return Some(Err((
            RopeFoldRefusal::AlreadyRoped,
            format!("the write already rotates; `{rope_name}` stays a rope"),
        )));
    }
    if g.use_count(values) != 1 || g.is_output(values) {
        return Some(Err((
            RopeFoldRefusal::RopeHasOtherReaders,
            format!(
                "`{rope_name}` has {} reader(s){}",
                g.use_count(values),
                if g.is_output(values) {
                    " and is a graph output"
                } else {
                    ""
                }
            ),
        )));
    }
    let rope_ops = g.operands(values);
    let Some(&positions) = rope_ops.get(1) else {
        return Some(Err((
            RopeFoldRefusal::RopeOffsetWithoutPositions,
            format!("`{rope_name}` rotates at offset {offset} with no positions operand"),
        )));
    };
    Some(Ok((ops[0], rope_ops[0], ops[2], positions, *axis, *theta)))
}

impl Pass for FoldRope {
    fn name(&self) -> &'static str {
        "fold_rope"
    }

    fn run(&self, g: &mut Graph) -> PassReport {
        let mut report = PassReport::new(self.name());
        let writes: Vec<NodeId> = g
            .node_ids()
            .filter(|&id| matches!(g.op(id), Op::CacheWrite { .. }))
            .collect();
        for id in writes {
            let name = g.node(id).name.clone();
            let (state, x, start, positions, axis, theta) = match matched(g, id) {
                None => continue,
                Some(Err((why, detail))) => {
                    report.skip(&name, why.code(), detail);
                    continue;
                }
                Some(Ok(m)) => m,
            };
            let rope = g.operands(id)[1];
            let rope_name = g.node(rope).name.clone();
            // The new write reads the state too until the old one is gone; `replace_node`
            // removes it (and the rope, now unread, with it below) before validation.
            let Ok(new) = g.cache_write_rope(state, x, start, positions, axis, theta) else {
                continue;
            };
            replace_node(g, id, new);
            if g.use_count(rope) == 0 && !g.is_output(rope) {
                g.remove_node(rope);
            }
            // The write keeps its name: listings and state links read the same.
            if g.node(new).name != name && g.find(&name).is_none() {
                g.rename(new, &name).ok();
            }
            report.rewrote(&name, format!("rope `{rope_name}` folded into the write"));
        }
        report
    }
}
