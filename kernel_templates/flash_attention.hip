// FlashAttention: q [{{ b }}, {{ hq }}, {{ sq }}, {{ d }}], k/v [{{ b }}, {{ hkv }}, {{ sk }}, {{ d }}/{{ dv }}], scale {{ scale }}{% if causal %}, causal (k <= q + {{ offset_text }}, the offset clamped to [-Sq, Sk]){% endif %}{% if mask %}, {{ mask }} mask{% endif %}.
// A block takes {{ block_m }} query rows of one (batch, head); {{ tpr }} threads share a row, each holding
// {{ dper }} of its D columns. Key/value tiles of {{ block_n }} rows are staged in shared memory, and the
// softmax is computed online in f32: a running max and sum per row, the accumulator rescaled when the
// max grows. Masked keys get -inf and contribute nothing; a row with no visible key writes zeros.
// Every lane runs the same loop, so the shuffles that sum a row's dot product never diverge.
extern "C" __global__ void __launch_bounds__({{ threads }}) {{ entry }}(const {{ ctype }}* __restrict__ q, const {{ ctype }}* __restrict__ k, const {{ ctype }}* __restrict__ v, {% if mask %}const {{ mask_ctype }}* __restrict__ mask, {% endif %}{% if kv_len %}const int* __restrict__ kv_len, {% endif %}{{ ctype }}* __restrict__ out) {
    RF_GRID_ENTER();
    __shared__ float Ks[{{ block_n }}][{{ d }} + 1];
    __shared__ float Vs[{{ block_n }}][{{ dv }} + 1];
    const int bh = blockIdx.x;
    const int bi = bh / {{ hq }}, h = bh % {{ hq }}, kvh = h / {{ group }};
{% if kv_len %}    // Keys from kv_len on hold no value (an unwritten cache tail): never read; the queries are the last Sq of the
    // kv_len positions, so the causal offset is kv_len - Sq.
    const int kv_given = kv_len[{% if kv_len == "batch" %}bi{% else %}0{% endif %}];
    const int kvn = kv_given < 0 ? 0 : (kv_given > {{ sk }} ? {{ sk }} : kv_given);  // clamped: never past the cache
    const long long kv_off = (long long)kvn - {{ sq }};
    (void)kv_off;
{% endif %}    const int lane = threadIdx.x % {{ tpr }};
    const int i = blockIdx.y * {{ block_m }} + threadIdx.x / {{ tpr }};
    const bool active = i < {{ sq }};
    const int qi = active ? i : 0;
    const long long q_base = ((long long)bh * {{ sq }} + qi) * {{ d }};
    const long long k_base = ((long long)bi * {{ hkv }} + kvh) * {{ sk }} * {{ d }};
    const long long v_base = ((long long)bi * {{ hkv }} + kvh) * {{ sk }} * {{ dv }};
    float qr[{{ dper }}], acc[{{ dvper }}];
    for (int t = 0; t < {{ dper }}; ++t) {
        const int c = lane + t * {{ tpr }};
        qr[t] = c < {{ d }} ? {{ load_pre }}q[q_base + c]{{ load_post }} : 0.0f;
    }
    for (int t = 0; t < {{ dvper }}; ++t) acc[t] = 0.0f;
    float m = -INFINITY, l = 0.0f;
{% if causal %}    // Keys after the last visible key of this block's last row are never needed.
    const long long last_row = min((long long)blockIdx.y * {{ block_m }} + {{ block_m - 1 }}, {{ sq - 1 }}LL);
    const long long end_ll = last_row + {{ offset }} + 1;
    const int key_end = end_ll < 0 ? 0 : (end_ll > {{ keys }} ? {{ keys }} : (int)end_ll);
{% else %}    const int key_end = {{ keys }};
{% endif %}{% if window %}    // Sliding window of {{ window }}: keys at or before this block's first row + offset - {{ window }} are out of every
    // row's window, so the tiles wholly before it are never loaded; tiles holding that boundary check keys one by one.
    const long long win_ll = (long long)blockIdx.y * {{ block_m }} + {{ offset }} - {{ window }}LL + 1;
    const int key_begin = win_ll >= key_end ? key_end : (win_ll <= 0 ? 0 : (int)(win_ll / {{ block_n }} * {{ block_n }}));
{% endif %}    for (int j0 = {% if window %}key_begin{% else %}0{% endif %}; j0 < key_end; j0 += {{ block_n }}) {
        __syncthreads();
{% if d > 0 %}        for (int t = threadIdx.x; t < {{ block_n * d }}; t += {{ threads }}) {
            const int r = t / {{ d }}, c = t % {{ d }};
            Ks[r][c] = j0 + r < {{ keys }} ? {{ load_pre }}k[k_base + (long long)(j0 + r) * {{ d }} + c]{{ load_post }} : 0.0f;
        }
{% endif %}        for (int t = threadIdx.x; t < {{ block_n * dv }}; t += {{ threads }}) {
            const int r = t / {{ dv }}, c = t % {{ dv }};
            Vs[r][c] = j0 + r < {{ keys }} ? {{ load_pre }}v[v_base + (long long)(j0 + r) * {{ dv }} + c]{{ load_post }} : 0.0f;
        }
        __syncthreads();
        const int n = min({{ block_n }}, key_end - j0);
        for (int jj = 0; jj < n; ++jj) {
            const int j = j0 + jj;
            float part = 0.0f;
            for (int t = 0; t < {{ dper }}; ++t) {
                const int c = lane + t * {{ tpr }};
                if (c < {{ d }}) part += qr[t] * Ks[jj][c];
            }
            for (int s = {{ tpr }} / 2; s > 0; s >>= 1) part += rf_shfl_xor(part, s);
            float x = part * {{ scale_f }};
{% if mask == "additive" %}            x = x + {{ mask_load_pre }}mask[(long long)bi * {{ ms[0] }} + (long long)h * {{ ms[1] }} + (long long)qi * {{ ms[2] }} + (long long)j * {{ ms[3] }}]{{ mask_load_post }};
{% elif mask == "boolean" %}            if (!mask[(long long)bi * {{ ms[0] }} + (long long)h * {{ ms[1] }} + (long long)qi * {{ ms[2] }} + (long long)j * {{ ms[3] }}]) x = -INFINITY;
{% endif %}{% if causal %}            if ((long long)j > (long long)i + {{ offset }}) x = -INFINITY;
{% endif %}{% if window %}            if ((long long)j <= (long long)i + {{ offset }} - {{ window }}LL) x = -INFINITY;
{% endif %}            const float m_new = fmaxf(m, x);
            if (m_new != -INFINITY) {
                const float corr = expf(m - m_new), p = expf(x - m_new);
                l = l * corr + p;
                for (int t = 0; t < {{ dvper }}; ++t) {
                    const int c = lane + t * {{ tpr }};
                    acc[t] = acc[t] * corr + p * (c < {{ dv }} ? Vs[jj][c] : 0.0f);
                }
                m = m_new;
            }
        }
    }
    if (active) {
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        const long long o_base = ((long long)bh * {{ sq }} + i) * {{ dv }};
        for (int t = 0; t < {{ dvper }}; ++t) {
            const int c = lane + t * {{ tpr }};
            if (c < {{ dv }}) out[o_base + c] = {{ store_pre }}(acc[t] * inv){{ store_post }};
        }
    }
}
