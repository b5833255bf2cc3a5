//! Which AMD target ids the loaded hiprtc accepts, checked before it is handed one.
//!
//! ROCm 5.2's hiprtc aborts the whole process inside comgr ("munmap_chunk(): invalid pointer")
//! when given a processor it does not know (gfx940, gfx1100, gfx9999, `sm_90`, text with spaces)
//! or a feature its processor lacks (`gfx1030:xnack+`, `gfx90a:foo+`); only a repeated feature
//! (`gfx90a:sramecc+:sramecc-`) gets an error back. So a target id must be known good first.
//!
//! Where the list comes from, in order:
//! 1. **A probe of the compiler itself.** hiprtc compiles through comgr, which lists the ISAs it
//!    supports (`amd_comgr_get_isa_count`/`_name`) and validates a full target id without
//!    compiling (`amd_comgr_get_isa_metadata` fails for an unknown processor or feature; on
//!    ROCm 5.2 it agrees with hiprtc on every processor × feature combination). rocmforge asks
//!    it which of `xnack` and `sramecc` each processor takes. The comgr already loaded in the
//!    process (by hiprtc) is preferred; else the one hiprtc's ROCm generation loads by name.
//! 2. **A known table per compiler version** where no comgr can be loaded: [`ROCM_5_2`], the
//!    probe's answer on ROCm 5.2 (Debian's libamdhip64-5), keyed by the HIP runtime version the
//!    hiprtc library reports. A version without a table supports nothing: refusing is better
//!    than risking an abort.
//!
//! Target ids follow LLVM's grammar: a processor, then `:feature+` or `:feature-` for each
//! feature at most once.

use std::ffi::{c_char, c_int, CStr, CString};

use libloading::Library;

use super::rtc_error::HiprtcError;

/// One processor and the target features it takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Processor {
    pub name: String,
    pub xnack: bool,
    pub sramecc: bool,
}

/// comgr's answer on ROCm 5.2 (HIP runtime 5.2, comgr 2.4): processor, xnack, sramecc.
pub const ROCM_5_2: [Row; 33] = [
    ("gfx600", false, false),
    ("gfx601", false, false),
    ("gfx602", false, false),
    ("gfx700", false, false),
    ("gfx701", false, false),
    ("gfx702", false, false),
    ("gfx703", false, false),
    ("gfx704", false, false),
    ("gfx705", false, false),
    ("gfx801", true, false),
    ("gfx802", false, false),
    ("gfx803", false, false),
    ("gfx805", false, false),
    ("gfx810", true, false),
    ("gfx900", true, false),
    ("gfx902", true, false),
    ("gfx904", true, false),
    ("gfx906", true, true),
    ("gfx908", true, true),
    ("gfx909", true, false),
    ("gfx90a", true, true),
    ("gfx90c", true, false),
    ("gfx1010", true, false),
    ("gfx1011", true, false),
    ("gfx1012", true, false),
    ("gfx1013", true, false),
    ("gfx1030", false, false),
    ("gfx1031", false, false),
    ("gfx1032", false, false),
    ("gfx1033", false, false),
    ("gfx1034", false, false),
    ("gfx1035", false, false),
    ("gfx1036", false, false),
];

/// A table row: processor, takes xnack, takes sramecc.
type Row = (&'static str, bool, bool);

/// Known tables by HIP runtime version (major, minor).
const TABLES: [((i32, i32), &[Row]); 1] = [((5, 2), &ROCM_5_2)];

/// The target ids one compiler accepts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AmdTargets {
    /// Where the list came from, for messages: "comgr libamd_comgr.so.2", "table for ROCm 5.2",
    /// or why there is none.
    pub source: String,
    pub processors: Vec<Processor>,
}

impl AmdTargets {
    pub fn from_table(source: &str, table: &[Row]) -> AmdTargets {
        AmdTargets {
            source: source.to_string(),
            processors: table
                .iter()
                .map(|&(name, xnack, sramecc)| Processor {
                    name: name.to_string(),
                    xnack,
                    sramecc,
                })
                .collect(),
        }
    }

    /// The targets of the hiprtc in `lib`: comgr's answer, else the table for the HIP runtime
    /// version `lib` reports, else none (with the reason in `source`).
    pub(crate) fn of(lib: &Library) -> AmdTargets {
        if let Some(t) = comgr::probe() {
            return t;
        }
        let version = runtime_version(lib);
        match version.and_then(|v| TABLES.iter().find(|(k, _)| *k == v)) {
            Some(((major, minor), table)) => {
                AmdTargets::from_table(&format!("the table for ROCm {major}.{minor}"), table)
            }
            None => AmdTargets {
                source: format!(
                    "no comgr could be loaded to ask, and there is no table for HIP runtime {}",
                    version.map_or("(unknown version)".to_string(), |(a, b)| format!("{a}.{b}"))
                ),
                processors: vec![],
            },
        }
    }

    /// Every supported target, features included (`gfx90a[:sramecc±][:xnack±]`).
    pub fn supported(&self) -> String {
        if self.processors.is_empty() {
            return format!("none known: {}", self.source);
        }
        let list: Vec<String> = self
            .processors
            .iter()
            .map(|p| {
                let mut s = p.name.clone();
                if p.sramecc {
                    s.push_str("[:sramecc±]");
                }
                if p.xnack {
                    s.push_str("[:xnack±]");
                }
                s
            })
            .collect();
        format!("{} (from {})", list.join(", "), self.source)
    }

    /// `target` is a target id this compiler accepts, or a typed error saying why not and
    /// listing those it does.
    pub fn check(&self, target: &str) -> Result<(), HiprtcError> {
        self.reason(target).map_or(Ok(()), |reason| {
            Err(HiprtcError::UnsupportedTarget {
                target: target.to_string(),
                reason,
                supported: self.supported(),
            })
        })
    }

    fn reason(&self, target: &str) -> Option<String> {
        let mut parts = target.split(':');
        let processor = parts.next().unwrap_or_default();
        if processor.is_empty() {
            return Some("no processor".into());
        }
        let Some(p) = self.processors.iter().find(|p| p.name == processor) else {
            return Some(format!("unknown processor `{processor}`"));
        };
        let mut seen: Vec<&str> = Vec::new();
        for feature in parts {
            let Some(name) = feature.strip_suffix(['+', '-']) else {
                return Some(format!("feature `{feature}` has no + or - sign"));
            };
            let has = match name {
                "xnack" => p.xnack,
                "sramecc" => p.sramecc,
                _ => return Some(format!("unknown feature `{feature}` (xnack±, sramecc±)")),
            };
            if !has {
                return Some(format!("{processor} has no {name} feature"));
            }
            if seen.contains(&name) {
                return Some(format!("feature {name} is given twice"));
            }
            seen.push(name);
        }
        None
    }
}

/// The HIP runtime version a hiprtc library reports, where it has `hipRuntimeGetVersion`
/// (ROCm 5's hiprtc lives in libamdhip64, which does).
fn runtime_version(lib: &Library) -> Option<(i32, i32)> {
    type VersionFn = unsafe extern "C" fn(*mut c_int) -> c_int;
    // SAFETY: looked up with the signature hip_runtime_api.h declares.
    let f = unsafe { lib.get::<VersionFn>(b"hipRuntimeGetVersion") }.ok()?;
    let mut v: c_int = 0;
    // SAFETY: writes one int through a valid pointer; needs no device or initialisation.
    if unsafe { f(&mut v) } != 0 || v <= 0 {
        return None;
    }
    // HIP_VERSION = major * 10_000_000 + minor * 100_000 + patch.
    Some((v / 10_000_000, (v / 100_000) % 100))
}

/// comgr, asked through its C API.
mod comgr {
    use super::*;

    /// comgr sonames: the one ROCm 7 uses, then ROCm 5 and 6.
    const LIBRARIES: [&str; 2] = ["libamd_comgr.so.3", "libamd_comgr.so.2"];
    const ISA_PREFIX: &str = "amdgcn-amd-amdhsa--";

    #[repr(C)]
    #[derive(Clone, Copy)]
    struct MetadataNode {
        handle: u64,
    }

    type CountFn = unsafe extern "C" fn(*mut usize) -> c_int;
    type NameFn = unsafe extern "C" fn(usize, *mut *const c_char) -> c_int;
    type MetadataFn = unsafe extern "C" fn(*const c_char, *mut MetadataNode) -> c_int;
    type DestroyFn = unsafe extern "C" fn(MetadataNode) -> c_int;

    /// The comgr hiprtc uses: one already loaded in the process, else the first that loads.
    fn load() -> Option<(Library, &'static str)> {
        for name in LIBRARIES {
            // SAFETY: RTLD_NOLOAD only returns a library already loaded (by hiprtc); nothing new
            // is initialised.
            let loaded = unsafe {
                libloading::os::unix::Library::open(Some(name), libc::RTLD_NOLOAD | libc::RTLD_LAZY)
            };
            if let Ok(lib) = loaded {
                return Some((lib.into(), name));
            }
        }
        LIBRARIES.iter().rev().find_map(|&name| {
            // SAFETY: comgr's initialisers are safe to run; hiprtc loads this library itself.
            unsafe { Library::new(name) }.ok().map(|l| (l, name))
        })
    }

    pub(super) fn probe() -> Option<AmdTargets> {
        let (lib, name) = load()?;
        // Never unloaded: hiprtc loads this comgr itself, and unloading it would leave its LLVM
        // command-line options registered in libLLVM (which stays loaded), so hiprtc's own load
        // would register them again and abort ("Option 'disassemble' registered more than
        // once").
        let lib = std::mem::ManuallyDrop::new(lib);
        // SAFETY: each symbol is looked up with the signature amd_comgr.h declares for it.
        let (count, isa_name, metadata, destroy) = unsafe {
            (
                *lib.get::<CountFn>(b"amd_comgr_get_isa_count").ok()?,
                *lib.get::<NameFn>(b"amd_comgr_get_isa_name").ok()?,
                *lib.get::<MetadataFn>(b"amd_comgr_get_isa_metadata").ok()?,
                *lib.get::<DestroyFn>(b"amd_comgr_destroy_metadata").ok()?,
            )
        };
        let valid = |isa: &str| {
            let Ok(c) = CString::new(isa) else {
                return false;
            };
            let mut node = MetadataNode { handle: 0 };
            // SAFETY: a NUL-terminated name and a valid out-pointer; a node comgr returns is
            // destroyed once, here.
            unsafe {
                if metadata(c.as_ptr(), &mut node) != 0 {
                    return false;
                }
                destroy(node);
            }
            true
        };
        let mut n = 0usize;
        // SAFETY: writes one size_t through a valid pointer.
        if unsafe { count(&mut n) } != 0 || n > 4096 {
            return None;
        }
        let mut processors = Vec::with_capacity(n);
        for i in 0..n {
            let mut p: *const c_char = std::ptr::null();
            // SAFETY: `i` < the count comgr gave; it writes a pointer to a static string.
            if unsafe { isa_name(i, &mut p) } != 0 || p.is_null() {
                return None;
            }
            // SAFETY: non-null results are NUL-terminated strings owned by comgr.
            let isa = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
            let Some(processor) = isa.strip_prefix(ISA_PREFIX) else {
                continue;
            };
            processors.push(Processor {
                name: processor.to_string(),
                xnack: valid(&format!("{isa}:xnack+")),
                sramecc: valid(&format!("{isa}:sramecc+")),
            });
        }
        Some(AmdTargets {
            source: format!("comgr {name}"),
            processors,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rocm52() -> AmdTargets {
        AmdTargets::from_table("the table for ROCm 5.2", &ROCM_5_2)
    }

    #[test]
    fn target_ids_the_compiler_knows_pass() {
        let t = rocm52();
        for ok in [
            "gfx906",
            "gfx90a",
            "gfx90a:sramecc+:xnack-",
            "gfx90a:xnack-:sramecc+",
            "gfx908:sramecc-",
            "gfx1010:xnack+",
            "gfx1030",
        ] {
            assert_eq!(t.check(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn unknown_processors_and_features_are_refused_with_the_list() {
        let t = rocm52();
        for (bad, why) in [
            ("gfx9999", "unknown processor `gfx9999`"),
            ("gfx940", "unknown processor `gfx940`"),
            ("gfx1100", "unknown processor `gfx1100`"),
            ("sm_9x", "unknown processor `sm_9x`"),
            ("sm_90", "unknown processor `sm_90`"),
            ("", "no processor"),
            (":xnack+", "no processor"),
            ("gfx90a:foo+", "unknown feature `foo+`"),
            ("gfx90a:xnack", "feature `xnack` has no + or - sign"),
            ("gfx90a:", "feature `` has no + or - sign"),
            ("gfx90a:sramecc+:sramecc-", "feature sramecc is given twice"),
            ("gfx1030:xnack+", "gfx1030 has no xnack feature"),
            ("gfx900:sramecc+", "gfx900 has no sramecc feature"),
            ("gfx90a -mllvm -x", "unknown processor `gfx90a -mllvm -x`"),
            ("gfx90a\0", "unknown processor `gfx90a\0`"),
        ] {
            match t.check(bad) {
                Err(HiprtcError::UnsupportedTarget {
                    target,
                    reason,
                    supported,
                }) => {
                    assert_eq!(target, bad);
                    assert!(reason.contains(why), "{bad:?}: {reason}");
                    assert!(
                        supported.contains("gfx90a[:sramecc±][:xnack±]")
                            && supported.contains("gfx1030,"),
                        "{supported}"
                    );
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_compiler_without_a_list_supports_nothing() {
        let none = AmdTargets {
            source: "no comgr".into(),
            processors: vec![],
        };
        let e = none.check("gfx90a").unwrap_err().to_string();
        assert!(e.contains("none known: no comgr"), "{e}");
    }
}
