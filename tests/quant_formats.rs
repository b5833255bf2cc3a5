//! Every block scheme dequantizes bit for bit as the reference does: the blocks and values in
//! `tests/data/quant/` were written by `scripts/quant-reference.py` with the `gguf` package
//! (llama.cpp's gguf-py, the Python twin of ggml's `dequantize_row_*`; Q8_K and the MXFP6
//! schemes from their definitions in numpy). And random bytes of any scheme never panic.

use std::path::PathBuf;

use rand::{Rng, SeedableRng};
use rocmforge::frontend::GgmlType;
use rocmforge::ir::{random_quant, DType, QuantError, QuantScheme, QuantTensor, Shape};

fn data(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/quant")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The reference blocks of `scheme` and their values.
fn reference(scheme: QuantScheme) -> (Vec<u8>, Vec<f32>) {
    let blocks = data(&format!("{}.bin", scheme.name()));
    let values = data(&format!("{}.f32", scheme.name()))
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (blocks, values)
}

/// The same f32, bit for bit, or both NaN (a NaN's payload is the hardware's, not the format's).
fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

fn assert_same(what: &str, got: &[f32], want: &[f32], elems: usize) {
    assert_eq!(got.len(), want.len(), "{what}: value count");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            same(g, w),
            "{what}: block {} element {}: {g:e} ({:#010x}) but the reference has {w:e} ({:#010x})",
            i / elems,
            i % elems,
            g.to_bits(),
            w.to_bits()
        );
    }
}

#[test]
fn every_scheme_matches_the_reference_bit_for_bit() {
    for scheme in QuantScheme::ALL {
        let (blocks, want) = reference(scheme);
        let n = blocks.len() / scheme.block_bytes();
        assert!(n >= 6, "{scheme}: {n} reference blocks");
        assert_eq!(
            blocks.len(),
            n * scheme.block_bytes(),
            "{scheme}: whole blocks"
        );
        // As one row and as rows of one block: the layout does not change the values.
        let row = Shape(vec![n * scheme.block_elems()]);
        let got = scheme.dequantize(&blocks, &row).unwrap();
        assert_same(scheme.name(), &got, &want, scheme.block_elems());
        let rows = Shape(vec![n, scheme.block_elems()]);
        let t = QuantTensor::new(scheme, rows, blocks.clone()).unwrap();
        let got = t.to_tensor(DType::F32).unwrap().to_f64_vec();
        let got: Vec<f32> = got.into_iter().map(|v| v as f32).collect();
        assert_same(scheme.name(), &got, &want, scheme.block_elems());
        // The reference is not trivial: most values are finite and not all equal.
        let finite: Vec<f32> = want.iter().copied().filter(|v| v.is_finite()).collect();
        assert!(
            finite.len() * 2 > want.len(),
            "{scheme}: mostly finite values"
        );
        assert!(
            finite.iter().any(|&v| v != finite[0]),
            "{scheme}: distinct values"
        );
    }
}

#[test]
fn gguf_types_read_as_their_schemes() {
    let mut seen = Vec::new();
    for ty in GgmlType::ALL {
        let Some(scheme) = ty.quant_scheme() else {
            continue;
        };
        seen.push(scheme);
        assert_eq!(ty.block_elements(), scheme.block_elems(), "{ty}");
        assert_eq!(ty.block_bytes(), scheme.block_bytes(), "{ty}");
        let (blocks, want) = reference(scheme);
        let mut got = vec![0f32; want.len()];
        assert_eq!(ty.bytes_for(want.len()), Some(blocks.len()), "{ty}");
        ty.dequantize_into(&blocks, &mut got);
        assert_same(ty.name(), &got, &want, scheme.block_elems());
    }
    // Every GGUF-backed scheme has its type; MXFP6 is ours alone.
    for scheme in QuantScheme::ALL {
        let in_gguf = !matches!(scheme, QuantScheme::Mxfp6E2m3 | QuantScheme::Mxfp6E3m2);
        assert_eq!(seen.contains(&scheme), in_gguf, "{scheme}");
    }
    // The types people download: Q4_K_M is Q4_K and Q6_K blocks.
    assert_eq!(
        GgmlType::from_id(12).and_then(GgmlType::quant_scheme),
        Some(QuantScheme::Q4K)
    );
    assert_eq!(
        GgmlType::from_id(14).and_then(GgmlType::quant_scheme),
        Some(QuantScheme::Q6K)
    );
    assert_eq!(
        GgmlType::from_id(39).and_then(GgmlType::quant_scheme),
        Some(QuantScheme::Mxfp4)
    );
}

/// Hand-worked values, one per family, so a reference regenerated wrongly would not pass.
#[test]
fn hand_worked_blocks() {
    let h = |v: f32| half::f16::from_f32(v).to_le_bytes();
    // Q4_K: d = 0.5, dmin = 0.25; sub-block 0 scale 3 min 2 (byte 0 = 3, byte 4 = 2); sub-block
    // 4's scale is byte 8's low nibble | byte 0's top 2 bits << 4 = 1 | 0 = 1, min = 8's high.
    let mut b = vec![0u8; 144];
    b[..2].copy_from_slice(&h(0.5));
    b[2..4].copy_from_slice(&h(0.25));
    b[4] = 3;
    b[8] = 2;
    b[12] = 0x51;
    b[16] = 0x7a; // element 0: nibble 0xa; element 32: nibble 7
    b[16 + 64] = 0x09; // element 128 (sub-block 4): nibble 9
    let mut v = [0f32; 256];
    QuantScheme::Q4K.dequantize_block(&b, &mut v);
    assert_eq!(v[0], 0.5 * 3.0 * 10.0 - 0.25 * 2.0);
    assert_eq!(v[128], 0.5 * 1.0 * 9.0 - 0.25 * 5.0);
    // Q6_K: d = 2, scale 0 = −3; element 0: ql low nibble 5, qh bits 0..2 = 2 → 37 − 32 = 5.
    let mut b = vec![0u8; 210];
    b[208..210].copy_from_slice(&h(2.0));
    b[192] = (-3i8) as u8;
    b[0] = 0x05;
    b[128] = 0x02;
    let mut v = [0f32; 256];
    QuantScheme::Q6K.dequantize_block(&b, &mut v);
    assert_eq!(v[0], 2.0 * -3.0 * 5.0);
    assert_eq!(v[1], 2.0 * -3.0 * -32.0);
    // MXFP4: e = 127 is the scale 1, which ggml halves to 0.5 against its doubled values:
    // code 7 (E2M1 6, stored as 12) is 12 · 0.5 = 6, code 0xF is −6.
    let mut b = vec![127u8];
    b.push(0xF7);
    b.extend([0u8; 15]);
    let mut v = [0f32; 32];
    QuantScheme::Mxfp4.dequantize_block(&b, &mut v);
    assert_eq!((v[0], v[16], v[1]), (6.0, -6.0, 0.0));
    // MXFP6 E2M3, scale 2^(128 − 127) = 2: code 0b0_11_111 = 1.875 · 2² = 7.5 → 15; code
    // 0b1_00_010 (bits 6..12: the subnormal 2/8) → −0.5. E3M2: code 0b0_111_11 = 1.75 · 2⁴ = 28 → 56.
    let mut b = vec![128u8, 0b10_011111, 0b0000_1000, 0];
    b.extend([0u8; 21]);
    QuantScheme::Mxfp6E2m3.dequantize_block(&b, &mut v);
    assert_eq!((v[0], v[1], v[2]), (15.0, -0.5, 0.0));
    b[1] = 0b11111;
    QuantScheme::Mxfp6E3m2.dequantize_block(&b, &mut v);
    assert_eq!(v[0], 56.0);
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(25);
    for scheme in QuantScheme::ALL {
        for _ in 0..200 {
            let blocks = rng.random_range(1..5usize);
            let mut bytes = vec![0u8; blocks * scheme.block_bytes()];
            rng.fill(&mut bytes[..]);
            // NaN and infinite scales give NaN and infinite values, never a panic.
            let shape = Shape(vec![blocks * scheme.block_elems()]);
            let v = scheme.dequantize(&bytes, &shape).unwrap();
            assert_eq!(v.len(), blocks * scheme.block_elems());
            // A length one byte off, or a row that is not whole blocks, is an error.
            let short = &bytes[..bytes.len() - 1];
            assert!(matches!(
                scheme.dequantize(short, &shape),
                Err(QuantError::Length { .. })
            ));
            let partial = Shape(vec![blocks * scheme.block_elems() - 16]);
            assert!(matches!(
                QuantTensor::new(scheme, partial, bytes.clone()),
                Err(QuantError::PartialBlock { .. })
            ));
        }
        assert!(matches!(
            scheme.layout(&Shape(vec![usize::MAX / 2, 2 * scheme.block_elems()])),
            Err(QuantError::Overflow { .. })
        ));
        // Drawn weights are finite.
        let w = random_quant("w", scheme, &Shape(vec![3, 2 * scheme.block_elems()]), 1).unwrap();
        let v = w.to_tensor(DType::F32).unwrap().to_f64_vec();
        assert!(v.iter().all(|x| x.is_finite()), "{scheme}");
    }
}
