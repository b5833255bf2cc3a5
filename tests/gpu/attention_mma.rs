//! GPU trials of the matrix-core FlashAttention (issue 13): every head size it takes (64, 96, 128,
//! 256) at sizes that are not multiples of its tiles, with additive, boolean and padding masks,
//! causal offsets on both sides (Sq < Sk, Sq > Sk, rows with no visible key), and GQA with three
//! query heads per K/V head; each against the interpreter on the same rounded inputs. The
//! `attention_mma_portable` trials force the choices MFMA/WMMA targets get (register staging,
//! element loads from padded tiles, P through shared memory: `AttentionAccess::PORTABLE`), so
//! that an NVIDIA GPU runs the structure AMD runs.
//!
//! Every trial first checks that the kernel it runs is the matrix-core one (a problem the
//! kernel does not take would silently test the scalar kernel instead).

use std::sync::Arc;

use rocmforge::codegen::{
    generate_with, AttentionAccess, CodegenOptions, F32Matmul, Kernel, WgmmaAttention,
};
use rocmforge::compile::{CompileOptions, KernelRewrite};
use rocmforge::ir::DType;
use rocmforge::passes::PassManager;
use rocmforge::runtime::Device;

use crate::attention::{check_attention_plan, check_attention_plan_within};
use crate::common::attention_graphs::{build, Mask, Scale, Spec};
use crate::harness::push;
use libtest_mimic::{Failed, Trial};

/// Which matrix-core attention kernel a trial runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// mma.sync, MFMA or WMMA (`kernels/attention/mma.rs`), the warpgroup kernel turned off.
    Mma,
    /// The sm_90a warpgroup kernel (`kernels/attention/wgmma.rs`) with this schedule.
    Wgmma(WgmmaAttention),
}

impl Kind {
    fn option(self) -> WgmmaAttention {
        match self {
            Kind::Mma => WgmmaAttention::Off,
            Kind::Wgmma(w) => w,
        }
    }
}

/// The attention kernel of `spec` on the device's target with `access`, which must be the
/// `kind` kernel.
fn mma_kernel(
    device: &Device,
    spec: &Spec,
    access: Option<AttentionAccess>,
    kind: Kind,
) -> Result<Kernel, Failed> {
    let target = device.target().ok_or("the device has no codegen target")?;
    let mut g = build(spec);
    PassManager::default_pipeline()
        .run(&mut g)
        .map_err(|e| e.to_string())?;
    let plan = generate_with(
        &g,
        target,
        &CodegenOptions {
            attention_access: access,
            wgmma_attention: kind.option(),
            ..CodegenOptions::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let k = plan
        .kernels
        .into_iter()
        .find(|k| k.family == "flash_attention")
        .ok_or(format!("{spec:?}: attention did not fuse"))?;
    let marker = match kind {
        Kind::Mma => "FlashAttention-2 on matrix cores",
        Kind::Wgmma(_) => "FlashAttention on Hopper's warpgroup MMA",
    };
    if !k.body.contains(marker) {
        return Err(format!("{spec:?} on {}: not the {kind:?} kernel", target.arch).into());
    }
    if access == Some(AttentionAccess::PORTABLE) && !k.body.contains("Ps[") {
        return Err(format!("{spec:?}: the portable kernel keeps P out of shared memory").into());
    }
    Ok(k)
}

/// Fused attention with the matrix-core kernel rendered with `access`, against the interpreter.
fn check(
    device: &Device,
    spec: Spec,
    seed: u64,
    access: Option<AttentionAccess>,
    kind: Kind,
) -> Result<(), Failed> {
    let kernel = mma_kernel(device, &spec, access, kind)?;
    let kernel_body = kernel.body.clone();
    let rewrite: KernelRewrite = Arc::new(move |k| {
        // The compile path lowers the same fused graph: the node and its buffers are the same.
        if k.family == "flash_attention" && k.node == kernel.node && k.args == kernel.args {
            *k = kernel.clone();
        }
    });
    let ran = check_attention_plan(
        device,
        spec,
        seed,
        CompileOptions {
            rewrite_kernels: Some(rewrite),
            wgmma_attention: kind.option(),
            ..crate::harness::options()
        },
    )?;
    // The rewrite only replaces a kernel it recognises: if none matched, the target's own
    // kernel ran and the result says nothing about the one rendered with `access`.
    let attention: Vec<&String> = ran
        .iter()
        .filter(|(family, _)| *family == "flash_attention")
        .map(|(_, body)| body)
        .collect();
    if attention.len() != 1 || *attention[0] != kernel_body {
        return Err(format!(
            "{spec:?} ({access:?}): the plan that ran has {} attention kernel(s), not the one \
             rendered for this trial",
            attention.len()
        )
        .into());
    }
    Ok(())
}

/// (b, hq, hkv, sq, sk, d, dtype, mask, causal offset)
type Case = (usize, usize, usize, usize, usize, usize, DType, Mask, i64);

fn cases() -> Vec<Case> {
    vec![
        // 24 heads x 6 tiles of 128 rows: the 128-row configurations; GQA 3.
        (2, 12, 4, 701, 903, 64, DType::F16, Mask::None, 0),
        (2, 12, 4, 701, 903, 64, DType::BF16, Mask::Causal, 202),
        (2, 12, 4, 650, 517, 96, DType::F16, Mask::Padding, 0),
        (2, 12, 4, 650, 517, 96, DType::BF16, Mask::Causal, 0),
        (2, 12, 12, 555, 777, 128, DType::F16, Mask::BoolNegInf, 0),
        (2, 12, 4, 555, 777, 128, DType::F16, Mask::Causal, 222),
        (1, 12, 4, 333, 301, 256, DType::F16, Mask::Causal, -7),
        (1, 12, 4, 333, 301, 256, DType::BF16, Mask::PerHead, 0),
        // Small: the 64-row configurations; Sq > Sk with rows that see no key.
        (1, 3, 1, 77, 45, 64, DType::F16, Mask::Causal, -20),
        (2, 3, 1, 50, 130, 128, DType::BF16, Mask::Dense2d, 0),
        (1, 6, 2, 19, 1000, 256, DType::F16, Mask::Padding, 0),
    ]
}

/// The attention graph of a case: scores scaled by multiplication, the softmax in f32.
fn spec_of((b, hq, hkv, sq, sk, d, dtype, mask, offset): Case) -> Spec {
    Spec {
        hkv,
        sk,
        dtype,
        mask,
        scale: Scale::MulScores,
        cast_softmax: true,
        offset,
        ..Spec::new(b, hq, sq, d)
    }
}

/// Cases of the warpgroup kernel beyond [`cases`]: D 192 (three panels), the benchmark's
/// shapes (three warpgroups a block at D 64), a kv tile count of one, and a problem of one
/// block.
fn wgmma_cases() -> Vec<Case> {
    vec![
        (1, 4, 2, 200, 200, 192, DType::F16, Mask::Causal, 0),
        (2, 16, 16, 1031, 1031, 64, DType::BF16, Mask::None, 0),
        (2, 16, 8, 1031, 1031, 128, DType::F16, Mask::Causal, 0),
        (1, 2, 2, 64, 100, 128, DType::F16, Mask::None, 0),
        (1, 1, 1, 17, 33, 64, DType::BF16, Mask::Padding, 0),
    ]
}

/// f32 attention at TF32 (`F32Matmul::Tf32`, opt-in) against the exact f32 interpreter within
/// `TF32_REL_L2`: the plan's attention kernel must be the matrix-core one on the TF32 atom where
/// the target has one (head sizes up to 128), else exact f32 with the plan's note saying so.
fn check_tf32(device: &Device, spec: Spec, seed: u64) -> Result<(), Failed> {
    let target = device.target().ok_or("the device has no codegen target")?;
    let has_tf32 = target
        .caps
        .mma
        .iter()
        .any(|a| a.precision == rocmforge::arch::mma::Precision::Tf32);
    let mut g = build(&spec);
    PassManager::default_pipeline()
        .run(&mut g)
        .map_err(|e| e.to_string())?;
    let on = CodegenOptions {
        f32_matmul: F32Matmul::Tf32,
        ..CodegenOptions::default()
    };
    let plan = generate_with(&g, target, &on).map_err(|e| e.to_string())?;
    let tf32 = plan
        .kernels
        .iter()
        .any(|k| k.family == "flash_attention" && k.body.contains("at TF32 precision"));
    if tf32 != has_tf32 || plan.notes.is_empty() != has_tf32 {
        return Err(format!(
            "{spec:?} on {}: TF32 kernel {tf32}, notes {:?}",
            target.arch, plan.notes
        )
        .into());
    }
    let ran = check_attention_plan_within(
        device,
        spec,
        seed,
        CompileOptions {
            f32_matmul: F32Matmul::Tf32,
            ..crate::harness::options()
        },
        crate::common::accuracy::TF32_REL_L2,
    )?;
    if has_tf32
        && !ran
            .iter()
            .any(|(_, body)| body.contains("at TF32 precision"))
    {
        return Err(format!("{spec:?}: the plan that ran has no TF32 attention kernel").into());
    }
    Ok(())
}

/// f32 cases for the TF32 kernel: the head sizes it takes (64, 96, 128), masks, causal offsets
/// either way (rows with no visible key), GQA, sizes off the tiles.
fn tf32_cases() -> Vec<Case> {
    vec![
        (2, 12, 4, 701, 903, 64, DType::F32, Mask::None, 0),
        (2, 12, 4, 701, 903, 64, DType::F32, Mask::Causal, 202),
        (2, 12, 4, 650, 517, 96, DType::F32, Mask::Padding, 0),
        (2, 12, 12, 555, 777, 128, DType::F32, Mask::BoolNegInf, 0),
        (2, 12, 4, 555, 777, 128, DType::F32, Mask::Causal, 222),
        (1, 3, 1, 77, 45, 64, DType::F32, Mask::Causal, -20),
        (2, 3, 1, 50, 130, 128, DType::F32, Mask::Dense2d, 0),
        (1, 6, 2, 19, 1000, 96, DType::F32, Mask::PerHead, 0),
    ]
}

/// `attention_mma::{i}` (the target's own choices, the warpgroup kernel off),
/// `attention_mma_portable::{i}` and, where the device has warpgroup MMA (sm_90a),
/// `attention_wgmma::{i}` over the same cases where the head size is whole 64-column panels,
/// and more.
pub fn trials(device: &Device, ignored: &Option<String>, out: &mut Vec<Trial>) {
    for (i, case) in tf32_cases().into_iter().enumerate() {
        let (spec, d) = (spec_of(case), case.5);
        let mask = spec.mask;
        let dev = device.clone();
        push(
            out,
            ignored,
            format!("attention_tf32::{i}::d{d}::{mask:?}"),
            Box::new(move || check_tf32(&dev, spec, 90 + i as u64)),
        );
    }
    let wgmma = device.target().is_some_and(|t| !t.caps.wgmma.is_empty());
    if wgmma {
        let all = cases().into_iter().chain(wgmma_cases());
        for (i, case) in all.enumerate() {
            let (spec, d) = (spec_of(case), case.5);
            if d % 64 != 0 {
                continue;
            }
            let (dtype, mask) = (spec.dtype, spec.mask);
            for (schedule, name) in [
                (WgmmaAttention::Serial, "serial"),
                (WgmmaAttention::Overlapped, "overlapped"),
            ] {
                let dev = device.clone();
                push(
                    out,
                    ignored,
                    format!("attention_wgmma::{name}::{i}::d{d}::{dtype}::{mask:?}"),
                    Box::new(move || {
                        check(&dev, spec, 170 + i as u64, None, Kind::Wgmma(schedule))
                    }),
                );
            }
        }
    }
    for (portable, prefix) in [(false, "attention_mma"), (true, "attention_mma_portable")] {
        for (i, case) in cases().into_iter().enumerate() {
            let (spec, d) = (spec_of(case), case.5);
            // The portable structure needs more registers per head element: the head sizes
            // it takes on NVIDIA (`AttentionAccess::PORTABLE` falls back to the scalar kernel past them).
            if portable && d > 96 {
                continue;
            }
            let (dtype, mask) = (spec.dtype, spec.mask);
            let dev = device.clone();
            let access = portable.then_some(AttentionAccess::PORTABLE);
            push(
                out,
                ignored,
                format!("{prefix}::{i}::d{d}::{dtype}::{mask:?}"),
                Box::new(move || check(&dev, spec, 70 + i as u64, access, Kind::Mma)),
            );
        }
    }
}
