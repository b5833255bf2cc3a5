// GEMM on CUDA cores: {{ p.batch }} × [{{ p.m }}, {{ p.k }}] · [{{ p.k }}, {{ p.n }}], operands read in place through
// their views; {{ p.what }}. 64×64 output tiles per block of 16×16 threads, each thread 4×4
// outputs; K in steps of 16 through shared memory; f32 accumulation.
RF_INLINE long long rf_a_at(long long bz, long long m, long long k) { return {{ p.a_at }}; }
RF_INLINE long long rf_b_at(long long bz, long long k, long long n) { return {{ p.b_at }}; }
RF_INLINE long long rf_c_at(long long bz, long long m, long long n) { return {{ p.c_at }}; }
{% for x in p.extra_at %}RF_INLINE long long rf_x{{ x[0] }}_at(long long bz, long long m, long long n) { return {{ x[1] }}; }
{% endfor %}extern "C" __global__ void __launch_bounds__(256) {{ entry }}(const {{ p.a_t }}* __restrict__ A, const {{ p.b_t }}* __restrict__ B, {% for e in p.extras %}const {{ e.ctype }}* __restrict__ in{{ e.index }}, {% endfor %}{{ p.c_t }}* __restrict__ C) {
    __shared__ float As[16][64 + 1];
    __shared__ float Bs[16][64 + 1];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int row0 = blockIdx.y * 64, col0 = blockIdx.x * 64;
    const long long bz = blockIdx.z;
    float acc[4][4];
    for (int y = 0; y < 4; ++y)
        for (int x = 0; x < 4; ++x) acc[y][x] = 0.0f;
    for (int k0 = 0; k0 < {{ p.k }}; k0 += 16) {
        for (int t = threadIdx.x; t < 64 * 16; t += 256) {
            const int r = t / 16, c = t % 16, gr = row0 + r, gc = k0 + c;
            As[c][r] = (gr < {{ p.m }} && gc < {{ p.k }}) ? {{ p.a_pre }}A[rf_a_at(bz, gr, gc)]{{ p.a_post }} : 0.0f;
        }
        for (int t = threadIdx.x; t < 16 * 64; t += 256) {
            const int r = t / 64, c = t % 64, gr = k0 + r, gc = col0 + c;
            Bs[r][c] = (gr < {{ p.k }} && gc < {{ p.n }}) ? {{ p.b_pre }}B[rf_b_at(bz, gr, gc)]{{ p.b_post }} : 0.0f;
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
            if (row >= {{ p.m }} || col >= {{ p.n }}) continue;
            const float acc_v = acc[y][x];
{% if p.epilogue %}            const float acc_r = {{ p.acc }};
{% endif %}{% for e in p.extras %}            const {{ e.vtype }} x{{ e.index }} = {{ e.load }};
{% endfor %}{% for l in p.lines %}            {{ l }}
{% endfor %}            C[rf_c_at(bz, row, col)] = {{ p.store }};
        }
    }
}
