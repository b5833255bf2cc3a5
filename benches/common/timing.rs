//! Timing shared by the benches: launches enqueued on one stream, then that stream synchronised;
//! the clock is read only around a synchronisation. Each bench uses a part of it.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use rocmforge::codegen::{F32Matmul, QuantSplit, TmaWidth, WgmmaAttention};
use rocmforge::compile::{CompileOptions, Compiled, Poison, SessionOptions};
use rocmforge::interp::Bindings;
use rocmforge::runtime::Device;

/// The device the benches run on (the best one found), printed; without a GPU, a note that the
/// interpreter is benchmarked on small shapes. No device at all (an error) ends the bench.
pub fn bench_device() -> Device {
    let (device, notes) = Device::best().unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(2)
    });
    if !device.is_gpu() {
        eprintln!(
            "no GPU ({}): benchmarking the interpreter on small shapes",
            notes.join("; ")
        );
    }
    println!("device: {}", device.label());
    device
}

/// Compile options for timing: no poisoning of fresh buffers, no progress output.
///
/// `ROCMFORGE_BENCH_WGMMA` chooses the sm_90a GEMM (as `CompileOptions` does by default when
/// unset or `auto`: the TMA kernel at the width its model picks): `64`, `128` or `256` (that
/// width), `cp_async` (the warpgroup kernel without TMA), `off` (the mma.sync kernel).
/// Anything else ends the bench with a message. `ROCMFORGE_BENCH_WGMMA_ATTENTION` chooses the
/// sm_90a attention: `auto` (or unset, the default as `CompileOptions`'s), `serial` or
/// `overlapped` (the warpgroup kernel and its schedules), `off` (the mma.sync kernel).
/// `ROCMFORGE_BENCH_TF32=1` compiles f32 matmuls (the f32 GEMM and attention rows) at TF32
/// precision on the device's TF32 atom (`CompileOptions::f32_matmul`); `0` or unset: exact f32.
pub fn bench_options() -> CompileOptions {
    let f32_matmul = match std::env::var("ROCMFORGE_BENCH_TF32").as_deref() {
        Err(_) | Ok("0") => F32Matmul::Exact,
        Ok("1") => F32Matmul::Tf32,
        Ok(x) => {
            eprintln!("error: ROCMFORGE_BENCH_TF32={x}: expected 1 or 0");
            std::process::exit(2)
        }
    };
    if f32_matmul == F32Matmul::Tf32 {
        println!("f32 matmuls: TF32 (opt-in; ~1e-3 relative error, f32 rows are not exact f32)");
    }
    let wgmma_attention = match std::env::var("ROCMFORGE_BENCH_WGMMA_ATTENTION").as_deref() {
        Err(_) | Ok("auto") => WgmmaAttention::Auto,
        Ok("serial") => WgmmaAttention::Serial,
        Ok("overlapped") => WgmmaAttention::Overlapped,
        Ok("off") => WgmmaAttention::Off,
        Ok(x) => {
            eprintln!(
                "error: ROCMFORGE_BENCH_WGMMA_ATTENTION={x}: expected auto, serial, overlapped or off"
            );
            std::process::exit(2)
        }
    };
    if wgmma_attention != WgmmaAttention::Auto {
        println!("sm_90a attention: {wgmma_attention:?}");
    }
    let (wgmma_gemm, wgmma_tma) = match std::env::var("ROCMFORGE_BENCH_WGMMA").as_deref() {
        Err(_) | Ok("auto") => (true, TmaWidth::Auto),
        Ok("off") => (false, TmaWidth::Auto),
        Ok("cp_async") => (true, TmaWidth::Off),
        Ok(w) => match w.parse::<usize>() {
            Ok(w) => (true, TmaWidth::Fixed(w)),
            Err(_) => {
                eprintln!(
                    "error: ROCMFORGE_BENCH_WGMMA={w}: expected auto, cp_async, 64, 128 or 256"
                );
                std::process::exit(2)
            }
        },
    };
    if std::env::var_os("ROCMFORGE_BENCH_WGMMA").is_some() {
        println!("sm_90a GEMM: warpgroup {wgmma_gemm}, TMA width {wgmma_tma:?}");
    }
    // Where the int8 GEMV quantizes its activations (codegen::QuantSplit): `on` a kernel of
    // their own, `off` every block of the GEMV, `auto` (unset) by the size of W.
    let quant_split = match std::env::var("ROCMFORGE_BENCH_QUANT_SPLIT").as_deref() {
        Err(_) | Ok("auto") => QuantSplit::Auto,
        Ok("on") => QuantSplit::On,
        Ok("off") => QuantSplit::Off,
        Ok(x) => {
            eprintln!("error: ROCMFORGE_BENCH_QUANT_SPLIT={x}: expected auto, on or off");
            std::process::exit(2)
        }
    };
    if quant_split != QuantSplit::Auto {
        println!("int8 GEMV activations: {quant_split:?}");
    }
    // GEMVs of 17-64 rows on tensor cores (codegen::CodegenOptions::mma_gemv, on by default)
    // or, with `off`, on CUDA cores.
    let mma_gemv = match std::env::var("ROCMFORGE_BENCH_MMA_GEMV").as_deref() {
        Ok("off") => false,
        Err(_) | Ok("on") => true,
        Ok(x) => {
            eprintln!("error: ROCMFORGE_BENCH_MMA_GEMV={x}: expected on or off");
            std::process::exit(2)
        }
    };
    if !mma_gemv {
        println!("GEMVs of 17-64 rows: CUDA cores");
    }
    CompileOptions {
        poison: Poison::Off,
        progress: false,
        wgmma_gemm,
        wgmma_tma,
        wgmma_attention,
        f32_matmul,
        quant_split,
        mma_gemv,
        ..CompileOptions::default()
    }
}

/// How a warm session is driven in a timed loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Drive {
    /// Replay the captured graph (else each kernel is launched from the host).
    pub replay: bool,
    /// Every step also writes every input and reads every output back to the host, as a
    /// caller serving requests does; without it only the launches are timed (the inputs stay
    /// on the device, as in torch's CUDA-graph replay).
    pub io: bool,
}

/// Time of `iters` steps of a warm session of `compiled` on `inputs`, after one warm-up step.
pub fn time_session(compiled: &Compiled, inputs: &Bindings, iters: u64, drive: Drive) -> Duration {
    let mut s = compiled
        .session_with(&SessionOptions {
            replay: drive.replay,
        })
        .expect("session");
    let set = |s: &mut rocmforge::compile::Session<'_>| {
        for (name, t) in &inputs.inputs {
            s.set_input(name, t).expect("set_input");
        }
    };
    set(&mut s);
    s.run().expect("warm-up run");
    s.outputs().expect("warm-up outputs");
    let t = Instant::now();
    for _ in 0..iters {
        if drive.io {
            set(&mut s);
        }
        s.run().expect("run");
        if drive.io {
            s.outputs().expect("outputs");
        }
    }
    s.synchronize().expect("sync");
    t.elapsed()
}

/// Time of `iters` runs of `compiled` on `inputs`, after one warm-up run.
pub fn time_runs(compiled: &Compiled, inputs: &Bindings, iters: u64) -> Duration {
    let mut p = compiled.prepare(inputs).expect("prepare");
    p.launch().expect("warm-up launch");
    p.synchronize().expect("sync");
    let t = Instant::now();
    for _ in 0..iters {
        p.launch().expect("launch");
    }
    p.synchronize().expect("sync");
    t.elapsed()
}

/// Seconds per run: the median of `repeats` timings, each of enough back-to-back runs to last
/// about `target` (at least one), so that a microsecond kernel is not one launch's latency.
pub fn seconds_per_run(c: &Compiled, inputs: &Bindings, target: Duration, repeats: usize) -> f64 {
    let once = time_runs(c, inputs, 1).as_secs_f64().max(1e-7);
    let iters = (target.as_secs_f64() / once).ceil().clamp(1.0, 2000.0) as u64;
    let mut times: Vec<f64> = (0..repeats)
        .map(|_| time_runs(c, inputs, iters).as_secs_f64() / iters as f64)
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// The plan's kernels by family, in launch order (`copy+matmul`), or `interpreter`.
pub fn kernel_families(c: &Compiled) -> String {
    match c.plan() {
        Some(plan) => plan
            .kernels
            .iter()
            .map(|k| k.family)
            .collect::<Vec<_>>()
            .join("+"),
        None => "interpreter".into(),
    }
}
