//! Device memory owned by a value: freed (and un-counted) on drop, never `Clone`.

use std::sync::Arc;

use super::dispatch::Erased;
use super::memory::MemoryCounter;

/// Device memory owned by this value: freed (and un-counted) on drop. Deliberately not `Clone`.
/// The backend's buffer keeps its stream and runtime alive, so it may outlive its `Device`.
pub struct DeviceBuffer {
    pub(super) memory: Arc<MemoryCounter>,
    pub(super) bytes: usize,
    pub(super) mem: Erased,
}

impl DeviceBuffer {
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        self.memory.release(self.bytes);
    }
}
