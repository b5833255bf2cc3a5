//! How the GEMM family chooses among its kernels and shapes them, per problem and target.

use super::{scalar, small_m, Problem};
use crate::arch::Target;
use crate::ir::gemm::Operand;
use crate::ir::{DType, Gemm, GemmDims, Graph, Op, Shape, View};

/// `batch` × [m, k] · [k, n] with B stored [N, K] (`nk`) or [K, N], and its Problem.
fn problem(dtype: DType, batch: usize, m: usize, n: usize, k: usize, nk: bool) -> (Problem, Gemm) {
    let dims = GemmDims {
        batch: vec![batch],
        m: vec![m],
        n: vec![n],
        k: vec![k],
    };
    let b = if nk {
        View {
            batch: vec![n * k],
            rows: vec![1],
            cols: vec![k],
        }
    } else {
        View::contiguous(&dims, Operand::B)
    };
    let gemm = Gemm {
        a: View::contiguous(&dims, Operand::A),
        b,
        out: View::contiguous(&dims, Operand::Out),
        extras: vec![],
        epilogue: None,
        shape: Shape(vec![batch, m, n]),
        prologue: None,
        paired: false,
        dims,
    };
    let mut g = Graph::new("gemm");
    let a = g.input("a", dtype, &[batch, m, k]).unwrap();
    let b_shape = if nk { [batch, n, k] } else { [batch, k, n] };
    let bi = g.input("b", dtype, &b_shape).unwrap();
    let id = g.gemm(gemm.clone(), a, bi, &[]).unwrap();
    let Op::Gemm(stored) = g.op(id) else {
        unreachable!("a gemm node")
    };
    (Problem::new(&g, id, stored).unwrap(), gemm)
}

fn target(arch: &str) -> Target {
    Target::parse(arch).unwrap()
}

/// Up to 16 rows always; 17 to 64 where the tiled kernels' 64×64 tiles would number fewer
/// than 128 (SmolLM2's projections at 32 rows: 3, 9, 24 tiles), the batch counted.
#[test]
fn small_m_takes_more_rows_where_the_tiled_grid_is_small() {
    for (batch, m, n, takes) in [
        (1, 1, 64, true),
        (1, 16, 64, true),
        (1, 16, 1_000_000, true),
        (1, 17, 64, true),
        (1, 33, 1536, true),
        (1, 64, 576, true),
        (1, 65, 64, false),
        // 127 tiles, then 128.
        (1, 32, 127 * 64, true),
        (1, 32, 128 * 64, false),
        (1, 64, 49_152, false),
        (2, 32, 64 * 64, false),
    ] {
        let (p, _) = problem(DType::F16, batch, m, n, 64, true);
        assert_eq!(small_m::takes(&p), takes, "batch {batch} M {m} N {n}");
    }
}

/// The fewest groups of at most 16 rows (8 paired), the rows shared out evenly; one group,
/// all rows, up to the group's size (the kernels of M ≤ 16 as before row groups).
#[test]
fn small_m_row_groups_cover_m_evenly() {
    for (m, pair, want) in [
        (1, false, (1, 1)),
        (16, false, (16, 1)),
        (17, false, (9, 2)),
        (33, false, (11, 3)),
        (47, false, (16, 3)),
        (64, false, (16, 4)),
        (8, true, (8, 1)),
        (9, true, (5, 2)),
        (32, true, (8, 4)),
        (33, true, (7, 5)),
    ] {
        let (mut p, _) = problem(DType::F16, 1, m, 576, 64, true);
        p.pair = pair;
        assert_eq!(small_m::row_groups(&p), want, "M {m} paired {pair}");
    }
    for m in 1..=small_m::MAX_M {
        for pair in [false, true] {
            let (mut p, _) = problem(DType::F16, 1, m, 576, 64, true);
            p.pair = pair;
            let (rows, groups) = small_m::row_groups(&p);
            let most = if pair {
                small_m::PAIRED_GROUP_ROWS
            } else {
                small_m::GROUP_ROWS
            };
            assert!(rows <= most && groups * rows >= m && (groups - 1) * rows < m);
            assert_eq!(groups == 1, m <= most, "M {m} paired {pair}");
        }
    }
}

/// Row groups are x's fastest digit: the grid is the column blocks times the groups, and a
/// group's rows leave room for columns as M of them would.
#[test]
fn small_m_row_groups_multiply_the_grid() {
    // SmolLM2's down projection at 33 rows: 3 groups of 11; 64 / 11 sums leave 4 columns, 432
    // blocks too few, so 2 columns: 288 column blocks × 3 groups.
    let (p, g) = problem(DType::F16, 1, 33, 576, 1536, true);
    for arch in ["sm_90", "gfx942", "gfx1100"] {
        let t = target(arch);
        let c = small_m::config(&p, &g, DType::F16, &t);
        assert_eq!((c.rows, c.row_groups, c.cols), (11, 3, 2), "{arch}");
        let launch = small_m::launch(&c, &p, "n", &t).unwrap();
        assert_eq!(launch.grid, [864, 1, 1], "{arch}");
    }
    // 17 rows of a batch of 2: 2 groups of 9 (7 columns a block at most: 4), y the batch.
    let (p, g) = problem(DType::F32, 2, 17, 1000, 64, true);
    let c = small_m::config(&p, &g, DType::F32, &target("sm_90"));
    assert_eq!((c.rows, c.row_groups), (9, 2));
    let launch = small_m::launch(&c, &p, "n", &target("sm_90")).unwrap();
    assert_eq!(launch.grid, [1000usize.div_ceil(c.cols) as u32 * 2, 2, 1]);
    // One group: the grid of before.
    let (p, g) = problem(DType::F16, 1, 16, 576, 1536, true);
    let c = small_m::config(&p, &g, DType::F16, &target("sm_90"));
    assert_eq!((c.rows, c.row_groups), (16, 1));
    let launch = small_m::launch(&c, &p, "n", &target("sm_90")).unwrap();
    assert_eq!(launch.grid, [576usize.div_ceil(c.cols) as u32, 1, 1]);
}

/// The quantized GEMV's row groups: 16 rows a block, 8 on Q5_K (its reader spilled at 16 on
/// sm_90) and with paired columns, whose blocks hold whole pairs at every M.
#[test]
fn quant_row_groups_and_whole_pairs() {
    use crate::ir::QuantScheme;
    for m in 1..=small_m::MAX_M {
        for scheme in [QuantScheme::Q4_1, QuantScheme::Q5K] {
            for (pair, n) in [(false, 576), (true, 74), (true, 3072)] {
                let (mut p, mut g) = problem(DType::F16, 1, m, n, 256, true);
                p.pair = pair;
                g.paired = pair;
                let c = super::quant::config(&p, &g, scheme, &target("gfx1100"));
                let most = if pair || scheme == QuantScheme::Q5K {
                    8
                } else {
                    16
                };
                let what = format!("M {m} {scheme} paired {pair} N {n}");
                assert!(c.rows <= most && c.row_groups * c.rows >= m, "{what}");
                assert!((c.row_groups - 1) * c.rows < m, "{what}");
                if pair {
                    assert!(c.cols >= 2 && c.cols.is_multiple_of(2), "{what}: {c:?}");
                }
            }
        }
    }
}

#[test]
fn small_m_reads_weights_in_16_byte_chunks_when_k_allows() {
    // Decode against a 4096² f16 weight: 8 halves a chunk, 4 columns a block (1024 blocks
    // fill the GPU), 4 waves (512 chunks: 4 per thread on wave32, 2 on wave64).
    let (p, g) = problem(DType::F16, 1, 1, 4096, 4096, true);
    for arch in ["sm_90", "gfx90a"] {
        let c = small_m::config(&p, &g, DType::F16, &target(arch));
        assert_eq!(
            c,
            small_m::Config {
                cols: 4,
                waves: 4,
                vec: 8,
                a_vec: true,
                b_vec: true,
                along_n: false,
                groups: 1,
                rows: 1,
                row_groups: 1,
                mma: None,
            },
            "{arch}"
        );
    }
    // f32: 4 floats a chunk.
    let (p, g) = problem(DType::F32, 1, 3, 4096, 4096, true);
    assert_eq!(small_m::config(&p, &g, DType::F32, &target("sm_90")).vec, 4);
    // K = 37: every vector would cross a column; [K, N] weights are not K-contiguous.
    let (p, g) = problem(DType::F16, 1, 3, 45, 37, true);
    let c = small_m::config(&p, &g, DType::F16, &target("sm_90"));
    assert!(!c.a_vec && !c.b_vec);
    let (p, g) = problem(DType::BF16, 1, 3, 45, 40, false);
    let c = small_m::config(&p, &g, DType::BF16, &target("sm_90"));
    assert!(c.a_vec && !c.b_vec);
}

#[test]
fn small_m_reads_n_contiguous_weights_along_n() {
    // [K, N] f16 weights, 4096²: 8 columns a lane; 16 a block would give 256 blocks, too few,
    // so one lane a row; 64 rows of K per wave, 2 steps each: 4 waves.
    let (p, g) = problem(DType::F16, 1, 1, 4096, 4096, false);
    let c = small_m::config(&p, &g, DType::F16, &target("sm_90"));
    assert!(c.along_n && !c.b_vec);
    assert_eq!((c.groups, c.cols, c.waves), (1, 8, 4));
    // 11008 columns: two lanes a row (a whole sector), 688 blocks.
    let (p, g) = problem(DType::F16, 1, 3, 11008, 4096, false);
    let c = small_m::config(&p, &g, DType::F16, &target("gfx942"));
    assert_eq!((c.along_n, c.groups, c.cols), (true, 2, 16));
    // 16 rows × 8 columns would be 128 sums a thread: K-chunks instead; f32 fits (16 × 4).
    let (p, g) = problem(DType::F16, 1, 16, 4096, 4096, false);
    assert!(!small_m::config(&p, &g, DType::F16, &target("sm_90")).along_n);
    let (p, g) = problem(DType::F32, 1, 16, 4096, 4096, false);
    assert!(small_m::config(&p, &g, DType::F32, &target("sm_90")).along_n);
    // N = 45: no vector fits along N either.
    let (p, g) = problem(DType::F32, 1, 2, 45, 64, false);
    assert!(!small_m::config(&p, &g, DType::F32, &target("sm_90")).along_n);
}

#[test]
fn small_m_shapes_follow_rows_columns_and_wave_size() {
    // 16 rows: at most 64 sums a thread, so 4 columns; a grid of 45 columns is too small to
    // fill a GPU, so one column a block.
    let (p, g) = problem(DType::F16, 1, 16, 45, 40, true);
    let c = small_m::config(&p, &g, DType::F16, &target("sm_90"));
    assert_eq!((c.cols, c.waves), (1, 1));
    let (p, g) = problem(DType::F16, 1, 16, 8192, 576, true);
    let c = small_m::config(&p, &g, DType::F16, &target("sm_90"));
    assert_eq!((c.cols, c.waves), (4, 2));
    // 72 chunks of K: two waves of 32 threads, one of 64.
    let c64 = small_m::config(&p, &g, DType::F16, &target("gfx942"));
    assert_eq!(c64.waves, 1);
    let launch = small_m::launch(&c, &p, "n", &target("sm_90")).unwrap();
    assert_eq!((launch.grid, launch.block), ([2048, 1, 1], [64, 1, 1]));
    let launch = small_m::launch(&c64, &p, "n", &target("gfx942")).unwrap();
    assert_eq!(launch.block, [64, 1, 1]);
    // A batch multiplies the grid: 200 columns alone take one a block, eight batches two.
    let (p, g) = problem(DType::F32, 1, 2, 200, 40, true);
    assert_eq!(
        small_m::config(&p, &g, DType::F32, &target("gfx1100")).cols,
        1
    );
    let (p, g) = problem(DType::F32, 8, 2, 200, 40, true);
    let c = small_m::config(&p, &g, DType::F32, &target("gfx1100"));
    assert_eq!(c.cols, 2);
    let launch = small_m::launch(&c, &p, "n", &target("gfx1100")).unwrap();
    assert_eq!(launch.grid, [100, 8, 1]);
}

/// Paired columns (gate/up interleaved) are combined a pair per block, so a block's columns are
/// always even: at M 3 and 5 the register budget alone gave 5 and 3, which split pairs across
/// blocks (a chunked prefill of 5 tokens produced NaN logits).
#[test]
fn small_m_paired_columns_come_in_whole_pairs() {
    for m in 1..=small_m::MAX_M {
        for n in [64, 6144] {
            for (fill, max_cols) in [
                (small_m::FILL_BLOCKS, small_m::MAX_COLS),
                (
                    small_m::PERSISTENT_FILL_BLOCKS,
                    small_m::PERSISTENT_MAX_COLS,
                ),
            ] {
                let (mut p, mut g) = problem(DType::F32, 1, m, n, 64, true);
                g.paired = true;
                p.pair = true;
                p.fill_blocks = fill;
                p.max_cols = max_cols;
                let c = small_m::config(&p, &g, DType::F32, &target("sm_90"));
                assert!(
                    c.cols >= 2 && c.cols.is_multiple_of(2),
                    "M {m} N {n} fill {fill}: {} columns",
                    c.cols
                );
                // One pair per thread in the combine (`gemm_parts.hip`'s pair_combine).
                assert!(c.rows * c.cols / 2 <= c.waves * 32, "M {m} N {n}");
            }
        }
    }
}

#[test]
fn scalar_tiles_shrink_until_the_grid_fills_the_gpu() {
    // 32 × 32 blocks of 128×128 are enough.
    let (p, g) = problem(DType::F32, 1, 4096, 4096, 4096, false);
    let c = scalar::config(&p, &g, DType::F32);
    assert_eq!((c.block_m, c.block_n, c.threads()), (128, 128, 256));
    // 4096 × 384: 96 blocks of 128×128, 192 of 128×64, 384 of 64×64.
    let (p, g) = problem(DType::F32, 1, 4096, 384, 1536, true);
    let c = scalar::config(&p, &g, DType::F32);
    assert_eq!((c.block_m, c.block_n, c.threads()), (64, 64, 64));
    let launch = scalar::launch(&c, &p, "n", &target("sm_90")).unwrap();
    assert_eq!((launch.grid, launch.block), ([6, 64, 1], [64, 1, 1]));
    // 1031 × 2053: 153 blocks of 128×128, 297 of 128×64.
    let (p, g) = problem(DType::F32, 1, 1031, 2053, 515, false);
    let c = scalar::config(&p, &g, DType::F32);
    assert_eq!((c.block_m, c.block_n), (128, 64));
    // A batch counts.
    let (p, g) = problem(DType::F32, 4, 1031, 2053, 515, false);
    assert_eq!(scalar::config(&p, &g, DType::F32).block_n, 128);
}

#[test]
fn scalar_loads_follow_the_views() {
    use scalar::Load;
    // A [M, K] along K; B [K, N] along N; B [N, K] along K.
    let (p, g) = problem(DType::F32, 1, 77, 48, 40, false);
    let c = scalar::config(&p, &g, DType::F32);
    assert_eq!((c.a_load, c.b_load), (Load::K, Load::X));
    let (p, g) = problem(DType::F32, 1, 77, 45, 40, true);
    let c = scalar::config(&p, &g, DType::F32);
    assert_eq!((c.a_load, c.b_load), (Load::K, Load::K));
    // K = 37, N = 45: no float4 fits; elements in the order memory has them.
    let (p, g) = problem(DType::F32, 1, 77, 45, 37, false);
    let c = scalar::config(&p, &g, DType::F32);
    assert_eq!((c.a_load, c.b_load), (Load::Ek, Load::Ex));
    let (p, g) = problem(DType::F32, 1, 77, 45, 37, true);
    let c = scalar::config(&p, &g, DType::F32);
    assert_eq!((c.a_load, c.b_load), (Load::Ek, Load::Ek));
    // 16-bit operands are read element by element.
    let (p, g) = problem(DType::F16, 1, 77, 48, 40, false);
    let c = scalar::config(&p, &g, DType::F16);
    assert_eq!((c.a_load, c.b_load), (Load::Ek, Load::Ex));
}

#[test]
fn lowering_picks_small_m_up_to_sixteen_rows_and_in_row_groups_to_64() {
    // 45 columns: one tile of the tiled kernels, so up to 64 rows in row groups. Past them
    // the matrix cores for 16-bit operands (gfx1100 has WMMA), CUDA cores for f32.
    for (m, sixteen_bit, f32) in [
        (1, "gemm_small_m", "gemm_small_m"),
        (16, "gemm_small_m", "gemm_small_m"),
        (17, "gemm_small_m", "gemm_small_m"),
        (64, "gemm_small_m", "gemm_small_m"),
        (65, "gemm_mma", "gemm"),
    ] {
        for dtype in [DType::F16, DType::BF16, DType::F32] {
            let family = if dtype == DType::F32 {
                f32
            } else {
                sixteen_bit
            };
            let dims = GemmDims {
                batch: vec![],
                m: vec![m],
                n: vec![45],
                k: vec![40],
            };
            let gemm = Gemm {
                a: View::contiguous(&dims, Operand::A),
                b: View::contiguous(&dims, Operand::B),
                out: View::contiguous(&dims, Operand::Out),
                extras: vec![],
                epilogue: None,
                shape: Shape(vec![m, 45]),
                prologue: None,
                paired: false,
                dims,
            };
            let mut g = Graph::new("gemm");
            let a = g.input("a", dtype, &[m, 40]).unwrap();
            let b = g.input("b", dtype, &[40, 45]).unwrap();
            let c = g.gemm(gemm, a, b, &[]).unwrap();
            g.set_outputs(&[c]).unwrap();
            let plan = crate::codegen::generate(&g, &target("gfx1100")).unwrap();
            let families: Vec<&str> = plan.kernels.iter().map(|k| k.family).collect();
            assert_eq!(families, [family], "M = {m}, {dtype}");
        }
    }
}

#[test]
fn quantized_activations_split_off_in_persistent_plans_unless_forced() {
    use super::quant_dot::splits;
    use crate::codegen::QuantSplit;
    use crate::ir::QuantScheme;
    // Q4_K, 128,256 × 2,048: 144 MiB of blocks, past the split's bound.
    let (mut p, _) = problem(DType::F16, 1, 1, 128_256, 2_048, true);
    assert!(splits(&p, QuantScheme::Q4K, QuantSplit::Auto));
    p.persistent = true;
    assert!(!splits(&p, QuantScheme::Q4K, QuantSplit::Auto));
    assert!(splits(&p, QuantScheme::Q4K, QuantSplit::On));
    assert!(!splits(&p, QuantScheme::Q4K, QuantSplit::Off));
}

/// The tensor-core GEMV's loads assume NVIDIA's m16n8k16 layouts; every other atom in the
/// tables is refused by the check, so a target whose atom differs keeps the CUDA-core form.
#[test]
fn mma_gemv_layouts_are_the_atoms() {
    use crate::arch::mma::atoms::{M16N8K16_BF16, M16N8K16_F16, M16N8K8_TF32};
    assert!(small_m::mma_k_slots_agree(&M16N8K16_F16));
    assert!(small_m::mma_k_slots_agree(&M16N8K16_BF16));
    assert!(!small_m::mma_k_slots_agree(&M16N8K8_TF32));
    for arch in ["gfx90a", "gfx942", "gfx1100", "gfx1201"] {
        for atom in target(arch).caps.mma {
            assert!(!small_m::mma_k_slots_agree(atom), "{arch} {}", atom.name);
        }
    }
    // Taken on sm_90 where asked for, at more than 16 rows, f16/bf16 only.
    let (mut p, _) = problem(DType::F16, 1, 32, 1536, 576, true);
    assert!(small_m::mma_atom(&p, DType::F16, true, true, &target("sm_90")).is_none());
    p.mma_gemv = true;
    assert!(small_m::mma_atom(&p, DType::F16, true, true, &target("sm_90")).is_some());
    assert!(small_m::mma_atom(&p, DType::F32, true, true, &target("sm_90")).is_none());
    assert!(small_m::mma_atom(&p, DType::F16, true, false, &target("sm_90")).is_none());
    assert!(small_m::mma_atom(&p, DType::F16, true, true, &target("gfx90a")).is_none());
    p.m = 16;
    assert!(small_m::mma_atom(&p, DType::F16, true, true, &target("sm_90")).is_none());
}
