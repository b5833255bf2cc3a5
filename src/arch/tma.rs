//! Tensor Memory Accelerator descriptions (NVIDIA sm_90+): what a tensor map says about a
//! region of global memory, as data that codegen writes into a plan and the runtime encodes
//! (`cuTensorMapEncodeTiled`) once a session knows the region's address. A kernel names the
//! map, never the address: `cp.async.bulk.tensor` copies a box of it into shared memory,
//! zero-filling what lies outside the tensor, and completes on an mbarrier.
//!
//! The checks here are the driver's documented limits, made before any device is asked, so
//! codegen refuses a view TMA cannot read (and takes another kernel) instead of a run failing.

use super::mma::wgmma::Swizzle;
use crate::ir::DType;

/// Most dimensions a tiled tensor map may have.
pub const MAX_RANK: usize = 5;
/// Largest box extent along any dimension.
pub const MAX_BOX: u32 = 256;
/// Global strides are multiples of this many bytes, and the base address is aligned to it.
pub const STRIDE_ALIGN: u64 = 16;
/// Bytes of an encoded map (`CUtensorMap`), aligned to 64 in memory.
pub const MAP_BYTES: usize = 128;

/// One tiled tensor map: a `rank`-dimensional tensor of `dtype` (dimension 0 innermost and
/// contiguous), read in boxes of `boxes` elements into shared memory with `swizzle`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorMapSpec {
    pub dtype: DType,
    /// Elements along each dimension, innermost first.
    pub dims: Vec<u64>,
    /// Byte strides of dimensions 1.. (dimension 0 has stride one element).
    pub strides: Vec<u64>,
    /// The box copied by one instruction, innermost first.
    pub boxes: Vec<u32>,
    pub swizzle: Swizzle,
}

/// Why a view cannot be a tensor map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MapRefusal {
    Rank(usize),
    Dim {
        dim: usize,
        size: u64,
    },
    Stride {
        dim: usize,
        bytes: u64,
    },
    Box {
        dim: usize,
        size: u32,
    },
    /// The box's inner extent is not the swizzle's line.
    InnerBox {
        bytes: u64,
        line: u32,
    },
    Dtype(DType),
}

impl std::fmt::Display for MapRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MapRefusal::Rank(r) => write!(f, "rank {r} (1..={MAX_RANK})"),
            MapRefusal::Dim { dim, size } => write!(f, "dimension {dim} of {size} elements"),
            MapRefusal::Stride { dim, bytes } => write!(
                f,
                "stride of dimension {dim} is {bytes} bytes (a multiple of {STRIDE_ALIGN} below 2^40)"
            ),
            MapRefusal::Box { dim, size } => {
                write!(f, "box of {size} along dimension {dim} (1..={MAX_BOX})")
            }
            MapRefusal::InnerBox { bytes, line } => {
                write!(f, "an inner box of {bytes} bytes with a {line}-byte swizzle")
            }
            MapRefusal::Dtype(d) => write!(f, "element type {d:?}"),
        }
    }
}

impl TensorMapSpec {
    /// A map, or why the driver would refuse it.
    pub fn new(
        dtype: DType,
        dims: Vec<u64>,
        strides: Vec<u64>,
        boxes: Vec<u32>,
        swizzle: Swizzle,
    ) -> Result<TensorMapSpec, MapRefusal> {
        let rank = dims.len();
        if rank == 0 || rank > MAX_RANK || strides.len() + 1 != rank || boxes.len() != rank {
            return Err(MapRefusal::Rank(rank));
        }
        if !matches!(dtype, DType::F16 | DType::BF16 | DType::F32) {
            return Err(MapRefusal::Dtype(dtype));
        }
        for (dim, &size) in dims.iter().enumerate() {
            if size == 0 || size > 1 << 32 {
                return Err(MapRefusal::Dim { dim, size });
            }
        }
        for (i, &bytes) in strides.iter().enumerate() {
            if bytes == 0 || !bytes.is_multiple_of(STRIDE_ALIGN) || bytes >= 1 << 40 {
                return Err(MapRefusal::Stride { dim: i + 1, bytes });
            }
        }
        for (dim, &size) in boxes.iter().enumerate() {
            if size == 0 || size > MAX_BOX {
                return Err(MapRefusal::Box { dim, size });
            }
        }
        let inner = u64::from(boxes[0]) * dtype.size_bytes() as u64;
        if inner != u64::from(swizzle.line_bytes()) {
            return Err(MapRefusal::InnerBox {
                bytes: inner,
                line: swizzle.line_bytes(),
            });
        }
        Ok(TensorMapSpec {
            dtype,
            dims,
            strides,
            boxes,
            swizzle,
        })
    }

    /// Bytes one box fills in shared memory (what the mbarrier's transaction count expects:
    /// the whole box, zero-filled parts included).
    pub fn box_bytes(&self) -> u64 {
        self.boxes.iter().map(|&b| u64::from(b)).product::<u64>() * self.dtype.size_bytes() as u64
    }
}

impl std::fmt::Display for TensorMapSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "tensor map {:?} dims {:?} strides {:?} B box {:?} swizzle {} B",
            self.dtype,
            self.dims,
            self.strides,
            self.boxes,
            self.swizzle.line_bytes()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_driver_limits_are_checked_before_a_device_is_asked() {
        let ok = |dims: Vec<u64>, strides: Vec<u64>, boxes: Vec<u32>| {
            TensorMapSpec::new(DType::F16, dims, strides, boxes, Swizzle::B128)
        };
        let m = ok(vec![576, 4097], vec![1152], vec![64, 128]).unwrap();
        assert_eq!(m.box_bytes(), 64 * 128 * 2);
        assert_eq!(
            ok(vec![576, 4097], vec![1154], vec![64, 128]),
            Err(MapRefusal::Stride {
                dim: 1,
                bytes: 1154
            })
        );
        assert_eq!(
            ok(vec![576, 4097], vec![1152], vec![32, 128]),
            Err(MapRefusal::InnerBox {
                bytes: 64,
                line: 128
            })
        );
        assert_eq!(
            ok(vec![576, 4097], vec![1152], vec![64, 512]),
            Err(MapRefusal::Box { dim: 1, size: 512 })
        );
        assert_eq!(
            ok(vec![576], vec![1152], vec![64]),
            Err(MapRefusal::Rank(1))
        );
        assert!(matches!(
            TensorMapSpec::new(DType::I32, vec![64], vec![], vec![64], Swizzle::B128),
            Err(MapRefusal::Dtype(_))
        ));
        assert!(matches!(
            ok(vec![0, 4], vec![128], vec![64, 4]),
            Err(MapRefusal::Dim { dim: 0, size: 0 })
        ));
    }
}
