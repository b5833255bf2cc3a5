//! Matrix-core instructions as data (tinygrad's `tc.py` is the model): per instruction its
//! M×N×K, operand and accumulator types, lanes, and for each operand the fragment layout: which
//! matrix element every lane holds in every element slot of its registers. The prelude's
//! fragment helpers (load, compute, store, row reductions, accumulator-to-operand reuse) are
//! generated from these rows (`codegen/mma/helpers.rs`), and kernels index fragments only
//! through them. The rows live here, at the ground floor, because the target table lists them.
//!
//! Conventions: D = A·B + C with A M×K (row = m, col = k), B K×N (row = k, col = n), C and D
//! M×N (row = m, col = n).

pub mod atoms;
mod index;
pub mod wgmma;

use crate::ir::DType;

pub use index::{Field, Linear, Var};
pub use wgmma::WgmmaAtom;

/// The instruction family, which decides how a fragment is typed and how the MMA is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MmaKind {
    /// NVIDIA `mma.sync.aligned` (inline PTX); 16-bit operands packed two per 32-bit register.
    MmaSync,
    /// AMD CDNA `v_mfma_*` (clang builtins), wave64; operands and accumulators as vectors.
    Mfma,
    /// AMD RDNA3 `v_wmma_*` (wave32): each half-wave holds a full copy of A and of B.
    WmmaGfx11,
    /// AMD RDNA4 `v_wmma_*` (wave32): A and B are split between the half-waves.
    WmmaGfx12,
}

/// What the instruction does to its inputs before multiplying.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    /// The inputs are used as their type holds them (f16, bf16): products are exact.
    #[default]
    Exact,
    /// f32 inputs reduced to TF32 (8-bit exponent, 10-bit mantissa): NVIDIA's `.tf32` mma
    /// (operands rounded by `cvt.rna.tf32.f32`, to nearest, ties away from zero) and CDNA3's
    /// `xf32` MFMA. Only an f32 matmul that opts in (`codegen::F32Matmul::Tf32`) takes such an
    /// atom.
    Tf32,
}

impl Precision {
    /// `x` as the instruction sees it: for TF32, rounded to 10 mantissa bits to nearest with
    /// ties away from zero (`cvt.rna.tf32.f32`: add half an ulp of the kept mantissa to the
    /// magnitude, then clear the 13 dropped bits). Infinities and NaNs are left as they are.
    pub fn round(self, x: f32) -> f32 {
        match self {
            Precision::Exact => x,
            Precision::Tf32 if !x.is_finite() => x,
            Precision::Tf32 => f32::from_bits((x.to_bits() + 0x1000) & !0x1fff),
        }
    }
}

/// Where one bit of a lane index or element index goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bit {
    /// Bit `b` of the row coordinate.
    Row(u8),
    /// Bit `b` of the column coordinate.
    Col(u8),
    /// Nowhere: lanes that differ only in this bit hold the same elements (copies).
    Copy,
}

/// A fragment layout: the coordinates of element `e` of lane `l` are the sum, over the set bits
/// of `l` and `e`, of the coordinate bits they map to. Every layout of the vendors' matrix
/// instructions for 16-bit inputs is of this form (a permutation of index bits, plus copies).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    pub rows: u32,
    pub cols: u32,
    /// Bit i of the lane index goes to `lane_bits[i]`.
    pub lane_bits: &'static [Bit],
    /// Bit i of the element index goes to `elem_bits[i]`.
    pub elem_bits: &'static [Bit],
}

impl Layout {
    /// Elements each lane holds.
    pub fn elems(&self) -> u32 {
        1 << self.elem_bits.len()
    }

    pub fn lanes(&self) -> u32 {
        1 << self.lane_bits.len()
    }

    /// (row, col) of element `e` of lane `lane`.
    pub fn coord(&self, lane: u32, e: u32) -> (u32, u32) {
        (self.row().eval(lane, e), self.col().eval(lane, e))
    }

    /// The row coordinate as a sum of bit fields of the lane and element index.
    pub fn row(&self) -> Linear {
        self.coordinate(|b| match b {
            Bit::Row(i) => Some(i),
            _ => None,
        })
    }

    pub fn col(&self) -> Linear {
        self.coordinate(|b| match b {
            Bit::Col(i) => Some(i),
            _ => None,
        })
    }

    fn coordinate(&self, pick: impl Fn(Bit) -> Option<u8>) -> Linear {
        let mut fields = Vec::new();
        for (var, bits) in [(Var::Lane, self.lane_bits), (Var::Elem, self.elem_bits)] {
            for (i, &b) in bits.iter().enumerate() {
                if let Some(to) = pick(b) {
                    fields.push(Field::bit(var, i as u32, bits.len() as u32, 1 << to));
                }
            }
        }
        Linear::new(fields, 0).merged()
    }

    /// Distinct rows one lane holds, and which of them element `e` is in: the element bits that
    /// map to row bits, compacted. Row-wise work (softmax statistics) keeps one value per slot.
    pub fn row_slots(&self) -> u32 {
        1 << self
            .elem_bits
            .iter()
            .filter(|b| matches!(b, Bit::Row(_)))
            .count()
    }

    pub fn row_slot(&self) -> Linear {
        let mut fields = Vec::new();
        let n = self.elem_bits.len() as u32;
        let mut to = 0;
        for (i, b) in self.elem_bits.iter().enumerate() {
            if matches!(b, Bit::Row(_)) {
                fields.push(Field::bit(Var::Elem, i as u32, n, 1 << to));
                to += 1;
            }
        }
        Linear::new(fields, 0).merged()
    }

    /// The xor masks of the lanes that hold other columns of the same rows: a row reduction
    /// over a fragment is a reduction over the lane's own elements, then over these.
    pub fn row_lane_masks(&self) -> Vec<u32> {
        self.lane_bits
            .iter()
            .enumerate()
            .filter(|(_, b)| matches!(b, Bit::Col(_)))
            .map(|(i, _)| 1 << i)
            .collect()
    }
}

/// One matrix instruction (an atom of a larger tile).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MmaAtom {
    /// Names the helpers: `rf_<name>_mma`, `rf_<name>_load_a`, …
    pub name: &'static str,
    pub kind: MmaKind,
    pub m: u32,
    pub n: u32,
    pub k: u32,
    /// A and B element type (as stored: f32 for the TF32 atoms).
    pub input: DType,
    /// What the instruction does to the inputs (TF32 atoms round f32 to a 10-bit mantissa).
    pub precision: Precision,
    /// C and D element type.
    pub acc: DType,
    /// Lanes that execute it together (the wave).
    pub lanes: u32,
    pub a: Layout,
    pub b: Layout,
    pub c: Layout,
    /// The PTX instruction or the clang builtin that issues it.
    pub intrinsic: &'static str,
    /// The instruction as the ISA listing spells it (one of these appears in the disassembly;
    /// LLVM renamed some between CDNA2 and CDNA3).
    pub mnemonics: &'static [&'static str],
    /// Where the layouts come from.
    pub source: &'static str,
}

impl MmaAtom {
    /// The prefix of its generated helpers.
    pub fn prefix(&self) -> String {
        format!("rf_{}", self.name)
    }

    /// 32-bit registers a lane's fragment of `layout` takes: 16-bit inputs pack two to a
    /// register, f32 (TF32) inputs one.
    pub fn regs(&self, layout: &Layout) -> u32 {
        (layout.elems() * self.input.size_bytes() as u32).div_ceil(4)
    }

    /// Whether the operands are 16-bit (packed in pairs; `ldmatrix` and the 16-bit tiles serve
    /// them).
    pub fn packs_pairs(&self) -> bool {
        self.input.size_bytes() == 2
    }
}
