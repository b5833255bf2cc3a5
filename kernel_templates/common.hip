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

// Integer semantics of ir::scalar. Sums, differences, products and negation wrap (two's
// complement): they are computed in unsigned arithmetic, where overflow is defined, because
// compilers assume signed overflow away.
#define RF_LL_MIN (-9223372036854775807LL - 1LL)
RF_INLINE long long rf_u2ll(unsigned long long u) {
    return (u >> 63) ? (long long)(u & 0x7fffffffffffffffULL) + RF_LL_MIN : (long long)u;
}
RF_INLINE long long rf_add_ll(long long a, long long b) { return rf_u2ll((unsigned long long)a + (unsigned long long)b); }
RF_INLINE long long rf_sub_ll(long long a, long long b) { return rf_u2ll((unsigned long long)a - (unsigned long long)b); }
RF_INLINE long long rf_mul_ll(long long a, long long b) { return rf_u2ll((unsigned long long)a * (unsigned long long)b); }
RF_INLINE long long rf_neg_ll(long long a) { return rf_u2ll(0ULL - (unsigned long long)a); }
RF_INLINE long long rf_abs_ll(long long a) { return a < 0 ? rf_neg_ll(a) : a; }
// Division by zero, and the one quotient that overflows (MIN / -1), give 0 (`checked_div`).
RF_INLINE long long rf_div_ll(long long a, long long b) { return (b == 0 || (b == -1 && a == RF_LL_MIN)) ? 0LL : a / b; }
// To i32 keeps the low 32 bits, as Rust's `as i32` does.
RF_INLINE long long rf_wrap_i32(long long x) {
    const unsigned long long u = (unsigned long long)x & 0xffffffffULL;
    return u >= 0x80000000ULL ? (long long)u - 0x100000000LL : (long long)u;
}
// Float to integer saturates at the type's limits and sends NaN to 0, as Rust's `as` does (C
// leaves out-of-range conversions undefined).
RF_INLINE int rf_f2i(float x) {
    return x != x ? 0 : x >= 2147483648.0f ? 2147483647 : x <= -2147483648.0f ? (-2147483647 - 1) : (int)x;
}
RF_INLINE long long rf_f2ll(float x) {
    return x != x ? 0LL : x >= 9223372036854775808.0f ? 9223372036854775807LL : x <= -9223372036854775808.0f ? RF_LL_MIN : (long long)x;
}
RF_INLINE long long rf_d2ll(double x) {
    return x != x ? 0LL : x >= 9223372036854775808.0 ? 9223372036854775807LL : x <= -9223372036854775808.0 ? RF_LL_MIN : (long long)x;
}

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
