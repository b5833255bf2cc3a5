// Rotary embedding (rotate-half) over [.., {{ s }}, {{ d }}], theta {{ theta }}, {% if positions %}positions read from `positions` (i32 [{{ s }}]){% else %}position offset {{ offset_text }}{% endif %}.
// Angles in double: positions times frequencies reach thousands of radians, past f32's precision.
{% if factors %}// Llama 3 rope scaling: each pair's frequency divided by its factor (in constant memory: a
// local array indexed by the thread's pair would cost a stack frame).
__constant__ double {{ entry }}_factors[{{ half }}] = { {% for f in factors %}{{ f }}{% if not loop.last %}, {% endif %}{% endfor %} };
{% endif %}extern "C" __global__ void __launch_bounds__(256) {{ entry }}(const {{ ctype }}* __restrict__ x, {% if positions %}const int* __restrict__ positions, {% endif %}{{ ctype }}* __restrict__ y) {
    const long long t = (long long)blockIdx.x * 256 + threadIdx.x;
    if (t >= {{ n }}LL) return;
    const long long row = t / {{ half }};
    const int i = (int)(t % {{ half }});
{% if positions %}    const double pos = (double)positions[row % {{ s }}];
{% else %}    const double pos = (double)(row % {{ s }}) + {{ offset }};
{% endif %}{% if factors %}    const double angle = pos * pow({{ theta }}, -2.0 * i / {{ d }}.0) / {{ entry }}_factors[i];
{% else %}    const double angle = pos * pow({{ theta }}, -2.0 * i / {{ d }}.0);
{% endif %}    const double sn = sin(angle), cs = cos(angle);
    const double a = {{ load_pre }}x[row * {{ d }} + i]{{ load_post }}, b = {{ load_pre }}x[row * {{ d }} + i + {{ half }}]{{ load_post }};
    y[row * {{ d }} + i] = {{ store_pre }}(float)(a * cs - b * sn){{ store_post }};
    y[row * {{ d }} + i + {{ half }}] = {{ store_pre }}(float)(b * cs + a * sn){{ store_post }};
}
