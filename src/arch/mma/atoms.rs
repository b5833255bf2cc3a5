//! The atoms. Each layout is transcribed from the vendor's documentation, cited per group;
//! `simulate.rs` checks every one against the documents' own formulas and by simulating the
//! instruction on the fragments the generated helpers load.
//!
//! Within a lane, the order in which A's and B's K elements sit in the registers only has to
//! agree between A and B (the instruction pairs slot i of A with slot i of B); the C layout
//! decides where results land and must be exact.

use super::{Bit, Layout, MmaAtom, MmaKind, Precision};
use crate::ir::DType;

use Bit::{Col, Copy, Row};

// ---- NVIDIA mma.sync.aligned.m16n8k16 (PTX ISA, "Warp-level matrix fragments", section
// "Matrix Fragments for mma.m16n8k16 with floating point type"; groupID = lane >> 2,
// threadID_in_group = lane % 4):
//   A (16x16, .row): a_i at row groupID + 8*((i >> 1) & 1), col 2*threadID_in_group + (i & 1) + 8*(i >> 2)
//   B (16x8, .col):  b_i at row 2*threadID_in_group + (i & 1) + 8*(i >> 1), col groupID
//   C (16x8):        c_i at row groupID + 8*(i >> 1), col 2*threadID_in_group + (i & 1)
const NV_A: Layout = Layout {
    rows: 16,
    cols: 16,
    lane_bits: &[Col(1), Col(2), Row(0), Row(1), Row(2)],
    elem_bits: &[Col(0), Row(3), Col(3)],
};
const NV_B: Layout = Layout {
    rows: 16,
    cols: 8,
    lane_bits: &[Row(1), Row(2), Col(0), Col(1), Col(2)],
    elem_bits: &[Row(0), Row(3)],
};
const NV_C: Layout = Layout {
    rows: 16,
    cols: 8,
    lane_bits: &[Col(1), Col(2), Row(0), Row(1), Row(2)],
    elem_bits: &[Col(0), Row(3)],
};
const NV_SOURCE: &str = "PTX ISA, Matrix Fragments for mma.m16n8k16 with floating point type";

pub static M16N8K16_F16: MmaAtom = MmaAtom {
    name: "m16n8k16_f16",
    kind: MmaKind::MmaSync,
    m: 16,
    n: 8,
    k: 16,
    input: DType::F16,
    precision: Precision::Exact,
    acc: DType::F32,
    lanes: 32,
    a: NV_A,
    b: NV_B,
    c: NV_C,
    intrinsic: "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
    mnemonics: &["mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"],
    source: NV_SOURCE,
};
pub static M16N8K16_BF16: MmaAtom = MmaAtom {
    name: "m16n8k16_bf16",
    input: DType::BF16,
    intrinsic: "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
    mnemonics: &["mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"],
    ..M16N8K16_F16
};

// ---- NVIDIA mma.sync.aligned.m16n8k8 with .tf32 inputs (PTX ISA, "Matrix Fragments for
// mma.m16n8k8", the .tf32 A and B tables; sm_80+). One 32-bit register per element; the
// operands are f32 rounded to TF32 by `cvt.rna.tf32.f32` when loaded (the instruction reads
// only the TF32 bits of each register):
//   A (16x8, .row): a_i at row groupID + 8*(i & 1), col threadID_in_group + 4*(i >> 1)
//   B (8x8, .col):  b_i at row threadID_in_group + 4*i, col groupID
//   C (16x8):       as m16n8k16
const NV_TF32_A: Layout = Layout {
    rows: 16,
    cols: 8,
    lane_bits: &[Col(0), Col(1), Row(0), Row(1), Row(2)],
    elem_bits: &[Row(3), Col(2)],
};
const NV_TF32_B: Layout = Layout {
    rows: 8,
    cols: 8,
    lane_bits: &[Row(0), Row(1), Col(0), Col(1), Col(2)],
    elem_bits: &[Row(2)],
};

pub static M16N8K8_TF32: MmaAtom = MmaAtom {
    name: "m16n8k8_tf32",
    kind: MmaKind::MmaSync,
    m: 16,
    n: 8,
    k: 8,
    input: DType::F32,
    precision: Precision::Tf32,
    acc: DType::F32,
    lanes: 32,
    a: NV_TF32_A,
    b: NV_TF32_B,
    c: NV_C,
    intrinsic: "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
    mnemonics: &["mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"],
    source: "PTX ISA, Matrix Fragments for mma.m16n8k8 (.tf32)",
};

// ---- AMD MFMA, wave64 (AMD Instinct MI200 / MI300 ISA reference, chapter "Matrix Arithmetic
// Instructions", and AMD's Matrix Instruction Calculator; the `_1k` bf16 forms take four bf16
// per lane exactly like f16):
//   32x32x8:  A[i][k]: lane i + 32*(k / 4), slot k % 4;  B[k][j]: lane j + 32*(k / 4), slot k % 4;
//             D[i][j]: lane j + 32*((i / 4) % 2), slot 4*(i / 8) + i % 4
//   16x16x16: A[i][k]: lane i + 16*(k / 4), slot k % 4;  B[k][j]: lane j + 16*(k / 4), slot k % 4;
//             D[i][j]: lane j + 16*(i / 4), slot i % 4
const MFMA32_A: Layout = Layout {
    rows: 32,
    cols: 8,
    lane_bits: &[Row(0), Row(1), Row(2), Row(3), Row(4), Col(2)],
    elem_bits: &[Col(0), Col(1)],
};
const MFMA32_B: Layout = Layout {
    rows: 8,
    cols: 32,
    lane_bits: &[Col(0), Col(1), Col(2), Col(3), Col(4), Row(2)],
    elem_bits: &[Row(0), Row(1)],
};
const MFMA32_C: Layout = Layout {
    rows: 32,
    cols: 32,
    lane_bits: &[Col(0), Col(1), Col(2), Col(3), Col(4), Row(2)],
    elem_bits: &[Row(0), Row(1), Row(3), Row(4)],
};
const MFMA16_A: Layout = Layout {
    rows: 16,
    cols: 16,
    lane_bits: &[Row(0), Row(1), Row(2), Row(3), Col(2), Col(3)],
    elem_bits: &[Col(0), Col(1)],
};
const MFMA16_B: Layout = Layout {
    rows: 16,
    cols: 16,
    lane_bits: &[Col(0), Col(1), Col(2), Col(3), Row(2), Row(3)],
    elem_bits: &[Row(0), Row(1)],
};
const MFMA16_C: Layout = Layout {
    rows: 16,
    cols: 16,
    lane_bits: &[Col(0), Col(1), Col(2), Col(3), Row(2), Row(3)],
    elem_bits: &[Row(0), Row(1)],
};
const MFMA_SOURCE: &str =
    "AMD Instinct MI200/MI300 ISA, Matrix Arithmetic Instructions (dense MFMA register layouts)";

pub static MFMA_32X32X8_F16: MmaAtom = MmaAtom {
    name: "mfma_32x32x8_f16",
    kind: MmaKind::Mfma,
    m: 32,
    n: 32,
    k: 8,
    input: DType::F16,
    precision: Precision::Exact,
    acc: DType::F32,
    lanes: 64,
    a: MFMA32_A,
    b: MFMA32_B,
    c: MFMA32_C,
    intrinsic: "__builtin_amdgcn_mfma_f32_32x32x8f16",
    mnemonics: &["v_mfma_f32_32x32x8f16", "v_mfma_f32_32x32x8_f16"],
    source: MFMA_SOURCE,
};
pub static MFMA_32X32X8_BF16: MmaAtom = MmaAtom {
    name: "mfma_32x32x8_bf16",
    input: DType::BF16,
    intrinsic: "__builtin_amdgcn_mfma_f32_32x32x8bf16_1k",
    mnemonics: &["v_mfma_f32_32x32x8bf16_1k", "v_mfma_f32_32x32x8_bf16"],
    ..MFMA_32X32X8_F16
};
pub static MFMA_16X16X16_F16: MmaAtom = MmaAtom {
    name: "mfma_16x16x16_f16",
    kind: MmaKind::Mfma,
    m: 16,
    n: 16,
    k: 16,
    input: DType::F16,
    precision: Precision::Exact,
    acc: DType::F32,
    lanes: 64,
    a: MFMA16_A,
    b: MFMA16_B,
    c: MFMA16_C,
    intrinsic: "__builtin_amdgcn_mfma_f32_16x16x16f16",
    mnemonics: &["v_mfma_f32_16x16x16f16", "v_mfma_f32_16x16x16_f16"],
    source: MFMA_SOURCE,
};
pub static MFMA_16X16X16_BF16: MmaAtom = MmaAtom {
    name: "mfma_16x16x16_bf16",
    input: DType::BF16,
    intrinsic: "__builtin_amdgcn_mfma_f32_16x16x16bf16_1k",
    mnemonics: &["v_mfma_f32_16x16x16bf16_1k", "v_mfma_f32_16x16x16_bf16"],
    ..MFMA_16X16X16_F16
};

// ---- AMD MFMA xf32, wave64, CDNA3 only (gfx940/941/942; AMD Instinct MI300 ISA, "Matrix
// Arithmetic Instructions": v_mfma_f32_32x32x4_xf32, v_mfma_f32_16x16x8_xf32; removed again in
// gfx950). f32 operands, two per lane, which the instruction reduces to xf32 (TF32's 10-bit
// mantissa) itself; K is spread over the lane groups exactly as the 16-bit forms spread theirs,
// with two values per lane instead of four (AMD's Matrix Instruction Calculator):
//   32x32x4: A[i][k]: lane i + 32*(k / 2), slot k % 2;  B[k][j]: lane j + 32*(k / 2), slot k % 2;
//            D as 32x32x8
//   16x16x8: A[i][k]: lane i + 16*(k / 2), slot k % 2;  B[k][j]: lane j + 16*(k / 2), slot k % 2;
//            D as 16x16x16
const MFMA32_XF32_A: Layout = Layout {
    rows: 32,
    cols: 4,
    lane_bits: &[Row(0), Row(1), Row(2), Row(3), Row(4), Col(1)],
    elem_bits: &[Col(0)],
};
const MFMA32_XF32_B: Layout = Layout {
    rows: 4,
    cols: 32,
    lane_bits: &[Col(0), Col(1), Col(2), Col(3), Col(4), Row(1)],
    elem_bits: &[Row(0)],
};
const MFMA16_XF32_A: Layout = Layout {
    rows: 16,
    cols: 8,
    lane_bits: &[Row(0), Row(1), Row(2), Row(3), Col(1), Col(2)],
    elem_bits: &[Col(0)],
};
const MFMA16_XF32_B: Layout = Layout {
    rows: 8,
    cols: 16,
    lane_bits: &[Col(0), Col(1), Col(2), Col(3), Row(1), Row(2)],
    elem_bits: &[Row(0)],
};
const MFMA_XF32_SOURCE: &str =
    "AMD Instinct MI300 ISA, Matrix Arithmetic Instructions (xf32 MFMA register layouts)";

pub static MFMA_32X32X4_XF32: MmaAtom = MmaAtom {
    name: "mfma_32x32x4_xf32",
    kind: MmaKind::Mfma,
    m: 32,
    n: 32,
    k: 4,
    input: DType::F32,
    precision: Precision::Tf32,
    acc: DType::F32,
    lanes: 64,
    a: MFMA32_XF32_A,
    b: MFMA32_XF32_B,
    c: MFMA32_C,
    intrinsic: "__builtin_amdgcn_mfma_f32_32x32x4_xf32",
    mnemonics: &["v_mfma_f32_32x32x4_xf32", "v_mfma_f32_32x32x4xf32"],
    source: MFMA_XF32_SOURCE,
};
pub static MFMA_16X16X8_XF32: MmaAtom = MmaAtom {
    name: "mfma_16x16x8_xf32",
    m: 16,
    n: 16,
    k: 8,
    a: MFMA16_XF32_A,
    b: MFMA16_XF32_B,
    c: MFMA16_C,
    intrinsic: "__builtin_amdgcn_mfma_f32_16x16x8_xf32",
    mnemonics: &["v_mfma_f32_16x16x8_xf32", "v_mfma_f32_16x16x8xf32"],
    ..MFMA_32X32X4_XF32
};

// ---- AMD WMMA on RDNA3, wave32 (RDNA3 ISA reference, section "Wave Matrix Multiply
// Accumulate (WMMA)"; GPUOpen, "How to accelerate AI applications on RDNA 3 using WMMA"):
//   A[i][k]: lanes i and i + 16 (a copy in each half-wave), slot k
//   B[k][j]: lanes j and j + 16, slot k
//   D[i][j] (f32): lane j + 16*(i % 2), slot i / 2
const WMMA11_A: Layout = Layout {
    rows: 16,
    cols: 16,
    lane_bits: &[Row(0), Row(1), Row(2), Row(3), Copy],
    elem_bits: &[Col(0), Col(1), Col(2), Col(3)],
};
const WMMA11_B: Layout = Layout {
    rows: 16,
    cols: 16,
    lane_bits: &[Col(0), Col(1), Col(2), Col(3), Copy],
    elem_bits: &[Row(0), Row(1), Row(2), Row(3)],
};
const WMMA11_C: Layout = Layout {
    rows: 16,
    cols: 16,
    lane_bits: &[Col(0), Col(1), Col(2), Col(3), Row(0)],
    elem_bits: &[Row(1), Row(2), Row(3)],
};

pub static WMMA11_16X16X16_F16: MmaAtom = MmaAtom {
    name: "wmma11_16x16x16_f16",
    kind: MmaKind::WmmaGfx11,
    m: 16,
    n: 16,
    k: 16,
    input: DType::F16,
    precision: Precision::Exact,
    acc: DType::F32,
    lanes: 32,
    a: WMMA11_A,
    b: WMMA11_B,
    c: WMMA11_C,
    intrinsic: "__builtin_amdgcn_wmma_f32_16x16x16_f16_w32",
    mnemonics: &["v_wmma_f32_16x16x16_f16"],
    source: "RDNA3 ISA, Wave Matrix Multiply Accumulate (WMMA)",
};
pub static WMMA11_16X16X16_BF16: MmaAtom = MmaAtom {
    name: "wmma11_16x16x16_bf16",
    input: DType::BF16,
    intrinsic: "__builtin_amdgcn_wmma_f32_16x16x16_bf16_w32",
    mnemonics: &["v_wmma_f32_16x16x16_bf16"],
    ..WMMA11_16X16X16_F16
};

// ---- AMD WMMA on RDNA4, wave32 (RDNA4 ISA reference, section "Wave Matrix Multiply
// Accumulate (WMMA)", 16-bit A/B and 32-bit C/D layouts for 16x16x16; AMD's Matrix Instruction
// Calculator, `--architecture rdna4 --instruction v_wmma_f32_16x16x16_f16 --detail-instruction`):
// no copies; K is split between the half-waves in groups of four: lanes 0-15 hold K {0-3, 8-11}
// of their row (A) or column (B), lanes 16-31 K {4-7, 12-15}. (Not K 0-7 / 8-15: that order
// gives right products only while A and B are both loaded in it, since the instruction pairs
// slot i of A with slot i of B; a fragment built from other register data would be wrong.)
//   A[i][k]: lane i + 16*((k / 4) % 2), slot k % 4 + 4*(k / 8)
//   B[k][j]: lane j + 16*((k / 4) % 2), slot k % 4 + 4*(k / 8)
//   D[i][j] (f32): lane j + 16*(i / 8), slot i % 8
const WMMA12_A: Layout = Layout {
    rows: 16,
    cols: 16,
    lane_bits: &[Row(0), Row(1), Row(2), Row(3), Col(2)],
    elem_bits: &[Col(0), Col(1), Col(3)],
};
const WMMA12_B: Layout = Layout {
    rows: 16,
    cols: 16,
    lane_bits: &[Col(0), Col(1), Col(2), Col(3), Row(2)],
    elem_bits: &[Row(0), Row(1), Row(3)],
};
const WMMA12_C: Layout = Layout {
    rows: 16,
    cols: 16,
    lane_bits: &[Col(0), Col(1), Col(2), Col(3), Row(3)],
    elem_bits: &[Row(0), Row(1), Row(2)],
};

pub static WMMA12_16X16X16_F16: MmaAtom = MmaAtom {
    name: "wmma12_16x16x16_f16",
    kind: MmaKind::WmmaGfx12,
    m: 16,
    n: 16,
    k: 16,
    input: DType::F16,
    precision: Precision::Exact,
    acc: DType::F32,
    lanes: 32,
    a: WMMA12_A,
    b: WMMA12_B,
    c: WMMA12_C,
    intrinsic: "__builtin_amdgcn_wmma_f32_16x16x16_f16_w32_gfx12",
    mnemonics: &["v_wmma_f32_16x16x16_f16"],
    source: "RDNA4 ISA, Wave Matrix Multiply Accumulate (WMMA)",
};
pub static WMMA12_16X16X16_BF16: MmaAtom = MmaAtom {
    name: "wmma12_16x16x16_bf16",
    input: DType::BF16,
    intrinsic: "__builtin_amdgcn_wmma_f32_16x16x16_bf16_w32_gfx12",
    mnemonics: &["v_wmma_f32_16x16x16_bf16"],
    ..WMMA12_16X16X16_F16
};

/// Every atom, for tests and listings.
pub static ALL: &[&MmaAtom] = &[
    &M16N8K16_F16,
    &M16N8K16_BF16,
    &MFMA_32X32X8_F16,
    &MFMA_32X32X8_BF16,
    &MFMA_16X16X16_F16,
    &MFMA_16X16X16_BF16,
    &WMMA11_16X16X16_F16,
    &WMMA11_16X16X16_BF16,
    &WMMA12_16X16X16_F16,
    &WMMA12_16X16X16_BF16,
    &M16N8K8_TF32,
    &MFMA_32X32X4_XF32,
    &MFMA_16X16X8_XF32,
];
