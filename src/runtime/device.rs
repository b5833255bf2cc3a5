//! Devices, buffers and streams. A `Device` is a cheap handle (`Send + Sync`) to one GPU or the
//! CPU, with its own kernel cache and memory counter. Buffers own their memory and are never
//! `Clone`; each execution makes its own `Stream` and synchronises only that stream.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream};

use super::cache::KernelCache;
use super::cuda::CudaDevice;
use super::graph::{Bound, CapturedGraph, GraphInner, KernelLaunch, LaunchList, ReplayOff};
use super::hip::{HipBuffer, HipDevice, HipFunction, HipLibraries, HipStream};
use super::timeline::{Hold, Marker, MarkerInner};
use super::{MemoryCounter, RuntimeError};
use crate::arch::{LaunchLimits, Target};

pub enum DeviceKind {
    /// The reference interpreter.
    Cpu,
    Cuda(CudaDevice),
    Hip(HipDevice),
}

struct Inner {
    kind: DeviceKind,
    spec: String,
    label: String,
    target: Option<Target>,
    cache: KernelCache,
    memory: MemoryCounter,
}

#[derive(Clone)]
pub struct Device(Arc<Inner>);

/// A device name, parsed: `cpu`, `cuda`, `cuda:N`, `hip`, `hip:N` (N a decimal device number
/// that fits the drivers' `int`; no sign, spaces or other text).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceSpec {
    Cpu,
    Cuda(usize),
    Hip(usize),
}

impl DeviceSpec {
    pub fn parse(spec: &str) -> Result<DeviceSpec, RuntimeError> {
        let bad = |reason: String| RuntimeError::DeviceSpec {
            spec: spec.to_string(),
            reason,
        };
        let (kind, index) = match spec.split_once(':') {
            Some((k, i)) => (k, Some(i)),
            None => (spec, None),
        };
        let ordinal = match index {
            None => 0,
            Some(i) if !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()) => i
                .parse::<i32>()
                .ok()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| bad(format!("device number {i} is past {}", i32::MAX)))?,
            Some(i) => return Err(bad(format!("`{i}` is not a device number"))),
        };
        match kind {
            "cpu" if index.is_none() => Ok(DeviceSpec::Cpu),
            "cpu" => Err(bad("the CPU has no device number".into())),
            "cuda" => Ok(DeviceSpec::Cuda(ordinal)),
            "hip" => Ok(DeviceSpec::Hip(ordinal)),
            other => Err(bad(format!("unknown kind of device `{other}`"))),
        }
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({})", self.0.label)
    }
}

impl Device {
    fn new(
        kind: DeviceKind,
        spec: String,
        label: String,
        target: Option<Target>,
        cache: KernelCache,
    ) -> Device {
        Device(Arc::new(Inner {
            kind,
            spec,
            label,
            target,
            cache,
            memory: MemoryCounter::default(),
        }))
    }

    pub fn cpu() -> Device {
        let threads = rayon::current_num_threads();
        Device::new(
            DeviceKind::Cpu,
            "cpu".into(),
            format!("cpu (reference interpreter, {threads} threads)"),
            None,
            KernelCache::with_disk(None),
        )
    }

    /// A device by name: `cpu`, `cuda:N`, `hip:N` (see [`DeviceSpec::parse`]).
    pub fn open(spec: &str) -> Result<Device, RuntimeError> {
        Device::open_with_cache(spec, KernelCache::from_env())
    }

    /// As [`Device::open`], with a kernel cache of the caller's (e.g. without a disk store).
    pub fn open_with_cache(spec: &str, cache: KernelCache) -> Result<Device, RuntimeError> {
        let parsed = DeviceSpec::parse(spec)?;
        let bad = |reason: String| RuntimeError::NoDevice {
            spec: spec.to_string(),
            reason,
        };
        match parsed {
            DeviceSpec::Cpu => Ok(Device::cpu()),
            DeviceSpec::Cuda(ordinal) => {
                let d = CudaDevice::open(ordinal)?;
                let target = Target::parse(&d.arch).map_err(|e| bad(e.to_string()))?;
                let label = format!(
                    "cuda:{ordinal} {} ({}, driver {}, NVRTC {}.{})",
                    d.name, d.arch, d.driver_version, d.nvrtc_version.0, d.nvrtc_version.1
                );
                Ok(Device::new(
                    DeviceKind::Cuda(d),
                    format!("cuda:{ordinal}"),
                    label,
                    Some(target),
                    cache,
                ))
            }
            DeviceSpec::Hip(ordinal) => Device::open_hip(ordinal, &HipLibraries::default(), cache),
        }
    }

    /// HIP device `ordinal` through the HIP runtime and hiprtc files `libraries` names (where
    /// it names none, as [`Device::open`] finds them). Its codegen target is the architecture
    /// the runtime reports: a `gfx` target on AMD, an `sm_` one on HIP's NVIDIA platform.
    pub fn open_hip(
        ordinal: usize,
        libraries: &HipLibraries,
        cache: KernelCache,
    ) -> Result<Device, RuntimeError> {
        let spec = format!("hip:{ordinal}");
        let d = HipDevice::open_with(ordinal, libraries)?;
        let target = Target::parse(&d.arch).map_err(|e| RuntimeError::NoDevice {
            spec: spec.clone(),
            reason: e.to_string(),
        })?;
        let label = format!(
            "{spec} {} ({}, HIP runtime {}, driver {}, {})",
            d.name,
            d.arch,
            d.runtime_version,
            d.driver_version,
            d.library()
        );
        Ok(Device::new(
            DeviceKind::Hip(d),
            spec,
            label,
            Some(target),
            cache,
        ))
    }

    /// The device to use: the one `ROCMFORGE_DEVICE` names if it is set (a malformed or absent
    /// device is an error, not a quiet fallback: the user asked for that one), else the best
    /// one here: HIP, then NVIDIA, then the CPU. Returns the device and, for every device
    /// passed over, why.
    pub fn best() -> Result<(Device, Vec<String>), RuntimeError> {
        if let Some(spec) = std::env::var_os("ROCMFORGE_DEVICE").filter(|s| !s.is_empty()) {
            let spec = spec.to_str().ok_or_else(|| RuntimeError::DeviceSpec {
                spec: spec.to_string_lossy().into_owned(),
                reason: "not UTF-8".into(),
            })?;
            return Device::open(spec)
                .map(|d| (d, vec![]))
                .map_err(|e| e.in_env("ROCMFORGE_DEVICE"));
        }
        let mut notes = Vec::new();
        for spec in ["hip:0", "cuda:0"] {
            match Device::open(spec) {
                Ok(d) => return Ok((d, notes)),
                Err(e) => notes.push(e.to_string()),
            }
        }
        Ok((Device::cpu(), notes))
    }

    pub fn kind(&self) -> &DeviceKind {
        &self.0.kind
    }

    pub fn is_gpu(&self) -> bool {
        !matches!(self.0.kind, DeviceKind::Cpu)
    }

    /// `cpu`, `cuda:0`, …
    pub fn spec(&self) -> &str {
        &self.0.spec
    }

    pub fn label(&self) -> &str {
        &self.0.label
    }

    /// The codegen target of a GPU.
    pub fn target(&self) -> Option<&Target> {
        self.0.target.as_ref()
    }

    pub fn cache(&self) -> &KernelCache {
        &self.0.cache
    }

    pub fn memory(&self) -> &MemoryCounter {
        &self.0.memory
    }

    /// Compiler and driver versions, part of every cache key.
    pub fn toolchain(&self) -> String {
        match &self.0.kind {
            DeviceKind::Cpu => "cpu".into(),
            // Kernels are CUBIN (entries from before were PTX, under another key).
            DeviceKind::Cuda(d) => format!(
                "nvrtc {}.{} cubin driver {}",
                d.nvrtc_version.0, d.nvrtc_version.1, d.driver_version
            ),
            DeviceKind::Hip(d) => format!(
                "hiprtc {}.{} ({}) HIP runtime {} driver {}",
                d.hiprtc().version.0,
                d.hiprtc().version.1,
                d.hiprtc().library,
                d.runtime_version,
                d.driver_version
            ),
        }
    }

    /// Compiles kernel source for this device (CUBIN on NVIDIA, a code object on AMD).
    pub fn compile_source(
        &self,
        source: &str,
        entry: &str,
        options: &[String],
    ) -> Result<Vec<u8>, RuntimeError> {
        match &self.0.kind {
            DeviceKind::Cpu => Err(RuntimeError::NoDevice {
                spec: "cpu".into(),
                reason: "the CPU runs the interpreter, not kernels".into(),
            }),
            DeviceKind::Cuda(d) => d.compile(source, entry, options),
            DeviceKind::Hip(d) => d.compile(source, entry, options),
        }
    }

    pub fn load_kernel(&self, image: &[u8], entry: &str) -> Result<LoadedKernel, RuntimeError> {
        match &self.0.kind {
            DeviceKind::Cpu => Err(RuntimeError::NoDevice {
                spec: "cpu".into(),
                reason: "no kernels on the CPU".into(),
            }),
            DeviceKind::Cuda(d) => Ok(LoadedKernel::Cuda(d.load(image, entry)?)),
            DeviceKind::Hip(d) => Ok(LoadedKernel::Hip(d.load(image, entry)?)),
        }
    }

    pub fn new_stream(&self) -> Result<Stream, RuntimeError> {
        match &self.0.kind {
            DeviceKind::Cpu => Err(RuntimeError::NoDevice {
                spec: "cpu".into(),
                reason: "no streams on the CPU".into(),
            }),
            DeviceKind::Cuda(d) => Ok(Stream {
                device: self.clone(),
                inner: StreamInner::Cuda(d.new_stream()?),
            }),
            DeviceKind::Hip(d) => Ok(Stream {
                device: self.clone(),
                inner: StreamInner::Hip(d.new_stream()?),
            }),
        }
    }
}

/// A kernel loaded on a device. Shared read-only by every execution.
pub enum LoadedKernel {
    Cuda(CudaFunction),
    Hip(HipFunction),
}

enum StreamInner {
    Cuda(Arc<CudaStream>),
    Hip(Arc<HipStream>),
}

/// The device and stream of one backend, checked to belong together.
enum Backend<'a> {
    Cuda(&'a CudaDevice, &'a Arc<CudaStream>),
    Hip(&'a HipDevice, &'a Arc<HipStream>),
}

/// One execution's queue of work; synchronising it waits for that work only.
pub struct Stream {
    device: Device,
    inner: StreamInner,
}

impl Stream {
    /// Identifies the driver stream (while this value lives).
    fn id(&self) -> usize {
        match &self.inner {
            StreamInner::Cuda(s) => Arc::as_ptr(s) as *const () as usize,
            StreamInner::Hip(s) => Arc::as_ptr(s) as *const () as usize,
        }
    }

    fn backend(&self) -> Backend<'_> {
        match (&self.device.0.kind, &self.inner) {
            (DeviceKind::Cuda(d), StreamInner::Cuda(s)) => Backend::Cuda(d, s),
            (DeviceKind::Hip(d), StreamInner::Hip(s)) => Backend::Hip(d, s),
            (DeviceKind::Cpu, _) => unreachable!("CPU devices make no streams"),
            _ => unreachable!("a stream is made by its own device"),
        }
    }

    fn owned(
        &self,
        bytes: usize,
        mem: Result<BufferMem, RuntimeError>,
    ) -> Result<DeviceBuffer, RuntimeError> {
        match mem {
            Ok(mem) => Ok(DeviceBuffer {
                device: self.device.clone(),
                bytes,
                mem,
            }),
            Err(e) => {
                self.device.memory().release(bytes);
                Err(e)
            }
        }
    }

    /// A fresh buffer of `bytes`, poisoned with a NaN pattern when `poison`.
    pub fn alloc(&self, bytes: usize, poison: bool) -> Result<DeviceBuffer, RuntimeError> {
        self.device.memory().reserve(bytes)?;
        let mem = match self.backend() {
            Backend::Cuda(d, s) => d.alloc(s, bytes, poison).map(BufferMem::Cuda),
            Backend::Hip(d, s) => d.alloc(s, bytes, poison).map(BufferMem::Hip),
        };
        self.owned(bytes, mem)
    }

    pub fn upload(&self, data: &[u8]) -> Result<DeviceBuffer, RuntimeError> {
        self.device.memory().reserve(data.len())?;
        let mem = match self.backend() {
            Backend::Cuda(d, s) => d.upload(s, data).map(BufferMem::Cuda),
            Backend::Hip(d, s) => d.upload(s, data).map(BufferMem::Hip),
        };
        self.owned(data.len(), mem)
    }

    /// Copies a buffer to the host; the copy is complete when this returns.
    pub fn download(&self, buf: &DeviceBuffer) -> Result<Vec<u8>, RuntimeError> {
        match (self.backend(), &buf.mem) {
            (Backend::Cuda(d, s), BufferMem::Cuda(m)) => d.download(s, m, buf.bytes),
            (Backend::Hip(d, s), BufferMem::Hip(m)) => d.download(s, m, buf.bytes),
            _ => Err(foreign()),
        }
    }

    pub fn launch(
        &self,
        kernel: &LoadedKernel,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        args: &[&DeviceBuffer],
    ) -> Result<(), RuntimeError> {
        let limits = match self.backend() {
            Backend::Cuda(d, _) => d.launch_limits(),
            Backend::Hip(d, _) => d.launch_limits(),
        };
        check_launch(&limits, grid, block, shared)?;
        match (self.backend(), kernel) {
            (Backend::Cuda(d, s), LoadedKernel::Cuda(f)) => {
                let slices = args
                    .iter()
                    .map(|b| match &b.mem {
                        BufferMem::Cuda(m) => Ok(m),
                        _ => Err(foreign()),
                    })
                    .collect::<Result<Vec<&CudaSlice<u8>>, _>>()?;
                d.launch(s, f, grid, block, shared, &slices)
            }
            (Backend::Hip(d, s), LoadedKernel::Hip(f)) => {
                let bufs = args
                    .iter()
                    .map(|b| match &b.mem {
                        BufferMem::Hip(m) => Ok(m),
                        _ => Err(foreign()),
                    })
                    .collect::<Result<Vec<&HipBuffer>, _>>()?;
                d.launch(s, f, grid, block, shared, &bufs)
            }
            _ => Err(foreign()),
        }
    }

    /// Writes `data` into `buf` in place (from its start), ordered on this stream. `data` may
    /// be dropped when this returns.
    pub fn write(&self, buf: &DeviceBuffer, data: &[u8]) -> Result<(), RuntimeError> {
        fits("write", data.len(), buf)?;
        match (self.backend(), &buf.mem) {
            (Backend::Cuda(d, s), BufferMem::Cuda(m)) => d.write(s, m, data),
            (Backend::Hip(d, s), BufferMem::Hip(m)) => d.write(s, m, data),
            _ => Err(foreign()),
        }
    }

    /// Sets every byte of `buf` to `byte`, ordered on this stream.
    pub fn fill(&self, buf: &DeviceBuffer, byte: u8) -> Result<(), RuntimeError> {
        match (self.backend(), &buf.mem) {
            (Backend::Cuda(d, s), BufferMem::Cuda(m)) => d.fill(s, m, byte, buf.bytes),
            (Backend::Hip(d, s), BufferMem::Hip(m)) => d.fill(s, m, byte, buf.bytes),
            _ => Err(foreign()),
        }
    }

    /// Copies the first `bytes` of `src` into the start of `dst` on the device, ordered on
    /// this stream (a `dst` used on another stream must wait for this one).
    pub fn copy(
        &self,
        src: &DeviceBuffer,
        dst: &DeviceBuffer,
        bytes: usize,
    ) -> Result<(), RuntimeError> {
        fits("copy", bytes, src)?;
        fits("copy", bytes, dst)?;
        match (self.backend(), &src.mem, &dst.mem) {
            (Backend::Cuda(d, s), BufferMem::Cuda(a), BufferMem::Cuda(b)) => d.copy(s, a, b, bytes),
            (Backend::Hip(d, s), BufferMem::Hip(a), BufferMem::Hip(b)) => d.copy(s, a, b, bytes),
            _ => Err(foreign()),
        }
    }

    /// Binds `launches` once: geometry checked against the device's limits, kernels and
    /// buffers resolved to raw handles and held by the list.
    pub fn bind(&self, launches: &[KernelLaunch]) -> Result<LaunchList, RuntimeError> {
        let limits = match self.backend() {
            Backend::Cuda(d, _) => d.launch_limits(),
            Backend::Hip(d, _) => d.launch_limits(),
        };
        let mut bound = Vec::with_capacity(launches.len());
        let (mut kernels, mut buffers) = (Vec::new(), Vec::new());
        for l in launches {
            check_launch(&limits, l.grid, l.block, l.shared_bytes)?;
            let (grid, block, shared) = (l.grid, l.block, l.shared_bytes);
            bound.push(match (self.backend(), &*l.kernel) {
                (Backend::Cuda(d, s), LoadedKernel::Cuda(f)) => Bound::Cuda {
                    f: f.cu_function(),
                    grid,
                    block,
                    shared,
                    args: l
                        .args
                        .iter()
                        .map(|b| match &b.mem {
                            BufferMem::Cuda(m) => Ok(d.address(s, m)),
                            BufferMem::Hip(_) => Err(foreign()),
                        })
                        .collect::<Result<_, _>>()?,
                },
                (Backend::Hip(_, _), LoadedKernel::Hip(f)) => Bound::Hip {
                    f: f.raw(),
                    grid,
                    block,
                    shared,
                    args: l
                        .args
                        .iter()
                        .map(|b| match &b.mem {
                            BufferMem::Hip(m) => Ok(m.raw()),
                            BufferMem::Cuda(_) => Err(foreign()),
                        })
                        .collect::<Result<_, _>>()?,
                },
                _ => return Err(foreign()),
            });
            kernels.push(l.kernel.clone());
            buffers.extend(l.args.iter().cloned());
        }
        Ok(LaunchList {
            bound,
            device: self.device.spec().to_string(),
            _kernels: kernels,
            _buffers: buffers,
        })
    }

    /// Enqueues launch `index` of `list` on this stream.
    pub fn launch_one(&self, list: &LaunchList, index: usize) -> Result<(), RuntimeError> {
        if list.device != self.device.spec() {
            return Err(foreign());
        }
        let Some(b) = list.bound.get(index) else {
            return Err(RuntimeError::NoDevice {
                spec: list.device.clone(),
                reason: format!("launch {index} of a list of {}", list.bound.len()),
            });
        };
        match (self.backend(), b) {
            (
                Backend::Cuda(d, s),
                Bound::Cuda {
                    f,
                    grid,
                    block,
                    shared,
                    args,
                },
            ) => d.launch_raw(s, *f, *grid, *block, *shared, args),
            (
                Backend::Hip(d, s),
                Bound::Hip {
                    f,
                    grid,
                    block,
                    shared,
                    args,
                },
            ) => d.launch_raw(s, *f, *grid, *block, *shared, args),
            _ => Err(foreign()),
        }
    }

    /// Enqueues every launch of `list` on this stream, in order.
    pub fn launch_list(&self, list: &LaunchList) -> Result<(), RuntimeError> {
        (0..list.bound.len()).try_for_each(|i| self.launch_one(list, i))
    }

    /// Whether this stream's device can capture and replay graphs.
    pub fn replay_support(&self) -> Result<(), ReplayOff> {
        match self.backend() {
            Backend::Cuda(d, _) => d.graph_support(),
            Backend::Hip(d, _) => d.graph_support(),
        }
        .map_err(|reason| ReplayOff::Unsupported { reason })
    }

    /// Captures `list`'s launches on this stream (nothing runs) as a graph to replay. The
    /// graph holds the list, so the buffers it touches live as long as it does.
    pub fn capture(&self, list: &Arc<LaunchList>) -> Result<CapturedGraph, RuntimeError> {
        let inner = match self.backend() {
            Backend::Cuda(d, s) => GraphInner::Cuda(d.capture(s, || self.launch_list(list))?),
            Backend::Hip(d, s) => GraphInner::Hip(d.capture(s, || self.launch_list(list))?),
        };
        Ok(CapturedGraph {
            inner,
            list: list.clone(),
            stream: self.id(),
        })
    }

    /// Enqueues one replay of `graph` on this stream, the one it was captured on (so that the
    /// buffers it holds, freed ordered on their stream, are never freed under a replay queued
    /// elsewhere).
    pub fn replay(&self, graph: &CapturedGraph) -> Result<(), RuntimeError> {
        if graph.stream != self.id() {
            return Err(RuntimeError::NoDevice {
                spec: self.device.spec().to_string(),
                reason: "a graph replays on the stream it was captured on, not another".into(),
            });
        }
        match (self.backend(), &graph.inner) {
            (Backend::Cuda(_, s), GraphInner::Cuda(g)) => g.launch(s),
            (Backend::Hip(_, s), GraphInner::Hip(g)) => g.launch(s),
            _ => Err(foreign()),
        }
    }

    pub fn synchronize(&self) -> Result<(), RuntimeError> {
        match self.backend() {
            Backend::Cuda(d, s) => d.sync(s),
            Backend::Hip(d, s) => d.sync(s),
        }
    }

    /// A marker stamped with the device's clock when the stream reaches this point.
    pub fn mark(&self) -> Result<Marker, RuntimeError> {
        Ok(Marker(match self.backend() {
            Backend::Cuda(d, s) => MarkerInner::Cuda(d.mark(s)?),
            Backend::Hip(d, s) => MarkerInner::Hip(d.mark(s)?),
        }))
    }

    /// Holds the stream at this point: what is enqueued after it waits until the hold is
    /// released or dropped, or `limit` has passed (then [`Hold::expired`] says so).
    pub fn hold(&self, limit: std::time::Duration) -> Result<Hold, RuntimeError> {
        let (hold, wait) = Hold::new(limit);
        match self.backend() {
            Backend::Cuda(d, s) => d.hold(s, wait)?,
            Backend::Hip(d, s) => d.hold(s, wait)?,
        }
        Ok(hold)
    }
}

/// Refuses a launch the device cannot run as asked: an empty or oversized grid or block, too
/// many threads, too much shared memory.
fn check_launch(
    limits: &LaunchLimits,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
) -> Result<(), RuntimeError> {
    const GRID: [&str; 3] = ["grid.x", "grid.y", "grid.z"];
    const BLOCK: [&str; 3] = ["block.x", "block.y", "block.z"];
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
                u64::from(shared).max(1),
                u64::from(limits.shared_bytes),
            ),
        ]);
    match checks.flatten().next() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Refuses writing `bytes` into a buffer smaller than that.
fn fits(what: &'static str, bytes: usize, buf: &DeviceBuffer) -> Result<(), RuntimeError> {
    if bytes > buf.bytes {
        return Err(RuntimeError::BufferSize {
            what,
            bytes,
            buffer: buf.bytes,
        });
    }
    Ok(())
}

fn foreign() -> RuntimeError {
    RuntimeError::NoDevice {
        spec: "mixed".into(),
        reason: "a buffer or kernel of another kind of device was passed to this stream".into(),
    }
}

enum BufferMem {
    Cuda(CudaSlice<u8>),
    Hip(HipBuffer),
}

/// Device memory owned by this value: freed (and un-counted) on drop. Deliberately not `Clone`.
pub struct DeviceBuffer {
    device: Device,
    bytes: usize,
    mem: BufferMem,
}

impl DeviceBuffer {
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        self.device.memory().release(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_parse_strictly() {
        assert_eq!(DeviceSpec::parse("cpu"), Ok(DeviceSpec::Cpu));
        assert_eq!(DeviceSpec::parse("cuda"), Ok(DeviceSpec::Cuda(0)));
        assert_eq!(DeviceSpec::parse("cuda:3"), Ok(DeviceSpec::Cuda(3)));
        assert_eq!(DeviceSpec::parse("hip:0"), Ok(DeviceSpec::Hip(0)));
        assert_eq!(
            DeviceSpec::parse("hip:2147483647"),
            Ok(DeviceSpec::Hip(2147483647))
        );
        for (bad, why) in [
            ("tpu", "unknown kind of device `tpu`"),
            ("", "unknown kind of device ``"),
            ("CUDA:0", "unknown kind of device `CUDA`"),
            ("hip:-1", "`-1` is not a device number"),
            ("cuda:+1", "`+1` is not a device number"),
            ("cuda: 1", "` 1` is not a device number"),
            ("cuda:", "`` is not a device number"),
            ("cuda:1:2", "`1:2` is not a device number"),
            ("cuda:2147483648", "past 2147483647"),
            ("cuda:18446744073709551616", "past 2147483647"),
            ("cpu:0", "the CPU has no device number"),
        ] {
            match DeviceSpec::parse(bad) {
                Err(RuntimeError::DeviceSpec { spec, reason }) => {
                    assert_eq!(spec, bad);
                    assert!(reason.contains(why), "{bad:?}: {reason}");
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_malformed_spec_never_reaches_a_driver() {
        // Device::open parses first: these fail the same way on any machine.
        for bad in ["cuda:99999999999", "hip:x", "gpu:0"] {
            assert!(
                matches!(Device::open(bad), Err(RuntimeError::DeviceSpec { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn launches_past_the_device_limits_are_refused() {
        let lim = LaunchLimits::PORTABLE;
        assert!(check_launch(&lim, [i32::MAX as u32, 65535, 65535], [1024, 1, 1], 0).is_ok());
        for (grid, block, shared, what) in [
            ([1u32 << 31, 1, 1], [256u32, 1, 1], 0u32, "grid.x"),
            ([1, 65536, 1], [256, 1, 1], 0, "grid.y"),
            ([1, 1, 0], [256, 1, 1], 0, "grid.z"),
            ([1, 1, 1], [2048, 1, 1], 0, "block.x"),
            ([1, 1, 1], [64, 32, 1], 0, "threads per block"),
            ([1, 1, 1], [256, 1, 1], 1 << 20, "shared memory bytes"),
        ] {
            match check_launch(&lim, grid, block, shared) {
                Err(RuntimeError::LaunchLimit { what: w, .. }) => assert_eq!(w, what),
                other => panic!("{grid:?} {block:?} {shared}: {other:?}"),
            }
        }
    }
}
