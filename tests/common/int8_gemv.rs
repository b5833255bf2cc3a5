//! The decode GEMV with 8-bit activations (`codegen/kernels/gemm/quant_dot.rs`): its cases
//! (`x · Wᵀ` on a Q4_0/Q4_1/Q8_0 weight, M 1..=8, or a Q4_K/Q5_K/Q6_K one, M 1..=4; odd N, K whole blocks, with the epilogues a
//! decoder fuses into it) and the bound its result is held to against the interpreter.
//!
//! The bound, per element (m, n), before the epilogue: the activations' rounding to 8 bits moves
//! each x by at most d/2 (d = max|x|/127 of its group of 32), so the product by at most
//! Σ_groups d/2 · Σ_{k in group} |w_k|; besides, the kernel takes W's values in f32 where the
//! interpreter has them in the dtype (u·Σ|x·w|, u its unit roundoff) and sums in another order
//! in f32 (K·2⁻²⁴·Σ|x·w|). Each rounding of a value to the dtype (the product as the epilogue
//! reads it, the stored result) may land one step apart on either side: 2u of the value each.
//! The epilogue's factor on the product (1 for an add, |silu(gate)| for silu(gate)·y) scales
//! what comes before it.
#![allow(dead_code)]

use rocmforge::interp::Bindings;
use rocmforge::ir::{BinaryOp, DType, Graph, QuantScheme, Tensor, UnaryOp};
use rocmforge::passes::PassManager;

/// What follows the product in the fused kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Epilogue {
    None,
    /// `y + bias`, bias `[N]`.
    Bias,
    /// `y + r`, r `[M, N]` (a residual).
    Residual,
    /// `silu(gate) · y`, gate `[M, N]` (SwiGLU's up projection).
    SiluMul,
}

#[derive(Clone, Copy, Debug)]
pub struct Int8Case {
    pub scheme: QuantScheme,
    pub dtype: DType,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub epilogue: Epilogue,
}

impl Int8Case {
    pub fn name(&self) -> String {
        format!(
            "{}_{}_m{}_n{}_k{}_{:?}",
            self.scheme, self.dtype, self.m, self.n, self.k, self.epilogue
        )
        .to_lowercase()
    }

    /// The layer unfused, as a model writes it, then after the default pipeline.
    pub fn fused(&self) -> Graph {
        let mut g = Graph::new(format!("int8_{}", self.name()));
        let x = g.input("x", self.dtype, &[self.m, self.k]).unwrap();
        let w = g
            .weight_quant("w", self.dtype, &[self.n, self.k], self.scheme)
            .unwrap();
        let wt = g.permute(w, &[1, 0]).unwrap();
        let mut y = g.matmul(x, wt).unwrap();
        match self.epilogue {
            Epilogue::None => {}
            Epilogue::Bias => {
                let bias = g.input("bias", self.dtype, &[self.n]).unwrap();
                y = g.binary(BinaryOp::Add, y, bias).unwrap();
            }
            Epilogue::Residual => {
                let r = g.input("r", self.dtype, &[self.m, self.n]).unwrap();
                y = g.binary(BinaryOp::Add, y, r).unwrap();
            }
            Epilogue::SiluMul => {
                let gate = g.input("gate", self.dtype, &[self.m, self.n]).unwrap();
                let s = g.unary(UnaryOp::Silu, gate).unwrap();
                y = g.binary(BinaryOp::Mul, s, y).unwrap();
            }
        }
        g.add_output(y).unwrap();
        PassManager::default_pipeline().run(&mut g).unwrap();
        g
    }
}

/// The cases run on the host: each legacy scheme at M 1..=8 on an odd N, K of 5 blocks (fewer
/// pieces than a wave has lanes) and of 33 (more than a round of every lane: the last one
/// partial), in f16 and f32, with each epilogue; the K-quants at M 1..=4 likewise.
pub fn host_cases() -> Vec<Int8Case> {
    let mut v = Vec::new();
    for scheme in [QuantScheme::Q4_0, QuantScheme::Q4_1, QuantScheme::Q8_0] {
        for m in 1..=8 {
            let (dtype, n, k, epilogue) = match m % 4 {
                0 => (DType::F32, 13, 1056, Epilogue::None),
                1 => (DType::F16, 37, 160, Epilogue::Residual),
                2 => (DType::F16, 9, 1056, Epilogue::SiluMul),
                _ => (DType::BF16, 45, 160, Epilogue::None),
            };
            v.push(Int8Case {
                scheme,
                dtype,
                m,
                n,
                k,
                epilogue,
            });
        }
    }
    // The K-quants (chosen by default, M up to 4): K of 1 super-block (fewer pieces than a wave
    // has lanes) and of 5 (more than a round of 32 lanes; on wave64 a partial round).
    for scheme in [QuantScheme::Q4K, QuantScheme::Q5K, QuantScheme::Q6K] {
        for m in 1..=4 {
            let (dtype, n, k, epilogue) = match m {
                1 => (DType::F16, 37, 256, Epilogue::Residual),
                2 => (DType::F16, 9, 1280, Epilogue::SiluMul),
                3 => (DType::BF16, 45, 256, Epilogue::None),
                _ => (DType::F32, 13, 1280, Epilogue::Bias),
            };
            v.push(Int8Case {
                scheme,
                dtype,
                m,
                n,
                k,
                epilogue,
            });
        }
    }
    v
}

fn unit_roundoff(dt: DType) -> f64 {
    match dt {
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        _ => 2f64.powi(-24),
    }
}

/// The relative L2 error the int8 GEMV is held to (see the bound below for why).
pub const REL_L2: f64 = 2e-2;

/// Checks `got` against the interpreter's `want` for `case` run on bindings `b` (its inputs and
/// the weight's blocks): every element within the bound of the module comment, and the relative
/// L2 error at most 2e-2. The second: an activation's rounding error is uniform in ±d/2, an RMS
/// of d/√12 ≈ max|x|/440, under 1% of the values' RMS for the inputs drawn here, so a correct
/// kernel sits near 0.5%; a piece of 16 values of a K of 160 left out costs about 30%.
pub fn check(case: &Int8Case, b: &Bindings, got: &Tensor, want: &Tensor) -> Result<(), String> {
    let (m, n, k) = (case.m, case.n, case.k);
    let x = b.inputs["x"].to_f64_vec();
    let w = b.quantized["w"]
        .to_tensor(case.dtype)
        .map_err(|e| e.to_string())?
        .to_f64_vec();
    let gate = b.inputs.get("gate").map(Tensor::to_f64_vec);
    let (g, r) = (
        got.cast(DType::F32).to_f64_vec(),
        want.cast(DType::F32).to_f64_vec(),
    );
    let u = unit_roundoff(case.dtype);
    let (mut num, mut den) = (0.0, 0.0);
    for row in 0..m {
        let xs = &x[row * k..(row + 1) * k];
        for col in 0..n {
            let ws = &w[col * k..(col + 1) * k];
            let (mut rounding, mut abs, mut y) = (0.0, 0.0, 0.0);
            for grp in 0..k / 32 {
                let span = grp * 32..(grp + 1) * 32;
                let amax = xs[span.clone()].iter().fold(0.0f64, |a, v| a.max(v.abs()));
                let wsum: f64 = ws[span].iter().map(|v| v.abs()).sum();
                rounding += amax / 254.0 * wsum;
            }
            for (a, wv) in xs.iter().zip(ws) {
                abs += (a * wv).abs();
                y += a * wv;
            }
            let factor = match (case.epilogue, &gate) {
                (Epilogue::SiluMul, Some(gv)) => {
                    let t = gv[row * n + col];
                    (t / (1.0 + (-t).exp())).abs()
                }
                _ => 1.0,
            };
            let i = row * n + col;
            let before =
                1.001 * rounding + (u + k as f64 * 2f64.powi(-24)) * abs + 2.0 * u * y.abs();
            let tol = factor * before + 2.0 * u * r[i].abs() + 1e-30;
            let err = (g[i] - r[i]).abs();
            // NaN (an element never written keeps its NaN poison) fails.
            if err.is_nan() || err > tol {
                return Err(format!(
                    "{}: element ({row}, {col}) is {}, want {} (error {err:e} > bound {tol:e})",
                    case.name(),
                    g[i],
                    r[i]
                ));
            }
            num += (g[i] - r[i]).powi(2);
            den += r[i] * r[i];
        }
    }
    let rel = (num / den.max(f64::MIN_POSITIVE)).sqrt();
    if rel > REL_L2 {
        return Err(format!("{}: relative L2 {rel:e} > {REL_L2:e}", case.name()));
    }
    Ok(())
}
