{% import "gemm_parts.hip" as parts -%}
{% import "quant_parts.hip" as quant -%}
{% set arow = "m0 + m" if c.row_groups > 1 else "m" -%}
// GEMM for small M (decoding) on a {{ scheme }} weight, GEMV-style: {{ p.batch }} × [{{ p.m }}, {{ p.k }}] · Wᵀ with W [{{ p.n }}, {{ p.k }}]
// kept in its blocks ({{ block_bytes }} bytes per {{ block_elems }} values along K) and dequantized in registers; A and the
// result read and written in place through their views; {{ p.what }}.
// A block computes {{ c.cols }} column(s) (rows of W) for {% if c.row_groups > 1 %}a group of {{ c.rows }} rows ({{ c.row_groups }} groups{% if c.row_groups * c.rows > p.m %}, the last storing {{ p.m - (c.row_groups - 1) * c.rows }}{% endif %};
// the groups reading the same rows of W are adjacent in launch order, so W comes from DRAM once and from L2 for
// the others){% else %}all {{ p.m }} rows{% endif %}; its threads split K in quarter blocks
// (8 values: the quants in bytes 4j..4j+3 of a block and the values 16 further on that share them), accumulate
// in f32, and the waves' sums meet in shared memory, added in a fixed order (deterministic). A: {% if c.a_vec %}one load of
// 4 elements{% else %}element loads{% endif %} per run of 4.
// Memory-bound: W's {{ weight_bytes }} bytes come from DRAM exactly once (vs {{ dense_bytes }} as {{ p.b_t }}); A (M·K) is read once per
// block from L2.
namespace {{ entry }}_ns {
{% if c.row_groups > 1 %}// The block's rows (a group of them), the problem's, and the groups.
constexpr int RF_M = {{ c.rows }};
constexpr long long RF_M_ALL = {{ p.m }};
constexpr int RF_ROW_GROUPS = {{ c.row_groups }};
{% else %}constexpr int RF_M = {{ p.m }};
{% endif %}constexpr long long RF_N = {{ p.n }};
constexpr int RF_COLS = {{ c.cols }};
constexpr int RF_THREADS = {{ threads }};
constexpr long long RF_BLOCKS = {{ blocks }};
constexpr long long RF_PIECES = RF_BLOCKS * 4;
constexpr long long RF_BLOCK_BYTES = {{ block_bytes }};
// Bytes of one row of W (rows are contiguous).
constexpr long long RF_ROW_BYTES = {% if groups > 1 %}RF_BLOCKS / {{ groups }} * RF_BLOCK_BYTES{% else %}RF_BLOCKS * RF_BLOCK_BYTES{% endif %};
{% if p.prologue %}constexpr long long RF_K = {{ p.k }};
{% endif %}{{ parts.views(p) }}
{{ parts.norm_helpers(p, c.row_groups > 1) }}{{ quant.piece(scheme, groups) }}
{% if c.a_vec %}struct alignas({{ 4 * a_bytes }}) rf_a4 { {% if a_bytes == 4 %}float x[4];{% else %}unsigned w[2];{% endif %} };
{% endif %}// A's 4 values of row `m` from `k` (a multiple of 4; K is whole blocks, so all 4 are inside).
RF_INLINE void rf_load_a4(const {{ p.a_t }}* __restrict__ A, long long bz, long long m, long long k, float* f) {
{% if c.a_vec %}    const rf_a4 x = *(const rf_a4*)(A + rf_a_at(bz, m, k));
{% if a_bytes == 4 %}    for (int i = 0; i < 4; ++i) f[i] = x.x[i];
{% else %}    for (int i = 0; i < 4; ++i) f[i] = {{ p.a_pre }}({{ p.a_t }})((x.w[i / 2] >> (16 * (i % 2))) & 0xffffu){{ p.a_post }};
{% endif %}{% else %}    for (int i = 0; i < 4; ++i) f[i] = {{ p.a_pre }}A[rf_a_at(bz, m, k + i)]{{ p.a_post }};
{% endif %}}
}  // namespace {{ entry }}_ns
extern "C" __global__ void __launch_bounds__({{ threads }}) {{ entry }}(const {{ p.a_t }}* __restrict__ A, const unsigned char* __restrict__ B, {% for e in p.extras %}const {{ e.ctype }}* __restrict__ in{{ e.index }}, {% endfor %}{{ parts.norm_params(p) }}{{ p.c_t }}* __restrict__ C) {
    using namespace {{ entry }}_ns;
{% if p.m <= 4 %}    // The block's weight rows (read by no kernel before this one) stream into L2 while the
    // previous kernel finishes; then the wait on it. Decode sizes only: past a few rows the
    // kernel is not launch-bound, and the prefetch's registers made M 16 spill on sm_90.
    RF_PREFETCH_LOOP(pf, threadIdx.x, ((RF_N - (long long)blockIdx.x * RF_COLS < RF_COLS ? RF_N - (long long)blockIdx.x * RF_COLS : RF_COLS) * RF_ROW_BYTES + 127) / 128, RF_THREADS, B + (long long)blockIdx.x * RF_COLS * RF_ROW_BYTES + pf * 128);
{% endif %}    RF_GRID_ENTER();
    __shared__ float partial[RF_THREADS / RF_WAVE][RF_M * RF_COLS];
    const int lane = threadIdx.x % RF_WAVE, wave = threadIdx.x / RF_WAVE;
    const long long bz = blockIdx.y;
{% if c.row_groups > 1 %}    // The row group is x's fastest digit: the groups of a column block run together (W from L2 after the first).
    // The group's rows are g0.. ; it reads the RF_M rows from m0, which is g0 except in a last group that M
    // leaves partial: it reads the last RF_M rows (their first ones the previous group's, which stores them), so
    // every row it reads is inside and its addresses are m0's plus constants (clamped rows each took registers).
    const long long g0 = (long long)(blockIdx.x % RF_ROW_GROUPS) * RF_M;
    const long long m0 = g0 + RF_M <= RF_M_ALL ? g0 : RF_M_ALL - RF_M;
    const long long n0 = (long long)(blockIdx.x / RF_ROW_GROUPS) * RF_COLS;
{% else %}    const long long n0 = (long long)blockIdx.x * RF_COLS;
{% endif %}{{ parts.norm_stats(p, "    ", c.row_groups > 1) }}    float acc[RF_M][RF_COLS];
#pragma unroll
    for (int m = 0; m < RF_M; ++m)
#pragma unroll
        for (int j = 0; j < RF_COLS; ++j) acc[m][j] = 0.0f;
    for (long long piece = threadIdx.x; piece < RF_PIECES; piece += RF_THREADS) {
        const long long blk = piece >> 2;
        const int q = (int)(piece & 3);
        const long long k0 = blk * 32 + 4 * q;
        float w[RF_COLS][8];
#pragma unroll
        for (int j = 0; j < RF_COLS; ++j) {
            if (n0 + j < RF_N) {
                rf_dequant_piece({% if groups > 1 %}B + ((n0 + j) * (RF_BLOCKS / {{ groups }}) + blk / {{ groups }}) * RF_BLOCK_BYTES, (int)(blk % {{ groups }}){% else %}B + ((n0 + j) * RF_BLOCKS + blk) * RF_BLOCK_BYTES{% endif %}, q, w[j]);
            } else {
                for (int i = 0; i < 8; ++i) w[j][i] = 0.0f;
            }
        }
#pragma unroll
        for (int m = 0; m < RF_M; ++m) {
            float a[8];
            rf_load_a4(A, bz, {{ arow }}, k0, a);
            rf_load_a4(A, bz, {{ arow }}, k0 + 16, a + 4);
{% if p.prologue %}#pragma unroll
            for (int i = 0; i < 4; ++i) {
                a[i] = {{ parts.norm_a(p, "a[i]", "m", "k0 + i") }};
                a[4 + i] = {{ parts.norm_a(p, "a[4 + i]", "m", "k0 + 16 + i") }};
            }
{% endif %}#pragma unroll
            for (int j = 0; j < RF_COLS; ++j)
#pragma unroll
                for (int i = 0; i < 8; ++i) acc[m][j] += a[i] * w[j][i];
        }
    }
#pragma unroll
    for (int m = 0; m < RF_M; ++m) {
#pragma unroll
        for (int j = 0; j < RF_COLS; ++j) {
            const float s = rf_wave_sum(acc[m][j]);
            if (lane == 0) partial[wave][m * RF_COLS + j] = s;
        }
    }
    __syncthreads();
{% if p.pair %}    {{ parts.pair_combine(p, c.row_groups > 1) }}{% else %}    for (int t = threadIdx.x; t < RF_M * RF_COLS; t += RF_THREADS) {
        const long long row = {% if c.row_groups > 1 %}m0 + {% endif %}t / RF_COLS, col = n0 + t % RF_COLS;
        if (col >= RF_N{% if c.row_groups > 1 %} || row < g0{% endif %}) continue;
        float acc_v = 0.0f;
        for (int w = 0; w < RF_THREADS / RF_WAVE; ++w) acc_v += partial[w][t];
{{ parts.store(p, "        ") }}
    }
{% endif %}}
