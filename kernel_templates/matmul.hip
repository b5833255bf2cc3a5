// Batched matmul: {{ batch }} × [{{ m }}, {{ k }}] · [{{ k }}, {{ n }}]. {{ tile }}×{{ tile }} output tiles per block of
// 16×16 threads, each thread 4×4 outputs; K in steps of 16 through shared memory; f32 accumulation.
extern "C" __global__ void __launch_bounds__(256) {{ entry }}(const {{ a_t }}* __restrict__ A, const {{ b_t }}* __restrict__ B, {{ c_t }}* __restrict__ C) {
    RF_GRID_ENTER();
    __shared__ float As[16][{{ tile }} + 1];
    __shared__ float Bs[16][{{ tile }} + 1];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int row0 = blockIdx.y * {{ tile }}, col0 = blockIdx.x * {{ tile }};
    const long long bz = blockIdx.z;
    long long a_off = 0, b_off = 0;
    {
        long long r = bz;
{% for ax in batch_axes %}        { const long long c = r % {{ ax.size }}LL; r /= {{ ax.size }}LL; a_off += c * {{ ax.a }}LL; b_off += c * {{ ax.b }}LL; }
{% endfor %}    }
    float acc[4][4];
    for (int y = 0; y < 4; ++y)
        for (int x = 0; x < 4; ++x) acc[y][x] = 0.0f;
    for (int k0 = 0; k0 < {{ k }}; k0 += 16) {
        for (int t = threadIdx.x; t < {{ tile }} * 16; t += 256) {
            const int r = t / 16, c = t % 16, gr = row0 + r, gc = k0 + c;
            As[c][r] = (gr < {{ m }} && gc < {{ k }}) ? {{ a_load_pre }}A[a_off + (long long)gr * {{ k }} + gc]{{ a_load_post }} : 0.0f;
        }
        for (int t = threadIdx.x; t < 16 * {{ tile }}; t += 256) {
            const int r = t / {{ tile }}, c = t % {{ tile }}, gr = k0 + r, gc = col0 + c;
            Bs[r][c] = (gr < {{ k }} && gc < {{ n }}) ? {{ b_load_pre }}B[b_off + (long long)gr * {{ n }} + gc]{{ b_load_post }} : 0.0f;
        }
        __syncthreads();
        for (int kk = 0; kk < 16; ++kk) {
            float a[4], b[4];
            for (int y = 0; y < 4; ++y) a[y] = As[kk][ty + 16 * y];
            for (int x = 0; x < 4; ++x) b[x] = Bs[kk][tx + 16 * x];
            for (int y = 0; y < 4; ++y)
                for (int x = 0; x < 4; ++x) acc[y][x] += a[y] * b[x];
        }
        __syncthreads();
    }
    for (int y = 0; y < 4; ++y) {
        for (int x = 0; x < 4; ++x) {
            const int row = row0 + ty + 16 * y, col = col0 + tx + 16 * x;
            if (row >= {{ m }} || col >= {{ n }}) continue;
            const long long i = bz * {{ mn }}LL + (long long)row * {{ n }} + col;
            const float acc_v = acc[y][x];
            C[i] = {{ store }};
        }
    }
}
