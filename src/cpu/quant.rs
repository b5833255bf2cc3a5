//! Quantized GEMV straight on the weight blocks (`ir::quant`): the activations are quantized to
//! 8 bits once per row (a block of 32 as llama.cpp's `quantize_row_q8_1`: an f32 scale, the
//! 32 signed bytes and their integer sum), and each block's dot product is an integer sum
//! scaled once. Kernels: a portable one (the reference in tests) and AVX2+FMA
//! (`_mm256_maddubs_epi16`), picked at run time.
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

    fn block_bytes(self) -> usize {
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

/// Which dot-product kernel this CPU runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    Portable,
    /// x86-64 AVX2 with FMA.
    Avx2,
}

impl Kernel {
    /// The fastest kernel the running CPU supports.
    pub fn detect() -> Kernel {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                return Kernel::Avx2;
            }
        }
        Kernel::Portable
    }

    /// The dot product of one weight row (its blocks) with one quantized activation row.
    pub fn dot(self, scheme: IntScheme, w: &[u8], a: &[Q8Block]) -> f32 {
        match self {
            Kernel::Portable => dot_portable(scheme, w, a),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` is only made by `detect` after checking AVX2 and FMA at run time
            // (or by a test that checked them the same way).
            Kernel::Avx2 => unsafe { avx2::dot(scheme, w, a) },
            #[cfg(not(target_arch = "x86_64"))]
            Kernel::Avx2 => dot_portable(scheme, w, a),
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
mod avx2 {
    use std::arch::x86_64::*;

    use super::IntScheme;
    use super::{f16_at, Q8Block};

    /// Horizontal sum of 8 lanes.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    /// # Safety
    /// The CPU supports AVX2 and FMA; `w` holds at least `a.len()` blocks of `scheme`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot(scheme: IntScheme, w: &[u8], a: &[Q8Block]) -> f32 {
        let bb = scheme.block_bytes();
        let qo = scheme.quants_offset();
        let ones = _mm256_set1_epi16(1);
        let low = _mm_set1_epi8(0x0F);
        let mut acc = _mm256_setzero_ps();
        let mut offset = 0.0f32;
        for (blk, act) in w.chunks_exact(bb).zip(a) {
            let dw = f16_at(blk, 0);
            let q = blk[qo..bb].as_ptr();
            // SAFETY (loads): `q` points at the block's quants (16 bytes for Q4, 32 for Q8,
            // inside `blk`), `act.qs` is 32 bytes; unaligned loads.
            let x = _mm256_loadu_si256(act.qs.as_ptr() as *const __m256i);
            let prod = match scheme {
                IntScheme::Q8_0 => {
                    let wq = _mm256_loadu_si256(q as *const __m256i);
                    // maddubs takes unsigned × signed: |w| times x with w's sign.
                    let aw = _mm256_sign_epi8(wq, wq);
                    let sx = _mm256_sign_epi8(x, wq);
                    _mm256_maddubs_epi16(aw, sx)
                }
                IntScheme::Q4_0 | IntScheme::Q4_1 => {
                    let bytes = _mm_loadu_si128(q as *const __m128i);
                    let lo = _mm_and_si128(bytes, low);
                    let hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low);
                    let nib = _mm256_set_m128i(hi, lo);
                    _mm256_maddubs_epi16(nib, x)
                }
            };
            let sum32 = _mm256_madd_epi16(prod, ones);
            let scale = _mm256_set1_ps(dw * act.d);
            acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sum32), acc);
            match scheme {
                IntScheme::Q8_0 => {}
                IntScheme::Q4_0 => offset -= dw * act.d * (8 * act.sum) as f32,
                IntScheme::Q4_1 => offset += f16_at(blk, 2) * act.d * act.sum as f32,
            }
        }
        hsum(acc) + offset
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
