//! Linear layers on quantized weights for the kernel tests, the GPU trials and the benchmark:
//! `x · Wᵀ (+ bias)` with W `[N, K]` a quantized weight (`Op::Weight` with `quant`, blocks along
//! K), built unfused as a model would be (`permute` + `matmul`) and formed into one Gemm by the
//! default pipeline. Sizes are odd (N and M not multiples of any tile; K a whole number of
//! blocks, as the format requires).

#![allow(dead_code)]

use rocmforge::ir::{BinaryOp, DType, Graph, QuantScheme};
use rocmforge::passes::PassManager;

#[derive(Clone, Copy, Debug)]
pub struct QuantCase {
    pub scheme: QuantScheme,
    /// The activations' dtype, which is also the weight's value dtype.
    pub dtype: DType,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// `+ bias[n]` as the epilogue.
    pub bias: bool,
}

impl QuantCase {
    pub fn name(&self) -> String {
        format!(
            "{}_{}_m{}_n{}_k{}{}",
            self.scheme,
            self.dtype,
            self.m,
            self.n,
            self.k,
            if self.bias { "_bias" } else { "" }
        )
    }

    /// The layer as a model writes it: `matmul(x, permute(w, [1, 0])) (+ bias)`.
    pub fn graph(&self) -> Graph {
        let mut g = Graph::new(format!("quant_{}", self.name()));
        let x = g.input("x", self.dtype, &[self.m, self.k]).unwrap();
        let w = g
            .weight_quant("w", self.dtype, &[self.n, self.k], self.scheme)
            .unwrap();
        let wt = g.permute(w, &[1, 0]).unwrap();
        let mut y = g.matmul(x, wt).unwrap();
        if self.bias {
            let b = g.input("bias", self.dtype, &[self.n]).unwrap();
            y = g.binary(BinaryOp::Add, y, b).unwrap();
        }
        g.add_output(y).unwrap();
        g
    }

    /// [`QuantCase::graph`] after the default pipeline: one Gemm reading `w` as B.
    pub fn fused(&self) -> Graph {
        let mut g = self.graph();
        PassManager::default_pipeline().run(&mut g).unwrap();
        g
    }
}

/// The GPU trials: every scheme in f32 and f16 at M 1, 3, 16 (the small-M bound), 17 and 130
/// (dequantized, then the dense GEMM) on N 577; SmolLM2's projections (576 → 1536, 1536 → 576)
/// at M 1, 16 and 130; a 49152-like LM head (N 49157) at M 1 and 17; a bias epilogue; the
/// 256-value schemes also at M 2 and 4 on N 577 and at M 1..=4 on N 1031, K 2304.
pub fn gpu_cases() -> Vec<QuantCase> {
    let mut v = Vec::new();
    for scheme in QuantScheme::ALL {
        for dtype in [DType::F32, DType::F16] {
            // K rounded up to whole blocks (the k-quants' 256: 576 → 768).
            let case = |m, n, k: usize, bias| QuantCase {
                scheme,
                dtype,
                m,
                n,
                k: k.next_multiple_of(scheme.block_elems()),
                bias,
            };
            for m in [1, 3, 16, 17, 130] {
                v.push(case(m, 577, 576, m == 3));
            }
            for m in [1, 16, 130] {
                v.push(case(m, 1536, 576, false));
                v.push(case(m, 576, 1536, false));
            }
            for m in [1, 17] {
                v.push(case(m, 49157, 576, false));
            }
            if scheme.block_elems() == 256 {
                // The K-quant GEMV at every M it takes (1..=4): M 2 and 4 beside the 1 and 3
                // above, and a K of 9 super-blocks, which takes a wave more than one step with
                // the last one partial.
                for m in [2, 4] {
                    v.push(case(m, 577, 576, false));
                }
                for m in 1..=4 {
                    v.push(case(m, 1031, 2304, false));
                }
            }
        }
    }
    v
}
