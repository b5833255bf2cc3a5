//! AMD processors. Sources: the ISA reference guides (CDNA1–3, RDNA2–4: "Wavefront size",
//! "Local data share" and the matrix chapters) and LLVM's AMDGPUUsage processor table.
//! LDS is what one workgroup may allocate (64 KiB on all of these; an RDNA WGP has 128 KiB
//! but a workgroup still sees 64). The matrix atoms are listed where the ISA has them for
//! f16/bf16 inputs with f32 accumulation (see `codegen::mma`). `hiprtc_since_rocm` is the ROCm
//! release that lists the processor as supported; where unsure we give the later release, which
//! only means the offline clang is used where an older hiprtc might also have worked.

use super::caps::{Arch, AsyncCopy, Dot4, Registers};
use super::Platform;
use crate::arch::mma::atoms::{
    MFMA_16X16X16_BF16, MFMA_16X16X16_F16, MFMA_16X16X8_XF32, MFMA_32X32X4_XF32, MFMA_32X32X8_BF16,
    MFMA_32X32X8_F16, WMMA11_16X16X16_BF16, WMMA11_16X16X16_F16, WMMA12_16X16X16_BF16,
    WMMA12_16X16X16_F16,
};

const LDS: u32 = 64 * 1024;
const XNACK_SRAMECC: &[&str] = &["sramecc", "xnack"];

/// Rows that differ only in name, ISA version, hiprtc support and register file.
#[allow(clippy::too_many_arguments)]
const fn amd(
    name: &'static str,
    family: &'static str,
    wave_size: u32,
    mma: &'static [&'static crate::arch::mma::MmaAtom],
    features: &'static [&'static str],
    isa_version: (u32, u32, u32),
    hiprtc_since_rocm: (u32, u32),
    registers: Registers,
    dot4: Dot4,
) -> Arch {
    Arch {
        name,
        family,
        platform: Platform::Amd,
        wave_size,
        shared_bytes_per_block: LDS,
        static_shared_bytes: LDS,
        // CDNA can load into LDS directly (`buffer_load ... lds`), one dword per lane; no kernel
        // here uses it, so it is not offered.
        async_copy: AsyncCopy::None,
        mma,
        features,
        variants: &[],
        wgmma: &[],
        setmaxnreg: false,
        // AMD has no programmatic dependent launch: every launch waits for the one before it.
        grid_dependency: false,
        specific_of: None,
        isa_version: Some(isa_version),
        hiprtc_since_rocm: Some(hiprtc_since_rocm),
        registers,
        dot4,
    }
}

// Vector register files (LLVM AMDGPUBaseInfo.cpp, `getTotalNumVGPRs` and
// `getAddressableNumVGPRs`; AMD's ISA guides give the same sizes): GCN/CDNA1 256 per lane of
// a wave64 SIMD (CDNA1's AccVGPRs hold only MFMA operands and are not counted); CDNA2/3 one
// unified file of 512 (VGPRs and AccVGPRs); RDNA wave32 1024 per lane, 1536 on the parts with
// the larger file (gfx1100, gfx1101),
// 256 addressable per wave (RDNA4 is given the smaller file, the safe side, until its size is
// confirmed). Waves of a block spread over 4 SIMDs (`getEUsPerCU`: gfx9, and
// gfx10+ in WGP mode, the compilers' default).
const GCN_REGS: Registers = Registers {
    file: 256,
    per_wave: 256,
    simds: 4,
    granule: 4,
};
const CDNA2_REGS: Registers = Registers {
    file: 512,
    per_wave: 512,
    simds: 4,
    granule: 8,
};
const RDNA_REGS: Registers = Registers {
    file: 1024,
    per_wave: 256,
    simds: 4,
    granule: 8,
};
const RDNA3_LARGE_REGS: Registers = Registers {
    file: 1536,
    ..RDNA_REGS
};

/// MI50/MI60: no matrix cores (dot-product instructions only).
pub static GFX906: Arch = amd(
    "gfx906",
    "GCN5 (Vega 20)",
    64,
    &[],
    XNACK_SRAMECC,
    (9, 0, 6),
    (2, 0),
    GCN_REGS,
    Dot4::Sdot4,
);
/// MI100: MFMA for f16; its bf16 MFMA (`32x32x4bf16`, two values per lane) predates the `_1k`
/// forms and has no atom here.
pub static GFX908: Arch = amd(
    "gfx908",
    "CDNA1",
    64,
    &[&MFMA_32X32X8_F16, &MFMA_16X16X16_F16],
    XNACK_SRAMECC,
    (9, 0, 8),
    (4, 0),
    GCN_REGS,
    Dot4::Sdot4,
);
/// MI200.
pub static GFX90A: Arch = amd(
    "gfx90a",
    "CDNA2",
    64,
    &[
        &MFMA_32X32X8_F16,
        &MFMA_16X16X16_F16,
        &MFMA_32X32X8_BF16,
        &MFMA_16X16X16_BF16,
    ],
    XNACK_SRAMECC,
    (9, 0, 10),
    (4, 5),
    CDNA2_REGS,
    Dot4::Sdot4,
);
/// MI300: the CDNA2 atoms, and the xf32 MFMA (f32 inputs at TF32 precision; taken only by an
/// f32 matmul that opts in to TF32). gfx90a has no xf32 form.
pub static GFX942: Arch = amd(
    "gfx942",
    "CDNA3",
    64,
    &[
        &MFMA_32X32X8_F16,
        &MFMA_16X16X16_F16,
        &MFMA_32X32X8_BF16,
        &MFMA_16X16X16_BF16,
        &MFMA_32X32X4_XF32,
        &MFMA_16X16X8_XF32,
    ],
    XNACK_SRAMECC,
    (9, 4, 2),
    (6, 0),
    CDNA2_REGS,
    Dot4::Sdot4,
);
/// RX 6800/6900, W6800: no matrix instructions.
pub static GFX1030: Arch = amd(
    "gfx1030",
    "RDNA2",
    32,
    &[],
    &[],
    (10, 3, 0),
    (5, 0),
    RDNA_REGS,
    Dot4::Sdot4,
);
/// RDNA3: WMMA with A and B replicated across the two half-waves.
const RDNA3_MMA: &[&crate::arch::mma::MmaAtom] = &[&WMMA11_16X16X16_F16, &WMMA11_16X16X16_BF16];
/// RX 7900.
pub static GFX1100: Arch = amd(
    "gfx1100",
    "RDNA3",
    32,
    RDNA3_MMA,
    &[],
    (11, 0, 0),
    (5, 7),
    RDNA3_LARGE_REGS,
    Dot4::Sudot4,
);
/// RX 7800/7700.
pub static GFX1101: Arch = amd(
    "gfx1101",
    "RDNA3",
    32,
    RDNA3_MMA,
    &[],
    (11, 0, 1),
    (5, 7),
    RDNA3_LARGE_REGS,
    Dot4::Sudot4,
);
/// RX 7600.
pub static GFX1102: Arch = amd(
    "gfx1102",
    "RDNA3",
    32,
    RDNA3_MMA,
    &[],
    (11, 0, 2),
    (5, 7),
    RDNA_REGS,
    Dot4::Sudot4,
);
/// RDNA4: WMMA with A and B split between the half-waves.
const RDNA4_MMA: &[&crate::arch::mma::MmaAtom] = &[&WMMA12_16X16X16_F16, &WMMA12_16X16X16_BF16];
/// RX 9060.
pub static GFX1200: Arch = amd(
    "gfx1200",
    "RDNA4",
    32,
    RDNA4_MMA,
    &[],
    (12, 0, 0),
    (6, 4),
    RDNA_REGS,
    Dot4::Sudot4,
);
/// RX 9070.
pub static GFX1201: Arch = amd(
    "gfx1201",
    "RDNA4",
    32,
    RDNA4_MMA,
    &[],
    (12, 0, 1),
    (6, 4),
    RDNA_REGS,
    Dot4::Sudot4,
);

pub static AMD: &[&Arch] = &[
    &GFX906, &GFX908, &GFX90A, &GFX942, &GFX1030, &GFX1100, &GFX1101, &GFX1102, &GFX1200, &GFX1201,
];
