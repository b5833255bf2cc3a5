//! The example graphs, the op zoo and the zoo under hostile node names, fused and unfused, against the interpreter.

use crate::common::*;
use crate::harness::*;
use libtest_mimic::Trial;
use rocmforge::ir::format;
use rocmforge::runtime::Device;

/// Every example graph, fused and unfused, and the op zoo, against the interpreter.
pub fn examples_and_zoo(device: &Device, ignored: &Option<String>, trials: &mut Vec<Trial>) {
    for path in files::graph_files() {
        for fuse in [true, false] {
            let (d, p) = (device.clone(), path.clone());
            let name = format!(
                "graph::{}::{}",
                p.file_stem().unwrap().to_string_lossy(),
                if fuse { "fused" } else { "unfused" }
            );
            push(
                trials,
                ignored,
                name,
                Box::new(move || {
                    check_graph(&d, &format::load(&p).map_err(|e| e.to_string())?, fuse, 3)
                }),
            );
        }
    }
    for g in op_zoo::zoo() {
        let d = device.clone();
        push(
            trials,
            ignored,
            format!("zoo::{}", g.name),
            Box::new(move || check_graph(&d, &g, true, 4)),
        );
    }
}

/// The op zoo under hostile node names.
pub fn hostile_names(device: &Device, ignored: &Option<String>, trials: &mut Vec<Trial>) {
    // Hostile names compile to the plain graph's kernels and run like any graph.
    for g in op_zoo::zoo() {
        let d = device.clone();
        let name = format!("names::hostile::{}", g.name);
        let h = op_zoo::with_hostile_names(&g);
        push(
            trials,
            ignored,
            name,
            Box::new(move || check_graph(&d, &h, true, 4)),
        );
    }
}
