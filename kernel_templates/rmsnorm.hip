{% if per_wave %}// RMSNorm over the last axis ({{ d }}), {{ rows }} rows, eps {{ eps }}: one wave per row, its {{ per_lane }} values
// per lane held in registers (x read once), the mean square by wave shuffles; RF_BLOCK / RF_WAVE rows a block.
extern "C" __global__ void __launch_bounds__(RF_BLOCK) {{ entry }}(const {{ ctype }}* __restrict__ x, const {{ wtype }}* __restrict__ w, {{ ctype }}* __restrict__ y) {
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
        s += v[i] * v[i];
    }
    const float inv = rsqrtf(rf_wave_sum(s) / {{ d }}.0f + {{ eps_f }});
    #pragma unroll
    for (int i = 0; i < {{ per_lane }}; ++i) {
        const int j = lane + i * RF_WAVE;
        if (j < {{ d }}) y[base + j] = {{ store_pre }}(v[i] * inv * {{ w_pre }}w[j]{{ w_post }}){{ store_post }};
    }
}
{%- else %}// RMSNorm over the last axis ({{ d }}), {{ rows }} rows, eps {{ eps }}: one block per row.
extern "C" __global__ void __launch_bounds__(RF_BLOCK) {{ entry }}(const {{ ctype }}* __restrict__ x, const {{ wtype }}* __restrict__ w, {{ ctype }}* __restrict__ y) {
    RF_GRID_ENTER();
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
{%- endif %}
