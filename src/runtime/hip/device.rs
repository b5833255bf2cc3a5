//! An AMD GPU (or HIP's NVIDIA platform) opened through the HIP runtime: the device query, its
//! launch limits, and the typed operations the [`Backend`](crate::runtime::backend::Backend)
//! impl calls.

use std::ffi::{c_int, c_void, CStr, CString};
use std::ptr;
use std::sync::{Arc, OnceLock};

use super::api::{
    Err, Handle, HipLibraries, Runtime, STREAM_CAPTURE_MODE_THREAD_LOCAL, STREAM_NON_BLOCKING,
};
use super::handles::{HipBuffer, HipEvent, HipFunction, HipGraphExec, HipModule, HipStream};
use crate::arch::LaunchLimits;
use crate::runtime::backend::{LaunchConfig, SharedLimits};
use crate::runtime::error::RuntimeError;
use crate::runtime::hiprtc::Hiprtc;
use crate::runtime::hold::HoldWait;

/// The full target id (`gfx90a:sramecc+:xnack-`) from the device properties. Their layout
/// changed between ROCm releases, so the struct is read into an oversized zeroed buffer and the
/// `gcnArchName` field found by its content: the only NUL-terminated string starting with `gfx`.
/// On HIP's NVIDIA platform the field holds the NVIDIA architecture instead, `sm_` and digits
/// with an optional variant letter (`sm_90`, `sm_90a`); an AMD name is preferred where both
/// appear.
fn arch_of(props: &[u8]) -> Option<String> {
    let names = || {
        props
            .split(|&b| b == 0)
            .filter_map(|s| std::str::from_utf8(s).ok())
    };
    names()
        .find(|s| s.starts_with("gfx") && s.len() > 3 && s.len() < 64)
        .or_else(|| names().find(|s| is_nvidia_arch(s)))
        .map(str::to_string)
}

/// `sm_` then two or three digits and at most one lowercase variant letter.
fn is_nvidia_arch(s: &str) -> bool {
    let Some(rest) = s.strip_prefix("sm_") else {
        return false;
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let variant = &rest.as_bytes()[digits..];
    (2..=3).contains(&digits)
        && (variant.is_empty() || (variant.len() == 1 && variant[0].is_ascii_lowercase()))
}

fn count(rt: &Runtime) -> Result<usize, String> {
    // SAFETY: hipInit takes flags 0; hipGetDeviceCount writes one int through a valid pointer.
    let code = unsafe { (rt.api.init)(0) };
    if code != 0 {
        return Err(format!(
            "{} loaded, but hipInit failed: {} (no AMD GPU or no amdgpu driver)",
            rt.library,
            rt.message(code)
        ));
    }
    let mut n = 0;
    // SAFETY: the runtime is initialised (above); `n` is a valid out-pointer for one int.
    let code = unsafe { (rt.api.get_device_count)(&mut n) };
    if code != 0 || n <= 0 {
        return Err(format!("{}: no AMD GPU found", rt.library));
    }
    Ok(n as usize)
}

pub struct HipDevice {
    rt: Arc<Runtime>,
    rtc: Hiprtc,
    ordinal: c_int,
    pub name: String,
    /// The full target id, features included.
    pub arch: String,
    pub runtime_version: i32,
    pub driver_version: i32,
    /// Queried at the first launch.
    limits: OnceLock<LaunchLimits>,
    /// Queried at the first launch.
    shared: OnceLock<SharedLimits>,
}

impl std::fmt::Debug for HipDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HipDevice({}, {})", self.name, self.arch)
    }
}

impl HipDevice {
    /// Device `ordinal` of the HIP runtime the environment or the search finds.
    pub fn open(ordinal: usize) -> Result<HipDevice, RuntimeError> {
        HipDevice::open_with(ordinal, &HipLibraries::default())
    }

    /// Device `ordinal` of the HIP runtime and hiprtc `libraries` name.
    pub fn open_with(ordinal: usize, libraries: &HipLibraries) -> Result<HipDevice, RuntimeError> {
        let spec = format!("hip:{ordinal}");
        let no = |reason: String| RuntimeError::NoDevice {
            spec: spec.clone(),
            reason,
        };
        let rt = Runtime::load(libraries.runtime.as_deref()).map_err(no)?;
        let n = count(&rt).map_err(no)?;
        if ordinal >= n {
            return Err(no(format!("{n} HIP GPU(s) present")));
        }
        let mut rtc =
            Hiprtc::load_from(libraries.hiprtc.as_deref()).map_err(|e| no(e.to_string()))?;
        let ord = ordinal as c_int;
        // SAFETY: `ord` is a valid device number (checked above).
        rt.check("hipSetDevice", unsafe { (rt.api.set_device)(ord) })?;
        let mut name = vec![0u8; 256];
        // SAFETY: the buffer holds the 256 bytes the call is told it has.
        rt.check("hipDeviceGetName", unsafe {
            (rt.api.device_get_name)(name.as_mut_ptr().cast(), 256, ord)
        })?;
        let name = CStr::from_bytes_until_nul(&name)
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default();
        // Several times the largest hipDeviceProp_t of any ROCm release.
        let mut props = vec![0u8; 16 * 1024];
        // SAFETY: the buffer is larger than the struct the runtime writes.
        rt.check("hipGetDeviceProperties", unsafe {
            (rt.api.get_device_properties)(props.as_mut_ptr().cast(), ord)
        })?;
        let arch = arch_of(&props).ok_or_else(|| {
            no("the HIP runtime reported no gfx (or sm_) target for this GPU".into())
        })?;
        // HIP's NVIDIA platform: its hiprtc (the same library's) compiles through NVRTC.
        if is_nvidia_arch(&arch) {
            rtc.pair_with_nvidia_runtime(rt.api.init as usize, &rt.library)
                .map_err(|e| no(e.to_string()))?;
        }
        // A GPU the compiler cannot target is no device for us (and hiprtc may abort on it).
        rtc.check_target(&arch).map_err(|e| no(e.to_string()))?;
        let (mut runtime_version, mut driver_version) = (0, 0);
        // SAFETY: both out-pointers are valid.
        unsafe {
            (rt.api.runtime_get_version)(&mut runtime_version);
            (rt.api.driver_get_version)(&mut driver_version);
        }
        Ok(HipDevice {
            rt: Arc::new(rt),
            rtc,
            ordinal: ord,
            name,
            arch,
            runtime_version,
            driver_version,
            limits: OnceLock::new(),
            shared: OnceLock::new(),
        })
    }

    /// The launch limits the runtime reports for this GPU, queried once; any it does not answer
    /// (or answers with a non-positive value) are the limits every target shares.
    pub fn launch_limits(&self) -> LaunchLimits {
        // hipDeviceAttribute_t values (hip_runtime_api.h, the CUDA-compatible block that
        // starts at 0 and has kept its order since ROCm 5.0).
        const MAX_BLOCK_DIM: [c_int; 3] = [26, 27, 28];
        const MAX_GRID_DIM: [c_int; 3] = [29, 30, 31];
        const MAX_THREADS_PER_BLOCK: c_int = 56;
        const MAX_SHARED_MEMORY_PER_BLOCK: c_int = 74;
        *self.limits.get_or_init(|| {
            let p = LaunchLimits::PORTABLE;
            let q = |attr: c_int, fallback: u32| -> u32 {
                let Some(get) = self.rt.api.device_get_attribute else {
                    return fallback;
                };
                let mut v: c_int = 0;
                // SAFETY: `v` receives one int; the ordinal was checked when the device opened.
                let code = unsafe { get(&mut v, attr, self.ordinal) };
                u32::try_from(v)
                    .ok()
                    .filter(|&v| code == 0 && v > 0)
                    .unwrap_or(fallback)
            };
            LaunchLimits {
                grid: [0, 1, 2].map(|i| q(MAX_GRID_DIM[i], p.grid[i])),
                block: [0, 1, 2].map(|i| q(MAX_BLOCK_DIM[i], p.block[i])),
                block_threads: q(MAX_THREADS_PER_BLOCK, p.block_threads),
                shared_bytes: q(MAX_SHARED_MEMORY_PER_BLOCK, p.shared_bytes),
            }
        })
    }

    /// Shared memory (LDS) per block: the default, and what a kernel may opt into
    /// (`hipDeviceAttributeSharedMemPerBlockOptin`, where the runtime answers it and can set
    /// function attributes; else the default alone).
    pub(super) fn shared_limits(&self) -> SharedLimits {
        // hipDeviceAttributeSharedMemPerBlockOptin, in the block of `launch_limits`.
        const SHARED_MEM_PER_BLOCK_OPTIN: c_int = 75;
        *self.shared.get_or_init(|| {
            let default_bytes = self.launch_limits().shared_bytes;
            let api = &self.rt.api;
            let opt_in = match (api.device_get_attribute, api.func_set_attribute) {
                (Some(get), Some(_)) => {
                    let mut v: c_int = 0;
                    // SAFETY: `v` receives one int; the ordinal was checked when the device
                    // opened.
                    let code = unsafe { get(&mut v, SHARED_MEM_PER_BLOCK_OPTIN, self.ordinal) };
                    u32::try_from(v).ok().filter(|_| code == 0).unwrap_or(0)
                }
                _ => 0,
            };
            SharedLimits {
                default_bytes,
                opt_in_bytes: opt_in.max(default_bytes),
            }
        })
    }

    /// Lets `f` use up to `bytes` of dynamic shared memory
    /// (`hipFuncSetAttribute(hipFuncAttributeMaxDynamicSharedMemorySize)`).
    pub(super) fn set_dynamic_shared(
        &self,
        f: &HipFunction,
        bytes: u32,
    ) -> Result<(), RuntimeError> {
        // hipFuncAttributeMaxDynamicSharedMemorySize (hip_runtime_api.h; CUDA's value too).
        const MAX_DYNAMIC_SHARED_MEMORY_SIZE: c_int = 8;
        let Some(set) = self.rt.api.func_set_attribute else {
            return Err(RuntimeError::Hip(format!(
                "{} has no symbol hipFuncSetAttribute",
                self.rt.library
            )));
        };
        let value = c_int::try_from(bytes)
            .map_err(|_| RuntimeError::Hip(format!("{bytes} bytes of shared memory")))?;
        self.bind()?;
        // SAFETY: `f.handle` is a live function of a loaded module (the HipFunction holds it);
        // the attribute and value are plain ints.
        self.rt.check("hipFuncSetAttribute", unsafe {
            set(f.handle.cast_const(), MAX_DYNAMIC_SHARED_MEMORY_SIZE, value)
        })
    }

    pub fn library(&self) -> &str {
        &self.rt.library
    }

    pub fn hiprtc(&self) -> &Hiprtc {
        &self.rtc
    }

    /// HIP's current device is per host thread: bind ours before every call.
    fn bind(&self) -> Result<(), RuntimeError> {
        // SAFETY: the ordinal was checked when the device was opened.
        self.rt.check("hipSetDevice", unsafe {
            (self.rt.api.set_device)(self.ordinal)
        })
    }

    /// Compiles a kernel to a code object for this device's target id.
    pub fn compile(
        &self,
        source: &str,
        entry: &str,
        options: &[String],
    ) -> Result<Vec<u8>, RuntimeError> {
        Ok(self.rtc.compile(source, entry, &self.arch, options)?)
    }

    pub fn load(&self, image: &[u8], entry: &str) -> Result<HipFunction, RuntimeError> {
        self.bind()?;
        let mut module: Handle = ptr::null_mut();
        // SAFETY: `image` is a complete code object (hiprtc output, a checksummed cache entry,
        // or a replay bundle's, which the bounds-checked ELF reader parsed first).
        self.rt.check("hipModuleLoadData", unsafe {
            (self.rt.api.module_load_data)(&mut module, image.as_ptr().cast())
        })?;
        let module = Arc::new(HipModule {
            rt: self.rt.clone(),
            handle: module,
        });
        let name = CString::new(entry).map_err(|_| RuntimeError::Hip("NUL in entry".into()))?;
        let mut f: Handle = ptr::null_mut();
        // SAFETY: the module is live and `name` NUL-terminated.
        self.rt.check("hipModuleGetFunction", unsafe {
            (self.rt.api.module_get_function)(&mut f, module.handle, name.as_ptr())
        })?;
        Ok(HipFunction {
            _module: module,
            handle: f,
        })
    }

    pub fn new_stream(&self) -> Result<Arc<HipStream>, RuntimeError> {
        self.bind()?;
        let mut s: Handle = ptr::null_mut();
        // SAFETY: `s` receives a new stream on the bound device.
        self.rt.check("hipStreamCreateWithFlags", unsafe {
            (self.rt.api.stream_create_with_flags)(&mut s, STREAM_NON_BLOCKING)
        })?;
        Ok(Arc::new(HipStream {
            rt: self.rt.clone(),
            ordinal: self.ordinal,
            handle: s,
        }))
    }

    /// `bytes` of device memory (at least one), ordered on `stream`, with whatever it held.
    fn raw_alloc(&self, stream: &Arc<HipStream>, bytes: usize) -> Result<HipBuffer, RuntimeError> {
        self.bind()?;
        let n = bytes.max(1);
        let api = &self.rt.api;
        let mut p: Handle = ptr::null_mut();
        // Memory pools are optional on some GPUs: hipMallocAsync may answer "not supported".
        // SAFETY: `p` receives `n` bytes of device memory on the bound device.
        let stream_ordered = api.stream_ordered.is_some_and(
            |(malloc_async, _)| unsafe { malloc_async(&mut p, n, stream.handle) } == 0,
        );
        if !stream_ordered {
            // SAFETY: as above.
            self.rt
                .check("hipMalloc", unsafe { (api.malloc)(&mut p, n) })?;
        }
        Ok(HipBuffer {
            stream: stream.clone(),
            ptr: p,
            stream_ordered,
        })
    }

    /// `bytes` of device memory, ordered on `stream`, filled with 0xFF (NaN in every float
    /// dtype) when `poison`, else zeros.
    pub fn alloc(
        &self,
        stream: &Arc<HipStream>,
        bytes: usize,
        poison: bool,
    ) -> Result<HipBuffer, RuntimeError> {
        let buf = self.raw_alloc(stream, bytes)?;
        let fill = if poison { 0xFF } else { 0 };
        // SAFETY: the buffer holds max(bytes, 1) bytes; the fill is ordered on the same stream
        // as every use.
        self.rt.check("hipMemsetAsync", unsafe {
            (self.rt.api.memset_async)(buf.ptr, fill, bytes.max(1), stream.handle)
        })?;
        Ok(buf)
    }

    /// A device copy of `data`. The host bytes may be freed as soon as this returns: the stream
    /// is synchronised after the copy (HIP may read pageable memory after an async call returns).
    pub fn upload(&self, stream: &Arc<HipStream>, data: &[u8]) -> Result<HipBuffer, RuntimeError> {
        // Every byte is written by the copy, so no fill first.
        let buf = self.raw_alloc(stream, data.len())?;
        if !data.is_empty() {
            // SAFETY: the buffer holds `data.len()` bytes; `data` lives until the sync below.
            self.rt.check("hipMemcpyHtoDAsync", unsafe {
                (self.rt.api.memcpy_htod_async)(
                    buf.ptr,
                    data.as_ptr().cast(),
                    data.len(),
                    stream.handle,
                )
            })?;
            self.sync(stream)?;
        }
        Ok(buf)
    }

    /// Copies `bytes` of `buf` to the host; complete when this returns.
    pub fn download(
        &self,
        stream: &Arc<HipStream>,
        buf: &HipBuffer,
        bytes: usize,
    ) -> Result<Vec<u8>, RuntimeError> {
        self.bind()?;
        let mut out = vec![0u8; bytes];
        if bytes > 0 {
            // SAFETY: `out` holds `bytes` bytes and the buffer at least as many; the host reads
            // `out` only after the stream is synchronised.
            self.rt.check("hipMemcpyDtoHAsync", unsafe {
                (self.rt.api.memcpy_dtoh_async)(
                    out.as_mut_ptr().cast(),
                    buf.ptr,
                    bytes,
                    stream.handle,
                )
            })?;
        }
        self.sync(stream)?;
        Ok(out)
    }

    /// Launches `f` on `stream` with device pointers `args`.
    pub fn launch(
        &self,
        stream: &Arc<HipStream>,
        f: &HipFunction,
        config: &LaunchConfig,
        args: &[&HipBuffer],
    ) -> Result<(), RuntimeError> {
        let ptrs: Vec<Handle> = args.iter().map(|b| b.ptr).collect();
        self.launch_raw(stream, f.handle, config, &ptrs)
    }

    /// Launches the kernel `f` with the device addresses `args` (one pointer parameter each).
    pub(super) fn launch_raw(
        &self,
        stream: &HipStream,
        f: Handle,
        config: &LaunchConfig,
        args: &[Handle],
    ) -> Result<(), RuntimeError> {
        let (grid, block) = (config.grid, config.block);
        self.bind()?;
        let mut ptrs: Vec<Handle> = args.to_vec();
        let mut params: Vec<*mut c_void> =
            ptrs.iter_mut().map(|p| (p as *mut Handle).cast()).collect();
        // SAFETY: every kernel takes exactly one device pointer per binding, in binding order;
        // `params` points at those pointers, which live until the call returns (HIP copies them);
        // the buffers they address are kept alive by the caller (a buffer or a launch list).
        self.rt.check("hipModuleLaunchKernel", unsafe {
            (self.rt.api.module_launch_kernel)(
                f,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                config.attrs.dynamic_shared_bytes,
                stream.handle,
                params.as_mut_ptr(),
                ptr::null_mut(),
            )
        })
    }

    /// Writes `data` into `buf` at its start, ordered on `stream`; synchronised after the copy
    /// (HIP may read pageable memory after an async call returns), so `data` may go at once.
    pub(super) fn write(
        &self,
        stream: &Arc<HipStream>,
        buf: &HipBuffer,
        data: &[u8],
    ) -> Result<(), RuntimeError> {
        if data.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the caller checked `data.len()` against the buffer's size; `data` lives until
        // the sync below.
        self.rt.check("hipMemcpyHtoDAsync", unsafe {
            (self.rt.api.memcpy_htod_async)(
                buf.ptr,
                data.as_ptr().cast(),
                data.len(),
                stream.handle,
            )
        })?;
        self.sync(stream)
    }

    /// Sets the first `bytes` of `buf` to `byte`, ordered on `stream`.
    pub(super) fn fill(
        &self,
        stream: &Arc<HipStream>,
        buf: &HipBuffer,
        byte: u8,
        bytes: usize,
    ) -> Result<(), RuntimeError> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the caller checked `bytes` against the buffer's size.
        self.rt.check("hipMemsetAsync", unsafe {
            (self.rt.api.memset_async)(buf.ptr, c_int::from(byte), bytes, stream.handle)
        })
    }

    /// Copies the first `bytes` of `src` to `dst`, ordered on `stream`.
    pub(super) fn copy(
        &self,
        stream: &Arc<HipStream>,
        src: &HipBuffer,
        dst: &HipBuffer,
        bytes: usize,
    ) -> Result<(), RuntimeError> {
        if bytes == 0 {
            return Ok(());
        }
        let Some(copy) = self.rt.api.memcpy_dtod_async else {
            return Err(RuntimeError::Hip(format!(
                "{} has no symbol hipMemcpyDtoDAsync",
                self.rt.library
            )));
        };
        self.bind()?;
        // SAFETY: the caller checked `bytes` against both buffers' sizes; both are on this device.
        self.rt.check("hipMemcpyDtoDAsync", unsafe {
            copy(dst.ptr, src.ptr, bytes, stream.handle)
        })
    }

    /// Whether this runtime can capture and replay graphs, else why not.
    pub(super) fn graph_support(&self) -> Result<(), String> {
        self.rt
            .api
            .graphs
            .map(|_| ())
            .map_err(|missing| format!("{} has no symbol {missing}", self.rt.library))
    }

    /// Captures what `enqueue` puts on `stream` (thread-local mode) and instantiates it.
    pub(super) fn capture(
        &self,
        stream: &Arc<HipStream>,
        enqueue: &mut dyn FnMut() -> Result<(), RuntimeError>,
    ) -> Result<HipGraphExec, RuntimeError> {
        let api = self.rt.api.graphs.map_err(|missing| {
            RuntimeError::Hip(format!("{} has no symbol {missing}", self.rt.library))
        })?;
        self.bind()?;
        // SAFETY: the stream is live and on the bound device.
        self.rt.check("hipStreamBeginCapture", unsafe {
            (api.begin_capture)(stream.handle, STREAM_CAPTURE_MODE_THREAD_LOCAL)
        })?;
        let enqueued = enqueue();
        let mut graph: Handle = ptr::null_mut();
        // SAFETY: the capture begun above is ended on the same stream, whatever `enqueue` did.
        let ended = unsafe { (api.end_capture)(stream.handle, &mut graph) };
        let destroy = |g: Handle| {
            if !g.is_null() {
                // SAFETY: `g` came from hipStreamEndCapture and is destroyed once, here.
                unsafe { (api.destroy)(g) };
            }
        };
        if let Err(e) = enqueued {
            destroy(graph);
            return Err(e);
        }
        if let Err(e) = self.rt.check("hipStreamEndCapture", ended) {
            destroy(graph);
            return Err(e);
        }
        let mut exec: Handle = ptr::null_mut();
        // SAFETY: `graph` is the captured graph; no error node or log is asked for.
        let code =
            unsafe { (api.instantiate)(&mut exec, graph, ptr::null_mut(), ptr::null_mut(), 0) };
        if let Err(e) = self.rt.check("hipGraphInstantiate", code) {
            destroy(graph);
            return Err(e);
        }
        Ok(HipGraphExec {
            rt: self.rt.clone(),
            api,
            ordinal: self.ordinal,
            graph,
            exec,
        })
    }

    pub fn sync(&self, stream: &Arc<HipStream>) -> Result<(), RuntimeError> {
        // SAFETY: the stream is live (held by the Arc).
        self.rt.check("hipStreamSynchronize", unsafe {
            (self.rt.api.stream_synchronize)(stream.handle)
        })
    }

    /// An event (timing on: flags 0) recorded on `stream`.
    pub(super) fn mark(&self, stream: &Arc<HipStream>) -> Result<HipEvent, RuntimeError> {
        self.bind()?;
        let mut e: Handle = ptr::null_mut();
        // SAFETY: `e` receives a new event on the bound device.
        self.rt.check("hipEventCreateWithFlags", unsafe {
            (self.rt.api.event_create_with_flags)(&mut e, 0)
        })?;
        let event = HipEvent {
            rt: self.rt.clone(),
            ordinal: self.ordinal,
            handle: e,
        };
        // SAFETY: the event and the stream are live and on this device.
        self.rt.check("hipEventRecord", unsafe {
            (self.rt.api.event_record)(event.handle, stream.handle)
        })?;
        Ok(event)
    }

    /// Holds `stream` here until `wait` ends: a stream callback that blocks on it.
    pub(super) fn hold(&self, stream: &Arc<HipStream>, wait: HoldWait) -> Result<(), RuntimeError> {
        self.bind()?;
        let data = Box::into_raw(Box::new(wait));
        // SAFETY: the stream is live (held by the Arc); `data` is a leaked Box that the callback
        // alone takes back, once; the callback makes no HIP call.
        let code = unsafe {
            (self.rt.api.stream_add_callback)(stream.handle, release_hold, data.cast(), 0)
        };
        if code != 0 {
            // SAFETY: a callback that was not added never runs, so the Box is still ours.
            drop(unsafe { Box::from_raw(data) });
        }
        self.rt.check("hipStreamAddCallback", code)
    }
}

/// The stream callback of [`HipDevice::hold`]: waits for the release on HIP's thread.
unsafe extern "C" fn release_hold(_stream: Handle, _status: Err, data: *mut c_void) {
    // SAFETY: `data` is the Box `hold` leaked for this callback, which runs once.
    let wait = unsafe { Box::from_raw(data.cast::<HoldWait>()) };
    wait.wait();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_is_found_in_any_property_layout() {
        let mut props = vec![0u8; 2048];
        props[..18].copy_from_slice(b"AMD Instinct MI210");
        props[396..418].copy_from_slice(b"gfx90a:sramecc+:xnack-");
        assert_eq!(arch_of(&props).as_deref(), Some("gfx90a:sramecc+:xnack-"));
        let mut other = vec![0u8; 2048];
        other[1200..1207].copy_from_slice(b"gfx1030");
        assert_eq!(arch_of(&other).as_deref(), Some("gfx1030"));
        assert_eq!(arch_of(&[0u8; 64]), None);
    }

    #[test]
    fn an_nvidia_platform_device_reports_its_sm_arch() {
        // hipDeviceProp_tR0600: name at 0, gcnArchName at 1160.
        let mut props = vec![0u8; 2048];
        props[..21].copy_from_slice(b"NVIDIA H100 80GB HBM3");
        props[1160..1165].copy_from_slice(b"sm_90");
        assert_eq!(arch_of(&props).as_deref(), Some("sm_90"));
        props[1160..1166].copy_from_slice(b"sm_90a");
        assert_eq!(arch_of(&props).as_deref(), Some("sm_90a"));
        // An AMD name wins where both appear; text that only starts like an arch is not one.
        props[600..606].copy_from_slice(b"gfx942");
        assert_eq!(arch_of(&props).as_deref(), Some("gfx942"));
        for not_arch in [
            "sm_", "sm_9", "sm_9000", "sm_90ab", "sm_90A", "sm_x0", "sm_90 ",
        ] {
            let mut p = vec![0u8; 64];
            p[8..8 + not_arch.len()].copy_from_slice(not_arch.as_bytes());
            assert_eq!(arch_of(&p), None, "{not_arch:?}");
        }
    }
}
