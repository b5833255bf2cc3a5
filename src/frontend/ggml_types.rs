//! ggml's tensor types as GGUF stores them, and their dequantization to f32.
//!
//! A quantized type stores a row in blocks of `block_elements` values, each block a small header
//! (scale, sometimes a minimum, as f16) and packed integers; the layouts are ggml's
//! (`ggml-common.h`: `block_q4_0`, `block_q5_K`, ...; see `ir::quant`, `ir::kquant` and
//! `ir::microscale`). A type this reader does not run is an error naming ggml's type and the
//! tensor ([`ggml_type_name`]). The semantics everywhere in
//! rocmforge (interpreter, device kernels) are "dequantize with these expressions, then f32".

use half::{bf16, f16};

use crate::ir::quant::QuantScheme;

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
    /// Blocks of 32, 5-bit `q`: `x = (q − 16)·d`.
    Q5_0,
    /// Blocks of 32, 5-bit `q`: `x = q·d + m`.
    Q5_1,
    /// Super-blocks of 256 (the k-quants, `ir::kquant`).
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    /// Blocks of 32, 4-bit indices into a non-linear grid.
    Iq4Nl,
    /// Blocks of 32 E2M1 values sharing an E8M0 scale (gpt-oss files).
    Mxfp4,
}

/// ggml's name for type id `id` (`ggml.h`'s `enum ggml_type`), whether or not this reader runs
/// it; `None` for ids ggml does not define.
pub fn ggml_type_name(id: u32) -> Option<&'static str> {
    Some(match id {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        30 => "BF16",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        40 => "NVFP4",
        41 => "Q1_0",
        _ => return None,
    })
}

impl GgmlType {
    pub const ALL: [GgmlType; 16] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Q8K,
        GgmlType::Iq4Nl,
        GgmlType::Mxfp4,
    ];

    /// The type with ggml id `id`, or `None` for one this reader does not run (Q8_1, the
    /// i-quants but IQ4_NL, the ternary and integer types, F64, NVFP4, Q1_0, unknown ids).
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GgmlType::ALL.into_iter().find(|t| t.id() == id)
    }

    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q2K => 10,
            GgmlType::Q3K => 11,
            GgmlType::Q4K => 12,
            GgmlType::Q5K => 13,
            GgmlType::Q6K => 14,
            GgmlType::Q8K => 15,
            GgmlType::Iq4Nl => 20,
            GgmlType::BF16 => 30,
            GgmlType::Mxfp4 => 39,
        }
    }

    /// ggml's name (`Q4_K`, ...).
    pub fn name(self) -> &'static str {
        ggml_type_name(self.id()).expect("every supported type is named")
    }

    /// The IR's block quantization this type is, `None` for the plain float types.
    pub fn quant_scheme(self) -> Option<QuantScheme> {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => None,
            GgmlType::Q4_0 => Some(QuantScheme::Q4_0),
            GgmlType::Q4_1 => Some(QuantScheme::Q4_1),
            GgmlType::Q8_0 => Some(QuantScheme::Q8_0),
            GgmlType::Q5_0 => Some(QuantScheme::Q5_0),
            GgmlType::Q5_1 => Some(QuantScheme::Q5_1),
            GgmlType::Q2K => Some(QuantScheme::Q2K),
            GgmlType::Q3K => Some(QuantScheme::Q3K),
            GgmlType::Q4K => Some(QuantScheme::Q4K),
            GgmlType::Q5K => Some(QuantScheme::Q5K),
            GgmlType::Q6K => Some(QuantScheme::Q6K),
            GgmlType::Q8K => Some(QuantScheme::Q8K),
            GgmlType::Iq4Nl => Some(QuantScheme::Iq4Nl),
            GgmlType::Mxfp4 => Some(QuantScheme::Mxfp4),
        }
    }

    /// Values per block (1 for the plain float types).
    pub fn block_elements(self) -> usize {
        self.quant_scheme().map_or(1, QuantScheme::block_elems)
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q8_0
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q2K
            | GgmlType::Q3K
            | GgmlType::Q4K
            | GgmlType::Q5K
            | GgmlType::Q6K
            | GgmlType::Q8K
            | GgmlType::Iq4Nl
            | GgmlType::Mxfp4 => self.quant_scheme().map_or(1, QuantScheme::block_bytes),
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
        match self.quant_scheme() {
            // The block layouts are defined once, in `ir::quant`, which the interpreter and the
            // device kernels read too.
            Some(scheme) => blocks
                .zip(outs)
                .for_each(|(b, o)| scheme.dequantize_block(b, o)),
            None if self == GgmlType::F32 => blocks
                .zip(outs)
                .for_each(|(b, o)| o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            None if self == GgmlType::F16 => blocks.zip(outs).for_each(|(b, o)| o[0] = half(b)),
            None => blocks
                .zip(outs)
                .for_each(|(b, o)| o[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32()),
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
        for id in [0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 15, 20, 30, 39] {
            let t = GgmlType::from_id(id).expect("a supported type");
            assert_eq!(t.id(), id);
            assert_eq!(Some(t.name()), ggml_type_name(id));
        }
        // The k-quants' super-blocks: 256 values in ggml's struct sizes.
        assert_eq!(GgmlType::Q4K.bytes_for(512), Some(288));
        assert_eq!(GgmlType::Q6K.bytes_for(256), Some(210));
        assert_eq!(GgmlType::Q4K.bytes_for(32), None);
        assert_eq!(GgmlType::Mxfp4.bytes_for(64), Some(34));
        for id in [4, 9, 16, 23, 24, 28, 40, 41, 99] {
            assert_eq!(GgmlType::from_id(id), None, "type {id}");
        }
        assert_eq!(ggml_type_name(16), Some("IQ2_XXS"));
        assert_eq!(ggml_type_name(4), None);
    }
}
