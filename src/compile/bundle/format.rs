//! `plan.json`: the typed, versioned description of a bundle. Every field a replay needs is
//! here; names (graph, nodes, buffers) are data only: JSON strings, never file names or code.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::arch::Platform;
use crate::ir::{DType, QuantScheme};

/// The format this build writes. Version 2 added persistent states (`state` buffers: initial
/// contents as data, final contents as expected values) and quantized weights (`quantized`
/// buffers: the blocks as stored, with their `quant` scheme).
pub const FORMAT: &str = "rocmforge-bundle/2";

/// The format before states and quantized weights; a version-1 plan is a version-2 plan with
/// neither, so this build reads it too.
pub const FORMAT_V1: &str = "rocmforge-bundle/1";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundlePlan {
    /// [`FORMAT`].
    pub format: String,
    /// The graph's name (data only).
    pub graph: String,
    /// The seed inputs and weights were drawn with (as `rocmforge run --seed`).
    pub seed: u64,
    /// Whether the default pass pipeline and matmul epilogues ran (`--no-fuse` turns them off).
    pub fused: bool,
    pub target: BundleTarget,
    pub compiler: BundleCompiler,
    /// In launch order.
    pub kernels: Vec<BundleKernel>,
    /// Indexed by id: `buffers[i].id == i`.
    pub buffers: Vec<BundleBuffer>,
    pub outputs: Vec<BundleOutput>,
    /// Status buffers to read after the run.
    pub checks: Vec<BundleCheck>,
    pub compare: CompareRule,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleTarget {
    /// The full arch name the kernels were generated for (`gfx90a:sramecc+:xnack-`, `sm_90`).
    pub arch: String,
    /// The processor alone (`gfx90a`, `sm_90`): a replay device must be this one.
    pub processor: String,
    pub vendor: Vendor,
    pub wave_size: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Vendor {
    Amd,
    Nvidia,
}

impl From<Platform> for Vendor {
    fn from(p: Platform) -> Vendor {
        match p {
            Platform::Amd => Vendor::Amd,
            Platform::Nvidia => Vendor::Nvidia,
        }
    }
}

/// Who made the code objects, or why there are none.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleCompiler {
    /// The compiler and its version (`hiprtc 5.2 (libamdhip64.so.5)`, `nvrtc 12.4`); `None` when
    /// no compiler for the target was found and the bundle holds sources only.
    pub name: Option<String>,
    /// The kind of every kernel's code object; `None` exactly when `name` is.
    pub code_object: Option<CodeObjectKind>,
    /// Options the sources were compiled with (a replay that recompiles uses them too).
    pub options: Vec<String>,
    /// Why there are no code objects.
    pub missing: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CodeObjectKind {
    /// An AMD code object (ELF, `hipModuleLoadData`).
    Co,
    /// PTX text from NVRTC (`cuModuleLoadData`; the driver compiles it for the GPU).
    Ptx,
}

impl CodeObjectKind {
    pub fn extension(self) -> &'static str {
        match self {
            CodeObjectKind::Co => "co",
            CodeObjectKind::Ptx => "ptx",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleKernel {
    /// The `extern "C"` entry point (`rf_<family>_<hash>`), also the stem of its files.
    pub entry: String,
    pub family: String,
    /// The node (or nodes) it computes (data only).
    pub node: String,
    /// `kernels/<entry>.hip`: prelude and body, compilable as it stands.
    pub source: String,
    /// `kernels/<entry>.<co|ptx>`, when the bundle has code objects.
    pub code_object: Option<String>,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Dynamic shared memory in bytes.
    pub shared_bytes: u32,
    /// One device pointer per parameter, in order.
    pub args: Vec<BundleArg>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleArg {
    pub buffer: usize,
    /// The parameter's C type as the source declares it (`const float*`).
    pub ctype: String,
    pub access: Access,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    /// A `const` pointer.
    Read,
    Write,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleBuffer {
    pub id: usize,
    /// The node whose value it holds (data only).
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Elements × dtype size: the exact size of its files and of the device allocation.
    pub bytes: u64,
    pub role: Role,
    /// `buffers/<id>.bin` for inputs, weights and constants.
    pub data: Option<String>,
    /// `expected/<id>.bin` for computed buffers: the interpreter's value (for a state, its
    /// value after the run).
    pub expected: Option<String>,
    /// The block scheme of a `quantized` buffer: its data file holds the blocks as stored
    /// (`bytes` is their size, not the dtype's × the element count); `dtype` and `shape` are
    /// those of the values the blocks hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quant: Option<QuantScheme>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Input,
    Weight,
    Constant,
    /// Written by a kernel, read by later ones.
    Computed,
    /// Written by a kernel and a graph output (possibly through a reshape, see `outputs`).
    Output,
    /// A kernel's error report: zeroed before the run, read after it (see `checks`).
    Status,
    /// Scratch the kernels of one node share (split-K partials): poisoned before the run,
    /// written and read by those kernels, holding no node's value, so never compared.
    Workspace,
    /// Counters kernels synchronise their blocks with (split-K arrival counts): zeroed when
    /// allocated, never poisoned; the kernels put them back to 0, so they hold no value to
    /// compare. Not part of format 1.
    Counters,
    /// A persistent tensor (a KV cache): uploaded from its data file before the run (its
    /// contents at the start of the run), written in place by kernels, and compared after the
    /// run with its expected file (the interpreter's state after one run).
    State,
    /// A quantized weight: its data file holds the blocks as stored, in the scheme `quant`
    /// names; only kernels that dequantize read it.
    Quantized,
}

impl Role {
    /// As `plan.json` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Role::Input => "input",
            Role::Weight => "weight",
            Role::Constant => "constant",
            Role::Computed => "computed",
            Role::Output => "output",
            Role::Status => "status",
            Role::Workspace => "workspace",
            Role::Counters => "counters",
            Role::State => "state",
            Role::Quantized => "quantized",
        }
    }

    /// Whether a kernel writes it and the interpreter has its value after the run (compared).
    pub fn is_computed(self) -> bool {
        match self {
            Role::Computed | Role::Output | Role::State => true,
            Role::Input
            | Role::Weight
            | Role::Constant
            | Role::Status
            | Role::Workspace
            | Role::Counters
            | Role::Quantized => false,
        }
    }

    /// Whether a kernel may write it: computed values, status reports and workspaces.
    pub fn is_written(self) -> bool {
        match self {
            Role::Computed
            | Role::Output
            | Role::Status
            | Role::Workspace
            | Role::Counters
            | Role::State => true,
            Role::Input | Role::Weight | Role::Constant | Role::Quantized => false,
        }
    }

    /// Whether its contents come with the bundle (a state's: those at the start of the run).
    pub fn is_data(self) -> bool {
        match self {
            Role::Input | Role::Weight | Role::Constant | Role::State | Role::Quantized => true,
            Role::Computed | Role::Output | Role::Status | Role::Workspace | Role::Counters => {
                false
            }
        }
    }
}

/// A graph output: the buffer holding it, seen with the output's own type (a reshaped output
/// shares the buffer of the value it reshapes, which is described once, in `buffers`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleOutput {
    pub name: String,
    pub buffer: usize,
    pub dtype: DType,
    pub shape: Vec<usize>,
}

/// A gather's index check: after the run, the status buffer's first little-endian u64 must be
/// 0; otherwise it is the bitwise complement of the first failing position and the second u64
/// the index found there.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleCheck {
    pub node: String,
    pub status: usize,
    /// Valid indices are `0..table_rows`.
    pub table_rows: u64,
}

/// How a replay's buffers are compared with `expected/`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompareRule {
    pub rule: String,
    /// The largest relative L2 error that passes, per dtype.
    pub tolerances: BTreeMap<DType, f64>,
}

impl CompareRule {
    pub fn standard() -> CompareRule {
        CompareRule {
            rule: "relative L2 error over the elements finite in both, sqrt(sum (got - want)^2 \
                   / sum want^2) (the absolute L2 error when want is all zeros), at most the \
                   dtype's tolerance; NaN and ±inf must sit at the same places in both"
                .into(),
            tolerances: DType::ALL.iter().map(|&d| (d, d.tolerance())).collect(),
        }
    }
}

/// Where each file of a bundle lives: derived from ids and entry names, never taken from
/// `plan.json`, which only has to agree.
pub mod paths {
    use super::CodeObjectKind;

    pub const PLAN: &str = "plan.json";
    pub const README: &str = "README.md";

    pub fn source(entry: &str) -> String {
        format!("kernels/{entry}.hip")
    }

    pub fn code_object(entry: &str, kind: CodeObjectKind) -> String {
        format!("kernels/{entry}.{}", kind.extension())
    }

    pub fn data(id: usize) -> String {
        format!("buffers/{id}.bin")
    }

    pub fn expected(id: usize) -> String {
        format!("expected/{id}.bin")
    }
}
