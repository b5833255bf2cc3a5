//! `Graph::compile(model)`: passes → codegen → memory plan → kernels loaded → [`Compiled`], on
//! the best device or one given. On the CPU, a compiled model runs the interpreter.

pub mod bundle;
mod memory_plan;
mod profile;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rayon::prelude::*;
use thiserror::Error;

use crate::codegen::{self, BufferRole, CodegenError, CodegenOptions, Kernel, KernelPlan};
use crate::interp::{self, Bindings, InterpError};
use crate::ir::{
    format, random_quant, random_weight, Graph, GraphError, Op, QuantError, QuantTensor, Tensor,
};
use crate::passes::{PassError, PassManager};
use crate::runtime::device::LoadedKernel;
use crate::runtime::{CacheKey, Device, DeviceBuffer, RuntimeError};

pub use memory_plan::{plan_memory, MemoryPlan};
pub use profile::{FamilyTime, KernelTime, Profile, HOLD_LIMIT};

#[derive(Debug, Error)]
pub enum CompileError {
    #[error(transparent)]
    Graph(#[from] GraphError),
    #[error(transparent)]
    Pass(#[from] PassError),
    #[error(transparent)]
    Codegen(#[from] CodegenError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Interp(#[from] InterpError),
    #[error(
        "`{name}` is bound as a weight, but weights are fixed when a model is compiled \
         (CompileOptions::weights); a run binds inputs only"
    )]
    WeightAtRun { name: String },
    #[error(
        "profiling times kernels on a GPU, but this model runs on {device}, in the interpreter"
    )]
    ProfileNeedsGpu { device: String },
    #[error(
        "profile: the stream was held {limit:?} and the host had still not enqueued the \
         {kernels} kernels of the run (a full launch queue?), so their times include the host's"
    )]
    ProfileHoldExpired { kernels: usize, limit: Duration },
    #[error("verify: output `{output}` is {got} in the run but {want} in the interpreter")]
    VerifyType {
        output: String,
        got: String,
        want: String,
    },
    #[error(
        "verify: output `{output}` holds NaN or ±inf at {count} place(s) where the interpreter \
         (unfused) does not agree; the first is element {index}: {got} in the run, {want} in \
         the interpreter"
    )]
    NonFiniteMismatch {
        output: String,
        count: usize,
        index: usize,
        got: f64,
        want: f64,
    },
}

/// A fault to plant in generated kernels, for tests that prove poisoning catches it.
pub type KernelRewrite = Arc<dyn Fn(&mut Kernel) + Send + Sync>;

#[derive(Clone)]
pub struct CompileOptions {
    /// Run the default pass pipeline (GEMM epilogues included); off: clean-up only, one kernel per op.
    pub fuse: bool,
    /// Fill fresh device buffers with a NaN pattern, so a kernel that reads what nobody wrote
    /// fails loudly. On in debug builds (and `ROCMFORGE_POISON=1`).
    pub poison: bool,
    /// Refuse device allocations past this many bytes (a typed error; the model stays usable).
    /// This sets the device's budget, shared by every model on it; `None` leaves it as it is
    /// (`device.memory().set_budget(None)` lifts it).
    pub memory_budget: Option<usize>,
    /// Seed for weights the model does not supply.
    pub seed: u64,
    /// Weights by name; others are drawn from `seed`.
    pub weights: HashMap<String, Tensor>,
    /// Blocks of quantized weights (`Op::Weight` with `quant`) by name; others are drawn from
    /// `seed` as random blocks.
    pub quantized: HashMap<String, QuantTensor>,
    /// Print compile progress on a terminal when it takes more than a moment.
    pub progress: bool,
    pub rewrite_kernels: Option<KernelRewrite>,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            fuse: true,
            poison: cfg!(debug_assertions)
                || std::env::var("ROCMFORGE_POISON").is_ok_and(|v| v == "1"),
            memory_budget: None,
            seed: 0,
            weights: HashMap::new(),
            quantized: HashMap::new(),
            progress: true,
            rewrite_kernels: None,
        }
    }
}

/// Anything that lowers to a graph.
pub trait Model {
    fn into_graph(self) -> Result<Graph, CompileError>;
}

impl Model for Graph {
    fn into_graph(self) -> Result<Graph, CompileError> {
        Ok(self)
    }
}
impl Model for &Graph {
    fn into_graph(self) -> Result<Graph, CompileError> {
        Ok(self.clone())
    }
}
impl Model for &Path {
    fn into_graph(self) -> Result<Graph, CompileError> {
        Ok(format::load(self)?)
    }
}
impl Model for PathBuf {
    fn into_graph(self) -> Result<Graph, CompileError> {
        Ok(format::load(&self)?)
    }
}
impl Model for &str {
    fn into_graph(self) -> Result<Graph, CompileError> {
        Ok(format::load(Path::new(self))?)
    }
}

/// How compiling went.
#[derive(Clone, Debug, Default)]
pub struct CompileStats {
    pub time: Duration,
    pub kernels: usize,
    /// Kernels compiled now (the rest came from the memory or disk cache).
    pub compiled: usize,
    pub from_disk: usize,
}

/// How one output of a run compares with the interpreter on the unfused graph.
#[derive(Clone, Debug, PartialEq)]
pub struct OutputCheck {
    pub name: String,
    /// Relative L2 error over the elements that are finite in both.
    pub error: f64,
    /// Elements that are NaN or ±inf in both, at the same places (and equal).
    pub non_finite: usize,
}

/// Per-output comparison of a run against the interpreter on the unfused graph.
#[derive(Clone, Debug)]
pub struct Verification {
    pub outputs: Vec<OutputCheck>,
}

impl Verification {
    pub fn max_error(&self) -> f64 {
        self.outputs.iter().map(|o| o.error).fold(0.0, f64::max)
    }
}

pub struct Compiled {
    device: Device,
    /// The model as given (the reference `verify` runs).
    pub source: Graph,
    /// After the passes.
    pub graph: Graph,
    pub plan: Option<KernelPlan>,
    pub memory: Option<MemoryPlan>,
    kernels: Vec<Arc<LoadedKernel>>,
    /// Weights and constants on the device, uploaded once and only read by runs.
    resident: HashMap<usize, DeviceBuffer>,
    weights: HashMap<String, Tensor>,
    /// Blocks of the quantized weights (uploaded as they are; the interpreter dequantizes them).
    quantized: HashMap<String, QuantTensor>,
    poison: bool,
    pub stats: CompileStats,
}

/// A run's stream and buffers (GPU), or its bindings (CPU).
pub struct Prepared<'a> {
    compiled: &'a Compiled,
    gpu: Option<GpuRun>,
    bindings: Bindings,
}

struct GpuRun {
    // Field order is drop order: buffers go before their stream.
    slots: Vec<DeviceBuffer>,
    uploaded: HashMap<usize, DeviceBuffer>,
    /// Status buffers of the plan's index checks, zeroed once: a run's inputs do not change
    /// between its launches, so neither does what the checks find.
    status: HashMap<usize, DeviceBuffer>,
    stream: crate::runtime::Stream,
}

impl Prepared<'_> {
    fn buffer(&self, id: usize) -> &DeviceBuffer {
        let (c, run) = (self.compiled, self.gpu.as_ref().expect("GPU run"));
        let plan = c.plan.as_ref().expect("GPU plan");
        match plan.buffers[id].role {
            BufferRole::Computed | BufferRole::Workspace => {
                &run.slots[c.memory.as_ref().expect("memory plan").slot_of[&id]]
            }
            BufferRole::Input(_) => &run.uploaded[&id],
            BufferRole::Weight(_) | BufferRole::QuantWeight(_) | BufferRole::Constant(_) => {
                &c.resident[&id]
            }
            BufferRole::Status => &run.status[&id],
        }
    }

    /// The interpreter's error for the first gather (in plan order, the order the interpreter
    /// runs them) whose kernel found an index outside its table.
    fn check_indices(&self, run: &GpuRun) -> Result<(), CompileError> {
        let plan = self.compiled.plan.as_ref().expect("GPU plan");
        for check in &plan.checks {
            let bytes = run.stream.download(&run.status[&check.status])?;
            if let Some(index) = check.failed_index(&bytes) {
                return Err(InterpError::IndexOutOfRange {
                    node: check.node.clone(),
                    index,
                    size: check.table_rows,
                }
                .into());
            }
        }
        Ok(())
    }

    /// Enqueues every kernel on this run's stream (asynchronous on a GPU).
    pub fn launch(&self) -> Result<(), CompileError> {
        let Some(run) = &self.gpu else {
            interp::run_with_data(
                &self.compiled.graph,
                &self.bindings,
                &self.compiled.weights,
                &self.compiled.quantized,
            )?;
            return Ok(());
        };
        let plan = self.compiled.plan.as_ref().expect("GPU plan");
        for (k, loaded) in plan.kernels.iter().zip(&self.compiled.kernels) {
            self.launch_kernel(run, k, loaded)?;
        }
        Ok(())
    }

    /// Enqueues one kernel of the plan with its buffers.
    fn launch_kernel(
        &self,
        run: &GpuRun,
        k: &Kernel,
        loaded: &LoadedKernel,
    ) -> Result<(), CompileError> {
        let args: Vec<&DeviceBuffer> = k.args.iter().map(|&a| self.buffer(a)).collect();
        run.stream.launch(
            loaded,
            k.launch.grid,
            k.launch.block,
            k.launch.shared_bytes,
            &args,
        )?;
        Ok(())
    }

    /// Waits for this run's stream (and nothing else).
    pub fn synchronize(&self) -> Result<(), CompileError> {
        if let Some(run) = &self.gpu {
            run.stream.synchronize()?;
        }
        Ok(())
    }

    /// The outputs of the last launch, copied to the host.
    pub fn outputs(&self) -> Result<Vec<Tensor>, CompileError> {
        let Some(run) = &self.gpu else {
            return Ok(interp::run_with_data(
                &self.compiled.graph,
                &self.bindings,
                &self.compiled.weights,
                &self.compiled.quantized,
            )?);
        };
        let plan = self.compiled.plan.as_ref().expect("GPU plan");
        let mut outs = Vec::with_capacity(plan.outputs.len());
        for o in &plan.outputs {
            let bytes = run.stream.download(self.buffer(o.buffer))?;
            let n = o.ty.shape.numel() * o.ty.dtype.size_bytes();
            outs.push(
                Tensor::from_bytes(&o.ty, &bytes[..n.min(bytes.len())])
                    .map_err(|e| RuntimeError::Cuda(e.to_string()))?,
            );
        }
        run.stream.synchronize()?;
        self.check_indices(run)?;
        Ok(outs)
    }
}

impl Graph {
    /// Compiles `model` with default options for the device `ROCMFORGE_DEVICE` names, else the
    /// best one here (see [`Device::best`]).
    pub fn compile(model: impl Model) -> Result<Compiled, CompileError> {
        let (device, _) = Device::best()?;
        Graph::compile_with(model, &device, &CompileOptions::default())
    }

    pub fn compile_with(
        model: impl Model,
        device: &Device,
        options: &CompileOptions,
    ) -> Result<Compiled, CompileError> {
        compile(model.into_graph()?, device, options)
    }
}

/// Compares output `name` of a run (`got`) with the interpreter's (`want`): NaN, +inf and -inf
/// must sit at the same places in both (there they count as equal); the error is the relative
/// L2 error over the elements finite in both.
fn compare_output(name: &str, got: &Tensor, want: &Tensor) -> Result<OutputCheck, CompileError> {
    if got.ty() != want.ty() {
        return Err(CompileError::VerifyType {
            output: name.to_string(),
            got: got.ty().to_string(),
            want: want.ty().to_string(),
        });
    }
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    // The class of a value: finite, NaN, +inf or -inf.
    let class = |x: f64| {
        if x.is_nan() {
            1
        } else if x == f64::INFINITY {
            2
        } else if x == f64::NEG_INFINITY {
            3
        } else {
            0
        }
    };
    let mut first: Option<usize> = None;
    let (mut mismatched, mut non_finite) = (0usize, 0usize);
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        match (class(a), class(b)) {
            (0, 0) => {
                num += (a - b).powi(2);
                den += b * b;
            }
            (ca, cb) if ca == cb => non_finite += 1,
            _ => {
                mismatched += 1;
                first.get_or_insert(i);
            }
        }
    }
    if let Some(index) = first {
        return Err(CompileError::NonFiniteMismatch {
            output: name.to_string(),
            count: mismatched,
            index,
            got: g[index],
            want: w[index],
        });
    }
    let error = if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    };
    Ok(OutputCheck {
        name: name.to_string(),
        error,
        non_finite,
    })
}

/// The graph a model runs as: validated, then the default pipeline (or clean-up only when not
/// fusing). `compile` and bundles both start here, so a bundle holds what a run launches.
fn optimise(source: &Graph, fuse: bool) -> Result<Graph, CompileError> {
    source.validate()?;
    let mut graph = source.clone();
    let pm = if fuse {
        PassManager::default_pipeline()
    } else {
        PassManager::cleanup()
    };
    pm.run(&mut graph)?;
    Ok(graph)
}

/// The kernel plan of an optimised graph, with matmul epilogues when fusing.
fn lower(graph: &Graph, target: &codegen::Target) -> Result<KernelPlan, CompileError> {
    Ok(codegen::generate_with(
        graph,
        target,
        &CodegenOptions::default(),
    )?)
}

/// Options every kernel is compiled with: hiprtc (and clang) take -O3; NVRTC optimises by
/// default and refuses it.
fn compiler_options(platform: codegen::Platform) -> Vec<String> {
    match platform {
        codegen::Platform::Amd => vec!["-O3".into()],
        codegen::Platform::Nvidia => vec![],
    }
}

/// The blocks of every quantized weight of `source`: supplied (checked against the weight's
/// scheme and shape; dense data for it is refused), or drawn from the seed.
fn quantized_weights(
    source: &Graph,
    options: &CompileOptions,
) -> Result<HashMap<String, QuantTensor>, CompileError> {
    let mut out = HashMap::new();
    for id in source.node_ids() {
        let node = source.node(id);
        let Op::Weight {
            quant: Some(scheme),
            ..
        } = &node.op
        else {
            continue;
        };
        let err = |source| InterpError::QuantBinding {
            name: node.name.clone(),
            source,
        };
        if let Some(t) = options.weights.get(&node.name) {
            return Err(err(QuantError::Mismatch {
                expected: format!("{scheme}{}", node.ty.shape),
                got: format!("dense {}", t.ty()),
            })
            .into());
        }
        let q = match options.quantized.get(&node.name) {
            Some(q) => q.clone(),
            None => random_quant(&node.name, *scheme, &node.ty.shape, options.seed).map_err(err)?,
        };
        q.check(*scheme, &node.ty.shape).map_err(err)?;
        out.insert(node.name.clone(), q);
    }
    Ok(out)
}

fn compile(
    source: Graph,
    device: &Device,
    options: &CompileOptions,
) -> Result<Compiled, CompileError> {
    let start = Instant::now();
    let graph = optimise(&source, options.fuse)?;
    // The budget belongs to the device, shared by every model on it: compiling with no budget
    // must not clear one that was set.
    if options.memory_budget.is_some() {
        device.memory().set_budget(options.memory_budget);
    }
    // Every weight gets its data now: supplied, or drawn from the seed.
    let mut weights = HashMap::new();
    let quantized = quantized_weights(&source, options)?;
    for id in source.node_ids() {
        let node = source.node(id);
        if let Op::Weight {
            init, quant: None, ..
        } = &node.op
        {
            if let Some(q) = options.quantized.get(&node.name) {
                return Err(InterpError::QuantBinding {
                    name: node.name.clone(),
                    source: QuantError::Mismatch {
                        expected: format!("dense {}", node.ty),
                        got: q.describe(),
                    },
                }
                .into());
            }
            let t =
                match options.weights.get(&node.name) {
                    Some(t) => t.clone(),
                    None => random_weight(&node.name, &node.ty, init, options.seed).map_err(
                        |source| InterpError::Host {
                            node: node.name.clone(),
                            source,
                        },
                    )?,
                };
            weights.insert(node.name.clone(), t);
        }
    }
    let mut compiled = Compiled {
        device: device.clone(),
        source,
        graph,
        plan: None,
        memory: None,
        kernels: vec![],
        resident: HashMap::new(),
        weights,
        quantized,
        poison: options.poison,
        stats: CompileStats::default(),
    };
    let Some(target) = device.target().cloned() else {
        compiled.stats.time = start.elapsed();
        return Ok(compiled);
    };
    let mut plan = lower(&compiled.graph, &target)?;
    if let Some(rewrite) = &options.rewrite_kernels {
        plan.kernels.iter_mut().for_each(|k| rewrite(k));
    }
    let (before_compiles, before_disk) = (device.cache().compiles(), device.cache().disk_hits());
    let total = plan.kernels.len();
    let done = AtomicUsize::new(0);
    let show = options.progress && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let compile_opts = compiler_options(target.platform);
    let toolchain = device.toolchain();
    let kernels = plan
        .kernels
        .par_iter()
        .map(|k| {
            let source = plan.source(k);
            let key = CacheKey {
                arch: target.arch.clone(),
                wave_size: target.wave_size,
                toolchain: toolchain.clone(),
                options: compile_opts.clone(),
                entry: k.entry.clone(),
                source: source.clone(),
            };
            let loaded = device.cache().get(
                &key,
                || device.compile_source(&source, &k.entry, &compile_opts),
                |image| device.load_kernel(image, &k.entry),
            );
            let n = done.fetch_add(1, Ordering::Relaxed) + 1;
            if show && start.elapsed() > Duration::from_millis(500) {
                eprint!(
                    "\r{} kernels: {n}/{total} ({:.1} s)  ",
                    target.arch,
                    start.elapsed().as_secs_f64()
                );
            }
            loaded
        })
        .collect::<Result<Vec<_>, _>>()?;
    if show && start.elapsed() > Duration::from_millis(500) {
        eprintln!();
    }
    // Weights and constants live on the device for the executable's lifetime.
    let stream = device.new_stream()?;
    for b in &plan.buffers {
        let data = match &b.role {
            BufferRole::Weight(_) => compiled.weights[&b.name].to_bytes(),
            // The blocks as stored: no f32 or f16 copy of a quantized weight on the device.
            BufferRole::QuantWeight(_) => compiled.quantized[&b.name].bytes().to_vec(),
            BufferRole::Constant(values) => Tensor::constant(&b.ty, values)
                .map_err(|source| InterpError::Host {
                    node: b.name.clone(),
                    source,
                })?
                .to_bytes(),
            BufferRole::Input(_)
            | BufferRole::Computed
            | BufferRole::Workspace
            | BufferRole::Status => continue,
        };
        compiled.resident.insert(b.id, stream.upload(&data)?);
    }
    stream.synchronize()?;
    compiled.memory = Some(plan_memory(&plan));
    compiled.stats = CompileStats {
        time: start.elapsed(),
        kernels: total,
        compiled: device.cache().compiles() - before_compiles,
        from_disk: device.cache().disk_hits() - before_disk,
    };
    compiled.kernels = kernels;
    compiled.plan = Some(plan);
    Ok(compiled)
}

impl Compiled {
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Runs on the device and returns the outputs in order. Each call has its own stream and
    /// buffers, so calls from many threads at once are independent.
    pub fn run(&self, inputs: &Bindings) -> Result<Vec<Tensor>, CompileError> {
        let prepared = self.prepare(inputs)?;
        prepared.launch()?;
        prepared.outputs()
    }

    /// Checks `inputs` against the model as given: every input it declares is bound with its
    /// type (used or not: the interface does not change with what the passes removed), nothing
    /// else is bound, and no weight (weights are fixed when compiled). Returns the bindings of
    /// the inputs the optimised graph still reads, which is what its interpreter run takes.
    fn bind_inputs(&self, inputs: &Bindings) -> Result<Bindings, CompileError> {
        if let Some(name) = inputs.weights.keys().chain(inputs.quantized.keys()).min() {
            return Err(CompileError::WeightAtRun { name: name.clone() });
        }
        inputs.check_against(&self.source)?;
        let mut kept = Bindings {
            seed: inputs.seed,
            ..Bindings::default()
        };
        for id in self.source.node_ids() {
            let node = self.source.node(id);
            let Op::Input { .. } = node.op else {
                continue;
            };
            let t = inputs
                .inputs
                .get(&node.name)
                .ok_or_else(|| InterpError::MissingInput {
                    name: node.name.clone(),
                    ty: node.ty.clone(),
                })?;
            if t.ty() != node.ty {
                return Err(InterpError::BindingType {
                    name: node.name.clone(),
                    expected: node.ty.clone(),
                    got: t.ty(),
                }
                .into());
            }
            if self.graph.find(&node.name).is_some() {
                kept.inputs.insert(node.name.clone(), t.clone());
            }
        }
        Ok(kept)
    }

    /// Allocates a run's buffers on a stream of its own and uploads `inputs`, for launching the
    /// kernels again and again (benchmarks time `launch` between stream synchronisations).
    pub fn prepare(&self, inputs: &Bindings) -> Result<Prepared<'_>, CompileError> {
        let bindings = self.bind_inputs(inputs)?;
        let (Some(plan), Some(memory)) = (&self.plan, &self.memory) else {
            return Ok(Prepared {
                compiled: self,
                gpu: None,
                bindings,
            });
        };
        let stream = self.device.new_stream()?;
        let slots: Vec<DeviceBuffer> = memory
            .slot_bytes
            .iter()
            .map(|&b| stream.alloc(b, self.poison))
            .collect::<Result<_, _>>()?;
        let mut uploaded: HashMap<usize, DeviceBuffer> = HashMap::new();
        let status = plan
            .checks
            .iter()
            .map(|c| Ok((c.status, stream.alloc(codegen::STATUS_BYTES, false)?)))
            .collect::<Result<HashMap<_, _>, RuntimeError>>()?;
        for b in &plan.buffers {
            if let BufferRole::Input(_) = b.role {
                // Checked by bind_inputs: every input the plan reads is bound with its type.
                let t = bindings
                    .inputs
                    .get(&b.name)
                    .ok_or_else(|| InterpError::MissingInput {
                        name: b.name.clone(),
                        ty: b.ty.clone(),
                    })?;
                uploaded.insert(b.id, stream.upload(&t.to_bytes())?);
            }
        }
        Ok(Prepared {
            compiled: self,
            gpu: Some(GpuRun {
                stream,
                slots,
                uploaded,
                status,
            }),
            bindings: Bindings::default(),
        })
    }

    /// Runs, and runs the interpreter on the unfused graph; reports the error per output. NaN
    /// and ±inf at different places in the two is an error naming the output and the element.
    pub fn verify(&self, inputs: &Bindings) -> Result<(Vec<Tensor>, Verification), CompileError> {
        let got = self.run(inputs)?;
        let want = interp::run_with_data(&self.source, inputs, &self.weights, &self.quantized)?;
        let outputs = self
            .source
            .outputs()
            .iter()
            .zip(got.iter().zip(&want))
            .map(|(&o, (g, w))| compare_output(&self.source.node(o).name, g, w))
            .collect::<Result<_, _>>()?;
        Ok((got, Verification { outputs }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::DType;

    fn t(values: &[f64]) -> Tensor {
        Tensor::from_f64(DType::F32, vec![values.len()], values).unwrap()
    }

    #[test]
    fn nan_and_inf_at_the_same_places_are_equal_and_the_error_is_over_finite_values() {
        let (inf, nan) = (f64::INFINITY, f64::NAN);
        let got = t(&[1.0, nan, inf, -inf, 2.0]);
        let want = t(&[1.0, nan, inf, -inf, 1.0]);
        let c = compare_output("o", &got, &want).unwrap();
        // Over the finite pairs (1, 1) and (2, 1): |(0, 1)| / |(1, 1)| = 1/√2.
        assert!((c.error - 0.5f64.sqrt()).abs() < 1e-12, "{}", c.error);
        assert_eq!(c.non_finite, 3);
        let only = compare_output("o", &t(&[nan, -inf]), &t(&[nan, -inf])).unwrap();
        assert_eq!((only.error, only.non_finite), (0.0, 2));
    }

    #[test]
    fn nan_or_inf_in_different_places_is_an_error_naming_the_element() {
        let (inf, nan) = (f64::INFINITY, f64::NAN);
        for (got, want, index, count) in [
            (vec![1.0, nan, 3.0], vec![1.0, 2.0, 3.0], 1, 1),
            (vec![1.0, 2.0, 3.0], vec![inf, 2.0, nan], 0, 2),
            (vec![inf, 0.0], vec![-inf, 0.0], 0, 1),
            (vec![nan, 0.0], vec![inf, 0.0], 0, 1),
        ] {
            match compare_output("o", &t(&got), &t(&want)) {
                Err(CompileError::NonFiniteMismatch {
                    output,
                    count: c,
                    index: i,
                    ..
                }) => assert_eq!((output.as_str(), c, i), ("o", count, index), "{got:?}"),
                other => panic!("{got:?} vs {want:?}: {other:?}"),
            }
        }
        let other_type = Tensor::from_f64(DType::F32, vec![3, 1], &[1.0, 2.0, 3.0]).unwrap();
        assert!(matches!(
            compare_output("o", &other_type, &t(&[1.0, 2.0, 3.0])),
            Err(CompileError::VerifyType { .. })
        ));
    }

    /// `y` is declared but read by nothing, so the passes remove it.
    fn unused_input_graph() -> Graph {
        let mut g = Graph::new("unused");
        let x = g.input("x", DType::F32, &[2, 3]).unwrap();
        g.input("y", DType::F32, &[4]).unwrap();
        let e = g.unary(crate::ir::UnaryOp::Exp, x).unwrap();
        g.add_output(e).unwrap();
        g
    }

    #[test]
    fn a_graph_with_an_unused_input_runs_and_verifies() {
        let g = unused_input_graph();
        let c = Graph::compile_with(&g, &Device::cpu(), &CompileOptions::default()).unwrap();
        assert!(
            c.graph.find("y").is_none(),
            "the passes drop the unused input"
        );
        let b = Bindings::random(&g, 3);
        let out = c.run(&b).unwrap();
        let x = b.inputs["x"].to_f64_vec();
        let want: Vec<f64> = x.iter().map(|v| (*v as f32).exp() as f64).collect();
        assert_eq!(out[0].to_f64_vec(), want);
        let (_, v) = c.verify(&b).unwrap();
        assert_eq!(v.max_error(), 0.0);
    }

    #[test]
    fn run_bindings_are_checked_against_the_model_as_given() {
        let g = unused_input_graph();
        let c = Graph::compile_with(&g, &Device::cpu(), &CompileOptions::default()).unwrap();
        let full = Bindings::random(&g, 3);
        let mut missing = full.clone();
        missing.inputs.remove("y");
        assert!(matches!(
            c.run(&missing),
            Err(CompileError::Interp(InterpError::MissingInput { name, .. })) if name == "y"
        ));
        let wrong = full.clone().with_input(
            "y",
            Tensor::from_f64(DType::F32, vec![5], &[0.0; 5]).unwrap(),
        );
        assert!(matches!(
            c.run(&wrong),
            Err(CompileError::Interp(InterpError::BindingType { name, .. })) if name == "y"
        ));
        let extra = full
            .clone()
            .with_input("z", Tensor::from_f64(DType::F32, vec![1], &[0.0]).unwrap());
        assert!(matches!(
            c.run(&extra),
            Err(CompileError::Interp(InterpError::UnknownBinding { name })) if name == "z"
        ));
        let mut weighted = full;
        weighted.weights.insert(
            "w".into(),
            Tensor::from_f64(DType::F32, vec![1], &[0.0]).unwrap(),
        );
        assert!(matches!(
            c.run(&weighted),
            Err(CompileError::WeightAtRun { name }) if name == "w"
        ));
    }
}
