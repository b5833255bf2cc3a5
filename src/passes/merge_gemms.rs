//! GEMMs that share an input merged into one: a decoder layer's Q, K and V projections (three
//! GEMVs at decode) become one Gemm over the three weights concatenated along N, and each former
//! result a contiguous slice of its output.
//!
//! Anchor: the live Gemm nodes reading the same A node. Each member must:
//! - read A through the same view, over the same M and K sub-axes as the others (`different_a`);
//! - have no batch axes (`batched`);
//! - read as B an `Op::Weight` `[N_i, K]` transposed (N outer, K inner, both contiguous), read by
//!   no other slot of the Gemm (`b_not_weight`); the merged B is `concat(axis 0)` of the weights,
//!   which the compile layer folds into one bound weight (`compile/fold.rs`), so no kernel
//!   concatenates them at run time;
//! - share the B dtype and quantisation scheme (or none) of the others (`schemes_differ`);
//! - carry no epilogue: one whose operands depend on a sibling's result (gate/up's
//!   `silu(gate)·up`) is `epilogue_reads_sibling`; any other is `epilogue_per_slice` (one Gemm
//!   has one epilogue over all its columns: per-slice epilogues are future work, see
//!   docs/decisions.md);
//! - write its result in row-major (M, N) order, ignoring size-1 axes (`out_not_contiguous`), so
//!   that the result is exactly a reshape of a slice of the merged output.
//!
//! The rewrite: the largest set of members that agree merges into one Gemm writing
//! `[m.., ΣN]`; each member's uses move to `reshape(slice(merged, last axis, o_i..o_i + N_i))`,
//! which takes the member's name. At M = 1 each slice is a contiguous range of the merged
//! buffer and codegen aliases it (no kernel); at M > 1 it is a strided copy.

use std::collections::HashMap;

use super::matchers::Live;
use super::{Pass, PassReport};
use crate::ir::{Gemm, GemmDims, Graph, NodeId, NodeSet, Op, Operand, QuantScheme, Shape, View};

pub struct MergeGemms;

impl Pass for MergeGemms {
    fn name(&self) -> &'static str {
        "merge_gemms"
    }

    fn run(&self, g: &mut Graph) -> PassReport {
        let mut report = PassReport::new(self.name());
        let Ok(order) = g.topo_order() else {
            return report;
        };
        let live = Live::of(g);
        // Gemms by their A node, in the order the first of each was met.
        let mut groups: Vec<(NodeId, Vec<NodeId>)> = Vec::new();
        for id in order {
            if !live.contains(id) || !matches!(g.op(id), Op::Gemm(_)) {
                continue;
            }
            let a = g.operands(id)[0];
            match groups.iter_mut().find(|(x, _)| *x == a) {
                Some((_, members)) => members.push(id),
                None => groups.push((a, vec![id])),
            }
        }
        for (_, mut members) in groups.into_iter().filter(|(_, m)| m.len() > 1) {
            // Slices in the order the members' weights were made (Q, K, V as a model lowers
            // them), not the order a topological walk happens to meet the Gemms.
            members.sort_by_key(|&id| (g.operands(id).get(1).copied(), id));
            merge_group(g, &members, &mut report);
        }
        report
    }
}

/// What members must agree on to merge: A's view and the M and K sub-axes, then B's dtype and
/// scheme.
#[derive(Clone, PartialEq)]
struct Key {
    a: View,
    m: Vec<usize>,
    k: Vec<usize>,
    dtype: crate::ir::DType,
    quant: Option<QuantScheme>,
}

type Refusal = (&'static str, String);

fn merge_group(g: &mut Graph, members: &[NodeId], report: &mut PassReport) {
    let mut eligible: Vec<(NodeId, Key)> = Vec::new();
    for &id in members {
        let name = g.node(id).name.clone();
        match candidate(g, id, members) {
            Ok(key) => eligible.push((id, key)),
            Err((code, detail)) => report.skip(&name, code, detail),
        }
    }
    // The largest set that agrees merges (ties: the first met).
    let mut sets: Vec<(Key, Vec<NodeId>)> = Vec::new();
    for (id, key) in eligible {
        match sets.iter_mut().find(|(k, _)| *k == key) {
            Some((_, ids)) => ids.push(id),
            None => sets.push((key, vec![id])),
        }
    }
    let Some(best) = (0..sets.len()).max_by_key(|&i| (sets[i].1.len(), usize::MAX - i)) else {
        return;
    };
    let chosen = sets[best].0.clone();
    for (i, (key, ids)) in sets.iter().enumerate() {
        if i == best {
            continue;
        }
        let (code, detail) = if (&key.a, &key.m, &key.k) != (&chosen.a, &chosen.m, &chosen.k) {
            (
                "different_a",
                "reads the shared A through another view or M/K",
            )
        } else {
            (
                "schemes_differ",
                "its weight's dtype or block scheme differs",
            )
        };
        for &id in ids {
            report.skip(&g.node(id).name.clone(), code, detail);
        }
    }
    if sets[best].1.len() > 1 {
        let ids = sets[best].1.clone();
        // Each slice of a merged result of more than one row is strided: a copy kernel per
        // member would replace the kernels merging saves (prefill), so only single-row
        // products merge.
        let rows = product(&chosen.m);
        if rows != 1 {
            for &id in &ids {
                report.skip(
                    &g.node(id).name.clone(),
                    "slices_would_copy",
                    format!("M = {rows} rows: each member's slice of the merged result would be a strided copy"),
                );
            }
            return;
        }
        let (merged, what) = rewrite(g, &ids, &chosen);
        report.rewrote(&g.node(merged).name.clone(), what);
    }
}

/// The member's key, or why it cannot merge with its siblings.
fn candidate(g: &Graph, id: NodeId, siblings: &[NodeId]) -> Result<Key, Refusal> {
    let Op::Gemm(gemm) = g.op(id) else {
        return Err(("not_gemm", "not a gemm".into()));
    };
    let ops = g.operands(id);
    let Some(b) = ops.get(1).copied() else {
        return Err(("b_not_weight", "no B operand".into()));
    };
    if !gemm.dims.batch.is_empty() {
        return Err(("batched", format!("batch axes {:?}", gemm.dims.batch)));
    }
    if gemm.prologue.is_some() {
        return Err((
            "has_prologue",
            "it has a prologue already (merging runs before norms are folded)".into(),
        ));
    }
    let Op::Weight { dtype, quant, .. } = g.op(b) else {
        return Err((
            "b_not_weight",
            format!("B is a `{}`, not a weight", g.op(b).name()),
        ));
    };
    let (n, k) = (product(&gemm.dims.n), product(&gemm.dims.k));
    if g.ty(b).shape.dims() != [n, k] || ops.iter().filter(|&&o| o == b).count() != 1 {
        return Err((
            "b_not_weight",
            format!(
                "B {} is not a [N, K] = [{n}, {k}] weight read once",
                g.ty(b).shape
            ),
        ));
    }
    // W [N, K] read transposed: N's sub-axes outer, K's inner, row-major together.
    let nk: Vec<usize> = gemm.dims.n.iter().chain(&gemm.dims.k).copied().collect();
    let want = Shape(nk).strides();
    let (want_n, want_k) = want.split_at(gemm.dims.n.len());
    if !same_strides(&gemm.dims.n, &gemm.b.cols, want_n)
        || !same_strides(&gemm.dims.k, &gemm.b.rows, want_k)
    {
        return Err(("b_not_weight", "B is not its weight read transposed".into()));
    }
    if gemm.epilogue.is_some() {
        let others: Vec<NodeId> = siblings.iter().copied().filter(|&s| s != id).collect();
        if let Some(s) = ops[2..].iter().find_map(|&x| depends_on(g, x, &others)) {
            return Err((
                "epilogue_reads_sibling",
                format!(
                    "its epilogue reads %{}, a gemm of the same A (a paired-column epilogue \
                     would merge them: future work)",
                    g.node(s).name
                ),
            ));
        }
        return Err((
            "epilogue_per_slice",
            "one merged gemm has one epilogue; a per-slice epilogue is not expressible yet".into(),
        ));
    }
    // The result, row-major over (M, N) where the axes have more than one index.
    let mn: Vec<usize> = gemm.dims.m.iter().chain(&gemm.dims.n).copied().collect();
    let want = Shape(mn).strides();
    let (want_m, want_n) = want.split_at(gemm.dims.m.len());
    if !same_strides(&gemm.dims.m, &gemm.out.rows, want_m)
        || !same_strides(&gemm.dims.n, &gemm.out.cols, want_n)
    {
        return Err((
            "out_not_contiguous",
            "the result is written through a permuting view".into(),
        ));
    }
    Ok(Key {
        a: gemm.a.clone(),
        m: gemm.dims.m.clone(),
        k: gemm.dims.k.clone(),
        dtype: *dtype,
        quant: *quant,
    })
}

fn product(v: &[usize]) -> usize {
    v.iter().product()
}

/// Strides equal where the sub-axis has more than one index (a size-1 axis's stride is never
/// used).
fn same_strides(sizes: &[usize], got: &[usize], want: &[usize]) -> bool {
    sizes.len() == got.len()
        && sizes
            .iter()
            .zip(got.iter().zip(want))
            .all(|(&s, (g, w))| s == 1 || g == w)
}

/// The first of `targets` that `x` is or depends on.
fn depends_on(g: &Graph, x: NodeId, targets: &[NodeId]) -> Option<NodeId> {
    let mut seen = NodeSet::default();
    let mut stack = vec![x];
    while let Some(id) = stack.pop() {
        if targets.contains(&id) {
            return Some(id);
        }
        if seen.insert(id) {
            stack.extend(g.operands(id));
        }
    }
    None
}

/// Replaces `ids` (agreeing on `key`) by one Gemm over their weights concatenated; returns the
/// merged node and the rewrite's description.
fn rewrite(g: &mut Graph, ids: &[NodeId], key: &Key) -> (NodeId, String) {
    let a = g.operands(ids[0])[0];
    let weights: Vec<NodeId> = ids.iter().map(|&id| g.operands(id)[1]).collect();
    let ns: Vec<usize> = weights.iter().map(|&w| g.ty(w).shape.dims()[0]).collect();
    let total: usize = ns.iter().sum();
    let k = product(&key.k);
    let names: Vec<String> = ids.iter().map(|&id| g.node(id).name.clone()).collect();
    let wnames: Vec<String> = weights.iter().map(|&w| g.node(w).name.clone()).collect();
    let concat_name = unique(g, &wnames.join("+"));
    let concat = g
        .add_node(Some(&concat_name), Op::Concat { axis: 0 }, &weights)
        .expect("weights of one K and dtype concatenate along N");
    let dims = GemmDims {
        batch: vec![],
        m: key.m.clone(),
        n: vec![total],
        k: key.k.clone(),
    };
    let mut shape = key.m.clone();
    shape.push(total);
    let b = View {
        batch: vec![],
        rows: Shape(key.k.clone()).strides(),
        cols: vec![k],
    };
    let out = View::contiguous(&dims, Operand::Out);
    let merged = Gemm {
        dims,
        a: key.a.clone(),
        b,
        out,
        extras: vec![],
        epilogue: None,
        prologue: None,
        shape: Shape(shape.clone()),
    };
    let merged_name = unique(g, &names.join("+"));
    let m = g
        .add_node(Some(&merged_name), Op::Gemm(Box::new(merged)), &[a, concat])
        .expect("the merged gemm's views are built valid");
    let last = shape.len() as i64 - 1;
    let mut at = 0usize;
    let mut offsets = HashMap::new();
    for ((&id, &n), name) in ids.iter().zip(&ns).zip(&names) {
        let slice = g
            .add_op(
                Op::Slice {
                    axis: last,
                    start: at as i64,
                    end: (at + n) as i64,
                },
                &[m],
            )
            .expect("the slice is inside the merged result");
        offsets.insert(name.clone(), at);
        at += n;
        let want = g.ty(id).shape.clone();
        let result = if g.ty(slice).shape == want {
            slice
        } else {
            let dims = want.dims().iter().map(|&d| d as i64).collect();
            g.add_op(Op::Reshape { shape: dims }, &[slice])
                .expect("the member's result has the slice's elements in order")
        };
        g.replace_all_uses(id, result)
            .expect("the slice holds the member's type");
        g.remove_node(id);
        g.rename(result, name)
            .expect("the member's name was just freed");
    }
    let parts: Vec<String> = names
        .iter()
        .zip(&ns)
        .map(|(n, w)| format!("{n} [{}..{}]", offsets[n], offsets[n] + w))
        .collect();
    (
        m,
        format!(
            "merged {} gemms sharing %{} into one of N = {total}: {}",
            ids.len(),
            g.node(a).name,
            parts.join(", ")
        ),
    )
}

/// `base`, or `base_n` where a node already has that name.
fn unique(g: &mut Graph, base: &str) -> String {
    match g.find(base) {
        None => base.to_string(),
        Some(_) => g.fresh_name(base),
    }
}
