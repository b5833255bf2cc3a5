//! What one GPU architecture can do, as data: a row per processor in `amd.rs` and `nvidia.rs`.
//! Every choice codegen and the runtime make per target reads a row; nothing is inferred from
//! the shape of the arch string.

use super::mma::{MmaAtom, WgmmaAtom};
use super::Platform;

/// How a kernel can move global memory into shared memory without staging it in registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AsyncCopy {
    /// Loads go through registers.
    None,
    /// `cp.async` (NVIDIA sm_80+): per-thread 4/8/16-byte copies tracked in commit groups.
    CpAsync,
    /// `cp.async` and the Tensor Memory Accelerator (`cp.async.bulk.tensor`, sm_90+).
    Tma,
}

impl AsyncCopy {
    pub fn has_cp_async(self) -> bool {
        match self {
            AsyncCopy::None => false,
            AsyncCopy::CpAsync | AsyncCopy::Tma => true,
        }
    }
}

/// The 4-way int8 dot product (`d = c + Σ a[i]·b[i]` over the four signed bytes of two 32-bit
/// words) a processor has, as the quantized GEMV calls it (`rf_dot4_i8` in the preludes). The
/// builtins differ by generation, so the choice is a row fact, not a test of the name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dot4 {
    /// NVIDIA `__dp4a` (sm_61 and later).
    Dp4a,
    /// AMD `v_dot4_i32_i8` through `__builtin_amdgcn_sdot4` (`dot1-insts`: gfx906, CDNA,
    /// RDNA2). clang-19 refuses it on gfx11 and gfx12.
    Sdot4,
    /// AMD `v_dot4_i32_iu8` through `__builtin_amdgcn_sudot4` with both operands signed
    /// (`dot8-insts`: RDNA3, RDNA4); clang-19 refuses it on gfx9 and gfx10.
    Sudot4,
    /// No instruction: four multiply-adds of the sign-extended bytes.
    Portable,
}

impl Dot4 {
    /// The name the preludes switch on.
    pub fn name(self) -> &'static str {
        match self {
            Dot4::Dp4a => "dp4a",
            Dot4::Sdot4 => "sdot4",
            Dot4::Sudot4 => "sudot4",
            Dot4::Portable => "portable",
        }
    }
}

/// What makes a row the arch-specific (`a`) form of a processor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArchSpecific {
    /// The portable processor (`sm_90`) whose devices run it.
    pub of: &'static str,
    /// The first NVRTC (major, minor) that compiles for it (`sm_90a`: CUDA 12.0).
    pub nvrtc_since: (i32, i32),
}

/// One processor's capabilities.
#[derive(Debug, PartialEq, Eq)]
pub struct Arch {
    /// The processor as compilers name it: `gfx942`, `sm_90`.
    pub name: &'static str,
    /// The marketing generation, for messages: `CDNA3`, `Hopper`.
    pub family: &'static str,
    pub platform: Platform,
    /// Lanes of a wavefront (AMD) or warp (NVIDIA) as our kernels are compiled: gfx10+ can
    /// also run wave64, but hiprtc and clang default to wave32 there and so do we.
    pub wave_size: u32,
    /// Shared memory (LDS) one block may use at most, dynamic opt-in included.
    pub shared_bytes_per_block: u32,
    /// Shared memory statically declared `__shared__` arrays may total: 48 KiB on NVIDIA (more
    /// needs dynamic shared memory and an opt-in), the whole LDS on AMD.
    pub static_shared_bytes: u32,
    pub async_copy: AsyncCopy,
    /// The matrix instructions we have atoms for (`arch::mma`); empty where the arch has
    /// none or only ones we do not model (Volta's m8n8k4, Turing's m16n8k8).
    pub mma: &'static [&'static MmaAtom],
    /// Target features the arch string may switch (`gfx90a:sramecc+:xnack-`).
    pub features: &'static [&'static str],
    /// Arch-specific variants of an NVIDIA processor (`sm_100a`: the `a` suffix) that have no
    /// row of their own and so parse to this row's capabilities.
    pub variants: &'static [&'static str],
    /// The warpgroup matrix instructions (`wgmma.mma_async`, sm_90a) we have atoms for: A and B
    /// read from shared memory through descriptors, so they are not fragment atoms (`mma`).
    pub wgmma: &'static [&'static WgmmaAtom],
    /// `setmaxnreg` (sm_90a): a warpgroup can hand registers back to the SM or take more, so
    /// producer warpgroups run on few registers and consumer warpgroups on many.
    pub setmaxnreg: bool,
    /// Programmatic dependent launch (`griddepcontrol`, sm_90+): a kernel may be scheduled
    /// while the one before it on the stream finishes, and waits on it in its first statement
    /// (the preludes' `RF_GRID_ENTER()`), so launch and block start-up overlap the previous
    /// kernel's tail. Codegen marks such kernels' launches programmatic.
    pub grid_dependency: bool,
    /// This row is the arch-specific form of another processor (`sm_90a` of `sm_90`): its code
    /// runs only on a device of exactly that compute capability, where the runtime prefers it
    /// (`arch::device_processor`). `None` for portable rows.
    pub specific_of: Option<ArchSpecific>,
    /// AMD: the ISA version (major, minor, stepping) the device libraries key on
    /// (`oclc_isa_version_<major><minor><stepping>.bc`, value `major*1000 + minor*100 + stepping`).
    pub isa_version: Option<(u32, u32, u32)>,
    /// AMD: the first ROCm release whose hiprtc compiles for this processor. Older hiprtc
    /// builds do not report an unknown processor as an error: ROCm 5.2's aborts the process.
    pub hiprtc_since_rocm: Option<(u32, u32)>,
    /// The vector register file as the compiler allocates it: what bounds a configuration's
    /// registers before it spills.
    pub registers: Registers,
    /// The 4-way int8 dot product the quantized decode GEMV uses.
    pub dot4: Dot4,
}

/// A processor's 32-bit vector registers per lane, as the compiler hands them to a kernel of
/// a given block size (LLVM `AMDGPUBaseInfo.cpp`: `getTotalNumVGPRs`, `getAddressableNumVGPRs`,
/// `getEUsPerCU`, `getVGPRAllocGranule`; NVIDIA: 64 K registers per SM, 255 per thread).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registers {
    /// Registers per lane in one SIMD's file, shared by the waves resident on it.
    pub file: u32,
    /// Most one wave (warp) may address.
    pub per_wave: u32,
    /// SIMDs a block's waves spread over: 4 on gfx9 and on gfx10+ in WGP mode (the default of
    /// hiprtc and clang); 1 on NVIDIA, where `file` is the SM's.
    pub simds: u32,
    /// Allocation granule.
    pub granule: u32,
}

impl Registers {
    /// Registers per lane a kernel of `threads` per block has without spilling: the file
    /// shared by the block's waves on one SIMD (all resident at once), at most `per_wave`,
    /// in whole granules. This is the bound the compiler works to under
    /// `__launch_bounds__(threads)`.
    pub fn budget(&self, threads: u32, wave: u32) -> u32 {
        let waves = threads.div_ceil(wave.max(1)).max(1);
        let per_simd = waves.div_ceil(self.simds.max(1));
        let share = self.file / per_simd / self.granule.max(1) * self.granule.max(1);
        share.min(self.per_wave)
    }
}

impl Arch {
    /// Whether a device of this row runs code made for `code`: the same row, or this row is
    /// the arch-specific form of it (an H100, `sm_90a`, runs `sm_90` code).
    pub fn runs_code_for(&self, code: &Arch) -> bool {
        self.name == code.name || self.specific_of.is_some_and(|s| s.of == code.name)
    }

    /// The value of `__oclc_ISA_version` for this processor.
    pub fn isa_version_number(&self) -> Option<u32> {
        self.isa_version
            .map(|(major, minor, stepping)| major * 1000 + minor * 100 + stepping)
    }

    /// The device-library file name for this processor's ISA version (`942` for gfx942,
    /// `90a` for gfx90a: the stepping is one hex digit).
    pub fn isa_version_file(&self) -> Option<String> {
        self.isa_version.map(|(major, minor, stepping)| {
            format!("oclc_isa_version_{major}{minor}{stepping:x}.bc")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::arches;

    /// sm_90a devices run sm_90 code; nothing runs the other way, nor across processors.
    #[test]
    fn arch_specific_rows_run_their_portable_code() {
        let row = |n: &str| crate::arch::arch(n).unwrap();
        assert!(row("sm_90a").runs_code_for(row("sm_90")));
        assert!(row("sm_90a").runs_code_for(row("sm_90a")));
        assert!(!row("sm_90").runs_code_for(row("sm_90a")));
        assert!(!row("sm_90a").runs_code_for(row("sm_80")));
        assert!(!row("sm_100").runs_code_for(row("sm_90")));
    }

    /// Which int8 dot product each row gets, as clang-19 accepts the built-ins per processor
    /// (`__builtin_amdgcn_sdot4` needs `dot1-insts`, absent from gfx11/gfx12;
    /// `__builtin_amdgcn_sudot4` needs `dot8-insts`, absent from gfx9/gfx10), and NVIDIA's dp4a.
    #[test]
    fn every_row_has_the_dot_product_its_compiler_accepts() {
        for a in arches() {
            let want = match (a.platform, a.name) {
                (Platform::Nvidia, _) => Dot4::Dp4a,
                (Platform::Amd, n) if n.starts_with("gfx11") || n.starts_with("gfx12") => {
                    Dot4::Sudot4
                }
                (Platform::Amd, _) => Dot4::Sdot4,
            };
            assert_eq!(a.dot4, want, "{}", a.name);
        }
    }
}
