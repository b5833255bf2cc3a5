{% import "rope_parts.hip" as rope_parts -%}
// Cache write, in place: values [{{ values_shape }}] into the state [{{ state_shape }}] at start..start + {{ len }} of axis {{ axis }}
// (start read from `start`). The window must lie in 0..{{ size }}: otherwise no element is written and the first thread
// records the start in `status` (position 0, complemented, then the value), which the runtime turns into the
// interpreter's error after the run. One thread per value element ({{ n }}; one thread checks an empty write).
{% if rope %}// The values are rotated as they are written: rope (rotate-half) over [.., {{ rope.s }}, {{ rope.d }}] with theta {{ rope.theta }} at the
// positions `positions` holds (i32 [{{ rope.s }}]), pairs (c, c + {{ rope.half }}) of a row; angles as the rope kernel's (rope_parts.hip).
{{ rope_parts.table(entry ~ "_inv_freq", rope.inv_freq) }}
{{ rope_parts.sincos(entry ~ "_sincos") }}
{% endif %}extern "C" __global__ void __launch_bounds__(256) {{ entry }}(const {{ ctype }}* __restrict__ values, const int* __restrict__ start, {% if rope %}const int* __restrict__ positions, {% endif %}unsigned long long* __restrict__ status, {{ ctype }}* __restrict__ state) {
    RF_GRID_ENTER();
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
{% if rope %}    const long long vrow = i / {{ rope.d }}LL;
    const int c = (int)(i % {{ rope.d }}LL), p = c % {{ rope.half }};
    const double pos = (double)positions[vrow % {{ rope.s }}LL];
    float sn, cs;
    {{ entry }}_sincos(pos * {{ entry }}_inv_freq[p], &sn, &cs);
    const float a = {{ load_pre }}values[vrow * {{ rope.d }}LL + p]{{ load_post }}, b = {{ load_pre }}values[vrow * {{ rope.d }}LL + p + {{ rope.half }}]{{ load_post }};
    const float r = c < {{ rope.half }} ? a * cs - b * sn : b * cs + a * sn;
    state[(outer * {{ size }}LL + at + row) * {{ inner }}LL + inner] = {{ store_pre }}r{{ store_post }};
{% else %}    state[(outer * {{ size }}LL + at + row) * {{ inner }}LL + inner] = values[i];
{% endif %}
}
