{% import "gemm_parts.hip" as parts -%}
{% if kq %}// Decode GEMV on a {{ scheme }} weight with 8-bit activations: {{ p.batch }} × [{{ p.m }}, {{ p.k }}] · Wᵀ with W [{{ p.n }}, {{ p.k }}] kept in its
// super-blocks ({{ block_bytes }} bytes per 256 values along K); A and the result read and written in place through their
// views; {{ p.what }}.
// 1. Activations: the block's threads quantize A's {{ p.m }} row(s) once into shared memory, per 32 values (one
//    sub-block of W's format) an int8 q each, the scale d = max|x| / 127 and the sum d·Σq of the rounded values
//    ({% if scheme == "q6_k" %}unused by Q6_K: its -32 offset is taken off the quants themselves{% else %}the sub-blocks' min terms read it{% endif %}). A non-finite value makes its group's scale NaN.
// 2. Products: wave w of the block takes {{ c.cols }} row(s) of W; its lanes split K in pieces of 32 values (8 per
//    super-block: {% if scheme == "q6_k" %}16 bytes of low quant bits and 16 of high bits, 2-byte loads: 210-byte blocks{% else %}one 16-byte load of the quants{% if scheme == "q5_k" %} and one of their fifth bits{% endif %}{% endif %}), the 6-bit
//    or 8-bit sub-block scales unpacked once per piece, read with 4-way int8 dot products (rf_dot4_i8) against
//    the activation bytes, scaled per sub-block in f32. Each row is a wave's alone: its lanes' sums meet by
//    shuffles, no shared memory.
// Memory-bound: W's {{ weight_bytes }} bytes come from DRAM exactly once (vs {{ dense_bytes }} as {{ p.b_t }}); A ({{ p.m }}·K) is read once per
// block from L2. The result differs from the f32 product by A's rounding to 8 bits: at most
// Σ_groups d/2 · Σ|w| per element.
{% else %}// Decode GEMV on a {{ scheme }} weight with 8-bit activations: {{ p.batch }} × [{{ p.m }}, {{ p.k }}] · Wᵀ with W [{{ p.n }}, {{ p.k }}] kept in its
// blocks ({{ block_bytes }} bytes per 32 values along K); A and the result read and written in place through their
// views; {{ p.what }}.
// 1. Activations: the block's threads quantize A's {{ p.m }} row(s) once into shared memory, per 32 values (one
//    block of W's format) an int8 q each, the scale d = max|x| / 127 and the sum d·Σq of the rounded values
//    ({% if scheme == "q4_1" %}Q4_1's min term reads it{% elif scheme == "q4_0" %}Q4_0's -8 offset reads it{% else %}unused by Q8_0{% endif %}). A non-finite value makes its group's scale NaN.
// 2. Products: wave w of the block takes {{ c.cols }} row(s) of W; its lanes split K in pieces of 8 bytes of quants
//    ({{ ppb }} per block), read with 4-way int8 dot products (rf_dot4_i8) against the activation bytes, scaled
//    per block in f32. Each row is a wave's alone: its lanes' sums meet by shuffles, no shared memory.
// Memory-bound: W's {{ weight_bytes }} bytes come from DRAM exactly once (vs {{ dense_bytes }} as {{ p.b_t }}); A ({{ p.m }}·K) is read once per
// block from L2. The result differs from the f32 product by A's rounding to 8 bits: at most
// Σ_blocks d/2 · Σ|w| per element.
{% endif %}namespace {{ entry }}_ns {
constexpr int RF_M = {{ p.m }};
constexpr long long RF_N = {{ p.n }};
constexpr int RF_K = {{ p.k }};
constexpr int RF_COLS = {{ c.cols }};
constexpr int RF_WAVES = {{ c.waves }};
constexpr int RF_THREADS = {{ threads }};
constexpr int RF_BLOCKS = RF_K / 32;
constexpr int RF_PIECES = RF_BLOCKS * {{ ppb }};
constexpr long long RF_BLOCK_BYTES = {{ block_bytes }};
{{ parts.views(p) }}
{{ parts.norm_helpers(p) }}struct alignas(8) rf_i2 { int x, y; };
{% if kq %}struct alignas(16) rf_i4 { int x, y, z, w; };
constexpr int RF_SUPER = RF_K / 256;
{% if scheme == "q6_k" %}// Bytes 0..3 at `p` as a word: Q6_K's 210-byte blocks are only 2-byte aligned, so two halves.
RF_INLINE int rf_w_word2(const unsigned char* __restrict__ p) {
    const unsigned short* q = (const unsigned short*)p;
    return (int)((unsigned)q[0] | ((unsigned)q[1] << 16));
}
// q - 32 in each byte of a word of 6-bit quants (0..63), as int8: the bytes' top bit set first so
// that no byte borrows from the next, then flipped back (a per-byte saturation-free subtraction).
RF_INLINE int rf_sub32(int q) { return (int)((((unsigned)q | 0x80808080u) - 0x20202020u) ^ 0x80808080u); }
{% else %}// ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j from the 12 bytes at `sm`.
RF_INLINE void rf_scale_min(const unsigned char* __restrict__ sm, int j, float* sc, float* mn) {
    if (j < 4) {
        *sc = (float)(sm[j] & 63);
        *mn = (float)(sm[j + 4] & 63);
    } else {
        *sc = (float)((sm[j + 4] & 15) | ((sm[j - 4] >> 6) << 4));
        *mn = (float)((sm[j + 4] >> 4) | ((sm[j] >> 6) << 4));
    }
}
// The quants of sub-block 2c (low nibbles) and 2c + 1 (high nibbles) in 4 bytes{% if scheme == "q5_k" %}, with their fifth
// bits (bit 2c, 2c + 1 of the 4 qh bytes `hb`) as bit 4{% endif %}.
RF_INLINE int rf_lo(int q{% if scheme == "q5_k" %}, int hb, int c{% endif %}) { return (q & 0x0f0f0f0f){% if scheme == "q5_k" %} | (((hb >> (2 * c)) & 0x01010101) << 4){% endif %}; }
RF_INLINE int rf_hi(int q{% if scheme == "q5_k" %}, int hb, int c{% endif %}) { return ((q >> 4) & 0x0f0f0f0f){% if scheme == "q5_k" %} | (((hb >> (2 * c + 1)) & 0x01010101) << 4){% endif %}; }
{% endif %}{% else %}// Quant word j (bytes 4j..4j+3 of the quants) of the {{ scheme }} block at `blk`. {% if scheme == "q4_1" %}20-byte blocks
// with the quants at byte 4: 4-byte aligned.
RF_INLINE int rf_w_word(const unsigned char* __restrict__ blk, int j) { return *(const int*)(blk + 4 + 4 * j); }
{% else %}{{ block_bytes }}-byte blocks with
// the quants at byte 2: 2-byte aligned, so a word is two halves.
RF_INLINE int rf_w_word(const unsigned char* __restrict__ blk, int j) {
    const unsigned short* q = (const unsigned short*)(blk + 2);
    return (int)((unsigned)q[2 * j] | ((unsigned)q[2 * j + 1] << 16));
}
{% endif %}{% endif %}// Step 1: A's rows as int8 in `qa` (row m at byte m·K), scales in `qd`, d·Σq in `qsum` (row m's
// group g at m·RF_BLOCKS + g). Each group of 32 values is 32 consecutive threads of one wave, which
// meet by shuffles; every thread runs every round (the shuffles need all lanes), idle ones on 0.
{% if p.prologue %}// With the prologue, each value is normalised (rf_norm: the rows' statistics) before it is rounded to 8 bits.
{% endif %}RF_INLINE void rf_quantize_a(const {{ p.a_t }}* __restrict__ A, long long bz, signed char* qa, float* qd, float* qsum{% if p.prologue %}, const float* rf_norm, const {{ p.prologue.w_t }}* __restrict__ NW{% if p.prologue.layer %}, const {{ p.prologue.b_t }}* __restrict__ NB{% endif %}{% endif %}) {
    for (int base = 0; base < RF_M * RF_K; base += RF_THREADS) {
        const int i = base + (int)threadIdx.x;
        const bool in = i < RF_M * RF_K;
        const int m = in ? i / RF_K : 0, k = in ? i % RF_K : 0;
{% if p.prologue %}        float x = in ? {{ p.a_pre }}A[rf_a_at(bz, m, k)]{{ p.a_post }} : 0.0f;
        if (in) x = {{ parts.norm_a(p, "x", "m", "k") }};{% else %}        const float x = in ? {{ p.a_pre }}A[rf_a_at(bz, m, k)]{{ p.a_post }} : 0.0f;{% endif %}
        float amax = fabsf(x);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, rf_shfl_xor(amax, o));
        const float d = amax / 127.0f;
        // |x| / d <= 127 up to rounding; halves away from zero, as the CPU executor's
        // quantize_row (src/cpu/quant.rs), so both devices round A alike. NaN where x is NaN
        // (fmaxf dropped it) or infinite (d is, and the reciprocal 0).
        const float id = d > 0.0f ? 1.0f / d : 0.0f;
        const float q = roundf(x * id);
        float sum = q;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sum += rf_shfl_xor(sum, o);
        // The sum keeps a NaN: a finite sum means 32 finite values.
        const bool finite = fabsf(sum) < INFINITY;
        if (in) qa[i] = (signed char)(finite ? (int)q : 0);
        if (in && k % 32 == 0) {
            qd[i / 32] = finite ? d : NAN;
            qsum[i / 32] = d * sum;
        }
    }
}
}  // namespace {{ entry }}_ns
extern "C" __global__ void __launch_bounds__({{ threads }}) {{ entry }}(const {{ p.a_t }}* __restrict__ A, const unsigned char* __restrict__ B, {% for e in p.extras %}const {{ e.ctype }}* __restrict__ in{{ e.index }}, {% endfor %}{{ parts.norm_params(p) }}{{ p.c_t }}* __restrict__ C) {
    RF_GRID_ENTER();
    using namespace {{ entry }}_ns;
    __shared__ rf_i2 qa[RF_M * RF_K / 8];
    __shared__ float qd[RF_M * RF_BLOCKS];
    __shared__ float qsum[RF_M * RF_BLOCKS];
    const long long bz = blockIdx.y;
{{ parts.norm_stats(p, "    ") }}    rf_quantize_a(A, bz, (signed char*)qa, qd, qsum{% if p.prologue %}, rf_norm, NW{% if p.prologue.layer %}, NB{% endif %}{% endif %});
    __syncthreads();
    const int lane = threadIdx.x % RF_WAVE, wave = threadIdx.x / RF_WAVE;
    const long long n0 = ((long long)blockIdx.x * RF_WAVES + wave) * RF_COLS;
    const int* qa_w = (const int*)qa;
    float acc[RF_M][RF_COLS];
#pragma unroll
    for (int m = 0; m < RF_M; ++m)
#pragma unroll
        for (int j = 0; j < RF_COLS; ++j) acc[m][j] = 0.0f;
{% if kq %}    for (int piece = lane; piece < RF_PIECES; piece += RF_WAVE) {
        const int sb = piece / 8, u = piece % 8;
{% if scheme == "q6_k" %}        // Piece u of super-block sb: half hh = u / 4 (values 128hh..), t = u % 4: low bits from the 16 bytes
        // 64hh + 16t of ql (low nibbles: values 128hh + 16t + i; high nibbles: 64 further), high bits from
        // the 16 bytes 32hh + 16(t % 2) of qh (bits 2(t / 2) and 4 + 2(t / 2)); one 8-bit scale per 16 values.
        const int hh = u / 4, t = u % 4;
        int ql[RF_COLS][4], qh[RF_COLS][4];
        float dl[RF_COLS], dh[RF_COLS];
#pragma unroll
        for (int j = 0; j < RF_COLS; ++j) {
            if (n0 + j < RF_N) {
                const unsigned char* b = B + ((n0 + j) * RF_SUPER + sb) * RF_BLOCK_BYTES;
                const float d = rf_h2f(*(const rf_half*)(b + 208));
                dl[j] = d * (float)(signed char)b[192 + 8 * hh + t];
                dh[j] = d * (float)(signed char)b[196 + 8 * hh + t];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    ql[j][i] = rf_w_word2(b + 64 * hh + 16 * t + 4 * i);
                    qh[j][i] = rf_w_word2(b + 128 + 32 * hh + 16 * (t % 2) + 4 * i);
                }
            } else {
                dl[j] = dh[j] = 0.0f;
#pragma unroll
                for (int i = 0; i < 4; ++i) ql[j][i] = qh[j][i] = 0;
            }
        }
        const int sh = 2 * (t / 2);
#pragma unroll
        for (int m = 0; m < RF_M; ++m) {
            // Values 128hh + 16t.. are half of activation group 4hh + t / 2; the high ones 64 further (group + 2).
            const int* a = qa_w + m * (RF_K / 4) + (sb * 256 + 128 * hh + 16 * t) / 4;
            const rf_i2 l0 = *(const rf_i2*)a, l1 = *(const rf_i2*)(a + 2);
            const rf_i2 h0 = *(const rf_i2*)(a + 16), h1 = *(const rf_i2*)(a + 18);
            const int g = m * RF_BLOCKS + sb * 8 + 4 * hh + t / 2;
            const float da_l = qd[g], da_h = qd[g + 2];
#pragma unroll
            for (int j = 0; j < RF_COLS; ++j) {
                int sl = rf_dot4_i8(rf_sub32((ql[j][0] & 0x0f0f0f0f) | (((qh[j][0] >> sh) & 0x03030303) << 4)), l0.x, 0);
                sl = rf_dot4_i8(rf_sub32((ql[j][1] & 0x0f0f0f0f) | (((qh[j][1] >> sh) & 0x03030303) << 4)), l0.y, sl);
                sl = rf_dot4_i8(rf_sub32((ql[j][2] & 0x0f0f0f0f) | (((qh[j][2] >> sh) & 0x03030303) << 4)), l1.x, sl);
                sl = rf_dot4_i8(rf_sub32((ql[j][3] & 0x0f0f0f0f) | (((qh[j][3] >> sh) & 0x03030303) << 4)), l1.y, sl);
                int su = rf_dot4_i8(rf_sub32(((ql[j][0] >> 4) & 0x0f0f0f0f) | (((qh[j][0] >> (sh + 4)) & 0x03030303) << 4)), h0.x, 0);
                su = rf_dot4_i8(rf_sub32(((ql[j][1] >> 4) & 0x0f0f0f0f) | (((qh[j][1] >> (sh + 4)) & 0x03030303) << 4)), h0.y, su);
                su = rf_dot4_i8(rf_sub32(((ql[j][2] >> 4) & 0x0f0f0f0f) | (((qh[j][2] >> (sh + 4)) & 0x03030303) << 4)), h1.x, su);
                su = rf_dot4_i8(rf_sub32(((ql[j][3] >> 4) & 0x0f0f0f0f) | (((qh[j][3] >> (sh + 4)) & 0x03030303) << 4)), h1.y, su);
                acc[m][j] += dl[j] * (da_l * (float)sl) + dh[j] * (da_h * (float)su);
            }
        }
{% else %}        // Piece u of super-block sb: the 16 quant bytes 32c + 16h (c = u / 2, h = u % 2), whose low nibbles are
        // values 64c + 16h + i (sub-block 2c) and high nibbles the 16 at 32 further (sub-block 2c + 1){% if scheme == "q5_k" %}; their
        // fifth bits are bits 2c and 2c + 1 of qh's bytes 16h..16h + 15{% endif %}.
        const int c = u / 2, h = u % 2;
        rf_i4 w[RF_COLS];
{% if scheme == "q5_k" %}        rf_i4 wh[RF_COLS];
{% endif %}        float d1[RF_COLS], d2[RF_COLS], m1[RF_COLS], m2[RF_COLS];
#pragma unroll
        for (int j = 0; j < RF_COLS; ++j) {
            if (n0 + j < RF_N) {
                // {{ block_bytes }}-byte blocks, a multiple of 16: the quants' 16-byte runs are aligned.
                const unsigned char* b = B + ((n0 + j) * RF_SUPER + sb) * RF_BLOCK_BYTES;
                const float d = rf_h2f(*(const rf_half*)b), dmin = rf_h2f(*(const rf_half*)(b + 2));
                float sc, mn;
                rf_scale_min(b + 4, 2 * c, &sc, &mn);
                d1[j] = d * sc;
                m1[j] = dmin * mn;
                rf_scale_min(b + 4, 2 * c + 1, &sc, &mn);
                d2[j] = d * sc;
                m2[j] = dmin * mn;
                w[j] = *(const rf_i4*)(b + {% if scheme == "q5_k" %}48{% else %}16{% endif %} + 32 * c + 16 * h);
{% if scheme == "q5_k" %}                wh[j] = *(const rf_i4*)(b + 16 + 16 * h);
{% endif %}            } else {
                d1[j] = d2[j] = m1[j] = m2[j] = 0.0f;
                w[j] = rf_i4{0, 0, 0, 0};
{% if scheme == "q5_k" %}                wh[j] = rf_i4{0, 0, 0, 0};
{% endif %}            }
        }
#pragma unroll
        for (int m = 0; m < RF_M; ++m) {
            const int* a = qa_w + m * (RF_K / 4) + (sb * 256 + 64 * c + 16 * h) / 4;
            const rf_i2 l0 = *(const rf_i2*)a, l1 = *(const rf_i2*)(a + 2);
            const rf_i2 h0 = *(const rf_i2*)(a + 8), h1 = *(const rf_i2*)(a + 10);
            const int g = m * RF_BLOCKS + sb * 8 + 2 * c;
            const float da1 = qd[g], da2 = qd[g + 1];
            // Half of each sub-block's d·Σq: the pieces h = 0 and 1 add up to its min term.
            const float s1 = 0.5f * qsum[g], s2 = 0.5f * qsum[g + 1];
#pragma unroll
            for (int j = 0; j < RF_COLS; ++j) {
{% if scheme == "q5_k" %}{% set hx = ", wh[j].x, c" %}{% set hy = ", wh[j].y, c" %}{% set hz = ", wh[j].z, c" %}{% set hw = ", wh[j].w, c" %}{% else %}{% set hx = "" %}{% set hy = "" %}{% set hz = "" %}{% set hw = "" %}{% endif %}                int sl = rf_dot4_i8(rf_lo(w[j].x{{ hx }}), l0.x, 0);
                sl = rf_dot4_i8(rf_lo(w[j].y{{ hy }}), l0.y, sl);
                sl = rf_dot4_i8(rf_lo(w[j].z{{ hz }}), l1.x, sl);
                sl = rf_dot4_i8(rf_lo(w[j].w{{ hw }}), l1.y, sl);
                int su = rf_dot4_i8(rf_hi(w[j].x{{ hx }}), h0.x, 0);
                su = rf_dot4_i8(rf_hi(w[j].y{{ hy }}), h0.y, su);
                su = rf_dot4_i8(rf_hi(w[j].z{{ hz }}), h1.x, su);
                su = rf_dot4_i8(rf_hi(w[j].w{{ hw }}), h1.y, su);
                // d·sc·q − dmin·m per value: the scales against the dot products, the mins against the sums.
                acc[m][j] += d1[j] * (da1 * (float)sl) + d2[j] * (da2 * (float)su) - (m1[j] * s1 + m2[j] * s2);
            }
        }
{% endif %}    }
{% else %}    for (int piece = lane; piece < RF_PIECES; piece += RF_WAVE) {
        const int blk = piece / {{ ppb }}, h = piece % {{ ppb }};
        // W's words 2h and 2h + 1 of this block, per row, with the block's scale{% if scheme == "q4_1" %} and min{% endif %}.
        int w[RF_COLS][2];
        float wd[RF_COLS]{% if scheme == "q4_1" %}, wm[RF_COLS]{% endif %};
#pragma unroll
        for (int j = 0; j < RF_COLS; ++j) {
            if (n0 + j < RF_N) {
                const unsigned char* b = B + ((n0 + j) * RF_BLOCKS + blk) * RF_BLOCK_BYTES;
                wd[j] = rf_h2f(*(const rf_half*)b);
{% if scheme == "q4_1" %}                wm[j] = rf_h2f(*(const rf_half*)(b + 2));
{% endif %}                w[j][0] = rf_w_word(b, 2 * h);
                w[j][1] = rf_w_word(b, 2 * h + 1);
            } else {
                wd[j] = 0.0f;
{% if scheme == "q4_1" %}                wm[j] = 0.0f;
{% endif %}                w[j][0] = w[j][1] = 0;
            }
        }
#pragma unroll
        for (int m = 0; m < RF_M; ++m) {
            const int* a = qa_w + m * (RF_K / 4) + blk * 8;
            const float da = qd[m * RF_BLOCKS + blk];
{% if scheme == "q8_0" %}            // Values 8h..8h+7: activation words 2h, 2h + 1.
            const rf_i2 lo = *(const rf_i2*)(a + 2 * h);
#pragma unroll
            for (int j = 0; j < RF_COLS; ++j) {
                const int s = rf_dot4_i8(w[j][1], lo.y, rf_dot4_i8(w[j][0], lo.x, 0));
                acc[m][j] += wd[j] * (da * (float)s);
            }
{% else %}            // Low nibbles: values 8h..8h+7 (activation words 2h, 2h + 1); high nibbles: the 16 after.
            const rf_i2 lo = *(const rf_i2*)(a + 2 * h);
            const rf_i2 hi = *(const rf_i2*)(a + 4 + 2 * h);
            // This piece is half the block: half the block's d·Σq (the halves' terms add up to it).
            const float half_sum = 0.5f * qsum[m * RF_BLOCKS + blk];
#pragma unroll
            for (int j = 0; j < RF_COLS; ++j) {
                int s = rf_dot4_i8(w[j][0] & 0x0f0f0f0f, lo.x, 0);
                s = rf_dot4_i8(w[j][1] & 0x0f0f0f0f, lo.y, s);
                s = rf_dot4_i8((w[j][0] >> 4) & 0x0f0f0f0f, hi.x, s);
                s = rf_dot4_i8((w[j][1] >> 4) & 0x0f0f0f0f, hi.y, s);
{% if scheme == "q4_0" %}                // (q - 8) · d_w: the offset against the values' sum.
                acc[m][j] += wd[j] * (da * (float)s - 8.0f * half_sum);
{% else %}                // q · d_w + min_w.
                acc[m][j] += wd[j] * (da * (float)s) + wm[j] * half_sum;
{% endif %}            }
{% endif %}        }
    }
{% endif %}    // Every lane gets each row's sum; lane m·RF_COLS + j keeps (m, j) and stores it.
    float mine = 0.0f;
#pragma unroll
    for (int m = 0; m < RF_M; ++m)
#pragma unroll
        for (int j = 0; j < RF_COLS; ++j) {
            const float s = rf_wave_sum(acc[m][j]);
            if (lane == m * RF_COLS + j) mine = s;
        }
    const long long row = lane / RF_COLS, col = n0 + lane % RF_COLS;
    if (lane < RF_M * RF_COLS && col < RF_N) {
        const float acc_v = mine;
{{ parts.store(p, "        ") }}
    }
}
