//! FNV-1a, the one stable hash of the project. Kernel names, cache and tuning keys, the
//! checksums of candidate lists and the seeded weights all derive from it, so it must never
//! change: a different value renames every kernel and invalidates every cache entry. It is
//! written here once, at the ground floor, so every layer shares the same definition.

/// FNV-1a's 64-bit offset basis (the usual seed).
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a's 64-bit prime.
pub const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// A second seed, for the upper half of a 128-bit digest ([`fnv1a_128_hex`]).
pub const FNV_SECOND_SEED: u64 = 0x6c62_272e_07bb_0142;

/// FNV-1a state fed piece by piece: the same value as [`fnv1a`] over the concatenation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fnv1a(u64);

impl Fnv1a {
    /// A hash seeded with the offset basis.
    pub fn new() -> Fnv1a {
        Fnv1a(FNV_OFFSET)
    }

    /// A hash seeded with `seed` instead of the offset basis.
    pub fn with_seed(seed: u64) -> Fnv1a {
        Fnv1a(seed)
    }

    /// Feeds `bytes`.
    pub fn write(mut self, bytes: &[u8]) -> Fnv1a {
        self.0 = bytes
            .iter()
            .fold(self.0, |h, &b| (h ^ u64::from(b)).wrapping_mul(FNV_PRIME));
        self
    }

    pub fn finish(self) -> u64 {
        self.0
    }
}

impl Default for Fnv1a {
    fn default() -> Fnv1a {
        Fnv1a::new()
    }
}

/// FNV-1a of `bytes` from the offset basis.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    Fnv1a::new().write(bytes).finish()
}

/// A 128-bit digest as 32 hex digits: FNV-1a from the offset basis, then from
/// [`FNV_SECOND_SEED`]. Cache and tuning keys name their files with it.
pub fn fnv1a_128_hex(bytes: &[u8]) -> String {
    format!(
        "{:016x}{:016x}",
        fnv1a(bytes),
        Fnv1a::with_seed(FNV_SECOND_SEED).write(bytes).finish()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The published FNV-1a 64 test vectors (Fowler, Noll and Vo's reference suite).
    #[test]
    fn matches_the_published_vectors() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn piecewise_equals_whole() {
        let whole = fnv1a(b"gemm_mmabody text");
        let pieces = Fnv1a::new().write(b"gemm_mma").write(b"body text").finish();
        assert_eq!(whole, pieces);
    }

    /// The digest's halves are the two seeded hashes, computed here by the textbook loop.
    #[test]
    fn digest_halves() {
        let text = b"rocmforge key";
        let by_loop = |seed: u64| {
            let mut h = seed;
            for &b in text {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x100_0000_01b3);
            }
            h
        };
        assert_eq!(
            fnv1a_128_hex(text),
            format!(
                "{:016x}{:016x}",
                by_loop(0xcbf2_9ce4_8422_2325),
                by_loop(0x6c62_272e_07bb_0142)
            )
        );
    }
}
