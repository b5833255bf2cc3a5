{# The end of the split-K decode kernels (flash_decode.hip, paged_decode.hip), included with their
    context: the waves' merge, then the split's partials and the last block's combine (or, with one
    split, the output). #}
    // The wave's KPW lane groups merge: each rescaled to the wave's maximum, summed by shuffles.
#pragma unroll
    for (int r = 0; r < {{ rows }}; ++r) {
        float mw = m[r];
#pragma unroll
        for (int o = LPK; o < RF_WAVE; o <<= 1) mw = fmaxf(mw, rf_shfl_xor(mw, o));
        const float f = mw == -INFINITY ? 0.0f : exp2f(m[r] - mw);
        float lw = l[r] * f;
#pragma unroll
        for (int o = LPK; o < RF_WAVE; o <<= 1) lw += rf_shfl_xor(lw, o);
#pragma unroll
        for (int x = 0; x < PV * VEC; ++x) {
            float a = acc[r][x] * f;
#pragma unroll
            for (int o = LPK; o < RF_WAVE; o <<= 1) a += rf_shfl_xor(a, o);
            acc[r][x] = a;
        }
        m[r] = mw;
        l[r] = lw;
    }
    // Each wave's rows, relative to the wave's maximum, into its own slice: no wave waits for another.
    if (kg == 0) {
#pragma unroll
        for (int r = 0; r < {{ rows }}; ++r)
#pragma unroll
            for (int i = 0; i < PV; ++i) {
                const int c = kl + i * LPK;
                if (c < NV)
#pragma unroll
                    for (int e = 0; e < VEC; ++e) O[wave][r][c * VEC + e] = acc[r][i * VEC + e];
            }
    }
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < {{ rows }}; ++r) {
            wave_m[wave][r] = m[r];
            wave_l[wave][r] = l[r];
        }
    }
    __syncthreads();
    // The block's (m, l) of row r from its waves', and element (r, c) of its output: the waves' slices rescaled to the
    // block's maximum and summed in wave order (a fixed order: the result does not depend on timing).
    auto block_ml = [&](int r, float& mb, float& lb) {
        mb = -INFINITY;
        for (int w = 0; w < {{ waves }}; ++w) mb = fmaxf(mb, wave_m[w][r]);
        lb = 0.0f;
        if (mb != -INFINITY)
            for (int w = 0; w < {{ waves }}; ++w) lb += wave_l[w][r] * exp2f(wave_m[w][r] - mb);
    };
    auto block_o = [&](int r, int c) {
        float mb = -INFINITY;
        for (int w = 0; w < {{ waves }}; ++w) mb = fmaxf(mb, wave_m[w][r]);
        float o = 0.0f;
        if (mb != -INFINITY)
            for (int w = 0; w < {{ waves }}; ++w) o += O[w][r][c] * exp2f(wave_m[w][r] - mb);
        return o;
    };
{% if splits > 1 %}    for (int t = tid; t < {{ rows * dv }}; t += {{ threads }}) {
        const int r = t / {{ dv }}, c = t % {{ dv }};
        ws[((row0 + r) * {{ splits }} + split) * {{ dv }} + c] = block_o(r, c);
    }
    if (tid < {{ rows }}) {
        float mb, lb;
        block_ml(tid, mb, lb);
        const long long at = {{ stats_at }}LL + ((row0 + tid) * {{ splits }} + split) * 2;
        ws[at] = mb;
        ws[at + 1] = lb;
    }
    // Release: this block's partials are visible to every block before it is counted.
    __threadfence();
    __syncthreads();
    __shared__ unsigned int is_last;
    if (tid == 0) {
        const unsigned int before = atomicAdd(&counters[bkv], 1u);
        is_last = before == (unsigned int)(active - 1) ? 1u : 0u;
        // Every block of this K/V head has counted: back to 0 for the next launch (and a replay).
        if (is_last) counters[bkv] = 0u;
    }
    __syncthreads();
    if (!is_last) return;
    // Acquire: the other blocks' partials, read from L2 (rf_ld_l2) so that no L1 line serves them (volatile loads, one
    // at a time, made the combine ~30 us on an H100).
    __threadfence();
    const float* part = ws;
    // Element (r, c) of the output, each thread its own ({{ (rows * dv + threads - 1) // threads }} a thread): the splits' (m, l, O) merged in split
    // order with a running maximum, m = max m_s, l = sum l_s * exp2(m_s - m), O = sum O_s * exp2(m_s - m), rescaled as m
    // grows; a split that saw no key of the row (m_s = -inf) weighs 0. No step waits for another thread: the loads of
    // eight splits (and of all the thread's elements) are independent and in flight together, one round trip to L2
    // per eight splits. A row no split saw a key of (m = -inf, l = 0) writes zeros, as the other attention kernels do.
    constexpr int RF_PER_THREAD = {{ (rows * dv + threads - 1) // threads }};
#pragma unroll
    for (int i = 0; i < RF_PER_THREAD; ++i) {
        const int t = tid + i * {{ threads }};
        if (t >= {{ rows * dv }}) break;
        const int r = t / {{ dv }}, c = t % {{ dv }};
        const long long at = {{ stats_at }}LL + (row0 + r) * {{ splits * 2 }};
        const long long po = (row0 + r) * {{ splits * dv }} + c;
        float mr = -INFINITY, lr = 0.0f, o = 0.0f;
#pragma unroll 8
        for (int s = 0; s < active; ++s) {
            const float ms = rf_ld_l2(part + at + 2 * s), ls = rf_ld_l2(part + at + 2 * s + 1);
            const float os = rf_ld_l2(part + po + (long long)s * {{ dv }});
            const float mn = fmaxf(mr, ms);
            const float a = mr == -INFINITY ? 0.0f : exp2f(mr - mn);
            const float b = ms == -INFINITY ? 0.0f : exp2f(ms - mn);
            lr = lr * a + ls * b;
            o = o * a + os * b;
            mr = mn;
        }
        const float inv = lr > 0.0f ? 1.0f / lr : 0.0f;
        out[(row0 + r) * {{ dv }} + c] = {{ store_pre }}(o * inv){{ store_post }};
    }
{% else %}    for (int t = tid; t < {{ rows * dv }}; t += {{ threads }}) {
        const int r = t / {{ dv }}, c = t % {{ dv }};
        float mb, lr;
        block_ml(r, mb, lr);
        const float inv = lr > 0.0f ? 1.0f / lr : 0.0f;
        out[(row0 + r) * {{ dv }} + c] = {{ store_pre }}(block_o(r, c) * inv){{ store_post }};
    }
{% endif %}}
