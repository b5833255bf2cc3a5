//! Which targets a host trial runs on. A case's kernels on the host differ between wave64
//! (gfx90a) and wave32 (gfx1030) plans only in the wave size they were shaped for, so CI runs
//! each case of a sweep on one of them, picked by a hash of the case's name: every case runs,
//! each target gets about half of every sweep. `ROCMFORGE_LONG_TESTS=1` runs every case on
//! every target.
#![allow(dead_code)]

/// Whether `ROCMFORGE_LONG_TESTS=1`: the full sweeps.
pub fn long() -> bool {
    std::env::var("ROCMFORGE_LONG_TESTS").is_ok_and(|v| v == "1")
}

/// A hash of `s` stable across runs, platforms and Rust versions (unlike `DefaultHasher`):
/// FNV-1a, then MurmurHash3's finaliser (FNV-1a's low bit alone is the parity of the bytes'
/// sum, so names differing in one digit would alternate in step with it).
fn hash(s: &str) -> u64 {
    let mut h = s.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The targets of `archs` that the case named `case` runs on: all of them with
/// `ROCMFORGE_LONG_TESTS=1`, else the one the name's hash picks (none where `archs` is empty).
pub fn archs<'a>(case: &str, archs: &[&'a str]) -> Vec<&'a str> {
    if long() || archs.len() <= 1 {
        return archs.to_vec();
    }
    vec![archs[(hash(case) % archs.len() as u64) as usize]]
}
