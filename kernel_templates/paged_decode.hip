{% import "rope_parts.hip" as rope_parts -%}
// Paged flash-decoding (split K, combined by the last block): q [{{ b }}, {{ hq }}, {{ sq }}, {{ d }}], K/V pools [{{ num_blocks }}, {{ hkv }}, {{ block_size }}, {{ d }}/{{ dv }}],
// block table [{{ b }}, {{ max_blocks }}], kv_len [{{ b }}], scale {{ scale }}, causal with the queries the last {{ sq }} of each sequence's kv_len keys.
// The structure and tiling are flash_decode.hip's (a block serves all {{ rows }} query rows ({{ group }} heads x {{ sq }}) of one
// K/V head of one sequence over split blockIdx.y of its keys ({{ splits }} splits of {{ keys_per_split }} for a full table of {{ sk }});
// {{ lanes_per_key }} lanes hold a key's row in pieces of {{ vec }} element(s); online softmax in f32, base 2; the waves merge in one
// step; the last block of a K/V head combines the splits in split order). What differs is where a key's row lies:
// key j of sequence b is row j % {{ block_size }} of block table[b][j / {{ block_size }}] of the pool, at
// ((block * {{ hkv }} + kv head) * {{ block_size }} + j % {{ block_size }}) rows from the pool's start. kv_len is clamped to 0..{{ sk }}, and
// a key whose block id lies outside 0..{{ num_blocks }} is invisible (never read), so no load leaves the pools.
{% if splits > 1 %}// Per (row, split) it writes the unnormalised output and (m, l) into the workspace and counts itself in its K/V head's
// counter; a block past the splits kv_len reaches returns at once, and the last active block to count combines and puts
// the counter back to 0 (zeroed once, when allocated, never poisoned).
{% else %}// One split: the block normalises its merged rows and writes the output itself.
{% endif %}{% if append %}// Append form: q holds this step's rows before rope, [1, {{ hq }}, {{ b * sq }}, {{ d }}] (sequence-major, as k_new), rotated as they are
// loaded (rope, rotate-half, pairs (c, c + {{ append.half }}), at the positions `positions` holds; angles as rope_parts.hip
// computes them) and rounded to the element type as a rope kernel's output would be. Split 0's block of each (sequence,
// K/V head) writes that sequence's {{ sq }} new row(s) of its head into the pools at their slots (K rotated), as the paged
// write's kernel would (a negative slot or one past the pool writes nothing; of two rows naming one slot the later is
// written): the paged cache writes read only by this attention have no kernel of their own. Every block, the writer
// included, takes key j = kv_len - {{ sq }} + n (n < {{ sq }}) from k_new (rotated in registers) and v_new instead of the pool
// when the table puts it at slots[n]: so no block reads a row another block writes. A key of another sequence's new
// slot is never read: the block pool gives each slot to one sequence, and shared prefix blocks are full.
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
extern "C" __global__ void __launch_bounds__({{ threads }}, 1) {{ entry }}(const {{ ctype }}* __restrict__ q, {% if append %}{{ ctype }}* __restrict__ k, {{ ctype }}* __restrict__ v{% else %}const {{ ctype }}* __restrict__ k, const {{ ctype }}* __restrict__ v{% endif %}, const int* __restrict__ table, const int* __restrict__ kv_len, {% if append %}const int* __restrict__ positions, const {{ ctype }}* __restrict__ k_new, const {{ ctype }}* __restrict__ v_new, const int* __restrict__ slots, {% endif %}{% if splits > 1 %}float* __restrict__ ws, unsigned int* __restrict__ counters, {% endif %}{{ ctype }}* __restrict__ out) {
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
    const int* const blocks = table + (long long)bi * {{ max_blocks }};  // this sequence's block table
{% if window %}    // The queries are the last Sq of the kv_len positions (causal offset kv_len - Sq); kv_len is clamped to the table.
    const int kv_given = kv_len[bi];
    const int kvn = kv_given < 0 ? 0 : (kv_given > {{ sk }} ? {{ sk }} : kv_given);
    const long long kv_off = (long long)kvn - {{ sq }};
    // Sliding window of {{ window }}: no row sees a key at or before kv_off - {{ window }} (position 0's window start), so the
    // splits share the keys from win_lo on: neither the keys nor the block-table entries before it are read. A split
    // that reaches no key writes the empty split the combine weighs 0.
    const long long win_ll = kv_off - {{ window }}LL + 1;
    const int win_lo = win_ll <= 0 ? 0 : (int)win_ll;
    const int key_begin = (int)((long long)win_lo + (long long)split * {{ keys_per_split }});
    const long long split_end = (long long)key_begin + {{ keys_per_split }};
    const int key_end_static = (int)(split_end < {{ valid_keys }}LL ? split_end : {{ valid_keys }}LL);
    const int key_end = key_end_static < kvn ? key_end_static : kvn;
{% if splits > 1 %}    const int visible = kvn < {{ valid_keys }} ? kvn : {{ valid_keys }};
    const int wanted = (visible - win_lo + {{ keys_per_split - 1 }}) / {{ keys_per_split }};
    const int active = wanted < 1 ? 1 : (wanted > {{ splits }} ? {{ splits }} : wanted);
    // Uniform over the block (blockIdx and kv_len only), before any barrier.
    if (split >= active) return;
{% endif %}{% else %}    const int key_begin = (int)((long long)split * {{ keys_per_split }});
    const long long split_end = (long long)key_begin + {{ keys_per_split }};
    const int key_end_static = (int)(split_end < {{ valid_keys }}LL ? split_end : {{ valid_keys }}LL);
    // Keys from kv_len on hold no value (an unwritten cache tail): never read, so a split past kv_len does no work and
    // writes the empty split the combine weighs 0. The queries are the last Sq of the kv_len positions (causal offset
    // kv_len - Sq).
    const int kv_given = kv_len[bi];
    const int kvn = kv_given < 0 ? 0 : (kv_given > {{ sk }} ? {{ sk }} : kv_given);  // clamped: never past the table
    const long long kv_off = (long long)kvn - {{ sq }};
    (void)kv_off;
    const int key_end = key_end_static < kvn ? key_end_static : kvn;
{% if splits > 1 %}    const int visible = kvn < {{ valid_keys }} ? kvn : {{ valid_keys }};
    const int wanted = (visible + {{ keys_per_split - 1 }}) / {{ keys_per_split }};
    const int active = wanted < 1 ? 1 : (wanted > {{ splits }} ? {{ splits }} : wanted);
    // Uniform over the block (blockIdx and kv_len only), before any barrier.
    if (split >= active) return;
{% endif %}{% endif %}    // Every lane holds the pieces kl, kl + LPK, ... of the Q rows (pre-scaled) and of its output rows.
    float qr[{{ rows }}][PK * VEC];
#pragma unroll
    for (int r = 0; r < {{ rows }}; ++r) {
{% if append %}        // Row r's query (head kvh * {{ group }} + r / {{ sq }}, position r % {{ sq }}) among this step's rows.
        const int qrow = bi * {{ sq }} + r % {{ sq }};
        const {{ ctype }}* qrow_p = q + ((long long)(kvh * {{ group }} + r / {{ sq }}) * {{ b * sq }} + qrow) * {{ d }};
        const Piece* qp = reinterpret_cast<const Piece*>(qrow_p);
{% else %}        const Piece* qp = reinterpret_cast<const Piece*>(q + (row0 + r) * {{ d }});
{% endif %}#pragma unroll
        for (int i = 0; i < PK; ++i) {
            const int c = kl + i * LPK;
            Piece x;
#pragma unroll
            for (int e = 0; e < VEC; ++e) x.e[e] = 0;
            if (c < NK) x = qp[c];
{% if append %}#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                if (c < NK) x.e[e] = {{ entry }}_rotated(qrow_p, c * VEC + e, positions[qrow]);
                qr[r][i * VEC + e] = {{ load_pre }}x.e[e]{{ load_post }} * {{ qscale }};
            }
{% else %}#pragma unroll
            for (int e = 0; e < VEC; ++e) qr[r][i * VEC + e] = {{ load_pre }}x.e[e]{{ load_post }} * {{ qscale }};
{% endif %}        }
    }
{% if append %}    // This step's rows of this sequence and K/V head into the pools, by split 0's block (always active), at their
    // slots; a slot outside the pool, or one a later row of the step names, is skipped (as the paged write's kernel).
    const int* const new_slots = slots + bi * {{ sq }};
    if (split == 0) {
        for (int t = tid; t < {{ sq * d }}; t += {{ threads }}) {
            const int nr = t / {{ d }}, col = t % {{ d }};
            const int slot = new_slots[nr];
            bool write = slot >= 0 && (long long)slot < {{ num_blocks * block_size }}LL;
            for (int later = bi * {{ sq }} + nr + 1; write && later < {{ b * sq }}; ++later) write = slots[later] != slot;
            if (write)
                k[(((long long)(slot / {{ block_size }}) * {{ hkv }} + kvh) * {{ block_size }} + slot % {{ block_size }}) * {{ d }} + col] =
                    {{ entry }}_rotated(k_new + ((long long)kvh * {{ b * sq }} + bi * {{ sq }} + nr) * {{ d }}, col, positions[bi * {{ sq }} + nr]);
        }
        for (int t = tid; t < {{ sq * dv }}; t += {{ threads }}) {
            const int nr = t / {{ dv }}, col = t % {{ dv }};
            const int slot = new_slots[nr];
            bool write = slot >= 0 && (long long)slot < {{ num_blocks * block_size }}LL;
            for (int later = bi * {{ sq }} + nr + 1; write && later < {{ b * sq }}; ++later) write = slots[later] != slot;
            if (write)
                v[(((long long)(slot / {{ block_size }}) * {{ hkv }} + kvh) * {{ block_size }} + slot % {{ block_size }}) * {{ dv }} + col] =
                    v_new[((long long)kvh * {{ b * sq }} + bi * {{ sq }} + nr) * {{ dv }} + col];
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
        bool okk[U];
        Piece kr[U][PK], vr[U][PV];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            key[u] = key_begin + round * STEP + (u * {{ waves }} + wave) * KPW + kg;
            // The key's block through the table; a block outside the pool makes the key invisible.
            const int blk = key[u] < key_end ? blocks[key[u] / {{ block_size }}] : -1;
            const bool ok = blk >= 0 && blk < {{ num_blocks }};
            okk[u] = ok;
            const long long prow = ok ? ((long long)blk * {{ hkv }} + kvh) * {{ block_size }} + key[u] % {{ block_size }} : 0;
{% if append %}            // A key of this step whose table slot is its row's slot comes from k_new / v_new (row nr), every other
            // from the pools.
            const int nr = (int)((long long)key[u] - kv_off);
            const bool fresh = ok && nr >= 0 && nr < {{ sq }} && (long long)new_slots[ok && nr >= 0 && nr < {{ sq }} ? nr : 0] == (long long)blk * {{ block_size }} + key[u] % {{ block_size }};
            const long long nrow = (long long)kvh * {{ b * sq }} + bi * {{ sq }} + (fresh ? nr : 0);
            const Piece* kp = reinterpret_cast<const Piece*>(fresh ? k_new + nrow * {{ d }} : k + prow * {{ d }});
            const Piece* vp = reinterpret_cast<const Piece*>(fresh ? v_new + nrow * {{ dv }} : v + prow * {{ dv }});
{% else %}            const Piece* kp = reinterpret_cast<const Piece*>(k + prow * {{ d }});
            const Piece* vp = reinterpret_cast<const Piece*>(v + prow * {{ dv }});
{% endif %}#pragma unroll
            for (int i = 0; i < PK; ++i) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) kr[u][i].e[e] = 0;
                if (ok && kl + i * LPK < NK) kr[u][i] = kp[kl + i * LPK];
{% if append %}                if (fresh && kl + i * LPK < NK) {
                    // Rotated in registers, from the row's other half read where it lies.
#pragma unroll
                    for (int e = 0; e < VEC; ++e) kr[u][i].e[e] = {{ entry }}_rotated(k_new + nrow * {{ d }}, (kl + i * LPK) * VEC + e, positions[bi * {{ sq }} + nr]);
                }
{% endif %}            }
#pragma unroll
            for (int i = 0; i < PV; ++i) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) vr[u][i].e[e] = 0;
                if (ok && kl + i * LPK < NV) vr[u][i] = vp[kl + i * LPK];
            }
        }
        // Scores, base 2, summed over the LPK lanes of a key; keys past key_end, in a block outside the pool or
        // after the row's causal end (kv_len - Sq + its position) are -inf.
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
                const int qi = r % {{ sq }};
                float x = -INFINITY;
                if (okk[u]) {
                    x = dot;
                    if ((long long)j > (long long)qi + {{ offset }}) x = -INFINITY;
{% if window %}                    if ((long long)j <= (long long)qi + {{ offset }} - {{ window }}LL) x = -INFINITY;
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
