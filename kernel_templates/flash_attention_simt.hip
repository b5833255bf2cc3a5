{% macro to_log2(e) %}{% if mask == "additive" %}({{ e }}) * LOG2E{% else %}({{ e }}){% endif %}{% endmacro -%}
{# The K (V) tile of the keys from j0: keys past Sk, columns past D (Dv) as zeros. -#}
{% macro load_k(j0) %}    {
        const int jt = {{ j0 }};
{% if async_copy %}        for (int u = tid; u < {{ bn * d4 // 4 }}; u += {{ threads }}) {
            const int r = u / {{ d4 // 4 }}, c = u % {{ d4 // 4 }} * 4;
            const bool ok = jt + r < {{ keys }};
            rf_cp_async16(&Ks[r][c], k + k_base + (long long)(ok ? jt + r : 0) * {{ d }} + c, ok);
        }
        rf_cp_async_commit();
{% elif vec_qk %}        for (int u = tid; u < {{ bn * d4 // 4 }}; u += {{ threads }}) {
            const int r = u / {{ d4 // 4 }}, c = u % {{ d4 // 4 }} * 4;
            F4* dst = (F4*)&Ks[r][c];
            if (jt + r < {{ keys }}) *dst = *(const F4*)(k + k_base + (long long)(jt + r) * {{ d }} + c);
            else *dst = F4{};
        }
{% else %}        for (int u = tid; u < {{ bn * d4 }}; u += {{ threads }}) {
            const int r = u / {{ d4 }}, c = u % {{ d4 }};
            Ks[r][c] = jt + r < {{ keys }} && c < {{ d }} ? k[k_base + (long long)(jt + r) * {{ d }} + c] : 0.0f;
        }
{% endif %}    }
{% endmacro %}{% macro load_v(j0) %}    {
        const int jt = {{ j0 }};
{% if async_copy %}        for (int u = tid; u < {{ bn * dv // 4 }}; u += {{ threads }}) {
            const int r = u / {{ dv // 4 }}, c = u % {{ dv // 4 }} * 4;
            const bool ok = jt + r < {{ keys }};
            rf_cp_async16(&Vs[r][c], v + v_base + (long long)(ok ? jt + r : 0) * {{ dv }} + c, ok);
        }
        rf_cp_async_commit();
{% elif vec_v %}        for (int u = tid; u < {{ bn * dv // 4 }}; u += {{ threads }}) {
            const int r = u / {{ dv // 4 }}, c = u % {{ dv // 4 }} * 4;
            F4* dst = (F4*)&Vs[r][c];
            if (jt + r < {{ keys }}) *dst = *(const F4*)(v + v_base + (long long)(jt + r) * {{ dv }} + c);
            else *dst = F4{};
        }
{% else %}        for (int u = tid; u < {{ bn * ((dv + 3) // 4 * 4) }}; u += {{ threads }}) {
            const int r = u / {{ (dv + 3) // 4 * 4 }}, c = u % {{ (dv + 3) // 4 * 4 }};
            Vs[r][c] = jt + r < {{ keys }} && c < {{ dv }} ? v[v_base + (long long)(jt + r) * {{ dv }} + c] : 0.0f;
        }
{% endif %}    }
{% endmacro -%}
// FlashAttention in f32 on CUDA cores (the FA2 loop, both products register-tiled): q [{{ b }}, {{ hq }}, {{ sq }}, {{ d }}],
// k/v [{{ b }}, {{ hkv }}, {{ sk }}, {{ d }}/{{ dv }}], scale {{ scale }}{% if causal %}, causal (k <= q + {{ offset_text }}, the offset clamped to [-Sq, Sk]){% endif %}{% if mask %}, {{ mask }} mask{% endif %}.
// A block of {{ threads }} threads takes {{ bm }} query rows of one (batch, head), kept in shared memory. Threads
// form {{ rg }} row groups of {{ tpr }} lanes; a thread owns rows rg + {{ rg }}·i (i < {{ tm }}), of each K/V tile of {{ bn }}
// keys the keys lane + {{ tpr }}·t (t < {{ tn }}), and of O the 4-column chunks at 4·lane + {{ 4 * tpr }}·u (u < {{ dvc }}).
// Per tile: S = Q·Kᵀ as a {{ tm }}×{{ tn }} register tile read from shared memory in 16-byte units (the lanes of a
// row group read consecutive K rows, padded to an odd number of 16-byte units, so distinct banks; a row group
// reads one Q row at a time, a broadcast); the online softmax{% if mask == "additive" %} (scores, mask and running max in natural units, so that a
// finite mask at the type's minimum does not overflow, exponentiated through exp2f){% else %} in the log2 domain (scale·log2e folded
// into one multiply, exp2f){% endif %}, row max and sum across the {{ tpr }} lanes of a row by shuffles; P to shared memory;
// O += P·V as a {{ tm }}×{{ 4 * dvc }} register tile. {% if async_copy %}K and V tiles arrive by cp.async: V(j) loads while S(j) is computed, K(j+1)
// while P(j)·V(j) is.{% else %}K and V tiles are copied through registers, V(j) before S(j) and K(j+1) before P(j)·V(j).{% endif %}
// Causal tiles wholly above the diagonal are never loaded; key bounds and the causal mask are checked only on
// the tiles that cross them. Masked keys get -inf and contribute nothing; a row with no visible key writes zeros.
// Exact f32: fmaf, no TF32.
extern "C" __global__ void __launch_bounds__({{ launch_bounds }}) {{ entry }}(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v, {% if mask %}const {{ mask_ctype }}* __restrict__ mask, {% endif %}{% if kv_len %}const int* __restrict__ kv_len, {% endif %}float* __restrict__ out) {
    RF_GRID_ENTER();
    struct alignas(16) F4 { float v[4]; };
    alignas(16) __shared__ float Qs[{{ bm }}][{{ qs }}];
    alignas(16) __shared__ float Ks[{{ bn }}][{{ qs }}];
    alignas(16) __shared__ float Vs[{{ bn }}][{{ vcols }}];
    alignas(16) __shared__ float Ps[{{ bm }}][{{ ps }}];
    const float LOG2E = 1.4426950408889634f;
    const int bh = blockIdx.x;
    const int bi = bh / {{ hq }}, h = bh % {{ hq }}, kvh = h / {{ group }};
{% if kv_len %}    // Keys from kv_len on hold no value (an unwritten cache tail): never read; the queries are the last Sq of the
    // kv_len positions, so the causal offset is kv_len - Sq.
    const int kv_given = kv_len[{% if kv_len == "batch" %}bi{% else %}0{% endif %}];
    const int kvn = kv_given < 0 ? 0 : (kv_given > {{ sk }} ? {{ sk }} : kv_given);  // clamped: never past the cache
    const long long kv_off = (long long)kvn - {{ sq }};
    (void)kv_off;
{% endif %}    const int tid = threadIdx.x;
    const int rg = tid / {{ tpr }}, lane = tid % {{ tpr }};
    const int row0 = blockIdx.y * {{ bm }};
    const long long q_base = ((long long)bh * {{ sq }} + row0) * {{ d }};
    const long long k_base = ((long long)bi * {{ hkv }} + kvh) * {{ sk }} * {{ d }};
    const long long v_base = ((long long)bi * {{ hkv }} + kvh) * {{ sk }} * {{ dv }};
    // Q rows past Sq and columns past D hold zeros.
{% if vec_qk %}    for (int u = tid; u < {{ bm * d4 // 4 }}; u += {{ threads }}) {
        const int r = u / {{ d4 // 4 }}, c = u % {{ d4 // 4 }} * 4;
        F4* dst = (F4*)&Qs[r][c];
        if (row0 + r < {{ sq }}) *dst = *(const F4*)(q + q_base + (long long)r * {{ d }} + c);
        else *dst = F4{};
    }
{% else %}    for (int u = tid; u < {{ bm * d4 }}; u += {{ threads }}) {
        const int r = u / {{ d4 }}, c = u % {{ d4 }};
        Qs[r][c] = row0 + r < {{ sq }} && c < {{ d }} ? q[q_base + (long long)r * {{ d }} + c] : 0.0f;
    }
{% endif %}{% if vcols > (dv + 3) // 4 * 4 %}    // V columns no load writes: lanes whose last chunk lies past Dv read them.
    for (int u = tid; u < {{ bn * vcols }}; u += {{ threads }}) {
        const int r = u / {{ vcols }}, c = u % {{ vcols }};
        if (c >= {{ (dv + 3) // 4 * 4 }}) Vs[r][c] = 0.0f;
    }
{% endif %}    float o[{{ tm }}][{{ 4 * dvc }}], m[{{ tm }}], l[{{ tm }}];
#pragma unroll
    for (int i = 0; i < {{ tm }}; ++i) {
        m[i] = -INFINITY;
        l[i] = 0.0f;  // this lane's share of the row sum, combined at the end
#pragma unroll
        for (int c = 0; c < {{ 4 * dvc }}; ++c) o[i][c] = 0.0f;
    }
{% if causal %}    // Keys after the last visible key of this block's last row are never needed.
    const long long last_row = row0 + {{ bm - 1 }} < {{ sq }} ? row0 + {{ bm - 1 }} : {{ sq - 1 }};
    const long long end_ll = last_row + {{ offset }} + 1;
    const int key_end = end_ll < 0 ? 0 : (end_ll > {{ keys }} ? {{ keys }} : (int)end_ll);
{% else %}    const int key_end = {{ keys }};
{% endif %}{% if window %}    // Sliding window of {{ window }}: keys at or before this block's first row + offset - {{ window }} are out of every
    // row's window, so the tiles wholly before it are never loaded; tiles holding that boundary check keys one by one.
    const long long win_ll = (long long)row0 + {{ offset }} - {{ window }}LL + 1;
    const int key_begin = win_ll >= key_end ? key_end : (win_ll <= 0 ? 0 : (int)(win_ll / {{ bn }} * {{ bn }}));
{% endif %}{% if window %}    if (key_end > key_begin) {
{{ load_k("key_begin") }}    }
    for (int j0 = key_begin; j0 < key_end; j0 += {{ bn }}) {
{% else %}    if (key_end > 0) {
{{ load_k("0") }}    }
    for (int j0 = 0; j0 < key_end; j0 += {{ bn }}) {
{% endif %}{% if async_copy %}        rf_cp_async_wait<0>();  // K(j0) has landed
{% endif %}        __syncthreads();  // K(j0) (and, the first time, Q) visible; the last P·V is done with Vs and Ps
{{ load_v("j0") }}        float s[{{ tm }}][{{ tn }}];
#pragma unroll
        for (int i = 0; i < {{ tm }}; ++i)
#pragma unroll
            for (int t = 0; t < {{ tn }}; ++t) s[i][t] = 0.0f;
#pragma unroll 4
        for (int c = 0; c < {{ d4 }}; c += 4) {
            F4 a[{{ tm }}], kb[{{ tn }}];
#pragma unroll
            for (int i = 0; i < {{ tm }}; ++i) a[i] = *(const F4*)&Qs[rg + i * {{ rg }}][c];
#pragma unroll
            for (int t = 0; t < {{ tn }}; ++t) kb[t] = *(const F4*)&Ks[lane + t * {{ tpr }}][c];
#pragma unroll
            for (int e = 0; e < 4; ++e)
#pragma unroll
                for (int i = 0; i < {{ tm }}; ++i)
#pragma unroll
                    for (int t = 0; t < {{ tn }}; ++t) s[i][t] = fmaf(a[i].v[e], kb[t].v[e], s[i][t]);
        }
        // Only a tile past Sk or crossing the diagonal of the block's first row checks keys.
        const bool edge = j0 + {{ bn }} > {{ keys }}{% if causal %} || (long long)j0 + {{ bn - 1 }} > (long long)row0 + {{ offset }}{% endif %}{% if window %} || (long long)j0 <= last_row + {{ offset }} - {{ window }}LL{% endif %};
#pragma unroll
        for (int i = 0; i < {{ tm }}; ++i) {
            const int row = row0 + rg + i * {{ rg }};
{% if mask %}            const long long mrow = (long long)bi * {{ ms[0] }} + (long long)h * {{ ms[1] }} + (long long)(row < {{ sq }} ? row : {{ sq - 1 }}) * {{ ms[2] }};
{% endif %}            float mx = -INFINITY;
#pragma unroll
            for (int t = 0; t < {{ tn }}; ++t) {
                const int j = j0 + lane + t * {{ tpr }};
                bool visible = true;
                if (edge) visible = j < {{ keys }}{% if causal %} && (long long)j <= (long long)row + {{ offset }}{% endif %}{% if window %} && (long long)j > (long long)row + {{ offset }} - {{ window }}LL{% endif %};
                float x = -INFINITY;
                if (visible) {
{% if mask == "additive" %}                    x = fmaf(s[i][t], {{ scale_f }}, {{ mask_load_pre }}mask[mrow + (long long)j * {{ ms[3] }}]{{ mask_load_post }});
{% elif mask == "boolean" %}                    if (mask[mrow + (long long)j * {{ ms[3] }}]) x = s[i][t] * {{ scale_log2e }};
{% else %}                    x = s[i][t] * {{ scale_log2e }};
{% endif %}                }
                s[i][t] = x;
                mx = fmaxf(mx, x);
            }
#pragma unroll
            for (int off = {{ tpr // 2 }}; off > 0; off >>= 1) mx = fmaxf(mx, rf_shfl_xor(mx, off));
            const float m_new = fmaxf(m[i], mx);
            // With no visible key yet every term is -inf: subtract 0 so that they give 0, not NaN.
            const float base = m_new == -INFINITY ? 0.0f : m_new;
            const float corr = exp2f({{ to_log2("m[i] - base") }});
            m[i] = m_new;
            float sum = 0.0f;
#pragma unroll
            for (int t = 0; t < {{ tn }}; ++t) {
                const float p = exp2f({{ to_log2("s[i][t] - base") }});
                Ps[rg + i * {{ rg }}][lane + t * {{ tpr }}] = p;
                sum += p;
            }
            l[i] = fmaf(l[i], corr, sum);
#pragma unroll
            for (int c = 0; c < {{ 4 * dvc }}; ++c) o[i][c] *= corr;
        }
{% if async_copy %}        rf_cp_async_wait<0>();  // V(j0) has landed
{% endif %}        __syncthreads();  // P and V(j0) visible; every thread is done with Ks
        if (j0 + {{ bn }} < key_end) {{ load_k("j0 + " ~ bn) }}#pragma unroll 2
        for (int j = 0; j < {{ bn }}; j += 4) {
            F4 pp[{{ tm }}];
#pragma unroll
            for (int i = 0; i < {{ tm }}; ++i) pp[i] = *(const F4*)&Ps[rg + i * {{ rg }}][j];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
#pragma unroll
                for (int u = 0; u < {{ dvc }}; ++u) {
                    const F4 vv = *(const F4*)&Vs[j + e][4 * lane + u * {{ 4 * tpr }}];
#pragma unroll
                    for (int i = 0; i < {{ tm }}; ++i)
#pragma unroll
                        for (int c = 0; c < 4; ++c) o[i][4 * u + c] = fmaf(pp[i].v[e], vv.v[c], o[i][4 * u + c]);
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < {{ tm }}; ++i) {
        float sum = l[i];
#pragma unroll
        for (int off = {{ tpr // 2 }}; off > 0; off >>= 1) sum += rf_shfl_xor(sum, off);
        const int row = row0 + rg + i * {{ rg }};
        if (row < {{ sq }}) {
            const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
            float* o_row = out + ((long long)bh * {{ sq }} + row) * {{ dv }};
#pragma unroll
            for (int u = 0; u < {{ dvc }}; ++u) {
                const int c = 4 * lane + u * {{ 4 * tpr }};
{% if vec_v %}                if (c < {{ dv }}) {
                    F4 x;
#pragma unroll
                    for (int e = 0; e < 4; ++e) x.v[e] = o[i][4 * u + e] * inv;
                    *(F4*)(o_row + c) = x;
                }
{% else %}#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (c + e < {{ dv }}) o_row[c + e] = o[i][4 * u + e] * inv;
{% endif %}            }
        }
    }
}
