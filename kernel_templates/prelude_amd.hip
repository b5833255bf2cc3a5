// rocmforge prelude for AMD GPUs (hiprtc). Target {{ arch }}, wave size {{ wave }}.
// Everything that differs between AMD and NVIDIA is here; kernels use only rf_* names.
#define RF_WAVE {{ wave }}
#define RF_INLINE __device__ __forceinline__
// Programmatic dependent launch is NVIDIA's (see the NVIDIA prelude): nothing to wait for here,
// every launch waits for the one before it.
#define RF_GRID_ENTER() do { } while (0)
// The weight prefetch issued before the wait on NVIDIA (see there): nothing to overlap here.
#define RF_PREFETCH_LOOP(i, begin, end, step, address) do { } while (0)
// The persistent kernel's (codegen/persistent.rs): a barrier among the block's first `threads` threads (a
// multiple of the wave size) while the others wait elsewhere. s_barrier counts every wave of the workgroup, so
// this one is counted in shared memory: `state` = (arrivals, generation), zeroed when the kernel starts. Lane 0
// of each wave arrives; the last resets the count and bumps the generation, the others wait for the bump
// (lanes of a wave run in lockstep, so the rest of the wave waits with its lane 0).
RF_INLINE void rf_sub_barrier(unsigned int* state, unsigned int threads) {
    __threadfence_block();
    if (threadIdx.x % RF_WAVE == 0) {
        volatile unsigned int* gen = state + 1;
        const unsigned int seen = *gen;
        if (atomicAdd(state, 1u) == threads / RF_WAVE - 1) {
            state[0] = 0u;
            __threadfence_block();
            atomicAdd(state + 1, 1u);
        } else {
            while (*gen == seen) __builtin_amdgcn_s_sleep(1);
        }
    }
    __threadfence_block();
}
// A short pause between polls of a word another block will write.
RF_INLINE void rf_spin_pause() { __builtin_amdgcn_s_sleep(2); }
// Adds 1 to a counter other blocks poll, after a device-wide fence (release: this thread's writes and those
// ordered before them, a block's barrier first: the whole block's).
RF_INLINE void rf_count_release(unsigned int* p) {
    __threadfence();
    atomicAdd(p, 1u);
}
// The persistent kernel's timeline clock: the shader cycle counter (not nanoseconds, and per CU; a timeline
// on AMD is in these units).
RF_INLINE unsigned long long rf_now_ns() { return __builtin_readcyclecounter(); }
// A counter's value (volatile: from L2, never a stale line), then a fence (acquire).
RF_INLINE unsigned int rf_poll_acquire(const unsigned int* p) {
    const unsigned int v = *(const volatile unsigned int*)p;
    __threadfence();
    return v;
}
#ifndef INFINITY
#define INFINITY __builtin_inff()
#endif
#ifndef NAN
#define NAN __builtin_nanf("")
#endif

typedef unsigned short rf_half;  // f16 storage
typedef unsigned short rf_bf16;  // bf16 storage

RF_INLINE float rf_h2f(rf_half x) {
    union { rf_half u; _Float16 h; } c;
    c.u = x;
    return (float)c.h;
}
RF_INLINE rf_half rf_f2h(float f) {
    union { rf_half u; _Float16 h; } c;
    c.h = (_Float16)f;  // round to nearest even
    return c.u;
}
RF_INLINE float rf_shfl_xor(float v, int mask) { return __shfl_xor(v, mask, RF_WAVE); }
// A load served by L2, not this CU's/SM's L1: values another block wrote (after its release fence and our
// acquire fence) are read as written, and loads stay independent (unlike volatile ones) so several are in flight.
RF_INLINE float rf_ld_l2(const float* p) { return __builtin_nontemporal_load(p); }
// c + the sum of the products of the four signed bytes of a and b ({{ dot4 }}: the arch row's
// `Dot4`, which says which built-in this processor's clang accepts).
RF_INLINE int rf_dot4_i8(int a, int b, int c) {
{% if dot4 == "sdot4" %}    return __builtin_amdgcn_sdot4(a, b, c, false);
{% elif dot4 == "sudot4" %}    return __builtin_amdgcn_sudot4(true, a, true, b, c, false);
{% else %}    for (int i = 0; i < 32; i += 8) c += (int)(signed char)(a >> i) * (int)(signed char)(b >> i);
    return c;
{% endif %}}
