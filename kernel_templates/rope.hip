{% import "rope_parts.hip" as rope_parts -%}
// Rotary embedding (rotate-half) over [.., {{ s }}, {{ d }}], theta {{ theta }}{% if factors %} with Llama 3 factors{% endif %}, {% if positions %}positions read from `positions` (i32 [{{ s }}]){% else %}position offset {{ offset_text }}{% endif %}.
// Angles in double (positions times frequencies reach thousands of radians, past f32's
// precision); the inverse frequencies are a host-computed table, sin/cos as rope_parts.hip says.
{{ rope_parts.table(entry ~ "_inv_freq", inv_freq) }}
{{ rope_parts.sincos(entry ~ "_sincos") }}
extern "C" __global__ void __launch_bounds__(256) {{ entry }}(const {{ ctype }}* __restrict__ x, {% if positions %}const int* __restrict__ positions, {% endif %}{{ ctype }}* __restrict__ y) {
    RF_GRID_ENTER();
    const long long t = (long long)blockIdx.x * 256 + threadIdx.x;
    if (t >= {{ n }}LL) return;
    const long long row = t / {{ half }};
    const int i = (int)(t % {{ half }});
{% if positions %}    const double pos = (double)positions[row % {{ s }}];
{% else %}    const double pos = (double)(row % {{ s }}) + {{ offset }};
{% endif %}    float sn, cs;
    {{ entry }}_sincos(pos * {{ entry }}_inv_freq[i], &sn, &cs);
    const float a = {{ load_pre }}x[row * {{ d }} + i]{{ load_post }}, b = {{ load_pre }}x[row * {{ d }} + i + {{ half }}]{{ load_post }};
    y[row * {{ d }} + i] = {{ store_pre }}(a * cs - b * sn){{ store_post }};
    y[row * {{ d }} + i + {{ half }}] = {{ store_pre }}(b * cs + a * sn){{ store_post }};
}
