//! The GEMM merge (issue 22, D): Gemms that read one A and weights `[N_i, K]` transposed become
//! one Gemm over the weights concatenated along N; each former result is a slice of it. The
//! merged graph computes what the unmerged one does (in the interpreter, on the same data), and
//! what it leaves alone is reported with its reason.

use super::*;
use rocmforge::compile::{fold::fold_weight_concats, optimise, optimise_folded, CompileOptions};
use rocmforge::ir::QuantScheme;
use rocmforge::passes::{explain_text, PassManager};
use rocmforge::runtime::Device;

/// One Gemm per weight, all reading `x` `[1, m, k]`; each result an output.
fn siblings(dtype: DType, m: usize, k: usize, ns: &[usize], quant: Option<QuantScheme>) -> Graph {
    let mut g = Graph::new("siblings");
    let x = g.input("x", dtype, &[1, m, k]).unwrap();
    for (i, &n) in ns.iter().enumerate() {
        let name = format!("w{i}");
        let w = match quant {
            Some(s) => g.weight_quant(&name, dtype, &[n, k], s).unwrap(),
            None => g.weight(&name, dtype, &[n, k]).unwrap(),
        };
        let wt = g.transpose_last(w).unwrap();
        let y = g.matmul(x, wt).unwrap();
        g.rename(y, &format!("y{i}")).unwrap();
        g.add_output(y).unwrap();
    }
    g
}

fn gemm_count(g: &Graph) -> usize {
    g.node_ids()
        .filter(|&id| matches!(g.op(id), Op::Gemm(_)))
        .count()
}

fn merge_report(reports: &[PassReport]) -> PassReport {
    reports
        .iter()
        .find(|r| r.pass == "merge_gemms")
        .cloned()
        .expect("the pipeline runs merge_gemms")
}

/// The optimised graph against the source in the interpreter on the same data: same types,
/// within the dtype's tolerance, no NaN.
fn assert_same_values(source: &Graph, merged: &Graph, seed: u64, what: &str) {
    let b = Bindings::random(source, seed);
    let want = run(source, &b).unwrap();
    let got = run(merged, &b).unwrap();
    assert_eq!(want.len(), got.len(), "{what}");
    for (w, o) in want.iter().zip(&got) {
        assert_eq!(w.ty(), o.ty(), "{what}");
        let (w, o) = (w.to_f64_vec(), o.to_f64_vec());
        assert!(o.iter().chain(&w).all(|v| !v.is_nan()), "{what}: NaN");
        let err = rel_l2(&o, &w);
        assert!(err <= tolerance(DType::F32), "{what}: rel L2 {err:e}");
    }
}

/// The optimised graph has one Gemm, the merge rewrote once and left nothing: that Gemm.
fn merged_into_one(merged: &Graph, reports: &[PassReport], what: &str) -> rocmforge::ir::NodeId {
    assert_eq!(gemm_count(merged), 1, "{what}");
    let r = merge_report(reports);
    assert_eq!(r.rewrites.len(), 1, "{what}: {r}");
    assert!(r.skipped.is_empty(), "{what}: {r}");
    merged
        .node_ids()
        .find(|&id| matches!(merged.op(id), Op::Gemm(_)))
        .unwrap()
}

/// At M > 1 a row-major result's slices would be strided: only members of one N merge, stacked
/// (`[members, M, N]`, each member a contiguous range) where their starts are aligned. The
/// optimised graph has `gemms` Gemms, the merge left members alone with `codes` (sorted), and
/// the values are the source's.
fn assert_prefill(
    g: &Graph,
    merged: &Graph,
    reports: &[PassReport],
    (gemms, codes): (usize, &[&str]),
    what: &str,
) {
    assert_eq!(gemm_count(merged), gemms, "{what}");
    let mut got: Vec<&str> = skipped(reports).iter().map(|c| c.1).collect();
    got.sort();
    assert_eq!(got, codes, "{what}: {reports:?}");
    assert_same_values(g, merged, 3, what);
}

/// What [`assert_prefill`] expects of Q/K/V-like siblings `ns` at 5 rows: the two 192-column
/// members stack; 7, 3 and 5 columns share no N; the 1- and 3-column stacks would start off
/// the 16-byte boundary (5 and 15 values a member).
fn prefill_expected(ns: &[usize]) -> (usize, &'static [&'static str]) {
    match ns {
        [576, 192, 192] => (2, &["layouts_differ"]),
        [7, 3, 5] => (3, &["layouts_differ", "layouts_differ"]),
        [1, 1] => (2, &["slices_would_copy", "slices_would_copy"]),
        [9, 3, 3] => (
            3,
            &["layouts_differ", "slices_would_copy", "slices_would_copy"],
        ),
        _ => unreachable!("no expectation for {ns:?}"),
    }
}

#[test]
fn siblings_merge_into_one_gemm_and_compute_the_same() {
    let cases: &[(&[usize], usize)] = &[(&[576, 192, 192], 96), (&[7, 3, 5], 13), (&[1, 1], 4)];
    for &(ns, k) in cases {
        for dtype in [DType::F32, DType::F16] {
            for m in [1, 5] {
                let what = format!("{dtype} m {m} k {k} ns {ns:?}");
                let g = siblings(dtype, m, k, ns, None);
                let (merged, reports) = optimize(&g).unwrap();
                if m > 1 {
                    assert_prefill(&g, &merged, &reports, prefill_expected(ns), &what);
                    continue;
                }
                let gemm = merged_into_one(&merged, &reports, &what);
                // The merged B is the weights concatenated along N, in the members' order.
                let b = merged.operands(gemm)[1];
                assert!(matches!(merged.op(b), Op::Concat { axis: 0 }), "{what}");
                let parts: Vec<&str> = merged
                    .operands(b)
                    .iter()
                    .map(|&p| merged.node(p).name.as_str())
                    .collect();
                let want: Vec<String> = (0..ns.len()).map(|i| format!("w{i}")).collect();
                assert_eq!(parts, want, "{what}");
                assert_eq!(
                    merged.ty(gemm).shape.dims().last(),
                    Some(&ns.iter().sum::<usize>())
                );
                // The outputs keep their names and types.
                for (i, &o) in merged.outputs().iter().enumerate() {
                    assert_eq!(merged.node(o).name, format!("y{i}"), "{what}");
                }
                assert_same_values(&g, &merged, 3, &what);
            }
        }
    }
}

#[test]
fn quantized_siblings_merge_and_fold_into_one_weight_of_their_blocks() {
    for scheme in [QuantScheme::Q4_1, QuantScheme::Q8_0] {
        for m in [1, 5] {
            for ns in [&[576usize, 192, 192][..], &[9, 3, 3]] {
                let what = format!("{scheme} m {m} ns {ns:?}");
                let g = siblings(DType::F16, m, 64, ns, Some(scheme));
                let (merged, reports) = optimize(&g).unwrap();
                if m > 1 {
                    assert_prefill(&g, &merged, &reports, prefill_expected(ns), &what);
                    continue;
                }
                assert_eq!(gemm_count(&merged), 1, "{what}");
                assert_eq!(merge_report(&reports).rewrites.len(), 1, "{what}");
                assert_same_values(&g, &merged, 5, &what);
                // Folded: the concat is one quantized weight of the concat's name and type.
                let (folded, folds) = optimise_folded(&g, true).unwrap();
                assert_eq!(folds.len(), 1, "{what}");
                assert_eq!(folds[0].parts, ["w0", "w1", "w2"], "{what}");
                assert_eq!(folds[0].quant, Some(scheme));
                let w = folded.find(&folds[0].name).unwrap();
                assert!(
                    matches!(folded.op(w), Op::Weight { quant: Some(s), .. } if *s == scheme),
                    "{what}"
                );
                assert!(folded.find("w0").is_none(), "{what}: parts removed");
                assert_eq!(
                    optimise(&g, true).unwrap().node_count(),
                    folded.node_count()
                );
            }
        }
    }
}

/// Compiled (CPU executor and interpreter devices), the folded weight is bound to its parts'
/// data: the outputs equal the interpreter's on the source graph.
#[test]
fn folded_weights_are_bound_to_their_parts_data() {
    for quant in [None, Some(QuantScheme::Q4_1), Some(QuantScheme::Q8_0)] {
        let g = siblings(DType::F32, 1, 64, &[40, 8, 8], quant);
        let options = CompileOptions {
            seed: 11,
            progress: false,
            ..CompileOptions::default()
        };
        for device in [Device::interp(), Device::cpu_threads(Some(1))] {
            let exe = Graph::compile_with(&g, &device, &options).unwrap();
            let b = Bindings::random(&g, 2);
            let inputs = Bindings {
                inputs: b.inputs.clone(),
                ..Bindings::default()
            };
            let (got, v) = exe.verify(&inputs).unwrap();
            assert_eq!(got.len(), 3);
            for o in &v.outputs {
                assert!(
                    o.error <= tolerance(DType::F32),
                    "{quant:?}: {} off by {}",
                    o.name,
                    o.error
                );
            }
        }
    }
}

fn skipped(reports: &[PassReport]) -> Vec<(String, &'static str)> {
    merge_report(reports)
        .skipped
        .iter()
        .map(|s| (s.at.clone(), s.code))
        .collect()
}

/// `silu(x·W_gateᵀ) · (x·W_upᵀ)` at `m` rows, weights `[n, k]` of `dtype` (or `scheme`).
fn glu(dtype: DType, m: usize, n: usize, k: usize, scheme: Option<QuantScheme>) -> Graph {
    glu_with(dtype, m, n, k, [scheme, scheme])
}

/// [`glu`] with the gate's and the up projection's own schemes.
fn glu_with(
    dtype: DType,
    m: usize,
    n: usize,
    k: usize,
    schemes: [Option<QuantScheme>; 2],
) -> Graph {
    let mut g = Graph::new("mlp");
    let x = g.input("x", dtype, &[1, m, k]).unwrap();
    let w = |g: &mut Graph, name: &str, scheme: Option<QuantScheme>| match scheme {
        Some(s) => g.weight_quant(name, dtype, &[n, k], s).unwrap(),
        None => g.weight(name, dtype, &[n, k]).unwrap(),
    };
    let (wg, wu) = (w(&mut g, "wg", schemes[0]), w(&mut g, "wu", schemes[1]));
    let (tg, tu) = (g.transpose_last(wg).unwrap(), g.transpose_last(wu).unwrap());
    let gate = g.matmul(x, tg).unwrap();
    let up = g.matmul(x, tu).unwrap();
    let s = g.silu(gate).unwrap();
    let h = g.mul(s, up).unwrap();
    g.add_output(h).unwrap();
    g
}

/// Gate and up at GEMV sizes merge into one Gemm with paired columns (N = 2·n) that computes
/// what the two did, for odd n, K not a multiple of a chunk, every float dtype and block
/// schemes; the folded graph reads one weight, the rows interleaved.
#[test]
fn gate_and_up_merge_into_paired_columns() {
    let cases: &[(DType, usize, usize, usize, Option<QuantScheme>)] = &[
        (DType::F32, 1, 37, 19, None),
        (DType::F16, 3, 37, 40, None),
        (DType::BF16, 8, 5, 24, None),
        (DType::F16, 1, 37, 64, Some(QuantScheme::Q4_0)),
        (DType::F16, 2, 9, 64, Some(QuantScheme::Q4_1)),
        (DType::F32, 5, 7, 96, Some(QuantScheme::Q8_0)),
        (DType::F16, 8, 48, 32, None),
        // Past 8 rows: the paired GEMVs take them in groups of 8 rows (up to 64).
        (DType::F16, 33, 37, 40, None),
        (DType::F32, 17, 7, 96, Some(QuantScheme::Q8_0)),
    ];
    for &(dtype, m, n, k, scheme) in cases {
        let what = format!("{dtype} m{m} n{n} k{k} {scheme:?}");
        let g = glu(dtype, m, n, k, scheme);
        let (merged, reports) = optimize(&g).unwrap();
        assert_eq!(gemm_count(&merged), 1, "{what}");
        let r = merge_report(&reports);
        assert_eq!(r.rewrites.len(), 1, "{what}: {r}");
        assert!(skipped(&reports).is_empty(), "{what}: {r}");
        let gemm = merged
            .node_ids()
            .find_map(|id| match merged.op(id) {
                Op::Gemm(gm) => Some(gm.clone()),
                _ => None,
            })
            .unwrap();
        assert!(gemm.paired, "{what}");
        assert_eq!(gemm.dims.n, vec![2 * n], "{what}");
        assert_same_values(&g, &merged, 7, &what);
        // Folded: one weight [2n, k] of the scheme, no concat left; same values.
        let (folded, folds) = optimise_folded(&g, true).unwrap();
        assert_eq!(folds.len(), 1, "{what}");
        assert_eq!(folds[0].outer, n, "{what}");
        assert_eq!(folds[0].ty.shape.dims(), [2 * n, k], "{what}");
        assert_eq!(folds[0].quant, scheme, "{what}");
        assert!(
            !folded
                .node_ids()
                .any(|id| matches!(folded.op(id), Op::Concat { .. })),
            "{what}"
        );
    }
}

#[test]
fn gate_and_up_refusals_are_named() {
    // More rows than the paired GEMVs take (64 in groups of 8), and prefill.
    let g = glu(DType::F32, 65, 8, 32, None);
    let (merged, reports) = optimize(&g).unwrap();
    assert_eq!(gemm_count(&merged), 2);
    let codes = skipped(&reports);
    assert_eq!(codes.len(), 1, "{codes:?}");
    assert_eq!(codes[0].1, "paired_needs_gemv");
    assert_same_values(&g, &merged, 1, "prefill");

    // Different schemes.
    let g = glu_with(
        DType::F16,
        1,
        8,
        64,
        [Some(QuantScheme::Q4_1), Some(QuantScheme::Q8_0)],
    );
    let (merged, reports) = optimize(&g).unwrap();
    assert_eq!(gemm_count(&merged), 2);
    let codes = skipped(&reports);
    assert_eq!(codes[0].1, "schemes_differ", "{codes:?}");
    assert_same_values(&g, &merged, 2, "schemes");

    // Up read elsewhere too: its result must stay.
    let mut g = glu(DType::F32, 1, 8, 32, None);
    let up = g
        .node_ids()
        .find(|&id| {
            g.node(id).name != "x" && matches!(g.op(id), Op::MatMul) && {
                let users = g.consumers(id);
                users.len() == 1 && matches!(g.op(users[0]), Op::Binary(_))
            }
        })
        .unwrap();
    let outs = g.outputs().to_vec();
    g.set_outputs(&[outs[0], up]).unwrap();
    let (merged, reports) = optimize(&g).unwrap();
    assert_eq!(gemm_count(&merged), 2);
    let codes = skipped(&reports);
    assert_eq!(codes[0].1, "up_has_other_uses", "{codes:?}");
    assert!(explain_text(&reports).contains("up_has_other_uses"));
    assert_same_values(&g, &merged, 3, "up read twice");
}

#[test]
fn refusals_are_named() {
    // Different schemes: the two Q4_1 weights merge, the Q8_0 one is left with its reason.
    let mut g = Graph::new("schemes");
    let x = g.input("x", DType::F16, &[1, 1, 64]).unwrap();
    let mut outs = Vec::new();
    for (name, s) in [
        ("a", QuantScheme::Q4_1),
        ("b", QuantScheme::Q8_0),
        ("c", QuantScheme::Q4_1),
    ] {
        let w = g.weight_quant(name, DType::F16, &[16, 64], s).unwrap();
        let t = g.transpose_last(w).unwrap();
        outs.push(g.matmul(x, t).unwrap());
    }
    for o in outs {
        g.add_output(o).unwrap();
    }
    let (merged, reports) = optimize(&g).unwrap();
    assert_eq!(gemm_count(&merged), 2);
    let codes = skipped(&reports);
    assert_eq!(codes.len(), 1, "{codes:?}");
    assert_eq!(codes[0].1, "schemes_differ");
    assert_same_values(&g, &merged, 2, "schemes");

    // B not a weight: an input as B; and A read through another view (x and xᵀ).
    let mut g = Graph::new("views");
    let x = g.input("x", DType::F32, &[8, 8]).unwrap();
    let y = g.input("y", DType::F32, &[8, 6]).unwrap();
    let w = g.weight("w", DType::F32, &[5, 8]).unwrap();
    let wt = g.transpose_last(w).unwrap();
    let xt = g.transpose_last(x).unwrap();
    let p = g.matmul(x, y).unwrap();
    let q = g.matmul(x, wt).unwrap();
    let w2 = g.weight("w2", DType::F32, &[3, 8]).unwrap();
    let w2t = g.transpose_last(w2).unwrap();
    let r = g.matmul(xt, w2t).unwrap();
    for o in [p, q, r] {
        g.add_output(o).unwrap();
    }
    let (merged, reports) = optimize(&g).unwrap();
    assert_eq!(gemm_count(&merged), 3);
    let mut codes: Vec<&str> = skipped(&reports).iter().map(|c| c.1).collect();
    codes.sort();
    assert_eq!(codes, ["b_not_weight", "different_a"], "{reports:?}");
    assert_same_values(&g, &merged, 4, "views");

    // A residual epilogue on one member: refused for that member, the others merge.
    let mut g = siblings(DType::F32, 1, 16, &[8, 8, 8], None);
    let outs = g.outputs().to_vec();
    let res = g.input("res", DType::F32, &[1, 1, 8]).unwrap();
    let sum = g.add(outs[2], res).unwrap();
    g.set_outputs(&[outs[0], outs[1], sum]).unwrap();
    let (merged, reports) = optimize(&g).unwrap();
    assert_eq!(gemm_count(&merged), 2);
    let codes = skipped(&reports);
    assert_eq!(codes.len(), 1, "{codes:?}");
    assert_eq!(codes[0].1, "epilogue_per_slice");
    assert_same_values(&g, &merged, 6, "epilogue");
}

/// The pass alone is idempotent: a second run finds one Gemm per A and rewrites nothing.
#[test]
fn merging_twice_changes_nothing() {
    let g = siblings(DType::F32, 1, 32, &[16, 8, 8], None);
    let (mut merged, _) = optimize(&g).unwrap();
    let before = rocmforge::ir::to_text(&merged).unwrap();
    let reports = PassManager::default_pipeline().run(&mut merged).unwrap();
    assert!(merge_report(&reports).rewrites.is_empty());
    assert_eq!(rocmforge::ir::to_text(&merged).unwrap(), before);
    // Folding a graph without concats of weights folds nothing.
    let mut plain = siblings(DType::F32, 1, 32, &[16], None);
    assert!(fold_weight_concats(&mut plain).unwrap().is_empty());
}

/// At M = 1 each slice is a contiguous range of the merged result: codegen binds it in place
/// (an alias at an element offset, no kernel); an output that is a slice gets a buffer of its
/// own (one copy); the memory plan keeps the merged buffer alive while an alias is read.
#[test]
fn slices_of_the_merged_result_are_read_in_place() {
    use rocmforge::arch::Target;
    use rocmforge::codegen::{generate, BufferRole};
    use rocmforge::compile::plan_memory;
    let target = Target::parse("sm_90").unwrap();
    let alias_offsets = |p: &rocmforge::codegen::KernelPlan| -> Vec<usize> {
        p.buffers
            .iter()
            .filter_map(|b| match b.role {
                BufferRole::Alias { offset, .. } => Some(offset),
                _ => None,
            })
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect()
    };
    // Outputs that are slices: copied out, one kernel each.
    let g = siblings(DType::F32, 1, 32, &[24, 8, 8], None);
    let plan = generate(&optimise(&g, true).unwrap(), &target).unwrap();
    assert_eq!(alias_offsets(&plan), [0, 24, 32]);
    assert_eq!(plan.kernels.len(), 4, "{}", plan.listing());
    for o in &plan.outputs {
        assert_eq!(plan.buffers[o.buffer].role, BufferRole::Computed);
    }
    // Slices read by kernels: no copy; each reader binds the merged buffer.
    let mut g = siblings(DType::F32, 1, 32, &[24, 8, 8], None);
    let outs = g.outputs().to_vec();
    let mut consumers = Vec::new();
    for &o in &outs {
        // Not elementwise: the GEMM pass would fold that into the Gemm as an epilogue.
        consumers.push(g.softmax(o, -1).unwrap());
    }
    // The last reader of the first slice comes after the others' readers.
    let late = g
        .reduce(rocmforge::ir::ReduceOp::Sum, outs[0], &[-1], true)
        .unwrap();
    consumers.push(late);
    g.set_outputs(&consumers).unwrap();
    let plan = generate(&optimise(&g, true).unwrap(), &target).unwrap();
    assert_eq!(alias_offsets(&plan), [0, 24, 32]);
    assert!(
        plan.kernels.iter().all(|k| k.family != "copy"),
        "{}",
        plan.listing()
    );
    let mem = plan_memory(&plan);
    let gemm = plan
        .kernels
        .iter()
        .position(|k| k.family.starts_with("gemm"))
        .unwrap();
    let base = plan.kernels[gemm].written().next().unwrap();
    let last_read = plan
        .kernels
        .iter()
        .rposition(|k| k.args.iter().any(|&a| plan.storage(a).0 == base))
        .unwrap();
    assert!(last_read > gemm + 1);
    for k in &plan.kernels[gemm + 1..=last_read] {
        for w in k.written() {
            if let Some(s) = mem.slot_of.get(&w) {
                assert_ne!(*s, mem.slot_of[&base], "{}", plan.listing());
            }
        }
    }
    // A slice starting off a 16-byte boundary (7 f32 = 28 bytes) is copied: kernels load
    // 16 bytes at a time from their operands' starts.
    let mut g = siblings(DType::F32, 1, 32, &[7, 3, 5], None);
    let outs = g.outputs().to_vec();
    let soft: Vec<_> = outs.iter().map(|&o| g.softmax(o, -1).unwrap()).collect();
    g.set_outputs(&soft).unwrap();
    let plan = generate(&optimise(&g, true).unwrap(), &target).unwrap();
    assert_eq!(alias_offsets(&plan), [0]);
    assert_eq!(
        plan.kernels.iter().filter(|k| k.family == "copy").count(),
        2,
        "{}",
        plan.listing()
    );
    // Interpreted (unfolded: the folded weight's data is bound by the compile layer), the
    // graph still computes what it did before the merge.
    assert_same_values(&g, &optimize(&g).unwrap().0, 8, "consumers");
}

/// A layer's Q, K and V projections of `m` rows as a model lowers them for the attention: each
/// `x·Wᵀ` split into heads of `d` and permuted to `[1, H, m, d]`, read by a softmax (a consumer
/// the GEMM pass does not fold).
fn projections(dtype: DType, m: usize, k: usize, heads: &[usize], d: usize) -> Graph {
    let mut g = Graph::new("projections");
    let x = g.input("x", dtype, &[1, m, k]).unwrap();
    let mut outs = Vec::new();
    for (i, &h) in heads.iter().enumerate() {
        let w = g.weight(&format!("w{i}"), dtype, &[h * d, k]).unwrap();
        let wt = g.transpose_last(w).unwrap();
        let y = g.matmul(x, wt).unwrap();
        let y = g.reshape(y, &[1, m as i64, h as i64, d as i64]).unwrap();
        let y = g.permute(y, &[0, 2, 1, 3]).unwrap();
        g.rename(y, &format!("y{i}")).unwrap();
        outs.push(g.softmax(y, -1).unwrap());
    }
    g.set_outputs(&outs).unwrap();
    g
}

/// Projections written heads-major (`[1, H, M, D]`, the attention's layout) merge at any M:
/// the merged result holds every member's heads one after another, so each member is a
/// contiguous range of it, read in place (no copy kernel) — a batched decode step's and a
/// prefill's Q/K/V in one GEMM. Single heads (MQA's K and V) line up with the rest.
#[test]
fn heads_major_projections_merge_at_any_rows() {
    use rocmforge::arch::Target;
    use rocmforge::codegen::{generate, BufferRole};
    let target = Target::parse("sm_90").unwrap();
    let cases: &[(&[usize], usize, usize)] = &[(&[9, 3, 3], 16, 64), (&[4, 1, 1], 8, 32)];
    for &(heads, d, k) in cases {
        for dtype in [DType::F32, DType::F16] {
            for m in [1, 5, 33] {
                let what = format!("{dtype} m {m} heads {heads:?} d {d}");
                let g = projections(dtype, m, k, heads, d);
                let (merged, reports) = optimize(&g).unwrap();
                let gemm = merged_into_one(&merged, &reports, &what);
                let total: usize = heads.iter().sum();
                if m > 1 {
                    assert_eq!(merged.ty(gemm).shape.dims(), [1, total, m, d], "{what}");
                }
                assert_same_values(&g, &merged, 5, &what);
                // Each member's heads are read where the merged GEMM wrote them.
                let plan = generate(&optimise(&g, true).unwrap(), &target).unwrap();
                let mut offsets: Vec<usize> = plan
                    .buffers
                    .iter()
                    .filter_map(|b| match b.role {
                        BufferRole::Alias { offset, .. } => Some(offset),
                        _ => None,
                    })
                    .collect();
                offsets.sort();
                let mut want = vec![0];
                for &h in &heads[..heads.len() - 1] {
                    want.push(want.last().unwrap() + h * m * d);
                }
                assert_eq!(offsets, want, "{what}\n{}", plan.listing());
                assert!(
                    plan.kernels.iter().all(|k| k.family != "copy"),
                    "{what}\n{}",
                    plan.listing()
                );
            }
        }
    }
}

/// Heads-major members whose slices would start off the 16-byte boundary are left alone as
/// `slices_would_copy` (each slice would be a copy kernel); members written in different
/// layouts as `layouts_differ`.
#[test]
fn heads_major_refusals_are_named() {
    // f32 heads of 3 values over 5 rows: the second member starts at byte 2·15·4 = 120.
    let g = projections(DType::F32, 5, 16, &[2, 1], 3);
    let (merged, reports) = optimize(&g).unwrap();
    assert_eq!(gemm_count(&merged), 2);
    let codes: Vec<&str> = skipped(&reports).iter().map(|c| c.1).collect();
    assert_eq!(codes, ["slices_would_copy"; 2], "{reports:?}");
    assert_same_values(&g, &merged, 6, "misaligned");

    // Two heads-major projections and one row-major result of the same x: the pair merges.
    let mut g = projections(DType::F32, 5, 16, &[2, 2], 8);
    let x = g.find("x").unwrap();
    let w = g.weight("w_plain", DType::F32, &[8, 16]).unwrap();
    let wt = g.transpose_last(w).unwrap();
    let y = g.matmul(x, wt).unwrap();
    let s = g.softmax(y, -1).unwrap();
    let mut outs = g.outputs().to_vec();
    outs.push(s);
    g.set_outputs(&outs).unwrap();
    let (merged, reports) = optimize(&g).unwrap();
    assert_eq!(gemm_count(&merged), 2);
    let codes: Vec<&str> = skipped(&reports).iter().map(|c| c.1).collect();
    assert_eq!(codes, ["layouts_differ"], "{reports:?}");
    assert_same_values(&g, &merged, 7, "layouts");
}
