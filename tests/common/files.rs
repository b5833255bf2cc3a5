//! The example graphs and the snapshot location, shared by the test suites.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// Every `graphs/*.json`, sorted.
pub fn graph_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("graphs"))
            .expect("graphs/")
            .map(|e| e.expect("directory entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
    files.sort();
    files
}

/// insta settings writing to `snapshots/` with plain names.
pub fn snapshot_settings() -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path(Path::new(env!("CARGO_MANIFEST_DIR")).join("snapshots"));
    s.set_prepend_module_to_snapshot(false);
    s
}
