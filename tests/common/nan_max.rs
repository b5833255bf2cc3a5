//! Maxima that keep NaN. `f64::max` returns the other operand when one is NaN, so
//! `fold(0.0, f64::max)` over errors that include a NaN silently drops it and a NaN result
//! passes a `worst <= tol` check; these propagate it instead.

/// The larger of `a` and `b`, or NaN when either is NaN.
pub fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// The largest |a − b| over the pairs, NaN when any difference is NaN (a NaN on either side,
/// or infinities of the same sign), 0 for no pairs.
pub fn max_abs_diff(got: &[f64], want: &[f64]) -> f64 {
    got.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, nan_max)
}

/// The largest |x|, NaN when any element is NaN, 0 for none.
pub fn max_abs(values: &[f64]) -> f64 {
    values.iter().map(|x| x.abs()).fold(0.0, nan_max)
}
