//! An NVIDIA GPU opened through cudarc: the device query, its launch limits, and the typed
//! operations the [`Backend`](crate::runtime::backend::Backend) impl calls.

use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::{self, CUevent_flags};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, LaunchConfig as CuLaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use super::graph::CudaGraphExec;
use super::library::{
    cuda_err, probe, ATTRIBUTE_SYMBOLS, DRIVER_SYMBOLS, GRAPH_SYMBOLS, LAUNCH_EX_SYMBOLS,
    NVRTC_SYMBOLS, OCCUPANCY_SYMBOLS, TIMING_SYMBOLS,
};
use super::nvrtc::{compile_cubin, nvrtc_archs};
use crate::arch::mma::wgmma::Swizzle;
use crate::arch::tma::{TensorMapSpec, MAP_BYTES};
use crate::arch::LaunchLimits;
use crate::ir::DType;
use crate::runtime::backend::{LaunchConfig, SharedLimits};
use crate::runtime::error::RuntimeError;
use crate::runtime::hold::HoldWait;
use crate::runtime::libraries;

pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    pub name: String,
    /// `sm_XY`
    pub arch: String,
    pub driver_version: i32,
    pub nvrtc_version: (i32, i32),
    /// Queried at the first launch.
    limits: OnceLock<LaunchLimits>,
    /// Whether the driver has [`TIMING_SYMBOLS`], else why not.
    timing: Result<(), String>,
    /// Whether the driver has [`GRAPH_SYMBOLS`], else why not.
    graphs: Result<(), String>,
    /// Whether the driver has [`ATTRIBUTE_SYMBOLS`] (the dynamic shared memory opt-in), else
    /// why not.
    attributes: Result<(), String>,
    /// Whether the driver has [`OCCUPANCY_SYMBOLS`].
    occupancy: Result<(), String>,
    /// Whether launches marked programmatic go as programmatic dependent launches: the GPU is
    /// sm_90 or newer and the driver has [`LAUNCH_EX_SYMBOLS`].
    programmatic: bool,
    /// Queried at the first launch.
    shared: OnceLock<SharedLimits>,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaDevice({}, {})", self.name, self.arch)
    }
}

impl CudaDevice {
    pub fn open(ordinal: usize) -> Result<CudaDevice, RuntimeError> {
        let spec = format!("cuda:{ordinal}");
        let no = |reason: String| RuntimeError::NoDevice {
            spec: spec.clone(),
            reason,
        };
        probe("ROCMFORGE_CUDA_LIBRARY", "cuda", &DRIVER_SYMBOLS).map_err(no)?;
        probe("ROCMFORGE_NVRTC_LIBRARY", "nvrtc", &NVRTC_SYMBOLS).map_err(no)?;
        // The probe kept the driver loaded, so this opens the same object again: each group of
        // optional entry points is checked on it, and one that is missing turns its feature off.
        let optional = |symbols: &[&str], what: &str| {
            libraries::open(
                "ROCMFORGE_CUDA_LIBRARY",
                &libraries::unique(cudarc::get_lib_name_candidates("cuda")),
            )
            .map_err(|e| e.describe("NVIDIA driver", "libcuda.so.1"))
            .and_then(|o| o.require(symbols, what))
        };
        let timing = optional(&TIMING_SYMBOLS, "libcuda with event timing");
        let graphs = optional(&GRAPH_SYMBOLS, "libcuda with graph capture");
        let attributes = optional(&ATTRIBUTE_SYMBOLS, "libcuda with function attributes");
        let occupancy = optional(&OCCUPANCY_SYMBOLS, "libcuda with the occupancy query");
        let launch_ex = optional(&LAUNCH_EX_SYMBOLS, "libcuda with launch attributes");
        let count =
            CudaContext::device_count().map_err(|e| no(format!("the CUDA driver failed: {e}")))?;
        if usize::try_from(count).map_or(true, |c| ordinal >= c) {
            return Err(no(format!("{count} NVIDIA GPU(s) present")));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| no(e.to_string()))?;
        let name = ctx.name().map_err(cuda_err)?;
        let (major, minor) = ctx.compute_capability().map_err(cuda_err)?;
        let mut driver_version = 0;
        // SAFETY: libcuda was probed and initialised by CudaContext::new; the out-pointer is valid.
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver_version) };
        let (mut major_rtc, mut minor_rtc) = (0, 0);
        // SAFETY: libnvrtc was probed above; both out-pointers are valid.
        unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major_rtc, &mut minor_rtc) };
        let nvrtc_version = (major_rtc, minor_rtc);
        // A GPU newer than the NVRTC cannot have kernels compiled for it: say so now.
        let sm = major * 10 + minor;
        let archs = nvrtc_archs().map_err(no)?;
        if !archs.contains(&sm) {
            let list: Vec<String> = archs.iter().map(|a| format!("sm_{a}")).collect();
            return Err(no(format!(
                "NVRTC {major_rtc}.{minor_rtc} cannot compile for this GPU's sm_{sm} (it \
                 supports {})",
                list.join(", ")
            )));
        }
        Ok(CudaDevice {
            ctx,
            name,
            // The arch-specific `sm_90a` on an H100 (wgmma, setmaxnreg): the row says which.
            arch: crate::arch::device_processor(major, minor, nvrtc_version),
            driver_version,
            nvrtc_version,
            limits: OnceLock::new(),
            timing,
            graphs,
            attributes,
            occupancy,
            // Programmatic dependent launch is a Hopper (compute capability 9.0) feature;
            // ROCMFORGE_PROGRAMMATIC_LAUNCH=0 turns it off (to measure what it gives).
            programmatic: launch_ex.is_ok()
                && major >= 9
                && std::env::var("ROCMFORGE_PROGRAMMATIC_LAUNCH").map_or(true, |v| v != "0"),
            shared: OnceLock::new(),
        })
    }

    /// The launch limits the driver reports for this GPU, queried once; any the driver does not
    /// answer are the limits every target shares.
    pub fn launch_limits(&self) -> LaunchLimits {
        use cudarc::driver::sys::CUdevice_attribute as A;
        *self.limits.get_or_init(|| {
            let p = LaunchLimits::PORTABLE;
            let q = |a: A, fallback: u32| {
                self.ctx
                    .attribute(a)
                    .ok()
                    .and_then(|v| u32::try_from(v).ok())
                    .filter(|&v| v > 0)
                    .unwrap_or(fallback)
            };
            LaunchLimits {
                grid: [
                    q(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, p.grid[0]),
                    q(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, p.grid[1]),
                    q(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, p.grid[2]),
                ],
                block: [
                    q(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, p.block[0]),
                    q(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, p.block[1]),
                    q(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, p.block[2]),
                ],
                block_threads: q(
                    A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                    p.block_threads,
                ),
                shared_bytes: q(
                    A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK,
                    p.shared_bytes,
                ),
            }
        })
    }

    /// Shared memory per block: the default, and what a kernel may opt into (the larger of the
    /// two the driver answers; without an answer, the default alone).
    pub(super) fn shared_limits(&self) -> SharedLimits {
        use cudarc::driver::sys::CUdevice_attribute as A;
        *self.shared.get_or_init(|| {
            let default_bytes = self.launch_limits().shared_bytes;
            let opt_in = self
                .ctx
                .attribute(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
                .ok()
                .and_then(|v| u32::try_from(v).ok())
                .filter(|_| self.attributes.is_ok())
                .unwrap_or(0);
            SharedLimits {
                default_bytes,
                opt_in_bytes: opt_in.max(default_bytes),
            }
        })
    }

    /// Blocks of `f` (`threads` threads, `shared` bytes of dynamic shared memory) resident on the
    /// whole GPU at once: the driver's occupancy per multiprocessor times their count; `None`
    /// where the driver cannot answer.
    pub(super) fn resident_blocks(
        &self,
        f: &CudaFunction,
        threads: u32,
        shared: u32,
    ) -> Option<u32> {
        use cudarc::driver::sys::CUdevice_attribute as A;
        self.occupancy.as_ref().ok()?;
        let sms = self
            .ctx
            .attribute(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .ok()
            .and_then(|v| u32::try_from(v).ok())?;
        let per_sm = f
            .occupancy_max_active_blocks_per_multiprocessor(threads, shared as usize, None)
            .ok()?;
        per_sm.checked_mul(sms).filter(|&n| n > 0)
    }

    /// Lets `f` use up to `bytes` of dynamic shared memory
    /// (`cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)`).
    pub(super) fn set_dynamic_shared(
        &self,
        f: &CudaFunction,
        bytes: u32,
    ) -> Result<(), RuntimeError> {
        use cudarc::driver::sys::CUfunction_attribute as F;
        self.attributes.clone().map_err(RuntimeError::Cuda)?;
        let value = i32::try_from(bytes).map_err(cuda_err)?;
        self.ctx.bind_to_thread().map_err(cuda_err)?;
        f.set_attribute(F::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, value)
            .map_err(cuda_err)
    }

    /// The encoded tiled tensor map `spec` of the memory at `address`
    /// (`cuTensorMapEncodeTiled`): no interleave, zero fill out of bounds, L2 promotion of 256
    /// bytes (the lines of a 128-byte-swizzled box come in pairs).
    pub(super) fn encode_tensor_map(
        &self,
        address: sys::CUdeviceptr,
        spec: &TensorMapSpec,
    ) -> Result<[u8; MAP_BYTES], RuntimeError> {
        use sys::CUtensorMapDataType_enum as T;
        let refuse = |reason: String| RuntimeError::TensorMap {
            map: spec.to_string(),
            reason,
        };
        let dtype = match spec.dtype {
            DType::F16 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            DType::BF16 => T::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            DType::F32 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
            other => return Err(refuse(format!("no TMA element type for {other:?}"))),
        };
        let swizzle = match spec.swizzle {
            Swizzle::B128 => sys::CUtensorMapSwizzle_enum::CU_TENSOR_MAP_SWIZZLE_128B,
        };
        let rank = u32::try_from(spec.dims.len()).map_err(|e| refuse(e.to_string()))?;
        let element_strides = vec![1u32; spec.dims.len()];
        let mut map = sys::CUtensorMap { opaque: [0; 16] };
        self.ctx.bind_to_thread().map_err(cuda_err)?;
        // SAFETY: every array holds `rank` entries (strides `rank - 1`), as `TensorMapSpec::new`
        // checked; `map` is a 64-byte-aligned 128-byte value the call writes; the address is
        // only recorded in the map, not dereferenced here.
        let r = unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map,
                dtype,
                rank,
                address as *mut std::ffi::c_void,
                spec.dims.as_ptr(),
                spec.strides.as_ptr(),
                spec.boxes.as_ptr(),
                element_strides.as_ptr(),
                sys::CUtensorMapInterleave_enum::CU_TENSOR_MAP_INTERLEAVE_NONE,
                swizzle,
                sys::CUtensorMapL2promotion_enum::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                sys::CUtensorMapFloatOOBfill_enum::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(refuse(format!("cuTensorMapEncodeTiled: {r:?}")));
        }
        let mut bytes = [0u8; MAP_BYTES];
        for (chunk, word) in bytes.chunks_exact_mut(8).zip(map.opaque) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        Ok(bytes)
    }

    /// Compiles a kernel to PTX for this device's arch.
    pub fn compile(
        &self,
        source: &str,
        entry: &str,
        options: &[String],
    ) -> Result<Vec<u8>, RuntimeError> {
        compile_cubin(source, entry, &self.arch, options)
    }

    /// Loads a kernel: CUBIN (an ELF image, what [`CudaDevice::compile`] makes) or PTX text
    /// (what bundles carry, [`compile_ptx`]).
    pub fn load(&self, image: &[u8], entry: &str) -> Result<CudaFunction, RuntimeError> {
        let ptx = if image.starts_with(b"\x7fELF") {
            Ptx::from_binary(image.to_vec())
        } else {
            Ptx::from_src(String::from_utf8_lossy(image).into_owned())
        };
        let module = self.ctx.load_module(ptx).map_err(cuda_err)?;
        module.load_function(entry).map_err(cuda_err)
    }

    pub fn new_stream(&self) -> Result<Arc<CudaStream>, RuntimeError> {
        self.ctx.new_stream().map_err(cuda_err)
    }

    /// `bytes` of device memory on `stream`, filled with 0xFF (NaN in every float dtype) when
    /// `poison`, else zeros.
    pub fn alloc(
        &self,
        stream: &Arc<CudaStream>,
        bytes: usize,
        poison: bool,
    ) -> Result<CudaSlice<u8>, RuntimeError> {
        let mut s = stream.alloc_zeros::<u8>(bytes.max(1)).map_err(cuda_err)?;
        if poison {
            stream
                .memcpy_htod(&vec![0xFFu8; bytes.max(1)], &mut s)
                .map_err(cuda_err)?;
        }
        Ok(s)
    }

    pub fn upload(
        &self,
        stream: &Arc<CudaStream>,
        data: &[u8],
    ) -> Result<CudaSlice<u8>, RuntimeError> {
        if data.is_empty() {
            return stream.alloc_zeros::<u8>(1).map_err(cuda_err);
        }
        stream.clone_htod(data).map_err(cuda_err)
    }

    pub fn download(
        &self,
        stream: &Arc<CudaStream>,
        buf: &CudaSlice<u8>,
        bytes: usize,
    ) -> Result<Vec<u8>, RuntimeError> {
        let mut v = stream.clone_dtoh(buf).map_err(cuda_err)?;
        v.truncate(bytes);
        Ok(v)
    }

    /// Launches `f` on `stream` with device pointers `args`.
    pub fn launch(
        &self,
        stream: &Arc<CudaStream>,
        f: &CudaFunction,
        config: &LaunchConfig,
        args: &[&CudaSlice<u8>],
    ) -> Result<(), RuntimeError> {
        let mut b = stream.launch_builder(f);
        for a in args {
            b.arg(*a);
        }
        let (grid, block) = (config.grid, config.block);
        let cfg = CuLaunchConfig {
            grid_dim: (grid[0], grid[1], grid[2]),
            block_dim: (block[0], block[1], block[2]),
            shared_mem_bytes: config.attrs.dynamic_shared_bytes,
        };
        // SAFETY: every kernel takes exactly one device pointer per binding, in binding order,
        // and each buffer holds the element count its type says (checked when planned).
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(cuda_err)
    }

    pub fn sync(&self, stream: &Arc<CudaStream>) -> Result<(), RuntimeError> {
        stream.synchronize().map_err(cuda_err)
    }

    fn timing(&self) -> Result<(), RuntimeError> {
        self.timing.clone().map_err(RuntimeError::Cuda)
    }

    /// An event recorded on `stream`, with timing on (cudarc's default turns it off).
    pub(super) fn mark(&self, stream: &Arc<CudaStream>) -> Result<CudaEvent, RuntimeError> {
        self.timing()?;
        stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(cuda_err)
    }

    /// Holds `stream` here until `wait` ends: a host function that blocks on it.
    pub(super) fn hold(
        &self,
        stream: &Arc<CudaStream>,
        wait: HoldWait,
    ) -> Result<(), RuntimeError> {
        self.timing()?;
        self.ctx.bind_to_thread().map_err(cuda_err)?;
        let data = Box::into_raw(Box::new(wait));
        // SAFETY: the stream is live (held by the Arc) on the bound context; `data` is a leaked
        // Box that the callback alone takes back, once; the callback makes no CUDA call.
        let r =
            unsafe { sys::cuLaunchHostFunc(stream.cu_stream(), Some(release_hold), data.cast()) };
        if let Err(e) = r.result() {
            // SAFETY: a failed launch never runs the callback, so the Box is still ours.
            drop(unsafe { Box::from_raw(data) });
            return Err(cuda_err(e));
        }
        Ok(())
    }
}

/// Raw handles of the in-place operations and bound launches (`runtime::graph`): they bypass
/// cudarc's per-buffer event tracking, which records and waits on events around every use of a
/// buffer. A session's buffers all live on its one stream, so stream order already orders them,
/// and a wait on an event recorded outside a capture would invalidate the capture.
impl CudaDevice {
    /// The device address of `buf` (cudarc records a read event on `stream` as it hands it out:
    /// harmless outside a capture, which is the only place this is called).
    pub(super) fn address(&self, stream: &CudaStream, buf: &CudaSlice<u8>) -> sys::CUdeviceptr {
        use cudarc::driver::DevicePtr;
        let (ptr, _read) = buf.device_ptr(stream);
        ptr
    }

    /// Writes `data` into `buf` at its start, ordered on `stream`. The host bytes may be freed
    /// when this returns: from pageable memory the driver stages the copy before returning.
    pub(super) fn write(
        &self,
        stream: &Arc<CudaStream>,
        buf: &CudaSlice<u8>,
        data: &[u8],
    ) -> Result<(), RuntimeError> {
        if data.is_empty() {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(cuda_err)?;
        let dst = self.address(stream, buf);
        // SAFETY: the caller checked `data.len()` against the buffer's size; the driver reads
        // `data` (pageable) before this returns.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, data.as_ptr().cast(), data.len(), stream.cu_stream())
        }
        .result()
        .map_err(cuda_err)
    }

    /// Sets the first `bytes` of `buf` to `byte`, ordered on `stream`.
    pub(super) fn fill(
        &self,
        stream: &Arc<CudaStream>,
        buf: &CudaSlice<u8>,
        byte: u8,
        bytes: usize,
    ) -> Result<(), RuntimeError> {
        if bytes == 0 {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(cuda_err)?;
        let dst = self.address(stream, buf);
        // SAFETY: the caller checked `bytes` against the buffer's size.
        unsafe { sys::cuMemsetD8Async(dst, byte, bytes, stream.cu_stream()) }
            .result()
            .map_err(cuda_err)
    }

    /// Copies the first `bytes` of `src` to `dst`, ordered on `stream`.
    pub(super) fn copy(
        &self,
        stream: &Arc<CudaStream>,
        src: &CudaSlice<u8>,
        dst: &CudaSlice<u8>,
        bytes: usize,
    ) -> Result<(), RuntimeError> {
        if bytes == 0 {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(cuda_err)?;
        let (s, d) = (self.address(stream, src), self.address(stream, dst));
        // SAFETY: the caller checked `bytes` against both buffers' sizes; both live on this
        // device's context.
        unsafe { sys::cuMemcpyDtoDAsync_v2(d, s, bytes, stream.cu_stream()) }
            .result()
            .map_err(cuda_err)
    }

    /// Launches `f` with the device addresses `args` (one pointer parameter each), bypassing
    /// cudarc's event tracking (see above).
    pub(super) fn launch_raw(
        &self,
        stream: &CudaStream,
        f: sys::CUfunction,
        config: &LaunchConfig,
        args: &[sys::CUdeviceptr],
    ) -> Result<(), RuntimeError> {
        let (grid, block) = (config.grid, config.block);
        self.ctx.bind_to_thread().map_err(cuda_err)?;
        let mut ptrs: Vec<sys::CUdeviceptr> = args.to_vec();
        let mut params: Vec<*mut std::ffi::c_void> = ptrs
            .iter_mut()
            .map(|p| (p as *mut sys::CUdeviceptr).cast())
            .collect();
        if config.attrs.programmatic && self.programmatic {
            let mut attr = sys::CUlaunchAttribute {
                id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                pad: Default::default(),
                value: sys::CUlaunchAttributeValue {
                    programmaticStreamSerializationAllowed: 1,
                },
            };
            let cfg = sys::CUlaunchConfig {
                gridDimX: grid[0],
                gridDimY: grid[1],
                gridDimZ: grid[2],
                blockDimX: block[0],
                blockDimY: block[1],
                blockDimZ: block[2],
                sharedMemBytes: config.attrs.dynamic_shared_bytes,
                hStream: stream.cu_stream(),
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: as for `cuLaunchKernel` below; `cfg` and the one attribute it points at
            // live until the call returns (the driver copies them), and the driver has
            // `cuLaunchKernelEx` (checked when the device opened).
            return unsafe {
                sys::cuLaunchKernelEx(&cfg, f, params.as_mut_ptr(), std::ptr::null_mut())
            }
            .result()
            .map_err(cuda_err);
        }
        // SAFETY: every kernel takes exactly one device pointer per binding, in binding order;
        // `params` points at those pointers, which live until the call returns (the driver
        // copies them); the buffers they address are kept alive by the caller's launch list.
        unsafe {
            sys::cuLaunchKernel(
                f,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                config.attrs.dynamic_shared_bytes,
                stream.cu_stream(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(cuda_err)
    }

    /// Whether this driver can capture and replay graphs, else why not.
    pub(super) fn graph_support(&self) -> Result<(), String> {
        self.graphs.clone()
    }

    /// Captures what `enqueue` puts on `stream` (thread-local mode: other threads' allocations
    /// do not break it) and instantiates it.
    pub(super) fn capture(
        &self,
        stream: &Arc<CudaStream>,
        enqueue: &mut dyn FnMut() -> Result<(), RuntimeError>,
    ) -> Result<CudaGraphExec, RuntimeError> {
        self.graphs.clone().map_err(RuntimeError::Cuda)?;
        self.ctx.bind_to_thread().map_err(cuda_err)?;
        let s = stream.cu_stream();
        // SAFETY: the stream is live; the symbols were checked when the device opened.
        unsafe {
            sys::cuStreamBeginCapture_v2(
                s,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .result()
        .map_err(cuda_err)?;
        let enqueued = enqueue();
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: the capture begun above is ended on the same stream, whatever `enqueue` did.
        let ended = unsafe { sys::cuStreamEndCapture(s, &mut graph) }.result();
        let destroy = |g: sys::CUgraph| {
            if !g.is_null() {
                // SAFETY: `g` came from cuStreamEndCapture and is destroyed once, here.
                unsafe { sys::cuGraphDestroy(g) };
            }
        };
        if let Err(e) = enqueued {
            destroy(graph);
            return Err(e);
        }
        if let Err(e) = ended {
            destroy(graph);
            return Err(cuda_err(format!("cuStreamEndCapture: {e}")));
        }
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: `graph` is the captured graph; `exec` receives its executable form.
        if let Err(e) = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) }.result() {
            destroy(graph);
            return Err(cuda_err(format!("cuGraphInstantiateWithFlags: {e}")));
        }
        Ok(CudaGraphExec {
            stream: stream.clone(),
            graph,
            exec,
        })
    }
}

/// The host function of [`CudaDevice::hold`]: waits for the release on the driver's thread.
unsafe extern "C" fn release_hold(data: *mut std::ffi::c_void) {
    // SAFETY: `data` is the Box `hold` leaked for this callback, which runs once.
    let wait = unsafe { Box::from_raw(data.cast::<HoldWait>()) };
    wait.wait();
}
