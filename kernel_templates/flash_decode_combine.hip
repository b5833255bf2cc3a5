// Flash-decoding, kernel 2 of 2 (combine): {{ b }} x {{ hq }} x {{ sq }} output rows of {{ dv }}, each from {{ splits }} splits.
// A block takes one row: m = max of the splits' maxima, l = sum of l_s * exp2(m_s - m), and the output is
// sum of O_s * exp2(m_s - m) / l, stored in its dtype. A split that saw no key has m_s = -inf and weighs 0; a row
// that no split saw a key of (m = -inf) writes zeros, as the other attention kernels do.
extern "C" __global__ void __launch_bounds__({{ threads }}) {{ entry }}(const float* __restrict__ ws, {{ ctype }}* __restrict__ out) {
    const long long row = blockIdx.x;
    const float* stats = ws + {{ stats_at }}LL + row * {{ splits * 2 }};
    const float* part = ws + row * {{ splits * dv }};
    float m = -INFINITY;
    for (int s = 0; s < {{ splits }}; ++s) m = fmaxf(m, stats[2 * s]);
    float l = 0.0f;
    if (m != -INFINITY)
        for (int s = 0; s < {{ splits }}; ++s) l += stats[2 * s + 1] * exp2f(stats[2 * s] - m);
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int c = threadIdx.x; c < {{ dv }}; c += {{ threads }}) {
        float o = 0.0f;
        if (m != -INFINITY)
            for (int s = 0; s < {{ splits }}; ++s) o += part[(long long)s * {{ dv }} + c] * exp2f(stats[2 * s] - m);
        out[row * {{ dv }} + c] = {{ store_pre }}(o * inv){{ store_post }};
    }
}
