{% set ktiles = (p.k + bk - 1) // bk %}{% set stage_bytes = a_bytes + b_bytes %}// GEMM on Hopper's warpgroup MMA ({{ atom_name }}: {{ instruction }}, f32 accumulation, sm_90a):
// {{ p.batch }} × [{{ p.m }}, {{ p.k }}] · [{{ p.k }}, {{ p.n }}], operands read in place through their views; {{ p.what }}.
// Block tile {{ bm }}×{{ bn }}, K in stages of {{ bk }} (one 128-byte line per tile row); {{ warpgroups }} warpgroups of 64 rows each.
// A and B arrive by 16-byte cp.async into a ring of {{ stages }} stages of dynamic shared memory ({{ stage_bytes }} bytes
// each), up to {{ stages - 2 }} ahead of use (one more stage is still read by the wgmma left in flight), stored K-major with the 128-byte swizzle the descriptors name; past M, N
// and K the chunks are zero-filled. The epilogue runs on the accumulators where the atom's C layout puts them.
RF_INLINE long long rf_a_at(long long bz, long long m, long long k) { return {{ p.a_at }}; }
RF_INLINE long long rf_b_at(long long bz, long long k, long long n) { return {{ p.b_at }}; }
RF_INLINE long long rf_c_at(long long bz, long long m, long long n) { return {{ p.c_at }}; }
{% for x in p.extra_at %}RF_INLINE long long rf_x{{ x[0] }}_at(long long bz, long long m, long long n) { return {{ x[1] }}; }
{% endfor %}// Byte offset of (row r, k) in a tile whose base is 1024-byte aligned: 16-byte chunk k / 8 of
// line r stored at chunk (k / 8) ^ (r % 8) (arch::mma::wgmma::SmemLayout::offset).
RF_INLINE unsigned rf_wg_at(int r, int k) { return (unsigned){{ smem_at }}; }
// The matrix descriptor of the K-major swizzled operand starting at shared address a.
RF_INLINE unsigned long long rf_wg_desc(unsigned a) { return {{ desc }}; }
// D += A·B for one K step of 16: A (64 rows) and B ({{ bn }} rows of K) from their descriptors.
RF_INLINE void rf_wgmma(float (&d)[{{ acc_n }}], unsigned long long da, unsigned long long db) {
    // scale-d is a predicate (true: accumulate into d); A and B unscaled, both K-major.
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %{{ acc_n + 2 }}, 0;\n{{ instruction }} {"
        "{% for i in range(acc_n) %}%{{ i }}{% if not loop.last %}, {% endif %}{% endfor %}}, %{{ acc_n }}, %{{ acc_n + 1 }}, p, 1, 1, 0, 0;\n}\n"
        : {% for i in range(acc_n) %}"+f"(d[{{ i }}]){% if not loop.last %}, {% endif %}{% endfor %}
        : "l"(da), "l"(db), "r"(1));
}
{#- Stage st gets the K tile at k0: every chunk by cp.async, zero-filled where invalid. -#}
{%- macro load_stage(st, k0) %}{
            const unsigned st_ = {{ st }};
            const int k0_ = {{ k0 }};
            unsigned char* as = smem + st_ * {{ stage_bytes }}u;
            unsigned char* bs = as + {{ a_bytes }};
#pragma unroll
            for (int i = 0; i < {{ a_iters }}; ++i) {
                const bool ok = a_ok[i] && k0_ + a_c[i] < {{ p.k }};
                rf_cp_async16(as + a_dst[i], ok ? A + a_base[i] + rf_a_at(0, 0, k0_ + a_c[i]) : A, ok);
            }
#pragma unroll
            for (int i = 0; i < {{ b_iters }}; ++i) {
                const bool ok = b_ok[i] && k0_ + b_c[i] < {{ p.k }};
                rf_cp_async16(bs + b_dst[i], ok ? B + b_base[i] + rf_b_at(0, k0_ + b_c[i], 0) : B, ok);
            }
        }{% endmacro %}
extern "C" __global__ void __launch_bounds__({{ threads }}, 1) {{ entry }}(const {{ p.a_t }}* __restrict__ A, const {{ p.b_t }}* __restrict__ B, {% for e in p.extras %}const {{ e.ctype }}* __restrict__ in{{ e.index }}, {% endfor %}{{ p.c_t }}* __restrict__ C) {
    RF_GRID_ENTER();
    // The ring starts at the first 1024-byte boundary of the dynamic shared memory (the launch
    // asks for 1024 bytes more): the hardware swizzles by address bits, the stores by offset.
    extern __shared__ __align__(16) unsigned char rf_smem_raw[];
    const unsigned raw = (unsigned)__cvta_generic_to_shared(rf_smem_raw);
    const unsigned base = (raw + 1023u) & ~1023u;
    unsigned char* smem = rf_smem_raw + (base - raw);
    const int wg = threadIdx.x / 128, lane = threadIdx.x % 128;
    const int m0 = blockIdx.y * {{ bm }}, n0 = blockIdx.x * {{ bn }};
    const long long bz = blockIdx.z;
    // This thread's 16-byte chunks of each tile (8 per line): where they go, whether their row
    // exists, and the part of their address that does not move with K.
    int a_c[{{ a_iters }}], b_c[{{ b_iters }}];
    unsigned a_dst[{{ a_iters }}], b_dst[{{ b_iters }}];
    bool a_ok[{{ a_iters }}], b_ok[{{ b_iters }}];
    long long a_base[{{ a_iters }}], b_base[{{ b_iters }}];
#pragma unroll
    for (int i = 0; i < {{ a_iters }}; ++i) {
        const int t = threadIdx.x + i * {{ threads }}, r = t / 8;
        a_c[i] = (t % 8) * 8;
        a_dst[i] = rf_wg_at(r, a_c[i]);
        a_ok[i] = m0 + r < {{ p.m }};
        a_base[i] = a_ok[i] ? rf_a_at(bz, m0 + r, 0) : 0;
    }
#pragma unroll
    for (int i = 0; i < {{ b_iters }}; ++i) {
        const int t = threadIdx.x + i * {{ threads }}, r = t / 8;
        b_c[i] = (t % 8) * 8;
        b_dst[i] = rf_wg_at(r, b_c[i]);
        b_ok[i] = n0 + r < {{ p.n }};
        b_base[i] = b_ok[i] ? rf_b_at(bz, 0, n0 + r) : 0;
    }
    float acc[{{ acc_n }}];
#pragma unroll
    for (int e = 0; e < {{ acc_n }}; ++e) acc[e] = 0.0f;
    // Prologue: tiles 0..{{ stages - 3 }} in flight, one commit group each (empty past the last tile, so
    // that the number of groups in flight stays fixed).
#pragma unroll
    for (int s = 0; s < {{ stages - 2 }}; ++s) {
        if (s < {{ ktiles }}) {{ load_stage("s", "s * " ~ bk) }}
        rf_cp_async_commit();
    }
    for (int kt = 0; kt < {{ ktiles }}; ++kt) {
        rf_cp_async_wait<{{ stages - 3 }}>();  // this thread's chunks of tile kt have landed
        // Written through the generic proxy, read next by the tensor cores (the async proxy):
        // each writing thread fences its own writes before the barrier that publishes them.
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        // Every chunk of tile kt is in; every warpgroup is done with tile kt - 2 (its wgmma
        // completed at the wait ending step kt - 1), whose stage is refilled next.
        __syncthreads();
        const int nt = kt + {{ stages - 2 }};
        if (nt < {{ ktiles }}) {{ load_stage("nt % " ~ stages, "nt * " ~ bk) }}
        rf_cp_async_commit();
        const unsigned a_s = base + (unsigned)(kt % {{ stages }}) * {{ stage_bytes }}u + (unsigned)wg * {{ 64 * bk * 2 }}u;
        const unsigned b_s = base + (unsigned)(kt % {{ stages }}) * {{ stage_bytes }}u + {{ a_bytes }}u;
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < {{ bk // 16 }}; ++kk)
            rf_wgmma(acc, rf_wg_desc(a_s + kk * 32), rf_wg_desc(b_s + kk * 32));
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        // Tile kt's wgmma stays in flight across the next step's barrier and loads (successive
        // wgmma on the same accumulators are ordered); tile kt - 1's is done reading.
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    // The epilogue, on each accumulator where the atom's C layout puts it.
#pragma unroll
    for (int e = 0; e < {{ acc_n }}; ++e) {
        const int row = m0 + wg * 64 + {{ c_row }};
        const int col = n0 + {{ c_col }};
        if (row >= {{ p.m }} || col >= {{ p.n }}) continue;
        const float acc_v = acc[e];
{%- if p.epilogue %}
        const float acc_r = {{ p.acc }};
{%- endif %}
{%- for x in p.extras %}
        const {{ x.vtype }} x{{ x.index }} = {{ x.load }};
{%- endfor %}
{%- for l in p.lines %}
        {{ l }}
{%- endfor %}
        C[rf_c_at(bz, row, col)] = {{ p.store }};
    }
}
