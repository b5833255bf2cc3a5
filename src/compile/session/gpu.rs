//! A session on a GPU: its stream, slots, input, status and state buffers, the launches bound
//! once, and the graph captured from them. Poisoning lives here too: when the executable
//! poisons, the launch list puts a poisoning kernel before the first kernel that uses each
//! computed buffer, so every run (replayed or not) starts each value from NaN bytes, even in a
//! slot an earlier kernel of the same run wrote.

use std::collections::HashMap;
use std::sync::Arc;

use super::executable::{Executable, Planned};
use super::poison::{buffer_bytes, poison_points, POISON_BLOCK, POISON_MAX_GRID};
use crate::codegen::{self, BufferRole, IndexCheck, StallCheck};
use crate::compile::CompileError;
use crate::interp::InterpError;
use crate::ir::{Tensor, TensorType};
use crate::runtime::{
    CapturedGraph, DeviceBuffer, KernelLaunch, LaunchList, ReplayOff, RuntimeError, Stream,
};

/// One persistent state of a session: its plan buffer id, name, type and buffer.
#[derive(Clone)]
pub(super) struct StateBuffer {
    pub(super) id: usize,
    pub(super) name: String,
    pub(super) ty: TensorType,
    pub(super) buffer: Arc<DeviceBuffer>,
}

/// A GPU session's state buffers, in plan order.
pub(super) type StateBuffers = Vec<StateBuffer>;

/// A session on a GPU.
pub(in crate::compile) struct GpuSession {
    // Field order is drop order: the captured graph and the launch list release their hold on
    // the buffers first, then the buffers are freed (ordered on the stream), then the stream.
    graph: Option<CapturedGraph>,
    /// Graphs captured in this session's life: at most one (inputs change in place).
    captures: usize,
    /// Every launch of a run: the plan's kernels, with the poisoning launches before them when
    /// the executable poisons.
    pub(in crate::compile) launches: Arc<LaunchList>,
    /// Where each of the plan's kernels sits in `launches`.
    pub(in crate::compile) kernel_at: Vec<usize>,
    replay: Result<(), ReplayOff>,
    slots: Vec<Arc<DeviceBuffer>>,
    /// Input buffers by plan buffer id.
    inputs: HashMap<usize, Arc<DeviceBuffer>>,
    /// Status words of the index checks (and a persistent kernel's stall report): one device
    /// buffer, zeroed before every run with one fill and read after it with one copy (a copy
    /// per check was a synchronous round trip each, 32 a decode step), each check's words at a
    /// byte offset into it, by plan buffer id.
    status: Arc<DeviceBuffer>,
    status_at: HashMap<usize, (usize, usize)>,
    /// Counters by plan buffer id: zeroed once here, never poisoned; the kernels that take
    /// them leave them at 0 (`BufferRole::Counters`), so neither a run nor a replay refills them.
    counters: HashMap<usize, Arc<DeviceBuffer>>,
    /// TMA tensor maps by plan buffer id, encoded from this session's buffers' addresses
    /// (fixed for its life, so valid for every run and replay).
    maps: HashMap<usize, Arc<DeviceBuffer>>,
    /// The plan's index checks, in the order the interpreter meets them.
    checks: Vec<IndexCheck>,
    /// A persistent plan's report of a wait that never ended.
    stall: Option<StallCheck>,
    /// The graph outputs in order: type and the buffer holding each.
    outputs: Vec<(TensorType, Arc<DeviceBuffer>)>,
    /// Persistent state buffers.
    pub(super) states: StateBuffers,
    /// Shared with the sessions that share this one's states, so their runs are ordered.
    pub(in crate::compile) stream: Arc<Stream>,
}

impl Drop for GpuSession {
    fn drop(&mut self) {
        // Runs still queued read the executable's weights, which may be freed right after the
        // session goes: wait for them. (An error here has nowhere to go; the buffers are
        // freed ordered on the stream regardless.)
        let _ = self.stream.synchronize();
    }
}

/// Whether `ROCMFORGE_REPLAY=0` turns replay off.
fn replay_env_off() -> bool {
    std::env::var("ROCMFORGE_REPLAY").is_ok_and(|v| v == "0")
}

/// A tensor of type `ty` from the first bytes of `bytes` (a slot may be larger than its value).
pub(super) fn tensor(ty: &TensorType, bytes: &[u8]) -> Result<Tensor, CompileError> {
    let n = ty.shape.numel() * ty.dtype.size_bytes();
    Ok(Tensor::from_bytes(ty, &bytes[..n.min(bytes.len())])
        .map_err(|e| RuntimeError::Cuda(e.to_string()))?)
}

impl GpuSession {
    /// Allocates a session's buffers, binds its launches and decides on replay. `lent`: the
    /// stream and states of the session this one shares them with.
    pub(super) fn new(
        exe: &Executable,
        planned: &Planned,
        options: &crate::compile::SessionOptions,
        lent: Option<(Arc<Stream>, StateBuffers)>,
    ) -> Result<GpuSession, CompileError> {
        let (plan, memory) = (&planned.plan, &planned.memory);
        let (stream, lent_states) = match lent {
            Some((stream, states)) => (stream, Some(states)),
            None => (Arc::new(exe.device.new_stream()?), None),
        };
        let slots = memory
            .slot_bytes
            .iter()
            .map(|&b| stream.alloc(b, exe.poison).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        let mut inputs = HashMap::new();
        let mut states = Vec::new();
        let mut counters = HashMap::new();
        for b in &plan.buffers {
            match &b.role {
                // Poisoned: an input is set before any run reads it (checked), so this only
                // shows when a kernel reads past it.
                BufferRole::Input(_) => {
                    let buf = stream.alloc(buffer_bytes(plan, b.id), exe.poison)?;
                    inputs.insert(b.id, Arc::new(buf));
                }
                BufferRole::State { name } => {
                    // A lent buffer of the same name (its type was checked against the graph's).
                    let buffer = match &lent_states {
                        Some(lent) => lent
                            .iter()
                            .find(|s| &s.name == name)
                            .map(|s| s.buffer.clone())
                            .ok_or_else(|| CompileError::StateMismatch {
                                name: name.clone(),
                                expected: b.ty.to_string(),
                                found: None,
                            })?,
                        // A state starts zeroed, as the interpreter starts it; a test that wants
                        // a poisoned cache tail writes one (`poison_state`).
                        None => {
                            let buf = stream.alloc(buffer_bytes(plan, b.id), false)?;
                            stream.fill(&buf, 0)?;
                            Arc::new(buf)
                        }
                    };
                    states.push(StateBuffer {
                        id: b.id,
                        name: name.clone(),
                        ty: b.ty.clone(),
                        buffer,
                    });
                }
                BufferRole::Counters => {
                    let buf = stream.alloc(buffer_bytes(plan, b.id), false)?;
                    stream.fill(&buf, 0)?;
                    counters.insert(b.id, Arc::new(buf));
                }
                BufferRole::Weight(_)
                | BufferRole::QuantWeight(_)
                | BufferRole::Constant(_)
                | BufferRole::Computed
                | BufferRole::Workspace
                | BufferRole::Status
                // Encoded below, once every buffer they describe has its address.
                | BufferRole::TensorMap { .. }
                | BufferRole::Alias { .. } => {}
            }
        }
        let mut status_at = HashMap::new();
        let mut status_bytes = 0usize;
        for id in plan
            .checks
            .iter()
            .map(|c| c.status)
            .chain(plan.stall.iter().map(|s| s.status))
        {
            // A persistent kernel's report also holds its timeline when it keeps one. Slots
            // stay 16-byte aligned (the words are u64).
            let bytes = buffer_bytes(plan, id).max(codegen::STATUS_BYTES);
            status_at.entry(id).or_insert_with(|| {
                let at = status_bytes;
                status_bytes += bytes.div_ceil(16) * 16;
                (at, bytes)
            });
        }
        let status = Arc::new(stream.alloc(status_bytes.max(16), false)?);
        stream.fill(&status, 0)?;
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
            kernel_at: Vec::with_capacity(plan.kernels.len()),
            replay,
            slots,
            inputs,
            status,
            status_at,
            counters,
            maps: HashMap::new(),
            checks: plan.checks.clone(),
            stall: plan.stall.clone(),
            outputs: Vec::with_capacity(plan.outputs.len()),
            states,
            stream,
        };
        for b in &plan.buffers {
            if let BufferRole::TensorMap { of, spec } = &b.role {
                let (described, offset) = gpu.bound(planned, *of)?;
                let map = gpu.stream.tensor_map(&described, offset, spec)?;
                gpu.maps.insert(b.id, Arc::new(map));
            }
        }
        for o in &plan.outputs {
            let buffer = gpu.buffer(planned, o.buffer)?;
            gpu.outputs.push((o.ty.clone(), buffer));
        }
        let launches = gpu.launch_list(exe, planned)?;
        gpu.launches = Arc::new(gpu.stream.bind(&launches)?);
        // The fills of fresh buffers are done before the session is handed out.
        gpu.stream.synchronize()?;
        Ok(gpu)
    }

    /// The session's (or executable's) buffer that plan buffer `id` is.
    fn buffer(&self, planned: &Planned, id: usize) -> Result<Arc<DeviceBuffer>, CompileError> {
        let plan = &planned.plan;
        let found = match &plan.buffers[id].role {
            BufferRole::Computed | BufferRole::Workspace => planned
                .memory
                .slot_of
                .get(&id)
                .and_then(|&s| self.slots.get(s)),
            BufferRole::Input(_) => self.inputs.get(&id),
            BufferRole::Weight(_) | BufferRole::QuantWeight(_) | BufferRole::Constant(_) => {
                planned.resident.get(&id)
            }
            // Bound at its offset by `bound`.
            BufferRole::Status => self.status_at.contains_key(&id).then_some(&self.status),
            BufferRole::Counters => self.counters.get(&id),
            BufferRole::TensorMap { .. } => self.maps.get(&id),
            BufferRole::State { .. } => self.states.iter().find(|s| s.id == id).map(|s| &s.buffer),
            // Bound through `bound`, with its offset; an output never is one (codegen copies).
            BufferRole::Alias { .. } => None,
        };
        // Every buffer a kernel or an output names is allocated above or at compile time; a
        // plan that names another is a codegen bug, reported rather than a panic.
        found.cloned().ok_or_else(|| CompileError::UnboundBuffer {
            id,
            name: plan.buffers[id].name.clone(),
        })
    }

    /// The buffer a kernel argument binds and the byte offset into it: an alias (a slice read
    /// in place) binds its base at its offset.
    fn bound(
        &self,
        planned: &Planned,
        id: usize,
    ) -> Result<(Arc<DeviceBuffer>, usize), CompileError> {
        let plan = &planned.plan;
        if let Some(&(at, _)) = self.status_at.get(&id) {
            return Ok((self.status.clone(), at));
        }
        let (base, offset) = plan.storage(id);
        let bytes = offset * plan.buffers[id].ty.dtype.size_bytes();
        Ok((self.buffer(planned, base)?, bytes))
    }

    /// The launches of a run in order; with poisoning, each computed buffer is poisoned right
    /// before the first kernel that uses it. A slot is reused only once its last occupant is
    /// dead (`plan_memory`), and a kernel never writes over its own operands, so the poison
    /// never hits a live value.
    fn launch_list(
        &mut self,
        exe: &Executable,
        planned: &Planned,
    ) -> Result<Vec<KernelLaunch>, CompileError> {
        let plan = &planned.plan;
        let points = match (exe.poison, &planned.poisoner) {
            (true, Some(p)) => Some((p, poison_points(plan))),
            (false, _) | (true, None) => None,
        };
        let mut launches = Vec::new();
        for (i, (k, loaded)) in plan.kernels.iter().zip(&planned.kernels).enumerate() {
            if let Some((p, points)) = &points {
                for &a in &points[i] {
                    let bytes = buffer_bytes(plan, a);
                    let Some(count) = p.counts.get(&bytes) else {
                        continue;
                    };
                    let blocks = bytes.div_ceil(POISON_BLOCK as usize).min(POISON_MAX_GRID);
                    launches.push(KernelLaunch {
                        kernel: p.kernel.clone(),
                        grid: [blocks as u32, 1, 1],
                        block: [POISON_BLOCK, 1, 1],
                        shared_bytes: 0,
                        args: vec![self.buffer(planned, a)?, count.clone()],
                        offsets: vec![],
                        // The poison kernel does not wait on the grid dependency.
                        programmatic: false,
                    });
                }
            }
            self.kernel_at.push(launches.len());
            let (args, offsets): (Vec<_>, Vec<_>) = k
                .args
                .iter()
                .map(|&a| self.bound(planned, a))
                .collect::<Result<Vec<_>, _>>()?
                .into_iter()
                .unzip();
            let mut grid = k.launch.grid;
            let (args, offsets) = match k.persistent {
                None => (args, offsets),
                // A persistent kernel takes the table of its buffers' addresses (fixed for the
                // session's life, so valid for every replay; the session holds the buffers)
                // and as many blocks as can be resident, at most what its plan asks for.
                Some(_) => {
                    let entries: Vec<_> = args.iter().map(|b| &**b).zip(offsets).collect();
                    let table = Arc::new(self.stream.address_table(&entries)?);
                    if let Some(n) = self.stream.resident_blocks(
                        loaded,
                        k.launch.block[0],
                        k.launch.shared_bytes,
                    )? {
                        grid[0] = grid[0].min(n);
                    }
                    (vec![table], vec![0])
                }
            };
            launches.push(KernelLaunch {
                kernel: loaded.clone(),
                grid,
                block: k.launch.block,
                shared_bytes: k.launch.shared_bytes,
                args,
                offsets,
                programmatic: k.launch.programmatic,
            });
        }
        Ok(launches)
    }

    /// Writes input buffer `id` in place, ordered on the stream.
    pub(super) fn set_input(&self, id: usize, value: &Tensor) -> Result<(), CompileError> {
        if let Some(buf) = self.inputs.get(&id) {
            self.stream.write(buf, &value.to_bytes())?;
        }
        Ok(())
    }

    /// Enqueues a run: status buffers zeroed, then the launches replayed (captured at the first
    /// run) or launched one by one.
    pub(super) fn run(&mut self) -> Result<(), CompileError> {
        // What the checks found is about this run's inputs only.
        self.stream.fill(&self.status, 0)?;
        if self.replay.is_ok() && !self.launches.is_empty() {
            if self.graph.is_none() {
                self.graph = Some(self.stream.capture(&self.launches)?);
                self.captures += 1;
            }
            if let Some(graph) = &self.graph {
                self.stream.replay(graph)?;
            }
        } else {
            self.stream.launch_list(&self.launches)?;
        }
        Ok(())
    }

    pub(super) fn replay_off(&self) -> Option<&ReplayOff> {
        self.replay.as_ref().err()
    }

    pub(super) fn captures(&self) -> usize {
        self.captures
    }

    /// The interpreter's error for the first gather (in plan order, the order the interpreter
    /// runs them) whose kernel found an index outside its table in the last run.
    pub(super) fn check_indices(&self) -> Result<(), CompileError> {
        if self.status_at.is_empty() {
            return Ok(());
        }
        let all = self.stream.download(&self.status)?;
        let words = |id: usize| -> Option<&[u8]> {
            let &(at, bytes) = self.status_at.get(&id)?;
            all.get(at..at + bytes)
        };
        // A persistent kernel that gave up on a wait computed nothing reliable: said first.
        if let Some(stall) = &self.stall {
            if let Some(bytes) = words(stall.status) {
                if let Some((step, waited_for)) = stall.stalled(bytes) {
                    // Tasks that gave up left their steps' counters part-counted (a split
                    // attention's, say): zeroed, so that the session's next run starts clean.
                    for c in self.counters.values() {
                        self.stream.fill(c, 0)?;
                    }
                    return Err(CompileError::PersistentStall { step, waited_for });
                }
            }
        }
        for check in &self.checks {
            let Some(bytes) = words(check.status) else {
                continue;
            };
            if let Some(index) = check.failed_index(bytes) {
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

    /// A timed persistent kernel's timeline of the last run (`None` for any other plan).
    pub(super) fn persistent_timeline(&self) -> Result<Option<codegen::Timeline>, CompileError> {
        let Some(stall) = &self.stall else {
            return Ok(None);
        };
        let Some(&(at, n)) = self.status_at.get(&stall.status) else {
            return Ok(None);
        };
        let all = self.stream.download(&self.status)?;
        Ok(all.get(at..at + n).and_then(|bytes| stall.timeline(bytes)))
    }

    /// Output `index`: its type and the buffer holding it.
    pub(super) fn output(&self, index: usize) -> (&TensorType, &Arc<DeviceBuffer>) {
        let (ty, buf) = &self.outputs[index];
        (ty, buf)
    }

    pub(super) fn output_count(&self) -> usize {
        self.outputs.len()
    }

    /// State `name` as it is now, copied to the host.
    pub(super) fn state(&self, name: &str) -> Result<Option<Tensor>, CompileError> {
        let Some(s) = self.states.iter().find(|s| s.name == name) else {
            return Ok(None);
        };
        let bytes = self.stream.download(&s.buffer)?;
        tensor(&s.ty, &bytes).map(Some)
    }

    /// Every state filled with `byte`, ordered on the stream.
    pub(super) fn fill_state(&self, byte: u8) -> Result<(), CompileError> {
        for s in &self.states {
            self.stream.fill(&s.buffer, byte)?;
        }
        Ok(())
    }
}
