//! Compilation targets, named by their full arch string: `gfx90a`, `gfx90a:sramecc+:xnack-`,
//! `gfx1100`, `sm_90`, `sm_90a`. The processor is looked up in the capability tables
//! (`amd.rs`, `nvidia.rs`: one [`Arch`] row per processor); an arch with no row is an error, so
//! no capability is ever guessed from the name.

use std::fmt;
use std::hash::{Hash, Hasher};

use super::caps::Arch;
use super::{amd, nvidia, ArchError};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Platform {
    /// HIP through hiprtc (or the offline clang).
    Amd,
    /// The same HIP source through NVRTC, with the NVIDIA prelude.
    Nvidia,
}

/// Every processor we have a row for.
pub fn arches() -> impl Iterator<Item = &'static Arch> {
    amd::AMD.iter().chain(nvidia::NVIDIA.iter()).copied()
}

/// The row of one processor (`gfx942`, `sm_90`; no features or variant suffix).
pub fn arch(processor: &str) -> Option<&'static Arch> {
    arches().find(|a| a.name == processor)
}

#[derive(Clone, Debug)]
pub struct Target {
    /// The full arch string, features included, as given.
    pub arch: String,
    /// The processor alone (`gfx90a`, `sm_90a`).
    pub processor: String,
    pub platform: Platform,
    pub wave_size: u32,
    /// What the processor can do.
    pub caps: &'static Arch,
}

/// Two targets are the same when their arch strings are: the row follows from the string.
impl PartialEq for Target {
    fn eq(&self, other: &Self) -> bool {
        self.arch == other.arch
    }
}
impl Eq for Target {}
impl Hash for Target {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.arch.hash(state)
    }
}

impl Target {
    pub fn parse(arch: &str) -> Result<Target, ArchError> {
        let unknown = |reason: String| ArchError::UnknownArch {
            arch: arch.to_string(),
            reason,
        };
        let mut parts = arch.split(':');
        let processor = parts.next().unwrap_or_default();
        let caps = lookup(processor).ok_or_else(|| {
            let known: Vec<&str> = arches().map(|a| a.name).collect();
            unknown(format!(
                "no capability table for `{processor}` (known: {})",
                known.join(", ")
            ))
        })?;
        let mut seen: Vec<&str> = Vec::new();
        for feature in parts {
            let name = feature
                .strip_suffix('+')
                .or_else(|| feature.strip_suffix('-'))
                .ok_or_else(|| unknown(format!("feature `{feature}` must end in + or -")))?;
            if !caps.features.contains(&name) {
                return Err(unknown(format!(
                    "{} has no feature `{name}` (it has: {})",
                    caps.name,
                    if caps.features.is_empty() {
                        "none".to_string()
                    } else {
                        caps.features.join(", ")
                    }
                )));
            }
            if seen.contains(&name) {
                return Err(unknown(format!("feature `{name}` given twice")));
            }
            seen.push(name);
        }
        Ok(Target {
            arch: arch.into(),
            processor: processor.into(),
            platform: caps.platform,
            wave_size: caps.wave_size,
            caps,
        })
    }
}

/// The processor a device of compute capability `major`.`minor` compiles for, given the NVRTC
/// version: the row that is the arch-specific form of `sm_<major><minor>` where the table has
/// one and this NVRTC compiles for it (`sm_90a` on an H100), else the portable name. Code for
/// the arch-specific row uses instructions (wgmma, setmaxnreg) only that exact capability has.
pub fn device_processor(major: i32, minor: i32, nvrtc: (i32, i32)) -> String {
    let portable = format!("sm_{major}{minor}");
    nvidia::NVIDIA
        .iter()
        .find(|a| {
            a.specific_of
                .is_some_and(|s| s.of == portable && nvrtc >= s.nvrtc_since)
        })
        .map_or(portable.clone(), |a| a.name.to_string())
}

/// The row for a processor name, allowing an NVIDIA variant suffix the row lists (`sm_90a`).
fn lookup(processor: &str) -> Option<&'static Arch> {
    arch(processor).or_else(|| {
        arches().find(|a| {
            a.variants
                .iter()
                .any(|v| processor.strip_suffix(v) == Some(a.name))
        })
    })
}

/// What one kernel launch may ask of a device: grid and block dimensions, threads per block,
/// shared memory. Codegen checks every kernel against its target's; the runtime checks every
/// launch again against the limits the device itself reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchLimits {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub block_threads: u32,
    pub shared_bytes: u32,
}

impl LaunchLimits {
    /// Limits every target here shares: CUDA's grid of 2³¹−1 × 65535 × 65535 blocks of at
    /// most 1024 threads (HIP documents the same), and 48 KiB of shared memory per block
    /// without opting in (no row has less: see the tests).
    pub const PORTABLE: LaunchLimits = LaunchLimits {
        grid: [i32::MAX as u32, 65535, 65535],
        block: [1024, 1024, 64],
        block_threads: 1024,
        shared_bytes: 48 * 1024,
    };
}

impl Target {
    /// The launch limits kernels for this target are generated within: a target-level fact,
    /// the same for every row. AMD GPUs take larger grids in y and z and more LDS than 48 KiB
    /// (`Arch::shared_bytes_per_block`), but kernels are generated to run on either vendor's
    /// limits, so a plan never depends on which one it was made for.
    pub fn limits(&self) -> LaunchLimits {
        LaunchLimits::PORTABLE
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (wave {})", self.arch, self.wave_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::mma::{MmaKind, Precision};
    use crate::arch::AsyncCopy;
    use crate::ir::DType;

    #[test]
    fn arches_parse_with_wave_sizes_from_their_rows() {
        let t = |a: &str| Target::parse(a).map(|t| (t.platform, t.wave_size, t.processor));
        assert_eq!(t("gfx90a").unwrap(), (Platform::Amd, 64, "gfx90a".into()));
        assert_eq!(
            t("gfx90a:sramecc+:xnack-").unwrap(),
            (Platform::Amd, 64, "gfx90a".into())
        );
        assert_eq!(t("gfx1030").unwrap(), (Platform::Amd, 32, "gfx1030".into()));
        assert_eq!(t("gfx942").unwrap().1, 64);
        assert_eq!(t("gfx1100").unwrap().1, 32);
        assert_eq!(t("gfx1201").unwrap().1, 32);
        assert_eq!(t("sm_90").unwrap(), (Platform::Nvidia, 32, "sm_90".into()));
        assert_eq!(
            t("sm_90a").unwrap(),
            (Platform::Nvidia, 32, "sm_90a".into())
        );
        assert_eq!(Target::parse("sm_90a").unwrap().caps.name, "sm_90a");
        assert_eq!(Target::parse("sm_100a").unwrap().caps.name, "sm_100");
        assert_eq!(Target::parse("sm_120f").unwrap().caps.name, "sm_120");
        for bad in [
            "",
            "gfx",
            "gfx90a:",
            "gfx90a:bogus",
            "gfx90a:bogus+",
            "gfx90a:xnack+:xnack-",
            "gfx1030:xnack+",
            "gpu7",
            "sm_x",
            "gfx1",
            "sm_90:xnack+",
            "sm_89a",
            "gfx90a::",
            // Well-formed names with no row: nothing is assumed about them.
            "gfx9000",
            "gfx1150",
            "sm_61",
        ] {
            assert!(
                matches!(Target::parse(bad), Err(ArchError::UnknownArch { .. })),
                "{bad}"
            );
        }
        let e = Target::parse("gfx1150").unwrap_err().to_string();
        assert!(e.contains("gfx942") && e.contains("sm_90"), "{e}");
    }

    /// The facts the issue names, per arch, as the rest of the compiler reads them.
    #[test]
    fn the_tables_hold_the_documented_capabilities() {
        let row = |n: &str| arch(n).unwrap_or_else(|| panic!("{n} has a row"));
        let kinds = |n: &str| -> Vec<(MmaKind, DType)> {
            row(n).mma.iter().map(|a| (a.kind, a.input)).collect()
        };
        for n in ["sm_80", "sm_89", "sm_90"] {
            assert_eq!(
                kinds(n),
                [
                    (MmaKind::MmaSync, DType::F16),
                    (MmaKind::MmaSync, DType::BF16),
                    (MmaKind::MmaSync, DType::F32)
                ]
            );
            // The f32 atom is the TF32 one: an opt-in precision, never exact f32.
            assert!(row(n)
                .mma
                .iter()
                .all(|a| (a.input == DType::F32) == (a.precision == Precision::Tf32)));
            assert!(row(n).async_copy.has_cp_async());
            assert_eq!(row(n).static_shared_bytes, 48 * 1024);
        }
        assert_eq!(row("sm_90").async_copy, AsyncCopy::Tma);
        assert_eq!(row("sm_90").shared_bytes_per_block, 227 * 1024);
        assert_eq!(row("sm_89").shared_bytes_per_block, 99 * 1024);
        assert_eq!(row("sm_80").shared_bytes_per_block, 163 * 1024);
        assert!(row("sm_75").mma.is_empty() && !row("sm_75").async_copy.has_cp_async());
        for n in ["gfx90a", "gfx942"] {
            assert!(kinds(n).iter().all(|k| k.0 == MmaKind::Mfma), "{n}");
            let exact = kinds(n).iter().filter(|k| k.1 != DType::F32).count();
            assert_eq!(exact, 4, "{n}: 32x32x8 and 16x16x16, f16 and bf16");
            assert!(row(n).mma.iter().all(|a| a.lanes == row(n).wave_size));
        }
        // xf32 (TF32 precision) exists on CDNA3 only; CDNA2 and RDNA have no f32 atom.
        let tf32 = |n: &str| -> Vec<&str> {
            row(n)
                .mma
                .iter()
                .filter(|a| a.precision == Precision::Tf32)
                .map(|a| a.name)
                .collect()
        };
        assert_eq!(tf32("gfx942"), ["mfma_32x32x4_xf32", "mfma_16x16x8_xf32"]);
        for n in ["gfx90a", "gfx908", "gfx1100", "gfx1201"] {
            assert!(tf32(n).is_empty(), "{n}");
        }
        assert_eq!(
            kinds("gfx1100"),
            [
                (MmaKind::WmmaGfx11, DType::F16),
                (MmaKind::WmmaGfx11, DType::BF16)
            ]
        );
        assert_eq!(
            kinds("gfx1201"),
            [
                (MmaKind::WmmaGfx12, DType::F16),
                (MmaKind::WmmaGfx12, DType::BF16)
            ]
        );
        assert!(row("gfx1030").mma.is_empty() && row("gfx906").mma.is_empty());
        assert_eq!(kinds("gfx908"), [(MmaKind::Mfma, DType::F16); 2]);
        for a in arches() {
            assert_eq!(
                a.wave_size,
                if a.platform == Platform::Amd && a.family.starts_with("CDNA")
                    || a.family.starts_with("GCN")
                {
                    64
                } else {
                    32
                },
                "{}",
                a.name
            );
            assert!(
                a.static_shared_bytes <= a.shared_bytes_per_block,
                "{}",
                a.name
            );
            assert!(a.mma.iter().all(|m| m.lanes == a.wave_size), "{}", a.name);
            // setmaxnreg and wgmma are arch-specific: only a row that is one has them.
            assert_eq!(
                a.setmaxnreg || !a.wgmma.is_empty(),
                a.specific_of.is_some(),
                "{}",
                a.name
            );
            assert_eq!(a.platform == Platform::Amd, a.isa_version.is_some());
        }
        assert_eq!(row("gfx942").isa_version_number(), Some(9402));
        assert_eq!(row("gfx90a").isa_version_number(), Some(9010));
        assert_eq!(
            row("gfx90a").isa_version_file().as_deref(),
            Some("oclc_isa_version_90a.bc")
        );
        assert_eq!(row("gfx1201").isa_version_number(), Some(12001));
        assert_eq!(
            row("gfx1201").isa_version_file().as_deref(),
            Some("oclc_isa_version_1201.bc")
        );
    }

    /// `sm_90a` is a row of its own with the warpgroup instructions as data; `sm_90` has none;
    /// a compute capability 9.0 device compiles for `sm_90a` when NVRTC can.
    #[test]
    fn sm_90a_is_its_own_row_and_a_cc_90_device_gets_it() {
        let a = Target::parse("sm_90a").unwrap();
        assert!(a.caps.setmaxnreg && a.caps.wgmma.len() == 2);
        assert_eq!(a.caps.specific_of.map(|s| s.of), Some("sm_90"));
        assert_eq!(a.caps.mma, arch("sm_90").unwrap().mma);
        assert_eq!(a.caps.shared_bytes_per_block, 227 * 1024);
        let p = Target::parse("sm_90").unwrap();
        assert!(!p.caps.setmaxnreg && p.caps.wgmma.is_empty());
        assert_eq!(device_processor(9, 0, (12, 4)), "sm_90a");
        assert_eq!(device_processor(9, 0, (11, 8)), "sm_90");
        assert_eq!(device_processor(8, 0, (12, 4)), "sm_80");
        assert_eq!(device_processor(12, 0, (12, 8)), "sm_120");
        assert!(Target::parse("sm_90a:xnack+").is_err());
    }

    /// The portable launch limits fit every row: no processor has less shared memory a block
    /// may declare statically, nor a narrower wave than a block's threads can hold whole.
    #[test]
    fn portable_launch_limits_fit_every_row() {
        let p = LaunchLimits::PORTABLE;
        for a in arches() {
            let t = Target::parse(a.name).unwrap();
            assert_eq!(t.limits(), p, "{}", a.name);
            assert!(p.shared_bytes <= a.static_shared_bytes, "{}", a.name);
            assert_eq!(p.block_threads % a.wave_size, 0, "{}", a.name);
        }
        assert_eq!(p.grid[0], i32::MAX as u32);
    }

    #[test]
    fn every_row_is_named_once() {
        let names: Vec<&str> = arches().map(|a| a.name).collect();
        for n in &names {
            assert_eq!(names.iter().filter(|m| *m == n).count(), 1, "{n}");
        }
    }
}
