//! Resource usage of AMD code objects: the `NT_AMDGPU_METADATA` note of the ELF file hiprtc
//! returns is a msgpack map with, per kernel, its VGPRs, AGPRs, SGPRs, LDS, scratch and spills.
//! Both readers check every length against the input, so truncated or corrupt input is a typed
//! error, never a panic.

use std::fmt::Write;

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum MetadataError {
    #[error("not an ELF64 little-endian file")]
    NotElf,
    #[error("the code object is truncated or corrupt: {0}")]
    Truncated(String),
    #[error("the code object has no NT_AMDGPU_METADATA note")]
    NoMetadata,
    #[error("bad msgpack in the metadata note at byte {offset}: {reason}")]
    Msgpack { offset: usize, reason: String },
    #[error("kernel metadata lacks `{field}`")]
    MissingField { field: String },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelResources {
    pub name: String,
    pub vgprs: u64,
    pub agprs: u64,
    pub sgprs: u64,
    pub lds_bytes: u64,
    pub scratch_bytes: u64,
    pub vgpr_spills: u64,
    pub sgpr_spills: u64,
    pub wave_size: u64,
}

impl KernelResources {
    pub fn spills(&self) -> bool {
        self.vgpr_spills > 0 || self.sgpr_spills > 0 || self.scratch_bytes > 0
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct CodeObjectInfo {
    /// `amdhsa.target`, e.g. `amdgcn-amd-amdhsa--gfx90a`.
    pub target: String,
    pub kernels: Vec<KernelResources>,
}

fn read<const N: usize>(b: &[u8], at: usize, what: &str) -> Result<[u8; N], MetadataError> {
    b.get(
        at..at
            .checked_add(N)
            .ok_or_else(|| MetadataError::Truncated(what.into()))?,
    )
    .and_then(|s| s.try_into().ok())
    .ok_or_else(|| MetadataError::Truncated(format!("{what} at byte {at}")))
}
fn u16_at(b: &[u8], at: usize, what: &str) -> Result<u64, MetadataError> {
    Ok(u64::from(u16::from_le_bytes(read(b, at, what)?)))
}
fn u32_at(b: &[u8], at: usize, what: &str) -> Result<u64, MetadataError> {
    Ok(u64::from(u32::from_le_bytes(read(b, at, what)?)))
}
fn u64_at(b: &[u8], at: usize, what: &str) -> Result<u64, MetadataError> {
    Ok(u64::from_le_bytes(read(b, at, what)?))
}
fn span<'a>(b: &'a [u8], at: u64, len: u64, what: &str) -> Result<&'a [u8], MetadataError> {
    let (s, e) = (
        usize::try_from(at).ok(),
        at.checked_add(len).and_then(|e| usize::try_from(e).ok()),
    );
    match (s, e) {
        (Some(s), Some(e)) if e <= b.len() => Ok(&b[s..e]),
        _ => Err(MetadataError::Truncated(format!(
            "{what} ({len} bytes at {at}) past the end ({} bytes)",
            b.len()
        ))),
    }
}

/// The metadata note's payload.
fn metadata_note(b: &[u8]) -> Result<&[u8], MetadataError> {
    if b.len() < 6 || b[..4] != [0x7f, b'E', b'L', b'F'] || b[4] != 2 || b[5] != 1 {
        return Err(MetadataError::NotElf);
    }
    let shoff = u64_at(b, 0x28, "section header offset")?;
    let shentsize = u16_at(b, 0x3a, "section header size")?;
    let shnum = u16_at(b, 0x3c, "section count")?;
    if shentsize < 0x28 {
        return Err(MetadataError::Truncated(format!(
            "section header size {shentsize}"
        )));
    }
    for i in 0..shnum {
        let hdr = span(
            b,
            shoff.saturating_add(i * shentsize),
            shentsize,
            "section header",
        )?;
        if u32_at(hdr, 4, "section type")? != 7 {
            continue; // not SHT_NOTE
        }
        let notes = span(
            b,
            u64_at(hdr, 0x18, "section offset")?,
            u64_at(hdr, 0x20, "section size")?,
            "note section",
        )?;
        let mut at = 0usize;
        while at + 12 <= notes.len() {
            let (namesz, descsz, ty) = (
                u32_at(notes, at, "note")?,
                u32_at(notes, at + 4, "note")?,
                u32_at(notes, at + 8, "note")?,
            );
            let name_at = at as u64 + 12;
            let desc_at = name_at + namesz.div_ceil(4) * 4;
            let name = span(notes, name_at, namesz, "note name")?;
            let desc = span(notes, desc_at, descsz, "note payload")?;
            if ty == 32 && name.starts_with(b"AMDGPU") {
                return Ok(desc);
            }
            at = usize::try_from(desc_at + descsz.div_ceil(4) * 4)
                .map_err(|_| MetadataError::Truncated("note".into()))?;
        }
    }
    Err(MetadataError::NoMetadata)
}

#[derive(Debug, Clone, PartialEq)]
enum Msg {
    Nil,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Bin(usize),
    Array(Vec<Msg>),
    Map(Vec<(Msg, Msg)>),
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn err<T>(&self, reason: &str) -> Result<T, MetadataError> {
        Err(MetadataError::Msgpack {
            offset: self.at,
            reason: reason.into(),
        })
    }
    fn take(&mut self, n: usize) -> Result<&[u8], MetadataError> {
        match self.at.checked_add(n) {
            Some(end) if end <= self.b.len() => {
                let s = &self.b[self.at..end];
                self.at = end;
                Ok(s)
            }
            _ => self.err("truncated"),
        }
    }
    fn uint(&mut self, n: usize) -> Result<u64, MetadataError> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |acc, &x| (acc << 8) | u64::from(x)))
    }
    fn value(&mut self, depth: usize) -> Result<Msg, MetadataError> {
        if depth > 32 {
            return self.err("nested too deep");
        }
        let tag = self.take(1)?[0];
        let len = |r: &mut Self, n: usize| r.uint(n).map(|v| v as usize);
        Ok(match tag {
            0x00..=0x7f => Msg::Int(i128::from(tag)),
            0xe0..=0xff => Msg::Int(i128::from(tag as i8)),
            0x80..=0x8f => self.map(usize::from(tag & 0x0f), depth)?,
            0x90..=0x9f => self.array(usize::from(tag & 0x0f), depth)?,
            0xa0..=0xbf => self.string(usize::from(tag & 0x1f))?,
            0xc0 => Msg::Nil,
            0xc2 => Msg::Bool(false),
            0xc3 => Msg::Bool(true),
            0xc4..=0xc6 => {
                let n = len(self, 1 << (tag - 0xc4))?;
                self.take(n)?;
                Msg::Bin(n)
            }
            0xca => Msg::Float(f64::from(f32::from_bits(self.uint(4)? as u32))),
            0xcb => Msg::Float(f64::from_bits(self.uint(8)?)),
            0xcc..=0xcf => Msg::Int(i128::from(self.uint(1 << (tag - 0xcc))?)),
            0xd0 => Msg::Int(i128::from(self.uint(1)? as u8 as i8)),
            0xd1 => Msg::Int(i128::from(self.uint(2)? as u16 as i16)),
            0xd2 => Msg::Int(i128::from(self.uint(4)? as u32 as i32)),
            0xd3 => Msg::Int(i128::from(self.uint(8)? as i64)),
            0xd9..=0xdb => {
                let n = len(self, 1 << (tag - 0xd9))?;
                self.string(n)?
            }
            0xdc | 0xdd => {
                let n = len(self, if tag == 0xdc { 2 } else { 4 })?;
                self.array(n, depth)?
            }
            0xde | 0xdf => {
                let n = len(self, if tag == 0xde { 2 } else { 4 })?;
                self.map(n, depth)?
            }
            _ => return self.err(&format!("unsupported tag 0x{tag:02x}")),
        })
    }
    fn string(&mut self, n: usize) -> Result<Msg, MetadataError> {
        Ok(Msg::Str(
            String::from_utf8_lossy(self.take(n)?).into_owned(),
        ))
    }
    fn array(&mut self, n: usize, depth: usize) -> Result<Msg, MetadataError> {
        // Each element takes at least a byte: a length beyond the input is corrupt.
        if n > self.b.len() - self.at {
            return self.err("array longer than the input");
        }
        (0..n)
            .map(|_| self.value(depth + 1))
            .collect::<Result<_, _>>()
            .map(Msg::Array)
    }
    fn map(&mut self, n: usize, depth: usize) -> Result<Msg, MetadataError> {
        if n > self.b.len() - self.at {
            return self.err("map longer than the input");
        }
        (0..n)
            .map(|_| Ok((self.value(depth + 1)?, self.value(depth + 1)?)))
            .collect::<Result<_, _>>()
            .map(Msg::Map)
    }
}

fn get<'a>(m: &'a Msg, key: &str) -> Option<&'a Msg> {
    match m {
        Msg::Map(kv) => kv
            .iter()
            .find(|(k, _)| matches!(k, Msg::Str(s) if s == key))
            .map(|(_, v)| v),
        _ => None,
    }
}

fn int(m: &Msg, key: &str) -> Result<u64, MetadataError> {
    match get(m, key) {
        Some(Msg::Int(v)) if *v >= 0 => Ok(*v as u64),
        _ => Err(MetadataError::MissingField {
            field: key.to_string(),
        }),
    }
}

/// Reads the resource usage of every kernel in an AMD code object.
pub fn parse_code_object(bytes: &[u8]) -> Result<CodeObjectInfo, MetadataError> {
    let note = metadata_note(bytes)?;
    let mut r = Reader { b: note, at: 0 };
    let root = r.value(0)?;
    let target = match get(&root, "amdhsa.target") {
        Some(Msg::Str(s)) => s.clone(),
        _ => {
            return Err(MetadataError::MissingField {
                field: "amdhsa.target".into(),
            })
        }
    };
    let Some(Msg::Array(ks)) = get(&root, "amdhsa.kernels") else {
        return Err(MetadataError::MissingField {
            field: "amdhsa.kernels".into(),
        });
    };
    let mut kernels = Vec::new();
    for k in ks {
        let name = match get(k, ".name") {
            Some(Msg::Str(s)) => s.clone(),
            _ => {
                return Err(MetadataError::MissingField {
                    field: ".name".into(),
                })
            }
        };
        kernels.push(KernelResources {
            name,
            vgprs: int(k, ".vgpr_count")?,
            agprs: int(k, ".agpr_count").unwrap_or(0),
            sgprs: int(k, ".sgpr_count")?,
            lds_bytes: int(k, ".group_segment_fixed_size")?,
            scratch_bytes: int(k, ".private_segment_fixed_size")?,
            vgpr_spills: int(k, ".vgpr_spill_count").unwrap_or(0),
            sgpr_spills: int(k, ".sgpr_spill_count").unwrap_or(0),
            wave_size: int(k, ".wavefront_size")?,
        });
    }
    Ok(CodeObjectInfo { target, kernels })
}

/// A table of kernels' resources, one line each.
pub fn report_table(rows: &[(String, KernelResources)]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<40} {:>5} {:>5} {:>5} {:>7} {:>7} {:>6} {:>6} {:>4}  node",
        "kernel", "vgpr", "agpr", "sgpr", "lds B", "scratch", "vspill", "sspill", "wave"
    );
    for (node, k) in rows {
        let _ = writeln!(
            out,
            "{:<40} {:>5} {:>5} {:>5} {:>7} {:>7} {:>6} {:>6} {:>4}  %{node}",
            k.name,
            k.vgprs,
            k.agprs,
            k.sgprs,
            k.lds_bytes,
            k.scratch_bytes,
            k.vgpr_spills,
            k.sgpr_spills,
            k.wave_size
        );
    }
    out
}
