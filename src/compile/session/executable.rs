//! [`Executable`]: what compiling a model makes. It says what it is with [`Body`]: the CPU runs
//! the interpreter on the optimised graph, a GPU runs a kernel plan with its memory plan, its
//! loaded kernels and its resident weights. Nothing here changes after compiling, so any number
//! of sessions on any threads share one (`Arc` or `&`).

use std::collections::HashMap;
use std::sync::Arc;

use super::poison::Poisoner;
use super::{ExeRef, Prepared, Session, SessionOptions, Shared};
use crate::codegen::KernelPlan;
use crate::compile::{compare_output, CompileError, CompileStats, MemoryPlan, Verification};
use crate::interp::{self, Bindings, InterpError};
use crate::ir::{Graph, Op, QuantTensor, Tensor, TensorType};
use crate::runtime::device::LoadedKernel;
use crate::runtime::{Device, DeviceBuffer};

/// A compiled model: immutable, shared by every session made from it (`Send + Sync`).
pub struct Executable {
    pub(in crate::compile) device: Device,
    /// The model as given (the reference `verify` runs, and the interface of inputs).
    pub source: Graph,
    /// After the passes.
    pub graph: Graph,
    /// How it runs: in the interpreter, or as a plan of kernels.
    pub(in crate::compile) body: Body,
    pub(in crate::compile) weights: HashMap<String, Tensor>,
    /// Blocks of the quantized weights (uploaded as they are; the interpreter dequantizes them).
    pub(in crate::compile) quantized: HashMap<String, QuantTensor>,
    /// Whether sessions poison their computed slots (when allocated and before every run).
    pub(in crate::compile) poison: bool,
    pub stats: CompileStats,
}

/// What an executable runs.
pub(in crate::compile) enum Body {
    /// A device without a codegen target (the CPU): sessions run the interpreter on the
    /// optimised graph.
    Interpreted,
    /// A GPU: the kernels of a plan.
    Planned(Box<Planned>),
}

/// A kernel plan made ready for a device.
pub(in crate::compile) struct Planned {
    pub(in crate::compile) plan: KernelPlan,
    pub(in crate::compile) memory: MemoryPlan,
    /// One per kernel of `plan`, in order.
    pub(in crate::compile) kernels: Vec<Arc<LoadedKernel>>,
    /// Weights and constants on the device by plan buffer id, uploaded once and only read.
    pub(in crate::compile) resident: HashMap<usize, Arc<DeviceBuffer>>,
    /// What sessions poison computed buffers with, when the executable poisons.
    pub(in crate::compile) poisoner: Option<Poisoner>,
}

impl Executable {
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The kernel plan, on a GPU; `None` where the interpreter runs the model.
    pub fn plan(&self) -> Option<&KernelPlan> {
        match &self.body {
            Body::Planned(p) => Some(&p.plan),
            Body::Interpreted => None,
        }
    }

    /// The memory plan of the kernel plan's buffers, on a GPU.
    pub fn memory(&self) -> Option<&MemoryPlan> {
        match &self.body {
            Body::Planned(p) => Some(&p.memory),
            Body::Interpreted => None,
        }
    }

    /// Whether sessions poison every computed slot before each run (see
    /// [`crate::compile::Poison`]).
    pub fn poisons(&self) -> bool {
        self.poison
    }

    /// A session borrowing this executable, with default options.
    pub fn session(&self) -> Result<Session<'_>, CompileError> {
        Session::make(ExeRef::Borrowed(self), &SessionOptions::default(), None)
    }

    pub fn session_with(&self, options: &SessionOptions) -> Result<Session<'_>, CompileError> {
        Session::make(ExeRef::Borrowed(self), options, None)
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
        Session::make(ExeRef::Borrowed(self), options, Some(shared))
    }

    /// `states_of`'s states, checked to be this executable's.
    pub(super) fn lend(&self, states_of: &Session<'_>) -> Result<Shared, CompileError> {
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
        let shared = states_of.lend_states();
        let same_kind = matches!(
            (&self.body, &shared),
            (Body::Planned(_), Shared::Gpu(..)) | (Body::Interpreted, Shared::Cpu(_))
        );
        if !same_kind || self.device.label() != states_of.exe.device.label() {
            return Err(CompileError::StateMismatch {
                name: mine.keys().min().cloned().unwrap_or_default(),
                expected: format!("states on {}", self.device.label()),
                found: Some(format!("states on {}", states_of.exe.device.label())),
            });
        }
        Ok(shared)
    }

    /// The persistent states of the optimised graph (what a session holds), by name.
    pub(super) fn state_types(&self) -> HashMap<String, TensorType> {
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
        for (name, ty) in session.input_types() {
            let t = inputs
                .inputs
                .get(&name)
                .ok_or_else(|| InterpError::MissingInput {
                    name: name.clone(),
                    ty,
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
