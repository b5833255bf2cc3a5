//! Quantized GEMV straight on the weight blocks (`ir::quant`): the activations are quantized to
//! 8 bits once per row (a block of 32 as llama.cpp's `quantize_row_q8_1`: an f32 scale, the
//! 32 signed bytes and their integer sum), and each block's dot product is an integer sum
//! scaled once. Kernels: a portable one (the reference in tests), AVX2 (`maddubs`), AVX-VNNI
//! and AVX-512 VNNI (`vpdpbusd`), picked at run time ([`Kernel::detect`]); each dots one weight
//! row with up to [`TILE`] activation rows at once. aarch64 runs the portable kernel.
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

    #[inline(always)]
    unsafe fn dispatch<const DP: u8>(
        scheme: IntScheme,
        w: &[u8],
        a: &[Q8Block],
        kb: usize,
        out: &mut [f32],
    ) {
        macro_rules! rows {
            ($s:expr) => {
                match out.len() {
                    0 => {}
                    1 => tile::<DP, $s, 1>(w, a, kb, out),
                    2 => tile::<DP, $s, 2>(w, a, kb, out),
                    3 => tile::<DP, $s, 3>(w, a, kb, out),
                    _ => tile::<DP, $s, 4>(w, a, kb, out),
                }
            };
        }
        // SAFETY: forwarded from the entry point's contract.
        unsafe {
            match scheme {
                IntScheme::Q8_0 => rows!(Q8_0),
                IntScheme::Q4_0 => rows!(Q4_0),
                IntScheme::Q4_1 => rows!(Q4_1),
            }
        }
    }

    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `w` holds `kb` blocks, `a` holds `out.len()·kb`
    /// blocks, `out.len()` ≤ 4.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn tile_avx2(
        scheme: IntScheme,
        w: &[u8],
        a: &[Q8Block],
        kb: usize,
        out: &mut [f32],
    ) {
        // SAFETY: the caller's contract.
        unsafe { dispatch::<MADD>(scheme, w, a, kb, out) }
    }

    /// # Safety
    /// As [`tile_avx2`], and the CPU has AVX-VNNI.
    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    pub unsafe fn tile_avxvnni(
        scheme: IntScheme,
        w: &[u8],
        a: &[Q8Block],
        kb: usize,
        out: &mut [f32],
    ) {
        // SAFETY: the caller's contract.
        unsafe { dispatch::<AVXVNNI>(scheme, w, a, kb, out) }
    }

    /// # Safety
    /// As [`tile_avx2`], and the CPU has AVX-512 F, VL and VNNI.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
    pub unsafe fn tile_avx512vnni(
        scheme: IntScheme,
        w: &[u8],
        a: &[Q8Block],
        kb: usize,
        out: &mut [f32],
    ) {
        // SAFETY: the caller's contract.
        unsafe { dispatch::<AVX512VNNI>(scheme, w, a, kb, out) }
    }
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
