//! Gemm graphs for the kernel tests (compile checks, snapshots, GPU trials): sizes that are not
//! multiples of any tile, weights stored [N, K] (read transposed, K-contiguous: the 16-byte
//! path when K allows) or [K, N], a bias + SiLU epilogue, batches. Each graph is one Gemm node
//! built with `Graph::gemm`, the weights an input so the interpreter sees the same values.

#![allow(dead_code)]

use rocmforge::ir::gemm::Operand;
use rocmforge::ir::{BinaryOp, DType, Expr, Gemm, GemmDims, Graph, Shape, UnaryOp, View};

/// One problem: `batch` × [m, k] · [k, n].
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub dtype: DType,
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// B stored [N, K] (a linear layer's weight) rather than [K, N].
    pub nk: bool,
    /// `silu(product + bias[n])` instead of the product.
    pub bias_silu: bool,
}

impl Case {
    pub fn name(&self) -> String {
        format!(
            "{}_b{}_m{}_n{}_k{}_{}{}",
            self.dtype,
            self.batch,
            self.m,
            self.n,
            self.k,
            if self.nk { "nk" } else { "kn" },
            if self.bias_silu { "_bias_silu" } else { "" }
        )
    }

    pub fn graph(&self) -> Graph {
        let Case {
            dtype,
            batch,
            m,
            n,
            k,
            nk,
            bias_silu,
        } = *self;
        let batched = batch > 1;
        let dims = GemmDims {
            batch: if batched { vec![batch] } else { vec![] },
            m: vec![m],
            n: vec![n],
            k: vec![k],
        };
        let lead = |v: Vec<usize>| -> Vec<usize> {
            if batched {
                std::iter::once(batch).chain(v).collect()
            } else {
                v
            }
        };
        let mut g = Graph::new(format!("gemm_{}", self.name()));
        let a = g.input("a", dtype, &lead(vec![m, k])).unwrap();
        let (b_shape, b_view) = if nk {
            let view = View {
                batch: if batched { vec![n * k] } else { vec![] },
                rows: vec![1],
                cols: vec![k],
            };
            (lead(vec![n, k]), view)
        } else {
            (lead(vec![k, n]), View::contiguous(&dims, Operand::B))
        };
        let b = g.input("b", dtype, &b_shape).unwrap();
        let mut extras = vec![];
        let mut extra_views = vec![];
        let mut epilogue = None;
        if bias_silu {
            extras.push(g.input("bias", dtype, &[n]).unwrap());
            extra_views.push(View {
                batch: if batched { vec![0] } else { vec![] },
                rows: vec![0],
                cols: vec![1],
            });
            epilogue = Some(Expr::Unary(
                UnaryOp::Silu,
                Box::new(Expr::Binary(
                    BinaryOp::Add,
                    Box::new(Expr::Input(0)),
                    Box::new(Expr::Input(1)),
                )),
            ));
        }
        let gemm = Gemm {
            a: View::contiguous(&dims, Operand::A),
            b: b_view,
            out: View::contiguous(&dims, Operand::Out),
            extras: extra_views,
            epilogue,
            shape: Shape(lead(vec![m, n])),
            prologue: None,
            paired: false,
            dims,
        };
        let c = g.gemm(gemm, a, b, &extras).unwrap();
        g.set_outputs(&[c]).unwrap();
        g
    }
}

const FLOATS: [DType; 3] = [DType::F16, DType::BF16, DType::F32];

fn case(dtype: DType, m: usize, n: usize, k: usize, nk: bool) -> Case {
    Case {
        dtype,
        batch: 1,
        m,
        n,
        k,
        nk,
        bias_silu: false,
    }
}

/// Small-M problems (the decode kernel): M ∈ {1, 3, 16} × odd and model-sized N, K; K = 37 is
/// not a multiple of any vector width (the element path); both layouts of B ([K, N] with N a
/// multiple of 8 is read along N); a bias + SiLU epilogue; batches.
pub fn small_m() -> Vec<Case> {
    let mut v = Vec::new();
    for dtype in FLOATS {
        for m in [1, 3, 16] {
            for (n, k) in [(45, 40), (45, 37), (576, 576), (1536, 576)] {
                for nk in [true, false] {
                    v.push(case(dtype, m, n, k, nk));
                }
            }
            // [K, N] weights with N a multiple of 8: read 16 bytes along N (K odd).
            v.push(case(dtype, m, 48, 37, false));
            v.push(Case {
                batch: 3,
                bias_silu: true,
                ..case(dtype, m, 48, 37, false)
            });
            v.push(Case {
                bias_silu: true,
                ..case(dtype, m, 45, 40, true)
            });
            v.push(Case {
                bias_silu: true,
                ..case(dtype, m, 1536, 576, false)
            });
            v.push(Case {
                batch: 3,
                ..case(dtype, m, 45, 37, true)
            });
            v.push(Case {
                batch: 3,
                bias_silu: true,
                ..case(dtype, m, 576, 576, true)
            });
        }
    }
    v
}

/// Problems for the small-M kernel's row groups (M 17 to 64 where the tiled kernels' grid is
/// small: `ir::gemm::runs_as_gemv`): 17 (two groups of 9 and 8), 33 (three of 11), 64 (four of
/// 16); odd sizes, both layouts of B ([K, N] f32 along N), a bias + SiLU, a batch, SmolLM2's
/// down projection.
pub fn row_groups() -> Vec<Case> {
    let mut v = Vec::new();
    for dtype in FLOATS {
        for m in [17, 33, 64] {
            v.push(Case {
                bias_silu: true,
                ..case(dtype, m, 45, 40, true)
            });
            v.push(Case {
                batch: 3,
                ..case(dtype, m, 48, 37, false)
            });
            v.push(case(dtype, m, 576, 1536, true));
        }
    }
    v
}

/// Problems for the CUDA-core kernel: odd sizes (partial tiles on every side, K = 37 on the
/// element path), each tile size (64×64, 128×64 and 128×128 are picked by grid size), both
/// layouts of B, an epilogue, a batch; f32 mostly (its kernel), f16 and bf16 at one size.
pub fn large_m() -> Vec<Case> {
    let f32c = |m, n, k, nk| case(DType::F32, m, n, k, nk);
    let mut v = vec![
        f32c(77, 45, 40, true),
        f32c(77, 45, 40, false),
        f32c(77, 45, 37, true),
        f32c(77, 45, 37, false),
        Case {
            bias_silu: true,
            ..f32c(77, 45, 40, true)
        },
        Case {
            batch: 3,
            bias_silu: true,
            ..f32c(77, 45, 37, false)
        },
        f32c(4096, 384, 1536, true),
        f32c(4096, 384, 1536, false),
        // 9 × 33 blocks of 128×64.
        f32c(1031, 2053, 515, false),
        // 19 × 17 blocks of 128×128.
        Case {
            bias_silu: true,
            ..f32c(2305, 2100, 260, true)
        },
    ];
    // Batches that make the grid large enough for the larger tiles at small sizes: 50 × 2 × 3
    // blocks of 128×64, 70 × 2 × 2 of 128×128.
    v.push(Case {
        batch: 50,
        ..f32c(130, 130, 12, false)
    });
    v.push(Case {
        batch: 70,
        bias_silu: true,
        ..f32c(130, 130, 12, true)
    });
    for dtype in [DType::F16, DType::BF16] {
        v.push(case(dtype, 77, 45, 40, true));
        v.push(Case {
            bias_silu: true,
            ..case(dtype, 130, 200, 37, false)
        });
    }
    v
}
