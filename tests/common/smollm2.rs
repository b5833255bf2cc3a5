//! Where the SmolLM2-135M GGUF is, for every test target that runs it. Each includes this file
//! and uses what it needs.
#![allow(dead_code)]

use std::path::PathBuf;

/// The model file: `ROCMFORGE_SMOLLM2`, else where `scripts/fetch-models` puts it.
pub fn gguf_path() -> PathBuf {
    std::env::var_os("ROCMFORGE_SMOLLM2")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            rocmforge::frontend::model_cache_dir(rocmforge::frontend::SMOLLM2)
                .join(rocmforge::frontend::SMOLLM2_GGUF)
        })
}

/// The model file if it is there; without it the caller's test says so and returns, unless
/// `ROCMFORGE_REQUIRE_MODELS=1` (set by .ci/run), which makes its absence a failure.
pub fn gguf_if_present() -> Option<PathBuf> {
    let p = gguf_path();
    if p.is_file() {
        return Some(p);
    }
    assert!(
        std::env::var("ROCMFORGE_REQUIRE_MODELS").map_or(true, |v| v != "1"),
        "ROCMFORGE_REQUIRE_MODELS=1 but no model at {}",
        p.display()
    );
    eprintln!(
        "skipped: SmolLM2 not found at {} (run scripts/fetch-models)",
        p.display()
    );
    None
}
