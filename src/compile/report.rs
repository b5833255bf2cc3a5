//! The resource report of a set of AMD kernels: each compiled (by hiprtc or the offline clang,
//! in batches) and its VGPRs, AGPRs, SGPRs, LDS, scratch and spills read from the code object's
//! metadata. `rocmforge compile --report` and the kernel-family tests both go through here, so
//! the choice of compiler and the reading of its output are written once.

use std::collections::HashMap;

use rayon::prelude::*;
use thiserror::Error;

use crate::arch::{compiler_options, ArchError, Platform, Target};
use crate::runtime::{
    amd_compiler_for, occupancy_table, parse_code_object, report_table, AmdCompiler,
    AmdCompilerChoice, Hiprtc, KernelResources,
};

/// Kernels a clang run compiles together: each run costs mostly headers and device libraries.
const CLANG_BATCH: usize = 24;

/// Kernels a hiprtc program compiles together, for the same reason.
const HIPRTC_BATCH: usize = 24;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum ReportError {
    #[error("--report reads AMD code objects; {arch} is an NVIDIA target")]
    NvidiaTarget { arch: String },
    #[error(transparent)]
    Target(#[from] ArchError),
    /// hiprtc could not be loaded or refuses the target (the message is hiprtc's).
    #[error("{0}")]
    Hiprtc(String),
    /// No compiler for the target under the choice (every reason tried).
    #[error("{0}")]
    NoCompiler(String),
    #[error("{kernel}: {message}")]
    Compile { kernel: String, message: String },
    #[error("{kernel}: {message}")]
    Metadata { kernel: String, message: String },
    #[error("{kernel} missing from its code object")]
    MissingKernel { kernel: String },
}

/// The target of a resource report for `arch`, checked against hiprtc's own list first (and
/// so never handing hiprtc one it cannot take). Under `Auto` a target hiprtc lacks but our
/// table has a row for goes on (to clang, see [`choose_amd_compiler`]); one neither knows is
/// hiprtc's error, as is a hiprtc library `ROCMFORGE_HIPRTC` names that cannot be loaded.
pub fn report_target(arch: &str, choice: AmdCompilerChoice) -> Result<Target, ReportError> {
    if Target::parse(arch).is_ok_and(|t| t.platform == Platform::Nvidia) {
        return Err(ReportError::NvidiaTarget {
            arch: arch.to_string(),
        });
    }
    if choice != AmdCompilerChoice::Clang {
        let forced = choice == AmdCompilerChoice::Hiprtc;
        match Hiprtc::load() {
            Ok(rtc) => {
                if let Err(e) = rtc.check_target(arch) {
                    if forced || Target::parse(arch).is_err() {
                        return Err(ReportError::Hiprtc(e.to_string()));
                    }
                }
            }
            Err(e) if forced || std::env::var_os("ROCMFORGE_HIPRTC").is_some() => {
                return Err(ReportError::Hiprtc(e.to_string()))
            }
            Err(_) => {}
        }
    }
    Ok(Target::parse(arch)?)
}

/// The AMD compiler for `target` under `choice`: hiprtc where its ROCm release knows the
/// processor, else the offline clang (`runtime::amd_compiler_for`).
pub fn choose_amd_compiler(
    target: &Target,
    choice: AmdCompilerChoice,
) -> Result<AmdCompiler, ReportError> {
    amd_compiler_for(target, choice).map_err(ReportError::NoCompiler)
}

/// One kernel to compile for a report.
#[derive(Clone, Copy, Debug)]
pub struct ReportKernel<'a> {
    pub entry: &'a str,
    /// The whole source (prelude and body), for hiprtc.
    pub source: &'a str,
    /// The body alone: clang compiles many bodies behind one prelude.
    pub body: &'a str,
    /// What the row is called in the table (the node, or the test case).
    pub label: &'a str,
}

/// One compiled kernel's resources.
#[derive(Clone, Debug, PartialEq)]
pub struct ReportRow {
    /// The label of the first kernel given with this code.
    pub label: String,
    /// How many of the kernels given are this one (same entry, same source): identical
    /// kernels share their entry (the hash of the body) and are compiled once.
    pub kernels: usize,
    pub resources: KernelResources,
    /// Waves per SIMD as LLVM's remarks give it (clang only).
    pub occupancy: Option<u32>,
}

/// The report of a set of kernels: one row per distinct kernel, in the order of first use.
#[derive(Clone, Debug, PartialEq)]
pub struct ResourceReport {
    /// The compiler, as it describes itself (version and file).
    pub compiler: String,
    /// Whether the offline clang compiled it (its table has an occupancy column).
    pub by_clang: bool,
    pub rows: Vec<ReportRow>,
}

impl ResourceReport {
    /// The table `compile --report` prints: one line per distinct kernel, labelled with its
    /// first node and, where others share it, their number (`tanh_3 (×20000)`): a chain of
    /// 20,000 identical kernels reads as one line, not 20,000 equal ones. With the occupancy
    /// column when clang gave one.
    pub fn table(&self) -> String {
        let label = |r: &ReportRow| {
            if r.kernels > 1 {
                format!("{} (×{})", r.label, r.kernels)
            } else {
                r.label.clone()
            }
        };
        if self.by_clang {
            let rows: Vec<(String, KernelResources, u32)> = self
                .rows
                .iter()
                .map(|r| (label(r), r.resources.clone(), r.occupancy.unwrap_or(0)))
                .collect();
            occupancy_table(&rows)
        } else {
            let rows: Vec<(String, KernelResources)> = self
                .rows
                .iter()
                .map(|r| (label(r), r.resources.clone()))
                .collect();
            report_table(&rows)
        }
    }

    /// The entries of the kernels that spill (registers or scratch).
    pub fn spilling(&self) -> Vec<&str> {
        self.rows
            .iter()
            .filter(|r| r.resources.spills())
            .map(|r| r.resources.name.as_str())
            .collect()
    }
}

/// The resources of `entry` in an AMD code object.
pub fn resources_of(code: &[u8], entry: &str) -> Result<KernelResources, ReportError> {
    parse_code_object(code)
        .map_err(|e| ReportError::Metadata {
            kernel: entry.to_string(),
            message: e.to_string(),
        })?
        .kernels
        .into_iter()
        .find(|r| r.name == entry)
        .ok_or_else(|| ReportError::MissingKernel {
            kernel: entry.to_string(),
        })
}

/// The distinct kernels of `kernels` in the order of first use, each with how many of
/// `kernels` it stands for. Identical kernels share their entry (the hash of the body), so
/// the entry finds the candidates; the body and source are compared as well, so that two
/// kernels are never merged on the name alone.
pub fn distinct_kernels<'a>(kernels: &[ReportKernel<'a>]) -> Vec<(ReportKernel<'a>, usize)> {
    let mut groups: Vec<(ReportKernel<'a>, usize)> = Vec::new();
    let mut by_entry: HashMap<&str, Vec<usize>> = HashMap::new();
    for k in kernels {
        let same = by_entry.entry(k.entry).or_default();
        let found = same.iter().copied().find(|&i| {
            let g = &groups[i].0;
            g.body == k.body && g.source == k.source
        });
        match found {
            Some(i) => groups[i].1 += 1,
            None => {
                same.push(groups.len());
                groups.push((*k, 1));
            }
        }
    }
    groups
}

/// The rows of `chunk` compiled by hiprtc for `target` as one program (the prelude, then each
/// body); where that program fails, each kernel alone, so the error names the kernel whose own
/// source fails, as a compile of that kernel alone would (its full source, as a plan gives it).
fn hiprtc_batch(
    rtc: &Hiprtc,
    prelude: &str,
    chunk: &[(ReportKernel<'_>, usize)],
    target: &Target,
    options: &[String],
) -> Result<Vec<ReportRow>, ReportError> {
    let row = |k: &ReportKernel<'_>, count: usize, code: &[u8]| -> Result<ReportRow, ReportError> {
        Ok(ReportRow {
            label: k.label.to_string(),
            kernels: count,
            resources: resources_of(code, k.entry)?,
            occupancy: None,
        })
    };
    let alone = |k: &ReportKernel<'_>| {
        rtc.compile(k.source, k.entry, &target.arch, options)
            .map_err(|e| ReportError::Compile {
                kernel: k.label.to_string(),
                message: e.to_string(),
            })
    };
    if let [(k, count)] = chunk {
        return Ok(vec![row(k, *count, &alone(k)?)?]);
    }
    // A batch stands for its kernels' own sources only where each is the prelude and its body.
    let same_source = chunk.iter().all(|(k, _)| {
        k.source
            .strip_prefix(prelude)
            .and_then(|rest| rest.strip_prefix('\n'))
            == Some(k.body)
    });
    let mut source = prelude.to_string();
    for (k, _) in chunk {
        source.push('\n');
        source.push_str(k.body);
    }
    match same_source
        .then(|| rtc.compile(&source, chunk[0].0.entry, &target.arch, options))
        .and_then(Result::ok)
    {
        Some(code) => chunk
            .iter()
            .map(|(k, count)| row(k, *count, &code))
            .collect(),
        None => chunk
            .iter()
            .map(|(k, count)| row(k, *count, &alone(k)?))
            .collect(),
    }
}

/// Every distinct kernel of `kernels` ([`distinct_kernels`]) compiled once for `target` by
/// `compiler` with the AMD [`compiler_options`], in parallel; `done` is called with the
/// number of `kernels` each compile covers (a progress bar over `kernels.len()`). One row per
/// distinct kernel, in the order of first use; the first error ends the report.
pub fn resource_report(
    kernels: &[ReportKernel<'_>],
    target: &Target,
    compiler: &AmdCompiler,
    done: &(dyn Fn(usize) + Sync),
) -> Result<ResourceReport, ReportError> {
    let options = compiler_options(Platform::Amd);
    let kernels = distinct_kernels(kernels);
    match compiler {
        AmdCompiler::Hiprtc(rtc) => {
            // Batches, as clang's: a program's cost is mostly hiprtc's headers and device
            // libraries (hiprtc compiles one program at a time in any case).
            let prelude = crate::codegen::prelude(target);
            let batches: Vec<Result<Vec<ReportRow>, ReportError>> = kernels
                .par_chunks(HIPRTC_BATCH)
                .map(|chunk| {
                    let rows = hiprtc_batch(rtc, &prelude, chunk, target, &options)?;
                    done(chunk.iter().map(|(_, count)| count).sum());
                    Ok(rows)
                })
                .collect();
            let mut rows = Vec::with_capacity(kernels.len());
            for batch in batches {
                rows.extend(batch?);
            }
            Ok(ResourceReport {
                compiler: format!(
                    "hiprtc {}.{} from {}",
                    rtc.version.0, rtc.version.1, rtc.library
                ),
                by_clang: false,
                rows,
            })
        }
        AmdCompiler::Clang(clang) => {
            let prelude = crate::codegen::prelude(target);
            let batches: Vec<Result<Vec<ReportRow>, ReportError>> = kernels
                .par_chunks(CLANG_BATCH)
                .map(|chunk| {
                    let pairs: Vec<(&str, &str)> =
                        chunk.iter().map(|(k, _)| (k.entry, k.body)).collect();
                    let rows = clang
                        .compile_batch(&prelude, &pairs, target, &options)
                        .map_err(|e| ReportError::Compile {
                            kernel: chunk
                                .iter()
                                .map(|(k, _)| k.label)
                                .collect::<Vec<_>>()
                                .join(", "),
                            message: e.to_string(),
                        })?;
                    done(chunk.iter().map(|(_, count)| count).sum());
                    Ok(chunk
                        .iter()
                        .zip(rows)
                        .map(|((k, count), (resources, occupancy))| ReportRow {
                            label: k.label.to_string(),
                            kernels: *count,
                            resources,
                            occupancy: Some(occupancy),
                        })
                        .collect())
                })
                .collect();
            let mut rows = Vec::with_capacity(kernels.len());
            for batch in batches {
                rows.extend(batch?);
            }
            Ok(ResourceReport {
                compiler: clang.describe(),
                by_clang: true,
                rows,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, vgpr_spills: u64, occupancy: Option<u32>) -> ReportRow {
        ReportRow {
            label: format!("node_{name}"),
            kernels: 1,
            resources: KernelResources {
                name: name.to_string(),
                vgprs: 32,
                agprs: 0,
                sgprs: 16,
                lds_bytes: 1024,
                scratch_bytes: 0,
                vgpr_spills,
                sgpr_spills: 0,
                wave_size: 64,
            },
            occupancy,
        }
    }

    #[test]
    fn nvidia_targets_are_refused_before_any_compiler_is_asked() {
        for choice in [
            AmdCompilerChoice::Auto,
            AmdCompilerChoice::Hiprtc,
            AmdCompilerChoice::Clang,
        ] {
            assert!(matches!(
                report_target("sm_90", choice),
                Err(ReportError::NvidiaTarget { .. })
            ));
        }
    }

    /// Under clang no hiprtc is consulted, so an arch outside our table is our table's error.
    #[test]
    fn an_unknown_arch_under_clang_is_the_tables_error() {
        assert!(matches!(
            report_target("gfx9999", AmdCompilerChoice::Clang),
            Err(ReportError::Target(ArchError::UnknownArch { .. }))
        ));
    }

    #[test]
    fn spilling_lists_the_entries_that_spill() {
        let report = ResourceReport {
            compiler: "c".into(),
            by_clang: false,
            rows: vec![row("a", 0, None), row("b", 3, None)],
        };
        assert_eq!(report.spilling(), vec!["b"]);
    }

    /// A chain of softmax → tanh pairs: each softmax and each tanh is its own kernel of the
    /// plan, and equal ops over equal shapes generate equal kernels (one entry each). The
    /// groups must be the plan's distinct entries (counted here apart, by a set), each once,
    /// standing together for every kernel of the plan.
    #[test]
    fn identical_kernels_of_a_plan_are_reported_once() {
        use crate::ir::{DType, Graph, UnaryOp};
        let mut g = Graph::new("chain");
        let mut x = g.input("x", DType::F32, &[4, 33]).unwrap();
        for _ in 0..60 {
            x = g.softmax(x, -1).unwrap();
            x = g.unary(UnaryOp::Tanh, x).unwrap();
        }
        g.set_outputs(&[x]).unwrap();
        let target = Target::parse("gfx90a").unwrap();
        let plan = crate::codegen::generate(&g, &target).unwrap();
        let sources: Vec<String> = plan.kernels.iter().map(|k| plan.source(k)).collect();
        let kernels: Vec<ReportKernel> = plan
            .kernels
            .iter()
            .zip(&sources)
            .map(|(k, source)| ReportKernel {
                entry: &k.entry,
                source,
                body: &k.body,
                label: &k.node,
            })
            .collect();
        assert!(kernels.len() >= 120, "{} kernels", kernels.len());
        let groups = distinct_kernels(&kernels);
        let entries: std::collections::HashSet<&str> =
            plan.kernels.iter().map(|k| k.entry.as_str()).collect();
        assert_eq!(groups.len(), entries.len());
        assert!(groups.len() < 10, "{} distinct kernels", groups.len());
        let mut seen = std::collections::HashSet::new();
        for (k, _) in &groups {
            assert!(seen.insert(k.entry), "{} reported twice", k.entry);
        }
        assert_eq!(groups.iter().map(|(_, n)| n).sum::<usize>(), kernels.len());
        // Each group counts exactly the kernels with its entry, and is labelled by the first.
        for (k, n) in &groups {
            let mine: Vec<&ReportKernel> = kernels.iter().filter(|o| o.entry == k.entry).collect();
            assert_eq!(*n, mine.len());
            assert_eq!(k.label, mine[0].label);
        }
    }

    /// Kernels are merged by what they are, not by the name alone: a body that differs under
    /// the same entry is its own row.
    #[test]
    fn a_kernel_is_merged_only_with_an_identical_one() {
        let k = |entry, body, label| ReportKernel {
            entry,
            source: body,
            body,
            label,
        };
        let kernels = [
            k("e1", "a", "n0"),
            k("e2", "b", "n1"),
            k("e1", "a", "n2"),
            k("e1", "c", "n3"),
            k("e1", "a", "n4"),
        ];
        let groups: Vec<(&str, usize)> = distinct_kernels(&kernels)
            .iter()
            .map(|(k, n)| (k.label, *n))
            .collect();
        assert_eq!(groups, vec![("n0", 3), ("n1", 1), ("n3", 1)]);
    }

    /// A row standing for several kernels says how many.
    #[test]
    fn a_shared_row_is_labelled_with_its_count() {
        let mut shared = row("a", 0, None);
        shared.kernels = 3;
        let report = ResourceReport {
            compiler: "h".into(),
            by_clang: false,
            rows: vec![shared, row("b", 0, None)],
        };
        assert_eq!(
            report.table(),
            report_table(&[
                ("node_a (×3)".into(), row("a", 0, None).resources),
                ("node_b".into(), row("b", 0, None).resources),
            ])
        );
    }

    /// The table is hiprtc's without occupancies and clang's with them.
    #[test]
    fn table_has_an_occupancy_column_only_from_clang() {
        let hiprtc = ResourceReport {
            compiler: "h".into(),
            by_clang: false,
            rows: vec![row("a", 0, None)],
        };
        let clang = ResourceReport {
            compiler: "c".into(),
            by_clang: true,
            rows: vec![row("a", 0, Some(8))],
        };
        assert_eq!(
            hiprtc.table(),
            report_table(&[("node_a".into(), row("a", 0, None).resources)])
        );
        assert_eq!(
            clang.table(),
            occupancy_table(&[("node_a".into(), row("a", 0, None).resources, 8)])
        );
    }
}
