//! Shared-memory tiles of 16-bit operands, read by the GEMM and the attention matrix-core
//! kernels alike (their K/V tiles are laid out as GEMM B tiles).

use serde::Serialize;

/// Halves per 16-byte chunk: the unit of global loads, swizzles and ldmatrix row addresses.
pub(crate) const CHUNK: usize = 8;

/// Shared-memory geometry of one operand's tile (the attention kernel's K/V tiles too): `rows` rows of `ld` halves, chunk
/// `c / 8` of row `r` stored at chunk `(c / 8) ^ ((r / swz_div) % swz_mod)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct TileLayout {
    pub rows: usize,
    pub cols: usize,
    pub ld: usize,
    pub swz_div: usize,
    pub swz_mod: usize,
}

impl TileLayout {
    /// Swizzled: the 8 rows one ldmatrix phase reads (same logical chunk) land on 8 distinct
    /// 16-byte bank groups of a 128-byte line. Padded: each row starts 16 bytes further along
    /// the banks, so do the rows an element load reads across lanes.
    pub(crate) fn new(rows: usize, cols: usize, swizzle: bool) -> TileLayout {
        let per_row = cols / CHUNK;
        if swizzle {
            TileLayout {
                rows,
                cols,
                ld: cols,
                swz_div: (CHUNK / per_row).max(1),
                swz_mod: per_row.min(CHUNK),
            }
        } else {
            TileLayout {
                rows,
                cols,
                ld: cols + CHUNK,
                swz_div: 1,
                swz_mod: 1,
            }
        }
    }

    /// A padded tile of f32 (TF32) elements, never swizzled (the TF32 atoms load element by
    /// element, not by `ldmatrix`). `k_rows`: the tile's rows run along K (B stored `[K, N]`, V),
    /// so a fragment load's lanes read 4 rows (K) × 8 columns: rows 8 floats apart put those
    /// 32 words on 32 banks. Otherwise a load reads 8 rows × 4 columns: rows 4 floats (one
    /// 16-byte chunk) apart do. Both keep rows 16-byte aligned for the staging copies.
    pub(crate) fn padded_f32(rows: usize, cols: usize, k_rows: bool) -> TileLayout {
        TileLayout {
            rows,
            cols,
            ld: cols + if k_rows { 8 } else { CHUNK / 2 },
            swz_div: 1,
            swz_mod: 1,
        }
    }

    pub(crate) fn elems(&self) -> usize {
        self.rows * self.ld
    }

    /// The element index of (r, c), as the template's `rf_gemm_sa`/`rf_gemm_sb` compute it
    /// (tests evaluate the tiling through it).
    #[cfg(test)]
    pub(crate) fn index(&self, r: usize, c: usize) -> usize {
        r * self.ld + ((((c >> 3) ^ ((r / self.swz_div) % self.swz_mod)) << 3) | (c & 7))
    }
}
