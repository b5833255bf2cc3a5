{% import "gemm_parts.hip" as parts -%}
{% import "quant_parts.hip" as quant -%}
// Decode GEMV on a {{ scheme }} weight with 8-bit activations: {{ p.batch }} × [{{ p.m }}, {{ p.k }}] · Wᵀ with W [{{ p.n }}, {{ p.k }}] kept in its
// {% if kq %}super-blocks ({{ block_bytes }} bytes per 256 values along K){% else %}blocks ({{ block_bytes }} bytes per 32 values along K){% endif %}; {% if split %}A quantized beforehand by the node's first kernel
// (gemm_quant_act) into the workspace WS, the result written in place through its view{% else %}A and the result read and written in place through their
// views{% endif %}; {{ p.what }}.
{% if split %}// 1. Activations: read from WS (written once for the whole grid, so from L2), per 32 values (one {% if kq %}sub-block{% else %}block{% endif %}
//    of W's format) an int8 q each, the scale d = max|x| / 127 and the sum d·Σq of the rounded values
//    ({% if scheme == "q6_k" %}unused by Q6_K: its -32 offset is taken off the quants themselves{% elif kq %}the sub-blocks' min terms read it{% elif scheme == "q4_1" %}Q4_1's min term reads it{% elif scheme == "q4_0" %}Q4_0's -8 offset reads it{% else %}unused by Q8_0{% endif %}).
//    Before waiting for that kernel (RF_GRID_ENTER) each block asks L2 for its first group's rows of W,
//    which that kernel does not write.
{% else %}// 0. Each thread issues the loads of its first step of W (below) before step 1, so that W's bytes are in flight
//    while the activations are quantized.
// 1. Activations: the block's threads quantize A's {{ p.m }} row(s) once into shared memory, per 32 values (one
//    {% if kq %}sub-block{% else %}block{% endif %} of W's format) an int8 q each, the scale d = max|x| / 127 and the sum d·Σq of the rounded values
//    ({% if scheme == "q6_k" %}unused by Q6_K: its -32 offset is taken off the quants themselves{% elif kq %}the sub-blocks' min terms read it{% elif scheme == "q4_1" %}Q4_1's min term reads it{% elif scheme == "q4_0" %}Q4_0's -8 offset reads it{% else %}unused by Q8_0{% endif %}). A thread takes runs of 8 values,
//    the 4 threads of a group meet by shuffles. A non-finite value makes its group's scale NaN.
{% endif %}// 2. Products: the block strides over groups of {{ c.waves }}·{{ c.cols }} rows of W ({{ c.grid }} blocks{% if not split %}; the quantized activations
//    serve every group it takes{% endif %}); wave w takes {{ c.cols }} row(s) of a group, its lanes split K in pieces of {% if kq %}32 values (8 per
//    super-block: {% if scheme == "q6_k" %}16 bytes of low quant bits and 16 of high bits, each from the two aligned 16-byte
//    loads around it, the blocks being 210 bytes{% else %}the block's 16-byte head of scales and one 16-byte load of the quants{% if scheme == "q5_k" %} and one of their fifth bits{% endif %}{% endif %}){% else %}8 bytes of quants
//    ({{ ppb }} per block){% endif %}, {{ c.unroll }} piece(s) per row per step, every load of a step issued before the first
//    is used, read with 4-way int8 dot products (rf_dot4_i8) against the activation bytes, scaled per {% if kq %}sub-block{% else %}block{% endif %}
//    in f32. Each row is a wave's alone: its lanes' sums meet by shuffles, no shared memory.
// Memory-bound: W's {{ weight_bytes }} bytes come from DRAM exactly once for all {{ p.m }} row(s) of A (vs {{ dense_bytes }} as {{ p.b_t }});
// {% if split %}the quantized A ({{ p.m }}·K·1.25 bytes) is read by every block from L2{% else %}A ({{ p.m }}·K) is read once per block from L2{% endif %}. The result differs from the f32
// product by A's rounding to 8 bits: at most Σ_groups d/2 · Σ|w| per element.
namespace {{ entry }}_ns {
constexpr int RF_M = {{ p.m }};
constexpr long long RF_N = {{ p.n }};
constexpr int RF_K = {{ p.k }};
constexpr int RF_COLS = {{ c.cols }};
constexpr int RF_WAVES = {{ c.waves }};
constexpr int RF_THREADS = {{ threads }};
constexpr int RF_BLOCKS = RF_K / 32;
constexpr int RF_PIECES = RF_BLOCKS * {{ ppb }};
constexpr long long RF_BLOCK_BYTES = {{ block_bytes }};
// Bytes of a row of W.
constexpr long long RF_ROW_BYTES = (long long)RF_K / {{ block_elems }} * RF_BLOCK_BYTES;
// Pieces per lane and row in one step, the steps that cover K, the groups of RF_WAVES · RF_COLS
// rows of W, and the blocks (the grid) that stride over them.
constexpr int RF_UNROLL = {{ c.unroll }};
constexpr int RF_STEPS = (RF_PIECES + RF_WAVE * RF_UNROLL - 1) / (RF_WAVE * RF_UNROLL);
constexpr long long RF_GROUPS = (RF_N + RF_WAVES * RF_COLS - 1) / (RF_WAVES * RF_COLS);
constexpr long long RF_GRID = {{ c.grid }};
// Runs of 8 activation values, and how many a thread loads before it rounds them.
constexpr int RF_RUNS = RF_M * RF_K / 8;
constexpr int RF_RUNS_IN_FLIGHT = {{ runs_in_flight }};
{% if split %}// Where the activations' scales start in WS (floats): after the int8 values of every batch.
constexpr long long RF_DS_AT = {{ ds_at }}LL;
{% endif %}{{ parts.views(p) }}
{{ parts.norm_helpers(p) }}{{ quant.act_types() }}
{% if kq %}constexpr int RF_SUPER = RF_K / 256;
{% if scheme == "q6_k" %}// The 16 bytes at `p` (2-byte aligned: 210-byte blocks) as 4 words, from the aligned 16-byte loads around
// them (the second only where `p` is not 16-byte aligned): the words picked by p's offset in its 16 bytes
// (selects on compile-time indices, no local array), then shifted down by 16 bits where it is odd in
// halves. Both loads stay inside the block: the runs read here end at byte 192 at the latest, the second
// load at 208 (and start at most 14 bytes before the run, in the block or the one before it).
// Two 16-byte loads a run, not 8 two-byte ones: a warp's load instruction costs L1 a pass per cache
// line it touches, and a lane's runs sit in 4 super-blocks, so fewer instructions is the bound.
RF_INLINE void rf_run16(const unsigned char* __restrict__ p, int* out) {
    const unsigned off = (unsigned)((unsigned long long)p & 15ull);
    const rf_i4* a = (const rf_i4*)(p - off);
    const rf_i4 lo = a[0];
    const rf_i4 hi = off != 0u ? a[1] : rf_i4{0, 0, 0, 0};
    const unsigned v[8] = {(unsigned)lo.x, (unsigned)lo.y, (unsigned)lo.z, (unsigned)lo.w,
                           (unsigned)hi.x, (unsigned)hi.y, (unsigned)hi.z, (unsigned)hi.w};
    const unsigned q = off / 4u, sh = 8u * (off & 3u);
    unsigned w[5];
#pragma unroll
    for (int i = 0; i < 5; ++i) w[i] = q == 0u ? v[i] : q == 1u ? v[i + 1] : q == 2u ? v[i + 2] : v[i + 3];
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = (int)(unsigned)((((unsigned long long)w[i + 1] << 32) | w[i]) >> sh);
}
// q - 32 in each byte of a word of 6-bit quants (0..63), as int8: the bytes' top bit set first so
// that no byte borrows from the next, then flipped back (a per-byte saturation-free subtraction).
RF_INLINE int rf_sub32(int q) { return (int)((((unsigned)q | 0x80808080u) - 0x20202020u) ^ 0x80808080u); }
// One piece of a row of W: piece u of super-block sb, half hh = u / 4 (values 128hh..), t = u % 4: low bits
// from the 16 bytes 64hh + 16t of ql (low nibbles: values 128hh + 16t + i; high nibbles: 64 further), high
// bits from the 16 bytes 32hh + 16(t % 2) of qh (bits 2(t / 2) and 4 + 2(t / 2)); one 8-bit scale per 16
// values (`lo`, `hi`), the super-block's d.
struct rf_wq {
    int ql[4], qh[4];
    int lo, hi;
    rf_half d;
};
RF_INLINE rf_wq rf_load(const unsigned char* __restrict__ B, long long n, int piece) {
    rf_wq w;
    if (n < RF_N && piece < RF_PIECES) {
        const int sb = piece / 8, u = piece % 8, hh = u / 4, t = u % 4;
        const unsigned char* b = B + (n * RF_SUPER + sb) * RF_BLOCK_BYTES;
        rf_run16(b + 64 * hh + 16 * t, w.ql);
        rf_run16(b + 128 + 32 * hh + 16 * (t % 2), w.qh);
        w.lo = (signed char)b[192 + 8 * hh + t];
        w.hi = (signed char)b[196 + 8 * hh + t];
        w.d = *(const rf_half*)(b + 208);
    } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) w.ql[i] = w.qh[i] = 0;
        w.lo = w.hi = 0;
        w.d = 0;
    }
    return w;
}
// Adds piece `piece` of the wave's RF_COLS rows (`w`) times A's rows to `acc`.
RF_INLINE void rf_dot(const rf_wq (&w)[RF_COLS], int piece, const int* __restrict__ qa_w, const rf_f2* __restrict__ ds, float (&acc)[RF_M][RF_COLS]) {
    const int sb = piece / 8, u = piece % 8, hh = u / 4, t = u % 4;
    const int sh = 2 * (t / 2);
    float dl[RF_COLS], dh[RF_COLS];
#pragma unroll
    for (int j = 0; j < RF_COLS; ++j) {
        const float d = rf_h2f(w[j].d);
        dl[j] = d * (float)w[j].lo;
        dh[j] = d * (float)w[j].hi;
    }
#pragma unroll
    for (int m = 0; m < RF_M; ++m) {
        // Values 128hh + 16t.. are half of activation group 4hh + t / 2; the high ones 64 further (group + 2).
        const int* a = qa_w + m * (RF_K / 4) + (sb * 256 + 128 * hh + 16 * t) / 4;
        // One 16-byte load each (the run starts at a multiple of 16 values).
        const rf_i4 l = *(const rf_i4*)a, h = *(const rf_i4*)(a + 16);
        const int g = m * RF_BLOCKS + sb * 8 + 4 * hh + t / 2;
        const float da_l = ds[g].x, da_h = ds[g + 2].x;
#pragma unroll
        for (int j = 0; j < RF_COLS; ++j) {
            const int* ql = w[j].ql;
            const int* qh = w[j].qh;
            int sl = rf_dot4_i8(rf_sub32((ql[0] & 0x0f0f0f0f) | (((qh[0] >> sh) & 0x03030303) << 4)), l.x, 0);
            sl = rf_dot4_i8(rf_sub32((ql[1] & 0x0f0f0f0f) | (((qh[1] >> sh) & 0x03030303) << 4)), l.y, sl);
            sl = rf_dot4_i8(rf_sub32((ql[2] & 0x0f0f0f0f) | (((qh[2] >> sh) & 0x03030303) << 4)), l.z, sl);
            sl = rf_dot4_i8(rf_sub32((ql[3] & 0x0f0f0f0f) | (((qh[3] >> sh) & 0x03030303) << 4)), l.w, sl);
            int su = rf_dot4_i8(rf_sub32(((ql[0] >> 4) & 0x0f0f0f0f) | (((qh[0] >> (sh + 4)) & 0x03030303) << 4)), h.x, 0);
            su = rf_dot4_i8(rf_sub32(((ql[1] >> 4) & 0x0f0f0f0f) | (((qh[1] >> (sh + 4)) & 0x03030303) << 4)), h.y, su);
            su = rf_dot4_i8(rf_sub32(((ql[2] >> 4) & 0x0f0f0f0f) | (((qh[2] >> (sh + 4)) & 0x03030303) << 4)), h.z, su);
            su = rf_dot4_i8(rf_sub32(((ql[3] >> 4) & 0x0f0f0f0f) | (((qh[3] >> (sh + 4)) & 0x03030303) << 4)), h.w, su);
            acc[m][j] += dl[j] * (da_l * (float)sl) + dh[j] * (da_h * (float)su);
        }
    }
}
{% else %}// ggml's get_scale_min_k4 on a super-block's head (`hd`: d and dmin, then the 12 bytes of scales and
// mins as the words y, z, w) for the pair of sub-blocks 2c and 2c + 1: their 6-bit scales and mins, from
// 16-bit halves (llama.cpp's vec_dot_q4_K_q8_1 form). Without a branch on c < 2: c is piece % 8 / 2, the
// same for a lane in every step (RF_WAVE is a multiple of 8), so such a branch diverges within every warp
// and runs both sides (sm_90 SASS: ~48 instructions a row, against ~16 here).
RF_INLINE void rf_scale_min2(const rf_i4& hd, int c, float* sc, float* mn) {
    const unsigned sh = 16u * (unsigned)(c & 1);
    const unsigned a = (unsigned)hd.y >> sh, b = (unsigned)hd.z >> sh, q = (unsigned)hd.w >> sh;
    // c < 2: the low 6 bits of scale bytes 2c, 2c + 1 (a) and of the mins 4 further (b); else the
    // nibbles of bytes 2c + 4.. (q: low the scales, high the mins) under the top 2 bits of a's and b's.
    const bool hi = c >= 2;
    const unsigned s = hi ? ((q & 0x0f0fu) | ((a >> 2) & 0x3030u)) : (a & 0x3f3fu);
    const unsigned m = hi ? (((q >> 4) & 0x0f0fu) | ((b >> 2) & 0x3030u)) : (b & 0x3f3fu);
    sc[0] = (float)(s & 0xffu);
    sc[1] = (float)(s >> 8 & 0xffu);
    mn[0] = (float)(m & 0xffu);
    mn[1] = (float)(m >> 8 & 0xffu);
}
// The quants of sub-block 2c (low nibbles) and 2c + 1 (high nibbles) in 4 bytes{% if scheme == "q5_k" %}, with their fifth
// bits (bit 2c, 2c + 1 of the 4 qh bytes `hb`) as bit 4{% endif %}.
RF_INLINE int rf_lo(int q{% if scheme == "q5_k" %}, int hb, int c{% endif %}) { return (q & 0x0f0f0f0f){% if scheme == "q5_k" %} | (((hb >> (2 * c)) & 0x01010101) << 4){% endif %}; }
RF_INLINE int rf_hi(int q{% if scheme == "q5_k" %}, int hb, int c{% endif %}) { return ((q >> 4) & 0x0f0f0f0f){% if scheme == "q5_k" %} | (((hb >> (2 * c + 1)) & 0x01010101) << 4){% endif %}; }
// One piece of a row of W: piece u of super-block sb, the 16 quant bytes 32c + 16h (c = u / 2, h = u % 2), whose
// low nibbles are values 64c + 16h + i (sub-block 2c) and high nibbles the 16 at 32 further (sub-block
// 2c + 1){% if scheme == "q5_k" %}, their fifth bits (bits 2c and 2c + 1 of qh's bytes 16h..16h + 15){% endif %}, and the super-block's 16-byte head.
// {{ block_bytes }}-byte blocks, a multiple of 16: every 16-byte load is aligned.
struct rf_wq {
    rf_i4 head, q{% if scheme == "q5_k" %}, qh{% endif %};
};
RF_INLINE rf_wq rf_load(const unsigned char* __restrict__ B, long long n, int piece) {
    rf_wq w;
    if (n < RF_N && piece < RF_PIECES) {
        const int sb = piece / 8, u = piece % 8, c = u / 2, h = u % 2;
        const unsigned char* b = B + (n * RF_SUPER + sb) * RF_BLOCK_BYTES;
        w.head = *(const rf_i4*)b;
        w.q = *(const rf_i4*)(b + {% if scheme == "q5_k" %}48{% else %}16{% endif %} + 32 * c + 16 * h);
{% if scheme == "q5_k" %}        w.qh = *(const rf_i4*)(b + 16 + 16 * h);
{% endif %}    } else {
        w.head = w.q = {% if scheme == "q5_k" %}w.qh = {% endif %}rf_i4{0, 0, 0, 0};
    }
    return w;
}
// Adds piece `piece` of the wave's RF_COLS rows (`w`) times A's rows to `acc`.
RF_INLINE void rf_dot(const rf_wq (&w)[RF_COLS], int piece, const int* __restrict__ qa_w, const rf_f2* __restrict__ ds, float (&acc)[RF_M][RF_COLS]) {
    const int sb = piece / 8, u = piece % 8, c = u / 2, h = u % 2;
    float d1[RF_COLS], d2[RF_COLS], m1[RF_COLS], m2[RF_COLS];
#pragma unroll
    for (int j = 0; j < RF_COLS; ++j) {
        const float d = rf_h2f((rf_half)((unsigned)w[j].head.x & 0xffffu));
        const float dmin = rf_h2f((rf_half)((unsigned)w[j].head.x >> 16));
        float sc[2], mn[2];
        rf_scale_min2(w[j].head, c, sc, mn);
        d1[j] = d * sc[0];
        m1[j] = dmin * mn[0];
        d2[j] = d * sc[1];
        m2[j] = dmin * mn[1];
    }
#pragma unroll
    for (int m = 0; m < RF_M; ++m) {
        const int* a = qa_w + m * (RF_K / 4) + (sb * 256 + 64 * c + 16 * h) / 4;
        // One 16-byte load each (the run starts at a multiple of 16 values), and one for both groups' d and
        // d·Σq (g is even).
        const rf_i4 l = *(const rf_i4*)a, h = *(const rf_i4*)(a + 8);
        const int g = m * RF_BLOCKS + sb * 8 + 2 * c;
        const rf_f4 dd = *(const rf_f4*)(ds + g);
        const float da1 = dd.x, da2 = dd.z;
        // Half of each sub-block's d·Σq: the pieces h = 0 and 1 add up to its min term.
        const float s1 = 0.5f * dd.y, s2 = 0.5f * dd.w;
#pragma unroll
        for (int j = 0; j < RF_COLS; ++j) {
            const rf_i4& q = w[j].q;
{% if scheme == "q5_k" %}            const rf_i4& qh = w[j].qh;
{% set hx = ", qh.x, c" %}{% set hy = ", qh.y, c" %}{% set hz = ", qh.z, c" %}{% set hw = ", qh.w, c" %}{% else %}{% set hx = "" %}{% set hy = "" %}{% set hz = "" %}{% set hw = "" %}{% endif %}            int sl = rf_dot4_i8(rf_lo(q.x{{ hx }}), l.x, 0);
            sl = rf_dot4_i8(rf_lo(q.y{{ hy }}), l.y, sl);
            sl = rf_dot4_i8(rf_lo(q.z{{ hz }}), l.z, sl);
            sl = rf_dot4_i8(rf_lo(q.w{{ hw }}), l.w, sl);
            int su = rf_dot4_i8(rf_hi(q.x{{ hx }}), h.x, 0);
            su = rf_dot4_i8(rf_hi(q.y{{ hy }}), h.y, su);
            su = rf_dot4_i8(rf_hi(q.z{{ hz }}), h.z, su);
            su = rf_dot4_i8(rf_hi(q.w{{ hw }}), h.w, su);
            // d·sc·q − dmin·m per value: the scales against the dot products, the mins against the sums.
            acc[m][j] += d1[j] * (da1 * (float)sl) + d2[j] * (da2 * (float)su) - (m1[j] * s1 + m2[j] * s2);
        }
    }
}
{% endif %}{% else %}// Quant word j (bytes 4j..4j+3 of the quants) of the {{ scheme }} block at `blk`. {% if scheme == "q4_1" %}20-byte blocks
// with the quants at byte 4: 4-byte aligned.
RF_INLINE int rf_w_word(const unsigned char* __restrict__ blk, int j) { return *(const int*)(blk + 4 + 4 * j); }
{% else %}{{ block_bytes }}-byte blocks with
// the quants at byte 2: 2-byte aligned, so a word is two halves.
RF_INLINE int rf_w_word(const unsigned char* __restrict__ blk, int j) {
    const unsigned short* q = (const unsigned short*)(blk + 2);
    return (int)((unsigned)q[2 * j] | ((unsigned)q[2 * j + 1] << 16));
}
{% endif %}// One piece of a row of W: quant words 2h and 2h + 1 of block blk (piece = {{ ppb }}·blk + h), the block's scale{% if scheme == "q4_1" %} and min{% endif %}.
struct rf_wq {
    int w0, w1;
    rf_half d{% if scheme == "q4_1" %}, mn{% endif %};
};
RF_INLINE rf_wq rf_load(const unsigned char* __restrict__ B, long long n, int piece) {
    rf_wq w;
    if (n < RF_N && piece < RF_PIECES) {
        const int blk = piece / {{ ppb }}, h = piece % {{ ppb }};
        const unsigned char* b = B + (n * RF_BLOCKS + blk) * RF_BLOCK_BYTES;
        w.d = *(const rf_half*)b;
{% if scheme == "q4_1" %}        w.mn = *(const rf_half*)(b + 2);
{% endif %}        w.w0 = rf_w_word(b, 2 * h);
        w.w1 = rf_w_word(b, 2 * h + 1);
    } else {
        w.w0 = w.w1 = 0;
        w.d = 0;
{% if scheme == "q4_1" %}        w.mn = 0;
{% endif %}    }
    return w;
}
// Adds piece `piece` of the wave's RF_COLS rows (`w`) times A's rows to `acc`.
RF_INLINE void rf_dot(const rf_wq (&w)[RF_COLS], int piece, const int* __restrict__ qa_w, const rf_f2* __restrict__ ds, float (&acc)[RF_M][RF_COLS]) {
    const int blk = piece / {{ ppb }}, h = piece % {{ ppb }};
    float wd[RF_COLS]{% if scheme == "q4_1" %}, wm[RF_COLS]{% endif %};
#pragma unroll
    for (int j = 0; j < RF_COLS; ++j) {
        wd[j] = rf_h2f(w[j].d);
{% if scheme == "q4_1" %}        wm[j] = rf_h2f(w[j].mn);
{% endif %}    }
#pragma unroll
    for (int m = 0; m < RF_M; ++m) {
        const int* a = qa_w + m * (RF_K / 4) + blk * 8;
        const rf_f2 dd = ds[m * RF_BLOCKS + blk];
        const float da = dd.x;
{% if scheme == "q8_0" %}        // Values 8h..8h+7: activation words 2h, 2h + 1.
        const rf_i2 lo = *(const rf_i2*)(a + 2 * h);
#pragma unroll
        for (int j = 0; j < RF_COLS; ++j) {
            const int s = rf_dot4_i8(w[j].w1, lo.y, rf_dot4_i8(w[j].w0, lo.x, 0));
            acc[m][j] += wd[j] * (da * (float)s);
        }
{% else %}        // Low nibbles: values 8h..8h+7 (activation words 2h, 2h + 1); high nibbles: the 16 after.
        const rf_i2 lo = *(const rf_i2*)(a + 2 * h);
        const rf_i2 hi = *(const rf_i2*)(a + 4 + 2 * h);
        // This piece is half the block: half the block's d·Σq (the halves' terms add up to it).
        const float half_sum = 0.5f * dd.y;
#pragma unroll
        for (int j = 0; j < RF_COLS; ++j) {
            int s = rf_dot4_i8(w[j].w0 & 0x0f0f0f0f, lo.x, 0);
            s = rf_dot4_i8(w[j].w1 & 0x0f0f0f0f, lo.y, s);
            s = rf_dot4_i8((w[j].w0 >> 4) & 0x0f0f0f0f, hi.x, s);
            s = rf_dot4_i8((w[j].w1 >> 4) & 0x0f0f0f0f, hi.y, s);
{% if scheme == "q4_0" %}            // (q - 8) · d_w: the offset against the values' sum.
            acc[m][j] += wd[j] * (da * (float)s - 8.0f * half_sum);
{% else %}            // q · d_w + min_w.
            acc[m][j] += wd[j] * (da * (float)s) + wm[j] * half_sum;
{% endif %}        }
{% endif %}    }
}
{% endif %}// Step `s` of the wave's rows n0.. (RF_UNROLL pieces of each): every load issued before any is used.
RF_INLINE void rf_load_step(rf_wq (&w)[RF_UNROLL][RF_COLS], const unsigned char* __restrict__ B, long long n0, int lane, int s) {
#pragma unroll
    for (int uu = 0; uu < RF_UNROLL; ++uu)
#pragma unroll
        for (int j = 0; j < RF_COLS; ++j) w[uu][j] = rf_load(B, n0 + j, lane + RF_WAVE * (RF_UNROLL * s + uu));
}
{% if not split %}{{ quant.act_quantize(p) }}
{% endif %}}  // namespace {{ entry }}_ns
{% if split %}extern "C" __global__ void __launch_bounds__({{ threads }}) {{ entry }}(const float* __restrict__ WS, const unsigned char* __restrict__ B, {% for e in p.extras %}const {{ e.ctype }}* __restrict__ in{{ e.index }}, {% endfor %}{{ p.c_t }}* __restrict__ C) {
    using namespace {{ entry }}_ns;
    // The rows of the block's first group (read by no kernel before this one) stream into L2 while the
    // activations' kernel runs; then the wait on it.
    RF_PREFETCH_LOOP(pf, threadIdx.x, ((RF_N - (long long)blockIdx.x * RF_WAVES * RF_COLS < RF_WAVES * RF_COLS ? RF_N - (long long)blockIdx.x * RF_WAVES * RF_COLS : RF_WAVES * RF_COLS) * RF_ROW_BYTES + 127) / 128, RF_THREADS, B + (long long)blockIdx.x * RF_WAVES * RF_COLS * RF_ROW_BYTES + pf * 128);
    RF_GRID_ENTER();
    const long long bz = blockIdx.y;
    const int lane = threadIdx.x % RF_WAVE, wave = threadIdx.x / RF_WAVE;
    // Batch bz's activations: its int8 values, then (after every batch's) its groups' d and d·Σq.
    const int* __restrict__ qa_w = (const int*)WS + bz * (RF_M * RF_K / 4);
    const rf_f2* __restrict__ ds = (const rf_f2*)(WS + RF_DS_AT) + bz * (RF_M * RF_BLOCKS);
    rf_wq w[RF_UNROLL][RF_COLS];
    rf_load_step(w, B, ((long long)blockIdx.x * RF_WAVES + wave) * RF_COLS, lane, 0);
{% else %}extern "C" __global__ void __launch_bounds__({{ threads }}) {{ entry }}(const {{ p.a_t }}* __restrict__ A, const unsigned char* __restrict__ B, {% for e in p.extras %}const {{ e.ctype }}* __restrict__ in{{ e.index }}, {% endfor %}{{ parts.norm_params(p) }}{{ p.c_t }}* __restrict__ C) {
    RF_GRID_ENTER();
    using namespace {{ entry }}_ns;
    __shared__ rf_i4 qa[RF_RUNS / 2];
    __shared__ rf_f4 qds[(RF_M * RF_BLOCKS + 1) / 2];
    const long long bz = blockIdx.y;
    const int lane = threadIdx.x % RF_WAVE, wave = threadIdx.x / RF_WAVE;
    const int* qa_w = (const int*)qa;
    const rf_f2* ds = (const rf_f2*)qds;
    // Step 0: the first step of the block's first group of rows, in flight during step 1.
    rf_wq w[RF_UNROLL][RF_COLS];
    rf_load_step(w, B, ((long long)blockIdx.x * RF_WAVES + wave) * RF_COLS, lane, 0);
{{ parts.norm_stats(p, "    ") }}    rf_quantize_a(A, bz, 0, RF_RUNS, (rf_i2*)qa, (rf_f2*)qds{% if p.prologue %}, rf_norm, NW{% if p.prologue.layer %}, NB{% endif %}{% endif %});
    __syncthreads();
{% endif %}    for (long long grp = blockIdx.x; grp < RF_GROUPS; grp += RF_GRID) {
        const long long n0 = (grp * RF_WAVES + wave) * RF_COLS;
        float acc[RF_M][RF_COLS];
#pragma unroll
        for (int m = 0; m < RF_M; ++m)
#pragma unroll
            for (int j = 0; j < RF_COLS; ++j) acc[m][j] = 0.0f;
        for (int s = 0; s < RF_STEPS; ++s) {
            if (s > 0 || grp != (long long)blockIdx.x) rf_load_step(w, B, n0, lane, s);
#pragma unroll
            for (int uu = 0; uu < RF_UNROLL; ++uu) {
                const int piece = lane + RF_WAVE * (RF_UNROLL * s + uu);
                if (piece < RF_PIECES) rf_dot(w[uu], piece, qa_w, ds, acc);
            }
        }
        // Every lane gets each row's sum; lane m·RF_COLS + j keeps (m, j) and stores it.
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
{{ parts.store(p, "            ") }}
        }
    }
}
