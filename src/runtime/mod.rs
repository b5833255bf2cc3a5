//! The runtime: devices, run-time compilation, the per-device kernel cache, buffers and
//! streams. The only home of `unsafe` FFI; every unsafe block says why it holds.
//!
//! A GPU is a [`backend::Backend`] (`cuda/`, `hip/`), erased once in `dispatch.rs`; `Device`,
//! `Stream`, `DeviceBuffer`, launch lists and markers hold that erased view and never name a
//! vendor. The modules import each other one way only (see `docs/architecture.md`).

pub mod amd_clang;
pub mod amd_compiler;
pub mod amd_metadata;
pub mod amd_targets;
pub mod backend;
mod buffer;
pub mod cache;
pub mod cuda;
pub mod device;
mod dispatch;
mod error;
pub mod graph;
pub mod hip;
pub mod hiprtc;
mod hold;
mod libraries;
mod memory;
mod rtc_error;
mod stream;
pub mod timeline;

/// The tuning store's old path (it lives in the cache now, on the disk store).
pub use cache::tuning as tune_cache;

pub use amd_clang::{occupancy_table, AmdClang, AmdClangError, ClangOutput};
pub use amd_compiler::{
    amd_compiler_for, hiprtc_knows, hiprtc_rocm_version, AmdCompiler, AmdCompilerChoice,
};
pub use amd_metadata::{
    parse_code_object, report_table, CodeObjectInfo, KernelResources, MetadataError,
};
pub use backend::{Backend, LaunchAttrs, LaunchConfig};
pub use cache::tuning::{TuneCache, TuneCacheError, TuneCacheKey, TuneDevice, TuneRecord};
pub use cache::{
    CacheEntryInfo, CacheKey, CacheListing, Cleared, DiskCache, EntryKind, KernelCache, NotRemoved,
    SkippedEntry, CACHE_ENTRY,
};
pub use device::{Device, DeviceBuffer, DeviceKind, DeviceSpec, LoadedKernel, Stream};
pub use error::RuntimeError;
pub use graph::{CapturedGraph, KernelLaunch, LaunchList, ReplayOff};
pub use hip::HipLibraries;
pub use hiprtc::{Hiprtc, HiprtcError};
pub use hold::HoldWait;
pub use memory::MemoryCounter;
pub use timeline::{Hold, Marker};
