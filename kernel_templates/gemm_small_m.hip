{% import "gemm_parts.hip" as parts -%}
{% set arow = "m0 + m" if c.row_groups > 1 else "m" -%}
// GEMM for small M (decoding), GEMV-style: {{ p.batch }} × [{{ p.m }}, {{ p.k }}] · [{{ p.k }}, {{ p.n }}], operands read in
// place through their views; {{ p.what }}. A block computes {{ c.cols }} column(s) for {% if c.row_groups > 1 %}a group of {{ c.rows }} rows
// ({{ c.row_groups }} groups{% if c.row_groups * c.rows > p.m %}, the last storing {{ p.m - (c.row_groups - 1) * c.rows }}{% endif %}; the groups reading the same columns of B are adjacent in launch order, so B
// comes from DRAM once and from L2 for the others){% else %}all {{ p.m }} rows{% endif %}; its threads
// split K, accumulate in f32, and the waves' sums meet in shared memory, added in a fixed order
// (no atomics: the result is deterministic).
{% if c.along_n %}// B is read 16 bytes along N ({{ c.vec }} columns; B is N-contiguous, not K-contiguous): {{ c.groups }} lane(s) cover
// the block's columns of one row of B, the other lanes other rows; lanes with the same columns
// are summed by shuffles. A is read element by element (each value serves {{ c.vec }} columns).
{% else %}// K is split in chunks of {{ c.vec }} elements; B: {% if c.b_vec %}one 16-byte load{% else %}element loads{% endif %}, A: {% if c.a_vec %}one 16-byte load{% else %}element loads{% endif %} per chunk.
{% endif %}// Memory-bound: per batch it moves N·K elements of B from DRAM exactly once and N·M of the result
// (and of each epilogue operand) once: bytes ≈ batch·(N·K·|B| + N·M·|C|). A (M·K) is read once
// per block{% if c.row_groups > 1 %} (its group's rows){% endif %}, ceil(N / {{ c.cols }}) times in all, from L2: M/{{ c.cols }} of B's traffic, never from DRAM twice.
// Helpers in a namespace of their own: several kernels may share one translation unit.
namespace {{ entry }}_ns {
{% if c.row_groups > 1 %}// The block's rows (a group of them), the problem's, and the groups.
constexpr int RF_M = {{ c.rows }};
constexpr long long RF_M_ALL = {{ p.m }};
constexpr int RF_ROW_GROUPS = {{ c.row_groups }};
{% else %}constexpr int RF_M = {{ p.m }};
{% endif %}constexpr long long RF_N = {{ p.n }};
constexpr long long RF_K = {{ p.k }};
constexpr int RF_COLS = {{ c.cols }};
constexpr int RF_VEC = {{ c.vec }};
constexpr int RF_CHUNKS = {{ chunks }};
constexpr int RF_GROUPS = {{ c.groups }};
constexpr int RF_THREADS = {{ threads }};
{{ parts.views(p) }}
{{ parts.norm_helpers(p, c.row_groups > 1) }}// Sixteen bytes, loaded with one instruction.
struct alignas(16) rf_v16 { unsigned w[4]; };
RF_INLINE void rf_unpack(const rf_v16 v, float* f) {
{% if c.vec == 8 %}    for (int i = 0; i < 8; ++i) f[i] = {{ p.b_pre }}({{ p.b_t }})((v.w[i / 2] >> (16 * (i % 2))) & 0xffffu){{ p.b_post }};
{% else %}    for (int i = 0; i < 4; ++i) f[i] = __uint_as_float(v.w[i]);
{% endif %}}
{% if c.mma and p.prologue %}// The tensor-core form's row statistics: each wave takes whole rows (wave w rows w, w + waves, ...), its lanes
// striding K; `stats` as rf_norm_stats leaves them (mean, 1/√(var + eps) per row), then a barrier.
RF_INLINE void rf_norm_stats_rows(const {{ p.a_t }}* __restrict__ A, long long bz, float* stats) {
    const int lane = threadIdx.x % RF_WAVE, wave = threadIdx.x / RF_WAVE;
    for (int m = wave; m < RF_M; m += RF_THREADS / RF_WAVE) {
        float mean = 0.0f;
{% if p.prologue.layer %}        for (long long k = lane; k < RF_K; k += RF_WAVE) mean += {{ p.a_pre }}A[rf_a_at(bz, m, k)]{{ p.a_post }};
        mean = rf_wave_sum(mean) / (float)RF_K;
{% endif %}        float q = 0.0f;
        for (long long k = lane; k < RF_K; k += RF_WAVE) {
            const float c = {{ p.a_pre }}A[rf_a_at(bz, m, k)]{{ p.a_post }} - mean;
            q += c * c;
        }
        q = rf_wave_sum(q);
        if (lane == 0) {
            stats[2 * m] = mean;
            stats[2 * m + 1] = 1.0f / sqrtf(q / (float)RF_K + {{ p.prologue.eps_f }});  // correctly rounded, as the interpreter
        }
    }
    __syncthreads();
}
{% endif %}// RF_VEC elements of A's row `m` from `k0` (k0 < K; past K reads as 0).
RF_INLINE void rf_load_a(const {{ p.a_t }}* __restrict__ A, long long bz, long long m, long long k0, float* f) {
{% if c.a_vec %}    rf_unpack(*(const rf_v16*)(A + rf_a_at(bz, m, k0)), f);
{% else %}    for (int i = 0; i < RF_VEC; ++i) f[i] = k0 + i < RF_K ? {{ p.a_pre }}A[rf_a_at(bz, m, k0 + i)]{{ p.a_post }} : 0.0f;
{% endif %}}
// RF_VEC elements of B's column `n` from `k0` (k0 < K; past K reads as 0).
RF_INLINE void rf_load_b(const {{ p.b_t }}* __restrict__ B, long long bz, long long k0, long long n, float* f) {
{% if c.b_vec %}    rf_unpack(*(const rf_v16*)(B + rf_b_at(bz, k0, n)), f);
{% else %}    for (int i = 0; i < RF_VEC; ++i) f[i] = k0 + i < RF_K ? {{ p.b_pre }}B[rf_b_at(bz, k0 + i, n)]{{ p.b_post }} : 0.0f;
{% endif %}}
}  // namespace {{ entry }}_ns
extern "C" __global__ void __launch_bounds__({{ threads }}) {{ entry }}(const {{ p.a_t }}* __restrict__ A, const {{ p.b_t }}* __restrict__ B, {% for e in p.extras %}const {{ e.ctype }}* __restrict__ in{{ e.index }}, {% endfor %}{{ parts.norm_params(p) }}{{ p.c_t }}* __restrict__ C{% if argmax %}, float* __restrict__ ws, unsigned int* __restrict__ counters, int* __restrict__ token{% endif %}) {
    using namespace {{ entry }}_ns;
{% if not c.along_n and p.m <= 4 %}    // The block's columns of B (decode sizes; a weight: read by no kernel before this one) stream into L2, a
    // line per 16-byte chunk, while the previous kernel finishes; then the wait on it.
    RF_PREFETCH_LOOP(pf, threadIdx.x, (long long)RF_CHUNKS * RF_COLS, RF_THREADS, B + rf_b_at(blockIdx.y, (pf / RF_COLS) * RF_VEC, ((long long)blockIdx.x * RF_COLS + pf % RF_COLS < RF_N ? (long long)blockIdx.x * RF_COLS + pf % RF_COLS : RF_N - 1)));
{% endif %}    RF_GRID_ENTER();
    __shared__ float partial[RF_THREADS / RF_WAVE][RF_M * RF_COLS];
    const int lane = threadIdx.x % RF_WAVE, wave = threadIdx.x / RF_WAVE;
    const long long bz = blockIdx.y;
{% if c.row_groups > 1 %}    // The row group is x's fastest digit: the groups of a column block run together (B from L2 after the first).
    // The group's rows are g0.. ; it reads the RF_M rows from m0, which is g0 except in a last group that M
    // leaves partial: it reads the last RF_M rows (their first ones the previous group's, which stores them), so
    // every row it reads is inside and its addresses are m0's plus constants (clamped rows each took registers).
    const long long g0 = (long long)(blockIdx.x % RF_ROW_GROUPS) * RF_M;
    const long long m0 = g0 + RF_M <= RF_M_ALL ? g0 : RF_M_ALL - RF_M;
    const long long n0 = (long long)(blockIdx.x / RF_ROW_GROUPS) * RF_COLS;
{% else %}    const long long n0 = (long long)blockIdx.x * RF_COLS;
{% endif %}{% if c.mma %}{% if p.prologue %}    __shared__ float rf_norm[2 * RF_M];
    rf_norm_stats_rows(A, bz, rf_norm);
{% endif %}    // Tensor cores ({{ c.mma }}): the block's RF_COLS columns are one column tile of the atom, its RF_M rows
    // RF_MT row tiles (rows past M read as 0, never stored). Each wave takes steps of 32 of K in turn; a lane
    // loads 16 bytes (8 consecutive K) of its column of B (lane / 4) and of each of its rows of A (lane / 4 and
    // lane / 4 + 8 of each row tile) and gives words 0-1 to one k16 step and 2-3 to the next: every lane holds
    // the same K slots in A as in B, so this is the product over K in another order (small_m::mma_k_slots_agree
    // checks the atom's layouts). The waves' sums meet in shared memory as the CUDA-core form's do.
    constexpr int RF_MT = (RF_M + 15) / 16;
    constexpr long long RF_KSTEPS = (RF_K + 31) / 32;
    {{ c.mma }}_c acc[RF_MT];
#pragma unroll
    for (int i = 0; i < RF_MT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][e] = 0.0f;
    const int g = lane >> 2, q = lane & 3;
    const long long bn = n0 + g;
    for (long long s = wave; s < RF_KSTEPS; s += RF_THREADS / RF_WAVE) {
        const long long k0 = s * 32 + 8 * q;
        // K is a multiple of 8 (both operands load 16 bytes along it): a lane's 8 are inside or past K.
        const bool kin = k0 < RF_K;
        rf_v16 b = {};
        if (kin && bn < RF_N) b = *(const rf_v16*)(B + rf_b_at(bz, k0, bn));
#pragma unroll
        for (int i = 0; i < RF_MT; ++i) {
            rf_v16 a[2] = {};
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int m = 16 * i + g + 8 * h;
                if (!kin || m >= RF_M) continue;
                a[h] = *(const rf_v16*)(A + rf_a_at(bz, m, k0));
{% if p.prologue %}                // Normalised as loaded, rounded to A's dtype as the unfused norm stores it.
                float f[8];
                rf_unpack(a[h], f);
#pragma unroll
                for (int j = 0; j < 8; ++j) f[j] = {{ parts.norm_a(p, "f[j]", "m", "k0 + j") }};
#pragma unroll
                for (int j = 0; j < 4; ++j) a[h].w[j] = {{ mma_pack }}(f[2 * j], f[2 * j + 1]);
{% endif %}            }
#pragma unroll
            for (int t = 0; t < 2; ++t) {
                const {{ c.mma }}_a fa = {a[0].w[2 * t], a[1].w[2 * t], a[0].w[2 * t + 1], a[1].w[2 * t + 1]};
                const {{ c.mma }}_b fb = {b.w[2 * t], b.w[2 * t + 1]};
                {{ c.mma }}_mma(acc[i], fa, fb);
            }
        }
    }
    // C element e of row tile i: row 16i + g + 8(e / 2), column 2q + e % 2.
#pragma unroll
    for (int i = 0; i < RF_MT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int m = 16 * i + g + 8 * (e / 2);
            if (m < RF_M) partial[wave][m * RF_COLS + 2 * q + e % 2] = acc[i][e];
        }
{% else %}{{ parts.norm_stats(p, "    ", c.row_groups > 1) }}{% endif %}{% if c.mma %}{% elif c.along_n %}    const int g = lane % RF_GROUPS;
    const long long n = n0 + g * RF_VEC;
    float acc[RF_M][RF_VEC];
#pragma unroll
    for (int m = 0; m < RF_M; ++m)
#pragma unroll
        for (int i = 0; i < RF_VEC; ++i) acc[m][i] = 0.0f;
    // N is a multiple of RF_VEC (the view vectorizes): a vector is inside the problem or outside.
    if (n < RF_N) {
        for (long long k = threadIdx.x / RF_GROUPS; k < RF_K; k += RF_THREADS / RF_GROUPS) {
            float b[RF_VEC];
            rf_unpack(*(const rf_v16*)(B + rf_b_at(bz, k, n)), b);
#pragma unroll
            for (int m = 0; m < RF_M; ++m) {
                const float a = {% if p.prologue %}{{ parts.norm_a(p, p.a_pre ~ "A[rf_a_at(bz, " ~ arow ~ ", k)]" ~ p.a_post, "m", "k") }}{% else %}{{ p.a_pre }}A[rf_a_at(bz, {{ arow }}, k)]{{ p.a_post }}{% endif %};
#pragma unroll
                for (int i = 0; i < RF_VEC; ++i) acc[m][i] += a * b[i];
            }
        }
    }
#pragma unroll
    for (int m = 0; m < RF_M; ++m) {
#pragma unroll
        for (int i = 0; i < RF_VEC; ++i) {
            float s = acc[m][i];
            for (int mask = RF_GROUPS; mask < RF_WAVE; mask <<= 1) s += rf_shfl_xor(s, mask);
            if (lane < RF_GROUPS) partial[wave][m * RF_COLS + g * RF_VEC + i] = s;
        }
    }
{% else %}    float acc[RF_M][RF_COLS];
#pragma unroll
    for (int m = 0; m < RF_M; ++m)
#pragma unroll
        for (int j = 0; j < RF_COLS; ++j) acc[m][j] = 0.0f;
    for (int chunk = threadIdx.x; chunk < RF_CHUNKS; chunk += RF_THREADS) {
        const long long k0 = (long long)chunk * RF_VEC;
        float b[RF_COLS][RF_VEC];
#pragma unroll
        for (int j = 0; j < RF_COLS; ++j) {
            if (n0 + j < RF_N) {
                rf_load_b(B, bz, k0, n0 + j, b[j]);
            } else {
                for (int i = 0; i < RF_VEC; ++i) b[j][i] = 0.0f;
            }
        }
#pragma unroll
        for (int m = 0; m < RF_M; ++m) {
            float a[RF_VEC];
            rf_load_a(A, bz, {{ arow }}, k0, a);
{% if p.prologue %}#pragma unroll
            for (int i = 0; i < RF_VEC; ++i)
                if (k0 + i < RF_K) a[i] = {{ parts.norm_a(p, "a[i]", "m", "k0 + i") }};
{% endif %}#pragma unroll
            for (int j = 0; j < RF_COLS; ++j)
#pragma unroll
                for (int i = 0; i < RF_VEC; ++i) acc[m][j] += a[i] * b[j][i];
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
{% endif %}    __syncthreads();
{% if p.pair %}    {{ parts.pair_combine(p, c.row_groups > 1) }}{% else %}    for (int t = threadIdx.x; t < RF_M * RF_COLS; t += RF_THREADS) {
        const long long row = {% if c.row_groups > 1 %}m0 + {% endif %}t / RF_COLS, col = n0 + t % RF_COLS;
        if (col >= RF_N{% if c.row_groups > 1 %} || row < g0{% endif %}) continue;
        float acc_v = 0.0f;
        for (int w = 0; w < RF_THREADS / RF_WAVE; ++w) acc_v += partial[w][t];
{{ parts.store(p, "        ") }}
    }
{% endif %}{% if argmax %}    // Argmax of the one result row, fused (argmax_split's protocol, one launch fewer): thread 0 reads back
    // the block's stored columns (the values the unfused argmax would read, in C's dtype) keeping the first of
    // the largest, writes the block's (value, index) and counts the block (release fence first). The last block
    // to count (acquire fence) merges the {{ argmax.blocks }} partials, its threads each a strided share, then thread 0 the
    // threads' in order; `better` orders by (NaN first, value, lower index), so the result is the first index of
    // the maximum whatever block finished last. It puts the counter back to 0 for the next launch (and replay).
    auto better = [](float v, int j, float b, int bj) {
        if (bj < 0) return true;
        const bool vn = v != v, bn = b != b;
        if (vn != bn) return vn;
        if (!vn && v != b) return v > b;
        return j < bj;
    };
    // The block's stores of C, visible to its thread 0.
    __syncthreads();
    __shared__ unsigned int rf_is_last;
    if (threadIdx.x == 0) {
        float bv = 0.0f;
        int bi = -1;
        for (int j = 0; j < RF_COLS; ++j) {
            const long long col = n0 + j;
            if (col >= RF_N) break;
            const float v = {{ argmax.c_pre }}C[rf_c_at(bz, 0, col)]{{ argmax.c_post }};
            if (better(v, (int)col, bv, bi)) { bv = v; bi = (int)col; }
        }
        ws[blockIdx.x * 2LL] = bv;
        ws[blockIdx.x * 2LL + 1] = __uint_as_float((unsigned)bi);
        // Release: the partial is visible to every block before this one is counted.
        __threadfence();
        const unsigned int before = atomicAdd(&counters[0], 1u);
        rf_is_last = before == {{ argmax.blocks - 1 }}u ? 1u : 0u;
        if (rf_is_last) counters[0] = 0u;
    }
    __syncthreads();
    if (!rf_is_last) return;
    // Acquire: the other blocks' partials, read from L2 (rf_ld_l2) so that no L1 line serves them.
    __threadfence();
    __shared__ float rf_best_v[RF_THREADS];
    __shared__ int rf_best_i[RF_THREADS];
    {
        float bv = 0.0f;
        int bi = -1;
        // Sixteen partials a thread in flight at once: their loads are independent of the running best (one
        // round trip to L2 per sixteen, where a load at a time made this merge most of the LM head's time).
#pragma unroll 16
        for (int s = threadIdx.x; s < {{ argmax.blocks }}; s += RF_THREADS) {
            const float v = rf_ld_l2(ws + s * 2LL);
            const int j = (int)__float_as_uint(rf_ld_l2(ws + s * 2LL + 1));
            if (better(v, j, bv, bi)) { bv = v; bi = j; }
        }
        rf_best_v[threadIdx.x] = bv;
        rf_best_i[threadIdx.x] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float bv = 0.0f;
        int bi = -1;
        for (int t = 0; t < RF_THREADS; ++t)
            if (rf_best_i[t] >= 0 && better(rf_best_v[t], rf_best_i[t], bv, bi)) { bv = rf_best_v[t]; bi = rf_best_i[t]; }
        token[0] = bi;
    }
{% endif %}}
