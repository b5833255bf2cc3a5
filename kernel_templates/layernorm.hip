{% if per_wave %}// LayerNorm over the last axis ({{ d }}), {{ rows }} rows, eps {{ eps }}: one wave per row, its {{ per_lane }} values
// per lane held in registers (x read once), mean and variance by wave shuffles; RF_BLOCK / RF_WAVE rows a block.
extern "C" __global__ void __launch_bounds__(RF_BLOCK) {{ entry }}(const {{ ctype }}* __restrict__ x, const {{ wtype }}* __restrict__ w, const {{ wtype }}* __restrict__ b, {{ ctype }}* __restrict__ y) {
    RF_GRID_ENTER();
    const int lane = threadIdx.x % RF_WAVE;
    const long long row = (long long)blockIdx.x * (RF_BLOCK / RF_WAVE) + threadIdx.x / RF_WAVE;
    if (row >= {{ rows }}LL) return;  // the whole wave: its shuffles stay among live lanes
    const long long base = row * {{ d }};
    float v[{{ per_lane }}];
    float s = 0.0f;
    #pragma unroll
    for (int i = 0; i < {{ per_lane }}; ++i) {
        const int j = lane + i * RF_WAVE;
        v[i] = j < {{ d }} ? {{ load_pre }}x[base + j]{{ load_post }} : 0.0f;
        s += v[i];
    }
    const float mean = rf_wave_sum(s) / {{ d }}.0f;
    float q = 0.0f;
    #pragma unroll
    for (int i = 0; i < {{ per_lane }}; ++i) {
        const int j = lane + i * RF_WAVE;
        const float c = v[i] - mean;
        q += j < {{ d }} ? c * c : 0.0f;
    }
    const float inv = rsqrtf(rf_wave_sum(q) / {{ d }}.0f + {{ eps_f }});
    #pragma unroll
    for (int i = 0; i < {{ per_lane }}; ++i) {
        const int j = lane + i * RF_WAVE;
        if (j < {{ d }}) y[base + j] = {{ store_pre }}((v[i] - mean) * inv * {{ w_pre }}w[j]{{ w_post }} + {{ w_pre }}b[j]{{ w_post }}){{ store_post }};
    }
}
{%- else %}// LayerNorm over the last axis ({{ d }}), {{ rows }} rows, eps {{ eps }}: one block per row, two passes.
extern "C" __global__ void __launch_bounds__(RF_BLOCK) {{ entry }}(const {{ ctype }}* __restrict__ x, const {{ wtype }}* __restrict__ w, const {{ wtype }}* __restrict__ b, {{ ctype }}* __restrict__ y) {
    RF_GRID_ENTER();
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
{%- endif %}
