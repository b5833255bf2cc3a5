{#- Pieces every GEMM kernel shares, as macros: the views' offsets and the epilogue at the store. -#}
{% macro views(p) -%}
RF_INLINE long long rf_a_at(long long bz, long long m, long long k) { return {{ p.a_at }}; }
RF_INLINE long long rf_b_at(long long bz, long long k, long long n) { return {{ p.b_at }}; }
RF_INLINE long long rf_c_at(long long bz, long long m, long long n) { return {{ p.c_at }}; }
{% for x in p.extra_at %}RF_INLINE long long rf_x{{ x[0] }}_at(long long bz, long long m, long long n) { return {{ x[1] }}; }
{% endfor %}
{%- endmacro %}
{#- The epilogue and the store of one product `acc_v` (f32) at (bz, row, col), which are in scope. -#}
{% macro store(p, pad) -%}
{% if p.epilogue %}{{ pad }}const float acc_r = {{ p.acc }};
{% endif %}{% for e in p.extras %}{{ pad }}const {{ e.vtype }} x{{ e.index }} = {{ e.load }};
{% endfor %}{% for l in p.lines %}{{ pad }}{{ l }}
{% endfor %}{{ pad }}C[rf_c_at(bz, row, col)] = {{ p.store }};
{%- endmacro %}
