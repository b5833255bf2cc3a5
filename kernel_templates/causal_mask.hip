// CausalMask [{{ sq }}, {{ sk }}]: true where k <= q + ({{ offset }}).
extern "C" __global__ void __launch_bounds__(256) {{ entry }}(unsigned char* __restrict__ out) {
    const long long i = (long long)blockIdx.x * 256 + threadIdx.x;
    if (i >= {{ sq * sk }}LL) return;
    const long long q = i / {{ sk }}, k = i % {{ sk }};
    out[i] = k <= q + ({{ offset }}LL) ? 1 : 0;
}
