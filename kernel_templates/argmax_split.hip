// Argmax over axis of length {{ len }} (inner stride {{ inner }}), {{ rows }} rows, each row split over {{ splits }} blocks of {{ chunk }}
// elements (a long row in one block is latency-bound: 49152 logits took 32 us on an H100). Block (s, row) scans its
// elements s·{{ chunk }} + t, + {{ threads }}, ... keeping the first of the largest, merges its threads in a fixed tree
// (the lower index winning ties), writes its (value, index) to the workspace and counts itself in the row's counter
// (release fence first). The block that counts last (acquire fence) merges the splits in split order: a split covers
// lower indices than the next, so ties keep the first index whatever block finished last. It puts the counter back
// to 0 for the next launch (the counters are zeroed once, when allocated, never poisoned). A NaN beats every number
// and the first NaN wins (torch.argmax). Indices as i32.
extern "C" __global__ void __launch_bounds__({{ threads }}) {{ entry }}(const {{ ctype }}* __restrict__ x, float* __restrict__ ws, unsigned int* __restrict__ counters, int* __restrict__ out) {
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
    const int split = blockIdx.x;
    const long long row = blockIdx.y;
    const long long base = (row / {{ inner }}LL) * {{ len * inner }}LL + row % {{ inner }}LL;
    const int tid = threadIdx.x;
    const int lo = split * {{ chunk }}, hi = min(lo + {{ chunk }}, {{ len }});
    float b = 0.0f;
    int bj = -1;
    for (int j = lo + tid; j < hi; j += {{ threads }}) {
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
    // Every split is non-empty (splits = ceil(len / chunk)), so its index is a real one.
    if (tid == 0) {
        ws[(row * {{ splits }} + split) * 2] = best_v[0];
        ws[(row * {{ splits }} + split) * 2 + 1] = __uint_as_float((unsigned)best_i[0]);
    }
    // Release: this block's partial is visible to every block before it is counted.
    __threadfence();
    __syncthreads();
    __shared__ unsigned int is_last;
    if (tid == 0) {
        const unsigned int before = atomicAdd(&counters[row], 1u);
        is_last = before == {{ splits - 1 }}u ? 1u : 0u;
        // Every split of this row has counted: back to 0 for the next launch (and a replay).
        if (is_last) counters[row] = 0u;
    }
    __syncthreads();
    if (!is_last) return;
    // Acquire: the other blocks' partials, read from L2 (rf_ld_l2) so that no L1 line serves them.
    __threadfence();
    if (tid == 0) {
        float bv = 0.0f;
        int bi = -1;
        for (int s = 0; s < {{ splits }}; ++s) {
            const float v = rf_ld_l2(ws + (row * {{ splits }} + s) * 2);
            const int j = (int)__float_as_uint(rf_ld_l2(ws + (row * {{ splits }} + s) * 2 + 1));
            if (better(v, j, bv, bi)) { bv = v; bi = j; }
        }
        out[row] = bi;
    }
}
