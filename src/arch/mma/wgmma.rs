//! Warpgroup MMA (`wgmma.mma_async`, sm_90a) as data. Unlike the fragment atoms (`atoms.rs`),
//! A and B are read from shared memory through 64-bit matrix descriptors, so an atom is its
//! accumulator layout (registers, like the others) plus the shared-memory layout its operands
//! must be stored in and the descriptor that names it. The kernel stores tiles with
//! [`SmemLayout::offset`] (its C twin [`SmemLayout::offset_c`]) and issues descriptors made by
//! [`SmemLayout::descriptor`]; the tests decode those descriptors the way the PTX ISA says the
//! tensor cores do and multiply, so a store layout, a descriptor field or an accumulator map
//! that disagrees with the documented hardware fails on the CPU.
//!
//! Sources: PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate Instructions":
//! "Register Fragments and Shared Memory Matrix Layouts" (D for m64nNk16: row
//! `16 * warp + groupID + 8 * ((i >> 1) & 1)`, column `8 * (i >> 2) + 2 * threadID_in_group +
//! (i & 1)`, i in 0..N/2), "Matrix Descriptor Format" (start address, leading and stride byte
//! offsets in 16-byte units, swizzle mode in bits 62-63), "Shared Memory Matrix Layout"
//! (K-major 128-byte swizzle: 8 rows of 128 bytes form a 1024-byte atom, the 16-byte chunk index
//! XORed with the row within the atom).

use super::{Bit, Layout};
use crate::ir::DType;

use Bit::{Col, Row};

/// Threads of a warpgroup: four consecutive warps, the first at a warp index divisible by 4.
pub const WARPGROUP: u32 = 128;

/// The shared-memory swizzle of a wgmma operand tile (K-major). Only the 128-byte mode is
/// modelled: a row of 64 16-bit elements is one 128-byte line, the widest K step per stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Swizzle {
    /// 128-byte swizzle (descriptor layout type 1; CUTLASS `Swizzle<3,4,3>`): address bits
    /// 4..7 (the 16-byte chunk within a line) XOR bits 7..10 (the line within a 1024-byte atom).
    B128,
}

impl Swizzle {
    /// The descriptor's layout-type field (bits 62-63).
    pub fn descriptor_bits(self) -> u64 {
        match self {
            Swizzle::B128 => 1,
        }
    }

    /// Bytes of one line (a row of the K-major tile).
    pub fn line_bytes(self) -> u32 {
        match self {
            Swizzle::B128 => 128,
        }
    }

    /// The address alignment the tile base needs, so that the hardware's swizzle (a function
    /// of address bits) and ours (a function of the offset) agree.
    pub fn atom_bytes(self) -> u32 {
        match self {
            Swizzle::B128 => 1024,
        }
    }

    /// The physical byte address of an unswizzled address, as the hardware applies it.
    pub fn apply(self, addr: u32) -> u32 {
        match self {
            Swizzle::B128 => addr ^ (((addr >> 7) & 7) << 4),
        }
    }
}

/// How one K-major operand tile (rows × `k_tile` 16-bit elements; A's rows are M, B's are N)
/// sits in shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SmemLayout {
    pub swizzle: Swizzle,
    /// Bytes per element (2 for f16 and bf16).
    pub elem_bytes: u32,
}

impl SmemLayout {
    pub const K_MAJOR_B128_16BIT: SmemLayout = SmemLayout {
        swizzle: Swizzle::B128,
        elem_bytes: 2,
    };

    /// Elements of K one line holds: the tile's K extent per stage.
    pub fn k_tile(&self) -> u32 {
        self.swizzle.line_bytes() / self.elem_bytes
    }

    /// Elements per 16-byte chunk: the unit one `cp.async` (or TMA) moves and the swizzle permutes.
    pub fn chunk_elems(&self) -> u32 {
        16 / self.elem_bytes
    }

    /// Byte offset of element (`row`, `k`) in the tile (`k` < [`Self::k_tile`]), the base being
    /// aligned to [`Swizzle::atom_bytes`].
    pub fn offset(&self, row: u32, k: u32) -> u32 {
        let line = self.swizzle.line_bytes();
        self.swizzle.apply(row * line + k * self.elem_bytes)
    }

    /// [`Self::offset`] in C, of `int` expressions `row` and `k`, for the kernel's stores.
    pub fn offset_c(&self, row: &str, k: &str) -> String {
        match self.swizzle {
            Swizzle::B128 => format!(
                "((({row}) << 7) + (((({k}) >> 3) ^ (({row}) & 7)) << 4) + ((({k}) & 7) << 1))"
            ),
        }
    }

    /// Bytes between consecutive groups of 8 rows (the descriptor's stride byte offset).
    pub fn stride_bytes(&self) -> u32 {
        8 * self.swizzle.line_bytes()
    }

    /// The matrix descriptor of the sub-tile that starts at shared address `addr` (the tile
    /// base plus `k0 * elem_bytes` for the K step at `k0`: within a swizzled line the hardware
    /// swizzles the address it forms, so stepping K is adding bytes to the start address).
    /// Leading byte offset: unused for swizzled K-major layouts; 1 as CUTLASS sets it.
    pub fn descriptor(&self, addr: u32) -> u64 {
        let enc = |x: u32| ((x as u64) & 0x3FFFF) >> 4;
        enc(addr)
            | (1u64 << 16)
            | (enc(self.stride_bytes()) << 32)
            | (self.swizzle.descriptor_bits() << 62)
    }

    /// The C expression of [`Self::descriptor`] of a `uint32_t` shared address `addr`.
    pub fn descriptor_c(&self, addr: &str) -> String {
        format!(
            "((((unsigned long long)({addr}) & 0x3FFFFULL) >> 4) | (1ULL << 16) | ({}ULL << 32) | ({}ULL << 62))",
            self.stride_bytes() >> 4,
            self.swizzle.descriptor_bits()
        )
    }
}

impl SmemLayout {
    /// The descriptor of an MN-major operand (`imm-trans-b` 1: B stored with N contiguous, as
    /// V `[keys][head]` is for P·V) whose tile is stored as [`Self::offset`] puts a K-major
    /// one, lines now running along N: line `k` holds N elements `64 p .. 64 p + 63` of panel
    /// `p`, panels `panel_bytes` apart. For swizzled MN-major layouts the PTX ISA's (and
    /// CUTLASS's) canonical form is ((8, 8, n), (8, k)) : ((1, 8, LBO), (64, SBO)) in elements:
    /// the leading byte offset steps the 64-element panels along N, the stride byte offset the
    /// groups of 8 lines along K. Stepping K by 16 is adding 16 lines (2048 bytes) to the start.
    pub fn descriptor_mn(&self, addr: u32, panel_bytes: u32) -> u64 {
        let enc = |x: u32| ((x as u64) & 0x3FFFF) >> 4;
        enc(addr)
            | (enc(panel_bytes) << 16)
            | (enc(self.stride_bytes()) << 32)
            | (self.swizzle.descriptor_bits() << 62)
    }

    /// The C expression of [`Self::descriptor_mn`] of a `uint32_t` shared address `addr`.
    pub fn descriptor_mn_c(&self, addr: &str, panel_bytes: u32) -> String {
        format!(
            "((((unsigned long long)({addr}) & 0x3FFFFULL) >> 4) | ({}ULL << 16) | ({}ULL << 32) | ({}ULL << 62))",
            (panel_bytes & 0x3FFFF) >> 4,
            self.stride_bytes() >> 4,
            self.swizzle.descriptor_bits()
        )
    }
}

/// A of m64nNk16 in registers (the `wgmma` form whose A is four `.b32` registers of two 16-bit
/// values each): element i of a thread sits where element i of the N = 16 accumulator layout
/// sits (PTX ISA, "Register Fragments", matrix A of m64nNk16). So the accumulators of 16
/// adjacent columns of an S tile, converted in place, are the A operand of the next product:
/// what FlashAttention's P·V reads without leaving registers (asserted in the tests).
pub const WGMMA_A_REGS: Layout = Layout {
    rows: 64,
    cols: 16,
    lane_bits: &[Col(1), Col(2), Row(0), Row(1), Row(2), Row(4), Row(5)],
    elem_bits: &[Col(0), Row(3), Col(3)],
};

/// One warpgroup MMA shape family: `wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}` for
/// N in 8..=256, a multiple of 8.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WgmmaAtom {
    pub name: &'static str,
    pub m: u32,
    pub k: u32,
    pub input: DType,
    pub acc: DType,
    /// A and B as they sit in shared memory.
    pub smem: SmemLayout,
    /// The accumulator layout at the largest N (256); a smaller N keeps its first
    /// `2 + log2(N / 8)` element bits (see [`WgmmaAtom::c`]).
    pub c_max: Layout,
    /// The PTX type suffix of A and B.
    pub ptx_type: &'static str,
    /// The SASS mnemonic a kernel that issues it shows.
    pub sass: &'static str,
    pub source: &'static str,
}

/// D of m64n256k16: lane bits (0-4 the lane in the warp, 5-6 the warp) and element bits, from
/// the PTX formula in the module comment. Element bits past the second step the 8-column groups.
const WGMMA_C_MAX: Layout = Layout {
    rows: 64,
    cols: 256,
    lane_bits: &[Col(1), Col(2), Row(0), Row(1), Row(2), Row(4), Row(5)],
    elem_bits: &[Col(0), Row(3), Col(3), Col(4), Col(5), Col(6), Col(7)],
};

pub static WGMMA_M64K16_F16: WgmmaAtom = WgmmaAtom {
    name: "wgmma_m64k16_f16",
    m: 64,
    k: 16,
    input: DType::F16,
    acc: DType::F32,
    smem: SmemLayout::K_MAJOR_B128_16BIT,
    c_max: WGMMA_C_MAX,
    ptx_type: "f16",
    sass: "HGMMA",
    source:
        "PTX ISA, wgmma.mma_async: register fragments, matrix descriptor, shared memory layouts",
};
pub static WGMMA_M64K16_BF16: WgmmaAtom = WgmmaAtom {
    name: "wgmma_m64k16_bf16",
    input: DType::BF16,
    ptx_type: "bf16",
    ..WGMMA_M64K16_F16
};

impl WgmmaAtom {
    /// The accumulator layout for N = `n` (a power of two from 8 to 256: the element bits are
    /// a prefix of the largest layout's; other multiples of 8 are valid PTX but not modelled).
    pub fn c(&self, n: u32) -> Option<Layout> {
        if !(8..=256).contains(&n) || !n.is_power_of_two() {
            return None;
        }
        let bits = 2 + (n / 8).trailing_zeros() as usize;
        Some(Layout {
            rows: self.m,
            cols: n,
            lane_bits: self.c_max.lane_bits,
            elem_bits: &self.c_max.elem_bits[..bits],
        })
    }

    /// The instruction for N = `n`, A and B both from descriptors, D += A·B (scale-d an input).
    pub fn instruction(&self, n: u32) -> String {
        format!(
            "wgmma.mma_async.sync.aligned.m{}n{n}k{}.f32.{t}.{t}",
            self.m,
            self.k,
            t = self.ptx_type
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic small-integer matrix: products and sums of these are exact in f32.
    fn value(seed: u32, r: u32, c: u32) -> f32 {
        ((r.wrapping_mul(7) + c.wrapping_mul(13) + seed * 5) % 9) as f32 - 4.0
    }

    /// Shared memory as bytes holding f32 stand-ins for the 16-bit values: each 2-byte slot
    /// keeps the index of the element stored there, so a decoded read names what it found.
    struct Smem {
        slots: Vec<Option<(u32, u32)>>,
    }

    impl Smem {
        fn new(bytes: u32) -> Smem {
            Smem {
                slots: vec![None; (bytes / 2) as usize],
            }
        }
        /// The producer: element (row, k) of a rows × k_tile tile stored at `base` through the
        /// layout the kernel uses.
        fn store_tile(&mut self, l: &SmemLayout, base: u32, rows: u32) {
            for r in 0..rows {
                for k in 0..l.k_tile() {
                    let at = base + l.offset(r, k);
                    let slot = &mut self.slots[(at / 2) as usize];
                    assert!(slot.is_none(), "two elements stored at byte {at}");
                    *slot = Some((r, k));
                }
            }
        }
    }

    /// The tensor core's read of a K-major operand: element (row, kk) of the rows × 16 matrix a
    /// descriptor names, decoded as the PTX ISA describes (start address in 16-byte units;
    /// 8-row groups `stride` bytes apart; rows of a group one line apart; the swizzle applied
    /// to the address formed).
    fn read(smem: &Smem, desc: u64, row: u32, kk: u32) -> Option<(u32, u32)> {
        let start = ((desc & 0x3FFF) as u32) << 4;
        let stride = (((desc >> 32) & 0x3FFF) as u32) << 4;
        let swizzle = match desc >> 62 {
            1 => Swizzle::B128,
            other => panic!("layout type {other} is not modelled"),
        };
        let addr = start + (row / 8) * stride + (row % 8) * swizzle.line_bytes() + kk * 2;
        smem.slots[(swizzle.apply(addr) / 2) as usize]
    }

    /// D = A·B for one m64nNk64 stage, through the stored tiles, the K-stepped descriptors and
    /// the accumulator layout; compared with the product of the logical matrices.
    fn stage_product(
        atom: &WgmmaAtom,
        n: u32,
        layout: &SmemLayout,
        descriptor: impl Fn(u32) -> u64,
    ) {
        let (m, kt) = (atom.m, layout.k_tile());
        let a_base = 0;
        let b_base = m * layout.swizzle.line_bytes();
        assert_eq!(b_base % layout.swizzle.atom_bytes(), 0);
        let mut smem = Smem::new(b_base + n * layout.swizzle.line_bytes());
        smem.store_tile(layout, a_base, m);
        smem.store_tile(layout, b_base, n);
        let c = atom.c(n).expect("modelled N");
        let mut d = vec![0f32; (WARPGROUP * c.elems()) as usize];
        for k0 in (0..kt).step_by(atom.k as usize) {
            let (da, db) = (descriptor(a_base + k0 * 2), descriptor(b_base + k0 * 2));
            for t in 0..WARPGROUP {
                for e in 0..c.elems() {
                    let (i, j) = c.coord(t, e);
                    let mut sum = 0f32;
                    for kk in 0..atom.k {
                        let (ar, ak) = read(&smem, da, i, kk).expect("A element stored");
                        let (bn, bk) = read(&smem, db, j, kk).expect("B element stored");
                        sum += value(1, ar, ak) * value(2, bk, bn);
                    }
                    d[(t * c.elems() + e) as usize] += sum;
                }
            }
        }
        let mut seen = vec![false; (m * n) as usize];
        for t in 0..WARPGROUP {
            for e in 0..c.elems() {
                let (i, j) = c.coord(t, e);
                assert!(i < m && j < n, "({i}, {j}) outside {m}x{n}");
                assert!(!seen[(i * n + j) as usize], "({i}, {j}) held twice");
                seen[(i * n + j) as usize] = true;
                let want: f32 = (0..kt).map(|k| value(1, i, k) * value(2, k, j)).sum();
                assert_eq!(d[(t * c.elems() + e) as usize], want, "D[{i}][{j}], N {n}");
            }
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn stored_tiles_and_descriptors_multiply_exactly() {
        for atom in [&WGMMA_M64K16_F16, &WGMMA_M64K16_BF16] {
            for n in [8, 16, 32, 64, 128, 256] {
                stage_product(atom, n, &atom.smem, |a| atom.smem.descriptor(a));
            }
        }
    }

    /// The C layout matches the PTX formula for D directly, lane by lane.
    #[test]
    fn accumulator_layout_is_the_documented_formula() {
        let c = WGMMA_M64K16_BF16.c(256).unwrap();
        for t in 0..WARPGROUP {
            let (warp, lane) = (t / 32, t % 32);
            let (group, tig) = (lane >> 2, lane % 4);
            for i in 0..128 {
                let want = (
                    16 * warp + group + 8 * ((i >> 1) & 1),
                    8 * (i >> 2) + 2 * tig + (i & 1),
                );
                assert_eq!(c.coord(t, i), want, "thread {t}, element {i}");
            }
        }
        assert_eq!(WGMMA_M64K16_F16.c(128).unwrap().elems(), 64);
        assert!(WGMMA_M64K16_F16.c(96).is_none() && WGMMA_M64K16_F16.c(512).is_none());
        assert_eq!(
            WGMMA_M64K16_BF16.instruction(128),
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"
        );
    }

    /// A store layout without the swizzle, or a descriptor with the wrong stride, reads other
    /// elements than it stored: the simulation catches both.
    #[test]
    fn a_wrong_layout_or_descriptor_is_caught() {
        let atom = &WGMMA_M64K16_BF16;
        let wrong_stride = |a: u32| {
            let d = atom.smem.descriptor(a);
            (d & !(0x3FFFu64 << 32)) | ((512u64 >> 4) << 32)
        };
        let r = std::panic::catch_unwind(|| stage_product(atom, 64, &atom.smem, wrong_stride));
        assert!(r.is_err(), "a 512-byte stride must not pass");
        // Stores that ignore the swizzle: read through a swizzling descriptor they disagree.
        let mut smem = Smem::new(64 * 128);
        for r in 0..64 {
            for k in 0..64 {
                smem.slots[((r * 128 + k * 2) / 2) as usize] = Some((r, k));
            }
        }
        let d = atom.smem.descriptor(0);
        let wrong = (0..64)
            .flat_map(|r| (0..16).map(move |k| (r, k)))
            .filter(|&(r, k)| read(&smem, d, r, k) != Some((r, k)))
            .count();
        assert!(wrong > 0);
        // The swizzled store itself is read back element for element.
        let mut smem = Smem::new(64 * 128);
        smem.store_tile(&atom.smem, 0, 64);
        for k0 in [0, 16, 32, 48] {
            let d = atom.smem.descriptor(k0 * 2);
            for r in 0..64 {
                for k in 0..16 {
                    assert_eq!(read(&smem, d, r, k), Some((r, k0 + k)));
                }
            }
        }
    }

    /// The tensor core's read of an MN-major operand (decoded as [`SmemLayout::descriptor_mn`]
    /// documents): element (n, kk) of the n × 16 B a descriptor names.
    fn read_mn(smem: &Smem, desc: u64, n: u32, kk: u32) -> Option<(u32, u32)> {
        let start = ((desc & 0x3FFF) as u32) << 4;
        let leading = (((desc >> 16) & 0x3FFF) as u32) << 4;
        let stride = (((desc >> 32) & 0x3FFF) as u32) << 4;
        assert_eq!(desc >> 62, 1, "128-byte swizzle");
        let addr = start + (n / 64) * leading + (kk / 8) * stride + (kk % 8) * 128 + (n % 64) * 2;
        smem.slots[(Swizzle::B128.apply(addr) / 2) as usize]
    }

    /// V [keys][dv] stored as the attention kernel stores it (64-column panels of lines, each
    /// line one key) and read as P·V's B (K = keys, N = dv) through MN-major descriptors, one
    /// per 16-key step: every element read is V[k0 + kk][n]. A wrong panel offset is caught.
    #[test]
    fn mn_major_panels_read_back_through_descriptors() {
        let l = SmemLayout::K_MAJOR_B128_16BIT;
        for (keys, dv) in [(64u32, 64u32), (128, 128), (64, 256)] {
            let panel = keys * 128;
            let mut smem = Smem::new(panel * dv / 64);
            for key in 0..keys {
                for n in 0..dv {
                    let at = (n / 64) * panel + l.offset(key, n % 64);
                    let slot = &mut smem.slots[(at / 2) as usize];
                    assert!(slot.is_none());
                    *slot = Some((key, n));
                }
            }
            for k0 in (0..keys).step_by(16) {
                let d = l.descriptor_mn(k0 * 128, panel);
                for kk in 0..16 {
                    for n in 0..dv {
                        assert_eq!(read_mn(&smem, d, n, kk), Some((k0 + kk, n)), "{keys}x{dv}");
                    }
                }
                if dv > 64 {
                    let wrong = l.descriptor_mn(k0 * 128, panel / 2);
                    assert_ne!(read_mn(&smem, wrong, 64, 0), Some((k0, 64)));
                }
            }
        }
        assert_eq!(
            l.descriptor_mn_c("a", 16384),
            "((((unsigned long long)(a) & 0x3FFFFULL) >> 4) | (1024ULL << 16) | (64ULL << 32) | (1ULL << 62))"
        );
    }

    /// A in registers is the N = 16 accumulator layout, element for element, so 16 adjacent
    /// columns of accumulators are an A operand in place.
    #[test]
    fn a_registers_are_sixteen_accumulator_columns() {
        let c = WGMMA_M64K16_F16.c(16).unwrap();
        assert_eq!(WGMMA_A_REGS.elems(), c.elems());
        for t in 0..WARPGROUP {
            for e in 0..8 {
                assert_eq!(
                    WGMMA_A_REGS.coord(t, e),
                    c.coord(t, e),
                    "thread {t}, element {e}"
                );
            }
        }
        // Columns 16 j .. 16 j + 15 of a wider C are its elements 8 j .. 8 j + 7.
        let wide = WGMMA_M64K16_F16.c(128).unwrap();
        for t in 0..WARPGROUP {
            for j in 0..8 {
                for e in 0..8 {
                    let (r, col) = wide.coord(t, 8 * j + e);
                    assert_eq!((r, col - 16 * j), c.coord(t, e));
                }
            }
        }
    }

    #[test]
    fn descriptor_fields_and_c_agree() {
        let l = SmemLayout::K_MAJOR_B128_16BIT;
        let d = l.descriptor(0x1_2400);
        assert_eq!(d & 0x3FFF, 0x1_2400 >> 4);
        assert_eq!((d >> 16) & 0x3FFF, 1);
        assert_eq!((d >> 32) & 0x3FFF, 1024 >> 4);
        assert_eq!(d >> 62, 1);
        assert_eq!(
            l.descriptor_c("a"),
            "((((unsigned long long)(a) & 0x3FFFFULL) >> 4) | (1ULL << 16) | (64ULL << 32) | (1ULL << 62))"
        );
        // The C store offset, evaluated by hand for a few points, is the Rust one.
        for (r, k, want) in [
            (0, 0, 0),
            (1, 0, 128 + 16),
            (3, 17, 3 * 128 + ((2 ^ 3) << 4) + 2),
        ] {
            assert_eq!(l.offset(r, k), want, "({r}, {k})");
        }
        assert_eq!(
            l.offset_c("r", "k"),
            "(((r) << 7) + ((((k) >> 3) ^ ((r) & 7)) << 4) + (((k) & 7) << 1))"
        );
    }
}
