//! GGUF metadata: the typed values (`GgufValue`, `GgufArray`) and how each is read, counts
//! bounded by the bytes left and arrays nested at most `MAX_NESTING` deep.

use super::cursor::Cursor;
use super::{GgufError, MAX_NESTING};

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

/// The smallest number of bytes a value of type `type_id` takes (for bounding counts).
pub(super) fn min_value_bytes(type_id: u32) -> u64 {
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

pub(super) fn read_value(
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

pub(super) fn read_bool(c: &mut Cursor<'_>, key: &str) -> Result<bool, GgufError> {
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
pub(super) fn fixed<T, const N: usize>(
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

pub(super) fn read_array(
    c: &mut Cursor<'_>,
    key: &str,
    depth: usize,
) -> Result<GgufArray, GgufError> {
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
