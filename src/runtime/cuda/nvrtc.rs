//! NVRTC: HIP source (with the NVIDIA prelude) compiled to CUBIN for a device, or to PTX for a
//! bundle, on any machine that has the library.

use cudarc::nvrtc::CompileOptions;

use super::library::{probe, NVRTC_SYMBOLS};
use crate::runtime::error::RuntimeError;

/// The architectures this NVRTC compiles for (`[50, 52, ..., 90]`).
pub(super) fn nvrtc_archs() -> Result<Vec<i32>, String> {
    let mut n = 0;
    // SAFETY: NVRTC was probed (nvrtcGetNumSupportedArchs is among NVRTC_SYMBOLS); `n` is a
    // valid out-pointer.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcGetNumSupportedArchs(&mut n) };
    if r != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS || !(0..=4096).contains(&n) {
        return Err(format!("nvrtcGetNumSupportedArchs failed ({r:?})"));
    }
    let mut archs = vec![0; n as usize];
    // SAFETY: `archs` holds the `n` ints NVRTC said it would write.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) };
    if r != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(format!("nvrtcGetSupportedArchs failed ({r:?})"));
    }
    Ok(archs)
}

/// NVRTC on its own, without a GPU or driver: how `--emit bundle` makes PTX for an `sm_*` target
/// on any machine that has the library. Returns NVRTC's version, or why it cannot be used.
pub fn nvrtc_version() -> Result<(i32, i32), RuntimeError> {
    probe("ROCMFORGE_NVRTC_LIBRARY", "nvrtc", &NVRTC_SYMBOLS).map_err(|reason| {
        RuntimeError::NoCompiler {
            what: "NVRTC",
            reason,
        }
    })?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: libnvrtc was probed just above (nvrtcVersion is among NVRTC_SYMBOLS); both
    // out-pointers are valid.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    Ok((major, minor))
}

/// Compiles HIP source (with the NVIDIA prelude) to PTX for `arch` (`sm_90`, `sm_90a`). NVRTC
/// must have been probed ([`nvrtc_version`], or a device opened).
pub fn compile_ptx(
    source: &str,
    entry: &str,
    arch: &str,
    options: &[String],
) -> Result<Vec<u8>, RuntimeError> {
    let opts = CompileOptions {
        arch: Some(Box::leak(arch.to_string().into_boxed_str())),
        options: options.to_vec(),
        ..Default::default()
    };
    let ptx =
        cudarc::nvrtc::compile_ptx_with_opts(source, opts).map_err(|e| RuntimeError::Nvrtc {
            kernel: entry.to_string(),
            target: arch.to_string(),
            log: e.to_string(),
        })?;
    Ok(ptx.to_src().into_bytes())
}

/// Compiles HIP source (with the NVIDIA prelude) to machine code (CUBIN) for the real
/// architecture `arch` (`sm_90`): loading it costs the driver no JIT, so a kernel read from the
/// disk cache is ready at once (PTX would be compiled again by the driver at every load).
pub fn compile_cubin(
    source: &str,
    entry: &str,
    arch: &str,
    options: &[String],
) -> Result<Vec<u8>, RuntimeError> {
    use cudarc::nvrtc::{result, sys};
    use std::ffi::{c_char, CStr, CString};
    let failed = |log: String| RuntimeError::Nvrtc {
        kernel: entry.to_string(),
        target: arch.to_string(),
        log,
    };
    let src = CString::new(source).map_err(|_| failed("the source holds a NUL byte".into()))?;
    let prog = result::create_program(&src, None).map_err(|e| failed(e.to_string()))?;
    let mut opts = vec![format!("--gpu-architecture={arch}")];
    opts.extend(options.iter().cloned());
    // SAFETY: `prog` was created just above and is destroyed once, below; the options are
    // NUL-free strings (ours).
    let compiled = unsafe { result::compile_program(prog, &opts) };
    let out = match compiled {
        Err(e) => {
            // SAFETY: `prog` is valid; the log is a NUL-terminated buffer NVRTC filled.
            let log = unsafe { result::get_program_log(prog) }
                .map(|l| {
                    unsafe { CStr::from_ptr(l.as_ptr()) }
                        .to_string_lossy()
                        .into_owned()
                })
                .unwrap_or_default();
            Err(failed(format!("{e}: {log}")))
        }
        Ok(()) => {
            let mut size = 0usize;
            // SAFETY: `prog` compiled; `size` is a valid out-pointer.
            let r = unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) };
            if r != sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
                Err(failed(format!(
                    "nvrtcGetCUBINSize: {r:?} (is {arch} a real architecture?)"
                )))
            } else {
                let mut cubin = vec![0u8; size];
                // SAFETY: `cubin` holds the `size` bytes NVRTC said it would write.
                let r = unsafe { sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast::<c_char>()) };
                if r == sys::nvrtcResult::NVRTC_SUCCESS {
                    Ok(cubin)
                } else {
                    Err(failed(format!("nvrtcGetCUBIN: {r:?}")))
                }
            }
        }
    };
    // SAFETY: created above, destroyed once.
    unsafe { result::destroy_program(prog) }.ok();
    out
}
