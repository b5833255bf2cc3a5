//! Decode attention that appends this step's K/V rows itself.
//!
//! Matches a FlashAttention with kv_len whose
//! - q is `rope(x, positions; theta, factors)` read by nothing else,
//! - k is `cache_write(k_state, k_rows, start)` of this step, k_rows rotated at the same
//!   positions with the same parameters: either folded into the write (`rope = theta`, no
//!   factors, `passes/rope_fold.rs`) or a rope read only by the write (Llama 3's factors, which
//!   the folded write does not carry),
//! - v is `cache_write(v_state, v_rows, start)` (not rotated), the same start,
//!
//! both writes along the key axis (2) and read by this attention only, with as many rows
//! written as there are queries, and at most [`Append::MAX_ROWS`] query rows per K/V head (the
//! decode kernel's bound). It becomes the append form (`ir::Append`): operands q = x (before
//! rope), the caches as the writes produce them, then positions, k_rows before rope, v_rows and
//! start. The writes stay: they are the producers of the states' next values (state linking,
//! the interpreter and in-place aliasing see no change); a kernel realises them inside the
//! attention (codegen gives a write whose only reader is an appending attention no kernel).
//!
//! Must not match (each a named refusal): `queries_above_decode_bound` (prefill),
//! `q_not_roped`, `q_rope_has_other_readers`, `cache_not_written_here`,
//! `cache_has_other_readers`, `cache_axis_not_keys`, `starts_differ`, `k_not_roped`,
//! `v_roped`, `rope_params_differ`, `positions_differ`, `rows_not_queries`.

use super::matchers::{k_rotates_as_q, rope_at_positions};
use super::{Pass, PassReport};
use crate::ir::{Append, Graph, NodeId, Op};

pub struct DecodeAppend;

/// What a match takes: the new attention's attributes and operands.
struct Matched {
    append: Append,
    q: NodeId,
    positions: NodeId,
    k_rows: NodeId,
    v_rows: NodeId,
    start: NodeId,
}

type Refusal = (&'static str, String);

fn matched(g: &Graph, id: NodeId) -> Option<Result<Matched, Refusal>> {
    let Op::FlashAttention(att) = g.op(id) else {
        return None;
    };
    if !att.kv_len || att.append.is_some() {
        return None;
    }
    Some(check(g, id))
}

fn check(g: &Graph, id: NodeId) -> Result<Matched, Refusal> {
    let ops = g.operands(id);
    let (q, k, v) = (ops[0], ops[1], ops[2]);
    let [_, hq, sq, _] = g.ty(q).shape.dims()[..] else {
        unreachable!("rank 4 by inference")
    };
    let hkv = g.ty(k).shape.dims()[1].max(1);
    let rows = (hq / hkv).saturating_mul(sq);
    if rows > Append::MAX_ROWS {
        return Err((
            "queries_above_decode_bound",
            format!(
                "{rows} query rows per K/V head (more than the decode kernel's {})",
                Append::MAX_ROWS
            ),
        ));
    }
    let Some((x, positions, theta, factors)) = rope_at_positions(g, q) else {
        return Err((
            "q_not_roped",
            format!(
                "q `{}` is not a rope at a positions operand",
                g.node(q).name
            ),
        ));
    };
    if g.use_count(q) != 1 || g.is_output(q) {
        return Err((
            "q_rope_has_other_readers",
            format!("`{}` is read elsewhere too", g.node(q).name),
        ));
    }
    let append = Append { theta, factors };
    let mut writes = Vec::with_capacity(2);
    for (what, w) in [("k", k), ("v", v)] {
        let Op::CacheWrite { axis, rope } = g.op(w) else {
            return Err((
                "cache_not_written_here",
                format!("{what} `{}` is not a cache write", g.node(w).name),
            ));
        };
        if g.use_count(w) != 1 || g.is_output(w) {
            return Err((
                "cache_has_other_readers",
                format!(
                    "{what} cache write `{}` is read elsewhere too",
                    g.node(w).name
                ),
            ));
        }
        let rank = g.ty(w).shape.rank() as i64;
        if axis.rem_euclid(rank.max(1)) != 2 {
            return Err((
                "cache_axis_not_keys",
                format!(
                    "`{}` writes along axis {axis}, not the keys (2)",
                    g.node(w).name
                ),
            ));
        }
        let wops = g.operands(w);
        if g.ty(wops[1]).shape.dims().get(2) != Some(&sq) {
            return Err((
                "rows_not_queries",
                format!(
                    "`{}` writes {} rows for {sq} queries",
                    g.node(w).name,
                    g.ty(wops[1]).shape
                ),
            ));
        }
        writes.push((w, *rope, wops));
    }
    let (kw, k_rope, kops) = &writes[0];
    let (vw, v_rope, vops) = &writes[1];
    if kops[2] != vops[2] {
        return Err((
            "starts_differ",
            format!(
                "`{}` and `{}` write at different starts",
                g.node(*kw).name,
                g.node(*vw).name
            ),
        ));
    }
    if v_rope.is_some() {
        return Err((
            "v_roped",
            format!("`{}` rotates the values", g.node(*vw).name),
        ));
    }
    // k's rows before rope, with the positions and parameters they are rotated with.
    let (k_rows, k_pos, k_theta, k_factors) = match k_rope {
        Some(t) => (kops[1], kops[3], *t, Vec::new()),
        None => {
            let r = kops[1];
            let Some(parts) =
                rope_at_positions(g, r).filter(|_| g.use_count(r) == 1 && !g.is_output(r))
            else {
                return Err((
                    "k_not_roped",
                    format!(
                        "`{}` writes rows that are not a rope read only by it",
                        g.node(*kw).name
                    ),
                ));
            };
            parts
        }
    };
    k_rotates_as_q(&append, positions, (k_theta, &k_factors, k_pos))?;
    Ok(Matched {
        append,
        q: x,
        positions,
        k_rows,
        v_rows: vops[1],
        start: kops[2],
    })
}

impl Pass for DecodeAppend {
    fn name(&self) -> &'static str {
        "decode_append"
    }

    fn run(&self, g: &mut Graph) -> PassReport {
        let mut report = PassReport::new(self.name());
        let anchors: Vec<NodeId> = g
            .node_ids()
            .filter(|&id| matches!(g.op(id), Op::FlashAttention(_)))
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
            let Op::FlashAttention(mut att) = g.op(id).clone() else {
                unreachable!("matched a FlashAttention")
            };
            att.append = Some(m.append);
            let ops = g.operands(id);
            let q_rope = ops[0];
            let mut operands = ops.clone();
            operands[0] = m.q;
            operands.extend([m.positions, m.k_rows, m.v_rows, m.start]);
            let Ok(new) = g.add_op(Op::FlashAttention(att), &operands) else {
                continue;
            };
            if g.replace_all_uses(id, new).is_err() {
                g.remove_node(new);
                continue;
            }
            g.remove_node(id);
            if g.use_count(q_rope) == 0 && !g.is_output(q_rope) {
                g.remove_node(q_rope);
            }
            // The attention keeps its name: listings read the same.
            if g.find(&name).is_none() {
                g.rename(new, &name).ok();
            }
            report.rewrote(
                &name,
                "q's rope and this step's K/V rows taken into the attention",
            );
        }
        report
    }
}
