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
