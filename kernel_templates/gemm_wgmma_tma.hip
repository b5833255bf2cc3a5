{% set ktiles = (p.k + bk - 1) // bk %}{% set stage_bytes = a_bytes + b_bytes %}// GEMM on Hopper's warpgroup MMA with TMA loads ({{ atom_name }}: {{ instruction }}, f32 accumulation, sm_90a):
// {{ p.batch }} × [{{ p.m }}, {{ p.k }}] · [{{ p.k }}, {{ p.n }}]; {{ p.what }}.
// Block tile {{ bm }}×{{ bn }}, K in stages of {{ bk }} (one 128-byte line per tile row). Warp-specialised: warpgroup 0
// produces (one thread issues the TMA copies of A's and B's boxes into a ring of {{ stages }} stages, {{ stage_bytes }} bytes
// each, completing on the stage's "full" mbarrier; its registers are given back with setmaxnreg), warpgroups 1..{{ consumers }}
// consume (each waits for a stage, multiplies its 64 rows of A by the stage's B with wgmma, and gives the stage back on
// its "empty" mbarrier once that wgmma has completed). TMA writes the 128-byte swizzle the descriptors name and
// zero-fills past M, N and K. Persistent: {{ grid }} blocks take tiles {{ grid }} apart ({{ tiles }} tiles, M fastest, so the
// blocks at work at once share B's columns); the producer runs on into the next tile's stages while the consumers
// finish a tile's epilogue, which runs on the accumulators where the atom's C layout puts them.
RF_INLINE long long rf_c_at(long long bz, long long m, long long n) { return {{ p.c_at }}; }
{% for x in p.extra_at %}RF_INLINE long long rf_x{{ x[0] }}_at(long long bz, long long m, long long n) { return {{ x[1] }}; }
{% endfor %}// The matrix descriptor of the K-major swizzled operand starting at shared address a.
RF_INLINE unsigned long long rf_wg_desc(unsigned a) { return {{ desc }}; }
// D += A·B for one K step of 16: A (64 rows) and B ({{ bn }} rows of K) from their descriptors.
RF_INLINE void rf_wgmma(float (&d)[{{ acc_n }}], unsigned long long da, unsigned long long db) {
    // scale-d is a predicate (true: accumulate into d); A and B unscaled, both K-major.
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %{{ acc_n + 2 }}, 0;\n{{ instruction }} {"
        "{% for i in range(acc_n) %}%{{ i }}{% if not loop.last %}, {% endif %}{% endfor %}}, %{{ acc_n }}, %{{ acc_n + 1 }}, p, 1, 1, 0, 0;\n}\n"
        : {% for i in range(acc_n) %}"+f"(d[{{ i }}]){% if not loop.last %}, {% endif %}{% endfor %}
        : "l"(da), "l"(db), "r"(1));
}
RF_INLINE void rf_mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
// Returns once the phase of parity `parity` has completed (a fresh barrier counts the phase
// before its first, parity 1, as complete).
RF_INLINE void rf_mbar_wait(unsigned bar, unsigned parity) {
    asm volatile("{\n.reg .pred done;\nRF_WAIT:\nmbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n@!done bra RF_WAIT;\n}\n"
                 :: "r"(bar), "r"(parity) : "memory");
}
RF_INLINE void rf_mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}
RF_INLINE void rf_mbar_expect(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}
{%- macro tma(rank, dst, map, c0, c1, c2) %}
{%- if rank == 2 %}
        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, { %2, %3 }], [%4];"
                     :: "r"({{ dst }}), "l"((unsigned long long){{ map }}), "r"({{ c0 }}), "r"({{ c1 }}), "r"(full) : "memory");
{%- else %}
        asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, { %2, %3, %4 }], [%5];"
                     :: "r"({{ dst }}), "l"((unsigned long long){{ map }}), "r"({{ c0 }}), "r"({{ c1 }}), "r"({{ c2 }}), "r"(full) : "memory");
{%- endif %}
{%- endmacro %}
{#- The stored value of accumulator e + h, at column col0 + h, into `to`. -#}
{%- macro value(h, to) %}{
                    const int col = col0 + {{ h }};
                    const float acc_v = acc[e + {{ h }}];
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
// A and B are read only through their tensor maps (map_a, map_b); they are parameters so that
// the plan sees this kernel read them.
extern "C" __global__ void __launch_bounds__({{ threads }}, 1) {{ entry }}(const {{ p.a_t }}* __restrict__ A, const {{ p.b_t }}* __restrict__ B, {% for e in p.extras %}const {{ e.ctype }}* __restrict__ in{{ e.index }}, {% endfor %}{{ p.c_t }}* __restrict__ C, const int* __restrict__ map_a, const int* __restrict__ map_b) {
    RF_GRID_ENTER();
    // The ring starts at the first 1024-byte boundary of the dynamic shared memory (the launch
    // asks for 1024 bytes more): the 128-byte swizzle repeats every 1024 bytes of address.
    extern __shared__ __align__(16) unsigned char rf_smem_raw[];
    const unsigned raw = (unsigned)__cvta_generic_to_shared(rf_smem_raw);
    const unsigned base = (raw + 1023u) & ~1023u;
    // Barriers after the ring: full[s] at bars + 8 s, empty[s] at bars + 8 ({{ stages }} + s).
    const unsigned bars = base + {{ stages * stage_bytes }}u;
    const int wg = threadIdx.x / 128;
    if (threadIdx.x == 0) {
        asm volatile("prefetch.tensormap [%0];" :: "l"((unsigned long long)map_a) : "memory");
        asm volatile("prefetch.tensormap [%0];" :: "l"((unsigned long long)map_b) : "memory");
#pragma unroll
        for (int s = 0; s < {{ stages }}; ++s) {
            rf_mbar_init(bars + 8u * s, 1u);                              // the producer's arrival (+ bytes)
            rf_mbar_init(bars + 8u * ({{ stages }} + s), {{ consumers * 4 }}u); // one per consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (wg == 0) {
        // Producer: a few registers are enough to issue copies.
        asm volatile("setmaxnreg.dec.sync.aligned.u32 {{ producer_regs }};");
        if (threadIdx.x == 0) {
            unsigned it = 0;  // stage uses so far, across tiles
            for (int tile = blockIdx.x; tile < {{ tiles }}; tile += {{ grid }}) {
            const int m0 = (tile % {{ tiles_m }}) * {{ bm }}, n0 = ((tile / {{ tiles_m }}) % {{ tiles_n }}) * {{ bn }};
            const int bz = tile / {{ tiles_m * tiles_n }};
            for (int kt = 0; kt < {{ ktiles }}; ++kt, ++it) {
                const unsigned s = it % {{ stages }}, round = it / {{ stages }};
                // The stage is free once every consumer warp gave back its previous use.
                rf_mbar_wait(bars + 8u * ({{ stages }} + s), (round & 1u) ^ 1u);
                const unsigned full = bars + 8u * s;
                rf_mbar_expect(full, {{ stage_bytes }}u);
                const unsigned as = base + s * {{ stage_bytes }}u, bs = as + {{ a_bytes }}u;
                const int k0 = kt * {{ bk }};
                {{ tma(a_rank, "as", "map_a", "k0", "m0", "bz") }}
                {{ tma(b_rank, "bs", "map_b", "k0", "n0", "bz") }}
            }
            }
        }
    } else {
        // One branch per role, so that ptxas applies each role's register count (setmaxnreg).
        asm volatile("setmaxnreg.inc.sync.aligned.u32 {{ consumer_regs }};");
        const int c = wg - 1;  // this consumer's 64 rows of the tile
        const int lane = threadIdx.x % 128;
        unsigned it = 0;  // stage uses so far, across tiles (as the producer counts them)
        for (int tile = blockIdx.x; tile < {{ tiles }}; tile += {{ grid }}) {
        const int m0 = (tile % {{ tiles_m }}) * {{ bm }}, n0 = ((tile / {{ tiles_m }}) % {{ tiles_n }}) * {{ bn }};
        const int bz = tile / {{ tiles_m * tiles_n }};
        float acc[{{ acc_n }}];
#pragma unroll
        for (int e = 0; e < {{ acc_n }}; ++e) acc[e] = 0.0f;
        for (int kt = 0; kt < {{ ktiles }}; ++kt, ++it) {
            const unsigned s = it % {{ stages }};
            rf_mbar_wait(bars + 8u * s, (it / {{ stages }}) & 1u);
            const unsigned a_s = base + s * {{ stage_bytes }}u + (unsigned)c * {{ 64 * bk * 2 }}u;
            const unsigned b_s = base + s * {{ stage_bytes }}u + {{ a_bytes }}u;
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
            for (int kk = 0; kk < {{ bk // 16 }}; ++kk)
                rf_wgmma(acc, rf_wg_desc(a_s + kk * 32), rf_wg_desc(b_s + kk * 32));
            asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
            // This use's wgmma stays in flight; the previous one has completed: its stage goes back.
            asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
            if (kt > 0 && lane % 32 == 0) rf_mbar_arrive(bars + 8u * ({{ stages }} + (it - 1) % {{ stages }}));
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        // The tile's last stage goes back too: the producer fills it for a later tile meanwhile.
        if (lane % 32 == 0) rf_mbar_arrive(bars + 8u * ({{ stages }} + (it - 1) % {{ stages }}));
        // The epilogue, on each accumulator where the atom's C layout puts it{% if c_pairs %}: elements 2h and 2h + 1
        // are adjacent columns and the out view holds pairs aligned, so each pair is one store{% endif %}.
#pragma unroll
        for (int e = 0; e < {{ acc_n }}; e += {{ 2 if c_pairs else 1 }}) {
            const int row = m0 + c * 64 + {{ c_row }};
            const int col0 = n0 + {{ c_col }};
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
