//! The options every generated kernel is compiled with, per platform. Written once here: the
//! compiler, the kernel cache's keys (the options are part of every key), bundles, the CLI's
//! resource report and the tests all take them from [`compiler_options`], so a kernel compiled
//! anywhere is the same binary the cache holds.

use super::Platform;

/// What hiprtc and the offline clang are given for an AMD target: `-O3`.
const AMD_OPTIONS: &[&str] = &["-O3"];

/// Options for `platform`: hiprtc (and clang) take `-O3`; NVRTC optimises by default and
/// refuses it, so NVIDIA gets none.
pub fn compiler_options(platform: Platform) -> Vec<String> {
    match platform {
        Platform::Amd => AMD_OPTIONS.iter().map(|s| s.to_string()).collect(),
        Platform::Nvidia => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The options are part of every cache key and bundle: changing them must be deliberate.
    #[test]
    fn amd_gets_o3_and_nvidia_nothing() {
        assert_eq!(compiler_options(Platform::Amd), vec!["-O3".to_string()]);
        assert!(compiler_options(Platform::Nvidia).is_empty());
    }
}
