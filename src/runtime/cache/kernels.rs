//! The per-device kernel cache in memory: a key is compiled at most once even when many
//! threads ask for it at the same time (the first caller compiles, the others wait on the same
//! cell); behind it the disk store ([`DiskCache`]) and the tuning results ([`TuneCache`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::disk::DiskCache;
use super::key::CacheKey;
use super::tuning::TuneCache;
use crate::runtime::dispatch::LoadedKernel;
use crate::runtime::error::RuntimeError;

type Cell = Arc<OnceLock<Result<Arc<LoadedKernel>, RuntimeError>>>;

pub struct KernelCache {
    cells: Mutex<HashMap<CacheKey, Cell>>,
    compiles: AtomicUsize,
    disk_hits: AtomicUsize,
    disk: Option<DiskCache>,
    /// Tuning results, in the same directory.
    tuning: TuneCache,
}

impl KernelCache {
    /// A cache with the disk store of [`DiskCache::default_dir`] (none if it cannot be used).
    pub fn from_env() -> KernelCache {
        KernelCache::with_disk(DiskCache::default_dir().map(DiskCache::new))
    }

    pub fn with_disk(disk: Option<DiskCache>) -> KernelCache {
        KernelCache {
            cells: Mutex::new(HashMap::new()),
            compiles: AtomicUsize::new(0),
            disk_hits: AtomicUsize::new(0),
            tuning: TuneCache::new(disk.as_ref().map(|d| DiskCache::new(d.dir().to_path_buf()))),
            disk,
        }
    }

    /// The tuning results of this device's kernels (on disk beside them where they are).
    pub fn tuning(&self) -> &TuneCache {
        &self.tuning
    }

    /// Kernels compiled by this cache (not loaded from memory or disk).
    pub fn compiles(&self) -> usize {
        self.compiles.load(Ordering::SeqCst)
    }

    pub fn disk_hits(&self) -> usize {
        self.disk_hits.load(Ordering::SeqCst)
    }

    /// The loaded kernel for `key`: from memory, else from disk, else compiled (once).
    pub fn get(
        &self,
        key: &CacheKey,
        compile: impl FnOnce() -> Result<Vec<u8>, RuntimeError>,
        load: impl Fn(&[u8]) -> Result<LoadedKernel, RuntimeError>,
    ) -> Result<Arc<LoadedKernel>, RuntimeError> {
        let cell = {
            let mut cells = self.cells.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(cells.entry(key.clone()).or_default())
        };
        let start = std::time::Instant::now();
        let ms = || start.elapsed().as_secs_f64() * 1e3;
        if let Some(done) = cell.get() {
            tracing::debug!(entry = %key.entry, "kernel: in memory");
            return done.clone();
        }
        cell.get_or_init(|| {
            if let Some(disk) = &self.disk {
                if let Some(image) = disk.read(key) {
                    if let Ok(k) = load(&image) {
                        self.disk_hits.fetch_add(1, Ordering::SeqCst);
                        tracing::debug!(entry = %key.entry, ms = ms(), "kernel: from disk");
                        return Ok(Arc::new(k));
                    }
                }
            }
            self.compiles.fetch_add(1, Ordering::SeqCst);
            let image = compile()?;
            let kernel = load(&image)?;
            tracing::debug!(entry = %key.entry, ms = ms(), "kernel: compiled");
            if let Some(disk) = &self.disk {
                // A cache that cannot be written only costs a recompile next time.
                let _ = disk.write(key, &image);
            }
            Ok(Arc::new(kernel))
        })
        .clone()
    }
}
