//! What codegen produces: buffers, and an ordered list of kernels with their source, launch
//! geometry and bindings.

use std::fmt::Write;

use super::{prelude, Target};
use crate::ir::{Init, Sample, TensorType};

pub type BufferId = usize;

/// Where a buffer's contents come from.
#[derive(Clone, Debug, PartialEq)]
pub enum BufferRole {
    Input(Sample),
    Weight(Init),
    /// Constant data, uploaded once (one value is a splat).
    Constant(Vec<f64>),
    /// Written by a kernel.
    Computed,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Buffer {
    pub id: BufferId,
    /// The node whose value this buffer holds.
    pub name: String,
    pub ty: TensorType,
    pub role: BufferRole,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Dynamic shared memory in bytes (kernels here use static shared memory only).
    pub shared_bytes: u32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    /// The `extern "C"` entry point: family and a hash of the body, so identical kernels share
    /// a name, a source and a cache entry.
    pub entry: String,
    pub family: &'static str,
    /// The graph node (or nodes, for fused epilogues) this kernel computes.
    pub node: String,
    /// The kernel itself; the full source is the target's prelude followed by this.
    pub body: String,
    pub launch: Launch,
    /// Buffers bound to the kernel's pointer parameters, in order; the last is written.
    pub args: Vec<BufferId>,
}

/// A graph output: the buffer holding it and its own type (a reshaped output shares the buffer
/// of the value it reshapes, whose type differs).
#[derive(Clone, Debug, PartialEq)]
pub struct PlanOutput {
    pub name: String,
    pub buffer: BufferId,
    pub ty: TensorType,
}

#[derive(Clone, Debug, PartialEq)]
pub struct KernelPlan {
    pub target: Target,
    pub graph: String,
    pub buffers: Vec<Buffer>,
    pub kernels: Vec<Kernel>,
    /// Graph outputs in order.
    pub outputs: Vec<PlanOutput>,
}

impl KernelPlan {
    /// Prelude and kernel, ready for hiprtc or NVRTC.
    pub fn source(&self, kernel: &Kernel) -> String {
        let mut s = prelude(&self.target);
        s.push('\n');
        s.push_str(&kernel.body);
        s
    }

    /// Every kernel with its launch and bindings, for snapshots and `--emit`.
    pub fn listing(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "// rocmforge kernel plan: graph {}, target {}",
            self.graph, self.target
        );
        let _ = writeln!(
            out,
            "// {} kernel(s), {} buffer(s)",
            self.kernels.len(),
            self.buffers.len()
        );
        for (i, k) in self.kernels.iter().enumerate() {
            let args: Vec<String> = k
                .args
                .iter()
                .enumerate()
                .map(|(j, &b)| {
                    format!(
                        "%{}{}",
                        self.buffers[b].name,
                        if j + 1 == k.args.len() {
                            " (write)"
                        } else {
                            ""
                        }
                    )
                })
                .collect();
            let _ = writeln!(out, "\n// ---- kernel {i}: {} for %{}", k.entry, k.node);
            let _ = writeln!(
                out,
                "// grid {:?} block {:?} shared {} B; args: {}",
                k.launch.grid,
                k.launch.block,
                k.launch.shared_bytes,
                args.join(", ")
            );
            out.push_str(&k.body);
        }
        out
    }
}
