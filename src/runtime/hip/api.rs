//! The HIP runtime library, loaded at run time: which file, and the entry points rocmforge
//! calls with the signatures of `hip_runtime_api.h`.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::path::PathBuf;

use libloading::Library;

use crate::runtime::error::RuntimeError;
use crate::runtime::libraries;

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

pub(super) type Err = c_int;
pub(super) type Handle = *mut c_void;

/// hipStreamNonBlocking: our streams never wait on the legacy null stream.
pub(super) const STREAM_NON_BLOCKING: c_uint = 1;

/// `hipStreamCallback_t`: the stream, its status, the user's pointer.
pub(super) type StreamCallback = unsafe extern "C" fn(Handle, Err, *mut c_void);

/// `hipStreamCaptureModeThreadLocal`: other threads' calls do not break a capture.
pub(super) const STREAM_CAPTURE_MODE_THREAD_LOCAL: c_int = 1;

/// The graph entry points of replay (`runtime::graph`), with the signatures of
/// `hip_runtime_api.h`; optional as a set: a runtime without them runs sessions with plain
/// launches and says why.
#[derive(Clone, Copy)]
pub(super) struct GraphApi {
    /// hipStreamBeginCapture(stream, mode)
    pub(super) begin_capture: unsafe extern "C" fn(Handle, c_int) -> Err,
    /// hipStreamEndCapture(stream, &graph)
    pub(super) end_capture: unsafe extern "C" fn(Handle, *mut Handle) -> Err,
    /// hipGraphInstantiate(&exec, graph, error node, log buffer, log size)
    pub(super) instantiate:
        unsafe extern "C" fn(*mut Handle, Handle, *mut Handle, *mut c_char, usize) -> Err,
    /// hipGraphLaunch(exec, stream)
    pub(super) launch: unsafe extern "C" fn(Handle, Handle) -> Err,
    /// hipGraphExecDestroy(exec)
    pub(super) exec_destroy: unsafe extern "C" fn(Handle) -> Err,
    /// hipGraphDestroy(graph)
    pub(super) destroy: unsafe extern "C" fn(Handle) -> Err,
}

/// The entry points rocmforge uses, with the signatures of `hip_runtime_api.h`.
pub(super) struct Api {
    pub(super) init: unsafe extern "C" fn(c_uint) -> Err,
    pub(super) get_device_count: unsafe extern "C" fn(*mut c_int) -> Err,
    pub(super) set_device: unsafe extern "C" fn(c_int) -> Err,
    pub(super) device_get_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> Err,
    pub(super) get_device_properties: unsafe extern "C" fn(*mut c_void, c_int) -> Err,
    pub(super) driver_get_version: unsafe extern "C" fn(*mut c_int) -> Err,
    pub(super) runtime_get_version: unsafe extern "C" fn(*mut c_int) -> Err,
    pub(super) error_string: unsafe extern "C" fn(Err) -> *const c_char,
    pub(super) stream_create_with_flags: unsafe extern "C" fn(*mut Handle, c_uint) -> Err,
    pub(super) stream_destroy: unsafe extern "C" fn(Handle) -> Err,
    pub(super) stream_synchronize: unsafe extern "C" fn(Handle) -> Err,
    pub(super) malloc: unsafe extern "C" fn(*mut Handle, usize) -> Err,
    pub(super) free: unsafe extern "C" fn(Handle) -> Err,
    /// hipMallocAsync and hipFreeAsync, where the runtime has both.
    #[allow(clippy::type_complexity)]
    pub(super) stream_ordered: Option<(
        unsafe extern "C" fn(*mut Handle, usize, Handle) -> Err,
        unsafe extern "C" fn(Handle, Handle) -> Err,
    )>,
    pub(super) memset_async: unsafe extern "C" fn(Handle, c_int, usize, Handle) -> Err,
    pub(super) memcpy_htod_async: unsafe extern "C" fn(Handle, *const c_void, usize, Handle) -> Err,
    pub(super) memcpy_dtoh_async: unsafe extern "C" fn(*mut c_void, Handle, usize, Handle) -> Err,
    /// hipMemcpyDtoDAsync(dst, src, bytes, stream): optional, only a session's copy of an
    /// output into a caller's buffer needs it.
    pub(super) memcpy_dtod_async:
        Option<unsafe extern "C" fn(Handle, Handle, usize, Handle) -> Err>,
    /// Graph capture and replay, where the runtime has every entry point, else the first missing.
    pub(super) graphs: Result<GraphApi, &'static str>,
    pub(super) module_load_data: unsafe extern "C" fn(*mut Handle, *const c_void) -> Err,
    pub(super) module_get_function: unsafe extern "C" fn(*mut Handle, Handle, *const c_char) -> Err,
    pub(super) module_unload: unsafe extern "C" fn(Handle) -> Err,
    pub(super) event_create_with_flags: unsafe extern "C" fn(*mut Handle, c_uint) -> Err,
    pub(super) event_record: unsafe extern "C" fn(Handle, Handle) -> Err,
    pub(super) event_synchronize: unsafe extern "C" fn(Handle) -> Err,
    pub(super) event_query: unsafe extern "C" fn(Handle) -> Err,
    pub(super) event_elapsed_time: unsafe extern "C" fn(*mut f32, Handle, Handle) -> Err,
    pub(super) event_destroy: unsafe extern "C" fn(Handle) -> Err,
    /// hipStreamAddCallback: HIP 5.2 has no hipLaunchHostFunc.
    pub(super) stream_add_callback:
        unsafe extern "C" fn(Handle, StreamCallback, *mut c_void, c_uint) -> Err,
    /// hipFuncSetAttribute(function, attribute, value), for the dynamic shared memory opt-in
    /// (optional: without it, every launch stays within the default limit).
    pub(super) func_set_attribute: Option<unsafe extern "C" fn(*const c_void, c_int, c_int) -> Err>,
    /// hipDeviceGetAttribute, for the launch limits (optional: without it, the portable ones).
    pub(super) device_get_attribute: Option<unsafe extern "C" fn(*mut c_int, c_int, c_int) -> Err>,
    #[allow(clippy::type_complexity)]
    pub(super) module_launch_kernel: unsafe extern "C" fn(
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
pub(super) struct Runtime {
    pub(super) api: Api,
    pub(super) _lib: Library,
    pub(super) library: String,
}

// SAFETY: the HIP runtime is thread-safe; the struct holds only function pointers and the library.
unsafe impl Send for Runtime {}
unsafe impl Sync for Runtime {}

impl Runtime {
    /// The file `path` or else `ROCMFORGE_HIP_LIBRARY` names (that one only), else the first of
    /// [`HIP_LIBRARIES`] that loads; either must export every entry point of [`Api`].
    pub(super) fn load(path: Option<&std::path::Path>) -> Result<Runtime, String> {
        let search = HIP_LIBRARIES.map(String::from);
        let opened = match path {
            Some(p) => libraries::open_path(p),
            None => libraries::open("ROCMFORGE_HIP_LIBRARY", &search),
        }
        .map_err(|e| e.describe("HIP runtime", "libamdhip64.so"))?;
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
            func_set_attribute: sym(&lib, "hipFuncSetAttribute"),
            module_launch_kernel: req!("hipModuleLaunchKernel"),
        };
        Ok(Runtime {
            api,
            _lib: lib,
            library: name.to_string(),
        })
    }

    pub(super) fn message(&self, code: Err) -> String {
        // SAFETY: hipGetErrorString returns a static NUL-terminated string (or null) for any code.
        let p = unsafe { (self.api.error_string)(code) };
        if p.is_null() {
            format!("error {code}")
        } else {
            // SAFETY: non-null results are static NUL-terminated strings.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    }

    pub(super) fn check(&self, call: &str, code: Err) -> Result<(), RuntimeError> {
        if code == 0 {
            Ok(())
        } else {
            Err(RuntimeError::Hip(format!("{call}: {}", self.message(code))))
        }
    }
}
