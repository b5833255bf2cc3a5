//! Microscaling (OCP MX) blocks: 32 small floats sharing one E8M0 scale (a power of two).
//!
//! - MXFP4 is ggml's `block_mxfp4` (GGUF type 39, gpt-oss files): 1 byte `e`, 16 bytes of E2M1
//!   nibbles in Q4_0's order (byte `j`: element `j` low, `j + 16` high). ggml stores the E2M1
//!   values doubled (`kvalues_mxfp4`, integers) and halves the scale instead
//!   (`GGML_E8M0_TO_FP32_HALF`), so `e = 255` is the finite 2¹²⁷ there, not NaN:
//!   ```c
//!   const float d = GGML_E8M0_TO_FP32_HALF(x[i].e);
//!   y[i*qk + j + 0   ] = kvalues_mxfp4[x[i].qs[j] & 0x0F]*d;
//!   y[i*qk + j + qk/2] = kvalues_mxfp4[x[i].qs[j] >>   4]*d;
//!   ```
//! - MXFP6 (E2M3 and E3M2, which GGUF lacks) is an IR scheme of ours, as the OCP MX spec v1.0
//!   defines the values: 1 byte E8M0 scale `e` (2^(e − 127); 255 is NaN), then 24 bytes holding
//!   32 six-bit codes as a little-endian bit stream (code `i` is bits `6i..6i + 6`: every 3
//!   bytes hold 4 codes). E2M3: sign, 2 exponent bits (bias 1), 3 mantissa bits, max 7.5.
//!   E3M2: sign, 3 exponent bits (bias 3), 2 mantissa bits, max 28. No inf or NaN codes.
//!   Value = `scale · element`, one f32 product (exact but for underflow: both are exact in f32).

/// `block_mxfp4`: 1 (`e`) + 16 (`qs`).
pub const MXFP4_BYTES: usize = 17;
/// 1 (`e`) + 24 bytes of 32 six-bit codes.
pub const MXFP6_BYTES: usize = 25;

/// ggml's `kvalues_mxfp4`: the E2M1 values, doubled.
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// ggml's `ggml_e8m0_to_fp32_half`: 2^(e − 128) built from its bits (a subnormal for e < 2).
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

/// The OCP E8M0 scale: 2^(e − 127), NaN for 255 (e = 0 is the subnormal 2⁻¹²⁷).
pub fn e8m0_to_f32(e: u8) -> f32 {
    match e {
        255 => f32::NAN,
        0 => f32::from_bits(0x0040_0000),
        _ => f32::from_bits(u32::from(e) << 23),
    }
}

pub fn mxfp4(b: &[u8], out: &mut [f32]) {
    let d = e8m0_to_f32_half(b[0]);
    for j in 0..16 {
        out[j] = f32::from(KVALUES_MXFP4[usize::from(b[1 + j] & 0xF)]) * d;
        out[j + 16] = f32::from(KVALUES_MXFP4[usize::from(b[1 + j] >> 4)]) * d;
    }
}

/// The 6-bit code `i` (0..32) of an MXFP6 block's 24 code bytes.
pub fn fp6_code(codes: &[u8], i: usize) -> u8 {
    let at = 3 * (i / 4);
    let w = u32::from(codes[at]) | u32::from(codes[at + 1]) << 8 | u32::from(codes[at + 2]) << 16;
    ((w >> (6 * (i % 4))) & 63) as u8
}

/// The value of a six-bit float code with `mant` mantissa bits (3: E2M3, 2: E3M2); exact in f32.
pub fn fp6_value(code: u8, mant: u32) -> f32 {
    let bias = if mant == 3 { 1 } else { 3 };
    let e = i32::from((code & 0x1F) >> mant);
    let m = f32::from(code & ((1 << mant) - 1));
    let one = (1u32 << mant) as f32;
    // Subnormals: m/2^mant · 2^(1 − bias); normals: (1 + m/2^mant) · 2^(e − bias).
    let mag = if e == 0 {
        m / one * 2f32.powi(1 - bias)
    } else {
        (1.0 + m / one) * 2f32.powi(e - bias)
    };
    if code & 0x20 != 0 {
        -mag
    } else {
        mag
    }
}

/// An MXFP6 block whose codes have `mant` mantissa bits.
pub fn mxfp6(b: &[u8], out: &mut [f32], mant: u32) {
    let x = e8m0_to_f32(b[0]);
    for (i, o) in out.iter_mut().enumerate().take(32) {
        *o = x * fp6_value(fp6_code(&b[1..], i), mant);
    }
}
