//! The HIP runtime's handles as owned values: each destroyed (or freed, or unloaded) once, on
//! drop, with the device bound first.

use std::ffi::{c_int, c_void};

use super::api::{Err, GraphApi, Handle, Runtime};
use crate::runtime::error::RuntimeError;
use std::sync::Arc;

/// A captured HIP graph and its executable form, destroyed together on drop.
pub struct HipGraphExec {
    pub(super) rt: Arc<Runtime>,
    pub(super) api: GraphApi,
    pub(super) ordinal: c_int,
    pub(super) graph: Handle,
    pub(super) exec: Handle,
}

// SAFETY: the handles may move to another thread; the type is not `Sync`, so no two threads
// use them at once (graph objects are not internally synchronised), and they are destroyed
// once, on drop.
unsafe impl Send for HipGraphExec {}

impl HipGraphExec {
    /// Enqueues one replay on `stream`.
    pub(super) fn launch(&self, stream: &HipStream) -> Result<(), RuntimeError> {
        // SAFETY: the ordinal was checked when the device opened; the executable graph is live
        // and the stream on the same device.
        let code = unsafe {
            (self.rt.api.set_device)(self.ordinal);
            (self.api.launch)(self.exec, stream.handle)
        };
        self.rt.check("hipGraphLaunch", code)
    }
}

impl Drop for HipGraphExec {
    fn drop(&mut self) {
        // SAFETY: both handles were made by `capture` and are destroyed once, here.
        unsafe {
            (self.rt.api.set_device)(self.ordinal);
            (self.api.exec_destroy)(self.exec);
            (self.api.destroy)(self.graph);
        }
    }
}

/// A timing event, destroyed on drop.
pub struct HipEvent {
    pub(super) rt: Arc<Runtime>,
    pub(super) ordinal: c_int,
    pub(super) handle: Handle,
}

// SAFETY: HIP events may be used from any thread; the event is destroyed exactly once.
unsafe impl Send for HipEvent {}
unsafe impl Sync for HipEvent {}

/// `hipErrorNotReady`: the event's work is still queued.
pub(super) const HIP_ERROR_NOT_READY: Err = 600;

impl HipEvent {
    /// Whether the stream has reached this event, without waiting.
    pub fn is_complete(&self) -> Result<bool, RuntimeError> {
        let api = &self.rt.api;
        // SAFETY: the event is live and was recorded on this device.
        let code = unsafe {
            (api.set_device)(self.ordinal);
            (api.event_query)(self.handle)
        };
        if code == HIP_ERROR_NOT_READY {
            return Ok(false);
        }
        self.rt.check("hipEventQuery", code).map(|()| true)
    }

    /// Milliseconds from this event to `end`, once the stream has reached both.
    pub fn elapsed_ms(&self, end: &HipEvent) -> Result<f32, RuntimeError> {
        let api = &self.rt.api;
        // SAFETY: both events are live and were recorded on this device.
        unsafe {
            (api.set_device)(self.ordinal);
            self.rt
                .check("hipEventSynchronize", (api.event_synchronize)(self.handle))?;
            self.rt
                .check("hipEventSynchronize", (api.event_synchronize)(end.handle))?;
        }
        let mut ms = 0.0f32;
        // SAFETY: both events are complete; `ms` is a valid out-pointer.
        self.rt.check("hipEventElapsedTime", unsafe {
            (api.event_elapsed_time)(&mut ms, self.handle, end.handle)
        })?;
        Ok(ms)
    }
}

impl Drop for HipEvent {
    fn drop(&mut self) {
        // SAFETY: created once by hipEventCreateWithFlags, destroyed once here.
        unsafe {
            (self.rt.api.set_device)(self.ordinal);
            (self.rt.api.event_destroy)(self.handle);
        }
    }
}

/// A loaded code object, unloaded when its last function is dropped.
pub(super) struct HipModule {
    pub(super) rt: Arc<Runtime>,
    pub(super) handle: Handle,
}

// SAFETY: HIP modules may be used from any thread.
unsafe impl Send for HipModule {}
unsafe impl Sync for HipModule {}

impl Drop for HipModule {
    fn drop(&mut self) {
        // SAFETY: loaded once by hipModuleLoadData, unloaded once here.
        unsafe { (self.rt.api.module_unload)(self.handle) };
    }
}

/// A kernel of a loaded module; launching it from several threads at once is allowed.
pub struct HipFunction {
    pub(super) _module: Arc<HipModule>,
    pub(super) handle: Handle,
}

impl HipFunction {
    /// The raw handle, for launch lists (`runtime::graph`), which keep this function alive.
    pub(super) fn raw(&self) -> *mut c_void {
        self.handle
    }
}

// SAFETY: hipFunction_t is an immutable handle; HIP allows launches from any thread.
unsafe impl Send for HipFunction {}
unsafe impl Sync for HipFunction {}

/// One execution's stream, destroyed when its last buffer is gone.
pub struct HipStream {
    pub(super) rt: Arc<Runtime>,
    pub(super) ordinal: c_int,
    pub(super) handle: Handle,
}

// SAFETY: HIP streams may be used from any thread.
unsafe impl Send for HipStream {}
unsafe impl Sync for HipStream {}

impl Drop for HipStream {
    fn drop(&mut self) {
        // SAFETY: the stream was created on `ordinal` and is destroyed once, here, after every
        // buffer ordered on it (they hold this Arc).
        unsafe {
            (self.rt.api.set_device)(self.ordinal);
            (self.rt.api.stream_destroy)(self.handle);
        }
    }
}

/// Device memory owned by this value, freed on its stream when dropped.
pub struct HipBuffer {
    pub(super) stream: Arc<HipStream>,
    pub(super) ptr: Handle,
    /// Allocated with hipMallocAsync, so freed with hipFreeAsync.
    pub(super) stream_ordered: bool,
}

impl HipBuffer {
    /// The device address, for launch lists (`runtime::graph`), which keep this buffer alive.
    pub(super) fn raw(&self) -> *mut c_void {
        self.ptr
    }
}

// SAFETY: device pointers may be used from any thread; the buffer is freed exactly once.
unsafe impl Send for HipBuffer {}
unsafe impl Sync for HipBuffer {}

impl Drop for HipBuffer {
    fn drop(&mut self) {
        let s = &self.stream;
        let api = &s.rt.api;
        // SAFETY: `ptr` came from hipMalloc(Async) on this device and is freed once, here;
        // stream-ordered, so work queued on the stream that uses it finishes first.
        unsafe {
            (api.set_device)(s.ordinal);
            match api.stream_ordered {
                Some((_, free_async)) if self.stream_ordered => free_async(self.ptr, s.handle),
                _ => (api.free)(self.ptr),
            };
        }
    }
}
