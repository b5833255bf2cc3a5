//! safetensors files, memory-mapped: the header is parsed and checked against the file up front,
//! tensor data is only read (and converted) when a tensor is asked for.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;
use serde_json::Value;

use super::ModelError;
use crate::ir::{DType, Tensor};

#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Byte range in the file.
    pub start: usize,
    pub end: usize,
}

pub struct SafeTensors {
    path: PathBuf,
    map: Mmap,
    tensors: BTreeMap<String, TensorInfo>,
}

fn corrupt<T>(path: &Path, reason: impl Into<String>) -> Result<T, ModelError> {
    Err(ModelError::Safetensors {
        path: path.display().to_string(),
        reason: reason.into(),
    })
}

fn dtype_of(s: &str) -> Option<DType> {
    Some(match s {
        "F32" => DType::F32,
        "F16" => DType::F16,
        "BF16" => DType::BF16,
        "I32" => DType::I32,
        "I64" => DType::I64,
        "BOOL" => DType::Bool,
        _ => return None,
    })
}

impl SafeTensors {
    pub fn open(path: &Path) -> Result<SafeTensors, ModelError> {
        let file = std::fs::File::open(path).map_err(|e| ModelError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        let map = map_file(&file, path)?;
        let len = map.len();
        if len < 8 {
            return corrupt(path, format!("{len} bytes: too short for a header length"));
        }
        let n = u64::from_le_bytes(map[..8].try_into().expect("8 bytes")) as usize;
        let Some(data_start) = n.checked_add(8).filter(|&e| e <= len) else {
            return corrupt(
                path,
                format!("header of {n} bytes runs past the end of the file ({len} bytes)"),
            );
        };
        let header: Value =
            serde_json::from_slice(&map[8..data_start]).map_err(|e| ModelError::Safetensors {
                path: path.display().to_string(),
                reason: format!("header is not JSON: {e}"),
            })?;
        let Value::Object(entries) = header else {
            return corrupt(path, "header is not a JSON object");
        };
        let mut tensors = BTreeMap::new();
        for (name, v) in entries {
            if name == "__metadata__" {
                continue;
            }
            let dtype = v
                .get("dtype")
                .and_then(Value::as_str)
                .and_then(dtype_of)
                .ok_or_else(|| ModelError::Safetensors {
                    path: path.display().to_string(),
                    reason: format!(
                        "tensor `{name}`: missing or unsupported dtype {}",
                        v.get("dtype").unwrap_or(&Value::Null)
                    ),
                })?;
            let shape: Vec<usize> = v
                .get("shape")
                .and_then(|s| serde_json::from_value(s.clone()).ok())
                .ok_or_else(|| ModelError::Safetensors {
                    path: path.display().to_string(),
                    reason: format!("tensor `{name}`: bad shape"),
                })?;
            let offs: [usize; 2] = v
                .get("data_offsets")
                .and_then(|s| serde_json::from_value(s.clone()).ok())
                .ok_or_else(|| ModelError::Safetensors {
                    path: path.display().to_string(),
                    reason: format!("tensor `{name}`: bad data_offsets"),
                })?;
            let (start, end) = (
                data_start.checked_add(offs[0]),
                data_start.checked_add(offs[1]),
            );
            let (Some(start), Some(end)) = (start, end) else {
                return corrupt(path, format!("tensor `{name}`: offsets overflow"));
            };
            if start > end || end > len {
                return corrupt(
                    path,
                    format!(
                        "tensor `{name}`: bytes {}..{} lie past the end of the data ({} bytes)",
                        offs[0],
                        offs[1],
                        len - data_start
                    ),
                );
            }
            let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            if numel.and_then(|n| n.checked_mul(dtype.size_bytes())) != Some(end - start) {
                return corrupt(
                    path,
                    format!(
                        "tensor `{name}`: {} bytes do not hold a {dtype}{shape:?}",
                        end - start
                    ),
                );
            }
            tensors.insert(
                name,
                TensorInfo {
                    dtype,
                    shape,
                    start,
                    end,
                },
            );
        }
        Ok(SafeTensors {
            path: path.to_path_buf(),
            map,
            tensors,
        })
    }

    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// The tensor `name`, checked against the shape the model expects, converted to f32
    /// (floats) on the way out of the map.
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<Tensor, ModelError> {
        let info = self
            .tensors
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                path: self.path.display().to_string(),
                name: name.to_string(),
            })?;
        if info.shape != shape {
            return Err(ModelError::TensorShape {
                name: name.to_string(),
                expected: shape.to_vec(),
                found: info.shape.clone(),
            });
        }
        let bytes = &self.map[info.start..info.end];
        let f32s = |v: Vec<f32>| {
            Tensor::from_f32(DType::F32, shape.to_vec(), v).expect("size checked when opened")
        };
        Ok(match info.dtype {
            DType::F32 => f32s(
                bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().expect("4")))
                    .collect(),
            ),
            DType::F16 => f32s(
                bytes
                    .chunks_exact(2)
                    .map(|c| f16::from_le_bytes(c.try_into().expect("2")).to_f32())
                    .collect(),
            ),
            DType::BF16 => f32s(
                bytes
                    .chunks_exact(2)
                    .map(|c| bf16::from_le_bytes(c.try_into().expect("2")).to_f32())
                    .collect(),
            ),
            other => {
                return Err(ModelError::TensorDType {
                    name: name.to_string(),
                    found: other,
                })
            }
        })
    }
}

fn map_file(file: &std::fs::File, path: &Path) -> Result<Mmap, ModelError> {
    // SAFETY: mapping is unsafe because the file could change under the map. Model files are
    // opened read-only and not written while rocmforge runs, and every read is bounds-checked
    // against the map's length, so a file truncated before mapping cannot be read past its end.
    // (Not FFI: the one `unsafe` outside `runtime`, kept here so `frontend` depends on `ir` only.)
    unsafe { Mmap::map(file) }.map_err(|e| ModelError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}
