// Safe softmax over an axis of {{ len }} (stride {{ inner }}), {{ rows }} rows: one block per row.
// A row whose inputs are all -inf gives zeros.
extern "C" __global__ void __launch_bounds__(RF_BLOCK) {{ entry }}(const {{ ctype }}* __restrict__ x, {{ ctype }}* __restrict__ y) {
    RF_GRID_ENTER();
    __shared__ float scratch[RF_BLOCK / RF_WAVE];
    const long long row = blockIdx.x;
    const long long base = (row / {{ inner }}) * {{ row_span }}LL + (row % {{ inner }});
    float m = -INFINITY;
    for (int j = threadIdx.x; j < {{ len }}; j += RF_BLOCK) m = fmaxf(m, {{ load_pre }}x[base + (long long)j * {{ inner }}]{{ load_post }});
    m = rf_block_max(m, scratch);
    if (m == -INFINITY) {
        for (int j = threadIdx.x; j < {{ len }}; j += RF_BLOCK) y[base + (long long)j * {{ inner }}] = {{ store_pre }}0.0f{{ store_post }};
        return;
    }
    float s = 0.0f;
    for (int j = threadIdx.x; j < {{ len }}; j += RF_BLOCK) s += expf({{ load_pre }}x[base + (long long)j * {{ inner }}]{{ load_post }} - m);
    s = rf_block_sum(s, scratch);
    const float inv = 1.0f / s;
    for (int j = threadIdx.x; j < {{ len }}; j += RF_BLOCK) {
        const long long at = base + (long long)j * {{ inner }};
        y[at] = {{ store_pre }}(expf({{ load_pre }}x[at]{{ load_post }} - m) * inv){{ store_post }};
    }
}
