// One persistent kernel for the whole plan (codegen/persistent.rs): {{ steps }} step(s) of the per-kernel plan,
// {{ tasks }} task(s) in all. A task is one block of one step's own launch, run by that step's kernel body (above,
// each turned into a device function whose blockIdx and gridDim are the task's). The grid's blocks of
// {{ threads }} threads claim tasks in plan order from one counter; a task first waits until the steps whose
// buffers it reads or overwrites have counted all their tasks (`rf_p_deps`, the plan's read/write order reduced
// to the steps not already implied), never for a grid-wide barrier. Since tasks are claimed in order and each
// waits only on earlier steps, the earliest unfinished task can always run: no block waits on a task that
// no running block holds, however many blocks are resident.
// Counting (release): the block's threads meet at a barrier, thread 0 fences and adds 1 to its step's word.
// Waiting (acquire): thread 0 reads the word until it reaches the step's task count, then fences; the task's
// threads meet at a barrier. A wait that lasts {{ spin_limit }} polls (a dependency that is never met) records
// the waiting step and the step it waited for in `stall`, raises the abort word, and every wait then gives up:
// the kernel ends and the session reports a typed error instead of hanging the GPU.
// The last block to leave puts every word back to 0 for the next launch (and a replayed graph).
{{ step_list }}namespace {{ entry }}_ns {
constexpr unsigned int RF_P_STEPS = {{ steps }};
constexpr unsigned int RF_P_TASKS = {{ tasks }};
constexpr unsigned int RF_P_THREADS = {{ threads }};
// Words of `sync`: tasks done per step, then the claim counter, the blocks that left, the abort flag.
constexpr unsigned int RF_P_CLAIM = RF_P_STEPS, RF_P_EXITED = RF_P_STEPS + 1, RF_P_ABORT = RF_P_STEPS + 2;
constexpr unsigned int RF_P_WORDS = RF_P_STEPS + 3;
constexpr unsigned int RF_P_SPIN_LIMIT = {{ spin_limit }}u;
// The first task of each step (and the total): step s has tasks rf_p_first[s] .. rf_p_first[s + 1].
__constant__ unsigned int rf_p_first[RF_P_STEPS + 1] = { {{ first }} };
// The steps each step waits for: rf_p_deps[rf_p_dep_at[s] .. rf_p_dep_at[s + 1]].
__constant__ unsigned int rf_p_dep_at[RF_P_STEPS + 1] = { {{ dep_at }} };
__constant__ unsigned short rf_p_deps[{{ dep_slots }}] = { {{ deps }} };
// Per step: which distinct kernel it runs (a case of the dispatcher), its launch's grid and threads, its blocks
// per task, and its buffers as slots of the argument table: rf_p_slots[rf_p_slot_at[s] .. rf_p_slot_at[s + 1]].
__constant__ unsigned short rf_p_kind[RF_P_STEPS] = { {{ kind }} };
__constant__ unsigned int rf_p_grid[RF_P_STEPS][3] = { {{ grid }} };
__constant__ unsigned short rf_p_threads[RF_P_STEPS] = { {{ threads_of }} };
__constant__ unsigned int rf_p_chunk[RF_P_STEPS] = { {{ chunk }} };
__constant__ unsigned int rf_p_slot_at[RF_P_STEPS + 1] = { {{ slot_at }} };
__constant__ unsigned short rf_p_slots[{{ slot_count }}] = { {{ slots }} };
}  // namespace {{ entry }}_ns

// What a task body knows of its task: its block of its step's grid, and the kernel's shared state.
struct rf_p_task {
    uint3 block, grid;
    unsigned int step, threads;
    unsigned int waited;  // 1: this task already waited (its later blocks need not)
    unsigned int* sync;
    unsigned long long* stall;
    int* ok;            // shared: the wait's verdict
};
// A pointer of the argument table, converted to the parameter type it is passed as.
struct rf_p_ptr {
    unsigned long long v;
    template <class T> RF_INLINE operator T*() const { return (T*)v; }
};

// The partial barrier's words (rf_sub_barrier), zeroed when a block starts.
__shared__ unsigned int rf_p_bar[2];
{% if timed %}// Nanoseconds the current task's thread 0 spent waiting for its dependencies (the timeline).
__shared__ unsigned long long rf_p_wait_ns;
{% endif %}

// The task barrier: the whole block's where the task has every thread, else its own threads' alone.
RF_INLINE void rf_p_sync(const rf_p_task& t) {
    if (t.threads == {{ threads }}u) {
        __syncthreads();
    } else {
        rf_sub_barrier(rf_p_bar, t.threads);
    }
}

// Waits until every step `t` depends on is done (thread 0 polls; the task's threads meet after, or the whole
// block's where `whole`: the dispatcher's wait, which every thread reaches). False when the run was aborted
// (this wait's limit, or another's).
RF_INLINE bool rf_p_enter(const rf_p_task& t, bool whole) {
    using namespace {{ entry }}_ns;
    if (t.waited) return true;
    if (threadIdx.x == 0) {
        int ok = 1;
{% if timed %}        const unsigned long long before = rf_now_ns();
{% endif %}        for (unsigned int i = rf_p_dep_at[t.step]; ok && i < rf_p_dep_at[t.step + 1]; ++i) {
            const unsigned int d = rf_p_deps[i];
            const unsigned int need = rf_p_first[d + 1] - rf_p_first[d];
            for (unsigned int spin = 0; rf_poll_acquire(t.sync + d) < need; ++spin) {
                if (*(const volatile unsigned int*)(t.sync + RF_P_ABORT) != 0u) {
                    ok = 0;
                    break;
                }
                if (spin == RF_P_SPIN_LIMIT) {
                    if (atomicCAS(t.stall, 0ull, ~(unsigned long long)t.step) == 0ull) t.stall[1] = d;
                    atomicExch(t.sync + RF_P_ABORT, 1u);
                    ok = 0;
                    break;
                }
                rf_spin_pause();
            }
        }
        // The polls acquired the steps' writes; this block's threads see them after the barrier.
        *t.ok = ok;
{% if timed %}        rf_p_wait_ns += rf_now_ns() - before;
{% endif %}
    }
    if (whole) {
        __syncthreads();
    } else {
        rf_p_sync(t);
    }
    return *t.ok != 0;
}

// The task bodies, each a step's kernel as a device function of its task.
#define blockIdx rf_t.block
#define gridDim rf_t.grid
#undef RF_GRID_ENTER
{{ bodies }}
#undef blockIdx
#undef gridDim

// Registers bounded for the shape's resident blocks per multiprocessor ({{ min_blocks }}: blocks per SM on NVIDIA, waves per
// SIMD on AMD, as each compiler reads the second bound).
extern "C" __global__ void __launch_bounds__({{ threads }}, {{ min_blocks }}) {{ entry }}(const unsigned long long* __restrict__ rf_args) {
    using namespace {{ entry }}_ns;
    __shared__ unsigned int rf_claimed, rf_last;
    __shared__ int rf_ok;
    unsigned int* const sync = (unsigned int*)rf_args[{{ sync_arg }}];
    unsigned long long* const stall = (unsigned long long*)rf_args[{{ stall_arg }}];
    if (threadIdx.x == 0) {
        rf_p_bar[0] = 0u;
        rf_p_bar[1] = 0u;
{% if timed %}        // The timeline's kernel words (after the steps'): the first block's start, the last block's exit.
        atomicMax(stall + 2 + 4ull * RF_P_STEPS, ~rf_now_ns());
{% endif %}    }
    // A block claims its next task when it is free: claiming ahead (while running a task) tied the next step's
    // tasks to blocks still busy with this one's, and measured slower (H200, docs/performance.md).
    for (;;) {
        if (threadIdx.x == 0) rf_claimed = atomicAdd(sync + RF_P_CLAIM, 1u);
        __syncthreads();
        const unsigned int task = rf_claimed;
        __syncthreads();
        if (task >= RF_P_TASKS) break;
{% if timed %}        unsigned long long t0 = 0;
        if (threadIdx.x == 0) {
            rf_p_wait_ns = 0;
            t0 = rf_now_ns();
        }
{% endif %}
        // The task's step: the last whose first task is at or before it.
        unsigned int lo = 0, hi = RF_P_STEPS - 1;
        while (lo < hi) {
            const unsigned int mid = (lo + hi + 1) / 2;
            if (rf_p_first[mid] <= task) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        const unsigned int b = task - rf_p_first[lo];
        rf_p_task t;
        t.step = lo;
        t.waited = 0u;
        t.grid = make_uint3(rf_p_grid[lo][0], rf_p_grid[lo][1], rf_p_grid[lo][2]);
        t.threads = rf_p_threads[lo];
        const unsigned int chunk = rf_p_chunk[lo];
        const unsigned int blocks = t.grid.x * t.grid.y * t.grid.z;
        t.sync = sync;
        t.stall = stall;
        t.ok = &rf_ok;
        switch (rf_p_kind[lo]) {
{{ cases }}        default:
            break;
        }
        // Every thread is done with the task (its shared memory is free for the next); count it (release).
        __syncthreads();
        if (threadIdx.x == 0) {
{% if timed %}            // The timeline (stall's words 2.. : per step the complement of the first body start, the last end,
            // the tasks' wait and body nanoseconds), zeroed before every run.
            const unsigned long long end = rf_now_ns(), waited = rf_p_wait_ns, start = t0 + waited;
            unsigned long long* tl = stall + 2 + 4ull * lo;
            atomicMax(tl, ~start);
            atomicMax(tl + 1, end);
            atomicAdd(tl + 2, waited);
            atomicAdd(tl + 3, end - start);
{% endif %}            rf_count_release(sync + lo);
        }
    }
    // The last block to leave resets every word: no task reads them any more in this launch.
    if (threadIdx.x == 0) {
{% if timed %}        atomicMax(stall + 3 + 4ull * RF_P_STEPS, rf_now_ns());
{% endif %}
        __threadfence();
        rf_last = atomicAdd(sync + RF_P_EXITED, 1u) == gridDim.x - 1 ? 1u : 0u;
    }
    __syncthreads();
    if (rf_last) {
        __threadfence();
        for (unsigned int i = threadIdx.x; i < RF_P_WORDS; i += RF_P_THREADS) sync[i] = 0u;
    }
}
