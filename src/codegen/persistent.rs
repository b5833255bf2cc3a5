//! One persistent kernel for a whole plan (the decode issue's megakernel): the per-kernel plan's
//! kernels become the steps of one launch. Each distinct kernel body is kept as it was generated
//! and turned into a device function of its task (`blockIdx`/`gridDim` are the task's, the wait
//! on earlier kernels is a wait on the steps it depends on); a dispatcher
//! (`kernel_templates/persistent.hip`) claims tasks in plan order (a task is one block of one
//! step, or a few where a step is cut into fewer tasks) and counts them done. The steps a step waits for come from the plan's buffer accesses (read
//! after write, write after read or write, by storage, so aliases and in-place writes order
//! correctly), reduced to those not already implied by another. Pure: the plan in, the plan out.
//!
//! What it refuses (typed, naming the kernel): kernels with dynamic shared memory, 2-D or 3-D
//! blocks, a thread count that is not whole waves, or tensor-map parameters (the TMA GEMM reads
//! its maps as `__grid_constant__` parameters, which a device function cannot take).

use std::collections::HashMap;

use serde::Serialize;

use super::kernel::{name, render_unnamed};
use super::lower::body_starts_with_grid_enter;
use super::plan::{
    Access, Buffer, BufferId, BufferRole, Kernel, KernelPlan, Launch, PersistentLaunch, StallCheck,
    STATUS_BYTES,
};
use super::CodegenError;
use crate::ir::{DType, TensorType};

/// Polls of a dependency's word before the wait gives up (each poll pauses ~64 ns on NVIDIA):
/// far beyond any step's time, short enough that a stall ends in about a second.
const SPIN_LIMIT: u32 = 1 << 22;
/// Blocks per multiprocessor the persistent kernel's registers are bounded for by default (the
/// fastest of 2, 3, 4 and 8 on the H200 for SmolLM2's decode step, docs/performance.md).
pub const DEFAULT_RESIDENT: u32 = 4;
/// Tasks a step is cut into at most by default: more than any decode step has blocks, so a task
/// is one block (fewer, longer tasks measured slower: a task's blocks run one after another).
pub const DEFAULT_TASKS: u32 = 1024;
/// The most blocks a persistent launch asks for; the runtime takes as many as can be resident.
const MAX_GRID: usize = 4096;

/// Whether a plan becomes one persistent kernel, and how it is shaped
/// ([`CodegenOptions::persistent`](super::CodegenOptions::persistent)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Persistent {
    /// One launch per kernel (the default).
    #[default]
    Off,
    /// One persistent kernel for the plan, its blocks' registers bounded so that
    /// [`DEFAULT_RESIDENT`] of them fit on a multiprocessor.
    On,
    /// As `On`, shaped: registers bounded so that `resident` blocks fit on a multiprocessor
    /// (the launch bounds' second argument: more blocks run more tasks at once, fewer
    /// registers each), and each step cut into at most `tasks` tasks (a task runs several of
    /// the step's blocks one after the other: fewer claims, waits and counts).
    /// With `timed`, the kernel records a timeline in its stall report (per step: first
    /// start, last end, the tasks' wait and body time), read by
    /// [`Session::persistent_timeline`](crate::compile::Session::persistent_timeline).
    Shaped {
        resident: u32,
        tasks: u32,
        timed: bool,
    },
    /// A test hook: as `On`, with the last step waiting for itself, a dependency that is
    /// never met, so a run must end in the stall error within the spin limit.
    NeverReady,
}

fn refuse(node: &str, reason: String) -> CodegenError {
    CodegenError::Unsupported {
        node: node.to_string(),
        reason: format!("the persistent kernel cannot run it: {reason}"),
    }
}

/// The steps each step waits for, by index: for each kernel in order, the last writer of every
/// buffer it touches (read after write, write after write) and, for every buffer it writes, the
/// readers since that write (write after read); then only those that no other kept dependency
/// already implies (a step waits on its own dependencies before it counts).
pub(crate) fn dependencies(plan: &KernelPlan) -> Vec<Vec<usize>> {
    let n = plan.kernels.len();
    let mut last_writer: HashMap<BufferId, usize> = HashMap::new();
    let mut readers: HashMap<BufferId, Vec<usize>> = HashMap::new();
    let words = n.div_ceil(64);
    // reach[s]: every step s waits for, directly or through others.
    let mut reach: Vec<Vec<u64>> = Vec::with_capacity(n);
    let mut deps = Vec::with_capacity(n);
    for (s, k) in plan.kernels.iter().enumerate() {
        let touched: Vec<(BufferId, Access)> = k
            .args
            .iter()
            .zip(&k.access)
            .map(|(&b, &a)| (plan.storage(b).0, a))
            .collect();
        let mut direct: Vec<usize> = Vec::new();
        for &(b, a) in &touched {
            if let Some(&w) = last_writer.get(&b) {
                direct.push(w);
            }
            if a == Access::Write {
                direct.extend(readers.get(&b).into_iter().flatten().copied());
            }
        }
        direct.retain(|&d| d != s);
        direct.sort_unstable();
        direct.dedup();
        let mut covered = vec![0u64; words];
        let mut kept = Vec::new();
        // Latest first: a later step is the likelier to imply an earlier one.
        for &d in direct.iter().rev() {
            if covered[d / 64] >> (d % 64) & 1 == 1 {
                continue;
            }
            kept.push(d);
            covered[d / 64] |= 1 << (d % 64);
            for (c, r) in covered.iter_mut().zip(&reach[d]) {
                *c |= r;
            }
        }
        kept.sort_unstable();
        reach.push(covered);
        deps.push(kept);
        for &(b, a) in &touched {
            match a {
                Access::Write => {
                    last_writer.insert(b, s);
                    readers.remove(&b);
                }
                Access::Read => readers.entry(b).or_default().push(s),
            }
        }
        // A buffer both read and written by one step: its write is what later steps see.
        for &(b, a) in &touched {
            if a == Access::Write {
                readers.remove(&b);
            }
        }
    }
    deps
}

/// The body of kernel `k` as a device function of its task: the entry's `extern "C" __global__`
/// head becomes an inline device function with the task as the first parameter, its wait on
/// the kernel before it (`RF_GRID_ENTER()`) the wait on its dependencies where it starts so,
/// and its barriers the task's where it runs with fewer threads than the block.
fn task_body(k: &Kernel, threads: u32) -> Result<(String, bool), CodegenError> {
    let head = "extern \"C\" __global__ void";
    let at = k
        .body
        .find(head)
        .ok_or_else(|| refuse(&k.node, format!("kernel {} has no entry head", k.entry)))?;
    if k.body[at + head.len()..].contains(head) {
        return Err(refuse(
            &k.node,
            format!("kernel {} has several entries", k.entry),
        ));
    }
    let call = format!(" {}(", k.entry);
    let name_at = k.body[at..]
        .find(&call)
        .map(|i| at + i)
        .ok_or_else(|| refuse(&k.node, format!("kernel {} has no entry", k.entry)))?;
    let params_at = name_at + call.len();
    let no_params = k.body[params_at..].trim_start().starts_with(')');
    let waits_inside = body_starts_with_grid_enter(&k.body, &k.entry);
    let mut out = String::new();
    out.push_str(&format!(
        "// ---- step kernel {} ({} threads) ----\n",
        k.entry, k.launch.block[0]
    ));
    if waits_inside {
        out.push_str("#define RF_GRID_ENTER() if (!rf_p_enter(rf_t, false)) return\n");
    } else {
        out.push_str("#define RF_GRID_ENTER() do { } while (0)\n");
    }
    let partial = k.launch.block[0] < threads;
    if partial {
        // Also in the body's helpers, which do not see the task: its thread count is the body's.
        out.push_str(&format!(
            "#define __syncthreads() rf_sub_barrier(rf_p_bar, {}u)\n",
            k.launch.block[0]
        ));
    }
    out.push_str(&k.body[..at]);
    out.push_str("RF_INLINE void");
    // `__launch_bounds__(...)` is a kernel's, not a device function's: dropped.
    let between = &k.body[at + head.len()..name_at];
    let between = match between.find("__launch_bounds__(") {
        Some(lb) => {
            let close = between[lb..]
                .find(')')
                .map_or(between.len(), |c| lb + c + 1);
            format!("{}{}", &between[..lb], &between[close..])
        }
        None => between.to_string(),
    };
    out.push_str(between.trim_end());
    out.push_str(&call);
    out.push_str(if no_params {
        "const rf_p_task rf_t"
    } else {
        "const rf_p_task rf_t, "
    });
    out.push_str(&k.body[params_at..]);
    if !out.ends_with('\n') {
        out.push('\n');
    }
    if partial {
        out.push_str("#undef __syncthreads\n");
    }
    out.push_str("#undef RF_GRID_ENTER\n");
    Ok((out, waits_inside))
}

/// `__launch_bounds__`' second argument for `resident` blocks of `threads` per multiprocessor:
/// CUDA reads it as blocks per SM; HIP as waves per SIMD (execution unit), so there it is the
/// blocks' waves spread over the CU's SIMDs.
fn launch_bound(target: &crate::arch::Target, threads: u32, resident: u32) -> u32 {
    match target.platform {
        crate::arch::Platform::Nvidia => resident,
        crate::arch::Platform::Amd => {
            let waves = threads.div_ceil(target.wave_size) * resident;
            waves.div_ceil(target.caps.registers.simds.max(1)).max(1)
        }
    }
}

#[derive(Serialize)]
struct Context {
    steps: usize,
    tasks: usize,
    threads: u32,
    spin_limit: u32,
    first: String,
    dep_at: String,
    dep_slots: usize,
    deps: String,
    bodies: String,
    cases: String,
    step_list: String,
    kind: String,
    grid: String,
    threads_of: String,
    chunk: String,
    slots: String,
    slot_count: usize,
    slot_at: String,
    sync_arg: usize,
    stall_arg: usize,
    min_blocks: u32,
    timed: bool,
}

fn list<T: ToString>(v: impl IntoIterator<Item = T>) -> String {
    v.into_iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `plan` as one persistent kernel (see the module), or the typed refusal of the first kernel
/// it cannot take. An empty plan stays as it is.
pub(crate) fn fold(mut plan: KernelPlan, mode: Persistent) -> Result<KernelPlan, CodegenError> {
    if mode == Persistent::Off || plan.kernels.is_empty() {
        return Ok(plan);
    }
    let wave = plan.target.wave_size;
    for k in &plan.kernels {
        let [x, y, z] = k.launch.block;
        if y != 1 || z != 1 {
            return Err(refuse(
                &k.node,
                format!("block {x}x{y}x{z} is not one-dimensional"),
            ));
        }
        if x % wave != 0 {
            return Err(refuse(
                &k.node,
                format!("{x} threads are not whole waves of {wave}"),
            ));
        }
        if k.launch.shared_bytes != 0 {
            return Err(refuse(
                &k.node,
                format!(
                    "it takes {} bytes of dynamic shared memory",
                    k.launch.shared_bytes
                ),
            ));
        }
        if k.persistent.is_some() {
            return Err(refuse(&k.node, "it is a persistent kernel already".into()));
        }
        if let Some(&m) = k
            .args
            .iter()
            .find(|&&b| matches!(plan.buffers[b].role, BufferRole::TensorMap { .. }))
        {
            return Err(refuse(
                &k.node,
                format!("it takes the tensor map {}", plan.buffers[m].name),
            ));
        }
    }
    let threads = plan
        .kernels
        .iter()
        .map(|k| k.launch.block[0])
        .max()
        .unwrap_or(wave);
    let mut deps = dependencies(&plan);
    let steps = plan.kernels.len();
    if mode == Persistent::NeverReady {
        deps[steps - 1].push(steps - 1);
    }
    let (resident, most_tasks, timed) = match mode {
        Persistent::Shaped {
            resident,
            tasks,
            timed,
        } => (resident.max(1), tasks.max(1) as usize, timed),
        // AMD: not measured (no AMD GPU here); bounded for one block per CU, so that the
        // compiler may give it every register: on gfx90a/gfx942 four spilled VGPRs to scratch.
        Persistent::Off | Persistent::On | Persistent::NeverReady => match plan.target.platform {
            crate::arch::Platform::Nvidia => (DEFAULT_RESIDENT, DEFAULT_TASKS as usize, false),
            crate::arch::Platform::Amd => (1, DEFAULT_TASKS as usize, false),
        },
    };
    let blocks = |l: &Launch| -> usize { l.grid.iter().map(|&g| g as usize).product() };
    // Each step's blocks per task: the fewest that keep it within `most_tasks` tasks.
    let chunk: Vec<usize> = plan
        .kernels
        .iter()
        .map(|k| blocks(&k.launch).div_ceil(most_tasks).max(1))
        .collect();
    let mut first = vec![0usize];
    for (k, &c) in plan.kernels.iter().zip(&chunk) {
        let next = first[first.len() - 1]
            .checked_add(blocks(&k.launch).div_ceil(c))
            .filter(|&t| t <= u32::MAX as usize)
            .ok_or_else(|| refuse(&k.node, "the plan has more than 2^32 tasks".into()))?;
        first.push(next);
    }
    let tasks = first[steps];
    let mut dep_at = vec![0usize];
    for d in &deps {
        dep_at.push(dep_at[dep_at.len() - 1] + d.len());
    }
    if steps > u16::MAX as usize {
        return Err(refuse(
            &plan.kernels[0].node,
            format!("{steps} kernels are more than its step table holds"),
        ));
    }
    // The argument table: every buffer a kernel binds, in order of first use; then the
    // synchronisation words and the stall report.
    let node = "persistent";
    let sync = plan.add_counters(node, steps + 3);
    let stall = plan.buffers.len();
    plan.buffers.push(Buffer {
        id: stall,
        name: format!("{node}:stall"),
        // With the timeline: four u64 per step after the report's two, then the kernel's two.
        ty: TensorType::new(
            DType::I32,
            vec![(STATUS_BYTES + if timed { 32 * steps + 16 } else { 0 }) / 4],
        ),
        role: BufferRole::Status,
    });
    let mut args: Vec<BufferId> = Vec::new();
    let mut access: Vec<Access> = Vec::new();
    let mut slot: HashMap<BufferId, usize> = HashMap::new();
    for k in &plan.kernels {
        for (&b, &a) in k.args.iter().zip(&k.access) {
            match slot.get(&b) {
                Some(&i) => {
                    if a == Access::Write {
                        access[i] = Access::Write;
                    }
                }
                None => {
                    slot.insert(b, args.len());
                    args.push(b);
                    access.push(a);
                }
            }
        }
    }
    let (sync_arg, stall_arg) = (args.len(), args.len() + 1);
    args.extend([sync, stall]);
    access.extend([Access::Write, Access::Write]);
    // Each distinct body once, inlined once: the dispatcher's cases are the distinct kernels,
    // and what differs between the steps of one (grid, threads, blocks a task, buffers) is
    // read from per-step tables. (A case per step with calls, each body a function, cost
    // calls: scratch and spills on AMD.)
    let mut bodies = String::new();
    let mut kinds: Vec<&Kernel> = Vec::new();
    let mut kind_of: HashMap<&str, usize> = HashMap::new();
    let mut step_kind = Vec::with_capacity(steps);
    let mut slots: Vec<usize> = Vec::new();
    let mut slot_at = vec![0usize];
    for k in &plan.kernels {
        let kind = match kind_of.get(k.entry.as_str()) {
            Some(&i) => i,
            None => {
                kind_of.insert(&k.entry, kinds.len());
                kinds.push(k);
                kinds.len() - 1
            }
        };
        step_kind.push(kind);
        slots.extend(k.args.iter().map(|b| slot[b]));
        slot_at.push(slots.len());
    }
    let mut cases = String::new();
    for (i, k) in kinds.iter().enumerate() {
        let (body, inside) = task_body(k, threads)?;
        bodies.push_str(&body);
        let call_args: String = (0..k.args.len())
            .map(|j| format!(", rf_p_ptr{{rf_args[a[{j}]]}}"))
            .collect();
        let wait = if inside {
            String::new()
        } else {
            "            if (!rf_p_enter(t, true)) break;\n".to_string()
        };
        cases.push_str(&format!(
            "        case {i}: {{  // {entry}\n            const unsigned short* a = rf_p_slots + rf_p_slot_at[lo];\n{wait}            for (unsigned int v = b * chunk; v < b * chunk + chunk && v < blocks; ++v) {{\n                if (v != b * chunk) {{\n                    __syncthreads();\n                    if (!*t.ok) break;\n                    t.waited = 1u;\n                }}\n                t.block = make_uint3(v % t.grid.x, (v / t.grid.x) % t.grid.y, v / (t.grid.x * t.grid.y));\n                if (threadIdx.x < {t}u) {entry}(t{call_args});\n            }}\n            break;\n        }}\n",
            entry = k.entry,
            t = k.launch.block[0],
        ));
    }
    if slots.len() > u16::MAX as usize + 1 || slot.len() > u16::MAX as usize {
        return Err(refuse(
            &plan.kernels[0].node,
            format!("{} bindings are more than its tables hold", slots.len()),
        ));
    }
    // What runs, for whoever reads the kernel: every step in order.
    let mut step_list = String::new();
    for (i, k) in plan.kernels.iter().enumerate() {
        let [x, y, z] = k.launch.grid;
        step_list.push_str(&format!(
            "// step {i}: {} for %{}, grid {x}x{y}x{z} block {}, {} task(s), waits for step(s) [{}]\n",
            k.entry,
            super::names::display_name(&k.node),
            k.launch.block[0],
            first[i + 1] - first[i],
            list(&deps[i])
        ));
    }
    let grid_table: Vec<String> = plan
        .kernels
        .iter()
        .map(|k| {
            let [x, y, z] = k.launch.grid;
            format!("{{{x}u, {y}u, {z}u}}")
        })
        .collect();
    let flat: Vec<usize> = deps.iter().flatten().copied().collect();
    let ctx = Context {
        steps,
        tasks,
        threads,
        spin_limit: SPIN_LIMIT,
        first: list(&first),
        dep_at: list(&dep_at),
        dep_slots: flat.len().max(1),
        deps: if flat.is_empty() {
            "0".into()
        } else {
            list(&flat)
        },
        bodies,
        cases,
        step_list,
        kind: list(&step_kind),
        grid: grid_table.join(", "),
        threads_of: list(plan.kernels.iter().map(|k| k.launch.block[0])),
        chunk: list(&chunk),
        slots: if slots.is_empty() {
            "0".into()
        } else {
            list(&slots)
        },
        slot_count: slots.len().max(1),
        slot_at: list(&slot_at),
        sync_arg,
        stall_arg,
        min_blocks: launch_bound(&plan.target, threads, resident),
        timed,
    };
    let body = render_unnamed("persistent.hip", ctx)?;
    let (entry, body) = name("persistent", &body);
    let step_nodes: Vec<String> = plan.kernels.iter().map(|k| k.node.clone()).collect();
    let kernel = Kernel {
        entry,
        family: "persistent",
        node: node.to_string(),
        body,
        launch: Launch {
            grid: [tasks.min(MAX_GRID) as u32, 1, 1],
            block: [threads, 1, 1],
            shared_bytes: 0,
            programmatic: false,
        },
        args,
        access,
        tune: None,
        persistent: Some(PersistentLaunch { steps, tasks }),
    };
    plan.kernels = vec![kernel];
    plan.stall = Some(StallCheck {
        status: stall,
        steps: step_nodes,
        timed,
    });
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::Target;

    fn buffer(id: BufferId, role: BufferRole) -> Buffer {
        Buffer {
            id,
            name: format!("b{id}"),
            ty: TensorType::new(DType::F32, vec![64]),
            role,
        }
    }

    /// A kernel of `threads` threads over `blocks` blocks reading `reads` and writing `writes`,
    /// whose body is a real (if trivial) kernel with one pointer parameter per buffer.
    fn kernel(i: usize, reads: &[BufferId], writes: &[BufferId], threads: u32) -> Kernel {
        let mut params = Vec::new();
        for r in reads {
            params.push(format!("const float* __restrict__ r{r}"));
        }
        for w in writes {
            params.push(format!("float* __restrict__ w{w}"));
        }
        let entry = format!("rf_test_{i}");
        let store: String = writes
            .iter()
            .map(|w| format!("    w{w}[blockIdx.x * {threads} + threadIdx.x] = 1.0f;\n"))
            .collect();
        Kernel {
            entry: entry.clone(),
            family: "test",
            node: format!("n{i}"),
            body: format!(
                "extern \"C\" __global__ void __launch_bounds__({threads}) {entry}({}) {{\n    RF_GRID_ENTER();\n    __syncthreads();\n{store}}}\n",
                params.join(", ")
            ),
            launch: Launch {
                grid: [2, 1, 1],
                block: [threads, 1, 1],
                shared_bytes: 0,
                programmatic: false,
            },
            args: reads.iter().chain(writes).copied().collect(),
            access: reads
                .iter()
                .map(|_| Access::Read)
                .chain(writes.iter().map(|_| Access::Write))
                .collect(),
            tune: None,
            persistent: None,
        }
    }

    fn plan(kernels: Vec<Kernel>) -> KernelPlan {
        KernelPlan {
            target: Target::parse("sm_90a").unwrap(),
            graph: "g".into(),
            buffers: vec![
                buffer(0, BufferRole::Computed),
                buffer(1, BufferRole::Computed),
                buffer(2, BufferRole::Computed),
                buffer(3, BufferRole::Alias { base: 0, offset: 8 }),
                buffer(4, BufferRole::Constant(vec![1.0])),
            ],
            kernels,
            outputs: Vec::new(),
            checks: Vec::new(),
            stall: None,
            notes: Vec::new(),
        }
    }

    #[test]
    fn a_step_waits_for_what_it_reads_and_overwrites_and_no_more() {
        let p = plan(vec![
            kernel(0, &[4], &[0], 64),
            // Reads 0: after 0.
            kernel(1, &[0], &[1], 64),
            // Reads 0 and 1: after 1 (which is after 0).
            kernel(2, &[0, 1], &[2], 64),
            // Overwrites 0 (read by 1 and 2): after 2, which implies 1.
            kernel(3, &[4], &[0], 64),
            // Reads an alias of 0: after 3, the last writer of 0's storage.
            kernel(4, &[3], &[1], 64),
            // Reads only a constant: waits for nothing.
            kernel(5, &[4], &[2], 64),
        ]);
        let deps = dependencies(&p);
        assert_eq!(deps[0], Vec::<usize>::new());
        assert_eq!(deps[1], vec![0]);
        assert_eq!(deps[2], vec![1]);
        assert_eq!(deps[3], vec![2]);
        assert_eq!(deps[4], vec![3]);
        // Writes 2, which 2 wrote and nobody read since: after 2 (write after write), implied
        // by 3, which is not a dependency of its own: 2 stays.
        assert_eq!(deps[5], vec![2]);
    }

    #[test]
    fn the_persistent_plan_is_one_kernel_over_every_step() {
        let p = plan(vec![
            kernel(0, &[4], &[0], 64),
            kernel(1, &[0], &[1], 128),
            kernel(2, &[0, 1], &[2], 64),
        ]);
        let steps = p.kernels.len();
        let folded = fold(p, Persistent::On).unwrap();
        assert_eq!(folded.kernels.len(), 1);
        let k = &folded.kernels[0];
        assert_eq!(k.persistent, Some(PersistentLaunch { steps, tasks: 6 }));
        // Blocks as large as the largest step's; the smaller steps use the task barrier.
        assert_eq!(k.launch.block, [128, 1, 1]);
        assert!(k
            .body
            .contains("#define __syncthreads() rf_sub_barrier(rf_p_bar, 64u)"));
        // Every buffer bound (4, 0, 1, 2) once, then the synchronisation words and the stall
        // report.
        assert_eq!(k.args.len(), 4 + 2);
        assert_eq!(folded.stall.as_ref().map(|s| s.steps.len()), Some(steps));
        for i in 0..steps {
            assert!(k.body.contains(&format!(
                "RF_INLINE void rf_test_{i}(const rf_p_task rf_t, "
            )));
            assert!(k
                .body
                .contains(&format!("        case {i}: {{  // rf_test_{i}")));
        }
        assert!(!k.body.contains("__launch_bounds__(64)"));
        // Two blocks a task where a step may have one task.
        let p = plan(vec![kernel(0, &[4], &[0], 64), kernel(1, &[0], &[1], 64)]);
        let shape = Persistent::Shaped {
            resident: 4,
            tasks: 1,
            timed: false,
        };
        let shaped = fold(p, shape).unwrap();
        let k = &shaped.kernels[0];
        assert_eq!(k.persistent.map(|p| p.tasks), Some(2));
        assert!(k.body.contains("rf_p_chunk[RF_P_STEPS] = { 2, 2 }"));
        assert!(k.body.contains("__launch_bounds__(64, 4)"));
    }

    #[test]
    fn what_it_cannot_run_is_refused_by_name() {
        let mut k = kernel(0, &[4], &[0], 64);
        k.launch.shared_bytes = 1024;
        let e = fold(plan(vec![k]), Persistent::On).unwrap_err();
        assert!(
            e.to_string().contains("n0") && e.to_string().contains("dynamic shared"),
            "{e}"
        );
        let mut k = kernel(0, &[4], &[0], 64);
        k.launch.block = [8, 8, 1];
        let e = fold(plan(vec![k]), Persistent::On).unwrap_err();
        assert!(e.to_string().contains("one-dimensional"), "{e}");
        let k = kernel(0, &[4], &[0], 48);
        let e = fold(plan(vec![k]), Persistent::On).unwrap_err();
        assert!(e.to_string().contains("whole waves"), "{e}");
    }

    #[test]
    fn a_stall_report_names_both_steps() {
        let s = StallCheck {
            status: 0,
            steps: vec!["a".into(), "b".into()],
            timed: false,
        };
        let mut bytes = vec![0u8; 16];
        assert_eq!(s.stalled(&bytes), None);
        bytes[..8].copy_from_slice(&(!1u64).to_le_bytes());
        bytes[8..].copy_from_slice(&0u64.to_le_bytes());
        assert_eq!(s.stalled(&bytes), Some(("b".into(), "a".into())));
    }
}
