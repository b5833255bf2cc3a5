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
}
