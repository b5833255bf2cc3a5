//! A session on the CPU: the interpreter runs the optimised graph with the same API a GPU
//! session has.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::executable::Executable;
use crate::compile::CompileError;
use crate::interp::{self, Bindings};
use crate::ir::Tensor;
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
