//! The per-row bound every float comparison against a reference applies besides the tensor's
//! relative L2 error. A tensor-wide relative L2 error alone lets a few rows be entirely wrong:
//! at bf16's 1e-2 about 50 elements of a 1M-element attention output could be garbage and still
//! pass. A row is the last axis (an attention output's head vector, a GEMM output row, a logits
//! row).

#![allow(dead_code)]

use rocmforge::ir::{DType, Tensor};

use super::accuracy::rel_l2;

/// How far one row may be off, as a multiple of the tensor's tolerance. Correct kernels round
/// each element to f16/bf16 (half an ulp: 2^-11 / 2^-8 of its magnitude) after f32 accumulation,
/// so a row's error sits near the tensor's; 10x leaves room for rows whose values cancel
/// without admitting a wrong row.
pub const ROW_FACTOR: f64 = 10.0;

/// `got` against `want` within `tol`: the tensor's relative L2 error, then every row
/// ([`rows_within`]); the message names `what`.
pub fn within(what: &str, got: &Tensor, want: &Tensor, tol: f64) -> Result<(), String> {
    let err = rel_l2(got, want).map_err(|e| format!("{what}: {e}"))?;
    if err > tol {
        return Err(format!("{what}: relative L2 {err:e} > {tol:e}"));
    }
    rows_within(got, want, tol).map_err(|e| format!("{what}: {e}"))
}

/// Every row of `got` (the last axis) within `ROW_FACTOR * tol` of `want`, both taken as f32:
/// its relative L2 error, and its largest element error relative to the row's largest
/// magnitude. Each row's scale is at least the tensor's root-mean-square row (or element), so a
/// row of near-zeros (attention rows that see no key) is not judged against itself alone.
/// Non-finite pairs are skipped: the caller has judged where NaN and infinities sit.
pub fn rows_within(got: &Tensor, want: &Tensor, tol: f64) -> Result<(), String> {
    let (got, want) = (got.cast(DType::F32), want.cast(DType::F32));
    if got.ty() != want.ty() {
        return Err(format!("{} vs {}", got.ty(), want.ty()));
    }
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let row = want.shape().dims().last().copied().unwrap_or(1).max(1);
    let rows = g.len() / row;
    // Per row: squared error, squared reference norm, largest error, largest magnitude.
    let mut per_row = vec![(0.0f64, 0.0f64, 0.0f64, 0.0f64); rows];
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        if !a.is_finite() || !b.is_finite() {
            continue;
        }
        let r = &mut per_row[i / row];
        let d = (a - b).abs();
        r.0 += d * d;
        r.1 += b * b;
        r.2 = r.2.max(d);
        r.3 = r.3.max(b.abs());
    }
    let den: f64 = per_row.iter().map(|r| r.1).sum();
    let rms_row = (den / rows.max(1) as f64).sqrt();
    let rms_elem = (den / g.len().max(1) as f64).sqrt();
    let bound = ROW_FACTOR * tol;
    for (r, &(e2, w2, emax, wmax)) in per_row.iter().enumerate() {
        let scale = w2.sqrt().max(rms_row);
        let rel = if scale == 0.0 {
            e2.sqrt()
        } else {
            e2.sqrt() / scale
        };
        if rel > bound {
            return Err(format!(
                "row {r} (of {rows}, {row} wide): relative L2 {rel:e} > {bound:e}"
            ));
        }
        let mag = wmax.max(rms_elem);
        let worst = if mag == 0.0 { emax } else { emax / mag };
        if worst > bound {
            return Err(format!(
                "row {r} (of {rows}, {row} wide): max |error| {emax:e} is {worst:e} of the \
                 row's largest magnitude {wmax:e}, > {bound:e}"
            ));
        }
    }
    Ok(())
}
