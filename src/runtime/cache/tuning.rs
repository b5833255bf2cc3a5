//! Tuning results per device, beside the kernels in the disk cache's atomic, checksummed store
//! (`<digest>.tune`). An entry is keyed by everything that could make another candidate the
//! fastest or the candidate list another one: the device (full arch with features, wave size,
//! driver and compiler versions, rocmforge's version), the family, the problem, and the
//! checksum of the candidate list; a changed list therefore never reuses a stale choice. An
//! entry that cannot be read back whole is reported (typed) and then rebuilt by the tuner.
//! Without a disk store, results live in memory for the process.

use std::collections::HashMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::disk::{DiskCache, EntryError, TUNING_EXT};
use crate::arch::{Choice, Family, TuneKey, TuneProblem};
use crate::runtime::error::RuntimeError;

/// The device a result was measured on, as the kernel cache keys it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct TuneDevice {
    /// Full arch name with features (`gfx90a:sramecc+:xnack-`, `sm_90`).
    pub arch: String,
    pub wave_size: u32,
    /// Compiler and driver versions ([`Device::toolchain`](crate::runtime::Device::toolchain)).
    pub toolchain: String,
}

/// What a result is stored under.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct TuneCacheKey {
    pub device: TuneDevice,
    pub key: TuneKey,
    /// Checksum of the family's candidate list for the problem.
    pub checksum: u64,
}

impl TuneCacheKey {
    /// A stable 128-bit digest of the key, rocmforge's version included.
    pub fn digest(&self) -> String {
        let text = format!(
            "rocmforge {} tuning\n{}",
            env!("CARGO_PKG_VERSION"),
            serde_json::to_string(self).expect("a tuning key serialises")
        );
        crate::ir::fnv1a_128_hex(text.as_bytes())
    }
}

/// One tuning result: the candidate kept and what each measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TuneRecord {
    pub family: Family,
    pub problem: TuneProblem,
    pub checksum: u64,
    /// The fastest candidate's index in the list.
    pub index: usize,
    /// The fastest candidate, as its configuration reads.
    pub choice: String,
    /// Device time per launch of each candidate, in microseconds (`None`: it failed to compile
    /// or launch).
    pub times_us: Vec<Option<f64>>,
}

impl TuneRecord {
    pub fn choice(&self) -> Choice {
        Choice {
            index: self.index,
            checksum: self.checksum,
        }
    }
}

/// Why a stored result was not used (the tuner then times the candidates again).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum TuneCacheError {
    #[error("tuning entry {file}: {reason}; it is rebuilt")]
    Corrupt { file: String, reason: String },
}

enum Store {
    Disk(DiskCache),
    Memory(Mutex<HashMap<String, TuneRecord>>),
}

pub struct TuneCache {
    store: Store,
}

impl TuneCache {
    /// On `disk` where given, else in memory.
    pub fn new(disk: Option<DiskCache>) -> TuneCache {
        TuneCache {
            store: match disk {
                Some(d) => Store::Disk(d),
                None => Store::Memory(Mutex::new(HashMap::new())),
            },
        }
    }

    /// The stored result for `key`: `Ok(None)` when there is none, an error when an entry is
    /// there but unusable (corrupt, truncated, or not this key's).
    pub fn read(&self, key: &TuneCacheKey) -> Result<Option<TuneRecord>, TuneCacheError> {
        let digest = key.digest();
        let disk = match &self.store {
            Store::Memory(m) => {
                let m = m.lock().unwrap_or_else(|p| p.into_inner());
                return Ok(m.get(&digest).cloned());
            }
            Store::Disk(d) => d,
        };
        let corrupt = |reason: String| TuneCacheError::Corrupt {
            file: disk.entry_path(&digest, TUNING_EXT).display().to_string(),
            reason,
        };
        let payload = match disk.read_entry(&digest, TUNING_EXT) {
            Ok(p) => p,
            Err(EntryError::Missing) => return Ok(None),
            Err(EntryError::Corrupt(reason)) => return Err(corrupt(reason)),
        };
        let record: TuneRecord = serde_json::from_slice(&payload)
            .map_err(|e| corrupt(format!("unreadable record: {e}")))?;
        if record.family != key.key.family
            || record.problem != key.key.problem
            || record.checksum != key.checksum
            || record.times_us.len() <= record.index
        {
            return Err(corrupt("the record does not match its key".into()));
        }
        Ok(Some(record))
    }

    /// Stores `record` under `key` (replacing what was there).
    pub fn write(&self, key: &TuneCacheKey, record: &TuneRecord) -> Result<(), RuntimeError> {
        let digest = key.digest();
        match &self.store {
            Store::Memory(m) => {
                m.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(digest, record.clone());
                Ok(())
            }
            Store::Disk(d) => {
                let payload = serde_json::to_vec(record).expect("a tuning record serialises");
                let problem = record.problem.to_string();
                d.write_entry(
                    &digest,
                    TUNING_EXT,
                    &[
                        &key.device.arch,
                        record.family.name(),
                        &digest,
                        &problem,
                        &record.choice,
                    ],
                    &payload,
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::disk::EntryKind;
    use super::*;
    use crate::arch::TuneMask;
    use crate::ir::DType;

    fn key(checksum: u64) -> TuneCacheKey {
        TuneCacheKey {
            device: TuneDevice {
                arch: "gfx90a:sramecc+:xnack-".into(),
                wave_size: 64,
                toolchain: "hiprtc 6.2, driver 6.2".into(),
            },
            key: TuneKey {
                family: Family::AttentionMma,
                problem: TuneProblem::Attention {
                    dtype: DType::F16,
                    b: 2,
                    hq: 6,
                    hkv: 2,
                    sq: 77,
                    sk: 93,
                    d: 64,
                    dv: 64,
                    causal: true,
                    mask: TuneMask::None,
                    window: None,
                },
            },
            checksum,
        }
    }

    fn record(checksum: u64) -> TuneRecord {
        TuneRecord {
            family: Family::AttentionMma,
            problem: key(checksum).key.problem,
            checksum,
            index: 1,
            choice: "Config { warps: 4 }".into(),
            times_us: vec![Some(12.5), Some(9.0), None],
        }
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "rocmforge-tune-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::remove_dir_all(&dir).ok();
        dir
    }

    #[test]
    fn results_round_trip_survive_a_restart_and_miss_for_another_candidate_list() {
        let dir = scratch("restart");
        let cache = TuneCache::new(Some(DiskCache::new(dir.clone())));
        assert_eq!(cache.read(&key(7)), Ok(None), "nothing stored yet");
        cache.write(&key(7), &record(7)).unwrap();
        assert_eq!(cache.read(&key(7)), Ok(Some(record(7))));
        // A new cache over the same directory (another process) reads it.
        let again = TuneCache::new(Some(DiskCache::new(dir.clone())));
        assert_eq!(again.read(&key(7)), Ok(Some(record(7))));
        assert_eq!(again.read(&key(7)).unwrap().unwrap().choice().index, 1);
        // Another candidate list (checksum), device or problem: a miss.
        assert_eq!(again.read(&key(8)), Ok(None));
        let mut other_device = key(7);
        other_device.device.toolchain = "hiprtc 6.3, driver 6.3".into();
        assert_eq!(again.read(&other_device), Ok(None));
        // `cache ls` lists it as a tuning entry, `cache clear` removes it.
        let listing = DiskCache::new(dir.clone()).list().unwrap();
        assert_eq!(listing.entries.len(), 1);
        let e = &listing.entries[0];
        assert!(e.valid);
        assert_eq!(
            e.kind,
            EntryKind::Tuning {
                family: "attention_mma".into(),
                problem: "f16 b2 h6/2 sq77 sk93 d64/64 causal".into(),
                choice: "Config { warps: 4 }".into(),
            }
        );
        assert_eq!(DiskCache::new(dir.clone()).clear().unwrap().removed, 1);
        assert_eq!(again.read(&key(7)), Ok(None));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_corrupt_or_truncated_entry_is_an_error_and_is_rebuilt() {
        let dir = scratch("corrupt");
        let disk = DiskCache::new(dir.clone());
        let path = disk.entry_path(&key(7).digest(), TUNING_EXT);
        let cache = TuneCache::new(Some(disk));
        cache.write(&key(7), &record(7)).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let mut flipped = bytes.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        for (what, b) in [
            ("a flipped bit", flipped),
            ("truncated", bytes[..bytes.len() / 2].to_vec()),
            ("empty", vec![]),
        ] {
            std::fs::write(&path, &b).unwrap();
            assert!(
                matches!(cache.read(&key(7)), Err(TuneCacheError::Corrupt { .. })),
                "{what}"
            );
            assert!(!DiskCache::new(dir.clone()).list().unwrap().entries[0].valid);
        }
        // A well-formed entry whose record names another key is refused too.
        cache.write(&key(7), &record(9)).unwrap();
        assert!(matches!(
            cache.read(&key(7)),
            Err(TuneCacheError::Corrupt { .. })
        ));
        // Rebuilt: written again, read again.
        cache.write(&key(7), &record(7)).unwrap();
        assert_eq!(cache.read(&key(7)), Ok(Some(record(7))));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn without_a_disk_results_live_in_memory() {
        let cache = TuneCache::new(None);
        cache.write(&key(3), &record(3)).unwrap();
        assert_eq!(cache.read(&key(3)), Ok(Some(record(3))));
        assert_eq!(cache.read(&key(4)), Ok(None));
    }
}
