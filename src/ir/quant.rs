//! Block-quantized weights as ggml (GGUF) stores them: the one definition of each scheme that
//! the interpreter, codegen and the GGUF reader share.
//!
//! A quantized tensor's last axis (K, contiguous) is cut into blocks of [`BLOCK_ELEMS`] values;
//! each block is a few bytes of scale (f16, little-endian) followed by the quants:
//!
//! | scheme | block bytes | layout | value of element `i` |
//! | --- | --- | --- | --- |
//! | Q8_0 | 34 | `d`, 32 × i8 `q` | `d·q[i]` |
//! | Q4_0 | 18 | `d`, 16 bytes of nibbles | `d·(nib(i) − 8)` |
//! | Q4_1 | 20 | `d`, `m`, 16 bytes of nibbles | `d·nib(i) + m` |
//!
//! `nib(i)` is ggml's nibble order: byte `j` of the quants holds element `j` in its low nibble
//! and element `j + 16` in its high nibble. Values are computed in f32 exactly as written above
//! (the integer `q − 8` first, then one product, then one sum), so every reader that follows
//! the table gets the same f32 bits on the host.
//!
//! A GGUF matrix of `ne0 = K`, `ne1 = N` is the tensor `[N, K]` here, used as `y = x · Wᵀ`.
//!
//! The other schemes — Q5_0, Q5_1, IQ4_NL, the k-quants (super-blocks of 256 values) and the
//! microscaling blocks (MXFP4, MXFP6) — are defined in [`super::kquant`] and
//! [`super::microscale`], one function per scheme; `docs/ops.md` has a section per layout.
//! Every block holds a whole number of groups of [`BLOCK_ELEMS`] values (1 or 8), the unit the
//! device kernels dequantize in.

use std::fmt;
use std::sync::Arc;

use half::f16;
use rand::Rng;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::random::seeded_rng;
use super::tensor::{check_host_size, try_collect};
use super::{kquant, microscale};
use super::{DType, Shape, Tensor, TensorError, TensorType};

/// Values per group: the smallest block of every scheme, and the unit device kernels take
/// (a k-quant super-block is 8 groups).
pub const BLOCK_ELEMS: usize = 32;

/// A ggml block quantization.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum QuantScheme {
    /// f16 scale `d`, 32 signed bytes: `d·q`.
    #[serde(rename = "q8_0")]
    Q8_0,
    /// f16 scale `d`, 32 nibbles: `d·(q − 8)`.
    #[serde(rename = "q4_0")]
    Q4_0,
    /// f16 scale `d`, f16 minimum `m`, 32 nibbles: `d·q + m`.
    #[serde(rename = "q4_1")]
    Q4_1,
    /// f16 `d`, 32 fifth bits, 32 nibbles: `d·(q − 16)`.
    #[serde(rename = "q5_0")]
    Q5_0,
    /// f16 `d`, f16 `m`, 32 fifth bits, 32 nibbles: `d·q + m`.
    #[serde(rename = "q5_1")]
    Q5_1,
    /// f16 `d`, 32 nibbles indexing a non-linear grid: `d·grid[q]`.
    #[serde(rename = "iq4_nl")]
    Iq4Nl,
    /// Super-blocks of 256: 4-bit scales and minimums per 16, 2-bit quants.
    #[serde(rename = "q2_k")]
    Q2K,
    /// Super-blocks of 256: 6-bit scales per 16, 3-bit quants.
    #[serde(rename = "q3_k")]
    Q3K,
    /// Super-blocks of 256: 6-bit scales and minimums per 32, 4-bit quants.
    #[serde(rename = "q4_k")]
    Q4K,
    /// Super-blocks of 256: 6-bit scales and minimums per 32, 5-bit quants.
    #[serde(rename = "q5_k")]
    Q5K,
    /// Super-blocks of 256: i8 scales per 16, 6-bit quants.
    #[serde(rename = "q6_k")]
    Q6K,
    /// Super-blocks of 256: f32 `d`, i8 quants.
    #[serde(rename = "q8_k")]
    Q8K,
    /// 32 E2M1 values sharing an E8M0 scale (ggml's layout, GGUF type 39).
    #[serde(rename = "mxfp4")]
    Mxfp4,
    /// 32 E2M3 values sharing an E8M0 scale (OCP MX; not in GGUF).
    #[serde(rename = "mxfp6_e2m3")]
    Mxfp6E2m3,
    /// 32 E3M2 values sharing an E8M0 scale (OCP MX; not in GGUF).
    #[serde(rename = "mxfp6_e3m2")]
    Mxfp6E3m2,
}

impl fmt::Display for QuantScheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Error, Clone, PartialEq)]
pub enum QuantError {
    #[error(
        "{scheme} stores each row as whole blocks of {block} values along the last axis, \
         but shape {shape} has rows of {k}"
    )]
    PartialBlock {
        scheme: QuantScheme,
        block: usize,
        shape: Shape,
        k: usize,
    },
    #[error("{scheme} data of shape {shape}: its size in bytes overflows")]
    Overflow { scheme: QuantScheme, shape: Shape },
    #[error("{scheme} data of shape {shape} takes {expected} bytes, but {got} were given")]
    Length {
        scheme: QuantScheme,
        shape: Shape,
        expected: usize,
        got: usize,
    },
    #[error("the weight is declared {expected}, but {got} data was bound to it")]
    Mismatch { expected: String, got: String },
    #[error(transparent)]
    Host(#[from] TensorError),
}

/// Reads the little-endian f16 at `b[at..at + 2]` as f32 (exact).
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

impl QuantScheme {
    pub const ALL: [QuantScheme; 15] = [
        QuantScheme::Q8_0,
        QuantScheme::Q4_0,
        QuantScheme::Q4_1,
        QuantScheme::Q5_0,
        QuantScheme::Q5_1,
        QuantScheme::Iq4Nl,
        QuantScheme::Q2K,
        QuantScheme::Q3K,
        QuantScheme::Q4K,
        QuantScheme::Q5K,
        QuantScheme::Q6K,
        QuantScheme::Q8K,
        QuantScheme::Mxfp4,
        QuantScheme::Mxfp6E2m3,
        QuantScheme::Mxfp6E3m2,
    ];

    /// The name in graph files (ggml's type name in lower case for the GGUF ones).
    pub fn name(self) -> &'static str {
        match self {
            QuantScheme::Q8_0 => "q8_0",
            QuantScheme::Q4_0 => "q4_0",
            QuantScheme::Q4_1 => "q4_1",
            QuantScheme::Q5_0 => "q5_0",
            QuantScheme::Q5_1 => "q5_1",
            QuantScheme::Iq4Nl => "iq4_nl",
            QuantScheme::Q2K => "q2_k",
            QuantScheme::Q3K => "q3_k",
            QuantScheme::Q4K => "q4_k",
            QuantScheme::Q5K => "q5_k",
            QuantScheme::Q6K => "q6_k",
            QuantScheme::Q8K => "q8_k",
            QuantScheme::Mxfp4 => "mxfp4",
            QuantScheme::Mxfp6E2m3 => "mxfp6_e2m3",
            QuantScheme::Mxfp6E3m2 => "mxfp6_e3m2",
        }
    }

    /// Values per block: [`BLOCK_ELEMS`], or [`kquant::QK_K`] for the k-quants.
    pub fn block_elems(self) -> usize {
        match self {
            QuantScheme::Q8_0
            | QuantScheme::Q4_0
            | QuantScheme::Q4_1
            | QuantScheme::Q5_0
            | QuantScheme::Q5_1
            | QuantScheme::Iq4Nl
            | QuantScheme::Mxfp4
            | QuantScheme::Mxfp6E2m3
            | QuantScheme::Mxfp6E3m2 => BLOCK_ELEMS,
            QuantScheme::Q2K
            | QuantScheme::Q3K
            | QuantScheme::Q4K
            | QuantScheme::Q5K
            | QuantScheme::Q6K
            | QuantScheme::Q8K => kquant::QK_K,
        }
    }

    /// Bytes of one block of [`QuantScheme::block_elems`] values.
    /// The scheme a loader keeps weights of this scheme in (see [`QuantTensor::reblocked`]):
    /// Q5_0 as Q8_0, every other as itself.
    pub fn kept_as(self) -> QuantScheme {
        match self {
            QuantScheme::Q5_0 => QuantScheme::Q8_0,
            other => other,
        }
    }

    pub fn block_bytes(self) -> usize {
        match self {
            QuantScheme::Q8_0 => 2 + BLOCK_ELEMS,
            QuantScheme::Q4_0 => 2 + BLOCK_ELEMS / 2,
            QuantScheme::Q4_1 => 4 + BLOCK_ELEMS / 2,
            QuantScheme::Q5_0 => kquant::Q5_0_BYTES,
            QuantScheme::Q5_1 => kquant::Q5_1_BYTES,
            QuantScheme::Iq4Nl => kquant::IQ4_NL_BYTES,
            QuantScheme::Q2K => kquant::Q2_K_BYTES,
            QuantScheme::Q3K => kquant::Q3_K_BYTES,
            QuantScheme::Q4K => kquant::Q4_K_BYTES,
            QuantScheme::Q5K => kquant::Q5_K_BYTES,
            QuantScheme::Q6K => kquant::Q6_K_BYTES,
            QuantScheme::Q8K => kquant::Q8_K_BYTES,
            QuantScheme::Mxfp4 => microscale::MXFP4_BYTES,
            QuantScheme::Mxfp6E2m3 | QuantScheme::Mxfp6E3m2 => microscale::MXFP6_BYTES,
        }
    }

    /// The values of one block: `block` holds exactly [`QuantScheme::block_bytes`] bytes and
    /// `out` exactly [`QuantScheme::block_elems`] values.
    pub fn dequantize_block(self, block: &[u8], out: &mut [f32]) {
        match self {
            QuantScheme::Q8_0 | QuantScheme::Q4_0 | QuantScheme::Q4_1 => {
                let out: &mut [f32; BLOCK_ELEMS] = out.try_into().expect("one block of values");
                self.dequantize_legacy(block, out);
            }
            QuantScheme::Q5_0 => kquant::q5_0(block, out),
            QuantScheme::Q5_1 => kquant::q5_1(block, out),
            QuantScheme::Iq4Nl => kquant::iq4_nl(block, out),
            QuantScheme::Q2K => kquant::q2_k(block, out),
            QuantScheme::Q3K => kquant::q3_k(block, out),
            QuantScheme::Q4K => kquant::q4_k(block, out),
            QuantScheme::Q5K => kquant::q5_k(block, out),
            QuantScheme::Q6K => kquant::q6_k(block, out),
            QuantScheme::Q8K => kquant::q8_k(block, out),
            QuantScheme::Mxfp4 => microscale::mxfp4(block, out),
            QuantScheme::Mxfp6E2m3 => microscale::mxfp6(block, out, 3),
            QuantScheme::Mxfp6E3m2 => microscale::mxfp6(block, out, 2),
        }
    }

    /// Q8_0, Q4_0 and Q4_1, by the table in the module's comment.
    fn dequantize_legacy(self, block: &[u8], out: &mut [f32; BLOCK_ELEMS]) {
        let d = f16_at(block, 0);
        let offset = if self == QuantScheme::Q4_1 { 4 } else { 2 };
        let q = &block[offset..self.block_bytes()];
        match self {
            QuantScheme::Q8_0 => {
                for (o, &b) in out.iter_mut().zip(q) {
                    *o = d * f32::from(b as i8);
                }
            }
            QuantScheme::Q4_0 => {
                for (j, &b) in q.iter().enumerate() {
                    out[j] = d * f32::from(i16::from(b & 0xF) - 8);
                    out[j + 16] = d * f32::from(i16::from(b >> 4) - 8);
                }
            }
            QuantScheme::Q4_1 => {
                let m = f16_at(block, 2);
                for (j, &b) in q.iter().enumerate() {
                    out[j] = d * f32::from(b & 0xF) + m;
                    out[j + 16] = d * f32::from(b >> 4) + m;
                }
            }
            // Dispatched in `dequantize_block`, never here.
            QuantScheme::Q5_0
            | QuantScheme::Q5_1
            | QuantScheme::Iq4Nl
            | QuantScheme::Q2K
            | QuantScheme::Q3K
            | QuantScheme::Q4K
            | QuantScheme::Q5K
            | QuantScheme::Q6K
            | QuantScheme::Q8K
            | QuantScheme::Mxfp4
            | QuantScheme::Mxfp6E2m3
            | QuantScheme::Mxfp6E3m2 => {}
        }
    }

    /// Blocks per row and bytes in all of a tensor of `shape` (last axis K, the rows every
    /// other axis): K must be a whole number of blocks.
    pub fn layout(self, shape: &Shape) -> Result<(usize, usize), QuantError> {
        let k = shape.dims().last().copied().unwrap_or(1);
        let block = self.block_elems();
        if k % block != 0 {
            return Err(QuantError::PartialBlock {
                scheme: self,
                block,
                shape: shape.clone(),
                k,
            });
        }
        let per_row = k / block;
        let dims = shape.dims();
        let rows = dims[..dims.len().saturating_sub(1)]
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d));
        let bytes = rows
            .and_then(|r| r.checked_mul(per_row))
            .and_then(|b| b.checked_mul(self.block_bytes()))
            .ok_or_else(|| QuantError::Overflow {
                scheme: self,
                shape: shape.clone(),
            })?;
        Ok((per_row, bytes))
    }

    /// Every value of `bytes` (blocks of a tensor of `shape`) in row-major order, in f32.
    pub fn dequantize(self, bytes: &[u8], shape: &Shape) -> Result<Vec<f32>, QuantError> {
        let (_, expected) = self.layout(shape)?;
        if bytes.len() != expected {
            return Err(QuantError::Length {
                scheme: self,
                shape: shape.clone(),
                expected,
                got: bytes.len(),
            });
        }
        let n = check_host_size(&TensorType::new(DType::F32, shape.clone()))?;
        let mut values = try_collect(n, std::iter::repeat_n(0.0f32, n))?;
        for (b, out) in bytes
            .chunks_exact(self.block_bytes())
            .zip(values.chunks_exact_mut(self.block_elems()))
        {
            self.dequantize_block(b, out);
        }
        Ok(values)
    }
}

/// A quantized tensor on the host: the blocks as stored (shared, cheap to clone), the scheme
/// and the logical shape of the values they hold.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantTensor {
    scheme: QuantScheme,
    shape: Shape,
    bytes: Arc<[u8]>,
}

impl QuantTensor {
    /// Blocks of `scheme` holding a tensor of `shape`; the length is checked.
    pub fn new(
        scheme: QuantScheme,
        shape: Shape,
        bytes: impl Into<Arc<[u8]>>,
    ) -> Result<QuantTensor, QuantError> {
        let bytes = bytes.into();
        let (_, expected) = scheme.layout(&shape)?;
        if bytes.len() != expected {
            return Err(QuantError::Length {
                scheme,
                shape,
                expected,
                got: bytes.len(),
            });
        }
        Ok(QuantTensor {
            scheme,
            shape,
            bytes,
        })
    }

    pub fn scheme(&self) -> QuantScheme {
        self.scheme
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The blocks, as stored and as uploaded to a device.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The same values in blocks of `to`, where that holds them exactly: Q5_0 as Q8_0 (the
    /// same f16 scale; each `q − 16` of 5 bits an i8, so every value dequantizes to the same
    /// f32 bits). `None` for any other pair. Loaders keep Q5_0 weights as Q8_0
    /// ([`QuantScheme::kept_as`]): every device reads Q8_0 with whole-byte loads and integer dot
    /// products, where Q5_0's fifth bits cost a decode per value.
    pub fn reblocked(&self, to: QuantScheme) -> Option<QuantTensor> {
        match (self.scheme, to) {
            (QuantScheme::Q5_0, QuantScheme::Q8_0) => {
                let out: Vec<u8> = self
                    .bytes
                    .chunks_exact(QuantScheme::Q5_0.block_bytes())
                    .flat_map(q5_0_as_q8_0)
                    .collect();
                QuantTensor::new(QuantScheme::Q8_0, self.shape.clone(), out).ok()
            }
            _ => None,
        }
    }

    /// `scheme[shape]`, as errors name it.
    pub fn describe(&self) -> String {
        format!("{}{}", self.scheme, self.shape)
    }

    /// The values, dequantized in f32 and then rounded to `dtype` (a quantized weight's value).
    pub fn to_tensor(&self, dtype: DType) -> Result<Tensor, QuantError> {
        let values = self.scheme.dequantize(&self.bytes, &self.shape)?;
        Ok(Tensor::from_f32(dtype, self.shape.clone(), values)?)
    }

    /// Refuses data that is not what a weight of `scheme` and `shape` declares.
    pub fn check(&self, scheme: QuantScheme, shape: &Shape) -> Result<(), QuantError> {
        if self.scheme != scheme || &self.shape != shape {
            return Err(QuantError::Mismatch {
                expected: format!("{scheme}{shape}"),
                got: self.describe(),
            });
        }
        Ok(())
    }
}

/// Seeded random blocks for a quantized weight the caller does not supply: scales of both signs
/// sized so the values have a standard deviation near 1/√K (as `Init::Normal` draws an f32
/// weight), every quant drawn uniformly. The stream depends only on the seed and the name.
/// One Q5_0 block (f16 `d`, 32 fifth bits in a little-endian u32, 16 bytes of nibbles: value
/// `j` is `d·((qs[j] & 15 | bit j << 4) − 16)`, value `j + 16` the high nibble with bit
/// `j + 16`) as the Q8_0 block of the same values.
fn q5_0_as_q8_0(b: &[u8]) -> [u8; 34] {
    let mut out = [0u8; 34];
    out[..2].copy_from_slice(&b[..2]);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    for j in 0..16 {
        let lo = (b[6 + j] & 0x0f) | (((qh >> j) & 1) as u8) << 4;
        let hi = (b[6 + j] >> 4) | (((qh >> (j + 16)) & 1) as u8) << 4;
        out[2 + j] = (lo as i8 - 16) as u8;
        out[2 + j + 16] = (hi as i8 - 16) as u8;
    }
    out
}

pub fn random_quant(
    name: &str,
    scheme: QuantScheme,
    shape: &Shape,
    seed: u64,
) -> Result<QuantTensor, QuantError> {
    let (_, bytes) = scheme.layout(shape)?;
    check_host_size(&TensorType::new(DType::F32, shape.clone()))?;
    let k = shape.dims().last().copied().unwrap_or(1).max(1) as f32;
    // The standard deviation of the integer part: uniform over 255 (i8 but −128) or 16 values.
    let spread = match scheme {
        QuantScheme::Q8_0 => 73.6,
        QuantScheme::Q4_0 | QuantScheme::Q4_1 => 4.6,
        QuantScheme::Q5_0
        | QuantScheme::Q5_1
        | QuantScheme::Iq4Nl
        | QuantScheme::Q2K
        | QuantScheme::Q3K
        | QuantScheme::Q4K
        | QuantScheme::Q5K
        | QuantScheme::Q6K
        | QuantScheme::Q8K
        | QuantScheme::Mxfp4
        | QuantScheme::Mxfp6E2m3
        | QuantScheme::Mxfp6E3m2 => {
            let mut rng = seeded_rng(seed ^ 0x0b10_c4ed, name);
            let mut out = try_collect(bytes, std::iter::repeat_n(0u8, bytes))?;
            for block in out.chunks_exact_mut(scheme.block_bytes()) {
                let target = rng.random_range(0.5f32..1.5) / k.sqrt();
                random_block(scheme, block, &mut rng, target);
            }
            return QuantTensor::new(scheme, shape.clone(), out);
        }
    };
    let mut rng = seeded_rng(seed ^ 0x0b10_c4ed, name);
    let mut out = try_collect(bytes, std::iter::repeat_n(0u8, bytes))?;
    for block in out.chunks_exact_mut(scheme.block_bytes()) {
        let sign = if rng.random::<bool>() { 1.0 } else { -1.0 };
        let d = sign * rng.random_range(0.5f32..1.5) / (spread * k.sqrt());
        block[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        if scheme == QuantScheme::Q4_1 {
            // Centred like Q4_0's `q − 8`, with a jitter so `m` is not a multiple of `d`.
            let m = -d * rng.random_range(7.0f32..9.0);
            block[2..4].copy_from_slice(&f16::from_f32(m).to_le_bytes());
        }
        let q = &mut block[if scheme == QuantScheme::Q4_1 { 4 } else { 2 }..];
        if scheme == QuantScheme::Q8_0 {
            q.iter_mut()
                .for_each(|b| *b = rng.random_range(-127i8..=127) as u8);
        } else {
            q.iter_mut().for_each(|b| *b = rng.random());
        }
    }
    QuantTensor::new(scheme, shape.clone(), out)
}

/// Where a block keeps the scales that multiply all of its values (ggml's `d`, `dmin`, `m`).
enum Scale {
    F16(usize),
    F32(usize),
    /// An E8M0 exponent byte and the code of the scale 1.
    E8m0(usize, u8),
}

fn scales_of(scheme: QuantScheme) -> &'static [Scale] {
    match scheme {
        QuantScheme::Q8_0 | QuantScheme::Q4_0 | QuantScheme::Q5_0 | QuantScheme::Iq4Nl => {
            &[Scale::F16(0)]
        }
        QuantScheme::Q4_1 | QuantScheme::Q5_1 | QuantScheme::Q4K | QuantScheme::Q5K => {
            &[Scale::F16(0), Scale::F16(2)]
        }
        QuantScheme::Q2K => &[Scale::F16(80), Scale::F16(82)],
        QuantScheme::Q3K => &[Scale::F16(108)],
        QuantScheme::Q6K => &[Scale::F16(208)],
        QuantScheme::Q8K => &[Scale::F32(0)],
        // ggml's MXFP4 scale is halved: 128 is 1.
        QuantScheme::Mxfp4 => &[Scale::E8m0(0, 128)],
        QuantScheme::Mxfp6E2m3 | QuantScheme::Mxfp6E3m2 => &[Scale::E8m0(0, 127)],
    }
}

/// One random block whose values have an RMS near `target`: random bytes, the block scales set
/// to ±1 and then multiplied by `target / rms` (the nearest power of two for E8M0), so the
/// sub-block scales, minimums and quants all stay uniformly drawn.
fn random_block(scheme: QuantScheme, block: &mut [u8], rng: &mut impl Rng, target: f32) {
    block.iter_mut().for_each(|b| *b = rng.random());
    let sign = if rng.random::<bool>() { 1.0f32 } else { -1.0 };
    let scales = scales_of(scheme);
    for (i, s) in scales.iter().enumerate() {
        let v = if i == 0 { sign } else { 1.0 };
        match *s {
            Scale::F16(at) => block[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes()),
            Scale::F32(at) => block[at..at + 4].copy_from_slice(&v.to_le_bytes()),
            Scale::E8m0(at, one) => block[at] = one,
        }
    }
    let mut values = vec![0.0f32; scheme.block_elems()];
    scheme.dequantize_block(block, &mut values);
    let rms = (values.iter().map(|v| v * v).sum::<f32>() / values.len() as f32).sqrt();
    let factor = if rms > 0.0 && rms.is_finite() {
        target / rms
    } else {
        target
    };
    for (i, s) in scales.iter().enumerate() {
        let v = if i == 0 { sign * factor } else { factor };
        match *s {
            Scale::F16(at) => block[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes()),
            Scale::F32(at) => block[at..at + 4].copy_from_slice(&v.to_le_bytes()),
            Scale::E8m0(at, one) => {
                let e = f32::from(one) + factor.log2().round();
                block[at] = e.clamp(1.0, 254.0) as u8;
            }
        }
    }
    if scheme == QuantScheme::Q8K {
        // `bsums`: the sums of each 16 quants, which ggml's dot products read.
        for j in 0..16 {
            let sum: i16 = block[4 + 16 * j..4 + 16 * (j + 1)]
                .iter()
                .map(|&q| i16::from(q as i8))
                .sum();
            block[260 + 2 * j..262 + 2 * j].copy_from_slice(&sum.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Q5_0 re-blocked as Q8_0 dequantizes to the same f32 bits (random blocks: every scale
    /// and fifth bit); no other pair re-blocks.
    #[test]
    fn q5_0_reblocked_as_q8_0_holds_the_same_values() {
        let shape = Shape::new(vec![7, 96]);
        let q = random_quant("w", QuantScheme::Q5_0, &shape, 11).unwrap();
        let r = q.reblocked(QuantScheme::Q5_0.kept_as()).unwrap();
        assert_eq!(r.scheme(), QuantScheme::Q8_0);
        let a = QuantScheme::Q5_0.dequantize(q.bytes(), &shape).unwrap();
        let b = QuantScheme::Q8_0.dequantize(r.bytes(), &shape).unwrap();
        assert_eq!(a.len(), b.len());
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
        assert!(a.iter().any(|&v| v != 0.0));
        for s in QuantScheme::ALL {
            if s != QuantScheme::Q5_0 {
                assert_eq!(s.kept_as(), s);
                let q = random_quant("w", s, &Shape::new(vec![1, 256]), 1).unwrap();
                assert!(q.reblocked(QuantScheme::Q8_0).is_none() || s == QuantScheme::Q8_0);
            }
        }
    }

    /// The schemes of the table in the module's comment (the others are checked against the
    /// `gguf` package in `tests/quant_formats.rs`).
    const LEGACY: [QuantScheme; 3] = [QuantScheme::Q8_0, QuantScheme::Q4_0, QuantScheme::Q4_1];

    fn h(v: f64) -> [u8; 2] {
        f16::from_f64(v).to_le_bytes()
    }

    /// The value of element `i` of a block, by the table in the module's comment, in f64.
    fn reference(scheme: QuantScheme, block: &[u8], i: usize) -> f64 {
        let d = f16::from_le_bytes([block[0], block[1]]).to_f64();
        match scheme {
            QuantScheme::Q8_0 => d * f64::from(block[2 + i] as i8),
            QuantScheme::Q4_0 | QuantScheme::Q4_1 => {
                let byte = block[(if scheme == QuantScheme::Q4_1 { 4 } else { 2 }) + i % 16];
                let nib = if i < 16 { byte & 0xF } else { byte >> 4 };
                if scheme == QuantScheme::Q4_0 {
                    d * (f64::from(nib) - 8.0)
                } else {
                    d * f64::from(nib) + f16::from_le_bytes([block[2], block[3]]).to_f64()
                }
            }
            _ => unreachable!("the legacy schemes only"),
        }
    }

    /// Hand-built blocks: for block `b`, a scale of alternating sign, a minimum, and quants
    /// that make every element distinct (nibble `i % 16` for byte `i`'s low half, `15 − i % 16`
    /// for its high half).
    fn blocks(scheme: QuantScheme, count: usize) -> Vec<u8> {
        let mut v = Vec::new();
        for b in 0..count {
            let d = if b % 2 == 0 { 0.25 } else { -0.375 } * (b + 1) as f64;
            v.extend(h(d));
            if scheme == QuantScheme::Q4_1 {
                v.extend(h(-1.5 + b as f64));
            }
            match scheme {
                QuantScheme::Q8_0 => {
                    v.extend((0..32).map(|i| ((i * 9 - 128 + b as i32) as i8) as u8))
                }
                QuantScheme::Q4_0 | QuantScheme::Q4_1 => {
                    v.extend((0..16u8).map(|i| ((15 - i) << 4) | ((i + b as u8) & 0xF)))
                }
                _ => unreachable!("the legacy schemes only"),
            }
        }
        v
    }

    #[test]
    fn every_scheme_matches_f64_loops() {
        // Odd block counts: 3 rows of 5 blocks and one row of 1.
        for scheme in LEGACY {
            for (rows, per_row) in [(3usize, 5usize), (1, 1)] {
                let shape = Shape(vec![rows, per_row * 32]);
                let bytes = blocks(scheme, rows * per_row);
                assert_eq!(bytes.len(), scheme.layout(&shape).unwrap().1);
                let got = scheme.dequantize(&bytes, &shape).unwrap();
                for (bi, block) in bytes.chunks_exact(scheme.block_bytes()).enumerate() {
                    for i in 0..32 {
                        let want = reference(scheme, block, i);
                        let g = got[bi * 32 + i];
                        assert!(
                            (f64::from(g) - want).abs() <= want.abs() * 1e-6,
                            "{scheme} block {bi} element {i}: {g} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn nibble_order_and_signs_are_ggml_s() {
        // Q4_0, d = −2: byte 0 = 0x93 holds element 0 (low nibble 3) and element 16 (high 9).
        let mut b = h(-2.0).to_vec();
        b.extend([0x93u8]);
        b.extend([0x88u8; 15]);
        let v = QuantScheme::Q4_0.dequantize(&b, &Shape(vec![32])).unwrap();
        assert_eq!((v[0], v[16], v[1], v[17]), (10.0, -2.0, 0.0, 0.0));
        // Q4_1, d = 0.5, m = −1: element 0 = 0.5·3 − 1, element 16 = 0.5·9 − 1.
        let mut b = h(0.5).to_vec();
        b.extend(h(-1.0));
        b.extend([0x93u8; 16]);
        let v = QuantScheme::Q4_1.dequantize(&b, &Shape(vec![32])).unwrap();
        assert_eq!((v[0], v[16], v[15], v[31]), (0.5, 3.5, 0.5, 3.5));
        // Q8_0 quants are signed: 0xFF is −1.
        let mut b = h(-0.5).to_vec();
        b.extend([0xFFu8, 0x7F, 0x80]);
        b.extend([0u8; 29]);
        let v = QuantScheme::Q8_0.dequantize(&b, &Shape(vec![32])).unwrap();
        assert_eq!((v[0], v[1], v[2], v[3]), (0.5, -63.5, 64.0, -0.0));
    }

    #[test]
    fn sizes_are_checked() {
        let s = QuantScheme::Q4_1;
        assert_eq!(
            s.layout(&Shape(vec![1536, 576])).unwrap(),
            (18, 1536 * 18 * 20)
        );
        assert!(matches!(
            s.layout(&Shape(vec![4, 40])),
            Err(QuantError::PartialBlock { k: 40, .. })
        ));
        assert!(matches!(
            s.layout(&Shape(vec![usize::MAX / 2, 64])),
            Err(QuantError::Overflow { .. })
        ));
        assert!(matches!(
            QuantTensor::new(s, Shape(vec![2, 32]), vec![0u8; 39]),
            Err(QuantError::Length {
                expected: 40,
                got: 39,
                ..
            })
        ));
        assert!(matches!(
            s.dequantize(&[0u8; 20], &Shape(vec![2, 32])),
            Err(QuantError::Length { .. })
        ));
    }

    #[test]
    fn random_blocks_are_seeded_and_sized() {
        for scheme in QuantScheme::ALL {
            let shape = Shape(vec![7, 2 * scheme.block_elems()]);
            let a = random_quant("w", scheme, &shape, 3).unwrap();
            assert_eq!(a, random_quant("w", scheme, &shape, 3).unwrap());
            assert_ne!(a, random_quant("w", scheme, &shape, 4).unwrap());
            let v = a.to_tensor(DType::F32).unwrap().to_f64_vec();
            let rms = (v.iter().map(|x| x * x).sum::<f64>() / v.len() as f64).sqrt();
            let want = 1.0 / (shape.dims()[1] as f64).sqrt();
            assert!(
                (0.4 * want..2.0 * want).contains(&rms),
                "{scheme}: rms {rms}, about {want} wanted"
            );
        }
    }
}
