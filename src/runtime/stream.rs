//! One execution's queue of work on a GPU: buffers, copies, launches (one by one or bound into
//! a [`LaunchList`]), capture and replay, markers and holds. Every call goes through the
//! device's one [`Gpu`] object; synchronising a stream waits for its own work only.

use std::sync::Arc;

use super::backend::{LaunchAttrs, LaunchConfig};
use super::buffer::DeviceBuffer;
use super::dispatch::{foreign, Erased, Gpu, LoadedKernel};
use super::error::RuntimeError;
use super::graph::{CapturedGraph, KernelLaunch, LaunchList, ReplayOff};
use super::hold::Hold;
use super::memory::MemoryCounter;
use super::timeline::Marker;
use crate::arch::tma::TensorMapSpec;

/// One execution's queue of work; synchronising it waits for that work only.
pub struct Stream {
    pub(super) gpu: Arc<dyn Gpu>,
    pub(super) memory: Arc<MemoryCounter>,
    /// The device's spec (`cuda:0`), which launch lists are checked against.
    pub(super) spec: Arc<str>,
    pub(super) inner: Erased,
}

impl Stream {
    /// Identifies the driver stream (while this value lives).
    fn id(&self) -> usize {
        self.inner.id()
    }

    fn owned(
        &self,
        bytes: usize,
        mem: Result<Erased, RuntimeError>,
    ) -> Result<DeviceBuffer, RuntimeError> {
        match mem {
            Ok(mem) => Ok(DeviceBuffer {
                memory: self.memory.clone(),
                bytes,
                mem,
            }),
            Err(e) => {
                self.memory.release(bytes);
                Err(e)
            }
        }
    }

    /// A fresh buffer of `bytes`, poisoned with a NaN pattern when `poison`.
    pub fn alloc(&self, bytes: usize, poison: bool) -> Result<DeviceBuffer, RuntimeError> {
        self.memory.reserve(bytes)?;
        let mem = self.gpu.alloc(&self.inner, bytes, poison);
        self.owned(bytes, mem)
    }

    pub fn upload(&self, data: &[u8]) -> Result<DeviceBuffer, RuntimeError> {
        self.memory.reserve(data.len())?;
        let mem = self.gpu.upload(&self.inner, data);
        self.owned(data.len(), mem)
    }

    /// A device copy of the TMA tensor map `spec` of `buf`'s memory from byte `offset` on: the
    /// map is refused where its furthest element would lie past the buffer (TMA checks
    /// coordinates against the map, never against the allocation).
    pub fn tensor_map(
        &self,
        buf: &DeviceBuffer,
        offset: usize,
        spec: &TensorMapSpec,
    ) -> Result<DeviceBuffer, RuntimeError> {
        let refuse = |reason: String| RuntimeError::TensorMap {
            map: spec.to_string(),
            reason,
        };
        let elem = spec.dtype.size_bytes() as u64;
        let last = spec
            .dims
            .iter()
            .zip(std::iter::once(&elem).chain(&spec.strides))
            .try_fold(elem, |end, (&d, &s)| {
                end.checked_add((d - 1).checked_mul(s)?)
            })
            .ok_or_else(|| refuse("its extent overflows".into()))?;
        let room = (buf.bytes as u64).saturating_sub(offset as u64);
        if offset > buf.bytes || last > room {
            return Err(refuse(format!(
                "reaches {last} bytes past offset {offset} of a {}-byte buffer",
                buf.bytes
            )));
        }
        let bytes = self
            .gpu
            .encode_tensor_map(&self.inner, &buf.mem, offset, spec)?;
        self.upload(&bytes)
    }

    /// A device table of the addresses of `entries` (each buffer at a byte offset within it), one
    /// little-endian u64 each: what a persistent kernel takes instead of one parameter per
    /// buffer. The addresses stay valid while the buffers live; the caller keeps them.
    pub fn address_table(
        &self,
        entries: &[(&DeviceBuffer, usize)],
    ) -> Result<DeviceBuffer, RuntimeError> {
        for &(b, offset) in entries {
            fits("address table offset", offset, b)?;
        }
        let bufs: Vec<(&Erased, usize)> = entries.iter().map(|&(b, o)| (&b.mem, o)).collect();
        let table = self.gpu.address_table(&self.inner, &bufs)?;
        self.upload(&table)
    }

    /// Blocks of `kernel` with `threads` threads and `shared` bytes of dynamic shared memory
    /// that can be resident on the device at once; `None` where the runtime cannot say.
    pub fn resident_blocks(
        &self,
        kernel: &LoadedKernel,
        threads: u32,
        shared: u32,
    ) -> Result<Option<u32>, RuntimeError> {
        self.gpu.resident_blocks(kernel, threads, shared)
    }

    /// Copies a buffer to the host; the copy is complete when this returns.
    pub fn download(&self, buf: &DeviceBuffer) -> Result<Vec<u8>, RuntimeError> {
        self.gpu.download(&self.inner, &buf.mem, buf.bytes)
    }

    /// Launches `kernel` with `shared` bytes of dynamic shared memory (see [`Stream::launch_with`]).
    pub fn launch(
        &self,
        kernel: &LoadedKernel,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        args: &[&DeviceBuffer],
    ) -> Result<(), RuntimeError> {
        let config = LaunchConfig {
            grid,
            block,
            attrs: LaunchAttrs::dynamic_shared(shared),
        };
        self.launch_with(kernel, &config, args)
    }

    /// Launches `kernel` as `config` says, one device pointer per buffer: the geometry is
    /// checked against the device's limits and the attributes applied first.
    pub fn launch_with(
        &self,
        kernel: &LoadedKernel,
        config: &LaunchConfig,
        args: &[&DeviceBuffer],
    ) -> Result<(), RuntimeError> {
        self.gpu.check(config)?;
        let mems: Vec<&Erased> = args.iter().map(|b| &b.mem).collect();
        self.gpu.launch(&self.inner, kernel, config, &mems)
    }

    /// Writes `data` into `buf` in place (from its start), ordered on this stream. `data` may
    /// be dropped when this returns.
    pub fn write(&self, buf: &DeviceBuffer, data: &[u8]) -> Result<(), RuntimeError> {
        fits("write", data.len(), buf)?;
        self.gpu.write(&self.inner, &buf.mem, data)
    }

    /// Sets every byte of `buf` to `byte`, ordered on this stream.
    pub fn fill(&self, buf: &DeviceBuffer, byte: u8) -> Result<(), RuntimeError> {
        self.gpu.fill(&self.inner, &buf.mem, byte, buf.bytes)
    }

    /// Copies the first `bytes` of `src` into the start of `dst` on the device, ordered on
    /// this stream (a `dst` used on another stream must wait for this one).
    pub fn copy(
        &self,
        src: &DeviceBuffer,
        dst: &DeviceBuffer,
        bytes: usize,
    ) -> Result<(), RuntimeError> {
        fits("copy", bytes, src)?;
        fits("copy", bytes, dst)?;
        self.gpu.copy(&self.inner, &src.mem, &dst.mem, bytes)
    }

    /// Binds `launches` once: geometry checked against the device's limits, attributes
    /// applied, kernels and buffers resolved to raw handles and held by the list.
    pub fn bind(&self, launches: &[KernelLaunch]) -> Result<LaunchList, RuntimeError> {
        let mut bound = Vec::with_capacity(launches.len());
        let (mut kernels, mut buffers) = (Vec::new(), Vec::new());
        for l in launches {
            let config = LaunchConfig {
                grid: l.grid,
                block: l.block,
                attrs: LaunchAttrs::dynamic_shared(l.shared_bytes)
                    .with_programmatic(l.programmatic),
            };
            self.gpu.check(&config)?;
            let mems: Vec<&Erased> = l.args.iter().map(|b| &b.mem).collect();
            let offsets = match l.offsets.len() {
                0 => vec![0; l.args.len()],
                _ => l.offsets.clone(),
            };
            // One offset per buffer, each leaving the pointer inside (or one past) its buffer.
            if offsets.len() != l.args.len() {
                return Err(RuntimeError::BufferSize {
                    what: "launch offsets (one per argument)",
                    bytes: offsets.len(),
                    buffer: l.args.len(),
                });
            }
            if let Some((b, &o)) = l.args.iter().zip(&offsets).find(|(b, &o)| o > b.bytes) {
                return Err(RuntimeError::BufferSize {
                    what: "launch argument offset",
                    bytes: o,
                    buffer: b.bytes,
                });
            }
            bound.push(
                self.gpu
                    .bind(&self.inner, &l.kernel, &config, &mems, &offsets)?,
            );
            kernels.push(l.kernel.clone());
            buffers.extend(l.args.iter().cloned());
        }
        Ok(LaunchList {
            bound,
            device: self.spec.to_string(),
            _kernels: kernels,
            _buffers: buffers,
        })
    }

    /// Enqueues launch `index` of `list` on this stream.
    pub fn launch_one(&self, list: &LaunchList, index: usize) -> Result<(), RuntimeError> {
        if list.device != *self.spec {
            return Err(foreign());
        }
        let Some(b) = list.bound.get(index) else {
            return Err(RuntimeError::NoDevice {
                spec: list.device.clone(),
                reason: format!("launch {index} of a list of {}", list.bound.len()),
            });
        };
        self.gpu.launch_bound(&self.inner, b)
    }

    /// Enqueues every launch of `list` on this stream, in order.
    pub fn launch_list(&self, list: &LaunchList) -> Result<(), RuntimeError> {
        (0..list.bound.len()).try_for_each(|i| self.launch_one(list, i))
    }

    /// Whether this stream's device can capture and replay graphs.
    pub fn replay_support(&self) -> Result<(), ReplayOff> {
        self.gpu
            .graph_support()
            .map_err(|reason| ReplayOff::Unsupported { reason })
    }

    /// Captures `list`'s launches on this stream (nothing runs) as a graph to replay. The
    /// graph holds the list, so the buffers it touches live as long as it does.
    pub fn capture(&self, list: &Arc<LaunchList>) -> Result<CapturedGraph, RuntimeError> {
        let inner = self
            .gpu
            .capture(&self.inner, &mut || self.launch_list(list))?;
        Ok(CapturedGraph {
            inner,
            list: list.clone(),
            stream: self.id(),
        })
    }

    /// Enqueues one replay of `graph` on this stream, the one it was captured on (so that the
    /// buffers it holds, freed ordered on their stream, are never freed under a replay queued
    /// elsewhere).
    pub fn replay(&self, graph: &CapturedGraph) -> Result<(), RuntimeError> {
        if graph.stream != self.id() {
            return Err(RuntimeError::NoDevice {
                spec: self.spec.to_string(),
                reason: "a graph replays on the stream it was captured on, not another".into(),
            });
        }
        self.gpu.replay(&self.inner, &graph.inner)
    }

    pub fn synchronize(&self) -> Result<(), RuntimeError> {
        self.gpu.sync(&self.inner)
    }

    /// A marker stamped with the device's clock when the stream reaches this point.
    pub fn mark(&self) -> Result<Marker, RuntimeError> {
        Ok(Marker {
            gpu: self.gpu.clone(),
            event: self.gpu.mark(&self.inner)?,
        })
    }

    /// Holds the stream at this point: what is enqueued after it waits until the hold is
    /// released or dropped, or `limit` has passed (then [`Hold::expired`] says so).
    pub fn hold(&self, limit: std::time::Duration) -> Result<Hold, RuntimeError> {
        let (hold, wait) = Hold::new(limit);
        self.gpu.hold(&self.inner, wait)?;
        Ok(hold)
    }
}

/// Refuses writing `bytes` into a buffer smaller than that.
fn fits(what: &'static str, bytes: usize, buf: &DeviceBuffer) -> Result<(), RuntimeError> {
    if bytes > buf.bytes {
        return Err(RuntimeError::BufferSize {
            what,
            bytes,
            buffer: buf.bytes,
        });
    }
    Ok(())
}
