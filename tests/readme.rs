//! The README's sample outputs quote node and kernel counts of `graphs/llama_block.json`; they
//! were copied from real runs, and this holds them to what the pipeline does today, so a pass or
//! codegen change that moves them makes the README wrong loudly instead of quietly.

use std::path::Path;

use rocmforge::arch::Target;
use rocmforge::codegen::generate;
use rocmforge::ir::format::load;
use rocmforge::passes::PassManager;

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap()
}

/// Every `(N nodes, M after passes)` the README quotes for `llama_block`.
fn quoted_node_counts(text: &str) -> Vec<(usize, usize)> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("graph:"))
        .filter_map(|l| l.trim().strip_prefix("llama_block ("))
        .map(|l| {
            let nums: Vec<usize> = l
                .split(|c: char| !c.is_ascii_digit())
                .filter(|s| !s.is_empty())
                .map(|s| s.parse().unwrap())
                .collect();
            (nums[0], nums[1])
        })
        .collect()
}

/// Every `(K kernels` on a `compile:` line the README quotes.
fn quoted_kernel_counts(text: &str) -> Vec<usize> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("compile:"))
        .filter_map(|l| l.split_once('(').map(|(_, r)| r))
        .filter_map(|r| r.split_once(" kernels").map(|(n, _)| n.trim()))
        .filter_map(|n| n.parse().ok())
        .collect()
}

#[test]
fn readme_node_and_kernel_counts_are_the_pipelines() {
    let text = readme();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("graphs/llama_block.json");
    let graph = load(&path).unwrap();
    let mut fused = graph.clone();
    PassManager::default_pipeline().run(&mut fused).unwrap();

    let nodes = quoted_node_counts(&text);
    assert!(
        !nodes.is_empty(),
        "the README quotes no `graph:  llama_block (…)` line"
    );
    for (before, after) in nodes {
        assert_eq!(
            (before, after),
            (graph.node_count(), fused.node_count()),
            "README quotes llama_block as ({before} nodes, {after} after passes)"
        );
    }

    // The GPU sample output is from an H100 (sm_90).
    let plan = generate(&fused, &Target::parse("sm_90").unwrap()).unwrap();
    let kernels = quoted_kernel_counts(&text);
    assert!(
        !kernels.is_empty(),
        "the README quotes no `compile: … (N kernels` line"
    );
    for k in kernels {
        assert_eq!(
            k,
            plan.kernels.len(),
            "README quotes {k} kernels for llama_block on sm_90"
        );
    }
}

#[test]
fn the_quote_readers_read_what_they_are_given() {
    let sample = "graph:  llama_block (63 nodes, 22 after passes)\ncompile: 64.0 ms (12 kernels, all from cache)\n";
    assert_eq!(quoted_node_counts(sample), [(63, 22)]);
    assert_eq!(quoted_kernel_counts(sample), [12]);
}
