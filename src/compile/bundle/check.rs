//! Opening a bundle. A bundle is user input: `plan.json` is parsed into typed structs (unknown
//! fields refused), checked against itself (ids, sizes, roles, paths, the target's table row),
//! and [`Bundle::check`] checks it against the files beside it, so that a replay never reads
//! past a file, launches a kernel with the wrong number of arguments, or opens a path the plan
//! made up. Every inconsistency is a typed error naming what is wrong.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::emit::byte_size;
use super::format::{paths, Access, BundlePlan, Role, FORMAT, FORMAT_V1};
use super::{signature, BundleError};
use crate::arch::Target;
use crate::codegen::STATUS_BYTES;
use crate::ir::file::{open_regular, read_limited, read_text};
use crate::ir::{FileLimit, Shape};

/// `plan.json` and kernel sources are text a person could read; far below these in practice.
const PLAN_LIMIT: u64 = 256 << 20;
const SOURCE_LIMIT: u64 = 64 << 20;
const CODE_OBJECT_LIMIT: u64 = 256 << 20;

/// An opened bundle whose plan is consistent with itself. The fields are private so that only
/// a checked plan is ever replayed.
#[derive(Clone, Debug)]
pub struct Bundle {
    pub(super) dir: PathBuf,
    pub(super) plan: BundlePlan,
    data_bytes: u64,
}

/// What [`Bundle::check`] looked at.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CheckReport {
    /// Launches.
    pub kernels: usize,
    /// Code-object files (one per distinct entry).
    pub code_objects: usize,
    pub buffers: usize,
    pub data_files: usize,
    pub expected_files: usize,
    pub bytes: u64,
}

fn malformed(reason: String) -> BundleError {
    BundleError::Malformed { reason }
}

/// An entry point usable as a file stem: a C identifier.
fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl Bundle {
    /// Reads and checks `dir/plan.json`; the bundle's files must hold at most `max_bytes`.
    pub fn open(dir: &Path, max_bytes: u64) -> Result<Bundle, BundleError> {
        let path = dir.join(paths::PLAN);
        let text = read_text(
            &path,
            FileLimit {
                what: "bundle plan",
                max_bytes: PLAN_LIMIT,
            },
        )?;
        let json_error = |e: serde_json::Error| BundleError::Json {
            path: path.display().to_string(),
            message: e.to_string(),
        };
        // The version first, so a future format is named as such rather than as bad fields.
        let value: serde_json::Value = serde_json::from_str(&text).map_err(json_error)?;
        match value.get("format").and_then(|f| f.as_str()) {
            Some(FORMAT | FORMAT_V1) => {}
            Some(other) => {
                return Err(BundleError::Version {
                    path: path.display().to_string(),
                    found: other.to_string(),
                })
            }
            None => {
                return Err(BundleError::Json {
                    path: path.display().to_string(),
                    message: "no `format` string".into(),
                })
            }
        }
        let plan: BundlePlan = serde_json::from_value(value).map_err(json_error)?;
        let data_bytes = validate(&plan)?;
        if data_bytes > max_bytes {
            return Err(BundleError::TooLarge {
                bytes: data_bytes,
                limit: max_bytes,
            });
        }
        Ok(Bundle {
            dir: dir.to_path_buf(),
            plan,
            data_bytes,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn plan(&self) -> &BundlePlan {
        &self.plan
    }

    /// Bytes of the data and expected files the buffer table promises.
    pub fn data_bytes(&self) -> u64 {
        self.data_bytes
    }

    fn buffer(&self, id: usize) -> Result<&super::format::BundleBuffer, BundleError> {
        self.plan
            .buffers
            .get(id)
            .ok_or_else(|| malformed(format!("no buffer {id}")))
    }

    fn file(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    /// Checks every file the plan names: present, a regular file, of the size the buffer table
    /// says; each source declares its entry with the parameters the plan binds. Reads no
    /// buffer data.
    pub fn check(&self) -> Result<CheckReport, BundleError> {
        let plan = &self.plan;
        let mut report = CheckReport {
            kernels: plan.kernels.len(),
            code_objects: 0,
            buffers: plan.buffers.len(),
            data_files: 0,
            expected_files: 0,
            bytes: 0,
        };
        // Identical kernels share an entry: its files are read once.
        let mut declared: HashMap<&str, Vec<(String, Access)>> = HashMap::new();
        for k in &plan.kernels {
            if !declared.contains_key(k.entry.as_str()) {
                let source = self.source(&k.entry)?;
                let params = signature::parameters(&source, &k.entry)
                    .map_err(|why| malformed(format!("{}: {why}", k.source)))?;
                if let Some(co) = &k.code_object {
                    let (_, size) = open_regular(&self.file(co), code_object_limit())?;
                    report.code_objects += 1;
                    report.bytes = report.bytes.saturating_add(size);
                }
                declared.insert(&k.entry, params);
            }
            let params = &declared[k.entry.as_str()];
            let recorded: Vec<(String, Access)> =
                k.args.iter().map(|a| (a.ctype.clone(), a.access)).collect();
            if *params != recorded {
                return Err(malformed(format!(
                    "kernel {} declares parameters {params:?} in {}, but plan.json binds {recorded:?}",
                    k.entry, k.source
                )));
            }
        }
        for b in &plan.buffers {
            for (rel, count) in [
                (&b.data, &mut report.data_files),
                (&b.expected, &mut report.expected_files),
            ] {
                if let Some(rel) = rel {
                    self.check_size(rel, b.bytes)?;
                    *count += 1;
                    report.bytes = report.bytes.saturating_add(b.bytes);
                }
            }
        }
        Ok(report)
    }

    /// The full source of kernel `entry`.
    pub fn source(&self, entry: &str) -> Result<String, BundleError> {
        Ok(read_text(
            &self.file(&paths::source(entry)),
            FileLimit {
                what: "kernel source",
                max_bytes: SOURCE_LIMIT,
            },
        )?)
    }

    /// The code object of kernel `entry`, if the bundle has one.
    pub fn code_object(&self, entry: &str) -> Result<Option<Vec<u8>>, BundleError> {
        let Some(kind) = self.plan.compiler.code_object else {
            return Ok(None);
        };
        Ok(Some(read_limited(
            &self.file(&paths::code_object(entry, kind)),
            code_object_limit(),
        )?))
    }

    /// Refuses a file the buffer table sizes unless it is a regular file of exactly `bytes`.
    fn check_size(&self, rel: &str, bytes: u64) -> Result<(), BundleError> {
        let path = self.file(rel);
        let any = FileLimit {
            what: "buffer file",
            max_bytes: u64::MAX,
        };
        let (_, found) = open_regular(&path, any)?;
        if found != bytes {
            return Err(BundleError::Size {
                path: path.display().to_string(),
                expected: bytes,
                found,
            });
        }
        Ok(())
    }

    /// The bytes of a file the buffer table sizes, refused unless it has exactly `bytes`.
    fn sized(&self, rel: &str, bytes: u64) -> Result<Vec<u8>, BundleError> {
        let path = self.file(rel);
        let what = FileLimit {
            what: "buffer file",
            max_bytes: bytes,
        };
        let data = read_limited(&path, what).map_err(|e| match e {
            crate::ir::FileError::TooLarge { size, .. } => BundleError::Size {
                path: path.display().to_string(),
                expected: bytes,
                found: size,
            },
            other => other.into(),
        })?;
        if data.len() as u64 != bytes {
            return Err(BundleError::Size {
                path: path.display().to_string(),
                expected: bytes,
                found: data.len() as u64,
            });
        }
        Ok(data)
    }

    /// The contents of an input, weight or constant buffer.
    pub fn data(&self, id: usize) -> Result<Vec<u8>, BundleError> {
        let b = self.buffer(id)?;
        let rel = b
            .data
            .as_ref()
            .ok_or_else(|| malformed(format!("buffer {id} has no data file")))?;
        self.sized(rel, b.bytes)
    }

    /// The interpreter's value of a computed buffer, where the bundle has one.
    pub fn expected(&self, id: usize) -> Result<Option<Vec<u8>>, BundleError> {
        let b = self.buffer(id)?;
        b.expected
            .as_ref()
            .map(|rel| self.sized(rel, b.bytes))
            .transpose()
    }
}

fn code_object_limit() -> FileLimit {
    FileLimit {
        what: "code object",
        max_bytes: CODE_OBJECT_LIMIT,
    }
}

/// Checks the plan against itself; returns the bytes its data and expected files hold.
fn validate(plan: &BundlePlan) -> Result<u64, BundleError> {
    let t = &plan.target;
    let target = Target::parse(&t.arch).map_err(|e| malformed(format!("target: {e}")))?;
    if target.processor != t.processor
        || target.wave_size != t.wave_size
        || super::format::Vendor::from(target.platform) != t.vendor
    {
        return Err(malformed(format!(
            "target {} is processor {}, wave size {}, vendor {:?}; plan.json says {}, {}, {:?}",
            t.arch,
            target.processor,
            target.wave_size,
            super::format::Vendor::from(target.platform),
            t.processor,
            t.wave_size,
            t.vendor
        )));
    }
    let c = &plan.compiler;
    if c.name.is_some() != c.code_object.is_some() {
        return Err(malformed(
            "compiler: a name and a code-object kind go together".into(),
        ));
    }
    let n = plan.buffers.len();
    let mut bytes = 0u64;
    for (i, b) in plan.buffers.iter().enumerate() {
        let at = |what: String| malformed(format!("buffer {i}: {what}"));
        if b.id != i {
            return Err(at(format!("its id is {}; ids must count up from 0", b.id)));
        }
        if plan.format == FORMAT_V1
            && matches!(b.role, Role::State | Role::Quantized | Role::Counters)
        {
            return Err(at(format!(
                "role {} is not part of format {FORMAT_V1}",
                b.role.name()
            )));
        }
        // A quantized buffer holds blocks: its size is the scheme's for the shape.
        let size = match (b.role, b.quant) {
            (Role::Quantized, Some(scheme)) => {
                let (_, n) = scheme
                    .layout(&Shape::new(b.shape.clone()))
                    .map_err(|e| at(e.to_string()))?;
                u64::try_from(n).ok()
            }
            (Role::Quantized, None) => {
                return Err(at("a quantized buffer names its scheme (`quant`)".into()))
            }
            (_, Some(scheme)) => {
                return Err(at(format!(
                    "a buffer of role {} holds no {scheme} blocks",
                    b.role.name()
                )))
            }
            (_, None) => byte_size(b.dtype, &b.shape),
        }
        .ok_or_else(|| at(format!("shape {:?} is too large to address", b.shape)))?;
        if size != b.bytes {
            return Err(at(format!(
                "{} {:?} is {size} bytes, not {}",
                b.dtype, b.shape, b.bytes
            )));
        }
        if b.role == Role::Status && b.bytes != STATUS_BYTES as u64 {
            return Err(at(format!("a status buffer has {STATUS_BYTES} bytes")));
        }
        let want_data = b.role.is_data().then(|| paths::data(i));
        if b.data != want_data {
            return Err(at(format!(
                "a buffer of role {} has data file {want_data:?}, not {:?}",
                b.role.name(),
                b.data
            )));
        }
        if let Some(e) = &b.expected {
            if !b.role.is_computed() || *e != paths::expected(i) {
                return Err(at(format!(
                    "expected file {e:?}: only computed buffers have one, at {}",
                    paths::expected(i)
                )));
            }
        }
        if b.role == Role::State && b.expected != Some(paths::expected(i)) {
            return Err(at(format!(
                "a state has its value after the run at {}",
                paths::expected(i)
            )));
        }
        let files = u64::from(b.data.is_some()) + u64::from(b.expected.is_some());
        bytes = b
            .bytes
            .checked_mul(files)
            .and_then(|add| bytes.checked_add(add))
            .ok_or_else(|| at("the bundle's size overflows".into()))?;
    }
    for (i, k) in plan.kernels.iter().enumerate() {
        let at = |what: String| malformed(format!("kernel {i}: {what}"));
        if !is_identifier(&k.entry) {
            return Err(at(format!("entry {:?} is not a C identifier", k.entry)));
        }
        if k.source != paths::source(&k.entry) {
            return Err(at(format!(
                "source {:?} must be {}",
                k.source,
                paths::source(&k.entry)
            )));
        }
        let want = c.code_object.map(|kind| paths::code_object(&k.entry, kind));
        if k.code_object != want {
            return Err(at(format!(
                "code object {:?} must be {want:?}",
                k.code_object
            )));
        }
        for a in &k.args {
            let b = plan.buffers.get(a.buffer).ok_or_else(|| {
                at(format!(
                    "argument buffer {} is not in the table ({n})",
                    a.buffer
                ))
            })?;
            if a.access == Access::Write && !b.role.is_written() {
                return Err(at(format!(
                    "writes buffer {}, of role {}",
                    a.buffer,
                    b.role.name()
                )));
            }
        }
    }
    for o in &plan.outputs {
        let b = plan.buffers.get(o.buffer).ok_or_else(|| {
            malformed(format!(
                "output buffer {} is not in the table ({n})",
                o.buffer
            ))
        })?;
        if byte_size(o.dtype, &o.shape) != Some(b.bytes) {
            return Err(malformed(format!(
                "output viewed as {} {:?} does not have the {} bytes of buffer {}",
                o.dtype, o.shape, b.bytes, o.buffer
            )));
        }
    }
    for ch in &plan.checks {
        if plan.buffers.get(ch.status).map(|b| b.role) != Some(Role::Status) {
            return Err(malformed(format!(
                "check of {:?} reads buffer {}, which is not a status buffer",
                ch.node, ch.status
            )));
        }
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_c_identifiers_name_kernel_files() {
        for ok in ["rf_matmul_0123abcd", "_k", "K9"] {
            assert!(is_identifier(ok), "{ok}");
        }
        for bad in ["", "9k", "../x", "a/b", "a.b", "rf x", "é"] {
            assert!(!is_identifier(bad), "{bad}");
        }
    }
}
