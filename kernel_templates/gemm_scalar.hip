{% import "gemm_parts.hip" as parts -%}
// GEMM on CUDA cores: {{ p.batch }} × [{{ p.m }}, {{ p.k }}] · [{{ p.k }}, {{ p.n }}], operands read in place through
// their views; {{ p.what }}. {{ c.block_m }}×{{ c.block_n }} output tiles per block of {{ threads }} threads, each thread
// 8×8 outputs in four 4×4 quadrants half a tile apart, so that its reads of shared memory are
// 16-byte loads that the threads of a wave share without bank conflicts. K in steps of {{ c.block_k }} through
// double-buffered shared memory, A and B both K-major there: the next step's global loads are in
// flight while this step computes, and one barrier per step suffices. Global loads: A {{ c.a_load }},
// B {{ c.b_load }} (k: 16 bytes along K; x: 16 bytes along M or N; ek/ex: elements, K or M/N
// innermost). f32 accumulation: exact f32, as PyTorch's default.
// Helpers in a namespace of their own: several kernels may share one translation unit.
namespace {{ entry }}_ns {
constexpr long long RF_M = {{ p.m }};
constexpr long long RF_N = {{ p.n }};
constexpr long long RF_K = {{ p.k }};
constexpr int RF_BM = {{ c.block_m }};
constexpr int RF_BN = {{ c.block_n }};
constexpr int RF_BK = {{ c.block_k }};
constexpr int RF_THREADS = {{ threads }};
// Keeps the rows of a tile in different banks when a wave stores K-consecutive values (k loads),
// and each row 16-byte aligned.
constexpr int RF_PAD = 4;
{{ parts.views(p) }}
RF_INLINE long long rf_bt_at(long long bz, long long n, long long k) { return rf_b_at(bz, k, n); }
struct alignas(16) rf_f4 { float v[4]; };
{% macro loader(name, t, at, pre, post, mode, lim, bx) %}
// Unit `u` of {{ name }}'s [RF_BK][{{ bx }}] tile: its position (x, k); a unit is {% if mode in ["k", "x"] %}4 elements{% else %}one element{% endif %}.
RF_INLINE void rf_unit_{{ name }}(int u, int& x, int& k) {
{% if mode == "k" %}    x = u / (RF_BK / 4); k = u % (RF_BK / 4) * 4;
{% elif mode == "x" %}    x = u % ({{ bx }} / 4) * 4; k = u / ({{ bx }} / 4);
{% elif mode == "ek" %}    x = u / RF_BK; k = u % RF_BK;
{% else %}    x = u % {{ bx }}; k = u / {{ bx }};
{% endif %}}
constexpr int RF_{{ name | upper }}_REGS = {{ bx }} * RF_BK / RF_THREADS;
// This thread's share of the tile at (x0, k0) into registers; 0 outside the problem.
RF_INLINE void rf_fetch_{{ name }}(const {{ t }}* __restrict__ P, long long bz, long long x0, long long k0, float* r) {
{% if mode in ["k", "x"] %}#pragma unroll
    for (int i = 0; i < RF_{{ name | upper }}_REGS / 4; ++i) {
        int x, k;
        rf_unit_{{ name }}(threadIdx.x + i * RF_THREADS, x, k);
        // The view vectorizes: 4 | the axis's size, so the unit is inside the problem or outside.
        rf_f4 v = {};
        if (x0 + x < {{ lim }} && k0 + k < RF_K) v = *(const rf_f4*)(P + {{ at }}(bz, x0 + x, k0 + k));
#pragma unroll
        for (int j = 0; j < 4; ++j) r[4 * i + j] = v.v[j];
    }
{% else %}#pragma unroll
    for (int i = 0; i < RF_{{ name | upper }}_REGS; ++i) {
        int x, k;
        rf_unit_{{ name }}(threadIdx.x + i * RF_THREADS, x, k);
        r[i] = (x0 + x < {{ lim }} && k0 + k < RF_K) ? {{ pre }}P[{{ at }}(bz, x0 + x, k0 + k)]{{ post }} : 0.0f;
    }
{% endif %}}
// The registers of rf_fetch_{{ name }} into shared memory.
RF_INLINE void rf_put_{{ name }}(float (*S)[{{ bx }} + RF_PAD], const float* r) {
{% if mode in ["k", "x"] %}#pragma unroll
    for (int i = 0; i < RF_{{ name | upper }}_REGS / 4; ++i) {
        int x, k;
        rf_unit_{{ name }}(threadIdx.x + i * RF_THREADS, x, k);
{% if mode == "k" %}#pragma unroll
        for (int j = 0; j < 4; ++j) S[k + j][x] = r[4 * i + j];
{% else %}        *(rf_f4*)&S[k][x] = rf_f4{r[4 * i], r[4 * i + 1], r[4 * i + 2], r[4 * i + 3]};
{% endif %}    }
{% else %}#pragma unroll
    for (int i = 0; i < RF_{{ name | upper }}_REGS; ++i) {
        int x, k;
        rf_unit_{{ name }}(threadIdx.x + i * RF_THREADS, x, k);
        S[k][x] = r[i];
    }
{% endif %}}
{% endmacro %}
{{- loader("a", p.a_t, "rf_a_at", p.a_pre, p.a_post, c.a_load, "RF_M", "RF_BM") }}
{{- loader("b", p.b_t, "rf_bt_at", p.b_pre, p.b_post, c.b_load, "RF_N", "RF_BN") }}
}  // namespace {{ entry }}_ns
extern "C" __global__ void __launch_bounds__({{ threads }}) {{ entry }}(const {{ p.a_t }}* __restrict__ A, const {{ p.b_t }}* __restrict__ B, {% for e in p.extras %}const {{ e.ctype }}* __restrict__ in{{ e.index }}, {% endfor %}{{ p.c_t }}* __restrict__ C) {
    RF_GRID_ENTER();
    using namespace {{ entry }}_ns;
    alignas(16) __shared__ float As[2][RF_BK][RF_BM + RF_PAD];
    alignas(16) __shared__ float Bs[2][RF_BK][RF_BN + RF_PAD];
    const int tx = threadIdx.x % (RF_BN / 8), ty = threadIdx.x / (RF_BN / 8);
    const long long row0 = (long long)blockIdx.y * RF_BM, col0 = (long long)blockIdx.x * RF_BN;
    const long long bz = blockIdx.z;
    float ra[RF_A_REGS], rb[RF_B_REGS];
    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
    rf_fetch_a(A, bz, row0, 0, ra);
    rf_fetch_b(B, bz, col0, 0, rb);
    rf_put_a(As[0], ra);
    rf_put_b(Bs[0], rb);
    __syncthreads();
    int buf = 0;
    for (long long k0 = 0; k0 < RF_K; k0 += RF_BK) {
        const bool more = k0 + RF_BK < RF_K;
        if (more) {
            rf_fetch_a(A, bz, row0, k0 + RF_BK, ra);
            rf_fetch_b(B, bz, col0, k0 + RF_BK, rb);
        }
        // Partly unrolled: fully unrolled, AMD's scheduler hoists every step's shared-memory
        // reads ahead of the multiply-adds and runs out of registers.
#pragma unroll 4
        for (int kk = 0; kk < RF_BK; ++kk) {
            const rf_f4 a0 = *(const rf_f4*)&As[buf][kk][ty * 4];
            const rf_f4 a1 = *(const rf_f4*)&As[buf][kk][RF_BM / 2 + ty * 4];
            const rf_f4 b0 = *(const rf_f4*)&Bs[buf][kk][tx * 4];
            const rf_f4 b1 = *(const rf_f4*)&Bs[buf][kk][RF_BN / 2 + tx * 4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    acc[i][j] += a0.v[i] * b0.v[j];
                    acc[i][4 + j] += a0.v[i] * b1.v[j];
                    acc[4 + i][j] += a1.v[i] * b0.v[j];
                    acc[4 + i][4 + j] += a1.v[i] * b1.v[j];
                }
            }
        }
        if (more) {
            rf_put_a(As[buf ^ 1], ra);
            rf_put_b(Bs[buf ^ 1], rb);
        }
        __syncthreads();
        buf ^= 1;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const long long row = row0 + (i < 4 ? ty * 4 + i : RF_BM / 2 + ty * 4 + i - 4);
        if (row >= RF_M) continue;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const long long col = col0 + (j < 4 ? tx * 4 + j : RF_BN / 2 + tx * 4 + j - 4);
            if (col >= RF_N) continue;
            const float acc_v = acc[i][j];
{{ parts.store(p, "            ") }}
        }
    }
}
