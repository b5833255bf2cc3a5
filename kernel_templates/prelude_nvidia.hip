// rocmforge prelude for NVIDIA GPUs (NVRTC): the HIP names the kernels use, mapped onto CUDA's.
// Target {{ arch }}, wave (warp) size {{ wave }}.
#define RF_WAVE {{ wave }}
#define RF_INLINE __device__ __forceinline__
// Programmatic dependent launch (sm_90+): RF_GRID_ENTER(), a kernel's first statement, waits
// until the kernel before it on the stream has completed and its writes are visible
// (griddepcontrol.wait; it returns at once after a plain launch), then lets the next kernel be
// scheduled (launch_dependents): its launch and block start-up overlap this kernel's work, and it
// waits in turn. Codegen marks a kernel programmatic only where its body starts so.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define RF_GRID_ENTER() asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define RF_GRID_ENTER() do { } while (0)
#endif
// An L2 prefetch of the line holding `p`: a hint that loads nothing into registers and cannot
// return stale data (L2 is where every SM's writes meet), so a kernel may issue it before
// RF_GRID_ENTER() for data the kernels before it do not write (weights): the fetch from DRAM
// then overlaps the previous kernel. RF_PREFETCH_LOOP is the one form codegen accepts before the
// wait (codegen/lower.rs, `body_starts_with_grid_enter`).
RF_INLINE void rf_prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" :: "l"(p)); }
#define RF_PREFETCH_LOOP(i, begin, end, step, address) \
    for (long long i = (begin); i < (long long)(end); i += (step)) rf_prefetch_l2(address)
// The persistent kernel's (codegen/persistent.rs): a barrier among the block's first `threads` threads (a
// multiple of the warp size) while the others wait elsewhere: named barrier 1 (0 is __syncthreads'), which
// orders memory among the threads that take part. `state` is the AMD form's; unused here.
RF_INLINE void rf_sub_barrier(unsigned int* state, unsigned int threads) {
    (void)state;
    asm volatile("bar.sync 1, %0;" :: "r"(threads) : "memory");
}
// A short pause between polls of a word another block will write.
RF_INLINE void rf_spin_pause() { __nanosleep(64); }
// Adds 1 to a counter other blocks poll, releasing this thread's writes and those ordered before them (a block's
// barrier first: the whole block's): one reduction, no fence, no reply to wait for.
RF_INLINE void rf_count_release(unsigned int* p) { asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(p) : "memory"); }
// The global timer in nanoseconds (the same clock on every SM): the persistent kernel's timeline.
RF_INLINE unsigned long long rf_now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
// A counter's value, acquiring what the blocks that counted released.
RF_INLINE unsigned int rf_poll_acquire(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif

typedef unsigned short rf_half;  // f16 storage
typedef unsigned short rf_bf16;  // bf16 storage

RF_INLINE float rf_h2f(rf_half x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
}
RF_INLINE rf_half rf_f2h(float f) {
    rf_half r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
}
// HIP's __shfl_xor is wave-wide and implicitly synchronous; CUDA needs the explicit mask.
RF_INLINE float rf_shfl_xor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask, RF_WAVE); }
// A load served by L2, not this CU's/SM's L1: values another block wrote (after its release fence and our
// acquire fence) are read as written, and loads stay independent (unlike volatile ones) so several are in flight.
RF_INLINE float rf_ld_l2(const float* p) { return __ldcg(p); }
// c + the sum of the products of the four signed bytes of a and b ({{ dot4 }}: the arch row's `Dot4`).
RF_INLINE int rf_dot4_i8(int a, int b, int c) {
{% if dot4 == "dp4a" %}    return __dp4a(a, b, c);
{% else %}    for (int i = 0; i < 32; i += 8) c += (int)(signed char)(a >> i) * (int)(signed char)(b >> i);
    return c;
{% endif %}}

// ---- matrix-core primitives (the MMA block of this prelude) ----
// What the fragment helpers generated from the target's matrix atoms (codegen/mma, appended after
// the common prelude) build on: 16-bit packing, ldmatrix and cp.async. Layouts are PTX's:
// https://docs.nvidia.com/cuda/parallel-thread-execution/#warp-level-matrix-fragment-mma-16816-float
// (raw: the asm operands' braces are not template syntax)
{% raw %}// Two floats into one register, `lo` in the low half (cvt puts its first source in the high half).
RF_INLINE unsigned rf_pack_f16x2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
RF_INLINE unsigned rf_pack_bf16x2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
// Four 8x8 b16 matrices from shared memory, one register each; lane L gives the address of row
// L % 8 of matrix L / 8. The transposed form gives each thread a column pair instead of a row pair.
RF_INLINE void rf_ldsm_x4(unsigned* r, const void* smem) {
    const unsigned addr = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
RF_INLINE void rf_ldsm_x4_trans(unsigned* r, const void* smem) {
    const unsigned addr = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
// 16 bytes global -> shared without passing through registers; `valid` false fills zeros (the
// source address is then not read). Completion is tracked in commit groups.
RF_INLINE void rf_cp_async16(void* smem, const void* gmem, bool valid) {
    const unsigned addr = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(addr), "l"(gmem), "r"(valid ? 16 : 0));
}
RF_INLINE void rf_cp_async_commit() { asm volatile("cp.async.commit_group;"); }
// Waits until at most one committed group is still in flight.
RF_INLINE void rf_cp_async_wait_one() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
// Waits until at most N committed groups are still in flight (a pipeline of N + 2 stages).
template <int N> RF_INLINE void rf_cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
{% endraw %}// ---- end of the matrix-core primitives ----

