// RMSNorm over the last axis ({{ d }}), {{ rows }} rows, eps {{ eps }}: one block per row.
extern "C" __global__ void __launch_bounds__(RF_BLOCK) {{ entry }}(const {{ ctype }}* __restrict__ x, const {{ wtype }}* __restrict__ w, {{ ctype }}* __restrict__ y) {
    __shared__ float scratch[RF_BLOCK / RF_WAVE];
    const long long base = (long long)blockIdx.x * {{ d }};
    float s = 0.0f;
    for (int j = threadIdx.x; j < {{ d }}; j += RF_BLOCK) {
        const float v = {{ load_pre }}x[base + j]{{ load_post }};
        s += v * v;
    }
    const float inv = rsqrtf(rf_block_sum(s, scratch) / {{ d }}.0f + {{ eps_f }});
    for (int j = threadIdx.x; j < {{ d }}; j += RF_BLOCK)
        y[base + j] = {{ store_pre }}({{ load_pre }}x[base + j]{{ load_post }} * inv * {{ w_pre }}w[j]{{ w_post }}){{ store_post }};
}
