//! GGUF files (llama.cpp's model format, versions 2 and 3), memory-mapped: the header, the
//! metadata and the tensor table are parsed and checked against the file up front; tensor data
//! is only read (and dequantized) when a tensor is asked for.
//!
//! Layout (little-endian): magic `GGUF`, version u32, tensor count u64, metadata count u64; the
//! metadata (key string, value type u32, value); the tensor table (name string, rank u32, dims
//! u64 × rank with the fastest-varying first, ggml type u32, offset u64 into the data section);
//! padding to `general.alignment` (32 when absent); the data section. A string is a u64 length
//! and UTF-8 bytes. Every count, length, offset and size read from the file is checked with
//! checked arithmetic against the bytes that remain before anything is allocated for it.

mod cursor;
mod metadata;
mod table;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use thiserror::Error;

use super::ggml_types::GgmlType;
use super::safetensors::map_file;
use super::ModelError;
use crate::ir::file::{self, FileLimit};
use crate::ir::{try_collect, DType, Tensor};

use cursor::Cursor;
use metadata::read_value;
pub use metadata::{GgufArray, GgufValue};
use table::{check_overlaps, read_entry};

/// Weights are memory-mapped, not read, so the limit only keeps out what no model file is.
pub const GGUF_FILE: FileLimit = FileLimit {
    what: "GGUF file",
    max_bytes: 1 << 40,
};

/// llama.cpp's `GGML_MAX_DIMS`.
pub const MAX_DIMS: usize = 4;

/// Arrays nest at most this deep (no model writes nested arrays; the bound keeps recursion
/// shallow on a hostile file).
const MAX_NESTING: usize = 4;

/// Far above any model (the largest have a few thousand tensors and a few dozen keys) and
/// small enough that a count past them is refused before its table is walked.
const MAX_TENSORS: u64 = 1 << 20;
const MAX_KEYS: u64 = 1 << 20;

/// The default `general.alignment`, and the largest this reader accepts.
pub const DEFAULT_ALIGNMENT: usize = 32;
const MAX_ALIGNMENT: usize = 1 << 20;

/// What is wrong with a GGUF file.
#[derive(Clone, Debug, Error, PartialEq)]
pub enum GgufError {
    #[error("not a GGUF file (magic {found:02x?}, expected \"GGUF\")")]
    BadMagic { found: Vec<u8> },
    #[error("GGUF version {version} is not supported (2 and 3 are)")]
    UnsupportedVersion { version: u32 },
    #[error("truncated: {what} needs {need} bytes at offset {at}, the file has {len}")]
    Truncated {
        what: String,
        at: usize,
        need: u64,
        len: usize,
    },
    #[error("{what}: a count of {count} is more than {max}")]
    TooMany { what: String, count: u64, max: u64 },
    #[error("{what}: not UTF-8")]
    BadUtf8 { what: String },
    #[error("metadata `{key}`: unknown value type {type_id}")]
    UnknownValueType { key: String, type_id: u32 },
    #[error("metadata `{key}`: a bool must be 0 or 1, found {found}")]
    BadBool { key: String, found: u8 },
    #[error("metadata `{key}`: arrays nested deeper than {MAX_NESTING}")]
    NestedTooDeep { key: String },
    #[error("metadata key `{key}` appears twice")]
    DuplicateKey { key: String },
    #[error("tensor `{name}` appears twice")]
    DuplicateTensor { name: String },
    #[error("general.alignment {value} is not a power of two in 1..={MAX_ALIGNMENT}")]
    BadAlignment { value: u64 },
    #[error("tensor `{tensor}`: ggml type {ggml_name} (id {type_id}) is not one rocmforge runs")]
    UnknownTensorType {
        tensor: String,
        type_id: u32,
        /// ggml's name for the id, `unknown` for an id ggml does not define.
        ggml_name: &'static str,
    },
    #[error("tensor `{tensor}`: {reason}")]
    BadShape { tensor: String, reason: String },
    #[error(
        "tensor `{tensor}`: data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    Misaligned {
        tensor: String,
        offset: u64,
        alignment: usize,
    },
    #[error(
        "tensor `{tensor}`: bytes {start}..{end} of the data lie past its end ({data_len} bytes)"
    )]
    OutOfRange {
        tensor: String,
        start: u64,
        end: u64,
        data_len: usize,
    },
    #[error("tensor `{tensor}` (data bytes {start}..{end}) overlaps tensor `{other}`")]
    Overlap {
        tensor: String,
        other: String,
        start: usize,
        end: usize,
    },
    #[error("metadata `{key}` is missing")]
    MissingKey { key: String },
    #[error("metadata `{key}` is {found}, expected {expected}")]
    KeyType {
        key: String,
        expected: &'static str,
        found: String,
    },
}

/// A tensor's entry in the table, checked against the file.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufTensor {
    pub ggml_type: GgmlType,
    /// The dims as GGUF stores them: the fastest-varying (the row) first.
    pub dims: Vec<usize>,
    /// Byte range in the file.
    pub start: usize,
    pub end: usize,
}

impl GgufTensor {
    /// The shape in row-major (PyTorch) order: GGUF's dims reversed.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().copied().collect()
    }

    pub fn elements(&self) -> usize {
        // Checked when the table was read.
        self.dims.iter().product()
    }
}

/// A GGUF file, mapped, with its metadata and tensor table read and checked.
pub struct Gguf {
    path: PathBuf,
    map: Mmap,
    pub version: u32,
    pub alignment: usize,
    /// Where the data section starts in the file.
    pub data_start: usize,
    metadata: BTreeMap<String, GgufValue>,
    tensors: BTreeMap<String, GgufTensor>,
    /// Tensor names in the order the file lists them.
    order: Vec<String>,
}

fn corrupt<T>(path: &Path, error: GgufError) -> Result<T, ModelError> {
    Err(ModelError::Gguf {
        path: path.display().to_string(),
        error,
    })
}

impl Gguf {
    /// Maps `path` (a regular file: a FIFO or device is refused unopened) and checks it: magic
    /// and version, every metadata value, and every tensor entry (a supported type, a shape of
    /// whole blocks, an aligned offset, bytes inside the data section, no two overlapping).
    pub fn open(path: &Path) -> Result<Gguf, ModelError> {
        let (file, _) = file::open_regular(path, GGUF_FILE)?;
        let map = map_file(&file, path)?;
        match Self::parse(&map) {
            Ok(p) => Ok(Gguf {
                path: path.to_path_buf(),
                map,
                version: p.version,
                alignment: p.alignment,
                data_start: p.data_start,
                metadata: p.metadata,
                tensors: p.tensors,
                order: p.order,
            }),
            Err(error) => corrupt(path, error),
        }
    }

    fn parse(buf: &[u8]) -> Result<Parsed, GgufError> {
        let mut c = Cursor { buf, at: 0 };
        let magic = c
            .take(4, || "the magic".into())
            .map_err(|_| GgufError::BadMagic {
                found: buf[..buf.len().min(4)].to_vec(),
            })?;
        if magic != b"GGUF" {
            return Err(GgufError::BadMagic {
                found: magic.to_vec(),
            });
        }
        let version = c.u32(&|| "the version".into())?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion { version });
        }
        // A tensor entry takes at least 8 (name) + 4 (rank) + 4 (type) + 8 (offset) bytes, a
        // metadata entry 8 (key) + 4 (type) + 1.
        let n_tensors = c.u64(&|| "the tensor count".into())?;
        let n_keys = c.u64(&|| "the metadata count".into())?;
        let bound = |n: u64, min: u64, max: u64, what: &str| {
            let fits = n.checked_mul(min).is_some_and(|b| b <= buf.len() as u64);
            if n > max || !fits {
                return Err(GgufError::TooMany {
                    what: what.into(),
                    count: n,
                    max: max.min(buf.len() as u64 / min),
                });
            }
            Ok(n as usize)
        };
        let n_tensors = bound(n_tensors, 24, MAX_TENSORS, "tensors")?;
        let n_keys = bound(n_keys, 13, MAX_KEYS, "metadata entries")?;
        let mut metadata = BTreeMap::new();
        for i in 0..n_keys {
            let key = c.string(&|| format!("metadata key {i}"))?;
            let type_id = c.u32(&|| format!("the type of metadata `{key}`"))?;
            let value = read_value(&mut c, &key, type_id, 0)?;
            if metadata.contains_key(&key) {
                return Err(GgufError::DuplicateKey { key });
            }
            metadata.insert(key, value);
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(GgufValue::U32(a)) => {
                let a = *a as usize;
                if a == 0 || !a.is_power_of_two() || a > MAX_ALIGNMENT {
                    return Err(GgufError::BadAlignment { value: a as u64 });
                }
                a
            }
            Some(other) => {
                return Err(GgufError::KeyType {
                    key: "general.alignment".into(),
                    expected: "u32",
                    found: other.type_name().into(),
                })
            }
        };
        let mut entries = Vec::with_capacity(n_tensors);
        for i in 0..n_tensors {
            entries.push(read_entry(&mut c, i)?);
        }
        // The data section starts at the next multiple of the alignment (it may be empty).
        let data_start =
            c.at.checked_next_multiple_of(alignment)
                .filter(|&s| s <= buf.len())
                .unwrap_or(buf.len());
        let data_len = buf.len() - data_start;
        let mut tensors = BTreeMap::new();
        let mut order = Vec::with_capacity(entries.len());
        for e in entries {
            if !e.offset.is_multiple_of(alignment as u64) {
                return Err(GgufError::Misaligned {
                    tensor: e.name,
                    offset: e.offset,
                    alignment,
                });
            }
            let end = e.offset.checked_add(e.bytes as u64);
            let range = usize::try_from(e.offset)
                .ok()
                .zip(end.and_then(|x| usize::try_from(x).ok()))
                .filter(|&(_, end)| end <= data_len);
            let Some((start, end)) = range else {
                return Err(GgufError::OutOfRange {
                    tensor: e.name,
                    start: e.offset,
                    end: end.unwrap_or(u64::MAX),
                    data_len,
                });
            };
            if tensors.contains_key(&e.name) {
                return Err(GgufError::DuplicateTensor { name: e.name });
            }
            order.push(e.name.clone());
            tensors.insert(
                e.name,
                GgufTensor {
                    ggml_type: e.ggml_type,
                    dims: e.dims,
                    start: data_start + start,
                    end: data_start + end,
                },
            );
        }
        check_overlaps(&tensors, data_start)?;
        Ok(Parsed {
            version,
            alignment,
            data_start,
            metadata,
            tensors,
            order,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The metadata value `key`, if present.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.metadata.keys().map(String::as_str)
    }

    fn require(&self, key: &str) -> Result<&GgufValue, ModelError> {
        self.get(key)
            .ok_or_else(|| self.error(GgufError::MissingKey { key: key.into() }))
    }

    /// A [`ModelError`] for this file.
    pub fn error(&self, error: GgufError) -> ModelError {
        ModelError::Gguf {
            path: self.path.display().to_string(),
            error,
        }
    }

    fn wrong_type(&self, key: &str, expected: &'static str, found: &GgufValue) -> ModelError {
        self.error(GgufError::KeyType {
            key: key.into(),
            expected,
            found: found.type_name().into(),
        })
    }

    /// An unsigned integer (of any integer type, non-negative) that fits a u32.
    pub fn u32(&self, key: &str) -> Result<u32, ModelError> {
        let v = self.require(key)?;
        v.as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .ok_or_else(|| self.wrong_type(key, "an unsigned 32-bit integer", v))
    }

    /// An f32 (an f64 that an f32 holds is accepted too).
    pub fn f32(&self, key: &str) -> Result<f32, ModelError> {
        match self.require(key)? {
            GgufValue::F32(x) => Ok(*x),
            GgufValue::F64(x) if (*x as f32) as f64 == *x => Ok(*x as f32),
            v => Err(self.wrong_type(key, "f32", v)),
        }
    }

    pub fn bool(&self, key: &str) -> Result<bool, ModelError> {
        match self.require(key)? {
            GgufValue::Bool(b) => Ok(*b),
            v => Err(self.wrong_type(key, "bool", v)),
        }
    }

    pub fn str(&self, key: &str) -> Result<&str, ModelError> {
        match self.require(key)? {
            GgufValue::String(s) => Ok(s),
            v => Err(self.wrong_type(key, "a string", v)),
        }
    }

    pub fn array(&self, key: &str) -> Result<&GgufArray, ModelError> {
        match self.require(key)? {
            GgufValue::Array(a) => Ok(a),
            v => Err(self.wrong_type(key, "an array", v)),
        }
    }

    pub fn strings(&self, key: &str) -> Result<&[String], ModelError> {
        match self.require(key)? {
            GgufValue::Array(GgufArray::String(s)) => Ok(s),
            v => Err(self.wrong_type(key, "an array of strings", v)),
        }
    }

    pub fn tensor_info(&self, name: &str) -> Option<&GgufTensor> {
        self.tensors.get(name)
    }

    /// Tensor names in the order the file lists them.
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.order.iter().map(String::as_str)
    }

    /// The stored bytes of tensor `name` (blocks, for a quantized type).
    pub fn raw(&self, name: &str) -> Result<(&GgufTensor, &[u8]), ModelError> {
        let info = self
            .tensors
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                path: self.path.display().to_string(),
                name: name.into(),
            })?;
        Ok((info, &self.map[info.start..info.end]))
    }

    /// Tensor `name` dequantized to f32, in file order (the row, GGUF's first dim, fastest).
    pub fn dequantize(&self, name: &str) -> Result<Vec<f32>, ModelError> {
        let (info, bytes) = self.raw(name)?;
        let n = info.elements();
        let mut out =
            try_collect(n, std::iter::repeat_n(0.0f32, n)).map_err(|e| ModelError::Io {
                path: self.path.display().to_string(),
                message: format!("tensor `{name}`: {e}"),
            })?;
        info.ggml_type.dequantize_into(bytes, &mut out);
        Ok(out)
    }

    /// Tensor `name` as a row-major tensor of `dtype` (f32, f16 or bf16: dequantized, then
    /// rounded), checked against the `shape` the model expects (PyTorch order).
    pub fn tensor(&self, name: &str, shape: &[usize], dtype: DType) -> Result<Tensor, ModelError> {
        let (info, _) = self.raw(name)?;
        if info.shape() != shape {
            return Err(ModelError::TensorShape {
                name: name.into(),
                expected: shape.to_vec(),
                found: info.shape(),
            });
        }
        if !dtype.is_float() {
            return Err(ModelError::TensorDType {
                name: name.into(),
                found: dtype,
            });
        }
        let values = self.dequantize(name)?;
        Ok(Tensor::from_f32(dtype, shape.to_vec(), values).expect("size checked when opened"))
    }
}

struct Parsed {
    version: u32,
    alignment: usize,
    data_start: usize,
    metadata: BTreeMap<String, GgufValue>,
    tensors: BTreeMap<String, GgufTensor>,
    order: Vec<String>,
}
