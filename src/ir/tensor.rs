//! Host tensors: the data that goes into and comes out of a graph. Floats are held as f32
//! rounded to their dtype (so an f16 tensor only ever holds f16 values); integers and bools as
//! i64 (bools are 0 or 1).

use half::{bf16, f16};
use std::sync::Arc;
use thiserror::Error;

use super::scalar::{self, Element};
use super::{DType, Shape, TensorType};

/// The most elements one host tensor may hold: 2^31 (8 GiB of f32, 16 GiB of integers, which the
/// host holds as i64). Host data whose size a graph file decides (random inputs and weights,
/// constants, every value the interpreter computes) is checked against it before anything is
/// allocated, and allocated fallibly within it, so a graph declaring a 2^40-element tensor
/// gets [`TensorError::TooLarge`] and one the host cannot hold [`TensorError::OutOfMemory`],
/// never an allocation abort.
pub const MAX_HOST_ELEMENTS: usize = 1 << 31;

#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    /// Shared: a clone of a tensor (a weight bound to several plans, say) is a reference to
    /// the same values, not a copy. Tensors are immutable once made.
    Float(Arc<Vec<f32>>),
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
    #[error(
        "{ty} holds {elements} elements, more than a host tensor may hold ({limit}, \
         ir::MAX_HOST_ELEMENTS)"
    )]
    TooLarge {
        ty: TensorType,
        elements: usize,
        limit: usize,
    },
    #[error("cannot draw random {ty}: {reason}")]
    Sample { ty: TensorType, reason: String },
    #[error("the host cannot allocate {elements} elements ({bytes} bytes)")]
    OutOfMemory { elements: usize, bytes: usize },
}

/// Checks that a tensor of type `ty` may be held on the host (see [`MAX_HOST_ELEMENTS`]).
pub fn check_host_size(ty: &TensorType) -> Result<usize, TensorError> {
    match ty.shape.checked_numel(ty.dtype) {
        Some(n) if n <= MAX_HOST_ELEMENTS => Ok(n),
        n => Err(TensorError::TooLarge {
            ty: ty.clone(),
            elements: n.unwrap_or(usize::MAX),
            limit: MAX_HOST_ELEMENTS,
        }),
    }
}

/// The `n` values of `values` in a vector allocated fallibly: more than [`MAX_HOST_ELEMENTS`],
/// or more than the allocator gives, is a typed error rather than an abort.
pub fn try_collect<T>(n: usize, values: impl Iterator<Item = T>) -> Result<Vec<T>, TensorError> {
    let too_big = || TensorError::OutOfMemory {
        elements: n,
        bytes: n.saturating_mul(std::mem::size_of::<T>()),
    };
    if n > MAX_HOST_ELEMENTS {
        return Err(too_big());
    }
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| too_big())?;
    v.extend(values.take(n));
    Ok(v)
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
            values
                .iter_mut()
                .for_each(|v| *v = scalar::round_float(dtype, *v));
        }
        Ok(Tensor {
            dtype,
            shape,
            data: Data::Float(Arc::new(values)),
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
            DType::I32 | DType::Bool => values
                .iter_mut()
                .for_each(|v| *v = scalar::wrap_int(dtype, *v)),
            DType::F32 | DType::F16 | DType::BF16 => {
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

    /// Builds a tensor of any dtype from f64 values, each converted as a constant of that dtype
    /// is (`ir::scalar::constant`).
    pub fn from_f64(
        dtype: DType,
        shape: impl Into<Shape>,
        values: &[f64],
    ) -> Result<Tensor, TensorError> {
        let shape = shape.into();
        check_len(&shape, values.len())?;
        Tensor::from_elements(
            dtype,
            shape,
            values.len(),
            values.iter().map(|&v| scalar::constant(dtype, v)),
        )
    }

    /// The data of a constant of type `ty` holding `values` (one value, splat, or one per
    /// element), allocated fallibly.
    pub fn constant(ty: &TensorType, values: &[f64]) -> Result<Tensor, TensorError> {
        let n = check_host_size(ty)?;
        let value = |i: usize| values[if values.len() == n { i } else { 0 }];
        if values.len() != n && values.len() != 1 {
            return Err(TensorError::Length {
                shape: ty.shape.clone(),
                expected: n,
                got: values.len(),
            });
        }
        Tensor::from_elements(
            ty.dtype,
            ty.shape.clone(),
            n,
            (0..n).map(|i| scalar::constant(ty.dtype, value(i))),
        )
    }

    /// A tensor of `n` elements, each already a value of `dtype`, allocated fallibly.
    pub fn from_elements(
        dtype: DType,
        shape: Shape,
        n: usize,
        elements: impl Iterator<Item = Element>,
    ) -> Result<Tensor, TensorError> {
        let data = if dtype.is_float() {
            Data::Float(Arc::new(try_collect(
                n,
                elements.map(|e| match e {
                    Element::Float(f) => f,
                    Element::Int(i) => i as f32,
                }),
            )?))
        } else {
            Data::Int(try_collect(
                n,
                elements.map(|e| match e {
                    Element::Int(i) => i,
                    Element::Float(f) => f as i64,
                }),
            )?)
        };
        check_len(&shape, data_len(&data))?;
        Ok(Tensor { dtype, shape, data })
    }

    /// The element at flat index `i`.
    pub fn element(&self, i: usize) -> Element {
        match &self.data {
            Data::Float(v) => Element::Float(v[i]),
            Data::Int(v) => Element::Int(v[i]),
        }
    }

    pub fn zeros(ty: &TensorType) -> Tensor {
        let n = ty.shape.numel();
        let data = if ty.dtype.is_float() {
            Data::Float(Arc::new(vec![0.0; n]))
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
        data_len(&self.data)
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
            Data::Float(v) => Some(v.as_slice()),
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

    /// Converts to another dtype as the `cast` op does (`ir::scalar::cast`: floats to integers
    /// truncate toward zero and saturate, NaN gives 0; anything to bool is "non-zero").
    pub fn try_cast(&self, to: DType) -> Result<Tensor, TensorError> {
        Tensor::from_elements(
            to,
            self.shape.clone(),
            self.len(),
            (0..self.len()).map(|i| scalar::cast(self.element(i), to)),
        )
    }

    /// As [`Tensor::try_cast`], for tensors already in memory: like any allocation of a `Vec`,
    /// it aborts if the host cannot give the memory for the copy.
    pub fn cast(&self, to: DType) -> Tensor {
        self.try_cast(to).unwrap_or_else(|_| {
            let bytes = self.len().saturating_mul(8);
            std::alloc::handle_alloc_error(
                std::alloc::Layout::from_size_align(bytes, 8)
                    .unwrap_or(std::alloc::Layout::new::<u64>()),
            )
        })
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

fn data_len(data: &Data) -> usize {
    match data {
        Data::Float(v) => v.len(),
        Data::Int(v) => v.len(),
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
