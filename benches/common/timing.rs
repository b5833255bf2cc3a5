//! Timing shared by the benches: launches enqueued on one stream, then that stream synchronised;
//! the clock is read only around a synchronisation.

use std::time::{Duration, Instant};

use rocmforge::compile::Compiled;
use rocmforge::interp::Bindings;

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
