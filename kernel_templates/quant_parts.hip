{#- Reading ggml blocks (`ir::quant`): one quarter of a block, as the dequantizing kernels take it. -#}
{% macro legacy_piece(scheme) -%}
// Values 4q..4q+3 (v[0..4]) and 16+4q..16+4q+3 (v[4..8]) of the {{ scheme }} block at `blk`, in f32: the
// quants of bytes 4q..4q+3{% if scheme != "q8_0" %} (low nibbles, then the high nibbles 16 values on){% else %} and 16+4q..16+4q+3{% endif %}. Blocks are 2-byte
// aligned ({{ scheme }}: the buffer starts aligned and every block is an even number of bytes).
RF_INLINE void rf_dequant_piece(const unsigned char* __restrict__ blk, int q, float* v) {
    const float d = rf_h2f(*(const rf_half*)blk);
{% if scheme == "q8_0" %}    const unsigned short* qs = (const unsigned short*)(blk + 2);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const unsigned w = (unsigned)qs[8 * h + 2 * q] | ((unsigned)qs[8 * h + 2 * q + 1] << 16);
#pragma unroll
        for (int i = 0; i < 4; ++i) v[4 * h + i] = d * (float)(signed char)((w >> (8 * i)) & 0xffu);
    }
{% elif scheme == "q4_0" %}    const unsigned short* qs = (const unsigned short*)(blk + 2);
    const unsigned w = (unsigned)qs[2 * q] | ((unsigned)qs[2 * q + 1] << 16);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int b = (int)((w >> (8 * i)) & 0xffu);
        v[i] = d * (float)((b & 15) - 8);
        v[4 + i] = d * (float)((b >> 4) - 8);
    }
{% else %}    const float m = rf_h2f(*(const rf_half*)(blk + 2));
    // 20-byte blocks: the quants are 4-byte aligned.
    const unsigned w = *(const unsigned*)(blk + 4 + 4 * q);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int b = (int)((w >> (8 * i)) & 0xffu);
        v[i] = d * (float)(b & 15) + m;
        v[4 + i] = d * (float)(b >> 4) + m;
    }
{% endif %}}
{%- endmacro %}
{#- The other schemes (ir::kquant, ir::microscale): element `e` of a block, read byte by byte (any
alignment: blocks of 17, 22, 25, 110 ... bytes) in the order of operations of the host's
dequantizer, then a quarter of group `g` (32 values) of the block as rf_dequant_piece. -#}
{% macro element(scheme) -%}
RF_INLINE float rf_q_f16(const unsigned char* __restrict__ p) { return rf_h2f((rf_half)(p[0] | (p[1] << 8))); }
RF_INLINE float rf_q_bits(unsigned u) {
    union { unsigned u; float f; } c;
    c.u = u;
    return c.f;
}
// Element e of the {{ scheme }} block at `blk`, in f32, as ir::{% if scheme in ["mxfp4", "mxfp6_e2m3", "mxfp6_e3m2"] %}microscale{% else %}kquant{% endif %} computes it.
RF_INLINE float rf_q_elem(const unsigned char* __restrict__ blk, int e) {
{% if scheme == "q5_0" or scheme == "q5_1" %}    // Low nibble of byte j (e < 16) or high nibble of byte j - 16, plus bit e of qh as bit 4.
    const int at = {% if scheme == "q5_0" %}2{% else %}4{% endif %};
    const unsigned qh = (unsigned)blk[at] | ((unsigned)blk[at + 1] << 8) | ((unsigned)blk[at + 2] << 16) | ((unsigned)blk[at + 3] << 24);
    const int b = blk[at + 4 + (e & 15)];
    const int q = (e < 16 ? (b & 15) : (b >> 4)) | (int)(((qh >> e) & 1u) << 4);
{% if scheme == "q5_0" %}    return (float)(q - 16) * rf_q_f16(blk);
{% else %}    return (float)q * rf_q_f16(blk) + rf_q_f16(blk + 2);
{% endif %}{% elif scheme == "iq4_nl" %}    // ggml's kvalues_iq4nl {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}
    // as the bytes of two 64-bit constants: a local array would cost a stack frame on NVIDIA.
    const int b = blk[2 + (e & 15)];
    const int i = e < 16 ? (b & 15) : (b >> 4);
    const int g = (int)(signed char)(unsigned char)(((i < 8 ? 0xF6EADDCFBFAD9881ull : 0x7159453526190D01ull) >> (8 * (i & 7))) & 0xffull);
    return rf_q_f16(blk) * (float)g;
{% elif scheme == "q2_k" %}    const int sc = blk[e / 16];
    const float dl = rf_q_f16(blk + 80) * (float)(sc & 15);
    const float ml = rf_q_f16(blk + 82) * (float)(sc >> 4);
    const int q = (blk[16 + 32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
    return dl * (float)q - ml;
{% elif scheme == "q3_k" %}    // The 6-bit scale of e / 16: low 4 bits in byte s % 8 (nibble s / 8), high 2 in byte 8 + s % 4.
    const int s = e / 16;
    const int sc = (((blk[96 + s % 8] >> (4 * (s / 8))) & 15) | (((blk[104 + s % 4] >> (2 * (s / 4))) & 3) << 4)) - 32;
    const float dl = rf_q_f16(blk + 108) * (float)sc;
    const int lo = (blk[32 + 32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
    const int hi = (blk[e % 32] & (1 << (e / 32))) ? 0 : 4;
    return dl * (float)(lo - hi);
{% elif scheme == "q4_k" or scheme == "q5_k" %}    // ggml's get_scale_min_k4 for sub-block j = e / 32.
    const unsigned char* sm = blk + 4;
    const int j = e / 32;
    const int sc = j < 4 ? (sm[j] & 63) : ((sm[j + 4] & 15) | ((sm[j - 4] >> 6) << 4));
    const int mn = j < 4 ? (sm[j + 4] & 63) : ((sm[j + 4] >> 4) | ((sm[j] >> 6) << 4));
{% if scheme == "q4_k" %}    const int q = (blk[16 + 32 * (e / 64) + e % 32] >> (4 * (j % 2))) & 15;
{% else %}    const int q = ((blk[48 + 32 * (e / 64) + e % 32] >> (4 * (j % 2))) & 15) | ((blk[16 + e % 32] & (1 << j)) ? 16 : 0);
{% endif %}    return rf_q_f16(blk) * (float)sc * (float)q - rf_q_f16(blk + 2) * (float)mn;
{% elif scheme == "q6_k" %}    const int h = e / 128, r = e % 128;
    const int lo = (blk[64 * h + r % 64] >> (4 * (r / 64))) & 15;
    const int hi = (blk[128 + 32 * h + r % 32] >> (2 * (r / 32))) & 3;
    return rf_q_f16(blk + 208) * (float)(signed char)blk[192 + e / 16] * (float)((lo | (hi << 4)) - 32);
{% elif scheme == "q8_k" %}    const float d = rf_q_bits((unsigned)blk[0] | ((unsigned)blk[1] << 8) | ((unsigned)blk[2] << 16) | ((unsigned)blk[3] << 24));
    return d * (float)(signed char)blk[4 + e];
{% elif scheme == "mxfp4" %}    // E2M1 doubled (ggml's kvalues_mxfp4) times the halved E8M0 scale (GGML_E8M0_TO_FP32_HALF).
    // {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12} as the bytes of two 64-bit
    // constants (no local array: no stack frame).
    const unsigned x = blk[0];
    const float d = rf_q_bits(x < 2 ? (0x00200000u << x) : ((x - 1) << 23));
    const int b = blk[1 + (e & 15)];
    const int i = e < 16 ? (b & 15) : (b >> 4);
    const int g = (int)(signed char)(unsigned char)(((i < 8 ? 0x0C08060403020100ull : 0xF4F8FAFCFDFEFF00ull) >> (8 * (i & 7))) & 0xffull);
    return (float)g * d;
{% else %}    // OCP E8M0 scale (255: NaN), code e = bits 6e..6e+6 of the 24 code bytes (little-endian).
    const unsigned x = blk[0];
    const float d = x == 255 ? NAN : rf_q_bits(x == 0 ? 0x00400000u : (x << 23));
    const unsigned char* c = blk + 1 + 3 * (e / 4);
    const unsigned w = (unsigned)c[0] | ((unsigned)c[1] << 8) | ((unsigned)c[2] << 16);
    const int code = (int)((w >> (6 * (e % 4))) & 63u);
{% if scheme == "mxfp6_e2m3" %}    const int mant = 3, bias = 1;
{% else %}    const int mant = 2, bias = 3;
{% endif %}    const int ex = (code & 31) >> mant, m = code & ((1 << mant) - 1);
    // An integer significand times a power of two: exact, as on the host.
    const float mag = ldexpf((float)(ex == 0 ? m : ((1 << mant) | m)), (ex == 0 ? 1 : ex) - bias - mant);
    return d * ((code & 32) ? -mag : mag);
{% endif %}}
{%- endmacro %}
{% macro piece(scheme, groups) -%}
{% if scheme in ["q8_0", "q4_0", "q4_1"] %}{{ legacy_piece(scheme) }}{% else %}{{ element(scheme) }}
// Values 4q..4q+3 (v[0..4]) and 16+4q..16+4q+3 (v[4..8]) of {% if groups > 1 %}group g (values 32g..32g+31) of {% endif %}the {{ scheme }} block at `blk`.
RF_INLINE void rf_dequant_piece(const unsigned char* __restrict__ blk, {% if groups > 1 %}int g, {% endif %}int q, float* v) {
    const int e0 = {% if groups > 1 %}32 * g + {% endif %}4 * q;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[i] = rf_q_elem(blk, e0 + i);
        v[4 + i] = rf_q_elem(blk, e0 + 16 + i);
    }
}{% endif %}
{%- endmacro %}
{#- The int8 GEMV's activation quantization (`gemm_quant_dot.hip`'s per-block stage and the kernel of its own,
    `gemm_quant_act.hip`), in the kernel's namespace after `views` and `norm_helpers`: reads RF_M, RF_K,
    RF_THREADS, RF_RUNS (= RF_M·RF_K / 8) and RF_RUNS_IN_FLIGHT, and the types of `act_types`. -#}
{% macro act_types() -%}
struct alignas(8) rf_i2 { int x, y; };
struct alignas(16) rf_i4 { int x, y, z, w; };
// A group of 32 activations' scale d and the sum d·Σq of its rounded values, side by side so that one
// load reads both (two neighbouring groups' in one 16-byte load: rf_f4).
struct alignas(8) rf_f2 { float x, y; };
struct alignas(16) rf_f4 { float x, y, z, w; };
{%- endmacro %}
{% macro act_quantize(p) -%}
// Rounds of runs a thread takes per pass: RF_RUNS_IN_FLIGHT, or fewer where the runs end sooner (a thread
// with nothing in a round would still run its shuffles and roundings).
constexpr int RF_ROUNDS = (RF_RUNS + RF_THREADS - 1) / RF_THREADS < RF_RUNS_IN_FLIGHT ? (RF_RUNS + RF_THREADS - 1) / RF_THREADS : RF_RUNS_IN_FLIGHT;
// Runs first..last - 1 of A's RF_M rows of batch `bz` as int8 in `qa` (run i of 8 values: row 8i / K, columns
// 8i % K..+7, at qa[i]: row m at byte m·K), and per group of 32 (row m's group g at m·RF_K / 32 + g) its scale
// d = max|x| / 127 and d·Σq in `ds`; `first` a multiple of 4 (whole groups). Thread t takes runs first + t,
// first + t + RF_THREADS, ..., RF_ROUNDS of them loaded before any is rounded;
// the 4 runs of a group are 4 neighbouring lanes, which meet by shuffles (xor 1, 2). Every thread runs
// every round (the shuffles need all lanes), idle ones on 0.
{% if p.prologue %}// With the prologue, each value is normalised (rf_norm: the rows' statistics) before it is rounded to 8 bits.
{% endif %}RF_INLINE void rf_quantize_a(const {{ p.a_t }}* __restrict__ A, long long bz, int first, int last, rf_i2* qa, rf_f2* ds{% if p.prologue %}, const float* rf_norm, const {{ p.prologue.w_t }}* __restrict__ NW{% if p.prologue.layer %}, const {{ p.prologue.b_t }}* __restrict__ NB{% endif %}{% endif %}) {
    for (int base = first; base < last; base += RF_THREADS * RF_ROUNDS) {
        float x[RF_ROUNDS][8];
#pragma unroll
        for (int r = 0; r < RF_ROUNDS; ++r) {
            const int i = base + r * RF_THREADS + (int)threadIdx.x;
            const bool in = i < last;
            const int m = in ? 8 * i / RF_K : 0, k0 = in ? 8 * i % RF_K : 0;
#pragma unroll
            for (int e = 0; e < 8; ++e) {
{% if p.prologue %}                x[r][e] = in ? {{ p.a_pre }}A[rf_a_at(bz, m, k0 + e)]{{ p.a_post }} : 0.0f;
                if (in) x[r][e] = rf_norm_a(x[r][e], rf_norm[2 * m], rf_norm[2 * m + 1], NW, {% if p.prologue.layer %}NB, {% endif %}k0 + e);
{% else %}                x[r][e] = in ? {{ p.a_pre }}A[rf_a_at(bz, m, k0 + e)]{{ p.a_post }} : 0.0f;
{% endif %}            }
        }
#pragma unroll
        for (int r = 0; r < RF_ROUNDS; ++r) {
            const int i = base + r * RF_THREADS + (int)threadIdx.x;
            float amax = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(x[r][e]));
            amax = fmaxf(amax, rf_shfl_xor(amax, 1));
            amax = fmaxf(amax, rf_shfl_xor(amax, 2));
            const float d = amax / 127.0f;
            // |x| / d <= 127 up to rounding; halves away from zero, as the CPU executor's
            // quantize_row (src/cpu/quant.rs), so both devices round A alike. NaN where x is NaN
            // (fmaxf dropped it) or infinite (d is, and the reciprocal 0).
            const float id = d > 0.0f ? 1.0f / d : 0.0f;
            float q[8];
            float sum = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                q[e] = roundf(x[r][e] * id);
                sum += q[e];
            }
            sum += rf_shfl_xor(sum, 1);
            sum += rf_shfl_xor(sum, 2);
            // The sum keeps a NaN: a finite sum means 32 finite values.
            const bool finite = fabsf(sum) < INFINITY;
            if (i < last) {
                unsigned lo = 0u, hi = 0u;
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    lo |= ((unsigned)(finite ? (int)q[e] : 0) & 0xffu) << (8 * e);
                    hi |= ((unsigned)(finite ? (int)q[4 + e] : 0) & 0xffu) << (8 * e);
                }
                qa[i] = rf_i2{(int)lo, (int)hi};
                if (i % 4 == 0) ds[i / 4] = rf_f2{finite ? d : NAN, d * sum};
            }
        }
    }
}
{%- endmacro %}
