//! Issue 22 (D): the real SmolLM2 decode plan on sm_90 loses three kernels per layer once the
//! Q/K/V GEMVs of each layer merge into one, with the slices read in place, and gate/up into one
//! paired-column GEMV (no GPU needed: the plan is counted). The quantized GEMVs still read the
//! merged weights' blocks (no dequantize kernel).

use super::*;
use rocmforge::arch::Target;
use rocmforge::codegen::{generate, BufferRole};
use rocmforge::passes::{
    DeadCode, DecodeAppend, FoldNormIntoGemv, FoldRope, FormGemm, FuseAttention, FuseElementwise,
    PagedAppend, PassManager, RecognizeActivations, RecognizeNorms, RecognizeSoftmax,
};

/// The default pipeline without the merge (the same passes in the same order, `merge_gemms`
/// and its dead-code pass left out), so the difference is the merge's alone.
fn without_merge() -> PassManager {
    PassManager::cleanup()
        .with(RecognizeSoftmax)
        .with(RecognizeNorms)
        .with(RecognizeActivations)
        .with(FuseAttention)
        .with(DeadCode)
        .with(FoldRope)
        .with(DecodeAppend)
        .with(PagedAppend)
        .with(DeadCode)
        .with(FuseElementwise)
        .with(DeadCode)
        .with(FormGemm)
        .with(DeadCode)
        .with(FoldNormIntoGemv)
        .with(DeadCode)
}

#[test]
fn smollm2_decode_plan_loses_three_kernels_per_layer() {
    // The comparison pipeline is the default one less the merge and its dead-code pass.
    let mut want = PassManager::default_pipeline().names();
    let at = want.iter().position(|n| *n == "merge_gemms").unwrap();
    want.drain(at..at + 2);
    assert_eq!(without_merge().names(), want);
    let Some(path) = smollm2::gguf_if_present() else {
        return;
    };
    let m = LlamaModel::load(&path).unwrap();
    let layers = m.config.num_hidden_layers;
    let g = m
        .kv_graph(1, 512, Precision::quantized(DType::F16), true)
        .unwrap();
    let target = Target::parse("sm_90").unwrap();
    let mut unmerged = g.clone();
    without_merge().run(&mut unmerged).unwrap();
    let before = generate(&unmerged, &target).unwrap();
    let merged = rocmforge::compile::optimise(&g, true).unwrap();
    let after = generate(&merged, &target).unwrap();
    // Q, K and V into one (two fewer), gate and up into one paired-column GEMV (one fewer).
    assert_eq!(
        after.kernels.len() + 3 * layers,
        before.kernels.len(),
        "{} kernels before, {} after, {layers} layers",
        before.kernels.len(),
        after.kernels.len()
    );
    let count = |p: &rocmforge::codegen::KernelPlan, family: &str| {
        p.kernels.iter().filter(|k| k.family == family).count()
    };
    // Every kernel family but the GEMMs' keeps its count: no slice copies, no dequantization.
    for k in &before.kernels {
        if !k.family.starts_with("gemm") {
            assert_eq!(
                count(&before, k.family),
                count(&after, k.family),
                "{}",
                k.family
            );
        }
    }
    // Two aliases per layer at least (q, k, v slices read in place), each of a computed base.
    let aliases = after
        .buffers
        .iter()
        .filter(|b| matches!(b.role, BufferRole::Alias { .. }))
        .count();
    assert!(aliases >= 3 * layers, "{aliases} aliases");
    // The merged weights are quantized weights bound once (their blocks read by the GEMV).
    let folded = |mark: char| {
        after
            .buffers
            .iter()
            .filter(|b| matches!(b.role, BufferRole::QuantWeight(_)) && b.name.contains(mark))
            .count()
    };
    // Q+K+V concatenated, gate~up interleaved.
    assert_eq!(folded('+'), layers);
    assert_eq!(folded('~'), layers);
    // Two rewrites per layer, nothing left alone.
    let mut g2 = g.clone();
    let reports = PassManager::default_pipeline().run(&mut g2).unwrap();
    let merge = reports.iter().find(|r| r.pass == "merge_gemms").unwrap();
    assert_eq!(merge.rewrites.len(), 2 * layers, "{merge}");
    assert!(merge.skipped.is_empty(), "{merge}");
}
