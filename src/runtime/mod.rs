//! The runtime: devices, run-time compilation, the per-device kernel cache, buffers and
//! streams. The only home of `unsafe` FFI; every unsafe block says why it holds.

pub mod amd_clang;
pub mod amd_compiler;
pub mod amd_metadata;
pub mod amd_targets;
pub mod cache;
pub mod cuda;
pub mod device;
mod error;
pub mod graph;
pub mod hip;
pub mod hiprtc;
mod libraries;
mod memory;
pub mod timeline;
pub mod tune_cache;

pub use amd_clang::{occupancy_table, AmdClang, AmdClangError, ClangOutput};
pub use amd_compiler::{
    amd_compiler_for, hiprtc_knows, hiprtc_rocm_version, AmdCompiler, AmdCompilerChoice,
};
pub use amd_metadata::{
    parse_code_object, report_table, CodeObjectInfo, KernelResources, MetadataError,
};
pub use cache::{
    CacheEntryInfo, CacheKey, CacheListing, Cleared, DiskCache, EntryKind, KernelCache,
    SkippedEntry, CACHE_ENTRY,
};
pub use device::{Device, DeviceBuffer, DeviceKind, DeviceSpec, LoadedKernel, Stream};
pub use error::RuntimeError;
pub use graph::{CapturedGraph, KernelLaunch, LaunchList, ReplayOff};
pub use hip::HipLibraries;
pub use hiprtc::{Hiprtc, HiprtcError};
pub use memory::MemoryCounter;
pub use timeline::{Hold, Marker};
pub use tune_cache::{TuneCache, TuneCacheError, TuneCacheKey, TuneDevice, TuneRecord};
