{#- Reading ggml blocks (`ir::quant`): one quarter of a block, as the dequantizing kernels take it. -#}
{% macro piece(scheme) -%}
// Values 4q..4q+3 (v[0..4]) and 16+4q..16+4q+3 (v[4..8]) of the {{ scheme }} block at `blk`, in f32: the
// quants of bytes 4q..4q+3{% if scheme != "q8_0" %} (low nibbles, then the high nibbles 16 values on){% else %} and 16+4q..16+4q+3{% endif %}. Blocks are 2-byte
// aligned ({{ scheme }}: the buffer starts aligned and every block is an even number of bytes).
RF_INLINE void rf_dequant_piece(const unsigned char* __restrict__ blk, int q, float* v) {
    const float d = rf_h2f(*(const rf_half*)blk);
{% if scheme == "q8_0" %}    const unsigned short* qs = (const unsigned short*)(blk + 2);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const unsigned w = (unsigned)qs[8 * h + 2 * q] | ((unsigned)qs[8 * h + 2 * q + 1] << 16);
#pragma unroll
        for (int i = 0; i < 4; ++i) v[4 * h + i] = d * (float)(signed char)((w >> (8 * i)) & 0xffu);
    }
{% elif scheme == "q4_0" %}    const unsigned short* qs = (const unsigned short*)(blk + 2);
    const unsigned w = (unsigned)qs[2 * q] | ((unsigned)qs[2 * q + 1] << 16);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int b = (int)((w >> (8 * i)) & 0xffu);
        v[i] = d * (float)((b & 15) - 8);
        v[4 + i] = d * (float)((b >> 4) - 8);
    }
{% else %}    const float m = rf_h2f(*(const rf_half*)(blk + 2));
    // 20-byte blocks: the quants are 4-byte aligned.
    const unsigned w = *(const unsigned*)(blk + 4 + 4 * q);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int b = (int)((w >> (8 * i)) & 0xffu);
        v[i] = d * (float)(b & 15) + m;
        v[4 + i] = d * (float)(b >> 4) + m;
    }
{% endif %}}
{%- endmacro %}
