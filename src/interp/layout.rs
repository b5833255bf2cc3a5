//! Layout ops: they move elements without computing on them.

use crate::ir::{slice_bounds, Shape, Tensor, TensorError, TensorType};

use super::strided::{pick, Offsets};
use super::InterpError;

pub fn reshape(x: &Tensor, out: &TensorType) -> Result<Tensor, TensorError> {
    pick(x, out, 0..x.len())
}

pub fn permute(x: &Tensor, perm: &[usize], out: &TensorType) -> Result<Tensor, TensorError> {
    let strides = x.shape().strides();
    let permuted: Vec<usize> = perm.iter().map(|&p| strides[p]).collect();
    pick(x, out, Offsets::new(out.shape.dims(), &permuted, 0))
}

pub fn expand(x: &Tensor, out: &TensorType) -> Result<Tensor, TensorError> {
    pick(x, out, Offsets::broadcast(x.shape(), &out.shape))
}

pub fn slice(
    x: &Tensor,
    axis: usize,
    start: i64,
    end: i64,
    out: &TensorType,
) -> Result<Tensor, TensorError> {
    let strides = x.shape().strides();
    let (s, _) =
        slice_bounds(start, end, x.shape().dims()[axis]).expect("checked by shape inference");
    let base = s * strides[axis];
    pick(x, out, Offsets::new(out.shape.dims(), &strides, base))
}

/// Operands joined along `axis`: for each index of the axes before it, each operand's block.
/// The caller has made sure the result is not empty, so the outer count is at most its size.
pub fn concat(xs: &[&Tensor], axis: usize, out: &TensorType) -> Result<Tensor, TensorError> {
    let outer: usize = out.shape.dims()[..axis].iter().product();
    let values = (0..outer).flat_map(|o| {
        xs.iter().flat_map(move |x| {
            let block: usize = x.shape().dims()[axis..].iter().product();
            (o * block..(o + 1) * block).map(move |i| x.element(i))
        })
    });
    Tensor::from_elements(out.dtype, out.shape.clone(), out.shape.numel(), values)
}

/// Rows of `table` picked by `indices`; an index outside the table is an error, not a panic
/// (even when the rows are empty, as PyTorch's index_select has it).
pub fn gather_rows(
    node: &str,
    table: &Tensor,
    indices: &Tensor,
    out: &TensorType,
) -> Result<Tensor, InterpError> {
    let rows = table.shape().dims()[0];
    let row_len: usize = table.shape().dims()[1..].iter().product();
    let idx = indices
        .as_i64()
        .expect("shape inference requires integer indices");
    if let Some(&i) = idx
        .iter()
        .find(|&&i| usize::try_from(i).map_or(true, |i| i >= rows))
    {
        return Err(InterpError::IndexOutOfRange {
            node: node.to_string(),
            index: i,
            size: rows,
        });
    }
    let offsets = idx.iter().flat_map(|&i| {
        let base = i as usize * row_len;
        base..base + row_len
    });
    let n = out.shape.numel();
    Tensor::from_elements(
        out.dtype,
        out.shape.clone(),
        n,
        offsets.map(|o| table.element(o)),
    )
    .map_err(|source| InterpError::Host {
        node: node.to_string(),
        source,
    })
}

/// Shape of `x` with the reduced axes kept as 1 (for strided accumulation).
pub(crate) fn keepdim_shape(x: &Shape, axes: &[usize]) -> Shape {
    Shape(
        x.dims()
            .iter()
            .enumerate()
            .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
            .collect(),
    )
}
