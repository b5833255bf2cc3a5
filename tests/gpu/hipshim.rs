//! The HIP device path on an NVIDIA GPU: `tests/hipshim/hipshim.c` (the HIP runtime and hiprtc
//! entry points rocmforge loads, over the CUDA driver API and NVRTC) built with the system C
//! compiler, and a `hip:0` device opened through it. This checks rocmforge's HIP runtime
//! plumbing (library loading, entry points, argument marshalling, streams, memory, events,
//! graphs), not AMD hardware or ISA.

use std::path::{Path, PathBuf};
use std::process::Command;

use rocmforge::runtime::{Device, DeviceKind, HipLibraries, KernelCache};

/// Why the shim-backed device is not there: a machine that is no NVIDIA GPU has nothing for
/// the shim to run over (its trials are ignored); a missing C compiler is a reason to ignore
/// them too, except under `ROCMFORGE_REQUIRE_GPU=1`; a shim that fails to build or open is a
/// failure of each.
pub enum Unavailable {
    NotNvidia(String),
    NoCompiler(String),
    Broken(String),
}

/// Why the shim cannot be built here, if `cc` is missing.
pub fn cc_missing() -> Option<String> {
    match Command::new("cc").arg("--version").output() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(NO_CC.to_string()),
        _ => None,
    }
}

const NO_CC: &str = "no system C compiler (`cc`) to build the HIP shim";

/// The shim built in a fresh directory under the system temp dir (removed by [`remove`]).
#[derive(Clone)]
pub struct Shim {
    pub dir: PathBuf,
    pub library: PathBuf,
}

/// Builds the shim with `cc`, only where `main_device` is an NVIDIA GPU: the shim needs its
/// driver.
pub fn build(main_device: &Device) -> Result<Shim, Unavailable> {
    if !matches!(main_device.kind(), DeviceKind::Cuda) {
        return Err(Unavailable::NotNvidia(format!(
            "the HIP shim runs over the CUDA driver, and {} is no NVIDIA GPU",
            main_device.label()
        )));
    }
    compile("device")
}

/// Builds the shim with `cc` into a fresh directory named for `purpose` and this process.
pub fn compile(purpose: &str) -> Result<Shim, Unavailable> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hipshim/hipshim.c");
    let dir = std::env::temp_dir().join(format!(
        "rocmforge-hipshim-{purpose}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir)
        .map_err(|e| Unavailable::Broken(format!("{}: {e}", dir.display())))?;
    let library = dir.join("libhipshim.so");
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-o"])
        .arg(&library)
        .arg(&source)
        .args(["-ldl", "-lpthread"])
        .output();
    let out = match out {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::remove_dir_all(&dir).ok();
            return Err(Unavailable::NoCompiler(NO_CC.into()));
        }
        Err(e) => return Err(Unavailable::Broken(format!("cc: {e}"))),
        Ok(out) => out,
    };
    if !out.status.success() {
        return Err(Unavailable::Broken(format!(
            "cc could not build {}: {}",
            source.display(),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(Shim { dir, library })
}

/// Builds `tests/hipshim/graph_check.c` beside the shim and runs it on the shim: stream
/// capture, hipGraph instantiate and replay, and hiprtc's option translation, driven from C
/// (rocmforge's own replay trials come with sessions). Its output when it fails.
pub fn graph_check(shim: &Shim) -> Result<(), String> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hipshim/graph_check.c");
    let exe = shim.dir.join("graph_check");
    let out = Command::new("cc")
        .args(["-O2", "-Wall", "-Wextra", "-o"])
        .arg(&exe)
        .arg(&source)
        .arg("-ldl")
        .output()
        .map_err(|e| format!("cc: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cc could not build {}: {}",
            source.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let out = Command::new(&exe)
        .arg(&shim.library)
        .output()
        .map_err(|e| format!("{}: {e}", exe.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if out.status.success() && text.trim() == "ok" {
        Ok(())
    } else {
        Err(format!(
            "graph_check: {}{}",
            text,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// `hip:0` through the shim (runtime and hiprtc both), with a kernel cache of its own in
/// memory. Sessions and replay trials on the HIP path open their device here.
pub fn open(shim: &Shim) -> Result<Device, Unavailable> {
    let libraries = HipLibraries {
        runtime: Some(shim.library.clone()),
        hiprtc: Some(shim.library.clone()),
    };
    Device::open_hip(0, &libraries, KernelCache::with_disk(None))
        .map_err(|e| Unavailable::Broken(format!("hip:0 through the shim: {e}")))
}

/// The shim-backed `hip:0` for `main_device`'s machine, or why not.
pub fn device(main_device: &Device) -> (Option<Shim>, Result<Device, Unavailable>) {
    match build(main_device) {
        Ok(shim) => {
            let d = open(&shim);
            (Some(shim), d)
        }
        Err(e) => (None, Err(e)),
    }
}

/// Removes the build directory (the loaded library stays mapped).
pub fn remove(shim: Option<Shim>) {
    if let Some(s) = shim {
        std::fs::remove_dir_all(&s.dir).ok();
    }
}
