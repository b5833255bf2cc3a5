//! Runs a kernel plan on the CPU. Pointwise kernels (threads that never share memory, shuffle
//! or wait at a barrier: elementwise, copy, gather (with its index check), reduce, causal mask, rope) run
//! one thread at a time. Cooperative kernels (the CUDA-core GEMMs: shared memory, barriers,
//! shuffles within a wave) run block after block, each GPU thread of a block a fiber of one
//! host thread, switched at barriers; a shuffle is a store, a barrier, a load and a barrier. The
//! generated source — the AMD prelude, the kernels, exactly as hiprtc gets them — is compiled
//! for the host by clang++ behind a shim for the GPU built-ins, kernels run in plan order. That
//! executes the kernels' C here, without a GPU: the numeric tests of codegen compare it with
//! the interpreter.
#![allow(dead_code)]

use std::collections::HashMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use rocmforge::arch::{Platform, Target};
use rocmforge::codegen::{prelude, BufferRole, KernelPlan, STATUS_BYTES};
use rocmforge::interp::{Bindings, InterpError};
use rocmforge::ir::{random_quant, random_weight, Graph, Op, Tensor};

/// Families whose kernels run correctly one thread at a time.
pub const POINTWISE: [&str; 8] = [
    "elementwise",
    "cache_write",
    "paged_cache_write",
    "dequantize",
    "copy",
    "reduce",
    "causal_mask",
    "rope",
];

/// Families whose blocks run with a fiber per GPU thread (barriers, shuffles, shared memory);
/// their blocks are one-dimensional. Attention runs here in its AMD forms. The gather
/// is here for its index check (block 0 reduces the first failing position).
pub const COOPERATIVE: [&str; 9] = [
    "argmax",
    "gather",
    "gemm",
    "gemm_small_m",
    "gemm_quant",
    "gemm_quant_act",
    "flash_attention",
    "flash_decode",
    "paged_decode",
];

/// The GPU built-ins the prelude and the kernels use, for the host. Block and thread indices
/// are set by the scheduler before it resumes a thread's fiber; atomics need no atomicity (one
/// host thread runs everything). Without a block barrier (pointwise
/// kernels) a barrier does nothing and a shuffle returns the thread's own value.
const SHIM: &str = r#"
// Fibers switch stacks with _longjmp, which the fortified (checking) longjmp would refuse.
#undef _FORTIFY_SOURCE
#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <csetjmp>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
// HIP's and CUDA's integer min/max built-ins.
using std::max;
using std::min;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
// Constant memory: a table the host computed (rope's inverse frequencies).
#define __constant__ static const
struct rf_host_dim3 { unsigned x, y, z; };
static rf_host_dim3 blockIdx, threadIdx;
// A cooperative block's GPU threads are fibers of the one host thread, each on a stack of its
// own, run in turn by rf_host_run_block: a fiber runs until it reaches a barrier (or a pause in a
// spin loop, or its end) and jumps back to the scheduler; a barrier lets its fibers go on once
// every fiber that has not finished waits at one. (One OS thread per GPU thread meeting at a
// futex barrier made every shuffle — a store and two barriers — a round of context switches
// through the kernel: most of a run's time on a 2-core machine.) A fiber starts with
// makecontext/setcontext and switches with _setjmp/_longjmp (no signal-mask system call); a
// barrier that some threads pass and others have finished before is a divergent barrier, which
// the GPU would not survive either: the run aborts.
enum rf_host_fiber_state { RF_HOST_RUNNABLE, RF_HOST_AT_BARRIER, RF_HOST_DONE };
struct rf_host_fiber {
    jmp_buf at;
    ucontext_t start;
    char* stack;
    bool started;
    rf_host_fiber_state state;
};
static const size_t rf_host_stack_bytes = 1 << 20;  // reserved, touched as used; a guard page below
static rf_host_fiber* rf_host_fibers = nullptr;
static unsigned rf_host_nfibers = 0, rf_host_current = 0;
static jmp_buf rf_host_scheduler;
static bool rf_host_in_block = false;  // false: a pointwise kernel, one GPU thread at a time
static void (*rf_host_body)(void*) = nullptr;
static void* rf_host_body_arg = nullptr;
static void rf_host_fiber_main() {
    rf_host_body(rf_host_body_arg);
    rf_host_fibers[rf_host_current].state = RF_HOST_DONE;
    _longjmp(rf_host_scheduler, 1);
}
// Back to the scheduler, `state` saying why; returns when the scheduler resumes this fiber.
static inline void rf_host_yield(rf_host_fiber_state state) {
    rf_host_fiber& f = rf_host_fibers[rf_host_current];
    f.state = state;
    if (!_setjmp(f.at)) _longjmp(rf_host_scheduler, 1);
}
// Runs body(arg) as `n` GPU threads of block `block`, every thread to its end.
static void rf_host_run_block(unsigned n, rf_host_dim3 block, void (*body)(void*), void* arg) {
    if (n > rf_host_nfibers) {
        rf_host_fibers = (rf_host_fiber*)realloc(rf_host_fibers, n * sizeof(rf_host_fiber));
        for (unsigned i = rf_host_nfibers; i < n; ++i) {
            void* m = mmap(nullptr, rf_host_stack_bytes, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
            if (m == MAP_FAILED) abort();
            mprotect(m, (size_t)getpagesize(), PROT_NONE);  // an overflow faults, never corrupts
            rf_host_fibers[i].stack = (char*)m;
        }
        rf_host_nfibers = n;
    }
    rf_host_body = body;
    rf_host_body_arg = arg;
    blockIdx = block;
    rf_host_in_block = true;
    for (unsigned i = 0; i < n; ++i) {
        rf_host_fiber& f = rf_host_fibers[i];
        f.started = false;
        f.state = RF_HOST_RUNNABLE;
        if (getcontext(&f.start) != 0) abort();
        f.start.uc_stack.ss_sp = f.stack;
        f.start.uc_stack.ss_size = rf_host_stack_bytes;
        f.start.uc_link = nullptr;
        makecontext(&f.start, rf_host_fiber_main, 0);
    }
    for (;;) {
        bool ran = false;
        for (unsigned i = 0; i < n; ++i) {
            rf_host_fiber& f = rf_host_fibers[i];
            if (f.state != RF_HOST_RUNNABLE) continue;
            ran = true;
            rf_host_current = i;
            threadIdx = {i, 0, 0};
            if (!_setjmp(rf_host_scheduler)) {
                if (!f.started) {
                    f.started = true;
                    setcontext(&f.start);
                }
                _longjmp(f.at, 1);
            }
        }
        if (ran) continue;
        // Nothing runnable: every thread has finished, or waits at a barrier.
        unsigned waiting = 0, done = 0;
        for (unsigned i = 0; i < n; ++i) {
            if (rf_host_fibers[i].state == RF_HOST_AT_BARRIER) ++waiting;
            if (rf_host_fibers[i].state == RF_HOST_DONE) ++done;
        }
        if (waiting == 0) break;
        if (done > 0) {
            fprintf(stderr, "block (%u, %u, %u): %u thread(s) wait at a barrier that %u finished thread(s) never reach\n",
                    block.x, block.y, block.z, waiting, done);
            abort();
        }
        for (unsigned i = 0; i < n; ++i) rf_host_fibers[i].state = RF_HOST_RUNNABLE;
    }
    rf_host_in_block = false;
}
static float rf_host_lanes[1024];
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline void __syncthreads() { if (rf_host_in_block) rf_host_yield(RF_HOST_AT_BARRIER); }
static inline float __shfl_xor(float v, int mask, int) {
    if (!rf_host_in_block) return v;
    rf_host_lanes[threadIdx.x] = v;
    __syncthreads();
    const float r = rf_host_lanes[threadIdx.x ^ mask];
    __syncthreads();
    return r;
}
// The AMD 4-way int8 dot products (`rf_dot4_i8` in the prelude), for the host: c plus the
// products of the four signed bytes of a and b. sudot4's flags say both operands are signed.
static inline int rf_host_dot4(int a, int b, int c) {
    for (int i = 0; i < 32; i += 8) c += (int)(signed char)(a >> i) * (int)(signed char)(b >> i);
    return c;
}
static inline int __builtin_amdgcn_sdot4(int a, int b, int c, bool) { return rf_host_dot4(a, b, c); }
static inline int __builtin_amdgcn_sudot4(bool sa, int a, bool sb, int b, int c, bool) {
    if (!sa || !sb) abort();  // the prelude reads both operands as signed
    return rf_host_dot4(a, b, c);
}
static inline unsigned long long atomicMax(unsigned long long* p, unsigned long long v) {
    const unsigned long long old = *p;
    if (v > old) *p = v;
    return old;
}
static inline unsigned atomicAdd(unsigned* p, unsigned v) {
    const unsigned old = *p;
    *p = old + v;
    return old;
}
// Blocks run one after another on the host: every write is visible to the next block.
static inline void __threadfence() {}
// Within a block the threads are fibers of one host thread: program order is memory order.
static inline void __threadfence_block() {}
// A pause between polls of a word another thread writes (the AMD prelude's `rf_spin_pause` and
// its counted sub-barrier): the other fibers run until this one is resumed.
static inline void __builtin_amdgcn_s_sleep(int) { if (rf_host_in_block) rf_host_yield(RF_HOST_RUNNABLE); }
// Converts a buffer to whatever pointer type the kernel parameter has.
struct rf_host_ptr {
    unsigned char* p;
    template <class T> operator T*() const { return (T*)p; }
};
"#;

/// A C++ compiler for the host that has `_Float16` (the AMD prelude's half type): clang.
/// `ROCMFORGE_HOST_CXX` names one explicitly.
pub fn host_cxx() -> Result<PathBuf, String> {
    let candidates: Vec<String> = match std::env::var("ROCMFORGE_HOST_CXX") {
        Ok(c) if !c.is_empty() => vec![c],
        _ => [
            "clang++",
            "clang++-19",
            "clang++-18",
            "clang++-17",
            "clang++-16",
        ]
        .map(String::from)
        .to_vec(),
    };
    for c in &candidates {
        let ok = Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return Ok(PathBuf::from(c));
        }
    }
    Err(format!(
        "no host clang++ for running kernels on the CPU (tried {})",
        candidates.join(", ")
    ))
}

/// The bytes each buffer of `plan` starts a run with: bound inputs, weights (seed 0, as
/// `Graph::compile` draws them when none are given), constants; computed buffers and
/// workspaces poisoned with 0xFF (NaN in every float dtype), status buffers zeroed.
fn initial_buffers(
    g: &Graph,
    plan: &KernelPlan,
    b: &Bindings,
    states: &HashMap<String, Tensor>,
) -> Result<Vec<Vec<u8>>, String> {
    plan.buffers
        .iter()
        .map(|buf| {
            let n = buf.ty.shape.numel() * buf.ty.dtype.size_bytes();
            Ok(match &buf.role {
                BufferRole::Input(_) => b
                    .inputs
                    .get(&buf.name)
                    .ok_or(format!("no input `{}`", buf.name))?
                    .to_bytes(),
                BufferRole::Weight(init) => b
                    .weights
                    .get(&buf.name)
                    .cloned()
                    .map_or_else(|| random_weight(&buf.name, &buf.ty, init, b.seed), Ok)
                    .map_err(|e| e.to_string())?
                    .to_bytes(),
                // The blocks as `Graph::compile` uploads them: bound, or drawn from the seed.
                BufferRole::QuantWeight(scheme) => match b.quantized.get(&buf.name) {
                    Some(q) => q.bytes().to_vec(),
                    None => random_quant(&buf.name, *scheme, &buf.ty.shape, b.seed)
                        .map_err(|e| e.to_string())?
                        .bytes()
                        .to_vec(),
                },
                BufferRole::Constant(values) => {
                    let full = if values.len() == buf.ty.shape.numel() {
                        values.clone()
                    } else {
                        vec![values[0]; buf.ty.shape.numel()]
                    };
                    Tensor::from_f64(buf.ty.dtype, buf.ty.shape.clone(), &full)
                        .map_err(|e| e.to_string())?
                        .to_bytes()
                }
                BufferRole::Computed | BufferRole::Workspace => vec![0xFF; n],
                // No storage of its own: kernels bind its base at its offset.
                BufferRole::Alias { .. } => vec![],
                BufferRole::Status => vec![0; STATUS_BYTES],
                BufferRole::Counters => vec![0; n],
                // Only sm_90a plans hold tensor maps, and host runs are of AMD plans.
                BufferRole::TensorMap { .. } => {
                    return Err(format!("`{}`: a TMA tensor map on the host", buf.name))
                }
                // A state not given starts zeroed, as a plain run's.
                BufferRole::State { name } => states
                    .get(name)
                    .map_or_else(|| vec![0; n], Tensor::to_bytes),
            })
        })
        .collect::<Result<_, String>>()
        .map_err(|e| format!("{}: {e}", g.name))
}

/// The prelude without its matrix-core fragment helpers: they call MFMA built-ins the host
/// compiler does not have, and no pointwise kernel uses them.
fn without_matrix_helpers(prelude: &str) -> String {
    const START: &str = "\n// ---- matrix-core fragment helpers for ";
    const END: &str = "// ---- end of the matrix-core fragment helpers ----\n";
    match (prelude.find(START), prelude.find(END)) {
        (Some(a), Some(b)) if a < b => format!("{}{}", &prelude[..a], &prelude[b + END.len()..]),
        _ => prelude.to_string(),
    }
}

/// One launch for the host driver: an entry point, its geometry and the buffers (indices into
/// the run's buffer list) bound to its parameters, in order.
pub struct HostLaunch<'a> {
    pub entry: &'a str,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub args: &'a [usize],
    /// Bytes into each of `args` where its pointer starts (empty: all at their start).
    pub offsets: Vec<usize>,
    /// Whether its blocks run with a fiber per GPU thread (`COOPERATIVE` families).
    pub cooperative: bool,
}

/// A main that reads buffers of `sizes` bytes from argv[1], runs `launches` in order (every
/// thread of every block in turn) and writes the buffers to argv[2].
fn driver(sizes: &[usize], launches: &[HostLaunch]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "\nstatic const size_t rf_sizes[] = {{0{}}};", {
        let mut list = String::new();
        for n in sizes {
            let _ = write!(list, ", {n}");
        }
        list
    });
    s.push_str(
        "int main(int argc, char** argv) {\n    const int nb = sizeof(rf_sizes) / sizeof(rf_sizes[0]) - 1;\n    unsigned char** buf = (unsigned char**)calloc(nb + 1, sizeof(void*));\n    FILE* in = fopen(argv[1], \"rb\");\n    if (!in) return 2;\n    for (int b = 0; b < nb; ++b) {\n        buf[b] = (unsigned char*)malloc(rf_sizes[b + 1] + 1);\n        if (fread(buf[b], 1, rf_sizes[b + 1], in) != rf_sizes[b + 1]) return 3;\n    }\n    fclose(in);\n",
    );
    for k in launches {
        let args: Vec<String> = k
            .args
            .iter()
            .enumerate()
            .map(|(i, &a)| {
                let at = k.offsets.get(i).copied().unwrap_or(0);
                format!("rf_host_ptr{{buf[{a}] + {at}}}")
            })
            .collect();
        let [gx, gy, gz] = k.grid;
        let [bx, by, bz] = k.block;
        if k.cooperative {
            let _ = writeln!(
                s,
                "    {{\n        auto rf_body = [&]() {{ {}({}); }};\n        for (unsigned gz = 0; gz < {gz}u; ++gz) for (unsigned gy = 0; gy < {gy}u; ++gy) for (unsigned gx = 0; gx < {gx}u; ++gx)\n            rf_host_run_block({bx}u, {{gx, gy, gz}}, [](void* b) {{ (*(decltype(rf_body)*)b)(); }}, &rf_body);\n    }}",
                k.entry,
                args.join(", ")
            );
            continue;
        }
        let _ = writeln!(
            s,
            "    for (unsigned gz = 0; gz < {gz}u; ++gz) for (unsigned gy = 0; gy < {gy}u; ++gy) for (unsigned gx = 0; gx < {gx}u; ++gx)\n    for (unsigned tz = 0; tz < {bz}u; ++tz) for (unsigned ty = 0; ty < {by}u; ++ty) for (unsigned tx = 0; tx < {bx}u; ++tx) {{\n        blockIdx = {{gx, gy, gz}}; threadIdx = {{tx, ty, tz}};\n        {}({});\n    }}",
            k.entry,
            args.join(", ")
        );
    }
    s.push_str(
        "    FILE* out = fopen(argv[2], \"wb\");\n    if (!out) return 4;\n    for (int b = 0; b < nb; ++b) fwrite(buf[b], 1, rf_sizes[b + 1], out);\n    fclose(out);\n    return 0;\n}\n",
    );
    s
}

/// The C++ program: shim, prelude, kernels, then the driver running them in plan order.
fn program(plan: &KernelPlan, sizes: &[usize]) -> String {
    // The plan's own AMD prelude (its wave size is the one cooperative kernels were shaped
    // for); an NVIDIA plan's prelude has PTX, so its pointwise kernels take gfx90a's.
    let target = if plan.target.platform == Platform::Amd {
        plan.target.clone()
    } else {
        Target::parse("gfx90a").expect("a known target")
    };
    let mut s = String::from(SHIM);
    s.push_str(&without_matrix_helpers(&prelude(&target)));
    let mut seen = std::collections::HashSet::new();
    for k in &plan.kernels {
        if seen.insert(&k.entry) {
            s.push('\n');
            s.push_str(&k.body);
        }
    }
    // An alias binds its base at its offset, as a GPU session binds it.
    let bound: Vec<(Vec<usize>, Vec<usize>)> = plan
        .kernels
        .iter()
        .map(|k| {
            k.args
                .iter()
                .map(|&a| {
                    let (base, at) = plan.storage(a);
                    (base, at * plan.buffers[a].ty.dtype.size_bytes())
                })
                .unzip()
        })
        .collect();
    let launches: Vec<HostLaunch> = plan
        .kernels
        .iter()
        .zip(&bound)
        .map(|(k, (args, offsets))| HostLaunch {
            entry: &k.entry,
            grid: k.launch.grid,
            block: k.launch.block,
            args,
            offsets: offsets.clone(),
            cooperative: COOPERATIVE.contains(&k.family),
        })
        .collect();
    s.push_str(&driver(sizes, &launches));
    s
}

/// Compiles `program` for the host and runs it on `buffers`; returns the buffers after it.
fn build_and_run(
    cxx: &Path,
    what: &str,
    program: &str,
    buffers: &[Vec<u8>],
) -> Result<Vec<Vec<u8>>, String> {
    let dir = std::env::temp_dir().join(format!(
        "rocmforge-host-{}-{}",
        std::process::id(),
        unique()
    ));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let (src, exe, input, output) = (
        dir.join("plan.cpp"),
        dir.join("plan"),
        dir.join("in.bin"),
        dir.join("out.bin"),
    );
    std::fs::write(&src, program).map_err(|e| e.to_string())?;
    std::fs::write(&input, buffers.concat()).map_err(|e| e.to_string())?;
    // -ffp-contract=off: no fused multiply-adds, so float results round as the interpreter's.
    let cc = Command::new(cxx)
        .args([
            "-std=c++17",
            "-O1",
            "-ffp-contract=off",
            "-pthread",
            "-w",
            "-o",
        ])
        .arg(&exe)
        .arg(&src)
        .output()
        .map_err(|e| e.to_string())?;
    if !cc.status.success() {
        return Err(format!(
            "{what}: host compile failed ({}):\n{}",
            src.display(),
            String::from_utf8_lossy(&cc.stderr)
        ));
    }
    let run = Command::new(&exe)
        .arg(&input)
        .arg(&output)
        .output()
        .map_err(|e| e.to_string())?;
    if !run.status.success() {
        return Err(format!("{what}: host run failed: {:?}", run.status));
    }
    let bytes = std::fs::read(&output).map_err(|e| e.to_string())?;
    std::fs::remove_dir_all(&dir).ok();
    let mut at = 0;
    Ok(buffers
        .iter()
        .map(|b| {
            let out = bytes[at..at + b.len()].to_vec();
            at += b.len();
            out
        })
        .collect())
}

/// Runs one kernel from its complete source (an AMD-prelude source, as a bundle's
/// `kernels/<entry>.hip` holds) on `buffers`, which are updated in place.
pub fn run_source(
    cxx: &Path,
    source: &str,
    launch: HostLaunch,
    buffers: &mut Vec<Vec<u8>>,
) -> Result<(), String> {
    let sizes: Vec<usize> = buffers.iter().map(Vec::len).collect();
    let mut program = String::from(SHIM);
    program.push_str(&without_matrix_helpers(source));
    program.push_str(&driver(&sizes, &[launch]));
    *buffers = build_and_run(cxx, "kernel", &program, buffers)?;
    Ok(())
}

/// What a run on the host gave: the plan's outputs, or the error its index checks raise (the
/// interpreter's error, as `Compiled::run` raises it on a GPU).
pub type HostResult = Result<Vec<Tensor>, InterpError>;

/// What a run with states gave: outputs and each state's buffer after the run, or the error.
pub type HostStateResult = Result<(Vec<Tensor>, HashMap<String, Tensor>), InterpError>;

/// Runs `plan` (generated from `g`) on the host with `bindings`; `Err(String)` when the plan
/// cannot run here (a kernel that is not pointwise) or the compiler fails.
pub fn run_plan(
    cxx: &Path,
    g: &Graph,
    plan: &KernelPlan,
    bindings: &Bindings,
) -> Result<HostResult, String> {
    Ok(run_plan_with_states(cxx, g, plan, bindings, &HashMap::new())?.map(|(outs, _)| outs))
}

/// As [`run_plan`], with the states' buffers starting from `states` (zeros for one not
/// given), and returning them after the run.
pub fn run_plan_with_states(
    cxx: &Path,
    g: &Graph,
    plan: &KernelPlan,
    bindings: &Bindings,
    states: &HashMap<String, Tensor>,
) -> Result<HostStateResult, String> {
    Ok(run_plan_with_states_buffers(cxx, g, plan, bindings, states)?.0)
}

/// [`run_plan_with_states`], with every buffer of the plan after the run (bytes, in the plan's
/// buffer order), for tests that look at a workspace's counters too.
pub fn run_plan_with_states_buffers(
    cxx: &Path,
    g: &Graph,
    plan: &KernelPlan,
    bindings: &Bindings,
    states: &HashMap<String, Tensor>,
) -> Result<(HostStateResult, Vec<Vec<u8>>), String> {
    let runs_here = |k: &&rocmforge::codegen::Kernel| {
        POINTWISE.contains(&k.family)
            || (COOPERATIVE.contains(&k.family) && k.launch.block[1..] == [1, 1])
    };
    if let Some(k) = plan.kernels.iter().find(|k| !runs_here(k)) {
        return Err(format!(
            "{}: {} is neither pointwise nor a one-dimensional cooperative kernel",
            g.name, k.entry
        ));
    }
    let init = initial_buffers(g, plan, bindings, states)?;
    let sizes: Vec<usize> = init.iter().map(Vec::len).collect();
    let buffers = build_and_run(cxx, &g.name, &program(plan, &sizes), &init)?;
    for check in &plan.checks {
        if let Some(index) = check.failed_index(&buffers[check.status]) {
            let err = match check.write_rows {
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
            };
            return Ok((Err(err), buffers));
        }
    }
    let outs = plan
        .outputs
        .iter()
        .map(|o| {
            let n = o.ty.shape.numel() * o.ty.dtype.size_bytes();
            Tensor::from_bytes(&o.ty, &buffers[o.buffer][..n]).map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, String>>()?;
    let mut next = HashMap::new();
    for b in &plan.buffers {
        if let BufferRole::State { name } = &b.role {
            let t = Tensor::from_bytes(&b.ty, &buffers[b.id]).map_err(|e| e.to_string())?;
            next.insert(name.clone(), t);
        }
    }
    Ok((Ok((outs, next)), buffers))
}

/// Every buffer of `plan` after a run on the host (bytes, in the plan's buffer order): for
/// tests that look past the outputs, at a workspace's counters.
pub fn run_plan_buffers(
    cxx: &Path,
    g: &Graph,
    plan: &KernelPlan,
    bindings: &Bindings,
) -> Result<Vec<Vec<u8>>, String> {
    let init = initial_buffers(g, plan, bindings, &HashMap::new())?;
    let sizes: Vec<usize> = init.iter().map(Vec::len).collect();
    build_and_run(cxx, &g.name, &program(plan, &sizes), &init)
}

fn unique() -> usize {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Whether every kernel of `plan` is pointwise, the gather included (cooperative only for its
/// index check), so that the plan runs on the host in its graph tests.
pub fn is_pointwise(plan: &KernelPlan) -> bool {
    plan.kernels
        .iter()
        .all(|k| POINTWISE.contains(&k.family) || k.family == "gather")
}

/// The weights `Graph::compile` draws for `g` (seed 0) as bindings, so the interpreter sees
/// what the kernels see.
pub fn with_weights(g: &Graph, mut b: Bindings) -> Bindings {
    for id in g.node_ids() {
        let n = g.node(id);
        match g.op(id) {
            Op::Weight {
                quant: Some(scheme),
                ..
            } => {
                b.quantized.entry(n.name.clone()).or_insert_with(|| {
                    random_quant(&n.name, *scheme, &n.ty.shape, 0)
                        .expect("a test graph's weights fit")
                });
            }
            Op::Weight { init, .. } => {
                b.weights.entry(n.name.clone()).or_insert_with(|| {
                    random_weight(&n.name, &n.ty, init, 0).expect("a test graph's weights fit")
                });
            }
            _ => {}
        }
    }
    b
}
