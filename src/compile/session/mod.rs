//! [`Executable`] and [`Session`]. An executable is what compiling a model makes: the graphs,
//! the kernel plan and memory plan, the loaded kernels and the weights resident on the device;
//! it never changes, so any number of sessions on any threads share it (`Arc` or `&`). A
//! session owns what runs need: a stream, the intermediate slots, one buffer per input (written
//! in place by [`Session::set_input`]), the status buffers of index checks and the persistent
//! state buffers. Once made, a session's runs allocate nothing on the device, so its kernel
//! launches are bound once and, where the runtime can, captured once as a graph and replayed
//! ([`crate::runtime::graph`]). Outputs stay on the device until asked for.
//!
//! On the CPU a session runs the fast CPU executor's plan (device `cpu`) or the reference
//! interpreter (device `interp`) with the same API.

mod cpu;
mod executable;
mod gpu;
mod poison;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use crate::codegen::BufferRole;
use crate::compile::CompileError;
use crate::interp::InterpError;
use crate::ir::{Op, Tensor, TensorType};
use crate::runtime::{DeviceBuffer, ReplayOff, Stream};

use cpu::{lock, CpuSession, FastSession, FastStates, SharedStates};
pub use executable::Executable;
pub(in crate::compile) use executable::{Body, Planned};
pub(in crate::compile) use gpu::GpuSession;
use gpu::{tensor, StateBuffers};
pub(in crate::compile) use poison::poisoner;

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

enum Backend {
    Cpu(CpuSession),
    Fast(Box<FastSession>),
    Gpu(Box<GpuSession>),
}

/// The states another session lends a new one.
enum Shared {
    Cpu(SharedStates),
    Fast(FastStates),
    Gpu(Arc<Stream>, StateBuffers),
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

impl Session<'static> {
    /// A session sharing `exe`, which it keeps alive (`Send`: move it to another thread).
    pub fn new(exe: Arc<Executable>) -> Result<Session<'static>, CompileError> {
        Session::make(ExeRef::Shared(exe), &SessionOptions::default(), None)
    }

    pub fn new_with(
        exe: Arc<Executable>,
        options: &SessionOptions,
    ) -> Result<Session<'static>, CompileError> {
        Session::make(ExeRef::Shared(exe), options, None)
    }

    /// [`Executable::session_sharing`] for a shared executable.
    pub fn new_sharing(
        exe: Arc<Executable>,
        options: &SessionOptions,
        states_of: &Session<'_>,
    ) -> Result<Session<'static>, CompileError> {
        let shared = exe.lend(states_of)?;
        Session::make(ExeRef::Shared(exe), options, Some(shared))
    }
}

impl<'e> Session<'e> {
    /// A session of `exe`, with `shared`'s states when given (checked by `Executable::lend`).
    fn make(
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
        let backend = match &exe.body {
            Body::Planned(planned) => {
                for slot in &mut inputs {
                    slot.buffer = planned
                        .plan
                        .buffers
                        .iter()
                        .find(|b| matches!(b.role, BufferRole::Input(_)) && b.name == slot.name)
                        .map(|b| b.id);
                }
                let lent = match shared {
                    Some(Shared::Gpu(stream, states)) => Some((stream, states)),
                    Some(Shared::Cpu(_) | Shared::Fast(_)) | None => None,
                };
                Backend::Gpu(Box::new(GpuSession::new(&exe, planned, options, lent)?))
            }
            Body::Interpreted => {
                for slot in &mut inputs {
                    // The optimised graph's interpreter run takes the inputs it still reads.
                    slot.buffer = exe.graph.find(&slot.name).map(|_| 0);
                }
                let lent = match shared {
                    Some(Shared::Cpu(states)) => Some(states),
                    Some(Shared::Gpu(..) | Shared::Fast(_)) | None => None,
                };
                Backend::Cpu(CpuSession::new(&exe, lent))
            }
            Body::Cpu(plan) => {
                for slot in &mut inputs {
                    // The plan takes the inputs the optimised graph still reads.
                    slot.buffer = plan.has_input(&slot.name).then_some(0);
                }
                let lent = match shared {
                    Some(Shared::Fast(states)) => Some(states),
                    Some(Shared::Gpu(..) | Shared::Cpu(_)) | None => None,
                };
                Backend::Fast(Box::new(FastSession::new(&exe, plan, lent)?))
            }
        };
        Ok(Session {
            backend,
            inputs,
            ran: false,
            exe,
        })
    }

    /// This session's states, to lend a new session.
    fn lend_states(&self) -> Shared {
        match &self.backend {
            Backend::Cpu(cpu) => Shared::Cpu(cpu.states.clone()),
            Backend::Fast(fast) => Shared::Fast(fast.states.clone()),
            Backend::Gpu(gpu) => Shared::Gpu(gpu.stream.clone(), gpu.states.clone()),
        }
    }

    /// The inputs of the model as given, with their types.
    fn input_types(&self) -> Vec<(String, TensorType)> {
        self.inputs
            .iter()
            .map(|s| (s.name.clone(), s.ty.clone()))
            .collect()
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
        match (&mut self.backend, slot.buffer) {
            (Backend::Cpu(cpu), Some(_)) => {
                cpu.bindings.inputs.insert(name.into(), value.clone());
            }
            (Backend::Fast(fast), Some(_)) => fast.session.set_input(name, value)?,
            (Backend::Gpu(gpu), Some(id)) => gpu.set_input(id, value)?,
            (Backend::Cpu(_) | Backend::Fast(_) | Backend::Gpu(_), None) => {}
        }
        slot.set = true;
        Ok(())
    }

    /// Enqueues a run (asynchronous on a GPU: outputs are read when asked for). Every input
    /// must have been set (by this run or an earlier one). On the CPU the interpreter runs now,
    /// and an index out of range is its error here; on a GPU it is reported when an output is
    /// read. A GPU executable that poisons refills each computed buffer with NaN bytes before
    /// the first kernel that uses it, in every run.
    pub fn run(&mut self) -> Result<(), CompileError> {
        if let Some(s) = self.inputs.iter().find(|s| !s.set) {
            return Err(InterpError::MissingInput {
                name: s.name.clone(),
                ty: s.ty.clone(),
            }
            .into());
        }
        match &mut self.backend {
            Backend::Cpu(cpu) => cpu.run(&self.exe)?,
            Backend::Fast(fast) => fast.run()?,
            Backend::Gpu(gpu) => gpu.run()?,
        }
        self.ran = true;
        Ok(())
    }

    /// [`Session::run`], by the name benchmarks and profiles use.
    pub fn launch(&mut self) -> Result<(), CompileError> {
        self.run()
    }

    /// Waits for this session's stream (and nothing else).
    /// The timeline a timed persistent kernel (`codegen::Persistent::Shaped { timed: true,
    /// .. }`) recorded in the last run: per step, when its first task's body started, when its
    /// last task ended, and its tasks' wait and busy time (device clock: nanoseconds on
    /// NVIDIA), and the kernel's first block start and last block exit. `None` for any other
    /// plan or device.
    pub fn persistent_timeline(&self) -> Result<Option<crate::codegen::Timeline>, CompileError> {
        match &self.backend {
            Backend::Gpu(gpu) => gpu.persistent_timeline(),
            _ => Ok(None),
        }
    }

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
            Backend::Cpu(_) | Backend::Fast(_) => Some(&ReplayOff::Cpu),
            Backend::Gpu(gpu) => gpu.replay_off(),
        }
    }

    /// How many times this session captured its launches as a graph: once, at its first run
    /// with replay on, and never again (inputs change in place); 0 without replay.
    pub fn captures(&self) -> usize {
        match &self.backend {
            Backend::Gpu(g) => g.captures(),
            Backend::Cpu(_) | Backend::Fast(_) => 0,
        }
    }

    /// The session's stream (GPU).
    pub fn stream(&self) -> Option<&Stream> {
        self.gpu().map(|g| &*g.stream)
    }

    pub(in crate::compile) fn gpu(&self) -> Option<&GpuSession> {
        match &self.backend {
            Backend::Gpu(g) => Some(g),
            Backend::Cpu(_) | Backend::Fast(_) => None,
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

    /// Output `name` of the last run, copied to the host.
    pub fn output(&self, name: &str) -> Result<Tensor, CompileError> {
        let index = self.output_index(name)?;
        match &self.backend {
            Backend::Cpu(cpu) => {
                Ok(cpu.outputs.as_ref().ok_or(CompileError::NotRun)?[index].clone())
            }
            Backend::Fast(fast) => Ok(fast.session.output(index)?),
            Backend::Gpu(gpu) => {
                let (ty, buffer) = gpu.output(index);
                let bytes = gpu.stream.download(buffer)?;
                gpu.check_indices()?;
                tensor(ty, &bytes)
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
            Backend::Fast(fast) => Ok(fast.session.outputs()?),
            Backend::Gpu(gpu) => {
                let mut out = Vec::with_capacity(gpu.output_count());
                for i in 0..gpu.output_count() {
                    let (ty, buffer) = gpu.output(i);
                    out.push((ty, gpu.stream.download(buffer)?));
                }
                gpu.check_indices()?;
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
            Backend::Fast(fast) => {
                let t = fast.session.output(index)?;
                (t.ty(), t.to_bytes())
            }
            Backend::Gpu(gpu) => {
                let (ty, buffer) = gpu.output(index);
                let bytes = gpu.stream.download(buffer)?;
                gpu.check_indices()?;
                (ty.clone(), bytes)
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
        let (ty, buffer) = gpu.output(index);
        let bytes = ty.shape.numel() * ty.dtype.size_bytes();
        gpu.stream.copy(buffer, dst, bytes)?;
        gpu.stream.synchronize()?;
        gpu.check_indices()
    }

    /// Names of the persistent states, in plan order.
    pub fn state_names(&self) -> Vec<String> {
        match &self.backend {
            Backend::Cpu(cpu) => {
                let mut names: Vec<String> = lock(&cpu.states).keys().cloned().collect();
                names.sort();
                names
            }
            Backend::Fast(fast) => fast.state_names(),
            Backend::Gpu(gpu) => gpu.states.iter().map(|s| s.name.clone()).collect(),
        }
    }

    /// State `name` as it is now, copied to the host.
    pub fn state(&self, name: &str) -> Result<Tensor, CompileError> {
        let unknown = || CompileError::UnknownState { name: name.into() };
        match &self.backend {
            Backend::Cpu(cpu) => lock(&cpu.states).get(name).cloned().ok_or_else(unknown),
            Backend::Fast(fast) => fast.state(name)?.ok_or_else(unknown),
            Backend::Gpu(gpu) => gpu.state(name)?.ok_or_else(unknown),
        }
    }

    /// Zeroes every state (ordered on the session's stream).
    pub fn reset_state(&mut self) -> Result<(), CompileError> {
        match &mut self.backend {
            Backend::Cpu(cpu) => cpu.fill_state(false),
            Backend::Fast(fast) => {
                fast.fill_state(false);
                Ok(())
            }
            Backend::Gpu(gpu) => gpu.fill_state(0),
        }
    }

    /// Fills every state with NaN (every byte 0xff: a NaN in f32, f16 and bf16; -1 in the
    /// integer types), so a test shows that nothing reads a row no run has written.
    pub fn poison_state(&mut self) -> Result<(), CompileError> {
        match &mut self.backend {
            Backend::Cpu(cpu) => cpu.fill_state(true),
            Backend::Fast(fast) => {
                fast.fill_state(true);
                Ok(())
            }
            Backend::Gpu(gpu) => gpu.fill_state(0xff),
        }
    }
}
