//! Quantized GEMV straight on the weight blocks (`ir::quant`): the activations are quantized to
//! 8 bits once per row (a block of 32 as llama.cpp's `quantize_row_q8_1`: an f32 scale, the
//! 32 signed bytes and their integer sum), and each block's dot product is an integer sum
//! scaled once. Kernels: a portable one (the reference in tests), AVX2 (`maddubs`), AVX-VNNI
//! and AVX-512 VNNI (`vpdpbusd`), picked at run time ([`Kernel::detect`]). The GEMV steps read
//! the weights repacked at plan time ([`Packed`]: 8 rows interleaved per block, one vector of
//! 8 row sums per block) through [`Kernel::dot_group`], with up to [`TILE`] activation rows at
//! once; [`Kernel::dot_tile`] dots one row in the source layout (the portable kernel is the
//! reference both ways). aarch64 runs the portable kernel.
//!
//! Per block with activation scale `da`, quants `a` (sum `sa`) and weight scale `dw`:
//! Q8_0 `dw·da·Σ w·a`; Q4_0 `dw·da·(Σ nib·a − 8·sa)`; Q4_1 `dw·da·Σ nib·a + m·da·sa`.

use half::f16;

use crate::ir::quant::BLOCK_ELEMS;
use crate::ir::QuantScheme;

/// The weight schemes the integer dot products read in their blocks (ggml's 32-value blocks with
/// one f16 scale, and Q4_1's f16 minimum); a weight of any other scheme is dequantized once
/// when the plan is made and goes through the dense GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntScheme {
    Q8_0,
    Q4_0,
    Q4_1,
}

impl IntScheme {
    pub fn of(scheme: QuantScheme) -> Option<IntScheme> {
        match scheme {
            QuantScheme::Q8_0 => Some(IntScheme::Q8_0),
            QuantScheme::Q4_0 => Some(IntScheme::Q4_0),
            QuantScheme::Q4_1 => Some(IntScheme::Q4_1),
            _ => None,
        }
    }

    pub fn block_bytes(self) -> usize {
        match self {
            IntScheme::Q8_0 => 34,
            IntScheme::Q4_0 => 18,
            IntScheme::Q4_1 => 20,
        }
    }

    /// Where the quants start: after the f16 scale (and Q4_1's f16 minimum).
    fn quants_offset(self) -> usize {
        match self {
            IntScheme::Q8_0 | IntScheme::Q4_0 => 2,
            IntScheme::Q4_1 => 4,
        }
    }
}

/// 32 activations quantized to 8 bits.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(32))]
pub struct Q8Block {
    pub qs: [i8; BLOCK_ELEMS],
    pub d: f32,
    /// Σ qs, for the weight schemes with an offset (Q4_0's −8, Q4_1's minimum).
    pub sum: i32,
}

/// Quantizes `x` (a whole number of blocks) into `out`: scale `max|x|/127`, values rounded to
/// the nearest (half away from zero, as `roundf`).
pub fn quantize_row(x: &[f32], out: &mut [Q8Block]) {
    for (blk, o) in x.chunks_exact(BLOCK_ELEMS).zip(out.iter_mut()) {
        let amax = blk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in o.qs.iter_mut().zip(blk) {
            *q = (v * id).round() as i8;
            sum += i32::from(*q);
        }
        o.d = d;
        o.sum = sum;
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
        assert!(w.len() >= kb * scheme.block_bytes() && a.len() >= kb * out.len());
        #[cfg(target_arch = "x86_64")]
        match self {
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

/// A quantized `[N, K]` weight repacked once, when the plan is made, for the x86 kernels: rows
/// in groups of [`GROUP`] (the last one padded with zero rows), each group's blocks one after
/// the other, and per (group, block) a record of the 8 rows' f16 scales, their f16 minimums
/// (Q4_1), then the quants interleaved so that one 32-byte vector holds the same 4 columns of
/// all 8 rows: `vpdpbusd` with those 4 activation bytes broadcast sums each row in its own lane,
/// and a block's 8 row sums come out as one vector (no horizontal sum, one scale multiply for
/// the 8 rows). The records are exactly as large as the 8 rows' blocks (no extra traffic).
///
/// Quants, for 4-column group `g` (columns 4g..4g+4) of row `r`, at byte `4r + i` of vector
/// `g`: Q8_0 `w ^ 0x80` (the unsigned `w + 128`; the kernel subtracts `128·Σa`), Q4 the nibble,
/// vectors `g` and `g + 4` sharing a byte (low and high nibble) so 4 loads give all 8.
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
    /// Bytes of one (group, block) record.
    pub fn record_bytes(scheme: IntScheme) -> usize {
        GROUP * scheme.block_bytes()
    }

    /// Repacks `src` (`n` rows of `kb` blocks of `scheme`).
    ///
    /// # Panics
    /// When `src` holds fewer than `n·kb` blocks (the plan checked the weight's shape).
    pub fn new(scheme: IntScheme, src: &crate::ir::QuantTensor, n: usize, kb: usize) -> Packed {
        let bb = scheme.block_bytes();
        let bytes = src.bytes();
        assert!(
            bytes.len() >= n * kb * bb,
            "a [{n}, {kb}·32] weight's blocks"
        );
        let rec = Packed::record_bytes(scheme);
        let groups = n.div_ceil(GROUP);
        let mut data = vec![0u8; groups * kb * rec];
        let qo = scheme.quants_offset();
        let head = if scheme == IntScheme::Q4_1 { 32 } else { 16 };
        for (gi, grp) in data.chunks_exact_mut(kb * rec).enumerate() {
            for (b, out) in grp.chunks_exact_mut(rec).enumerate() {
                let (scales, quants) = out.split_at_mut(head);
                if scheme == IntScheme::Q8_0 {
                    // Padded rows read as w = 0 (stored 0x80) with a zero scale.
                    quants.fill(0x80);
                }
                for r in 0..GROUP {
                    let row = gi * GROUP + r;
                    if row >= n {
                        continue;
                    }
                    let blk = &bytes[(row * kb + b) * bb..][..bb];
                    scales[2 * r..2 * r + 2].copy_from_slice(&blk[..2]);
                    if scheme == IntScheme::Q4_1 {
                        scales[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&blk[2..4]);
                    }
                    let q = &blk[qo..];
                    for e in 0..BLOCK_ELEMS {
                        let (g, i) = (e / 4, e % 4);
                        match scheme {
                            IntScheme::Q8_0 => quants[g * 32 + 4 * r + i] = q[e] ^ 0x80,
                            IntScheme::Q4_0 | IntScheme::Q4_1 => {
                                let nib = if e < 16 { q[e] & 0xF } else { q[e - 16] >> 4 };
                                let shift = if g < 4 { 0 } else { 4 };
                                quants[(g % 4) * 32 + 4 * r + i] |= nib << shift;
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
        let rb = self.kb * self.scheme.block_bytes();
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
        let rec = Packed::record_bytes(w.scheme);
        let recs = &w.data[group * kb * rec..(group + 1) * kb * rec];
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

/// The reference: integer sums per block, one f32 product per block, summed in order.
pub fn dot_portable(scheme: IntScheme, w: &[u8], a: &[Q8Block]) -> f32 {
    let bb = scheme.block_bytes();
    let qo = scheme.quants_offset();
    let mut acc = 0.0f32;
    for (blk, act) in w.chunks_exact(bb).zip(a) {
        let dw = f16_at(blk, 0);
        let q = &blk[qo..bb];
        let v = match scheme {
            IntScheme::Q8_0 => {
                let s: i32 = q
                    .iter()
                    .zip(&act.qs)
                    .map(|(&w, &x)| i32::from(w as i8) * i32::from(x))
                    .sum();
                dw * act.d * s as f32
            }
            IntScheme::Q4_0 | IntScheme::Q4_1 => {
                let mut s = 0i32;
                for (j, &b) in q.iter().enumerate() {
                    s += i32::from(b & 0xF) * i32::from(act.qs[j]);
                    s += i32::from(b >> 4) * i32::from(act.qs[j + 16]);
                }
                if scheme == IntScheme::Q4_0 {
                    dw * act.d * (s - 8 * act.sum) as f32
                } else {
                    dw * act.d * s as f32 + f16_at(blk, 2) * act.d * act.sum as f32
                }
            }
        };
        acc += v;
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
            _ => (20, 4),
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

    /// One group of 8 repacked rows with `T` activation rows (`Packed`'s layout).
    #[inline(always)]
    #[allow(clippy::needless_range_loop)] // `t` indexes the activation rows and `acc` alike
    unsafe fn group<const DP: u8, const S: u8, const T: usize>(
        recs: &[u8],
        a: &[Q8Block],
        kb: usize,
        out: &mut [[f32; 8]],
    ) {
        let (rec, head) = match S {
            Q8_0 => (8 * 34, 16),
            Q4_0 => (8 * 18, 16),
            _ => (8 * 20, 32),
        };
        // SAFETY: the entry points enable AVX2/FMA/F16C (and DP's features); the caller
        // asserted `recs` holds `kb` records and `a` `T·kb` blocks, so every pointer below is
        // inside them; loads are unaligned; `out` has `T` rows of 8.
        unsafe {
            let low = _mm256_set1_epi8(0x0F);
            let mut acc = [_mm256_setzero_ps(); T];
            let rp = recs.as_ptr();
            for b in 0..kb {
                let r = rp.add(b * rec);
                let dv = _mm256_cvtph_ps(_mm_loadu_si128(r as *const __m128i));
                let mv = if S == Q4_1 {
                    _mm256_cvtph_ps(_mm_loadu_si128(r.add(16) as *const __m128i))
                } else {
                    _mm256_setzero_ps()
                };
                let q = r.add(head) as *const __m256i;
                let mut v = [_mm256_setzero_si256(); 8];
                if S == Q8_0 {
                    for (g, vg) in v.iter_mut().enumerate() {
                        *vg = _mm256_loadu_si256(q.add(g));
                    }
                } else {
                    for h in 0..4 {
                        let p = _mm256_loadu_si256(q.add(h));
                        v[h] = _mm256_and_si256(p, low);
                        v[h + 4] = _mm256_and_si256(_mm256_srli_epi16(p, 4), low);
                    }
                }
                for t in 0..T {
                    let act = &*a.as_ptr().add(t * kb + b);
                    let xp = act.qs.as_ptr() as *const i32;
                    // Two chains of 4, so that vpdpbusd's latency overlaps.
                    let mut s0 = _mm256_setzero_si256();
                    let mut s1 = _mm256_setzero_si256();
                    for g in (0..8).step_by(2) {
                        let x0 = _mm256_set1_epi32(xp.add(g).read_unaligned());
                        let x1 = _mm256_set1_epi32(xp.add(g + 1).read_unaligned());
                        s0 = dp_packed::<DP, S>(s0, v[g], x0);
                        s1 = dp_packed::<DP, S>(s1, v[g + 1], x1);
                    }
                    let mut isum = _mm256_add_epi32(s0, s1);
                    if S == Q8_0 && DP != MADD {
                        isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(128 * act.sum));
                    } else if S == Q4_0 {
                        isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(8 * act.sum));
                    }
                    let scale = _mm256_mul_ps(dv, _mm256_set1_ps(act.d));
                    acc[t] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(isum), acc[t]);
                    if S == Q4_1 {
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
                IntScheme::Q4_0 => monomorphised!(@rows $f, $dp, Q4_0, $rows; $($arg),*),
                IntScheme::Q4_1 => monomorphised!(@rows $f, $dp, Q4_1, $rows; $($arg),*),
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
                unsafe { monomorphised!(tile::<$dp>(scheme, out.len(); w, a, kb, out)) }
            }

            /// # Safety
            #[doc = $needs]
            /// `recs` holds `kb` records of `scheme`, `a` holds `out.len()·kb` blocks,
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
    use crate::ir::random_quant;
    use crate::ir::Shape;

    /// The chosen kernel against the portable reference, and both against an f64 sum of the
    /// dequantized weight times the dequantized activations (the same quantized math).
    #[test]
    fn kernels_agree_with_the_f64_sum_of_the_blocks() {
        for scheme in QuantScheme::ALL {
            let Some(int) = IntScheme::of(scheme) else {
                continue;
            };
            let k = 32 * 7;
            let w = random_quant("w", scheme, &Shape(vec![3, k]), 5).unwrap();
            let x: Vec<f32> = (0..k)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
                .collect();
            let mut a = vec![Q8Block::default(); k / 32];
            quantize_row(&x, &mut a);
            let dense = w.to_tensor(crate::ir::DType::F32).unwrap();
            let dense = dense.as_f32().unwrap();
            for row in 0..3 {
                let bytes = &w.bytes()[row * (k / 32) * scheme.block_bytes()..]
                    [..(k / 32) * scheme.block_bytes()];
                let want: f64 = (0..k)
                    .map(|i| {
                        let xa = f64::from(a[i / 32].d) * f64::from(a[i / 32].qs[i % 32]);
                        f64::from(dense[row * k + i]) * xa
                    })
                    .sum();
                assert_eq!(int.block_bytes(), scheme.block_bytes());
                let p = dot_portable(int, bytes, &a);
                let f = Kernel::detect().dot(int, bytes, &a);
                let tol = 1e-5 * want.abs().max(1.0);
                assert!((f64::from(p) - want).abs() < tol, "{scheme} {p} {want}");
                assert!((f64::from(f) - want).abs() < tol, "{scheme} {f} {want}");
            }
        }
    }
}
