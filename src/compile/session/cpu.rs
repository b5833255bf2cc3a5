//! Sessions on the CPU, with the same API a GPU session has: the reference interpreter runs the
//! optimised graph (device `interp`), or the fast CPU executor runs its plan of it (`cpu`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::executable::Executable;
use crate::compile::CompileError;
use crate::cpu::{self, Buf, CpuPlan};
use crate::interp::{self, Bindings, InterpError};
use crate::ir::{Tensor, TensorType};
use crate::runtime::RuntimeError;

/// A CPU session's states, shared by the sessions that share them.
pub(super) type SharedStates = Arc<Mutex<HashMap<String, Tensor>>>;

/// The states, whatever a panicking holder left (each run replaces them whole).
pub(super) fn lock(states: &SharedStates) -> MutexGuard<'_, HashMap<String, Tensor>> {
    states.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A session on the CPU: the interpreter's bindings and last outputs.
pub(super) struct CpuSession {
    pub(super) bindings: Bindings,
    pub(super) outputs: Option<Vec<Tensor>>,
    /// Persistent tensors by name, kept across runs: each run passes them in and takes them
    /// back (see `docs/architecture.md`). Shared with the sessions made by
    /// [`Executable::session_sharing`].
    pub(super) states: SharedStates,
}

impl CpuSession {
    /// A session with `lent` states, or its own, zeroed as a fresh GPU session's are.
    pub(super) fn new(exe: &Executable, lent: Option<SharedStates>) -> CpuSession {
        let states = lent.unwrap_or_else(|| {
            Arc::new(Mutex::new(
                exe.state_types()
                    .into_iter()
                    .map(|(name, ty)| (name, Tensor::zeros(&ty)))
                    .collect(),
            ))
        });
        CpuSession {
            bindings: Bindings::default(),
            outputs: None,
            states,
        }
    }

    /// Runs the interpreter now. The states move on only when the run succeeds (a write out of
    /// range leaves them as they were).
    pub(super) fn run(&mut self, exe: &Executable) -> Result<(), CompileError> {
        self.outputs = None;
        let mut states = lock(&self.states);
        let (outputs, next) = interp::run_with_state_data(
            &exe.graph,
            &self.bindings,
            &exe.weights,
            &exe.quantized,
            &states,
        )?;
        *states = next;
        drop(states);
        self.outputs = Some(outputs);
        Ok(())
    }

    /// Every state zeroed, or filled with 0xff bytes when `poison`.
    pub(super) fn fill_state(&mut self, poison: bool) -> Result<(), CompileError> {
        for t in lock(&self.states).values_mut() {
            let ty = t.ty();
            *t = if poison {
                Tensor::from_bytes(&ty, &vec![0xff; ty.shape.numel() * ty.dtype.size_bytes()])
                    .map_err(|e| RuntimeError::Cuda(e.to_string()))?
            } else {
                Tensor::zeros(&ty)
            };
        }
        Ok(())
    }
}

/// A fast CPU session's states, by name, shared by the sessions that share them: the buffers
/// themselves, handed to the running session and back (no copy).
pub(super) type FastStates = Arc<Mutex<HashMap<String, Buf>>>;

fn lock_fast(states: &FastStates) -> MutexGuard<'_, HashMap<String, Buf>> {
    states.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A session on the fast CPU device: the plan's session and the (maybe shared) states.
pub(super) struct FastSession {
    pub(super) session: cpu::CpuSession<'static>,
    pub(super) states: FastStates,
    /// The states' types, by name.
    types: HashMap<String, TensorType>,
}

impl FastSession {
    /// A session of `plan` with `lent` states (checked by `Executable::lend`), or its own
    /// zeroed ones.
    pub(super) fn new(
        exe: &Executable,
        plan: &Arc<CpuPlan>,
        lent: Option<FastStates>,
    ) -> Result<FastSession, CompileError> {
        let types = exe.state_types();
        let states = lent.unwrap_or_else(|| {
            Arc::new(Mutex::new(
                types
                    .iter()
                    .map(|(name, ty)| (name.clone(), Buf::zeros(ty)))
                    .collect(),
            ))
        });
        Ok(FastSession {
            session: plan.shared_session()?,
            states,
            types,
        })
    }

    /// Runs the plan now on the states: they move into the plan's session for the run and
    /// back after it, whatever the run did (a cache write out of range writes nothing).
    pub(super) fn run(&mut self) -> Result<(), CompileError> {
        let mut states = lock_fast(&self.states);
        for (name, buf) in states.iter_mut() {
            self.session.swap_state(name, buf)?;
        }
        let result = self.session.run();
        for (name, buf) in states.iter_mut() {
            self.session.swap_state(name, buf)?;
        }
        Ok(result?)
    }

    pub(super) fn state_names(&self) -> Vec<String> {
        let mut names: Vec<String> = lock_fast(&self.states).keys().cloned().collect();
        names.sort();
        names
    }

    pub(super) fn state(&self, name: &str) -> Result<Option<Tensor>, CompileError> {
        let states = lock_fast(&self.states);
        let (Some(buf), Some(ty)) = (states.get(name), self.types.get(name)) else {
            return Ok(None);
        };
        let t = buf.to_tensor(ty).map_err(|source| InterpError::Host {
            node: name.to_string(),
            source,
        })?;
        Ok(Some(t))
    }

    /// Every state zeroed, or filled with 0xff bytes when `poison` (NaN floats, -1 integers:
    /// what those bytes are in every dtype the states hold).
    pub(super) fn fill_state(&mut self, poison: bool) {
        for buf in lock_fast(&self.states).values_mut() {
            match buf {
                Buf::F(v) => v.fill(if poison { f32::NAN } else { 0.0 }),
                Buf::I(v) => v.fill(if poison { -1 } else { 0 }),
            }
        }
    }
}
