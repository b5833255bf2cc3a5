//! Host tensors: the data that goes into and comes out of a graph. Floats are held as f32
//! rounded to their dtype (so an f16 tensor only ever holds f16 values); integers and bools as
//! i64 (bools are 0 or 1).

use half::{bf16, f16};
use thiserror::Error;

use super::{DType, Shape, TensorType};

#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    Float(Vec<f32>),
    Int(Vec<i64>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    dtype: DType,
    shape: Shape,
    data: Data,
}

#[derive(Debug, Error, Clone, PartialEq)]
pub enum TensorError {
    #[error("shape {shape} holds {expected} elements, but {got} were given")]
    Length {
        shape: Shape,
        expected: usize,
        got: usize,
    },
    #[error("{dtype} data cannot be given as {given}")]
    Storage { dtype: DType, given: &'static str },
}

impl Tensor {
    /// A float tensor; values are rounded to `dtype`.
    pub fn from_f32(
        dtype: DType,
        shape: impl Into<Shape>,
        mut values: Vec<f32>,
    ) -> Result<Tensor, TensorError> {
        let shape = shape.into();
        check_len(&shape, values.len())?;
        if !dtype.is_float() {
            return Err(TensorError::Storage {
                dtype,
                given: "floats",
            });
        }
        if dtype != DType::F32 {
            values.iter_mut().for_each(|v| *v = dtype.round_f32(*v));
        }
        Ok(Tensor {
            dtype,
            shape,
            data: Data::Float(values),
        })
    }

    /// An integer or bool tensor; values wrap to i32 or map to 0/1 as `dtype` requires.
    pub fn from_i64(
        dtype: DType,
        shape: impl Into<Shape>,
        mut values: Vec<i64>,
    ) -> Result<Tensor, TensorError> {
        let shape = shape.into();
        check_len(&shape, values.len())?;
        match dtype {
            DType::I64 => {}
            DType::I32 => values.iter_mut().for_each(|v| *v = i64::from(*v as i32)),
            DType::Bool => values.iter_mut().for_each(|v| *v = i64::from(*v != 0)),
            _ => {
                return Err(TensorError::Storage {
                    dtype,
                    given: "integers",
                })
            }
        }
        Ok(Tensor {
            dtype,
            shape,
            data: Data::Int(values),
        })
    }

    pub fn from_bool(shape: impl Into<Shape>, values: &[bool]) -> Result<Tensor, TensorError> {
        Tensor::from_i64(
            DType::Bool,
            shape,
            values.iter().map(|&b| i64::from(b)).collect(),
        )
    }

    /// Builds a tensor of any dtype from f64 values (used for constants and references).
    pub fn from_f64(
        dtype: DType,
        shape: impl Into<Shape>,
        values: &[f64],
    ) -> Result<Tensor, TensorError> {
        if dtype.is_float() {
            Tensor::from_f32(dtype, shape, values.iter().map(|&v| v as f32).collect())
        } else {
            Tensor::from_i64(dtype, shape, values.iter().map(|&v| v as i64).collect())
        }
    }

    pub fn zeros(ty: &TensorType) -> Tensor {
        let n = ty.shape.numel();
        let data = if ty.dtype.is_float() {
            Data::Float(vec![0.0; n])
        } else {
            Data::Int(vec![0; n])
        };
        Tensor {
            dtype: ty.dtype,
            shape: ty.shape.clone(),
            data,
        }
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    pub fn ty(&self) -> TensorType {
        TensorType::new(self.dtype, self.shape.clone())
    }

    pub fn len(&self) -> usize {
        match &self.data {
            Data::Float(v) => v.len(),
            Data::Int(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn data(&self) -> &Data {
        &self.data
    }

    pub fn into_data(self) -> Data {
        self.data
    }

    /// The values of a float tensor.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            Data::Float(v) => Some(v),
            Data::Int(_) => None,
        }
    }

    /// The values of an integer or bool tensor.
    pub fn as_i64(&self) -> Option<&[i64]> {
        match &self.data {
            Data::Int(v) => Some(v),
            Data::Float(_) => None,
        }
    }

    pub fn to_f64_vec(&self) -> Vec<f64> {
        match &self.data {
            Data::Float(v) => v.iter().map(|&x| f64::from(x)).collect(),
            Data::Int(v) => v.iter().map(|&x| x as f64).collect(),
        }
    }

    /// Converts to another dtype: floats to ints truncate toward zero (saturating), anything
    /// to bool is "non-zero".
    pub fn cast(&self, to: DType) -> Tensor {
        let data = match (&self.data, to.is_float()) {
            (Data::Float(v), true) => Data::Float(v.iter().map(|&x| to.round_f32(x)).collect()),
            (Data::Float(v), false) => Data::Int(
                v.iter()
                    .map(|&x| match to {
                        DType::Bool => i64::from(x != 0.0),
                        DType::I32 => i64::from(x as i32),
                        _ => x as i64,
                    })
                    .collect(),
            ),
            (Data::Int(v), true) => {
                Data::Float(v.iter().map(|&x| to.round_f32(x as f32)).collect())
            }
            (Data::Int(v), false) => Data::Int(
                v.iter()
                    .map(|&x| match to {
                        DType::Bool => i64::from(x != 0),
                        DType::I32 => i64::from(x as i32),
                        _ => x,
                    })
                    .collect(),
            ),
        };
        Tensor {
            dtype: to,
            shape: self.shape.clone(),
            data,
        }
    }

    /// Little-endian bytes in the dtype's storage layout (what a device buffer holds).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len() * self.dtype.size_bytes());
        match (&self.data, self.dtype) {
            (Data::Float(v), DType::F32) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            (Data::Float(v), DType::F16) => v
                .iter()
                .for_each(|x| out.extend(f16::from_f32(*x).to_le_bytes())),
            (Data::Float(v), DType::BF16) => v
                .iter()
                .for_each(|x| out.extend(bf16::from_f32(*x).to_le_bytes())),
            (Data::Int(v), DType::I64) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            (Data::Int(v), DType::I32) => {
                v.iter().for_each(|x| out.extend((*x as i32).to_le_bytes()))
            }
            (Data::Int(v), DType::Bool) => v.iter().for_each(|x| out.push(u8::from(*x != 0))),
            (Data::Float(_), _) | (Data::Int(_), _) => {
                unreachable!("constructors keep storage and dtype in step")
            }
        }
        out
    }

    /// Reads a tensor from little-endian bytes in the dtype's storage layout.
    pub fn from_bytes(ty: &TensorType, bytes: &[u8]) -> Result<Tensor, TensorError> {
        let n = ty.shape.numel();
        let size = ty.dtype.size_bytes();
        if bytes.len() != n * size {
            return Err(TensorError::Length {
                shape: ty.shape.clone(),
                expected: n * size,
                got: bytes.len(),
            });
        }
        let chunks = bytes.chunks_exact(size);
        match ty.dtype {
            DType::F32 => Tensor::from_f32(
                ty.dtype,
                ty.shape.clone(),
                chunks
                    .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
                    .collect(),
            ),
            DType::F16 => Tensor::from_f32(
                ty.dtype,
                ty.shape.clone(),
                chunks
                    .map(|c| f16::from_le_bytes(c.try_into().expect("2 bytes")).to_f32())
                    .collect(),
            ),
            DType::BF16 => Tensor::from_f32(
                ty.dtype,
                ty.shape.clone(),
                chunks
                    .map(|c| bf16::from_le_bytes(c.try_into().expect("2 bytes")).to_f32())
                    .collect(),
            ),
            DType::I32 => Tensor::from_i64(
                ty.dtype,
                ty.shape.clone(),
                chunks
                    .map(|c| i64::from(i32::from_le_bytes(c.try_into().expect("4 bytes"))))
                    .collect(),
            ),
            DType::I64 => Tensor::from_i64(
                ty.dtype,
                ty.shape.clone(),
                chunks
                    .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
                    .collect(),
            ),
            DType::Bool => Tensor::from_i64(
                ty.dtype,
                ty.shape.clone(),
                chunks.map(|c| i64::from(c[0] != 0)).collect(),
            ),
        }
    }
}

fn check_len(shape: &Shape, got: usize) -> Result<(), TensorError> {
    let expected = shape.numel();
    if expected == got {
        Ok(())
    } else {
        Err(TensorError::Length {
            shape: shape.clone(),
            expected,
            got,
        })
    }
}
