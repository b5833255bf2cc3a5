//! The flash-decoding kernels (`codegen/kernels/attention/decode.rs`) without a GPU:
//!
//! - `plan::` the plan of a decode node: one kernel; with several splits it writes a workspace
//!   (planned memory, never an output) and counts its blocks in a counters buffer (zeroed once,
//!   never planned or poisoned), and its last block writes the node's buffer.
//! - `host::` runs the pair on the CPU (the generated AMD source compiled by the host's
//!   clang++, one fiber per GPU thread, see `common/host_kernels.rs`) against the f32
//!   interpreter at the dtype tolerances, for wave64 (gfx90a) and wave32 (gfx1100) plans. The
//!   output and the workspace start poisoned (NaN), so a slot the combine reads that the split
//!   kernel did not write, or an output element nobody wrote, fails.
//!
//! - `compile::` compiles both kernels of every dtype, head size (64, 80, 128), mask and causal
//!   form with hiprtc (gfx90a, gfx1030), the offline clang (gfx942, gfx1100, gfx1201) and
//!   NVRTC + ptxas (sm_90): no spills, no scratch or stack, the target's wave size.
//!
//! - `state::` (issue 15): the decode kernel and the prefill kernels bounded by `kv_len` from data
//!   over caches whose tail past it is NaN (`common/kv_cases.rs`), on the host against the
//!   interpreter; one decode step of a GQA layer (`graphs/decode_step.json` after the default
//!   pipeline: in-place cache writes, rope at positions from data, attention over `kv_len` keys,
//!   argmax) run token by token on the host through state buffers whose unwritten tail is NaN,
//!   against the interpreter's `run_with_state`; a write past the cache reported as the
//!   interpreter's error; argmax's ties and NaN. The `compile::` trials include these kernels.
//!
//! The GPU trials are `decode::` and `decops::` in `tests/gpu/`. Trials whose tool is missing are reported
//! ignored, with the reason; `ROCMFORGE_REQUIRE_HOST_CXX=1`, `ROCMFORGE_REQUIRE_HIPRTC=1`,
//! `ROCMFORGE_REQUIRE_CLANG=1` and `ROCMFORGE_REQUIRE_PTXAS=1` make that a failure.

#[path = "common/accuracy.rs"]
mod accuracy;
#[path = "common/decode_cases.rs"]
mod decode_cases;
#[path = "common/host_kernels.rs"]
mod host_kernels;
#[path = "common/kernel_compile.rs"]
mod kernel_compile;
#[path = "common/kv_cases.rs"]
mod kv_cases;
#[path = "common/needs.rs"]
mod needs;
#[path = "common/row_error.rs"]
mod row_error;

use std::collections::HashMap;
use std::path::Path;

use accuracy::{rel_l2, tolerance};
use decode_cases::{batch0_zero, Case, Mask};
use libtest_mimic::{Arguments, Failed, Trial};
use needs::needs;
use rocmforge::arch::Target;
use rocmforge::codegen::{generate_with, BufferRole, CodegenOptions, KernelPlan};
use rocmforge::compile::plan_memory;
use rocmforge::interp::{self, Bindings, InterpError};
use rocmforge::ir::{format, DType, Graph, Tensor};
use rocmforge::passes::PassManager;

fn plan(c: &Case, arch: &str) -> Result<KernelPlan, Failed> {
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    generate_with(&c.graph(), &target, &CodegenOptions::default())
        .map_err(|e| format!("{}: {e}", c.name()).into())
}

/// The plan is the one decode kernel, writing `out`; with several splits its workspace and
/// counters come just before `out`.
fn is_decode(c: &Case, plan: &KernelPlan) -> Result<(), Failed> {
    let families: Vec<&str> = plan.kernels.iter().map(|k| k.family).collect();
    if families != ["flash_decode"] {
        return Err(format!("{}: kernels {families:?}", c.name()).into());
    }
    let k = &plan.kernels[0];
    let out = plan.outputs[0].buffer;
    let n = k.args.len();
    if k.args.last() != Some(&out) {
        return Err(format!("{}: bindings {:?}", c.name(), k.args).into());
    }
    if k.launch.grid[1] > 1 {
        let roles = [
            &plan.buffers[k.args[n - 3]].role,
            &plan.buffers[k.args[n - 2]].role,
        ];
        if roles != [&BufferRole::Workspace, &BufferRole::Counters] {
            return Err(format!("{}: workspace and counters {roles:?}", c.name()).into());
        }
    }
    Ok(())
}

/// The decode kernel's workspace, counters and output, for a plan of several splits.
fn split_buffers(plan: &KernelPlan) -> Result<(usize, usize, usize), Failed> {
    let a = &plan.kernels[0].args;
    match a.len() {
        n if n >= 3 && plan.kernels[0].launch.grid[1] > 1 => Ok((a[n - 3], a[n - 2], a[n - 1])),
        _ => Err(format!("one split: {a:?}").into()),
    }
}

fn plan_shape(c: &Case, arch: &str) -> Result<(), Failed> {
    let plan = plan(c, arch)?;
    is_decode(c, &plan)?;
    if plan.kernels[0].launch.grid[1] == 1 {
        // One split: the block writes the output itself, with no scratch at all.
        let scratch = plan
            .buffers
            .iter()
            .any(|b| matches!(b.role, BufferRole::Workspace | BufferRole::Counters));
        return match scratch {
            true => Err(format!("{}: one split with a workspace or counters", c.name()).into()),
            false => Ok(()),
        };
    }
    let (ws, counters, _) = split_buffers(&plan)?;
    let splits = plan.kernels[0].launch.grid[1] as usize;
    // (Dv partials + m + l) per output row and split, in f32.
    let rows = c.b * c.hq * c.sq;
    let want = rows * splits * (c.dv + 2);
    let ty = &plan.buffers[ws].ty;
    if ty.dtype != DType::F32 || ty.shape.dims() != [want] {
        return Err(format!("{}: workspace {ty}, want f32 [{want}]", c.name()).into());
    }
    if plan.outputs.iter().any(|o| o.buffer == ws) {
        return Err("the workspace is an output".into());
    }
    let grid = plan.kernels[0].launch.grid;
    if grid[0] as usize != c.b * c.hkv {
        return Err(format!("{}: grid {grid:?}", c.name()).into());
    }
    // One counter per (batch, K/V head): the blocks of a grid row count in it.
    let cty = &plan.buffers[counters].ty;
    if cty.shape.dims() != [c.b * c.hkv] || cty.dtype.size_bytes() != 4 {
        return Err(format!("{}: counters {cty}", c.name()).into());
    }
    let memory = plan_memory(&plan);
    // Counters live outside the slots, so neither the memory plan nor re-poisoning touches them.
    if memory.slot_of.contains_key(&counters) {
        return Err("the counters share planned memory".into());
    }
    let slot = memory
        .slot_of
        .get(&ws)
        .ok_or("the workspace has no memory")?;
    if memory.slot_bytes[*slot] < want * 4 {
        return Err("the workspace's slot is too small".into());
    }
    if memory.slot_of.get(&plan.outputs[0].buffer) == Some(slot) {
        return Err("the workspace shares the output's slot".into());
    }
    Ok(())
}

/// A workspace's slot is free once its node is done: a later value may take it.
fn workspace_slot_reused() -> Result<(), Failed> {
    let c = Case::new(1, 600, DType::F32);
    let mut g = c.graph();
    let out = g.find("out").expect("out");
    // out · 2 then · 3: the second product takes a freed slot, the workspace's being the
    // only one free that is large enough besides the first product's operand.
    let two = g.scalar(2.0, DType::F32).map_err(|e| e.to_string())?;
    let a = g.mul(out, two).map_err(|e| e.to_string())?;
    let three = g.scalar(3.0, DType::F32).map_err(|e| e.to_string())?;
    let b = g.mul(a, three).map_err(|e| e.to_string())?;
    g.set_outputs(&[b]).map_err(|e| e.to_string())?;
    let target = Target::parse("sm_90").map_err(|e| e.to_string())?;
    let plan = generate_with(&g, &target, &CodegenOptions::default()).map_err(|e| e.to_string())?;
    let memory = plan_memory(&plan);
    let ws = plan
        .buffers
        .iter()
        .find(|b| b.role == BufferRole::Workspace)
        .ok_or("no workspace")?;
    let reused = plan
        .buffers
        .iter()
        .filter(|b| b.role == BufferRole::Computed)
        .any(|b| memory.slot_of.get(&b.id) == memory.slot_of.get(&ws.id));
    if reused {
        Ok(())
    } else {
        Err(format!("no value reuses the workspace's slot: {memory:?}").into())
    }
}

/// The GPU trials (`decode::` in tests/gpu/) exercise the decode kernel on sm_90 wherever a
/// K/V head serves several query heads and its rows fit one block (group × Sq ≤ 16, D ≤ 128).
fn gpu_cases_take_decode() -> Result<(), Failed> {
    let mut decode = 0;
    for c in decode_cases::gpu_cases() {
        let group = c.hq / c.hkv;
        let p = plan(&c, "sm_90")?;
        if group > 1 && group * c.sq <= 16 {
            is_decode(&c, &p)?;
            decode += 1;
        }
    }
    if decode < 100 {
        return Err(format!("only {decode} GPU cases take the decode kernels").into());
    }
    Ok(())
}

fn host_run(cxx: &Path, c: &Case, arch: &str) -> Result<(), Failed> {
    let plan = plan(c, arch)?;
    is_decode(c, &plan)?;
    let g = c.graph();
    let b = c.bindings(5);
    let want = c.reference(&b);
    let got = host_kernels::run_plan(cxx, &g, &plan, &b)?
        .map_err(|e| e.to_string())?
        .remove(0);
    row_error::within(&c.name(), &got, &want, tolerance(c.dtype))?;
    if c.mask == Mask::EmptyRow && !batch0_zero(&got, c) {
        return Err(format!("{}: rows with no visible key are not zeros", c.name()).into());
    }
    Ok(())
}

/// Small enough for one fiber per GPU thread: odd key counts (not multiples of the tile
/// or the split), several splits, each dtype, the head sizes whose loads are and are not
/// 16-byte vectors, causal offsets, masks and rows with no visible key.
fn host_cases() -> Vec<Case> {
    let mut v = Vec::new();
    for dtype in [DType::F16, DType::BF16, DType::F32] {
        v.push(Case::new(1, 601, dtype));
        v.push(Case {
            causal: Some(-1),
            ..Case::new(3, 530, dtype)
        });
    }
    v.push(Case::new(1, 17, DType::F32));
    // No key visible to any row: one split with no key, zeros out.
    v.push(Case {
        causal: Some(-3),
        ..Case::new(3, 300, DType::BF16)
    });
    v.push(Case {
        d: 80,
        dv: 72,
        hq: 4,
        hkv: 1,
        ..Case::new(2, 700, DType::F16)
    });
    v.push(Case {
        d: 36,
        dv: 20,
        hq: 2,
        hkv: 1,
        causal: Some(300),
        ..Case::new(3, 777, DType::F32)
    });
    v.push(Case {
        b: 2,
        mask: Mask::Padding,
        ..Case::new(1, 900, DType::BF16)
    });
    v.push(Case {
        b: 2,
        hq: 1,
        hkv: 1,
        mask: Mask::EmptyRow,
        ..Case::new(2, 600, DType::F32)
    });
    v
}

/// The cases compiled for every target: each dtype and head size (16-byte loads for 64 and 128,
/// and for 80 where the dtype's vector divides it), with and without mask and causal, one and
/// several query positions.
fn compile_cases() -> Vec<Case> {
    let mut v = Vec::new();
    for dtype in [DType::F16, DType::BF16, DType::F32] {
        for d in [64, 80, 128] {
            v.push(Case {
                d,
                dv: d,
                ..Case::new(1, 4097, dtype)
            });
            v.push(Case {
                b: 2,
                hq: 16,
                hkv: 4,
                d,
                dv: d,
                mask: Mask::Padding,
                causal: Some(4000),
                ..Case::new(4, 4097, dtype)
            });
        }
        v.push(Case {
            mask: Mask::EmptyRow,
            d: 36,
            dv: 20,
            ..Case::new(2, 777, dtype)
        });
    }
    v
}

/// The unique kernels of the compile cases for `arch`, with the kv_len forms of the decode and
/// prefill kernels and the decode step's state kernels.
fn compile_set(arch: &str) -> Result<kernel_compile::KernelSet, Failed> {
    let mut out = kernel_compile::KernelSet::new();
    for c in compile_cases() {
        let plan = plan(&c, arch)?;
        is_decode(&c, &plan)?;
        for k in &plan.kernels {
            out.entry(k.entry.clone())
                .or_insert((plan.source(k), k.body.clone(), c.name()));
        }
    }
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let mut graphs: Vec<(String, Graph)> = kv_cases::gpu_cases()
        .into_iter()
        .map(|c| (c.name(), c.graph()))
        .collect();
    graphs.push(("decode_step".into(), decode_step()?));
    // The split argmax over an LM head's logits (SmolLM2's vocabulary), f32 and f16.
    for dtype in [DType::F32, DType::F16] {
        let mut g = Graph::new("argmax_split");
        let x = g
            .input("x", dtype, &[1, 49152])
            .map_err(|e| e.to_string())?;
        let r = g.argmax(x, -1).map_err(|e| e.to_string())?;
        g.set_outputs(&[r]).map_err(|e| e.to_string())?;
        graphs.push((format!("argmax_split_{dtype}"), g));
    }
    // The LM head with its argmax fused (SmolLM2's sizes: vocabulary 49152, hidden 576).
    for dtype in [DType::F32, DType::F16] {
        let mut g = Graph::new("lm_head_argmax");
        let x = g.input("x", dtype, &[1, 576]).map_err(|e| e.to_string())?;
        let w = g
            .input("w", dtype, &[49152, 576])
            .map_err(|e| e.to_string())?;
        let wt = g.permute(w, &[1, 0]).map_err(|e| e.to_string())?;
        let mut logits = g.matmul(x, wt).map_err(|e| e.to_string())?;
        if dtype != DType::F32 {
            logits = g.cast(logits, DType::F32).map_err(|e| e.to_string())?;
        }
        let r = g.argmax(logits, -1).map_err(|e| e.to_string())?;
        g.set_outputs(&[r]).map_err(|e| e.to_string())?;
        PassManager::default_pipeline()
            .run(&mut g)
            .map_err(|e| e.to_string())?;
        graphs.push((format!("lm_head_argmax_{dtype}"), g));
    }
    // The appending decode kernel (q rotated on load, the step's rows from the inputs).
    for c in append_cases() {
        let mut g = c.graph();
        PassManager::default_pipeline()
            .run(&mut g)
            .map_err(|e| e.to_string())?;
        graphs.push((format!("append_{}", c.name()), g));
    }
    for (name, g) in graphs {
        let plan = generate_with(&g, &target, &CodegenOptions::default())
            .map_err(|e| format!("{name}: {e}"))?;
        // Rope (and a cache write that rotates) compiles for NVIDIA too: its sin/cos are
        // polynomials on a double-reduced angle (rope_parts.hip), no library slow path and
        // so no stack frame.
        for k in &plan.kernels {
            out.entry(k.entry.clone())
                .or_insert((plan.source(k), k.body.clone(), name.clone()));
        }
    }
    Ok(out)
}

// ---- state:: (issue 15) -------------------------------------------------------------------

fn kv_plan(c: &kv_cases::KvCase, arch: &str) -> Result<KernelPlan, Failed> {
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    generate_with(&c.graph(), &target, &CodegenOptions::default())
        .map_err(|e| format!("{}: {e}", c.name()).into())
}

/// The kv_len case on the host: the decode kernel where its rows fit one block (else the prefill
/// kernel the target has), against the interpreter; the tail of K/V is NaN.
fn kv_host_run(cxx: &Path, c: &kv_cases::KvCase, arch: &str) -> Result<(), Failed> {
    let plan = kv_plan(c, arch)?;
    let families: Vec<&str> = plan.kernels.iter().map(|k| k.family).collect();
    if kv_cases::is_decode(c) && families != ["flash_decode"] {
        return Err(format!("{}: kernels {families:?}", c.name()).into());
    }
    let g = c.graph();
    let b = c.bindings(7);
    let want = c.reference(&b);
    let got = host_kernels::run_plan(cxx, &g, &plan, &b)?
        .map_err(|e| e.to_string())?
        .remove(0);
    row_error::within(&c.name(), &got, &want, tolerance(c.dtype))?;
    Ok(())
}

/// The decode kernel over a cache of 2048 (the grid's splits are those of the largest
/// context) at contexts that reach a few of them, not multiples of a split: GQA 9/3, 4/1 and
/// 1/1, head dims 64, 80 and 128, f32 and f16, the cache tail NaN.
fn split_cases() -> Vec<kv_cases::KvCase> {
    let mut v = Vec::new();
    for (i, kv) in [1usize, 7, 64, 65, 511].into_iter().enumerate() {
        let dtype = [DType::F16, DType::F32][i % 2];
        v.push(kv_cases::KvCase::new(2048, kv, dtype));
    }
    v.push(kv_cases::KvCase {
        hq: 4,
        hkv: 1,
        d: 128,
        ..kv_cases::KvCase::new(2048, 65, DType::F16)
    });
    v.push(kv_cases::KvCase {
        hq: 1,
        hkv: 1,
        d: 80,
        causal: false,
        ..kv_cases::KvCase::new(2048, 130, DType::F32)
    });
    v
}

/// A split case on the host: one launch of the decode kernel with several splits in its grid,
/// against the interpreter, and every counter back at 0 afterwards (the last active block
/// counted and reset it; a block past kv_len's splits counted nothing), so the next launch or
/// a replay starts clean whatever kv_len it reads.
fn split_host_run(cxx: &Path, c: &kv_cases::KvCase, arch: &str) -> Result<(), Failed> {
    let plan = kv_plan(c, arch)?;
    let k = match plan.kernels.as_slice() {
        [k] if k.family == "flash_decode" && k.launch.grid[1] > 1 => k,
        _ => return Err(format!("{}: not one split decode kernel", c.name()).into()),
    };
    let counters = plan
        .buffers
        .iter()
        .find(|b| matches!(b.role, BufferRole::Counters) && k.args.contains(&b.id))
        .ok_or("no counters")?
        .id;
    let g = c.graph();
    let b = c.bindings(5);
    let want = c.reference(&b);
    let buffers = host_kernels::run_plan_buffers(cxx, &g, &plan, &b)?;
    if buffers[counters].iter().any(|&x| x != 0) {
        return Err(format!("{}: counters left {:?}", c.name(), buffers[counters]).into());
    }
    let out = &plan.outputs[0];
    let n = out.ty.shape.numel() * out.ty.dtype.size_bytes();
    let got = Tensor::from_bytes(&out.ty, &buffers[out.buffer][..n]).map_err(|e| e.to_string())?;
    row_error::within(&c.name(), &got, &want, tolerance(c.dtype))?;
    Ok(())
}

/// `graphs/decode_step.json` after the default pipeline.
fn decode_step() -> Result<Graph, Failed> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("graphs/decode_step.json");
    let mut g = format::load(&path).map_err(|e| e.to_string())?;
    PassManager::default_pipeline()
        .run(&mut g)
        .map_err(|e| e.to_string())?;
    Ok(g)
}

fn i32s(v: &[i64]) -> Tensor {
    Tensor::from_i64(DType::I32, vec![v.len()], v.to_vec()).expect("i32 values")
}

/// Four decode steps on the host through the plan's state buffers (starting NaN: the unwritten
/// tail must never be read), each against the interpreter's `run_with_state` from the states it
/// left; then a write at the end of the context, which both refuse with the same error.
fn decode_step_host(cxx: &Path, arch: &str) -> Result<(), Failed> {
    let g = decode_step()?;
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let plan = generate_with(&g, &target, &CodegenOptions::default()).map_err(|e| e.to_string())?;
    let families: Vec<&str> = plan.kernels.iter().map(|k| k.family).collect();
    // The attention appends (`decode_append`): q's rope and both cache writes are done by the
    // decode kernel, which writes the state buffers in place (no copy of a cache made); the
    // token's argmax is the LM head GEMV's tail (no argmax kernel of its own).
    if !families.contains(&"flash_decode") || families.contains(&"argmax") {
        return Err(format!("not flash_decode and a folded argmax: {families:?}").into());
    }
    if families.iter().any(|&f| f == "cache_write" || f == "rope") {
        return Err(format!("a rope or cache write kernel left in {families:?}").into());
    }
    let state_bufs: Vec<usize> = plan
        .buffers
        .iter()
        .filter(|b| matches!(b.role, BufferRole::State { .. }))
        .map(|b| b.id)
        .collect();
    let attention = plan
        .kernels
        .iter()
        .find(|k| k.family == "flash_decode")
        .ok_or("no decode kernel")?;
    let mut writes: Vec<usize> = attention
        .written()
        .filter(|b| state_bufs.contains(b))
        .collect();
    writes.sort_unstable();
    if state_bufs.len() != 2 || writes != state_bufs {
        return Err(format!("the decode kernel writes {writes:?}, states {state_bufs:?}").into());
    }
    let weights: HashMap<String, Tensor> =
        host_kernels::with_weights(&g, Bindings::default()).weights;
    let cache = g.ty(g.find("k_cache").ok_or("no k_cache")?).clone();
    let nan = Tensor::from_f64(
        DType::F32,
        cache.shape.clone(),
        &vec![f64::NAN; cache.shape.numel()],
    )
    .map_err(|e| e.to_string())?;
    let mut host_states: HashMap<String, Tensor> = ["k_cache", "v_cache"]
        .iter()
        .map(|n| (n.to_string(), nan.clone()))
        .collect();
    let mut ref_states = host_states.clone();
    for t in 0..4i64 {
        let mut b = Bindings::random(&g, 100 + t as u64);
        b.inputs.insert("pos".into(), i32s(&[t]));
        b.inputs.insert("kv_len".into(), i32s(&[t + 1]));
        let b = host_kernels::with_weights(&g, b);
        let (want, want_states) =
            interp::run_with_state(&g, &b, &weights, &ref_states).map_err(|e| e.to_string())?;
        let (got, got_states) =
            host_kernels::run_plan_with_states(cxx, &g, &plan, &b, &host_states)?
                .map_err(|e| e.to_string())?;
        let err = rel_l2(&got[0], &want[0]).map_err(|e| format!("step {t}: {e}"))?;
        if err > 1e-5 {
            return Err(format!("step {t}: logits relative L2 {err:e}").into());
        }
        row_error::rows_within(&got[0], &want[0], 1e-5).map_err(|e| format!("step {t}: {e}"))?;
        if got[1] != want[1] {
            return Err(format!("step {t}: token {:?}, want {:?}", got[1], want[1]).into());
        }
        // Written rows agree; the tail is still the NaN it started as.
        for name in ["k_cache", "v_cache"] {
            let (h, r) = (
                got_states[name].to_f64_vec(),
                want_states[name].to_f64_vec(),
            );
            let same = h.iter().zip(&r).all(|(a, b)| {
                (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-5 * b.abs().max(1.0)
            });
            if !same {
                return Err(format!("step {t}: state {name} differs").into());
            }
        }
        host_states = got_states;
        ref_states = want_states;
    }
    let last = cache.shape.dims()[2] as i64;
    let mut b = host_kernels::with_weights(&g, Bindings::random(&g, 9));
    b.inputs.insert("pos".into(), i32s(&[last]));
    b.inputs.insert("kv_len".into(), i32s(&[last]));
    let want = interp::run_with_state(&g, &b, &weights, &ref_states).unwrap_err();
    let got = host_kernels::run_plan_with_states(cxx, &g, &plan, &b, &host_states)?.unwrap_err();
    let (InterpError::CacheWriteOutOfRange { start, .. }, true) = (&got, got == want) else {
        return Err(format!("a write past the cache: host {got}, interpreter {want}").into());
    };
    if *start != last {
        return Err(format!("reported start {start}, want {last}").into());
    }
    Ok(())
}

// ---- append:: (issue 22: the decode attention that appends K/V) -----------------------------

/// A decode step as the LLaMA lowering makes it (q and k roped at `pos`, k and v written at
/// `start` into caches `[1, hkv, max, d]`, attention over kv_len keys), with or without Llama
/// 3's frequency divisors.
#[derive(Clone, Debug)]
struct AppendCase {
    hq: usize,
    hkv: usize,
    d: usize,
    max: usize,
    dtype: DType,
    factors: bool,
    /// kv_len of the first of two consecutive steps.
    kv_len: usize,
}

impl AppendCase {
    fn name(&self) -> String {
        format!(
            "{}_{}x{}_d{}_max{}_kv{}{}",
            self.dtype.name(),
            self.hq,
            self.hkv,
            self.d,
            self.max,
            self.kv_len,
            if self.factors { "_factors" } else { "" }
        )
    }

    fn graph(&self) -> Graph {
        let (dt, d) = (self.dtype, self.d);
        let factors: Vec<f64> = if self.factors {
            (0..d / 2).map(|i| 1.0 + i as f64 / 8.0).collect()
        } else {
            Vec::new()
        };
        let mut g = Graph::new("append_step");
        let kc = g.state("k_cache", dt, &[1, self.hkv, self.max, d]).unwrap();
        let vc = g.state("v_cache", dt, &[1, self.hkv, self.max, d]).unwrap();
        let q = g.input("q", dt, &[1, self.hq, 1, d]).unwrap();
        let k = g.input("k", dt, &[1, self.hkv, 1, d]).unwrap();
        let v = g.input("v", dt, &[1, self.hkv, 1, d]).unwrap();
        let pos = g.input("pos", DType::I32, &[1]).unwrap();
        let start = g.input("start", DType::I32, &[1]).unwrap();
        let kv_len = g.input("kv_len", DType::I32, &[1]).unwrap();
        let qr = g
            .rope_scaled(q, Some(pos), 10_000.0, 0, factors.clone())
            .unwrap();
        let kr = g.rope_scaled(k, Some(pos), 10_000.0, 0, factors).unwrap();
        let kw = g.cache_write(kc, kr, start, 2).unwrap();
        let vw = g.cache_write(vc, v, start, 2).unwrap();
        let att = g
            .flash_attention_len((qr, kw, vw), kv_len, 1.0 / (d as f64).sqrt(), true)
            .unwrap();
        g.add_output(att).unwrap();
        g
    }
}

fn append_cases() -> Vec<AppendCase> {
    let base = AppendCase {
        hq: 9,
        hkv: 3,
        d: 64,
        max: 80,
        dtype: DType::F16,
        factors: false,
        kv_len: 1,
    };
    vec![
        base.clone(),
        AppendCase {
            kv_len: 7,
            dtype: DType::F32,
            factors: true,
            ..base.clone()
        },
        AppendCase {
            hq: 4,
            hkv: 1,
            d: 128,
            kv_len: 65,
            ..base.clone()
        },
        AppendCase {
            hq: 1,
            hkv: 1,
            d: 80,
            kv_len: 30,
            dtype: DType::F32,
            ..base.clone()
        },
        // A cache of 2048: several splits in the grid, kv_len reaching a few of them.
        AppendCase {
            max: 2048,
            kv_len: 511,
            factors: true,
            ..base.clone()
        },
        AppendCase {
            hq: 4,
            hkv: 1,
            max: 2048,
            kv_len: 130,
            dtype: DType::F32,
            ..base
        },
    ]
}

/// The append form on the host: the plan is the decode kernel alone (no rope, no cache write);
/// two consecutive steps from caches whose rows before the first start are random and whose
/// tail is NaN (never read), each against the interpreter on the unfused graph from the states
/// it left (the second step reads the row the first appended), the written rows equal and the
/// tail still NaN; every counter back at 0 after each step; then a start past the cache, which
/// both refuse with the same error.
fn append_host_run(cxx: &Path, c: &AppendCase, arch: &str) -> Result<(), Failed> {
    let name = c.name();
    let g = c.graph();
    let mut fused = g.clone();
    PassManager::default_pipeline()
        .run(&mut fused)
        .map_err(|e| e.to_string())?;
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let plan =
        generate_with(&fused, &target, &CodegenOptions::default()).map_err(|e| e.to_string())?;
    let families: Vec<&str> = plan.kernels.iter().map(|k| k.family).collect();
    if families != ["flash_decode"] {
        return Err(format!("{name}: kernels {families:?}").into());
    }
    let counters: Vec<usize> = plan
        .buffers
        .iter()
        .filter(|b| matches!(b.role, BufferRole::Counters))
        .map(|b| b.id)
        .collect();
    let ty = g.ty(g.find("k_cache").ok_or("no k_cache")?).clone();
    let first = c.kv_len - 1;
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let row = c.d;
    let per_head = c.max * row;
    let cache = |rng: &mut u64| -> Result<Tensor, String> {
        let v: Vec<f64> = (0..ty.shape.numel())
            .map(|e| {
                if (e % per_head) / row < first {
                    *rng ^= *rng << 13;
                    *rng ^= *rng >> 7;
                    *rng ^= *rng << 17;
                    (*rng >> 40) as f64 / (1u64 << 23) as f64 - 1.0
                } else {
                    f64::NAN
                }
            })
            .collect();
        Tensor::from_f64(ty.dtype, ty.shape.clone(), &v).map_err(|e| e.to_string())
    };
    let mut host_states: HashMap<String, Tensor> = HashMap::new();
    host_states.insert("k_cache".into(), cache(&mut rng)?);
    host_states.insert("v_cache".into(), cache(&mut rng)?);
    let mut ref_states = host_states.clone();
    let tol = tolerance(c.dtype);
    let weights = HashMap::new();
    for step in 0..2usize {
        let at = (first + step) as i64;
        let mut b = Bindings::random(&g, 40 + step as u64);
        // Positions not starting at 0 and not the rows they land in.
        b.inputs.insert("pos".into(), i32s(&[at + 300]));
        b.inputs.insert("start".into(), i32s(&[at]));
        b.inputs.insert("kv_len".into(), i32s(&[at + 1]));
        let (want, want_states) =
            interp::run_with_state(&g, &b, &weights, &ref_states).map_err(|e| e.to_string())?;
        let (got, buffers) =
            host_kernels::run_plan_with_states_buffers(cxx, &fused, &plan, &b, &host_states)?;
        let (got, got_states) = got.map_err(|e| e.to_string())?;
        let what = format!("{name} step {step}");
        row_error::within(&what, &got[0], &want[0], tol)?;
        for name in ["k_cache", "v_cache"] {
            let (h, r) = (
                got_states[name].to_f64_vec(),
                want_states[name].to_f64_vec(),
            );
            // The rotated row may differ by the last bit of its dtype (f32 polynomials against
            // the interpreter's f64 sin/cos); the tail stays NaN.
            let bad = h.iter().zip(&r).position(|(a, b)| {
                !((a.is_nan() && b.is_nan()) || (a - b).abs() <= 2.0 * tol * b.abs().max(1.0))
            });
            if let Some(i) = bad {
                return Err(format!("{what}: {name}[{i}] = {}, want {}", h[i], r[i]).into());
            }
        }
        for &cb in &counters {
            if buffers[cb].iter().any(|&x| x != 0) {
                return Err(format!("{what}: counters left non-zero").into());
            }
        }
        host_states = got_states;
        ref_states = want_states;
    }
    let mut b = Bindings::random(&g, 9);
    let last = c.max as i64;
    b.inputs.insert("pos".into(), i32s(&[last]));
    b.inputs.insert("start".into(), i32s(&[last]));
    b.inputs.insert("kv_len".into(), i32s(&[last]));
    // Against the interpreter on the same (fused) graph: the error names the write it runs
    // first, which the plan's check names too.
    let want = interp::run_with_state(&fused, &b, &weights, &ref_states).unwrap_err();
    let got =
        host_kernels::run_plan_with_states(cxx, &fused, &plan, &b, &host_states)?.unwrap_err();
    if got != want {
        return Err(format!("a write past the cache: host {got}, interpreter {want}").into());
    }
    Ok(())
}

/// Rope far into the context (positions up to 2047, angles of thousands of radians) with
/// Qwen's theta 1e6 and Llama 3's 5e5 with factors, from positions and from an offset, and a
/// cache write that rotates (theta 5e5), head dims 64 and 128: the kernels' host-table
/// frequencies and double reduction against the interpreter's f64 sin/cos.
fn rope_far_host(cxx: &Path, arch: &str) -> Result<(), Failed> {
    for d in [64usize, 128] {
        let mut g = Graph::new("rope_far");
        let s = 4usize;
        let x = g
            .input("x", DType::F32, &[1, 3, s, d])
            .map_err(|e| e.to_string())?;
        let pos = g
            .input("pos", DType::I32, &[s])
            .map_err(|e| e.to_string())?;
        let start = g
            .input("start", DType::I32, &[1])
            .map_err(|e| e.to_string())?;
        // Llama 3's factors: 1 for the fast pairs, 8 for the slow, a ramp between.
        let factors: Vec<f64> = (0..d / 2)
            .map(|i| 1.0 + 7.0 * (i as f64 / (d / 2 - 1) as f64).powi(2))
            .collect();
        let qwen = g.rope_at(x, pos, 1e6).map_err(|e| e.to_string())?;
        let llama = g
            .rope_scaled(x, Some(pos), 5e5, 0, factors.clone())
            .map_err(|e| e.to_string())?;
        let offset = g
            .rope_scaled(x, None, 5e5, 2044, factors)
            .map_err(|e| e.to_string())?;
        let cache = g
            .state("k_cache", DType::F32, &[1, 3, 2048, d])
            .map_err(|e| e.to_string())?;
        let written = g
            .cache_write_rope(cache, x, start, pos, 2, 5e5)
            .map_err(|e| e.to_string())?;
        g.set_outputs(&[qwen, llama, offset, written])
            .map_err(|e| e.to_string())?;
        let mut b = Bindings::random(&g, 11);
        b.inputs.insert("pos".into(), i32s(&[2047, 2046, 1031, 5]));
        b.inputs.insert("start".into(), i32s(&[2044]));
        let want = interp::run(&g, &b).map_err(|e| e.to_string())?;
        let target = Target::parse(arch).map_err(|e| e.to_string())?;
        let plan =
            generate_with(&g, &target, &CodegenOptions::default()).map_err(|e| e.to_string())?;
        let got = host_kernels::run_plan(cxx, &g, &plan, &b)?.map_err(|e| e.to_string())?;
        for (i, (h, r)) in got.iter().zip(&want).enumerate() {
            let (h, r) = (h.to_f64_vec(), r.to_f64_vec());
            // The state's unwritten rows are whatever both started with; compare all, the
            // rotated rows are the ones that differ in a wrong kernel.
            let worst = h
                .iter()
                .zip(&r)
                .map(|(a, b)| (a - b).abs())
                .fold(
                    0.0f64,
                    |m, e| if e.is_nan() { f64::INFINITY } else { m.max(e) },
                );
            if worst > 2e-6 {
                return Err(format!("d {d}, output {i}: max abs error {worst:e}").into());
            }
        }
    }
    Ok(())
}

/// Argmax's kernel on rows with ties, NaN, infinities and rows longer than its block.
fn argmax_host(cxx: &Path, arch: &str) -> Result<(), Failed> {
    let mut g = Graph::new("argmax");
    let x = g
        .input("x", DType::F32, &[6, 700])
        .map_err(|e| e.to_string())?;
    let rows = g.argmax(x, -1).map_err(|e| e.to_string())?;
    let cols = g.argmax(x, 0).map_err(|e| e.to_string())?;
    g.set_outputs(&[rows, cols]).map_err(|e| e.to_string())?;
    let mut vals: Vec<f64> = (0..6 * 700).map(|i| ((i * 37) % 101) as f64).collect();
    vals[700 + 650] = f64::NAN; // row 1: a NaN after the maximum
    vals[700 + 690] = f64::NAN;
    vals[2 * 700 + 3] = f64::INFINITY;
    vals[2 * 700 + 600] = f64::INFINITY; // row 2: tie of +inf
    for v in &mut vals[3 * 700..4 * 700] {
        *v = 5.0; // row 3: all equal
    }
    for v in &mut vals[4 * 700..5 * 700] {
        *v = f64::NEG_INFINITY;
    }
    let t = Tensor::from_f64(DType::F32, vec![6, 700], &vals).map_err(|e| e.to_string())?;
    let b = Bindings::default().with_input("x", t);
    let want = interp::run(&g, &b).map_err(|e| e.to_string())?;
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let plan = generate_with(&g, &target, &CodegenOptions::default()).map_err(|e| e.to_string())?;
    let got = host_kernels::run_plan(cxx, &g, &plan, &b)?.map_err(|e| e.to_string())?;
    if got != want {
        return Err(format!("argmax: host {:?}, interpreter {:?}", got[0], want[0]).into());
    }
    if want[0].to_f64_vec()[1] != 650.0 || want[0].to_f64_vec()[3] != 0.0 {
        return Err("the interpreter's reference is not the first NaN / first tie".into());
    }
    Ok(())
}

/// The split argmax (rows longer than one block's chunk: an LM head's logits) on rows with the
/// maximum tied across blocks, NaNs in two blocks, a row of −∞, the length not a multiple of
/// the chunk or the block, f32 and f16, and over an axis with an inner stride; the partials
/// are merged by the last block, checked against the interpreter.
fn argmax_split_host(cxx: &Path, arch: &str) -> Result<(), Failed> {
    const LEN: usize = 49157;
    for dtype in [DType::F32, DType::F16] {
        let mut g = Graph::new("argmax_split");
        let x = g.input("x", dtype, &[4, LEN]).map_err(|e| e.to_string())?;
        let y = g.input("y", dtype, &[LEN, 2]).map_err(|e| e.to_string())?;
        let rows = g.argmax(x, -1).map_err(|e| e.to_string())?;
        let cols = g.argmax(y, 0).map_err(|e| e.to_string())?;
        g.set_outputs(&[rows, cols]).map_err(|e| e.to_string())?;
        let mut vals: Vec<f64> = (0..4 * LEN)
            .map(|i| ((i * 37) % 101) as f64 - 50.0)
            .collect();
        for v in &mut vals[..LEN] {
            *v = -1.0; // row 0: the maximum tied between a late and an early block
        }
        vals[45000] = 3.0;
        vals[5000] = 3.0;
        vals[LEN + 30000] = f64::NAN; // row 1: NaNs in two blocks, the first wins
        vals[LEN + 9000] = f64::NAN;
        for v in &mut vals[2 * LEN..3 * LEN] {
            *v = f64::NEG_INFINITY; // row 2: all −∞ gives 0
        }
        vals[4 * LEN - 1] = 60.0; // row 3: the last element
        let t = Tensor::from_f64(dtype, vec![4, LEN], &vals).map_err(|e| e.to_string())?;
        let yv: Vec<f64> = (0..2 * LEN).map(|i| ((i * 53) % 97) as f64).collect();
        let ty = Tensor::from_f64(dtype, vec![LEN, 2], &yv).map_err(|e| e.to_string())?;
        let b = Bindings::default().with_input("x", t).with_input("y", ty);
        let want = interp::run(&g, &b).map_err(|e| e.to_string())?;
        if want[0].to_f64_vec() != [5000.0, 9000.0, 0.0, (LEN - 1) as f64] {
            return Err(format!("the interpreter's reference: {:?}", want[0]).into());
        }
        let target = Target::parse(arch).map_err(|e| e.to_string())?;
        let plan =
            generate_with(&g, &target, &CodegenOptions::default()).map_err(|e| e.to_string())?;
        let split = plan
            .kernels
            .iter()
            .filter(|k| k.family == "argmax" && k.launch.grid[0] > 1 && k.body.contains("counters"))
            .count();
        if split != 2 {
            return Err(format!("{dtype}: {split} split argmax kernels, want 2").into());
        }
        let got = host_kernels::run_plan(cxx, &g, &plan, &b)?.map_err(|e| e.to_string())?;
        if got != want {
            return Err(format!(
                "{dtype}: host {:?} {:?}, interpreter {:?} {:?}",
                got[0], got[1], want[0], want[1]
            )
            .into());
        }
    }
    Ok(())
}

/// The LM head's GEMV with the argmax fused into its kernel (the last block merges the blocks'
/// partials): the token against the interpreter on the unfused graph, with the maximum tied
/// between a late and an early column, NaN columns (the first wins), an odd vocabulary and K,
/// f32 and f16 (the f16 product cast to f32 logits, the cast the GEMM's epilogue), with and
/// without the logits asked for (then they are still written, and checked too).
fn lm_head_argmax_host(cxx: &Path, arch: &str) -> Result<(), Failed> {
    const V: usize = 1031;
    for (dtype, k, with_logits) in [
        (DType::F32, 67, false),
        (DType::F16, 64, true),
        (DType::F16, 67, false),
    ] {
        let mut g = Graph::new("lm_head_argmax");
        let x = g.input("x", dtype, &[1, k]).map_err(|e| e.to_string())?;
        let w = g.input("w", dtype, &[V, k]).map_err(|e| e.to_string())?;
        let wt = g.permute(w, &[1, 0]).map_err(|e| e.to_string())?;
        let mut logits = g.matmul(x, wt).map_err(|e| e.to_string())?;
        if dtype != DType::F32 {
            logits = g.cast(logits, DType::F32).map_err(|e| e.to_string())?;
        }
        let token = g.argmax(logits, -1).map_err(|e| e.to_string())?;
        let outs = if with_logits {
            vec![token, logits]
        } else {
            vec![token]
        };
        g.set_outputs(&outs).map_err(|e| e.to_string())?;
        let xv: Vec<f64> = (0..k).map(|i| ((i * 7) % 5) as f64 * 0.25 - 0.5).collect();
        let mut cases: Vec<(Vec<f64>, f64)> = Vec::new();
        let base: Vec<f64> = (0..V * k)
            .map(|i| ((i * 37) % 101) as f64 / 64.0 - 0.75)
            .collect();
        // Ties: columns 1000 and 40 hold the same large row; the first index wins.
        let mut tied = base.clone();
        for c in [1000, 40] {
            for (j, v) in tied[c * k..(c + 1) * k].iter_mut().enumerate() {
                *v = if xv[j] > 0.0 { 4.0 } else { -4.0 };
            }
        }
        cases.push((tied, 40.0));
        // NaN logits at columns 900 and 300 (a NaN weight): the first NaN wins.
        let mut nan = base.clone();
        nan[900 * k + 3] = f64::NAN;
        nan[300 * k + 5] = f64::NAN;
        cases.push((nan, 300.0));
        // The last column largest.
        let mut last = base;
        for (j, v) in last[(V - 1) * k..].iter_mut().enumerate() {
            *v = if xv[j] > 0.0 { 8.0 } else { -8.0 };
        }
        cases.push((last, (V - 1) as f64));
        let target = Target::parse(arch).map_err(|e| e.to_string())?;
        let mut fused = g.clone();
        PassManager::default_pipeline()
            .run(&mut fused)
            .map_err(|e| e.to_string())?;
        let plan = generate_with(&fused, &target, &CodegenOptions::default())
            .map_err(|e| e.to_string())?;
        let families: Vec<&str> = plan.kernels.iter().map(|k| k.family).collect();
        if families != ["gemm_small_m"] || !plan.kernels[0].body.contains("counters") {
            return Err(format!(
                "{dtype} k {k}: kernels {families:?}, want one fused gemm_small_m"
            )
            .into());
        }
        for (wv, at) in cases {
            let b = Bindings::default()
                .with_input(
                    "x",
                    Tensor::from_f64(dtype, vec![1, k], &xv).map_err(|e| e.to_string())?,
                )
                .with_input(
                    "w",
                    Tensor::from_f64(dtype, vec![V, k], &wv).map_err(|e| e.to_string())?,
                );
            let want = interp::run(&g, &b).map_err(|e| e.to_string())?;
            if want[0].to_f64_vec() != [at] {
                return Err(
                    format!("the interpreter's reference: {:?}, want {at}", want[0]).into(),
                );
            }
            // Twice: the counter the last block put back serves the next launch.
            for run in 0..2 {
                let got =
                    host_kernels::run_plan(cxx, &fused, &plan, &b)?.map_err(|e| e.to_string())?;
                if got[0] != want[0] {
                    return Err(format!(
                        "{dtype} k {k} run {run}: host {:?}, interpreter {:?}",
                        got[0], want[0]
                    )
                    .into());
                }
                if with_logits && !wv.iter().any(|v| v.is_nan()) {
                    let e = rel_l2(&got[1], &want[1])?;
                    if e.is_nan() || e > tolerance(dtype) {
                        return Err(format!("{dtype}: logits rel L2 {e}").into());
                    }
                }
            }
        }
    }
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let cxx = host_kernels::host_cxx();
    // The compile trials first: the longest, so the shorter ones fill the other threads.
    let mut trials = kernel_compile::compile_trials(compile_set);
    for (i, c) in host_cases().into_iter().enumerate() {
        let arch = ["gfx90a", "gfx1100"][i % 2];
        trials.push(needs(
            &cxx,
            "ROCMFORGE_REQUIRE_HOST_CXX",
            format!("host::{arch}::{}", c.name()),
            move |cxx| host_run(&cxx, &c, arch),
        ));
    }
    for arch in ["sm_90", "gfx90a", "gfx1100"] {
        for c in [
            Case::new(1, 4097, DType::F16),
            Case {
                b: 3,
                mask: Mask::Padding,
                causal: Some(5),
                ..Case::new(2, 513, DType::F32)
            },
        ] {
            trials.push(Trial::test(
                format!("plan::{arch}::{}", c.name()),
                move || plan_shape(&c, arch),
            ));
        }
    }
    for (i, c) in kv_cases::host_cases().into_iter().enumerate() {
        // Prefill kernels on the host: f32's CUDA-core kernel (any target), f16's scalar one
        // on gfx1030, which has no matrix cores (MFMA/WMMA do not run here).
        let arch = match (kv_cases::is_decode(&c), c.dtype) {
            (true, _) => ["gfx90a", "gfx1100"][i % 2],
            (false, DType::F32) => "gfx90a",
            (false, _) => "gfx1030",
        };
        trials.push(needs(
            &cxx,
            "ROCMFORGE_REQUIRE_HOST_CXX",
            format!("state::host::{arch}::{}", c.name()),
            move |cxx| kv_host_run(&cxx, &c, arch),
        ));
    }
    for (i, c) in split_cases().into_iter().enumerate() {
        let arch = ["gfx90a", "gfx1100"][i % 2];
        trials.push(needs(
            &cxx,
            "ROCMFORGE_REQUIRE_HOST_CXX",
            format!("state::splits::{arch}::{}", c.name()),
            move |cxx| split_host_run(&cxx, &c, arch),
        ));
    }
    for arch in ["gfx90a", "gfx1100"] {
        trials.push(needs(
            &cxx,
            "ROCMFORGE_REQUIRE_HOST_CXX",
            format!("state::decode_step::{arch}"),
            move |cxx| decode_step_host(&cxx, arch),
        ));
        trials.push(needs(
            &cxx,
            "ROCMFORGE_REQUIRE_HOST_CXX",
            format!("state::rope_far::{arch}"),
            move |cxx| rope_far_host(&cxx, arch),
        ));
        trials.push(needs(
            &cxx,
            "ROCMFORGE_REQUIRE_HOST_CXX",
            format!("state::argmax::{arch}"),
            move |cxx| argmax_host(&cxx, arch),
        ));
        trials.push(needs(
            &cxx,
            "ROCMFORGE_REQUIRE_HOST_CXX",
            format!("state::argmax_split::{arch}"),
            move |cxx| argmax_split_host(&cxx, arch),
        ));
        trials.push(needs(
            &cxx,
            "ROCMFORGE_REQUIRE_HOST_CXX",
            format!("state::lm_head_argmax::{arch}"),
            move |cxx| lm_head_argmax_host(&cxx, arch),
        ));
    }
    for (i, c) in append_cases().into_iter().enumerate() {
        let arch = ["gfx90a", "gfx1100"][i % 2];
        trials.push(needs(
            &cxx,
            "ROCMFORGE_REQUIRE_HOST_CXX",
            format!("append::{arch}::{}", c.name()),
            move |cxx| append_host_run(&cxx, &c, arch),
        ));
    }
    trials.push(Trial::test(
        "plan::gpu_cases_take_decode",
        gpu_cases_take_decode,
    ));
    trials.push(Trial::test(
        "plan::workspace_slot_reused",
        workspace_slot_reused,
    ));
    libtest_mimic::run(&args, trials).exit();
}
