//! Static shapes, numpy broadcasting and axis normalisation.

use std::fmt;

use super::DType;

/// Bytes a slice's first element must be a multiple of for the slice to be read in place, as an
/// alias of its operand's buffer at an offset, with no copy: kernels load operands 16 bytes at a
/// time where their views allow it, trusting a buffer's start to be aligned as every allocation
/// is. Codegen decides aliases by it; `passes::merge_gemms` merges only where its slices will be
/// aliases.
pub const IN_PLACE_ALIGN_BYTES: usize = 16;

/// A static shape. Element counts are checked for overflow when a node is typed, so code that
/// holds a typed node's shape may call [`Shape::numel`] freely.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Shape(pub Vec<usize>);

impl Shape {
    pub fn new(dims: impl Into<Vec<usize>>) -> Shape {
        Shape(dims.into())
    }

    pub fn scalar() -> Shape {
        Shape(Vec::new())
    }

    pub fn rank(&self) -> usize {
        self.0.len()
    }

    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    pub fn numel(&self) -> usize {
        self.0.iter().product()
    }

    /// Element count, or `None` when the shape is not addressable: a dimension past `i64::MAX`
    /// (PyTorch's and the kernels' index type), the product of the dimensions with zeros taken
    /// as ones past `isize::MAX` (so row-major strides never overflow, even for an empty
    /// tensor), or the size in bytes for `dtype` past `isize::MAX`.
    pub fn checked_numel(&self, dtype: DType) -> Option<usize> {
        let extent = self.0.iter().try_fold(1usize, |acc, &d| {
            (d <= i64::MAX as usize).then_some(())?;
            acc.checked_mul(d.max(1))
        })?;
        if extent > isize::MAX as usize {
            return None;
        }
        let n = if self.0.contains(&0) { 0 } else { extent };
        let bytes = n.checked_mul(dtype.size_bytes())?;
        (bytes <= isize::MAX as usize).then_some(n)
    }

    /// Row-major strides in elements.
    pub fn strides(&self) -> Vec<usize> {
        let mut strides = vec![1; self.0.len()];
        for i in (0..self.0.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * self.0[i + 1];
        }
        strides
    }

    /// Strides that read this shape as if broadcast to `out` (0 on broadcast axes).
    /// The caller has checked that the shapes broadcast.
    pub fn broadcast_strides(&self, out: &Shape) -> Vec<usize> {
        let own = self.strides();
        let lead = out.rank() - self.rank();
        (0..out.rank())
            .map(|i| {
                if i < lead || self.0[i - lead] == 1 {
                    0
                } else {
                    own[i - lead]
                }
            })
            .collect()
    }

    /// The numpy broadcast of two shapes, or `None` when they are incompatible.
    pub fn broadcast(a: &Shape, b: &Shape) -> Option<Shape> {
        let rank = a.rank().max(b.rank());
        let mut out = vec![0; rank];
        for (i, slot) in out.iter_mut().enumerate() {
            let da = dim_from_right(a, rank - 1 - i);
            let db = dim_from_right(b, rank - 1 - i);
            *slot = match (da, db) {
                (x, y) if x == y => x,
                (1, y) => y,
                (x, 1) => x,
                _ => return None,
            };
        }
        Some(Shape(out))
    }

    /// Whether this shape broadcasts to `target` without changing `target`.
    pub fn broadcasts_to(&self, target: &Shape) -> bool {
        Shape::broadcast(self, target).as_ref() == Some(target)
    }

    /// Resolves a possibly negative axis against this rank.
    pub fn axis(&self, axis: i64) -> Option<usize> {
        normalize_axis(axis, self.rank())
    }
}

fn dim_from_right(s: &Shape, from_right: usize) -> usize {
    if from_right < s.rank() {
        s.0[s.rank() - 1 - from_right]
    } else {
        1
    }
}

/// Resolves a Python-style axis (negative counts from the end) against `rank`; `None` when it
/// is out of range (`i64::MIN` included: a negative axis is only ever added to the rank).
pub fn normalize_axis(axis: i64, rank: usize) -> Option<usize> {
    let r = i64::try_from(rank).ok()?;
    let a = if axis < 0 { axis.checked_add(r)? } else { axis };
    (0..r).contains(&a).then_some(a as usize)
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

impl From<Vec<usize>> for Shape {
    fn from(v: Vec<usize>) -> Shape {
        Shape(v)
    }
}

impl From<&[usize]> for Shape {
    fn from(v: &[usize]) -> Shape {
        Shape(v.to_vec())
    }
}

/// The type of a tensor: element type and static shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Shape,
}

impl TensorType {
    pub fn new(dtype: DType, shape: impl Into<Shape>) -> TensorType {
        TensorType {
            dtype,
            shape: shape.into(),
        }
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_follows_numpy() {
        let s = |v: &[usize]| Shape::new(v.to_vec());
        assert_eq!(
            Shape::broadcast(&s(&[2, 1, 4]), &s(&[3, 1])),
            Some(s(&[2, 3, 4]))
        );
        assert_eq!(Shape::broadcast(&s(&[]), &s(&[5])), Some(s(&[5])));
        assert_eq!(Shape::broadcast(&s(&[2, 3]), &s(&[3, 2])), None);
        assert!(s(&[1, 4]).broadcasts_to(&s(&[3, 4])));
        assert!(!s(&[3, 4]).broadcasts_to(&s(&[1, 4])));
    }

    #[test]
    fn numel_overflow_is_detected() {
        let s = Shape::new(vec![usize::MAX / 2, 3]);
        assert_eq!(s.checked_numel(DType::F32), None);
        assert_eq!(Shape::new(vec![2, 3]).checked_numel(DType::F32), Some(6));
    }

    #[test]
    fn empty_shapes_are_checked_as_if_their_zeros_were_ones() {
        let s = |v: &[usize]| Shape::new(v.to_vec());
        assert_eq!(s(&[0, 1 << 20]).checked_numel(DType::F32), Some(0));
        // Strides of [0, 2^40, 2^40] would overflow; it is refused although it holds nothing.
        assert_eq!(s(&[0, 1 << 40, 1 << 40]).checked_numel(DType::F32), None);
        assert_eq!(s(&[0, usize::MAX]).checked_numel(DType::Bool), None);
        assert_eq!(s(&[0, 1 << 63]).checked_numel(DType::Bool), None);
    }

    #[test]
    fn axes_normalise() {
        assert_eq!(normalize_axis(-1, 4), Some(3));
        assert_eq!(normalize_axis(4, 4), None);
        assert_eq!(normalize_axis(-5, 4), None);
        assert_eq!(normalize_axis(i64::MIN, 4), None);
        assert_eq!(normalize_axis(i64::MAX, 4), None);
        assert_eq!(normalize_axis(-1, 0), None);
    }
}
