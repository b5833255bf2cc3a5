//! Seeded random data for graph inputs and for weights a graph file does not supply. Each
//! tensor's stream depends only on the seed and the node's name, so two graphs that share names
//! (a graph and its fused form) get the same data whatever their node order.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

use super::dtype::DType;
use super::scalar::{self, Element};
use super::shape::TensorType;
use super::tensor::check_host_size;
use super::tensor::{Tensor, TensorError};
use super::values::{Init, Sample};

/// A generator for `(seed, name)`; FNV-1a keeps the mapping stable across Rust versions.
pub fn seeded_rng(seed: u64, name: &str) -> ChaCha8Rng {
    let h = super::hash::fnv1a(name.as_bytes());
    ChaCha8Rng::seed_from_u64(h ^ seed.rotate_left(17))
}

/// Random data for an input, drawn as its `sample` attribute says. Its size is checked against
/// the host limit and allocated fallibly; a range that is empty or does not fit the dtype is an
/// error (shape inference refuses such inputs, see [`Sample::check`]).
pub fn random_input(
    name: &str,
    ty: &TensorType,
    sample: &Sample,
    seed: u64,
) -> Result<Tensor, TensorError> {
    let n = check_host_size(ty)?;
    sample
        .check(ty.dtype)
        .map_err(|reason| TensorError::Sample {
            ty: ty.clone(),
            reason,
        })?;
    let mut rng = seeded_rng(seed, name);
    let (dt, shape) = (ty.dtype, ty.shape.clone());
    match sample {
        Sample::Normal => match dt {
            DType::Bool => {
                let draw = (0..n).map(|_| Element::Int(i64::from(rng.random::<bool>())));
                Tensor::from_elements(dt, shape, n, draw)
            }
            d if d.is_int() => {
                let draw = (0..n).map(|_| Element::Int(i64::from(rng.random_range(0i32..16))));
                Tensor::from_elements(dt, shape, n, draw)
            }
            _ => {
                let draw = (0..n).map(|_| scalar::constant(dt, rng.sample(StandardNormal)));
                Tensor::from_elements(dt, shape, n, draw)
            }
        },
        Sample::PaddingMask => {
            let row = ty.shape.dims().last().copied().unwrap_or(1).max(1);
            let draw = (0..n.div_ceil(row)).flat_map(|_| {
                let keep = rng.random_range(1..=row);
                (0..row).map(move |i| scalar::constant(dt, f64::from(u8::from(i < keep))))
            });
            Tensor::from_elements(dt, shape, n, draw)
        }
        Sample::Range { low, high } => {
            if dt.is_float() {
                let (lo, hi) = (*low as f64, *high as f64);
                let draw = (0..n).map(|_| scalar::constant(dt, rng.random_range(lo..hi)));
                Tensor::from_elements(dt, shape, n, draw)
            } else {
                // Integers are drawn as integers: through an f64 they would lose bits past 2^53.
                let draw = (0..n).map(|_| Element::Int(rng.random_range(*low..*high)));
                Tensor::from_elements(dt, shape, n, draw)
            }
        }
    }
}

/// Data for a weight that was not supplied, as its `init` attribute says; checked and allocated
/// as [`random_input`] is.
pub fn random_weight(
    name: &str,
    ty: &TensorType,
    init: &Init,
    seed: u64,
) -> Result<Tensor, TensorError> {
    let n = check_host_size(ty)?;
    let (dt, shape) = (ty.dtype, ty.shape.clone());
    match init {
        Init::Ones => Tensor::constant(ty, &[1.0]),
        Init::Zeros => Tensor::constant(ty, &[0.0]),
        Init::Normal => {
            let mut rng = seeded_rng(seed ^ 0x005e_ed0f_3e16, name);
            let fan_in = ty.shape.dims().first().copied().unwrap_or(1).max(1) as f64;
            let std = if ty.shape.rank() >= 2 {
                fan_in.sqrt().recip()
            } else {
                0.02
            };
            let draw =
                (0..n).map(|_| scalar::constant(dt, std * rng.sample::<f64, _>(StandardNormal)));
            Tensor::from_elements(dt, shape, n, draw)
        }
    }
}
