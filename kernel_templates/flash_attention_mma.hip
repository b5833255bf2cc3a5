// FlashAttention on tensor cores ({{ dtype }}, the {{ atom }} matrix atom with f32 accumulation, where the
// target's table has it; every other target uses flash_attention.hip): q [{{ b }}, {{ hq }}, {{ sq }}, {{ d }}], k/v [{{ b }}, {{ hkv }}, {{ sk }}, {{ d }}/{{ dv }}],
// scale {{ scale }}{% if causal %}, causal (k <= q + {{ offset_text }}, the offset clamped to [-Sq, Sk]){% endif %}{% if mask %}, {{ mask }} mask{% endif %}.
// A block of {{ warps }} warps takes {{ block_m }} query rows of one (batch, head), {{ am }} per warp; each warp keeps its
// Q rows as mma fragments in registers for the whole kernel. Key/value tiles of {{ block_n }} rows are staged
// in shared memory (rows padded by 8 halves so that fragment loads hit distinct banks), loaded by cp.async one
// tile ahead of use. Per tile a warp
// computes S = Q·Kᵀ ({{ am }} × {{ block_n }}) in registers, applies scale and masks, updates the online softmax in
// the log2 domain, and multiplies P — converted to {{ dtype }} where the S accumulator already holds it in the
// A-fragment layout, so P never touches shared memory — by V, read with ldmatrix.trans.
// Fragments are indexed only through the {{ atom }}_* helpers generated from the atom: each thread holds
// {{ atom }}_C_ROWS rows of its warp's {{ am }} (row slots), and row max and sum combine the lanes that hold the
// rest of a row ({{ atom }}_c_row_max/_sum). Masked keys get -inf and contribute nothing; a row with no
// visible key writes zeros.
extern "C" __global__ void __launch_bounds__({{ threads }}) {{ entry }}(const {{ ctype }}* __restrict__ q, const {{ ctype }}* __restrict__ k, const {{ ctype }}* __restrict__ v, {% if mask %}const {{ mask_ctype }}* __restrict__ mask, {% endif %}{{ ctype }}* __restrict__ out) {
    __shared__ __align__(16) unsigned short Ks[{{ block_n }}][{{ d + 8 }}];
    __shared__ __align__(16) unsigned short Vs[{{ block_n }}][{{ dv + 8 }}];
    const float LOG2E = 1.4426950408889634f;
    const int bh = blockIdx.x;
    const int bi = bh / {{ hq }}, h = bh % {{ hq }}, kvh = h / {{ group }};
    const int warp = threadIdx.x / {{ atom }}_LANES, lane = threadIdx.x % {{ atom }}_LANES;
    const int row0 = blockIdx.y * {{ block_m }} + warp * {{ atom }}_M;
    const long long q_base = (long long)bh * {{ sq }} * {{ d }};
    const long long k_base = ((long long)bi * {{ hkv }} + kvh) * {{ sk }} * {{ d }};
    const long long v_base = ((long long)bi * {{ hkv }} + kvh) * {{ sk }} * {{ dv }};
    {{ atom }}_a qf[{{ d // ak }}];
    for (int kk = 0; kk < {{ d // ak }}; ++kk)
        {{ atom }}_load_a(qf[kk], q + q_base + kk * {{ atom }}_K, {{ d }}, row0, {{ sq }}, lane);
    {{ atom }}_c o[{{ dv // an }}];
    for (int n = 0; n < {{ dv // an }}; ++n) {{ atom }}_zero_c(o[n]);
    float m[{{ atom }}_C_ROWS], l[{{ atom }}_C_ROWS];
    for (int r = 0; r < {{ atom }}_C_ROWS; ++r) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
{% if causal %}    // Keys after the last visible key of this block's last row are never needed.
    const long long last_row = min((long long)blockIdx.y * {{ block_m }} + {{ block_m - 1 }}, {{ sq - 1 }}LL);
    const long long end_ll = last_row + {{ offset }} + 1;
    const int key_end = end_ll < 0 ? 0 : (end_ll > {{ sk }} ? {{ sk }} : (int)end_ll);
{% else %}    const int key_end = {{ sk }};
{% endif %}    // K and V tiles arrive by cp.async in separate commit groups, one tile ahead: the next K
    // loads while this tile's P·V runs, the next V while the next S is computed.
    auto load_k = [&](int j0) {
        for (int t = threadIdx.x; t < {{ block_n * d // 8 }}; t += {{ threads }}) {
            const int r = t / {{ d // 8 }}, c = (t % {{ d // 8 }}) * 8;
            const bool ok = j0 + r < {{ sk }};
            rf_cp_async16(&Ks[r][c], k + k_base + (long long)(ok ? j0 + r : 0) * {{ d }} + c, ok);
        }
        rf_cp_async_commit();
    };
    auto load_v = [&](int j0) {
        for (int t = threadIdx.x; t < {{ block_n * dv // 8 }}; t += {{ threads }}) {
            const int r = t / {{ dv // 8 }}, c = (t % {{ dv // 8 }}) * 8;
            const bool ok = j0 + r < {{ sk }};
            rf_cp_async16(&Vs[r][c], v + v_base + (long long)(ok ? j0 + r : 0) * {{ dv }} + c, ok);
        }
        rf_cp_async_commit();
    };
    if (key_end > 0) {
        load_k(0);
        load_v(0);
    }
    for (int j0 = 0; j0 < key_end; j0 += {{ block_n }}) {
        rf_cp_async_wait_one();  // K(j0) has landed; V(j0) may still be in flight
        __syncthreads();
        {{ atom }}_c s[{{ block_n // an }}];
        for (int n = 0; n < {{ block_n // an }}; ++n) {{ atom }}_zero_c(s[n]);
        for (int n = 0; n < {{ block_n // an }}; n += 2) {
            for (int kk = 0; kk < {{ d // ak }}; ++kk) {
                // K fragments of key tiles n and n + 1: B[k][key] = K[key][k], read as rows of K.
                {{ atom }}_b kb[2];
                {{ atom }}_load_b_pair_nk_smem(kb, &Ks[n * {{ atom }}_N][kk * {{ atom }}_K], {{ d + 8 }}, lane);
                {{ atom }}_mma(s[n], qf[kk], kb[0]);
                {{ atom }}_mma(s[n + 1], qf[kk], kb[1]);
            }
        }
        float mx[{{ atom }}_C_ROWS];
        for (int r = 0; r < {{ atom }}_C_ROWS; ++r) mx[r] = -INFINITY;
        for (int n = 0; n < {{ block_n // an }}; ++n) {
            for (int e = 0; e < {{ atom }}_C_ELEMS; ++e) {
{% if causal or mask %}                const int i = row0 + {{ atom }}_c_row(lane, e);
{% endif %}                const int j = j0 + n * {{ atom }}_N + {{ atom }}_c_col(lane, e);
                float x = s[n][e] * {{ scale_f }};
{% if mask == "additive" %}                if (j < {{ sk }}) x += {{ mask_load_pre }}mask[(long long)bi * {{ ms[0] }} + (long long)h * {{ ms[1] }} + (long long)min(i, {{ sq - 1 }}) * {{ ms[2] }} + (long long)j * {{ ms[3] }}]{{ mask_load_post }};
{% elif mask == "boolean" %}                if (j < {{ sk }} && !mask[(long long)bi * {{ ms[0] }} + (long long)h * {{ ms[1] }} + (long long)min(i, {{ sq - 1 }}) * {{ ms[2] }} + (long long)j * {{ ms[3] }}]) x = -INFINITY;
{% endif %}{% if causal %}                if ((long long)j > (long long)i + {{ offset }}) x = -INFINITY;
{% endif %}                if (j >= {{ sk }}) x = -INFINITY;
                s[n][e] = x * LOG2E;
                mx[{{ atom }}_c_row_slot(e)] = fmaxf(mx[{{ atom }}_c_row_slot(e)], s[n][e]);
            }
        }
        float corr[{{ atom }}_C_ROWS], base[{{ atom }}_C_ROWS];
        for (int r = 0; r < {{ atom }}_C_ROWS; ++r) {
            mx[r] = {{ atom }}_c_row_max(mx[r]);
            const float m_new = fmaxf(m[r], mx[r]);
            // With every key so far masked, the row keeps max -inf: subtract 0 instead of -inf.
            base[r] = m_new == -INFINITY ? 0.0f : m_new;
            corr[r] = exp2f(m[r] - base[r]);
            m[r] = m_new;
            l[r] *= corr[r];
        }
        for (int n = 0; n < {{ dv // an }}; ++n)
            for (int e = 0; e < {{ atom }}_C_ELEMS; ++e) o[n][e] *= corr[{{ atom }}_c_row_slot(e)];
        for (int n = 0; n < {{ block_n // an }}; ++n) {
            for (int e = 0; e < {{ atom }}_C_ELEMS; ++e) {
                s[n][e] = exp2f(s[n][e] - base[{{ atom }}_c_row_slot(e)]);
                l[{{ atom }}_c_row_slot(e)] += s[n][e];
            }
        }
        __syncthreads();  // every warp is done with Ks
        if (j0 + {{ block_n }} < key_end) load_k(j0 + {{ block_n }});
        else rf_cp_async_commit();  // an empty group keeps the count of groups in flight fixed
        rf_cp_async_wait_one();     // V(j0) has landed
        __syncthreads();
        for (int kk = 0; kk < {{ block_n // ak }}; ++kk) {
            // P's accumulators for keys kk*K.. become the A operand where they are.
            {{ atom }}_a pa;
            {{ atom }}_c_to_a(pa, &s[kk * {{ ak // an }}]);
            for (int n2 = 0; n2 < {{ dv // (2 * an) }}; ++n2) {
                {{ atom }}_b vb[2];
                {{ atom }}_load_b_pair_kn_smem(vb, &Vs[kk * {{ atom }}_K][n2 * 2 * {{ atom }}_N], {{ dv + 8 }}, lane);
                {{ atom }}_mma(o[2 * n2], pa, vb[0]);
                {{ atom }}_mma(o[2 * n2 + 1], pa, vb[1]);
            }
        }
        __syncthreads();  // every warp is done with Vs
        if (j0 + {{ block_n }} < key_end) load_v(j0 + {{ block_n }});
        else rf_cp_async_commit();
    }
    float inv[{{ atom }}_C_ROWS];
    for (int r = 0; r < {{ atom }}_C_ROWS; ++r) {
        l[r] = {{ atom }}_c_row_sum(l[r]);
        inv[r] = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    }
    for (int n = 0; n < {{ dv // an }}; ++n) {
        for (int e = 0; e < {{ atom }}_C_ELEMS; ++e) {
            const int row = row0 + {{ atom }}_c_row(lane, e);
            if (row < {{ sq }})
                out[((long long)bh * {{ sq }} + row) * {{ dv }} + n * {{ atom }}_N + {{ atom }}_c_col(lane, e)] = {{ store_pre }}(o[n][e] * inv[{{ atom }}_c_row_slot(e)]){{ store_post }};
        }
    }
}
