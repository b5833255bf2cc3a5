//! Products with a fixed dense B (a weight) repacked once, when the plan is made, into panels
//! of [`NR`] columns, and an AVX-512 kernel that streams those panels against A read in place.
//!
//! Why: `matrixmultiply` packs B on every call, once per task; at MiniLM's 128 rows that
//! packing (and its per-call buffers) cost as much as a third of the product. A weight never
//! changes, so its packing is paid once. Each result element is one sum over K in order, so
//! results do not depend on how the columns are split over threads.

/// Columns of a panel: two AVX-512 registers of f32.
pub const NR: usize = 32;
/// Rows of A a kernel call keeps in registers (2 × 8 accumulators of 16 lanes).
const MR: usize = 8;

/// B `[K, N]` as panels: panel `p` holds `B[k][p·NR + c]` at `(p·K + k)·NR + c`, zeros past N.
pub struct PackedB {
    k: usize,
    n: usize,
    data: Vec<f32>,
}

impl PackedB {
    /// Packs B whose element (k, j) is `src[off + k·rs + j·cs]` (the caller's view, checked
    /// by shape inference to lie inside `src`).
    pub fn new(src: &[f32], off: usize, rs: usize, cs: usize, k: usize, n: usize) -> PackedB {
        let panels = n.div_ceil(NR);
        let mut data = vec![0.0f32; panels * k * NR];
        for (p, panel) in data.chunks_mut((k * NR).max(1)).enumerate() {
            for (kk, row) in panel.chunks_mut(NR).enumerate() {
                for (c, x) in row.iter_mut().enumerate() {
                    let j = p * NR + c;
                    if j < n {
                        *x = src[off + kk * rs + j * cs];
                    }
                }
            }
        }
        PackedB { k, n, data }
    }

    pub fn panels(&self) -> usize {
        self.n.div_ceil(NR)
    }
}

/// Whether this CPU runs the packed kernel (AVX-512F, detected at run time).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `C[i][j] = Σₖ A[i][k]·B[k][j]` for rows `i < m` and the columns of panels `p0..p1` (clipped
/// to N): A's row `i` is `a[i·lda..][..K]`, C's element (i, j) is at `c + i·ldc + j`.
///
/// # Safety
/// [`available`] must be true; `c` must be valid for writes of every such element, and no
/// other thread may access them meanwhile.
///
/// # Panics
/// When `a` is shorter than `m` rows of `lda` (the last one K long) or `p1` is past the panels.
pub unsafe fn gemm(
    a: &[f32],
    lda: usize,
    m: usize,
    b: &PackedB,
    panels: std::ops::Range<usize>,
    c: *mut f32,
    ldc: usize,
) {
    let k = b.k;
    if m == 0 || panels.is_empty() {
        return;
    }
    assert!(
        panels.end <= b.panels(),
        "panels {panels:?} of {}",
        b.panels()
    );
    assert!(
        (m - 1) * lda + k <= a.len(),
        "A: {m} rows of stride {lda} past {}",
        a.len()
    );
    #[cfg(target_arch = "x86_64")]
    for p in panels {
        let cols = NR.min(b.n - p * NR);
        let bp = &b.data[p * k * NR..(p + 1) * k * NR];
        let mut i = 0;
        while i < m {
            let rows = MR.min(m - i);
            let (ar, cr) = (&a[i * lda..], c.add(i * ldc + p * NR));
            // SAFETY: AVX-512F is available (the caller's contract); `ar` holds `rows` rows of
            // `lda` with K values each (asserted above); `bp` is the panel's K·NR values; C's
            // rows i..i+rows, columns p·NR.. p·NR + cols are the caller's to write.
            unsafe {
                match rows {
                    8 => avx512::tile::<8>(ar, lda, k, bp, cr, ldc, cols),
                    7 => avx512::tile::<7>(ar, lda, k, bp, cr, ldc, cols),
                    6 => avx512::tile::<6>(ar, lda, k, bp, cr, ldc, cols),
                    5 => avx512::tile::<5>(ar, lda, k, bp, cr, ldc, cols),
                    4 => avx512::tile::<4>(ar, lda, k, bp, cr, ldc, cols),
                    3 => avx512::tile::<3>(ar, lda, k, bp, cr, ldc, cols),
                    2 => avx512::tile::<2>(ar, lda, k, bp, cr, ldc, cols),
                    _ => avx512::tile::<1>(ar, lda, k, bp, cr, ldc, cols),
                }
            }
            i += rows;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (a, lda, c, ldc);
        unreachable!("the packed kernel is only available on x86-64 with AVX-512F");
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::NR;

    /// R rows of A times one panel: 2·R accumulators of 16 lanes held over the whole of K,
    /// then stored (masked past `cols`).
    ///
    /// # Safety
    /// AVX-512F available; `a` holds R rows of stride `lda` with `k` values each; `b` holds
    /// `k·NR` values; `c` is writable at `r·ldc + j` for r < R, j < cols ≤ NR.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn tile<const R: usize>(
        a: &[f32],
        lda: usize,
        k: usize,
        b: &[f32],
        c: *mut f32,
        ldc: usize,
        cols: usize,
    ) {
        debug_assert!(b.len() >= k * NR && a.len() >= (R - 1) * lda + k);
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        let (ap, bp) = (a.as_ptr(), b.as_ptr());
        for kk in 0..k {
            // SAFETY: kk < k: the panel's row kk is in `b`, A's (r, kk) in `a` (contract).
            unsafe {
                let b0 = _mm512_loadu_ps(bp.add(kk * NR));
                let b1 = _mm512_loadu_ps(bp.add(kk * NR + 16));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let x = _mm512_set1_ps(*ap.add(r * lda + kk));
                    acc[0] = _mm512_fmadd_ps(x, b0, acc[0]);
                    acc[1] = _mm512_fmadd_ps(x, b1, acc[1]);
                }
            }
        }
        let lo = cols.min(16);
        let hi = cols - lo;
        let mask = |n: usize| -> __mmask16 { ((1u32 << n) - 1) as __mmask16 };
        for (r, acc) in acc.iter().enumerate() {
            // SAFETY: columns below `cols` of row r are writable (contract); the masks keep
            // the stores to them.
            unsafe {
                let row = c.add(r * ldc);
                if cols == NR {
                    _mm512_storeu_ps(row, acc[0]);
                    _mm512_storeu_ps(row.add(16), acc[1]);
                } else {
                    _mm512_mask_storeu_ps(row, mask(lo), acc[0]);
                    if hi > 0 {
                        _mm512_mask_storeu_ps(row.add(16), mask(hi), acc[1]);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Odd sizes (row and column tails, one panel and several) against an f64 reference,
    /// with B read through a transposed view (a weight stored [N, K]).
    #[test]
    fn packed_products_match_an_f64_reference_at_odd_sizes() {
        if !available() {
            eprintln!("skipped: no AVX-512F on this CPU");
            return;
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        for (m, n, k) in [
            (1, 1, 1),
            (7, 33, 5),
            (9, 32, 64),
            (17, 70, 129),
            (8, 96, 384),
        ] {
            let a: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0..1.0)).collect();
            let w: Vec<f32> = (0..n * k).map(|_| rng.random_range(-1.0..1.0)).collect();
            // B[k][j] = W[j][k]: row stride 1, column stride k.
            let pb = PackedB::new(&w, 0, 1, k, k, n);
            let ldc = n + 3;
            let mut c = vec![f32::NAN; m * ldc];
            // SAFETY: available() checked; `c` holds m rows of ldc ≥ n.
            unsafe { gemm(&a, k, m, &pb, 0..pb.panels(), c.as_mut_ptr(), ldc) };
            for i in 0..m {
                for j in 0..n {
                    let want: f64 = (0..k)
                        .map(|t| f64::from(a[i * k + t]) * f64::from(w[j * k + t]))
                        .sum();
                    let got = f64::from(c[i * ldc + j]);
                    assert!(
                        (got - want).abs() <= 1e-5 * (k as f64).sqrt(),
                        "{m}x{n}x{k} ({i}, {j}): {got} vs {want}"
                    );
                }
                // Nothing written past N.
                assert!(c[i * ldc + n..(i + 1) * ldc].iter().all(|x| x.is_nan()));
            }
        }
    }
}
