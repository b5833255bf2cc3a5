//! safetensors files: `frontend::SafeTensors::open` (header parsed and checked against the
//! file), then every tensor read back. What opens must keep its promises: each tensor's bytes
//! lie in the data section and hold exactly its shape, float tensors read back as the bytes
//! say (decoded here independently), other dtypes and wrong shapes are typed errors.

use std::path::Path;

use rocmforge::frontend::{ModelError, SafeTensors};
use rocmforge::ir::DType;

use super::{message_label, read_dir_files, root, Outcome, Structure, Target};

pub struct SafetensorsTarget;

/// An IEEE half as f32, decoded from its bits (not through the `half` crate the reader uses).
fn f16_bits_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0f32 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let mant = f32::from(h & 0x3ff);
    match exp {
        0 => sign * mant * 2f32.powi(-24),
        31 if mant == 0.0 => sign * f32::INFINITY,
        31 => f32::NAN,
        _ => sign * (1.0 + mant / 1024.0) * 2f32.powi(exp - 15),
    }
}

/// The values `bytes` hold as `dtype`, for the float dtypes.
fn decode(dtype: DType, bytes: &[u8]) -> Option<Vec<f32>> {
    let u16s = || {
        bytes
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
    };
    Some(match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        DType::F16 => u16s().map(f16_bits_to_f32).collect(),
        DType::BF16 => u16s().map(|b| f32::from_bits(u32::from(b) << 16)).collect(),
        DType::I32 | DType::I64 | DType::Bool => return None,
    })
}

fn same(a: f32, b: f32) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

impl Target for SafetensorsTarget {
    fn name(&self) -> &'static str {
        "safetensors"
    }

    fn structure(&self) -> Structure {
        Structure::Safetensors
    }

    fn input_file(&self) -> &'static str {
        "model.safetensors"
    }

    fn seeds(&self) -> Vec<Vec<u8>> {
        let mut seeds = read_dir_files(&root().join("tests/data/fuzz/safetensors"), &[]);
        seeds.push(
            std::fs::read(root().join("tests/data/fuzz/bert_tiny/model.safetensors"))
                .expect("tests/data/fuzz/bert_tiny/model.safetensors"),
        );

        seeds
    }

    fn dictionary(&self) -> Vec<String> {
        [
            "F32",
            "F16",
            "BF16",
            "I32",
            "I64",
            "BOOL",
            "F64",
            "U8",
            "__metadata__",
            "rocmforge.quant.",
            "mxfp6_e2m3",
            "mxfp6_e3m2",
            "q4_0",
            "q8_0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    fn run(&mut self, input: &[u8], path: &Path) -> Outcome {
        let st = match SafeTensors::open(path) {
            Ok(st) => st,
            Err(ModelError::Safetensors { reason, .. }) => {
                return Ok(format!("open-err:{}", message_label(&reason)))
            }
            Err(e) => return Err(format!("open gave an error of the wrong kind: {e}")),
        };
        // The header length as the file states it; `open` succeeded, so it is in range.
        let header_len = u64::from_le_bytes(input[..8].try_into().expect("8 bytes"));
        let data_start = 8 + usize::try_from(header_len).expect("open checked it");
        let names: Vec<String> = st.names().map(str::to_string).collect();
        for name in &names {
            let info = st.info(name).expect("a listed name has info").clone();
            if info.start < data_start || info.start > info.end || info.end > input.len() {
                return Err(format!(
                    "`{name}`: bytes {}..{} outside the data section {data_start}..{}",
                    info.start,
                    info.end,
                    input.len()
                ));
            }
            if let Some(scheme) = info.quant {
                // Blocks (a U8 tensor marked in __metadata__): whole blocks per row, read back
                // as the scheme dequantizes those bytes (bit for bit against gguf-py in
                // tests/quant_formats.rs).
                let bytes = match info.shape[..] {
                    [rows, k] if k % scheme.block_elems() == 0 => rows
                        .checked_mul(k / scheme.block_elems())
                        .and_then(|b| b.checked_mul(scheme.block_bytes())),
                    _ => None,
                };
                if bytes != Some(info.end - info.start) {
                    return Err(format!(
                        "`{name}`: {} bytes for {scheme} blocks of {:?}",
                        info.end - info.start,
                        info.shape
                    ));
                }
                let shape = rocmforge::ir::Shape::new(info.shape.clone());
                let want = scheme
                    .dequantize(&input[info.start..info.end], &shape)
                    .map_err(|e| format!("`{name}`: {e}"))?;
                let t = st
                    .tensor(name, &info.shape)
                    .map_err(|e| format!("reading `{name}`: {e}"))?;
                let got = t.as_f32().ok_or("blocks read as integers")?;
                if !got.iter().zip(&want).all(|(&g, &w)| same(g, w)) || got.len() != want.len() {
                    return Err(format!("`{name}` reads back other values than its blocks"));
                }
                continue;
            }
            let numel = info
                .shape
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .and_then(|n| n.checked_mul(info.dtype.size_bytes()));
            if numel != Some(info.end - info.start) {
                return Err(format!(
                    "`{name}`: {} bytes for {}{:?}",
                    info.end - info.start,
                    info.dtype,
                    info.shape
                ));
            }
            let read = st.tensor(name, &info.shape);
            match (decode(info.dtype, &input[info.start..info.end]), read) {
                (Some(want), Ok(t)) => {
                    let got = t.as_f32().ok_or("a float tensor read as integers")?;
                    if t.shape().dims() != info.shape.as_slice()
                        || got.len() != want.len()
                        || !got.iter().zip(&want).all(|(&g, &w)| same(g, w))
                    {
                        return Err(format!("`{name}` reads back other values than its bytes"));
                    }
                }
                (None, Err(ModelError::TensorDType { .. })) => {}
                (_, Err(e)) => return Err(format!("reading `{name}`: {e}")),
                (None, Ok(_)) => return Err(format!("`{name}` ({}) read as floats", info.dtype)),
            }
            let mut wrong = info.shape.clone();
            wrong.push(1);
            if !matches!(st.tensor(name, &wrong), Err(ModelError::TensorShape { .. })) {
                return Err(format!("`{name}` read with a shape it does not have"));
            }
        }
        let missing = "\u{0}not a tensor";
        if st.info(missing).is_none()
            && !matches!(
                st.tensor(missing, &[1]),
                Err(ModelError::MissingTensor { .. })
            )
        {
            return Err("a missing tensor is not MissingTensor".into());
        }
        Ok(format!("open:{} tensors", names.len().min(3)))
    }
}
