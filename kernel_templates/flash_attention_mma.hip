{% set P = atom %}{% set S = stages %}{% set ntile_n = block_n // an %}{% set ntile_o = dv // an %}{% set kq = d // ak %}{#- Element (r, c) of a K or V tile, as TileLayout::index computes it. -#}
{%- macro at(t, r, c) %}(({{ r }}) * {{ t.ld }} + (((({{ c }}) >> 3) ^ ((({{ r }}) / {{ t.swz_div }}) % {{ t.swz_mod }})) << 3 | (({{ c }}) & 7))){% endmacro -%}
{#- The scores of tile j0 of every atom tile of the warp: masks, bounds and the row maxima. `edge`:
    the tile needs key checks. -#}
{%- macro scores(edge) %}
#pragma unroll
            for (int i = 0; i < {{ atoms }}; ++i) {
#pragma unroll
                for (int n = 0; n < {{ ntile_n }}; ++n) {
#pragma unroll
                    for (int e = 0; e < {{ P }}_C_ELEMS; ++e) {
{%- if edge and causal %}
                        const int qi = row0 + i * {{ P }}_M + {{ P }}_c_row(lane, e);
{%- endif %}
{%- if edge or mask %}
                        const int kj = j0 + n * {{ P }}_N + {{ P }}_c_col(lane, e);
{%- endif %}
                        float x = s[i][n][e]{% if not fold %} * {{ scale_log2 }}{% endif %};
{%- if mask == "additive" %}
                        {% if edge %}if (kj < {{ keys }}) {% endif %}x += LOG2E * {{ mask_load_pre }}mask[mrow[i][{{ P }}_c_row_slot(e)] + (long long)kj * {{ ms[3] }}]{{ mask_load_post }};
{%- elif mask == "boolean" %}
                        if ({% if edge %}kj < {{ keys }} && {% endif %}!mask[mrow[i][{{ P }}_c_row_slot(e)] + (long long)kj * {{ ms[3] }}]) x = -INFINITY;
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
                        s[i][n][e] = x;
                        mx[i][{{ P }}_c_row_slot(e)] = fmaxf(mx[i][{{ P }}_c_row_slot(e)], x);
                    }
                }
            }
{%- endmacro -%}
// FlashAttention-2 on matrix cores ({{ dtype }}{% if tf32 %} at TF32 precision (opt-in: Q, K, V and P rounded to a 10-bit mantissa as fragments
// load){% endif %}, the {{ atom }} atom with f32 accumulation): q [{{ b }}, {{ hq }}, {{ sq }}, {{ d }}],
// k/v [{{ b }}, {{ hkv }}, {{ sk }}, {{ d }}/{{ dv }}], scale {{ scale }}{% if causal %}, causal (k <= q + {{ offset_text }}, the offset clamped to [-Sq, Sk]){% endif %}{% if mask %}, {{ mask }} mask{% endif %}.
// A block of {{ warps }} warps takes {{ block_m }} query rows of one (batch, head), {{ rows_w }} per warp ({{ atoms }} atom tile{% if atoms > 1 %}s{% endif %} of {{ am }} rows), so
// each K/V fragment a warp reads from shared memory serves {{ rows_w }} rows.
// {% if q_in_registers %}Q fragments stay in registers{% else %}Q fragments are reloaded at
// every key tile (the registers hold O){% endif %}. Keys come in tiles of {{ block_n }};
// {% if cp_async %}K and V arrive by cp.async into rings of {{ S }} buffer{% if S > 1 %}s{% endif %},
// in separate commit groups, so the next K loads while P·V runs and the next V while S is computed{% else %}K and V pass through
// registers: the next K is loaded while S is computed and stored after, the next V likewise during P·V{% endif %}.
// Fragments load {% if ldmatrix %}by ldmatrix from tiles whose 16-byte chunks are XOR-swizzled by row{% else %}through the atom's element loads from tiles whose rows are padded by 16 bytes{% endif %}.
// Per tile a warp computes S = Q·Kᵀ, updates the online softmax in the log2 domain ({% if fold %}the scale folded into the
// exponent: exp2(s·scale·log2e − m), one FMA{% else %}scores scaled{% if mask == "additive" %} and the mask added{% endif %} first{% endif %}), and multiplies P by V;
// P {% if p_in_registers %}stays in registers (the S accumulators already hold it in the A layout){% else %}goes through shared memory (stored from the accumulators, reloaded as A fragments){% endif %}.
// Only boundary tiles (past Sk{% if causal %}, or crossing the causal diagonal of the warp's rows{% endif %}) check keys{% if causal %}; tiles wholly
// above the block's diagonal are never loaded{% endif %}. Masked keys contribute nothing; a row with no visible key writes zeros.
// Fragments are indexed only through the {{ P }}_* helpers generated from the atom.
extern "C" __global__ void __launch_bounds__({{ threads }}, 1) {{ entry }}(const {{ ctype }}* __restrict__ q, const {{ ctype }}* __restrict__ k, const {{ ctype }}* __restrict__ v, {% if mask %}const {{ mask_ctype }}* __restrict__ mask, {% endif %}{% if kv_len %}const int* __restrict__ kv_len, {% endif %}{{ ctype }}* __restrict__ out) {
    RF_GRID_ENTER();
    __shared__ __align__(16) {{ st }} Ks[{{ S }}][{{ tk.rows * tk.ld }}];
    __shared__ __align__(16) {{ st }} Vs[{{ S }}][{{ tv.rows * tv.ld }}];
{%- if not p_in_registers %}
    __shared__ __align__(16) {{ st }} Ps[{{ block_m }}][{{ p_ld }}];
{%- endif %}
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
{% endif %}    const int warp = threadIdx.x / {{ P }}_LANES, lane = threadIdx.x % {{ P }}_LANES;
    // Atom tile i of this warp holds rows row0 + i*{{ am }} ...
    const int row0 = blockIdx.y * {{ block_m }} + warp * {{ rows_w }};
    const long long q_base = (long long)bh * {{ sq }} * {{ d }};
    const long long k_base = ((long long)bi * {{ hkv }} + kvh) * {{ sk }} * {{ d }};
    const long long v_base = ((long long)bi * {{ hkv }} + kvh) * {{ sk }} * {{ dv }};
{%- if q_in_registers %}
    {{ P }}_a qf[{{ atoms }}][{{ kq }}];
#pragma unroll
    for (int i = 0; i < {{ atoms }}; ++i)
#pragma unroll
        for (int kk = 0; kk < {{ kq }}; ++kk)
            {{ P }}_load_a(qf[i][kk], q + q_base + kk * {{ P }}_K, {{ d }}, row0 + i * {{ P }}_M, {{ sq }}, lane);
{%- endif %}
{%- if mask %}
    // The mask's offset of each of this thread's rows (clamped into range: rows past Sq are never stored).
    long long mrow[{{ atoms }}][{{ P }}_C_ROWS];
#pragma unroll
    for (int i = 0; i < {{ atoms }}; ++i)
#pragma unroll
        for (int e = 0; e < {{ P }}_C_ELEMS; ++e)
            mrow[i][{{ P }}_c_row_slot(e)] = (long long)bi * {{ ms[0] }} + (long long)h * {{ ms[1] }} + (long long)min(row0 + i * {{ P }}_M + {{ P }}_c_row(lane, e), {{ sq - 1 }}) * {{ ms[2] }};
{%- endif %}
    {{ P }}_c o[{{ atoms }}][{{ ntile_o }}];
#pragma unroll
    for (int i = 0; i < {{ atoms }}; ++i)
#pragma unroll
        for (int n = 0; n < {{ ntile_o }}; ++n) {{ P }}_zero_c(o[i][n]);
    // Row statistics in the log2 domain: running max m and sum l, per atom tile and row slot.
    float m[{{ atoms }}][{{ P }}_C_ROWS], l[{{ atoms }}][{{ P }}_C_ROWS];
#pragma unroll
    for (int i = 0; i < {{ atoms }}; ++i)
#pragma unroll
        for (int r = 0; r < {{ P }}_C_ROWS; ++r) {
            m[i][r] = -INFINITY;
            l[i][r] = 0.0f;
        }
{% if causal %}    // Keys after the last visible key of this block's last row are never loaded.
    const long long last_row = min((long long)blockIdx.y * {{ block_m }} + {{ block_m - 1 }}, {{ sq - 1 }}LL);
    const long long end_ll = last_row + {{ offset }} + 1;
    const int key_end = end_ll < 0 ? 0 : (end_ll > {{ keys }} ? {{ keys }} : (int)end_ll);
{% else %}    const int key_end = {{ keys }};
{% endif %}{% if window %}    // Sliding window of {{ window }}: keys at or before this block's first row + offset - {{ window }} are out of every
    // row's window, so the tiles wholly before it are never loaded; tiles holding that boundary check keys one by one.
    const long long win_ll = (long long)blockIdx.y * {{ block_m }} + {{ offset }} - {{ window }}LL + 1;
    const int key_begin = win_ll >= key_end ? key_end : (win_ll <= 0 ? 0 : (int)(win_ll / {{ block_n }} * {{ block_n }}));
{% endif %}    const int ntiles = (key_end{% if window %} - key_begin{% endif %} + {{ block_n - 1 }}) / {{ block_n }};
{%- if cp_async %}
    // Tile t of K (V) into buffer t % {{ S }}, one commit group each, empty past the last tile so that
    // the count of groups in flight stays fixed: groups are issued K0 V0 K1 V1 ..., and before
    // K(t) or V(t) is read the {{ 2 * S - 2 }} groups issued after it may still be in flight.
    auto issue_k = [&](int t) {
        if (t < ntiles) {
            {{ st }}* dst = Ks[t % {{ S }}];
            const int j0 = {% if window %}key_begin + {% endif %}t * {{ block_n }};
#pragma unroll
            for (int x = threadIdx.x; x < {{ block_n * d // ce }}; x += {{ threads }}) {
                const int r = x / {{ d // ce }}, c = (x % {{ d // ce }}) * {{ ce }};
                const bool ok = j0 + r < {{ keys }};
                rf_cp_async16(dst + {{ at(tk, "r", "c") }}, k + k_base + (long long)(ok ? j0 + r : 0) * {{ d }} + c, ok);
            }
        }
        rf_cp_async_commit();
    };
    auto issue_v = [&](int t) {
        if (t < ntiles) {
            {{ st }}* dst = Vs[t % {{ S }}];
            const int j0 = {% if window %}key_begin + {% endif %}t * {{ block_n }};
#pragma unroll
            for (int x = threadIdx.x; x < {{ block_n * dv // ce }}; x += {{ threads }}) {
                const int r = x / {{ dv // ce }}, c = (x % {{ dv // ce }}) * {{ ce }};
                const bool ok = j0 + r < {{ keys }};
                rf_cp_async16(dst + {{ at(tv, "r", "c") }}, v + v_base + (long long)(ok ? j0 + r : 0) * {{ dv }} + c, ok);
            }
        }
        rf_cp_async_commit();
    };
#pragma unroll
    for (int t = 0; t < {{ S }}; ++t) {
        issue_k(t);
        if (t + 1 < {{ S }}) issue_v(t);
    }
{%- else %}
    // 16-byte chunks of tile t in registers (zeros past Sk and past the last tile), then into the
    // one K (V) buffer. Chunk x of a tile is thread x % {{ threads }}'s, step x / {{ threads }}.
    uint4 kr[{{ k_iters }}], vr[{{ v_iters }}];
{%- for w in [("k", "kr", "k_iters", d, "tk", "Ks"), ("v", "vr", "v_iters", dv, "tv", "Vs")] %}
{%- set cols = w[3] %}{% set iters = k_iters if w[0] == "k" else v_iters %}{% set tl = tk if w[0] == "k" else tv %}
    auto fetch_{{ w[0] }} = [&](int t) {
        const int j0 = {% if window %}key_begin + {% endif %}t * {{ block_n }};
#pragma unroll
        for (int i = 0; i < {{ iters }}; ++i) {
            const int x = threadIdx.x + i * {{ threads }};
            const int r = x / {{ cols // ce }}, c = (x % {{ cols // ce }}) * {{ ce }};
            uint4 val = make_uint4(0u, 0u, 0u, 0u);
            if (x < {{ block_n * cols // ce }} && t < ntiles && j0 + r < {{ keys }})
                val = *(const uint4*)({{ w[0] }} + {{ w[0] }}_base + (long long)(j0 + r) * {{ cols }} + c);
            {{ w[1] }}[i] = val;
        }
    };
    auto store_{{ w[0] }} = [&]() {
#pragma unroll
        for (int i = 0; i < {{ iters }}; ++i) {
            const int x = threadIdx.x + i * {{ threads }};
            const int r = x / {{ cols // ce }}, c = (x % {{ cols // ce }}) * {{ ce }};
            if (x < {{ block_n * cols // ce }}) *(uint4*)&{{ w[5] }}[0][{{ at(tl, "r", "c") }}] = {{ w[1] }}[i];
        }
    };
{%- endfor %}
    fetch_k(0);
    store_k();
    fetch_v(0);
{%- endif %}
    for (int t = 0; t < ntiles; ++t) {
        const int j0 = {% if window %}key_begin + {% endif %}t * {{ block_n }};
{%- if cp_async %}
        rf_cp_async_wait<{{ 2 * S - 2 }}>();  // K(t) has landed
        __syncthreads();  // ... for every thread; and every warp is done with V(t - 1)
        issue_v(t + {{ S - 1 }});
        const {{ st }}* ks = Ks[t % {{ S }}];
        const {{ st }}* vs = Vs[t % {{ S }}];
{%- else %}
        __syncthreads();  // K(t) is stored for every thread; every warp is done with V(t - 1)
        store_v();        // V(t), read after the next barrier
        fetch_k(t + 1);   // in flight while S(t) is computed
        const {{ st }}* ks = Ks[0];
        const {{ st }}* vs = Vs[0];
{%- endif %}
        {{ P }}_c s[{{ atoms }}][{{ ntile_n }}];
#pragma unroll
        for (int i = 0; i < {{ atoms }}; ++i)
#pragma unroll
            for (int n = 0; n < {{ ntile_n }}; ++n) {{ P }}_zero_c(s[i][n]);
#pragma unroll
        for (int kk = 0; kk < {{ kq }}; ++kk) {
{%- if not q_in_registers %}
            {{ P }}_a qf[{{ atoms }}][1];
#pragma unroll
            for (int i = 0; i < {{ atoms }}; ++i)
                {{ P }}_load_a(qf[i][0], q + q_base + kk * {{ P }}_K, {{ d }}, row0 + i * {{ P }}_M, {{ sq }}, lane);
{%- endif %}
            // K fragments: B[k][key] = K[key][k], K's rows read as B's columns; each serves every atom tile.
#pragma unroll
            for (int n = 0; n < {{ ntile_n }}; n += {{ n_step // an }}) {
                {{ P }}_b kb[{{ n_step // an }}];
{%- if ldmatrix %}
                {{ P }}_load_b_pair_ldsm(kb[0], kb[1], ks + {{ at(tk, "n * " ~ P ~ "_N + " ~ P ~ "_ldsm_b_nk_row(lane)", "kk * " ~ P ~ "_K + " ~ P ~ "_ldsm_b_nk_col(lane)") }});
{%- else %}
                {{ P }}_load_b_nk(kb[0], ks + {{ at(tk, "n * " ~ P ~ "_N", "kk * " ~ P ~ "_K") }}, {{ tk.ld }}, lane);
{%- endif %}
#pragma unroll
                for (int i = 0; i < {{ atoms }}; ++i)
#pragma unroll
                    for (int f = 0; f < {{ n_step // an }}; ++f) {{ P }}_mma(s[i][n + f], qf[i][{% if q_in_registers %}kk{% else %}0{% endif %}], kb[f]);
            }
        }
        float mx[{{ atoms }}][{{ P }}_C_ROWS];
#pragma unroll
        for (int i = 0; i < {{ atoms }}; ++i)
#pragma unroll
            for (int r = 0; r < {{ P }}_C_ROWS; ++r) mx[i][r] = -INFINITY;
        // Key checks only where the tile reaches past Sk{% if causal %} or crosses the diagonal of this warp's first row{% endif %}.
        const bool edge = j0 + {{ block_n }} > {{ keys }}{% if causal %} || (long long)j0 + {{ block_n - 1 }} > (long long)row0 + {{ offset }}{% endif %}{% if window %} || (long long)j0 <= (long long)row0 + {{ rows_w - 1 }} + {{ offset }} - {{ window }}LL{% endif %};
        if (edge) {
{{- scores(true) }}
        } else {
{{- scores(false) }}
        }
        float base[{{ atoms }}][{{ P }}_C_ROWS];
#pragma unroll
        for (int i = 0; i < {{ atoms }}; ++i)
#pragma unroll
            for (int r = 0; r < {{ P }}_C_ROWS; ++r) {
                const float m_new = fmaxf(m[i][r], {{ P }}_c_row_max(mx[i][r]){% if fold %} * {{ scale_log2 }}{% endif %});
                // With every key so far masked the row keeps max -inf: subtract 0 instead.
                base[i][r] = m_new == -INFINITY ? 0.0f : m_new;
                const float corr = exp2f(m[i][r] - base[i][r]);
                m[i][r] = m_new;
                l[i][r] *= corr;
#pragma unroll
                for (int n = 0; n < {{ ntile_o }}; ++n)
#pragma unroll
                    for (int e = 0; e < {{ P }}_C_ELEMS; ++e)
                        if ({{ P }}_c_row_slot(e) == r) o[i][n][e] *= corr;
            }
#pragma unroll
        for (int i = 0; i < {{ atoms }}; ++i)
#pragma unroll
            for (int n = 0; n < {{ ntile_n }}; ++n)
#pragma unroll
                for (int e = 0; e < {{ P }}_C_ELEMS; ++e) {
                    const float pv = exp2f({% if fold %}fmaf(s[i][n][e], {{ scale_log2 }}, -base[i][{{ P }}_c_row_slot(e)]){% else %}s[i][n][e] - base[i][{{ P }}_c_row_slot(e)]{% endif %});
                    l[i][{{ P }}_c_row_slot(e)] += pv;
{%- if p_in_registers %}
                    s[i][n][e] = pv;
{%- else %}
                    Ps[warp * {{ rows_w }} + i * {{ P }}_M + {{ P }}_c_row(lane, e)][n * {{ P }}_N + {{ P }}_c_col(lane, e)] = {{ store_pre }}pv{{ store_post }};
{%- endif %}
                }
{%- if cp_async %}
        rf_cp_async_wait<{{ 2 * S - 2 }}>();  // V(t) has landed
        __syncthreads();  // ... for every thread{% if not p_in_registers %}, and so has P{% endif %}; every warp is done with K(t)
        issue_k(t + {{ S }});
{%- else %}
        __syncthreads();  // V(t){% if not p_in_registers %} and P{% endif %} stored for every thread; every warp is done with K(t)
        store_k();        // K(t + 1), read after the next barrier
        fetch_v(t + 1);   // in flight while P·V(t) runs
{%- endif %}
#pragma unroll
        for (int kk = 0; kk < {{ block_n // ak }}; ++kk) {
            {{ P }}_a pa[{{ atoms }}];
#pragma unroll
            for (int i = 0; i < {{ atoms }}; ++i)
{%- if p_in_registers %}
                {{ P }}_c_to_a(pa[i], &s[i][kk * {{ ak // an }}]);  // P's accumulators for keys kk*K.. are the A operand
{%- else %}
                {{ P }}_load_a(pa[i], &Ps[warp * {{ rows_w }} + i * {{ P }}_M][kk * {{ P }}_K], {{ p_ld }}, 0, {{ P }}_M, lane);
{%- endif %}
#pragma unroll
            for (int n = 0; n < {{ ntile_o }}; n += {{ n_step // an }}) {
                {{ P }}_b vb[{{ n_step // an }}];
{%- if ldmatrix %}
                {{ P }}_load_b_pair_ldsm_trans(vb[0], vb[1], vs + {{ at(tv, "kk * " ~ P ~ "_K + " ~ P ~ "_ldsm_b_kn_row(lane)", "n * " ~ P ~ "_N + " ~ P ~ "_ldsm_b_kn_col(lane)") }});
{%- else %}
                {{ P }}_load_b_kn(vb[0], vs + {{ at(tv, "kk * " ~ P ~ "_K", "n * " ~ P ~ "_N") }}, {{ tv.ld }}, lane);
{%- endif %}
#pragma unroll
                for (int i = 0; i < {{ atoms }}; ++i)
#pragma unroll
                    for (int f = 0; f < {{ n_step // an }}; ++f) {{ P }}_mma(o[i][n + f], pa[i], vb[f]);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < {{ atoms }}; ++i) {
        float inv[{{ P }}_C_ROWS];
#pragma unroll
        for (int r = 0; r < {{ P }}_C_ROWS; ++r) {
            const float sum = {{ P }}_c_row_sum(l[i][r]);
            inv[r] = sum > 0.0f ? 1.0f / sum : 0.0f;
        }
#pragma unroll
        for (int n = 0; n < {{ ntile_o }}; ++n)
#pragma unroll
            for (int e = 0; e < {{ P }}_C_ELEMS; ++e) {
                const int row = row0 + i * {{ P }}_M + {{ P }}_c_row(lane, e);
                if (row < {{ sq }})
                    out[((long long)bh * {{ sq }} + row) * {{ dv }} + n * {{ P }}_N + {{ P }}_c_col(lane, e)] = {{ store_pre }}(o[i][n][e] * inv[{{ P }}_c_row_slot(e)]){{ store_post }};
            }
    }
}
