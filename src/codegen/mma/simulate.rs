//! The layout data checked without hardware. Each instruction is simulated the way its
//! document describes it: the formulas below are transcribed from the documents, independently
//! of the bit tables in `atoms.rs`, and say which matrix element the instruction takes from (or
//! puts into) each register slot of each lane. The fragments are filled and drained by the same
//! index expressions the generated helpers print, so a wrong table row, a wrong expression or a
//! wrong address composition shows up as a wrong product.

use super::atoms::ALL;
use super::helpers::{c_to_a, fragment_helpers, ldmatrix_a, ldmatrix_pairs};
use super::{Layout, MmaAtom, MmaKind, Precision};

/// Which operand a formula is for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Operand {
    A,
    B,
    C,
}

/// (row, col) of element `e` of lane `l`, from the documents:
/// - PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type";
/// - AMD CDNA2/CDNA3 ISA, "Matrix Arithmetic Instructions" (and AMD's matrix instruction
///   calculator) for v_mfma_f32_32x32x8{f16,bf16_1k} and v_mfma_f32_16x16x16{f16,bf16_1k};
/// - RDNA3 ISA, "Wave Matrix Multiply Accumulate" (A/B copied in both half-waves, D rows
///   interleaved between them);
/// - RDNA4 ISA, "Wave Matrix Multiply Accumulate", and AMD's matrix instruction calculator for
///   rdna4 (K split between the half-waves in groups of four: lanes 0-15 K {0-3, 8-11}, lanes
///   16-31 K {4-7, 12-15}; D rows 0-7 in the lower half-wave, 8-15 in the upper);
/// - PTX ISA, "Matrix Fragments for mma.m16n8k8" (.tf32: one element per register);
/// - AMD MI300 ISA, v_mfma_f32_32x32x4_xf32 and v_mfma_f32_16x16x8_xf32 (two K per lane).
fn documented(atom: &MmaAtom, op: Operand, l: u32, e: u32) -> (u32, u32) {
    match (atom.kind, atom.m, op) {
        (MmaKind::MmaSync, _, op) if atom.k == 8 => {
            let (g, t) = (l >> 2, l % 4);
            match op {
                Operand::A => (g + 8 * (e & 1), t + 4 * (e >> 1)),
                Operand::B => (t + 4 * e, g),
                Operand::C => (g + 8 * (e >> 1), 2 * t + (e & 1)),
            }
        }
        (MmaKind::Mfma, 32, Operand::A) if atom.k == 4 => (l % 32, 2 * (l / 32) + e),
        (MmaKind::Mfma, 32, Operand::B) if atom.k == 4 => (2 * (l / 32) + e, l % 32),
        (MmaKind::Mfma, 16, Operand::A) if atom.k == 8 => (l % 16, 2 * (l / 16) + e),
        (MmaKind::Mfma, 16, Operand::B) if atom.k == 8 => (2 * (l / 16) + e, l % 16),
        (MmaKind::MmaSync, _, op) => {
            let (g, t) = (l >> 2, l % 4);
            match op {
                Operand::A => (g + 8 * ((e >> 1) & 1), 2 * t + (e & 1) + 8 * (e >> 2)),
                Operand::B => (2 * t + (e & 1) + 8 * (e >> 1), g),
                Operand::C => (g + 8 * (e >> 1), 2 * t + (e & 1)),
            }
        }
        (MmaKind::Mfma, 32, Operand::A) => (l % 32, 4 * (l / 32) + e),
        (MmaKind::Mfma, 32, Operand::B) => (4 * (l / 32) + e, l % 32),
        (MmaKind::Mfma, 32, Operand::C) => (8 * (e / 4) + 4 * (l / 32) + e % 4, l % 32),
        (MmaKind::Mfma, _, Operand::A) => (l % 16, 4 * (l / 16) + e),
        (MmaKind::Mfma, _, Operand::B) => (4 * (l / 16) + e, l % 16),
        (MmaKind::Mfma, _, Operand::C) => (4 * (l / 16) + e, l % 16),
        (MmaKind::WmmaGfx11, _, Operand::A) => (l % 16, e),
        (MmaKind::WmmaGfx11, _, Operand::B) => (e, l % 16),
        (MmaKind::WmmaGfx11, _, Operand::C) => (2 * e + l / 16, l % 16),
        (MmaKind::WmmaGfx12, _, Operand::A) => (l % 16, e % 4 + 4 * (l / 16) + 8 * (e / 4)),
        (MmaKind::WmmaGfx12, _, Operand::B) => (e % 4 + 4 * (l / 16) + 8 * (e / 4), l % 16),
        (MmaKind::WmmaGfx12, _, Operand::C) => (8 * (l / 16) + e, l % 16),
    }
}

fn layouts(atom: &MmaAtom) -> [(Operand, &Layout, (u32, u32)); 3] {
    [
        (Operand::A, &atom.a, (atom.m, atom.k)),
        (Operand::B, &atom.b, (atom.k, atom.n)),
        (Operand::C, &atom.c, (atom.m, atom.n)),
    ]
}

#[test]
fn every_layout_is_the_documented_one_and_covers_its_matrix() {
    for atom in ALL {
        for (op, layout, (rows, cols)) in layouts(atom) {
            assert_eq!((layout.rows, layout.cols), (rows, cols), "{}", atom.name);
            assert_eq!(layout.lanes(), atom.lanes, "{}", atom.name);
            let mut held = vec![0u32; (rows * cols) as usize];
            for l in 0..atom.lanes {
                for e in 0..layout.elems() {
                    let at = layout.coord(l, e);
                    assert_eq!(
                        at,
                        documented(atom, op, l, e),
                        "{} lane {l} elem {e}",
                        atom.name
                    );
                    assert!(at.0 < rows && at.1 < cols, "{}", atom.name);
                    held[(at.0 * cols + at.1) as usize] += 1;
                }
            }
            // Every element is held, each as often (copies in both RDNA3 half-waves).
            let copies = atom.lanes * layout.elems() / (rows * cols);
            assert!(copies >= 1, "{}", atom.name);
            assert!(held.iter().all(|&h| h == copies), "{} {held:?}", atom.name);
            assert_eq!(
                copies > 1,
                atom.kind == MmaKind::WmmaGfx11 && op != Operand::C,
                "{}",
                atom.name
            );
        }
    }
}

/// Deterministic small integers, so every product and sum is exact in f16, bf16 and f32.
fn small_ints(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 7) as f64 - 3.0
        })
        .collect()
}

/// An input value as the instruction multiplies it: TF32 atoms round f32 to a 10-bit mantissa
/// (`cvt.rna` on NVIDIA, the xf32 MFMA itself on CDNA3), others use the value as stored.
fn seen(atom: &MmaAtom, v: f64) -> f64 {
    match atom.precision {
        Precision::Exact => v,
        Precision::Tf32 => f64::from(atom.precision.round(v as f32)),
    }
}

/// Runs the probe kernel (`kernel_templates/mma_probe.hip`) in simulation: the helpers' index
/// expressions fill the fragments from memory, the instruction computes as documented, and the
/// store helper's expressions write C back.
fn simulate_probe(atom: &MmaAtom, a: &[f64], b: &[f64], bt: &[f64]) -> Vec<f64> {
    let (m, n, k) = (atom.m, atom.n, atom.k);
    let lanes = atom.lanes;
    let ld_a = 2 * k;
    let mut acc = vec![vec![0.0f64; atom.c.elems() as usize]; lanes as usize];
    for step in 0..2u32 {
        // load_a(fa, a + step*K, 2K, 0, M): A[m][k] = t[(row0 + m)*ld + k], t = a + step*K.
        let fa: Vec<Vec<f64>> = (0..lanes)
            .map(|l| {
                (0..atom.a.elems())
                    .map(|e| {
                        let (r, c) = (atom.a.row().eval(l, e), atom.a.col().eval(l, e));
                        assert!(r < m, "bounded rows");
                        a[(r * ld_a + c + step * k) as usize]
                    })
                    .collect()
            })
            .collect();
        // Step 0: load_b_kn(fb, b, N): t[k*ld + n]. Step 1: load_b_nk(fb, bt + K, 2K): t[n*ld + k].
        let fb: Vec<Vec<f64>> = (0..lanes)
            .map(|l| {
                (0..atom.b.elems())
                    .map(|e| {
                        let (r, c) = (atom.b.row().eval(l, e), atom.b.col().eval(l, e));
                        if step == 0 {
                            b[(r * n + c) as usize]
                        } else {
                            bt[(c * ld_a + r + k) as usize]
                        }
                    })
                    .collect()
            })
            .collect();
        // The instruction: gather A and B as the document says it reads them (every copy must
        // agree), multiply, scatter D the same way.
        let gather = |op: Operand, f: &[Vec<f64>], rows: u32, cols: u32| -> Vec<f64> {
            let mut out = vec![f64::NAN; (rows * cols) as usize];
            for l in 0..lanes {
                for (e, &v) in f[l as usize].iter().enumerate() {
                    let v = seen(atom, v);
                    let (r, c) = documented(atom, op, l, e as u32);
                    let slot = &mut out[(r * cols + c) as usize];
                    assert!(slot.is_nan() || *slot == v, "{}: copies differ", atom.name);
                    *slot = v;
                }
            }
            out
        };
        let (am, bm) = (gather(Operand::A, &fa, m, k), gather(Operand::B, &fb, k, n));
        for l in 0..lanes {
            for e in 0..atom.c.elems() {
                let (r, c) = documented(atom, Operand::C, l, e);
                let dot: f64 = (0..k)
                    .map(|i| am[(r * k + i) as usize] * bm[(i * n + c) as usize])
                    .sum();
                acc[l as usize][e as usize] += dot;
            }
        }
    }
    // store_c(c, N, acc): t[row*ld + col] = c[e].
    let mut out = vec![f64::NAN; (m * n) as usize];
    for l in 0..lanes {
        for e in 0..atom.c.elems() {
            let (r, c) = (atom.c.row().eval(l, e), atom.c.col().eval(l, e));
            out[(r * n + c) as usize] = acc[l as usize][e as usize];
        }
    }
    out
}

/// The probe's product of `a` `[M, K]` and `b` `[K, N]` through `atom`'s layouts (B also given
/// transposed, as the probe reads it).
fn probe(atom: &MmaAtom, a: &[f64], b: &[f64], (n, k): (usize, usize)) -> Vec<f64> {
    let bt: Vec<f64> = (0..n * k).map(|x| b[(x % k) * n + x / k]).collect();
    simulate_probe(atom, a, b, &bt)
}

/// A·B in f64, row-major `[M, N]`.
fn exact_product(a: &[f64], b: &[f64], (m, n, k): (usize, usize, usize)) -> Vec<f64> {
    (0..m * n)
        .map(|i| (0..k).map(|x| a[(i / n) * k + x] * b[x * n + i % n]).sum())
        .collect()
}

#[test]
fn a_simulated_mma_over_the_layouts_computes_a_times_b() {
    for (i, atom) in ALL.iter().enumerate() {
        let (m, n, k) = (atom.m as usize, atom.n as usize, 2 * atom.k as usize);
        let a = small_ints(m * k, 11 + i as u64);
        let b = small_ints(k * n, 101 + i as u64);
        let got = probe(atom, &a, &b, (n, k));
        for r in 0..m {
            for c in 0..n {
                let want: f64 = (0..k).map(|x| a[r * k + x] * b[x * n + c]).sum();
                assert_eq!(got[r * n + c], want, "{} C[{r}][{c}]", atom.name);
            }
        }
    }
}

/// A planted error in a layout (two lane bits swapped) is caught by the checks above: the
/// simulation is not vacuous.
#[test]
fn a_wrong_layout_is_caught() {
    use super::Bit::{Col, Row};
    let mut wrong = super::atoms::M16N8K16_F16.clone();
    wrong.c = Layout {
        lane_bits: &[Col(2), Col(1), Row(0), Row(1), Row(2)],
        ..wrong.c
    };
    let differs = (0..32)
        .any(|l| (0..4).any(|e| wrong.c.coord(l, e) != documented(&wrong, Operand::C, l, e)));
    assert!(differs);
    let (m, n, k) = (16, 8, 32);
    let a = small_ints(m * k, 3);
    let b = small_ints(k * n, 4);
    assert_ne!(
        probe(&wrong, &a, &b, (n, k)),
        exact_product(&a, &b, (m, n, k))
    );
}

/// B's (k, n) for slot `e` of lane `l`, written as the per-lane K lists AMD's matrix
/// instruction calculator prints (and the PTX table), not through `documented` or the bit
/// tables: a second, independent spelling of where B's K elements sit.
fn listed_b(atom: &MmaAtom, l: u32, e: u32) -> (u32, u32) {
    const GFX12_K: [u32; 8] = [0, 1, 2, 3, 8, 9, 10, 11];
    match atom.kind {
        MmaKind::MmaSync if atom.precision == Precision::Tf32 => (l % 4 + 4 * e, l >> 2),
        MmaKind::MmaSync => (2 * (l % 4) + (e & 1) + 8 * (e >> 1), l >> 2),
        // Each lane group holds B_ELEMS consecutive K (four 16-bit values, two xf32).
        MmaKind::Mfma => (atom.b.elems() * (l / atom.n) + e, l % atom.n),
        MmaKind::WmmaGfx11 => (e, l % 16),
        MmaKind::WmmaGfx12 => (GFX12_K[e as usize] + 4 * (l / 16), l % 16),
    }
}

/// One K step of the instruction on an A fragment loaded through `atom`'s table and a B
/// fragment built in the calculator's order: right only when the table's A order is the
/// hardware's, whatever order B uses. Loading A and B both through the tables (as the probe
/// does) cannot see a K order that is wrong in the same way for both, since the K sum does
/// not care; a fragment made from other register data (P kept in registers) would.
fn mixed_order_product_is_right(atom: &MmaAtom) -> bool {
    let (m, n, k) = (atom.m, atom.n, atom.k);
    let a = small_ints((m * k) as usize, 21);
    let b = small_ints((k * n) as usize, 22);
    let mut am = vec![f64::NAN; (m * k) as usize];
    let mut bm = vec![f64::NAN; (k * n) as usize];
    for l in 0..atom.lanes {
        for e in 0..atom.a.elems() {
            let (r, c) = atom.a.coord(l, e);
            let (hr, hc) = documented(atom, Operand::A, l, e);
            am[(hr * k + hc) as usize] = a[(r * k + c) as usize];
        }
        for e in 0..atom.b.elems() {
            let (r, c) = listed_b(atom, l, e);
            let (hr, hc) = documented(atom, Operand::B, l, e);
            bm[(hr * n + hc) as usize] = b[(r * n + c) as usize];
        }
    }
    (0..m).all(|r| {
        (0..n).all(|c| {
            let got: f64 = (0..k)
                .map(|i| am[(r * k + i) as usize] * bm[(i * n + c) as usize])
                .sum();
            let want: f64 = (0..k)
                .map(|i| a[(r * k + i) as usize] * b[(i * n + c) as usize])
                .sum();
            got == want
        })
    })
}

#[test]
fn a_and_b_fragments_built_in_different_orders_multiply_right() {
    for atom in ALL {
        assert!(mixed_order_product_is_right(atom), "{}", atom.name);
    }
    // The RDNA4 layout once written as K 0-7 in the lower half-wave and 8-15 in the upper
    // passes a probe that loads A and B alike, and must fail here.
    use super::Bit::{Col, Row};
    let mut old = super::atoms::WMMA12_16X16X16_F16.clone();
    old.a = Layout {
        lane_bits: &[Row(0), Row(1), Row(2), Row(3), Col(3)],
        elem_bits: &[Col(0), Col(1), Col(2)],
        ..old.a
    };
    assert!(!mixed_order_product_is_right(&old));
}

#[test]
fn accumulators_become_an_a_operand_in_place_only_where_the_layouts_line_up() {
    for atom in ALL {
        let map = c_to_a(atom);
        assert_eq!(
            map.is_some(),
            atom.kind == MmaKind::MmaSync && atom.packs_pairs(),
            "{}",
            atom.name
        );
        let Some(map) = map else { continue };
        // P (M x K) held as K/N accumulator tiles; the A fragment built from them must be
        // exactly what load_a of P gives.
        let (m, k) = (atom.m, atom.k);
        let p = small_ints((m * k) as usize, 7);
        for l in 0..atom.lanes {
            for (ea, &(tile, ec)) in map.iter().enumerate() {
                let (r, c) = documented(atom, Operand::C, l, ec);
                let from_c = p[(r * k + tile * atom.n + c) as usize];
                let (ar, ac) = documented(atom, Operand::A, l, ea as u32);
                assert_eq!(
                    from_c,
                    p[(ar * k + ac) as usize],
                    "{} lane {l} slot {ea}",
                    atom.name
                );
            }
        }
    }
}

/// `ldmatrix.x4` as the PTX ISA describes it, from the addresses the generated helpers give.
#[test]
fn ldmatrix_pairs_load_the_documented_b_fragments() {
    for atom in ALL {
        let pairs = ldmatrix_pairs(atom);
        assert_eq!(
            pairs.is_some(),
            atom.kind == MmaKind::MmaSync && atom.packs_pairs(),
            "{}",
            atom.name
        );
        let Some(pairs) = pairs else { continue };
        let (k, n2) = (atom.k, 2 * atom.n);
        let ld = 24; // a padded row, as in shared memory
                     // B (k x 2N); stored transposed (nk: row n) and as is (kn: row k).
        let b = small_ints((k * n2) as usize, 5);
        let mut nk = vec![f64::NAN; (n2 * ld) as usize];
        let mut kn = vec![f64::NAN; (k * ld.max(n2)) as usize];
        for kk in 0..k {
            for nn in 0..n2 {
                nk[(nn * ld + kk) as usize] = b[(kk * n2 + nn) as usize];
                kn[(kk * ld + nn) as usize] = b[(kk * n2 + nn) as usize];
            }
        }
        for trans in [false, true] {
            let (row, col, mem) = if trans {
                (&pairs.kn_row, &pairs.kn_col, &kn)
            } else {
                (&pairs.nk_row, &pairs.nk_col, &nk)
            };
            let addr = |lane: u32| row.eval(lane, 0) * ld + col.eval(lane, 0);
            for t in 0..32u32 {
                for j in 0..4u32 {
                    for h in 0..2u32 {
                        // Non-trans: row T/4 of matrix j, columns 2(T%4)+h. Trans: element
                        // (2(T%4)+h, T/4) of matrix j, i.e. row 2(T%4)+h, column T/4 in memory.
                        let v = if trans {
                            mem[(addr(8 * j + 2 * (t % 4) + h) + t / 4) as usize]
                        } else {
                            mem[(addr(8 * j + t / 4) + 2 * (t % 4) + h) as usize]
                        };
                        let (f, r) = (j / 2, j % 2);
                        let (kk, nn) = documented(atom, Operand::B, t, 2 * r + h);
                        let want = b[(kk * n2 + nn + f * atom.n) as usize];
                        assert_eq!(v, want, "{} trans {trans} thread {t} matrix {j}", atom.name);
                    }
                }
            }
        }
    }
}

/// `ldmatrix.x4` (non-transposed) from the addresses `P_ldsm_a_row/col` give, on a row-major A
/// tile with padded rows, fills exactly the documented A fragment; atoms it cannot load have no
/// such helper.
#[test]
fn ldmatrix_loads_the_documented_a_fragment() {
    for atom in ALL {
        let l = ldmatrix_a(atom);
        assert_eq!(
            l.is_some(),
            atom.kind == MmaKind::MmaSync && atom.packs_pairs(),
            "{}",
            atom.name
        );
        let helpers = fragment_helpers(atom);
        assert_eq!(
            helpers.contains(&format!("{}_load_a_ldsm(", atom.prefix())),
            l.is_some(),
            "{}",
            atom.name
        );
        let Some(l) = l else { continue };
        let (m, k) = (atom.m, atom.k);
        let ld = k + 8;
        let a = small_ints((m * k) as usize, 9);
        let mut mem = vec![f64::NAN; (m * ld) as usize];
        for mm in 0..m {
            for kk in 0..k {
                mem[(mm * ld + kk) as usize] = a[(mm * k + kk) as usize];
            }
        }
        let addr = |lane: u32| l.row.eval(lane, 0) * ld + l.col.eval(lane, 0);
        for t in 0..32u32 {
            for j in 0..4u32 {
                for h in 0..2u32 {
                    // Register j of thread T: row T/4 of matrix j, columns 2(T%4)+h.
                    let v = mem[(addr(8 * j + t / 4) + 2 * (t % 4) + h) as usize];
                    let (mm, kk) = documented(atom, Operand::A, t, 2 * j + h);
                    assert_eq!(
                        v,
                        a[(mm * k + kk) as usize],
                        "{} thread {t} reg {j}",
                        atom.name
                    );
                }
            }
        }
        // The C spelling is the evaluated expression: lane L addresses row L % 16, column
        // 8 * (L / 16) of the 16x16 tile.
        for lane in 0..32 {
            assert_eq!(
                (l.row.eval(lane, 0), l.col.eval(lane, 0)),
                (lane % 16, 8 * (lane / 16))
            );
        }
    }
}

#[test]
fn row_reductions_reach_exactly_the_lanes_of_a_row() {
    for atom in ALL {
        let masks = atom.c.row_lane_masks();
        let slots = atom.c.row_slot();
        for l in 0..atom.lanes {
            // Lanes reached by xor-ing any subset of the masks.
            let reached: Vec<u32> = (0..1u32 << masks.len())
                .map(|s| {
                    masks
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| s >> i & 1 == 1)
                        .fold(l, |x, (_, m)| x ^ m)
                })
                .collect();
            for e in 0..atom.c.elems() {
                let row = atom.c.coord(l, e).0;
                // Elements of one slot are in one row.
                for e2 in 0..atom.c.elems() {
                    if slots.eval(0, e2) == slots.eval(0, e) {
                        assert_eq!(atom.c.coord(l, e2).0, row, "{}", atom.name);
                    }
                }
                // The reached lanes' elements of this slot are the whole row, once each.
                let slot = slots.eval(0, e);
                let same_slot: Vec<u32> = (0..atom.c.elems())
                    .filter(|&e2| slots.eval(0, e2) == slot)
                    .collect();
                let mut cols: Vec<u32> = reached
                    .iter()
                    .flat_map(|&x| same_slot.iter().map(move |&e2| atom.c.coord(x, e2)))
                    .map(|(r, c)| {
                        assert_eq!(r, row, "{}", atom.name);
                        c
                    })
                    .collect();
                cols.sort_unstable();
                assert_eq!(cols, (0..atom.n).collect::<Vec<_>>(), "{}", atom.name);
            }
        }
        assert!(atom.c.row_slots() <= atom.c.elems());
    }
}

#[test]
fn generated_helpers_spell_the_instruction_and_the_layouts() {
    let nv = fragment_helpers(&super::atoms::M16N8K16_F16);
    assert!(nv.contains(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
    ));
    assert!(nv.contains(
        "RF_INLINE int rf_m16n8k16_f16_a_row(int lane, int e) { return (lane >> 2) + (((e >> 1) & 1) << 3); }"
    ));
    assert!(nv.contains("a[0] = rf_pack_f16x2(c[0][0], c[0][1]);"));
    assert!(nv.contains("a[3] = rf_pack_f16x2(c[1][2], c[1][3]);"));
    // The addresses the hand-written kernel used: row (lane & 7) + 8*(lane >> 4), column
    // 8*((lane >> 3) & 1) for K; row lane & 15, column 8*(lane >> 4) for V (ldmatrix.trans).
    assert!(nv.contains(
        "rf_ldsm_x4(r, t + ((lane & 7) + ((lane >> 4) << 3)) * ld + ((((lane >> 3) & 1) << 3)));"
    ));
    assert!(nv.contains("rf_ldsm_x4_trans(r, t + ((lane & 15)) * ld + (((lane >> 4) << 3)));"));
    assert!(nv.contains("rf_shfl_xor(v, 1)") && nv.contains("rf_shfl_xor(v, 2)"));
    let mfma = fragment_helpers(&super::atoms::MFMA_32X32X8_BF16);
    assert!(mfma.contains("c = __builtin_amdgcn_mfma_f32_32x32x8bf16_1k(a, b, c, 0, 0, 0);"));
    assert!(
        mfma.contains("typedef float rf_mfma_32x32x8_bf16_c __attribute__((ext_vector_type(16)));")
    );
    assert!(!mfma.contains("c_to_a") && !mfma.contains("ldsm"));
    // TF32: one register per element, rounded by cvt.rna as it is loaded from f32 memory.
    let tf32 = fragment_helpers(&super::atoms::M16N8K8_TF32);
    assert!(tf32.contains(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
    ));
    assert!(tf32.contains("typedef unsigned rf_m16n8k8_tf32_a[4];"));
    assert!(tf32.contains("cvt.rna.tf32.f32"));
    assert!(tf32.contains("rf_m16n8k8_tf32_load_a(rf_m16n8k8_tf32_a& x, const float* t,"));
    assert!(tf32
        .contains("x[e] = (row0 + rf_m16n8k8_tf32_a_row(lane, e) < rows ? rf_m16n8k8_tf32_cvt(t["));
    assert!(!tf32.contains("c_to_a") && !tf32.contains("ldsm"));
    let xf32 = fragment_helpers(&super::atoms::MFMA_16X16X8_XF32);
    assert!(xf32.contains("c = __builtin_amdgcn_mfma_f32_16x16x8_xf32(a, b, c, 0, 0, 0);"));
    assert!(
        xf32.contains("typedef float rf_mfma_16x16x8_xf32_a __attribute__((ext_vector_type(2)));")
    );
    assert!(!xf32.contains("cvt.rna"));
    for atom in ALL {
        let h = fragment_helpers(atom);
        // No fragment index is a literal wave size: lanes come from the expressions.
        assert!(!h.contains("% 32") && !h.contains("% 64"), "{}", atom.name);
        assert!(h.contains(&format!("#define {}_LANES {}", atom.prefix(), atom.lanes)));
    }
}

/// Seeded values in [-2, 2) with full f32 mantissas, so that TF32 rounding changes them.
fn fractions(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            f64::from(((s >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0) as f32)
        })
        .collect()
}

/// TF32 rounding, independently of `Precision::round`'s bit trick: the nearest multiple of the
/// value's 10-bit-mantissa ulp, ties away from zero.
fn tf32_by_arithmetic(x: f32) -> f32 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let ulp = 2f64.powi(f64::from(x.abs()).log2().floor() as i32 - 10);
    let q = f64::from(x.abs()) / ulp;
    let r = if q.fract() >= 0.5 {
        q.floor() + 1.0
    } else {
        q.floor()
    };
    (x.signum() as f64 * r * ulp) as f32
}

#[test]
fn tf32_rounding_is_to_nearest_with_ties_away() {
    let r = |x: f32| Precision::Tf32.round(x);
    let one_ulp = 2f32.powi(-10);
    assert_eq!(r(1.0 + one_ulp / 2.0), 1.0 + one_ulp, "a tie rounds away");
    assert_eq!(r(-(1.0 + one_ulp / 2.0)), -(1.0 + one_ulp));
    assert_eq!(r(1.0 + one_ulp / 4.0), 1.0);
    assert_eq!(r(1.0 + 3.0 * one_ulp / 4.0), 1.0 + one_ulp);
    // The carry out of the mantissa steps the exponent.
    assert_eq!(r(2.0 - one_ulp / 2.0), 2.0);
    assert!(r(f32::INFINITY).is_infinite() && r(f32::NAN).is_nan());
    assert_eq!(
        Precision::Exact.round(1.0 + one_ulp / 4.0),
        1.0 + one_ulp / 4.0
    );
    for (i, x) in fractions(4096, 77).into_iter().enumerate() {
        let x = x as f32 * 2f32.powi(i as i32 % 60 - 30);
        let got = r(x);
        assert_eq!(got, tf32_by_arithmetic(x), "{x:e}");
        assert_eq!(got.to_bits() & 0x1fff, 0, "13 low mantissa bits cleared");
        assert!(((got - x) / x).abs() <= 2f32.powi(-11), "{x:e}");
    }
}

/// The TF32 atoms through the probe's loads, instruction and store: with inputs that TF32
/// rounding changes, the product is A·B of the rounded inputs (the rounding is modelled where
/// the instruction reads), not the exact f32 product, and it stays within the TF32 bound
/// |Δ| ≤ 2·2⁻¹¹·Σ|a||b| of the exact one (each factor off by at most 2⁻¹¹ relative).
#[test]
fn tf32_atoms_multiply_the_rounded_inputs() {
    let mut tf32 = 0;
    for (i, atom) in ALL.iter().enumerate() {
        if atom.precision != Precision::Tf32 {
            continue;
        }
        tf32 += 1;
        let (m, n, k) = (atom.m as usize, atom.n as usize, 2 * atom.k as usize);
        let a = fractions(m * k, 31 + i as u64);
        let b = fractions(k * n, 41 + i as u64);
        let got = probe(atom, &a, &b, (n, k));
        let t = |x: f64| f64::from(tf32_by_arithmetic(x as f32));
        let mut rounded_differs = false;
        for r in 0..m {
            for c in 0..n {
                let terms = || (0..k).map(|x| (a[r * k + x], b[x * n + c]));
                let want: f64 = terms().map(|(x, y)| t(x) * t(y)).sum();
                let exact: f64 = terms().map(|(x, y)| x * y).sum();
                let mag: f64 = terms().map(|(x, y)| (x * y).abs()).sum();
                let g = got[r * n + c];
                assert!((g - want).abs() <= 1e-12 * mag, "{} C[{r}][{c}]", atom.name);
                assert!(
                    (g - exact).abs() <= 2.0 * 2f64.powi(-11) * mag,
                    "{} C[{r}][{c}]",
                    atom.name
                );
                rounded_differs |= (g - exact).abs() > 1e-7 * mag;
            }
        }
        assert!(
            rounded_differs,
            "{}: the rounding is not modelled",
            atom.name
        );
    }
    assert_eq!(tf32, 3, "m16n8k8 tf32 and the two xf32 MFMAs");
}

/// A TF32 layout with its A element bits swapped (rows 8.. and columns 4.. exchanged between
/// registers) disagrees with the document and gives a wrong product.
#[test]
fn a_wrong_tf32_layout_is_caught() {
    use super::Bit::{Col, Row};
    let mut wrong = super::atoms::M16N8K8_TF32.clone();
    wrong.a = Layout {
        elem_bits: &[Col(2), Row(3)],
        ..wrong.a
    };
    assert!((0..32)
        .any(|l| (0..4).any(|e| wrong.a.coord(l, e) != documented(&wrong, Operand::A, l, e))));
    let (m, n, k) = (16, 8, 16);
    let a = small_ints(m * k, 5);
    let b = small_ints(k * n, 6);
    assert_ne!(
        probe(&wrong, &a, &b, (n, k)),
        exact_product(&a, &b, (m, n, k))
    );
    assert!(!mixed_order_product_is_right(&wrong));
}
