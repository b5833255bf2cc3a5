//! Devices, buffers and streams. A `Device` is a cheap handle (`Send + Sync`) to one GPU or the
//! CPU, with its own kernel cache and memory counter. Buffers own their memory and are never
//! `Clone`; each execution makes its own `Stream` and synchronises only that stream.

use std::sync::Arc;

pub use super::backend::DeviceKind;
pub use super::buffer::DeviceBuffer;
use super::cache::KernelCache;
use super::cuda::CudaDevice;
use super::dispatch::Gpu;
pub use super::dispatch::LoadedKernel;
use super::error::RuntimeError;
use super::hip::{HipDevice, HipLibraries};
use super::memory::MemoryCounter;
pub use super::stream::Stream;
use crate::arch::Target;

/// What runs a device's work: the fast CPU executor (`threads` workers; `None`: one per
/// physical core, counted where the executor is built), the reference interpreter, or a GPU
/// backend behind the one dispatch point.
enum Engine {
    Cpu { threads: Option<usize> },
    Interp,
    Gpu(Arc<dyn Gpu>),
}

struct Inner {
    engine: Engine,
    spec: String,
    label: String,
    target: Option<Target>,
    cache: KernelCache,
    memory: Arc<MemoryCounter>,
}

#[derive(Clone)]
pub struct Device(Arc<Inner>);

/// A device name, parsed: `cpu` (the fast CPU executor), `interp` (the reference interpreter),
/// `cuda`, `cuda:N`, `hip`, `hip:N` (N a decimal device number that fits the drivers' `int`;
/// no sign, spaces or other text).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceSpec {
    Cpu,
    Interp,
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
            "interp" if index.is_none() => Ok(DeviceSpec::Interp),
            "interp" => Err(bad("the interpreter has no device number".into())),
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
        engine: Engine,
        spec: String,
        label: String,
        target: Option<Target>,
        cache: KernelCache,
    ) -> Device {
        Device(Arc::new(Inner {
            engine,
            spec,
            label,
            target,
            cache,
            memory: Arc::default(),
        }))
    }

    /// The fast CPU device with one worker per physical core.
    pub fn cpu() -> Device {
        Device::cpu_threads(None)
    }

    /// The fast CPU device with `threads` workers (`None`: one per physical core).
    pub fn cpu_threads(threads: Option<usize>) -> Device {
        let label = match threads {
            Some(n) => format!("cpu (fast CPU executor, {n} threads)"),
            None => "cpu (fast CPU executor, one thread per physical core)".into(),
        };
        Device::new(
            Engine::Cpu { threads },
            "cpu".into(),
            label,
            None,
            KernelCache::with_disk(None),
        )
    }

    /// The reference interpreter: exact and simple, what `verify` and the tests compare with.
    pub fn interp() -> Device {
        Device::new(
            Engine::Interp,
            "interp".into(),
            "interp (reference interpreter)".into(),
            None,
            KernelCache::with_disk(None),
        )
    }

    /// `ROCMFORGE_THREADS`, when set: the fast CPU device's worker count (a positive integer).
    pub fn threads_from_env() -> Result<Option<usize>, RuntimeError> {
        let Some(v) = std::env::var_os("ROCMFORGE_THREADS").filter(|s| !s.is_empty()) else {
            return Ok(None);
        };
        let text = v.to_string_lossy();
        match text.parse::<usize>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(RuntimeError::DeviceSpec {
                spec: format!("ROCMFORGE_THREADS={text}"),
                reason: "the thread count must be a positive integer".into(),
            }),
        }
    }

    /// The fast CPU device's worker count, when fixed (`None`: one per physical core, and for
    /// every other device).
    pub fn cpu_thread_count(&self) -> Option<usize> {
        match &self.0.engine {
            Engine::Cpu { threads } => *threads,
            Engine::Interp | Engine::Gpu(_) => None,
        }
    }

    /// Whether this is the reference interpreter (`interp`).
    pub fn is_interp(&self) -> bool {
        matches!(self.0.engine, Engine::Interp)
    }

    /// A device by name: `cpu`, `interp`, `cuda:N`, `hip:N` (see [`DeviceSpec::parse`]); `cpu`
    /// takes its thread count from `ROCMFORGE_THREADS` when set.
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
            DeviceSpec::Cpu => Ok(Device::cpu_threads(Device::threads_from_env()?)),
            DeviceSpec::Interp => Ok(Device::interp()),
            DeviceSpec::Cuda(ordinal) => {
                let d = CudaDevice::open(ordinal)?;
                let target = Target::parse(&d.arch).map_err(|e| bad(e.to_string()))?;
                let label = format!(
                    "cuda:{ordinal} {} ({}, driver {}, NVRTC {}.{})",
                    d.name, d.arch, d.driver_version, d.nvrtc_version.0, d.nvrtc_version.1
                );
                Ok(Device::new(
                    Engine::Gpu(Arc::new(d)),
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
            Engine::Gpu(Arc::new(d)),
            spec,
            label,
            Some(target),
            cache,
        ))
    }

    /// The device to use: the one `ROCMFORGE_DEVICE` names if it is set (a malformed or absent
    /// device is an error, not a quiet fallback: the user asked for that one), else the best
    /// one here: HIP, then NVIDIA, then the fast CPU device. Returns the device and, for every device
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
        Ok((Device::cpu_threads(Device::threads_from_env()?), notes))
    }

    pub fn kind(&self) -> DeviceKind {
        match &self.0.engine {
            Engine::Cpu { .. } | Engine::Interp => DeviceKind::Cpu,
            Engine::Gpu(g) => g.kind(),
        }
    }

    pub fn is_gpu(&self) -> bool {
        matches!(self.0.engine, Engine::Gpu(_))
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

    /// The file the GPU runtime library was loaded from (the HIP runtime's; cudarc finds its
    /// own), to reopen the same device through it.
    pub fn runtime_library(&self) -> Option<&str> {
        match &self.0.engine {
            Engine::Cpu { .. } | Engine::Interp => None,
            Engine::Gpu(g) => g.runtime_library(),
        }
    }

    /// Compiler and driver versions, part of every cache key.
    pub fn toolchain(&self) -> String {
        match &self.0.engine {
            Engine::Cpu { .. } => "cpu".into(),
            Engine::Interp => "interp".into(),
            Engine::Gpu(g) => g.toolchain(),
        }
    }

    /// The GPU backend, or why the CPU has none of `what`.
    fn gpu(&self, what: &str) -> Result<&Arc<dyn Gpu>, RuntimeError> {
        match &self.0.engine {
            Engine::Gpu(g) => Ok(g),
            Engine::Cpu { .. } | Engine::Interp => Err(RuntimeError::NoDevice {
                spec: self.0.spec.clone(),
                reason: what.into(),
            }),
        }
    }

    /// Compiles kernel source for this device (CUBIN on NVIDIA, a code object on AMD).
    pub fn compile_source(
        &self,
        source: &str,
        entry: &str,
        options: &[String],
    ) -> Result<Vec<u8>, RuntimeError> {
        self.gpu("the CPU runs no generated kernels")?
            .compile(source, entry, options)
    }

    pub fn load_kernel(&self, image: &[u8], entry: &str) -> Result<LoadedKernel, RuntimeError> {
        self.gpu("no kernels on the CPU")?.load(image, entry)
    }

    pub fn new_stream(&self) -> Result<Stream, RuntimeError> {
        let gpu = self.gpu("no streams on the CPU")?;
        Ok(Stream {
            inner: gpu.new_stream()?,
            gpu: gpu.clone(),
            memory: self.0.memory.clone(),
            spec: Arc::from(self.0.spec.as_str()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_parse_strictly() {
        assert_eq!(DeviceSpec::parse("cpu"), Ok(DeviceSpec::Cpu));
        assert_eq!(DeviceSpec::parse("interp"), Ok(DeviceSpec::Interp));
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
            ("interp:0", "the interpreter has no device number"),
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
}
