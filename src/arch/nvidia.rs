//! NVIDIA processors. Sources: the CUDA C++ Programming Guide ("Compute Capabilities":
//! shared memory per block, opt-in included) and the PTX ISA (`mma`, `cp.async` and
//! `cp.async.bulk.tensor` target requirements). Statically declared shared memory is capped at
//! 48 KiB on every one of them.

use super::caps::{Arch, ArchSpecific, AsyncCopy, Dot4, Registers};
use super::Platform;
use crate::arch::mma::atoms::{M16N8K16_BF16, M16N8K16_F16, M16N8K8_TF32};
use crate::arch::mma::wgmma::{WGMMA_M64K16_BF16, WGMMA_M64K16_F16};
use crate::arch::mma::{MmaAtom, WgmmaAtom};

const STATIC_SHARED: u32 = 48 * 1024;
/// `mma.sync.m16n8k16` with f16 or bf16 inputs, and `mma.sync.m16n8k8` with tf32 inputs (taken
/// only by an f32 matmul that opts in to TF32): sm_80 and later.
const MMA_SYNC: &[&MmaAtom] = &[&M16N8K16_F16, &M16N8K16_BF16, &M16N8K8_TF32];

/// `wgmma.mma_async.m64nNk16` with f16 or bf16 inputs and f32 accumulators: sm_90a.
const WGMMA: &[&WgmmaAtom] = &[&WGMMA_M64K16_F16, &WGMMA_M64K16_BF16];

const fn nvidia(
    name: &'static str,
    family: &'static str,
    shared_bytes_per_block: u32,
    async_copy: AsyncCopy,
    mma: &'static [&'static MmaAtom],
    variants: &'static [&'static str],
) -> Arch {
    Arch {
        name,
        family,
        platform: Platform::Nvidia,
        wave_size: 32,
        shared_bytes_per_block,
        static_shared_bytes: STATIC_SHARED,
        async_copy,
        mma,
        features: &[],
        variants,
        wgmma: &[],
        setmaxnreg: false,
        grid_dependency: false,
        specific_of: None,
        isa_version: None,
        hiprtc_since_rocm: None,
        // 64 K 32-bit registers per SM (2048 per lane of a warp slot), at most 255 per thread,
        // allocated per warp in units of 256 (8 per lane): CUDA Programming Guide, "Compute
        // Capabilities", table of technical specifications (sm_70 to sm_90).
        registers: Registers {
            file: 2048,
            per_wave: 255,
            simds: 1,
            granule: 8,
        },
        // `__dp4a`: compute capability 6.1 and later (PTX `dp4a`, sm_61+), every row here.
        dot4: Dot4::Dp4a,
    }
}

/// V100: tensor cores through `mma.m8n8k4` only, which has no atom here.
pub static SM_70: Arch = nvidia("sm_70", "Volta", 96 * 1024, AsyncCopy::None, &[], &[]);
/// T4, RTX 20: `mma.m16n8k8` (no k16 for f16, no bf16): no atom here.
pub static SM_75: Arch = nvidia("sm_75", "Turing", 64 * 1024, AsyncCopy::None, &[], &[]);
/// A100.
pub static SM_80: Arch = nvidia(
    "sm_80",
    "Ampere",
    163 * 1024,
    AsyncCopy::CpAsync,
    MMA_SYNC,
    &[],
);
/// RTX 30, A10, A40.
pub static SM_86: Arch = nvidia(
    "sm_86",
    "Ampere",
    99 * 1024,
    AsyncCopy::CpAsync,
    MMA_SYNC,
    &[],
);
/// Jetson Orin.
pub static SM_87: Arch = nvidia(
    "sm_87",
    "Ampere",
    163 * 1024,
    AsyncCopy::CpAsync,
    MMA_SYNC,
    &[],
);
/// RTX 40, L4, L40.
pub static SM_89: Arch = nvidia("sm_89", "Ada", 99 * 1024, AsyncCopy::CpAsync, MMA_SYNC, &[]);
/// Programmatic dependent launch (`griddepcontrol.wait` / `.launch_dependents`): PTX ISA,
/// "Target ISA notes" of `griddepcontrol` ("requires sm_90 or higher").
const GRID_DEPENDENCY: bool = true;

/// H100, H200, portable code (`sm_90a` below adds wgmma and setmaxnreg).
pub static SM_90: Arch = Arch {
    grid_dependency: GRID_DEPENDENCY,
    ..nvidia("sm_90", "Hopper", 227 * 1024, AsyncCopy::Tma, MMA_SYNC, &[])
};
/// H100, H200, arch-specific code: PTX ISA, "Target ISA notes" for `wgmma.mma_async` and
/// `setmaxnreg` ("requires sm_90a"); NVRTC compiles for `sm_90a` from CUDA 12.0. Code for it
/// runs on compute capability 9.0 only, which is what a device of that capability gets.
pub static SM_90A: Arch = Arch {
    name: "sm_90a",
    wgmma: WGMMA,
    setmaxnreg: true,
    grid_dependency: GRID_DEPENDENCY,
    specific_of: Some(ArchSpecific {
        of: "sm_90",
        nvrtc_since: (12, 0),
    }),
    ..nvidia(
        "sm_90a",
        "Hopper",
        227 * 1024,
        AsyncCopy::Tma,
        MMA_SYNC,
        &[],
    )
};
/// B200.
pub static SM_100: Arch = Arch {
    grid_dependency: GRID_DEPENDENCY,
    ..nvidia(
        "sm_100",
        "Blackwell",
        227 * 1024,
        AsyncCopy::Tma,
        MMA_SYNC,
        &["a", "f"],
    )
};
/// RTX 50.
pub static SM_120: Arch = Arch {
    grid_dependency: GRID_DEPENDENCY,
    ..nvidia(
        "sm_120",
        "Blackwell",
        99 * 1024,
        AsyncCopy::Tma,
        MMA_SYNC,
        &["a", "f"],
    )
};

pub static NVIDIA: &[&Arch] = &[
    &SM_70, &SM_75, &SM_80, &SM_86, &SM_87, &SM_89, &SM_90, &SM_90A, &SM_100, &SM_120,
];
