//! The key of a compiled kernel: everything that changes the binary, and its stable digest.

/// Everything that changes a compiled binary.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CacheKey {
    /// Full arch name with features (`gfx90a:sramecc+:xnack-`, `sm_90`).
    pub arch: String,
    pub wave_size: u32,
    /// Compiler and driver versions.
    pub toolchain: String,
    pub options: Vec<String>,
    pub entry: String,
    pub source: String,
}

impl CacheKey {
    /// A stable 128-bit digest of the key, rocmforge's version included.
    pub fn digest(&self) -> String {
        let text = format!(
            "rocmforge {}\n{}\n{}\n{}\n{}\n{}\n{}",
            env!("CARGO_PKG_VERSION"),
            self.arch,
            self.wave_size,
            self.toolchain,
            self.options.join(" "),
            self.entry,
            self.source
        );
        crate::ir::fnv1a_128_hex(text.as_bytes())
    }
}
