//! The backend trait: what a GPU runtime (CUDA through cudarc, HIP through the loaded HIP
//! library) must do for rocmforge, with its own types for streams, buffers, loaded functions,
//! captured graphs and events (CubeCL's `Runtime`/`ComputeServer` split is the model). Each
//! backend implements it once, in `runtime/cuda/` and `runtime/hip/`; the erased layer in
//! `runtime/dispatch.rs` is the one place a `Device` chooses between them, so a new launch
//! attribute or operation is a trait method and two implementations, not an arm per method.

use std::sync::atomic::{AtomicU32, Ordering};

use super::error::RuntimeError;
use super::hold::HoldWait;
use crate::arch::tma::{TensorMapSpec, MAP_BYTES};
use crate::arch::LaunchLimits;

/// Which vendor runtime a device goes through (the CPU runs the interpreter and has none).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// The reference interpreter.
    Cpu,
    /// NVIDIA through cudarc (driver API and NVRTC).
    Cuda,
    /// The HIP runtime: AMD, or HIP's NVIDIA platform.
    Hip,
}

/// Everything a launch carries besides its kernel, geometry and arguments: the one place a new
/// launch attribute goes, applied by [`Backend::prepare`] and passed to every launch.
///
/// Slots kept for what comes next, each to be a field here and a step in `prepare`/`launch`:
/// TMA tensor maps (made at bind time from the plan's descriptors, passed as by-value kernel
/// parameters), cooperative launch (`cuLaunchCooperativeKernel`/`hipModuleLaunchCooperativeKernel`,
/// with the grid checked against the occupancy-derived maximum), and collectives (a
/// communicator handle the launch is ordered with on its stream).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LaunchAttrs {
    /// Dynamic shared memory (LDS) per block, in bytes. Past the device's default per-block
    /// limit, the kernel is opted in (`MAX_DYNAMIC_SHARED_SIZE_BYTES`) once, up to the device's
    /// opt-in limit; further is a typed error.
    pub dynamic_shared_bytes: u32,
    /// Programmatic dependent launch (NVIDIA sm_90+: `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_
    /// SERIALIZATION`): the kernel may be scheduled before the previous kernel on its stream has
    /// finished, so its launch and block start-up overlap that kernel's tail. Only for kernels
    /// that execute `griddepcontrol.wait` (the preludes' `RF_GRID_WAIT()`) before their first
    /// access to global memory: the wait returns once the previous kernel has completed and its
    /// writes are visible, so the result is the same as a plain launch. Where the device or the
    /// driver cannot, the launch is a plain one (the wait is then a no-op).
    pub programmatic: bool,
}

impl LaunchAttrs {
    pub fn dynamic_shared(bytes: u32) -> LaunchAttrs {
        LaunchAttrs {
            dynamic_shared_bytes: bytes,
            programmatic: false,
        }
    }

    /// These attributes with programmatic dependent launch on or off.
    pub fn with_programmatic(self, programmatic: bool) -> LaunchAttrs {
        LaunchAttrs {
            programmatic,
            ..self
        }
    }
}

/// A launch's geometry and attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LaunchConfig {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub attrs: LaunchAttrs,
}

/// The shared-memory limits of a device: the default per block, and the most a kernel may opt
/// into (equal where the device has no opt-in).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedLimits {
    pub default_bytes: u32,
    pub opt_in_bytes: u32,
}

/// A loaded function and the dynamic shared memory it has been opted into, so the attribute is
/// set once per function (again only for a larger size), never per launch.
pub struct Function<F> {
    pub(super) f: F,
    opted_in: AtomicU32,
}

impl<F> Function<F> {
    pub(super) fn new(f: F) -> Function<F> {
        Function {
            f,
            opted_in: AtomicU32::new(0),
        }
    }

    /// Opts this function into `bytes` of dynamic shared memory through `set` where `bytes` is
    /// past the default limit and past what it was opted into before; past the opt-in limit is
    /// refused.
    fn opt_in(
        &self,
        bytes: u32,
        limits: SharedLimits,
        set: impl FnOnce(&F, u32) -> Result<(), RuntimeError>,
    ) -> Result<(), RuntimeError> {
        if bytes <= limits.default_bytes || bytes <= self.opted_in.load(Ordering::Acquire) {
            return Ok(());
        }
        if bytes > limits.opt_in_bytes {
            return Err(RuntimeError::LaunchLimit {
                what: "dynamic shared memory bytes (opt-in)",
                requested: u64::from(bytes),
                limit: u64::from(limits.opt_in_bytes),
            });
        }
        set(&self.f, bytes)?;
        self.opted_in.fetch_max(bytes, Ordering::AcqRel);
        Ok(())
    }
}

/// One GPU runtime. `Self` is an opened device; every operation names the stream it is
/// ordered on. Methods return typed errors, never panic on what a caller passes.
pub trait Backend: Send + Sync + Sized + 'static {
    /// One execution's queue of work.
    type Stream: Send + Sync + 'static;
    /// Device memory, freed (stream-ordered where the runtime can) on drop.
    type Buffer: Send + Sync + 'static;
    /// A kernel of a loaded module; its module lives as long as it does.
    type Function: Send + Sync + 'static;
    /// A captured and instantiated graph. `Send`, not `Sync`: replayed by one thread at a time.
    type Graph: Send + 'static;
    /// A timing event recorded on a stream.
    type Event: Send + Sync + 'static;
    /// The raw handle of a function, kept by launch lists (which keep the function alive).
    type RawFunction: Copy + Send + Sync + 'static;
    /// The raw device address of a buffer, kept by launch lists (which keep the buffer alive).
    type RawAddress: Copy + Send + Sync + 'static;

    const KIND: DeviceKind;

    /// Compiler and driver versions, part of every cache key.
    fn toolchain(&self) -> String;
    /// The file the runtime library was loaded from, where the backend loads one itself.
    fn runtime_library(&self) -> Option<&str>;
    fn launch_limits(&self) -> LaunchLimits;
    fn shared_limits(&self) -> SharedLimits;

    fn compile(
        &self,
        source: &str,
        entry: &str,
        options: &[String],
    ) -> Result<Vec<u8>, RuntimeError>;
    fn load(&self, image: &[u8], entry: &str) -> Result<Self::Function, RuntimeError>;
    /// Sets `f`'s maximum dynamic shared memory to `bytes` (the caller checked the opt-in limit).
    fn set_dynamic_shared(&self, f: &Self::Function, bytes: u32) -> Result<(), RuntimeError>;

    fn new_stream(&self) -> Result<Self::Stream, RuntimeError>;
    /// `bytes` of device memory (at least one) ordered on `stream`, filled with 0xFF (NaN in
    /// every float dtype) when `poison`, else zeros.
    fn alloc(
        &self,
        stream: &Self::Stream,
        bytes: usize,
        poison: bool,
    ) -> Result<Self::Buffer, RuntimeError>;
    /// A device copy of `data`; the host bytes may go when this returns.
    fn upload(&self, stream: &Self::Stream, data: &[u8]) -> Result<Self::Buffer, RuntimeError>;
    /// The first `bytes` of `buf`, complete when this returns.
    fn download(
        &self,
        stream: &Self::Stream,
        buf: &Self::Buffer,
        bytes: usize,
    ) -> Result<Vec<u8>, RuntimeError>;
    /// Writes `data` at `buf`'s start (size checked by the caller); `data` may go on return.
    fn write(
        &self,
        stream: &Self::Stream,
        buf: &Self::Buffer,
        data: &[u8],
    ) -> Result<(), RuntimeError>;
    /// Sets the first `bytes` of `buf` (checked by the caller) to `byte`.
    fn fill(
        &self,
        stream: &Self::Stream,
        buf: &Self::Buffer,
        byte: u8,
        bytes: usize,
    ) -> Result<(), RuntimeError>;
    /// Copies the first `bytes` of `src` into `dst` (sizes checked by the caller).
    fn copy(
        &self,
        stream: &Self::Stream,
        src: &Self::Buffer,
        dst: &Self::Buffer,
        bytes: usize,
    ) -> Result<(), RuntimeError>;

    /// Launches `f` with one device pointer per buffer, in order (geometry checked and
    /// attributes applied by the caller, [`check_launch`] and [`Backend::prepare`]).
    fn launch(
        &self,
        stream: &Self::Stream,
        f: &Self::Function,
        config: &LaunchConfig,
        args: &[&Self::Buffer],
    ) -> Result<(), RuntimeError>;
    fn raw_function(f: &Self::Function) -> Self::RawFunction;
    /// The device address `offset` bytes into `buf` (the caller checked `offset` against its
    /// size): a slice read in place binds its base buffer at an offset.
    fn raw_address(
        &self,
        stream: &Self::Stream,
        buf: &Self::Buffer,
        offset: usize,
    ) -> Self::RawAddress;
    /// The value of a raw address, as a table of pointers in device memory holds it.
    fn address_value(a: Self::RawAddress) -> u64;
    /// Blocks of `f` with `threads` threads and `shared` bytes of dynamic shared memory that
    /// can be resident on the whole device at once; `None` where the runtime cannot say.
    fn resident_blocks(&self, f: &Self::Function, threads: u32, shared: u32) -> Option<u32>;
    /// The encoded TMA tensor map of the memory `offset` bytes into `buf` (the caller checked
    /// that the map stays within the buffer). Backends without TMA refuse.
    fn encode_tensor_map(
        &self,
        stream: &Self::Stream,
        buf: &Self::Buffer,
        offset: usize,
        spec: &TensorMapSpec,
    ) -> Result<[u8; MAP_BYTES], RuntimeError>;
    /// Launches a bound launch: raw handles the caller keeps alive.
    fn launch_raw(
        &self,
        stream: &Self::Stream,
        f: Self::RawFunction,
        config: &LaunchConfig,
        args: &[Self::RawAddress],
    ) -> Result<(), RuntimeError>;

    /// Whether this runtime can capture and replay graphs, else why not.
    fn graph_support(&self) -> Result<(), String>;
    /// Captures what `enqueue` puts on `stream` (thread-local mode) and instantiates it.
    fn capture(
        &self,
        stream: &Self::Stream,
        enqueue: &mut dyn FnMut() -> Result<(), RuntimeError>,
    ) -> Result<Self::Graph, RuntimeError>;
    fn replay(&self, stream: &Self::Stream, graph: &Self::Graph) -> Result<(), RuntimeError>;

    fn sync(&self, stream: &Self::Stream) -> Result<(), RuntimeError>;
    /// An event with timing, recorded on `stream`.
    fn mark(&self, stream: &Self::Stream) -> Result<Self::Event, RuntimeError>;
    fn reached(&self, event: &Self::Event) -> Result<bool, RuntimeError>;
    /// Milliseconds from `start` to `end`, once the stream has reached both.
    fn elapsed_ms(&self, start: &Self::Event, end: &Self::Event) -> Result<f32, RuntimeError>;
    /// Holds `stream` here until `wait` ends (a host callback that blocks on it).
    fn hold(&self, stream: &Self::Stream, wait: HoldWait) -> Result<(), RuntimeError>;

    /// Applies `attrs` to `f` before a launch or a bind: a dynamic shared size past the default
    /// limit opts the function in, once per size it grows to, and past the opt-in limit is
    /// refused. Nothing is called for a launch within the default limit.
    fn prepare(
        &self,
        f: &Function<Self::Function>,
        attrs: &LaunchAttrs,
    ) -> Result<(), RuntimeError> {
        f.opt_in(
            attrs.dynamic_shared_bytes,
            self.shared_limits(),
            |f, bytes| self.set_dynamic_shared(f, bytes),
        )
    }
}

/// Refuses a launch the device cannot run as asked: an empty or oversized grid or block, too
/// many threads, more dynamic shared memory than the device allows even with an opt-in.
pub(super) fn check_launch(
    limits: &LaunchLimits,
    shared: SharedLimits,
    config: &LaunchConfig,
) -> Result<(), RuntimeError> {
    const GRID: [&str; 3] = ["grid.x", "grid.y", "grid.z"];
    const BLOCK: [&str; 3] = ["block.x", "block.y", "block.z"];
    let (grid, block) = (config.grid, config.block);
    let over = |what, requested: u64, limit: u64| {
        (requested > limit || requested == 0).then_some(RuntimeError::LaunchLimit {
            what,
            requested,
            limit,
        })
    };
    let threads = block.iter().map(|&b| u64::from(b)).product::<u64>();
    let checks = (0..3)
        .map(|a| over(GRID[a], u64::from(grid[a]), u64::from(limits.grid[a])))
        .chain((0..3).map(|a| over(BLOCK[a], u64::from(block[a]), u64::from(limits.block[a]))))
        .chain([
            over(
                "threads per block",
                threads,
                u64::from(limits.block_threads),
            ),
            // Zero shared memory is a launch like any other.
            over(
                "shared memory bytes",
                u64::from(config.attrs.dynamic_shared_bytes).max(1),
                u64::from(limits.shared_bytes.max(shared.opt_in_bytes)),
            ),
        ]);
    match checks.flatten().next() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(grid: [u32; 3], block: [u32; 3], shared: u32) -> LaunchConfig {
        LaunchConfig {
            grid,
            block,
            attrs: LaunchAttrs::dynamic_shared(shared),
        }
    }

    #[test]
    fn a_function_is_opted_in_once_per_size_it_grows_to() {
        let limits = SharedLimits {
            default_bytes: 48 << 10,
            opt_in_bytes: 227 << 10,
        };
        let f = Function::new(());
        let calls = std::cell::RefCell::new(Vec::new());
        let set = |_: &(), b: u32| {
            calls.borrow_mut().push(b);
            Ok(())
        };
        for bytes in [
            0,
            48 << 10,
            100 << 10,
            64 << 10,
            100 << 10,
            227 << 10,
            1 << 10,
        ] {
            f.opt_in(bytes, limits, set).unwrap();
        }
        assert_eq!(*calls.borrow(), vec![100 << 10, 227 << 10]);
        match f.opt_in(228 << 10, limits, set) {
            Err(RuntimeError::LaunchLimit {
                requested, limit, ..
            }) => assert_eq!((requested, limit), (228 << 10, 227 << 10)),
            other => panic!("{other:?}"),
        }
        assert_eq!(calls.borrow().len(), 2, "a refused size is never set");
        // A failed attribute call leaves the function as it was, so the next launch tries again.
        let g = Function::new(());
        let failing = |_: &(), _: u32| Err(RuntimeError::Cuda("refused".into()));
        assert!(g.opt_in(64 << 10, limits, failing).is_err());
        assert_eq!(g.opted_in.load(Ordering::Acquire), 0);
    }

    #[test]
    fn launches_past_the_device_limits_are_refused() {
        let lim = LaunchLimits::PORTABLE;
        let shared = SharedLimits {
            default_bytes: lim.shared_bytes,
            opt_in_bytes: lim.shared_bytes,
        };
        let ok = config([i32::MAX as u32, 65535, 65535], [1024, 1, 1], 0);
        assert!(check_launch(&lim, shared, &ok).is_ok());
        for (grid, block, bytes, what) in [
            ([1u32 << 31, 1, 1], [256u32, 1, 1], 0u32, "grid.x"),
            ([1, 65536, 1], [256, 1, 1], 0, "grid.y"),
            ([1, 1, 0], [256, 1, 1], 0, "grid.z"),
            ([1, 1, 1], [2048, 1, 1], 0, "block.x"),
            ([1, 1, 1], [64, 32, 1], 0, "threads per block"),
            ([1, 1, 1], [256, 1, 1], 1 << 20, "shared memory bytes"),
        ] {
            match check_launch(&lim, shared, &config(grid, block, bytes)) {
                Err(RuntimeError::LaunchLimit { what: w, .. }) => assert_eq!(w, what),
                other => panic!("{grid:?} {block:?} {bytes}: {other:?}"),
            }
        }
        // Past the default limit but within the opt-in one is a launch the device can run.
        let opt_in = SharedLimits {
            default_bytes: 48 << 10,
            opt_in_bytes: 227 << 10,
        };
        let big = config([1, 1, 1], [256, 1, 1], 200 << 10);
        assert!(check_launch(&lim, opt_in, &big).is_ok());
        assert!(check_launch(&lim, shared, &big).is_err());
    }
}
