//! ggml's tensor types as GGUF stores them, and their dequantization to f32.
//!
//! A quantized type stores a row in blocks of `block_elements` values, each block a small header
//! (scale, sometimes a minimum, as f16) and packed integers; the layouts are ggml's
//! (`ggml-common.h`: `block_q4_0`, `block_q4_1`, `block_q8_0`). The semantics everywhere in
//! rocmforge (interpreter, device kernels) are "dequantize with these expressions, then f32".

use half::{bf16, f16};

use crate::ir::quant::{QuantScheme, BLOCK_ELEMS};

/// The tensor types this reader understands, with ggml's type ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    /// Blocks of 32: f16 scale `d`, 16 bytes of 4-bit `q`; `x = (q − 8)·d`.
    Q4_0,
    /// Blocks of 32: f16 scale `d`, f16 minimum `m`, 16 bytes of 4-bit `q`; `x = q·d + m`.
    Q4_1,
    /// Blocks of 32: f16 scale `d`, 32 signed bytes `q`; `x = q·d`.
    Q8_0,
}

impl GgmlType {
    /// The type with ggml id `id`, or `None` for one this reader does not support (the k-quants,
    /// Q5, Q8_1, the i-quants, integer tensors).
    pub fn from_id(id: u32) -> Option<GgmlType> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            8 => GgmlType::Q8_0,
            30 => GgmlType::BF16,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q8_0 => 8,
            GgmlType::BF16 => 30,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::BF16 => "BF16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q8_0 => "Q8_0",
        }
    }

    /// The IR's block quantization this type is, `None` for the plain float types.
    pub fn quant_scheme(self) -> Option<QuantScheme> {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => None,
            GgmlType::Q4_0 => Some(QuantScheme::Q4_0),
            GgmlType::Q4_1 => Some(QuantScheme::Q4_1),
            GgmlType::Q8_0 => Some(QuantScheme::Q8_0),
        }
    }

    /// Values per block (1 for the plain float types).
    pub fn block_elements(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => 32,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 2 + 16,
            GgmlType::Q4_1 => 2 + 2 + 16,
            GgmlType::Q8_0 => 2 + 32,
        }
    }

    /// Bytes of a tensor of `elements` values, `None` when they are not whole blocks or the
    /// size overflows.
    pub fn bytes_for(self, elements: usize) -> Option<usize> {
        if !elements.is_multiple_of(self.block_elements()) {
            return None;
        }
        (elements / self.block_elements()).checked_mul(self.block_bytes())
    }

    /// Decodes `bytes` (whole blocks, as [`GgmlType::bytes_for`] sized them) into `out`, which
    /// holds exactly the values they encode.
    pub fn dequantize_into(self, bytes: &[u8], out: &mut [f32]) {
        let half = |b: &[u8]| f16::from_le_bytes([b[0], b[1]]).to_f32();
        let blocks = bytes.chunks_exact(self.block_bytes());
        let outs = out.chunks_exact_mut(self.block_elements());
        match self {
            GgmlType::F32 => blocks
                .zip(outs)
                .for_each(|(b, o)| o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            GgmlType::F16 => blocks.zip(outs).for_each(|(b, o)| o[0] = half(b)),
            GgmlType::BF16 => blocks
                .zip(outs)
                .for_each(|(b, o)| o[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32()),
            // The block layouts are defined once, in `ir::quant`, which the interpreter and the
            // device kernels read too.
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => {
                let scheme = self.quant_scheme().expect("a block-quantized type");
                blocks.zip(outs).for_each(|(b, o)| {
                    let o: &mut [f32; BLOCK_ELEMS] = o.try_into().expect("whole blocks");
                    scheme.dequantize_block(b, o);
                })
            }
        }
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One hand-written block per quantized type against values worked out by hand.
    #[test]
    fn blocks_decode_as_ggml_defines_them() {
        // d = 0.5 (f16 0x3800), m = −1 (f16 0xbc00); byte j = (15 − j % 16) << 4 | (j % 16).
        let packed: Vec<u8> = (0..16u8).map(|j| ((15 - j) << 4) | j).collect();
        let mut q41 = vec![0x00, 0x38, 0x00, 0xbc];
        q41.extend(&packed);
        let mut out = [0f32; 32];
        GgmlType::Q4_1.dequantize_into(&q41, &mut out);
        for j in 0..16 {
            assert_eq!(out[j], j as f32 * 0.5 - 1.0);
            assert_eq!(out[j + 16], (15 - j) as f32 * 0.5 - 1.0);
        }
        let mut q40 = vec![0x00, 0x38];
        q40.extend(&packed);
        GgmlType::Q4_0.dequantize_into(&q40, &mut out);
        for j in 0..16 {
            assert_eq!(out[j], (j as f32 - 8.0) * 0.5);
            assert_eq!(out[j + 16], (7.0 - j as f32) * 0.5);
        }
        let mut q80 = vec![0x00, 0x38];
        q80.extend((0..32).map(|j: i32| (j * 8 - 128) as i8 as u8));
        GgmlType::Q8_0.dequantize_into(&q80, &mut out);
        for (j, &v) in out.iter().enumerate() {
            assert_eq!(v, (j as f32 * 8.0 - 128.0) * 0.5);
        }
        assert_eq!(GgmlType::Q4_1.bytes_for(64), Some(40));
        assert_eq!(GgmlType::Q8_0.bytes_for(33), None);
        assert_eq!(GgmlType::F16.bytes_for(3), Some(6));
        for id in [0, 1, 2, 3, 8, 30] {
            assert_eq!(GgmlType::from_id(id).map(GgmlType::id), Some(id));
        }
        assert_eq!(GgmlType::from_id(12), None, "Q4_K is not supported");
    }
}
