//! Which AMD compiler compiles for a target: hiprtc where the installed one knows the
//! processor (the target's table row says from which ROCm release on), else the offline clang.
//! Asking an older hiprtc for a newer processor is not an error it reports: ROCm 5.2's aborts
//! the process, so the choice is made before calling it.

use std::ffi::c_int;

use libloading::Library;

use super::amd_clang::AmdClang;
use super::hiprtc::Hiprtc;
use crate::arch::{Platform, Target};

/// Which compiler the caller wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AmdCompilerChoice {
    /// hiprtc where it knows the target, else clang.
    Auto,
    Hiprtc,
    Clang,
}

/// A compiler ready for one target.
pub enum AmdCompiler {
    Hiprtc(Hiprtc),
    Clang(AmdClang),
}

/// The ROCm release a loaded hiprtc belongs to: the HIP runtime version of the same library
/// where it has one (ROCm 5 keeps hiprtc inside libamdhip64), else hiprtc's own version, which
/// ROCm 6 and later set to the HIP version (ROCm 5 reported a fixed 9.0, so that is ignored).
pub fn hiprtc_rocm_version(rtc: &Hiprtc) -> Option<(u32, u32)> {
    type RuntimeVersionFn = unsafe extern "C" fn(*mut c_int) -> c_int;
    // SAFETY: the library is the one `rtc` was loaded from, so it is loaded already and
    // opening it again only takes another reference; its initialisers have run.
    if let Ok(lib) = unsafe { Library::new(&rtc.library) } {
        // SAFETY: hipRuntimeGetVersion has this signature in every HIP release.
        if let Ok(f) = unsafe { lib.get::<RuntimeVersionFn>(b"hipRuntimeGetVersion") } {
            let mut v: c_int = 0;
            // SAFETY: it writes one int through a valid pointer; it needs no device.
            if unsafe { f(&mut v) } == 0 && v > 0 {
                // HIP_VERSION = major * 10^7 + minor * 10^5 + patch.
                let v = v as u32;
                return Some((v / 10_000_000, (v / 100_000) % 100));
            }
        }
    }
    match rtc.version {
        (major, minor) if (6..9).contains(&major) && minor >= 0 => {
            Some((major as u32, minor as u32))
        }
        _ => None,
    }
}

/// Whether `rtc` compiles for `target` (an AMD target with a table row saying since when).
pub fn hiprtc_knows(rtc: &Hiprtc, target: &Target) -> bool {
    match (target.caps.hiprtc_since_rocm, hiprtc_rocm_version(rtc)) {
        (Some(since), Some(have)) => have >= since,
        _ => false,
    }
}

/// The compiler for `target` under `choice`, or why there is none (every reason tried). An
/// NVIDIA target has none here: the AMD target lists and ROCm releases say nothing about it
/// (NVRTC compiles it, or hiprtc on HIP's NVIDIA platform through a HIP device).
pub fn amd_compiler_for(target: &Target, choice: AmdCompilerChoice) -> Result<AmdCompiler, String> {
    if target.platform != Platform::Amd {
        return Err(format!(
            "{} is an NVIDIA target: NVRTC compiles it, not an AMD compiler",
            target.arch
        ));
    }
    let hiprtc = || -> Result<AmdCompiler, String> {
        let rtc = Hiprtc::load().map_err(|e| e.to_string())?;
        // The target id must be on hiprtc's own list as well (processor and features).
        rtc.check_target(&target.arch).map_err(|e| e.to_string())?;
        if hiprtc_knows(&rtc, target) {
            return Ok(AmdCompiler::Hiprtc(rtc));
        }
        let have = hiprtc_rocm_version(&rtc)
            .map(|(a, b)| format!("ROCm {a}.{b}"))
            .unwrap_or_else(|| "an unknown ROCm release".into());
        let since = target
            .caps
            .hiprtc_since_rocm
            .map(|(a, b)| format!("ROCm {a}.{b}"))
            .unwrap_or_else(|| "no release".into());
        Err(format!(
            "{} is from {have}; {} needs {since} or later",
            rtc.library, target.caps.name
        ))
    };
    let clang = || {
        AmdClang::probe()
            .map(AmdCompiler::Clang)
            .map_err(|e| e.to_string())
    };
    match choice {
        AmdCompilerChoice::Hiprtc => hiprtc(),
        AmdCompilerChoice::Clang => clang(),
        AmdCompilerChoice::Auto => hiprtc().or_else(|why_not_hiprtc| {
            clang().map_err(|why_not_clang| {
                format!(
                    "no AMD compiler for {}: hiprtc: {why_not_hiprtc}; clang: {why_not_clang}",
                    target.arch
                )
            })
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidia_targets_are_not_asked_of_the_amd_compilers() {
        let sm90 = Target::parse("sm_90").unwrap();
        for choice in [
            AmdCompilerChoice::Auto,
            AmdCompilerChoice::Hiprtc,
            AmdCompilerChoice::Clang,
        ] {
            match amd_compiler_for(&sm90, choice) {
                Err(e) => assert!(e.contains("sm_90 is an NVIDIA target"), "{e}"),
                Ok(_) => panic!("{choice:?}: an AMD compiler for sm_90"),
            }
        }
    }
}
