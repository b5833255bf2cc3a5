// {{ what }}: {{ n }} elements.
extern "C" __global__ void __launch_bounds__(256) {{ entry }}(const {{ ctype }}* __restrict__ src, {{ ctype }}* __restrict__ dst) {
    RF_GRID_ENTER();
    const long long i = (long long)blockIdx.x * 256 + threadIdx.x;
    if (i >= {{ n }}LL) return;
    long long r = i, s = {{ src_base }}LL, d = {{ dst_base }}LL;
{% for ax in axes %}    { const long long c = r % {{ ax.size }}LL; r /= {{ ax.size }}LL; s += c * {{ ax.src }}LL; d += c * {{ ax.dst }}LL; }
{% endfor %}    dst[d] = src[s];
}
