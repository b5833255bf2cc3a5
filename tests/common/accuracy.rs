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
