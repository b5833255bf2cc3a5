//! Kernels compiled and loaded through the device's cache: what `compile` and the tuner share.

use std::sync::Arc;

use crate::arch::Target;
use crate::runtime::device::LoadedKernel;
use crate::runtime::{CacheKey, Device, RuntimeError};

/// The kernel `entry` of `source`, loaded on `device`: from the cache's memory, else its disk
/// store, else compiled now (the cache says which, with the time, at `RUST_LOG=debug`).
pub(super) fn load_kernel(
    device: &Device,
    target: &Target,
    compile_opts: &[String],
    entry: &str,
    source: &str,
) -> Result<Arc<LoadedKernel>, RuntimeError> {
    let key = CacheKey {
        arch: target.arch.clone(),
        wave_size: target.wave_size,
        toolchain: device.toolchain(),
        options: compile_opts.to_vec(),
        entry: entry.to_string(),
        source: source.to_string(),
    };
    device.cache().get(
        &key,
        || device.compile_source(source, entry, compile_opts),
        |image| device.load_kernel(image, entry),
    )
}
