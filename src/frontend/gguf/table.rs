//! The GGUF tensor table: each entry read and checked (rank, a supported type, rows of whole
//! blocks, sizes without overflow), and the placed ranges checked to be disjoint.

use std::collections::BTreeMap;

use super::cursor::Cursor;
use super::{GgufError, GgufTensor, MAX_DIMS};
use crate::frontend::ggml_types::{ggml_type_name, GgmlType};

/// One tensor table entry, before its offset is placed in the data section.
pub(super) struct Entry {
    pub(super) name: String,
    pub(super) ggml_type: GgmlType,
    pub(super) dims: Vec<usize>,
    pub(super) offset: u64,
    pub(super) bytes: usize,
}

pub(super) fn read_entry(c: &mut Cursor<'_>, i: usize) -> Result<Entry, GgufError> {
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

/// No two tensors share a byte (gaps are alignment padding, and allowed).
pub(super) fn check_overlaps(
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
