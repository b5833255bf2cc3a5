//! The offline AMD compiler: a system clang (17 or later) with the ROCm device libraries and
//! the HIP headers, next to hiprtc. It compiles the same prelude + kernel source as hiprtc for
//! targets the installed hiprtc does not know (Debian's ROCm 5.2 hiprtc stops at gfx90a and
//! gfx1030; clang-19 compiles gfx942, gfx1100 and gfx1201), and reports each kernel's occupancy
//! as LLVM computes it (`-Rpass-analysis=kernel-resource-usage`).
//!
//! clang refuses an arch whose `oclc_isa_version_<id>.bc` is missing from the device libraries,
//! and ROCm 5.2 ships none for gfx942, gfx11 or gfx12. That file holds one constant,
//! `__oclc_ISA_version`; for such targets we assemble it with the same clang from a two-line IR
//! module (its value from the arch's table row) into a cache directory that also links every
//! shipped library, and point clang there. Nothing binary is committed.
//!
//! Probing mirrors hiprtc's: a missing clang, lld, device library or header is a typed error
//! that tests turn into a skip with the reason, unless `ROCMFORGE_REQUIRE_CLANG=1`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use thiserror::Error;

use super::amd_metadata::{parse_code_object, KernelResources};
use super::cache::DiskCache;
use crate::arch::{Platform, Target};

/// The oldest clang whose AMDGPU backend knows gfx942.
pub const MIN_CLANG_MAJOR: u32 = 17;

/// Tried in order when `ROCMFORGE_CLANG` is not set: the newest first.
pub const CLANG_CANDIDATES: [&str; 5] = ["clang-20", "clang-19", "clang-18", "clang-17", "clang"];

/// Where distributions put the device libraries (`ROCMFORGE_ROCM_DEVICE_LIBS` overrides).
pub const DEVICE_LIB_DIRS: [&str; 3] = [
    "/usr/lib/x86_64-linux-gnu/amdgcn/bitcode",
    "/usr/lib/amdgcn/bitcode",
    "/opt/rocm/amdgcn/bitcode",
];

/// ROCm roots whose `include/hip/hip_runtime.h` clang can use (`ROCMFORGE_ROCM_PATH`
/// overrides): Debian's libamdhip64-dev installs into /usr.
pub const ROCM_ROOTS: [&str; 2] = ["/usr", "/opt/rocm"];

#[derive(Debug, Error, Clone, PartialEq)]
pub enum AmdClangError {
    #[error("no clang for AMD GPUs: {reason}; install Debian's clang-19, lld-19, rocm-device-libs and libamdhip64-dev, or set ROCMFORGE_CLANG")]
    NotFound { reason: String },
    #[error(
        "{clang} is clang {found}; the offline AMD compiler needs clang {MIN_CLANG_MAJOR} or later"
    )]
    TooOld { clang: String, found: String },
    #[error("{clang} has no ld.lld beside it (install the matching lld, e.g. lld-19)")]
    NoLinker { clang: String },
    #[error("ROCm device libraries (ocml.bc) not found in {tried}; install rocm-device-libs or set ROCMFORGE_ROCM_DEVICE_LIBS")]
    NoDeviceLibs { tried: String },
    #[error("HIP headers (include/hip/hip_runtime.h) not found under {tried}; install libamdhip64-dev or set ROCMFORGE_ROCM_PATH")]
    NoHipHeaders { tried: String },
    #[error("`{arch}` is not an AMD target")]
    NotAmd { arch: String },
    #[error("cannot prepare the device libraries for {arch} in {dir}: {message}")]
    DeviceLibs {
        arch: String,
        dir: String,
        message: String,
    },
    #[error("clang could not compile kernel `{kernel}` for {target}:\n{log}")]
    Compile {
        kernel: String,
        target: String,
        log: String,
    },
    #[error("cannot run {program}: {message}")]
    Run { program: String, message: String },
    #[error("clang's output for {target} lacks kernel `{kernel}`: {what}")]
    Missing {
        kernel: String,
        target: String,
        what: String,
    },
}

/// A located clang with everything it needs for HIP device code.
#[derive(Debug)]
pub struct AmdClang {
    /// The clang executable.
    pub clang: PathBuf,
    /// (major, minor, patch).
    pub version: (u32, u32, u32),
    /// The shipped device-library directory.
    pub device_libs: PathBuf,
    /// The root whose `include/hip` clang reads (`--rocm-path`).
    pub rocm_root: PathBuf,
    /// Where generated device-library directories go.
    cache_dir: PathBuf,
    /// Per arch, the device-library directory to use, once prepared in this process.
    prepared: Mutex<HashMap<String, PathBuf>>,
}

/// One compile: the code object and, per kernel, LLVM's occupancy (waves per SIMD).
#[derive(Clone, Debug, PartialEq)]
pub struct ClangOutput {
    pub code_object: Vec<u8>,
    pub occupancy: Vec<(String, u32)>,
}

fn env_path(key: &str) -> Option<PathBuf> {
    std::env::var_os(key)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

fn run(cmd: &mut Command) -> Result<std::process::Output, AmdClangError> {
    cmd.output().map_err(|e| AmdClangError::Run {
        program: format!("{:?}", cmd.get_program()),
        message: e.to_string(),
    })
}

/// `(major, minor, patch)` from `clang --version` ("... clang version 19.1.7 (...)").
pub fn parse_clang_version(text: &str) -> Option<(u32, u32, u32)> {
    let rest = &text[text.find("clang version ")? + "clang version ".len()..];
    let word = rest.split_whitespace().next()?;
    let mut nums = word
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u32>().ok());
    Some((
        nums.next()??,
        nums.next()??,
        nums.next().flatten().unwrap_or(0),
    ))
}

impl AmdClang {
    /// Finds clang (`ROCMFORGE_CLANG`, else the newest of [`CLANG_CANDIDATES`] on `PATH`), its
    /// lld, the device libraries and the HIP headers.
    pub fn probe() -> Result<AmdClang, AmdClangError> {
        let candidates: Vec<PathBuf> = match env_path("ROCMFORGE_CLANG") {
            Some(p) => vec![p],
            None => CLANG_CANDIDATES.iter().map(PathBuf::from).collect(),
        };
        let mut reasons = Vec::new();
        let mut found = None;
        for c in &candidates {
            match Command::new(c).arg("--version").output() {
                Ok(out) if out.status.success() => {
                    let text = String::from_utf8_lossy(&out.stdout);
                    match parse_clang_version(&text) {
                        Some(v) if v.0 >= MIN_CLANG_MAJOR => {
                            found = Some((c.clone(), v));
                            break;
                        }
                        Some(v) => reasons.push(
                            AmdClangError::TooOld {
                                clang: c.display().to_string(),
                                found: format!("{}.{}.{}", v.0, v.1, v.2),
                            }
                            .to_string(),
                        ),
                        None => reasons.push(format!("{}: unrecognised --version", c.display())),
                    }
                }
                Ok(_) => reasons.push(format!("{}: --version failed", c.display())),
                Err(_) => reasons.push(format!("{}: not found", c.display())),
            }
        }
        let Some((clang, version)) = found else {
            return Err(AmdClangError::NotFound {
                reason: reasons.join("; "),
            });
        };
        // clang links AMD code objects with the ld.lld of its own installation.
        let lld = run(Command::new(&clang).arg("-print-prog-name=ld.lld"))?;
        let lld = PathBuf::from(String::from_utf8_lossy(&lld.stdout).trim());
        if !lld.is_absolute() || !lld.exists() {
            return Err(AmdClangError::NoLinker {
                clang: clang.display().to_string(),
            });
        }
        let lib_dirs: Vec<PathBuf> = match env_path("ROCMFORGE_ROCM_DEVICE_LIBS") {
            Some(p) => vec![p],
            None => DEVICE_LIB_DIRS.iter().map(PathBuf::from).collect(),
        };
        let device_libs = lib_dirs
            .iter()
            .find(|d| d.join("ocml.bc").is_file())
            .cloned()
            .ok_or_else(|| AmdClangError::NoDeviceLibs {
                tried: join_paths(&lib_dirs),
            })?;
        let roots: Vec<PathBuf> = match env_path("ROCMFORGE_ROCM_PATH") {
            Some(p) => vec![p],
            None => ROCM_ROOTS.iter().map(PathBuf::from).collect(),
        };
        let rocm_root = roots
            .iter()
            .find(|r| r.join("include/hip/hip_runtime.h").is_file())
            .cloned()
            .ok_or_else(|| AmdClangError::NoHipHeaders {
                tried: join_paths(&roots),
            })?;
        let cache_dir = DiskCache::default_dir()
            .unwrap_or_else(std::env::temp_dir)
            .join("amd-device-libs");
        Ok(AmdClang {
            clang,
            version,
            device_libs,
            rocm_root,
            cache_dir,
            prepared: Mutex::new(HashMap::new()),
        })
    }

    /// `clang 19.1.7 (/usr/bin/clang-19)`.
    pub fn describe(&self) -> String {
        format!(
            "clang {}.{}.{} ({})",
            self.version.0,
            self.version.1,
            self.version.2,
            self.clang.display()
        )
    }

    /// The device-library directory for `target`: the shipped one when it has the target's
    /// ISA-version library, else a cache directory that links the shipped libraries and adds a
    /// generated one.
    fn device_libs_for(&self, target: &Target) -> Result<PathBuf, AmdClangError> {
        let fail = |dir: &Path, message: String| AmdClangError::DeviceLibs {
            arch: target.arch.clone(),
            dir: dir.display().to_string(),
            message,
        };
        let (Some(file), Some(value)) = (
            target.caps.isa_version_file(),
            target.caps.isa_version_number(),
        ) else {
            return Err(AmdClangError::NotAmd {
                arch: target.arch.clone(),
            });
        };
        if self.device_libs.join(&file).is_file() {
            return Ok(self.device_libs.clone());
        }
        let mut prepared = self
            .prepared
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(dir) = prepared.get(&target.caps.name.to_string()) {
            return Ok(dir.clone());
        }
        // One directory per (clang, shipped libraries): the generated bitcode is clang's.
        let h = crate::ir::fnv1a(
            format!("{}|{}", self.describe(), self.device_libs.display()).as_bytes(),
        );
        let dir = self.cache_dir.join(format!("{h:016x}"));
        let target_file = dir.join(&file);
        if !target_file.is_file() {
            std::fs::create_dir_all(&dir).map_err(|e| fail(&dir, e.to_string()))?;
            link_shipped(&self.device_libs, &dir).map_err(|e| fail(&dir, e))?;
            self.assemble_isa_version(&dir, &file, value)
                .map_err(|e| fail(&dir, e))?;
        }
        prepared.insert(target.caps.name.to_string(), dir.clone());
        Ok(dir)
    }

    /// Writes `dir/file` (atomically: a temporary name, then a rename), the module that
    /// defines `__oclc_ISA_version` as the shipped ones do.
    fn assemble_isa_version(&self, dir: &Path, file: &str, value: u32) -> Result<(), String> {
        let unique = unique_suffix();
        let ll = dir.join(format!("{file}.{unique}.ll"));
        let tmp = dir.join(format!("{file}.{unique}.tmp"));
        let ir = format!(
            "; {file}: the ISA version constant of the ROCm device libraries, which ship no such\n\
             ; file for this processor; assembled by rocmforge.\n\
             target triple = \"amdgcn-amd-amdhsa\"\n\
             @__oclc_ISA_version = linkonce_odr protected local_unnamed_addr addrspace(4) constant i32 {value}, align 4\n"
        );
        std::fs::write(&ll, ir).map_err(|e| e.to_string())?;
        let out = Command::new(&self.clang)
            .args([
                "-x",
                "ir",
                "--target=amdgcn-amd-amdhsa",
                "-nogpulib",
                "-c",
                "-emit-llvm",
            ])
            .arg(&ll)
            .arg("-o")
            .arg(&tmp)
            .output()
            .map_err(|e| e.to_string());
        let _ = std::fs::remove_file(&ll);
        let out = out?;
        if !out.status.success() {
            let _ = std::fs::remove_file(&tmp);
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        std::fs::rename(&tmp, dir.join(file)).map_err(|e| e.to_string())
    }

    /// Compiles HIP source for `target` (an AMD target) into a code object, with LLVM's
    /// occupancy of every kernel in it. `name` names the file and errors.
    pub fn compile(
        &self,
        source: &str,
        name: &str,
        target: &Target,
        options: &[String],
    ) -> Result<ClangOutput, AmdClangError> {
        let (code, log) = self.invoke(source, name, target, options, false)?;
        Ok(ClangOutput {
            code_object: code,
            occupancy: parse_occupancy(&log),
        })
    }

    /// Compiles kernels `(entry, body)` that share one prelude as one translation unit (an
    /// entry names one body: kernels are named by the hash of their bodies), and returns each
    /// kernel's resources and occupancy in order. Each clang run spends most of its time on the HIP headers and the
    /// device libraries, whatever the kernels, so a batch costs about what one kernel does.
    /// When the batch does not compile, the kernels are compiled one by one so that the error
    /// names the kernel at fault.
    pub fn compile_batch(
        &self,
        prelude: &str,
        kernels: &[(&str, &str)],
        target: &Target,
        options: &[String],
    ) -> Result<Vec<(KernelResources, u32)>, AmdClangError> {
        let Some(&(first, _)) = kernels.first() else {
            return Ok(Vec::new());
        };
        // A kernel twice in the list (the same layer twice in a graph) is defined once.
        let mut source = prelude.to_string();
        let mut seen: Vec<&str> = Vec::new();
        for &(entry, body) in kernels {
            if !seen.contains(&entry) {
                seen.push(entry);
                source.push('\n');
                source.push_str(body);
            }
        }
        let out = match self.compile(&source, first, target, options) {
            Ok(out) => out,
            Err(AmdClangError::Compile { .. }) if kernels.len() > 1 => {
                return kernels
                    .iter()
                    .map(|k| {
                        self.compile_batch(prelude, std::slice::from_ref(k), target, options)
                            .map(|mut rows| rows.remove(0))
                    })
                    .collect();
            }
            Err(e) => return Err(e),
        };
        let missing = |kernel: &str, what: String| AmdClangError::Missing {
            kernel: kernel.to_string(),
            target: target.arch.clone(),
            what,
        };
        let info = parse_code_object(&out.code_object)
            .map_err(|e| missing(first, format!("unreadable code object: {e}")))?;
        kernels
            .iter()
            .map(|&(entry, _)| {
                let res = info
                    .kernels
                    .iter()
                    .find(|k| k.name == entry)
                    .ok_or_else(|| missing(entry, "not in the code object".into()))?;
                let occupancy = out
                    .occupancy
                    .iter()
                    .find(|(k, _)| k == entry)
                    .ok_or_else(|| missing(entry, "no resource-usage remark".into()))?;
                Ok((res.clone(), occupancy.1))
            })
            .collect()
    }

    /// The assembly listing of the same compile (to check which instructions a kernel uses).
    pub fn assembly(
        &self,
        source: &str,
        kernel: &str,
        target: &Target,
        options: &[String],
    ) -> Result<String, AmdClangError> {
        let (text, _) = self.invoke(source, kernel, target, options, true)?;
        Ok(String::from_utf8_lossy(&text).into_owned())
    }

    fn invoke(
        &self,
        source: &str,
        kernel: &str,
        target: &Target,
        options: &[String],
        assembly: bool,
    ) -> Result<(Vec<u8>, String), AmdClangError> {
        if target.platform != Platform::Amd {
            return Err(AmdClangError::NotAmd {
                arch: target.arch.clone(),
            });
        }
        let libs = self.device_libs_for(target)?;
        let work = std::env::temp_dir().join(format!("rocmforge-clang-{}", unique_suffix()));
        let fail = |message: String| AmdClangError::Run {
            program: self.clang.display().to_string(),
            message,
        };
        std::fs::create_dir_all(&work).map_err(|e| fail(e.to_string()))?;
        let _cleanup = RemoveOnDrop(work.clone());
        // The kernel name is ours (rf_<family>_<hash>), but keep the file name plain anyway.
        let stem: String = kernel
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let src = work.join(format!("{stem}.hip"));
        let out = work.join(format!("{stem}.{}", if assembly { "s" } else { "co" }));
        std::fs::write(&src, source).map_err(|e| fail(e.to_string()))?;
        let mut cmd = Command::new(&self.clang);
        cmd.args(["-x", "hip", "--cuda-device-only", "--no-gpu-bundle-output"])
            .arg(format!("--offload-arch={}", target.arch))
            .arg(format!("--rocm-path={}", self.rocm_root.display()))
            .arg(format!("--rocm-device-lib-path={}", libs.display()))
            // hiprtc includes the HIP runtime header implicitly; clang does not.
            .args(["-include", "hip/hip_runtime.h"])
            .arg("-Rpass-analysis=kernel-resource-usage")
            .args(options)
            .arg(if assembly { "-S" } else { "-c" })
            .arg(&src)
            .arg("-o")
            .arg(&out);
        let result = run(&mut cmd)?;
        let log = String::from_utf8_lossy(&result.stderr).into_owned();
        if !result.status.success() {
            return Err(AmdClangError::Compile {
                kernel: kernel.to_string(),
                target: target.arch.clone(),
                log,
            });
        }
        let bytes = std::fs::read(&out).map_err(|e| fail(format!("{}: {e}", out.display())))?;
        Ok((bytes, log))
    }
}

fn join_paths(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Unique within this machine for this run: process id and a counter.
fn unique_suffix() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Symlinks every shipped `.bc` into `dir` (already present ones are kept).
fn link_shipped(shipped: &Path, dir: &Path) -> Result<(), String> {
    let entries = std::fs::read_dir(shipped).map_err(|e| format!("{}: {e}", shipped.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.extension().is_none_or(|x| x != "bc") {
            continue;
        }
        let Some(name) = path.file_name() else {
            continue;
        };
        match std::os::unix::fs::symlink(&path, dir.join(name)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("{}: {e}", dir.join(name).display())),
        }
    }
    Ok(())
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Per kernel, `Occupancy [waves/SIMD]` from clang's `kernel-resource-usage` remarks:
/// ```text
/// k.hip:75:1: remark: Function Name: rf_layernorm_fc5888d9eb9b [-Rpass-analysis=kernel-resource-usage]
/// k.hip:75:1: remark:     Occupancy [waves/SIMD]: 8 [-Rpass-analysis=kernel-resource-usage]
/// ```
pub fn parse_occupancy(log: &str) -> Vec<(String, u32)> {
    const TAG: &str = " [-Rpass-analysis=kernel-resource-usage]";
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in log.lines() {
        let Some(body) = line
            .split_once("remark:")
            .and_then(|(_, rest)| rest.strip_suffix(TAG))
        else {
            continue;
        };
        let Some((key, value)) = body.trim().split_once(": ") else {
            continue;
        };
        match key {
            "Function Name" => current = Some(value.trim().to_string()),
            "Occupancy [waves/SIMD]" => {
                if let (Some(k), Ok(v)) = (&current, value.trim().parse()) {
                    out.push((k.clone(), v));
                }
            }
            _ => {}
        }
    }
    out
}

/// The offline compiler's resource report: the code object's VGPRs, AGPRs, SGPRs, LDS,
/// scratch and spills, and LLVM's occupancy, one kernel a line.
pub fn occupancy_table(rows: &[(String, KernelResources, u32)]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<40} {:>5} {:>5} {:>5} {:>7} {:>7} {:>6} {:>6} {:>4} {:>4}  node",
        "kernel", "vgpr", "agpr", "sgpr", "lds B", "scratch", "vspill", "sspill", "wave", "occ"
    );
    for (node, k, occupancy) in rows {
        let _ = writeln!(
            out,
            "{:<40} {:>5} {:>5} {:>5} {:>7} {:>7} {:>6} {:>6} {:>4} {:>4}  %{node}",
            k.name,
            k.vgprs,
            k.agprs,
            k.sgprs,
            k.lds_bytes,
            k.scratch_bytes,
            k.vgpr_spills,
            k.sgpr_spills,
            k.wave_size,
            occupancy
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clang_versions_parse() {
        assert_eq!(
            parse_clang_version("Debian clang version 19.1.7 (3~deb12u1)\nTarget: x86_64"),
            Some((19, 1, 7))
        );
        assert_eq!(
            parse_clang_version("clang version 17.0.0git (https://github.com/llvm)"),
            Some((17, 0, 0))
        );
        assert_eq!(
            parse_clang_version("AMD clang version 18.0.0"),
            Some((18, 0, 0))
        );
        assert_eq!(parse_clang_version("gcc (Debian 12.2.0-14) 12.2.0"), None);
        assert_eq!(parse_clang_version("clang version"), None);
    }

    #[test]
    fn occupancy_comes_from_the_remarks_of_each_kernel() {
        let log = "\
k.hip:75:1: remark: Function Name: rf_a [-Rpass-analysis=kernel-resource-usage]
   75 | extern \"C\" __global__ void rf_a() {
      | ^
k.hip:75:1: remark:     SGPRs: 22 [-Rpass-analysis=kernel-resource-usage]
k.hip:75:1: remark:     Occupancy [waves/SIMD]: 8 [-Rpass-analysis=kernel-resource-usage]
k.hip:80:1: remark: Function Name: rf_b [-Rpass-analysis=kernel-resource-usage]
k.hip:80:1: remark:     Occupancy [waves/SIMD]: 16 [-Rpass-analysis=kernel-resource-usage]
k.hip:80:1: warning: something else
k.hip:81:1: remark:     Occupancy [waves/SIMD]: x [-Rpass-analysis=kernel-resource-usage]
";
        assert_eq!(
            parse_occupancy(log),
            vec![("rf_a".to_string(), 8), ("rf_b".to_string(), 16)]
        );
        assert!(parse_occupancy("").is_empty());
        // A remark before any function name is not attributed to anything.
        assert!(parse_occupancy(
            "x: remark:     Occupancy [waves/SIMD]: 4 [-Rpass-analysis=kernel-resource-usage]"
        )
        .is_empty());
    }
}
