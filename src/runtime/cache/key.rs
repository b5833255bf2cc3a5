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
        format!(
            "{:016x}{:016x}",
            fnv1a(text.as_bytes(), 0xcbf2_9ce4_8422_2325),
            fnv1a(text.as_bytes(), 0x6c62_272e_07bb_0142)
        )
    }
}

pub(super) fn fnv1a(bytes: &[u8], seed: u64) -> u64 {
    bytes.iter().fold(seed, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
