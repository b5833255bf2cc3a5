// Flash-decoding, kernel 1 of 2 (split K): q [{{ b }}, {{ hq }}, {{ sq }}, {{ d }}], k/v [{{ b }}, {{ hkv }}, {{ sk }}, {{ d }}/{{ dv }}], scale {{ scale }}{% if causal %}, causal (k <= q + {{ offset_text }}, the offset clamped to [-Sq, Sk]){% endif %}{% if mask %}, {{ mask }} mask{% endif %}.
// A block serves all {{ rows }} query rows ({{ group }} heads x {{ sq }}) of one K/V head, so K/V are read once per group,
// over split blockIdx.y of the {{ valid_keys }} keys any row can see ({{ splits }} splits of {{ keys_per_split }}); it never
// reads past them. K/V tiles of {{ block_n }} keys are staged in shared memory as f32{% if vec > 1 %} by 16-byte loads{% endif %}; the
// softmax is online in f32 and base 2 (scale * log2(e) folded into Q), one wave per row for the max and sum.
// Per (row, split) it writes the unnormalised output (Dv floats), then m and l, into the workspace; a split that
// sees no key of a row writes m = -inf, l = 0 and zeros, which the combine weighs by exp2(-inf) = 0.
// At least one block per SM (the second bound): without it ptxas trades a few spills for the next occupancy step.
extern "C" __global__ void __launch_bounds__({{ threads }}, 1) {{ entry }}(const {{ ctype }}* __restrict__ q, const {{ ctype }}* __restrict__ k, const {{ ctype }}* __restrict__ v, {% if mask %}const {{ mask_ctype }}* __restrict__ mask, {% endif %}float* __restrict__ ws) {
    __shared__ float Qs[{{ rows }}][{{ d }}];
    __shared__ float Ks[{{ block_n }}][{{ d }} + 1];
    __shared__ float Vs[{{ block_n }}][{{ dv }}];
    __shared__ float S[{{ rows }}][{{ block_n }}];
    __shared__ float row_m[{{ rows }}], row_l[{{ rows }}], row_corr[{{ rows }}];
    const int tid = threadIdx.x;
    const int bkv = blockIdx.x, split = blockIdx.y;
    const int bi = bkv / {{ hkv }}, kvh = bkv % {{ hkv }};
    // Row r of the block is query head kvh * {{ group }} + r / {{ sq }}, position r % {{ sq }}: in q's and out's
    // order the group's rows are consecutive from row0.
    const long long row0 = ((long long)bi * {{ hq }} + (long long)kvh * {{ group }}) * {{ sq }};
    const long long kv_row0 = (long long)bkv * {{ sk }};
    const int key_begin = (int)((long long)split * {{ keys_per_split }});
    const long long split_end = (long long)key_begin + {{ keys_per_split }};
    const int key_end = (int)(split_end < {{ valid_keys }}LL ? split_end : {{ valid_keys }}LL);
    for (int t = tid; t < {{ rows * d }}; t += {{ threads }}) {
        const int r = t / {{ d }}, c = t % {{ d }};
        Qs[r][c] = {{ load_pre }}q[(row0 + r) * {{ d }} + c]{{ load_post }} * {{ qscale }};
    }
    if (tid < {{ rows }}) {
        row_m[tid] = -INFINITY;
        row_l[tid] = 0.0f;
    }
    float acc[{{ per_thread }}];
    for (int i = 0; i < {{ per_thread }}; ++i) acc[i] = 0.0f;
    const int wave = tid / RF_WAVE, lane = tid % RF_WAVE;
    for (int j0 = key_begin; j0 < key_end; j0 += {{ block_n }}) {
        const int n = key_end - j0 < {{ block_n }} ? key_end - j0 : {{ block_n }};
        __syncthreads();  // the previous tile's K, V and scores are consumed; Q and the stats are set
        // The tile's n keys are contiguous in K and in V: n x D elements from the tile's first key.
        const {{ ctype }}* kt = k + (kv_row0 + j0) * {{ d }};
        const {{ ctype }}* vt = v + (kv_row0 + j0) * {{ dv }};
{% if vec > 1 %}        // 16-byte loads: every row starts at a multiple of {{ vec }} elements.
        struct alignas(16) Vec16 { unsigned int w[4]; };
        for (int t = tid; t < n * {{ d // vec }}; t += {{ threads }}) {
            const int r = t / {{ d // vec }}, c = t % {{ d // vec }} * {{ vec }};
            const Vec16 raw = reinterpret_cast<const Vec16*>(kt)[t];
            const {{ ctype }}* e = reinterpret_cast<const {{ ctype }}*>(&raw);
            for (int u = 0; u < {{ vec }}; ++u) Ks[r][c + u] = {{ load_pre }}e[u]{{ load_post }};
        }
        for (int t = tid; t < n * {{ dv // vec }}; t += {{ threads }}) {
            const int r = t / {{ dv // vec }}, c = t % {{ dv // vec }} * {{ vec }};
            const Vec16 raw = reinterpret_cast<const Vec16*>(vt)[t];
            const {{ ctype }}* e = reinterpret_cast<const {{ ctype }}*>(&raw);
            for (int u = 0; u < {{ vec }}; ++u) Vs[r][c + u] = {{ load_pre }}e[u]{{ load_post }};
        }
{% else %}        for (int t = tid; t < n * {{ d }}; t += {{ threads }}) Ks[t / {{ d }}][t % {{ d }}] = {{ load_pre }}kt[t]{{ load_post }};
        for (int t = tid; t < n * {{ dv }}; t += {{ threads }}) Vs[t / {{ dv }}][t % {{ dv }}] = {{ load_pre }}vt[t]{{ load_post }};
{% endif %}        __syncthreads();
        // Scores, base 2; keys past the tile's valid ones, masked or after the row's causal end are -inf.
        for (int t = tid; t < {{ rows * block_n }}; t += {{ threads }}) {
            const int r = t / {{ block_n }}, jj = t % {{ block_n }};
            float x = -INFINITY;
            if (jj < n) {
                const int j = j0 + jj;
                const int h = kvh * {{ group }} + r / {{ sq }}, qi = r % {{ sq }};
                float dot = 0.0f;
                for (int c = 0; c < {{ d }}; ++c) dot += Qs[r][c] * Ks[jj][c];
                x = dot;
{% if mask == "additive" %}                x = x + {{ mask_load_pre }}mask[(long long)bi * {{ ms[0] }} + (long long)h * {{ ms[1] }} + (long long)qi * {{ ms[2] }} + (long long)j * {{ ms[3] }}]{{ mask_load_post }} * {{ log2e }};
{% elif mask == "boolean" %}                if (!mask[(long long)bi * {{ ms[0] }} + (long long)h * {{ ms[1] }} + (long long)qi * {{ ms[2] }} + (long long)j * {{ ms[3] }}]) x = -INFINITY;
{% else %}                (void)h;
{% endif %}{% if causal %}                if ((long long)j > (long long)qi + {{ offset }}) x = -INFINITY;
{% else %}                (void)qi;
{% endif %}            }
            S[r][jj] = x;
        }
        __syncthreads();
        // Online softmax, one wave per row. Every wave runs the same number of rounds (a wave past the last
        // row computes nothing it keeps), so the shuffles never diverge.
        for (int r0 = 0; r0 < {{ rows }}; r0 += {{ threads }} / RF_WAVE) {
            const bool live = r0 + wave < {{ rows }};
            const int r = live ? r0 + wave : {{ rows - 1 }};
            const float m_old = row_m[r];
            float mx = -INFINITY;
            for (int jj = lane; jj < {{ block_n }}; jj += RF_WAVE) mx = fmaxf(mx, S[r][jj]);
            for (int s = RF_WAVE / 2; s > 0; s >>= 1) mx = fmaxf(mx, rf_shfl_xor(mx, s));
            const float m_new = fmaxf(m_old, mx);
            // No visible key yet: every p is exp2(-inf) = 0 and the accumulators stay 0.
            const float base = m_new == -INFINITY ? 0.0f : m_new;
            float sum = 0.0f;
            for (int jj = lane; jj < {{ block_n }}; jj += RF_WAVE) {
                const float p = exp2f(S[r][jj] - base);
                if (live) S[r][jj] = p;
                sum += p;
            }
            for (int s = RF_WAVE / 2; s > 0; s >>= 1) sum += rf_shfl_xor(sum, s);
            if (live && lane == 0) {
                const float corr = exp2f(m_old - base);
                row_corr[r] = corr;
                row_l[r] = row_l[r] * corr + sum;
                row_m[r] = m_new;
            }
        }
        __syncthreads();
        for (int i = 0; i < {{ per_thread }}; ++i) {
            const int t = tid + i * {{ threads }};
            if (t < {{ rows * dv }}) {
                const int r = t / {{ dv }}, c = t % {{ dv }};
                float a = acc[i] * row_corr[r];
                for (int jj = 0; jj < n; ++jj) a += S[r][jj] * Vs[jj][c];
                acc[i] = a;
            }
        }
    }
    __syncthreads();  // the stats of the last tile are set
    for (int i = 0; i < {{ per_thread }}; ++i) {
        const int t = tid + i * {{ threads }};
        if (t < {{ rows * dv }}) {
            const int r = t / {{ dv }}, c = t % {{ dv }};
            ws[((row0 + r) * {{ splits }} + split) * {{ dv }} + c] = acc[i];
        }
    }
    if (tid < {{ rows }}) {
        const long long at = {{ stats_at }}LL + ((row0 + tid) * {{ splits }} + split) * 2;
        ws[at] = row_m[tid];
        ws[at + 1] = row_l[tid];
    }
}
