//! A captured CUDA graph, destroyed on drop.

use std::sync::Arc;

use cudarc::driver::{sys, CudaStream};

use super::library::cuda_err;
use crate::runtime::error::RuntimeError;

/// A captured CUDA graph and its executable form, destroyed together on drop.
pub struct CudaGraphExec {
    /// Keeps the context alive for the destroy calls.
    pub(super) stream: Arc<CudaStream>,
    pub(super) graph: sys::CUgraph,
    pub(super) exec: sys::CUgraphExec,
}

// SAFETY: the handles may move to another thread (the driver's graph objects are not tied to
// one); the type is not `Sync`, so no two threads use them at once (graph objects are not
// internally synchronised), and they are destroyed once, on drop.
unsafe impl Send for CudaGraphExec {}

impl CudaGraphExec {
    /// Enqueues one replay on `stream`.
    pub(super) fn launch(&self, stream: &CudaStream) -> Result<(), RuntimeError> {
        self.stream.context().bind_to_thread().map_err(cuda_err)?;
        // SAFETY: the executable graph is live; the stream belongs to the same context.
        unsafe { sys::cuGraphLaunch(self.exec, stream.cu_stream()) }
            .result()
            .map_err(cuda_err)
    }
}

impl Drop for CudaGraphExec {
    fn drop(&mut self) {
        let _ = self.stream.context().bind_to_thread();
        // SAFETY: both handles were made by `capture` and are destroyed once, here; a replay
        // still queued keeps its resources until it completes (the driver's rule).
        unsafe {
            sys::cuGraphExecDestroy(self.exec);
            sys::cuGraphDestroy(self.graph);
        }
    }
}
