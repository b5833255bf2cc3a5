//! Which views allow 16-byte vector loads. A kernel loads `vec` consecutive elements along one
//! problem axis (K, M or N) with one instruction, starting at indices that are multiples of
//! `vec`; that reads the right elements, from an aligned address, exactly when
//!
//! - the axis's innermost sub-axis (size-1 sub-axes aside) has stride 1 and a size that is a
//!   multiple of `vec`, so the `vec` elements never cross into the next outer index, and
//! - every other sub-axis of the view (batch, rows, columns) has a stride that is a multiple of
//!   `vec`, so the first element's offset is a multiple of `vec`.
//!
//! Together with the buffer's own alignment (every buffer is its own allocation, aligned to at
//! least 256 bytes by the HIP and CUDA allocators) that makes each load 16-byte aligned.

use crate::ir::gemm::{GemmDims, Operand};
use crate::ir::View;

/// The problem axis a vector runs along: one of the view's row or column axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Along {
    Rows,
    Cols,
}

/// Whether `view` of `operand` can be read `vec` elements at a time along `along`.
pub(crate) fn vectorizes(
    dims: &GemmDims,
    view: &View,
    operand: Operand,
    along: Along,
    vec: usize,
) -> bool {
    let [batch, rows, cols] = dims.of(operand);
    let (sizes, strides) = match along {
        Along::Rows => (rows, &view.rows),
        Along::Cols => (cols, &view.cols),
    };
    // The innermost sub-axis that indexes anything; size-1 sub-axes add no offset.
    let Some(inner) = sizes.iter().rposition(|&size| size != 1) else {
        return false;
    };
    if vec == 0 || strides.get(inner) != Some(&1) || sizes[inner] % vec != 0 {
        return false;
    }
    let parts = [
        (batch, &view.batch, false),
        (rows, &view.rows, along == Along::Rows),
        (cols, &view.cols, along == Along::Cols),
    ];
    parts.into_iter().all(|(sizes, strides, is_along)| {
        sizes
            .iter()
            .zip(strides)
            .enumerate()
            .all(|(j, (&size, &stride))| (is_along && j == inner) || size == 1 || stride % vec == 0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(m: Vec<usize>, n: Vec<usize>, k: Vec<usize>) -> GemmDims {
        GemmDims {
            batch: vec![],
            m,
            n,
            k,
        }
    }

    #[test]
    fn contiguous_nk_weights_vectorize_along_k() {
        // B stored [N, K]: rows (K) stride 1, columns (N) stride K.
        let d = dims(vec![3], vec![45], vec![40]);
        let b = View {
            batch: vec![],
            rows: vec![1],
            cols: vec![40],
        };
        assert!(vectorizes(&d, &b, Operand::B, Along::Rows, 8));
        assert!(!vectorizes(&d, &b, Operand::B, Along::Cols, 8));
        // K = 37: a vector would cross into the next column.
        let d37 = dims(vec![3], vec![45], vec![37]);
        let b37 = View {
            cols: vec![37],
            ..b.clone()
        };
        assert!(!vectorizes(&d37, &b37, Operand::B, Along::Rows, 8));
        assert!(vectorizes(&d37, &b37, Operand::B, Along::Rows, 1));
    }

    #[test]
    fn misaligned_outer_strides_and_split_axes() {
        // K as (head 3, d 8) with head stride 12: the head offset is not a multiple of 8.
        let d = dims(vec![2], vec![5], vec![3, 8]);
        let a = View {
            batch: vec![],
            rows: vec![40],
            cols: vec![12, 1],
        };
        assert!(!vectorizes(&d, &a, Operand::A, Along::Cols, 8));
        assert!(vectorizes(&d, &a, Operand::A, Along::Cols, 4));
        // A row stride of 40 is a multiple of 8 but not of 16.
        let a2 = View {
            cols: vec![8, 1],
            ..a.clone()
        };
        assert!(vectorizes(&d, &a2, Operand::A, Along::Cols, 8));
        assert!(!vectorizes(&d, &a2, Operand::A, Along::Cols, 16));
        // A trailing size-1 sub-axis does not hide the inner one.
        let d1 = dims(vec![2], vec![5], vec![8, 1]);
        let a3 = View {
            batch: vec![],
            rows: vec![8],
            cols: vec![1, 0],
        };
        assert!(vectorizes(&d1, &a3, Operand::A, Along::Cols, 4));
        // The inner stride is not 1 (a transposed read).
        let a4 = View {
            batch: vec![],
            rows: vec![1],
            cols: vec![2, 16],
        };
        assert!(!vectorizes(&d, &a4, Operand::A, Along::Cols, 4));
    }

    #[test]
    fn batch_strides_count() {
        let d = GemmDims {
            batch: vec![3],
            m: vec![1],
            n: vec![4],
            k: vec![8],
        };
        let mut b = View {
            batch: vec![36],
            rows: vec![1],
            cols: vec![9],
        };
        assert!(!vectorizes(&d, &b, Operand::B, Along::Rows, 4));
        b.cols = vec![8];
        b.batch = vec![36];
        assert!(!vectorizes(&d, &b, Operand::B, Along::Rows, 8));
        b.batch = vec![32];
        assert!(vectorizes(&d, &b, Operand::B, Along::Rows, 8));
    }
}
