//! Norm into GEMV (`passes::norm_gemv`, issue 22 (C)): a RMSNorm/LayerNorm read only by
//! GEMV-sized Gemms as their A becomes each Gemm's prologue, and the fused graph computes
//! bit for bit what the unfused one computes in the interpreter (every dtype: the prologue
//! rounds the normalised rows to A's dtype exactly as the norm node's output is); every
//! refusal leaves the norm with its named reason.

use super::*;
use crate::norm_cases::{cases, has_norm, NormCase};
use rocmforge::ir::{NodeId, NormKind, Tensor};

/// The norm_gemv pass's report among `reports`.
fn norm_report(reports: &[PassReport]) -> &PassReport {
    reports.iter().find(|r| r.pass == "norm_gemv").unwrap()
}

fn bits(t: &Tensor) -> Vec<u64> {
    t.to_f64_vec().iter().map(|v| v.to_bits()).collect()
}

#[test]
fn folded_norms_compute_the_unfused_bits() {
    for case in cases() {
        let g = case.graph();
        let (fused, reports) = optimize(&g).unwrap();
        let name = case.name();
        assert!(!has_norm(&fused), "{name}: the norm is left");
        assert_eq!(norm_report(&reports).rewrites.len(), 1, "{name}");
        let gemms: Vec<NodeId> = fused
            .node_ids()
            .filter(|&id| matches!(fused.op(id), Op::Gemm(_)))
            .collect();
        assert_eq!(gemms.len(), 1 + usize::from(case.two), "{name}");
        for &id in &gemms {
            let Op::Gemm(gm) = fused.op(id) else {
                unreachable!()
            };
            let p = gm.prologue.expect("a prologue");
            let want = if case.layer {
                NormKind::Layer
            } else {
                NormKind::Rms
            };
            assert_eq!((p.norm, p.eps), (want, 1e-5), "{name}");
            // The norm's input is A; its weight (and bias) follow the extras.
            let ops = fused.operands(id);
            assert_eq!(fused.node(ops[0]).name, "x", "{name}");
            let params: Vec<&str> = ops[gm.prologue_slots()]
                .iter()
                .map(|&o| fused.node(o).name.as_str())
                .collect();
            let want: &[&str] = if case.layer {
                &["norm_w", "norm_b"]
            } else {
                &["norm_w"]
            };
            assert_eq!(params, want, "{name}");
        }
        // The epilogue is kept.
        if case.residual {
            assert!(fused.node_ids().any(|id| matches!(fused.op(id),
                Op::Gemm(gm) if gm.epilogue.is_some() && gm.extras.len() == 1)));
        }
        let b = Bindings::random(&g, 5);
        let (want, got) = (run(&g, &b).unwrap(), run(&fused, &b).unwrap());
        for (w, o) in want.iter().zip(&got) {
            assert_eq!(w.ty(), o.ty(), "{name}");
            assert!(o.to_f64_vec().iter().all(|v| v.is_finite()), "{name}");
            assert!(
                bits(w) == bits(o),
                "{name}: the fused graph computes other bits"
            );
        }
    }
}

/// The refusal codes of the norm_gemv pass on `g`, and whether a norm is left.
fn refusals(g: &Graph) -> (Vec<&'static str>, bool) {
    let (fused, reports) = optimize(g).unwrap();
    let r = norm_report(&reports);
    assert!(r.rewrites.is_empty(), "{r}");
    (r.skipped.iter().map(|s| s.code).collect(), has_norm(&fused))
}

fn rms(g: &mut Graph, m: usize, k: usize) -> NodeId {
    let x = g.input("x", DType::F32, &[m, k]).unwrap();
    let w = g.weight("norm_w", DType::F32, &[k]).unwrap();
    g.rms_norm(x, w, 1e-6).unwrap()
}

fn linear(g: &mut Graph, h: NodeId, name: &str, n: usize, k: usize) -> NodeId {
    let w = g.weight(name, DType::F32, &[n, k]).unwrap();
    let wt = g.permute(w, &[1, 0]).unwrap();
    g.matmul(h, wt).unwrap()
}

#[test]
fn a_norm_with_another_reader_stays() {
    let mut g = Graph::new("other_reader");
    let h = rms(&mut g, 2, 24);
    let y = linear(&mut g, h, "w", 5, 24);
    let e = g.unary(UnaryOp::Exp, h).unwrap();
    g.set_outputs(&[y, e]).unwrap();
    assert_eq!(refusals(&g), (vec!["read_by_non_gemm"], true));
}

#[test]
fn a_norm_that_is_an_output_stays() {
    let mut g = Graph::new("norm_output");
    let h = rms(&mut g, 2, 24);
    let y = linear(&mut g, h, "w", 5, 24);
    g.set_outputs(&[y, h]).unwrap();
    assert_eq!(refusals(&g), (vec!["norm_is_output"], true));
}

#[test]
fn a_norm_before_a_large_m_gemm_stays() {
    // Past the GEMVs' row groups (64 rows), and at 32 rows where the tiled kernels' grid is
    // large (128 tiles of 64 × 64: `ir::gemm::runs_as_gemv`).
    for (m, n) in [(65, 5), (32, 128 * 64)] {
        let mut g = Graph::new("prefill");
        let h = rms(&mut g, m, 24);
        let y = linear(&mut g, h, "w", n, 24);
        g.set_outputs(&[y]).unwrap();
        assert_eq!(
            refusals(&g),
            (vec!["m_above_gemv_bound"], true),
            "M {m} N {n}"
        );
    }
    // 33 rows on a small N: the GEMV takes them in groups, so the norm folds.
    let mut g = Graph::new("batched");
    let h = rms(&mut g, 33, 24);
    let y = linear(&mut g, h, "w", 5, 24);
    g.set_outputs(&[y]).unwrap();
    let (fused, reports) = optimize(&g).unwrap();
    assert_eq!(norm_report(&reports).rewrites.len(), 1);
    assert!(!has_norm(&fused));
    // One reader past the bound keeps the norm for the other readers too.
    let mut g = Graph::new("mixed");
    let h = rms(&mut g, 65, 24);
    let y = linear(&mut g, h, "w", 5, 24);
    let h2 = g.slice(h, 0, 0, 2).unwrap();
    let z = linear(&mut g, h2, "w2", 5, 24);
    g.set_outputs(&[y, z]).unwrap();
    let (codes, left) = refusals(&g);
    assert!(left && !codes.is_empty(), "{codes:?}");
}

#[test]
fn a_norm_read_across_its_axis_stays() {
    // hᵀ · W: the Gemm's K is the norm's rows, not its axis.
    let mut g = Graph::new("across");
    let h = rms(&mut g, 6, 8);
    let ht = g.permute(h, &[1, 0]).unwrap();
    let w = g.weight("w", DType::F32, &[6, 5]).unwrap();
    let y = g.matmul(ht, w).unwrap();
    g.set_outputs(&[y]).unwrap();
    assert_eq!(refusals(&g), (vec!["a_not_contiguous_over_k"], true));
}

#[test]
fn a_norm_read_as_b_stays() {
    let mut g = Graph::new("as_b");
    let h = rms(&mut g, 6, 8);
    let q = g.input("q", DType::F32, &[1, 6]).unwrap();
    let y = g.matmul(q, h).unwrap();
    g.set_outputs(&[y]).unwrap();
    assert_eq!(refusals(&g), (vec!["read_not_as_a"], true));
}

#[test]
fn the_prologue_survives_the_file_format_and_shows_in_dumps() {
    let case = NormCase {
        layer: true,
        dtype: DType::F16,
        scheme: None,
        m: 2,
        n: 7,
        k: 24,
        two: false,
        residual: true,
    };
    let fused = case.fused();
    let text = rocmforge::ir::to_text(&fused).unwrap();
    assert!(text.contains("prologue=layer_norm(eps=0.00001)"), "{text}");
    let json = rocmforge::ir::format::to_json_string(&fused).unwrap();
    let back = rocmforge::ir::format::from_json_str(&json).unwrap();
    assert_eq!(rocmforge::ir::to_text(&back).unwrap(), text);
}
