//! Decode attention (the flash-decoding pair), attention over KV caches bounded by kv_len, cache writes past the cache, argmax.

use crate::attention::first_output_within_tolerance;
use crate::common::*;
use crate::harness::*;
use libtest_mimic::{Failed, Trial};
use rocmforge::compile::CompileError;
use rocmforge::interp::{run, Bindings};
use rocmforge::ir::{format, DType, Graph, Tensor};
use rocmforge::runtime::Device;

/// A decode-shaped FlashAttention node against the f32 interpreter, outputs and the split-K
/// workspace poisoned; rows with no visible key must be zeros. Which cases lower to the decode
/// pair is checked without a GPU (`plan::gpu_cases_take_decode` in tests/decode_kernels.rs).
pub fn check_decode(device: &Device, case: decode_cases::Case, seed: u64) -> Result<(), Failed> {
    let g = case.graph();
    let b = case.bindings(seed);
    let (got, what) = first_output_within_tolerance(
        device,
        &g,
        &b,
        &case.reference(&b),
        &case.name(),
        case.dtype,
    )?;
    if case.mask == decode_cases::Mask::EmptyRow && !decode_cases::batch0_zero(&got, &case) {
        return Err(format!("{what}: rows with no visible key are not zeros").into());
    }
    Ok(())
}

/// Attention over `kv_len` valid keys of a cache whose tail is NaN, against the f32
/// interpreter (which never reads the tail): any read of the tail by a kernel is NaN and fails.
pub fn check_kv(device: &Device, case: kv_cases::KvCase, seed: u64) -> Result<(), Failed> {
    let g = case.graph();
    let b = case.bindings(seed);
    first_output_within_tolerance(
        device,
        &g,
        &b,
        &case.reference(&b),
        &case.name(),
        case.dtype,
    )?;
    Ok(())
}

/// Paged decode attention (`Op::PagedAttention`: keys read through block tables, a prefix block
/// shared by two sequences, every unread pool row NaN) on the device, against FlashAttention over
/// the same pools gathered into contiguous caches, run by the interpreter.
pub fn check_paged(device: &Device, case: paged_cases::PagedCase, seed: u64) -> Result<(), Failed> {
    let data = case.data(seed);
    let g = case.attention_graph(case.dtype);
    let b = case.attention_bindings(&data);
    // The harness compares in f32 (it casts the device's output).
    let want = case.reference(&data, case.dtype).cast(DType::F32);
    first_output_within_tolerance(device, &g, &b, &want, &case.name(), case.dtype)?;
    Ok(())
}

/// The append form of paged decode (`passes::PagedAppend`: q's and k's rope, the step's two
/// paged cache writes and q's view inside the paged decode kernel) on the device against the
/// unfused step run by the interpreter: the output and both pools after the step (zeroed
/// before it, on both sides). Odd seeds scale the rope's frequencies (Llama 3).
pub fn check_paged_append(
    device: &Device,
    case: paged_cases::PagedCase,
    seed: u64,
) -> Result<(), Failed> {
    use rocmforge::interp::run_with_state;
    use std::collections::HashMap;
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let factors: Vec<f64> = if seed % 2 == 1 {
        (0..case.d / 2).map(|i| 1.0 + i as f64 / 4.0).collect()
    } else {
        vec![]
    };
    let g = case.append_graph(case.dtype, factors);
    let data = case.data(seed);
    let rows = case.b * case.s;
    let i32s = |shape: &[usize], v: Vec<i64>| {
        Tensor::from_i64(DType::I32, shape.to_vec(), v).expect("i32 values")
    };
    let lens = data.kv_len.as_i64().ok_or("kv_len: not integers")?;
    let positions = (0..rows)
        .map(|r| lens[r / case.s] - case.s as i64 + (r % case.s) as i64)
        .collect();
    let mut b = Bindings::random(&g, seed);
    b.inputs
        .insert("positions".into(), i32s(&[rows], positions));
    let slots = data.slots.as_i64().ok_or("slots: not integers")?;
    b.inputs
        .insert("slots".into(), i32s(&[1, rows], slots.to_vec()));
    b.inputs.insert("table".into(), data.table.clone());
    b.inputs.insert("kv_len".into(), data.kv_len.clone());
    let zeros: HashMap<String, Tensor> = ["k_pool", "v_pool"]
        .into_iter()
        .map(|n| {
            let ty = g.ty(g.find(n).expect("a pool")).clone();
            let z = vec![0.0; ty.shape.numel()];
            (
                n.to_string(),
                Tensor::from_f64(ty.dtype, ty.shape, &z).expect("zeros"),
            )
        })
        .collect();
    let (want, want_next) =
        run_with_state(&g, &b, &HashMap::new(), &zeros).map_err(|e| e.to_string())?;
    let c = Graph::compile_with(&g, device, &options()).map_err(|e| e.to_string())?;
    let mut s = c.session().map_err(|e| e.to_string())?;
    s.reset_state().map_err(|e| e.to_string())?;
    for (name, t) in &b.inputs {
        s.set_input(name, t).map_err(|e| e.to_string())?;
    }
    s.run().map_err(|e| e.to_string())?;
    let tol = tolerance(case.dtype);
    let what = format!("paged append {}", case.name());
    compare(
        &s.outputs().map_err(|e| e.to_string())?[0].cast(DType::F32),
        &want[0].cast(DType::F32),
        tol,
        &format!("{what}: output"),
    )?;
    for n in ["k_pool", "v_pool"] {
        compare(
            &s.state(n).map_err(|e| e.to_string())?.cast(DType::F32),
            &want_next[n].cast(DType::F32),
            tol,
            &format!("{what}: {n}"),
        )?;
    }
    Ok(())
}

/// The example decode step with its position at the last row of the cache (runs) and one past
/// it: the run fails with the interpreter's `CacheWriteOutOfRange`, not a write past the state.
pub fn check_cache_write_bounds(device: &Device) -> Result<(), Failed> {
    use rocmforge::interp::InterpError;
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("graphs/decode_step.json");
    let g = format::load(&path).map_err(|e| e.to_string())?;
    let c = Graph::compile_with(&g, device, &options()).map_err(|e| e.to_string())?;
    let size = g.ty(g.find("k_cache").ok_or("no k_cache")?).shape.dims()[2] as i64;
    let i32s = |v: i64| Tensor::from_i64(DType::I32, vec![1], vec![v]).expect("an i32");
    for (pos, ok) in [(size - 1, true), (size, false), (-1, false)] {
        let b = Bindings::random(&g, 21)
            .with_input("pos", i32s(pos))
            .with_input("kv_len", i32s(size));
        let want = run(&g, &with_weights(&g, &b));
        match (c.run(&b), want) {
            (Ok(got), Ok(want)) if ok => {
                let err = compare(
                    &got[0],
                    &want[0],
                    tolerance(DType::F32),
                    "decode_step logits",
                )?;
                if err > tolerance(DType::F32) || got[1] != want[1] {
                    return Err(format!(
                        "pos {pos}: logits error {err:e}, tokens {:?} vs {:?}",
                        got[1], want[1]
                    )
                    .into());
                }
            }
            (
                Err(CompileError::Interp(InterpError::CacheWriteOutOfRange { start, .. })),
                Err(_),
            ) if !ok && start == pos => {}
            (got, want) => {
                return Err(format!(
                    "pos {pos}: run {:?}, interpreter {:?}",
                    got.err(),
                    want.err()
                )
                .into())
            }
        }
    }
    Ok(())
}

/// Argmax on the device: rows with ties, NaN, ±inf, longer than a block, exactly the
/// interpreter's indices.
pub fn check_argmax(device: &Device) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let mut g = Graph::new(format!("argmax_{dtype}"));
        let x = g.input("x", dtype, &[7, 1001]).map_err(|e| e.to_string())?;
        let rows = g.argmax(x, -1).map_err(|e| e.to_string())?;
        let cols = g.argmax(x, 0).map_err(|e| e.to_string())?;
        g.set_outputs(&[rows, cols]).map_err(|e| e.to_string())?;
        let mut vals: Vec<f64> = (0..7 * 1001).map(|i| ((i * 37) % 101) as f64).collect();
        vals[1001 + 650] = f64::NAN;
        vals[1001 + 990] = f64::NAN;
        vals[2 * 1001 + 3] = f64::INFINITY;
        vals[2 * 1001 + 999] = f64::INFINITY;
        vals[3 * 1001..4 * 1001].iter_mut().for_each(|v| *v = 5.0);
        vals[4 * 1001..5 * 1001]
            .iter_mut()
            .for_each(|v| *v = f64::NEG_INFINITY);
        let t = Tensor::from_f64(dtype, vec![7, 1001], &vals).map_err(|e| e.to_string())?;
        let b = Bindings::default().with_input("x", t);
        let c = Graph::compile_with(&g, device, &options()).map_err(|e| e.to_string())?;
        let got = c.run(&b).map_err(|e| e.to_string())?;
        let want = run(&g, &b).map_err(|e| e.to_string())?;
        if got != want {
            return Err(format!("{dtype}: device {:?}, interpreter {:?}", got[0], want[0]).into());
        }
    }
    Ok(())
}

/// The LM head's GEMV with its argmax fused (one kernel; the last block merges the partials
/// and resets the counter): SmolLM2's hidden size, an odd vocabulary, the maximum tied between
/// a late and an early column, then NaN columns; three runs each (replayed: the counter must be
/// back at 0), the token exactly the interpreter's on the unfused graph, the logits (asked for
/// in f16) within tolerance.
pub fn check_lm_head_argmax(device: &Device) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    const V: usize = 49157;
    const K: usize = 576;
    for dtype in [DType::F32, DType::F16] {
        let mut g = Graph::new(format!("lm_head_argmax_{dtype}"));
        let x = g.input("x", dtype, &[1, K]).map_err(|e| e.to_string())?;
        let w = g.input("w", dtype, &[V, K]).map_err(|e| e.to_string())?;
        let wt = g.permute(w, &[1, 0]).map_err(|e| e.to_string())?;
        let mut logits = g.matmul(x, wt).map_err(|e| e.to_string())?;
        if dtype != DType::F32 {
            logits = g.cast(logits, DType::F32).map_err(|e| e.to_string())?;
        }
        let token = g.argmax(logits, -1).map_err(|e| e.to_string())?;
        let with_logits = dtype == DType::F16;
        let outs = if with_logits {
            vec![token, logits]
        } else {
            vec![token]
        };
        g.set_outputs(&outs).map_err(|e| e.to_string())?;
        let xv: Vec<f64> = (0..K).map(|i| ((i * 7) % 5) as f64 * 0.25 - 0.5).collect();
        let base: Vec<f64> = (0..V * K)
            .map(|i| ((i * 37) % 101) as f64 / 64.0 - 0.75)
            .collect();
        let mut tied = base.clone();
        for c in [45000, 7000] {
            for (j, v) in tied[c * K..(c + 1) * K].iter_mut().enumerate() {
                *v = if xv[j] > 0.0 { 4.0 } else { -4.0 };
            }
        }
        let mut nan = base;
        nan[40000 * K + 3] = f64::NAN;
        nan[9000 * K + 5] = f64::NAN;
        let c = Graph::compile_with(&g, device, &options()).map_err(|e| e.to_string())?;
        for (wv, at) in [(tied, 7000.0), (nan, 9000.0)] {
            let b = Bindings::default()
                .with_input(
                    "x",
                    Tensor::from_f64(dtype, vec![1, K], &xv).map_err(|e| e.to_string())?,
                )
                .with_input(
                    "w",
                    Tensor::from_f64(dtype, vec![V, K], &wv).map_err(|e| e.to_string())?,
                );
            let want = run(&g, &b).map_err(|e| e.to_string())?;
            if want[0].to_f64_vec() != [at] {
                return Err(
                    format!("{dtype}: the interpreter gives {:?}, want {at}", want[0]).into(),
                );
            }
            for r in 0..3 {
                let got = c.run(&b).map_err(|e| e.to_string())?;
                if got[0] != want[0] {
                    return Err(format!(
                        "{dtype} run {r}: device {:?}, interpreter {:?}",
                        got[0], want[0]
                    )
                    .into());
                }
                if with_logits && !wv.iter().any(|v| v.is_nan()) {
                    let e = crate::common::accuracy::rel_l2(&got[1], &want[1])?;
                    if e.is_nan() || e > dtype.tolerance() {
                        return Err(format!("{dtype}: logits rel L2 {e}").into());
                    }
                }
            }
        }
    }
    Ok(())
}

/// Decode attention, KV caches, cache write bounds and argmax.
pub fn trials(device: &Device, ignored: &Option<String>, trials: &mut Vec<Trial>) {
    for (i, case) in decode_cases::gpu_cases().into_iter().enumerate() {
        let d = device.clone();
        push(
            trials,
            ignored,
            format!("decode::{}", case.name()),
            Box::new(move || check_decode(&d, case, 300 + i as u64)),
        );
    }
    for (i, case) in kv_cases::gpu_cases().into_iter().enumerate() {
        let d = device.clone();
        push(
            trials,
            ignored,
            format!("decops::kv::{}", case.name()),
            Box::new(move || check_kv(&d, case, 500 + i as u64)),
        );
    }
    for (i, case) in paged_cases::cases().into_iter().enumerate() {
        let d = device.clone();
        push(
            trials,
            ignored,
            format!("decops::paged::{}", case.name()),
            Box::new(move || check_paged(&d, case, 700 + i as u64)),
        );
    }
    for (i, case) in paged_cases::cases().into_iter().enumerate() {
        let d = device.clone();
        push(
            trials,
            ignored,
            format!("decops::paged_append::{}", case.name()),
            Box::new(move || check_paged_append(&d, case, 750 + i as u64)),
        );
    }
    let d = device.clone();
    push(
        trials,
        ignored,
        "decops::cache_write_bounds".into(),
        Box::new(move || check_cache_write_bounds(&d)),
    );
    let d = device.clone();
    push(
        trials,
        ignored,
        "decops::argmax".into(),
        Box::new(move || check_argmax(&d)),
    );
    let d = device.clone();
    push(
        trials,
        ignored,
        "decops::lm_head_argmax".into(),
        Box::new(move || check_lm_head_argmax(&d)),
    );
}
