//! NVIDIA GPUs through cudarc (driver API and NVRTC, both loaded at run time). cudarc panics when
//! it cannot find its libraries, so both are probed first and a missing one is a typed error.
//! Kernels are the same HIP source as on AMD, compiled with the NVIDIA prelude.
//!
//! `library` probes the driver and NVRTC, `nvrtc` compiles, `device` opens a GPU and holds its
//! operations, `graph` is a captured CUDA graph; this file is the [`Backend`] impl.

mod device;
mod graph;
mod library;
mod nvrtc;

use std::sync::Arc;

use cudarc::driver::sys::{CUdeviceptr, CUfunction};
use cudarc::driver::{CudaEvent, CudaFunction, CudaSlice, CudaStream};

pub use device::CudaDevice;
pub use graph::CudaGraphExec;
use library::cuda_err;
pub use nvrtc::{compile_cubin, compile_ptx, nvrtc_version};

use crate::arch::tma::{TensorMapSpec, MAP_BYTES};
use crate::arch::LaunchLimits;
use crate::runtime::backend::{Backend, DeviceKind, LaunchConfig, SharedLimits};
use crate::runtime::error::RuntimeError;
use crate::runtime::hold::HoldWait;

/// A loaded function's raw handle, as launch lists keep it.
#[derive(Clone, Copy)]
pub struct RawFunction(CUfunction);

// SAFETY: a CUfunction is an immutable driver handle; the driver allows launches of it from any
// thread, and the launch list that holds this keeps the function (and its module) alive.
unsafe impl Send for RawFunction {}
unsafe impl Sync for RawFunction {}

impl Backend for CudaDevice {
    type Stream = Arc<CudaStream>;
    type Buffer = CudaSlice<u8>;
    type Function = CudaFunction;
    type Graph = CudaGraphExec;
    type Event = CudaEvent;
    type RawFunction = RawFunction;
    type RawAddress = CUdeviceptr;

    const KIND: DeviceKind = DeviceKind::Cuda;

    fn toolchain(&self) -> String {
        // Kernels are CUBIN (entries from before were PTX, under another key).
        format!(
            "nvrtc {}.{} cubin driver {}",
            self.nvrtc_version.0, self.nvrtc_version.1, self.driver_version
        )
    }

    fn runtime_library(&self) -> Option<&str> {
        // cudarc opens the driver by its own list of names.
        None
    }

    fn launch_limits(&self) -> LaunchLimits {
        CudaDevice::launch_limits(self)
    }

    fn shared_limits(&self) -> SharedLimits {
        CudaDevice::shared_limits(self)
    }

    fn compile(
        &self,
        source: &str,
        entry: &str,
        options: &[String],
    ) -> Result<Vec<u8>, RuntimeError> {
        CudaDevice::compile(self, source, entry, options)
    }

    fn load(&self, image: &[u8], entry: &str) -> Result<CudaFunction, RuntimeError> {
        CudaDevice::load(self, image, entry)
    }

    fn set_dynamic_shared(&self, f: &CudaFunction, bytes: u32) -> Result<(), RuntimeError> {
        CudaDevice::set_dynamic_shared(self, f, bytes)
    }

    fn new_stream(&self) -> Result<Arc<CudaStream>, RuntimeError> {
        CudaDevice::new_stream(self)
    }

    fn alloc(
        &self,
        stream: &Arc<CudaStream>,
        bytes: usize,
        poison: bool,
    ) -> Result<CudaSlice<u8>, RuntimeError> {
        CudaDevice::alloc(self, stream, bytes, poison)
    }

    fn upload(&self, stream: &Arc<CudaStream>, data: &[u8]) -> Result<CudaSlice<u8>, RuntimeError> {
        CudaDevice::upload(self, stream, data)
    }

    fn download(
        &self,
        stream: &Arc<CudaStream>,
        buf: &CudaSlice<u8>,
        bytes: usize,
    ) -> Result<Vec<u8>, RuntimeError> {
        CudaDevice::download(self, stream, buf, bytes)
    }

    fn write(
        &self,
        stream: &Arc<CudaStream>,
        buf: &CudaSlice<u8>,
        data: &[u8],
    ) -> Result<(), RuntimeError> {
        CudaDevice::write(self, stream, buf, data)
    }

    fn fill(
        &self,
        stream: &Arc<CudaStream>,
        buf: &CudaSlice<u8>,
        byte: u8,
        bytes: usize,
    ) -> Result<(), RuntimeError> {
        CudaDevice::fill(self, stream, buf, byte, bytes)
    }

    fn copy(
        &self,
        stream: &Arc<CudaStream>,
        src: &CudaSlice<u8>,
        dst: &CudaSlice<u8>,
        bytes: usize,
    ) -> Result<(), RuntimeError> {
        CudaDevice::copy(self, stream, src, dst, bytes)
    }

    fn launch(
        &self,
        stream: &Arc<CudaStream>,
        f: &CudaFunction,
        config: &LaunchConfig,
        args: &[&CudaSlice<u8>],
    ) -> Result<(), RuntimeError> {
        CudaDevice::launch(self, stream, f, config, args)
    }

    fn raw_function(f: &CudaFunction) -> RawFunction {
        RawFunction(f.cu_function())
    }

    fn raw_address(
        &self,
        stream: &Arc<CudaStream>,
        buf: &CudaSlice<u8>,
        offset: usize,
    ) -> CUdeviceptr {
        // Within the allocation (checked by `Stream::bind`), so this cannot overflow.
        self.address(stream, buf) + offset as CUdeviceptr
    }

    fn address_value(a: CUdeviceptr) -> u64 {
        a
    }

    fn resident_blocks(&self, f: &CudaFunction, threads: u32, shared: u32) -> Option<u32> {
        CudaDevice::resident_blocks(self, f, threads, shared)
    }

    fn encode_tensor_map(
        &self,
        stream: &Arc<CudaStream>,
        buf: &CudaSlice<u8>,
        offset: usize,
        spec: &TensorMapSpec,
    ) -> Result<[u8; MAP_BYTES], RuntimeError> {
        let address = self.address(stream, buf) + offset as CUdeviceptr;
        CudaDevice::encode_tensor_map(self, address, spec)
    }

    fn launch_raw(
        &self,
        stream: &Arc<CudaStream>,
        f: RawFunction,
        config: &LaunchConfig,
        args: &[CUdeviceptr],
    ) -> Result<(), RuntimeError> {
        CudaDevice::launch_raw(self, stream, f.0, config, args)
    }

    fn graph_support(&self) -> Result<(), String> {
        CudaDevice::graph_support(self)
    }

    fn capture(
        &self,
        stream: &Arc<CudaStream>,
        enqueue: &mut dyn FnMut() -> Result<(), RuntimeError>,
    ) -> Result<CudaGraphExec, RuntimeError> {
        CudaDevice::capture(self, stream, enqueue)
    }

    fn replay(&self, stream: &Arc<CudaStream>, graph: &CudaGraphExec) -> Result<(), RuntimeError> {
        graph.launch(stream)
    }

    fn sync(&self, stream: &Arc<CudaStream>) -> Result<(), RuntimeError> {
        CudaDevice::sync(self, stream)
    }

    fn mark(&self, stream: &Arc<CudaStream>) -> Result<CudaEvent, RuntimeError> {
        CudaDevice::mark(self, stream)
    }

    fn reached(&self, event: &CudaEvent) -> Result<bool, RuntimeError> {
        event.try_is_complete().map_err(cuda_err)
    }

    fn elapsed_ms(&self, start: &CudaEvent, end: &CudaEvent) -> Result<f32, RuntimeError> {
        start.elapsed_ms(end).map_err(cuda_err)
    }

    fn hold(&self, stream: &Arc<CudaStream>, wait: HoldWait) -> Result<(), RuntimeError> {
        CudaDevice::hold(self, stream, wait)
    }
}
