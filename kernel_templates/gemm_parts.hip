{#- Pieces every GEMM kernel shares, as macros: the views' offsets and the epilogue at the store. -#}
{% macro views(p) -%}
RF_INLINE long long rf_a_at(long long bz, long long m, long long k) { return {{ p.a_at }}; }
RF_INLINE long long rf_b_at(long long bz, long long k, long long n) { return {{ p.b_at }}; }
RF_INLINE long long rf_c_at(long long bz, long long m, long long n) { return {{ p.c_at }}; }
{% for x in p.extra_at %}RF_INLINE long long rf_x{{ x[0] }}_at(long long bz, long long m, long long n) { return {{ x[1] }}; }
{% endfor %}
{%- endmacro %}
{#- The epilogue and the store of one product `acc_v` (f32) at (bz, row, col), which are in scope. -#}
{% macro store(p, pad) -%}
{% if p.epilogue %}{{ pad }}const float acc_r = {{ p.acc }};
{% endif %}{% if p.pair %}{{ pad }}const float acc_r1 = {{ p.acc1 }};
{% endif %}{% for e in p.extras %}{{ pad }}const {{ e.vtype }} x{{ e.index }} = {{ e.load }};
{% endfor %}{% for l in p.lines %}{{ pad }}{{ l }}
{% endfor %}{{ pad }}C[rf_c_at(bz, row, col)] = {{ p.store }};
{%- endmacro %}
{#- The prologue (a folded RMSNorm/LayerNorm, `ir::gemm::Prologue`), in four pieces any GEMV
    kernel includes: its buffer parameters, its helpers (in the kernel's namespace, after
    `views`; they read RF_M, RF_K and RF_THREADS), the row statistics (every thread of the block,
    before the products: two block reductions over K of all rows at once for LayerNorm, one for
    RMSNorm), and the normalised value of one loaded A element. -#}
{% macro norm_params(p) -%}
{% if p.prologue %}const {{ p.prologue.w_t }}* __restrict__ NW, {% if p.prologue.layer %}const {{ p.prologue.b_t }}* __restrict__ NB, {% endif %}{% endif %}
{%- endmacro %}
{#- `grouped`: the block computes a group of rows (row groups, `small_m::Config::row_groups`): RF_M is
    the group's rows, and its row `m` of A is row m0 + m (every one inside the problem). -#}
{% macro norm_helpers(p, grouped=false) -%}
{% if p.prologue %}// Prologue: A's rows are {{ "LayerNorm" if p.prologue.layer else "RMSNorm" }}-normalised over K (eps {{ p.prologue.eps_f }}) as they are loaded;
// each block computes the statistics of its RF_M rows itself (the normalised rows are never stored).
// Each of `v`'s RF_M values summed over the block, in place: a wave's shuffles, one barrier, then every
// thread adds the waves' partials in the same order (`red`: RF_THREADS / RF_WAVE × RF_M floats).
RF_INLINE void rf_norm_sums(float* v, float* red) {
    const int lane = threadIdx.x % RF_WAVE, wave = threadIdx.x / RF_WAVE;
#pragma unroll
    for (int m = 0; m < RF_M; ++m) v[m] = rf_wave_sum(v[m]);
    // `red` may still be read by the previous call's threads.
    __syncthreads();
    if (lane == 0)
#pragma unroll
        for (int m = 0; m < RF_M; ++m) red[wave * RF_M + m] = v[m];
    __syncthreads();
#pragma unroll
    for (int m = 0; m < RF_M; ++m) {
        float t = 0.0f;
        for (int w = 0; w < RF_THREADS / RF_WAVE; ++w) t += red[w * RF_M + m];
        v[m] = t;
    }
}
// Each row `m`'s mean (0 for RMSNorm) and 1/√(var + eps) into stats[2m], stats[2m + 1]. All RF_M rows at
// once: a thread's loads of every row are in flight together and each pass ends in one block reduction
// of RF_M sums (a reduction and two barriers per row, one row after another, cost a batched decode step
// RF_M round trips to L2 per kernel).
RF_INLINE void rf_norm_stats(const {{ p.a_t }}* __restrict__ A, long long bz, {% if grouped %}long long m0, {% endif %}float* red, float* stats) {
    float mean[RF_M];
{% if p.prologue.layer %}#pragma unroll
    for (int m = 0; m < RF_M; ++m) mean[m] = 0.0f;
    for (long long k = threadIdx.x; k < RF_K; k += RF_THREADS)
#pragma unroll
        for (int m = 0; m < RF_M; ++m) mean[m] += {{ p.a_pre }}A[rf_a_at(bz, {% if grouped %}m0 + m{% else %}m{% endif %}, k)]{{ p.a_post }};
    rf_norm_sums(mean, red);
#pragma unroll
    for (int m = 0; m < RF_M; ++m) mean[m] /= (float)RF_K;
{% else %}#pragma unroll
    for (int m = 0; m < RF_M; ++m) mean[m] = 0.0f;
{% endif %}    float q[RF_M];
#pragma unroll
    for (int m = 0; m < RF_M; ++m) q[m] = 0.0f;
    for (long long k = threadIdx.x; k < RF_K; k += RF_THREADS)
#pragma unroll
        for (int m = 0; m < RF_M; ++m) {
            const float c = {{ p.a_pre }}A[rf_a_at(bz, {% if grouped %}m0 + m{% else %}m{% endif %}, k)]{{ p.a_post }} - mean[m];
            q[m] += c * c;
        }
    rf_norm_sums(q, red);
    if (threadIdx.x == 0)
#pragma unroll
        for (int m = 0; m < RF_M; ++m) {
            stats[2 * m] = mean[m];
            stats[2 * m + 1] = 1.0f / sqrtf(q[m] / (float)RF_K + {{ p.prologue.eps_f }});  // correctly rounded, as the interpreter
        }
    __syncthreads();
}
// The normalised value of A's element `v` at (row with `mean`, `inv`; column k < K).
RF_INLINE float rf_norm_a(float v, float mean, float inv, const {{ p.prologue.w_t }}* __restrict__ NW, {% if p.prologue.layer %}const {{ p.prologue.b_t }}* __restrict__ NB, {% endif %}long long k) {
    return {{ p.prologue.value }};
}
{% endif %}
{%- endmacro %}
{% macro norm_stats(p, pad, grouped=false) -%}
{% if p.prologue %}{{ pad }}__shared__ float rf_norm_red[(RF_THREADS / RF_WAVE) * RF_M];
{{ pad }}__shared__ float rf_norm[2 * RF_M];
{{ pad }}rf_norm_stats(A, bz, {% if grouped %}m0, {% endif %}rf_norm_red, rf_norm);
{% endif %}
{%- endmacro %}
{#- `v` normalised, for row `m` and column `k` (expressions in scope). -#}
{% macro norm_a(p, v, m, k) -%}
rf_norm_a({{ v }}, rf_norm[2 * ({{ m }})], rf_norm[2 * ({{ m }}) + 1], NW, {% if p.prologue.layer %}NB, {% endif %}{{ k }})
{%- endmacro %}
{#- Paired columns (`ir::gemm`): the GEMV kernels' last step when the block's RF_COLS product
    columns (an even count, from an even n0) pair up: thread t adds the waves' sums of pair t,
    `acc_v` the even column and `acc_u` the odd, and the epilogue stores result column
    `col` = (n0 + 2jj) / 2. RF_N is even, so a pair is inside the problem or outside. One pair
    per thread, no loop (codegen keeps M × RF_COLS / 2 ≤ one wave): with a loop, sm_90 spilled
    the loop's state around an f32 epilogue's division (a called slow path). `grouped`: the
    block's RF_M rows are rows m0.. of the problem, those before g0 (a partial last group's
    overlap with the previous group, which stores them) not stored. -#}
{% macro pair_combine(p, grouped=false) -%}
static_assert(RF_M * (RF_COLS / 2) <= RF_THREADS, "one column pair per thread");
    const int t = threadIdx.x;
    const int jj = t % (RF_COLS / 2), at = (t / (RF_COLS / 2)) * RF_COLS + 2 * jj;
    const long long row = {% if grouped %}m0 + {% endif %}t / (RF_COLS / 2), pc = n0 + 2 * jj, col = pc / 2;
    if (t < RF_M * (RF_COLS / 2) && pc < RF_N{% if grouped %} && row >= g0{% endif %}) {
        float acc_v = 0.0f, acc_u = 0.0f;
        for (int w = 0; w < RF_THREADS / RF_WAVE; ++w) {
            acc_v += partial[w][at];
            acc_u += partial[w][at + 1];
        }
{{ store(p, "        ") }}
    }
{% endmacro %}