// rocmforge prelude for NVIDIA GPUs (NVRTC): the HIP names the kernels use, mapped onto CUDA's.
// Target {{ arch }}, wave (warp) size {{ wave }}.
#define RF_WAVE {{ wave }}
#define RF_INLINE __device__ __forceinline__
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

// Tensor-core primitives (sm_80+), used only by flash_attention_mma.hip. Fragment layouts are
// PTX's for mma.m16n8k16: https://docs.nvidia.com/cuda/parallel-thread-execution/#warp-level-matrix-fragment-mma-16816-float
// (raw: the asm operands' braces are not template syntax)
{% raw %}RF_INLINE void rf_mma_f16(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
RF_INLINE void rf_mma_bf16(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Two floats into one register, `lo` in the low half (cvt puts its first source in the high half).
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
{% endraw %}
