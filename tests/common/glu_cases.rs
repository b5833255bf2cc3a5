//! The GLU block `silu(h·W_gateᵀ) · (h·W_upᵀ)` as a model writes it (unfused), for the tests of
//! the merged gate/up GEMV: the host-run kernels and the CPU device.

#![allow(dead_code)]

use rocmforge::ir::{DType, Graph, QuantScheme};

/// A GLU case: `silu(h·W_gateᵀ) · (h·W_upᵀ)`, `h` = x or RMSNorm(x), weights `[n, k]`.
#[derive(Clone, Copy, Debug)]
pub struct GluCase {
    pub dtype: DType,
    pub scheme: Option<QuantScheme>,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub norm: bool,
}

impl GluCase {
    pub fn name(&self) -> String {
        format!(
            "glu_{}_{}_m{}_n{}_k{}{}",
            self.dtype,
            self.scheme.map_or("dense".to_string(), |s| s.to_string()),
            self.m,
            self.n,
            self.k,
            if self.norm { "_rms" } else { "" }
        )
    }

    /// The unfused graph, as a model writes it.
    pub fn graph(&self) -> Graph {
        let mut g = Graph::new(self.name());
        let x = g.input("x", self.dtype, &[1, self.m, self.k]).unwrap();
        let h = if self.norm {
            let w = g.weight("norm_w", self.dtype, &[self.k]).unwrap();
            g.rms_norm(x, w, 1e-5).unwrap()
        } else {
            x
        };
        let lin = |g: &mut Graph, name: &str| {
            let w = match self.scheme {
                Some(s) => g
                    .weight_quant(name, self.dtype, &[self.n, self.k], s)
                    .unwrap(),
                None => g.weight(name, self.dtype, &[self.n, self.k]).unwrap(),
            };
            let wt = g.transpose_last(w).unwrap();
            g.matmul(h, wt).unwrap()
        };
        let gate = lin(&mut g, "w_gate");
        let up = lin(&mut g, "w_up");
        let s = g.silu(gate).unwrap();
        let y = g.mul(s, up).unwrap();
        g.add_output(y).unwrap();
        g
    }
}
