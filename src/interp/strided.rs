//! Strided reads: the offsets at which a row-major walk over an output shape finds each element
//! of an input laid out with given strides (0 on broadcast axes). The offsets are produced one
//! at a time, so reading a broadcast or permuted operand costs no memory beyond the result.

use crate::ir::{Element, Shape, Tensor, TensorError, TensorType};

/// For every element of `shape` in row-major order, `base + Σ index[i]·strides[i]`.
pub(crate) struct Offsets {
    shape: Vec<usize>,
    strides: Vec<usize>,
    index: Vec<usize>,
    offset: usize,
    remaining: usize,
}

impl Offsets {
    pub(crate) fn new(shape: &[usize], strides: &[usize], base: usize) -> Offsets {
        Offsets {
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            index: vec![0; shape.len()],
            offset: base,
            remaining: shape.iter().product(),
        }
    }

    /// The offsets at which `x` is read when broadcast to `out`.
    pub(crate) fn broadcast(x: &Shape, out: &Shape) -> Offsets {
        Offsets::new(out.dims(), &x.broadcast_strides(out), 0)
    }
}

impl Iterator for Offsets {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let current = self.offset;
        // Advance the odometer, last axis fastest.
        for ax in (0..self.shape.len()).rev() {
            self.index[ax] += 1;
            self.offset += self.strides[ax];
            if self.index[ax] < self.shape[ax] {
                break;
            }
            self.offset -= self.strides[ax] * self.shape[ax];
            self.index[ax] = 0;
        }
        Some(current)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for Offsets {}

/// A tensor of type `out` whose elements are those of `x` at `offsets`, in that order.
pub(crate) fn pick(
    x: &Tensor,
    out: &TensorType,
    offsets: impl ExactSizeIterator<Item = usize>,
) -> Result<Tensor, TensorError> {
    let n = offsets.len();
    Tensor::from_elements(
        out.dtype,
        out.shape.clone(),
        n,
        offsets.map(|o| x.element(o)),
    )
}

/// The elements of `x` read as if broadcast to `out`.
pub(crate) fn broadcast_elements<'a>(
    x: &'a Tensor,
    out: &Shape,
) -> impl Iterator<Item = Element> + 'a {
    Offsets::broadcast(x.shape(), out).map(|o| x.element(o))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets(shape: &[usize], strides: &[usize], base: usize) -> Vec<usize> {
        Offsets::new(shape, strides, base).collect()
    }

    #[test]
    fn offsets_walk_strides() {
        // A [2, 3] view of a transposed [3, 2] buffer.
        assert_eq!(offsets(&[2, 3], &[1, 2], 0), vec![0, 2, 4, 1, 3, 5]);
        // Broadcast of a [3] row over [2, 3].
        assert_eq!(offsets(&[2, 3], &[0, 1], 0), vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(offsets(&[], &[], 7), vec![7]);
        assert!(offsets(&[2, 0], &[0, 1], 0).is_empty());
        assert_eq!(offsets(&[2, 2], &[3, 1], 4), vec![4, 5, 7, 8]);
        assert_eq!(Offsets::new(&[3, 4], &[4, 1], 0).len(), 12);
    }
}
