// Shared by every platform: bf16 conversion, activations, block reductions.
RF_INLINE float rf_b2f(rf_bf16 x) { return __uint_as_float(((unsigned int)x) << 16); }
RF_INLINE rf_bf16 rf_f2b(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (rf_bf16)0x7fc0;  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);                                 // round to nearest even
    return (rf_bf16)(u >> 16);
}
RF_INLINE float rf_sigmoid(float x) { return x >= 0.0f ? 1.0f / (1.0f + expf(-x)) : expf(x) / (1.0f + expf(x)); }
RF_INLINE float rf_silu(float x) { return x * rf_sigmoid(x); }
RF_INLINE float rf_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
RF_INLINE float rf_gelu_tanh(float x) { return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x))); }
RF_INLINE float rf_max(float a, float b) { return (a != a || b != b) ? NAN : fmaxf(a, b); }
RF_INLINE float rf_min(float a, float b) { return (a != a || b != b) ? NAN : fminf(a, b); }

// Reductions over a block of RF_BLOCK threads: within each wave by shuffles, then across waves
// through shared memory. Every thread of the block must call them.
#define RF_BLOCK 256
RF_INLINE float rf_wave_sum(float v) {
    for (int m = RF_WAVE / 2; m > 0; m >>= 1) v += rf_shfl_xor(v, m);
    return v;
}
RF_INLINE float rf_wave_max(float v) {
    for (int m = RF_WAVE / 2; m > 0; m >>= 1) v = fmaxf(v, rf_shfl_xor(v, m));
    return v;
}
RF_INLINE float rf_block_sum(float v, float* scratch) {
    v = rf_wave_sum(v);
    const int lane = threadIdx.x % RF_WAVE, wave = threadIdx.x / RF_WAVE;
    __syncthreads();
    if (lane == 0) scratch[wave] = v;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < RF_BLOCK / RF_WAVE; ++w) total += scratch[w];
    return total;
}
RF_INLINE float rf_block_max(float v, float* scratch) {
    v = rf_wave_max(v);
    const int lane = threadIdx.x % RF_WAVE, wave = threadIdx.x / RF_WAVE;
    __syncthreads();
    if (lane == 0) scratch[wave] = v;
    __syncthreads();
    float m = -INFINITY;
    for (int w = 0; w < RF_BLOCK / RF_WAVE; ++w) m = fmaxf(m, scratch[w]);
    return m;
}
