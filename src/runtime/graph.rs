//! Launches bound once, and graph replay. A [`LaunchList`] is a run's kernel launches with
//! their buffers resolved to device addresses and their geometry checked, holding (`Arc`) every
//! kernel and buffer it names, so the addresses stay valid as long as the list lives. A
//! [`CapturedGraph`] is such a list captured once on a stream (CUDA graphs through the driver
//! API, hipGraph through the HIP runtime) and replayed with one call; it holds its list, so the
//! buffers the graph touches outlive it (CubeCL's CUDA graph keeps its buffers the same way).
//! Nothing is allocated, uploaded or freed inside a capture: the list is bound before it.

use std::sync::Arc;

use super::buffer::DeviceBuffer;
use super::dispatch::{Erased, ErasedGraph, LoadedKernel};

/// One kernel launch of a run: the kernel, its geometry and its buffers (one pointer parameter
/// each, in order).
pub struct KernelLaunch {
    pub kernel: Arc<LoadedKernel>,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
    pub args: Vec<Arc<DeviceBuffer>>,
    /// Bytes into each of `args` where the kernel's pointer starts (a slice read in place
    /// binds its base buffer at an offset); empty: every one at its start.
    pub offsets: Vec<usize>,
    /// Launched as a programmatic dependent of the kernel before it (see
    /// [`super::LaunchAttrs::programmatic`]): only for kernels that wait on the grid dependency
    /// before touching global memory.
    pub programmatic: bool,
}

/// Kernel launches bound to their buffers on one device (made by [`super::Stream::bind`]):
/// launching them again costs no lookups, no checks and no allocation, and is what a capture
/// records.
pub struct LaunchList {
    /// One bound launch each, in the backend's raw handles.
    pub(super) bound: Vec<Erased>,
    /// The device the list was bound on (its spec), checked at every launch.
    pub(super) device: String,
    /// Keep alive what the raw handles in `bound` point at.
    pub(super) _kernels: Vec<Arc<LoadedKernel>>,
    pub(super) _buffers: Vec<Arc<DeviceBuffer>>,
}

impl LaunchList {
    pub fn len(&self) -> usize {
        self.bound.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bound.is_empty()
    }
}

/// Why a session launches its kernels one by one instead of replaying a captured graph.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplayOff {
    /// `SessionOptions::replay` was false.
    #[error("replay is turned off in the session's options")]
    Disabled,
    /// `ROCMFORGE_REPLAY=0` in the environment.
    #[error("replay is turned off by ROCMFORGE_REPLAY=0")]
    Env,
    /// The CPU runs the interpreter: there are no kernels to capture.
    #[error("the CPU runs the interpreter, which has no kernels to capture")]
    Cpu,
    /// The driver or runtime lacks the graph entry points (an old HIP, say).
    #[error("the runtime cannot capture graphs: {reason}")]
    Unsupported { reason: String },
}

/// A launch list captured once and replayed with one call per run. `Send`, not `Sync`: graph
/// objects are not internally synchronised, so one thread at a time replays it.
pub struct CapturedGraph {
    // Field order is drop order: the executable graph is destroyed before the list releases
    // the buffers it addresses (which are then freed ordered on their stream, after any replay
    // still queued there).
    pub(super) inner: ErasedGraph,
    pub(super) list: Arc<LaunchList>,
    /// The stream it was captured on (the only one it replays on).
    pub(super) stream: usize,
}

impl CapturedGraph {
    /// The launches this graph replays.
    pub fn list(&self) -> &Arc<LaunchList> {
        &self.list
    }
}
