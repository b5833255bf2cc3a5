//! Norm into GEMV: a RMSNorm or LayerNorm whose value only GEMV-sized Gemms read as their A is
//! folded into each of them as a prologue (`ir::gemm::Prologue`): every Gemm reads the norm's
//! input and normalises A's rows itself, so the normalised rows are never written and the norm
//! is not a kernel of its own. In a decoder layer that removes the attention norm and the MLP
//! norm (and the final norm before the LM head).
//!
//! Anchor: a live `rms_norm`/`layer_norm` node that some live Gemm reads (a norm no Gemm reads
//! is no candidate and is not reported). Matches when:
//! - it is not a graph output and every live use is operand slot 0 (A) of a Gemm
//!   (`read_by_non_gemm`, `read_not_as_a`, `norm_is_output`); one Gemm or several (Q, K and V;
//!   gate and up): each recomputes the row statistics, which costs a pass over K per block but
//!   no launch and no round trip of the rows through memory;
//! - each Gemm runs as a GEMV ([`runs_as_gemv`]: M up to 16 rows, up to 64 where the tiled
//!   kernels' grid would be small) (`m_above_gemv_bound`): only the GEMV-style kernels take a
//!   prologue cheaply (a block owns its group of rows, so it computes their statistics once);
//!   past the bound the statistics would be recomputed by every tile of M × N, and a separate
//!   norm kernel is cheaper;
//! - each Gemm reads A's K as exactly the norm's axis, in order (`a_not_contiguous_over_k`):
//!   K's product is the norm's last dimension, K's strides in A are the contiguous ones, and
//!   every batch or row stride is a whole number of rows; otherwise K would mix norm rows;
//! - no Gemm has a prologue already (`has_prologue`).
//!
//! Must not: fold when the normalised value has any other reader (it would have to be written
//! anyway, so folding would save nothing and recompute the statistics), or fold into some of
//! the Gemms and not the others (same reason): a refusal for one reader leaves all of them.

use super::matchers::{replace_node, Live};
use super::{Pass, PassReport};
use crate::ir::gemm::{runs_as_gemv, Operand, GEMV_MAX_M};
use crate::ir::{Gemm, Graph, NodeId, NormKind, Op, Prologue};

pub struct FoldNormIntoGemv;

impl Pass for FoldNormIntoGemv {
    fn name(&self) -> &'static str {
        "norm_gemv"
    }

    fn run(&self, g: &mut Graph) -> PassReport {
        let mut report = PassReport::new(self.name());
        let Ok(order) = g.topo_order() else {
            return report;
        };
        let live = Live::of(g);
        for id in order {
            // Folding removes the Gemms it replaces: ids later in the order may be gone.
            if !g.contains(id) || !live.contains(id) {
                continue;
            }
            let prologue = match g.op(id) {
                Op::RmsNorm { eps } => Prologue {
                    norm: NormKind::Rms,
                    eps: *eps,
                },
                Op::LayerNorm { eps } => Prologue {
                    norm: NormKind::Layer,
                    eps: *eps,
                },
                _ => continue,
            };
            let read_by_gemm = g
                .consumers(id)
                .into_iter()
                .any(|u| live.contains(u) && matches!(g.op(u), Op::Gemm(_)));
            if !read_by_gemm {
                continue;
            }
            let name = g.node(id).name.clone();
            match readers(g, &live, id) {
                Err((code, detail)) => report.skip(&name, code, detail),
                Ok(gemms) => {
                    let names = fold(g, id, prologue, gemms);
                    report.rewrote(
                        &name,
                        format!("folded into the prologue of {}", names.join(", ")),
                    );
                }
            }
        }
        report
    }
}

type Refusal = (&'static str, String);

/// The Gemms reading norm `id` as their A, when all its live uses are such Gemms and each
/// can take the prologue.
fn readers(g: &Graph, live: &Live, id: NodeId) -> Result<Vec<(NodeId, Gemm)>, Refusal> {
    if g.is_output(id) {
        return Err((
            "norm_is_output",
            "the normalised value is a graph output".into(),
        ));
    }
    let d = g.ty(id).shape.dims().last().copied().unwrap_or(1);
    let mut gemms = Vec::new();
    for user in g.consumers(id).into_iter().filter(|&u| live.contains(u)) {
        let uname = &g.node(user).name;
        let Op::Gemm(gemm) = g.op(user) else {
            return Err((
                "read_by_non_gemm",
                format!(
                    "%{uname} ({}) reads the normalised value",
                    g.op(user).name()
                ),
            ));
        };
        let ops = g.operands(user);
        if ops.iter().skip(1).any(|&o| o == id) {
            return Err((
                "read_not_as_a",
                format!("%{uname} reads the normalised value as B or an epilogue operand"),
            ));
        }
        if gemm.prologue.is_some() {
            return Err(("has_prologue", format!("%{uname} has a prologue already")));
        }
        let [batch, m, n, _] = gemm.dims.sizes().expect("checked by shape inference");
        if !runs_as_gemv(batch, m, n) {
            return Err((
                "m_above_gemv_bound",
                format!(
                    "%{uname} has M = {m} rows and N = {n} columns: the GEMV kernels take \
                     1..={GEMV_MAX_M} rows only where the tiled kernels' grid is small"
                ),
            ));
        }
        if !k_is_norm_axis(gemm, d) {
            return Err((
                "a_not_contiguous_over_k",
                format!("%{uname} does not read A's K as the norm's axis of {d}, in order"),
            ));
        }
        gemms.push((user, (**gemm).clone()));
    }
    Ok(gemms)
}

/// Whether the Gemm's A rows over K are the norm's rows of `d`: K's sub-axes have the
/// contiguous strides of their sizes (innermost 1), their product is `d`, and each batch and
/// row sub-axis (of size > 1) steps a whole number of rows.
fn k_is_norm_axis(gemm: &Gemm, d: usize) -> bool {
    let Some([_, _, _, k]) = gemm.dims.sizes() else {
        return false;
    };
    if k != d {
        return false;
    }
    let want = crate::ir::View::contiguous(&gemm.dims, Operand::A);
    let cols_ok = gemm
        .dims
        .k
        .iter()
        .zip(gemm.a.cols.iter().zip(&want.cols))
        .all(|(&size, (got, want))| size == 1 || got == want);
    let [batch, rows, _] = gemm.dims.of(Operand::A);
    let outer_ok = batch
        .iter()
        .zip(&gemm.a.batch)
        .chain(rows.iter().zip(&gemm.a.rows))
        .all(|(&size, &stride)| size == 1 || stride.is_multiple_of(d.max(1)));
    cols_ok && outer_ok
}

/// Replaces each Gemm by one reading the norm's input as A, its parameters appended after the
/// extras (`ir::gemm`'s operand order), with `prologue`. Returns the new Gemms' names.
fn fold(
    g: &mut Graph,
    norm: NodeId,
    prologue: Prologue,
    gemms: Vec<(NodeId, Gemm)>,
) -> Vec<String> {
    let norm_ops = g.operands(norm);
    let (x, params) = (norm_ops[0], &norm_ops[1..]);
    let mut names = Vec::new();
    for (old, mut new) in gemms {
        new.prologue = Some(prologue);
        let mut ops = g.operands(old);
        ops[0] = x;
        ops.extend_from_slice(params);
        let id = g
            .add_op(Op::Gemm(Box::new(new)), &ops)
            .expect("the norm's input has its output's type; its parameters are [K]");
        let name = g.node(old).name.clone();
        replace_node(g, old, id);
        // The Gemm keeps its name (dumps and `--explain` keep naming the same node).
        if g.node(id).name != name {
            g.rename(id, &name).expect("the old name was just freed");
        }
        names.push(format!("%{name}"));
    }
    names
}
