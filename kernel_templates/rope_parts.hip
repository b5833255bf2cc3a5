{#- Rope's shared parts, imported by every template that rotates (rope, cache_write,
    flash_decode). The angle of pair i at position p is p·inv_freq[i]: the inverse frequencies
    (theta^(−2i/d) divided by the Llama 3 factors) come from the host in f64 (codegen, with
    `ir::rope_inv_freq`, the interpreter's own values) as a constant table, so a kernel does one
    double multiply per element instead of a double pow, sin and cos (a ~8000-cycle dependent
    chain). Angles reach thousands of radians, past f32's precision: the reduction to a quadrant
    and a remainder in [−π/4, π/4] stays in double (one multiply, one rint, one multiply-add),
    then f32 polynomials give sin and cos of the small remainder. No library sin/cos: their
    slow path for large arguments (a stack frame on NVIDIA) is never compiled in. -#}
{% macro table(name, inv_freq) -%}
__constant__ double {{ name }}[{{ inv_freq | length }}] = { {% for f in inv_freq %}{{ f }}{% if not loop.last %}, {% endif %}{% endfor %} };
{%- endmacro %}
{% macro sincos(name) -%}
// sin and cos of a rope angle: k = rint(angle·2/π) and r = angle − k·π/2 in double (|r| ≤ π/4),
// then the minimax polynomials of Cephes' sinf/cosf on r (about 1 ulp of f32) and the quadrant
// k mod 4 picks and signs them. A NaN or infinite angle gives NaN.
RF_INLINE void {{ name }}(double angle, float* sn, float* cs) {
    const double k = rint(angle * 0.63661977236758134308);
    const float r = (float)(angle - k * 1.57079632679489661923);
    const float z = r * r;
    const float s = r + r * z * ((-1.9515295891e-4f * z + 8.3321608736e-3f) * z - 1.6666654611e-1f);
    const float c = 1.0f - 0.5f * z + z * z * ((2.443315711809948e-5f * z - 1.388731625493765e-3f) * z + 4.166664568298827e-2f);
    const int q = (int)((long long)k & 3LL);
    *sn = q == 0 ? s : q == 1 ? c : q == 2 ? -s : -c;
    *cs = q == 0 ? c : q == 1 ? -s : q == 2 ? -c : s;
}
{%- endmacro %}
