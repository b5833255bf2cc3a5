//! Attention bounded by data (`kv_len`) over a cache whose tail beyond the valid keys holds
//! NaN (the unwritten part of a KV cache): the host runs and compiles in
//! `tests/decode_kernels.rs` (`state::`), the GPU trials `decops::` in `tests/gpu/`. The
//! reference is the interpreter on the same graph in f32, which never reads the tail (checked
//! against an f64 loop in `tests/interp/state.rs`); a kernel that reads it gives NaN and fails.
#![allow(dead_code)]

use rocmforge::interp::{self, Bindings};
use rocmforge::ir::{DType, Graph, Tensor};

#[derive(Clone, Debug, PartialEq)]
pub struct KvCase {
    pub b: usize,
    pub hq: usize,
    pub hkv: usize,
    pub sq: usize,
    /// Keys the cache holds (its maximum context).
    pub sk: usize,
    pub d: usize,
    pub dtype: DType,
    pub causal: bool,
    /// Valid keys: one value for every batch, or one per batch.
    pub kv_len: Vec<usize>,
}

impl KvCase {
    /// SmolLM2's heads (9 over 3 K/V heads, D = 64), one batch, one position.
    pub fn new(sk: usize, kv_len: usize, dtype: DType) -> KvCase {
        KvCase {
            b: 1,
            hq: 9,
            hkv: 3,
            sq: 1,
            sk,
            d: 64,
            dtype,
            causal: true,
            kv_len: vec![kv_len],
        }
    }

    pub fn name(&self) -> String {
        let lens: Vec<String> = self.kv_len.iter().map(|l| l.to_string()).collect();
        format!(
            "{}_b{}_h{}x{}_sq{}_sk{}_d{}_kv{}{}",
            self.dtype,
            self.b,
            self.hq,
            self.hkv,
            self.sq,
            self.sk,
            self.d,
            lens.join("-"),
            if self.causal { "_causal" } else { "" }
        )
    }

    /// Valid keys of batch `b`.
    pub fn len_of(&self, b: usize) -> usize {
        self.kv_len[if self.kv_len.len() == 1 { 0 } else { b }]
    }

    pub fn graph_in(&self, dtype: DType) -> Graph {
        let mut g = Graph::new("kv_attention");
        let q = g
            .input("q", dtype, &[self.b, self.hq, self.sq, self.d])
            .unwrap();
        let k = g
            .input("k", dtype, &[self.b, self.hkv, self.sk, self.d])
            .unwrap();
        let v = g
            .input("v", dtype, &[self.b, self.hkv, self.sk, self.d])
            .unwrap();
        let l = g.input("kv_len", DType::I32, &[self.kv_len.len()]).unwrap();
        let scale = 1.0 / (self.d as f64).sqrt();
        let out = g
            .flash_attention_len((q, k, v), l, scale, self.causal)
            .unwrap();
        g.rename(out, "out").unwrap();
        g.set_outputs(&[out]).unwrap();
        g
    }

    pub fn graph(&self) -> Graph {
        self.graph_in(self.dtype)
    }

    /// Random q, k, v with NaN in every key row past the batch's valid keys, and `kv_len`.
    pub fn bindings(&self, seed: u64) -> Bindings {
        let g = self.graph();
        let mut b = Bindings::random(&g, seed);
        for name in ["k", "v"] {
            let t = &b.inputs[name];
            let dims = t.shape().dims().to_vec();
            let row = dims[3];
            let per_batch = dims[1] * dims[2] * row;
            let mut vals = t.to_f64_vec();
            for (i, x) in vals.iter_mut().enumerate() {
                let (bi, key) = (i / per_batch, (i / row) % dims[2]);
                if key >= self.len_of(bi) {
                    *x = f64::NAN;
                }
            }
            let poisoned = Tensor::from_f64(t.dtype(), dims, &vals).unwrap();
            b.inputs.insert(name.into(), poisoned);
        }
        let lens: Vec<i64> = self.kv_len.iter().map(|&l| l as i64).collect();
        let lt = Tensor::from_i64(DType::I32, vec![lens.len()], lens).unwrap();
        b.inputs.insert("kv_len".into(), lt);
        b
    }

    /// The interpreter's output for `bindings`, in f32.
    pub fn reference(&self, bindings: &Bindings) -> Tensor {
        let mut rb = Bindings::default();
        for (n, t) in &bindings.inputs {
            let t = if t.dtype().is_float() {
                t.cast(DType::F32)
            } else {
                t.clone()
            };
            rb.inputs.insert(n.clone(), t);
        }
        interp::run(&self.graph_in(DType::F32), &rb)
            .unwrap()
            .remove(0)
    }
}

/// Host-sized cases (one OS thread per GPU thread): each dtype, kv_len 1, a middle one and the
/// whole cache, several query positions causal (GQA rows of one K/V head together), one
/// kv_len per batch, odd key counts.
pub fn host_cases() -> Vec<KvCase> {
    let mut v = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        v.push(KvCase::new(301, 157, dtype));
    }
    v.push(KvCase::new(301, 1, DType::F32));
    v.push(KvCase::new(301, 301, DType::F16));
    v.push(KvCase {
        causal: false,
        ..KvCase::new(77, 40, DType::F32)
    });
    v.push(KvCase {
        b: 2,
        sq: 3,
        kv_len: vec![3, 250],
        ..KvCase::new(251, 0, DType::F32)
    });
    v.push(KvCase {
        b: 2,
        sq: 2,
        d: 40,
        kv_len: vec![33],
        ..KvCase::new(97, 0, DType::BF16)
    });
    // Prefill-shaped (more rows per K/V head than the decode kernel takes): the CUDA-core f32
    // kernel, and the scalar one for f16 where the target has no matrix cores.
    for dtype in [DType::F32, DType::F16] {
        v.push(KvCase {
            b: 2,
            hq: 2,
            hkv: 1,
            sq: 20,
            d: 24,
            kv_len: vec![20, 37],
            ..KvCase::new(45, 0, dtype)
        });
    }
    v
}

/// Whether the case's rows per K/V head fit the decode kernel (else a prefill kernel serves it).
pub fn is_decode(c: &KvCase) -> bool {
    (c.hq / c.hkv) * c.sq <= 16
}

/// GPU-sized cases: long caches (several splits past kv_len do no work), odd sizes, each dtype.
pub fn gpu_cases() -> Vec<KvCase> {
    let mut v = Vec::new();
    for dtype in [DType::F16, DType::BF16, DType::F32] {
        v.push(KvCase::new(8191, 513, dtype));
        v.push(KvCase::new(4097, 1, dtype));
        v.push(KvCase::new(2049, 2049, dtype));
        v.push(KvCase {
            b: 3,
            sq: 4,
            kv_len: vec![4, 1000, 3001],
            ..KvCase::new(3001, 0, dtype)
        });
    }
    // Prefill-shaped (too many rows for the decode kernel): the prefill kernels bound by data.
    for dtype in [DType::F16, DType::F32] {
        v.push(KvCase {
            b: 2,
            sq: 77,
            kv_len: vec![77, 400],
            ..KvCase::new(513, 0, dtype)
        });
    }
    v
}
