// Cache write, in place: values [{{ values_shape }}] into the state [{{ state_shape }}] at start..start + {{ len }} of axis {{ axis }}
// (start read from `start`). The window must lie in 0..{{ size }}: otherwise no element is written and the first thread
// records the start in `status` (position 0, complemented, then the value), which the runtime turns into the
// interpreter's error after the run. One thread per value element ({{ n }}; one thread checks an empty write).
extern "C" __global__ void __launch_bounds__(256) {{ entry }}(const {{ ctype }}* __restrict__ values, const int* __restrict__ start, unsigned long long* __restrict__ status, {{ ctype }}* __restrict__ state) {
    const long long i = (long long)blockIdx.x * 256 + threadIdx.x;
    if (i >= {{ threads }}LL) return;
    const long long at = (long long)start[0];
    if (at < 0 || at > {{ max_start }}LL) {
        if (i == 0) {
            atomicMax(&status[0], ~0ull);
            status[1] = (unsigned long long)at;
        }
        return;
    }
    if (i >= {{ n }}LL) return;
    // i splits into (outer, row along the axis, inner) of the values; the state's row is at + row.
    const long long inner = i % {{ inner }}LL, row = (i / {{ inner }}LL) % {{ len }}LL, outer = i / {{ inner * len }}LL;
    state[(outer * {{ size }}LL + at + row) * {{ inner }}LL + inner] = values[i];
}
