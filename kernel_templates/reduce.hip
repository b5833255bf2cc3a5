// {{ op }} over {{ count }} elements for each of {{ n }} outputs: one thread per output.
extern "C" __global__ void __launch_bounds__(256) {{ entry }}(const {{ ctype }}* __restrict__ x, {{ ctype }}* __restrict__ y) {
    RF_GRID_ENTER();
    const long long o = (long long)blockIdx.x * 256 + threadIdx.x;
    if (o >= {{ n }}LL) return;
    long long r = o, base = 0;
{% for ax in kept %}    { const long long c = r % {{ ax.size }}LL; r /= {{ ax.size }}LL; base += c * {{ ax.stride }}LL; }
{% endfor %}    float acc = {{ init }};
    for (long long t = 0; t < {{ count }}LL; ++t) {
        long long q = t, at = base;
{% for ax in reduced %}        { const long long c = q % {{ ax.size }}LL; q /= {{ ax.size }}LL; at += c * {{ ax.stride }}LL; }
{% endfor %}        const float v = {{ load_pre }}x[at]{{ load_post }};
        acc = {{ combine }};
    }
    y[o] = {{ store_pre }}({{ finish }}){{ store_post }};
}
