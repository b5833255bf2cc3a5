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

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::path::PathBuf;
use std::ptr;
use std::sync::{Arc, OnceLock};

use libloading::Library;

use super::hiprtc::Hiprtc;
use super::libraries;
use super::timeline::HoldWait;
use super::RuntimeError;
use crate::arch::LaunchLimits;

/// Runtime libraries tried in order; `ROCMFORGE_HIP_LIBRARY` replaces the search (point it at
/// nothing to keep rocmforge off AMD GPUs).
pub const HIP_LIBRARIES: [&str; 4] = [
    "libamdhip64.so.7",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
    "libamdhip64.so",
];

/// Which files the HIP runtime and hiprtc are loaded from. `None`: the file the environment
/// variable names (`ROCMFORGE_HIP_LIBRARY`, `ROCMFORGE_HIPRTC`), else the usual search. A path
/// given here is that file and no other, whatever the environment says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HipLibraries {
    pub runtime: Option<PathBuf>,
    pub hiprtc: Option<PathBuf>,
}

type Err = c_int;
type Handle = *mut c_void;

/// hipStreamNonBlocking: our streams never wait on the legacy null stream.
const STREAM_NON_BLOCKING: c_uint = 1;

/// `hipStreamCallback_t`: the stream, its status, the user's pointer.
type StreamCallback = unsafe extern "C" fn(Handle, Err, *mut c_void);

/// `hipStreamCaptureModeThreadLocal`: other threads' calls do not break a capture.
const STREAM_CAPTURE_MODE_THREAD_LOCAL: c_int = 1;

/// The graph entry points of replay (`runtime::graph`), with the signatures of
/// `hip_runtime_api.h`; optional as a set: a runtime without them runs sessions with plain
/// launches and says why.
#[derive(Clone, Copy)]
struct GraphApi {
    /// hipStreamBeginCapture(stream, mode)
    begin_capture: unsafe extern "C" fn(Handle, c_int) -> Err,
    /// hipStreamEndCapture(stream, &graph)
    end_capture: unsafe extern "C" fn(Handle, *mut Handle) -> Err,
    /// hipGraphInstantiate(&exec, graph, error node, log buffer, log size)
    instantiate: unsafe extern "C" fn(*mut Handle, Handle, *mut Handle, *mut c_char, usize) -> Err,
    /// hipGraphLaunch(exec, stream)
    launch: unsafe extern "C" fn(Handle, Handle) -> Err,
    /// hipGraphExecDestroy(exec)
    exec_destroy: unsafe extern "C" fn(Handle) -> Err,
    /// hipGraphDestroy(graph)
    destroy: unsafe extern "C" fn(Handle) -> Err,
}

/// The entry points rocmforge uses, with the signatures of `hip_runtime_api.h`.
struct Api {
    init: unsafe extern "C" fn(c_uint) -> Err,
    get_device_count: unsafe extern "C" fn(*mut c_int) -> Err,
    set_device: unsafe extern "C" fn(c_int) -> Err,
    device_get_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> Err,
    get_device_properties: unsafe extern "C" fn(*mut c_void, c_int) -> Err,
    driver_get_version: unsafe extern "C" fn(*mut c_int) -> Err,
    runtime_get_version: unsafe extern "C" fn(*mut c_int) -> Err,
    error_string: unsafe extern "C" fn(Err) -> *const c_char,
    stream_create_with_flags: unsafe extern "C" fn(*mut Handle, c_uint) -> Err,
    stream_destroy: unsafe extern "C" fn(Handle) -> Err,
    stream_synchronize: unsafe extern "C" fn(Handle) -> Err,
    malloc: unsafe extern "C" fn(*mut Handle, usize) -> Err,
    free: unsafe extern "C" fn(Handle) -> Err,
    /// hipMallocAsync and hipFreeAsync, where the runtime has both.
    #[allow(clippy::type_complexity)]
    stream_ordered: Option<(
        unsafe extern "C" fn(*mut Handle, usize, Handle) -> Err,
        unsafe extern "C" fn(Handle, Handle) -> Err,
    )>,
    memset_async: unsafe extern "C" fn(Handle, c_int, usize, Handle) -> Err,
    memcpy_htod_async: unsafe extern "C" fn(Handle, *const c_void, usize, Handle) -> Err,
    memcpy_dtoh_async: unsafe extern "C" fn(*mut c_void, Handle, usize, Handle) -> Err,
    /// hipMemcpyDtoDAsync(dst, src, bytes, stream): optional, only a session's copy of an
    /// output into a caller's buffer needs it.
    memcpy_dtod_async: Option<unsafe extern "C" fn(Handle, Handle, usize, Handle) -> Err>,
    /// Graph capture and replay, where the runtime has every entry point, else the first missing.
    graphs: Result<GraphApi, &'static str>,
    module_load_data: unsafe extern "C" fn(*mut Handle, *const c_void) -> Err,
    module_get_function: unsafe extern "C" fn(*mut Handle, Handle, *const c_char) -> Err,
    module_unload: unsafe extern "C" fn(Handle) -> Err,
    event_create_with_flags: unsafe extern "C" fn(*mut Handle, c_uint) -> Err,
    event_record: unsafe extern "C" fn(Handle, Handle) -> Err,
    event_synchronize: unsafe extern "C" fn(Handle) -> Err,
    event_query: unsafe extern "C" fn(Handle) -> Err,
    event_elapsed_time: unsafe extern "C" fn(*mut f32, Handle, Handle) -> Err,
    event_destroy: unsafe extern "C" fn(Handle) -> Err,
    /// hipStreamAddCallback: HIP 5.2 has no hipLaunchHostFunc.
    stream_add_callback: unsafe extern "C" fn(Handle, StreamCallback, *mut c_void, c_uint) -> Err,
    /// hipDeviceGetAttribute, for the launch limits (optional: without it, the portable ones).
    device_get_attribute: Option<unsafe extern "C" fn(*mut c_int, c_int, c_int) -> Err>,
    #[allow(clippy::type_complexity)]
    module_launch_kernel: unsafe extern "C" fn(
        Handle,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        Handle,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> Err,
}

/// The loaded runtime; the function pointers in `api` live as long as `_lib`.
struct Runtime {
    api: Api,
    _lib: Library,
    library: String,
}

// SAFETY: the HIP runtime is thread-safe; the struct holds only function pointers and the library.
unsafe impl Send for Runtime {}
unsafe impl Sync for Runtime {}

impl Runtime {
    /// The file `path` or else `ROCMFORGE_HIP_LIBRARY` names (that one only), else the first of
    /// [`HIP_LIBRARIES`] that loads; either must export every entry point of [`Api`].
    fn load(path: Option<&std::path::Path>) -> Result<Runtime, String> {
        let search = HIP_LIBRARIES.map(String::from);
        let opened = match path {
            Some(p) => libraries::open_path(p),
            None => libraries::open("ROCMFORGE_HIP_LIBRARY", &search),
        }
        .map_err(|e| e.describe("HIP runtime"))?;
        let label = opened.label();
        Runtime::bind(opened.lib, &opened.name, &label)
    }

    /// `label` names the library in messages (`ROCMFORGE_HIP_LIBRARY=path` when the user chose).
    fn bind(lib: Library, name: &str, label: &str) -> Result<Runtime, String> {
        fn sym<T: Copy>(lib: &Library, symbol: &str) -> Option<T> {
            // SAFETY: each symbol is looked up with the signature hip_runtime_api.h gives it.
            unsafe { lib.get::<T>(symbol.as_bytes()) }.ok().map(|s| *s)
        }
        let need = |symbol: &str| format!("{label} has no symbol {symbol}");
        macro_rules! req {
            ($s:literal) => {
                sym(&lib, $s).ok_or_else(|| need($s))?
            };
        }
        let api = Api {
            init: req!("hipInit"),
            get_device_count: req!("hipGetDeviceCount"),
            set_device: req!("hipSetDevice"),
            device_get_name: req!("hipDeviceGetName"),
            // ROCm 6 renamed the current layout; the scan in `arch_of` reads either.
            get_device_properties: sym(&lib, "hipGetDevicePropertiesR0600")
                .or_else(|| sym(&lib, "hipGetDeviceProperties"))
                .ok_or_else(|| need("hipGetDeviceProperties"))?,
            driver_get_version: req!("hipDriverGetVersion"),
            runtime_get_version: req!("hipRuntimeGetVersion"),
            error_string: req!("hipGetErrorString"),
            stream_create_with_flags: req!("hipStreamCreateWithFlags"),
            stream_destroy: req!("hipStreamDestroy"),
            stream_synchronize: req!("hipStreamSynchronize"),
            malloc: req!("hipMalloc"),
            free: req!("hipFree"),
            stream_ordered: sym(&lib, "hipMallocAsync").zip(sym(&lib, "hipFreeAsync")),
            memset_async: req!("hipMemsetAsync"),
            memcpy_htod_async: req!("hipMemcpyHtoDAsync"),
            memcpy_dtoh_async: req!("hipMemcpyDtoHAsync"),
            memcpy_dtod_async: sym(&lib, "hipMemcpyDtoDAsync"),
            graphs: (|| {
                macro_rules! opt {
                    ($s:literal) => {
                        sym(&lib, $s).ok_or($s)?
                    };
                }
                Ok(GraphApi {
                    begin_capture: opt!("hipStreamBeginCapture"),
                    end_capture: opt!("hipStreamEndCapture"),
                    instantiate: opt!("hipGraphInstantiate"),
                    launch: opt!("hipGraphLaunch"),
                    exec_destroy: opt!("hipGraphExecDestroy"),
                    destroy: opt!("hipGraphDestroy"),
                })
            })(),
            module_load_data: req!("hipModuleLoadData"),
            module_get_function: req!("hipModuleGetFunction"),
            module_unload: req!("hipModuleUnload"),
            event_create_with_flags: req!("hipEventCreateWithFlags"),
            event_record: req!("hipEventRecord"),
            event_synchronize: req!("hipEventSynchronize"),
            event_query: req!("hipEventQuery"),
            event_elapsed_time: req!("hipEventElapsedTime"),
            event_destroy: req!("hipEventDestroy"),
            stream_add_callback: req!("hipStreamAddCallback"),
            device_get_attribute: sym(&lib, "hipDeviceGetAttribute"),
            module_launch_kernel: req!("hipModuleLaunchKernel"),
        };
        Ok(Runtime {
            api,
            _lib: lib,
            library: name.to_string(),
        })
    }

    fn message(&self, code: Err) -> String {
        // SAFETY: hipGetErrorString returns a static NUL-terminated string (or null) for any code.
        let p = unsafe { (self.api.error_string)(code) };
        if p.is_null() {
            format!("error {code}")
        } else {
            // SAFETY: non-null results are static NUL-terminated strings.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    }

    fn check(&self, call: &str, code: Err) -> Result<(), RuntimeError> {
        if code == 0 {
            Ok(())
        } else {
            Err(RuntimeError::Hip(format!("{call}: {}", self.message(code))))
        }
    }
}

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
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        args: &[&HipBuffer],
    ) -> Result<(), RuntimeError> {
        let ptrs: Vec<Handle> = args.iter().map(|b| b.ptr).collect();
        self.launch_raw(stream, f.handle, grid, block, shared, &ptrs)
    }

    /// Launches the kernel `f` with the device addresses `args` (one pointer parameter each).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_raw(
        &self,
        stream: &HipStream,
        f: Handle,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        args: &[Handle],
    ) -> Result<(), RuntimeError> {
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
                shared,
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
        enqueue: impl FnOnce() -> Result<(), RuntimeError>,
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

/// A captured HIP graph and its executable form, destroyed together on drop.
pub struct HipGraphExec {
    rt: Arc<Runtime>,
    api: GraphApi,
    ordinal: c_int,
    graph: Handle,
    exec: Handle,
}

// SAFETY: the handles may move to another thread; the type is not `Sync`, so no two threads
// use them at once (graph objects are not internally synchronised), and they are destroyed
// once, on drop.
unsafe impl Send for HipGraphExec {}

impl HipGraphExec {
    /// Enqueues one replay on `stream`.
    pub(super) fn launch(&self, stream: &HipStream) -> Result<(), RuntimeError> {
        // SAFETY: the ordinal was checked when the device opened; the executable graph is live
        // and the stream on the same device.
        let code = unsafe {
            (self.rt.api.set_device)(self.ordinal);
            (self.api.launch)(self.exec, stream.handle)
        };
        self.rt.check("hipGraphLaunch", code)
    }
}

impl Drop for HipGraphExec {
    fn drop(&mut self) {
        // SAFETY: both handles were made by `capture` and are destroyed once, here.
        unsafe {
            (self.rt.api.set_device)(self.ordinal);
            (self.api.exec_destroy)(self.exec);
            (self.api.destroy)(self.graph);
        }
    }
}

/// A timing event, destroyed on drop.
pub struct HipEvent {
    rt: Arc<Runtime>,
    ordinal: c_int,
    handle: Handle,
}

// SAFETY: HIP events may be used from any thread; the event is destroyed exactly once.
unsafe impl Send for HipEvent {}
unsafe impl Sync for HipEvent {}

/// `hipErrorNotReady`: the event's work is still queued.
const HIP_ERROR_NOT_READY: Err = 600;

impl HipEvent {
    /// Whether the stream has reached this event, without waiting.
    pub fn is_complete(&self) -> Result<bool, RuntimeError> {
        let api = &self.rt.api;
        // SAFETY: the event is live and was recorded on this device.
        let code = unsafe {
            (api.set_device)(self.ordinal);
            (api.event_query)(self.handle)
        };
        if code == HIP_ERROR_NOT_READY {
            return Ok(false);
        }
        self.rt.check("hipEventQuery", code).map(|()| true)
    }

    /// Milliseconds from this event to `end`, once the stream has reached both.
    pub fn elapsed_ms(&self, end: &HipEvent) -> Result<f32, RuntimeError> {
        let api = &self.rt.api;
        // SAFETY: both events are live and were recorded on this device.
        unsafe {
            (api.set_device)(self.ordinal);
            self.rt
                .check("hipEventSynchronize", (api.event_synchronize)(self.handle))?;
            self.rt
                .check("hipEventSynchronize", (api.event_synchronize)(end.handle))?;
        }
        let mut ms = 0.0f32;
        // SAFETY: both events are complete; `ms` is a valid out-pointer.
        self.rt.check("hipEventElapsedTime", unsafe {
            (api.event_elapsed_time)(&mut ms, self.handle, end.handle)
        })?;
        Ok(ms)
    }
}

impl Drop for HipEvent {
    fn drop(&mut self) {
        // SAFETY: created once by hipEventCreateWithFlags, destroyed once here.
        unsafe {
            (self.rt.api.set_device)(self.ordinal);
            (self.rt.api.event_destroy)(self.handle);
        }
    }
}

/// A loaded code object, unloaded when its last function is dropped.
struct HipModule {
    rt: Arc<Runtime>,
    handle: Handle,
}

// SAFETY: HIP modules may be used from any thread.
unsafe impl Send for HipModule {}
unsafe impl Sync for HipModule {}

impl Drop for HipModule {
    fn drop(&mut self) {
        // SAFETY: loaded once by hipModuleLoadData, unloaded once here.
        unsafe { (self.rt.api.module_unload)(self.handle) };
    }
}

/// A kernel of a loaded module; launching it from several threads at once is allowed.
pub struct HipFunction {
    _module: Arc<HipModule>,
    handle: Handle,
}

impl HipFunction {
    /// The raw handle, for launch lists (`runtime::graph`), which keep this function alive.
    pub(super) fn raw(&self) -> *mut c_void {
        self.handle
    }
}

// SAFETY: hipFunction_t is an immutable handle; HIP allows launches from any thread.
unsafe impl Send for HipFunction {}
unsafe impl Sync for HipFunction {}

/// One execution's stream, destroyed when its last buffer is gone.
pub struct HipStream {
    rt: Arc<Runtime>,
    ordinal: c_int,
    handle: Handle,
}

// SAFETY: HIP streams may be used from any thread.
unsafe impl Send for HipStream {}
unsafe impl Sync for HipStream {}

impl Drop for HipStream {
    fn drop(&mut self) {
        // SAFETY: the stream was created on `ordinal` and is destroyed once, here, after every
        // buffer ordered on it (they hold this Arc).
        unsafe {
            (self.rt.api.set_device)(self.ordinal);
            (self.rt.api.stream_destroy)(self.handle);
        }
    }
}

/// Device memory owned by this value, freed on its stream when dropped.
pub struct HipBuffer {
    stream: Arc<HipStream>,
    ptr: Handle,
    /// Allocated with hipMallocAsync, so freed with hipFreeAsync.
    stream_ordered: bool,
}

impl HipBuffer {
    /// The device address, for launch lists (`runtime::graph`), which keep this buffer alive.
    pub(super) fn raw(&self) -> *mut c_void {
        self.ptr
    }
}

// SAFETY: device pointers may be used from any thread; the buffer is freed exactly once.
unsafe impl Send for HipBuffer {}
unsafe impl Sync for HipBuffer {}

impl Drop for HipBuffer {
    fn drop(&mut self) {
        let s = &self.stream;
        let api = &s.rt.api;
        // SAFETY: `ptr` came from hipMalloc(Async) on this device and is freed once, here;
        // stream-ordered, so work queued on the stream that uses it finishes first.
        unsafe {
            (api.set_device)(s.ordinal);
            match api.stream_ordered {
                Some((_, free_async)) if self.stream_ordered => free_async(self.ptr, s.handle),
                _ => (api.free)(self.ptr),
            };
        }
    }
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
