//! Snapshots (insta, in `snapshots/`) of every example graph: its text form before and after
//! the default pipeline, and the `--explain` report. A change to a pass shows up as a diff to
//! review (`cargo insta review`); CI fails on an unreviewed change.

#[path = "common/files.rs"]
mod files;

use rocmforge::ir::{format, to_text};
use rocmforge::passes::{explain_text, PassManager};

#[test]
fn graphs_before_and_after_the_default_pipeline() {
    for path in files::graph_files() {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let mut g = format::load(&path).unwrap();
        let before = to_text(&g).unwrap();
        let reports = PassManager::default_pipeline().run(&mut g).unwrap();
        let after = to_text(&g).unwrap();
        files::snapshot_settings().bind(|| {
            insta::assert_snapshot!(format!("graph__{name}__before"), before);
            insta::assert_snapshot!(format!("graph__{name}__fused"), after);
            insta::assert_snapshot!(format!("explain__{name}"), explain_text(&reports));
        });
    }
}
