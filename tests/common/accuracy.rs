//! How close a kernel's result must be to the interpreter's: the design's tolerances and the
//! relative L2 error the kernel test targets measure.
#![allow(dead_code)]

use rocmforge::ir::{DType, Tensor};

/// The design's tolerances: relative L2 error against the f32 interpreter (`DType::tolerance`;
/// the tests compare floats only, so integers take f32's).
pub fn tolerance(dt: DType) -> f64 {
    if dt.is_float() {
        dt.tolerance()
    } else {
        DType::F32.tolerance()
    }
}

/// The relative L2 bound of an f32 matmul run at TF32 precision (`F32Matmul::Tf32`) against the
/// exact f32 interpreter. Each operand is rounded to a 10-bit mantissa (to nearest: relative error
/// at most u = 2⁻¹¹ ≈ 4.9e-4), so each product a·b is off by at most ≈ 2u relative; accumulation
/// is f32 (K terms add at most K·2⁻²⁴ relative to Σ|ab|, ≈ 2.4e-5 at K = 384, negligible). The
/// rounding errors of independent inputs are independent and zero-mean, so over a K-term dot
/// product of random inputs they add like a random walk, as the terms do: the relative error of
/// a result stays about √(2/3)·u ≈ 4e-4 whatever K. Attention adds P rounded to TF32 before P·V
/// (another u) and the scores' error through exp (absolute error in a score of size ~1 becomes
/// relative error of its weight): ≈ 1e-3. The bound is f16's, 2e-3 — TF32 keeps f16's 10-bit
/// mantissa — which holds those with room, and is 200× what exact f32 must meet, so a TF32
/// kernel could not pass as exact nor an exact one be needed to pass.
pub const TF32_REL_L2: f64 = 2e-3;

/// Relative L2 error of `got` against `want`, both taken as f32 (any float dtype); a
/// non-finite element (the poison of a slot nobody wrote, a NaN) fails.
pub fn rel_l2(got: &Tensor, want: &Tensor) -> Result<f64, String> {
    let (got, want) = (got.cast(DType::F32), want.cast(DType::F32));
    if got.ty() != want.ty() {
        return Err(format!("{} vs {}", got.ty(), want.ty()));
    }
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let (mut num, mut den) = (0.0, 0.0);
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        if !a.is_finite() || !b.is_finite() {
            return Err(format!("element {i} is {a}, want {b}"));
        }
        num += (a - b).powi(2);
        den += b * b;
    }
    Ok(if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    })
}
