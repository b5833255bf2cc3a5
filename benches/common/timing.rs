//! Timing shared by the benches: launches enqueued on one stream, then that stream synchronised;
//! the clock is read only around a synchronisation.

use std::time::{Duration, Instant};

use rocmforge::compile::{CompileOptions, Compiled};
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
pub fn bench_options() -> CompileOptions {
    CompileOptions {
        poison: false,
        progress: false,
        ..CompileOptions::default()
    }
}

/// Time of `iters` runs of `compiled` on `inputs`, after one warm-up run.
pub fn time_runs(compiled: &Compiled, inputs: &Bindings, iters: u64) -> Duration {
    let p = compiled.prepare(inputs).expect("prepare");
    p.launch().expect("warm-up launch");
    p.synchronize().expect("sync");
    let t = Instant::now();
    for _ in 0..iters {
        p.launch().expect("launch");
    }
    p.synchronize().expect("sync");
    t.elapsed()
}
