//! Compilation targets, named by their full arch string: `gfx90a`, `gfx90a:sramecc+:xnack-`,
//! `gfx1030`, `sm_90`. The wave size follows from the arch: 64 on gfx9 (CDNA/GCN), 32 on gfx10+
//! and NVIDIA.

use std::fmt;

use super::CodegenError;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Platform {
    /// HIP through hiprtc.
    Amd,
    /// The same HIP source through NVRTC, with the NVIDIA prelude.
    Nvidia,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    /// The full arch string, features included, as given.
    pub arch: String,
    /// The processor alone (`gfx90a`, `sm_90`).
    pub processor: String,
    pub platform: Platform,
    pub wave_size: u32,
}

impl Target {
    pub fn parse(arch: &str) -> Result<Target, CodegenError> {
        let unknown = || CodegenError::UnknownArch {
            arch: arch.to_string(),
        };
        let mut parts = arch.split(':');
        let processor = parts.next().filter(|p| !p.is_empty()).ok_or_else(unknown)?;
        for feature in parts {
            let ok = feature.len() > 1
                && (feature.ends_with('+') || feature.ends_with('-'))
                && feature[..feature.len() - 1]
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric());
            if !ok {
                return Err(unknown());
            }
        }
        if let Some(num) = processor.strip_prefix("sm_") {
            let digits = num.trim_end_matches(['a', 'f']);
            if digits.len() < 2 || !digits.chars().all(|c| c.is_ascii_digit()) || arch.contains(':')
            {
                return Err(unknown());
            }
            return Ok(Target {
                arch: arch.into(),
                processor: processor.into(),
                platform: Platform::Nvidia,
                wave_size: 32,
            });
        }
        let Some(id) = processor.strip_prefix("gfx") else {
            return Err(unknown());
        };
        if id.len() < 3 || !id.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(unknown());
        }
        // gfx9xx (GCN/CDNA) runs 64-wide waves; gfx10xx and later (RDNA) 32-wide.
        let wave_size = match id.len() {
            3 if id.starts_with('9') || id.starts_with('8') => 64,
            4 if id.starts_with("10") || id.starts_with("11") || id.starts_with("12") => 32,
            _ => return Err(unknown()),
        };
        Ok(Target {
            arch: arch.into(),
            processor: processor.into(),
            platform: Platform::Amd,
            wave_size,
        })
    }
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
    /// without opting in.
    pub const PORTABLE: LaunchLimits = LaunchLimits {
        grid: [i32::MAX as u32, 65535, 65535],
        block: [1024, 1024, 64],
        block_threads: 1024,
        shared_bytes: 48 * 1024,
    };
}

impl Target {
    /// The launch limits kernels for this target are generated within.
    pub fn limits(&self) -> LaunchLimits {
        match self.platform {
            // AMD GPUs take larger grids in y and z, but kernels are generated to run on
            // either vendor's limits, so a plan never depends on which one it was made for.
            Platform::Amd | Platform::Nvidia => LaunchLimits::PORTABLE,
        }
    }

    /// The compute capability of an NVIDIA target as one number (`sm_90a` → 90).
    pub fn nvidia_sm(&self) -> Option<u32> {
        self.processor
            .strip_prefix("sm_")?
            .trim_end_matches(['a', 'f'])
            .parse()
            .ok()
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

    #[test]
    fn arches_parse_with_wave_sizes() {
        let t = |a: &str| Target::parse(a).map(|t| (t.platform, t.wave_size, t.processor));
        assert_eq!(t("gfx90a").unwrap(), (Platform::Amd, 64, "gfx90a".into()));
        assert_eq!(
            t("gfx90a:sramecc+:xnack-").unwrap(),
            (Platform::Amd, 64, "gfx90a".into())
        );
        assert_eq!(t("gfx1030").unwrap(), (Platform::Amd, 32, "gfx1030".into()));
        assert_eq!(t("gfx942").unwrap().1, 64);
        assert_eq!(t("sm_90").unwrap(), (Platform::Nvidia, 32, "sm_90".into()));
        assert_eq!(t("sm_90a").unwrap().0, Platform::Nvidia);
        assert_eq!(Target::parse("sm_90a").unwrap().nvidia_sm(), Some(90));
        assert_eq!(Target::parse("sm_120").unwrap().nvidia_sm(), Some(120));
        assert_eq!(Target::parse("gfx90a").unwrap().nvidia_sm(), None);
        for bad in [
            "",
            "gfx",
            "gfx90a:",
            "gfx90a:bogus",
            "gpu7",
            "sm_x",
            "gfx1",
            "sm_90:xnack+",
            "gfx90a::",
        ] {
            assert!(
                matches!(Target::parse(bad), Err(CodegenError::UnknownArch { .. })),
                "{bad}"
            );
        }
    }
}
