{% set P = atom %}{% set cpr_a = ta.cols // ce %}{% set cpr_b = tb.cols // ce %}{% set ktiles = (p.k + c.bk - 1) // c.bk %}// GEMM on matrix cores ({{ atom_name }}, f32 accumulation): {{ p.batch }} × [{{ p.m }}, {{ p.k }}] · [{{ p.k }}, {{ p.n }}], operands read in
// place through their views; {{ p.what }}.{% if tf32 %}
// f32 operands at TF32 precision (opt-in): staged as f32, rounded to a 10-bit mantissa as fragments load,
// products accumulated in f32.{% endif %}
// Block tile {{ c.bm }}×{{ c.bn }}, K in steps of {{ c.bk }}; {{ c.warps_m }}×{{ c.warps_n }} warps, each owning {{ wm }}×{{ wn }} ({{ fm }}×{{ fn_ }} atom tiles).
// A is read {% if a_vec %}in 16-byte pieces{% else %}element by element{% endif %}, B ({{ b_form }} in shared memory) {% if b_vec %}in 16-byte pieces{% else %}element by element{% endif %}; past M, N and K tiles
// are zero-filled. {% if cp_async %}Tiles arrive by cp.async, up to {{ c.stages - 1 }} ahead of use ({{ c.stages }} buffers){% else %}Two tile buffers: the next tile is loaded into registers while this one is
// computed, then stored{% endif %}; fragments load {% if ldmatrix %}by ldmatrix from tiles whose 16-byte chunks are XOR-swizzled by
// row{% else %}through the atom's element loads from tiles whose rows are padded by 16 bytes{% endif %}, so the rows one load reads sit on distinct banks.
// The epilogue runs on the accumulators where they are (the atom's C layout) and stores through the out view.
RF_INLINE long long rf_a_at(long long bz, long long m, long long k) { return {{ p.a_at }}; }
RF_INLINE long long rf_b_at(long long bz, long long k, long long n) { return {{ p.b_at }}; }
RF_INLINE long long rf_c_at(long long bz, long long m, long long n) { return {{ p.c_at }}; }
{% for x in p.extra_at %}RF_INLINE long long rf_x{{ x[0] }}_at(long long bz, long long m, long long n) { return {{ x[1] }}; }
{% endfor %}// Element index of (r, c) in a shared tile: rows of ld halves, 16-byte chunk c / 8 stored at chunk (c / 8) ^ ((r / div) % mod).
RF_INLINE int rf_gemm_sa(int r, int c) { return r * {{ ta.ld }} + ((((c >> 3) ^ ((r / {{ ta.swz_div }}) % {{ ta.swz_mod }})) << 3) | (c & 7)); }
RF_INLINE int rf_gemm_sb(int r, int c) { return r * {{ tb.ld }} + ((((c >> 3) ^ ((r / {{ tb.swz_div }}) % {{ tb.swz_mod }})) << 3) | (c & 7)); }
struct __align__(16) rf_gemm_u4 { unsigned x, y, z, w; };
// 16 bytes at `p` where `ok`, else zeros. (A conditional expression choosing between two such
// structs is lowered through a stack copy on AMD: scratch.)
RF_INLINE rf_gemm_u4 rf_gemm_load16(const {{ smem_t }}* p, bool ok) {
    rf_gemm_u4 r;
    r.x = r.y = r.z = r.w = 0u;
    if (ok) r = *(const rf_gemm_u4*)p;
    return r;
}
{#- One 16-byte chunk of A (8 consecutive K of row m0 + a_r[i]) or of B (8 consecutive K of column
    n, or 8 consecutive N of row k), zero past the bounds. Element loads fill the four words by
    name, so that no array can end up in scratch. -#}
{%- macro pack8(one) %}[&] {
                rf_gemm_u4 r;
{%- for w in ["x", "y", "z", "w"] %}
{%- if ce == 4 %}
                r.{{ w }} = __float_as_uint({{ one(loop.index0) }});
{%- else %}
                r.{{ w }} = (unsigned){{ one(2 * loop.index0) }} | ((unsigned){{ one(2 * loop.index0 + 1) }} << 16);
{%- endif %}
{%- endfor %}
                return r;
            }(){% endmacro -%}
{%- macro a_elem(e) %}(a_ok[i] && k0_ + a_c[i] + {{ e }} < {{ p.k }} ? A[a_base[i] + rf_a_at(0, 0, k0_ + a_c[i] + {{ e }})] : {{ zero }}){% endmacro -%}
{%- macro b_elem_nk(e) %}(b_ok[i] && k0_ + b_c[i] + {{ e }} < {{ p.k }} ? B[b_base[i] + rf_b_at(0, k0_ + b_c[i] + {{ e }}, 0)] : {{ zero }}){% endmacro -%}
{%- macro b_elem_kn(e) %}(k0_ + b_r[i] < {{ p.k }} && n0 + b_c[i] + {{ e }} < {{ p.n }} ? B[rf_b_at(bz, k0_ + b_r[i], n0 + b_c[i] + {{ e }})] : {{ zero }}){% endmacro -%}
{#- Chunk i of tile k0_ (the caller's name for the tile's first K). -#}
{%- macro fetch_a() %}{% if a_vec %}rf_gemm_load16(A + a_base[i] + rf_a_at(0, 0, k0_ + a_c[i]), a_ok[i] && k0_ + a_c[i] < {{ p.k }}){% else %}{{ pack8(a_elem) }}{% endif %}{% endmacro -%}
{%- macro fetch_b() %}{% if b_form == "nk" %}{% if b_vec %}rf_gemm_load16(B + b_base[i] + rf_b_at(0, k0_ + b_c[i], 0), b_ok[i] && k0_ + b_c[i] < {{ p.k }}){% else %}{{ pack8(b_elem_nk) }}{% endif %}{% else %}{% if b_vec %}rf_gemm_load16(B + b_base[i] + rf_b_at(0, k0_ + b_r[i], 0), b_ok[i] && k0_ + b_r[i] < {{ p.k }}){% else %}{{ pack8(b_elem_kn) }}{% endif %}{% endif %}{% endmacro -%}
{#- The block's fragments of one stage, multiplied into the accumulators. -#}
{%- macro compute(stage) %}        {
            const {{ smem_t }}* as = As[{{ stage }}];
            const {{ smem_t }}* bs = Bs[{{ stage }}];
#pragma unroll
            for (int kk = 0; kk < {{ c.bk }}; kk += {{ P }}_K) {
                {{ P }}_a af[{{ fm }}];
                {{ P }}_b bf[{{ fn_ }}];
#pragma unroll
                for (int i = 0; i < {{ fm }}; ++i)
{% if ldmatrix %}                    {{ P }}_load_a_ldsm(af[i], as + rf_gemm_sa(wm0 + i * {{ P }}_M + {{ P }}_ldsm_a_row(lane), kk + {{ P }}_ldsm_a_col(lane)));
{% else %}                    {{ P }}_load_a(af[i], as + rf_gemm_sa(wm0 + i * {{ P }}_M, kk), {{ ta.ld }}, 0, {{ P }}_M, lane);
{% endif %}#pragma unroll
{% if ldmatrix %}                for (int j = 0; j < {{ fn_ }}; j += 2)
{% if b_form == "nk" %}                    {{ P }}_load_b_pair_ldsm(bf[j], bf[j + 1], bs + rf_gemm_sb(wn0 + j * {{ P }}_N + {{ P }}_ldsm_b_nk_row(lane), kk + {{ P }}_ldsm_b_nk_col(lane)));
{% else %}                    {{ P }}_load_b_pair_ldsm_trans(bf[j], bf[j + 1], bs + rf_gemm_sb(kk + {{ P }}_ldsm_b_kn_row(lane), wn0 + j * {{ P }}_N + {{ P }}_ldsm_b_kn_col(lane)));
{% endif %}{% else %}                for (int j = 0; j < {{ fn_ }}; ++j)
{% if b_form == "nk" %}                    {{ P }}_load_b_nk(bf[j], bs + rf_gemm_sb(wn0 + j * {{ P }}_N, kk), {{ tb.ld }}, lane);
{% else %}                    {{ P }}_load_b_kn(bf[j], bs + rf_gemm_sb(kk, wn0 + j * {{ P }}_N), {{ tb.ld }}, lane);
{% endif %}{% endif %}#pragma unroll
                for (int i = 0; i < {{ fm }}; ++i)
#pragma unroll
                    for (int j = 0; j < {{ fn_ }}; ++j) {{ P }}_mma(acc[i][j], af[i], bf[j]);
            }
        }
{% endmacro -%}
{#- Stage st gets tile k0: vector chunks by cp.async (zero-filled where invalid), element chunks
    through registers (visible to every warp after the next barrier, like the copies). -#}
{%- macro load_stage(st, k0) %}{
            const int st_ = {{ st }}, k0_ = {{ k0 }};
#pragma unroll
            for (int i = 0; i < {{ a_iters }}; ++i) {
                {{ smem_t }}* dst = &As[st_][rf_gemm_sa(a_r[i], a_c[i])];
{%- if a_vec %}
                const bool ok = a_ok[i] && k0_ + a_c[i] < {{ p.k }};
                rf_cp_async16(dst, ok ? A + a_base[i] + rf_a_at(0, 0, k0_ + a_c[i]) : A, ok);
{%- else %}
                *(rf_gemm_u4*)dst = {{ fetch_a() }};
{%- endif %}
            }
#pragma unroll
            for (int i = 0; i < {{ b_iters }}; ++i) {
                {{ smem_t }}* dst = &Bs[st_][rf_gemm_sb(b_r[i], b_c[i])];
{%- if b_vec and b_form == "nk" %}
                const bool ok = b_ok[i] && k0_ + b_c[i] < {{ p.k }};
                rf_cp_async16(dst, ok ? B + b_base[i] + rf_b_at(0, k0_ + b_c[i], 0) : B, ok);
{%- elif b_vec %}
                const bool ok = b_ok[i] && k0_ + b_r[i] < {{ p.k }};
                rf_cp_async16(dst, ok ? B + b_base[i] + rf_b_at(0, k0_ + b_r[i], 0) : B, ok);
{%- else %}
                *(rf_gemm_u4*)dst = {{ fetch_b() }};
{%- endif %}
            }
        }{% endmacro -%}
{#- The register path: tile k0 into registers, and registers into stage st. -#}
{%- macro fetch_tile(k0) %}{
            const int k0_ = {{ k0 }};
#pragma unroll
            for (int i = 0; i < {{ a_iters }}; ++i) a_reg[i] = {{ fetch_a() }};
#pragma unroll
            for (int i = 0; i < {{ b_iters }}; ++i) b_reg[i] = {{ fetch_b() }};
        }{% endmacro -%}
{%- macro store_tile(st) %}{
            const int st_ = {{ st }};
#pragma unroll
            for (int i = 0; i < {{ a_iters }}; ++i) *(rf_gemm_u4*)&As[st_][rf_gemm_sa(a_r[i], a_c[i])] = a_reg[i];
#pragma unroll
            for (int i = 0; i < {{ b_iters }}; ++i) *(rf_gemm_u4*)&Bs[st_][rf_gemm_sb(b_r[i], b_c[i])] = b_reg[i];
        }{% endmacro %}
{#- The stored value of element e + h of accumulator tile (i, j), at column col0 + h, into `to`. -#}
{%- macro value(h, to) %}{
                    const int col = col0 + {{ h }};
                    const float acc_v = acc[i][j][e + {{ h }}];
{%- if p.epilogue %}
                    const float acc_r = {{ p.acc }};
{%- endif %}
{%- for x in p.extras %}
                    const {{ x.vtype }} x{{ x.index }} = {{ x.load }};
{%- endfor %}
{%- for l in p.lines %}
                    {{ l }}
{%- endfor %}
                    {{ to }} = {{ p.store }};
                }{% endmacro %}
{%- if c_pairs %}
// Two adjacent outputs in one store (the address is aligned to the pair: checked when generated).
{%- if p.c_t == "float" %}
RF_INLINE void rf_gemm_store2(float* p, float a, float b) { *(float2*)p = make_float2(a, b); }
{%- else %}
RF_INLINE void rf_gemm_store2(unsigned short* p, unsigned short a, unsigned short b) { *(unsigned*)p = (unsigned)a | ((unsigned)b << 16); }
{%- endif %}
{%- endif %}
extern "C" __global__ void __launch_bounds__({{ threads }}) {{ entry }}(const {{ p.a_t }}* __restrict__ A, const {{ p.b_t }}* __restrict__ B, {% for e in p.extras %}const {{ e.ctype }}* __restrict__ in{{ e.index }}, {% endfor %}{{ p.c_t }}* __restrict__ C) {
    RF_GRID_ENTER();
    __shared__ __align__(16) {{ smem_t }} As[{{ c.stages }}][{{ ta.rows * ta.ld }}];
    __shared__ __align__(16) {{ smem_t }} Bs[{{ c.stages }}][{{ tb.rows * tb.ld }}];
    const int lane = threadIdx.x % {{ P }}_LANES, warp = threadIdx.x / {{ P }}_LANES;
    const int wm0 = (warp / {{ c.warps_n }}) * {{ wm }}, wn0 = (warp % {{ c.warps_n }}) * {{ wn }};
    const int m0 = blockIdx.y * {{ c.bm }}, n0 = blockIdx.x * {{ c.bn }};
    const long long bz = blockIdx.z;
    // This thread's 16-byte chunks of each tile ({{ cpr_a }} and {{ cpr_b }} per tile row): where they sit, whether
    // the row or column they belong to exists, and the part of their address that does not move with K
    // (a view's offset is a sum of a batch, a row and a column term).
    int a_r[{{ a_iters }}], a_c[{{ a_iters }}], b_r[{{ b_iters }}], b_c[{{ b_iters }}];
    bool a_ok[{{ a_iters }}], b_ok[{{ b_iters }}];
    long long a_base[{{ a_iters }}], b_base[{{ b_iters }}];
#pragma unroll
    for (int i = 0; i < {{ a_iters }}; ++i) {
        const int t = threadIdx.x + i * {{ threads }};
        a_r[i] = t / {{ cpr_a }};
        a_c[i] = (t % {{ cpr_a }}) * {{ ce }};
        a_ok[i] = m0 + a_r[i] < {{ p.m }};
        a_base[i] = a_ok[i] ? rf_a_at(bz, m0 + a_r[i], 0) : 0;
    }
#pragma unroll
    for (int i = 0; i < {{ b_iters }}; ++i) {
        const int t = threadIdx.x + i * {{ threads }};
        b_r[i] = t / {{ cpr_b }};
        b_c[i] = (t % {{ cpr_b }}) * {{ ce }};
{% if b_form == "nk" %}        b_ok[i] = n0 + b_r[i] < {{ p.n }};
        b_base[i] = b_ok[i] ? rf_b_at(bz, 0, n0 + b_r[i]) : 0;
{% else %}        b_ok[i] = n0 + b_c[i] < {{ p.n }};
        b_base[i] = b_ok[i] ? rf_b_at(bz, 0, n0 + b_c[i]) : 0;
{% endif %}    }
    {{ P }}_c acc[{{ fm }}][{{ fn_ }}];
#pragma unroll
    for (int i = 0; i < {{ fm }}; ++i)
#pragma unroll
        for (int j = 0; j < {{ fn_ }}; ++j) {{ P }}_zero_c(acc[i][j]);
{% if cp_async %}    // Prologue: tiles 0..{{ c.stages - 2 }} in flight, one commit group each (empty past the last tile, so
    // that the number of groups in flight stays fixed).
#pragma unroll
    for (int s = 0; s < {{ c.stages - 1 }}; ++s) {
        if (s < {{ ktiles }}) {{ load_stage("s", "s * " ~ c.bk) }}
        rf_cp_async_commit();
    }
    for (int kt = 0; kt < {{ ktiles }}; ++kt) {
        rf_cp_async_wait<{{ c.stages - 2 }}>();  // tile kt has landed
        __syncthreads();                // ... for every warp; and every warp is done with tile kt - 1
        const int nt = kt + {{ c.stages - 1 }};
        if (nt < {{ ktiles }}) {{ load_stage("nt % " ~ c.stages, "nt * " ~ c.bk) }}
        rf_cp_async_commit();
{{ compute("kt % " ~ c.stages) }}    }
{% else %}    rf_gemm_u4 a_reg[{{ a_iters }}], b_reg[{{ b_iters }}];
    if ({{ ktiles }} > 0) {
        {{ fetch_tile("0") }}
        {{ store_tile("0") }}
    }
    __syncthreads();
    for (int kt = 0; kt < {{ ktiles }}; ++kt) {
        // Tile kt + 1 travels to registers while tile kt is computed; buffer (kt + 1) % 2 was last
        // read in step kt - 1, which every warp finished before the barrier ending that step.
        const bool next = kt + 1 < {{ ktiles }};
        if (next) {{ fetch_tile("(kt + 1) * " ~ c.bk) }}
{{ compute("kt & 1") }}        if (next) {{ store_tile("(kt + 1) & 1") }}
        __syncthreads();
    }
{% endif %}    // The epilogue, on each accumulator where the atom's C layout puts it{% if c_pairs %}: elements 2h and 2h + 1 of
    // a lane are adjacent columns, and the out view is contiguous along N with even strides, so
    // each pair is one aligned store{% endif %}.
#pragma unroll
    for (int i = 0; i < {{ fm }}; ++i) {
#pragma unroll
        for (int j = 0; j < {{ fn_ }}; ++j) {
#pragma unroll
            for (int e = 0; e < {{ P }}_C_ELEMS; e += {{ 2 if c_pairs else 1 }}) {
                const int row = m0 + wm0 + i * {{ P }}_M + {{ P }}_c_row(lane, e);
                const int col0 = n0 + wn0 + j * {{ P }}_N + {{ P }}_c_col(lane, e);
                if (row >= {{ p.m }} || col0 >= {{ p.n }}) continue;
{%- if c_pairs %}
                {{ p.c_t }} v0, v1;
                {{ value("0", "v0") }}
                if (col0 + 1 < {{ p.n }}) {
                    {{ value("1", "v1") }}
                    rf_gemm_store2(C + rf_c_at(bz, row, col0), v0, v1);
                } else {
                    C[rf_c_at(bz, row, col0)] = v0;
                }
{%- else %}
                {{ p.c_t }} v0;
                {{ value("0", "v0") }}
                C[rf_c_at(bz, row, col0)] = v0;
{%- endif %}
            }
        }
    }
}
