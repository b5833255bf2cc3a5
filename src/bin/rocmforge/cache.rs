//! `rocmforge cache`: list or clear the on-disk kernel cache.

use rocmforge::runtime::{DiskCache, EntryKind};

use crate::common::file_name;
use crate::CacheAction;

pub(crate) fn cmd_cache(action: &CacheAction) -> Result<(), String> {
    let Some(dir) = DiskCache::default_dir() else {
        return Err("no cache directory: set ROCMFORGE_CACHE_DIR or HOME".into());
    };
    let disk = DiskCache::new(dir.clone());
    let mut not_removed = Vec::new();
    let skipped = match action {
        CacheAction::Ls => {
            let listing = disk.list().map_err(|e| e.to_string())?;
            outln!("{} ({} entries)", dir.display(), listing.entries.len());
            for e in listing.entries {
                let what = match &e.kind {
                    EntryKind::Kernel => e.entry.clone(),
                    EntryKind::Tuning {
                        family,
                        problem,
                        choice,
                    } => format!("tuning {family} [{problem}] -> {choice}"),
                };
                outln!(
                    "  {}  {:>8} B  {:<24} {}{}",
                    file_name(&e.file),
                    e.bytes,
                    e.arch,
                    what,
                    if e.valid {
                        ""
                    } else {
                        "  (corrupt: will be rebuilt)"
                    }
                );
            }
            listing.skipped
        }
        CacheAction::Clear => {
            let cleared = disk.clear().map_err(|e| e.to_string())?;
            outln!("removed {} entries from {}", cleared.removed, dir.display());
            not_removed = cleared.not_removed;
            cleared.skipped
        }
    };
    if !skipped.is_empty() {
        outln!(
            "skipped {} file(s) that are not cache entries rocmforge can handle:",
            skipped.len()
        );
        for s in skipped {
            outln!("  {}  {}", file_name(&s.file), s.reason);
        }
    }
    // Entries `clear` meant to remove and could not: the cache is not clear, so say which and
    // fail.
    if !not_removed.is_empty() {
        let lines: Vec<String> = not_removed
            .iter()
            .map(|n| format!("  {}  {}", n.file.display(), n.message))
            .collect();
        return Err(format!(
            "could not remove {} cache entr{}:\n{}",
            not_removed.len(),
            if not_removed.len() == 1 { "y" } else { "ies" },
            lines.join("\n")
        ));
    }
    Ok(())
}
