// LayerNorm over the last axis ({{ d }}), {{ rows }} rows, eps {{ eps }}: one block per row, two passes.
extern "C" __global__ void __launch_bounds__(RF_BLOCK) {{ entry }}(const {{ ctype }}* __restrict__ x, const {{ wtype }}* __restrict__ w, const {{ wtype }}* __restrict__ b, {{ ctype }}* __restrict__ y) {
    __shared__ float scratch[RF_BLOCK / RF_WAVE];
    const long long base = (long long)blockIdx.x * {{ d }};
    float s = 0.0f;
    for (int j = threadIdx.x; j < {{ d }}; j += RF_BLOCK) s += {{ load_pre }}x[base + j]{{ load_post }};
    const float mean = rf_block_sum(s, scratch) / {{ d }}.0f;
    float v = 0.0f;
    for (int j = threadIdx.x; j < {{ d }}; j += RF_BLOCK) {
        const float c = {{ load_pre }}x[base + j]{{ load_post }} - mean;
        v += c * c;
    }
    const float inv = rsqrtf(rf_block_sum(v, scratch) / {{ d }}.0f + {{ eps_f }});
    for (int j = threadIdx.x; j < {{ d }}; j += RF_BLOCK) {
        const float c = {{ load_pre }}x[base + j]{{ load_post }} - mean;
        y[base + j] = {{ store_pre }}(c * inv * {{ w_pre }}w[j]{{ w_post }} + {{ w_pre }}b[j]{{ w_post }}){{ store_post }};
    }
}
