// Argmax over axis of length {{ len }} (inner stride {{ inner }}), {{ rows }} rows: one block per row. Each thread scans
// the elements t, t + {{ threads }}, ... keeping the first of the largest; the block then merges pairs in a fixed
// tree, the lower index winning ties, so the result is the first index of the maximum whatever the schedule.
// A NaN beats every number and the first NaN wins (torch.argmax). Indices as i32.
extern "C" __global__ void __launch_bounds__({{ threads }}) {{ entry }}(const {{ ctype }}* __restrict__ x, int* __restrict__ out) {
    RF_GRID_ENTER();
    // Whether (v, j) beats (b, bj): no candidate yet (bj < 0), a NaN over a number, a larger
    // number, or the same value at a lower index.
    auto better = [](float v, int j, float b, int bj) {
        if (bj < 0) return true;
        const bool vn = v != v, bn = b != b;
        if (vn != bn) return vn;
        if (!vn && v != b) return v > b;
        return j < bj;
    };
    __shared__ float best_v[{{ threads }}];
    __shared__ int best_i[{{ threads }}];
    const long long row = blockIdx.x;
    const long long base = (row / {{ inner }}LL) * {{ len * inner }}LL + row % {{ inner }}LL;
    const int tid = threadIdx.x;
    float b = 0.0f;
    int bj = -1;
    for (int j = tid; j < {{ len }}; j += {{ threads }}) {
        const float v = {{ load_pre }}x[base + (long long)j * {{ inner }}LL]{{ load_post }};
        if (better(v, j, b, bj)) { b = v; bj = j; }
    }
    best_v[tid] = b;
    best_i[tid] = bj;
    __syncthreads();
    for (int s = {{ threads }} / 2; s > 0; s >>= 1) {
        if (tid < s) {
            const float v = best_v[tid + s];
            const int j = best_i[tid + s];
            if (j >= 0 && better(v, j, best_v[tid], best_i[tid])) {
                best_v[tid] = v;
                best_i[tid] = j;
            }
        }
        __syncthreads();
    }
    if (tid == 0) out[row] = best_i[0];
}
