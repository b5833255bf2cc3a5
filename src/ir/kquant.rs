//! ggml's block formats beyond Q8_0/Q4_0/Q4_1: the 5-bit blocks of 32 (Q5_0, Q5_1), IQ4_NL and
//! the k-quants (super-blocks of 256: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K).
//!
//! One function per scheme; each reads exactly one block and writes its values in f32, in the
//! order of operations of ggml's `dequantize_row_*` (`ggml/src/ggml-quants.c`, quoted above each
//! function) so the f32 bits are ggml's: every product is formed as written there, left to
//! right, with no fused multiply-add. Byte offsets are those of the block structs in
//! `ggml-common.h` (all fields little-endian, no padding). A block here is always exactly the
//! scheme's block bytes (the caller slices it), so every index below is in bounds.

use half::f16;

/// Values in a k-quant super-block (ggml's `QK_K`).
pub const QK_K: usize = 256;

/// `block_q5_0`: 2 (`d`) + 4 (`qh`) + 16 (`qs`).
pub const Q5_0_BYTES: usize = 22;
/// `block_q5_1`: 2 (`d`) + 2 (`m`) + 4 (`qh`) + 16 (`qs`).
pub const Q5_1_BYTES: usize = 24;
/// `block_iq4_nl`: 2 (`d`) + 16 (`qs`).
pub const IQ4_NL_BYTES: usize = 18;
/// `block_q2_K`: 16 (`scales`) + 64 (`qs`) + 2 (`d`) + 2 (`dmin`).
pub const Q2_K_BYTES: usize = 84;
/// `block_q3_K`: 32 (`hmask`) + 64 (`qs`) + 12 (`scales`) + 2 (`d`).
pub const Q3_K_BYTES: usize = 110;
/// `block_q4_K`: 2 (`d`) + 2 (`dmin`) + 12 (`scales`) + 128 (`qs`).
pub const Q4_K_BYTES: usize = 144;
/// `block_q5_K`: 2 (`d`) + 2 (`dmin`) + 12 (`scales`) + 32 (`qh`) + 128 (`qs`).
pub const Q5_K_BYTES: usize = 176;
/// `block_q6_K`: 128 (`ql`) + 64 (`qh`) + 16 (`scales`, i8) + 2 (`d`).
pub const Q6_K_BYTES: usize = 210;
/// `block_q8_K`: 4 (`d`, f32) + 256 (`qs`, i8) + 32 (`bsums`, 16 × i16, unused by dequantization).
pub const Q8_K_BYTES: usize = 292;

/// IQ4_NL's non-linear 4-bit grid (ggml's `kvalues_iq4nl`).
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// ```c
/// const uint32_t qh; memcpy(&qh, x[i].qh, sizeof(qh));
/// const uint8_t xh_0 = ((qh >> (j +  0)) << 4) & 0x10;
/// const uint8_t xh_1 = ((qh >> (j + 12))     ) & 0x10;
/// const int32_t x0 = ((x[i].qs[j] & 0x0F) | xh_0) - 16;
/// const int32_t x1 = ((x[i].qs[j] >>   4) | xh_1) - 16;
/// y[i*qk + j + 0   ] = x0*d;
/// y[i*qk + j + qk/2] = x1*d;
/// ```
pub fn q5_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    for j in 0..16 {
        let lo = i32::from(b[6 + j] & 0xF) | (((qh >> j) << 4) & 0x10) as i32;
        let hi = i32::from(b[6 + j] >> 4) | ((qh >> (j + 12)) & 0x10) as i32;
        out[j] = (lo - 16) as f32 * d;
        out[j + 16] = (hi - 16) as f32 * d;
    }
}

/// As Q5_0 without the −16, plus the minimum: `y = x0*d + m`.
pub fn q5_1(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    for j in 0..16 {
        let lo = u32::from(b[8 + j] & 0xF) | (((qh >> j) << 4) & 0x10);
        let hi = u32::from(b[8 + j] >> 4) | ((qh >> (j + 12)) & 0x10);
        out[j] = lo as f32 * d + m;
        out[j + 16] = hi as f32 * d + m;
    }
}

/// ```c
/// y[j+     0] = d * kvalues_iq4nl[qs[j] & 0xf];
/// y[j+QK4_NL/2] = d * kvalues_iq4nl[qs[j] >>  4];
/// ```
pub fn iq4_nl(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for j in 0..16 {
        out[j] = d * f32::from(KVALUES_IQ4NL[usize::from(b[2 + j] & 0xF)]);
        out[j + 16] = d * f32::from(KVALUES_IQ4NL[usize::from(b[2 + j] >> 4)]);
    }
}

/// ```c
/// for (int n = 0; n < QK_K; n += 128) { int shift = 0;
///   for (int j = 0; j < 4; ++j) {
///     uint8_t sc = x[i].scales[is++];
///     float dl = d * (sc & 0xF); float ml = min * (sc >> 4);
///     for (int l = 0; l < 16; ++l) *y++ = dl * ((int8_t)((q[l] >> shift) & 3)) - ml;
///     sc = x[i].scales[is++]; dl = d * (sc & 0xF); ml = min * (sc >> 4);
///     for (int l = 0; l < 16; ++l) *y++ = dl * ((int8_t)((q[l+16] >> shift) & 3)) - ml;
///     shift += 2; }
///   q += 32; }
/// ```
/// Element `e`: byte `32·(e/128) + e%32` of `qs`, bits `2·((e/32)%4)`; scale `e/16`.
pub fn q2_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 80);
    let dmin = f16_at(b, 82);
    for (e, o) in out.iter_mut().enumerate().take(QK_K) {
        let sc = b[e / 16];
        let dl = d * f32::from(sc & 0xF);
        let ml = dmin * f32::from(sc >> 4);
        let q = (b[16 + 32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
        *o = dl * f32::from(q) - ml;
    }
}

/// The 16 six-bit scales of Q3_K, `− 32` (ggml unpacks them with `kmask1`/`kmask2` into
/// `aux`): scale `s` has its low 4 bits in byte `s % 8` (nibble `s / 8`) and its high 2 bits in
/// byte `8 + s % 4`, bits `2·(s / 4)`.
fn q3_k_scale(scales: &[u8], s: usize) -> i32 {
    let low = (scales[s % 8] >> (4 * (s / 8))) & 0xF;
    let high = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
    i32::from(low | (high << 4)) - 32
}

/// ```c
/// const float d_all = GGML_FP16_TO_FP32(x[i].d);
/// dl = d_all * (scales[is++] - 32);
/// *y++ = dl * ((int8_t)((q[l+ 0] >> shift) & 3) - ((hm[l+ 0] & m) ? 0 : 4));
/// ```
/// Element `e`: low bits as Q2_K's, high bit `e/32` of `hmask[e%32]` (clear means −4).
pub fn q3_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 108);
    let scales = &b[96..108];
    for (e, o) in out.iter_mut().enumerate().take(QK_K) {
        let dl = d * q3_k_scale(scales, e / 16) as f32;
        let low = i32::from((b[32 + 32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3);
        let high = if b[e % 32] & (1 << (e / 32)) != 0 {
            0
        } else {
            4
        };
        *o = dl * (low - high) as f32;
    }
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and minimum of sub-block `j` (0..8) of Q4_K/Q5_K.
/// ```c
/// if (j < 4) { *d = q[j] & 63; *m = q[j + 4] & 63; }
/// else { *d = (q[j+4] & 0xF) | ((q[j-4] >> 6) << 4); *m = (q[j+4] >> 4) | ((q[j-0] >> 6) << 4); }
/// ```
pub fn scale_min_k4(q: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// ```c
/// get_scale_min_k4(is + 0, x[i].scales, &sc, &m);
/// const float d1 = d * sc; const float m1 = min * m;
/// for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;   // then q[l] >> 4 with is + 1
/// ```
/// Element `e`: sub-block `e/32`, byte `32·(e/64) + e%32` of `qs`, nibble `(e/32)%2`.
pub fn q4_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    for (e, o) in out.iter_mut().enumerate().take(QK_K) {
        let (sc, m) = scale_min_k4(&b[4..16], e / 32);
        let q = (b[16 + 32 * (e / 64) + e % 32] >> (4 * ((e / 32) % 2))) & 0xF;
        *o = d * f32::from(sc) * f32::from(q) - dmin * f32::from(m);
    }
}

/// Q4_K's nibbles plus a fifth bit: bit `e/32` of `qh[e%32]`.
/// ```c
/// *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
/// ```
pub fn q5_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    for (e, o) in out.iter_mut().enumerate().take(QK_K) {
        let (sc, m) = scale_min_k4(&b[4..16], e / 32);
        let low = (b[48 + 32 * (e / 64) + e % 32] >> (4 * ((e / 32) % 2))) & 0xF;
        let high = if b[16 + e % 32] & (1 << (e / 32)) != 0 {
            16
        } else {
            0
        };
        *o = d * f32::from(sc) * f32::from(low + high) - dmin * f32::from(m);
    }
}

/// ```c
/// const int8_t q1 = (int8_t)((ql[l +  0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
/// y[l +  0] = d * sc[is + 0] * q1;   // q2..q4 at l + 32, 64, 96: ql[l+32], ql >> 4, qh >> 2·k
/// ```
/// Element `e` (half `h = e/128`, `r = e%128`): low nibble `r/64` of `ql[64h + r%64]`, high 2
/// bits `2·(r/32)` of `qh[32h + r%32]`; scale `e/16`.
pub fn q6_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 208);
    for (e, o) in out.iter_mut().enumerate().take(QK_K) {
        let (h, r) = (e / 128, e % 128);
        let low = (b[64 * h + r % 64] >> (4 * (r / 64))) & 0xF;
        let high = (b[128 + 32 * h + r % 32] >> (2 * (r / 32))) & 3;
        let q = i32::from(low | (high << 4)) - 32;
        let sc = f32::from(b[192 + e / 16] as i8);
        *o = d * sc * q as f32;
    }
}

/// ```c
/// for (int j = 0; j < QK_K; ++j) *y++ = x[i].d * x[i].qs[j];
/// ```
pub fn q8_k(b: &[u8], out: &mut [f32]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (o, &q) in out.iter_mut().zip(&b[4..4 + QK_K]) {
        *o = d * f32::from(q as i8);
    }
}
