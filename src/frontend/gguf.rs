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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use thiserror::Error;

use super::ggml_types::{ggml_type_name, GgmlType};
use super::safetensors::map_file;
use super::ModelError;
use crate::ir::file::{self, FileLimit};
use crate::ir::{try_collect, DType, Tensor};

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

/// A metadata value, typed as the file declares it.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(GgufArray),
}

/// A metadata array: one element type for all elements, stored unboxed.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<GgufArray>),
}

impl GgufArray {
    pub fn len(&self) -> usize {
        match self {
            GgufArray::U8(v) => v.len(),
            GgufArray::I8(v) => v.len(),
            GgufArray::U16(v) => v.len(),
            GgufArray::I16(v) => v.len(),
            GgufArray::U32(v) => v.len(),
            GgufArray::I32(v) => v.len(),
            GgufArray::U64(v) => v.len(),
            GgufArray::I64(v) => v.len(),
            GgufArray::F32(v) => v.len(),
            GgufArray::F64(v) => v.len(),
            GgufArray::Bool(v) => v.len(),
            GgufArray::String(v) => v.len(),
            GgufArray::Array(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements as i64, for the integer element types.
    pub fn to_i64(&self) -> Option<Vec<i64>> {
        Some(match self {
            GgufArray::U8(v) => v.iter().map(|&x| i64::from(x)).collect(),
            GgufArray::I8(v) => v.iter().map(|&x| i64::from(x)).collect(),
            GgufArray::U16(v) => v.iter().map(|&x| i64::from(x)).collect(),
            GgufArray::I16(v) => v.iter().map(|&x| i64::from(x)).collect(),
            GgufArray::U32(v) => v.iter().map(|&x| i64::from(x)).collect(),
            GgufArray::I32(v) => v.iter().map(|&x| i64::from(x)).collect(),
            GgufArray::I64(v) => v.clone(),
            GgufArray::U64(v) => return v.iter().map(|&x| i64::try_from(x).ok()).collect(),
            GgufArray::F32(_)
            | GgufArray::F64(_)
            | GgufArray::Bool(_)
            | GgufArray::String(_)
            | GgufArray::Array(_) => return None,
        })
    }

    fn type_name(&self) -> &'static str {
        match self {
            GgufArray::U8(_) => "an array of u8",
            GgufArray::I8(_) => "an array of i8",
            GgufArray::U16(_) => "an array of u16",
            GgufArray::I16(_) => "an array of i16",
            GgufArray::U32(_) => "an array of u32",
            GgufArray::I32(_) => "an array of i32",
            GgufArray::U64(_) => "an array of u64",
            GgufArray::I64(_) => "an array of i64",
            GgufArray::F32(_) => "an array of f32",
            GgufArray::F64(_) => "an array of f64",
            GgufArray::Bool(_) => "an array of bool",
            GgufArray::String(_) => "an array of strings",
            GgufArray::Array(_) => "an array of arrays",
        }
    }
}

impl GgufValue {
    /// The type in words, for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            GgufValue::U8(_) => "u8",
            GgufValue::I8(_) => "i8",
            GgufValue::U16(_) => "u16",
            GgufValue::I16(_) => "i16",
            GgufValue::U32(_) => "u32",
            GgufValue::I32(_) => "i32",
            GgufValue::U64(_) => "u64",
            GgufValue::I64(_) => "i64",
            GgufValue::F32(_) => "f32",
            GgufValue::F64(_) => "f64",
            GgufValue::Bool(_) => "bool",
            GgufValue::String(_) => "a string",
            GgufValue::Array(a) => a.type_name(),
        }
    }

    /// The value as an unsigned integer, for any integer type holding a non-negative value.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(u64::from(v)),
            GgufValue::U16(v) => Some(u64::from(v)),
            GgufValue::U32(v) => Some(u64::from(v)),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
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

/// A reader over the header bytes that names what it reads when they run out.
struct Cursor<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64, what: impl FnOnce() -> String) -> Result<&'a [u8], GgufError> {
        let truncated = || GgufError::Truncated {
            what: what(),
            at: self.at,
            need: n,
            len: self.buf.len(),
        };
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| self.at.checked_add(n))
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(truncated)?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let b = self.take(N as u64, what)?;
        Ok(b.try_into().expect("N bytes taken"))
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.at
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let n = self.u64(&|| format!("the length of {}", what()))?;
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::BadUtf8 { what: what() })
    }

    /// A count of elements of at least `min_bytes` each: more than the remaining bytes could
    /// hold is refused before anything is allocated for it.
    fn count(
        &mut self,
        min_bytes: u64,
        max: u64,
        what: &dyn Fn() -> String,
    ) -> Result<usize, GgufError> {
        let n = self.u64(what)?;
        let fits = n
            .checked_mul(min_bytes)
            .is_some_and(|b| b <= self.remaining() as u64);
        if n > max || !fits {
            return Err(GgufError::TooMany {
                what: what(),
                count: n,
                max: max.min(self.remaining() as u64 / min_bytes.max(1)),
            });
        }
        Ok(usize::try_from(n).expect("at most the remaining bytes"))
    }
}

/// The smallest number of bytes a value of type `type_id` takes (for bounding counts).
fn min_value_bytes(type_id: u32) -> u64 {
    match type_id {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        // An array: its element type and count.
        9 => 12,
        _ => 1,
    }
}

fn read_value(
    c: &mut Cursor<'_>,
    key: &str,
    type_id: u32,
    depth: usize,
) -> Result<GgufValue, GgufError> {
    let what = || format!("metadata `{key}`");
    Ok(match type_id {
        0 => GgufValue::U8(u8::from_le_bytes(c.array(&what)?)),
        1 => GgufValue::I8(i8::from_le_bytes(c.array(&what)?)),
        2 => GgufValue::U16(u16::from_le_bytes(c.array(&what)?)),
        3 => GgufValue::I16(i16::from_le_bytes(c.array(&what)?)),
        4 => GgufValue::U32(u32::from_le_bytes(c.array(&what)?)),
        5 => GgufValue::I32(i32::from_le_bytes(c.array(&what)?)),
        6 => GgufValue::F32(f32::from_le_bytes(c.array(&what)?)),
        7 => GgufValue::Bool(read_bool(c, key)?),
        8 => GgufValue::String(c.string(&what)?),
        9 => GgufValue::Array(read_array(c, key, depth)?),
        10 => GgufValue::U64(u64::from_le_bytes(c.array(&what)?)),
        11 => GgufValue::I64(i64::from_le_bytes(c.array(&what)?)),
        12 => GgufValue::F64(f64::from_le_bytes(c.array(&what)?)),
        _ => {
            return Err(GgufError::UnknownValueType {
                key: key.into(),
                type_id,
            })
        }
    })
}

fn read_bool(c: &mut Cursor<'_>, key: &str) -> Result<bool, GgufError> {
    match c.array::<1>(&|| format!("metadata `{key}`"))?[0] {
        0 => Ok(false),
        1 => Ok(true),
        found => Err(GgufError::BadBool {
            key: key.into(),
            found,
        }),
    }
}

/// `n` fixed-size elements decoded by `f`, the count already bounded by the bytes left.
fn fixed<T, const N: usize>(
    c: &mut Cursor<'_>,
    n: usize,
    key: &str,
    f: fn([u8; N]) -> T,
) -> Result<Vec<T>, GgufError> {
    let bytes = c.take((n as u64) * N as u64, || format!("metadata `{key}`"))?;
    Ok(bytes
        .chunks_exact(N)
        .map(|b| f(b.try_into().expect("N bytes")))
        .collect())
}

fn read_array(c: &mut Cursor<'_>, key: &str, depth: usize) -> Result<GgufArray, GgufError> {
    if depth >= MAX_NESTING {
        return Err(GgufError::NestedTooDeep { key: key.into() });
    }
    let what = || format!("metadata `{key}`");
    let type_id = c.u32(&what)?;
    if !(0..=12).contains(&type_id) {
        return Err(GgufError::UnknownValueType {
            key: key.into(),
            type_id,
        });
    }
    let n = c.count(min_value_bytes(type_id), u64::MAX, &|| {
        format!("metadata `{key}` (array)")
    })?;
    Ok(match type_id {
        0 => GgufArray::U8(fixed(c, n, key, u8::from_le_bytes)?),
        1 => GgufArray::I8(fixed(c, n, key, i8::from_le_bytes)?),
        2 => GgufArray::U16(fixed(c, n, key, u16::from_le_bytes)?),
        3 => GgufArray::I16(fixed(c, n, key, i16::from_le_bytes)?),
        4 => GgufArray::U32(fixed(c, n, key, u32::from_le_bytes)?),
        5 => GgufArray::I32(fixed(c, n, key, i32::from_le_bytes)?),
        6 => GgufArray::F32(fixed(c, n, key, f32::from_le_bytes)?),
        10 => GgufArray::U64(fixed(c, n, key, u64::from_le_bytes)?),
        11 => GgufArray::I64(fixed(c, n, key, i64::from_le_bytes)?),
        12 => GgufArray::F64(fixed(c, n, key, f64::from_le_bytes)?),
        7 => GgufArray::Bool(
            (0..n)
                .map(|_| read_bool(c, key))
                .collect::<Result<_, _>>()?,
        ),
        8 => GgufArray::String(
            (0..n)
                .map(|i| c.string(&|| format!("metadata `{key}`[{i}]")))
                .collect::<Result<_, _>>()?,
        ),
        9 => GgufArray::Array(
            (0..n)
                .map(|_| read_array(c, key, depth + 1))
                .collect::<Result<_, _>>()?,
        ),
        _ => unreachable!("checked above"),
    })
}

/// One tensor table entry, before its offset is placed in the data section.
struct Entry {
    name: String,
    ggml_type: GgmlType,
    dims: Vec<usize>,
    offset: u64,
    bytes: usize,
}

fn read_entry(c: &mut Cursor<'_>, i: usize) -> Result<Entry, GgufError> {
    let name = c.string(&|| format!("the name of tensor {i}"))?;
    let what = || format!("tensor `{name}`");
    let rank = c.u32(&what)?;
    let bad = |reason: String| GgufError::BadShape {
        tensor: name.clone(),
        reason,
    };
    if rank as usize > MAX_DIMS {
        return Err(bad(format!("{rank} dims, more than {MAX_DIMS}")));
    }
    let mut dims = Vec::with_capacity(rank as usize);
    for _ in 0..rank {
        let d = c.u64(&what)?;
        dims.push(usize::try_from(d).map_err(|_| bad(format!("dim {d} overflows")))?);
    }
    let type_id = c.u32(&what)?;
    let offset = c.u64(&what)?;
    let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownTensorType {
        tensor: name.clone(),
        type_id,
        ggml_name: ggml_type_name(type_id).unwrap_or("unknown"),
    })?;
    let elements = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| bad(format!("dims {dims:?} overflow")))?;
    // Blocks run along the row, so the row must be whole blocks.
    let row = dims.first().copied().unwrap_or(1);
    if !row.is_multiple_of(ggml_type.block_elements()) {
        return Err(bad(format!(
            "rows of {row} values are not whole {ggml_type} blocks of {}",
            ggml_type.block_elements()
        )));
    }
    let bytes = ggml_type
        .bytes_for(elements)
        .ok_or_else(|| bad(format!("{elements} {ggml_type} values overflow")))?;
    Ok(Entry {
        name,
        ggml_type,
        dims,
        offset,
        bytes,
    })
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

/// No two tensors share a byte (gaps are alignment padding, and allowed).
fn check_overlaps(
    tensors: &BTreeMap<String, GgufTensor>,
    data_start: usize,
) -> Result<(), GgufError> {
    let mut ranges: Vec<(&String, &GgufTensor)> =
        tensors.iter().filter(|(_, t)| t.end > t.start).collect();
    ranges.sort_by_key(|(_, t)| (t.start, t.end));
    for w in ranges.windows(2) {
        let ((prev, p), (name, t)) = (w[0], w[1]);
        if t.start < p.end {
            return Err(GgufError::Overlap {
                tensor: name.clone(),
                other: prev.clone(),
                start: t.start - data_start,
                end: t.end - data_start,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF file built field by field, so a test can write exactly the bytes it means.
    #[derive(Default)]
    struct Writer {
        b: Vec<u8>,
    }

    impl Writer {
        fn u32(mut self, v: u32) -> Self {
            self.b.extend(v.to_le_bytes());
            self
        }
        fn u64(mut self, v: u64) -> Self {
            self.b.extend(v.to_le_bytes());
            self
        }
        fn str(self, s: &str) -> Self {
            self.bytes_str(s.as_bytes())
        }
        fn bytes_str(mut self, s: &[u8]) -> Self {
            self.b.extend((s.len() as u64).to_le_bytes());
            self.b.extend(s);
            self
        }
        fn raw(mut self, bytes: &[u8]) -> Self {
            self.b.extend(bytes);
            self
        }
        fn header(version: u32, tensors: u64, keys: u64) -> Self {
            Writer::default()
                .raw(b"GGUF")
                .u32(version)
                .u64(tensors)
                .u64(keys)
        }
        fn kv_u32(self, k: &str, v: u32) -> Self {
            self.str(k).u32(4).u32(v)
        }
        fn tensor(self, name: &str, dims: &[u64], ty: u32, offset: u64) -> Self {
            let mut w = self.str(name).u32(dims.len() as u32);
            for &d in dims {
                w = w.u64(d);
            }
            w.u32(ty).u64(offset)
        }
        /// Pads to `align` then appends `data`.
        fn data(mut self, align: usize, data: &[u8]) -> Self {
            while !self.b.len().is_multiple_of(align) {
                self.b.push(0);
            }
            self.b.extend(data);
            self
        }
    }

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rocmforge-gguf-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn open_bytes(d: &Path, bytes: &[u8]) -> Result<Gguf, ModelError> {
        let p = d.join("m.gguf");
        std::fs::write(&p, bytes).unwrap();
        Gguf::open(&p)
    }

    fn error_of(d: &Path, bytes: &[u8]) -> GgufError {
        match open_bytes(d, bytes) {
            Err(ModelError::Gguf { error, .. }) => error,
            Err(e) => panic!("not a GGUF error: {e}"),
            Ok(_) => panic!("opened"),
        }
    }

    /// Two tensors (an F32 [2, 3] and a Q8_0 [32]) and a few typed keys, alignment 32.
    fn good() -> Vec<u8> {
        let f: Vec<u8> = (0..6)
            .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
            .collect();
        let mut q = vec![0x00, 0x3c]; // d = 1.0
        q.extend((0..32).map(|j: i32| (j - 16) as i8 as u8));
        let mut data = f.clone();
        data.resize(32, 0);
        data.extend(&q);
        Writer::header(3, 2, 4)
            .kv_u32("llama.block_count", 30)
            .str("general.name")
            .u32(8)
            .str("tiny")
            .str("tokenizer.ggml.tokens")
            .u32(9)
            .u32(8)
            .u64(2)
            .str("a")
            .str("b")
            .str("flag")
            .u32(7)
            .raw(&[1])
            .tensor("t.f32", &[3, 2], 0, 0)
            .tensor("t.q8", &[32], 8, 32)
            .data(32, &data)
            .b
    }

    #[test]
    fn a_small_file_reads_back_its_metadata_and_tensors() {
        let d = dir("good");
        let g = open_bytes(&d, &good()).unwrap();
        assert_eq!((g.version, g.alignment), (3, 32));
        assert_eq!(g.u32("llama.block_count").unwrap(), 30);
        assert_eq!(g.str("general.name").unwrap(), "tiny");
        assert_eq!(g.strings("tokenizer.ggml.tokens").unwrap(), ["a", "b"]);
        assert!(g.bool("flag").unwrap());
        assert!(matches!(
            g.u32("general.name"),
            Err(ModelError::Gguf {
                error: GgufError::KeyType { .. },
                ..
            })
        ));
        assert!(matches!(
            g.f32("nope"),
            Err(ModelError::Gguf {
                error: GgufError::MissingKey { .. },
                ..
            })
        ));
        let t = g.tensor("t.f32", &[2, 3], DType::F32).unwrap();
        assert_eq!(t.to_f64_vec(), [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]);
        assert!(matches!(
            g.tensor("t.f32", &[3, 2], DType::F32),
            Err(ModelError::TensorShape { .. })
        ));
        let q = g.dequantize("t.q8").unwrap();
        assert_eq!(q, (0..32).map(|j| (j - 16) as f32).collect::<Vec<_>>());
        assert_eq!(g.tensor_names().collect::<Vec<_>>(), ["t.f32", "t.q8"]);
        // Version 2 has the same layout.
        let mut v2 = good();
        v2[4] = 2;
        assert!(open_bytes(&d, &v2).is_ok());
        std::fs::remove_dir_all(&d).ok();
    }

    /// Hand-made malformed files: each a typed error naming what is wrong, none a panic or a
    /// huge allocation (counts are bounded by the bytes present before anything is reserved).
    #[test]
    fn malformed_files_give_typed_errors() {
        let d = dir("bad");
        let good = good();
        let tensor_file = |name: &str, dims: &[u64], ty: u32, offset: u64, data: usize| {
            Writer::header(3, 1, 0)
                .tensor(name, dims, ty, offset)
                .data(32, &vec![0u8; data])
                .b
        };
        type Check = fn(&GgufError) -> bool;
        let cases: Vec<(&str, Vec<u8>, Check)> = vec![
            ("empty", vec![], |e| matches!(e, GgufError::BadMagic { .. })),
            ("magic", b"GGML\x03\0\0\0".to_vec(), |e| {
                matches!(e, GgufError::BadMagic { .. })
            }),
            ("version 1", Writer::header(1, 0, 0).b, |e| {
                matches!(e, GgufError::UnsupportedVersion { version: 1 })
            }),
            ("version 4", Writer::header(4, 0, 0).b, |e| {
                matches!(e, GgufError::UnsupportedVersion { version: 4 })
            }),
            ("truncated header", good[..14].to_vec(), |e| {
                matches!(e, GgufError::Truncated { .. })
            }),
            ("truncated metadata", good[..60].to_vec(), |e| {
                matches!(e, GgufError::Truncated { .. })
            }),
            (
                "truncated data",
                good[..good.len() - 1].to_vec(),
                |e| matches!(e, GgufError::OutOfRange { tensor, .. } if tensor == "t.q8"),
            ),
            ("huge tensor count", Writer::header(3, u64::MAX, 0).b, |e| {
                matches!(
                    e,
                    GgufError::TooMany {
                        count: u64::MAX,
                        ..
                    }
                )
            }),
            ("huge key count", Writer::header(3, 0, 1 << 40).b, |e| {
                matches!(e, GgufError::TooMany { .. })
            }),
            (
                "huge array",
                Writer::header(3, 0, 1)
                    .str("a")
                    .u32(9)
                    .u32(8)
                    .u64(1 << 61)
                    .b,
                |e| matches!(e, GgufError::TooMany { .. }),
            ),
            (
                "huge string",
                Writer::header(3, 0, 1).str("s").u32(8).u64(u64::MAX).b,
                |e| matches!(e, GgufError::Truncated { need: u64::MAX, .. }),
            ),
            (
                "unknown value type",
                Writer::header(3, 0, 1).str("k").u32(13).u32(0).b,
                |e| matches!(e, GgufError::UnknownValueType { type_id: 13, .. }),
            ),
            (
                "unknown array element type",
                Writer::header(3, 0, 1).str("k").u32(9).u32(99).u64(0).b,
                |e| matches!(e, GgufError::UnknownValueType { type_id: 99, .. }),
            ),
            (
                "nested too deep",
                {
                    let mut w = Writer::header(3, 0, 1).str("k").u32(9);
                    for _ in 0..6 {
                        w = w.u32(9).u64(1);
                    }
                    w.b
                },
                |e| matches!(e, GgufError::NestedTooDeep { .. }),
            ),
            (
                "bad bool",
                Writer::header(3, 0, 1).str("k").u32(7).raw(&[2]).b,
                |e| matches!(e, GgufError::BadBool { found: 2, .. }),
            ),
            (
                "bad utf-8 key",
                Writer::header(3, 0, 1)
                    .bytes_str(b"\xff\xfe")
                    .u32(4)
                    .u32(0)
                    .b,
                |e| matches!(e, GgufError::BadUtf8 { .. }),
            ),
            (
                "bad utf-8 value",
                Writer::header(3, 0, 1)
                    .str("k")
                    .u32(8)
                    .bytes_str(b"a\xc0")
                    .b,
                |e| matches!(e, GgufError::BadUtf8 { .. }),
            ),
            (
                "duplicate key",
                Writer::header(3, 0, 2).kv_u32("k", 1).kv_u32("k", 2).b,
                |e| matches!(e, GgufError::DuplicateKey { key } if key == "k"),
            ),
            (
                "alignment not a power of two",
                Writer::header(3, 0, 1).kv_u32("general.alignment", 24).b,
                |e| matches!(e, GgufError::BadAlignment { value: 24 }),
            ),
            (
                "alignment zero",
                Writer::header(3, 0, 1).kv_u32("general.alignment", 0).b,
                |e| matches!(e, GgufError::BadAlignment { value: 0 }),
            ),
            (
                "alignment of the wrong type",
                Writer::header(3, 0, 1)
                    .str("general.alignment")
                    .u32(8)
                    .str("32")
                    .b,
                |e| matches!(e, GgufError::KeyType { .. }),
            ),
            (
                "a ggml type not run",
                tensor_file("t", &[256], 23, 0, 256),
                |e| {
                    matches!(e, GgufError::UnknownTensorType { type_id: 23, ggml_name: "IQ4_XS", tensor } if tensor == "t")
                        && e.to_string().contains("`t`: ggml type IQ4_XS (id 23)")
                },
            ),
            (
                "an id ggml does not define",
                tensor_file("t", &[32], 99, 0, 256),
                |e| {
                    matches!(
                        e,
                        GgufError::UnknownTensorType {
                            type_id: 99,
                            ggml_name: "unknown",
                            ..
                        }
                    )
                },
            ),
            (
                "too many dims",
                tensor_file("t", &[1, 1, 1, 1, 1], 0, 0, 4),
                |e| matches!(e, GgufError::BadShape { .. }),
            ),
            (
                "dims overflow",
                tensor_file("t", &[1 << 40, 1 << 40], 0, 0, 4),
                |e| matches!(e, GgufError::BadShape { .. }),
            ),
            ("partial block", tensor_file("t", &[48], 3, 0, 64), |e| {
                matches!(e, GgufError::BadShape { .. })
            }),
            ("misaligned offset", tensor_file("t", &[1], 0, 4, 8), |e| {
                matches!(e, GgufError::Misaligned { offset: 4, .. })
            }),
            (
                "offset past the end",
                tensor_file("t", &[1], 0, 64, 32),
                |e| matches!(e, GgufError::OutOfRange { start: 64, .. }),
            ),
            (
                "offset overflows",
                tensor_file("t", &[8], 0, u64::MAX - 31, 32),
                |e| matches!(e, GgufError::OutOfRange { .. }),
            ),
            (
                "overlapping tensors",
                Writer::header(3, 2, 0)
                    .tensor("a", &[16], 0, 0)
                    .tensor("b", &[16], 0, 32)
                    .data(32, &[0u8; 128])
                    .b,
                |e| matches!(e, GgufError::Overlap { tensor, other, .. } if tensor == "b" && other == "a"),
            ),
            (
                "duplicate tensor",
                Writer::header(3, 2, 0)
                    .tensor("a", &[4], 0, 0)
                    .tensor("a", &[4], 0, 32)
                    .data(32, &[0u8; 64])
                    .b,
                |e| matches!(e, GgufError::DuplicateTensor { name } if name == "a"),
            ),
        ];
        for (name, bytes, check) in cases {
            let e = error_of(&d, &bytes);
            assert!(check(&e), "{name}: {e}");
        }
        std::fs::remove_dir_all(&d).ok();
    }

    #[test]
    fn special_files_are_not_models() {
        let d = dir("special");
        let fifo = d.join("fifo.gguf");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        for p in [fifo.as_path(), Path::new("/dev/zero"), d.as_path()] {
            assert!(matches!(
                Gguf::open(p),
                Err(ModelError::File(crate::ir::FileError::NotRegular { .. }))
            ));
        }
        std::fs::remove_dir_all(&d).ok();
    }
}
