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
//! - write its result so that it is a contiguous range of the merged one ([`Layout`]): row-major
//!   (M, N) at one row, or heads outermost (`[1, H, M, D]`, the attention's layout) at any M
//!   (`out_not_contiguous` otherwise), the same layout as the others (`layouts_differ`);
//!   row-major results of more than one row, or heads starting off the 16-byte boundary a slice
//!   needs to be read in place, would make each slice a copy (`slices_would_copy`).
//!
//! First, gate/up pairs (a GLU: `act(A·W_gate) · (A·W_up)`, which FuseElementwise leaves as
//! the gate Gemm's epilogue `act($0)·$1` reading the up Gemm's result) merge into one Gemm with
//! paired columns (`ir::gemm` "paired columns"): B is the two weights' rows interleaved,
//! `reshape([2N, K], concat(axis 1, W_gate, W_up))`, which `compile/fold.rs` folds into one
//! bound weight; the epilogue, unchanged, combines columns 2j ($0) and 2j + 1 ($1) into result
//! column j. The pair must:
//! - have the up Gemm's result read by the gate's epilogue only, as its one extra
//!   (`up_has_other_uses`, `epilogue_not_glu`), through the view the up Gemm writes it, which
//!   is the gate's own result view (`views_differ`); the up Gemm carries no epilogue
//!   (`epilogue_not_glu`);
//! - both pass the member checks above except the epilogue's and the result's contiguity (the
//!   result view is kept), with equal B dtype and scheme (`schemes_differ`), A view and M/K
//!   (`different_a`), N (`sizes_differ`) and prologue with its parameters (`prologues_differ`);
//! - run as a GEMV at their paired size (`paired_needs_gemv`: `ir::gemm::runs_as_gemv` of M
//!   rows and 2N product columns, up to 64 rows where the tiled kernels' grid would be small):
//!   only the GEMV kernels (small-M, quantized) combine column pairs (the tiled ones give a
//!   typed error); past 8 rows they take the rows in groups of 8 (their sums spilled on wave32
//!   targets at 16 rows a block).
//!
//! Then the rewrite: the largest set of members that agree merges into one Gemm writing
//! `[m.., ΣN]` (row-major) or `[1, ΣH, M, D]` (heads outermost); each member's uses move to
//! its slice (reshaped where needed), which takes the member's name. Each slice is a
//! contiguous range of the merged buffer and codegen aliases it (no kernel).

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
            // Gate/up pairs first: what they consume leaves the group.
            let (paired, refused) = merge_glu_pairs(g, &members, &mut report);
            members.retain(|id| !paired.contains(id));
            if members.len() < 2 {
                continue;
            }
            // Slices in the order the members' weights were made (Q, K, V as a model lowers
            // them), not the order a topological walk happens to meet the Gemms.
            members.sort_by_key(|&id| (g.operands(id).get(1).copied(), id));
            merge_group(g, &members, &refused, &mut report);
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

fn merge_group(
    g: &mut Graph,
    members: &[NodeId],
    refused: &[(NodeId, Refusal)],
    report: &mut PassReport,
) {
    let mut eligible: Vec<(NodeId, (Key, Layout))> = Vec::new();
    for &id in members {
        let name = g.node(id).name.clone();
        let decided = refused
            .iter()
            .find(|(r, _)| *r == id)
            .map(|(_, why)| why.clone());
        match decided.map_or_else(|| candidate(g, id, members), Err) {
            Ok(key) => eligible.push((id, key)),
            Err((code, detail)) => report.skip(&name, code, detail),
        }
    }
    // The largest set that agrees merges (ties: the first met).
    let mut sets: Vec<((Key, Layout), Vec<NodeId>)> = Vec::new();
    for (id, key) in eligible {
        match sets.iter_mut().find(|(k, _)| *k == key) {
            Some((_, ids)) => ids.push(id),
            None => sets.push((key, vec![id])),
        }
    }
    let Some(best) = (0..sets.len()).max_by_key(|&i| (sets[i].1.len(), usize::MAX - i)) else {
        return;
    };
    let (chosen, layout) = sets[best].0.clone();
    for (i, ((key, other), ids)) in sets.iter().enumerate() {
        if i == best {
            continue;
        }
        let (code, detail) = if (&key.a, &key.m, &key.k) != (&chosen.a, &chosen.m, &chosen.k) {
            (
                "different_a",
                "reads the shared A through another view or M/K",
            )
        } else if (key.dtype, key.quant) != (chosen.dtype, chosen.quant) {
            (
                "schemes_differ",
                "its weight's dtype or block scheme differs",
            )
        } else {
            debug_assert_ne!(*other, layout);
            (
                "layouts_differ",
                "it writes its result in another layout than the merged set's",
            )
        };
        for &id in ids {
            report.skip(&g.node(id).name.clone(), code, detail);
        }
    }
    if sets[best].1.len() > 1 {
        let ids = sets[best].1.clone();
        let spread = match spread(g, &ids, &chosen, &layout) {
            Ok(spread) => spread,
            Err(detail) => {
                for &id in &ids {
                    report.skip(
                        &g.node(id).name.clone(),
                        "slices_would_copy",
                        detail.clone(),
                    );
                }
                return;
            }
        };
        let (merged, what) = rewrite(g, &ids, &chosen, &spread);
        report.rewrote(&g.node(merged).name.clone(), what);
    }
}

/// Merges each gate/up pair among `members` (Gemms of one A) into one paired-column Gemm;
/// returns the members merged, and each gate left alone with why (the slice merge reports it
/// in its order: a gate never slice-merges, its epilogue reads a sibling).
fn merge_glu_pairs(
    g: &mut Graph,
    members: &[NodeId],
    report: &mut PassReport,
) -> (Vec<NodeId>, Vec<(NodeId, Refusal)>) {
    let mut done = Vec::new();
    let mut refused = Vec::new();
    for &gate in members {
        if done.contains(&gate) {
            continue;
        }
        let Op::Gemm(gg) = g.op(gate) else {
            continue;
        };
        let ops = g.operands(gate);
        // A GLU's gate reads a sibling's result in its epilogue: anything else is not a pair.
        let Some(&up) = ops
            .get(2)
            .filter(|u| members.contains(u) && !done.contains(*u))
        else {
            continue;
        };
        if gg.epilogue.is_none() {
            continue;
        }
        let name = g.node(gate).name.clone();
        match glu_pair(g, gate, up) {
            Ok(key) => {
                let what = rewrite_glu(g, gate, up, &key);
                report.rewrote(&name, what);
                done.extend([gate, up]);
            }
            Err(why) => refused.push((gate, why)),
        }
    }
    (done, refused)
}

/// Why gate (whose epilogue reads `up` as its first extra) and up cannot merge into paired
/// columns, or their shared key.
fn glu_pair(g: &Graph, gate: NodeId, up: NodeId) -> Result<Key, Refusal> {
    let (Op::Gemm(gg), Op::Gemm(ug)) = (g.op(gate), g.op(up)) else {
        return Err(("not_gemm", "not a gemm".into()));
    };
    let up_name = &g.node(up).name;
    if gg.extras.len() != 1 || ug.epilogue.is_some() || !ug.extras.is_empty() {
        return Err((
            "epilogue_not_glu",
            format!(
                "the epilogue reads {} operand(s) besides the product and %{up_name} has {} \
                 epilogue: a GLU pair is act(gate)·up over two plain products",
                gg.extras.len(),
                if ug.epilogue.is_some() { "an" } else { "no" }
            ),
        ));
    }
    if g.use_count(up) != 1 || g.is_output(up) {
        return Err((
            "up_has_other_uses",
            format!("%{up_name} is read elsewhere too: its result must stay stored"),
        ));
    }
    if gg.extras[0] != ug.out || gg.out != ug.out {
        return Err((
            "views_differ",
            format!("the epilogue reads %{up_name} through another view than the results'"),
        ));
    }
    let (kg, ku) = (weight_key(g, gate)?, weight_key(g, up)?);
    if (&kg.a, &kg.m, &kg.k) != (&ku.a, &ku.m, &ku.k) {
        return Err((
            "different_a",
            format!("%{up_name} reads the shared A through another view or M/K"),
        ));
    }
    if (kg.dtype, kg.quant) != (ku.dtype, ku.quant) {
        return Err((
            "schemes_differ",
            format!(
                "the weights' dtypes or block schemes differ ({:?} vs {:?})",
                kg.quant, ku.quant
            ),
        ));
    }
    if gg.dims.n != ug.dims.n {
        return Err((
            "sizes_differ",
            format!("N {:?} vs {:?}", gg.dims.n, ug.dims.n),
        ));
    }
    let params = |id: NodeId, gm: &Gemm| g.operands(id)[gm.prologue_slots()].to_vec();
    if gg.prologue != ug.prologue || params(gate, gg) != params(up, ug) {
        return Err((
            "prologues_differ",
            "the two normalise A differently (or not both)".into(),
        ));
    }
    // The members have no batch axes (`batched`); the pair's product has 2N columns.
    let (rows, cols) = (product(&kg.m), 2 * product(&gg.dims.n));
    if !crate::ir::gemm::runs_as_gemv(1, rows, cols) {
        return Err((
            "paired_needs_gemv",
            format!(
                "M = {rows} rows, {cols} paired columns: only the GEMV kernels combine column \
                 pairs, up to {} rows where the tiled kernels' grid is small",
                crate::ir::gemm::GEMV_MAX_M
            ),
        ));
    }
    Ok(kg)
}

/// Replaces gate and up by one Gemm with paired columns over their weights' rows interleaved;
/// returns the rewrite's description.
fn rewrite_glu(g: &mut Graph, gate: NodeId, up: NodeId, key: &Key) -> String {
    let Op::Gemm(gg) = g.op(gate) else {
        unreachable!("glu_pair checked both are gemms");
    };
    let gg = (**gg).clone();
    let ops = g.operands(gate);
    let (a, wg, wu) = (ops[0], ops[1], g.operands(up)[1]);
    let params = ops[gg.prologue_slots()].to_vec();
    let (n, k) = (product(&gg.dims.n), product(&key.k));
    let names = [g.node(gate).name.clone(), g.node(up).name.clone()];
    let wnames = [g.node(wg).name.clone(), g.node(wu).name.clone()];
    // Row j of the concat is gate's row j then up's; as [2N, K], rows 2j and 2j + 1.
    let concat = g
        .add_op(Op::Concat { axis: 1 }, &[wg, wu])
        .expect("two [N, K] weights of one dtype concatenate along K");
    let inter_name = unique(g, &format!("{}~{}", wnames[0], wnames[1]));
    let inter = g
        .add_node(
            Some(&inter_name),
            Op::Reshape {
                shape: vec![2 * n as i64, k as i64],
            },
            &[concat],
        )
        .expect("[N, 2K] holds 2N rows of K");
    let mut dims = gg.dims.clone();
    *dims
        .n
        .last_mut()
        .expect("N has a sub-axis: views were checked") *= 2;
    let nk: Vec<usize> = dims.n.iter().chain(&dims.k).copied().collect();
    let strides = Shape(nk).strides();
    let (cols, rows) = strides.split_at(dims.n.len());
    let b = View {
        batch: vec![],
        rows: rows.to_vec(),
        cols: cols.to_vec(),
    };
    let merged = Gemm {
        dims,
        a: gg.a.clone(),
        b,
        out: gg.out.clone(),
        extras: vec![],
        epilogue: gg.epilogue.clone(),
        shape: gg.shape.clone(),
        prologue: gg.prologue,
        paired: true,
    };
    let expr = gg
        .epilogue
        .as_ref()
        .map(|e| e.to_string())
        .unwrap_or_default();
    let mut operands = vec![a, inter];
    operands.extend(params);
    let merged_name = unique(g, &names.join("+"));
    let m = g
        .add_node(Some(&merged_name), Op::Gemm(Box::new(merged)), &operands)
        .expect("the paired gemm's views are the gate's");
    g.replace_all_uses(gate, m)
        .expect("the paired gemm holds the gate's type");
    g.remove_node(gate);
    g.remove_node(up);
    format!(
        "paired {} (gate) and {} (up) into one gemm of N = {} columns combined in pairs by {expr}",
        names[0],
        names[1],
        2 * n
    )
}

/// The member's key and result layout, or why it cannot merge with its siblings.
fn candidate(g: &Graph, id: NodeId, siblings: &[NodeId]) -> Result<(Key, Layout), Refusal> {
    let Op::Gemm(gemm) = g.op(id) else {
        return Err(("not_gemm", "not a gemm".into()));
    };
    if gemm.prologue.is_some() {
        return Err((
            "has_prologue",
            "it has a prologue already (merging runs before norms are folded)".into(),
        ));
    }
    let key = weight_key(g, id)?;
    let layout = slice_checks(g, id, siblings)?;
    Ok((key, layout))
}

/// The checks on a member's batch axes and its B (a weight `[N, K]` read transposed, once),
/// and its key; the paired merge and the slice merge share them.
fn weight_key(g: &Graph, id: NodeId) -> Result<Key, Refusal> {
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
    if gemm.paired {
        return Err(("paired", "its columns are paired already".into()));
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
    Ok(Key {
        a: gemm.a.clone(),
        m: gemm.dims.m.clone(),
        k: gemm.dims.k.clone(),
        dtype: *dtype,
        quant: *quant,
    })
}

/// The rest of a slice-merge member's checks (after [`weight_key`]'s), and the layout its result
/// is written in.
fn slice_checks(g: &Graph, id: NodeId, siblings: &[NodeId]) -> Result<Layout, Refusal> {
    let Op::Gemm(gemm) = g.op(id) else {
        return Err(("not_gemm", "not a gemm".into()));
    };
    let ops = g.operands(id);
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
    let row_major = same_strides(&gemm.dims.m, &gemm.out.rows, want_m)
        && same_strides(&gemm.dims.n, &gemm.out.cols, want_n);
    let rows = product(&gemm.dims.m);
    if row_major && rows == 1 {
        return Ok(Layout::RowMajor);
    }
    if let Some(layout) = outer_n(gemm) {
        return Ok(layout);
    }
    if row_major {
        // Refused when its set is chosen (`spread`): more than one row.
        return Ok(Layout::RowMajor);
    }
    Err((
        "out_not_contiguous",
        "the result is written through a permuting view that neither is row-major nor keeps \
         N's first sub-axis outermost"
            .into(),
    ))
}

/// How a member's result lies in its storage, which decides how a slice of the merged result
/// can be that result in place (a contiguous range of the merged buffer, no copy).
#[derive(Clone, Debug, PartialEq)]
enum Layout {
    /// Row-major (M, N): at one row member i is columns `o_i..o_i + N_i` of a merged `[.., ΣN]`
    /// (at more than one, each slice would be strided: refused, `slices_would_copy`).
    RowMajor,
    /// N's first sub-axis outermost in storage, whatever M: the heads of a projection written
    /// `[1, H, M, D]` for the attention (a batched decode step, a prefill). Member i is heads
    /// `o_i..o_i + H_i` of a merged result of ΣH heads, a contiguous range at any M. Holds what
    /// the members must share: N's other sub-axes, the result view (size-1 sub-axes' strides
    /// and the outer one's, which follows from the rest, zeroed) and the result shape with the
    /// heads' axis zeroed.
    OuterN {
        rest: Vec<usize>,
        out: View,
        shape: Vec<usize>,
        axis: usize,
    },
}

/// The [`Layout::OuterN`] of a Gemm whose result is stored densely with N's first sub-axis
/// outermost and whose shape has only size-1 axes before that sub-axis's; `None` otherwise. A
/// result of one head (MQA's K and V), whose N the GEMM pass did not split, counts as having
/// an outer sub-axis of 1 before its N.
fn outer_n(gemm: &Gemm) -> Option<Layout> {
    let sub_axes = || {
        gemm.dims
            .m
            .iter()
            .zip(&gemm.out.rows)
            .chain(gemm.dims.n.iter().zip(&gemm.out.cols))
    };
    // Dense: the sub-axes with more than one index, by stride, are row-major.
    let mut axes: Vec<(usize, usize)> = sub_axes()
        .filter(|(&size, _)| size > 1)
        .map(|(&size, &stride)| (size, stride))
        .collect();
    axes.sort_by_key(|&(_, stride)| std::cmp::Reverse(stride));
    let mut expect = 1usize;
    for &(size, stride) in axes.iter().rev() {
        if stride != expect {
            return None;
        }
        expect = expect.checked_mul(size)?;
    }
    let (&n0, _) = gemm.dims.n.split_first()?;
    let split = n0 == 1 || axes.first() == Some(&(n0, gemm.out.cols[0]));
    // N's sub-axes after the heads', and the strides of all of N's.
    let (heads, rest, n_strides): (usize, &[usize], Vec<usize>) = if split {
        (n0, &gemm.dims.n[1..], gemm.out.cols.clone())
    } else {
        let mut cols = vec![0];
        cols.extend(&gemm.out.cols);
        (1, &gemm.dims.n[..], cols)
    };
    // The heads' axis of the shape: only size-1 axes before it (the last such axis where there
    // is one head, so that a single head lines up with its siblings' `[1, H, M, D]`).
    let dims = gemm.shape.dims();
    let axis = (0..dims.len())
        .rev()
        .find(|&i| dims[i] == heads && dims[..i].iter().all(|&d| d == 1))?;
    let mut shape = dims.to_vec();
    shape[axis] = 0;
    let zero_unit = |sizes: &[usize], strides: &[usize]| -> Vec<usize> {
        sizes
            .iter()
            .zip(strides)
            .map(|(&s, &t)| if s == 1 { 0 } else { t })
            .collect()
    };
    let mut out = View {
        batch: vec![],
        rows: zero_unit(&gemm.dims.m, &gemm.out.rows),
        cols: vec![0],
    };
    out.cols.extend(zero_unit(rest, &n_strides[1..]));
    Some(Layout::OuterN {
        rest: rest.to_vec(),
        out,
        shape,
        axis,
    })
}

/// A member's heads: N's first sub-axis, or 1 where its N is `rest` alone (see [`outer_n`]).
fn heads_of(gemm: &Gemm, rest: &[usize]) -> usize {
    if gemm.dims.n.len() == rest.len() {
        1
    } else {
        gemm.dims.n[0]
    }
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

/// The merged result of a set of members: its N sub-axes, view and shape, the result axis the
/// members' slices run along and each member's extent on it (N_i, or its heads).
struct Spread {
    n: Vec<usize>,
    out: View,
    shape: Vec<usize>,
    axis: usize,
    extents: Vec<usize>,
}

/// Where `ids` (agreeing on `key` and `layout`) go in the merged result; for heads outermost,
/// an error where a slice would start off the alignment a slice needs to be read in place
/// (codegen would copy it, one kernel a member, more than merging saves).
fn spread(g: &Graph, ids: &[NodeId], key: &Key, layout: &Layout) -> Result<Spread, String> {
    let gemm = |id: NodeId| match g.op(id) {
        Op::Gemm(gemm) => gemm.clone(),
        _ => unreachable!("members are gemms"),
    };
    match layout {
        Layout::RowMajor => {
            // Each slice of a merged result of more than one row is strided: a copy kernel
            // per member would replace the kernels merging saves.
            let rows = product(&key.m);
            if rows != 1 {
                return Err(format!(
                    "M = {rows} rows of a row-major result: each member's slice of the \
                     merged result would be a strided copy"
                ));
            }
            let extents: Vec<usize> = ids.iter().map(|&id| product(&gemm(id).dims.n)).collect();
            let total = extents.iter().sum::<usize>();
            let n = vec![total];
            let dims = GemmDims {
                batch: vec![],
                m: key.m.clone(),
                n: n.clone(),
                k: key.k.clone(),
            };
            let mut shape = key.m.clone();
            shape.push(total);
            Ok(Spread {
                n,
                out: View::contiguous(&dims, Operand::Out),
                axis: shape.len() - 1,
                shape,
                extents,
            })
        }
        Layout::OuterN {
            rest,
            out,
            shape,
            axis,
        } => {
            let extents: Vec<usize> = ids.iter().map(|&id| heads_of(&gemm(id), rest)).collect();
            let heads = extents.iter().sum::<usize>();
            // Elements a head holds: every M row of N's other sub-axes.
            let per_head = product(&key.m) * product(rest);
            let bytes = g.ty(ids[0]).dtype.size_bytes();
            let mut at = 0usize;
            for (&id, &h) in ids.iter().zip(&extents) {
                if !(at * per_head * bytes).is_multiple_of(crate::ir::IN_PLACE_ALIGN_BYTES) {
                    return Err(format!(
                        "%{}'s heads would start at element {} of the merged result, off the \
                         {}-byte boundary a slice needs to be read in place: each would be a \
                         copy",
                        g.node(id).name,
                        at * per_head,
                        crate::ir::IN_PLACE_ALIGN_BYTES
                    ));
                }
                at += h;
            }
            // The shared view, the heads' stride now that there are several (size-1
            // sub-axes' strides stay 0: never used).
            let mut out = out.clone();
            out.cols[0] = per_head;
            let mut shape = shape.clone();
            shape[*axis] = heads;
            let mut n = vec![heads];
            n.extend(rest);
            Ok(Spread {
                n,
                out,
                shape,
                axis: *axis,
                extents,
            })
        }
    }
}

/// Replaces `ids` (agreeing on `key`) by one Gemm over their weights concatenated, laid out as
/// `spread` says; returns the merged node and the rewrite's description.
fn rewrite(g: &mut Graph, ids: &[NodeId], key: &Key, spread: &Spread) -> (NodeId, String) {
    let a = g.operands(ids[0])[0];
    let weights: Vec<NodeId> = ids.iter().map(|&id| g.operands(id)[1]).collect();
    let names: Vec<String> = ids.iter().map(|&id| g.node(id).name.clone()).collect();
    let wnames: Vec<String> = weights.iter().map(|&w| g.node(w).name.clone()).collect();
    let concat_name = unique(g, &wnames.join("+"));
    let concat = g
        .add_node(Some(&concat_name), Op::Concat { axis: 0 }, &weights)
        .expect("weights of one K and dtype concatenate along N");
    let dims = GemmDims {
        batch: vec![],
        m: key.m.clone(),
        n: spread.n.clone(),
        k: key.k.clone(),
    };
    // The concatenated weight [ΣN, K] read transposed: N's sub-axes outer, K's inner.
    let nk: Vec<usize> = dims.n.iter().chain(&dims.k).copied().collect();
    let strides = Shape(nk).strides();
    let (cols, rows) = strides.split_at(dims.n.len());
    let b = View {
        batch: vec![],
        rows: rows.to_vec(),
        cols: cols.to_vec(),
    };
    let merged = Gemm {
        dims,
        a: key.a.clone(),
        b,
        out: spread.out.clone(),
        extras: vec![],
        epilogue: None,
        prologue: None,
        paired: false,
        shape: Shape(spread.shape.clone()),
    };
    let merged_name = unique(g, &names.join("+"));
    let m = g
        .add_node(Some(&merged_name), Op::Gemm(Box::new(merged)), &[a, concat])
        .expect("the merged gemm's views are built valid");
    let mut at = 0usize;
    let mut parts = Vec::new();
    for ((&id, &n), name) in ids.iter().zip(&spread.extents).zip(&names) {
        let slice = g
            .add_op(
                Op::Slice {
                    axis: spread.axis as i64,
                    start: at as i64,
                    end: (at + n) as i64,
                },
                &[m],
            )
            .expect("the slice is inside the merged result");
        parts.push(format!("{name} [{at}..{}]", at + n));
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
    let along = if spread.n.len() == 1 {
        format!("N = {at}")
    } else {
        format!("N = {:?} ({at} heads outermost)", spread.n)
    };
    (
        m,
        format!(
            "merged {} gemms sharing %{} into one of {along}: {}",
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
