//! Sliding-window attention (issue 25: `Attention::window`, `Op::PagedAttention`'s window)
//! without a GPU, every case from `common/window_cases.rs` against its dense f64 reference:
//!
//! - `interp::` the interpreter's FlashAttention and PagedAttention with a window; window 1 is
//!   the diagonal key's value, a window past the sequence is no window;
//! - `ir::` the typed errors (window 0, a window without causal) and the text/JSON round trip;
//! - `plan::` the kernels' key loops start at the window (`key_begin`, the decode kernels'
//!   `win_lo`), the decode splits share the window's keys only, and a window that hides no key
//!   gives the unwindowed kernel byte for byte;
//! - `host::` the generated AMD source run on the CPU (host clang++, `common/host_kernels.rs`)
//!   for wave64 and wave32 plans: the f32 prefill kernel, the split-K decode kernel and the paged
//!   decode kernel, with the K/V rows and blocks before the window NaN, so a skipped tile that
//!   is read fails;
//! - `compile::` every windowed kernel (f32, f16, bf16 prefill on every family the targets pick,
//!   the sm_90a warpgroup kernel, decode, paged decode) through hiprtc, the offline clang and
//!   NVRTC + ptxas (sm_90, sm_90a): no spills, no scratch.
//!
//! The GPU trials are `window::` in `tests/gpu/`. Trials whose tool is missing are reported
//! ignored, with the reason; the `ROCMFORGE_REQUIRE_*` variables make that a failure.

#[path = "common/accuracy.rs"]
mod accuracy;
#[path = "common/host_kernels.rs"]
mod host_kernels;
#[path = "common/kernel_compile.rs"]
mod kernel_compile;
#[path = "common/needs.rs"]
mod needs;
#[path = "common/window_cases.rs"]
mod window_cases;

use std::path::Path;

use accuracy::{rel_l2, tolerance};
use kernel_compile::KernelSet;
use libtest_mimic::{Arguments, Failed, Trial};
use needs::needs;
use rocmforge::arch::Target;
use rocmforge::codegen::{generate_with, CodegenOptions, KernelPlan, WgmmaAttention};
use rocmforge::interp::{self, Bindings};
use rocmforge::ir::{format, DType, Graph, GraphError, Op, WindowError};
use window_cases::{decode_cases, paged_cases, prefill_cases, PagedWindow, WindowCase};

fn check(
    name: &str,
    got: &rocmforge::ir::Tensor,
    want: &rocmforge::ir::Tensor,
    dt: DType,
) -> Result<(), Failed> {
    let err = rel_l2(got, want).map_err(|e| format!("{name}: {e}"))?;
    if err > tolerance(dt) {
        return Err(format!("{name}: relative L2 {err:e}").into());
    }
    Ok(())
}

fn interp_case(c: &WindowCase) -> Result<(), Failed> {
    let b = c.bindings(11);
    let got = interp::run(&c.graph(), &b)
        .map_err(|e| e.to_string())?
        .remove(0);
    check(&c.name, &got, &c.reference(&b), DType::F32)
}

fn interp_paged(p: &PagedWindow) -> Result<(), Failed> {
    let (b, flat) = p.bindings(12);
    let got = interp::run(&p.graph(), &b)
        .map_err(|e| e.to_string())?
        .remove(0);
    check(&p.base.name, &got, &p.base.reference(&flat), DType::F32)
}

/// Window 1: each query sees only the key at `i + offset`, so its output is that V row
/// exactly; a window past every key is the plain causal attention, bit for bit.
fn interp_edges() -> Result<(), Failed> {
    let c = WindowCase::new("w1", (1, 2, 1), (9, 12, 8), DType::F32, 3, None, 1);
    let b = c.bindings(5);
    let got = interp::run(&c.graph(), &b)
        .map_err(|e| e.to_string())?
        .remove(0);
    let (got, v) = (got.as_f32().unwrap(), b.inputs["v"].as_f32().unwrap());
    for h in 0..2 {
        for i in 0..9 {
            let o = &got[(h * 9 + i) * 8..][..8];
            let want = &v[(i + 3) * 8..][..8];
            if o != want {
                return Err(format!("head {h} row {i}: {o:?}, want {want:?}").into());
            }
        }
    }
    let wide = WindowCase {
        window: 1000,
        ..c.clone()
    };
    let plain = wide.graph_window(None);
    let x = interp::run(&wide.graph(), &b)
        .map_err(|e| e.to_string())?
        .remove(0);
    let y = interp::run(&plain, &b)
        .map_err(|e| e.to_string())?
        .remove(0);
    if x.as_f32() != y.as_f32() {
        return Err("a window past every key changed the result".into());
    }
    Ok(())
}

/// Window 0 and a window without causal are typed errors; the attribute survives the text
/// form.
fn ir_rules() -> Result<(), Failed> {
    let c = WindowCase::new("rules", (1, 1, 1), (4, 4, 8), DType::F32, 0, None, 2);
    let mut g = Graph::new("rules");
    let q = g.input("q", DType::F32, &[1, 1, 4, 8])?;
    let e = g.flash_attention_windowed((q, q, q), None, 0.5, 0, Some(0));
    if !matches!(
        e,
        Err(GraphError::BadWindow {
            error: WindowError::Zero,
            ..
        })
    ) {
        return Err(format!("window 0: {e:?}").into());
    }
    let e = g.paged_attention_windowed((q, q, q), q, q, 0.5, Some(0));
    if !matches!(
        e,
        Err(GraphError::BadWindow {
            error: WindowError::Zero,
            ..
        })
    ) {
        return Err(format!("paged window 0: {e:?}").into());
    }
    let mut att = rocmforge::ir::Attention {
        scale: 0.5,
        causal: false,
        causal_offset: 0,
        window: Some(3),
        mask: rocmforge::ir::MaskKind::None,
        kv_len: false,
        append: None,
    };
    let e = g.add_op(Op::FlashAttention(att.clone()), &[q, q, q]);
    if !matches!(
        e,
        Err(GraphError::BadWindow {
            error: WindowError::NotCausal,
            ..
        })
    ) {
        return Err(format!("window without causal: {e:?}").into());
    }
    att.causal = true;
    g.add_op(Op::FlashAttention(att), &[q, q, q])?;
    let g = c.graph();
    let text = format::to_json_string(&g).map_err(|e| e.to_string())?;
    if !text.contains("\"window\": 2") {
        return Err(format!("no window in {text}").into());
    }
    let back = format::from_json_str(&text).map_err(|e| e.to_string())?;
    if format::to_json_string(&back).map_err(|e| e.to_string())? != text {
        return Err("the window did not round-trip".into());
    }
    Ok(())
}

fn plan_of(g: &Graph, arch: &str, options: &CodegenOptions) -> Result<KernelPlan, Failed> {
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    generate_with(g, &target, options).map_err(|e| format!("{}: {e}", g.name).into())
}

fn attention_kernel(plan: &KernelPlan) -> Result<&rocmforge::codegen::Kernel, Failed> {
    plan.kernels
        .iter()
        .find(|k| k.family.starts_with("flash_") || k.family == "paged_decode")
        .ok_or_else(|| "no attention kernel".into())
}

/// The key loops start at the window, and a window that hides nothing changes nothing.
fn plan_loops(arch: &'static str) -> Result<(), Failed> {
    let d = CodegenOptions::default();
    for c in prefill_cases(DType::F32)
        .into_iter()
        .chain(prefill_cases(DType::F16))
        .chain(decode_cases(DType::F32))
    {
        let plan = plan_of(&c.graph(), arch, &d)?;
        let body = &attention_kernel(&plan)?.body;
        let windowed = body.contains("Sliding window of");
        let starts = body.contains("key_begin + t *")
            || body.contains("j0 = key_begin")
            || body.contains("win_lo + (long long)split");
        if c.effective() && !(windowed && starts) {
            return Err(format!(
                "{} on {arch}: the key loop does not start at the window",
                c.name
            )
            .into());
        }
        // A window that hides no key gives the unwindowed kernel.
        if !c.effective() && windowed {
            return Err(format!("{}: a window hiding nothing was kept", c.name).into());
        }
    }
    for p in paged_cases(DType::F32) {
        let body = attention_kernel(&plan_of(&p.graph(), arch, &d)?)?
            .body
            .clone();
        if !body.contains("win_lo + (long long)split") {
            return Err(format!("{}: the splits do not start at the window", p.base.name).into());
        }
    }
    // No window vs a window of 2^32 − 1 over the same node: the same plan, byte for byte.
    let c = WindowCase::new(
        "same",
        (1, 4, 2),
        (70, 90, 64),
        DType::F16,
        20,
        None,
        u32::MAX,
    );
    let wide = plan_of(&c.graph(), arch, &d)?.listing();
    let plain = plan_of(&c.graph_window(None), arch, &d)?.listing();
    if plain != wide {
        return Err(format!("{arch}: a window hiding nothing changed the plan").into());
    }
    Ok(())
}

fn host_run(
    cxx: &Path,
    g: &Graph,
    b: &Bindings,
    want: &rocmforge::ir::Tensor,
    arch: &str,
) -> Result<(), Failed> {
    let plan = plan_of(g, arch, &CodegenOptions::default())?;
    let got = host_kernels::run_plan(cxx, g, &plan, b)?
        .map_err(|e| e.to_string())?
        .remove(0);
    check(&format!("{} on {arch}", g.name), &got, want, DType::F32)
}

/// The kernels of every case for `arch`: f32, f16 and bf16 prefill, decode, paged decode.
fn compile_set(arch: &str) -> Result<KernelSet, Failed> {
    let mut set = KernelSet::new();
    let d = CodegenOptions::default();
    let mut graphs: Vec<Graph> = Vec::new();
    for dt in [DType::F32, DType::F16, DType::BF16] {
        graphs.extend(prefill_cases(dt).iter().map(WindowCase::graph));
        graphs.extend(decode_cases(dt).iter().map(WindowCase::graph));
        graphs.extend(paged_cases(dt).iter().map(PagedWindow::graph));
    }
    for g in &graphs {
        let plan = plan_of(g, arch, &d)?;
        for k in &plan.kernels {
            set.entry(k.entry.clone())
                .or_insert((plan.source(k), k.body.clone(), g.name.clone()));
        }
    }
    Ok(set)
}

/// The sm_90a warpgroup kernels of the f16/bf16 prefill cases (its head sizes: 64 and 128), in
/// both schedules.
fn wgmma_set() -> Result<KernelSet, Failed> {
    let mut set = KernelSet::new();
    for dt in [DType::F16, DType::BF16] {
        for c in prefill_cases(dt).into_iter().filter(|c| c.d >= 64) {
            for schedule in [WgmmaAttention::Auto, WgmmaAttention::Overlapped] {
                let options = CodegenOptions {
                    wgmma_attention: schedule,
                    ..CodegenOptions::default()
                };
                let plan = plan_of(&c.graph(), "sm_90a", &options)?;
                let k = attention_kernel(&plan)?;
                if !k
                    .body
                    .starts_with("// FlashAttention on Hopper's warpgroup MMA")
                {
                    continue;
                }
                set.entry(k.entry.clone()).or_insert((
                    plan.source(k),
                    k.body.clone(),
                    c.name.clone(),
                ));
            }
        }
    }
    if set.is_empty() {
        return Err("no case took the warpgroup kernel".into());
    }
    Ok(set)
}

fn main() {
    let args = Arguments::from_args();
    let cxx = host_kernels::host_cxx();
    let mut trials: Vec<Trial> = kernel_compile::compile_trials(compile_set);
    trials.push(needs(
        &kernel_compile::ptxas(),
        "ROCMFORGE_REQUIRE_PTXAS",
        "compile::nvrtc::sm_90a::wgmma".to_string(),
        |p| kernel_compile::nvrtc(&p, "sm_90a", &wgmma_set()?),
    ));
    for c in prefill_cases(DType::F32)
        .into_iter()
        .chain(decode_cases(DType::F32))
    {
        trials.push(Trial::test(format!("interp::{}", c.name), move || {
            interp_case(&c)
        }));
    }
    for p in paged_cases(DType::F32) {
        trials.push(Trial::test(format!("interp::{}", p.base.name), move || {
            interp_paged(&p)
        }));
    }
    trials.push(Trial::test(
        "interp::window_1_and_past_every_key",
        interp_edges,
    ));
    trials.push(Trial::test("ir::typed_errors_and_round_trip", ir_rules));
    for arch in ["gfx90a", "gfx1100", "sm_90a"] {
        trials.push(Trial::test(
            format!("plan::{arch}::loops_start_at_the_window"),
            move || plan_loops(arch),
        ));
    }
    for arch in ["gfx90a", "gfx1100"] {
        for c in prefill_cases(DType::F32)
            .into_iter()
            .chain(decode_cases(DType::F32))
        {
            trials.push(needs(
                &cxx,
                "ROCMFORGE_REQUIRE_HOST_CXX",
                format!("host::{arch}::{}", c.name),
                move |cxx| {
                    let b = c.bindings(21);
                    host_run(&cxx, &c.graph(), &b, &c.reference(&b), arch)
                },
            ));
        }
        for p in paged_cases(DType::F32) {
            trials.push(needs(
                &cxx,
                "ROCMFORGE_REQUIRE_HOST_CXX",
                format!("host::{arch}::{}", p.base.name),
                move |cxx| {
                    let (b, flat) = p.bindings(22);
                    host_run(&cxx, &p.graph(), &b, &p.base.reference(&flat), arch)
                },
            ));
        }
    }
    libtest_mimic::run(&args, trials).exit();
}
