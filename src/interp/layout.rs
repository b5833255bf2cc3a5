//! Layout ops: they move elements without computing on them.

use crate::ir::{slice_bounds, Data, Shape, Tensor, TensorType};

use super::strided::{gather, offsets};
use super::InterpError;

fn rebuild(ty: &TensorType, data: Data) -> Tensor {
    match data {
        Data::Float(v) => Tensor::from_f32(ty.dtype, ty.shape.clone(), v),
        Data::Int(v) => Tensor::from_i64(ty.dtype, ty.shape.clone(), v),
    }
    .expect("layout ops keep the element count the type says")
}

pub fn reshape(x: &Tensor, out: &TensorType) -> Tensor {
    rebuild(out, x.data().clone())
}

pub fn permute(x: &Tensor, perm: &[usize], out: &TensorType) -> Tensor {
    let strides = x.shape().strides();
    let permuted: Vec<usize> = perm.iter().map(|&p| strides[p]).collect();
    rebuild(
        out,
        gather(x.data(), &offsets(out.shape.dims(), &permuted, 0)),
    )
}

pub fn expand(x: &Tensor, out: &TensorType) -> Tensor {
    let strides = x.shape().broadcast_strides(&out.shape);
    rebuild(
        out,
        gather(x.data(), &offsets(out.shape.dims(), &strides, 0)),
    )
}

pub fn slice(x: &Tensor, axis: usize, start: i64, end: i64, out: &TensorType) -> Tensor {
    let strides = x.shape().strides();
    let (s, _) =
        slice_bounds(start, end, x.shape().dims()[axis]).expect("checked by shape inference");
    rebuild(
        out,
        gather(
            x.data(),
            &offsets(out.shape.dims(), &strides, s * strides[axis]),
        ),
    )
}

pub fn concat(xs: &[&Tensor], axis: usize, out: &TensorType) -> Tensor {
    let outer: usize = out.shape.dims()[..axis].iter().product();
    let mut data = match xs[0].data() {
        Data::Float(_) => Data::Float(Vec::with_capacity(out.shape.numel())),
        Data::Int(_) => Data::Int(Vec::with_capacity(out.shape.numel())),
    };
    for o in 0..outer {
        for x in xs {
            let block: usize = x.shape().dims()[axis..].iter().product();
            match (&mut data, x.data()) {
                (Data::Float(d), Data::Float(v)) => {
                    d.extend_from_slice(&v[o * block..(o + 1) * block])
                }
                (Data::Int(d), Data::Int(v)) => d.extend_from_slice(&v[o * block..(o + 1) * block]),
                (Data::Float(_), Data::Int(_)) | (Data::Int(_), Data::Float(_)) => {
                    unreachable!("shape inference refuses mixed dtypes")
                }
            }
        }
    }
    rebuild(out, data)
}

/// Rows of `table` picked by `indices`; an index outside the table is an error, not a panic.
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
    let mut offs = Vec::with_capacity(out.shape.numel());
    for &i in idx {
        if i < 0 || i as usize >= rows {
            return Err(InterpError::IndexOutOfRange {
                node: node.to_string(),
                index: i,
                size: rows,
            });
        }
        let base = i as usize * row_len;
        offs.extend(base..base + row_len);
    }
    Ok(rebuild(out, gather(table.data(), &offs)))
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
