// {{ what }}: {{ n }} elements of {{ out_shape }}{% if args %}, reading {% for a in args %}{{ a.shape }}{% if not loop.last %}, {% endif %}{% endfor %}{% endif %}.
extern "C" __global__ void __launch_bounds__(256) {{ entry }}({% for a in args %}const {{ a.ctype }}* __restrict__ in{{ loop.index0 }}, {% endfor %}{{ out_ctype }}* __restrict__ out) {
    RF_GRID_ENTER();
    const long long i = (long long)blockIdx.x * 256 + threadIdx.x;
    if (i >= {{ n }}LL) return;
{% if broadcast %}    long long r = i{% for a in args %}, o{{ loop.index0 }} = 0{% endfor %};
{% for ax in axes %}    { const long long c = r % {{ ax.size }}LL; r /= {{ ax.size }}LL;{% for s in ax.strides %}{% if s != 0 %} o{{ loop.index0 }} += c * {{ s }}LL;{% endif %}{% endfor %} }
{% endfor %}{% endif %}{% for a in args %}    const {{ a.vtype }} x{{ loop.index0 }} = {{ a.load }};
{% endfor %}{% for l in lines %}    {{ l }}
{% endfor %}    out[i] = {{ store }};
}
