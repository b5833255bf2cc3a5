//! The per-device kernel cache: keys ([`key`]), the in-memory compile-once table
//! ([`kernels`]), the atomic checksummed disk store ([`disk`]) and the tuning results kept in it
//! ([`tuning`]). The disk store imports nothing else of the cache, so the kernel cache and the
//! tuning store both sit on it without importing each other.

pub mod disk;
pub mod kernels;
pub mod key;
pub mod tuning;

pub use disk::{
    CacheEntryInfo, CacheListing, Cleared, DiskCache, EntryKind, NotRemoved, SkippedEntry,
    CACHE_ENTRY,
};
pub use kernels::KernelCache;
pub use key::CacheKey;
