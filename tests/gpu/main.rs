//! GPU tests: every example graph, the op zoo and random attention shapes against the
//! interpreter within the dtype tolerances; concurrency stress; a planted bug caught by
//! poisoning; memory back to its baseline; the disk cache across processes. They run under the
//! default parallel harness. Where no GPU is found, each is reported ignored, with the reason;
//! with `ROCMFORGE_REQUIRE_GPU=1` (set by `.gpu/run` on the GPU machine) each fails instead.
//!
//! One file per subject; the trial names (`graph::`, `gemm::`, `attention::`, …) are the ones
//! this suite has always had, whichever file registers them:
//! - `graphs.rs`: the example graphs, the op zoo, hostile node names.
//! - `edges.rs` (issue 11): every op with a zero-size dimension, attention with no queries, no
//!   keys or a head size of 0, reductions over an empty axis, causal offsets near the i64
//!   limits, gathers out of range (the CPU's typed error), edge values through every
//!   elementwise row, launches past the device's limits.
//! - `gemm.rs` (issue 12): layouts, the matrix cores, the small-M and CUDA-core kernels at odd
//!   and model sizes, quantized weights.
//! - `attention.rs`, `attention_mma.rs`: fused attention at random shapes, the tensor-core
//!   kernels, f32 attention, attention written step by step.
//! - `decode.rs` (issues 13, 15): the flash-decoding pair at decode shapes (`decode::`);
//!   attention bounded by `kv_len` over caches whose tail is NaN, cache writes past the cache,
//!   argmax with ties and NaN (`decops::`).
//! - `sessions.rs` (issue 14): warm sessions, replay on and off, sessions on threads, no
//!   allocation in a warm run, inputs changed in place, captured graphs keeping buffers.
//! - `hip.rs`, `hipshim.rs` (issue 14, `hip::`): on an NVIDIA GPU, `tests/hipshim/hipshim.c` is
//!   built with the system C compiler and `hip:0` opened through it (HIP's NVIDIA platform over
//!   the CUDA driver and NVRTC); a selection of the trials above runs on that device. This
//!   checks our HIP plumbing (loading, entry points, marshalling, streams, memory, events), not
//!   AMD hardware or ISA.
//! - `models.rs`, `llama.rs`: all-MiniLM-L6-v2 and SmolLM2 against PyTorch, the tiny llama;
//!   the batched generator over the paged KV cache against lone runs (`serve::`).
//! - `bundle.rs`, `tune.rs`, `device.rs`: replay bundles, tuning, and the device itself
//!   (stress, poisoning, memory, the disk cache, matrix atoms, profiling).

/// Helpers shared with the other test binaries, from `tests/common/`.
#[path = "../common"]
mod common {
    pub mod accuracy;
    pub mod attention_graphs;
    pub mod batched_cases;
    pub mod decode_cases;
    pub mod decode_step;
    pub mod edge_cases;
    pub mod files;
    pub mod gemm_cases;
    pub mod gemm_graphs;
    pub mod gemm_small_cases;
    pub mod glu_cases;
    pub mod int8_gemv;
    pub mod kv_cases;
    pub mod linear_graphs;
    pub mod model_refs;
    pub mod nan_max;
    pub mod norm_cases;
    pub mod op_zoo;
    pub mod paged_cases;
    pub mod quant_cases;
    pub mod row_error;
    pub mod smollm2;
    pub mod tiny_gguf;
    pub mod window_cases;
}

mod attention;
mod attention_mma;
mod bundle;
mod decode;
mod device;
mod edges;
mod families;
mod gemm;
mod graphs;
mod harness;
mod hip;
mod hipshim;
mod llama;
mod models;
mod poison;
mod sessions;
mod tune;
mod window;

use libtest_mimic::{Arguments, Trial};
use rocmforge::runtime::Device;

fn main() {
    if std::env::var("ROCMFORGE_GPU_CHILD_DEVICE").is_ok() {
        device::child_compile();
        return;
    }
    let args = Arguments::from_args();
    // A ROCMFORGE_DEVICE that cannot be opened fails the run rather than skipping every trial.
    let (device, notes) = Device::best().unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(1)
    });
    let ignored = if device.is_gpu() {
        None
    } else {
        Some(format!("no GPU: {}", notes.join("; ")))
    };
    let mut trials: Vec<Trial> = Vec::new();
    graphs::examples_and_zoo(&device, &ignored, &mut trials);
    gemm::layouts_and_mma(&device, &ignored, &mut trials);
    gemm::wgmma(&device, &ignored, &mut trials);
    graphs::hostile_names(&device, &ignored, &mut trials);
    edges::zero_size(&device, &ignored, &mut trials);
    tune::trials(&device, &ignored, &mut trials);
    models::llama(&device, &ignored, &mut trials);
    families::trials(&device, &ignored, &mut trials);
    gemm::quant(&device, &ignored, &mut trials);
    edges::trials(&device, &ignored, &mut trials);
    attention::trials(&device, &ignored, &mut trials);
    poison::trials(&device, &ignored, &mut trials);
    models::minilm(&device, &ignored, &mut trials);
    device::mma_atoms(&device, &ignored, &mut trials);
    gemm::linear(&device, &ignored, &mut trials);
    sessions::trials(&device, &ignored, &mut trials);
    bundle::trials(&device, &ignored, &mut trials);
    device::trials(&device, &ignored, &mut trials);
    gemm::small_and_cuda_core(&device, &ignored, &mut trials);
    gemm::row_groups_fused(&device, &ignored, &mut trials);
    gemm::mma_gemv(&device, &ignored, &mut trials);
    decode::trials(&device, &ignored, &mut trials);
    window::trials(&device, &ignored, &mut trials);
    let (shim, hip) = hipshim::device(&device);
    hip::hip_trials(&mut trials, &device, &shim, &hip);
    trials.push(hip::shim_binds_trial());
    let conclusion = libtest_mimic::run(&args, trials);
    hipshim::remove(shim);
    conclusion.exit();
}
