//! Transcendental functions over f32 slices, written without branches or calls so the
//! compiler vectorises them (the scalar `f32::exp` and `libm::erff` are calls per element:
//! MiniLM's GELU epilogue spent more time in `erff` than in its product).
//!
//! They are approximations, not the interpreter's bits: `exp` within 2 ulp, sigmoid and SiLU
//! within a few, GELU within 1e-7·max(1, |x|) absolute of the exact erf form (Abramowitz &
//! Stegun 7.1.26, whose erf error bound is 1.5e-7, halved by GELU's x/2). All are far inside
//! the f32 tolerance (1e-5 relative L2) the CPU device is held to against the interpreter. NaN stays NaN, and ±∞ give what the
//! interpreter's formulas give (exp: ∞ and 0; sigmoid: 1 and 0; GELU and SiLU: ∞ and NaN).

use std::f32::consts::{FRAC_1_SQRT_2, LOG2_E};

/// ln 2 split in two so `x − n·ln 2` stays exact for |n| ≤ 150 (Cody and Waite): the high part
/// (355/512) has few enough mantissa bits that `n · LN2_HI` is exact, and the low part is
/// ln 2 − 355/512 to f32 precision (not `LN_2 − LN2_HI` in f32, which keeps f32 `LN_2`'s
/// rounding error and costs 4 ulp near e⁸⁸).
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Adding then subtracting 1.5·2²³ rounds a float of magnitude below 2²² to the nearest
/// integer (ties to even), with no call to `round`.
const ROUND: f32 = 12_582_912.0;

/// eˣ of one value, the body of [`exp`] (inlined into the slice loops).
#[inline(always)]
pub fn exp1(x: f32) -> f32 {
    // Beyond these, eˣ is ∞ or rounds to 0 in f32; clamping keeps 2ⁿ representable as two
    // factors below. `clamp` returns NaN for NaN, which the arithmetic carries through.
    let x = x.clamp(-104.0, 89.0);
    let n = (x * LOG2_E + ROUND) - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    // eʳ for |r| ≤ ln2/2 by its Taylor polynomial to degree 7 (remainder below 2⁻²⁵).
    let p = 1.0 / 5040.0;
    let p = p * r + 1.0 / 720.0;
    let p = p * r + 1.0 / 120.0;
    let p = p * r + 1.0 / 24.0;
    let p = p * r + 1.0 / 6.0;
    let p = p * r + 0.5;
    let p = p * r + 1.0;
    let p = p * r + 1.0;
    // 2ⁿ for n in [−150, 129] as two powers of two each inside the exponent range, so the
    // result underflows to subnormals and overflows to ∞ as eˣ does.
    let n = n as i32;
    let half = n >> 1;
    let s1 = f32::from_bits(((half + 127) as u32) << 23);
    let s2 = f32::from_bits(((n - half + 127) as u32) << 23);
    p * s1 * s2
}

/// `dst[i] = e^src[i]`.
pub fn exp(src: &[f32], dst: &mut [f32]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = exp1(x);
    }
}

/// `v[i] = e^v[i]`.
pub fn exp_in_place(v: &mut [f32]) {
    for x in v.iter_mut() {
        *x = exp1(*x);
    }
}

/// The logistic function 1 / (1 + e⁻ˣ) of one value.
#[inline(always)]
fn sigmoid1(x: f32) -> f32 {
    // As the interpreter: 1/(1 + e⁻ˣ) for x ≥ 0, eˣ/(1 + eˣ) below, so the exponential
    // never overflows and tiny results keep their (subnormal) value.
    let e = exp1(-x.abs());
    let r = 1.0 / (1.0 + e);
    if x >= 0.0 {
        r
    } else {
        e * r
    }
}

pub fn sigmoid(src: &[f32], dst: &mut [f32]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = sigmoid1(x);
    }
}

/// x·σ(x).
pub fn silu(src: &[f32], dst: &mut [f32]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        // x = −∞ gives −∞·0 = NaN, as the interpreter's x·σ(x) does.
        *d = x * sigmoid1(x);
    }
}

/// GELU, the erf form: x/2 · (1 + erf(x/√2)), with erf by Abramowitz & Stegun 7.1.26:
/// erf(z) = 1 − (a₁t + a₂t² + a₃t³ + a₄t⁴ + a₅t⁵)·e^(−z²), t = 1/(1 + p·z) for z ≥ 0, odd.
pub fn gelu(src: &[f32], dst: &mut [f32]) {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [
        0.254_829_6,
        -0.284_496_74,
        1.421_413_8,
        -1.453_152,
        1.061_405_4,
    ];
    for (d, &x) in dst.iter_mut().zip(src) {
        let z = (x * FRAC_1_SQRT_2).abs();
        let t = 1.0 / (1.0 + P * z);
        let poly = ((((A[4] * t + A[3]) * t + A[2]) * t + A[1]) * t + A[0]) * t;
        let erf_abs = 1.0 - poly * exp1(-z * z);
        let erf = if x < 0.0 { -erf_abs } else { erf_abs };
        // x = −∞ gives −∞·0 = NaN, as the interpreter's formula does.
        *d = 0.5 * x * (1.0 + erf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Values across the whole range: seeded uniform in a few magnitudes plus the edges.
    fn samples() -> Vec<f32> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let mut v: Vec<f32> = [1e-6f32, 1e-2, 1.0, 4.0, 20.0, 100.0]
            .iter()
            .flat_map(|&m| {
                (0..2000)
                    .map(|_| rng.random_range(-m..m))
                    .collect::<Vec<_>>()
            })
            .collect();
        v.extend([
            0.0,
            -0.0,
            88.7,
            88.72,
            89.0,
            -87.3,
            -103.9,
            -104.5,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN,
        ]);
        v
    }

    fn ulps(a: f32, b: f32) -> u32 {
        if a == b {
            return 0;
        }
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn exp_is_within_two_ulp_of_the_exact_function() {
        let v = samples();
        let mut got = vec![0.0; v.len()];
        exp(&v, &mut got);
        for (&x, &g) in v.iter().zip(&got) {
            // Results are never negative, so the bit patterns order them (subnormals too).
            let want = (x as f64).exp() as f32;
            assert!(ulps(g, want) <= 2, "exp({x}) = {g}, want {want}");
        }
        let mut nan = [0.0];
        exp(&[f32::NAN], &mut nan);
        assert!(nan[0].is_nan());
    }

    /// Within (`tol` + two steps of the smallest subnormal)·max(1, |x|) plus four f32
    /// roundings of `want`, or the same non-finite value.
    fn near(what: &str, x: f32, g: f32, want: f64, tol: f64) {
        if !want.is_finite() {
            assert!(
                g.is_nan() && want.is_nan() || g as f64 == want,
                "{what}({x}) = {g}, want {want}"
            );
        } else {
            let err = (g as f64 - want).abs();
            // Two subnormal steps, times |x| where a subnormal σ(x) is multiplied by x.
            let bound = (tol + 3e-45) * f64::from(x.abs().min(f32::MAX)).max(1.0)
                + 4.0 * f64::from(f32::EPSILON) * want.abs();
            assert!(err <= bound, "{what}({x}) = {g}, want {want}");
        }
    }

    #[test]
    fn gelu_sigmoid_and_silu_are_within_f32_noise_of_the_exact_forms() {
        let v = samples();
        let mut got = vec![0.0; v.len()];
        gelu(&v, &mut got);
        for (&x, &g) in v.iter().zip(&got) {
            let x64 = x as f64;
            let want = 0.5 * x64 * (1.0 + libm::erf(x64 * std::f64::consts::FRAC_1_SQRT_2));
            near("gelu", x, g, want, 1e-7);
        }
        sigmoid(&v, &mut got);
        for (&x, &g) in v.iter().zip(&got) {
            near("sigmoid", x, g, 1.0 / (1.0 + (-(x as f64)).exp()), 0.0);
        }
        silu(&v, &mut got);
        for (&x, &g) in v.iter().zip(&got) {
            let x64 = x as f64;
            near("silu", x, g, x64 * (1.0 / (1.0 + (-x64).exp())), 0.0);
        }
        for f in [gelu, sigmoid, silu] {
            let mut out = [0.0];
            f(&[f32::NAN], &mut out);
            assert!(out[0].is_nan());
        }
    }
}
