//! hiprtc, loaded at run time: no ROCm is needed to build rocmforge, and a machine without it
//! gets a typed error, not a missing-symbol crash. ROCm 6+ ships `libhiprtc.so`; ROCm 5 keeps
//! hiprtc inside `libamdhip64.so`. Error codes differ between platforms, so only success (0) is
//! interpreted; everything else is reported through `hiprtcGetErrorString`.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr;
use std::sync::Mutex;

use libloading::Library;

use super::amd_targets::AmdTargets;
use super::libraries::{self, OpenError};
pub use super::rtc_error::HiprtcError;
use crate::arch::{Platform, Target};

/// Libraries tried in order.
pub const HIPRTC_LIBRARIES: [&str; 4] = [
    "libhiprtc.so.7",
    "libhiprtc.so.6",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
];

/// hiprtc keeps process-wide LLVM state: ROCm 5.2's aborts ("Option 'h' registered more than
/// once") when programs compile on several threads at once. Compiles are serialised here, for
/// every loaded copy, so callers may share a `Hiprtc` across threads freely.
static COMPILE_LOCK: Mutex<()> = Mutex::new(());

type Program = *mut c_void;
type CreateFn = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> c_int;
type CompileFn = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int;
type DestroyFn = unsafe extern "C" fn(*mut Program) -> c_int;
type SizeFn = unsafe extern "C" fn(Program, *mut usize) -> c_int;
type CopyFn = unsafe extern "C" fn(Program, *mut c_char) -> c_int;
type ErrorStringFn = unsafe extern "C" fn(c_int) -> *const c_char;
type VersionFn = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;

/// A loaded hiprtc. The function pointers stay valid as long as `lib` lives, which is as long
/// as this value.
pub struct Hiprtc {
    lib: Library,
    create: CreateFn,
    compile: CompileFn,
    destroy: DestroyFn,
    log_size: SizeFn,
    log: CopyFn,
    code_size: SizeFn,
    code: CopyFn,
    error_string: ErrorStringFn,
    /// The library file that was loaded.
    pub library: String,
    /// hiprtc's own version (major, minor).
    pub version: (i32, i32),
    /// The target ids it accepts; nothing else is handed to it.
    pub targets: AmdTargets,
    /// This hiprtc is HIP's NVIDIA platform: the HIP runtime it came with reported an NVIDIA
    /// GPU (see [`Hiprtc::pair_with_nvidia_runtime`]). It takes NVIDIA architectures only.
    nvidia_platform: bool,
}

impl std::fmt::Debug for Hiprtc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Hiprtc({} v{}.{})",
            self.library, self.version.0, self.version.1
        )
    }
}

impl Hiprtc {
    /// Loads the hiprtc `ROCMFORGE_HIPRTC` names (that file only), else the first of
    /// [`HIPRTC_LIBRARIES`] found, and learns which targets it accepts (see `amd_targets`).
    pub fn load() -> Result<Hiprtc, HiprtcError> {
        Hiprtc::load_from(None)
    }

    /// As [`Hiprtc::load`], but the file at `path` (that one only) where one is given.
    pub fn load_from(path: Option<&std::path::Path>) -> Result<Hiprtc, HiprtcError> {
        let search = HIPRTC_LIBRARIES.map(String::from);
        let opened = match path {
            Some(p) => libraries::open_path(p),
            None => libraries::open("ROCMFORGE_HIPRTC", &search),
        };
        match opened {
            Ok(opened) => Hiprtc::from_library(opened.lib, &opened.name),
            Err(e @ OpenError::NotFound { .. }) => Err(HiprtcError::NotFound { tried: e.tried() }),
            Err(OpenError::Unusable { reason }) => Err(HiprtcError::Unusable { reason }),
        }
    }

    fn from_library(lib: Library, name: &str) -> Result<Hiprtc, HiprtcError> {
        fn sym<T: Copy>(lib: &Library, library: &str, symbol: &str) -> Result<T, HiprtcError> {
            // SAFETY: every symbol is looked up with the signature hiprtc.h declares for it.
            unsafe { lib.get::<T>(symbol.as_bytes()) }
                .map(|s| *s)
                .map_err(|_| HiprtcError::MissingSymbol {
                    library: library.to_string(),
                    symbol: symbol.to_string(),
                })
        }
        let version_fn: VersionFn = sym(&lib, name, "hiprtcVersion")?;
        let (mut major, mut minor) = (0, 0);
        // SAFETY: hiprtcVersion writes two ints through valid pointers.
        unsafe { version_fn(&mut major, &mut minor) };
        let targets = AmdTargets::of(&lib);
        Ok(Hiprtc {
            targets,
            create: sym(&lib, name, "hiprtcCreateProgram")?,
            compile: sym(&lib, name, "hiprtcCompileProgram")?,
            destroy: sym(&lib, name, "hiprtcDestroyProgram")?,
            log_size: sym(&lib, name, "hiprtcGetProgramLogSize")?,
            log: sym(&lib, name, "hiprtcGetProgramLog")?,
            code_size: sym(&lib, name, "hiprtcGetCodeSize")?,
            code: sym(&lib, name, "hiprtcGetCode")?,
            error_string: sym(&lib, name, "hiprtcGetErrorString")?,
            lib,
            library: name.to_string(),
            version: (major, minor),
            nvidia_platform: false,
        })
    }

    fn message(&self, code: c_int) -> String {
        // SAFETY: hiprtcGetErrorString returns a static string (or null) for any code.
        let p = unsafe { (self.error_string)(code) };
        if p.is_null() {
            format!("error {code}")
        } else {
            // SAFETY: non-null results are NUL-terminated static strings.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    }

    fn check(&self, call: &'static str, code: c_int) -> Result<(), HiprtcError> {
        if code == 0 {
            Ok(())
        } else {
            Err(HiprtcError::Call {
                call,
                message: self.message(code),
            })
        }
    }

    /// Whether this hiprtc accepts target id `arch`; the error lists those it does.
    pub fn check_target(&self, arch: &str) -> Result<(), HiprtcError> {
        check_target(&self.targets, self.nvidia_platform, arch)
    }

    /// Marks this hiprtc as HIP's NVIDIA platform, for a HIP runtime (whose `hipInit` is at
    /// `runtime_init`) that reported an NVIDIA architecture for its device. Only the hiprtc of
    /// that same library qualifies: HIP's NVIDIA platform pairs the two, whereas a hiprtc found
    /// apart from it may be AMD's, which aborts on an `sm_` target.
    pub(crate) fn pair_with_nvidia_runtime(
        &mut self,
        runtime_init: usize,
        runtime: &str,
    ) -> Result<(), HiprtcError> {
        // SAFETY: the symbol is read as an address only, never called or dereferenced.
        let ours = unsafe { self.lib.get::<*mut c_void>(b"hipInit") }
            .ok()
            .map(|s| *s as usize);
        if ours != Some(runtime_init) {
            return Err(HiprtcError::Unusable {
                reason: format!(
                    "the HIP runtime {runtime} reports an NVIDIA GPU (HIP's NVIDIA platform), \
                     but hiprtc {} is not from that library; name it as the hiprtc too",
                    self.library
                ),
            });
        }
        self.nvidia_platform = true;
        Ok(())
    }

    /// Compiles HIP source for `arch` (a full target id such as `gfx90a:sramecc+:xnack-`) and
    /// returns the code object. A compile error carries the kernel name, target and log. A
    /// target this hiprtc does not accept is refused before hiprtc sees it (ROCm 5.2's aborts
    /// the process on one).
    pub fn compile(
        &self,
        source: &str,
        kernel: &str,
        arch: &str,
        options: &[String],
    ) -> Result<Vec<u8>, HiprtcError> {
        self.check_target(arch)?;
        let nul = |s: &str| CString::new(s.replace('\0', "")).expect("NULs removed");
        let (src, file) = (nul(source), nul(&format!("{kernel}.hip")));
        let mut opts: Vec<CString> = vec![nul(&format!("--gpu-architecture={arch}"))];
        opts.extend(options.iter().map(|o| nul(o)));
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let _serial = COMPILE_LOCK
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut prog: Program = ptr::null_mut();
        // SAFETY: valid NUL-terminated strings, no headers; `prog` receives a new program.
        self.check("hiprtcCreateProgram", unsafe {
            (self.create)(
                &mut prog,
                src.as_ptr(),
                file.as_ptr(),
                0,
                ptr::null(),
                ptr::null(),
            )
        })?;
        let guard = ProgramGuard { rtc: self, prog };
        // SAFETY: `prog` is live; the option pointers outlive the call.
        let status =
            unsafe { (self.compile)(guard.prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
        if status != 0 {
            let log = guard
                .read(self.log_size, self.log, "hiprtcGetProgramLog")
                .map(|b| {
                    String::from_utf8_lossy(&b)
                        .trim_end_matches('\0')
                        .to_string()
                });
            return Err(HiprtcError::Compile {
                kernel: kernel.to_string(),
                target: arch.to_string(),
                log: log.unwrap_or_else(|e| e.to_string())
                    + &format!("\n({})", self.message(status)),
            });
        }
        guard.read(self.code_size, self.code, "hiprtcGetCode")
    }
}

/// Whether a hiprtc whose AMD target list is `targets` may be handed `arch`.
///
/// AMD's hiprtc takes the AMD target ids on its list and nothing else: it aborts on others,
/// `sm_90` included. HIP's NVIDIA platform (`nvidia_platform`: the hiprtc of a HIP runtime
/// that reported an NVIDIA GPU) compiles through NVRTC and takes the NVIDIA architectures our
/// target tables know, and no AMD ones; the AMD list (whatever comgr the machine has) says
/// nothing about it.
fn check_target(
    targets: &AmdTargets,
    nvidia_platform: bool,
    arch: &str,
) -> Result<(), HiprtcError> {
    if !nvidia_platform {
        return targets.check(arch);
    }
    match Target::parse(arch) {
        Ok(t) if t.platform == Platform::Nvidia => Ok(()),
        _ => Err(HiprtcError::UnsupportedTarget {
            target: arch.to_string(),
            reason: "HIP's NVIDIA platform compiles NVIDIA architectures only".into(),
            supported: "the sm_ architectures of rocmforge's target tables".into(),
        }),
    }
}

/// Destroys the program however compilation ends.
struct ProgramGuard<'a> {
    rtc: &'a Hiprtc,
    prog: Program,
}

impl ProgramGuard<'_> {
    fn read(
        &self,
        size_fn: SizeFn,
        copy_fn: CopyFn,
        call: &'static str,
    ) -> Result<Vec<u8>, HiprtcError> {
        let mut n = 0usize;
        // SAFETY: `prog` is live and `n` is a valid out-pointer.
        self.rtc
            .check(call, unsafe { size_fn(self.prog, &mut n) })?;
        let mut buf = vec![0u8; n];
        if n > 0 {
            // SAFETY: `buf` holds exactly the `n` bytes hiprtc reported.
            self.rtc
                .check(call, unsafe { copy_fn(self.prog, buf.as_mut_ptr().cast()) })?;
        }
        Ok(buf)
    }
}

impl Drop for ProgramGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: `prog` was created by hiprtcCreateProgram and is destroyed once, here.
        unsafe { (self.rtc.destroy)(&mut self.prog) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::amd_targets::ROCM_5_2;

    #[test]
    fn nvidia_targets_go_only_to_the_nvidia_platform_hiprtc() {
        // Whatever comgr the machine has (here ROCm 5.2's list), the paired hiprtc of a HIP
        // runtime that reported an NVIDIA GPU takes NVIDIA architectures and nothing else.
        let amd_list = AmdTargets::from_table("the table for ROCm 5.2", &ROCM_5_2);
        let none = AmdTargets {
            source: "no comgr".into(),
            processors: vec![],
        };
        for targets in [&amd_list, &none] {
            for ok in ["sm_90", "sm_90a", "sm_80", "sm_120"] {
                assert_eq!(check_target(targets, true, ok), Ok(()), "{ok}");
            }
            for bad in ["gfx90a", "sm_91", "sm_9x", "sm_90:xnack+", ""] {
                match check_target(targets, true, bad) {
                    Err(HiprtcError::UnsupportedTarget { reason, .. }) => {
                        assert!(reason.contains("NVIDIA architectures only"), "{reason}")
                    }
                    other => panic!("{bad:?}: {other:?}"),
                }
            }
        }
        // AMD's hiprtc (ROCm 5.2's aborts on `sm_90`) is never handed one, list or not.
        for targets in [&amd_list, &none] {
            assert!(check_target(targets, false, "sm_90").is_err());
        }
        assert_eq!(
            check_target(&amd_list, false, "gfx90a:sramecc+:xnack-"),
            Ok(())
        );
    }
}
