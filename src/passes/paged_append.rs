//! Paged decode attention that appends this step's K/V rows itself: `decode_append` for the
//! paged plan (`Op::PagedAttention`'s append form, `ir::Append`).
//!
//! Matches a PagedAttention (no append yet) whose
//! - q is `rope(x, positions; theta, factors)` seen per sequence as the batched lowering makes
//!   it (`frontend/llama/lower.rs`, `Paged::per_sequence`): x `[1, Hq, B·s, D]` itself (B = 1),
//!   `permute(x, [2, 1, 0, 3])` (s = 1) or `permute(reshape(x, [Hq, B, s, D]), [1, 0, 2, 3])`,
//!   the rope and each view read by nothing else,
//! - k pool is `paged_cache_write(k_pool, k_rows, slots)` of this step, k_rows a rope of the same
//!   theta, factors and positions operand read only by the write (the paged write has no folded
//!   rope, so Llama 3's factors and plain ropes look alike here),
//! - v pool is `paged_cache_write(v_pool, v_rows, slots)` with the same slots operand,
//!
//! both writes read by this attention only and writing `[1, Hkv, B·s, D]` rows (this step's, as
//! many as the queries), with at most [`Append::MAX_ROWS`] query rows per K/V head (the paged
//! kernel's bound, the decode kernel's). It becomes the append form: q = x, the pools as the
//! writes produce them, then positions, k_rows before rope, v_rows and slots. The writes stay as
//! the pools' producers (state linking, the interpreter and in-place aliasing see no change);
//! the attention's kernel does their work (codegen gives a write whose only reader is an
//! appending paged attention no kernel), and the per-sequence view of q is read in place.
//!
//! Must not match (each a named refusal): `queries_above_decode_bound` (more rows per K/V head
//! than the kernel serves), `q_not_roped` (not a rope at a positions operand through one of the
//! views above, attributes compared exactly), `q_rope_has_other_readers`,
//! `pool_not_written_here`, `pool_has_other_readers`, `rows_not_queries`, `slots_differ`,
//! `k_not_roped`, `rope_params_differ`, `positions_differ`.

use super::matchers::{k_rotates_as_q, rope_at_positions};
use super::{Pass, PassReport};
use crate::ir::{Append, Graph, NodeId, Op};

pub struct PagedAppend;

/// What a match takes: the new attention's attributes and operands, and the nodes of q's rope
/// and view that it leaves unread.
struct Matched {
    append: Append,
    q: NodeId,
    q_chain: Vec<NodeId>,
    positions: NodeId,
    k_rows: NodeId,
    v_rows: NodeId,
    slots: NodeId,
}

type Refusal = (&'static str, String);

/// The rows node under q's per-sequence view, with the view's nodes (q first), where q
/// `[b, hq, s, d]` is one of the three views the batched lowering makes of `[1, hq, b·s, d]`.
fn rows_under_view(
    g: &Graph,
    q: NodeId,
    [b, hq, s, d]: [usize; 4],
) -> Option<(NodeId, Vec<NodeId>)> {
    if b == 1 {
        return Some((q, vec![]));
    }
    let rows_shape = [1, hq, b * s, d];
    let Op::Permute { perm } = g.op(q) else {
        return None;
    };
    let under = g.operands(q)[0];
    if s == 1 && perm[..] == [2, 1, 0, 3] && g.ty(under).shape.dims() == rows_shape {
        return Some((under, vec![q]));
    }
    let Op::Reshape { shape } = g.op(under) else {
        return None;
    };
    let want = [hq, b, s, d].map(|x| x as i64);
    let rows = g.operands(under)[0];
    (perm[..] == [1, 0, 2, 3] && shape[..] == want && g.ty(rows).shape.dims() == rows_shape)
        .then(|| (rows, vec![q, under]))
}

fn matched(g: &Graph, id: NodeId) -> Option<Result<Matched, Refusal>> {
    let Op::PagedAttention { append: None, .. } = g.op(id) else {
        return None;
    };
    Some(check(g, id))
}

fn check(g: &Graph, id: NodeId) -> Result<Matched, Refusal> {
    let ops = g.operands(id);
    let (q, k, v) = (ops[0], ops[1], ops[2]);
    let [b, hq, sq, d] = g.ty(q).shape.dims()[..] else {
        unreachable!("rank 4 by inference")
    };
    let hkv = g.ty(k).shape.dims()[1].max(1);
    let rows = (hq / hkv).saturating_mul(sq);
    if rows > Append::MAX_ROWS {
        return Err((
            "queries_above_decode_bound",
            format!(
                "{rows} query rows per K/V head (more than the paged kernel's {})",
                Append::MAX_ROWS
            ),
        ));
    }
    let not_roped = || {
        (
            "q_not_roped",
            format!(
                "q `{}` is not a rope at a positions operand of this step's rows, directly or \
                 through the per-sequence view",
                g.node(q).name
            ),
        )
    };
    let (rope, mut q_chain) = rows_under_view(g, q, [b, hq, sq, d]).ok_or_else(not_roped)?;
    let (x, positions, theta, factors) = rope_at_positions(g, rope).ok_or_else(not_roped)?;
    q_chain.push(rope);
    if let Some(&n) = q_chain
        .iter()
        .find(|&&n| g.use_count(n) != 1 || g.is_output(n))
    {
        return Err((
            "q_rope_has_other_readers",
            format!("`{}` is read elsewhere too", g.node(n).name),
        ));
    }
    let append = Append { theta, factors };
    let mut writes = Vec::with_capacity(2);
    for (what, w) in [("k", k), ("v", v)] {
        let Op::PagedCacheWrite = g.op(w) else {
            return Err((
                "pool_not_written_here",
                format!("{what} `{}` is not a paged cache write", g.node(w).name),
            ));
        };
        if g.use_count(w) != 1 || g.is_output(w) {
            return Err((
                "pool_has_other_readers",
                format!(
                    "{what} paged cache write `{}` is read elsewhere too",
                    g.node(w).name
                ),
            ));
        }
        let wops = g.operands(w);
        let written = g.ty(wops[1]).shape.dims();
        if written.len() != 4 || written[0] != 1 || written[2] != b * sq {
            return Err((
                "rows_not_queries",
                format!(
                    "`{}` writes rows {} for {b} sequence(s) of {sq} queries ([1, Hkv, {}, D] \
                     wanted)",
                    g.node(w).name,
                    g.ty(wops[1]).shape,
                    b * sq
                ),
            ));
        }
        writes.push((w, wops));
    }
    let (kw, kops) = &writes[0];
    let (vw, vops) = &writes[1];
    if kops[2] != vops[2] {
        return Err((
            "slots_differ",
            format!(
                "`{}` and `{}` write at different slots operands",
                g.node(*kw).name,
                g.node(*vw).name
            ),
        ));
    }
    let r = kops[1];
    let Some((k_rows, k_pos, k_theta, k_factors)) =
        rope_at_positions(g, r).filter(|_| g.use_count(r) == 1 && !g.is_output(r))
    else {
        return Err((
            "k_not_roped",
            format!(
                "`{}` writes rows that are not a rope at a positions operand read only by it",
                g.node(*kw).name
            ),
        ));
    };
    k_rotates_as_q(&append, positions, (k_theta, &k_factors, k_pos))?;
    Ok(Matched {
        append,
        q: x,
        q_chain,
        positions,
        k_rows,
        v_rows: vops[1],
        slots: kops[2],
    })
}

impl Pass for PagedAppend {
    fn name(&self) -> &'static str {
        "paged_append"
    }

    fn run(&self, g: &mut Graph) -> PassReport {
        let mut report = PassReport::new(self.name());
        let anchors: Vec<NodeId> = g
            .node_ids()
            .filter(|&id| matches!(g.op(id), Op::PagedAttention { .. }))
            .collect();
        for id in anchors {
            let name = g.node(id).name.clone();
            let m = match matched(g, id) {
                None => continue,
                Some(Err((code, detail))) => {
                    report.skip(&name, code, detail);
                    continue;
                }
                Some(Ok(m)) => m,
            };
            let Op::PagedAttention { scale, window, .. } = *g.op(id) else {
                unreachable!("matched a PagedAttention")
            };
            let op = Op::PagedAttention {
                scale,
                window,
                append: Some(m.append),
            };
            let mut operands = g.operands(id).clone();
            operands[0] = m.q;
            operands.extend([m.positions, m.k_rows, m.v_rows, m.slots]);
            let Ok(new) = g.add_op(op, &operands) else {
                continue;
            };
            if g.replace_all_uses(id, new).is_err() {
                g.remove_node(new);
                continue;
            }
            g.remove_node(id);
            // q's view, then its rope, now read by nothing.
            for n in m.q_chain {
                if g.use_count(n) == 0 && !g.is_output(n) {
                    g.remove_node(n);
                }
            }
            // The attention keeps its name: listings read the same.
            if g.find(&name).is_none() {
                g.rename(new, &name).ok();
            }
            report.rewrote(
                &name,
                "q's rope and view and this step's paged K/V rows taken into the attention",
            );
        }
        report
    }
}
