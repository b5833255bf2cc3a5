//! GEMM on the device: layouts read in place, the matrix cores, the small-M and CUDA-core kernels, quantized weights, the linear layers the GEMM bench times.

use crate::common::*;
use crate::harness::*;
use libtest_mimic::{Failed, Trial};
use rocmforge::codegen::TmaWidth;
use rocmforge::interp::{run, Bindings};
use rocmforge::ir::{DType, Graph};
use rocmforge::runtime::Device;

/// A linear layer on a quantized weight against the interpreter (which dequantizes the same
/// blocks): the weight's device buffer is its blocks, and the plan is the fused small-M kernel
/// up to M 16, the dequantize kernel and a dense GEMM past it.
pub fn check_quant(device: &Device, case: quant_cases::QuantCase) -> Result<(), Failed> {
    use rocmforge::codegen::BufferRole;
    let g = case.graph();
    {
        let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
        let c = Graph::compile_with(&g, device, &options()).map_err(|e| e.to_string())?;
        let plan = c.plan().ok_or("no kernel plan on a GPU")?;
        let w = plan
            .buffers
            .iter()
            .find(|b| b.name == "w")
            .ok_or("no buffer w")?;
        if w.role != BufferRole::QuantWeight(case.scheme) {
            return Err(format!("{}: w is {:?}", case.name(), w.role).into());
        }
        let families: Vec<&str> = plan.kernels.iter().map(|k| k.family).collect();
        // The int8 K-quant GEMV on a large weight quantizes A in a kernel of its own first
        // (`quant_dot::splits`): two launches, one node.
        let fused = families == ["gemm_quant"] || families == ["gemm_quant_act", "gemm_quant"];
        let dequantized = families.first() == Some(&"dequantize") && families.len() == 2;
        let gemv = rocmforge::ir::gemm::runs_as_gemv(1, case.m, case.n);
        if (gemv && !fused) || (!gemv && !dequantized) {
            return Err(format!("{}: kernels {families:?}", case.name()).into());
        }
        // 8-bit activations (the int8 GEMV): held to their rounding's bound.
        if plan.kernels.iter().any(|k| k.body.contains("rf_dot4_i8")) {
            // The device binds inputs only (its weights were drawn at compile); the interpreter
            // and the bound read the same weights.
            let inputs = Bindings::random(&g, 21);
            let b = with_weights(&g, &inputs);
            let got = c.run(&inputs).map_err(|e| e.to_string())?.remove(0);
            let want = run(&g, &b).map_err(|e| e.to_string())?.remove(0);
            return Ok(int8_gemv::check(&int8_case(&case), &b, &got, &want)?);
        }
    }
    check_graph(device, &g, true, 21)
}

/// `case` as the int8 GEMV's checker takes it.
fn int8_case(case: &quant_cases::QuantCase) -> int8_gemv::Int8Case {
    int8_gemv::Int8Case {
        scheme: case.scheme,
        dtype: case.dtype,
        m: case.m,
        n: case.n,
        k: case.k,
        epilogue: if case.bias {
            int8_gemv::Epilogue::Bias
        } else {
            int8_gemv::Epilogue::None
        },
    }
}

/// Blocks the caller binds (`CompileOptions::quantized`) are the ones the kernels read.
pub fn quant_bound_blocks(device: &Device) -> Result<(), Failed> {
    use rocmforge::ir::{random_quant, QuantScheme, Shape};
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    for m in [1, 40] {
        let case = quant_cases::QuantCase {
            scheme: QuantScheme::Q4_1,
            dtype: DType::F32,
            m,
            n: 577,
            k: 576,
            bias: false,
        };
        let g = case.graph();
        let blocks = random_quant("w", case.scheme, &Shape(vec![case.n, case.k]), 99)
            .map_err(|e| e.to_string())?;
        let mut opts = options();
        opts.quantized.insert("w".into(), blocks.clone());
        let c = Graph::compile_with(&g, device, &opts).map_err(|e| e.to_string())?;
        let mut b = Bindings::random(&g, 4);
        let got = c.run(&b).map_err(|e| e.to_string())?.remove(0);
        b.quantized.insert("w".into(), blocks);
        let want = run(&g, &b).map_err(|e| e.to_string())?.remove(0);
        if m == 1 {
            // The int8 GEMV: its bound (on the bound blocks, which the checker reads from `b`).
            int8_gemv::check(&int8_case(&case), &b, &got, &want)?;
            continue;
        }
        let err = compare(&got, &want, tolerance(DType::F32), &case.name())?;
        if err > tolerance(DType::F32) {
            return Err(format!("{}: relative L2 {err:e}", case.name()).into());
        }
    }
    Ok(())
}

/// The linear-layer graphs benches/gemm.rs times, at sizes no tile divides (M = 1 and 17,
/// MiniLM's and SmolLM2's K), against the interpreter: the bench times kernels that compute
/// the right thing.
pub fn linear_layer_matches_interpreter(
    device: &Device,
    (m, n, k): (usize, usize, usize),
    dtype: DType,
    bias_gelu: bool,
) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let g =
        linear_graphs::linear("linear", m, n, k, dtype, bias_gelu).map_err(|e| e.to_string())?;
    let c = Graph::compile_with(&g, device, &options()).map_err(|e| e.to_string())?;
    let (_, v) = c
        .verify(&Bindings::random(&g, 12))
        .map_err(|e| e.to_string())?;
    if v.max_error() > tolerance(dtype) {
        return Err(format!("M{m} N{n} K{k} {dtype}: relative L2 {:e}", v.max_error()).into());
    }
    Ok(())
}

/// GEMM nodes reading their layouts in place, and on the matrix cores.
pub fn layouts_and_mma(device: &Device, ignored: &Option<String>, trials: &mut Vec<Trial>) {
    // Gemm kernels reading and writing the layouts around them in place, at odd sizes.
    for dt in [DType::F32, DType::F16, DType::BF16] {
        for g in gemm_graphs::layouts(dt) {
            let d = device.clone();
            let name = format!("gemm_layouts::{}", g.name);
            push(
                trials,
                ignored,
                name,
                Box::new(move || check_graph(&d, &g, true, 6)),
            );
        }
    }
    // Gemm nodes on the matrix cores (where the device has an atom for the dtype): odd sizes,
    // element loads, both B layouts, head merge/split views, epilogues, a batch, a large shape;
    // poisoned outputs against the interpreter.
    for dt in [DType::F16, DType::BF16] {
        for g in gemm_cases::cases(dt, true) {
            let d = device.clone();
            push(
                trials,
                ignored,
                format!("gemm_mma::{}", g.name),
                Box::new(move || check_graph(&d, &g, false, 12)),
            );
        }
    }
    // f32 Gemm nodes at TF32 (opt-in): the same odd sizes, element loads (K 36 reads in
    // pieces of four floats, N 45 does not), both B layouts, views, epilogues, a batch with a
    // shared B and the large shapes, on the TF32 atom, within the TF32 bound.
    for g in gemm_cases::cases(DType::F32, true) {
        let d = device.clone();
        push(
            trials,
            ignored,
            format!("gemm_tf32::{}", g.name),
            Box::new(move || check_graph_tf32(&d, &g, 14)),
        );
    }
}

/// Gemm nodes on the warpgroup kernel (sm_90a: an H100 or H200): sizes no tile divides, K
/// tails, epilogues, views, a batch, against the interpreter with poisoned outputs. Where the
/// device's target has wgmma, each case's plan must use the kernel the case expects (the
/// warpgroup one, or the fallback); elsewhere the cases run on whatever kernel the plan has.
pub fn wgmma(device: &Device, ignored: &Option<String>, trials: &mut Vec<Trial>) {
    for dt in [DType::F16, DType::BF16] {
        for g in gemm_cases::wgmma_cases(dt) {
            // The width the model gives the case (the family the case expects), then, for the
            // cases the TMA kernel takes, each tile width and the cp.async warpgroup kernel.
            let mut runs = vec![("", TmaWidth::Auto, gemm_cases::wgmma_family(&g), 13)];
            if gemm_cases::wgmma_family(&g) == "gemm_wgmma_tma" {
                runs.extend([
                    ("w64::", TmaWidth::Fixed(64), "gemm_wgmma_tma", 17),
                    ("w128::", TmaWidth::Fixed(128), "gemm_wgmma_tma", 17),
                    ("w256::", TmaWidth::Fixed(256), "gemm_wgmma_tma", 17),
                    ("cp_async::", TmaWidth::Off, "gemm_wgmma", 17),
                ]);
            }
            for (label, width, family, seed) in runs {
                let (d, g) = (device.clone(), g.clone());
                push(
                    trials,
                    ignored,
                    format!("gemm_wgmma::{label}{}", g.name),
                    Box::new(move || {
                        let target = d.target().ok_or("the device has no codegen target")?;
                        if !target.caps.wgmma.is_empty() {
                            let on = rocmforge::codegen::CodegenOptions {
                                wgmma_gemm: true,
                                wgmma_tma: width,
                                ..Default::default()
                            };
                            let plan = rocmforge::codegen::generate_with(&g, target, &on)
                                .map_err(|e| e.to_string())?;
                            if !plan.kernels.iter().any(|k| k.family == family) {
                                return Err(format!("{}: no {family} kernel", g.name).into());
                            }
                        }
                        check_graph_with(&d, &g, false, seed, Some(width))
                    }),
                );
            }
        }
    }
}

/// Linear layers on quantized weights.
pub fn quant(device: &Device, ignored: &Option<String>, trials: &mut Vec<Trial>) {
    // Linear layers on quantized weights at odd sizes, f32 and f16, both sides of the small-M
    // bound, SmolLM2's shapes and a 49152-like LM head.
    for case in quant_cases::gpu_cases() {
        let d = device.clone();
        push(
            trials,
            ignored,
            format!("quant::{}", case.name()),
            Box::new(move || check_quant(&d, case)),
        );
    }
}

/// The linear layers benches/gemm.rs times.
pub fn linear(device: &Device, ignored: &Option<String>, trials: &mut Vec<Trial>) {
    // The graphs benches/gemm.rs times, at sizes no tile divides.
    for (m, n, k) in [
        (1, 384, 384),
        (17, 1536, 384),
        (17, 384, 1536),
        (17, 192, 576),
    ] {
        for dtype in [DType::F16, DType::BF16, DType::F32] {
            for bias_gelu in [false, true] {
                let d = device.clone();
                push(
                    trials,
                    ignored,
                    format!(
                        "gemm::linear_M{m}_N{n}_K{k}_{dtype}{}",
                        if bias_gelu { "_bias_gelu" } else { "" }
                    ),
                    Box::new(move || {
                        linear_layer_matches_interpreter(&d, (m, n, k), dtype, bias_gelu)
                    }),
                );
            }
        }
    }
}

/// The small-M and CUDA-core GEMM kernels.
pub fn small_and_cuda_core(device: &Device, ignored: &Option<String>, trials: &mut Vec<Trial>) {
    // The GEMM kernels (issue 12): small-M decode (M ≤ 16), its row groups (M 17, 33, 64,
    // issue 26) and the CUDA-core kernel, at odd and model sizes, both weight layouts, bias +
    // SiLU, batches, every float dtype.
    for case in gemm_small_cases::small_m()
        .into_iter()
        .chain(gemm_small_cases::row_groups())
        .chain(gemm_small_cases::large_m())
    {
        let d = device.clone();
        push(
            trials,
            ignored,
            format!("gemm::{}", case.name()),
            Box::new(move || check_graph(&d, &case.graph(), false, 8)),
        );
    }
}

/// The GEMV kernels' row groups (issue 26) with what only they apply, compiled as users get it
/// (the default passes fold the norm into the GEMVs and pair gate/up) against the unfused
/// interpreter: a norm shared by two GEMVs with a residual in the first one's epilogue, and a
/// GLU with the norm, at SmolLM2's shapes (K 576 → 2 × 1536; K 1536 → 576) and 17, 33 and 64
/// rows (a batched decode step of that many sequences), dense f16 and bf16 and Q4_1.
pub fn row_groups_fused(device: &Device, ignored: &Option<String>, trials: &mut Vec<Trial>) {
    use rocmforge::ir::QuantScheme;
    for m in [17, 33, 64] {
        for (dtype, scheme) in [
            (DType::F16, None),
            (DType::BF16, None),
            (DType::F16, Some(QuantScheme::Q4_1)),
        ] {
            let norm = norm_cases::NormCase {
                layer: false,
                dtype,
                scheme,
                m,
                n: 576,
                k: 1536,
                two: true,
                residual: true,
            };
            let d = device.clone();
            push(
                trials,
                ignored,
                format!("gemm::row_groups::norm::{}", norm.name()),
                Box::new(move || check_graph(&d, &norm.graph(), true, 9)),
            );
            let glu = glu_cases::GluCase {
                dtype,
                scheme,
                m,
                n: 1536,
                k: 576,
                norm: true,
            };
            let d = device.clone();
            push(
                trials,
                ignored,
                format!("gemm::row_groups::{}", glu.name()),
                Box::new(move || check_graph(&d, &glu.graph(), true, 9)),
            );
        }
    }
}

/// The tensor-core GEMV (`CompileOptions::mma_gemv`, on by default) against the unfused
/// interpreter, compiled as users get it: on a device whose
/// target has the m16n8k16 atom every GEMV of the plan must be that form (so a CUDA-core
/// kernel cannot pass in its place). A norm shared by two GEMVs with a residual (K 1536 → 576)
/// and a GLU with the norm (K 576 → 2 × 1536) at 17, 33 and 64 rows (rows past M in the last
/// row tile), RMSNorm and LayerNorm, f16 and bf16; and odd sizes: N 577 (a partial column
/// tile), K 520 (a partial last step of 32), 45 rows.
pub fn mma_gemv(device: &Device, ignored: &Option<String>, trials: &mut Vec<Trial>) {
    use rocmforge::compile::CompileOptions;
    let check = |d: &Device, g: &rocmforge::ir::Graph| -> Result<(), Failed> {
        let options = CompileOptions {
            mma_gemv: true,
            ..options()
        };
        let has_atom = d
            .target()
            .is_some_and(|t| t.caps.mma.iter().any(|a| a.name.starts_with("m16n8k16")));
        if has_atom {
            let c = Graph::compile_with(g, d, &options).map_err(|e| e.to_string())?;
            let plan = c.plan().ok_or("no kernel plan on a GPU")?;
            let cuda_core = plan
                .kernels
                .iter()
                .filter(|k| k.family == "gemm_small_m" && !k.body.contains("// Tensor cores ("))
                .count();
            if cuda_core > 0 {
                return Err(format!("{}: {cuda_core} CUDA-core GEMV(s) left", g.name).into());
            }
        }
        check_graph_options(d, g, 9, &options)
    };
    let mut graphs = Vec::new();
    for m in [17, 33, 64] {
        for dtype in [DType::F16, DType::BF16] {
            for layer in [false, true] {
                graphs.push(
                    norm_cases::NormCase {
                        layer,
                        dtype,
                        scheme: None,
                        m,
                        n: 576,
                        k: 1536,
                        two: true,
                        residual: true,
                    }
                    .graph(),
                );
            }
            graphs.push(
                glu_cases::GluCase {
                    dtype,
                    scheme: None,
                    m,
                    n: 1536,
                    k: 576,
                    norm: true,
                }
                .graph(),
            );
        }
    }
    graphs.push(
        norm_cases::NormCase {
            layer: false,
            dtype: DType::F16,
            scheme: None,
            m: 45,
            n: 577,
            k: 520,
            two: false,
            residual: false,
        }
        .graph(),
    );
    graphs.push(
        glu_cases::GluCase {
            dtype: DType::BF16,
            scheme: None,
            m: 45,
            n: 578,
            k: 520,
            norm: true,
        }
        .graph(),
    );
    for g in graphs {
        let d = device.clone();
        push(
            trials,
            ignored,
            format!("gemm::mma_gemv::{}", g.name),
            Box::new(move || check(&d, &g)),
        );
    }
}
