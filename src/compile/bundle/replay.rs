//! Running a bundle on a device: load each kernel from the bundle's code object (or compile
//! its source), upload the data, launch the kernels in order with one buffer per id (no memory
//! reuse, so every computed buffer still holds its value at the end), then download every
//! computed buffer and compare it with the interpreter's value.

use std::collections::HashMap;

use serde::Serialize;

use super::format::{Access, CodeObjectKind, Role};
use super::{Bundle, BundleError};
use crate::arch::compiler_options;
use crate::arch::Target;
use crate::codegen::IndexCheck;
use crate::compile::compare_output;
use crate::ir::{DType, Tensor, TensorType};
use crate::runtime::device::LoadedKernel;
use crate::runtime::{parse_code_object, Device, DeviceBuffer, Stream};

#[derive(Clone, Debug, Default)]
pub struct ReplayOptions {
    /// Compile every kernel from its source with the device's own compiler, ignoring the
    /// bundle's code objects.
    pub recompile: bool,
}

/// Where a kernel's binary came from.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "from", rename_all = "snake_case")]
pub enum KernelSource {
    /// The bundle's code object, loaded as it is.
    CodeObject,
    /// The bundle's source, compiled here, and why.
    Compiled { reason: String },
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KernelReport {
    pub index: usize,
    pub entry: String,
    pub loaded: KernelSource,
}

/// One computed buffer against `expected/`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BufferReport {
    pub id: usize,
    pub name: String,
    pub dtype: DType,
    pub role: Role,
    /// The last kernel (launch index) that writes it.
    pub written_by: Option<usize>,
    /// Relative L2 error over the elements finite in both; `None` when not compared.
    pub error: Option<f64>,
    pub tolerance: f64,
    /// Elements NaN or ±inf in both, at the same places.
    pub non_finite: usize,
    pub passed: bool,
    /// Why it failed or was not compared.
    pub note: Option<String>,
}

/// A gather's index check after the run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CheckResult {
    pub node: String,
    pub status: usize,
    /// The first index found outside `0..table_rows`, if any.
    pub failed_index: Option<i64>,
}

/// The first kernel, in launch order, whose output does not match.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Mismatch {
    pub kernel: Option<usize>,
    pub entry: Option<String>,
    pub buffer: usize,
    pub name: String,
    pub reason: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReplayReport {
    pub device: String,
    pub target: String,
    pub kernels: Vec<KernelReport>,
    pub buffers: Vec<BufferReport>,
    pub checks: Vec<CheckResult>,
    pub first_mismatch: Option<Mismatch>,
    /// Every compared buffer within its tolerance and every check clean.
    pub passed: bool,
}

impl Bundle {
    /// Replays the bundle on `device` (a GPU of the bundle's processor) and compares every
    /// computed buffer with the interpreter's value.
    pub fn replay(
        &self,
        device: &Device,
        options: &ReplayOptions,
    ) -> Result<ReplayReport, BundleError> {
        self.check()?;
        let plan = &self.plan;
        let target = device_target(device, &plan.target.arch)?;
        let rt = BundleError::runtime;

        // Each entry is loaded once: identical kernels share a name.
        let mut loaded: HashMap<&str, (LoadedKernel, KernelSource)> = HashMap::new();
        for k in &plan.kernels {
            if !loaded.contains_key(k.entry.as_str()) {
                let kernel = self.load(device, &target, &k.entry, options)?;
                loaded.insert(&k.entry, kernel);
            }
        }

        let stream = device.new_stream().map_err(rt(None))?;
        let bufs = self.allocate(&stream)?;
        let mut written_by: Vec<Option<usize>> = vec![None; plan.buffers.len()];
        for (i, k) in plan.kernels.iter().enumerate() {
            let args: Vec<&DeviceBuffer> = k.args.iter().map(|a| &bufs[a.buffer]).collect();
            let (kernel, _) = &loaded[k.entry.as_str()];
            let at = rt(Some(&k.entry));
            stream
                .launch(kernel, k.grid, k.block, k.shared_bytes, &args)
                .map_err(&at)?;
            // One kernel at a time, so a fault names its kernel.
            stream.synchronize().map_err(&at)?;
            for a in k.args.iter().filter(|a| a.access == Access::Write) {
                written_by[a.buffer] = Some(i);
            }
        }
        let buffers = self.compare_all(&stream, &bufs, &written_by)?;
        let checks = self.read_checks(&stream, &bufs)?;
        let first_mismatch = first_mismatch(&buffers, |i| plan.kernels[i].entry.clone());
        let passed = first_mismatch.is_none() && checks.iter().all(|c| c.failed_index.is_none());
        Ok(ReplayReport {
            device: device.label().to_string(),
            target: plan.target.arch.clone(),
            kernels: plan
                .kernels
                .iter()
                .enumerate()
                .map(|(index, k)| KernelReport {
                    index,
                    entry: k.entry.clone(),
                    loaded: loaded[k.entry.as_str()].1.clone(),
                })
                .collect(),
            buffers,
            checks,
            first_mismatch,
            passed,
        })
    }

    /// One device buffer per buffer id (no reuse): data uploaded (inputs, weights, constants,
    /// quantized blocks, the states' initial contents), computed buffers poisoned so a value no
    /// kernel wrote fails the comparison, status buffers and counters zeroed.
    fn allocate(&self, stream: &Stream) -> Result<Vec<DeviceBuffer>, BundleError> {
        let rt = BundleError::runtime(None);
        self.plan
            .buffers
            .iter()
            .map(|b| {
                let bytes = usize::try_from(b.bytes).map_err(|_| BundleError::TooLarge {
                    bytes: b.bytes,
                    limit: usize::MAX as u64,
                })?;
                match b.role {
                    // A state starts the run with its data file's contents.
                    Role::Input | Role::Weight | Role::Constant | Role::State | Role::Quantized => {
                        stream.upload(&self.data(b.id)?).map_err(&rt)
                    }
                    Role::Computed | Role::Output | Role::Workspace => {
                        stream.alloc(bytes, true).map_err(&rt)
                    }
                    Role::Status => stream.alloc(bytes, false).map_err(&rt),
                    // Zeroed, as a session allocates them: a poisoned count never completes.
                    Role::Counters => {
                        let buf = stream.alloc(bytes, false).map_err(&rt)?;
                        stream.fill(&buf, 0).map_err(&rt)?;
                        Ok(buf)
                    }
                }
            })
            .collect()
    }

    /// Every computed buffer downloaded and compared with its expected value.
    fn compare_all(
        &self,
        stream: &Stream,
        bufs: &[DeviceBuffer],
        written_by: &[Option<usize>],
    ) -> Result<Vec<BufferReport>, BundleError> {
        let mut reports = Vec::new();
        for b in self.plan.buffers.iter().filter(|b| b.role.is_computed()) {
            let got = stream
                .download(&bufs[b.id])
                .map_err(BundleError::runtime(None))?;
            let mut report = BufferReport {
                id: b.id,
                name: b.name.clone(),
                dtype: b.dtype,
                role: b.role,
                written_by: written_by[b.id],
                error: None,
                tolerance: b.dtype.tolerance(),
                non_finite: 0,
                passed: true,
                note: None,
            };
            match self.expected(b.id)? {
                None => report.note = Some("no interpreter value (scratch)".into()),
                Some(want) => {
                    let ty = TensorType::new(b.dtype, b.shape.clone());
                    compare(&mut report, &ty, &got, &want)
                }
            }
            reports.push(report);
        }
        Ok(reports)
    }

    /// What each gather's index check found.
    fn read_checks(
        &self,
        stream: &Stream,
        bufs: &[DeviceBuffer],
    ) -> Result<Vec<CheckResult>, BundleError> {
        self.plan
            .checks
            .iter()
            .map(|c| {
                let bytes = stream
                    .download(&bufs[c.status])
                    .map_err(BundleError::runtime(None))?;
                let check = IndexCheck {
                    node: c.node.clone(),
                    table_rows: usize::try_from(c.table_rows).unwrap_or(usize::MAX),
                    status: c.status,
                    write_rows: None,
                };
                Ok(CheckResult {
                    node: c.node.clone(),
                    status: c.status,
                    failed_index: check.failed_index(&bytes),
                })
            })
            .collect()
    }

    /// Kernel `entry` loaded on `device`: the bundle's code object where it has one that
    /// loads, else its source compiled by the device's own compiler (the code object may be
    /// from a compiler newer than this driver, or absent).
    fn load(
        &self,
        device: &Device,
        target: &Target,
        entry: &str,
        options: &ReplayOptions,
    ) -> Result<(LoadedKernel, KernelSource), BundleError> {
        let at = BundleError::runtime(Some(entry));
        let from_source = |reason: String| -> Result<(LoadedKernel, KernelSource), BundleError> {
            let source = self.source(entry)?;
            // Our own options for the platform: a bundle does not choose compiler flags.
            let image = device
                .compile_source(&source, entry, &compiler_options(target.platform))
                .map_err(&at)?;
            let kernel = device.load_kernel(&image, entry).map_err(&at)?;
            Ok((kernel, KernelSource::Compiled { reason }))
        };
        if options.recompile {
            return from_source("--recompile".into());
        }
        let Some(kind) = self.plan.compiler.code_object else {
            return from_source("the bundle has no code objects".into());
        };
        let image = self
            .code_object(entry)?
            .ok_or_else(|| BundleError::malformed(format!("no code object for {entry}")))?;
        if let Err(why) = holds_entry(kind, &image, entry) {
            return from_source(format!(
                "its code object was not handed to the driver: {why}"
            ));
        }
        match device.load_kernel(&image, entry) {
            Ok(kernel) => Ok((kernel, KernelSource::CodeObject)),
            Err(e) => from_source(format!("its code object did not load: {e}")),
        }
    }
}

/// Whether `image` is a code object of `kind` that defines `entry`, checked before the driver
/// sees it: the driver parses what it is given without bounds a bundle's bytes can be trusted
/// to respect. AMD code objects are read with the bounds-checked ELF reader; PTX must be text
/// that declares the entry.
fn holds_entry(kind: CodeObjectKind, image: &[u8], entry: &str) -> Result<(), String> {
    let found = match kind {
        CodeObjectKind::Co => parse_code_object(image)
            .map_err(|e| e.to_string())?
            .kernels
            .iter()
            .any(|k| k.name == entry),
        CodeObjectKind::Ptx => {
            let text = std::str::from_utf8(image).map_err(|_| "PTX that is not text")?;
            !text.contains('\0') && text.contains(&format!(".entry {entry}"))
        }
    };
    if found {
        Ok(())
    } else {
        Err(format!("it does not define {entry}"))
    }
}

/// The device's target, which must be the bundle's processor: the sources carry that
/// target's prelude (wave size, matrix instructions) and the code objects its ISA.
fn device_target(device: &Device, arch: &str) -> Result<Target, BundleError> {
    let Some(have) = device.target() else {
        return Err(BundleError::NoGpu {
            reason: format!("{} runs the interpreter, not kernels", device.label()),
        });
    };
    let want = Target::parse(arch).map_err(|e| BundleError::Malformed {
        reason: format!("target: {e}"),
    })?;
    if want.caps.name == have.caps.name {
        return Ok(have.clone());
    }
    // A bundle for the portable processor on a device that compiles for its arch-specific form
    // (`sm_90` on an H100, `sm_90a`): the bundle's own target, whose code the device runs.
    if have.caps.runs_code_for(want.caps) {
        return Ok(want);
    }
    Err(BundleError::TargetMismatch {
        bundle: arch.to_string(),
        vendor: format!("{:?}", want.platform),
        device: format!("{} ({})", device.label(), have.arch),
    })
}

/// The failing buffer whose writer ran first (a buffer no kernel writes comes last): later
/// mismatches may only follow from it.
fn first_mismatch(buffers: &[BufferReport], entry: impl Fn(usize) -> String) -> Option<Mismatch> {
    buffers
        .iter()
        .filter(|r| !r.passed)
        .min_by_key(|r| (r.written_by.unwrap_or(usize::MAX), r.id))
        .map(|r| Mismatch {
            kernel: r.written_by,
            entry: r.written_by.map(entry),
            buffer: r.id,
            name: r.name.clone(),
            reason: r.note.clone().unwrap_or_default(),
        })
}

/// Fills `report` with how `got` compares with `want` (both raw bytes of `ty`).
fn compare(report: &mut BufferReport, ty: &TensorType, got: &[u8], want: &[u8]) {
    let tensors = Tensor::from_bytes(ty, got).and_then(|g| Ok((g, Tensor::from_bytes(ty, want)?)));
    let (got, want) = match tensors {
        Ok(pair) => pair,
        Err(e) => {
            report.passed = false;
            report.note = Some(e.to_string());
            return;
        }
    };
    match compare_output(&report.name, &got, &want) {
        Ok(check) => {
            report.error = Some(check.error);
            report.non_finite = check.non_finite;
            report.passed = check.error <= report.tolerance;
            if !report.passed {
                report.note = Some(format!(
                    "relative L2 error {:.3e} is past the {} tolerance {:e}",
                    check.error, report.dtype, report.tolerance
                ));
            }
        }
        // NaN or ±inf where the interpreter has none (or the reverse), named by element.
        Err(e) => {
            report.passed = false;
            report.note = Some(e.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(id: usize, dtype: DType, written_by: Option<usize>) -> BufferReport {
        BufferReport {
            id,
            name: format!("b{id}"),
            dtype,
            role: Role::Computed,
            written_by,
            error: None,
            tolerance: dtype.tolerance(),
            non_finite: 0,
            passed: true,
            note: None,
        }
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn buffers_compare_by_relative_l2_against_the_dtype_tolerance() {
        let ty = TensorType::new(DType::F32, vec![4]);
        let want = [3.0f32, 0.0, -4.0, 0.0];
        // |(0, 0, 0, 1e-5)| / |(3, 0, -4, 0)| = 2e-6: within f32's 1e-5.
        let mut r = report(0, DType::F32, Some(0));
        compare(
            &mut r,
            &ty,
            &f32_bytes(&[3.0, 0.0, -4.0, 1e-5]),
            &f32_bytes(&want),
        );
        assert!(r.passed, "{r:?}");
        assert!((r.error.unwrap() - 2e-6).abs() < 1e-12, "{r:?}");
        // 5e-4 / 5 = 1e-4: past it.
        let mut r = report(0, DType::F32, Some(0));
        compare(
            &mut r,
            &ty,
            &f32_bytes(&[3.0, 5e-4, -4.0, 0.0]),
            &f32_bytes(&want),
        );
        assert!(!r.passed);
        assert!((r.error.unwrap() - 1e-4).abs() < 1e-9, "{r:?}");
        assert!(r.note.as_ref().unwrap().contains("tolerance"), "{r:?}");
    }

    #[test]
    fn poison_left_in_a_buffer_and_off_by_one_integers_fail() {
        let ty = TensorType::new(DType::F32, vec![2]);
        let mut r = report(1, DType::F32, Some(0));
        compare(&mut r, &ty, &[0xFF; 8], &f32_bytes(&[1.0, 2.0]));
        assert!(!r.passed);
        assert!(r.note.as_ref().unwrap().contains("NaN"), "{r:?}");
        let ty = TensorType::new(DType::I32, vec![2]);
        let ints = |v: [i32; 2]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let mut r = report(2, DType::I32, Some(0));
        compare(&mut r, &ty, &ints([7, 9]), &ints([7, 8]));
        assert!(!r.passed, "integers must match exactly: {r:?}");
        let mut r = report(2, DType::I32, Some(0));
        compare(&mut r, &ty, &ints([7, 8]), &ints([7, 8]));
        assert_eq!((r.passed, r.error), (true, Some(0.0)));
        let mut r = report(2, DType::I32, Some(0));
        compare(&mut r, &ty, &ints([7, 8])[..5], &ints([7, 8]));
        assert!(!r.passed, "a short download is a failure");
    }

    #[test]
    fn code_objects_must_define_their_entry_before_a_driver_sees_them() {
        let ptx = b".version 8.0\n.target sm_90\n.visible .entry rf_x_1(\n.param .u64 a\n)\n{\n}\n";
        assert!(holds_entry(CodeObjectKind::Ptx, ptx, "rf_x_1").is_ok());
        assert!(holds_entry(CodeObjectKind::Ptx, ptx, "rf_y_2").is_err());
        assert!(holds_entry(CodeObjectKind::Ptx, b"\xff\xfe", "rf_x_1").is_err());
        assert!(holds_entry(CodeObjectKind::Ptx, b".entry rf_x_1\0", "rf_x_1").is_err());
        // A real AMD code object holding one kernel, `add`.
        let co = include_bytes!("../../../tests/data/code_objects/add_gfx90a.co");
        assert!(holds_entry(CodeObjectKind::Co, co, "add").is_ok());
        assert!(holds_entry(CodeObjectKind::Co, co, "rf_x_1").is_err());
        assert!(holds_entry(CodeObjectKind::Co, &co[..co.len() / 2], "add").is_err());
        for junk in [
            &b""[..],
            b"not a code object",
            &[0x7f, b'E', b'L', b'F', 2, 1, 1][..],
        ] {
            assert!(
                holds_entry(CodeObjectKind::Co, junk, "rf_x_1").is_err(),
                "{junk:?}"
            );
        }
    }

    #[test]
    fn the_first_mismatch_is_the_one_whose_writer_ran_first() {
        let mut bufs = vec![
            report(0, DType::F32, Some(0)),
            report(1, DType::F32, Some(3)),
            report(2, DType::F32, Some(1)),
            report(3, DType::F32, None),
        ];
        assert_eq!(first_mismatch(&bufs, |i| format!("k{i}")), None);
        for i in [1, 2, 3] {
            bufs[i].passed = false;
        }
        let m = first_mismatch(&bufs, |i| format!("k{i}")).unwrap();
        assert_eq!(
            (m.kernel, m.entry.as_deref(), m.buffer),
            (Some(1), Some("k1"), 2)
        );
        bufs[2].passed = true;
        bufs[1].passed = true;
        let m = first_mismatch(&bufs, |i| format!("k{i}")).unwrap();
        assert_eq!((m.kernel, m.buffer), (None, 3));
    }
}
