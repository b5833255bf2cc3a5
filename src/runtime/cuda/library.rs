//! The CUDA driver and NVRTC libraries: which entry points rocmforge calls, and the probe that
//! makes sure cudarc will find them (cudarc panics on a missing library or symbol, so both are
//! checked first and a missing one is a typed error).

use crate::runtime::error::RuntimeError;
use crate::runtime::libraries;

pub(super) fn cuda_err(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Cuda(e.to_string())
}

/// The driver entry points rocmforge's path through cudarc calls (device query, primary
/// context, streams and events, stream-ordered memory, modules, launches). cudarc resolves each
/// lazily and panics on one that is missing, so a library lacking any is refused up front.
pub(super) const DRIVER_SYMBOLS: [&str; 27] = [
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuMemAllocAsync",
    "cuMemFreeAsync",
    "cuMemsetD8Async",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuLaunchKernel",
];

/// The driver entry points of timing a run on the device's clock (`timeline`): checked when the
/// device opens, but only a profile needs them, so a driver without them still runs models.
pub(super) const TIMING_SYMBOLS: [&str; 3] = [
    "cuEventSynchronize",
    "cuEventElapsedTime_v2",
    "cuLaunchHostFunc",
];

/// The driver entry points of graph replay (`runtime::graph`): checked when the device opens;
/// a driver without them runs sessions with plain launches and says why.
pub(super) const GRAPH_SYMBOLS: [&str; 6] = [
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
];

/// The driver entry point of the dynamic shared memory opt-in ([`LaunchAttrs`]): checked when
/// the device opens; a driver without it runs every launch within the default limit.
///
/// [`LaunchAttrs`]: crate::runtime::backend::LaunchAttrs
pub(super) const ATTRIBUTE_SYMBOLS: [&str; 1] = ["cuFuncSetAttribute"];

/// The driver entry points of the occupancy query (how many blocks of a persistent kernel can be
/// resident): checked when the device opens; without them a persistent kernel is launched with
/// one block per multiprocessor.
pub(super) const OCCUPANCY_SYMBOLS: [&str; 1] =
    ["cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags"];

/// The driver entry point of launches with attributes (programmatic dependent launch,
/// [`LaunchAttrs::programmatic`]): checked when the device opens; without it every launch is a
/// plain `cuLaunchKernel`.
///
/// [`LaunchAttrs::programmatic`]: crate::runtime::backend::LaunchAttrs::programmatic
pub(super) const LAUNCH_EX_SYMBOLS: [&str; 1] = ["cuLaunchKernelEx"];

/// The NVRTC entry points compilation and the arch check call.
pub(super) const NVRTC_SYMBOLS: [&str; 12] = [
    "nvrtcVersion",
    "nvrtcGetNumSupportedArchs",
    "nvrtcGetSupportedArchs",
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcDestroyProgram",
    "nvrtcGetPTXSize",
    "nvrtcGetPTX",
    "nvrtcGetCUBINSize",
    "nvrtcGetCUBIN",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
];

/// Makes sure the library cudarc will use for `lib` (`cuda`, `nvrtc`) is there and has
/// `symbols`. `env` (`ROCMFORGE_CUDA_LIBRARY`, `ROCMFORGE_NVRTC_LIBRARY`) may name the file:
/// cudarc cannot be told a path (it opens its own list of names), so the named file is loaded
/// and kept loaded first, and then cudarc's own search must resolve to that very object (the
/// dynamic loader matches a loaded library by soname); if it would load another file, the
/// named file would not be the one used, and that is refused with the reason.
pub(super) fn probe(env: &'static str, lib: &str, symbols: &[&str]) -> Result<(), String> {
    let what = format!("lib{lib}");
    let search = libraries::unique(cudarc::get_lib_name_candidates(lib));
    let (library, usual) = match lib {
        "cuda" => ("NVIDIA driver", "libcuda.so.1"),
        _ => ("NVRTC", "libnvrtc.so"),
    };
    let opened = libraries::open(env, &search).map_err(|e| e.describe(library, usual))?;
    opened.require(symbols, &what)?;
    if opened.env.is_some() {
        let ours = opened.address(symbols[0]);
        let name = opened.name.clone();
        // Kept loaded before cudarc's search runs, so the search can find it by soname.
        opened.keep();
        let theirs = search
            .iter()
            .find_map(|c| libraries::open_by_name(c).map(|o| (c, o)));
        match theirs {
            Some((_, o)) if o.address(symbols[0]) == ours => o.keep(),
            Some((c, _)) => {
                return Err(format!(
                    "{env}={name}, but cudarc, which opens {what} by name, would load {c}, \
                     another file; put {name}'s directory first in LD_LIBRARY_PATH instead"
                ))
            }
            None => {
                return Err(format!(
                    "{env}={name}, but cudarc, which opens {what} by name, finds none of its \
                     names ({}); give {name} one of them or put its directory in LD_LIBRARY_PATH",
                    search.join(", ")
                ))
            }
        }
    } else {
        opened.keep();
    }
    Ok(())
}
