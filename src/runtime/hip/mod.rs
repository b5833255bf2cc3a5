//! AMD GPUs through the HIP runtime (`libamdhip64`), loaded at run time like hiprtc, so neither
//! building nor running rocmforge needs ROCm. Kernels are compiled by hiprtc to code objects for
//! the device's full target id and loaded with the module API.
//!
//! HIP keeps the current device per host thread, so every call first binds this device on the
//! calling thread. Memory is allocated and freed stream-ordered (`hipMallocAsync`) where the
//! runtime has it: `hipFree` would synchronise the whole device.
//!
//! HIP also has an NVIDIA platform: a HIP device whose architecture is an NVIDIA one (`sm_90`),
//! with hiprtc compiling through NVRTC. Such a device gets the NVIDIA codegen target, so its
//! kernels carry the NVIDIA prelude and its code objects are PTX. The GPU suite runs this path
//! through `tests/hipshim/hipshim.c` (HIP over the CUDA driver API) on an NVIDIA GPU.
//!
//! `api` loads the library and its entry points, `device` opens a GPU and holds its
//! operations, `handles` owns streams, buffers, modules, events and graphs; this file is the
//! [`Backend`] impl.

mod api;
mod device;
mod handles;

use std::ffi::c_void;
use std::sync::Arc;

pub use api::{HipLibraries, HIP_LIBRARIES};
pub use device::HipDevice;
pub use handles::{HipBuffer, HipEvent, HipFunction, HipGraphExec, HipStream};

use crate::arch::tma::{TensorMapSpec, MAP_BYTES};
use crate::arch::LaunchLimits;
use crate::runtime::backend::{Backend, DeviceKind, LaunchConfig, SharedLimits};
use crate::runtime::error::RuntimeError;
use crate::runtime::hold::HoldWait;

/// A raw HIP handle (a function or a device address), as launch lists keep it.
#[derive(Clone, Copy)]
pub struct RawHandle(*mut c_void);

// SAFETY: function handles and device addresses are immutable values the HIP runtime accepts
// from any thread; the launch list that holds this keeps what it names alive.
unsafe impl Send for RawHandle {}
unsafe impl Sync for RawHandle {}

impl Backend for HipDevice {
    type Stream = Arc<HipStream>;
    type Buffer = HipBuffer;
    type Function = HipFunction;
    type Graph = HipGraphExec;
    type Event = HipEvent;
    type RawFunction = RawHandle;
    type RawAddress = RawHandle;

    const KIND: DeviceKind = DeviceKind::Hip;

    fn toolchain(&self) -> String {
        format!(
            "hiprtc {}.{} ({}) HIP runtime {} driver {}",
            self.hiprtc().version.0,
            self.hiprtc().version.1,
            self.hiprtc().library,
            self.runtime_version,
            self.driver_version
        )
    }

    fn runtime_library(&self) -> Option<&str> {
        Some(self.library())
    }

    fn launch_limits(&self) -> LaunchLimits {
        HipDevice::launch_limits(self)
    }

    fn shared_limits(&self) -> SharedLimits {
        HipDevice::shared_limits(self)
    }

    fn compile(
        &self,
        source: &str,
        entry: &str,
        options: &[String],
    ) -> Result<Vec<u8>, RuntimeError> {
        HipDevice::compile(self, source, entry, options)
    }

    fn load(&self, image: &[u8], entry: &str) -> Result<HipFunction, RuntimeError> {
        HipDevice::load(self, image, entry)
    }

    fn set_dynamic_shared(&self, f: &HipFunction, bytes: u32) -> Result<(), RuntimeError> {
        HipDevice::set_dynamic_shared(self, f, bytes)
    }

    fn new_stream(&self) -> Result<Arc<HipStream>, RuntimeError> {
        HipDevice::new_stream(self)
    }

    fn alloc(
        &self,
        stream: &Arc<HipStream>,
        bytes: usize,
        poison: bool,
    ) -> Result<HipBuffer, RuntimeError> {
        HipDevice::alloc(self, stream, bytes, poison)
    }

    fn upload(&self, stream: &Arc<HipStream>, data: &[u8]) -> Result<HipBuffer, RuntimeError> {
        HipDevice::upload(self, stream, data)
    }

    fn download(
        &self,
        stream: &Arc<HipStream>,
        buf: &HipBuffer,
        bytes: usize,
    ) -> Result<Vec<u8>, RuntimeError> {
        HipDevice::download(self, stream, buf, bytes)
    }

    fn write(
        &self,
        stream: &Arc<HipStream>,
        buf: &HipBuffer,
        data: &[u8],
    ) -> Result<(), RuntimeError> {
        HipDevice::write(self, stream, buf, data)
    }

    fn fill(
        &self,
        stream: &Arc<HipStream>,
        buf: &HipBuffer,
        byte: u8,
        bytes: usize,
    ) -> Result<(), RuntimeError> {
        HipDevice::fill(self, stream, buf, byte, bytes)
    }

    fn copy(
        &self,
        stream: &Arc<HipStream>,
        src: &HipBuffer,
        dst: &HipBuffer,
        bytes: usize,
    ) -> Result<(), RuntimeError> {
        HipDevice::copy(self, stream, src, dst, bytes)
    }

    fn launch(
        &self,
        stream: &Arc<HipStream>,
        f: &HipFunction,
        config: &LaunchConfig,
        args: &[&HipBuffer],
    ) -> Result<(), RuntimeError> {
        HipDevice::launch(self, stream, f, config, args)
    }

    fn raw_function(f: &HipFunction) -> RawHandle {
        RawHandle(f.raw())
    }

    fn raw_address(&self, _stream: &Arc<HipStream>, buf: &HipBuffer, offset: usize) -> RawHandle {
        // Address arithmetic only (nothing is dereferenced on the host): `wrapping_add` keeps it
        // free of the in-bounds rules of `add`; the offset is within the buffer (checked by
        // `Stream::bind`).
        RawHandle(buf.raw().cast::<u8>().wrapping_add(offset).cast())
    }

    fn address_value(a: RawHandle) -> u64 {
        a.0 as usize as u64
    }

    fn resident_blocks(&self, _f: &HipFunction, _threads: u32, _shared: u32) -> Option<u32> {
        // Not queried through HIP yet: a persistent kernel is launched with the grid codegen
        // bounds it to; its blocks claim tasks in order, so residency is a matter of speed,
        // never of progress.
        None
    }

    fn encode_tensor_map(
        &self,
        _stream: &Arc<HipStream>,
        _buf: &HipBuffer,
        _offset: usize,
        spec: &TensorMapSpec,
    ) -> Result<[u8; MAP_BYTES], RuntimeError> {
        // Only sm_90a plans hold tensor maps, and AMD targets have no TMA: a plan compiled for
        // an NVIDIA target and run through HIP's NVIDIA platform gets here.
        Err(RuntimeError::TensorMap {
            map: spec.to_string(),
            reason: "the HIP runtime cannot encode TMA tensor maps; compile this plan without \
                     the warpgroup GEMM (or run it through CUDA)"
                .into(),
        })
    }

    fn launch_raw(
        &self,
        stream: &Arc<HipStream>,
        f: RawHandle,
        config: &LaunchConfig,
        args: &[RawHandle],
    ) -> Result<(), RuntimeError> {
        let args: Vec<*mut c_void> = args.iter().map(|a| a.0).collect();
        HipDevice::launch_raw(self, stream, f.0, config, &args)
    }

    fn graph_support(&self) -> Result<(), String> {
        HipDevice::graph_support(self)
    }

    fn capture(
        &self,
        stream: &Arc<HipStream>,
        enqueue: &mut dyn FnMut() -> Result<(), RuntimeError>,
    ) -> Result<HipGraphExec, RuntimeError> {
        HipDevice::capture(self, stream, enqueue)
    }

    fn replay(&self, stream: &Arc<HipStream>, graph: &HipGraphExec) -> Result<(), RuntimeError> {
        graph.launch(stream)
    }

    fn sync(&self, stream: &Arc<HipStream>) -> Result<(), RuntimeError> {
        HipDevice::sync(self, stream)
    }

    fn mark(&self, stream: &Arc<HipStream>) -> Result<HipEvent, RuntimeError> {
        HipDevice::mark(self, stream)
    }

    fn reached(&self, event: &HipEvent) -> Result<bool, RuntimeError> {
        event.is_complete()
    }

    fn elapsed_ms(&self, start: &HipEvent, end: &HipEvent) -> Result<f32, RuntimeError> {
        start.elapsed_ms(end)
    }

    fn hold(&self, stream: &Arc<HipStream>, wait: HoldWait) -> Result<(), RuntimeError> {
        HipDevice::hold(self, stream, wait)
    }
}
