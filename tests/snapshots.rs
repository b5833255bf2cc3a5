//! Snapshots (insta, in `snapshots/`) of every example graph: its text form before and after
//! the default pipeline, and the `--explain` report. A change to a pass shows up as a diff to
//! review (`cargo insta review`); CI fails on an unreviewed change.

use std::path::Path;

use rocmforge::ir::{format, to_text};
use rocmforge::passes::{explain_text, PassManager};

fn settings() -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path(Path::new(env!("CARGO_MANIFEST_DIR")).join("snapshots"));
    s.set_prepend_module_to_snapshot(false);
    s
}

#[test]
fn graphs_before_and_after_the_default_pipeline() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("graphs");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    for path in files {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let mut g = format::load(&path).unwrap();
        let before = to_text(&g).unwrap();
        let reports = PassManager::default_pipeline().run(&mut g).unwrap();
        let after = to_text(&g).unwrap();
        settings().bind(|| {
            insta::assert_snapshot!(format!("graph__{name}__before"), before);
            insta::assert_snapshot!(format!("graph__{name}__fused"), after);
            insta::assert_snapshot!(format!("explain__{name}"), explain_text(&reports));
        });
    }
}
