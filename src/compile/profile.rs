//! Where a run's device time goes: every kernel of one run timed on the device's clock, and the
//! sums per kernel family. The run is queued behind a hold on its stream, with a marker before
//! and after each kernel, and only then let go, so each interval is the kernel's own time on
//! the device: no host launch latency, which for a small kernel is larger than the kernel.

use std::fmt::Write;
use std::time::Duration;

use super::{CompileError, Session};

/// How long a profiled run's stream waits for the host to enqueue it before starting anyway
/// (a launch queue too short for the run would block the host): then the profile is refused.
pub const HOLD_LIMIT: Duration = Duration::from_secs(10);

/// Kernels queued behind one hold (with their markers, 600 launch-queue entries).
const SEGMENT: usize = 200;

/// One kernel of a profiled run.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTime {
    /// Position in the plan (launch order).
    pub index: usize,
    pub entry: String,
    pub family: &'static str,
    /// The graph node (or nodes) it computes.
    pub node: String,
    pub time: Duration,
}

/// The kernels of one family in a profiled run.
#[derive(Clone, Debug, PartialEq)]
pub struct FamilyTime {
    pub family: &'static str,
    pub kernels: usize,
    pub time: Duration,
}

/// Every kernel of one run, in launch order, with its device time.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    pub kernels: Vec<KernelTime>,
    /// From the first kernel's start to the last one's end: the kernels and the device's
    /// switches between them, with the host out of the way (summed over the segments a long
    /// plan is queued in).
    pub span: Duration,
}

impl Profile {
    /// The sum of the kernels' device times.
    pub fn total(&self) -> Duration {
        self.kernels.iter().map(|k| k.time).sum()
    }

    /// Kernel count and summed time per family, most time first (ties by name).
    pub fn by_family(&self) -> Vec<FamilyTime> {
        let mut out: Vec<FamilyTime> = Vec::new();
        for k in &self.kernels {
            match out.iter_mut().find(|f| f.family == k.family) {
                Some(f) => {
                    f.kernels += 1;
                    f.time += k.time;
                }
                None => out.push(FamilyTime {
                    family: k.family,
                    kernels: 1,
                    time: k.time,
                }),
            }
        }
        out.sort_by(|a, b| b.time.cmp(&a.time).then(a.family.cmp(b.family)));
        out
    }

    /// The per-family table: kernels, device ms and share of the total, then the total and
    /// the span.
    pub fn family_table(&self) -> String {
        let total = self.total();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let mut out = format!(
            "{:<22} {:>8} {:>10} {:>7}\n",
            "family", "kernels", "device ms", "share"
        );
        for f in self.by_family() {
            let share = if total.is_zero() {
                0.0
            } else {
                100.0 * f.time.as_secs_f64() / total.as_secs_f64()
            };
            let _ = writeln!(
                out,
                "{:<22} {:>8} {:>10.4} {:>6.1}%",
                f.family,
                f.kernels,
                ms(f.time),
                share
            );
        }
        let _ = writeln!(
            out,
            "{:<22} {:>8} {:>10.4}  (span {:.4} ms: first kernel's start to last kernel's end)",
            "sum of kernels",
            self.kernels.len(),
            ms(total),
            ms(self.span)
        );
        out
    }
}

impl Session<'_> {
    /// Runs once untimed (so every buffer holds a value and every kernel has run), then once
    /// more, kernel by kernel without replay, queued behind a hold (one per segment of
    /// [`SEGMENT`] kernels) with a marker around each kernel, and returns each kernel's device
    /// time. GPU runs only: the CPU runs the
    /// interpreter, which has no kernels.
    pub fn profile(&mut self) -> Result<Profile, CompileError> {
        let Some(plan) = self.executable().plan().cloned() else {
            return Err(CompileError::ProfileNeedsGpu {
                device: self.executable().device.label().to_string(),
            });
        };
        self.launch()?;
        let Some(run) = self.gpu() else {
            return Err(CompileError::ProfileNeedsGpu {
                device: self.executable().device.label().to_string(),
            });
        };
        run.stream.synchronize()?;
        // In segments, each queued behind its own hold: a kernel and its two markers are three
        // entries of the device's launch queue, which holds about a thousand, so a plan of more
        // than ~330 kernels queued at once blocks the host until the hold expires (a batched
        // decode step has 363–454).
        let mut marks = Vec::with_capacity(2 * plan.kernels.len());
        // Each segment's first and last marker: the span adds their intervals, not the host's
        // time between segments.
        let mut ends = Vec::new();
        for segment in (0..plan.kernels.len()).collect::<Vec<_>>().chunks(SEGMENT) {
            let mut hold = run.stream.hold(HOLD_LIMIT)?;
            let first = marks.len();
            for &i in segment {
                marks.push(run.stream.mark()?);
                run.stream.launch_one(&run.launches, run.kernel_at[i])?;
                marks.push(run.stream.mark()?);
            }
            ends.push((first, marks.len() - 1));
            hold.release();
            run.stream.synchronize()?;
            if hold.expired() {
                return Err(CompileError::ProfileHoldExpired {
                    kernels: segment.len(),
                    limit: hold.limit(),
                });
            }
        }
        let kernels = plan
            .kernels
            .iter()
            .zip(marks.chunks_exact(2))
            .enumerate()
            .map(|(index, (k, pair))| {
                Ok(KernelTime {
                    index,
                    entry: k.entry.clone(),
                    family: k.family,
                    node: k.node.clone(),
                    time: pair[1].since(&pair[0])?,
                })
            })
            .collect::<Result<Vec<_>, CompileError>>()?;
        let mut span = Duration::ZERO;
        for &(first, last) in &ends {
            span += marks[last].since(&marks[first])?;
        }
        Ok(Profile { kernels, span })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::CompileOptions;
    use crate::interp::Bindings;
    use crate::ir::{DType, Graph};
    use crate::runtime::Device;

    fn kernel(index: usize, family: &'static str, micros: u64) -> KernelTime {
        KernelTime {
            index,
            entry: format!("{family}_{index}"),
            family,
            node: format!("n{index}"),
            time: Duration::from_micros(micros),
        }
    }

    fn sample() -> Profile {
        Profile {
            kernels: vec![
                kernel(0, "copy", 3),
                kernel(1, "matmul", 40),
                kernel(2, "copy", 5),
                kernel(3, "layernorm", 8),
                kernel(4, "matmul", 60),
                kernel(5, "softmax", 8),
            ],
            span: Duration::from_micros(130),
        }
    }

    #[test]
    fn families_sum_their_kernels_most_time_first() {
        let p = sample();
        assert_eq!(p.total(), Duration::from_micros(124));
        let fam: Vec<(&str, usize, u128)> = p
            .by_family()
            .iter()
            .map(|f| (f.family, f.kernels, f.time.as_micros()))
            .collect();
        // Equal times (layernorm and softmax, 8 µs each) in name order.
        assert_eq!(
            fam,
            [
                ("matmul", 2, 100),
                ("copy", 2, 8),
                ("layernorm", 1, 8),
                ("softmax", 1, 8)
            ]
        );
    }

    #[test]
    fn the_table_has_a_row_per_family_and_the_totals() {
        let table = sample().family_table();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 6, "{table}");
        // 100 of 124 µs: 80.6 %.
        assert!(
            lines[1].starts_with("matmul")
                && lines[1].contains("0.1000")
                && lines[1].contains("80.6%"),
            "{table}"
        );
        assert!(
            lines[2].starts_with("copy") && lines[2].contains(" 2 "),
            "{table}"
        );
        assert!(
            lines[5].starts_with("sum of kernels")
                && lines[5].contains(" 6 ")
                && lines[5].contains("0.1240")
                && lines[5].contains("span 0.1300 ms"),
            "{table}"
        );
        let empty = Profile {
            kernels: vec![],
            span: Duration::ZERO,
        };
        assert_eq!(empty.family_table().lines().count(), 2);
    }

    #[test]
    fn profiling_a_cpu_run_is_a_typed_error_naming_the_device() {
        let mut g = Graph::new("p");
        let x = g.input("x", DType::F32, &[3]).unwrap();
        let e = g.exp(x).unwrap();
        g.add_output(e).unwrap();
        let device = Device::cpu();
        let c = Graph::compile_with(&g, &device, &CompileOptions::default()).unwrap();
        let mut prepared = c.prepare(&Bindings::random(&g, 1)).unwrap();
        match prepared.profile() {
            Err(CompileError::ProfileNeedsGpu { device: d }) => assert_eq!(d, device.label()),
            other => panic!("{other:?}"),
        }
    }
}
