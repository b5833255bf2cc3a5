// Flash-decoding, kernel 2 of 2 (combine): {{ b }} x {{ hq }} x {{ sq }} output rows of {{ dv }}, each from {{ splits }} splits.
// A block takes one row: m = max of the splits' maxima, l = sum of l_s * exp2(m_s - m) (every wave computes both,
// lanes over the splits, reduced by shuffles; the first wave keeps the splits' weights in shared memory), and the
// output is sum of O_s * exp2(m_s - m) / l: {{ slices }} slice(s) of the splits per column, each thread summing its
// slice with several loads in flight, then the slices summed. Stored in its dtype. A split that saw no key has
// m_s = -inf and weighs 0; a row that no split saw a key of (m = -inf) writes zeros, as the other attention kernels do.
extern "C" __global__ void __launch_bounds__({{ threads }}) {{ entry }}(const float* __restrict__ ws, {{ ctype }}* __restrict__ out) {
    __shared__ float weight[{{ splits }}];
    __shared__ float slice_sum[{{ slices }}][{{ dv }}];
    const long long row = blockIdx.x;
    const int tid = threadIdx.x, lane = tid % RF_WAVE;
    const float* stats = ws + {{ stats_at }}LL + row * {{ splits * 2 }};
    const float* part = ws + row * {{ splits * dv }};
    float m = -INFINITY;
    for (int s = lane; s < {{ splits }}; s += RF_WAVE) m = fmaxf(m, stats[2 * s]);
    for (int o = RF_WAVE / 2; o > 0; o >>= 1) m = fmaxf(m, rf_shfl_xor(m, o));
    float l = 0.0f;
    for (int s = lane; s < {{ splits }}; s += RF_WAVE) {
        const float w = m == -INFINITY ? 0.0f : exp2f(stats[2 * s] - m);
        if (tid == lane) weight[s] = w;
        l += stats[2 * s + 1] * w;
    }
    for (int o = RF_WAVE / 2; o > 0; o >>= 1) l += rf_shfl_xor(l, o);
    __syncthreads();  // every split's weight is in shared memory
    for (int t = tid; t < {{ slices * dv }}; t += {{ threads }}) {
        const int sl = t / {{ dv }}, c = t % {{ dv }};
        float o = 0.0f;
#pragma unroll {{ unroll }}
        for (int s = sl; s < {{ splits }}; s += {{ slices }}) o += part[(long long)s * {{ dv }} + c] * weight[s];
        slice_sum[sl][c] = o;
    }
    __syncthreads();  // every slice is summed
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int c = tid; c < {{ dv }}; c += {{ threads }}) {
        float o = 0.0f;
        for (int sl = 0; sl < {{ slices }}; ++sl) o += slice_sum[sl][c];
        out[row * {{ dv }} + c] = {{ store_pre }}(o * inv){{ store_post }};
    }
}
