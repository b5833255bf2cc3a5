{% set S = stages %}{% set ahead = S - 2 if overlap else S - 1 %}{% set s_n = block_n // 2 %}{% set o_n = dv // 2 %}{% set kq = d // 16 %}{% set kv_steps = block_n // 16 %}{#- The scores of the tile at j0 held by this thread: masks, bounds and the row maxima. `edge`: the tile needs key checks. -#}
{%- macro scores(edge) %}
#pragma unroll
            for (int e = 0; e < {{ s_n }}; ++e) {
                const int slot = {{ c_slot }};
{%- if edge and causal %}
                const int qi = row0 + {{ c_row }};
{%- endif %}
{%- if edge or mask %}
                const int kj = j0 + {{ c_col }};
{%- endif %}
                float x = s[e]{% if not fold %} * {{ scale_log2 }}{% endif %};
{%- if mask == "additive" %}
                {% if edge %}if (kj < {{ keys }}) {% endif %}x += LOG2E * {{ mask_load_pre }}mask[mrow[slot] + (long long)kj * {{ ms[3] }}]{{ mask_load_post }};
{%- elif mask == "boolean" %}
                if ({% if edge %}kj < {{ keys }} && {% endif %}!mask[mrow[slot] + (long long)kj * {{ ms[3] }}]) x = -INFINITY;
{%- endif %}
{%- if edge %}
{%- if causal %}
                if ((long long)kj > (long long)qi + {{ offset }}) x = -INFINITY;
{%- if window %}
                if ((long long)kj <= (long long)qi + {{ offset }} - {{ window }}LL) x = -INFINITY;
{%- endif %}
{%- endif %}
                if (kj >= {{ keys }}) x = -INFINITY;
{%- endif %}
                s[e] = x;
                mx[slot] = fmaxf(mx[slot], x);
            }
{%- endmacro -%}
// FlashAttention on Hopper's warpgroup MMA ({{ dtype }}, {{ atom_name }}, f32 accumulation, sm_90a): q [{{ b }}, {{ hq }}, {{ sq }}, {{ d }}],
// k/v [{{ b }}, {{ hkv }}, {{ sk }}, {{ d }}/{{ dv }}], scale {{ scale }}{% if causal %}, causal (k <= q + {{ offset_text }}, the offset clamped to [-Sq, Sk]){% endif %}{% if mask %}, {{ mask }} mask{% endif %}.
// A block takes {{ block_m }} query rows of one (batch, head): {{ warpgroups }} warpgroups of 64 rows. Q ({{ block_m }} rows) and
// each K and V tile ({{ block_n }} keys) sit in dynamic shared memory in the 128-byte-swizzled layout the descriptors name
// (64-column panels of 128-byte lines); K and V tiles arrive by 16-byte cp.async into a ring of {{ S }}, one commit group a tile,
// loaded by every thread {{ ahead }} tile{% if ahead > 1 %}s{% endif %} ahead of use. Per tile a warpgroup computes S = Q·Kᵀ by {{ kq }} wgmma steps
// ({{ instruction_s }}, A and B from shared memory), the online softmax in registers (log2 domain{% if fold %}, the scale
// folded into the exponent's FMA{% endif %}), and O += P·V by {{ kv_steps }} steps ({{ instruction_o }}): P's accumulators, converted in
// place, are the A registers (16 columns of S are one A operand), V is B read N-major through its transposed descriptor.
// Only boundary tiles (past Sk{% if causal %}, or crossing the causal diagonal of the warpgroup's rows{% endif %}) check keys{% if causal %}; tiles wholly
// above the block's diagonal are never loaded{% endif %}. Masked keys contribute nothing; a row with no visible key writes zeros.
// Accumulator places come from the atom's C layout (arch::mma::wgmma).
RF_INLINE unsigned long long rf_wg_desc(unsigned a) { return {{ desc_k }}; }
RF_INLINE unsigned long long rf_wg_desc_v(unsigned a) { return {{ desc_v }}; }
// S (+)= Q·Kᵀ for one 16-wide step of the head: A (64 query rows) and B ({{ block_n }} keys) from descriptors;
// the first step overwrites (scale-d false).
RF_INLINE void rf_wgmma_s(float (&d)[{{ s_n }}], unsigned long long da, unsigned long long db, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %{{ s_n + 2 }}, 0;\n{{ instruction_s }} {"
        "{% for i in range(s_n) %}%{{ i }}{% if not loop.last %}, {% endif %}{% endfor %}}, %{{ s_n }}, %{{ s_n + 1 }}, p, 1, 1, 0, 0;\n}\n"
        : {% for i in range(s_n) %}"+f"(d[{{ i }}]){% if not loop.last %}, {% endif %}{% endfor %}
        : "l"(da), "l"(db), "r"(accumulate));
}
// O += P·V for one 16-key step: A (P) from four registers, B (V) N-major from its descriptor (transpose-b 1).
RF_INLINE void rf_wgmma_o(float (&d)[{{ o_n }}], const unsigned (&a)[4], unsigned long long db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %{{ o_n + 5 }}, 0;\n{{ instruction_o }} {"
        "{% for i in range(o_n) %}%{{ i }}{% if not loop.last %}, {% endif %}{% endfor %}}, { %{{ o_n }}, %{{ o_n + 1 }}, %{{ o_n + 2 }}, %{{ o_n + 3 }} }, %{{ o_n + 4 }}, p, 1, 1, 1;\n}\n"
        : {% for i in range(o_n) %}"+f"(d[{{ i }}]){% if not loop.last %}, {% endif %}{% endfor %}
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
// Ties registers a wgmma writes (or reads, in flight) to this point of the program: reads after a wait
// cannot be moved above it, and the registers stay live until it (CUTLASS's warpgroup_fence_operand).
RF_INLINE void rf_fence(float& x) { asm volatile("" : "+f"(x) :: "memory"); }
RF_INLINE void rf_fence(unsigned& x) { asm volatile("" : "+r"(x) :: "memory"); }
extern "C" __global__ void __launch_bounds__({{ threads }}, 1) {{ entry }}(const {{ ctype }}* __restrict__ q, const {{ ctype }}* __restrict__ k, const {{ ctype }}* __restrict__ v, {% if mask %}const {{ mask_ctype }}* __restrict__ mask, {% endif %}{% if kv_len %}const int* __restrict__ kv_len, {% endif %}{{ ctype }}* __restrict__ out) {
    RF_GRID_ENTER();
    // Q, then the ring, from the first 1024-byte boundary of the dynamic shared memory (the launch asks for 1024
    // bytes more): the hardware swizzles by address bits, the stores by offset.
    extern __shared__ __align__(16) unsigned char rf_smem_raw[];
    const unsigned raw = (unsigned)__cvta_generic_to_shared(rf_smem_raw);
    const unsigned base = (raw + 1023u) & ~1023u;
    unsigned char* smem = rf_smem_raw + (base - raw);
{%- if mask == "additive" %}
    const float LOG2E = 1.4426950408889634f;
{%- endif %}
    const int bh = blockIdx.x;
    const int bi = bh / {{ hq }}, h = bh % {{ hq }}, kvh = h / {{ group }};
{% if kv_len %}    // Keys from kv_len on hold no value (an unwritten cache tail): never read; the queries are the last Sq of the
    // kv_len positions, so the causal offset is kv_len - Sq.
    const int kv_given = kv_len[{% if kv_len == "batch" %}bi{% else %}0{% endif %}];
    const int kvn = kv_given < 0 ? 0 : (kv_given > {{ sk }} ? {{ sk }} : kv_given);  // clamped: never past the cache
    const long long kv_off = (long long)kvn - {{ sq }};
    (void)kv_off;
{% endif %}    const int wg = threadIdx.x / 128, lane = threadIdx.x % 128;
    const int q0 = blockIdx.y * {{ block_m }};
    // This warpgroup's first query row; the thread's rows are row0 + the C layout's row of its elements.
    const int row0 = q0 + wg * 64;
    const long long q_base = (long long)bh * {{ sq }} * {{ d }};
    const long long k_base = ((long long)bi * {{ hkv }} + kvh) * {{ sk }} * {{ d }};
    const long long v_base = ((long long)bi * {{ hkv }} + kvh) * {{ sk }} * {{ dv }};
{% if causal %}    // Keys after the last visible key of this block's last row are never loaded.
    const long long last_row = min((long long)q0 + {{ block_m - 1 }}, {{ sq - 1 }}LL);
    const long long end_ll = last_row + {{ offset }} + 1;
    const int key_end = end_ll < 0 ? 0 : (end_ll > {{ keys }} ? {{ keys }} : (int)end_ll);
{% else %}    const int key_end = {{ keys }};
{% endif %}{% if window %}    // Sliding window of {{ window }}: keys at or before this block's first row + offset - {{ window }} are out of every
    // row's window, so the tiles wholly before it are never loaded; tiles holding that boundary check keys one by one.
    const long long win_ll = (long long)q0 + {{ offset }} - {{ window }}LL + 1;
    const int key_begin = win_ll >= key_end ? key_end : (win_ll <= 0 ? 0 : (int)(win_ll / {{ block_n }} * {{ block_n }}));
{% endif %}    const int ntiles = (key_end{% if window %} - key_begin{% endif %} + {{ block_n - 1 }}) / {{ block_n }};
    // Q's rows (zeros past Sq) join the first tile's commit group.
#pragma unroll
    for (int x = threadIdx.x; x < {{ block_m * d // 8 }}; x += {{ threads }}) {
        const int r = x / {{ d // 8 }}, c = (x % {{ d // 8 }}) * 8;
        const bool ok = q0 + r < {{ sq }};
        rf_cp_async16(smem + (c / 64) * {{ q_panel }} + {{ smem_at }}, q + q_base + (long long)(ok ? q0 + r : 0) * {{ d }} + c, ok);
    }
    // Tile t of K and V into stage t % {{ S }}, one commit group (empty past the last tile, so that the count of groups
    // in flight stays fixed).
    auto issue = [&](int t) {
        if (t < ntiles) {
            unsigned char* ks = smem + {{ q_bytes }} + (t % {{ S }}) * {{ stage_bytes }};
            unsigned char* vs = ks + {{ k_bytes }};
            const int j0 = {% if window %}key_begin + {% endif %}t * {{ block_n }};
#pragma unroll
            for (int x = threadIdx.x; x < {{ block_n * d // 8 }}; x += {{ threads }}) {
                const int r = x / {{ d // 8 }}, c = (x % {{ d // 8 }}) * 8;
                const bool ok = j0 + r < {{ keys }};
                rf_cp_async16(ks + (c / 64) * {{ kv_panel }} + {{ smem_at }}, k + k_base + (long long)(ok ? j0 + r : 0) * {{ d }} + c, ok);
            }
#pragma unroll
            for (int x = threadIdx.x; x < {{ block_n * dv // 8 }}; x += {{ threads }}) {
                const int r = x / {{ dv // 8 }}, c = (x % {{ dv // 8 }}) * 8;
                const bool ok = j0 + r < {{ keys }};
                rf_cp_async16(vs + (c / 64) * {{ kv_panel }} + {{ smem_at }}, v + v_base + (long long)(ok ? j0 + r : 0) * {{ dv }} + c, ok);
            }
        }
        rf_cp_async_commit();
    };
#pragma unroll
    for (int t = 0; t < {{ ahead }}; ++t) issue(t);
{%- if mask %}
    // The mask's offset of each of this thread's rows (clamped into range: rows past Sq are never stored).
    long long mrow[2];
#pragma unroll
    for (int e = 0; e < 4; ++e)
        mrow[{{ c_slot }}] = (long long)bi * {{ ms[0] }} + (long long)h * {{ ms[1] }} + (long long)min(row0 + {{ c_row }}, {{ sq - 1 }}) * {{ ms[2] }};
{%- endif %}
    float o[{{ o_n }}];
#pragma unroll
    for (int e = 0; e < {{ o_n }}; ++e) o[e] = 0.0f;
    // Row statistics in the log2 domain: running max m and this thread's part of the sum l, per row slot.
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
{%- if overlap %}
    // P of the previous tile, whose P·V is issued with this tile's QKᵀ.
    unsigned pa_prev[{{ kv_steps }}][4];
{%- endif %}
    for (int t = 0; t < ntiles; ++t) {
        const int j0 = {% if window %}key_begin + {% endif %}t * {{ block_n }};
        rf_cp_async_wait<{{ ahead - 1 }}>();  // tile t (and Q) have landed
        __syncthreads();  // ... for every thread; and every warpgroup is done with the stage the next load takes
        issue(t + {{ ahead }});  // into the stage of tile t - {{ S - ahead }}
        const unsigned ks = base + {{ q_bytes }}u + (unsigned)(t % {{ S }}) * {{ stage_bytes }}u;
        const unsigned vs = ks + {{ k_bytes }}u;
        float s[{{ s_n }}];
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < {{ kq }}; ++kk)
            rf_wgmma_s(s, rf_wg_desc(base + (kk / 4) * {{ q_panel }}u + (unsigned)wg * {{ 64 * 128 }}u + (kk % 4) * 32u),
                       rf_wg_desc(ks + (kk / 4) * {{ kv_panel }}u + (kk % 4) * 32u), kk > 0);
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
{%- if overlap %}
        // P·V of the previous tile, in flight with this tile's QKᵀ and softmax (an empty group at t = 0).
        if (t > 0) {
            const unsigned vs_prev = base + {{ q_bytes }}u + (unsigned)((t - 1) % {{ S }}) * {{ stage_bytes }}u + {{ k_bytes }}u;
#pragma unroll
            for (int kk = 0; kk < {{ kv_steps }}; ++kk) rf_wgmma_o(o, pa_prev[kk], rf_wg_desc_v(vs_prev + kk * {{ 16 * 128 }}u));
        }
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");  // S(t) done; P·V(t - 1) may run on
{%- else %}
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
{%- endif %}
#pragma unroll
        for (int e = 0; e < {{ s_n }}; ++e) rf_fence(s[e]);
        float mx[2] = {-INFINITY, -INFINITY};
        // Key checks only where the tile reaches past Sk{% if causal %} or crosses the diagonal of this warpgroup's first row{% endif %}.
        const bool edge = j0 + {{ block_n }} > {{ keys }}{% if causal %} || (long long)j0 + {{ block_n - 1 }} > (long long)row0 + {{ offset }}{% endif %}{% if window %} || (long long)j0 <= (long long)row0 + 63 + {{ offset }} - {{ window }}LL{% endif %};
        if (edge) {
{{- scores(true) }}
        } else {
{{- scores(false) }}
        }
        float base_r[2], corr[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            // The row's maximum over the lanes that hold its other columns.
{%- for mask_bits in row_lanes %}
            mx[r] = fmaxf(mx[r], rf_shfl_xor(mx[r], {{ mask_bits }}));
{%- endfor %}
            const float m_new = fmaxf(m[r], mx[r]{% if fold %} * {{ scale_log2 }}{% endif %});
            // With every key so far masked the row keeps max -inf: subtract 0 instead.
            base_r[r] = m_new == -INFINITY ? 0.0f : m_new;
            corr[r] = exp2f(m[r] - base_r[r]);
            m[r] = m_new;
            l[r] *= corr[r];
        }
        // P in the A registers of the 16-key steps: elements 8 j .. 8 j + 7 of S are step j's A, in order.
        unsigned pa[{{ kv_steps }}][4];
#pragma unroll
        for (int e = 0; e < {{ s_n }}; e += 2) {
            const int slot = {{ c_slot }};
            const float p0 = exp2f({% if fold %}fmaf(s[e], {{ scale_log2 }}, -base_r[slot]){% else %}s[e] - base_r[slot]{% endif %});
            const float p1 = exp2f({% if fold %}fmaf(s[e + 1], {{ scale_log2 }}, -base_r[slot]){% else %}s[e + 1] - base_r[slot]{% endif %});
            l[slot] += p0 + p1;
            pa[e / 8][(e % 8) / 2] = {{ pack }}(p0, p1);
        }
{%- if overlap %}
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");  // P·V(t - 1) done: O may be rescaled
#pragma unroll
        for (int kk = 0; kk < {{ kv_steps }}; ++kk)
#pragma unroll
            for (int j = 0; j < 4; ++j) rf_fence(pa_prev[kk][j]);
#pragma unroll
        for (int e = 0; e < {{ o_n }}; ++e) {
            rf_fence(o[e]);
            o[e] *= corr[{{ c_slot }}];
        }
#pragma unroll
        for (int kk = 0; kk < {{ kv_steps }}; ++kk)
#pragma unroll
            for (int j = 0; j < 4; ++j) pa_prev[kk][j] = pa[kk][j];
    }
    if (ntiles > 0) {
        // The last tile's P·V.
        const unsigned vs_last = base + {{ q_bytes }}u + (unsigned)((ntiles - 1) % {{ S }}) * {{ stage_bytes }}u + {{ k_bytes }}u;
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < {{ kv_steps }}; ++kk) rf_wgmma_o(o, pa_prev[kk], rf_wg_desc_v(vs_last + kk * {{ 16 * 128 }}u));
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
        for (int e = 0; e < {{ o_n }}; ++e) rf_fence(o[e]);
    }
{%- else %}
#pragma unroll
        for (int e = 0; e < {{ o_n }}; ++e) o[e] *= corr[{{ c_slot }}];
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < {{ kv_steps }}; ++kk) rf_wgmma_o(o, pa[kk], rf_wg_desc_v(vs + kk * {{ 16 * 128 }}u));
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
        for (int e = 0; e < {{ o_n }}; ++e) rf_fence(o[e]);
#pragma unroll
        for (int kk = 0; kk < {{ kv_steps }}; ++kk)
#pragma unroll
            for (int j = 0; j < 4; ++j) rf_fence(pa[kk][j]);
    }
{%- endif %}
    rf_cp_async_wait<0>();  // no copy outlives the block (the tail's empty groups, Q where no tile ran)
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float sum = l[r];
{%- for mask_bits in row_lanes %}
        sum += rf_shfl_xor(sum, {{ mask_bits }});
{%- endfor %}
        inv[r] = sum > 0.0f ? 1.0f / sum : 0.0f;
    }
    // Elements 2h and 2h + 1 are adjacent columns of one row: one 32-bit store each pair.
#pragma unroll
    for (int e = 0; e < {{ o_n }}; e += 2) {
        const int row = row0 + {{ c_row }};
        if (row < {{ sq }}) {
            const int slot = {{ c_slot }};
            *(unsigned*)&out[((long long)bh * {{ sq }} + row) * {{ dv }} + {{ c_col_o }}] = {{ pack }}(o[e] * inv[slot], o[e + 1] * inv[slot]);
        }
    }
}
