//! Seeded random data for graph inputs and for weights a graph file does not supply. Each
//! tensor's stream depends only on the seed and the node's name, so two graphs that share names
//! (a graph and its fused form) get the same data whatever their node order.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

use super::op::{Init, Sample};
use super::{DType, Tensor, TensorType};

/// A generator for `(seed, name)`; FNV-1a keeps the mapping stable across Rust versions.
pub fn seeded_rng(seed: u64, name: &str) -> ChaCha8Rng {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    ChaCha8Rng::seed_from_u64(h ^ seed.rotate_left(17))
}

/// Random data for an input, drawn as its `sample` attribute says.
pub fn random_input(name: &str, ty: &TensorType, sample: &Sample, seed: u64) -> Tensor {
    let mut rng = seeded_rng(seed, name);
    let n = ty.shape.numel();
    let values: Vec<f64> = match sample {
        Sample::Normal => match ty.dtype {
            DType::Bool => (0..n)
                .map(|_| f64::from(u8::from(rng.random::<bool>())))
                .collect(),
            d if d.is_int() => (0..n).map(|_| f64::from(rng.random_range(0..16))).collect(),
            _ => (0..n)
                .map(|_| rng.sample::<f64, _>(StandardNormal))
                .collect(),
        },
        Sample::PaddingMask => {
            let row = ty.shape.dims().last().copied().unwrap_or(1).max(1);
            let mut v = Vec::with_capacity(n);
            while v.len() < n {
                let keep = rng.random_range(1..=row);
                v.extend((0..row).map(|i| f64::from(u8::from(i < keep))));
            }
            v.truncate(n);
            v
        }
        // `high` is exclusive; an empty range draws `low`. Both come from the file, so `low`
        // may be i64::MAX: no `low + 1`, and integers are drawn from the inclusive range
        // (which rand draws exactly as `low..high`).
        Sample::Range { low, high } => {
            if ty.dtype.is_float() {
                let (lo, hi) = (*low as f64, (*high).max(low.saturating_add(1)) as f64);
                (0..n)
                    .map(|_| {
                        if lo < hi {
                            rng.random_range(lo..hi)
                        } else {
                            lo
                        }
                    })
                    .collect()
            } else {
                let hi = high.saturating_sub(1).max(*low);
                (0..n).map(|_| rng.random_range(*low..=hi) as f64).collect()
            }
        }
    };
    Tensor::from_f64(ty.dtype, ty.shape.clone(), &values).expect("length matches the shape")
}

/// Data for a weight that was not supplied, as its `init` attribute says.
pub fn random_weight(name: &str, ty: &TensorType, init: &Init, seed: u64) -> Tensor {
    let n = ty.shape.numel();
    let values: Vec<f64> = match init {
        Init::Ones => vec![1.0; n],
        Init::Zeros => vec![0.0; n],
        Init::Normal => {
            let mut rng = seeded_rng(seed ^ 0x005e_ed0f_3e16, name);
            let fan_in = ty.shape.dims().first().copied().unwrap_or(1).max(1) as f64;
            let std = if ty.shape.rank() >= 2 {
                fan_in.sqrt().recip()
            } else {
                0.02
            };
            (0..n)
                .map(|_| std * rng.sample::<f64, _>(StandardNormal))
                .collect()
        }
    };
    Tensor::from_f64(ty.dtype, ty.shape.clone(), &values).expect("length matches the shape")
}
