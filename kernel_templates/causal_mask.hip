// CausalMask [{{ sq }}, {{ sk }}]: true where k <= q + offset. The offset is the graph's, clamped
// to [-{{ sq }}, {{ sk }}]: the same mask, and q + offset cannot overflow.
extern "C" __global__ void __launch_bounds__(256) {{ entry }}(unsigned char* __restrict__ out) {
    RF_GRID_ENTER();
    const long long i = (long long)blockIdx.x * 256 + threadIdx.x;
    if (i >= {{ n }}LL) return;
    const long long q = i / {{ sk }}LL, k = i % {{ sk }}LL;
    out[i] = k <= q + {{ offset }} ? 1 : 0;
}
