//! Autotuning at compile time (`CompileOptions::tune`, `--tune`): for every kernel whose family
//! offers more than one configuration for its problem, each candidate is compiled and timed on
//! the device's clock (a few warm-up launches, then timed launches queued behind a hold, on
//! poisoned scratch buffers of the kernel's sizes), and the fastest is kept. Results persist per
//! device in the tune cache ([`TuneCache`](crate::runtime::TuneCache)) beside the kernels, so a
//! later compile reads its choices instead of timing. Problems shared by several kernels (the
//! layers of a model) are timed once.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rayon::prelude::*;

use super::{load, progress, CompileError};
use crate::arch::{Choice, Target, TuneKey, TuneSite, Tuned};
use crate::codegen::{self, BufferRole, CodegenOptions, Kernel, KernelPlan, STATUS_BYTES};
use crate::ir::Graph;
use crate::runtime::device::LoadedKernel;
use crate::runtime::{Device, DeviceBuffer, RuntimeError, TuneCacheKey, TuneDevice, TuneRecord};

/// Launches before timing: the first pays for module loading and cold caches.
const WARMUP: usize = 3;
/// Launches timed together (one interval over all of them, so the markers' resolution of about
/// a microsecond is spread over many launches).
const TIMED: usize = 20;
/// How long the stream waits for the host to queue the timed launches.
const HOLD: Duration = Duration::from_secs(10);

/// What tuning did in one compile.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TuneStats {
    /// Distinct (family, problem) pairs with more than one candidate.
    pub problems: usize,
    /// Of those, read from the tune cache (no timing).
    pub from_cache: usize,
    /// Of those, timed now.
    pub timed: usize,
    /// Candidate kernels launched for timing, over every problem timed now.
    pub candidates_timed: usize,
    pub time: Duration,
}

/// The codegen options a compile generates its plan with: the choices of every tunable problem
/// (from the tune cache, else timed now) when `tune`, else the families' defaults.
pub(super) fn codegen_options(
    graph: &Graph,
    device: &Device,
    target: &Target,
    tune: bool,
    f32_matmul: crate::codegen::F32Matmul,
    compile_opts: &[String],
    show_progress: bool,
) -> Result<(CodegenOptions, TuneStats), CompileError> {
    // The precision decides which kernels (and so which tunable problems) the plan has: a TF32
    // GEMM is a matrix-core problem, its exact twin a CUDA-core one.
    let base = CodegenOptions {
        f32_matmul,
        ..CodegenOptions::default()
    };
    if !tune {
        return Ok((base, TuneStats::default()));
    }
    let _span = tracing::debug_span!("tune").entered();
    let start = Instant::now();
    let plan = codegen::generate_with(graph, target, &base)?;
    let sites = distinct_sites(&plan);
    let tune_device = TuneDevice {
        arch: target.arch.clone(),
        wave_size: target.wave_size,
        toolchain: device.toolchain(),
    };
    let cache = device.cache().tuning();
    let mut stats = TuneStats {
        problems: sites.len(),
        ..TuneStats::default()
    };
    let mut tuned = Tuned::new();
    let mut pending = Vec::new();
    for site in sites.into_values() {
        let key = TuneCacheKey {
            device: tune_device.clone(),
            key: site.key.clone(),
            checksum: site.checksum,
        };
        match cache.read(&key) {
            Ok(Some(record)) => {
                tracing::debug!(
                    family = %site.key.family,
                    problem = %site.key.problem,
                    choice = %record.choice,
                    "tuning: from the cache"
                );
                stats.from_cache += 1;
                tuned.insert(site.key.clone(), record.choice());
            }
            Ok(None) => pending.push((site, key)),
            Err(e) => {
                tracing::warn!("{e}");
                pending.push((site, key));
            }
        }
    }
    if !pending.is_empty() {
        let times = time_candidates(
            graph,
            device,
            target,
            &pending,
            f32_matmul,
            compile_opts,
            show_progress,
        )?;
        for ((site, key), times) in pending.iter().zip(times) {
            stats.timed += 1;
            stats.candidates_timed += times.iter().flatten().count();
            let Some(index) = fastest(&times) else {
                tracing::warn!(
                    family = %site.key.family,
                    problem = %site.key.problem,
                    "tuning: no candidate ran; the default is kept"
                );
                continue;
            };
            let record = TuneRecord {
                family: site.key.family,
                problem: site.key.problem.clone(),
                checksum: site.checksum,
                index,
                choice: site.candidates[index].clone(),
                times_us: times
                    .iter()
                    .map(|t| t.map(|d| d.as_secs_f64() * 1e6))
                    .collect(),
            };
            tracing::debug!(
                family = %site.key.family,
                problem = %site.key.problem,
                choice = %record.choice,
                default = %site.candidates[site.default],
                times_us = ?record.times_us,
                "tuning: timed"
            );
            // A cache that cannot be written only costs timing again next time.
            if let Err(e) = cache.write(key, &record) {
                tracing::warn!("tuning result not stored: {e}");
            }
            tuned.insert(site.key.clone(), record.choice());
        }
    }
    stats.time = start.elapsed();
    tracing::debug!(
        problems = stats.problems,
        from_cache = stats.from_cache,
        timed = stats.timed,
        time_ms = stats.time.as_secs_f64() * 1e3,
        "tuning done"
    );
    Ok((
        CodegenOptions {
            tuned,
            f32_matmul,
            ..CodegenOptions::default()
        },
        stats,
    ))
}

/// The first kernel of each tunable problem, in plan order (kernels of the same problem have
/// the same candidates).
fn distinct_sites(plan: &KernelPlan) -> BTreeMap<TuneKey, TuneSite> {
    let mut sites = BTreeMap::new();
    for site in plan.kernels.iter().filter_map(|k| k.tune.as_ref()) {
        sites
            .entry(site.key.clone())
            .or_insert_with(|| site.clone());
    }
    sites
}

/// The index of the fastest candidate that ran (the first among equals).
fn fastest(times: &[Option<Duration>]) -> Option<usize> {
    times
        .iter()
        .enumerate()
        .filter_map(|(i, t)| t.map(|t| (t, i)))
        .min()
        .map(|(_, i)| i)
}

/// One candidate of one pending problem, as generated.
struct Trial {
    problem: usize,
    candidate: usize,
    kernel: Kernel,
    source: String,
    arg_bytes: Vec<usize>,
}

/// Device time per launch of every candidate of every pending problem (`None` where one did
/// not compile or launch). The plan is generated once per candidate index with every pending
/// problem set to that index, so each generation yields one candidate of every problem.
fn time_candidates(
    graph: &Graph,
    device: &Device,
    target: &Target,
    pending: &[(TuneSite, TuneCacheKey)],
    f32_matmul: crate::codegen::F32Matmul,
    compile_opts: &[String],
    show_progress: bool,
) -> Result<Vec<Vec<Option<Duration>>>, CompileError> {
    let most = pending
        .iter()
        .map(|(s, _)| s.candidates.len())
        .max()
        .unwrap_or(0);
    let mut trials = Vec::new();
    for candidate in 0..most {
        let mut table = Tuned::new();
        for (s, _) in pending {
            if candidate < s.candidates.len() {
                table.insert(
                    s.key.clone(),
                    Choice {
                        index: candidate,
                        checksum: s.checksum,
                    },
                );
            }
        }
        let options = CodegenOptions {
            tuned: table,
            f32_matmul,
            ..CodegenOptions::default()
        };
        let plan = codegen::generate_with(graph, target, &options)?;
        for (problem, (s, _)) in pending.iter().enumerate() {
            let found = plan.kernels.iter().find(|k| {
                k.tune
                    .as_ref()
                    .is_some_and(|t| t.key == s.key && t.chosen == candidate)
            });
            if let Some(k) = found {
                trials.push(Trial {
                    problem,
                    candidate,
                    kernel: k.clone(),
                    source: plan.source(k),
                    arg_bytes: k.args.iter().map(|&a| arg_bytes(&plan, a)).collect(),
                });
            }
        }
    }
    // By problem, so that each problem's scratch buffers are allocated once.
    trials.sort_by_key(|t| (t.problem, t.candidate));
    let bar = progress::bar(trials.len(), "tuning: compiling candidates", show_progress);
    let loaded: Vec<Result<std::sync::Arc<LoadedKernel>, RuntimeError>> = trials
        .par_iter()
        .map(|t| {
            let r = load::load_kernel(device, target, compile_opts, &t.kernel.entry, &t.source);
            bar.inc(1);
            r
        })
        .collect();
    bar.finish_and_clear();
    let stream = device.new_stream()?;
    let mut times: Vec<Vec<Option<Duration>>> = pending
        .iter()
        .map(|(s, _)| vec![None; s.candidates.len()])
        .collect();
    // Scratch buffers per problem: every candidate of a problem binds the same buffers.
    let mut scratch: Option<(usize, Vec<DeviceBuffer>)> = None;
    let bar = progress::bar(trials.len(), "tuning: timing candidates", show_progress);
    for (t, loaded) in trials.iter().zip(loaded) {
        bar.inc(1);
        let kernel = match loaded {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!(entry = %t.kernel.entry, "tuning: a candidate did not compile: {e}");
                continue;
            }
        };
        if scratch.as_ref().is_none_or(|(p, _)| *p != t.problem) {
            // The last problem's buffers go before this one's are allocated.
            drop(scratch.take());
            let bufs = t
                .arg_bytes
                .iter()
                .map(|&b| stream.alloc(b, true))
                .collect::<Result<Vec<_>, _>>();
            match bufs {
                Ok(bufs) => scratch = Some((t.problem, bufs)),
                // Over a memory budget, say: this problem keeps its default.
                Err(e) => {
                    tracing::warn!(entry = %t.kernel.entry, "tuning: no scratch buffers: {e}");
                    continue;
                }
            }
        }
        let bufs = &scratch.as_ref().expect("allocated above").1;
        match time_one(&stream, &kernel, &t.kernel, bufs) {
            Ok(d) => times[t.problem][t.candidate] = Some(d),
            Err(e) => {
                tracing::warn!(entry = %t.kernel.entry, "tuning: a candidate did not run: {e}");
                // The stream may hold the failed work: start the next one on a fresh one.
                stream.synchronize().ok();
            }
        }
    }
    bar.finish_and_clear();
    Ok(times)
}

/// Bytes of a plan buffer as a kernel binds it (at least one element's worth, so that an
/// empty buffer is still a valid pointer).
fn arg_bytes(plan: &KernelPlan, id: usize) -> usize {
    let b = &plan.buffers[id];
    let bytes = match b.role {
        BufferRole::Status => STATUS_BYTES,
        BufferRole::Input(_)
        | BufferRole::Weight(_)
        | BufferRole::Constant(_)
        | BufferRole::Computed
        | BufferRole::Workspace
        | BufferRole::Counters
        | BufferRole::State { .. }
        // Never bound by a trial: kernels that read through a tensor map have no tuning site.
        | BufferRole::TensorMap { .. }
        // Timed on a buffer of its own: where it points makes no difference to the kernel.
        | BufferRole::Alias { .. } => b.ty.shape.numel().saturating_mul(b.ty.dtype.size_bytes()),
        // The blocks as stored.
        BufferRole::QuantWeight(scheme) => scheme.layout(&b.ty.shape).map_or(0, |(_, all)| all),
    };
    bytes.max(16)
}

/// Device time per launch of `kernel`: warm-up launches, then [`TIMED`] launches between two
/// markers, queued behind a hold so that the host's launch latency is not in the interval.
fn time_one(
    stream: &crate::runtime::Stream,
    loaded: &LoadedKernel,
    k: &Kernel,
    bufs: &[DeviceBuffer],
) -> Result<Duration, RuntimeError> {
    let args: Vec<&DeviceBuffer> = bufs.iter().collect();
    let launch = || {
        stream.launch(
            loaded,
            k.launch.grid,
            k.launch.block,
            k.launch.shared_bytes,
            &args,
        )
    };
    for _ in 0..WARMUP {
        launch()?;
    }
    stream.synchronize()?;
    let mut hold = stream.hold(HOLD)?;
    let start = stream.mark()?;
    for _ in 0..TIMED {
        launch()?;
    }
    let end = stream.mark()?;
    hold.release();
    stream.synchronize()?;
    if hold.expired() {
        // The host was slower than the hold's limit: the interval includes its latency. Still
        // a time, only a pessimistic one; said so.
        tracing::warn!(entry = %k.entry, "tuning: the hold expired while queueing launches");
    }
    Ok(end.since(&start)? / TIMED as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fastest_candidate_that_ran_wins_and_the_first_among_equals() {
        let us = |x: u64| Some(Duration::from_micros(x));
        assert_eq!(fastest(&[us(5), us(3), None, us(4)]), Some(1));
        assert_eq!(fastest(&[None, us(3), us(3)]), Some(1));
        assert_eq!(fastest(&[None, None]), None);
    }
}
