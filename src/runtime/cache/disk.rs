//! The on-disk store: entries written atomically (temporary file, then rename) with a checksum;
//! a corrupt or truncated entry is recompiled, never loaded. Kernels (`*.bin`) and tuning
//! results (`*.tune`) share it.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::key::CacheKey;
use crate::ir::file::{self, FileLimit};
use crate::ir::fnv1a;
use crate::runtime::error::RuntimeError;

/// One cache entry on disk, as `rocmforge cache ls` shows it.
#[derive(Clone, Debug)]
pub struct CacheEntryInfo {
    pub file: PathBuf,
    pub bytes: u64,
    pub arch: String,
    /// The kernel's entry point; for a tuning entry, its family.
    pub entry: String,
    pub valid: bool,
    /// A compiled kernel or a tuning result (`?` fields where the entry is corrupt).
    pub kind: EntryKind,
}

/// What an entry holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryKind {
    Kernel,
    Tuning {
        family: String,
        problem: String,
        choice: String,
    },
}

/// File extensions of the two kinds of entry.
pub(super) const KERNEL_EXT: &str = "bin";
pub(super) const TUNING_EXT: &str = "tune";

const MAGIC: &[u8; 8] = b"RFKCACHE";

/// A code object is a few hundred kilobytes; a PTX module a few megabytes.
pub const CACHE_ENTRY: FileLimit = FileLimit {
    what: "kernel cache entry",
    max_bytes: 64 << 20,
};

pub struct DiskCache {
    dir: PathBuf,
}

impl DiskCache {
    pub fn new(dir: PathBuf) -> DiskCache {
        DiskCache { dir }
    }

    /// `ROCMFORGE_CACHE_DIR`, else `$XDG_CACHE_HOME/rocmforge`, else `~/.cache/rocmforge`.
    pub fn default_dir() -> Option<PathBuf> {
        let env = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        env("ROCMFORGE_CACHE_DIR")
            .or_else(|| env("XDG_CACHE_HOME").map(|p| p.join("rocmforge")))
            .or_else(|| env("HOME").map(|p| p.join(".cache/rocmforge")))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub(super) fn entry_path(&self, digest: &str, ext: &str) -> PathBuf {
        self.dir.join(format!("{digest}.{ext}"))
    }

    /// File layout: magic, checksum of the rest (u64), header length (u32), header (arch, entry,
    /// digest, then any more fields; one per line), payload.
    fn encode(header: &[&str], payload: &[u8]) -> Vec<u8> {
        let header = header.join("\n");
        let mut body = Vec::with_capacity(4 + header.len() + payload.len());
        body.extend((header.len() as u32).to_le_bytes());
        body.extend(header.as_bytes());
        body.extend(payload);
        let mut out = MAGIC.to_vec();
        out.extend(fnv1a(&body).to_le_bytes());
        out.extend(body);
        out
    }

    /// Header lines and payload of a well-formed entry.
    fn decode(bytes: &[u8]) -> Option<(Vec<String>, &[u8])> {
        let rest = bytes.strip_prefix(MAGIC)?;
        let (sum, body) = rest.split_at_checked(8)?;
        if u64::from_le_bytes(sum.try_into().ok()?) != fnv1a(body) {
            return None;
        }
        let (len, body) = body.split_at_checked(4)?;
        let len = u32::from_le_bytes(len.try_into().ok()?) as usize;
        let (header, payload) = body.split_at_checked(len)?;
        Some((
            String::from_utf8_lossy(header)
                .lines()
                .map(str::to_string)
                .collect(),
            payload,
        ))
    }

    /// The payload stored for `key`, if its entry is a regular file within [`CACHE_ENTRY`] whose
    /// checksum and digest hold; anything else is a miss (and is replaced when written).
    pub fn read(&self, key: &CacheKey) -> Option<Vec<u8>> {
        self.read_entry(&key.digest(), KERNEL_EXT).ok()
    }

    /// The payload of the entry `digest.ext`, or why there is none usable: missing, not a
    /// regular file within [`CACHE_ENTRY`], a checksum that fails, or another digest inside.
    pub(super) fn read_entry(&self, digest: &str, ext: &str) -> Result<Vec<u8>, EntryError> {
        let path = self.entry_path(digest, ext);
        let bytes = match file::read_limited(&path, CACHE_ENTRY) {
            Ok(b) => b,
            Err(_) if !path.exists() => return Err(EntryError::Missing),
            Err(e) => return Err(EntryError::Corrupt(e.to_string())),
        };
        let (header, payload) = DiskCache::decode(&bytes)
            .ok_or_else(|| EntryError::Corrupt("bad magic, length or checksum".into()))?;
        if header.get(2).map(String::as_str) != Some(digest) {
            return Err(EntryError::Corrupt("the entry holds another key".into()));
        }
        Ok(payload.to_vec())
    }

    pub fn write(&self, key: &CacheKey, payload: &[u8]) -> Result<(), RuntimeError> {
        let digest = key.digest();
        self.write_entry(
            &digest,
            KERNEL_EXT,
            &[&key.arch, &key.entry, &digest],
            payload,
        )
    }

    /// Writes entry `digest.ext` atomically (a temporary file, then a rename); `header` starts
    /// with arch, entry and digest.
    pub(super) fn write_entry(
        &self,
        digest: &str,
        ext: &str,
        header: &[&str],
        payload: &[u8],
    ) -> Result<(), RuntimeError> {
        let err = |e: std::io::Error| RuntimeError::Cache {
            path: self.dir.display().to_string(),
            message: e.to_string(),
        };
        std::fs::create_dir_all(&self.dir).map_err(err)?;
        let tmp = self.dir.join(format!(
            ".tmp-{}-{:?}-{digest}.{ext}",
            std::process::id(),
            std::thread::current().id(),
        ));
        // A fresh file of our own: never opened through whatever else sits at that name (a
        // FIFO there would block a plain open for writing).
        let _ = std::fs::remove_file(&tmp);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .and_then(|mut f| f.write_all(&DiskCache::encode(header, payload)))
            .map_err(err)?;
        std::fs::rename(&tmp, self.entry_path(digest, ext)).map_err(err)
    }

    /// Every entry (`*.bin` kernels, `*.tune` tuning results) in the directory, and every file
    /// so named that rocmforge cannot handle (not a regular file, unreadable, too large) with
    /// the reason. Special files are
    /// classified without being opened, so a FIFO never blocks this. A directory that does not
    /// exist yet is an empty cache.
    pub fn list(&self) -> Result<CacheListing, RuntimeError> {
        let rd = match std::fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(CacheListing::default())
            }
            Err(e) => {
                return Err(RuntimeError::Cache {
                    path: self.dir.display().to_string(),
                    message: e.to_string(),
                })
            }
        };
        let mut listing = CacheListing::default();
        for dirent in rd {
            let dirent = dirent.map_err(|e| RuntimeError::Cache {
                path: self.dir.display().to_string(),
                message: e.to_string(),
            })?;
            let file = dirent.path();
            let tuning = match file.extension().and_then(|x| x.to_str()) {
                Some(KERNEL_EXT) => false,
                Some(TUNING_EXT) => true,
                _ => continue,
            };
            let skip = |reason: String| SkippedEntry {
                file: file.clone(),
                reason,
            };
            // lstat: a symbolic link (a loop included) is reported, never followed; the cache
            // writes none.
            let meta = match std::fs::symlink_metadata(&file) {
                Ok(m) => m,
                Err(e) => {
                    listing.skipped.push(skip(e.to_string()));
                    continue;
                }
            };
            if !meta.is_file() {
                listing.skipped.push(skip(format!(
                    "{}, not a regular file",
                    file::describe(&meta)
                )));
                continue;
            }
            match file::read_limited(&file, CACHE_ENTRY) {
                Ok(bytes) => {
                    let decoded = DiskCache::decode(&bytes);
                    let field = |i: usize| {
                        decoded
                            .as_ref()
                            .and_then(|(h, _)| h.get(i).cloned())
                            .unwrap_or_else(|| "?".into())
                    };
                    let kind = if tuning {
                        EntryKind::Tuning {
                            family: field(1),
                            problem: field(3),
                            choice: field(4),
                        }
                    } else {
                        EntryKind::Kernel
                    };
                    listing.entries.push(CacheEntryInfo {
                        bytes: bytes.len() as u64,
                        arch: field(0),
                        entry: field(1),
                        valid: decoded.is_some(),
                        kind,
                        file,
                    });
                }
                Err(e) => listing.skipped.push(skip(e.to_string())),
            }
        }
        listing.entries.sort_by(|a, b| a.file.cmp(&b.file));
        listing.skipped.sort_by(|a, b| a.file.cmp(&b.file));
        Ok(listing)
    }

    /// Removes every entry [`DiskCache::list`] finds (valid or corrupt) and leaves everything
    /// else alone: what it skipped comes back with the reason, and every entry it could not
    /// remove comes back apart ([`Cleared::not_removed`]), so a caller can fail on those.
    pub fn clear(&self) -> Result<Cleared, RuntimeError> {
        let listing = self.list()?;
        let mut cleared = Cleared {
            removed: 0,
            skipped: listing.skipped,
            not_removed: Vec::new(),
        };
        for e in listing.entries {
            match std::fs::remove_file(&e.file) {
                Ok(()) => cleared.removed += 1,
                Err(err) => cleared.not_removed.push(NotRemoved {
                    file: e.file,
                    kind: err.kind(),
                    message: err.to_string(),
                }),
            }
        }
        Ok(cleared)
    }
}

/// Why an entry could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum EntryError {
    Missing,
    Corrupt(String),
}

/// What [`DiskCache::list`] found.
#[derive(Clone, Debug, Default)]
pub struct CacheListing {
    pub entries: Vec<CacheEntryInfo>,
    pub skipped: Vec<SkippedEntry>,
}

/// What [`DiskCache::clear`] did.
#[derive(Clone, Debug)]
pub struct Cleared {
    pub removed: usize,
    /// Files named like entries that are not entries rocmforge handles (left alone on purpose).
    pub skipped: Vec<SkippedEntry>,
    /// Entries that were to be removed and are still there.
    pub not_removed: Vec<NotRemoved>,
}

/// A cache entry [`DiskCache::clear`] tried to remove and could not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotRemoved {
    pub file: PathBuf,
    pub kind: std::io::ErrorKind,
    /// The operating system's words.
    pub message: String,
}

/// A file named like a cache entry that rocmforge left alone, and why.
#[derive(Clone, Debug)]
pub struct SkippedEntry {
    pub file: PathBuf,
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(src: &str) -> CacheKey {
        CacheKey {
            arch: "gfx90a:sramecc+:xnack-".into(),
            wave_size: 64,
            toolchain: "t".into(),
            options: vec!["-O3".into()],
            entry: "k".into(),
            source: src.into(),
        }
    }

    #[test]
    fn entries_round_trip_and_corruption_is_detected() {
        let dir = std::env::temp_dir().join(format!("rocmforge-cache-unit-{}", std::process::id()));
        let disk = DiskCache::new(dir.clone());
        disk.write(&key("a"), b"payload").unwrap();
        assert_eq!(disk.read(&key("a")).as_deref(), Some(&b"payload"[..]));
        assert_eq!(disk.read(&key("b")), None);
        let path = disk.entry_path(&key("a").digest(), KERNEL_EXT);
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(disk.read(&key("a")), None, "a flipped bit is refused");
        std::fs::write(&path, &bytes[..10]).unwrap();
        assert_eq!(disk.read(&key("a")), None, "a truncated entry is refused");
        let listing = disk.list().unwrap();
        assert_eq!(listing.entries.len(), 1);
        assert!(!listing.entries[0].valid);
        assert_eq!(disk.clear().unwrap().removed, 1);
        std::fs::remove_dir_all(&dir).ok();
        assert_ne!(key("a").digest(), key("b").digest());
    }
}
