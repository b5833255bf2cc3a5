//! safetensors files, memory-mapped: the header is parsed and checked against the file up front,
//! tensor data is only read (and converted) when a tensor is asked for.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;
use serde_json::Value;

use super::ModelError;
use crate::ir::file::{self, FileLimit};
use crate::ir::{DType, QuantScheme, Shape, Tensor};

#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// The stored element type; for blocks (`quant`), F32, what they dequantize to.
    pub dtype: DType,
    /// The logical shape: for blocks `[rows, K]` (the file's U8 shape is `[rows, K / block
    /// elements × block bytes]`).
    pub shape: Vec<usize>,
    /// Blocks of this scheme: a U8 tensor named by a [`QUANT_KEY`] entry of the header's
    /// `__metadata__` (our convention, written by `scripts/quantize-safetensors.py`).
    pub quant: Option<QuantScheme>,
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

/// The `__metadata__` key prefix that marks a U8 tensor as blocks of a [`QuantScheme`]:
/// `"rocmforge.quant.<tensor name>": "<scheme name>"` (e.g. `mxfp6_e2m3`). The safetensors
/// format has no quantized dtypes; this is how a checkpoint quantized by
/// `scripts/quantize-safetensors.py` says what its bytes are.
pub const QUANT_KEY: &str = "rocmforge.quant.";

/// The schemes `__metadata__` marks, by tensor name: every value a string (the format's rule),
/// every marked scheme one we know.
fn quant_marks(
    path: &Path,
    metadata: Option<&Value>,
) -> Result<BTreeMap<String, QuantScheme>, ModelError> {
    let mut marks = BTreeMap::new();
    let Some(metadata) = metadata else {
        return Ok(marks);
    };
    let Value::Object(entries) = metadata else {
        return corrupt(path, "__metadata__ is not a JSON object");
    };
    for (key, value) in entries {
        let Some(value) = value.as_str() else {
            return corrupt(path, format!("__metadata__ `{key}` is not a string"));
        };
        if let Some(tensor) = key.strip_prefix(QUANT_KEY) {
            let scheme = QuantScheme::ALL
                .into_iter()
                .find(|s| s.name() == value)
                .ok_or_else(|| ModelError::Safetensors {
                    path: path.display().to_string(),
                    reason: format!(
                        "`{key}` names the block scheme `{}`, which is not one of {}",
                        value.escape_debug(),
                        QuantScheme::ALL.map(QuantScheme::name).join(", ")
                    ),
                })?;
            marks.insert(tensor.to_string(), scheme);
        }
    }
    Ok(marks)
}

/// One header entry, checked against the file: a known dtype, a shape whose bytes are exactly
/// its byte range, and a range inside the data section; a U8 tensor only as the blocks
/// `quant` says it holds, its rows whole blocks.
fn tensor_info(
    path: &Path,
    name: &str,
    v: &Value,
    data_start: usize,
    len: usize,
    quant: Option<QuantScheme>,
) -> Result<TensorInfo, ModelError> {
    let stored = v.get("dtype").and_then(Value::as_str);
    if let Some(scheme) = quant {
        if stored != Some("U8") {
            return corrupt(
                path,
                format!(
                    "`{QUANT_KEY}{name}` marks it as {scheme} blocks, but its dtype is {}, not U8",
                    v.get("dtype").unwrap_or(&Value::Null)
                ),
            );
        }
        let mut info = tensor_info(path, name, &bytes_entry(v), data_start, len, None)?;
        let (rows, row_bytes) = match info.shape[..] {
            [rows, row_bytes] => (rows, row_bytes),
            _ => {
                return corrupt(
                    path,
                    format!(
                        "tensor `{name}`: {scheme} blocks need a shape [rows, bytes], not {:?}",
                        info.shape
                    ),
                )
            }
        };
        if row_bytes % scheme.block_bytes() != 0 {
            return corrupt(
                path,
                format!(
                    "tensor `{name}`: rows of {row_bytes} bytes are not whole {scheme} blocks \
                     of {} bytes",
                    scheme.block_bytes()
                ),
            );
        }
        let k = (row_bytes / scheme.block_bytes()).checked_mul(scheme.block_elems());
        let Some(k) = k else {
            return corrupt(path, format!("tensor `{name}`: row length overflows"));
        };
        info.dtype = DType::F32;
        info.shape = vec![rows, k];
        info.quant = Some(scheme);
        return Ok(info);
    }
    if stored == Some("U8") {
        return corrupt(
            path,
            format!(
                "tensor `{name}` is U8 without a `{QUANT_KEY}{name}` entry in __metadata__: \
                 rocmforge reads U8 tensors only as quantized blocks"
            ),
        );
    }
    let dtype = stored
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
    Ok(TensorInfo {
        dtype,
        shape,
        quant: None,
        start,
        end,
    })
}

/// `v` with its dtype read as bytes (U8 is one byte, like Bool), for the size checks of blocks.
fn bytes_entry(v: &Value) -> Value {
    let mut v = v.clone();
    if let Value::Object(m) = &mut v {
        m.insert("dtype".into(), Value::String("BOOL".into()));
    }
    v
}

/// The tensors' byte ranges, in order, must cover `data_start..len` exactly once.
fn check_tiling(
    path: &Path,
    tensors: &BTreeMap<String, TensorInfo>,
    data_start: usize,
    len: usize,
) -> Result<(), ModelError> {
    let mut ranges: Vec<(&str, &TensorInfo)> =
        tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    ranges.sort_by_key(|(_, t)| (t.start, t.end));
    let rel = |at: usize| at - data_start;
    let mut covered = data_start;
    let mut last: Option<(&str, &TensorInfo)> = None;
    for (name, t) in ranges {
        if t.start < covered {
            let (prev, p) = last.expect("only a previous tensor covers bytes");
            return corrupt(
                path,
                format!(
                    "tensor `{name}` (bytes {}..{}) overlaps tensor `{prev}` (bytes {}..{})",
                    rel(t.start),
                    rel(t.end),
                    rel(p.start),
                    rel(p.end)
                ),
            );
        }
        if t.start > covered {
            return corrupt(
                path,
                format!(
                    "bytes {}..{} of the data belong to no tensor (before `{name}`)",
                    rel(covered),
                    rel(t.start)
                ),
            );
        }
        covered = t.end;
        last = Some((name, t));
    }
    if covered != len {
        return corrupt(
            path,
            format!(
                "bytes {}..{} of the data belong to no tensor (after the last one)",
                rel(covered),
                rel(len)
            ),
        );
    }
    Ok(())
}

/// Weights are memory-mapped, not read, so the limit only keeps out what no model file is.
pub const WEIGHTS_FILE: FileLimit = FileLimit {
    what: "safetensors file",
    max_bytes: 1 << 40,
};

/// The format's own bound on the JSON header (the reference implementation refuses more).
pub const MAX_HEADER_BYTES: usize = 100_000_000;

impl SafeTensors {
    /// Maps `path` (a regular file: a FIFO or device is refused unopened) and checks its header:
    /// every tensor's dtype, shape and byte range, and that the ranges tile the data section
    /// exactly, in the format's words: no overlaps and no gaps (bytes no tensor owns are how a
    /// file smuggles other content).
    pub fn open(path: &Path) -> Result<SafeTensors, ModelError> {
        let (file, _) = file::open_regular(path, WEIGHTS_FILE)?;
        let map = map_file(&file, path)?;
        let len = map.len();
        if len < 8 {
            return corrupt(path, format!("{len} bytes: too short for a header length"));
        }
        let n = u64::from_le_bytes(map[..8].try_into().expect("8 bytes"));
        let header_end = usize::try_from(n)
            .ok()
            .filter(|&n| n <= MAX_HEADER_BYTES)
            .and_then(|n| n.checked_add(8));
        let Some(data_start) = header_end.filter(|&e| e <= len) else {
            return corrupt(
                path,
                format!(
                    "header of {n} bytes runs past the end of the file ({len} bytes) or past \
                     the format's limit of {MAX_HEADER_BYTES}"
                ),
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
        let mut marks = quant_marks(path, entries.get("__metadata__"))?;
        let mut tensors = BTreeMap::new();
        for (name, v) in entries {
            if name == "__metadata__" {
                continue;
            }
            let quant = marks.remove(&name);
            let info = tensor_info(path, &name, &v, data_start, len, quant)?;
            tensors.insert(name, info);
        }
        if let Some(name) = marks.keys().next() {
            return corrupt(
                path,
                format!("`{QUANT_KEY}{name}` marks a tensor the file does not hold"),
            );
        }
        check_tiling(path, &tensors, data_start, len)?;
        Ok(SafeTensors {
            path: path.to_path_buf(),
            map,
            tensors,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// The header entry and stored bytes of tensor `name` (blocks as written, for weights kept
    /// quantized on the device).
    pub fn raw(&self, name: &str) -> Option<(&TensorInfo, &[u8])> {
        let info = self.tensors.get(name)?;
        Some((info, &self.map[info.start..info.end]))
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
        if let Some(scheme) = info.quant {
            let values = scheme
                .dequantize(bytes, &Shape::new(shape.to_vec()))
                .map_err(|e| ModelError::Safetensors {
                    path: self.path.display().to_string(),
                    reason: format!("tensor `{name}`: {e}"),
                })?;
            return Ok(Tensor::from_f32(DType::F32, shape.to_vec(), values)
                .expect("size checked when opened"));
        }
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

pub(super) fn map_file(file: &std::fs::File, path: &Path) -> Result<Mmap, ModelError> {
    // SAFETY: mapping is unsafe because the file could change under the map. Model files are
    // opened read-only and not written while rocmforge runs, and every read is bounds-checked
    // against the map's length, so a file truncated before mapping cannot be read past its end.
    // (Not FFI: the one `unsafe` outside `runtime`, kept here so `frontend` depends on `ir` only.)
    unsafe { Mmap::map(file) }.map_err(|e| ModelError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rocmforge-st-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A safetensors file: the header as given, then `data` bytes.
    fn write(path: &Path, header: &str, data: usize) {
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend(header.as_bytes());
        bytes.extend((0..data).map(|i| i as u8));
        std::fs::write(path, bytes).unwrap();
    }

    fn reason(path: &Path) -> String {
        match SafeTensors::open(path) {
            Err(ModelError::Safetensors { reason, .. }) => reason,
            Ok(_) => panic!("{}: opened", path.display()),
            Err(e) => panic!("{}: {e}", path.display()),
        }
    }

    const A: &str = r#""a":{"dtype":"F32","shape":[2],"data_offsets":"#;
    const B: &str = r#""b":{"dtype":"F16","shape":[4],"data_offsets":"#;

    #[test]
    fn ranges_that_tile_the_data_open_and_read() {
        let d = dir("tile");
        let p = d.join("ok.safetensors");
        write(
            &p,
            &format!(r#"{{"__metadata__":{{"k":"v"}},{A}[0,8]}},{B}[8,16]}}}}"#),
            16,
        );
        let st = SafeTensors::open(&p).unwrap();
        assert_eq!(st.names().collect::<Vec<_>>(), ["a", "b"]);
        let a = st.tensor("a", &[2]).unwrap().to_f64_vec();
        let want = |b: [u8; 4]| f64::from(f32::from_le_bytes(b));
        assert_eq!(a, [want([0, 1, 2, 3]), want([4, 5, 6, 7])]);
        // Zero-sized tensors take no bytes anywhere in the tiling.
        write(
            &p,
            &format!(r#"{{{A}[0,8]}},"e":{{"dtype":"F32","shape":[0],"data_offsets":[8,8]}}}}"#),
            8,
        );
        assert!(SafeTensors::open(&p).is_ok());
        std::fs::remove_dir_all(&d).ok();
    }

    #[test]
    fn overlaps_gaps_and_trailing_bytes_are_refused() {
        let d = dir("gaps");
        let p = d.join("bad.safetensors");
        for (header, data, why) in [
            (
                format!(r#"{{{A}[0,8]}},{B}[4,12]}}}}"#),
                16,
                "tensor `b` (bytes 4..12) overlaps tensor `a` (bytes 0..8)",
            ),
            (
                format!(r#"{{{A}[0,8]}},"c":{{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}}}"#),
                8,
                "overlaps",
            ),
            (
                format!(r#"{{{A}[8,16]}}}}"#),
                16,
                "bytes 0..8 of the data belong to no tensor (before `a`)",
            ),
            (
                format!(r#"{{{A}[0,8]}},{B}[12,20]}}}}"#),
                20,
                "bytes 8..12 of the data belong to no tensor (before `b`)",
            ),
            (
                format!(r#"{{{A}[0,8]}}}}"#),
                12,
                "bytes 8..12 of the data belong to no tensor (after the last one)",
            ),
            (
                format!(r#"{{{A}[0,12]}}}}"#),
                12,
                "12 bytes do not hold a f32[2]",
            ),
        ] {
            write(&p, &header, data);
            let r = reason(&p);
            assert!(r.contains(why), "{header}: {r}");
        }
        std::fs::remove_dir_all(&d).ok();
    }

    /// U8 tensors are blocks named by `__metadata__`: read back through the scheme's
    /// dequantization (a hand-made MXFP6 E2M3 block), and every way the marks and the bytes can
    /// disagree refused with the reason.
    #[test]
    fn blocks_marked_in_the_metadata_read_and_misuses_are_refused() {
        let d = dir("blocks");
        let p = d.join("q.safetensors");
        // One row of one block: scale byte 128 (2¹), code 0b0_01_000 (1.0) for every value.
        let mut block = vec![128u8];
        let word: u32 = 8 | (8 << 6) | (8 << 12) | (8 << 18);
        for _ in 0..8 {
            block.extend(&word.to_le_bytes()[..3]);
        }
        let mut bytes = {
            let header = r#"{"__metadata__":{"rocmforge.quant.w":"mxfp6_e2m3"},"w":{"dtype":"U8","shape":[1,25],"data_offsets":[0,25]}}"#;
            let mut b = (header.len() as u64).to_le_bytes().to_vec();
            b.extend(header.as_bytes());
            b
        };
        bytes.extend(&block);
        std::fs::write(&p, &bytes).unwrap();
        let st = SafeTensors::open(&p).unwrap();
        let info = st.info("w").unwrap();
        assert_eq!(
            (info.quant, info.shape.clone()),
            (Some(QuantScheme::Mxfp6E2m3), vec![1, 32])
        );
        assert_eq!(st.raw("w").unwrap().1, &block[..]);
        let t = st.tensor("w", &[1, 32]).unwrap();
        assert_eq!(t.as_f32().unwrap(), &[2.0f32; 32][..]);

        for (header, data, why) in [
            (
                r#"{"w":{"dtype":"U8","shape":[1,25],"data_offsets":[0,25]}}"#,
                25,
                "U8 without a `rocmforge.quant.w` entry",
            ),
            (
                r#"{"__metadata__":{"rocmforge.quant.w":"q9_9"},"w":{"dtype":"U8","shape":[1,25],"data_offsets":[0,25]}}"#,
                25,
                "names the block scheme `q9_9`",
            ),
            (
                r#"{"__metadata__":{"rocmforge.quant.x":"mxfp6_e2m3"},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
                4,
                "`rocmforge.quant.x` marks a tensor the file does not hold",
            ),
            (
                r#"{"__metadata__":{"rocmforge.quant.w":"mxfp6_e2m3"},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
                4,
                "its dtype is \"F32\", not U8",
            ),
            (
                r#"{"__metadata__":{"rocmforge.quant.w":"mxfp6_e2m3"},"w":{"dtype":"U8","shape":[1,24],"data_offsets":[0,24]}}"#,
                24,
                "rows of 24 bytes are not whole mxfp6_e2m3 blocks of 25 bytes",
            ),
            (
                r#"{"__metadata__":{"rocmforge.quant.w":"mxfp6_e2m3"},"w":{"dtype":"U8","shape":[25],"data_offsets":[0,25]}}"#,
                25,
                "need a shape [rows, bytes], not [25]",
            ),
            (
                r#"{"__metadata__":{"rocmforge.quant.w":7},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
                4,
                "__metadata__ `rocmforge.quant.w` is not a string",
            ),
        ] {
            write(&p, header, data);
            let r = reason(&p);
            assert!(r.contains(why), "{header}: {r}");
        }
        std::fs::remove_dir_all(&d).ok();
    }

    #[test]
    fn a_header_past_the_format_limit_is_refused_unread() {
        let d = dir("header");
        let p = d.join("big.safetensors");
        let mut bytes = ((MAX_HEADER_BYTES + 1) as u64).to_le_bytes().to_vec();
        bytes.extend(b"{}");
        std::fs::write(&p, bytes).unwrap();
        assert!(reason(&p).contains("limit of 100000000"));
        std::fs::remove_dir_all(&d).ok();
    }

    #[test]
    fn special_files_are_not_weights() {
        let d = dir("special");
        let fifo = d.join("fifo.safetensors");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        for p in [fifo.as_path(), Path::new("/dev/zero"), d.as_path()] {
            assert!(
                matches!(
                    SafeTensors::open(p),
                    Err(ModelError::File(crate::ir::FileError::NotRegular { .. }))
                ),
                "{}",
                p.display()
            );
        }
        std::fs::remove_dir_all(&d).ok();
    }
}
