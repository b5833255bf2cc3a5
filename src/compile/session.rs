//! [`Executable`] and [`Session`]. An executable is what compiling a model makes: the graphs,
//! the kernel plan and memory plan, the loaded kernels and the weights resident on the device;
//! it never changes, so any number of sessions on any threads share it (`Arc` or `&`). A
//! session owns what runs need: a stream, the intermediate slots, one buffer per input (written
//! in place by [`Session::set_input`]), the status buffers of index checks and the persistent
//! state buffers. Once made, a session's runs allocate nothing on the device, so its kernel
//! launches are bound once and, where the runtime can, captured once as a graph and replayed
//! ([`crate::runtime::graph`]). Outputs stay on the device until asked for.
//!
//! On the CPU a session runs the interpreter with the same API.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use super::{compare_output, CompileError, CompileStats, MemoryPlan, Verification};
use crate::codegen::{self, BufferRole, KernelPlan};
use crate::interp::{self, Bindings, InterpError};
use crate::ir::{Graph, Op, QuantTensor, Tensor, TensorType};
use crate::runtime::device::LoadedKernel;
use crate::runtime::{
    CapturedGraph, Device, DeviceBuffer, KernelLaunch, LaunchList, ReplayOff, RuntimeError, Stream,
};

/// A compiled model: immutable, shared by every session made from it (`Send + Sync`).
pub struct Executable {
    pub(super) device: Device,
    /// The model as given (the reference `verify` runs, and the interface of inputs).
    pub source: Graph,
    /// After the passes.
    pub graph: Graph,
    pub plan: Option<KernelPlan>,
    pub memory: Option<MemoryPlan>,
    pub(super) kernels: Vec<Arc<LoadedKernel>>,
    /// Weights and constants on the device, uploaded once and only read by runs.
    pub(super) resident: HashMap<usize, Arc<DeviceBuffer>>,
    pub(super) weights: HashMap<String, Tensor>,
    /// Blocks of the quantized weights (uploaded as they are; the interpreter dequantizes them).
    pub(super) quantized: HashMap<String, QuantTensor>,
    pub(super) poison: bool,
    pub stats: CompileStats,
}

/// The name the first sessions-less API gave the executable; kept so call sites compile.
pub type Compiled = Executable;

/// A session made by [`Executable::prepare`]: the inputs bound, ready to launch again and again.
pub type Prepared<'e> = Session<'e>;

/// How a session runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionOptions {
    /// Capture the kernel launches once and replay them (where the runtime can; see
    /// [`Session::replay_off`]). `ROCMFORGE_REPLAY=0` turns it off whatever this says.
    /// Results are bitwise the same either way.
    pub replay: bool,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions { replay: true }
    }
}

/// The executable a session runs: borrowed, or shared (`Session<'static>`).
enum ExeRef<'e> {
    Borrowed(&'e Executable),
    Shared(Arc<Executable>),
}

impl std::ops::Deref for ExeRef<'_> {
    type Target = Executable;
    fn deref(&self) -> &Executable {
        match self {
            ExeRef::Borrowed(e) => e,
            ExeRef::Shared(e) => e,
        }
    }
}

/// An input of the model as given.
struct InputSlot {
    name: String,
    ty: TensorType,
    /// Its buffer in the plan (GPU), or whether the optimised graph still reads it (CPU); the
    /// passes may have removed an input nothing reads, which is still set like any other.
    buffer: Option<usize>,
    set: bool,
}

/// A session on the CPU: the interpreter's bindings and last outputs.
struct CpuSession {
    bindings: Bindings,
    outputs: Option<Vec<Tensor>>,
    /// Persistent tensors by name, kept across runs: each run passes them in and takes them
    /// back (see `docs/architecture.md`). Shared with the sessions made by
    /// [`Executable::session_sharing`].
    states: SharedStates,
}

/// A CPU session's states, shared by the sessions that share them.
type SharedStates = Arc<Mutex<HashMap<String, Tensor>>>;

/// The states, whatever a panicking holder left (each run replaces them whole).
fn lock(states: &SharedStates) -> std::sync::MutexGuard<'_, HashMap<String, Tensor>> {
    states.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A GPU session's state buffers: plan buffer id, name, buffer.
type StateBuffers = Vec<(usize, String, Arc<DeviceBuffer>)>;

/// A session on a GPU.
pub(super) struct GpuSession {
    // Field order is drop order: the captured graph and the launch list release their hold on
    // the buffers first, then the buffers are freed (ordered on the stream), then the stream.
    graph: Option<CapturedGraph>,
    /// Graphs captured in this session's life: at most one (inputs change in place).
    captures: usize,
    pub(super) launches: Arc<LaunchList>,
    replay: Result<(), ReplayOff>,
    slots: Vec<Arc<DeviceBuffer>>,
    /// Input buffers by plan buffer id.
    inputs: HashMap<usize, Arc<DeviceBuffer>>,
    /// Status buffers of the index checks, zeroed before every run.
    status: HashMap<usize, Arc<DeviceBuffer>>,
    /// Persistent state buffers by plan buffer id, with their names.
    states: StateBuffers,
    /// Shared with the sessions that share this one's states, so their runs are ordered.
    pub(super) stream: Arc<Stream>,
}

impl Drop for GpuSession {
    fn drop(&mut self) {
        // Runs still queued read the executable's weights, which may be freed right after the
        // session goes: wait for them. (An error here has nowhere to go; the buffers are
        // freed ordered on the stream regardless.)
        let _ = self.stream.synchronize();
    }
}

enum Backend {
    Cpu(CpuSession),
    Gpu(GpuSession),
}

/// A stream and every buffer a run needs, kept across runs. `Send`: move it to a thread; make
/// one per thread to run an executable from many at once.
pub struct Session<'e> {
    // Dropped before the executable it may hold the last reference to.
    backend: Backend,
    inputs: Vec<InputSlot>,
    ran: bool,
    exe: ExeRef<'e>,
}

impl Executable {
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// A session borrowing this executable, with default options.
    pub fn session(&self) -> Result<Session<'_>, CompileError> {
        Session::make(ExeRef::Borrowed(self), &SessionOptions::default())
    }

    pub fn session_with(&self, options: &SessionOptions) -> Result<Session<'_>, CompileError> {
        Session::make(ExeRef::Borrowed(self), options)
    }

    /// A session whose persistent states are `states_of`'s (the same buffers, not copies): what
    /// a run of either writes, the other reads, as a prefill plan and a decode plan share a KV
    /// cache. The two executables must be on one device and declare the same states (names and
    /// types), else [`CompileError::StateMismatch`]. On a GPU the new session also runs on
    /// `states_of`'s stream, so the runs of both are ordered without synchronising.
    pub fn session_sharing<'a>(
        &'a self,
        options: &SessionOptions,
        states_of: &Session<'_>,
    ) -> Result<Session<'a>, CompileError> {
        let shared = self.lend(states_of)?;
        Session::make_sharing(ExeRef::Borrowed(self), options, Some(shared))
    }

    /// `states_of`'s states, checked to be this executable's.
    fn lend(&self, states_of: &Session<'_>) -> Result<Shared, CompileError> {
        let mine = self.state_types();
        let theirs = states_of.exe.state_types();
        for (name, ty) in &mine {
            match theirs.get(name) {
                Some(t) if t == ty => {}
                other => {
                    return Err(CompileError::StateMismatch {
                        name: name.clone(),
                        expected: ty.to_string(),
                        found: other.map(ToString::to_string),
                    })
                }
            }
        }
        if let Some(name) = theirs.keys().find(|n| !mine.contains_key(*n)) {
            return Err(CompileError::StateMismatch {
                name: name.clone(),
                expected: "no such state".into(),
                found: Some(theirs[name].to_string()),
            });
        }
        let shared = match &states_of.backend {
            Backend::Cpu(cpu) => Shared::Cpu(cpu.states.clone()),
            Backend::Gpu(gpu) => Shared::Gpu(gpu.stream.clone(), gpu.states.clone()),
        };
        let on_gpu = self.plan.is_some() && self.memory.is_some();
        if on_gpu != matches!(shared, Shared::Gpu(..))
            || self.device.label() != states_of.exe.device.label()
        {
            return Err(CompileError::StateMismatch {
                name: mine.keys().min().cloned().unwrap_or_default(),
                expected: format!("states on {}", self.device.label()),
                found: Some(format!("states on {}", states_of.exe.device.label())),
            });
        }
        Ok(shared)
    }

    /// The persistent states of the optimised graph (what a session holds), by name.
    fn state_types(&self) -> HashMap<String, TensorType> {
        self.graph
            .node_ids()
            .filter(|&id| matches!(self.graph.op(id), Op::State { .. }))
            .map(|id| {
                let n = self.graph.node(id);
                (n.name.clone(), n.ty.clone())
            })
            .collect()
    }

    /// Runs on the device and returns the outputs in order: a session of its own (no replay:
    /// a single run would capture more than it launches), so calls from many threads at once
    /// are independent.
    pub fn run(&self, inputs: &Bindings) -> Result<Vec<Tensor>, CompileError> {
        let mut session = self.prepare_with(inputs, &SessionOptions { replay: false })?;
        session.run()?;
        session.outputs()
    }

    /// Checks `inputs` against the model as given: every input it declares is bound with its
    /// type (used or not: the interface does not change with what the passes removed), nothing
    /// else is bound, and no weight (weights are fixed when compiled).
    fn check_bindings(&self, inputs: &Bindings) -> Result<(), CompileError> {
        if let Some(name) = inputs.weights.keys().chain(inputs.quantized.keys()).min() {
            return Err(CompileError::WeightAtRun { name: name.clone() });
        }
        inputs.check_against(&self.source)?;
        Ok(())
    }

    /// A session with `inputs` set, for launching the kernels again and again (benchmarks time
    /// `launch` between stream synchronisations).
    pub fn prepare(&self, inputs: &Bindings) -> Result<Prepared<'_>, CompileError> {
        self.prepare_with(inputs, &SessionOptions::default())
    }

    fn prepare_with(
        &self,
        inputs: &Bindings,
        options: &SessionOptions,
    ) -> Result<Prepared<'_>, CompileError> {
        self.check_bindings(inputs)?;
        let mut session = self.session_with(options)?;
        session.bindings_seed(inputs.seed);
        for i in 0..session.inputs.len() {
            let name = session.inputs[i].name.clone();
            let t = inputs
                .inputs
                .get(&name)
                .ok_or_else(|| InterpError::MissingInput {
                    name: name.clone(),
                    ty: session.inputs[i].ty.clone(),
                })?;
            session.set_input(&name, t)?;
        }
        Ok(session)
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

    /// Names of the outputs, in order (those of the model as given).
    pub fn output_names(&self) -> Vec<String> {
        self.source
            .outputs()
            .iter()
            .map(|&o| self.source.node(o).name.clone())
            .collect()
    }
}

impl Session<'static> {
    /// A session sharing `exe`, which it keeps alive (`Send`: move it to another thread).
    pub fn new(exe: Arc<Executable>) -> Result<Session<'static>, CompileError> {
        Session::make(ExeRef::Shared(exe), &SessionOptions::default())
    }

    pub fn new_with(
        exe: Arc<Executable>,
        options: &SessionOptions,
    ) -> Result<Session<'static>, CompileError> {
        Session::make(ExeRef::Shared(exe), options)
    }

    /// [`Executable::session_sharing`] for a shared executable.
    pub fn new_sharing(
        exe: Arc<Executable>,
        options: &SessionOptions,
        states_of: &Session<'_>,
    ) -> Result<Session<'static>, CompileError> {
        let shared = exe.lend(states_of)?;
        Session::make_sharing(ExeRef::Shared(exe), options, Some(shared))
    }
}

/// Whether `ROCMFORGE_REPLAY=0` turns replay off.
fn replay_env_off() -> bool {
    std::env::var("ROCMFORGE_REPLAY").is_ok_and(|v| v == "0")
}

/// The states another session lends a new one.
enum Shared {
    Cpu(SharedStates),
    Gpu(Arc<Stream>, StateBuffers),
}

impl<'e> Session<'e> {
    fn make(exe: ExeRef<'e>, options: &SessionOptions) -> Result<Session<'e>, CompileError> {
        Session::make_sharing(exe, options, None)
    }

    fn make_sharing(
        exe: ExeRef<'e>,
        options: &SessionOptions,
        shared: Option<Shared>,
    ) -> Result<Session<'e>, CompileError> {
        let mut inputs = Vec::new();
        for id in exe.source.node_ids() {
            let node = exe.source.node(id);
            if let Op::Input { .. } = node.op {
                inputs.push(InputSlot {
                    name: node.name.clone(),
                    ty: node.ty.clone(),
                    buffer: None,
                    set: false,
                });
            }
        }
        let backend = match (&exe.plan, &exe.memory) {
            (Some(plan), Some(memory)) => {
                for slot in &mut inputs {
                    slot.buffer = plan
                        .buffers
                        .iter()
                        .find(|b| matches!(b.role, BufferRole::Input(_)) && b.name == slot.name)
                        .map(|b| b.id);
                }
                let lent = match shared {
                    Some(Shared::Gpu(stream, states)) => Some((stream, states)),
                    Some(Shared::Cpu(_)) | None => None,
                };
                Backend::Gpu(gpu_session(&exe, plan, memory, options, lent)?)
            }
            _ => {
                for slot in &mut inputs {
                    // The optimised graph's interpreter run takes the inputs it still reads.
                    slot.buffer = exe.graph.find(&slot.name).map(|_| 0);
                }
                // Every state starts zeroed, as a fresh session's device buffers do.
                let states = match shared {
                    Some(Shared::Cpu(states)) => states,
                    Some(Shared::Gpu(..)) | None => Arc::new(Mutex::new(
                        exe.state_types()
                            .into_iter()
                            .map(|(name, ty)| (name, Tensor::zeros(&ty)))
                            .collect(),
                    )),
                };
                Backend::Cpu(CpuSession {
                    bindings: Bindings::default(),
                    outputs: None,
                    states,
                })
            }
        };
        Ok(Session {
            backend,
            inputs,
            ran: false,
            exe,
        })
    }

    fn bindings_seed(&mut self, seed: u64) {
        if let Backend::Cpu(cpu) = &mut self.backend {
            cpu.bindings.seed = seed;
        }
    }

    pub fn executable(&self) -> &Executable {
        &self.exe
    }

    /// Writes input `name` in place, ordered on the session's stream (no allocation, no
    /// recompile, no re-capture: a replayed graph reads the new value). Its type must be the
    /// declared one.
    pub fn set_input(&mut self, name: &str, value: &Tensor) -> Result<(), CompileError> {
        let Some(slot) = self.inputs.iter_mut().find(|s| s.name == name) else {
            let is_weight = self.exe.source.node_ids().any(|id| {
                let n = self.exe.source.node(id);
                n.name == name && matches!(n.op, Op::Weight { .. })
            });
            return Err(if is_weight {
                CompileError::WeightAtRun { name: name.into() }
            } else {
                InterpError::UnknownBinding { name: name.into() }.into()
            });
        };
        let got = value.ty();
        if got != slot.ty {
            return Err(InterpError::BindingType {
                name: name.into(),
                expected: slot.ty.clone(),
                got,
            }
            .into());
        }
        match &mut self.backend {
            Backend::Cpu(cpu) => {
                if slot.buffer.is_some() {
                    cpu.bindings.inputs.insert(name.into(), value.clone());
                }
            }
            Backend::Gpu(gpu) => {
                if let Some(id) = slot.buffer {
                    gpu.stream.write(&gpu.inputs[&id], &value.to_bytes())?;
                }
            }
        }
        slot.set = true;
        Ok(())
    }

    /// Enqueues a run (asynchronous on a GPU: outputs are read when asked for). Every input
    /// must have been set (by this run or an earlier one). On the CPU the interpreter runs now,
    /// and an index out of range is its error here; on a GPU it is reported when an output is
    /// read.
    pub fn run(&mut self) -> Result<(), CompileError> {
        if let Some(s) = self.inputs.iter().find(|s| !s.set) {
            return Err(InterpError::MissingInput {
                name: s.name.clone(),
                ty: s.ty.clone(),
            }
            .into());
        }
        match &mut self.backend {
            Backend::Cpu(cpu) => {
                cpu.outputs = None;
                // The states move on only when the run succeeds (a write out of range leaves
                // them as they were).
                let mut states = lock(&cpu.states);
                let (outputs, next) = interp::run_with_state_data(
                    &self.exe.graph,
                    &cpu.bindings,
                    &self.exe.weights,
                    &self.exe.quantized,
                    &states,
                )?;
                *states = next;
                drop(states);
                cpu.outputs = Some(outputs);
            }
            Backend::Gpu(gpu) => {
                // What the checks found is about this run's inputs only.
                for s in gpu.status.values() {
                    gpu.stream.fill(s, 0)?;
                }
                if gpu.replay.is_ok() && !gpu.launches.is_empty() {
                    if gpu.graph.is_none() {
                        gpu.graph = Some(gpu.stream.capture(&gpu.launches)?);
                        gpu.captures += 1;
                    }
                    if let Some(graph) = &gpu.graph {
                        gpu.stream.replay(graph)?;
                    }
                } else {
                    gpu.stream.launch_list(&gpu.launches)?;
                }
            }
        }
        self.ran = true;
        Ok(())
    }

    /// [`Session::run`], by the name benchmarks and profiles use.
    pub fn launch(&mut self) -> Result<(), CompileError> {
        self.run()
    }

    /// Waits for this session's stream (and nothing else).
    pub fn synchronize(&self) -> Result<(), CompileError> {
        if let Backend::Gpu(gpu) = &self.backend {
            gpu.stream.synchronize()?;
        }
        Ok(())
    }

    /// Why this session launches kernels one by one instead of replaying a captured graph;
    /// `None` when it replays.
    pub fn replay_off(&self) -> Option<&ReplayOff> {
        match &self.backend {
            Backend::Cpu(_) => Some(&ReplayOff::Cpu),
            Backend::Gpu(gpu) => gpu.replay.as_ref().err(),
        }
    }

    /// How many times this session captured its launches as a graph: once, at its first run
    /// with replay on, and never again (inputs change in place); 0 without replay.
    pub fn captures(&self) -> usize {
        match &self.backend {
            Backend::Gpu(g) => g.captures,
            Backend::Cpu(_) => 0,
        }
    }

    /// The session's stream (GPU).
    pub fn stream(&self) -> Option<&Stream> {
        self.gpu().map(|g| &*g.stream)
    }

    pub(super) fn gpu(&self) -> Option<&GpuSession> {
        match &self.backend {
            Backend::Gpu(g) => Some(g),
            Backend::Cpu(_) => None,
        }
    }

    /// Index of output `name`.
    fn output_index(&self, name: &str) -> Result<usize, CompileError> {
        if !self.ran {
            return Err(CompileError::NotRun);
        }
        self.exe
            .source
            .outputs()
            .iter()
            .position(|&o| self.exe.source.node(o).name == name)
            .ok_or_else(|| CompileError::UnknownOutput { name: name.into() })
    }

    /// The interpreter's error for the first gather (in plan order, the order the interpreter
    /// runs them) whose kernel found an index outside its table in the last run.
    fn check_indices(&self, gpu: &GpuSession) -> Result<(), CompileError> {
        let plan = self.exe.plan.as_ref().expect("a GPU session has a plan");
        for check in &plan.checks {
            let bytes = gpu.stream.download(&gpu.status[&check.status])?;
            if let Some(index) = check.failed_index(&bytes) {
                return Err(match check.write_rows {
                    None => InterpError::IndexOutOfRange {
                        node: check.node.clone(),
                        index,
                        size: check.table_rows,
                    },
                    Some(len) => InterpError::CacheWriteOutOfRange {
                        node: check.node.clone(),
                        start: index,
                        len,
                        size: check.table_rows,
                    },
                }
                .into());
            }
        }
        Ok(())
    }

    /// Output `index`'s bytes (GPU), its type and its buffer; the run's index checks first.
    fn gpu_output(
        &self,
        gpu: &GpuSession,
        index: usize,
    ) -> Result<(TensorType, Arc<DeviceBuffer>), CompileError> {
        let plan = self.exe.plan.as_ref().expect("a GPU session has a plan");
        let o = &plan.outputs[index];
        let buffer = gpu_buffer(&self.exe, gpu, plan, o.buffer);
        Ok((o.ty.clone(), buffer))
    }

    /// Output `name` of the last run, copied to the host.
    pub fn output(&self, name: &str) -> Result<Tensor, CompileError> {
        let index = self.output_index(name)?;
        match &self.backend {
            Backend::Cpu(cpu) => {
                Ok(cpu.outputs.as_ref().ok_or(CompileError::NotRun)?[index].clone())
            }
            Backend::Gpu(gpu) => {
                let (ty, buffer) = self.gpu_output(gpu, index)?;
                let bytes = gpu.stream.download(&buffer)?;
                self.check_indices(gpu)?;
                tensor(&ty, &bytes)
            }
        }
    }

    /// Every output of the last run, in order, copied to the host.
    pub fn outputs(&self) -> Result<Vec<Tensor>, CompileError> {
        if !self.ran {
            return Err(CompileError::NotRun);
        }
        match &self.backend {
            Backend::Cpu(cpu) => cpu.outputs.clone().ok_or(CompileError::NotRun),
            Backend::Gpu(gpu) => {
                let n = self.exe.plan.as_ref().map_or(0, |p| p.outputs.len());
                let mut out = Vec::with_capacity(n);
                for i in 0..n {
                    let (ty, buffer) = self.gpu_output(gpu, i)?;
                    out.push((ty, gpu.stream.download(&buffer)?));
                }
                self.check_indices(gpu)?;
                out.iter().map(|(ty, bytes)| tensor(ty, bytes)).collect()
            }
        }
    }

    /// Output `name` of the last run copied into `out`, which must hold exactly its bytes
    /// (little-endian elements, as [`Tensor::to_bytes`]).
    pub fn output_to_host(&self, name: &str, out: &mut [u8]) -> Result<(), CompileError> {
        let index = self.output_index(name)?;
        let (ty, bytes) = match &self.backend {
            Backend::Cpu(cpu) => {
                let t = &cpu.outputs.as_ref().ok_or(CompileError::NotRun)?[index];
                (t.ty(), t.to_bytes())
            }
            Backend::Gpu(gpu) => {
                let (ty, buffer) = self.gpu_output(gpu, index)?;
                let bytes = gpu.stream.download(&buffer)?;
                self.check_indices(gpu)?;
                (ty, bytes)
            }
        };
        let want = ty.shape.numel() * ty.dtype.size_bytes();
        if out.len() != want {
            return Err(CompileError::OutputSize {
                name: name.into(),
                ty: ty.to_string(),
                want,
                got: out.len(),
            });
        }
        out.copy_from_slice(&bytes[..want]);
        Ok(())
    }

    /// Output `name` of the last run copied on the device into the start of `dst` (at least
    /// its bytes), then the session's stream synchronised, so `dst` may be used on any stream
    /// when this returns. GPU sessions only.
    pub fn output_to_device(&self, name: &str, dst: &DeviceBuffer) -> Result<(), CompileError> {
        let index = self.output_index(name)?;
        let Backend::Gpu(gpu) = &self.backend else {
            return Err(CompileError::NeedsGpu {
                what: "copying an output to a device buffer",
                device: self.exe.device.label().to_string(),
            });
        };
        let (ty, buffer) = self.gpu_output(gpu, index)?;
        let bytes = ty.shape.numel() * ty.dtype.size_bytes();
        gpu.stream.copy(&buffer, dst, bytes)?;
        gpu.stream.synchronize()?;
        self.check_indices(gpu)
    }

    /// Names of the persistent states, in plan order.
    pub fn state_names(&self) -> Vec<String> {
        match &self.backend {
            Backend::Cpu(cpu) => {
                let mut names: Vec<String> = lock(&cpu.states).keys().cloned().collect();
                names.sort();
                names
            }
            Backend::Gpu(gpu) => gpu.states.iter().map(|(_, n, _)| n.clone()).collect(),
        }
    }

    /// State `name` as it is now, copied to the host.
    pub fn state(&self, name: &str) -> Result<Tensor, CompileError> {
        let unknown = || CompileError::UnknownState { name: name.into() };
        match &self.backend {
            Backend::Cpu(cpu) => lock(&cpu.states).get(name).cloned().ok_or_else(unknown),
            Backend::Gpu(gpu) => {
                let plan = self.exe.plan.as_ref().expect("a GPU session has a plan");
                let (id, _, buffer) = gpu
                    .states
                    .iter()
                    .find(|(_, n, _)| n == name)
                    .ok_or_else(unknown)?;
                let bytes = gpu.stream.download(buffer)?;
                tensor(&plan.buffers[*id].ty, &bytes)
            }
        }
    }

    /// Zeroes every state (ordered on the session's stream).
    pub fn reset_state(&mut self) -> Result<(), CompileError> {
        self.fill_state(false)
    }

    /// Fills every state with NaN (every byte 0xff: a NaN in f32, f16 and bf16; -1 in the
    /// integer types), so a test shows that nothing reads a row no run has written.
    pub fn poison_state(&mut self) -> Result<(), CompileError> {
        self.fill_state(true)
    }

    fn fill_state(&mut self, poison: bool) -> Result<(), CompileError> {
        match &mut self.backend {
            Backend::Cpu(cpu) => {
                for t in lock(&cpu.states).values_mut() {
                    let ty = t.ty();
                    *t = if poison {
                        Tensor::from_bytes(
                            &ty,
                            &vec![0xff; ty.shape.numel() * ty.dtype.size_bytes()],
                        )
                        .map_err(|e| RuntimeError::Cuda(e.to_string()))?
                    } else {
                        Tensor::zeros(&ty)
                    };
                }
            }
            Backend::Gpu(gpu) => {
                for (_, _, b) in &gpu.states {
                    gpu.stream.fill(b, if poison { 0xff } else { 0 })?;
                }
            }
        }
        Ok(())
    }
}

/// A tensor of type `ty` from the first bytes of `bytes` (a slot may be larger than its value).
fn tensor(ty: &TensorType, bytes: &[u8]) -> Result<Tensor, CompileError> {
    let n = ty.shape.numel() * ty.dtype.size_bytes();
    Ok(Tensor::from_bytes(ty, &bytes[..n.min(bytes.len())])
        .map_err(|e| RuntimeError::Cuda(e.to_string()))?)
}

/// The session's (or executable's) buffer that plan buffer `id` is.
fn gpu_buffer(
    exe: &Executable,
    gpu: &GpuSession,
    plan: &KernelPlan,
    id: usize,
) -> Arc<DeviceBuffer> {
    let memory = exe
        .memory
        .as_ref()
        .expect("a GPU executable has a memory plan");
    match &plan.buffers[id].role {
        BufferRole::Computed | BufferRole::Workspace => gpu.slots[memory.slot_of[&id]].clone(),
        BufferRole::Input(_) => gpu.inputs[&id].clone(),
        BufferRole::Weight(_) | BufferRole::QuantWeight(_) | BufferRole::Constant(_) => {
            exe.resident[&id].clone()
        }
        BufferRole::Status => gpu.status[&id].clone(),
        BufferRole::State { .. } => gpu
            .states
            .iter()
            .find(|(b, _, _)| *b == id)
            .map(|(_, _, buf)| buf.clone())
            .expect("every state buffer is allocated with the session"),
    }
}

/// Allocates a GPU session's buffers, binds its launches and decides on replay.
fn gpu_session(
    exe: &Executable,
    plan: &KernelPlan,
    memory: &MemoryPlan,
    options: &SessionOptions,
    lent: Option<(Arc<Stream>, StateBuffers)>,
) -> Result<GpuSession, CompileError> {
    let (stream, lent_states) = match lent {
        Some((stream, states)) => (stream, Some(states)),
        None => (Arc::new(exe.device.new_stream()?), None),
    };
    let bytes =
        |id: usize| plan.buffers[id].ty.shape.numel() * plan.buffers[id].ty.dtype.size_bytes();
    let slots = memory
        .slot_bytes
        .iter()
        .map(|&b| stream.alloc(b, exe.poison).map(Arc::new))
        .collect::<Result<Vec<_>, _>>()?;
    let mut inputs = HashMap::new();
    let mut states = Vec::new();
    for b in &plan.buffers {
        match &b.role {
            // Poisoned: an input is set before any run reads it (checked), so this only shows
            // when a kernel reads past it.
            BufferRole::Input(_) => {
                inputs.insert(b.id, Arc::new(stream.alloc(bytes(b.id), exe.poison)?));
            }
            BufferRole::State { name } => {
                // A lent buffer of the same name (its type was checked against the graph's).
                let buffer = match &lent_states {
                    Some(lent) => lent
                        .iter()
                        .find(|(_, n, _)| n == name)
                        .map(|(_, _, buf)| buf.clone())
                        .ok_or_else(|| CompileError::StateMismatch {
                            name: name.clone(),
                            expected: b.ty.to_string(),
                            found: None,
                        })?,
                    // A state starts zeroed, as the interpreter starts it; a test that wants a
                    // poisoned cache tail writes one (`poison_state`).
                    None => {
                        let buf = stream.alloc(bytes(b.id), false)?;
                        stream.fill(&buf, 0)?;
                        Arc::new(buf)
                    }
                };
                states.push((b.id, name.clone(), buffer));
            }
            BufferRole::Weight(_)
            | BufferRole::QuantWeight(_)
            | BufferRole::Constant(_)
            | BufferRole::Computed
            | BufferRole::Workspace
            | BufferRole::Status => {}
        }
    }
    let status = plan
        .checks
        .iter()
        .map(|c| {
            Ok((
                c.status,
                Arc::new(stream.alloc(codegen::STATUS_BYTES, false)?),
            ))
        })
        .collect::<Result<HashMap<_, _>, RuntimeError>>()?;
    let replay = if !options.replay {
        Err(ReplayOff::Disabled)
    } else if replay_env_off() {
        Err(ReplayOff::Env)
    } else {
        stream.replay_support()
    };
    let mut gpu = GpuSession {
        graph: None,
        captures: 0,
        launches: Arc::new(stream.bind(&[])?),
        replay,
        slots,
        inputs,
        status,
        states,
        stream,
    };
    let launches: Vec<KernelLaunch> = plan
        .kernels
        .iter()
        .zip(&exe.kernels)
        .map(|(k, loaded)| KernelLaunch {
            kernel: loaded.clone(),
            grid: k.launch.grid,
            block: k.launch.block,
            shared_bytes: k.launch.shared_bytes,
            args: k
                .args
                .iter()
                .map(|&a| gpu_buffer(exe, &gpu, plan, a))
                .collect(),
        })
        .collect();
    gpu.launches = Arc::new(gpu.stream.bind(&launches)?);
    // The fills of fresh buffers are done before the session is handed out.
    gpu.stream.synchronize()?;
    Ok(gpu)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::CompileOptions;
    use crate::ir::{DType, Shape};

    /// Rows of a weight table gathered by an i32 index input, plus an input the passes drop.
    fn gather_graph() -> Graph {
        let mut g = Graph::new("session_gather");
        let table = g.weight("table", DType::F32, &[9, 4]).unwrap();
        let ids = g.input("ids", DType::I32, &[3]).unwrap();
        let x = g.input("x", DType::F32, &[3, 4]).unwrap();
        g.input("unused", DType::F32, &[2]).unwrap();
        let rows = g.gather(table, ids).unwrap();
        let sum = g.add(rows, x).unwrap();
        g.add_output(sum).unwrap();
        g
    }

    fn ids(v: &[i64]) -> Tensor {
        Tensor::from_i64(DType::I32, Shape::new(vec![v.len()]), v.to_vec()).unwrap()
    }

    fn compiled() -> Executable {
        Graph::compile_with(gather_graph(), &Device::cpu(), &CompileOptions::default()).unwrap()
    }

    #[test]
    fn a_cpu_session_runs_each_step_as_the_interpreter_does() {
        let g = gather_graph();
        let exe = compiled();
        let mut s = exe.session().unwrap();
        assert_eq!(s.replay_off(), Some(&ReplayOff::Cpu));
        assert!(matches!(s.outputs(), Err(CompileError::NotRun)));
        let base = Bindings::random(&g, 7);
        for name in ["x", "unused"] {
            s.set_input(name, &base.inputs[name]).unwrap();
        }
        for step in 0..5i64 {
            let v = [step % 9, (step * 4 + 1) % 9, 8 - step];
            s.set_input("ids", &ids(&v)).unwrap();
            s.run().unwrap();
            let b = base.clone().with_input("ids", ids(&v));
            let want = interp::run_with_weights(&g, &b, &exe.weights).unwrap();
            assert_eq!(s.outputs().unwrap(), want, "step {step}");
            let name = &exe.output_names()[0];
            assert_eq!(s.output(name).unwrap(), want[0]);
            let mut host = vec![0u8; 3 * 4 * 4];
            s.output_to_host(name, &mut host).unwrap();
            assert_eq!(host, want[0].to_bytes());
        }
        // An index out of range is the interpreter's error, at the run.
        s.set_input("ids", &ids(&[0, 9, 1])).unwrap();
        assert!(matches!(
            s.run(),
            Err(CompileError::Interp(InterpError::IndexOutOfRange {
                index: 9,
                ..
            }))
        ));
    }

    #[test]
    fn session_errors_are_typed() {
        let exe = compiled();
        let mut s = exe.session().unwrap();
        let f32s = |dims: &[usize]| {
            Tensor::from_f64(DType::F32, dims.to_vec(), &vec![0.5; dims.iter().product()]).unwrap()
        };
        assert!(matches!(
            s.set_input("nope", &f32s(&[3, 4])),
            Err(CompileError::Interp(InterpError::UnknownBinding { name })) if name == "nope"
        ));
        assert!(matches!(
            s.set_input("table", &f32s(&[9, 4])),
            Err(CompileError::WeightAtRun { name }) if name == "table"
        ));
        // Wrong shape, then wrong dtype.
        assert!(matches!(
            s.set_input("x", &f32s(&[4, 3])),
            Err(CompileError::Interp(InterpError::BindingType { name, .. })) if name == "x"
        ));
        let i32s = Tensor::from_i64(DType::I32, Shape::new(vec![3, 4]), vec![0; 12]).unwrap();
        assert!(matches!(
            s.set_input("x", &i32s),
            Err(CompileError::Interp(InterpError::BindingType { name, .. })) if name == "x"
        ));
        s.set_input("x", &f32s(&[3, 4])).unwrap();
        s.set_input("ids", &ids(&[1, 2, 3])).unwrap();
        // `unused` is part of the interface even though the passes removed it.
        assert!(matches!(
            s.run(),
            Err(CompileError::Interp(InterpError::MissingInput { name, .. })) if name == "unused"
        ));
        s.set_input("unused", &f32s(&[2])).unwrap();
        s.run().unwrap();
        assert!(matches!(
            s.output("nope"),
            Err(CompileError::UnknownOutput { name }) if name == "nope"
        ));
        let name = exe.output_names()[0].clone();
        let mut short = vec![0u8; 5];
        assert!(matches!(
            s.output_to_host(&name, &mut short),
            Err(CompileError::OutputSize {
                want: 48,
                got: 5,
                ..
            })
        ));
        assert!(matches!(
            s.state("kv"),
            Err(CompileError::UnknownState { name }) if name == "kv"
        ));
        assert!(s.state_names().is_empty());
        s.reset_state().unwrap();
    }

    /// A cache `kv` `[1, 1, rows, 2]` with `s` rows written at `start`; outputs its next value.
    fn cache_graph(s: usize, rows: usize) -> Executable {
        let mut g = Graph::new(format!("cache_s{s}"));
        let kv = g.state("kv", DType::F32, &[1, 1, rows, 2]).unwrap();
        let vals = g.input("vals", DType::F32, &[1, 1, s, 2]).unwrap();
        let start = g.input("start", DType::I32, &[1]).unwrap();
        let next = g.cache_write(kv, vals, start, 2).unwrap();
        let out = g.add(next, next).unwrap();
        g.add_output(out).unwrap();
        Graph::compile_with(g, &Device::cpu(), &CompileOptions::default()).unwrap()
    }

    fn f32s(dims: &[usize], v: &[f64]) -> Tensor {
        Tensor::from_f64(DType::F32, dims.to_vec(), v).unwrap()
    }

    /// A prefill-like executable writes two rows, a decode-like one sharing its states writes
    /// the third and sees all three; each session's `state` reads the same cache; a poisoned
    /// cache reads back NaN in both.
    #[test]
    fn sessions_sharing_states_see_each_others_writes() {
        let (wide, one) = (cache_graph(2, 5), cache_graph(1, 5));
        let mut a = wide.session().unwrap();
        let mut b = one.session_sharing(&SessionOptions::default(), &a).unwrap();
        a.set_input("vals", &f32s(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]))
            .unwrap();
        a.set_input("start", &ids(&[0])).unwrap();
        a.run().unwrap();
        b.set_input("vals", &f32s(&[1, 1, 1, 2], &[5.0, 6.0]))
            .unwrap();
        b.set_input("start", &ids(&[2])).unwrap();
        b.run().unwrap();
        let want = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 0.0, 0.0, 0.0, 0.0];
        let doubled: Vec<f64> = want.iter().map(|v| 2.0 * v).collect();
        assert_eq!(b.outputs().unwrap()[0].to_f64_vec(), doubled);
        assert_eq!(a.state("kv").unwrap().to_f64_vec(), want);
        assert_eq!(b.state("kv").unwrap().to_f64_vec(), want);
        // A session of its own does not see them.
        let c = one.session().unwrap();
        assert_eq!(c.state("kv").unwrap().to_f64_vec(), vec![0.0; 10]);
        b.poison_state().unwrap();
        assert!(a
            .state("kv")
            .unwrap()
            .to_f64_vec()
            .iter()
            .all(|v| v.is_nan()));
        a.reset_state().unwrap();
        assert_eq!(b.state("kv").unwrap().to_f64_vec(), vec![0.0; 10]);
    }

    #[test]
    fn sharing_states_of_another_type_is_a_typed_error() {
        let (short, long) = (cache_graph(1, 5), cache_graph(1, 6));
        let a = short.session().unwrap();
        assert!(matches!(
            long.session_sharing(&SessionOptions::default(), &a),
            Err(CompileError::StateMismatch { name, found: Some(_), .. }) if name == "kv"
        ));
        // No states where the other has one.
        let plain = compiled();
        assert!(matches!(
            plain.session_sharing(&SessionOptions::default(), &a),
            Err(CompileError::StateMismatch { name, .. }) if name == "kv"
        ));
    }

    #[test]
    fn many_sessions_of_one_executable_run_on_threads() {
        fn send<T: Send>() {}
        fn send_sync<T: Send + Sync>() {}
        send::<Session<'static>>();
        send_sync::<Executable>();
        let g = gather_graph();
        let exe = Arc::new(compiled());
        let base = Bindings::random(&g, 3);
        let threads: Vec<_> = (0..4i64)
            .map(|t| {
                let (exe, base, g) = (exe.clone(), base.clone(), g.clone());
                std::thread::spawn(move || {
                    let mut s = Session::new(exe.clone()).unwrap();
                    for name in ["x", "unused"] {
                        s.set_input(name, &base.inputs[name]).unwrap();
                    }
                    for step in 0..3 {
                        let v = [t, step, (t + step) % 9];
                        s.set_input("ids", &ids(&v)).unwrap();
                        s.run().unwrap();
                        let b = base.clone().with_input("ids", ids(&v));
                        let want = interp::run_with_weights(&g, &b, &exe.weights).unwrap();
                        assert_eq!(s.outputs().unwrap(), want);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
}
