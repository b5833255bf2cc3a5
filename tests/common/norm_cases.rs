//! A norm feeding GEMVs, as a decoder layer has it (`passes::norm_gemv`'s pattern): `x [M, K]`
//! → RMSNorm or LayerNorm → one linear layer (`x · Wᵀ`, W `[N, K]` dense or quantized), or two
//! sharing the norm (gate/up-like, the second of another N), optionally a residual added in the
//! first one's epilogue. Built unfused, as a model writes it; [`NormCase::fused`] is the
//! default pipeline's graph, where the norm is each Gemm's prologue.

#![allow(dead_code)]

use rocmforge::ir::{BinaryOp, DType, Graph, NodeId, Op, QuantScheme};
use rocmforge::passes::PassManager;

#[derive(Clone, Copy, Debug)]
pub struct NormCase {
    /// LayerNorm (with bias) rather than RMSNorm.
    pub layer: bool,
    pub dtype: DType,
    /// The weights' blocks (`None`: dense weights of `dtype`).
    pub scheme: Option<QuantScheme>,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// A second linear layer (N + 6 columns) reading the same norm.
    pub two: bool,
    /// `+ residual[M, N]` in the first layer's epilogue.
    pub residual: bool,
}

impl NormCase {
    pub fn name(&self) -> String {
        format!(
            "{}_{}_{}_m{}_n{}_k{}{}{}",
            if self.layer { "layer" } else { "rms" },
            self.dtype,
            self.scheme.map_or("dense".to_string(), |s| s.to_string()),
            self.m,
            self.n,
            self.k,
            if self.two { "_two" } else { "" },
            if self.residual { "_residual" } else { "" },
        )
    }

    fn linear(&self, g: &mut Graph, h: NodeId, name: &str, n: usize) -> NodeId {
        let w = match self.scheme {
            Some(s) => g.weight_quant(name, self.dtype, &[n, self.k], s).unwrap(),
            None => g.weight(name, self.dtype, &[n, self.k]).unwrap(),
        };
        let wt = g.permute(w, &[1, 0]).unwrap();
        g.matmul(h, wt).unwrap()
    }

    /// The unfused graph.
    pub fn graph(&self) -> Graph {
        let mut g = Graph::new(format!("norm_{}", self.name()));
        let x = g.input("x", self.dtype, &[self.m, self.k]).unwrap();
        let w = g.weight("norm_w", self.dtype, &[self.k]).unwrap();
        let h = if self.layer {
            let b = g.weight("norm_b", self.dtype, &[self.k]).unwrap();
            g.layer_norm(x, w, b, 1e-5).unwrap()
        } else {
            g.rms_norm(x, w, 1e-5).unwrap()
        };
        let mut y = self.linear(&mut g, h, "w1", self.n);
        if self.residual {
            let r = g.input("residual", self.dtype, &[self.m, self.n]).unwrap();
            y = g.binary(BinaryOp::Add, y, r).unwrap();
        }
        let mut outs = vec![y];
        if self.two {
            outs.push(self.linear(&mut g, h, "w2", self.n + 6));
        }
        g.set_outputs(&outs).unwrap();
        g
    }

    /// [`NormCase::graph`] after the default pipeline.
    pub fn fused(&self) -> Graph {
        let mut g = self.graph();
        PassManager::default_pipeline().run(&mut g).unwrap();
        g
    }
}

/// Whether `g` still has a norm node.
pub fn has_norm(g: &Graph) -> bool {
    g.node_ids()
        .any(|id| matches!(g.op(id), Op::RmsNorm { .. } | Op::LayerNorm { .. }))
}

/// The cases: both norms × dense f32/f16/bf16 and Q4_1/Q8_0/Q4_K (f16 values) × M 1, 3, 8; odd N
/// (45, and 51 for the second GEMM); K 37 for dense (not a multiple of any vector width: the
/// element path and a partial last chunk), 96 (3 blocks) for Q4_1/Q8_0, 256 (a super-block)
/// for Q4_K (the int8 GEMV up to M 4); residual epilogues and shared norms (two GEMMs) among them.
pub fn cases() -> Vec<NormCase> {
    let mut v = Vec::new();
    for layer in [false, true] {
        let kinds: [(DType, Option<QuantScheme>); 6] = [
            (DType::F32, None),
            (DType::F16, None),
            (DType::BF16, None),
            (DType::F16, Some(QuantScheme::Q4_1)),
            (DType::F16, Some(QuantScheme::Q8_0)),
            (DType::F16, Some(QuantScheme::Q4K)),
        ];
        for (dtype, scheme) in kinds {
            let k = match scheme {
                Some(s) if s.block_elems() == 256 => 256,
                Some(_) => 96,
                None => 37,
            };
            for (m, two, residual) in [(1, false, true), (3, true, false), (8, true, true)] {
                v.push(NormCase {
                    layer,
                    dtype,
                    scheme,
                    m,
                    n: 45,
                    k,
                    two,
                    residual,
                });
            }
        }
    }
    v
}
