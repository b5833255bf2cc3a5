//! What codegen produces: buffers, and an ordered list of kernels with their source, launch
//! geometry and bindings.

use std::fmt::Write;

use super::names::display_name;
use super::prelude;
use crate::arch::Target;
use crate::ir::{Init, QuantScheme, Sample, TensorType};

pub type BufferId = usize;

/// Where a buffer's contents come from.
#[derive(Clone, Debug, PartialEq)]
pub enum BufferRole {
    Input(Sample),
    Weight(Init),
    /// A quantized weight: the buffer holds its blocks as stored (`ir::quant`), not the values
    /// its type describes. Only kernels that dequantize read it (the GEMM's B operand, the
    /// dequantize kernel); `ty` is the value's type.
    QuantWeight(QuantScheme),
    /// Constant data, uploaded once (one value is a splat).
    Constant(Vec<f64>),
    /// Written by a kernel.
    Computed,
    /// Scratch that the kernels of one node share (split-K partials written by one kernel and
    /// read by the next; a quantized weight dequantized for the kernels that cannot read its
    /// blocks): elements of its type, allocated and poisoned with the intermediates, never a
    /// graph output and holding no node's value, so never compared with the interpreter.
    Workspace,
    /// Counters that kernels synchronise their blocks with (split-K's arrival counts, one
    /// unsigned 32-bit word per element): zeroed once when a session (or a replay, or a
    /// tuning trial) allocates it, and every kernel that takes one puts each counter back to 0
    /// before it ends, so the next launch and a replayed graph start from zeros. Never poisoned
    /// (0xff bytes would be a count nobody reaches), never shared with another buffer by the
    /// memory plan, never a node's value.
    Counters,
    /// A kernel's error report ([`IndexCheck`]): [`STATUS_BYTES`] zeroed before a run and read
    /// after it.
    Status,
    /// A persistent tensor a session keeps across runs (a KV cache): allocated once per
    /// session, zeroed (as the interpreter starts it), never reused by the memory plan.
    State {
        name: String,
    },
    /// A contiguous range of another buffer (a slice that codegen reads in place): `base`'s
    /// memory from element `offset` on (elements of this buffer's dtype, which is `base`'s).
    /// No storage of its own: binding it binds `base` at that offset, and `base` lives while
    /// any alias of it is read (`compile::memory_plan`). Never a plan output (codegen copies
    /// an output that would be one) and never written by a kernel. `base` is never an alias.
    Alias {
        base: BufferId,
        offset: usize,
    },
    /// A TMA tensor map (`arch::tma`, [`MAP_BYTES`](crate::arch::tma::MAP_BYTES) bytes) of
    /// buffer `of`'s memory: encoded by the runtime when a session binds its buffers (the
    /// address is known then and fixed for the session's life, replays included), uploaded
    /// once, never poisoned and never reused by the memory plan. The kernel that copies boxes
    /// through it also takes `of` itself, so `of`'s liveness and poisoning are as for any
    /// operand.
    TensorMap {
        of: BufferId,
        spec: crate::arch::tma::TensorMapSpec,
    },
}

/// Bytes of a status buffer: two u64, the bitwise complement of the first failing position
/// (0 while none failed), then the value found there.
pub const STATUS_BYTES: usize = 16;

/// A gather whose kernels report an index outside its table, or a cache write whose window
/// leaves its state, so that a run on a GPU fails with the interpreter's error instead of
/// returning rows nobody looked up or writing memory the state does not own.
#[derive(Clone, Debug, PartialEq)]
pub struct IndexCheck {
    /// The gather or cache-write node.
    pub node: String,
    /// Rows of its table (valid indices are `0..table_rows`); for a cache write, the state's
    /// size along the written axis.
    pub table_rows: usize,
    /// Its status buffer.
    pub status: BufferId,
    /// For a cache write, the rows it writes (the failing value is then its start).
    pub write_rows: Option<usize>,
}

impl IndexCheck {
    /// The first out-of-range index the kernels found, from the status buffer's bytes; `None`
    /// when every index was in range.
    pub fn failed_index(&self, status: &[u8]) -> Option<i64> {
        match status_word(status, 0)? {
            0 => None,
            _ => Some(i64::from_le_bytes(status_word(status, 1)?.to_le_bytes())),
        }
    }
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
    /// Launched as a programmatic dependent of the kernel before it: set where the target has
    /// `grid_dependency` and the kernel's first statement is `RF_GRID_ENTER()` (see
    /// [`mark_programmatic`](super::lower::mark_programmatic)).
    pub programmatic: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    /// The `extern "C"` entry point: family and a hash of the body, so identical kernels share
    /// a name, a source and a cache entry.
    pub entry: String,
    pub family: &'static str,
    /// The graph node this kernel computes (a gemm node includes its epilogue).
    pub node: String,
    /// The kernel itself; the full source is the target's prelude followed by this.
    pub body: String,
    pub launch: Launch,
    /// Buffers bound to the kernel's pointer parameters, in order.
    pub args: Vec<BufferId>,
    /// How the kernel uses each of `args` (same order), read from its own parameter list: a
    /// `const` pointer is read, any other written.
    pub access: Vec<Access>,
    /// Where the family had several configurations to choose from: which, and which it took.
    pub tune: Option<crate::arch::tuning::TuneSite>,
    /// Set on the one kernel of a persistent plan ([`super::persistent`]): its only parameter is
    /// a device table of the addresses of `args` (in order), and `launch.grid` is the most
    /// blocks it can use: the runtime launches as many as can be resident at once, at most that.
    pub persistent: Option<PersistentLaunch>,
}

/// What the runtime needs to know of a persistent kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PersistentLaunch {
    /// Kernels of the per-kernel plan it runs (its steps).
    pub steps: usize,
    /// Tasks it runs: each one or more blocks of one step's launch.
    pub tasks: usize,
}

/// How a kernel uses a buffer bound to one of its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

impl Kernel {
    /// The buffers this kernel writes, in parameter order.
    pub fn written(&self) -> impl Iterator<Item = BufferId> + '_ {
        self.args
            .iter()
            .zip(&self.access)
            .filter(|(_, &a)| a == Access::Write)
            .map(|(&b, _)| b)
    }
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
    /// Gathers to check after a run, in the order the interpreter would meet them.
    pub checks: Vec<IndexCheck>,
    /// A persistent plan's report of a wait that never ended ([`super::persistent`]).
    pub stall: Option<StallCheck>,
    /// What codegen was asked for and could not do here, one line each (an f32 matmul that
    /// asked for TF32 on a target without a TF32 atom runs exact f32, and says so): printed by
    /// the plan's listing, so `compile` shows it.
    pub notes: Vec<String>,
}

/// Where a persistent kernel records a dependency it waited for in vain (its bounded spin ran
/// out): a status buffer of two u64, the bitwise complement of the waiting step (0 while none
/// stalled) and the step it waited for, zeroed before every run and read after it.
#[derive(Clone, Debug, PartialEq)]
pub struct StallCheck {
    pub status: BufferId,
    /// The node of each step, in step order.
    pub steps: Vec<String>,
    /// Whether the kernel records its timeline after the report (`Persistent::Shaped`).
    pub timed: bool,
}

/// One step of a persistent kernel's timeline (device clock units: nanoseconds on NVIDIA).
#[derive(Clone, Debug, PartialEq)]
pub struct StepTiming {
    pub node: String,
    /// When its first task's body started and its last task ended.
    pub start: u64,
    pub end: u64,
    /// Its tasks' time waiting for their dependencies, and running, summed over its tasks.
    pub wait: u64,
    pub busy: u64,
}

/// A timed persistent kernel's timeline of one run (`Persistent::Shaped { timed: true, .. }`).
#[derive(Clone, Debug, PartialEq)]
pub struct Timeline {
    /// When the kernel's first block started and its last block left.
    pub kernel_start: u64,
    pub kernel_end: u64,
    /// The steps any task ran, in step order.
    pub steps: Vec<StepTiming>,
}

/// Little-endian u64 number `k` of a status buffer's bytes.
fn status_word(status: &[u8], k: usize) -> Option<u64> {
    let bytes = status.get(8 * k..8 * k + 8)?;
    Some(u64::from_le_bytes(bytes.try_into().ok()?))
}

impl StallCheck {
    /// The timeline from the status buffer's bytes (`None` unless `timed`): after the report's
    /// two words, four per step (the complement of its first body start, its last end, its
    /// tasks' wait and busy time), then the complement of the kernel's first block start and
    /// its last block exit. Steps no task ran are left out.
    pub fn timeline(&self, status: &[u8]) -> Option<Timeline> {
        if !self.timed {
            return None;
        }
        let word = |k: usize| status_word(status, k);
        let mut steps = Vec::new();
        for (i, node) in self.steps.iter().enumerate() {
            let at = 2 + 4 * i;
            let (first, end) = (word(at)?, word(at + 1)?);
            if first == 0 {
                continue;
            }
            steps.push(StepTiming {
                node: node.clone(),
                start: !first,
                end,
                wait: word(at + 2)?,
                busy: word(at + 3)?,
            });
        }
        let at = 2 + 4 * self.steps.len();
        Some(Timeline {
            kernel_start: !word(at)?,
            kernel_end: word(at + 1)?,
            steps,
        })
    }

    /// The waiting step's node and the node it waited for, from the status buffer's bytes;
    /// `None` when no wait stalled.
    pub fn stalled(&self, status: &[u8]) -> Option<(String, String)> {
        let name = |i: u64| {
            usize::try_from(i)
                .ok()
                .and_then(|i| self.steps.get(i))
                .cloned()
                .unwrap_or_else(|| format!("step {i}"))
        };
        match status_word(status, 0)? {
            0 => None,
            w => Some((name(!w), name(status_word(status, 1)?))),
        }
    }
}

impl KernelPlan {
    /// The buffer holding `id`'s memory and the element offset into it: `id` itself at 0, or
    /// an alias's base and offset.
    pub fn storage(&self, id: BufferId) -> (BufferId, usize) {
        match self.buffers[id].role {
            BufferRole::Alias { base, offset } => (base, offset),
            BufferRole::Input(_)
            | BufferRole::Weight(_)
            | BufferRole::QuantWeight(_)
            | BufferRole::Constant(_)
            | BufferRole::Computed
            | BufferRole::Workspace
            | BufferRole::Status
            | BufferRole::Counters
            | BufferRole::TensorMap { .. }
            | BufferRole::State { .. } => (id, 0),
        }
    }

    /// Adds a workspace of `elems` f32 elements for the kernels of node `node`; its id. It is
    /// named `<node>:workspace` for listings (a buffer's name binds nothing but inputs and
    /// weights).
    pub(crate) fn add_workspace(&mut self, node: &str, elems: usize) -> BufferId {
        self.add_typed_workspace(
            &format!("{node}:workspace"),
            TensorType::new(crate::ir::DType::F32, vec![elems]),
        )
    }

    /// Adds `n` zeroed counters (u32, stored as an i32 tensor) for the kernels of node `node`;
    /// its id. Named `<node>:counters` for listings.
    pub(crate) fn add_counters(&mut self, node: &str, n: usize) -> BufferId {
        let id = self.buffers.len();
        self.buffers.push(Buffer {
            id,
            name: format!("{node}:counters"),
            ty: TensorType::new(crate::ir::DType::I32, vec![n]),
            role: BufferRole::Counters,
        });
        id
    }

    /// Adds a tensor map of buffer `of` for the kernels of node `node`; its id. Named
    /// `<node>:map:<of's name>` for listings.
    pub(crate) fn add_tensor_map(
        &mut self,
        node: &str,
        of: BufferId,
        spec: crate::arch::tma::TensorMapSpec,
    ) -> BufferId {
        let id = self.buffers.len();
        let name = format!("{node}:map:{}", self.buffers[of].name);
        self.buffers.push(Buffer {
            id,
            name,
            // Opaque bytes; typed as 32-bit words as counters are.
            ty: TensorType::new(crate::ir::DType::I32, vec![crate::arch::tma::MAP_BYTES / 4]),
            role: BufferRole::TensorMap { of, spec },
        });
        id
    }

    /// Adds a workspace named `name` holding a `ty`; its id.
    pub(crate) fn add_typed_workspace(&mut self, name: &str, ty: TensorType) -> BufferId {
        let id = self.buffers.len();
        self.buffers.push(Buffer {
            id,
            name: name.to_string(),
            ty,
            role: BufferRole::Workspace,
        });
        id
    }

    /// Prelude and kernel, ready for hiprtc or NVRTC.
    pub fn source(&self, kernel: &Kernel) -> String {
        let mut s = prelude(&self.target);
        s.push('\n');
        s.push_str(&kernel.body);
        s
    }

    /// Every kernel with its launch and bindings, for snapshots and `--emit`. Names are shown
    /// through [`display_name`], so the listing is as inert as the kernels.
    pub fn listing(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "// rocmforge kernel plan: graph {}, target {}",
            display_name(&self.graph),
            self.target
        );
        let _ = writeln!(
            out,
            "// {} kernel(s), {} buffer(s)",
            self.kernels.len(),
            self.buffers.len()
        );
        for note in &self.notes {
            let _ = writeln!(out, "// note: {note}");
        }
        for (i, k) in self.kernels.iter().enumerate() {
            // The mark names the kernel's result: its written buffers other than a status
            // buffer (the error channel of gathers and cache writes), or the status buffer
            // where that is all it writes (the index check).
            let result_only = k
                .written()
                .any(|w| self.buffers[w].role != BufferRole::Status);
            let args: Vec<String> = k
                .args
                .iter()
                .enumerate()
                .map(|(j, &b)| {
                    format!(
                        "%{}{}",
                        display_name(&self.buffers[b].name),
                        if k.access.get(j) == Some(&Access::Write)
                            && (!result_only || self.buffers[b].role != BufferRole::Status)
                        {
                            " (write)"
                        } else {
                            ""
                        }
                    )
                })
                .collect();
            let _ = writeln!(
                out,
                "\n// ---- kernel {i}: {} for %{}",
                k.entry,
                display_name(&k.node)
            );
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
