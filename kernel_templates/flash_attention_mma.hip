// FlashAttention on tensor cores ({{ dtype }}, mma.sync m16n8k16 with f32 accumulation; NVIDIA sm_80+ only,
// every other target uses flash_attention.hip): q [{{ b }}, {{ hq }}, {{ sq }}, {{ d }}], k/v [{{ b }}, {{ hkv }}, {{ sk }}, {{ d }}/{{ dv }}],
// scale {{ scale }}{% if causal %}, causal (k <= q + {{ offset_text }}, the offset clamped to [-Sq, Sk]){% endif %}{% if mask %}, {{ mask }} mask{% endif %}.
// A block of {{ warps }} warps takes {{ block_m }} query rows of one (batch, head), 16 per warp; each warp keeps its
// Q rows as mma fragments in registers for the whole kernel. Key/value tiles of {{ block_n }} rows are staged
// in shared memory (rows padded by 8 halves so that fragment loads hit distinct banks), loaded by cp.async one
// tile ahead of use. Per tile a warp
// computes S = Q·Kᵀ (16 × {{ block_n }}) in registers, applies scale and masks, updates the online softmax in
// the log2 domain, and multiplies P — converted to {{ dtype }} where the S accumulator already holds it in the
// A-fragment layout, so P never touches shared memory — by V, read with ldmatrix.trans.
// Each thread holds two rows (g and g + 8 of its warp's 16); the four threads of a group share a row,
// so row max and sum are reduced over xor-shuffles 1 and 2. Masked keys get -inf and contribute
// nothing; a row with no visible key writes zeros.
extern "C" __global__ void __launch_bounds__({{ threads }}) {{ entry }}(const {{ ctype }}* __restrict__ q, const {{ ctype }}* __restrict__ k, const {{ ctype }}* __restrict__ v, {% if mask %}const {{ mask_ctype }}* __restrict__ mask, {% endif %}{{ ctype }}* __restrict__ out) {
    __shared__ __align__(16) unsigned short Ks[{{ block_n }}][{{ d + 8 }}];
    __shared__ __align__(16) unsigned short Vs[{{ block_n }}][{{ dv + 8 }}];
    const float LOG2E = 1.4426950408889634f;
    const int bh = blockIdx.x;
    const int bi = bh / {{ hq }}, h = bh % {{ hq }}, kvh = h / {{ group }};
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t4 = lane & 3;
    const int row0 = blockIdx.y * {{ block_m }} + warp * 16;
    const int rows[2] = {row0 + g, row0 + g + 8};
    const long long k_base = ((long long)bi * {{ hkv }} + kvh) * {{ sk }} * {{ d }};
    const long long v_base = ((long long)bi * {{ hkv }} + kvh) * {{ sk }} * {{ dv }};
    const unsigned* q32 = (const unsigned*)q;
    unsigned qf[{{ d // 16 }}][4];
    for (int kk = 0; kk < {{ d // 16 }}; ++kk) {
        for (int e = 0; e < 4; ++e) {
            const int r = rows[e & 1], c = kk * 16 + t4 * 2 + (e >> 1) * 8;
            qf[kk][e] = r < {{ sq }} ? q32[(((long long)bh * {{ sq }} + r) * {{ d }} + c) / 2] : 0u;
        }
    }
    float o[{{ dv // 8 }}][4];
    for (int n = 0; n < {{ dv // 8 }}; ++n)
        for (int e = 0; e < 4; ++e) o[n][e] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
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
        float s[{{ block_n // 8 }}][4];
        for (int n = 0; n < {{ block_n // 8 }}; ++n)
            for (int e = 0; e < 4; ++e) s[n][e] = 0.0f;
        for (int n = 0; n < {{ block_n // 8 }}; n += 2) {
            for (int kk = 0; kk < {{ d // 16 }}; ++kk) {
                // K fragments of key tiles n and n + 1: B[k][key] = K[key][k], read as rows of K.
                unsigned kb[4];
                rf_ldsm_x4(kb, &Ks[n * 8 + (lane >> 4) * 8 + (lane & 7)][kk * 16 + ((lane >> 3) & 1) * 8]);
                {{ mma }}(s[n], qf[kk], kb[0], kb[1]);
                {{ mma }}(s[n + 1], qf[kk], kb[2], kb[3]);
            }
        }
        float mx[2] = {-INFINITY, -INFINITY};
        for (int n = 0; n < {{ block_n // 8 }}; ++n) {
            for (int e = 0; e < 4; ++e) {
{% if causal or mask %}                const int i = rows[e >> 1];
{% endif %}                const int j = j0 + n * 8 + t4 * 2 + (e & 1);
                float x = s[n][e] * {{ scale_f }};
{% if mask == "additive" %}                if (j < {{ sk }}) x += {{ mask_load_pre }}mask[(long long)bi * {{ ms[0] }} + (long long)h * {{ ms[1] }} + (long long)min(i, {{ sq - 1 }}) * {{ ms[2] }} + (long long)j * {{ ms[3] }}]{{ mask_load_post }};
{% elif mask == "boolean" %}                if (j < {{ sk }} && !mask[(long long)bi * {{ ms[0] }} + (long long)h * {{ ms[1] }} + (long long)min(i, {{ sq - 1 }}) * {{ ms[2] }} + (long long)j * {{ ms[3] }}]) x = -INFINITY;
{% endif %}{% if causal %}                if ((long long)j > (long long)i + {{ offset }}) x = -INFINITY;
{% endif %}                if (j >= {{ sk }}) x = -INFINITY;
                s[n][e] = x * LOG2E;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
            }
        }
        float corr[2], base[2];
        for (int r = 0; r < 2; ++r) {
            mx[r] = fmaxf(mx[r], rf_shfl_xor(mx[r], 1));
            mx[r] = fmaxf(mx[r], rf_shfl_xor(mx[r], 2));
            const float m_new = fmaxf(m[r], mx[r]);
            // With every key so far masked, the row keeps max -inf: subtract 0 instead of -inf.
            base[r] = m_new == -INFINITY ? 0.0f : m_new;
            corr[r] = exp2f(m[r] - base[r]);
            m[r] = m_new;
            l[r] *= corr[r];
        }
        for (int n = 0; n < {{ dv // 8 }}; ++n)
            for (int e = 0; e < 4; ++e) o[n][e] *= corr[e >> 1];
        for (int n = 0; n < {{ block_n // 8 }}; ++n) {
            for (int e = 0; e < 4; ++e) {
                s[n][e] = exp2f(s[n][e] - base[e >> 1]);
                l[e >> 1] += s[n][e];
            }
        }
        __syncthreads();  // every warp is done with Ks
        if (j0 + {{ block_n }} < key_end) load_k(j0 + {{ block_n }});
        else rf_cp_async_commit();  // an empty group keeps the count of groups in flight fixed
        rf_cp_async_wait_one();     // V(j0) has landed
        __syncthreads();
        for (int kk = 0; kk < {{ block_n // 16 }}; ++kk) {
            unsigned pa[4];
            pa[0] = {{ pack }}(s[2 * kk][0], s[2 * kk][1]);
            pa[1] = {{ pack }}(s[2 * kk][2], s[2 * kk][3]);
            pa[2] = {{ pack }}(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            pa[3] = {{ pack }}(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            for (int n2 = 0; n2 < {{ dv // 16 }}; ++n2) {
                unsigned vb[4];
                rf_ldsm_x4_trans(vb, &Vs[kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)][n2 * 16 + (lane >> 4) * 8]);
                {{ mma }}(o[2 * n2], pa, vb[0], vb[1]);
                {{ mma }}(o[2 * n2 + 1], pa, vb[2], vb[3]);
            }
        }
        __syncthreads();  // every warp is done with Vs
        if (j0 + {{ block_n }} < key_end) load_v(j0 + {{ block_n }});
        else rf_cp_async_commit();
    }
    for (int r = 0; r < 2; ++r) {
        l[r] += rf_shfl_xor(l[r], 1);
        l[r] += rf_shfl_xor(l[r], 2);
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        if (rows[r] < {{ sq }}) {
            const long long o_base = ((long long)bh * {{ sq }} + rows[r]) * {{ dv }};
            for (int n = 0; n < {{ dv // 8 }}; ++n) {
                const int c = n * 8 + t4 * 2;
                out[o_base + c] = {{ store_pre }}(o[n][2 * r] * inv){{ store_post }};
                out[o_base + c + 1] = {{ store_pre }}(o[n][2 * r + 1] * inv){{ store_post }};
            }
        }
    }
}
