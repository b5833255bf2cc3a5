//! Writing a bundle: the plan a run would launch (same passes, same codegen), every kernel's
//! source and, where a compiler for the target is here, its code object; the seeded inputs,
//! weights and constants `rocmforge run` would draw; and the interpreter's value of every
//! computed buffer, so a replay can be compared buffer by buffer.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use rayon::prelude::*;

use super::format::{
    paths, BundleArg, BundleBuffer, BundleCheck, BundleCompiler, BundleKernel, BundleOutput,
    BundlePlan, BundleTarget, CodeObjectKind, CompareRule, Role, FORMAT,
};
use super::{readme, signature, BundleError, DEFAULT_MAX_BUNDLE_BYTES};
use crate::arch::compiler_options;
use crate::arch::{Platform, Target};
use crate::codegen::{Buffer, BufferId, BufferRole, Kernel, KernelPlan};
use crate::compile::{lower, optimise, CompileError};
use crate::interp::{self, Bindings, InterpError};
use crate::ir::{
    random_input, random_quant, random_weight, DType, Graph, QuantTensor, Sample, Shape, Tensor,
    TensorError,
};
use crate::runtime::cuda::{compile_ptx, nvrtc_version};
use crate::runtime::{amd_compiler_for, hiprtc_rocm_version, AmdCompiler, AmdCompilerChoice};

#[derive(Clone, Debug)]
pub struct EmitOptions {
    /// As `CompileOptions::fuse`.
    pub fuse: bool,
    /// As `CompileOptions::seed` and `Bindings::random`: the data `rocmforge run --seed` uses.
    pub seed: u64,
    /// Which compiler makes AMD code objects.
    pub compiler: AmdCompilerChoice,
    /// The most bytes the bundle's files may hold together.
    pub max_bytes: u64,
}

impl Default for EmitOptions {
    fn default() -> Self {
        EmitOptions {
            fuse: true,
            seed: 0,
            compiler: AmdCompilerChoice::Auto,
            max_bytes: DEFAULT_MAX_BUNDLE_BYTES,
        }
    }
}

/// What was written.
#[derive(Clone, Debug)]
pub struct Emitted {
    pub plan: BundlePlan,
    /// Bytes of every file together.
    pub bytes: u64,
}

/// Bytes of `elements` of `dtype` with shape `dims`, or `None` past what a host or device
/// buffer can address.
pub(super) fn byte_size(dtype: DType, dims: &[usize]) -> Option<u64> {
    let n = Shape::new(dims.to_vec()).checked_numel(dtype)?;
    u64::try_from(n.checked_mul(dtype.size_bytes())?).ok()
}

/// Writes the bundle of `source` compiled for `target` into `dir` (new, or empty).
pub fn emit(
    source: &Graph,
    target: &Target,
    dir: &Path,
    options: &EmitOptions,
) -> Result<Emitted, BundleError> {
    let graph = optimise(source, options.fuse)?;
    let plan = lower(&graph, target)?;
    let buffers = describe_buffers(&graph, &plan)?;
    // The data files alone must fit before anything is drawn or interpreted.
    let data_bytes = buffers
        .iter()
        .filter(|b| b.role.is_data() || b.expected.is_some())
        .try_fold(0u64, |acc, b| acc.checked_add(b.bytes))
        .unwrap_or(u64::MAX);
    if data_bytes > options.max_bytes {
        return Err(BundleError::TooLarge {
            bytes: data_bytes,
            limit: options.max_bytes,
        });
    }
    let compiler = find_compiler(target, options.compiler);
    // A compiler asked for by name must be there; only `auto` falls back to sources alone.
    if let (Err(reason), AmdCompilerChoice::Hiprtc | AmdCompilerChoice::Clang) =
        (&compiler, options.compiler)
    {
        if target.platform == Platform::Amd {
            return Err(BundleError::NoCompiler {
                reason: reason.clone(),
            });
        }
    }
    let existed = dir.exists();
    let mut out = Writer::create(dir, options.max_bytes)?;
    let written = write_files(&mut out, &graph, &plan, buffers, compiler, target, options);
    if written.is_err() {
        // No half-written bundle is left behind: the directory was new or empty.
        let _ = std::fs::remove_dir_all(dir);
        if existed {
            let _ = std::fs::create_dir(dir);
        }
    }
    written
}

/// Everything after the directory is made: data, expected values, kernels, README, plan.
fn write_files(
    out: &mut Writer,
    graph: &Graph,
    plan: &KernelPlan,
    mut buffers: Vec<BundleBuffer>,
    compiler: Result<Compiler, String>,
    target: &Target,
    options: &EmitOptions,
) -> Result<Emitted, BundleError> {
    let data = host_data(plan, options.seed)?;
    for b in &plan.buffers {
        if let Some(bytes) = data.bytes(b.id) {
            out.write(&paths::data(b.id), &bytes)?;
        }
    }
    let expected = interpret(graph, plan, &buffers, &data, options.seed)?;
    for b in &mut buffers {
        match expected.get(&b.id) {
            Some(t) => out.write(&paths::expected(b.id), &t.to_bytes())?,
            None => b.expected = None,
        }
    }

    let compile_opts = compiler_options(target.platform);
    let (compiler_desc, missing) = match &compiler {
        Ok(c) => (Some(c.describe()), None),
        Err(why) => (None, Some(why.clone())),
    };
    // Identical kernels share an entry (it is the hash of the body): each is compiled and
    // written once.
    let mut seen = HashSet::new();
    let unique: Vec<&Kernel> = plan
        .kernels
        .iter()
        .filter(|k| seen.insert(k.entry.as_str()))
        .collect();
    let built = unique
        .par_iter()
        .map(|k| {
            let source = plan.source(k);
            let params = signature::parameters(&source, &k.entry).map_err(|reason| {
                BundleError::malformed(format!("generated kernel {}: {reason}", k.entry))
            })?;
            if params.len() != k.args.len() {
                return Err(BundleError::malformed(format!(
                    "generated kernel {} declares {} parameters but is bound to {} buffers",
                    k.entry,
                    params.len(),
                    k.args.len()
                )));
            }
            let code = match &compiler {
                Ok(c) => Some(c.compile(&source, &k.entry, target, &compile_opts)?),
                Err(_) => None,
            };
            Ok((source, params, code))
        })
        .collect::<Result<Vec<_>, BundleError>>()?;
    let kind = compiler.as_ref().ok().map(Compiler::kind);
    let mut params_of = HashMap::new();
    for (k, (source, params, code)) in unique.iter().zip(built) {
        out.write(&paths::source(&k.entry), source.as_bytes())?;
        if let (Some(code), Some(kind)) = (code, kind) {
            out.write(&paths::code_object(&k.entry, kind), &code)?;
        }
        params_of.insert(k.entry.as_str(), params);
    }
    let mut described = Vec::with_capacity(plan.kernels.len());
    for k in &plan.kernels {
        let params = params_of[k.entry.as_str()].clone();
        described.push(BundleKernel {
            entry: k.entry.clone(),
            family: k.family.to_string(),
            node: k.node.clone(),
            source: paths::source(&k.entry),
            code_object: kind.map(|kind| paths::code_object(&k.entry, kind)),
            grid: k.launch.grid,
            block: k.launch.block,
            shared_bytes: k.launch.shared_bytes,
            args: k
                .args
                .iter()
                .zip(params)
                .map(|(&buffer, (ctype, access))| BundleArg {
                    buffer,
                    ctype,
                    access,
                })
                .collect(),
        });
    }

    let bundle = BundlePlan {
        format: FORMAT.into(),
        graph: plan.graph.clone(),
        seed: options.seed,
        fused: options.fuse,
        target: BundleTarget {
            arch: target.arch.clone(),
            processor: target.processor.clone(),
            vendor: target.platform.into(),
            wave_size: target.wave_size,
        },
        compiler: BundleCompiler {
            name: compiler_desc,
            code_object: kind,
            options: compile_opts,
            missing,
        },
        kernels: described,
        buffers,
        outputs: plan
            .outputs
            .iter()
            .map(|o| BundleOutput {
                name: o.name.clone(),
                buffer: o.buffer,
                dtype: o.ty.dtype,
                shape: o.ty.shape.dims().to_vec(),
            })
            .collect(),
        checks: plan
            .checks
            .iter()
            .map(|c| BundleCheck {
                node: c.node.clone(),
                status: c.status,
                table_rows: c.table_rows as u64,
            })
            .collect(),
        compare: CompareRule::standard(),
    };
    out.write(paths::README, readme::render(&bundle).as_bytes())?;
    let json = serde_json::to_string_pretty(&bundle).map_err(|e| BundleError::Write {
        path: out.path(paths::PLAN),
        message: e.to_string(),
    })?;
    out.write(paths::PLAN, json.as_bytes())?;
    Ok(Emitted {
        plan: bundle,
        bytes: out.written,
    })
}

/// The buffer table: each buffer once (reshapes alias their operand's buffer in the plan, and
/// outputs name the buffer they view), with the files it will have.
fn describe_buffers(graph: &Graph, plan: &KernelPlan) -> Result<Vec<BundleBuffer>, BundleError> {
    plan.buffers
        .iter()
        .map(|b| {
            let bytes = byte_size(b.ty.dtype, b.ty.shape.dims()).ok_or_else(|| {
                BundleError::malformed(format!(
                    "buffer {} ({}) is too large to address",
                    b.id, b.ty
                ))
            })?;
            let role = match &b.role {
                BufferRole::Input(_) => Role::Input,
                BufferRole::Weight(_) => Role::Weight,
                BufferRole::QuantWeight(_) => Role::Quantized,
                BufferRole::Constant(_) => Role::Constant,
                BufferRole::Status => Role::Status,
                BufferRole::Counters => Role::Counters,
                BufferRole::Workspace => Role::Workspace,
                BufferRole::Computed if plan.outputs.iter().any(|o| o.buffer == b.id) => {
                    Role::Output
                }
                BufferRole::Computed => Role::Computed,
                BufferRole::State { .. } => Role::State,
                // Bundles are lowered with every slice a copy (`compile::lower`).
                BufferRole::Alias { .. } => {
                    return Err(BundleError::malformed(format!(
                        "buffer {} is an alias, which bundles cannot bind",
                        b.id
                    )))
                }
                // Bundles are lowered with the default options (`compile::lower`: no warpgroup
                // GEMM, so no tensor maps), and a replay has no driver encoding step.
                BufferRole::TensorMap { .. } => {
                    return Err(BundleError::malformed(format!(
                        "buffer {} is a TMA tensor map, which bundles do not record",
                        b.id
                    )))
                }
            };
            // A quantized weight's file holds its blocks as stored.
            let (bytes, quant) = match &b.role {
                BufferRole::QuantWeight(scheme) => {
                    let (_, n) = scheme.layout(&b.ty.shape).map_err(|e| {
                        CompileError::from(InterpError::QuantBinding {
                            name: b.name.clone(),
                            source: e,
                        })
                    })?;
                    (n as u64, Some(*scheme))
                }
                BufferRole::Input(_)
                | BufferRole::Weight(_)
                | BufferRole::Constant(_)
                | BufferRole::Computed
                | BufferRole::Workspace
                | BufferRole::Status
                | BufferRole::Counters
                | BufferRole::State { .. }
                | BufferRole::TensorMap { .. }
                | BufferRole::Alias { .. } => (bytes, None),
            };
            Ok(BundleBuffer {
                id: b.id,
                name: b.name.clone(),
                dtype: b.ty.dtype,
                shape: b.ty.shape.dims().to_vec(),
                bytes,
                role,
                data: role.is_data().then(|| paths::data(b.id)),
                // Cleared later for a buffer that holds no node's value (a kernel's scratch). A
                // state's is its value after the run.
                expected: (role == Role::State
                    || (role.is_computed() && reference_node(graph, b).is_some()))
                .then(|| paths::expected(b.id)),
                quant,
            })
        })
        .collect()
}

/// The node whose value a computed buffer holds: the node it is named after, with its type.
fn reference_node(graph: &Graph, b: &Buffer) -> Option<crate::ir::NodeId> {
    graph.find(&b.name).filter(|&id| graph.ty(id) == &b.ty)
}

/// What a bundle's data files hold, by buffer id: inputs, weights, constants and the states'
/// initial contents as tensors, quantized weights as their blocks.
struct HostData {
    tensors: HashMap<BufferId, Tensor>,
    quantized: HashMap<BufferId, QuantTensor>,
}

impl HostData {
    /// The bytes of buffer `id`'s data file.
    fn bytes(&self, id: BufferId) -> Option<Vec<u8>> {
        match (self.tensors.get(&id), self.quantized.get(&id)) {
            (Some(t), _) => Some(t.to_bytes()),
            (None, Some(q)) => Some(q.bytes().to_vec()),
            (None, None) => None,
        }
    }
}

/// The inputs, weights and constants, drawn exactly as `rocmforge run` draws them; quantized
/// weights' blocks as `Graph::compile` draws them; each state's contents at the start of the
/// run drawn like an input (standard normal, or uniform small integers), so that a kernel
/// reading a row the interpreter does not read shows in the comparison (a zeroed cache would
/// hide it).
fn host_data(plan: &KernelPlan, seed: u64) -> Result<HostData, BundleError> {
    fn host(b: &Buffer) -> impl Fn(TensorError) -> BundleError + '_ {
        move |source| {
            CompileError::from(InterpError::Host {
                node: b.name.clone(),
                source,
            })
            .into()
        }
    }
    let mut data = HostData {
        tensors: HashMap::new(),
        quantized: HashMap::new(),
    };
    for b in &plan.buffers {
        let t = match &b.role {
            BufferRole::Input(sample) => random_input(&b.name, &b.ty, sample, seed),
            BufferRole::Weight(init) => random_weight(&b.name, &b.ty, init, seed),
            BufferRole::Constant(values) => Tensor::constant(&b.ty, values),
            BufferRole::State { name } => random_input(name, &b.ty, &Sample::Normal, seed),
            BufferRole::QuantWeight(scheme) => {
                let q = random_quant(&b.name, *scheme, &b.ty.shape, seed).map_err(|source| {
                    CompileError::from(InterpError::QuantBinding {
                        name: b.name.clone(),
                        source,
                    })
                })?;
                data.quantized.insert(b.id, q);
                continue;
            }
            BufferRole::Computed
            | BufferRole::Status
            | BufferRole::Workspace
            | BufferRole::Counters
            | BufferRole::TensorMap { .. }
            | BufferRole::Alias { .. } => continue,
        }
        .map_err(host(b))?;
        data.tensors.insert(b.id, t);
    }
    Ok(data)
}

/// The interpreter's value of every computed buffer that holds a node's value, and of every
/// state after the run: the optimised graph (the one the kernels compute) run once from the
/// bundle's data with each such node made an output.
fn interpret(
    graph: &Graph,
    plan: &KernelPlan,
    buffers: &[BundleBuffer],
    data: &HostData,
    seed: u64,
) -> Result<HashMap<BufferId, Tensor>, BundleError> {
    let mut g = graph.clone();
    let first = g.outputs().len();
    let mut wanted = Vec::new();
    for (b, d) in plan.buffers.iter().zip(buffers) {
        if d.role == Role::State {
            continue;
        }
        if let (Some(_), Some(id)) = (&d.expected, reference_node(graph, b)) {
            g.add_output(id).map_err(CompileError::from)?;
            wanted.push(b.id);
        }
    }
    let mut bindings = Bindings {
        seed,
        ..Bindings::default()
    };
    let (mut weights, mut quantized, mut states) = (HashMap::new(), HashMap::new(), HashMap::new());
    for b in &plan.buffers {
        match (&b.role, data.tensors.get(&b.id), data.quantized.get(&b.id)) {
            (BufferRole::Input(_), Some(t), _) => {
                bindings.inputs.insert(b.name.clone(), t.clone());
            }
            (BufferRole::Weight(_), Some(t), _) => {
                weights.insert(b.name.clone(), t.clone());
            }
            (BufferRole::State { name }, Some(t), _) => {
                states.insert(name.clone(), t.clone());
            }
            (BufferRole::QuantWeight(_), _, Some(q)) => {
                quantized.insert(b.name.clone(), q.clone());
            }
            _ => {}
        }
    }
    let (values, next) = interp::run_with_state_data(&g, &bindings, &weights, &quantized, &states)
        .map_err(CompileError::from)?;
    let mut out: HashMap<BufferId, Tensor> = wanted
        .into_iter()
        .zip(values.into_iter().skip(first))
        .collect();
    for b in &plan.buffers {
        if let BufferRole::State { name } = &b.role {
            if let Some(t) = next.get(name) {
                out.insert(b.id, t.clone());
            }
        }
    }
    Ok(out)
}

/// The compiler that makes code objects for a target.
enum Compiler {
    Amd(AmdCompiler),
    Nvrtc((i32, i32)),
}

/// The compiler for `target`, or why there is none here.
fn find_compiler(target: &Target, choice: AmdCompilerChoice) -> Result<Compiler, String> {
    match target.platform {
        Platform::Amd => amd_compiler_for(target, choice).map(Compiler::Amd),
        Platform::Nvidia => nvrtc_version()
            .map(Compiler::Nvrtc)
            .map_err(|e| e.to_string()),
    }
}

impl Compiler {
    fn describe(&self) -> String {
        match self {
            Compiler::Amd(AmdCompiler::Hiprtc(rtc)) => {
                // hiprtc's own version is fixed at 9.0 in ROCm 5: the release says more.
                let rocm = hiprtc_rocm_version(rtc)
                    .map(|(a, b)| format!("ROCm {a}.{b}"))
                    .unwrap_or_else(|| "unknown ROCm release".into());
                format!(
                    "hiprtc {}.{} ({rocm}, {})",
                    rtc.version.0, rtc.version.1, rtc.library
                )
            }
            Compiler::Amd(AmdCompiler::Clang(clang)) => clang.describe(),
            Compiler::Nvrtc((major, minor)) => format!("nvrtc {major}.{minor}"),
        }
    }

    fn kind(&self) -> CodeObjectKind {
        match self {
            Compiler::Amd(_) => CodeObjectKind::Co,
            Compiler::Nvrtc(_) => CodeObjectKind::Ptx,
        }
    }

    fn compile(
        &self,
        source: &str,
        entry: &str,
        target: &Target,
        options: &[String],
    ) -> Result<Vec<u8>, BundleError> {
        let failed = |message: String| BundleError::CodeObject {
            entry: entry.to_string(),
            message,
        };
        match self {
            Compiler::Amd(AmdCompiler::Hiprtc(rtc)) => rtc
                .compile(source, entry, &target.arch, options)
                .map_err(|e| failed(e.to_string())),
            Compiler::Amd(AmdCompiler::Clang(clang)) => clang
                .compile(source, entry, target, options)
                .map(|o| o.code_object)
                .map_err(|e| failed(e.to_string())),
            Compiler::Nvrtc(_) => {
                compile_ptx(source, entry, &target.arch, options).map_err(|e| failed(e.to_string()))
            }
        }
    }
}

/// Files into the bundle directory, counting bytes against the limit before each write.
struct Writer<'a> {
    dir: &'a Path,
    written: u64,
    limit: u64,
}

impl<'a> Writer<'a> {
    /// Makes `dir` (refusing one that holds anything) and its subdirectories.
    fn create(dir: &'a Path, limit: u64) -> Result<Writer<'a>, BundleError> {
        let io = |path: &Path, e: std::io::Error| BundleError::Write {
            path: path.display().to_string(),
            message: e.to_string(),
        };
        if dir.exists() {
            let mut entries = std::fs::read_dir(dir).map_err(|e| io(dir, e))?;
            if entries.next().is_some() {
                return Err(BundleError::NotEmpty {
                    path: dir.display().to_string(),
                });
            }
        }
        for sub in ["kernels", "buffers", "expected"] {
            let path = dir.join(sub);
            std::fs::create_dir_all(&path).map_err(|e| io(&path, e))?;
        }
        Ok(Writer {
            dir,
            written: 0,
            limit,
        })
    }

    fn path(&self, rel: &str) -> String {
        self.dir.join(rel).display().to_string()
    }

    fn write(&mut self, rel: &str, bytes: &[u8]) -> Result<(), BundleError> {
        let total = self
            .written
            .checked_add(bytes.len() as u64)
            .filter(|&t| t <= self.limit)
            .ok_or(BundleError::TooLarge {
                bytes: self.written.saturating_add(bytes.len() as u64),
                limit: self.limit,
            })?;
        std::fs::write(self.dir.join(rel), bytes).map_err(|e| BundleError::Write {
            path: self.path(rel),
            message: e.to_string(),
        })?;
        self.written = total;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_are_checked() {
        assert_eq!(byte_size(DType::F16, &[3, 5]), Some(30));
        assert_eq!(byte_size(DType::Bool, &[0, 7]), Some(0));
        assert_eq!(byte_size(DType::F32, &[usize::MAX, 2]), None);
        assert_eq!(byte_size(DType::I64, &[1 << 31, 1 << 31]), None);
    }
}
