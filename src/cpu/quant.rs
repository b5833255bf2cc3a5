//! Quantized GEMV straight on the weight blocks (`ir::quant`): the activations are quantized to
//! 8 bits once per row (a block of 32 as llama.cpp's `quantize_row_q8_1`: an f32 scale, the
//! 32 signed bytes, their integer sum and each half's), and each block's dot product is an integer sum
//! scaled once. Kernels: a portable one (the reference in tests), AVX2 (`maddubs`), AVX-VNNI
//! and AVX-512 VNNI (`vpdpbusd`), picked at run time ([`Kernel::detect`]). The GEMV steps read
//! the weights repacked at plan time ([`Packed`]: 8 rows interleaved per block, one vector of
//! 8 row sums per block) through [`Kernel::dot_group`], with up to [`TILE`] activation rows at
//! once; [`Kernel::dot_tile`] dots one row in the source layout (the portable kernel is the
//! reference both ways; the k-quants and Q5_0 have no x86 source-layout tile). aarch64 runs
//! the portable kernel.
//!
//! Per block of 32 with activation scale `da`, quants `a` (sum `sa`, halves `sa₀`, `sa₁`) and
//! weight scale `dw`: Q8_0 `dw·da·Σ w·a`; Q5_0 (as Q8_0, 5 bits a value) `dw·da·(Σ u·a −
//! 16·sa)` with `u = w + 16`; Q4_0 `dw·da·(Σ nib·a − 8·sa)`; Q4_1 `dw·da·Σ nib·a + m·da·sa`;
//! Q4_K `(d·sc)·da·Σ nib·a − (dmin·m)·da·sa` (its sub-block's scale and minimum); Q6_K
//! `d·da·(sc₀·(Σ₀ q·a − 32·sa₀) + sc₁·(Σ₁ q·a − 32·sa₁))` (its two 16-value sub-blocks).

use half::f16;

use crate::ir::kquant;
use crate::ir::quant::BLOCK_ELEMS;
use crate::ir::QuantScheme;

/// The weight schemes the integer dot products read in their blocks: ggml's 32-value blocks with
/// one f16 scale (and Q4_1's f16 minimum), and the k-quant super-blocks of 256 values Q4_K
/// (per 32 values Q4_1's form `(d·sc)·q − dmin·m`, 6-bit `sc`, `m`) and Q6_K (per 16 values
/// `(d·sc)·(q − 32)`, i8 `sc`, 6-bit `q`). A weight of any other scheme is dequantized once when
/// the plan is made and goes through the dense GEMM. `Q5_0` reads Q8_0 blocks whose values
/// all fit in 5 bits (a GGUF file's Q5_0, which the loaders keep as Q8_0:
/// `QuantTensor::reblocked`) in Q5_0's size: [`IntScheme::for_blocks`] picks it.
///
/// Everywhere here `kb` counts groups of 32 values (the activation blocks, [`Q8Block`]); a
/// source block of the scheme is [`IntScheme::groups_per_block`] of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntScheme {
    Q8_0,
    /// Q8_0 blocks of values in −16..=15, repacked as 5 bits (a nibble and a bit) a value.
    Q5_0,
    Q4_0,
    Q4_1,
    Q4K,
    Q6K,
}

impl IntScheme {
    pub const ALL: [IntScheme; 6] = [
        IntScheme::Q8_0,
        IntScheme::Q5_0,
        IntScheme::Q4_0,
        IntScheme::Q4_1,
        IntScheme::Q4K,
        IntScheme::Q6K,
    ];

    /// The scheme that reads blocks of `scheme` (Q8_0 for Q8_0: whatever their values).
    pub fn of(scheme: QuantScheme) -> Option<IntScheme> {
        IntScheme::ALL.into_iter().find(|s| s.source() == scheme)
    }

    /// The scheme that reads `q` in the fewest bytes: [`IntScheme::of`] its scheme, but Q8_0
    /// blocks whose values all lie in −16..=15 (a Q5_0 file's, kept as Q8_0) as `Q5_0`.
    pub fn for_blocks(q: &crate::ir::QuantTensor) -> Option<IntScheme> {
        let s = IntScheme::of(q.scheme())?;
        let narrow = |blk: &[u8]| blk[2..].iter().all(|&b| (-16..=15).contains(&(b as i8)));
        if s == IntScheme::Q8_0 && q.bytes().chunks_exact(s.block_bytes()).all(narrow) {
            return Some(IntScheme::Q5_0);
        }
        Some(s)
    }

    /// The block format this scheme reads.
    pub fn source(self) -> QuantScheme {
        match self {
            IntScheme::Q8_0 | IntScheme::Q5_0 => QuantScheme::Q8_0,
            IntScheme::Q4_0 => QuantScheme::Q4_0,
            IntScheme::Q4_1 => QuantScheme::Q4_1,
            IntScheme::Q4K => QuantScheme::Q4K,
            IntScheme::Q6K => QuantScheme::Q6K,
        }
    }

    /// Bytes of one source block ([`IntScheme::groups_per_block`] groups of 32 values).
    pub fn block_bytes(self) -> usize {
        self.source().block_bytes()
    }

    /// Groups of 32 values per source block: 1, or 8 for a k-quant super-block.
    pub fn groups_per_block(self) -> usize {
        self.source().block_elems() / BLOCK_ELEMS
    }

    /// Bytes of a row of `kb` groups of 32 values (a whole number of source blocks).
    pub fn row_bytes(self, kb: usize) -> usize {
        kb / self.groups_per_block() * self.block_bytes()
    }

    /// Where the quants start: after the f16 scale (and Q4_1's f16 minimum).
    fn quants_offset(self) -> usize {
        match self {
            IntScheme::Q8_0 | IntScheme::Q5_0 | IntScheme::Q4_0 => 2,
            IntScheme::Q4_1 => 4,
            // Read through `kquant`'s own offsets.
            IntScheme::Q4K | IntScheme::Q6K => 0,
        }
    }
}

/// 32 activations quantized to 8 bits.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(32))]
pub struct Q8Block {
    pub qs: [i8; BLOCK_ELEMS],
    pub d: f32,
    /// Σ qs, for the weight schemes with an offset (Q4_0's −8, Q4_1's and Q4_K's minimum).
    pub sum: i32,
    /// Σ qs of each half (16 values: Q6_K's −32 under a scale per 16). In the alignment's
    /// padding: the block is 64 bytes with or without it.
    pub half: [i32; 2],
}

/// Quantizes `x` (a whole number of blocks) into `out`: scale `max|x|/127`, values rounded to
/// the nearest (half away from zero, as `roundf`).
pub fn quantize_row(x: &[f32], out: &mut [Q8Block]) {
    for (blk, o) in x.chunks_exact(BLOCK_ELEMS).zip(out.iter_mut()) {
        let amax = blk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut half = [0i32; 2];
        for (i, (q, &v)) in o.qs.iter_mut().zip(blk).enumerate() {
            *q = (v * id).round() as i8;
            half[i / 16] += i32::from(*q);
        }
        o.d = d;
        o.sum = half[0] + half[1];
        o.half = half;
    }
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// The most activation rows one weight row is dotted with at a time ([`Kernel::dot_tile`]):
/// the weight block is loaded and unpacked once for all of them (a prompt's GEMM reads each
/// weight once per tile instead of once per token).
pub const TILE: usize = 4;

/// Which dot-product kernel runs. All x86 kernels compute the same integer sums per group of
/// 4 bytes (`maddubs`+`madd` and `vpdpbusd` agree exactly: no 16-bit saturation is reachable
/// with 4-bit or ±127 weights) and accumulate them in the same order, so their results are
/// bitwise equal; the portable kernel sums per block in f32 and differs by rounding only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// Plain Rust (any architecture; aarch64 included, vectorised by the compiler).
    Portable,
    /// x86-64 AVX2 with FMA and F16C: `maddubs` + `madd` per 32 bytes.
    Avx2,
    /// AVX-VNNI (VEX `vpdpbusd` on 256 bits): one instruction per 32 bytes.
    AvxVnni,
    /// AVX-512 VNNI with VL (EVEX `vpdpbusd` on 256 bits, for CPUs without AVX-VNNI).
    Avx512Vnni,
}

impl Kernel {
    pub const ALL: [Kernel; 4] = [
        Kernel::Portable,
        Kernel::Avx2,
        Kernel::AvxVnni,
        Kernel::Avx512Vnni,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kernel::Portable => "portable",
            Kernel::Avx2 => "avx2",
            Kernel::AvxVnni => "avxvnni",
            Kernel::Avx512Vnni => "avx512vnni",
        }
    }

    pub fn parse(s: &str) -> Option<Kernel> {
        Kernel::ALL.into_iter().find(|k| k.name() == s)
    }

    /// Whether the running CPU can run this kernel.
    pub fn supported(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            match self {
                Kernel::Portable => true,
                Kernel::Avx2 => avx2,
                Kernel::AvxVnni => avx2 && is_x86_feature_detected!("avxvnni"),
                Kernel::Avx512Vnni => {
                    avx2 && is_x86_feature_detected!("avx512f")
                        && is_x86_feature_detected!("avx512vl")
                        && is_x86_feature_detected!("avx512vnni")
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Kernel::Portable
        }
    }

    /// The kernel `ROCMFORGE_CPU_KERNEL` names (portable, avx2, avxvnni, avx512vnni) when the
    /// CPU supports it (to test or compare the paths), else the fastest the CPU supports.
    pub fn detect() -> Kernel {
        if let Some(k) = std::env::var("ROCMFORGE_CPU_KERNEL")
            .ok()
            .and_then(|v| Kernel::parse(&v))
            .filter(|k| k.supported())
        {
            return k;
        }
        [Kernel::AvxVnni, Kernel::Avx512Vnni, Kernel::Avx2]
            .into_iter()
            .find(|k| k.supported())
            .unwrap_or(Kernel::Portable)
    }

    /// The dot product of one weight row (its blocks) with one quantized activation row.
    pub fn dot(self, scheme: IntScheme, w: &[u8], a: &[Q8Block]) -> f32 {
        let mut out = [0.0f32];
        self.dot_tile(scheme, w, a, a.len(), &mut out);
        out[0]
    }

    /// One weight row (`kb` blocks of `scheme` in `w`) dotted with `out.len()` ≤ [`TILE`]
    /// activation rows of `kb` blocks each, stored one after the other in `a`.
    ///
    /// # Panics
    /// When `w` or `a` is shorter than that, or `out` is longer than [`TILE`] (callers size
    /// them from the plan: a bug, not user input).
    pub fn dot_tile(self, scheme: IntScheme, w: &[u8], a: &[Q8Block], kb: usize, out: &mut [f32]) {
        assert!(out.len() <= TILE, "a tile is at most {TILE} rows");
        assert!(
            kb.is_multiple_of(scheme.groups_per_block()),
            "whole source blocks"
        );
        assert!(w.len() >= scheme.row_bytes(kb) && a.len() >= kb * out.len());
        #[cfg(target_arch = "x86_64")]
        match self {
            // The k-quants' source layout has no x86 tile: the GEMV reads them repacked
            // (`dot_group`), this row form is the reference.
            _ if matches!(scheme, IntScheme::Q4K | IntScheme::Q6K) => {}
            // Q5_0's source blocks are Q8_0's.
            _ if scheme == IntScheme::Q5_0 => return self.dot_tile(IntScheme::Q8_0, w, a, kb, out),
            Kernel::Portable => {}
            // SAFETY: every x86 kernel but the portable one is checked with `supported()`
            // before it is made (`detect`, or a test that asks `supported()` first), and its
            // target features are exactly the ones checked there; the lengths were asserted.
            Kernel::Avx2 => return unsafe { x86::tile_avx2(scheme, w, a, kb, out) },
            // SAFETY: as above.
            Kernel::AvxVnni => return unsafe { x86::tile_avxvnni(scheme, w, a, kb, out) },
            // SAFETY: as above.
            Kernel::Avx512Vnni => return unsafe { x86::tile_avx512vnni(scheme, w, a, kb, out) },
        }
        for (t, o) in out.iter_mut().enumerate() {
            *o = dot_portable(scheme, w, &a[t * kb..(t + 1) * kb]);
        }
    }
}

/// Weight rows per group of the repacked layout ([`Packed`]): one activation load serves them all.
pub const GROUP: usize = 8;

/// The layout of one record of [`Packed`] (8 rows × one source block of a scheme): its size,
/// where its quants start, and how many bytes those take per 32 values. The head holds the 8
/// rows' scales, by scheme:
///
/// | scheme | head (row `r` at …) | bytes | quants per 32 values |
/// | --- | --- | --: | --- |
/// | Q8_0 | f16 `d` at `2r` | 16 | 256: `w ^ 0x80` (the unsigned `w + 128`) |
/// | Q5_0 | f16 `d` at `2r` | 16 | 160: nibbles of `w + 16`, then its fifth bits (below) |
/// | Q4_0 | f16 `d` at `2r` | 16 | 128: nibbles |
/// | Q4_1 | f16 `d` at `2r`, f16 `m` at `16 + 2r` | 32 | 128: nibbles |
/// | Q4_K | f32 `d` at `4r`, f32 `dmin` at `32 + 4r`, u8 `sc` of sub-block `j` at `64 + 8j + r`, u8 `m` at `128 + 8j + r` | 192 | 128: nibbles |
/// | Q6_K | f32 `d` at `4r`, i8 `sc` of 16-value sub-block `j` at `32 + 8j + r` | 160 | 192: nibbles of `q` (0..63), then its two high bits (below) |
///
/// The k-quants' `d` is the f16 widened to f32 and `sc`, `m` the 6-bit integers, so the kernels'
/// `d·sc` (exact in f32: an 11-bit times a 6- or 8-bit integer) is the interpreter's value, not
/// an f16 rounding of it; the head stays small (a Q4_K record is 1216 bytes for the 8 rows'
/// 1152 source bytes, a Q6_K record 1696 for 1680).
///
/// High bits after the nibbles (`high_bits` 1 or 2 a value), for vector `g` at byte `4r + i`
/// (see [`Packed`]): Q5_0's one vector holds `g`'s fifth bit at bit `4 + g` (g < 4) or `g − 4`;
/// Q6_K's two vectors (g < 4, g ≥ 4) hold `g`'s two bits at bits `[4, 6, 0, 2][g % 4]`: a
/// 16-bit shift (none, right 2, left 4, left 2 for Q6_K) and a mask put them at bit 4.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    pub bytes: usize,
    pub head: usize,
    /// Bytes of quants per 32 values (vectors of 32 bytes: 8 of bytes, or 4 of nibbles and
    /// `high_bits` of the bits above them).
    pub quant_bytes: usize,
    /// Whether the quants are whole bytes (else nibbles).
    pub bytes_form: bool,
    /// Bits above the nibble per value (0, Q5_0's 1, Q6_K's 2).
    pub high_bits: usize,
}

impl IntScheme {
    pub fn record(self) -> Record {
        // (head, whole bytes, high bits)
        let (head, bytes_form, high_bits) = match self {
            IntScheme::Q8_0 => (16, true, 0),
            IntScheme::Q5_0 => (16, false, 1),
            IntScheme::Q4_0 => (16, false, 0),
            IntScheme::Q4_1 => (32, false, 0),
            IntScheme::Q4K => (192, false, 0),
            IntScheme::Q6K => (160, false, 2),
        };
        let quant_bytes = if bytes_form {
            256
        } else {
            128 + 32 * high_bits
        };
        Record {
            bytes: head + self.groups_per_block() * quant_bytes,
            head,
            quant_bytes,
            bytes_form,
            high_bits,
        }
    }

    /// The 32 quants of group `j` of source block `blk`, as stored: Q8_0's i8 bits, Q5_0's
    /// `w + 16` (0..31), the nibbles of Q4_0/Q4_1/Q4_K, Q6_K's `q` (0..63, before its −32).
    fn quants(self, blk: &[u8], j: usize) -> [u8; BLOCK_ELEMS] {
        let mut out = [0u8; BLOCK_ELEMS];
        for (e, o) in out.iter_mut().enumerate() {
            *o = match self {
                IntScheme::Q8_0 => blk[2 + e],
                IntScheme::Q5_0 => (blk[2 + e] as i8 + 16) as u8,
                IntScheme::Q4_0 | IntScheme::Q4_1 => {
                    let q = &blk[self.quants_offset()..];
                    if e < 16 {
                        q[e] & 0xF
                    } else {
                        q[e - 16] >> 4
                    }
                }
                // ggml's `dequantize_row_q4_K` (`kquant::q4_k`): group j is byte 16 + 32·(j/2)
                // + e's low (j even) or high nibble.
                IntScheme::Q4K => (blk[16 + 32 * (j / 2) + e] >> (4 * (j % 2))) & 0xF,
                // `kquant::q6_k`: low 4 bits from `ql`, high 2 from `qh`.
                IntScheme::Q6K => {
                    let v = 32 * j + e;
                    let (h, r) = (v / 128, v % 128);
                    let low = (blk[64 * h + r % 64] >> (4 * (r / 64))) & 0xF;
                    let high = (blk[128 + 32 * h + r % 32] >> (2 * (r / 32))) & 3;
                    low | (high << 4)
                }
            };
        }
        out
    }
}

/// A quantized `[N, K]` weight repacked once, when the plan is made, for the x86 kernels: rows
/// in groups of [`GROUP`] (the last one padded with zero rows), each group's source blocks one
/// after the other, and per (group, block) a [`Record`]: the 8 rows' scales, then per 32 values
/// the quants interleaved so that one 32-byte vector holds the same 4 columns of all 8 rows:
/// `vpdpbusd` with those 4 activation bytes broadcast sums each row in its own lane, and a
/// block's 8 row sums come out as one vector (no horizontal sum, one scale multiply for the 8
/// rows). The legacy schemes' records are exactly as large as the 8 rows' blocks (no extra
/// traffic); the k-quants' a little larger (see [`Record`]).
///
/// Quants, for 4-column group `g` (columns 4g..4g+4) of row `r`, at byte `4r + i` of vector
/// `g`: bytes (Q8_0, Q6_K) one vector per `g`; nibbles (Q5_0, Q4_0, Q4_1, Q4_K) vectors `g`
/// and `g + 4` sharing a byte (low and high nibble) so 4 loads give all 8. Q5_0's fifth bits
/// follow as one vector: byte `4r + i` holds vector `g`'s at bit `4 + g` (g < 4) or `g − 4`
/// (g ≥ 4), so that one 16-bit shift (right by g, left by 8 − g) and a mask put it at bit 4.
pub struct Packed {
    scheme: IntScheme,
    n: usize,
    kb: usize,
    data: Vec<u8>,
    /// The source blocks (the portable kernel reads them); held so that the cache's key (their
    /// address) stays theirs while this lives.
    src: crate::ir::QuantTensor,
}

impl Packed {
    /// Bytes of one (group, source block) record.
    pub fn record_bytes(scheme: IntScheme) -> usize {
        scheme.record().bytes
    }

    /// Repacks `src` (`n` rows of `kb` groups of 32 values of `scheme`).
    ///
    /// # Panics
    /// When `kb` is not a whole number of source blocks or `src` holds fewer than `n` such rows
    /// (the plan checked the weight's shape).
    pub fn new(scheme: IntScheme, src: &crate::ir::QuantTensor, n: usize, kb: usize) -> Packed {
        let bb = scheme.block_bytes();
        let gpb = scheme.groups_per_block();
        let bytes = src.bytes();
        assert!(
            kb.is_multiple_of(gpb) && bytes.len() >= n * scheme.row_bytes(kb),
            "a [{n}, {kb}·32] weight's blocks"
        );
        let nblk = kb / gpb;
        let layout = scheme.record();
        let rec = layout.bytes;
        let groups = n.div_ceil(GROUP);
        let mut data = vec![0u8; groups * nblk * rec];
        for (gi, grp) in data.chunks_exact_mut(nblk * rec).enumerate() {
            for (b, out) in grp.chunks_exact_mut(rec).enumerate() {
                let (head, quants) = out.split_at_mut(layout.head);
                if scheme == IntScheme::Q8_0 {
                    // Padded rows read as w = 0 (stored 0x80) with a zero scale.
                    quants.fill(0x80);
                }
                for r in 0..GROUP {
                    let row = gi * GROUP + r;
                    if row >= n {
                        continue;
                    }
                    let blk = &bytes[(row * nblk + b) * bb..][..bb];
                    let f32_at = |at: usize| f16_at(blk, at).to_le_bytes();
                    match scheme {
                        IntScheme::Q8_0 | IntScheme::Q5_0 | IntScheme::Q4_0 => {
                            head[2 * r..2 * r + 2].copy_from_slice(&blk[..2]);
                        }
                        IntScheme::Q4_1 => {
                            head[2 * r..2 * r + 2].copy_from_slice(&blk[..2]);
                            head[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&blk[2..4]);
                        }
                        IntScheme::Q4K => {
                            head[4 * r..4 * r + 4].copy_from_slice(&f32_at(0));
                            head[32 + 4 * r..32 + 4 * r + 4].copy_from_slice(&f32_at(2));
                            for j in 0..gpb {
                                let (sc, m) = kquant::scale_min_k4(&blk[4..16], j);
                                head[64 + 8 * j + r] = sc;
                                head[128 + 8 * j + r] = m;
                            }
                        }
                        IntScheme::Q6K => {
                            head[4 * r..4 * r + 4].copy_from_slice(&f32_at(208));
                            for j in 0..2 * gpb {
                                head[32 + 8 * j + r] = blk[192 + j];
                            }
                        }
                    }
                    for j in 0..gpb {
                        let q = scheme.quants(blk, j);
                        let dst = &mut quants[j * layout.quant_bytes..][..layout.quant_bytes];
                        for (e, &v) in q.iter().enumerate() {
                            let (g, i) = (e / 4, e % 4);
                            if layout.bytes_form {
                                let v = if scheme == IntScheme::Q8_0 {
                                    v ^ 0x80
                                } else {
                                    v
                                };
                                dst[g * 32 + 4 * r + i] = v;
                                continue;
                            }
                            let shift = if g < 4 { 0 } else { 4 };
                            dst[(g % 4) * 32 + 4 * r + i] |= (v & 0xF) << shift;
                            let high = v >> 4;
                            match layout.high_bits {
                                0 => debug_assert_eq!(high, 0),
                                1 => {
                                    let bit = if g < 4 { 4 + g } else { g - 4 };
                                    dst[128 + 4 * r + i] |= high << bit;
                                }
                                _ => {
                                    let bit = [4, 6, 0, 2][g % 4];
                                    dst[128 + 32 * (g / 4) + 4 * r + i] |= high << bit;
                                }
                            }
                        }
                    }
                }
            }
        }
        Packed {
            scheme,
            n,
            kb,
            data,
            src: src.clone(),
        }
    }

    /// The repacked form of `src`, shared by every plan of the process that reads the same
    /// blocks the same way (a model's decode and prompt plans repack each weight once): a cache
    /// of weak references keyed by the blocks' address, kept alive by the packed form itself.
    pub fn shared(
        scheme: IntScheme,
        src: &crate::ir::QuantTensor,
        n: usize,
        kb: usize,
    ) -> std::sync::Arc<Packed> {
        use std::sync::{Arc, Mutex, Weak};
        static CACHE: Mutex<Vec<Weak<Packed>>> = Mutex::new(Vec::new());
        let same = |p: &Packed| {
            p.scheme == scheme && p.n == n && p.kb == kb && std::ptr::eq(p.src.bytes(), src.bytes())
        };
        // A poisoned cache (a panic while it was held) is still a list of weak references.
        let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
        cache.retain(|w| w.strong_count() > 0);
        if let Some(p) = cache.iter().filter_map(Weak::upgrade).find(|p| same(p)) {
            return p;
        }
        let p = Arc::new(Packed::new(scheme, src, n, kb));
        cache.push(Arc::downgrade(&p));
        p
    }

    pub fn scheme(&self) -> IntScheme {
        self.scheme
    }

    pub fn rows(&self) -> usize {
        self.n
    }

    pub fn blocks_per_row(&self) -> usize {
        self.kb
    }

    pub fn groups(&self) -> usize {
        self.n.div_ceil(GROUP)
    }

    /// The source blocks of row `row`.
    pub fn src_row(&self, row: usize) -> &[u8] {
        let rb = self.scheme.row_bytes(self.kb);
        &self.src.bytes()[row * rb..(row + 1) * rb]
    }
}

impl Kernel {
    /// Rows `group·8 .. group·8+8` of `w` dotted with `out.len()` ≤ [`TILE`] activation rows of
    /// `kb` blocks each (one after the other in `a`): `out[t][r]` is row `group·8 + r` with
    /// activation row `t` (rows past the weight's last are 0). The x86 kernels read the
    /// repacked records; the portable one the source blocks, row by row.
    ///
    /// # Panics
    /// When `group` is past the last, `a` holds fewer than `out.len()·kb` blocks, or `out` is
    /// longer than [`TILE`] (callers size them from the plan: a bug, not user input).
    pub fn dot_group(self, w: &Packed, group: usize, a: &[Q8Block], out: &mut [[f32; GROUP]]) {
        let kb = w.kb;
        assert!(out.len() <= TILE, "a tile is at most {TILE} rows");
        assert!(group < w.groups() && a.len() >= kb * out.len());
        let grp = kb / w.scheme.groups_per_block() * Packed::record_bytes(w.scheme);
        let recs = &w.data[group * grp..(group + 1) * grp];
        #[cfg(target_arch = "x86_64")]
        match self {
            Kernel::Portable => {}
            // SAFETY: as in `dot_tile`: the kernel's features were checked by `supported()`
            // before it was made; `recs` holds the group's `kb` records and `a` `out.len()·kb`
            // blocks (asserted).
            Kernel::Avx2 => return unsafe { x86::group_avx2(w.scheme, recs, a, kb, out) },
            // SAFETY: as above.
            Kernel::AvxVnni => return unsafe { x86::group_avxvnni(w.scheme, recs, a, kb, out) },
            // SAFETY: as above.
            Kernel::Avx512Vnni => {
                return unsafe { x86::group_avx512vnni(w.scheme, recs, a, kb, out) }
            }
        }
        // Only the x86 kernels read the records (unused elsewhere).
        let _ = recs;
        for (t, o) in out.iter_mut().enumerate() {
            for (r, v) in o.iter_mut().enumerate() {
                let row = group * GROUP + r;
                *v = if row < w.n {
                    dot_portable(w.scheme, w.src_row(row), &a[t * kb..(t + 1) * kb])
                } else {
                    0.0
                };
            }
        }
    }
}

/// The reference: integer sums per 32 values (per 16 for Q6_K), one f32 product per 32 values,
/// summed in order.
pub fn dot_portable(scheme: IntScheme, w: &[u8], a: &[Q8Block]) -> f32 {
    let bb = scheme.block_bytes();
    let gpb = scheme.groups_per_block();
    let qo = scheme.quants_offset();
    let mut acc = 0.0f32;
    for (blk, acts) in w.chunks_exact(bb).zip(a.chunks_exact(gpb)) {
        let q = &blk[qo..bb];
        match scheme {
            // Q5_0's source blocks are Q8_0's: the same sum.
            IntScheme::Q8_0 | IntScheme::Q5_0 => {
                let (act, dw) = (&acts[0], f16_at(blk, 0));
                let s: i32 = q
                    .iter()
                    .zip(&act.qs)
                    .map(|(&w, &x)| i32::from(w as i8) * i32::from(x))
                    .sum();
                acc += dw * act.d * s as f32;
            }
            IntScheme::Q4_0 | IntScheme::Q4_1 => {
                let (act, dw) = (&acts[0], f16_at(blk, 0));
                let mut s = 0i32;
                for (j, &b) in q.iter().enumerate() {
                    s += i32::from(b & 0xF) * i32::from(act.qs[j]);
                    s += i32::from(b >> 4) * i32::from(act.qs[j + 16]);
                }
                acc += if scheme == IntScheme::Q4_0 {
                    dw * act.d * (s - 8 * act.sum) as f32
                } else {
                    dw * act.d * s as f32 + f16_at(blk, 2) * act.d * act.sum as f32
                };
            }
            // Per 32 values Q4_1's form with f32 scale `d·sc` and minimum `dmin·m`.
            IntScheme::Q4K => {
                let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
                for (j, act) in acts.iter().enumerate() {
                    let (sc, m) = kquant::scale_min_k4(&blk[4..16], j);
                    let s: i32 = scheme
                        .quants(blk, j)
                        .iter()
                        .zip(&act.qs)
                        .map(|(&w, &x)| i32::from(w) * i32::from(x))
                        .sum();
                    let (scale, min) = (d * f32::from(sc), dmin * f32::from(m));
                    acc += scale * act.d * s as f32 - min * (act.d * act.sum as f32);
                }
            }
            // Per 16 values an i8 scale on `q − 32`: both halves' integer sums, scaled in
            // integers, then one f32 product per 32.
            IntScheme::Q6K => {
                let d = f16_at(blk, 208);
                for (j, act) in acts.iter().enumerate() {
                    let q = scheme.quants(blk, j);
                    let mut s = 0i32;
                    for h in 0..2 {
                        let sc = i32::from(blk[192 + 2 * j + h] as i8);
                        let half: i32 = (16 * h..16 * h + 16)
                            .map(|e| (i32::from(q[e]) - 32) * i32::from(act.qs[e]))
                            .sum();
                        s += sc * half;
                    }
                    acc += d * act.d * s as f32;
                }
            }
        }
    }
    acc
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! One generic tile loop, inlined into three `target_feature` entry points that differ
    //! in how 4-byte groups are multiplied and summed (`DP`); the scheme and the tile height
    //! are constants too, so the inner loop has no branches but the loop's own.

    use std::arch::x86_64::*;

    use super::{IntScheme, Q8Block};

    const MADD: u8 = 0;
    const AVXVNNI: u8 = 1;
    const AVX512VNNI: u8 = 2;
    const Q8_0: u8 = 0;
    const Q4_0: u8 = 1;
    const Q4_1: u8 = 2;
    const Q4K: u8 = 3;
    const Q6K: u8 = 4;
    const Q5_0: u8 = 5;

    /// Horizontal sum of 8 lanes (a fixed order, the same in every kernel).
    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        // SAFETY: the callers run with AVX enabled.
        unsafe {
            let lo = _mm256_castps256_ps128(v);
            let hi = _mm256_extractf128_ps(v, 1);
            let s = _mm_add_ps(lo, hi);
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
            _mm_cvtss_f32(s)
        }
    }

    /// The f16 at `p` (little-endian) as f32, by F16C.
    #[inline(always)]
    unsafe fn f16(p: *const u8) -> f32 {
        // SAFETY: `p` points at 2 readable bytes (a block's scale or minimum); F16C enabled.
        unsafe {
            let bits = u16::from_le_bytes([*p, *p.add(1)]);
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
        }
    }

    /// Σ u·s over each group of 4 bytes (u unsigned, s signed) as 8 i32 lanes.
    #[inline(always)]
    unsafe fn dot4<const DP: u8>(u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: each entry point enables the features of its `DP`.
        unsafe {
            match DP {
                MADD => _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)),
                AVXVNNI => _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s),
                _ => _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s),
            }
        }
    }

    #[inline(always)]
    unsafe fn tile<const DP: u8, const S: u8, const T: usize>(
        w: &[u8],
        a: &[Q8Block],
        kb: usize,
        out: &mut [f32],
    ) {
        let (bb, qo) = match S {
            Q8_0 => (34, 2),
            Q4_0 => (18, 2),
            Q4_1 => (20, 4),
            _ => unreachable!("the k-quants have no source-layout x86 tile"),
        };
        // SAFETY: the entry points enable AVX2/FMA/F16C (and DP's features); the caller
        // asserted `w` holds `kb` blocks and `a` holds `T·kb`, so every block pointer below
        // is inside them; loads are unaligned.
        unsafe {
            let low = _mm_set1_epi8(0x0F);
            let mut acc = [_mm256_setzero_ps(); T];
            let mut off = [0.0f32; T];
            let wp = w.as_ptr();
            for b in 0..kb {
                let blk = wp.add(b * bb);
                let dw = f16(blk);
                let q = blk.add(qo);
                // The weight bytes as the unsigned operand, and (Q8_0) the signs to move onto
                // the activations: |w|·sign(x, w) = w·x.
                let (u, wq) = if S == Q8_0 {
                    let wq = _mm256_loadu_si256(q as *const __m256i);
                    (_mm256_sign_epi8(wq, wq), wq)
                } else {
                    let bytes = _mm_loadu_si128(q as *const __m128i);
                    let lo = _mm_and_si128(bytes, low);
                    let hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low);
                    (_mm256_set_m128i(hi, lo), _mm256_setzero_si256())
                };
                let m = if S == Q4_1 { f16(blk.add(2)) } else { 0.0 };
                for t in 0..T {
                    let act = &*a.as_ptr().add(t * kb + b);
                    let x = _mm256_loadu_si256(act.qs.as_ptr() as *const __m256i);
                    let s = if S == Q8_0 {
                        _mm256_sign_epi8(x, wq)
                    } else {
                        x
                    };
                    let sum = dot4::<DP>(u, s);
                    let scale = dw * act.d;
                    acc[t] =
                        _mm256_fmadd_ps(_mm256_set1_ps(scale), _mm256_cvtepi32_ps(sum), acc[t]);
                    if S == Q4_0 {
                        off[t] -= scale * (8 * act.sum) as f32;
                    } else if S == Q4_1 {
                        off[t] += m * act.d * act.sum as f32;
                    }
                }
            }
            for t in 0..T {
                out[t] = hsum(acc[t]) + off[t];
            }
        }
    }

    /// `acc + Σ` over each group of 4 bytes of `v`·`x` for a repacked vector `v` (Q8_0: the
    /// weight plus 128 for the VNNI kernels, which subtract 128·Σx after; `maddubs` would
    /// saturate on that, so the AVX2 kernel moves the signs as `tile` does).
    #[inline(always)]
    unsafe fn dp_packed<const DP: u8, const S: u8>(
        acc: __m256i,
        v: __m256i,
        x: __m256i,
    ) -> __m256i {
        // SAFETY: each entry point enables the features of its `DP`.
        unsafe {
            match DP {
                MADD => {
                    let (u, s) = if S == Q8_0 {
                        let w = _mm256_xor_si256(v, _mm256_set1_epi8(-128));
                        (_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w))
                    } else {
                        (v, x)
                    };
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
                    _mm256_add_epi32(acc, p)
                }
                AVXVNNI => _mm256_dpbusd_avx_epi32(acc, v, x),
                _ => _mm256_dpbusd_epi32(acc, v, x),
            }
        }
    }

    /// One group of 8 repacked rows with `T` activation rows (`Packed`'s layout, `Record`'s
    /// table): per 32 values the 8 rows' scales (and minimums) as vectors, the quants as 8
    /// vectors of 4 columns, then for each activation row two chains of 4 `vpdpbusd` (columns
    /// 0..16 and 16..32: Q6_K's two scales), the offset, one scale multiply for the 8 rows.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)] // `t` indexes the activation rows and `acc` alike
    unsafe fn group<const DP: u8, const S: u8, const T: usize>(
        recs: &[u8],
        a: &[Q8Block],
        kb: usize,
        out: &mut [[f32; 8]],
    ) {
        // (record bytes, head bytes, 32-value groups per record, quant bytes per group)
        let (rec, head, gpb, qb) = match S {
            Q8_0 => (8 * 34, 16, 1, 256),
            Q5_0 => (8 * 22, 16, 1, 160),
            Q4_0 => (8 * 18, 16, 1, 128),
            Q4_1 => (8 * 20, 32, 1, 128),
            Q4K => (192 + 8 * 128, 192, 8, 128),
            _ => (160 + 8 * 192, 160, 8, 192),
        };
        // SAFETY: the entry points enable AVX2/FMA/F16C (and DP's features); the caller
        // asserted `recs` holds `kb / gpb` records and `a` `T·kb` blocks, so every pointer below
        // is inside them; loads are unaligned; `out` has `T` rows of 8.
        unsafe {
            let low = _mm256_set1_epi8(0x0F);
            let mut acc = [_mm256_setzero_ps(); T];
            let rp = recs.as_ptr();
            for b in 0..kb {
                let (r, j) = (rp.add((b / gpb) * rec), b % gpb);
                // Per row: `dv` the scale, `mv` the minimum to add times `da·Σa` (Q4_1 `m`,
                // Q4_K `−dmin·m`); Q6_K's i8 scales of the two halves as i32 (`sl`, `sh`).
                let bytes8 = |at: usize| _mm_loadl_epi64(r.add(at) as *const __m128i);
                let zero = _mm256_setzero_si256();
                let (dv, mv, sl, sh) = match S {
                    Q4K => {
                        let sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes8(64 + 8 * j)));
                        let m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes8(128 + 8 * j)));
                        let min = _mm256_mul_ps(_mm256_loadu_ps(r.add(32) as *const f32), m);
                        (
                            _mm256_mul_ps(_mm256_loadu_ps(r as *const f32), sc),
                            _mm256_sub_ps(_mm256_setzero_ps(), min),
                            zero,
                            zero,
                        )
                    }
                    Q6K => (
                        _mm256_loadu_ps(r as *const f32),
                        _mm256_setzero_ps(),
                        _mm256_cvtepi8_epi32(bytes8(32 + 16 * j)),
                        _mm256_cvtepi8_epi32(bytes8(40 + 16 * j)),
                    ),
                    _ => (
                        _mm256_cvtph_ps(_mm_loadu_si128(r as *const __m128i)),
                        if S == Q4_1 {
                            _mm256_cvtph_ps(_mm_loadu_si128(r.add(16) as *const __m128i))
                        } else {
                            _mm256_setzero_ps()
                        },
                        zero,
                        zero,
                    ),
                };
                let q = r.add(head + j * qb) as *const __m256i;
                let mut v = [_mm256_setzero_si256(); 8];
                if qb == 256 {
                    for (g, vg) in v.iter_mut().enumerate() {
                        *vg = _mm256_loadu_si256(q.add(g));
                    }
                } else {
                    for h in 0..4 {
                        let p = _mm256_loadu_si256(q.add(h));
                        v[h] = _mm256_and_si256(p, low);
                        v[h + 4] = _mm256_and_si256(_mm256_srli_epi16(p, 4), low);
                    }
                    if S == Q6K {
                        // The two high bits to bits 4..6 (`Record`'s layout).
                        let m = _mm256_set1_epi8(0x30);
                        for h in 0..2 {
                            let p = _mm256_loadu_si256(q.add(4 + h));
                            let hi = [
                                _mm256_and_si256(p, m),
                                _mm256_and_si256(_mm256_srli_epi16(p, 2), m),
                                _mm256_and_si256(_mm256_slli_epi16(p, 4), m),
                                _mm256_and_si256(_mm256_slli_epi16(p, 2), m),
                            ];
                            for (x, vg) in hi.into_iter().zip(&mut v[4 * h..4 * h + 4]) {
                                *vg = _mm256_or_si256(*vg, x);
                            }
                        }
                    }
                    if S == Q5_0 {
                        // The fifth bits to bit 4 (`Record`'s layout); the shift counts are
                        // constants once the loop is unrolled.
                        let hb = _mm256_loadu_si256(q.add(4));
                        let bit4 = _mm256_set1_epi8(0x10);
                        for (g, vg) in v.iter_mut().enumerate() {
                            let at = if g < 4 {
                                _mm256_srl_epi16(hb, _mm_cvtsi32_si128(g as i32))
                            } else {
                                _mm256_sll_epi16(hb, _mm_cvtsi32_si128(8 - g as i32))
                            };
                            *vg = _mm256_or_si256(*vg, _mm256_and_si256(at, bit4));
                        }
                    }
                }
                for t in 0..T {
                    let act = &*a.as_ptr().add(t * kb + b);
                    let xp = act.qs.as_ptr() as *const i32;
                    // Two chains of 4 (columns 0..16 and 16..32), so that vpdpbusd's latency
                    // overlaps.
                    let mut s0 = _mm256_setzero_si256();
                    let mut s1 = _mm256_setzero_si256();
                    for g in 0..4 {
                        let x0 = _mm256_set1_epi32(xp.add(g).read_unaligned());
                        let x1 = _mm256_set1_epi32(xp.add(g + 4).read_unaligned());
                        s0 = dp_packed::<DP, S>(s0, v[g], x0);
                        s1 = dp_packed::<DP, S>(s1, v[g + 4], x1);
                    }
                    let isum = if S == Q6K {
                        let lo = _mm256_sub_epi32(s0, _mm256_set1_epi32(32 * act.half[0]));
                        let hi = _mm256_sub_epi32(s1, _mm256_set1_epi32(32 * act.half[1]));
                        _mm256_add_epi32(_mm256_mullo_epi32(lo, sl), _mm256_mullo_epi32(hi, sh))
                    } else {
                        let isum = _mm256_add_epi32(s0, s1);
                        if S == Q8_0 && DP != MADD {
                            _mm256_sub_epi32(isum, _mm256_set1_epi32(128 * act.sum))
                        } else if S == Q4_0 {
                            _mm256_sub_epi32(isum, _mm256_set1_epi32(8 * act.sum))
                        } else if S == Q5_0 {
                            _mm256_sub_epi32(isum, _mm256_set1_epi32(16 * act.sum))
                        } else {
                            isum
                        }
                    };
                    let scale = _mm256_mul_ps(dv, _mm256_set1_ps(act.d));
                    acc[t] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(isum), acc[t]);
                    if S == Q4_1 || S == Q4K {
                        let ms = _mm256_set1_ps(act.d * act.sum as f32);
                        acc[t] = _mm256_fmadd_ps(mv, ms, acc[t]);
                    }
                }
            }
            for t in 0..T {
                _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]);
            }
        }
    }

    /// `$f::<$dp, scheme, rows>(args)` for a run-time scheme and row count (0 does nothing,
    /// more than 4 is 4): each combination is its own branch-free loop.
    macro_rules! monomorphised {
        ($f:ident::<$dp:ident>($scheme:expr, $rows:expr; $($arg:expr),*)) => {
            match $scheme {
                IntScheme::Q8_0 => monomorphised!(@rows $f, $dp, Q8_0, $rows; $($arg),*),
                IntScheme::Q5_0 => monomorphised!(@rows $f, $dp, Q5_0, $rows; $($arg),*),
                IntScheme::Q4_0 => monomorphised!(@rows $f, $dp, Q4_0, $rows; $($arg),*),
                IntScheme::Q4_1 => monomorphised!(@rows $f, $dp, Q4_1, $rows; $($arg),*),
                IntScheme::Q4K => monomorphised!(@rows $f, $dp, Q4K, $rows; $($arg),*),
                IntScheme::Q6K => monomorphised!(@rows $f, $dp, Q6K, $rows; $($arg),*),
            }
        };
        // The source-layout tile: the legacy schemes only (`dot_tile` sends the k-quants to
        // the portable kernel).
        (@legacy $f:ident::<$dp:ident>($scheme:expr, $rows:expr; $($arg:expr),*)) => {
            match $scheme {
                IntScheme::Q8_0 => monomorphised!(@rows $f, $dp, Q8_0, $rows; $($arg),*),
                IntScheme::Q4_0 => monomorphised!(@rows $f, $dp, Q4_0, $rows; $($arg),*),
                IntScheme::Q4_1 => monomorphised!(@rows $f, $dp, Q4_1, $rows; $($arg),*),
                IntScheme::Q5_0 | IntScheme::Q4K | IntScheme::Q6K => {
                    unreachable!("Q5_0 and the k-quants have no source-layout x86 tile")
                }
            }
        };
        (@rows $f:ident, $dp:ident, $s:ident, $rows:expr; $($arg:expr),*) => {
            match $rows {
                0 => {}
                1 => $f::<$dp, $s, 1>($($arg),*),
                2 => $f::<$dp, $s, 2>($($arg),*),
                3 => $f::<$dp, $s, 3>($($arg),*),
                _ => $f::<$dp, $s, 4>($($arg),*),
            }
        };
    }

    /// The two entry points of one instruction set (`tile`: rows of blocks; `group`: the
    /// 8-row repacked records), compiled with `$features` and the dot product `$dp`.
    macro_rules! entry_points {
        ($tile:ident, $group:ident, $features:literal, $dp:ident, $needs:literal) => {
            /// # Safety
            #[doc = $needs]
            /// `w` holds `kb` blocks, `a` holds `out.len()·kb` blocks, `out.len()` ≤ 4.
            #[target_feature(enable = $features)]
            pub unsafe fn $tile(
                scheme: IntScheme,
                w: &[u8],
                a: &[Q8Block],
                kb: usize,
                out: &mut [f32],
            ) {
                // SAFETY: the caller's contract.
                unsafe { monomorphised!(@legacy tile::<$dp>(scheme, out.len(); w, a, kb, out)) }
            }

            /// # Safety
            #[doc = $needs]
            /// `recs` holds `kb / groups_per_block` records of `scheme`, `a` holds `out.len()·kb` blocks,
            /// `out.len()` ≤ 4.
            #[target_feature(enable = $features)]
            pub unsafe fn $group(
                scheme: IntScheme,
                recs: &[u8],
                a: &[Q8Block],
                kb: usize,
                out: &mut [[f32; 8]],
            ) {
                // SAFETY: the caller's contract.
                unsafe { monomorphised!(group::<$dp>(scheme, out.len(); recs, a, kb, out)) }
            }
        };
    }

    entry_points!(
        tile_avx2,
        group_avx2,
        "avx2,fma,f16c",
        MADD,
        "The CPU has AVX2, FMA and F16C."
    );
    entry_points!(
        tile_avxvnni,
        group_avxvnni,
        "avx2,fma,f16c,avxvnni",
        AVXVNNI,
        "The CPU has AVX2, FMA, F16C and AVX-VNNI."
    );
    entry_points!(
        tile_avx512vnni,
        group_avx512vnni,
        "avx2,fma,f16c,avx512f,avx512vl,avx512vnni",
        AVX512VNNI,
        "The CPU has AVX2, FMA, F16C and AVX-512 F, VL and VNNI."
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Shape;
    use crate::ir::{random_quant, QuantTensor};

    /// The chosen kernel against the portable reference, and both against an f64 sum of the
    /// dequantized weight times the dequantized activations (the same quantized math).
    #[test]
    fn kernels_agree_with_the_f64_sum_of_the_blocks() {
        for int in IntScheme::ALL {
            let scheme = int.source();
            let k = 32 * 7 * int.groups_per_block();
            let w = random_blocks(int, &Shape(vec![3, k]), 5);
            assert_eq!(IntScheme::for_blocks(&w), Some(int));
            let x: Vec<f32> = (0..k)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
                .collect();
            let mut a = vec![Q8Block::default(); k / 32];
            quantize_row(&x, &mut a);
            let dense = w.to_tensor(crate::ir::DType::F32).unwrap();
            let dense = dense.as_f32().unwrap();
            let rb = int.row_bytes(k / 32);
            assert_eq!(rb * 3, w.bytes().len());
            for row in 0..3 {
                let bytes = &w.bytes()[row * rb..][..rb];
                let want: f64 = (0..k)
                    .map(|i| {
                        let xa = f64::from(a[i / 32].d) * f64::from(a[i / 32].qs[i % 32]);
                        f64::from(dense[row * k + i]) * xa
                    })
                    .sum();
                let p = dot_portable(int, bytes, &a);
                let f = Kernel::detect().dot(int, bytes, &a);
                let tol = 1e-5 * want.abs().max(1.0);
                assert!((f64::from(p) - want).abs() < tol, "{scheme} {p} {want}");
                assert!((f64::from(f) - want).abs() < tol, "{scheme} {f} {want}");
            }
        }
    }

    /// Seeded random blocks that `int` reads: `random_quant` of its source scheme, but for
    /// Q5_0 a random Q5_0 tensor kept as Q8_0 (as the loaders keep it).
    pub(crate) fn random_blocks(int: IntScheme, shape: &Shape, seed: u64) -> QuantTensor {
        if int == IntScheme::Q5_0 {
            let q5 = random_quant("w", QuantScheme::Q5_0, shape, seed).unwrap();
            return q5.reblocked(QuantScheme::Q8_0).unwrap();
        }
        random_quant("w", int.source(), shape, seed).unwrap()
    }

    /// Q8_0 blocks with a value outside −16..=15 stay Q8_0; a Q5_0 file's (reblocked) are
    /// read as 5 bits, and so would any Q8_0 tensor that happens to fit (the same values).
    #[test]
    fn narrow_q8_0_blocks_are_read_as_5_bits() {
        let shape = Shape(vec![4, 64]);
        let q8 = random_quant("w", QuantScheme::Q8_0, &shape, 3).unwrap();
        assert_eq!(IntScheme::for_blocks(&q8), Some(IntScheme::Q8_0));
        let q5 = random_blocks(IntScheme::Q5_0, &shape, 3);
        assert_eq!(q5.scheme(), QuantScheme::Q8_0);
        assert_eq!(IntScheme::for_blocks(&q5), Some(IntScheme::Q5_0));
        // One value of 16 (one past the range) anywhere makes it Q8_0 again.
        let mut bytes = q5.bytes().to_vec();
        bytes[34 * 5 + 2 + 17] = 16;
        let wide = QuantTensor::new(QuantScheme::Q8_0, shape.clone(), bytes).unwrap();
        assert_eq!(IntScheme::for_blocks(&wide), Some(IntScheme::Q8_0));
        let q4k = random_quant("w", QuantScheme::Q4K, &Shape(vec![2, 256]), 3).unwrap();
        assert_eq!(IntScheme::for_blocks(&q4k), Some(IntScheme::Q4K));
        let q5k = random_quant("w", QuantScheme::Q5K, &Shape(vec![2, 256]), 3).unwrap();
        assert_eq!(IntScheme::for_blocks(&q5k), None);
    }

    /// The activation block's sums: the whole and each half of 16 (Q6_K's offset per scale).
    #[test]
    fn quantized_activations_carry_their_sums() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 53 % 29) as f32 - 14.0) / 3.0)
            .collect();
        let mut a = [Q8Block::default(); 2];
        quantize_row(&x, &mut a);
        for b in &a {
            let h0: i32 = b.qs[..16].iter().map(|&q| i32::from(q)).sum();
            let h1: i32 = b.qs[16..].iter().map(|&q| i32::from(q)).sum();
            assert_eq!(b.half, [h0, h1]);
            assert_eq!(b.sum, h0 + h1);
        }
        assert_eq!(std::mem::size_of::<Q8Block>(), 64);
    }

    /// Q4_K, Q6_K and Q5_0 repacked (odd row counts: a padded last group; 1 to 3 blocks),
    /// every kernel this CPU runs, every tile height, against an f64 sum of the interpreter's
    /// dequantized weights times the dequantized activations, with seeded random activations
    /// (an all-zero row among them); the x86 kernels bitwise equal to each other.
    #[test]
    fn k_quant_groups_match_the_dequantized_f64_dot() {
        use rand::{Rng, SeedableRng};
        let kernels: Vec<Kernel> = Kernel::ALL.into_iter().filter(|k| k.supported()).collect();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(25);
        for int in [IntScheme::Q4K, IntScheme::Q6K, IntScheme::Q5_0] {
            for (rows, sb) in [(1usize, 1usize), (9, 2), (13, 3), (8, 1)] {
                let kb = int.groups_per_block() * sb;
                let k = 32 * kb;
                let w = random_blocks(int, &Shape(vec![rows, k]), rng.random());
                let dense = w.to_tensor(crate::ir::DType::F32).unwrap();
                let dense = dense.as_f32().unwrap();
                let mut a = vec![Q8Block::default(); TILE * kb];
                for t in 0..TILE {
                    let x: Vec<f32> = (0..k)
                        .map(|_| {
                            if t == 1 {
                                0.0
                            } else {
                                rng.random_range(-3.0..3.0)
                            }
                        })
                        .collect();
                    quantize_row(&x, &mut a[t * kb..(t + 1) * kb]);
                }
                let packed = Packed::new(int, &w, rows, kb);
                assert_eq!(
                    packed.data.len(),
                    rows.div_ceil(GROUP) * sb * int.record().bytes
                );
                let mut first_x86: Option<Vec<[f32; GROUP]>> = None;
                for &kern in &kernels {
                    let mut all = Vec::new();
                    for group in 0..packed.groups() {
                        for h in 1..=TILE {
                            let mut out = vec![[f32::NAN; GROUP]; h];
                            kern.dot_group(&packed, group, &a[..h * kb], &mut out);
                            for (t, o) in out.iter().enumerate() {
                                for (r, &g) in o.iter().enumerate() {
                                    let row = group * GROUP + r;
                                    if row >= rows {
                                        assert_eq!(g, 0.0, "{kern:?} {int:?} padded row");
                                        continue;
                                    }
                                    let want: f64 = (0..k)
                                        .map(|i| {
                                            let b = &a[t * kb + i / 32];
                                            f64::from(dense[row * k + i])
                                                * f64::from(b.d)
                                                * f64::from(b.qs[i % 32])
                                        })
                                        .sum();
                                    let tol = 1e-5 * want.abs().max(1.0);
                                    assert!(
                                        (f64::from(g) - want).abs() <= tol,
                                        "{kern:?} {int:?} {rows}x{k} row {row} t {t}: {g} vs {want}"
                                    );
                                }
                            }
                            if h == TILE {
                                all.extend(out);
                            }
                        }
                    }
                    if kern != Kernel::Portable {
                        match &first_x86 {
                            None => first_x86 = Some(all),
                            Some(f) => assert_eq!(f, &all, "{kern:?} vs the first x86"),
                        }
                    }
                }
            }
        }
    }
}
