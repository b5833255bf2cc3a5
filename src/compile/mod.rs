//! `Graph::compile(model)`: passes → codegen → memory plan → kernels loaded → [`Compiled`], on
//! the best device or one given. On the CPU, a compiled model runs the interpreter.

pub mod bundle;
pub mod fold;
mod load;
mod memory_plan;
mod profile;
mod progress;
pub mod report;
mod session;
pub mod tune;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rayon::prelude::*;
use thiserror::Error;

use crate::codegen::{self, BufferRole, CodegenError, CodegenOptions, Kernel, KernelPlan};
use crate::interp::{Bindings, InterpError};
use crate::ir::{
    format, random_quant, random_weight, Graph, GraphError, Op, QuantError, QuantTensor, Tensor,
};
use crate::passes::{PassError, PassManager};
use crate::runtime::{Device, RuntimeError};

pub use memory_plan::{plan_memory, MemoryPlan};
pub use profile::{FamilyTime, KernelTime, Profile, HOLD_LIMIT};
use session::{Body, Planned};
pub use session::{Compiled, Executable, Prepared, Session, SessionOptions};
pub use tune::TuneStats;

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
    /// The fast CPU device (its conditions the interpreter shares come as [`Self::Interp`]).
    #[error(transparent)]
    Cpu(crate::cpu::CpuError),
    #[error(
        "`{name}` is bound as a weight, but weights are fixed when a model is compiled \
         (CompileOptions::weights); a run binds inputs only"
    )]
    WeightAtRun { name: String },
    /// A weight folded from parts (`fold.rs`) whose part has no data: every weight is bound
    /// before folding, so this is a bug, reported rather than a panic.
    #[error("folded weight `{name}`: its part `{part}` has no data bound (a rocmforge bug)")]
    FoldedPart { name: String, part: String },
    #[error(
        "profiling times kernels on a GPU, but this model runs on {device}, in the interpreter"
    )]
    ProfileNeedsGpu { device: String },
    #[error("{what} needs a GPU, but this model runs on {device}, in the interpreter")]
    NeedsGpu { what: &'static str, device: String },
    #[error("the session has not run yet, so it has no outputs")]
    NotRun,
    #[error("the model has no output `{name}`")]
    UnknownOutput { name: String },
    #[error("the model has no state `{name}`")]
    UnknownState { name: String },
    /// A kernel plan names a buffer a session has no device buffer for (a codegen bug).
    #[error("plan buffer {id} (`{name}`) has no device buffer")]
    UnboundBuffer { id: usize, name: String },
    /// [`Executable::session_sharing`] between executables whose states differ.
    #[error("cannot share state `{name}`: this model's is {expected}, the other session's {}", found.as_deref().unwrap_or("missing"))]
    StateMismatch {
        name: String,
        expected: String,
        found: Option<String>,
    },
    #[error("output `{name}` ({ty}) is {want} bytes, but the buffer given holds {got}")]
    OutputSize {
        name: String,
        ty: String,
        want: usize,
        got: usize,
    },
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
    /// A persistent kernel's task waited longer than its bound for a step it depends on (a
    /// dependency that can never be met): the run ended instead of hanging the GPU.
    #[error(
        "the persistent kernel's step `{step}` waited in vain for step `{waited_for}` (its \
         bounded wait ran out); the run's outputs are not valid"
    )]
    PersistentStall { step: String, waited_for: String },
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
    /// Fill every computed buffer with a NaN pattern when allocated and again before the first
    /// kernel that uses it in every run, so a kernel that leaves an element unwritten fails
    /// loudly even where an earlier kernel wrote the slot. [`Poison::Auto`] (the default) is on
    /// in debug builds and with `ROCMFORGE_POISON=1`; tests that must catch unwritten elements
    /// in release builds ask for [`Poison::On`].
    pub poison: Poison,
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
    /// Time every candidate configuration of the kernels that have several, keep the fastest
    /// (results persist per device in the tune cache); off: each family's default.
    pub tune: bool,
    pub rewrite_kernels: Option<KernelRewrite>,
    /// How the fast CPU device multiplies by quantized weights: [`crate::cpu::Precision::Exact`]
    /// (the default: within f32 rounding of the interpreter), or 8-bit activations where the
    /// caller opts in for speed. Other devices ignore it.
    pub cpu_precision: crate::cpu::Precision,
    /// f16/bf16 GEMMs on the sm_90a warpgroup kernels where the device has them
    /// ([`CodegenOptions::wgmma_gemm`], on by default).
    pub wgmma_gemm: bool,
    /// With `wgmma_gemm`: the TMA kernel's tile width ([`CodegenOptions::wgmma_tma`]).
    pub wgmma_tma: crate::codegen::TmaWidth,
    /// f16/bf16 attention on the sm_90a warpgroup kernel where the device has it
    /// ([`CodegenOptions::wgmma_attention`]; on by default).
    pub wgmma_attention: crate::codegen::WgmmaAttention,
    /// The plan as one persistent kernel ([`CodegenOptions::persistent`]; off by default).
    pub persistent: crate::codegen::Persistent,
    /// f32 GEMMs and f32 attention at TF32 precision on the device's TF32 matrix atom
    /// Where the GEMV with 8-bit activations quantizes A ([`CodegenOptions::quant_split`]).
    pub quant_split: crate::codegen::QuantSplit,
    /// ([`CodegenOptions::f32_matmul`]): opt-in, about 1e-3 relative error; exact f32 by
    /// default, and wherever the device has no TF32 atom.
    pub f32_matmul: crate::codegen::F32Matmul,
    /// GEMVs of 17 to 64 rows on the device's mma.sync atom ([`CodegenOptions::mma_gemv`];
    /// on by default).
    pub mma_gemv: bool,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            fuse: true,
            poison: Poison::Auto,
            memory_budget: None,
            seed: 0,
            weights: HashMap::new(),
            quantized: HashMap::new(),
            progress: true,
            tune: false,
            rewrite_kernels: None,
            cpu_precision: crate::cpu::Precision::Exact,
            wgmma_gemm: true,
            wgmma_tma: crate::codegen::TmaWidth::Auto,
            wgmma_attention: crate::codegen::WgmmaAttention::Auto,
            persistent: crate::codegen::Persistent::Off,
            f32_matmul: crate::codegen::F32Matmul::Exact,
            quant_split: crate::codegen::QuantSplit::Auto,
            mma_gemv: true,
        }
    }
}

/// Whether an executable poisons its computed buffers (see [`CompileOptions::poison`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Poison {
    /// On in debug builds and where `ROCMFORGE_POISON=1`, off otherwise.
    #[default]
    Auto,
    /// Always: fresh buffers, and every computed buffer again before each run uses it.
    On,
    /// Never (timing: the poisoning launches cost time).
    Off,
}

impl Poison {
    /// Whether this choice poisons, here and now.
    pub fn enabled(self) -> bool {
        match self {
            Poison::On => true,
            Poison::Off => false,
            Poison::Auto => {
                cfg!(debug_assertions) || std::env::var("ROCMFORGE_POISON").is_ok_and(|v| v == "1")
            }
        }
    }
}

/// The interpreter's conditions stay [`CompileError::Interp`] on the fast CPU device, so both
/// CPU devices fail alike for callers that match on them.
impl From<crate::cpu::CpuError> for CompileError {
    fn from(e: crate::cpu::CpuError) -> CompileError {
        match e {
            crate::cpu::CpuError::Interp(e) => CompileError::Interp(e),
            other => CompileError::Cpu(other),
        }
    }
}

impl From<bool> for Poison {
    fn from(on: bool) -> Poison {
        if on {
            Poison::On
        } else {
            Poison::Off
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
    /// Kernels compiled now (the rest came from the memory or disk cache), the poisoning
    /// kernel included when the executable poisons (so at most `kernels + 1`).
    pub compiled: usize,
    /// Kernels read from the disk cache, counted as `compiled` is.
    pub from_disk: usize,
    /// What tuning did (nothing unless `CompileOptions::tune`).
    pub tuning: TuneStats,
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
/// Weights that merged GEMMs read concatenated are folded into one weight each
/// ([`fold::fold_weight_concats`]), so the plan binds them instead of concatenating per run.
pub fn optimise(source: &Graph, fuse: bool) -> Result<Graph, CompileError> {
    Ok(optimise_folded(source, fuse)?.0)
}

/// [`optimise`], with the weights it folded (whose data [`fold::bind_folded`] binds).
pub fn optimise_folded(
    source: &Graph,
    fuse: bool,
) -> Result<(Graph, Vec<fold::FoldedWeight>), CompileError> {
    source.validate()?;
    let mut graph = source.clone();
    PassManager::pipeline(fuse).run(&mut graph)?;
    let folds = fold::fold_weight_concats(&mut graph)?;
    graph.validate()?;
    Ok((graph, folds))
}

/// The kernel plan of an optimised graph for a bundle, with matmul epilogues when fusing, and
/// every slice a copy (the bundle format binds buffers at their start).
fn lower(graph: &Graph, target: &crate::arch::Target) -> Result<KernelPlan, CompileError> {
    Ok(codegen::generate_with(
        graph,
        target,
        &CodegenOptions {
            copy_slices: true,
            // The bundle format has no tensor maps: the warpgroup GEMM reads by cp.async.
            wgmma_tma: crate::codegen::TmaWidth::Off,
            ..CodegenOptions::default()
        },
    )?)
}

/// Milliseconds, for the stage times `RUST_LOG=rocmforge=debug` shows.
fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
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

/// The fast CPU device's plan of `exe`'s optimised graph, on `exe`'s weights (lent to the plan
/// while it copies them, so the weights are never held three times).
fn cpu_plan(
    exe: &mut Executable,
    device: &Device,
    options: &CompileOptions,
) -> Result<crate::cpu::CpuPlan, CompileError> {
    let bindings = Bindings {
        weights: std::mem::take(&mut exe.weights),
        quantized: std::mem::take(&mut exe.quantized),
        seed: options.seed,
        ..Bindings::default()
    };
    let cpu_options = crate::cpu::CpuOptions {
        threads: device
            .cpu_thread_count()
            .unwrap_or_else(crate::cpu::physical_cores),
        precision: options.cpu_precision,
    };
    let plan = crate::cpu::CpuPlan::new(&exe.graph, &bindings, cpu_options);
    exe.weights = bindings.weights;
    exe.quantized = bindings.quantized;
    Ok(plan?)
}

fn compile(
    source: Graph,
    device: &Device,
    options: &CompileOptions,
) -> Result<Compiled, CompileError> {
    let start = Instant::now();
    let _span = tracing::debug_span!("compile", graph = %source.name).entered();
    // Weights the merged GEMMs read concatenated become one bound weight each (data below).
    let (graph, folds) = optimise_folded(&source, options.fuse)?;
    tracing::debug!(ms = ms(start.elapsed()), "passes done");
    // The budget belongs to the device, shared by every model on it: compiling with no budget
    // must not clear one that was set.
    if options.memory_budget.is_some() {
        device.memory().set_budget(options.memory_budget);
    }
    // Every weight gets its data now: supplied, or drawn from the seed.
    let mut weights = HashMap::new();
    let mut quantized = quantized_weights(&source, options)?;
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
    fold::bind_folded(&folds, &mut weights, &mut quantized)?;
    let poison = options.poison.enabled();
    let mut compiled = Executable {
        device: device.clone(),
        source,
        graph,
        body: Body::Interpreted,
        weights,
        quantized,
        poison,
        stats: CompileStats::default(),
    };
    let Some(target) = device.target().cloned() else {
        if !device.is_interp() {
            compiled.body = Body::Cpu(Arc::new(cpu_plan(&mut compiled, device, options)?));
        }
        compiled.stats.time = start.elapsed();
        return Ok(compiled);
    };
    let show = options.progress;
    let compile_opts = crate::arch::compiler_options(target.platform);
    let (codegen_options, tuning) = tune::codegen_options(
        &compiled.graph,
        device,
        &target,
        options.tune,
        options.f32_matmul,
        &compile_opts,
        show,
    )?;
    let codegen_options = CodegenOptions {
        wgmma_gemm: options.wgmma_gemm,
        // Tensor maps are encoded by the CUDA driver; through HIP (its NVIDIA platform) the
        // warpgroup GEMM reads its operands by cp.async instead.
        wgmma_tma: if device.kind() == crate::runtime::DeviceKind::Cuda {
            options.wgmma_tma
        } else {
            crate::codegen::TmaWidth::Off
        },
        wgmma_attention: options.wgmma_attention,
        persistent: options.persistent,
        f32_matmul: options.f32_matmul,
        quant_split: options.quant_split,
        mma_gemv: options.mma_gemv,
        ..codegen_options
    };
    let codegen_start = Instant::now();
    let mut plan = codegen::generate_with(&compiled.graph, &target, &codegen_options)?;
    tracing::debug!(
        kernels = plan.kernels.len(),
        ms = ms(codegen_start.elapsed()),
        "codegen done"
    );
    if let Some(rewrite) = &options.rewrite_kernels {
        plan.kernels.iter_mut().for_each(|k| rewrite(k));
    }
    let (before_compiles, before_disk) = (device.cache().compiles(), device.cache().disk_hits());
    let total = plan.kernels.len();
    let bar = progress::bar(total, &format!("{} kernels", target.arch), show);
    let kernels_start = Instant::now();
    let kernels = plan
        .kernels
        .par_iter()
        .map(|k| {
            let loaded =
                load::load_kernel(device, &target, &compile_opts, &k.entry, &plan.source(k));
            bar.inc(1);
            loaded
        })
        .collect::<Result<Vec<_>, _>>()?;
    bar.finish_and_clear();
    tracing::debug!(
        kernels = total,
        ms = ms(kernels_start.elapsed()),
        "kernels loaded"
    );
    let upload_start = Instant::now();
    // Weights and constants live on the device for the executable's lifetime.
    let stream = device.new_stream()?;
    let mut resident = HashMap::new();
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
            | BufferRole::Status
            | BufferRole::Counters
            | BufferRole::State { .. }
            // Encoded by each session, from its own buffers' addresses.
            | BufferRole::TensorMap { .. }
            | BufferRole::Alias { .. } => continue,
        };
        resident.insert(b.id, Arc::new(stream.upload(&data)?));
    }
    let memory = plan_memory(&plan);
    let poisoner = match poison {
        true => Some(session::poisoner(
            device,
            &target,
            &compile_opts,
            &plan,
            &memory,
            &stream,
        )?),
        false => None,
    };
    stream.synchronize()?;
    tracing::debug!(
        buffers = resident.len(),
        ms = ms(upload_start.elapsed()),
        "weights uploaded"
    );
    compiled.stats = CompileStats {
        time: start.elapsed(),
        kernels: total,
        compiled: device.cache().compiles() - before_compiles,
        from_disk: device.cache().disk_hits() - before_disk,
        tuning,
    };
    tracing::debug!(ms = ms(compiled.stats.time), "compile done");
    compiled.body = Body::Planned(Box::new(Planned {
        plan,
        memory,
        kernels,
        resident,
        poisoner,
    }));
    Ok(compiled)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp::Bindings;
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
