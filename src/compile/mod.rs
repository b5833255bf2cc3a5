//! `Graph::compile(model)`: passes → codegen → memory plan → kernels loaded → [`Compiled`], on
//! the best device or one given. On the CPU, a compiled model runs the interpreter.

mod memory_plan;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rayon::prelude::*;
use thiserror::Error;

use crate::codegen::{self, BufferRole, CodegenError, CodegenOptions, Kernel, KernelPlan};
use crate::interp::{self, Bindings, InterpError};
use crate::ir::{format, random_weight, Graph, GraphError, Op, Tensor};
use crate::passes::{PassError, PassManager};
use crate::runtime::device::LoadedKernel;
use crate::runtime::{CacheKey, Device, DeviceBuffer, RuntimeError};

pub use memory_plan::{plan_memory, MemoryPlan};

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
}

/// A fault to plant in generated kernels, for tests that prove poisoning catches it.
pub type KernelRewrite = Arc<dyn Fn(&mut Kernel) + Send + Sync>;

#[derive(Clone)]
pub struct CompileOptions {
    /// Run the default pass pipeline and matmul epilogues; off: clean-up only, one kernel per op.
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

/// Per-output error of a run against the interpreter on the unfused graph.
#[derive(Clone, Debug)]
pub struct Verification {
    pub outputs: Vec<(String, f64)>,
}

impl Verification {
    pub fn max_error(&self) -> f64 {
        self.outputs.iter().map(|(_, e)| *e).fold(0.0, f64::max)
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
            BufferRole::Computed => {
                &run.slots[c.memory.as_ref().expect("memory plan").slot_of[&id]]
            }
            BufferRole::Input(_) => &run.uploaded[&id],
            BufferRole::Weight(_) | BufferRole::Constant(_) => &c.resident[&id],
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
            interp::run_with_weights(&self.compiled.graph, &self.bindings, &self.compiled.weights)?;
            return Ok(());
        };
        let plan = self.compiled.plan.as_ref().expect("GPU plan");
        for (k, loaded) in plan.kernels.iter().zip(&self.compiled.kernels) {
            let args: Vec<&DeviceBuffer> = k.args.iter().map(|&a| self.buffer(a)).collect();
            run.stream.launch(
                loaded,
                k.launch.grid,
                k.launch.block,
                k.launch.shared_bytes,
                &args,
            )?;
        }
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
            return Ok(interp::run_with_weights(
                &self.compiled.graph,
                &self.bindings,
                &self.compiled.weights,
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
    /// Compiles `model` for the best device with default options.
    pub fn compile(model: impl Model) -> Result<Compiled, CompileError> {
        Graph::compile_with(model, &Device::best().0, &CompileOptions::default())
    }

    pub fn compile_with(
        model: impl Model,
        device: &Device,
        options: &CompileOptions,
    ) -> Result<Compiled, CompileError> {
        compile(model.into_graph()?, device, options)
    }
}

fn relative_l2(a: &[f64], b: &[f64]) -> f64 {
    if a.len() != b.len() || a.iter().chain(b).any(|x| x.is_nan()) {
        return f64::INFINITY;
    }
    let num = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).powi(2))
        .sum::<f64>()
        .sqrt();
    let den = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    if den == 0.0 {
        num
    } else {
        num / den
    }
}

fn compile(
    source: Graph,
    device: &Device,
    options: &CompileOptions,
) -> Result<Compiled, CompileError> {
    let start = Instant::now();
    source.validate()?;
    let mut graph = source.clone();
    let pm = if options.fuse {
        PassManager::default_pipeline()
    } else {
        PassManager::cleanup()
    };
    pm.run(&mut graph)?;
    // The budget belongs to the device, shared by every model on it: compiling with no budget
    // must not clear one that was set.
    if options.memory_budget.is_some() {
        device.memory().set_budget(options.memory_budget);
    }
    // Every weight gets its data now: supplied, or drawn from the seed.
    let mut weights = HashMap::new();
    for id in source.node_ids() {
        let node = source.node(id);
        if let Op::Weight { init, .. } = &node.op {
            let t = options
                .weights
                .get(&node.name)
                .cloned()
                .unwrap_or_else(|| random_weight(&node.name, &node.ty, init, options.seed));
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
        poison: options.poison,
        stats: CompileStats::default(),
    };
    let Some(target) = device.target().cloned() else {
        compiled.stats.time = start.elapsed();
        return Ok(compiled);
    };
    let mut plan = codegen::generate_with(
        &compiled.graph,
        &target,
        &CodegenOptions {
            matmul_epilogues: options.fuse,
        },
    )?;
    if let Some(rewrite) = &options.rewrite_kernels {
        plan.kernels.iter_mut().for_each(|k| rewrite(k));
    }
    let (before_compiles, before_disk) = (device.cache().compiles(), device.cache().disk_hits());
    let total = plan.kernels.len();
    let done = AtomicUsize::new(0);
    let show = options.progress && std::io::IsTerminal::is_terminal(&std::io::stderr());
    // hiprtc takes clang's -O3; NVRTC optimises by default and refuses it.
    let compile_opts: Vec<String> = match target.platform {
        codegen::Platform::Amd => vec!["-O3".into()],
        codegen::Platform::Nvidia => vec![],
    };
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
            BufferRole::Constant(values) => {
                let n = b.ty.shape.numel();
                let full: Vec<f64> = if values.len() == n {
                    values.clone()
                } else {
                    vec![values[0]; n]
                };
                Tensor::from_f64(b.ty.dtype, b.ty.shape.clone(), &full)
                    .expect("constant values match")
                    .to_bytes()
            }
            BufferRole::Input(_) | BufferRole::Computed | BufferRole::Status => continue,
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
        if self.plan.is_none() {
            return Ok(interp::run_with_weights(
                &self.graph,
                inputs,
                &self.weights,
            )?);
        }
        let prepared = self.prepare(inputs)?;
        prepared.launch()?;
        prepared.outputs()
    }

    /// Allocates a run's buffers on a stream of its own and uploads `inputs`, for launching the
    /// kernels again and again (benchmarks time `launch` between stream synchronisations).
    pub fn prepare(&self, inputs: &Bindings) -> Result<Prepared<'_>, CompileError> {
        let (Some(plan), Some(memory)) = (&self.plan, &self.memory) else {
            return Ok(Prepared {
                compiled: self,
                gpu: None,
                bindings: inputs.clone(),
            });
        };
        inputs.check_against(&self.source)?;
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
                let t = inputs
                    .inputs
                    .get(&b.name)
                    .ok_or_else(|| InterpError::MissingInput {
                        name: b.name.clone(),
                        ty: b.ty.clone(),
                    })?;
                if t.ty() != b.ty {
                    return Err(InterpError::BindingType {
                        name: b.name.clone(),
                        expected: b.ty.clone(),
                        got: t.ty(),
                    }
                    .into());
                }
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

    /// Runs, and runs the interpreter on the unfused graph; reports the error per output.
    pub fn verify(&self, inputs: &Bindings) -> Result<(Vec<Tensor>, Verification), CompileError> {
        let got = self.run(inputs)?;
        let want = interp::run_with_weights(&self.source, inputs, &self.weights)?;
        let names = self
            .source
            .outputs()
            .iter()
            .map(|&o| self.source.node(o).name.clone());
        let outputs = names
            .zip(got.iter().zip(&want))
            .map(|(n, (g, w))| (n, relative_l2(&g.to_f64_vec(), &w.to_f64_vec())))
            .collect();
        Ok((got, Verification { outputs }))
    }
}
