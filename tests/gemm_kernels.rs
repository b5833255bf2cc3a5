//! The GEMM kernels (`codegen/kernels/gemm`: the small-M decode kernel and the CUDA-core one)
//! without a GPU:
//!
//! - `host::` runs them on the CPU (the generated AMD source compiled by the host's clang++,
//!   one fiber per GPU thread, see `common/host_kernels.rs`) against the interpreter at
//!   the dtype tolerances, for wave64 (gfx90a) and wave32 (gfx1030) plans; outputs start
//!   poisoned, so an element never written fails. A case that both can run runs on one of them
//!   (picked by its name, `common/sample.rs`), on both with `ROCMFORGE_LONG_TESTS=1`.
//! - `compile::` compiles them with hiprtc (gfx90a, gfx1030), the offline clang (gfx942,
//!   gfx1100, gfx1201) and NVRTC + ptxas (sm_90): no spills, no scratch, the target's wave size.
//! - `snapshot::` keeps one kernel of each as generated for sm_90.
//!
//! Each trial is reported ignored, with the reason, where its tool is missing;
//! `ROCMFORGE_REQUIRE_HIPRTC=1`, `ROCMFORGE_REQUIRE_CLANG=1`, `ROCMFORGE_REQUIRE_HOST_CXX=1` and
//! `ROCMFORGE_REQUIRE_PTXAS=1` turn that into a failure. NVRTC is found as cudarc finds it
//! (`LD_LIBRARY_PATH`), ptxas through `ROCMFORGE_PTXAS` or the `PATH`.

#[path = "common/accuracy.rs"]
mod accuracy;
#[path = "common/files.rs"]
mod files;
#[path = "common/gemm_cases.rs"]
mod gemm_cases;
#[path = "common/gemm_small_cases.rs"]
mod gemm_small_cases;
#[path = "common/glu_cases.rs"]
mod glu_cases;
#[path = "common/host_kernels.rs"]
mod host_kernels;
#[path = "common/int8_gemv.rs"]
mod int8_gemv;
#[path = "common/kernel_compile.rs"]
mod kernel_compile;
#[path = "common/needs.rs"]
mod needs;
#[path = "common/norm_cases.rs"]
mod norm_cases;
#[path = "common/quant_cases.rs"]
mod quant_cases;
#[path = "common/row_error.rs"]
mod row_error;
#[path = "common/sample.rs"]
mod sample;

use needs::needs;
use std::collections::BTreeMap;
use std::path::Path;

use gemm_small_cases::Case;
use glu_cases::GluCase;
use int8_gemv::{Epilogue, Int8Case};
use libtest_mimic::{Arguments, Failed, Trial};
use quant_cases::QuantCase;
use rocmforge::arch::Target;
use rocmforge::codegen::{generate_with, CodegenOptions, F32Matmul, Kernel, QuantSplit, TmaWidth};
use rocmforge::interp::{self, Bindings};
use rocmforge::ir::{DType, QuantScheme};

use accuracy::tolerance;

/// The Gemm kernel of `case`'s graph for `arch` (the graph is one Gemm node).
fn gemm_kernel(case: &Case, arch: &str) -> Result<(Kernel, String), Failed> {
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let g = case.graph();
    let plan = generate_with(&g, &target, &CodegenOptions::default())
        .map_err(|e| format!("{}: {e}", case.name()))?;
    match plan.kernels.as_slice() {
        [k] if k.family.starts_with("gemm") => Ok((k.clone(), plan.source(k))),
        ks => Err(format!("{}: {} kernels, not one GEMM", case.name(), ks.len()).into()),
    }
}

/// Runs `case` on the host for `arch`'s plan and compares with the interpreter.
fn host_run(cxx: &Path, case: &Case, arch: &str) -> Result<(), Failed> {
    let g = case.graph();
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let plan = generate_with(&g, &target, &CodegenOptions::default()).map_err(|e| e.to_string())?;
    let b = Bindings::random(&g, 11);
    let want = interp::run(&g, &b).map_err(|e| e.to_string())?.remove(0);
    let got = host_kernels::run_plan(cxx, &g, &plan, &b)?
        .map_err(|e| e.to_string())?
        .remove(0);
    row_error::within(&case.name(), &got, &want, tolerance(case.dtype))?;
    Ok(())
}

/// The cases the host runs (a fiber per GPU thread: small sizes, the host is slow):
/// the odd small-M cases, a K long enough for every wave of a block to have chunks, and the
/// odd CUDA-core cases.
fn host_cases() -> Vec<Case> {
    let odd = |c: &Case| (c.n == 45 && (c.k == 40 || (c.k == 37 && !c.nk))) || c.n == 48;
    let mut v: Vec<Case> = gemm_small_cases::small_m()
        .into_iter()
        .filter(|c| odd(c) || (c.batch > 1 && c.n == 45))
        .collect();
    for dtype in [DType::F16, DType::BF16, DType::F32] {
        v.push(Case {
            dtype,
            batch: 1,
            m: 3,
            n: 5,
            k: 1600,
            nk: true,
            bias_silu: false,
        });
    }
    v.extend(
        gemm_small_cases::large_m()
            .into_iter()
            .filter(|c| c.batch * c.m * c.n * c.k <= 15_000_000),
    );
    v
}

/// The kernel families `case`'s plan must have: the fused small-M kernel alone where the Gemm
/// runs as a GEMV (`ir::gemm::runs_as_gemv`), the dequantize kernel and a dense GEMM past it.
fn quant_families(case: &QuantCase, dense: &str) -> Vec<String> {
    if rocmforge::ir::gemm::runs_as_gemv(1, case.m, case.n) {
        vec!["gemm_quant".into()]
    } else {
        vec!["dequantize".into(), dense.into()]
    }
}

/// Runs quantized `case` on the host for `arch`'s plan (the weight's blocks drawn from the
/// bindings' seed, as the interpreter draws them) and compares with the interpreter.
fn quant_host_run(cxx: &Path, case: &QuantCase, arch: &str) -> Result<(), Failed> {
    let g = case.fused();
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let plan = generate_with(&g, &target, &CodegenOptions::default()).map_err(|e| e.to_string())?;
    let families: Vec<String> = plan.kernels.iter().map(|k| k.family.to_string()).collect();
    if families != quant_families(case, "gemm") {
        return Err(format!("{}: kernels {families:?}", case.name()).into());
    }
    let int8 = plan.kernels.iter().any(|k| k.body.contains("rf_dot4_i8"));
    if int8 != takes_int8(case.scheme, case.m) {
        return Err(format!("{}: int8 activations {int8}", case.name()).into());
    }
    let b = host_kernels::with_weights(&g, Bindings::random(&g, 11));
    let want = interp::run(&g, &b).map_err(|e| e.to_string())?.remove(0);
    let got = host_kernels::run_plan(cxx, &g, &plan, &b)?
        .map_err(|e| e.to_string())?
        .remove(0);
    if int8 {
        // 8-bit activations: held to their rounding's bound, not the dtype's tolerance.
        let c = Int8Case {
            scheme: case.scheme,
            dtype: case.dtype,
            m: case.m,
            n: case.n,
            k: case.k,
            epilogue: if case.bias {
                Epilogue::Bias
            } else {
                Epilogue::None
            },
        };
        return Ok(int8_gemv::check(&c, &b, &got, &want)?);
    }
    row_error::within(&case.name(), &got, &want, tolerance(case.dtype))?;
    Ok(())
}

/// Runs the fused graph of norm `case` (the norm a prologue of its GEMVs) on the host for
/// `arch`'s plan and compares each output with the interpreter on the unfused graph.
/// With `split`, the int8 GEMVs quantize A (and apply the norm) in a kernel of their own
/// (`CodegenOptions::quant_split` on, `int8_gemv` on so that the legacy schemes take it too).
fn norm_host_run(
    cxx: &Path,
    case: &norm_cases::NormCase,
    arch: &str,
    split: bool,
) -> Result<(), Failed> {
    let (g, fused) = (case.graph(), case.fused());
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let options = if split {
        split_options()
    } else {
        CodegenOptions::default()
    };
    let plan = generate_with(&fused, &target, &options).map_err(|e| e.to_string())?;
    // One GEMV kernel per linear layer and no norm kernel; with the split, the int8 GEMV's
    // quantize kernel (the norm applied there) before each.
    let int8 = case.scheme.is_some_and(|s| {
        if split {
            (1..=split_max_m(s)).contains(&case.m)
        } else {
            takes_int8(s, case.m)
        }
    });
    let per_layer: &[&str] = match (case.scheme, split && int8) {
        (None, _) => &["gemm_small_m"],
        (Some(_), false) => &["gemm_quant"],
        (Some(_), true) => &["gemm_quant_act", "gemm_quant"],
    };
    let families: Vec<&str> = plan.kernels.iter().map(|k| k.family).collect();
    if families != per_layer.repeat(1 + usize::from(case.two)) {
        return Err(format!("{}: kernels {families:?}", case.name()).into());
    }
    let b = Bindings::random(&g, 11);
    let want = interp::run(&g, &b).map_err(|e| e.to_string())?;
    let got = host_kernels::run_plan(cxx, &fused, &plan, &b)?.map_err(|e| e.to_string())?;
    // The int8 GEMV rounds the normalised activations to 8 bits: held to the relative L2 bound
    // the int8 cases use (tests/common/int8_gemv.rs), not the dtype's tolerance.
    if plan.kernels.iter().any(|k| k.body.contains("rf_dot4_i8")) != int8 {
        return Err(format!("{}: int8 activations {}", case.name(), !int8).into());
    }
    let tol = if int8 {
        int8_gemv::REL_L2
    } else {
        tolerance(case.dtype)
    };
    for (got, want) in got.iter().zip(&want) {
        row_error::within(&case.name(), got, want, tol)?;
    }
    Ok(())
}

fn glu_cases() -> Vec<GluCase> {
    let mut v = Vec::new();
    for (dtype, scheme, k) in [
        (DType::F32, None, 37),
        (DType::F16, None, 40),
        (DType::BF16, None, 24),
        (DType::F16, Some(QuantScheme::Q4_0), 64),
        (DType::F16, Some(QuantScheme::Q4_1), 96),
        (DType::F32, Some(QuantScheme::Q8_0), 64),
    ] {
        for m in [1, 3, 8] {
            for norm in [false, true] {
                v.push(GluCase {
                    dtype,
                    scheme,
                    m,
                    n: 37,
                    k,
                    norm,
                });
            }
        }
    }
    v
}

/// Runs GLU `case` folded (one paired-column GEMV kernel over the interleaved weight, bound as
/// a compile binds it) on the host and compares with the interpreter on the unfused graph.
fn glu_host_run(cxx: &Path, case: &GluCase, arch: &str) -> Result<(), Failed> {
    let g = case.graph();
    let (fused, folds) =
        rocmforge::compile::optimise_folded(&g, true).map_err(|e| e.to_string())?;
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let plan =
        generate_with(&fused, &target, &CodegenOptions::default()).map_err(|e| e.to_string())?;
    let family = if case.scheme.is_some() {
        "gemm_quant"
    } else {
        "gemm_small_m"
    };
    let families: Vec<&str> = plan.kernels.iter().map(|k| k.family).collect();
    if families != vec![family] {
        return Err(format!("{}: kernels {families:?}", case.name()).into());
    }
    let b = host_kernels::with_weights(&g, Bindings::random(&g, 11));
    let want = interp::run(&g, &b).map_err(|e| e.to_string())?.remove(0);
    // The folded graph's weight is the parts' rows interleaved, as a compile binds it.
    let mut bf = b.clone();
    rocmforge::compile::fold::bind_folded(&folds, &mut bf.weights, &mut bf.quantized)
        .map_err(|e| e.to_string())?;
    let got = host_kernels::run_plan(cxx, &fused, &plan, &bf)?
        .map_err(|e| e.to_string())?
        .remove(0);
    row_error::within(&case.name(), &got, &want, tolerance(case.dtype))?;
    Ok(())
}

/// Norm cases compiled for every target: SmolLM2's shapes (K 576 → N 1536, K 1536 → N 576) at
/// M 1 and 16, both norms, dense f32/f16/bf16 and Q4_1/Q8_0, two GEMVs sharing the norm.
fn norm_compile_cases() -> Vec<norm_cases::NormCase> {
    let mut v = Vec::new();
    for layer in [false, true] {
        for (dtype, scheme) in [
            (DType::F32, None),
            (DType::F16, None),
            (DType::BF16, None),
            (DType::F16, Some(QuantScheme::Q4_1)),
            (DType::F16, Some(QuantScheme::Q8_0)),
        ] {
            // And 33 rows (three groups of 11, each block its rows' statistics).
            for (m, n, k) in [(1, 1536, 576), (16, 576, 1536), (33, 576, 1536)] {
                v.push(norm_cases::NormCase {
                    layer,
                    dtype,
                    scheme,
                    m,
                    n,
                    k,
                    two: true,
                    residual: m == 1,
                });
            }
        }
        // Q4_K (K whole super-blocks) at Llama-3.2-1B's hidden size, M 1 and 4 (the int8
        // GEMV's largest on K-quants), and 33 (the f32 reader in three row groups of 11).
        for m in [1, 4, 33] {
            v.push(norm_cases::NormCase {
                layer,
                dtype: DType::F16,
                scheme: Some(QuantScheme::Q4K),
                m,
                n: 2048,
                k: 2048,
                two: true,
                residual: m == 1,
            });
        }
    }
    v
}

/// The options that choose the int8 GEMV (off by default: `CodegenOptions::int8_gemv`).
fn int8_options() -> CodegenOptions {
    CodegenOptions {
        int8_gemv: true,
        ..CodegenOptions::default()
    }
}

/// The largest M at which the decode GEMV with int8 activations computes a `scheme` weight
/// under the default options: the K-quants up to M 4 always; the legacy schemes up to M 8 only
/// where `CodegenOptions::int8_gemv` is on (off by default). The shapes of the tests fit its
/// shared memory everywhere.
fn int8_max_m(scheme: QuantScheme) -> Option<usize> {
    match scheme {
        QuantScheme::Q4K | QuantScheme::Q5K | QuantScheme::Q6K => Some(4),
        QuantScheme::Q4_0 | QuantScheme::Q4_1 | QuantScheme::Q8_0 => {
            CodegenOptions::default().int8_gemv.then_some(8)
        }
        _ => None,
    }
}

/// Whether the decode GEMV with int8 activations computes a `scheme` weight at M `m` under the
/// default options (see [`int8_max_m`]).
fn takes_int8(scheme: QuantScheme, m: usize) -> bool {
    int8_max_m(scheme).is_some_and(|max| (1..=max).contains(&m))
}

/// The options that choose the int8 GEMV and quantize its activations in a kernel of their own
/// (`CodegenOptions::quant_split`), whatever the size of W.
fn split_options() -> CodegenOptions {
    CodegenOptions {
        quant_split: QuantSplit::On,
        ..int8_options()
    }
}

/// The largest M at which the int8 GEMV computes a `scheme` weight under [`split_options`].
fn split_max_m(scheme: QuantScheme) -> usize {
    match scheme {
        QuantScheme::Q4K | QuantScheme::Q5K | QuantScheme::Q6K => 4,
        _ => 8,
    }
}

/// Runs `case` on the host for `arch`'s plan: one kernel, the int8 GEMV, within its bound; with
/// `split`, its quantize kernel first, then the GEMV reading the workspace that one wrote.
fn int8_host_run(cxx: &Path, case: &Int8Case, arch: &str, split: bool) -> Result<(), Failed> {
    let g = case.fused();
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let options = if split {
        split_options()
    } else {
        int8_options()
    };
    let plan = generate_with(&g, &target, &options).map_err(|e| e.to_string())?;
    match plan.kernels.as_slice() {
        [k] if !split && k.family == "gemm_quant" && k.body.contains("rf_dot4_i8") => {}
        [a, k]
            if split
                && a.family == "gemm_quant_act"
                && k.family == "gemm_quant"
                && k.body.contains("rf_dot4_i8")
                && a.node == k.node => {}
        ks => {
            let names: Vec<&str> = ks.iter().map(|k| k.entry.as_str()).collect();
            return Err(format!("{}: kernels {names:?}, not the int8 GEMV", case.name()).into());
        }
    }
    let b = host_kernels::with_weights(&g, Bindings::random(&g, 5));
    let want = interp::run(&g, &b).map_err(|e| e.to_string())?.remove(0);
    let got = host_kernels::run_plan(cxx, &g, &plan, &b)?
        .map_err(|e| e.to_string())?
        .remove(0);
    Ok(int8_gemv::check(case, &b, &got, &want)?)
}

/// Quantized cases small enough for the host, for `arch`: each scheme on wave32 (gfx1030) in
/// f32 with a bias epilogue (M 3, K of 5 blocks), f16 at M 1, and bf16 at M 17 (the fused
/// kernel in two groups of rows); on wave64 (gfx90a) f16 at M 3 and f32 at M 65 (past the row
/// groups: dequantized, then the CUDA-core GEMM). N is odd.
fn quant_host_cases(arch: &str) -> Vec<QuantCase> {
    let shapes: &[(DType, usize, usize, usize, bool)] = if arch == "gfx1030" {
        &[
            (DType::F32, 3, 37, 160, true),
            (DType::F16, 1, 45, 96, false),
            (DType::BF16, 17, 29, 96, false),
        ]
    } else {
        &[
            (DType::F16, 3, 37, 160, true),
            (DType::F32, 65, 29, 96, false),
        ]
    };
    QuantScheme::ALL
        .into_iter()
        .flat_map(|scheme| {
            shapes.iter().map(move |&(dtype, m, n, k, bias)| QuantCase {
                scheme,
                dtype,
                m,
                n,
                // Whole blocks: the k-quants' rows are 256.
                k: k.next_multiple_of(scheme.block_elems()),
                bias,
            })
        })
        .collect()
}

/// The quantized cases compiled for every target: each scheme and dtype at M 1 (576 → 1536)
/// and M 16 (1536 → 576), SmolLM2's projections, and in f16 at M 33 (three groups of 11 rows,
/// Q5_K five of 7); the Q8_0 LM head (N 49152) and the dequantize kernels of an f32 and an f16
/// prefill (M 130).
fn quant_compile_cases() -> Vec<QuantCase> {
    let mut v = Vec::new();
    for scheme in QuantScheme::ALL {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            // Whole blocks: the k-quants' rows are 256 (576 → 768).
            let case = |m, n, k: usize| QuantCase {
                scheme,
                dtype,
                m,
                n,
                k: k.next_multiple_of(scheme.block_elems()),
                bias: false,
            };
            v.extend([case(1, 1536, 576), case(16, 576, 1536)]);
            if dtype == DType::F16 {
                v.push(case(33, 576, 1536));
            }
            if let Some(m) = int8_max_m(scheme) {
                // The int8 GEMV at its largest M.
                v.extend([case(m, 1536, 576), case(m, 576, 1536)]);
            }
            if dtype != DType::BF16 {
                v.push(case(130, 1536, 576));
            }
            if scheme == QuantScheme::Q8_0 && dtype == DType::F16 {
                v.push(case(1, 49152, 576));
            }
            if scheme.block_elems() == 256 && dtype == DType::F16 {
                // Llama-3.2-1B's LM head (128256 × 2048): the int8 GEMV's grid strides over
                // its rows, several pieces of two rows a lane in flight.
                v.extend([case(1, 128256, 2048), case(4, 128256, 2048)]);
            }
        }
    }
    v
}

/// The cases compiled for every target: each dtype and path of both kernels, once.
fn compile_cases() -> Vec<Case> {
    let mut v: Vec<Case> = gemm_small_cases::small_m()
        .into_iter()
        .filter(|c| [1, 16].contains(&c.m) && (c.n, c.k) != (1536, 576) && c.batch == 1)
        .collect();
    v.extend(
        gemm_small_cases::small_m()
            .into_iter()
            .filter(|c| c.batch > 1),
    );
    // Row groups: every dtype at 33 and 64 rows, SmolLM2's down projection (one group of 11
    // and of 16 rows a block).
    v.extend(
        gemm_small_cases::row_groups()
            .into_iter()
            .filter(|c| c.n == 576),
    );
    v.extend(gemm_small_cases::large_m());
    v
}

/// The unique kernels of the compile cases for `arch`: entry → (source, body, case).
fn compile_set(arch: &str) -> Result<kernel_compile::KernelSet, Failed> {
    let mut out = BTreeMap::new();
    for c in compile_cases() {
        let (k, src) = gemm_kernel(&c, arch)?;
        out.entry(k.entry.clone())
            .or_insert((src, k.body.clone(), c.name()));
    }
    // The quantized cases' own kernels (the dense GEMM after a dequantize is compiled above).
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    // Each also with the int8 GEMV's activations in a kernel of their own (the LM heads take
    // that by default).
    for c in quant_compile_cases() {
        for options in [CodegenOptions::default(), split_options()] {
            let plan = generate_with(&c.fused(), &target, &options)
                .map_err(|e| format!("{}: {e}", c.name()))?;
            for k in &plan.kernels {
                if ["gemm_quant", "gemm_quant_act", "dequantize"].contains(&k.family) {
                    out.entry(k.entry.clone()).or_insert((
                        plan.source(k),
                        k.body.clone(),
                        c.name(),
                    ));
                }
            }
        }
    }
    for c in norm_compile_cases() {
        for options in [CodegenOptions::default(), split_options()] {
            let plan = generate_with(&c.fused(), &target, &options)
                .map_err(|e| format!("{}: {e}", c.name()))?;
            for k in &plan.kernels {
                out.entry(k.entry.clone())
                    .or_insert((plan.source(k), k.body.clone(), c.name()));
            }
        }
    }
    // A split GEMV with its norm as steps of the persistent kernel (the quantize kernel a step,
    // the GEMV after it waiting for it; `split_in_persistent` checks the plan). NVIDIA only:
    // forced on AMD, that kernel spills scalar registers (gfx90a 53, gfx942 18, gfx1030 2), and
    // a persistent plan keeps the split off unless asked (`gemm::lower`).
    if target.platform == rocmforge::arch::Platform::Nvidia {
        let plan = generate_with(
            &split_norm_case().fused(),
            &target,
            &persistent_split_options(),
        )
        .map_err(|e| e.to_string())?;
        for k in &plan.kernels {
            out.entry(k.entry.clone()).or_insert((
                plan.source(k),
                k.body.clone(),
                "persistent split".into(),
            ));
        }
    }
    // The warpgroup kernel's cases (sm_90a plans hold it; other targets their fallbacks).
    // The TMA kernel at every tile width (the register budget grows with it: 128 accumulators
    // a consumer thread at 256) and the cp.async kernel in its place.
    for dt in [DType::F16, DType::BF16] {
        for g in gemm_cases::wgmma_cases(dt) {
            for width in [
                TmaWidth::Auto,
                TmaWidth::Fixed(64),
                TmaWidth::Fixed(128),
                TmaWidth::Fixed(256),
                TmaWidth::Off,
            ] {
                let wgmma = CodegenOptions {
                    wgmma_gemm: true,
                    wgmma_tma: width,
                    ..CodegenOptions::default()
                };
                let plan =
                    generate_with(&g, &target, &wgmma).map_err(|e| format!("{}: {e}", g.name))?;
                for k in &plan.kernels {
                    out.entry(k.entry.clone()).or_insert((
                        plan.source(k),
                        k.body.clone(),
                        format!("{} {width:?}", g.name),
                    ));
                }
            }
        }
    }

    // The paired-column (GLU) GEMVs at SmolLM2's gate/up shapes (K 576 → 2 × 1536), M 1, 8
    // (the most rows a block of pairs takes) and 32 (four groups of 8), with the folded norm.
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for scheme in [None, Some(QuantScheme::Q4_1), Some(QuantScheme::Q8_0)] {
            for m in [1, 8, 32] {
                let c = GluCase {
                    dtype,
                    scheme,
                    m,
                    n: 1536,
                    k: 576,
                    norm: true,
                };
                let (fused, _) = rocmforge::compile::optimise_folded(&c.graph(), true)
                    .map_err(|e| e.to_string())?;
                let plan = generate_with(&fused, &target, &CodegenOptions::default())
                    .map_err(|e| format!("{}: {e}", c.name()))?;
                for k in &plan.kernels {
                    out.entry(k.entry.clone()).or_insert((
                        plan.source(k),
                        k.body.clone(),
                        c.name(),
                    ));
                }
            }
        }
    }
    // The tensor-core GEMV (`CodegenOptions::mma_gemv`; NVIDIA's m16n8k16 atom): GLU pairs
    // with the norm at 17, 32 and 64 rows, two normalised GEMVs with a residual at 33 and 64,
    // f16 and bf16. Elsewhere the same graphs are CUDA-core GEMVs, mostly of the row-group
    // sizes above: only the 64-row f16 ones (whose 16-row norm groups spilled on RDNA) are
    // compiled there, for CI's time.
    let nvidia = target.platform == rocmforge::arch::Platform::Nvidia;
    for c in mma_gemv_graphs()
        .into_iter()
        .filter(|(name, _)| nvidia || (name.contains("_m64_") && name.contains("_f16_")))
    {
        let plan = generate_with(&c.1, &target, &mma_gemv_options())
            .map_err(|e| format!("{}: {e}", c.0))?;
        for k in &plan.kernels {
            out.entry(k.entry.clone())
                .or_insert((plan.source(k), k.body.clone(), c.0.clone()));
        }
    }
    // The int8 GEMV with each epilogue and M, in one kernel and in two.
    for c in int8_gemv::host_cases() {
        for options in [int8_options(), split_options()] {
            let plan = generate_with(&c.fused(), &target, &options)
                .map_err(|e| format!("{}: {e}", c.name()))?;
            for k in &plan.kernels {
                out.entry(k.entry.clone())
                    .or_insert((plan.source(k), k.body.clone(), c.name()));
            }
        }
    }
    Ok(out)
}

/// The options that allow the tensor-core GEMV (`CodegenOptions::mma_gemv`, the default), and
/// the ones that keep the CUDA-core GEMV.
fn mma_gemv_options() -> CodegenOptions {
    CodegenOptions {
        mma_gemv: true,
        ..CodegenOptions::default()
    }
}

fn cuda_core_gemv_options() -> CodegenOptions {
    CodegenOptions {
        mma_gemv: false,
        ..CodegenOptions::default()
    }
}

/// Fused (folded) graphs the tensor-core GEMV takes, by name: GLU pairs with the norm
/// (K 576 → 2 × 1536) at 17, 32 and 64 rows, two normalised GEMVs with a residual (K 1536 →
/// 576) at 33 and 64 (RMSNorm) and 17 (LayerNorm), f16 and bf16.
fn mma_gemv_graphs() -> Vec<(String, rocmforge::ir::Graph)> {
    let mut v = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        for m in [17, 32, 64] {
            let c = GluCase {
                dtype,
                scheme: None,
                m,
                n: 1536,
                k: 576,
                norm: true,
            };
            let (fused, _) = rocmforge::compile::optimise_folded(&c.graph(), true).unwrap();
            v.push((c.name(), fused));
        }
        for (layer, m) in [(false, 33), (false, 64), (true, 17)] {
            let c = norm_cases::NormCase {
                layer,
                dtype,
                scheme: None,
                m,
                n: 576,
                k: 1536,
                two: true,
                residual: true,
            };
            v.push((c.name(), c.fused()));
        }
    }
    v
}

/// The tensor-core GEMV is what sm_90 and sm_90a plans of those graphs run by default, with the
/// same kernel count as the CUDA-core plan; AMD targets, fewer rows (16) and `mma_gemv` off keep
/// the CUDA-core GEMV.
fn mma_gemv_chosen() -> Result<(), Failed> {
    let tensor = |p: &rocmforge::codegen::KernelPlan| {
        p.kernels
            .iter()
            .filter(|k| {
                k.family == "gemm_small_m" && k.body.contains("// Tensor cores (rf_m16n8k16_")
            })
            .count()
    };
    for (name, g) in mma_gemv_graphs() {
        for arch in ["sm_90", "sm_90a", "gfx90a", "gfx1100"] {
            let target = Target::parse(arch).map_err(|e| e.to_string())?;
            let on = generate_with(&g, &target, &mma_gemv_options()).map_err(|e| e.to_string())?;
            let off =
                generate_with(&g, &target, &cuda_core_gemv_options()).map_err(|e| e.to_string())?;
            let default = generate_with(&g, &target, &CodegenOptions::default())
                .map_err(|e| e.to_string())?;
            if tensor(&default) != tensor(&on) {
                return Err(
                    format!("{name} on {arch}: the default is not the tensor-core GEMV").into(),
                );
            }
            let gemvs = off
                .kernels
                .iter()
                .filter(|k| k.family == "gemm_small_m")
                .count();
            let want = if arch.starts_with("sm_") { gemvs } else { 0 };
            if gemvs == 0 || tensor(&on) != want || tensor(&off) != 0 {
                return Err(format!(
                    "{name} on {arch}: {} tensor-core GEMVs of {gemvs} asked for, {} with it off",
                    tensor(&on),
                    tensor(&off)
                )
                .into());
            }
            if on.kernels.len() != off.kernels.len() {
                return Err(format!("{name} on {arch}: kernel counts differ").into());
            }
        }
    }
    let small = GluCase {
        dtype: DType::F16,
        scheme: None,
        m: 16,
        n: 1536,
        k: 576,
        norm: true,
    };
    let (fused, _) = rocmforge::compile::optimise_folded(&small.graph(), true).unwrap();
    let target = Target::parse("sm_90").unwrap();
    let plan = generate_with(&fused, &target, &mma_gemv_options()).map_err(|e| e.to_string())?;
    if tensor(&plan) != 0 {
        return Err("16 rows took the tensor-core GEMV".into());
    }
    Ok(())
}

/// The f32 GEMM cases (odd sizes, both B layouts, K 36, views, epilogues, a batch, the large
/// shapes) compiled with TF32 asked for: every one must be the matrix-core kernel on the TF32
/// atom of `arch`.
fn tf32_set(arch: &str) -> Result<kernel_compile::KernelSet, Failed> {
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let options = CodegenOptions {
        f32_matmul: F32Matmul::Tf32,
        ..CodegenOptions::default()
    };
    let mut out = BTreeMap::new();
    for g in gemm_cases::cases(DType::F32, true) {
        let plan = generate_with(&g, &target, &options).map_err(|e| format!("{}: {e}", g.name))?;
        let k = match plan.kernels.as_slice() {
            [k] if k.family == "gemm_mma" && k.body.contains("at TF32 precision") => k,
            _ => return Err(format!("{} on {arch}: not the TF32 matrix-core GEMM", g.name).into()),
        };
        out.entry(k.entry.clone())
            .or_insert((plan.source(k), k.body.clone(), g.name.clone()));
    }
    Ok(out)
}

/// The body of one kernel of each family, as generated for sm_90.
fn snapshot(name: &'static str, case: Case) -> Result<(), Failed> {
    let (k, _) = gemm_kernel(&case, "sm_90")?;
    std::panic::catch_unwind(|| {
        files::snapshot_settings().bind(|| insta::assert_snapshot!(name, k.body))
    })
    .map_err(|_| Failed::from(format!("{name} differs from its snapshot")))
}

/// The body of the `family` kernel of quantized `case`, as generated for sm_90.
fn quant_snapshot(
    name: &'static str,
    case: QuantCase,
    family: &str,
    options: &CodegenOptions,
) -> Result<(), Failed> {
    let target = Target::parse("sm_90").map_err(|e| e.to_string())?;
    let plan = generate_with(&case.fused(), &target, options).map_err(|e| e.to_string())?;
    let k = plan
        .kernels
        .iter()
        .find(|k| k.family == family)
        .ok_or_else(|| format!("{}: no {family} kernel", case.name()))?
        .clone();
    std::panic::catch_unwind(|| {
        files::snapshot_settings().bind(|| insta::assert_snapshot!(name, k.body))
    })
    .map_err(|_| Failed::from(format!("{name} differs from its snapshot")))
}

/// The default plan of a K-quant GEMV quantizes A in a kernel of its own where W is large (the
/// LM head of Llama-3.2-1B, 128256 × 2048: two launches for the one node, the workspace between
/// them) and in every block where it is small (its 2048 × 2048 projections: one launch); the
/// options force either.
fn split_by_weight_bytes() -> Result<(), Failed> {
    let target = Target::parse("sm_90").map_err(|e| e.to_string())?;
    let case = |n| QuantCase {
        scheme: QuantScheme::Q4K,
        dtype: DType::F16,
        m: 1,
        n,
        k: 2048,
        bias: false,
    };
    let off = CodegenOptions {
        quant_split: QuantSplit::Off,
        ..CodegenOptions::default()
    };
    for (n, options, want) in [
        (128256, CodegenOptions::default(), 2),
        (2048, CodegenOptions::default(), 1),
        (128256, off, 1),
        (2048, split_options(), 2),
    ] {
        let plan = generate_with(&case(n).fused(), &target, &options).map_err(|e| e.to_string())?;
        let families: Vec<&str> = plan.kernels.iter().map(|k| k.family).collect();
        let expect: &[&str] = if want == 2 {
            &["gemm_quant_act", "gemm_quant"]
        } else {
            &["gemm_quant"]
        };
        if families != expect {
            return Err(format!("N {n} {:?}: kernels {families:?}", options.quant_split).into());
        }
        if want == 2 {
            let (act, dot) = (&plan.kernels[0], &plan.kernels[1]);
            // One node; the first writes the workspace, the second reads it (and not A).
            let [ws] = act.written().collect::<Vec<_>>()[..] else {
                return Err("the quantize kernel writes more than its workspace".into());
            };
            let ws_name = &plan.buffers[ws].name;
            if act.node != dot.node || !ws_name.ends_with(":activations") {
                return Err(
                    format!("nodes {} / {}, workspace {ws_name}", act.node, dot.node).into(),
                );
            }
            if dot.args.first() != Some(&ws) || dot.args.contains(&act.args[0]) {
                return Err("the GEMV does not read the workspace in A's place".into());
            }
            if !plan.listing().contains(&format!("%{ws_name} (write)")) {
                return Err("the listing does not show the workspace written".into());
            }
        }
    }
    Ok(())
}

/// A Q4_K GEMV pair behind an RMSNorm (M 1, Llama-3.2-1B's hidden size).
fn split_norm_case() -> norm_cases::NormCase {
    norm_cases::NormCase {
        layer: false,
        dtype: DType::F16,
        scheme: Some(QuantScheme::Q4K),
        m: 1,
        n: 512,
        k: 2048,
        two: true,
        residual: true,
    }
}

/// [`split_options`] as one persistent kernel.
fn persistent_split_options() -> CodegenOptions {
    CodegenOptions {
        persistent: rocmforge::codegen::Persistent::On,
        ..split_options()
    }
}

/// The persistent kernel takes the two-kernel GEMVs as two steps each: one kernel over the four
/// steps of the per-kernel plan.
fn split_in_persistent() -> Result<(), Failed> {
    let target = Target::parse("sm_90").map_err(|e| e.to_string())?;
    let fused = split_norm_case().fused();
    let steps = generate_with(&fused, &target, &split_options())
        .map_err(|e| e.to_string())?
        .kernels
        .len();
    let plan =
        generate_with(&fused, &target, &persistent_split_options()).map_err(|e| e.to_string())?;
    match plan.kernels.as_slice() {
        [k] if k.persistent.map(|p| p.steps) == Some(steps) && steps == 4 => Ok(()),
        ks => Err(format!("{} kernels for {steps} steps", ks.len()).into()),
    }
}

/// Whether `case`'s kernel for `arch` is one of the CUDA-core GEMMs the host runs.
fn on_cuda_cores(case: &Case, arch: &str) -> bool {
    let target = Target::parse(arch).expect("a known target");
    generate_with(&case.graph(), &target, &CodegenOptions::default())
        .map(|plan| {
            plan.kernels
                .iter()
                .all(|k| host_kernels::COOPERATIVE.contains(&k.family))
        })
        .unwrap_or(true)
}

fn main() {
    let args = Arguments::from_args();
    let cxx = host_kernels::host_cxx();
    let mut trials = kernel_compile::compile_trials(compile_set);
    trials.extend(kernel_compile::tf32_trials(tf32_set));
    // Each case runs on one of the two wave sizes (the sampled sweep, `common/sample.rs`), every
    // case on both with ROCMFORGE_LONG_TESTS=1.
    const HOST: [&str; 2] = ["gfx90a", "gfx1030"];
    for case in host_cases() {
        // f16/bf16 problems past the small-M bound go to the matrix cores on gfx90a (MFMA),
        // which the host cannot run; gfx1030 has no matrix atom, so they run there on the
        // CUDA-core kernel. The matrix-core kernel is checked on the GPU (tests/gpu/).
        let on: Vec<&'static str> = HOST
            .into_iter()
            .filter(|arch| on_cuda_cores(&case, arch))
            .collect();
        for arch in sample::archs(&case.name(), &on) {
            let name = format!("host::{arch}::{}", case.name());
            trials.push(needs(
                &cxx,
                "ROCMFORGE_REQUIRE_HOST_CXX",
                name,
                move |cxx| host_run(&cxx, &case, arch),
            ));
        }
    }
    // Shapes of their own per target: all of them run.
    for arch in HOST {
        for case in quant_host_cases(arch) {
            let name = format!("host::{arch}::quant::{}", case.name());
            trials.push(needs(
                &cxx,
                "ROCMFORGE_REQUIRE_HOST_CXX",
                name,
                move |cxx| quant_host_run(&cxx, &case, arch),
            ));
        }
    }
    for case in glu_cases() {
        for arch in sample::archs(&case.name(), &HOST) {
            let name = format!("host::{arch}::{}", case.name());
            trials.push(needs(
                &cxx,
                "ROCMFORGE_REQUIRE_HOST_CXX",
                name,
                move |cxx| glu_host_run(&cxx, &case, arch),
            ));
        }
    }
    for case in norm_cases::cases() {
        for arch in sample::archs(&case.name(), &HOST) {
            let name = format!("host::{arch}::norm::{}", case.name());
            trials.push(needs(
                &cxx,
                "ROCMFORGE_REQUIRE_HOST_CXX",
                name,
                move |cxx| norm_host_run(&cxx, &case, arch, false),
            ));
        }
        // The quantized ones with the int8 GEMV's activations (and the norm) in a kernel of
        // their own: at 8 rows (the most statistics, the quantize kernel's widest run), which
        // the smaller M of the same scheme and norm add no path to (CI time).
        if case.scheme.is_some() && case.m == 8 {
            for arch in sample::archs(&format!("split_{}", case.name()), &HOST) {
                let name = format!("host::{arch}::norm_split::{}", case.name());
                trials.push(needs(
                    &cxx,
                    "ROCMFORGE_REQUIRE_HOST_CXX",
                    name,
                    move |cxx| norm_host_run(&cxx, &case, arch, true),
                ));
            }
        }
    }
    for case in int8_gemv::host_cases() {
        for arch in sample::archs(&case.name(), &HOST) {
            let name = format!("host::{arch}::int8::{}", case.name());
            trials.push(needs(
                &cxx,
                "ROCMFORGE_REQUIRE_HOST_CXX",
                name,
                move |cxx| int8_host_run(&cxx, &case, arch, false),
            ));
        }
        // The split form at up to 4 rows: the 32-value schemes' cases at 5 to 8 rows repeat
        // those shapes at larger M, the same paths through both kernels (CI time).
        if case.m > 4 {
            continue;
        }
        for arch in sample::archs(&format!("split_{}", case.name()), &HOST) {
            let name = format!("host::{arch}::int8_split::{}", case.name());
            trials.push(needs(
                &cxx,
                "ROCMFORGE_REQUIRE_HOST_CXX",
                name,
                move |cxx| int8_host_run(&cxx, &case, arch, true),
            ));
        }
    }
    // Row groups (M 17 to 64, issue 26), each case on the host named (a clang compile each, CI
    // time), wave64 and wave32 both covered: plain (a bias + SiLU; a batch of [K, N] f32 read
    // along N), the norm prologue with a residual epilogue (dense and Q4_1), paired columns
    // with the norm (dense and Q8_0); 17 (groups of 9 and 8: the last reads rows 8..17 and
    // stores 9..17), 33 (of 11; paired, 5 of 7, the last storing 5), 47 (of 16, the last
    // storing 15) and 64 (of 16; paired, 8 of 8).
    let plain = |dtype, batch, m, n, k, nk, bias_silu| Case {
        dtype,
        batch,
        m,
        n,
        k,
        nk,
        bias_silu,
    };
    for (arch, case) in [
        ("gfx90a", plain(DType::F16, 1, 33, 45, 40, true, true)),
        ("gfx1030", plain(DType::F32, 3, 17, 48, 37, false, false)),
    ] {
        let name = format!("host::{arch}::row_groups::{}", case.name());
        trials.push(needs(
            &cxx,
            "ROCMFORGE_REQUIRE_HOST_CXX",
            name,
            move |cxx| host_run(&cxx, &case, arch),
        ));
    }
    let norm = |layer, dtype, scheme, m, k| norm_cases::NormCase {
        layer,
        dtype,
        scheme,
        m,
        n: 45,
        k,
        two: true,
        residual: true,
    };
    for (arch, case) in [
        ("gfx90a", norm(false, DType::F16, None, 17, 37)),
        ("gfx1030", norm(true, DType::BF16, None, 33, 37)),
        (
            "gfx90a",
            norm(false, DType::F16, Some(QuantScheme::Q4_1), 47, 96),
        ),
    ] {
        let name = format!("host::{arch}::row_groups::norm::{}", case.name());
        trials.push(needs(
            &cxx,
            "ROCMFORGE_REQUIRE_HOST_CXX",
            name,
            move |cxx| norm_host_run(&cxx, &case, arch, false),
        ));
    }
    let glu = |dtype, scheme, m, k| GluCase {
        dtype,
        scheme,
        m,
        n: 37,
        k,
        norm: true,
    };
    for (arch, case) in [
        ("gfx1030", glu(DType::BF16, None, 33, 24)),
        ("gfx90a", glu(DType::F16, None, 64, 40)),
        ("gfx90a", glu(DType::F32, Some(QuantScheme::Q8_0), 17, 64)),
    ] {
        let name = format!("host::{arch}::row_groups::{}", case.name());
        trials.push(needs(
            &cxx,
            "ROCMFORGE_REQUIRE_HOST_CXX",
            name,
            move |cxx| glu_host_run(&cxx, &case, arch),
        ));
    }
    trials.push(Trial::test("ptxas_log_parser", || {
        let clean = "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads";
        let spilled = "    40 bytes stack frame, 40 bytes spill stores, 36 bytes spill loads";
        let stack = "    16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads";
        match (
            kernel_compile::spills_or_stack(clean),
            kernel_compile::spills_or_stack(spilled),
            kernel_compile::spills_or_stack(stack),
        ) {
            (false, true, true) => Ok(()),
            got => Err(format!("parsed {got:?}, want (false, true, true)").into()),
        }
    }));
    let one = |dtype, m, n, k, nk| Case {
        dtype,
        batch: 1,
        m,
        n,
        k,
        nk,
        bias_silu: true,
    };
    trials.push(Trial::test("snapshot::gemm_small_m", move || {
        snapshot(
            "kernels__gemm_small_m__f16__sm_90",
            one(DType::F16, 3, 45, 40, true),
        )
    }));
    trials.push(Trial::test("snapshot::gemm_scalar", move || {
        snapshot(
            "kernels__gemm_scalar__f32__sm_90",
            one(DType::F32, 77, 45, 40, false),
        )
    }));
    let quant = |scheme, dtype, m| QuantCase {
        scheme,
        dtype,
        m,
        n: 45,
        k: 96,
        bias: true,
    };
    // Q4_1 at M 3 with the int8 GEMV asked for; Q3_K the f32 reader (the default for it).
    trials.push(Trial::test("snapshot::gemm_quant", move || {
        quant_snapshot(
            "kernels__gemm_quant__q4_1_f16__sm_90",
            quant(QuantScheme::Q4_1, DType::F16, 3),
            "gemm_quant",
            &int8_options(),
        )
    }));
    // The f32 reader on a scheme of 256-value blocks (Q3_K: read value by value).
    trials.push(Trial::test("snapshot::gemm_quant_f32", move || {
        quant_snapshot(
            "kernels__gemm_quant__q3_k_f16__sm_90",
            QuantCase {
                k: 256,
                ..quant(QuantScheme::Q3K, DType::F16, 3)
            },
            "gemm_quant",
            &CodegenOptions::default(),
        )
    }));
    // The int8 GEMV on the K-quants (chosen by default).
    for (scheme, name) in [
        (QuantScheme::Q4K, "kernels__gemm_quant__q4_k_f16__sm_90"),
        (QuantScheme::Q6K, "kernels__gemm_quant__q6_k_f16__sm_90"),
    ] {
        trials.push(Trial::test(
            format!("snapshot::gemm_quant_kq::{scheme}"),
            move || {
                quant_snapshot(
                    name,
                    QuantCase {
                        k: 512,
                        ..quant(scheme, DType::F16, 3)
                    },
                    "gemm_quant",
                    &CodegenOptions::default(),
                )
            },
        ));
    }
    // The same with the activations quantized by a kernel of their own: that kernel, and the
    // GEMV reading its workspace.
    for (family, name) in [
        ("gemm_quant_act", "kernels__gemm_quant_act__q4_k_f16__sm_90"),
        ("gemm_quant", "kernels__gemm_quant__q4_k_f16_split__sm_90"),
    ] {
        trials.push(Trial::test(
            format!("snapshot::split::{family}"),
            move || {
                quant_snapshot(
                    name,
                    QuantCase {
                        k: 512,
                        ..quant(QuantScheme::Q4K, DType::F16, 3)
                    },
                    family,
                    &split_options(),
                )
            },
        ));
    }
    trials.push(Trial::test(
        "plan::split_by_weight_bytes",
        split_by_weight_bytes,
    ));
    trials.push(Trial::test(
        "plan::split_in_persistent",
        split_in_persistent,
    ));
    trials.push(Trial::test("plan::mma_gemv_chosen", mma_gemv_chosen));
    for (scheme, name) in [
        (QuantScheme::Q8_0, "kernels__dequantize__q8_0_f16__sm_90"),
        (QuantScheme::Q4_0, "kernels__dequantize__q4_0_f16__sm_90"),
    ] {
        trials.push(Trial::test(
            format!("snapshot::dequantize::{scheme}"),
            move || {
                quant_snapshot(
                    name,
                    // Past the row groups' 64 rows: the weight dequantized for the dense GEMM.
                    quant(scheme, DType::F16, 130),
                    "dequantize",
                    &CodegenOptions::default(),
                )
            },
        ));
    }
    libtest_mimic::run(&args, trials).exit();
}
