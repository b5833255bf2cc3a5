//! Strided reads: the offsets at which a row-major walk over an output shape finds each element
//! of an input laid out with given strides (0 on broadcast axes).

use crate::ir::Data;

/// For every element of `shape` in row-major order, `base + Σ index[i]·strides[i]`.
pub(crate) fn offsets(shape: &[usize], strides: &[usize], base: usize) -> Vec<usize> {
    let n: usize = shape.iter().product();
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let rank = shape.len();
    if rank == 0 {
        out.push(base);
        return out;
    }
    let (inner, inner_stride) = (shape[rank - 1], strides[rank - 1]);
    let mut idx = vec![0usize; rank - 1];
    let mut off = base;
    loop {
        out.extend((0..inner).map(|j| off + j * inner_stride));
        // Advance the odometer over the outer axes.
        let mut ax = rank - 1;
        loop {
            if ax == 0 {
                return out;
            }
            ax -= 1;
            idx[ax] += 1;
            off += strides[ax];
            if idx[ax] < shape[ax] {
                break;
            }
            off -= strides[ax] * shape[ax];
            idx[ax] = 0;
        }
    }
}

/// The elements of `data` at `offsets`, in that order.
pub(crate) fn gather(data: &Data, offsets: &[usize]) -> Data {
    match data {
        Data::Float(v) => Data::Float(offsets.iter().map(|&o| v[o]).collect()),
        Data::Int(v) => Data::Int(offsets.iter().map(|&o| v[o]).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_walk_strides() {
        // A [2, 3] view of a transposed [3, 2] buffer.
        assert_eq!(offsets(&[2, 3], &[1, 2], 0), vec![0, 2, 4, 1, 3, 5]);
        // Broadcast of a [3] row over [2, 3].
        assert_eq!(offsets(&[2, 3], &[0, 1], 0), vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(offsets(&[], &[], 7), vec![7]);
        assert!(offsets(&[2, 0], &[0, 1], 0).is_empty());
    }
}
