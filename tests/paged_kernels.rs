//! The paged KV cache kernels (`codegen/kernels/attention/paged.rs`: `paged_write.hip`,
//! `paged_decode.hip`) without a GPU:
//!
//! - `plan::` a paged step's plan: two in-place writes (their buffers the pools' states) and one
//!   paged decode kernel, with workspace and counters when the keys split;
//! - `host::` the generated AMD source compiled by the host's clang++ (one fiber per GPU
//!   thread, `common/host_kernels.rs`) for wave64 (gfx90a) and wave32 (gfx1100) plans: a
//!   decode step through state buffers against the interpreter (the output at the dtype
//!   tolerance, the written pools bit for bit), and attention alone against the contiguous
//!   reference; every pool row no sequence reads is NaN (`common/paged_cases.rs`), so a read
//!   through a wrong block or past kv_len fails; counters back at 0 after a split run;
//! - `compile::` every kernel of the cases through hiprtc (gfx90a, gfx1030), the offline clang
//!   (gfx942, gfx1100, gfx1201) and NVRTC + ptxas (sm_90, sm_90a): no spills, no stack.
//!
//! The GPU trials are `paged::` in `tests/gpu/`. Trials whose tool is missing are reported
//! ignored, with the reason; the `ROCMFORGE_REQUIRE_*` variables make that a failure.

#[path = "common/accuracy.rs"]
mod accuracy;
#[path = "common/host_kernels.rs"]
mod host_kernels;
#[path = "common/kernel_compile.rs"]
mod kernel_compile;
#[path = "common/needs.rs"]
mod needs;
#[path = "common/paged_cases.rs"]
mod paged_cases;

use std::collections::HashMap;
use std::path::Path;

use accuracy::{rel_l2, tolerance};
use libtest_mimic::{Arguments, Failed, Trial};
use needs::needs;
use paged_cases::{cases, PagedCase};
use rocmforge::arch::Target;
use rocmforge::codegen::{generate_with, BufferRole, CodegenOptions, KernelPlan};
use rocmforge::interp;
use rocmforge::ir::{DType, Graph, Tensor};

fn plan_of(g: &Graph, arch: &str) -> Result<KernelPlan, Failed> {
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    generate_with(g, &target, &CodegenOptions::default())
        .map_err(|e| format!("{}: {e}", g.name).into())
}

/// The host cases, and one whose keys split (a table of 40 blocks of 16, lengths that reach
/// different numbers of splits).
fn host_cases() -> Vec<PagedCase> {
    let mut v = cases();
    v.push(split_case());
    v
}

fn split_case() -> PagedCase {
    PagedCase {
        b: 3,
        hq: 8,
        hkv: 2,
        s: 1,
        d: 32,
        block_size: 16,
        num_blocks: 67,
        max_blocks: 40,
        kv_len: vec![600, 333, 17],
        share_prefix: true,
        dtype: DType::F16,
    }
}

fn plan_shape(arch: &str) -> Result<(), Failed> {
    let c = split_case();
    let g = c.step_graph(c.dtype);
    let plan = plan_of(&g, arch)?;
    let families: Vec<&str> = plan.kernels.iter().map(|k| k.family).collect();
    if families != ["paged_cache_write", "paged_cache_write", "paged_decode"] {
        return Err(format!("kernels {families:?}").into());
    }
    // Each write's output is its state's buffer: in place.
    for (k, state) in plan.kernels[..2].iter().zip(["k_pool", "v_pool"]) {
        let out = *k.args.last().ok_or("no args")?;
        match &plan.buffers[out].role {
            BufferRole::State { name } if name == state => {}
            other => return Err(format!("write into {other:?}, not {state}").into()),
        }
    }
    let att = &plan.kernels[2];
    if att.launch.grid[1] < 2 {
        return Err(format!("{arch}: no split over 640 keys: {:?}", att.launch).into());
    }
    let roles: Vec<bool> = att
        .args
        .iter()
        .map(|&a| matches!(plan.buffers[a].role, BufferRole::Counters))
        .collect();
    if roles.iter().filter(|&&c| c).count() != 1 {
        return Err("the split kernel has no counters".into());
    }
    // Too many query rows per K/V head for one block: a typed error, not a kernel.
    let wide = PagedCase {
        s: 9,
        kv_len: vec![20, 20, 12],
        ..PagedCase::small(DType::F32)
    };
    match plan_of(&wide.attention_graph(DType::F32), arch) {
        Err(e) if e.message().is_some_and(|m| m.contains("query rows")) => Ok(()),
        Err(e) => Err(format!("unexpected error {e:?}").into()),
        Ok(_) => Err("27 query rows per K/V head took a kernel".into()),
    }
}

/// A decode step on the host through state buffers: output against the interpreter and the
/// contiguous reference, pools bit for bit against the interpreter's next states; with splits,
/// every counter back at 0.
fn host_step(cxx: &Path, c: &PagedCase, arch: &str) -> Result<(), Failed> {
    let g = c.step_graph(c.dtype);
    let plan = plan_of(&g, arch)?;
    let data = c.data(21);
    let b = c.step_bindings(&data);
    let states = HashMap::from([
        ("k_pool".to_string(), data.k_pool.clone()),
        ("v_pool".to_string(), data.v_pool.clone()),
    ]);
    let (want, want_states) = interp::run_with_state(&g, &b, &HashMap::new(), &states)
        .map_err(|e| format!("{}: {e}", c.name()))?;
    let (result, buffers) =
        host_kernels::run_plan_with_states_buffers(cxx, &g, &plan, &b, &states)?;
    let (got, got_states) = result.map_err(|e| format!("{}: {e}", c.name()))?;
    let tol = tolerance(c.dtype);
    for (what, w) in [
        ("the interpreter", &want[0]),
        ("the contiguous attention", &c.reference(&data, c.dtype)),
    ] {
        let err = rel_l2(&got[0], w).map_err(|e| format!("{}: {e}", c.name()))?;
        if err > tol {
            return Err(format!(
                "{}: against {what}: relative L2 {err:e} > {tol:e}",
                c.name()
            )
            .into());
        }
    }
    for (name, w) in &want_states {
        let g = &got_states[name];
        let same = g
            .as_f32()
            .unwrap()
            .iter()
            .zip(w.as_f32().unwrap())
            .all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()));
        if !same {
            return Err(format!("{}: pool {name} differs from the interpreter's", c.name()).into());
        }
    }
    for buf in &plan.buffers {
        if matches!(buf.role, BufferRole::Counters) && buffers[buf.id].iter().any(|&x| x != 0) {
            return Err(format!("{}: counters left non-zero", c.name()).into());
        }
    }
    Ok(())
}

/// A table entry that names a block outside the pool, among the blocks a sequence reads: the
/// kernel reads nothing outside the pools and treats those keys as invisible, so the output is
/// attention over the other keys (finite), where the interpreter reports the error.
fn host_bad_block(cxx: &Path, arch: &str) -> Result<(), Failed> {
    let c = PagedCase::small(DType::F32);
    let g = c.attention_graph(DType::F32);
    let plan = plan_of(&g, arch)?;
    let data = c.data(4);
    let mut b = c.attention_bindings(&data);
    let mut table = data.table.as_i64().unwrap().to_vec();
    // Sequence 1's second block (keys 4..8 of 13) out of the pool.
    table[c.max_blocks + 1] = 1 << 20;
    b.inputs.insert(
        "table".into(),
        Tensor::from_i64(DType::I32, vec![c.b, c.max_blocks], table).unwrap(),
    );
    if interp::run(&g, &b).is_ok() {
        return Err("the interpreter accepted a block outside the pool".into());
    }
    let got = host_kernels::run_plan(cxx, &g, &plan, &b)?
        .map_err(|e| e.to_string())?
        .remove(0);
    if got.as_f32().unwrap().iter().any(|x| !x.is_finite()) {
        return Err("a bad block's keys were read".into());
    }
    Ok(())
}

/// The unique kernels of every case's step plan for `arch`, and of its append form
/// (`passes::PagedAppend`: q rotated on load, the writes done by the attention's kernel), with
/// Llama 3's factors on every other case.
fn compile_set(arch: &str) -> Result<kernel_compile::KernelSet, Failed> {
    let mut out = kernel_compile::KernelSet::new();
    for (i, c) in host_cases().into_iter().enumerate() {
        let factors = if i % 2 == 1 {
            (0..c.d / 2).map(|j| 1.0 + (j % 3) as f64).collect()
        } else {
            vec![]
        };
        let mut appending = c.append_graph(c.dtype, factors);
        rocmforge::passes::PassManager::pipeline(true)
            .run(&mut appending)
            .map_err(|e| e.to_string())?;
        for g in [c.step_graph(c.dtype), c.attention_graph(c.dtype), appending] {
            let plan = plan_of(&g, arch)?;
            for k in &plan.kernels {
                out.entry(k.entry.clone())
                    .or_insert((plan.source(k), k.body.clone(), c.name()));
            }
        }
    }
    Ok(out)
}

fn main() {
    let args = Arguments::from_args();
    let cxx = host_kernels::host_cxx();
    // The compile trials first: the longest, so the shorter ones fill the other threads.
    let mut trials = kernel_compile::compile_trials(compile_set);
    for arch in ["sm_90", "gfx90a", "gfx1100"] {
        trials.push(Trial::test(format!("plan::{arch}"), move || {
            plan_shape(arch)
        }));
    }
    for (i, c) in host_cases().into_iter().enumerate() {
        let arch = ["gfx90a", "gfx1100"][i % 2];
        trials.push(needs(
            &cxx,
            "ROCMFORGE_REQUIRE_HOST_CXX",
            format!("host::{arch}::{}", c.name()),
            move |cxx| host_step(&cxx, &c, arch),
        ));
    }
    for arch in ["gfx90a", "gfx1100"] {
        trials.push(needs(
            &cxx,
            "ROCMFORGE_REQUIRE_HOST_CXX",
            format!("host::{arch}::bad_block"),
            move |cxx| host_bad_block(&cxx, arch),
        ));
    }
    libtest_mimic::run(&args, trials).exit();
}
