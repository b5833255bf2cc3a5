//! Sliding-window attention (issue 25) on the GPU: every case of `common/window_cases.rs` (odd
//! sizes; windows of 1, below, at and above the kernels' key tiles and past the whole context;
//! causal offsets either way; kv_len per batch; GQA) for the prefill kernels in f32, f16 and
//! bf16 (and the sm_90a warpgroup kernel where the device takes it), the split-K decode kernel
//! and the paged decode kernel, against the dense f64 reference at the dtype's tolerance. The
//! K/V rows and paged blocks before the window are NaN, so a kernel that reads a skipped tile,
//! split or block fails; the outputs start poisoned, so every element must be written.

use crate::common::accuracy::rel_l2;
use crate::common::window_cases::{decode_cases, paged_cases, prefill_cases};
use crate::harness::*;
use libtest_mimic::{Failed, Trial};
use rocmforge::codegen::WgmmaAttention;
use rocmforge::compile::CompileOptions;
use rocmforge::interp::Bindings;
use rocmforge::ir::{DType, Graph, Tensor};
use rocmforge::runtime::Device;

fn run_case(
    device: &Device,
    g: &Graph,
    b: &Bindings,
    want: &Tensor,
    dt: DType,
    opts: CompileOptions,
) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let c = Graph::compile_with(g, device, &opts).map_err(|e| e.to_string())?;
    let got = c.run(b).map_err(|e| e.to_string())?.remove(0);
    let err = rel_l2(&got, want).map_err(|e| format!("{}: {e}", g.name))?;
    if err > tolerance(dt) {
        return Err(format!("{}: relative L2 {err:e} over {}", g.name, tolerance(dt)).into());
    }
    Ok(())
}

pub fn trials(device: &Device, ignored: &Option<String>, trials: &mut Vec<Trial>) {
    for dt in [DType::F32, DType::F16, DType::BF16] {
        for c in prefill_cases(dt).into_iter().chain(decode_cases(dt)) {
            let dev = device.clone();
            push(
                trials,
                ignored,
                format!("window::{dt}::{}", c.name),
                Box::new(move || {
                    let b = c.bindings(31);
                    run_case(&dev, &c.graph(), &b, &c.reference(&b), dt, options())
                }),
            );
        }
        for p in paged_cases(dt) {
            let dev = device.clone();
            push(
                trials,
                ignored,
                format!("window::{dt}::{}", p.base.name),
                Box::new(move || {
                    let (b, flat) = p.bindings(32);
                    run_case(
                        &dev,
                        &p.graph(),
                        &b,
                        &p.base.reference(&flat),
                        dt,
                        options(),
                    )
                }),
            );
        }
    }
    // The warpgroup kernel (sm_90a; elsewhere the option falls back to the other kernels, and
    // the trial checks those).
    for dt in [DType::F16, DType::BF16] {
        for c in prefill_cases(dt).into_iter().filter(|c| c.d >= 64) {
            let dev = device.clone();
            push(
                trials,
                ignored,
                format!("window::wgmma::{dt}::{}", c.name),
                Box::new(move || {
                    let b = c.bindings(33);
                    let opts = CompileOptions {
                        wgmma_attention: WgmmaAttention::Overlapped,
                        ..options()
                    };
                    run_case(&dev, &c.graph(), &b, &c.reference(&b), dt, opts)
                }),
            );
        }
    }
}
