{% import "rope_parts.hip" as rope_parts -%}
// Flash-decoding (split K, combined by the last block): q [{{ b }}, {{ hq }}, {{ sq }}, {{ d }}], k/v [{{ b }}, {{ hkv }}, {{ sk }}, {{ d }}/{{ dv }}], scale {{ scale }}{% if causal %}, causal (k <= q + {{ offset_text }}, the offset clamped to [-Sq, Sk]){% endif %}{% if mask %}, {{ mask }} mask{% endif %}.
// A block serves all {{ rows }} query rows ({{ group }} heads x {{ sq }}) of one K/V head, so K/V are read once per group,
// over split blockIdx.y of the {{ valid_keys }} keys any row can see ({{ splits }} splits of {{ keys_per_split }}); it never
// reads past them. The kernel streams K/V: {{ lanes_per_key }} lanes hold one key's row in pieces of {{ vec }} element(s)
// ({{ vec * elem }} bytes), so a wave takes RF_WAVE / {{ lanes_per_key }} keys per load, and each lane requests the pieces of
// {{ unroll }} such keys before it uses the first, straight from global memory into registers. Each group of lanes runs its own
// online softmax (f32, base 2: Q is pre-scaled by scale * log2(e)) over the keys it took, with no barrier in the key
// loop; the groups of a wave merge by shuffles, and the block's {{ waves }} waves in one step at the end: each wave writes
// its rows (relative to its own maximum) and (m, l) to shared memory, one barrier, then each element is the sum over the
// waves in wave order, rescaled to the block's maximum.
{% if splits > 1 %}// Per (row, split) it writes the unnormalised output (Dv floats), then m and l, into the workspace; a split that
// sees no key of a row writes m = -inf, l = 0 and zeros, which the combine weighs by exp2(-inf) = 0. Then it counts
// itself in its K/V head's counter (release fence first); the block that counts last (acquire fence) combines the
// splits of its rows in split order, so the result does not depend on which block finished last, writes the output
// and puts the counter back to 0 for the next launch (the counters are zeroed once, when allocated, never poisoned).
{% if kv_len %}// The splits that run are those kv_len reaches (ceil(kv_len / {{ keys_per_split }}), at least one, at most {{ splits }}),
// known at run time: the grid has {{ splits }} in y for the largest context, and a block past the active ones returns at
// once, writing and counting nothing; the last of the active ones combines them. kv_len is read by every block of a
// launch alike, so the count a launch waits for is the count of blocks that count.
{% endif %}{% else %}// One split: the block normalises its merged rows and writes the output itself.
{% endif %}{% if append %}// Append form: the queries are rotated as they are loaded (rope, rotate-half, pairs (c, c + {{ append.half }}), at the positions
// `positions` holds; angles as rope_parts.hip computes them), rounded to the element type as a rope kernel's output
// would be. This step's {{ sq }} K/V row(s) of each head, cache rows start..start + {{ sq }}, are taken from k_new (rotated in
// registers) and v_new, never from the caches; split 0's block of each K/V head writes them into the caches (the
// cache writes read only by this attention have no kernel of their own), and every other block reads them from the
// inputs too, so no block reads a row another writes. A start outside 0..{{ append.max_start }} writes nothing and is recorded in
// `status` (as the cache write's kernel records it).
{{ rope_parts.table(entry ~ "_inv_freq", append.inv_freq) }}
{{ rope_parts.sincos(entry ~ "_sincos") }}
// Element `col` of `row` rotated at position `pos`, rounded to the element type (as the rope kernel stores it).
RF_INLINE {{ ctype }} {{ entry }}_rotated(const {{ ctype }}* row, int col, int pos) {
    const int p = col % {{ append.half }};
    float sn, cs;
    {{ entry }}_sincos((double)pos * {{ entry }}_inv_freq[p], &sn, &cs);
    const float a = {{ load_pre }}row[p]{{ load_post }}, b = {{ load_pre }}row[p + {{ append.half }}]{{ load_post }};
    const float r = col < {{ append.half }} ? a * cs - b * sn : b * cs + a * sn;
    return {{ store_pre }}r{{ store_post }};
}
{% endif %}// At least one block per SM (the second bound): without it the compiler trades a few spills for the next occupancy step.
extern "C" __global__ void __launch_bounds__({{ threads }}, 1) {{ entry }}(const {{ ctype }}* __restrict__ q, {% if append %}{{ ctype }}* __restrict__ k, {{ ctype }}* __restrict__ v{% else %}const {{ ctype }}* __restrict__ k, const {{ ctype }}* __restrict__ v{% endif %}, {% if mask %}const {{ mask_ctype }}* __restrict__ mask, {% endif %}{% if kv_len %}const int* __restrict__ kv_len, {% endif %}{% if append %}const int* __restrict__ positions, const {{ ctype }}* __restrict__ k_new, const {{ ctype }}* __restrict__ v_new, const int* __restrict__ start, unsigned long long* __restrict__ status, {% endif %}{% if splits > 1 %}float* __restrict__ ws, unsigned int* __restrict__ counters, {% endif %}{{ ctype }}* __restrict__ out) {
    RF_GRID_ENTER();
    constexpr int LPK = {{ lanes_per_key }};  // lanes holding one key's row
    constexpr int KPW = RF_WAVE / LPK;  // keys a wave takes per load
    constexpr int VEC = {{ vec }};  // elements per load
    constexpr int NK = {{ d // vec }}, NV = {{ dv // vec }};  // pieces of a K row, of a V row
    constexpr int PK = {{ pieces_k }}, PV = {{ pieces_v }};  // pieces a lane holds of each
    constexpr int U = {{ unroll }};  // keys per lane group whose loads are in flight together
    constexpr int STEP = {{ waves }} * KPW * U;  // keys per round of the block
    struct alignas({{ vec * elem }}) Piece { {{ ctype }} e[VEC]; };
    __shared__ float O[{{ waves }}][{{ rows }}][{{ dv }}];
    __shared__ float wave_m[{{ waves }}][{{ rows }}], wave_l[{{ waves }}][{{ rows }}];
    const int tid = threadIdx.x;
    const int wave = tid / RF_WAVE, lane = tid % RF_WAVE;
    const int kl = lane % LPK, kg = lane / LPK;  // the lane's place in its key's row; its key of the wave's KPW
    const int bkv = blockIdx.x, split = blockIdx.y;
    const int bi = bkv / {{ hkv }}, kvh = bkv % {{ hkv }};
    // Row r of the block is query head kvh * {{ group }} + r / {{ sq }}, position r % {{ sq }}: in q's and out's
    // order the group's rows are consecutive from row0.
    const long long row0 = ((long long)bi * {{ hq }} + (long long)kvh * {{ group }}) * {{ sq }};
    const long long kv_row0 = (long long)bkv * {{ sk }};
{% if append %}    const int at = start[0];
    const bool at_ok = at >= 0 && at <= {{ append.max_start }};
{% endif %}{% if window %}{% if kv_len %}    // Keys from kv_len on hold no value (an unwritten cache tail): never read. The queries are the last Sq of the
    // kv_len positions (causal offset kv_len - Sq).
    const int kv_given = kv_len[{% if kv_len == "batch" %}bi{% else %}0{% endif %}];
    const int kvn = kv_given < 0 ? 0 : (kv_given > {{ sk }} ? {{ sk }} : kv_given);  // clamped: never past the cache
    const long long kv_off = (long long)kvn - {{ sq }};
{% endif %}    // Sliding window of {{ window }}: no row sees a key at or before position 0's offset - {{ window }} (the earliest
    // window start), so the splits share the keys from win_lo on and none reads a key before it. A split that
    // reaches no key writes the empty split the combine weighs 0.
    const long long win_ll = (long long){{ offset }} - {{ window }}LL + 1;
    const int win_lo = win_ll <= 0 ? 0 : (int)win_ll;
    const int key_begin = (int)((long long)win_lo + (long long)split * {{ keys_per_split }});
    const long long split_end = (long long)key_begin + {{ keys_per_split }};
    const int {% if kv_len %}key_end_static{% else %}key_end{% endif %} = (int)(split_end < {{ valid_keys }}LL ? split_end : {{ valid_keys }}LL);
{% if kv_len %}    const int key_end = key_end_static < kvn ? key_end_static : kvn;
{% if splits > 1 %}    const int visible = kvn < {{ valid_keys }} ? kvn : {{ valid_keys }};
    const int wanted = (visible - win_lo + {{ keys_per_split - 1 }}) / {{ keys_per_split }};
    const int active = wanted < 1 ? 1 : (wanted > {{ splits }} ? {{ splits }} : wanted);
    // Uniform over the block (blockIdx and kv_len only), before any barrier.
    if (split >= active) return;
{% endif %}{% elif splits > 1 %}    constexpr int active = {{ splits }};
{% endif %}{% else %}    const int key_begin = (int)((long long)split * {{ keys_per_split }});
    const long long split_end = (long long)key_begin + {{ keys_per_split }};
    const int {% if kv_len %}key_end_static{% else %}key_end{% endif %} = (int)(split_end < {{ valid_keys }}LL ? split_end : {{ valid_keys }}LL);
{% if kv_len %}    // Keys from kv_len on hold no value (an unwritten cache tail): never read, so a split past kv_len does no work and
    // writes the empty split the combine weighs 0. The queries are the last Sq of the kv_len positions (causal offset
    // kv_len - Sq).
    const int kv_given = kv_len[{% if kv_len == "batch" %}bi{% else %}0{% endif %}];
    const int kvn = kv_given < 0 ? 0 : (kv_given > {{ sk }} ? {{ sk }} : kv_given);  // clamped: never past the cache
    const long long kv_off = (long long)kvn - {{ sq }};
    (void)kv_off;
    const int key_end = key_end_static < kvn ? key_end_static : kvn;
{% if splits > 1 %}    const int visible = kvn < {{ valid_keys }} ? kvn : {{ valid_keys }};
    const int wanted = (visible + {{ keys_per_split - 1 }}) / {{ keys_per_split }};
    const int active = wanted < 1 ? 1 : (wanted > {{ splits }} ? {{ splits }} : wanted);
    // Uniform over the block (blockIdx and kv_len only), before any barrier.
    if (split >= active) return;
{% endif %}{% elif splits > 1 %}    constexpr int active = {{ splits }};
{% endif %}{% endif %}    // Every lane holds the pieces kl, kl + LPK, ... of the Q rows (pre-scaled) and of its output rows.
    float qr[{{ rows }}][PK * VEC];
#pragma unroll
    for (int r = 0; r < {{ rows }}; ++r) {
        const Piece* qp = reinterpret_cast<const Piece*>(q + (row0 + r) * {{ d }});
#pragma unroll
        for (int i = 0; i < PK; ++i) {
            const int c = kl + i * LPK;
            Piece x;
#pragma unroll
            for (int e = 0; e < VEC; ++e) x.e[e] = 0;
            if (c < NK) x = qp[c];
{% if append %}#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                if (c < NK) x.e[e] = {{ entry }}_rotated(q + (row0 + r) * {{ d }}, c * VEC + e, positions[r % {{ sq }}]);
                qr[r][i * VEC + e] = {{ load_pre }}x.e[e]{{ load_post }} * {{ qscale }};
            }
{% else %}#pragma unroll
            for (int e = 0; e < VEC; ++e) qr[r][i * VEC + e] = {{ load_pre }}x.e[e]{{ load_post }} * {{ qscale }};
{% endif %}        }
    }
{% if append %}    // This step's rows into the caches, by split 0's block of each K/V head (always active), before any return.
    if (split == 0) {
        if (!at_ok) {
            if (bkv == 0 && tid == 0) {
                atomicMax(&status[0], ~0ull);
                status[1] = (unsigned long long)(long long)at;
            }
        } else {
            for (int t = tid; t < {{ sq * d }}; t += {{ threads }}) {
                const int nr = t / {{ d }}, col = t % {{ d }};
                k[(kv_row0 + at + nr) * {{ d }} + col] = {{ entry }}_rotated(k_new + ((long long)bkv * {{ sq }} + nr) * {{ d }}, col, positions[nr]);
            }
            for (int t = tid; t < {{ sq * dv }}; t += {{ threads }}) {
                const int nr = t / {{ dv }}, col = t % {{ dv }};
                v[(kv_row0 + at + nr) * {{ dv }} + col] = v_new[((long long)bkv * {{ sq }} + nr) * {{ dv }} + col];
            }
        }
    }
{% endif %}    float acc[{{ rows }}][PV * VEC], m[{{ rows }}], l[{{ rows }}];
#pragma unroll
    for (int r = 0; r < {{ rows }}; ++r) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int x = 0; x < PV * VEC; ++x) acc[r][x] = 0.0f;
    }
    // Every wave runs the same rounds (a key past key_end is neither read nor counted), so the shuffles never diverge.
    const int rounds = key_end > key_begin ? (key_end - key_begin + STEP - 1) / STEP : 0;
#pragma unroll 1
    for (int round = 0; round < rounds; ++round) {
        // The lane group's U keys, and all their K and V pieces requested before any is used.
        int key[U];
        Piece kr[U][PK], vr[U][PV];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            key[u] = key_begin + round * STEP + (u * {{ waves }} + wave) * KPW + kg;
{% if append %}            // A row of this step comes from k_new / v_new (row nr), every other from the caches.
            const int nr = key[u] - at;
            const bool fresh = key[u] < key_end && at_ok && nr >= 0 && nr < {{ sq }};
            const bool ok = key[u] < key_end;
            const Piece* kp = reinterpret_cast<const Piece*>(fresh ? k_new + ((long long)bkv * {{ sq }} + nr) * {{ d }} : k + (kv_row0 + (ok ? key[u] : 0)) * {{ d }});
            const Piece* vp = reinterpret_cast<const Piece*>(fresh ? v_new + ((long long)bkv * {{ sq }} + nr) * {{ dv }} : v + (kv_row0 + (ok ? key[u] : 0)) * {{ dv }});
{% else %}            const bool ok = key[u] < key_end;
            const Piece* kp = reinterpret_cast<const Piece*>(k + (kv_row0 + (ok ? key[u] : 0)) * {{ d }});
            const Piece* vp = reinterpret_cast<const Piece*>(v + (kv_row0 + (ok ? key[u] : 0)) * {{ dv }});
{% endif %}#pragma unroll
            for (int i = 0; i < PK; ++i) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) kr[u][i].e[e] = 0;
                if (ok && kl + i * LPK < NK) kr[u][i] = kp[kl + i * LPK];
{% if append %}                if (fresh && kl + i * LPK < NK) {
                    // Rotated in registers, from the row's other half read where it lies.
                    const {{ ctype }}* kn = k_new + ((long long)bkv * {{ sq }} + nr) * {{ d }};
#pragma unroll
                    for (int e = 0; e < VEC; ++e) kr[u][i].e[e] = {{ entry }}_rotated(kn, (kl + i * LPK) * VEC + e, positions[nr]);
                }
{% endif %}            }
#pragma unroll
            for (int i = 0; i < PV; ++i) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) vr[u][i].e[e] = 0;
                if (ok && kl + i * LPK < NV) vr[u][i] = vp[kl + i * LPK];
            }
        }
        // Scores, base 2, summed over the LPK lanes of a key; keys past key_end, masked or after the row's causal
        // end are -inf.
        float s[U][{{ rows }}];
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
            for (int r = 0; r < {{ rows }}; ++r) {
                float dot = 0.0f;
#pragma unroll
                for (int i = 0; i < PK; ++i)
#pragma unroll
                    for (int e = 0; e < VEC; ++e) dot += qr[r][i * VEC + e] * {{ load_pre }}kr[u][i].e[e]{{ load_post }};
#pragma unroll
                for (int o = LPK / 2; o > 0; o >>= 1) dot += rf_shfl_xor(dot, o);
                const int j = key[u];
                const int h = kvh * {{ group }} + r / {{ sq }}, qi = r % {{ sq }};
                float x = -INFINITY;
                if (j < key_end) {
                    x = dot;
{% if mask == "additive" %}                    x = x + {{ mask_load_pre }}mask[(long long)bi * {{ ms[0] }} + (long long)h * {{ ms[1] }} + (long long)qi * {{ ms[2] }} + (long long)j * {{ ms[3] }}]{{ mask_load_post }} * {{ log2e }};
{% elif mask == "boolean" %}                    if (!mask[(long long)bi * {{ ms[0] }} + (long long)h * {{ ms[1] }} + (long long)qi * {{ ms[2] }} + (long long)j * {{ ms[3] }}]) x = -INFINITY;
{% else %}                    (void)h;
{% endif %}{% if causal %}                    if ((long long)j > (long long)qi + {{ offset }}) x = -INFINITY;
{% if window %}                    if ((long long)j <= (long long)qi + {{ offset }} - {{ window }}LL) x = -INFINITY;
{% endif %}{% else %}                    (void)qi;
{% endif %}                }
                s[u][r] = x;
            }
        }
        // Online softmax over the U keys at once: one rescale of the accumulators per round.
#pragma unroll
        for (int r = 0; r < {{ rows }}; ++r) {
            float mx = m[r];
#pragma unroll
            for (int u = 0; u < U; ++u) mx = fmaxf(mx, s[u][r]);
            // No visible key yet: every p is exp2(-inf) = 0 and the accumulators stay 0.
            const float base = mx == -INFINITY ? 0.0f : mx;
            const float corr = exp2f(m[r] - base);
            float sum = l[r] * corr;
#pragma unroll
            for (int x = 0; x < PV * VEC; ++x) acc[r][x] *= corr;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const float p = exp2f(s[u][r] - base);
                sum += p;
#pragma unroll
                for (int i = 0; i < PV; ++i)
#pragma unroll
                    for (int e = 0; e < VEC; ++e) acc[r][i * VEC + e] += p * {{ load_pre }}vr[u][i].e[e]{{ load_post }};
            }
            l[r] = sum;
            m[r] = mx;
        }
    }
{%- include "decode_merge.hip" -%}
