//! Shared helpers for integration tests: seeded data, index arithmetic for f64 references, and
//! error measures. References built from these never call the code under test.
#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rocmforge::interp::{self, Bindings};
use rocmforge::ir::{DType, Graph, NodeId, Tensor};

pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// Uniform values in [-2, 2) as f64, for references; the tensor gets them rounded to `dtype`.
pub fn random_f64(rng: &mut ChaCha8Rng, n: usize) -> Vec<f64> {
    (0..n).map(|_| rng.random_range(-2.0..2.0)).collect()
}

/// A random float tensor and the exact f64 values it holds (after rounding to `dtype`).
pub fn random_tensor(rng: &mut ChaCha8Rng, dtype: DType, shape: &[usize]) -> (Tensor, Vec<f64>) {
    let n = shape.iter().product();
    let t = Tensor::from_f64(dtype, shape.to_vec(), &random_f64(rng, n)).unwrap();
    let v = t.to_f64_vec();
    (t, v)
}

pub fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for ax in (0..shape.len()).rev() {
        idx[ax] = i % shape[ax];
        i /= shape[ax];
    }
    idx
}

pub fn ravel(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |acc, (&i, &d)| acc * d + i)
}

/// Linear index into `shape` of the element that numpy broadcasting reads for `out_idx`.
pub fn broadcast_index(out_idx: &[usize], shape: &[usize]) -> usize {
    let lead = out_idx.len() - shape.len();
    let idx: Vec<usize> = shape
        .iter()
        .enumerate()
        .map(|(i, &d)| if d == 1 { 0 } else { out_idx[lead + i] })
        .collect();
    ravel(&idx, shape)
}

/// ‖a − b‖ / ‖b‖ (absolute when the reference is zero); NaN anywhere gives infinity.
pub fn rel_l2(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    if a.iter().chain(b).any(|x| x.is_nan()) {
        return f64::INFINITY;
    }
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).powi(2))
        .sum::<f64>()
        .sqrt();
    let den: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    if den == 0.0 {
        num
    } else {
        num / den
    }
}

/// Elementwise closeness, per dtype: what one rounding step to that dtype may move a value.
pub fn assert_close(got: &[f64], want: &[f64], dtype: DType, what: &str) {
    let rtol = match dtype {
        DType::F32 => 2e-5,
        DType::F16 => 2e-3,
        DType::BF16 => 1.6e-2,
        _ => 0.0,
    };
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan())
            || (g - w).abs() <= rtol * w.abs().max(1e-3) + 1e-6
            || g == w;
        assert!(ok, "{what}: element {i}: got {g}, want {w} ({dtype})");
    }
}

/// Runs `graph` with the given inputs bound by name; returns the first output.
pub fn run_with(graph: &Graph, inputs: Vec<(&str, Tensor)>) -> Tensor {
    let mut b = Bindings::default();
    for (n, t) in inputs {
        b.inputs.insert(n.to_string(), t);
    }
    interp::run(graph, &b).expect("interpreter run").remove(0)
}

/// A graph with inputs named a, b, c… of the given tensors' types, one op built by `build`,
/// run on those tensors.
pub fn run_op(inputs: &[&Tensor], build: impl FnOnce(&mut Graph, &[NodeId]) -> NodeId) -> Tensor {
    let mut g = Graph::new("op");
    let names = ["a", "b", "c", "d", "e", "f"];
    let ids: Vec<NodeId> = inputs
        .iter()
        .zip(names)
        .map(|(t, n)| g.input(n, t.dtype(), t.shape().dims()).unwrap())
        .collect();
    let out = build(&mut g, &ids);
    g.add_output(out).unwrap();
    g.validate().unwrap();
    run_with(
        &g,
        inputs
            .iter()
            .zip(names)
            .map(|(t, n)| (n, (*t).clone()))
            .collect(),
    )
}
pub mod attention_graphs;
pub mod files;
pub mod gemm_graphs;
pub mod op_zoo;
