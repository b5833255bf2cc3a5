//! The prelude's fragment helpers, generated from an atom. For an atom `P` (`rf_<name>`):
//!
//! - `P_M`, `P_N`, `P_K`, `P_LANES`, `P_A_ELEMS`, `P_B_ELEMS`, `P_C_ELEMS`, `P_C_ROWS`;
//! - the fragment types `P_a`, `P_b`, `P_c` (element `e` of a `P_c` is `c[e]`);
//! - `P_a_row(lane, e)`, `P_a_col`, `P_b_row`, `P_b_col`, `P_c_row`, `P_c_col`: the matrix
//!   coordinates of element `e` of lane `lane`, and `P_c_row_slot(e)`: which of the lane's
//!   `P_C_ROWS` rows element `e` is in;
//! - `P_load_a` (A row-major, rows past a bound read as zero), `P_load_b_nk` (B stored
//!   transposed: `t[n*ld + k]`), `P_load_b_kn` (`t[k*ld + n]`), `P_store_c`, `P_zero_c`;
//! - `P_mma(c, a, b)`: c += a·b;
//! - `P_c_row_max`, `P_c_row_sum`: a value per row slot combined across the lanes that hold
//!   the other columns of that row;
//! - where the layouts allow, `P_c_to_a` (accumulators of `P_K / P_N` adjacent C tiles become
//!   one A operand without leaving registers) and `P_load_b_pair_nk_smem` /
//!   `P_load_b_pair_kn_smem` (two B fragments by one `ldmatrix.x4`, plain or `.trans`);
//! - where `ldmatrix` can load them, the same loads from an address the kernel forms (for
//!   swizzled tiles): `P_ldsm_a_row/col(lane)` with `P_load_a_ldsm`, and
//!   `P_ldsm_b_nk_row/col`, `P_ldsm_b_kn_row/col` with `P_load_b_pair_ldsm(_trans)`.
//!
//! Index expressions come from `Layout` as `Linear` values, the same values the simulation
//! evaluates.

use std::fmt::Write;

use super::{Bit, Layout, MmaAtom, MmaKind, Precision};
use super::{Field, Linear, Var};
use crate::ir::DType;

/// The helpers for one atom, as C++ for the target's prelude.
pub fn fragment_helpers(atom: &MmaAtom) -> String {
    let p = atom.prefix();
    let mut s = String::new();
    let w = &mut s;
    let input = match atom.precision {
        Precision::Exact => atom.input.to_string(),
        Precision::Tf32 => format!("{} at tf32 precision", atom.input),
    };
    let _ = writeln!(
        w,
        "// {p}: {} ({}x{}x{}, {input} x {input} -> {}, {} lanes; A/B/C {}/{}/{} elements per lane).\n// Layouts: {}.",
        atom.intrinsic,
        atom.m,
        atom.n,
        atom.k,
        atom.acc,
        atom.lanes,
        atom.a.elems(),
        atom.b.elems(),
        atom.c.elems(),
        atom.source
    );
    for (name, v) in [
        ("M", atom.m),
        ("N", atom.n),
        ("K", atom.k),
        ("LANES", atom.lanes),
        ("A_ELEMS", atom.a.elems()),
        ("B_ELEMS", atom.b.elems()),
        ("C_ELEMS", atom.c.elems()),
        ("C_ROWS", atom.c.row_slots()),
    ] {
        let _ = writeln!(w, "#define {p}_{name} {v}");
    }
    types(w, atom, &p);
    for (op, layout) in [("a", &atom.a), ("b", &atom.b), ("c", &atom.c)] {
        let _ = writeln!(
            w,
            "RF_INLINE int {p}_{op}_row(int lane, int e) {{ return {}; }}",
            layout.row().c()
        );
        let _ = writeln!(
            w,
            "RF_INLINE int {p}_{op}_col(int lane, int e) {{ return {}; }}",
            layout.col().c()
        );
    }
    let _ = writeln!(
        w,
        "RF_INLINE int {p}_c_row_slot(int e) {{ return {}; }}",
        atom.c.row_slot().c()
    );
    loads(w, atom, &p);
    let _ = writeln!(
        w,
        "RF_INLINE void {p}_store_c(float* t, long long ld, const {p}_c& c, int lane) {{\n    #pragma unroll\n    for (int e = 0; e < {p}_C_ELEMS; ++e) t[(long long){p}_c_row(lane, e) * ld + {p}_c_col(lane, e)] = c[e];\n}}"
    );
    let _ = writeln!(
        w,
        "RF_INLINE void {p}_zero_c({p}_c& c) {{\n    #pragma unroll\n    for (int e = 0; e < {p}_C_ELEMS; ++e) c[e] = 0.0f;\n}}"
    );
    mma(w, atom, &p);
    for (what, combine) in [("max", "fmaxf(v, o)"), ("sum", "v + o")] {
        let _ = write!(w, "RF_INLINE float {p}_c_row_{what}(float v) {{");
        for mask in atom.c.row_lane_masks() {
            let _ = write!(
                w,
                " {{ const float o = rf_shfl_xor(v, {mask}); v = {combine}; }}"
            );
        }
        let _ = writeln!(w, " return v; }}");
    }
    if let Some(map) = c_to_a(atom) {
        c_to_a_helper(w, atom, &p, &map);
    }
    if let Some(l) = ldmatrix_pairs(atom) {
        for (form, row, col, ldsm, storage) in [
            (
                "nk",
                &l.nk_row,
                &l.nk_col,
                "rf_ldsm_x4",
                "B transposed (row n at t + n*ld, k contiguous)",
            ),
            (
                "kn",
                &l.kn_row,
                &l.kn_col,
                "rf_ldsm_x4_trans",
                "B as is (row k at t + k*ld, n contiguous)",
            ),
        ] {
            let _ = writeln!(
                w,
                "// B fragments of columns 0..{n} and {n}..{n2} of a K x {n2} tile in shared memory holding {storage}, by one\n// ldmatrix.x4: lane L gives the address of row L % 8 of 8x8 matrix L / 8.\nRF_INLINE void {p}_load_b_pair_{form}_smem({p}_b (&b)[2], const unsigned short* t, int ld, int lane) {{\n    unsigned r[4];\n    {ldsm}(r, t + ({}) * ld + ({}));\n    b[0][0] = r[0]; b[0][1] = r[1]; b[1][0] = r[2]; b[1][1] = r[3];\n}}",
                row.c(),
                col.c(),
                n = atom.n,
                n2 = 2 * atom.n,
            );
        }
    }
    ldmatrix_helpers(w, atom, &p);
    s
}

/// The vector element type of an AMD fragment for the input type.
fn amd_element(input: DType) -> &'static str {
    match input {
        DType::BF16 => "short",
        DType::F32 => "float",
        _ => "_Float16",
    }
}

/// The element type of the memory the fragment loads read: 16-bit patterns, or f32.
pub fn stored_element(atom: &MmaAtom) -> &'static str {
    if atom.packs_pairs() {
        "unsigned short"
    } else {
        "float"
    }
}

fn types(w: &mut String, atom: &MmaAtom, p: &str) {
    match atom.kind {
        MmaKind::MmaSync => {
            // Two 16-bit elements per 32-bit register, element 2i in the low half of register i;
            // a TF32 element takes a register of its own.
            let _ = writeln!(
                w,
                "typedef unsigned {p}_a[{}];\ntypedef unsigned {p}_b[{}];\ntypedef float {p}_c[{}];",
                atom.regs(&atom.a),
                atom.regs(&atom.b),
                atom.c.elems()
            );
            if atom.precision == Precision::Tf32 {
                // The mma reads only the TF32 bits of a register; cvt.rna rounds to them (to
                // nearest, ties away) rather than letting the hardware truncate.
                let _ = writeln!(
                    w,
                    "RF_INLINE unsigned {p}_cvt(float x) {{ unsigned r; asm(\"cvt.rna.tf32.f32 %0, %1;\" : \"=r\"(r) : \"f\"(x)); return r; }}"
                );
            }
        }
        MmaKind::Mfma | MmaKind::WmmaGfx11 | MmaKind::WmmaGfx12 => {
            let el = amd_element(atom.input);
            let _ = writeln!(
                w,
                "typedef {el} {p}_a __attribute__((ext_vector_type({})));\ntypedef {el} {p}_b __attribute__((ext_vector_type({})));\ntypedef float {p}_c __attribute__((ext_vector_type({})));",
                atom.a.elems(),
                atom.b.elems(),
                atom.c.elems()
            );
        }
    }
}

/// Where element `e` of a fragment sits in memory for one storage order: `row * ld + col` of
/// the stored matrix, the stored row being the layout's row (`false`) or column (`true`),
/// offset by `row0` rows where the helper takes one.
fn address(p: &str, op: &str, transposed: bool, e: &str, row0: bool) -> String {
    let (r, c) = if transposed {
        ("col", "row")
    } else {
        ("row", "col")
    };
    let row = if row0 {
        format!("(row0 + {p}_{op}_{r}(lane, {e}))")
    } else {
        format!("{p}_{op}_{r}(lane, {e})")
    };
    format!("(long long){row} * ld + {p}_{op}_{c}(lane, {e})")
}

/// Whether elements 2i and 2i + 1 are adjacent in memory for a storage order: element bit 0
/// must step the stored column by one.
fn pairs_adjacent(layout: &Layout, transposed: bool) -> bool {
    let want = if transposed { Bit::Row(0) } else { Bit::Col(0) };
    layout.elem_bits.first() == Some(&want)
}

fn loads(w: &mut String, atom: &MmaAtom, p: &str) {
    // (helper, operand, layout, stored transposed, bounded rows, what it reads)
    let forms = [
        (
            "load_a",
            "a",
            &atom.a,
            false,
            true,
            "A[m][k] = t[(row0 + m)*ld + k]; rows at or past `rows` read as 0",
        ),
        (
            "load_b_nk",
            "b",
            &atom.b,
            true,
            false,
            "B[k][n] = t[n*ld + k]",
        ),
        (
            "load_b_kn",
            "b",
            &atom.b,
            false,
            false,
            "B[k][n] = t[k*ld + n]",
        ),
    ];
    let et = stored_element(atom);
    for (name, op, layout, transposed, bounded, doc) in forms {
        let elems = format!("{p}_{}_ELEMS", op.to_uppercase());
        let params = if bounded { ", int row0, int rows" } else { "" };
        // The guarded value: the bound is checked before the address is formed.
        let value = |read: String, zero: &str| -> String {
            if bounded {
                format!("(row0 + {p}_{op}_row(lane, e) < rows ? {read} : {zero})")
            } else {
                read
            }
        };
        let _ = writeln!(
            w,
            "// {doc}.\nRF_INLINE void {p}_{name}({p}_{op}& x, const {et}* t, long long ld{params}, int lane) {{\n    #pragma unroll"
        );
        let at = |e: &str| address(p, op, transposed, e, bounded);
        match atom.kind {
            MmaKind::MmaSync if atom.precision == Precision::Tf32 => {
                // One f32 per register, rounded to TF32 as it is loaded.
                let v = value(format!("{p}_cvt(t[{}])", at("e")), "0u");
                let _ = writeln!(w, "    for (int e = 0; e < {elems}; ++e) x[e] = {v};\n}}");
            }
            MmaKind::MmaSync if pairs_adjacent(layout, transposed) => {
                // Both halves of a register are one aligned 32-bit word (t 4-byte aligned, ld
                // and the column even).
                let read = format!("*(const unsigned*)(t + {})", at("e"));
                let _ = writeln!(
                    w,
                    "    for (int e = 0; e < {elems}; e += 2) x[e >> 1] = {};\n}}",
                    value(read, "0u")
                );
            }
            MmaKind::MmaSync => {
                let read = format!(
                    "((unsigned)t[{}] | ((unsigned)t[{}] << 16))",
                    at("e"),
                    at("e + 1")
                );
                let _ = writeln!(
                    w,
                    "    for (int e = 0; e < {elems}; e += 2) x[e >> 1] = {};\n}}",
                    value(read, "0u")
                );
            }
            MmaKind::Mfma | MmaKind::WmmaGfx11 | MmaKind::WmmaGfx12 => {
                let zero = if atom.packs_pairs() {
                    "(unsigned short)0"
                } else {
                    "0.0f"
                };
                let v = value(format!("t[{}]", at("e")), zero);
                let conv = match atom.input {
                    DType::BF16 => format!("(short){v}"),
                    // xf32: the instruction reduces the f32 values itself.
                    DType::F32 => v,
                    _ => format!("__builtin_bit_cast(_Float16, (unsigned short){v})"),
                };
                let _ = writeln!(
                    w,
                    "    for (int e = 0; e < {elems}; ++e) x[e] = {conv};\n}}"
                );
            }
        }
    }
}

fn mma(w: &mut String, atom: &MmaAtom, p: &str) {
    let _ = write!(
        w,
        "RF_INLINE void {p}_mma({p}_c& c, const {p}_a& a, const {p}_b& b) {{\n    "
    );
    match atom.kind {
        MmaKind::MmaSync => {
            let (na, nb, nc) = (atom.regs(&atom.a), atom.regs(&atom.b), atom.c.elems());
            let list = |from: u32, n: u32| -> String {
                (from..from + n)
                    .map(|i| format!("%{i}"))
                    .collect::<Vec<_>>()
                    .join(",")
            };
            let outs: Vec<String> = (0..nc).map(|i| format!("\"+f\"(c[{i}])")).collect();
            let ins: Vec<String> = (0..na)
                .map(|i| format!("\"r\"(a[{i}])"))
                .chain((0..nb).map(|i| format!("\"r\"(b[{i}])")))
                .collect();
            let _ = writeln!(
                w,
                "asm volatile(\"{} {{{}}}, {{{}}}, {{{}}}, {{{}}};\"\n                 : {}\n                 : {});\n}}",
                atom.intrinsic,
                list(0, nc),
                list(nc, na),
                list(nc + na, nb),
                list(0, nc),
                outs.join(", "),
                ins.join(", ")
            );
        }
        MmaKind::Mfma => {
            // cbsz, abid, blgp = 0: no broadcast between blocks, B as loaded.
            let _ = writeln!(w, "c = {}(a, b, c, 0, 0, 0);\n}}", atom.intrinsic);
        }
        MmaKind::WmmaGfx11 | MmaKind::WmmaGfx12 => {
            let _ = writeln!(w, "c = {}(a, b, c);\n}}", atom.intrinsic);
        }
    }
}

/// For each A element slot, the C tile (of the `k / n` tiles side by side) and slot holding the
/// same (row, column) in the same lane; `None` where some slot has no such partner.
pub(crate) fn c_to_a(atom: &MmaAtom) -> Option<Vec<(u32, u32)>> {
    // The helper converts and packs 16-bit pairs (no TF32 atom's layouts line up anyway).
    if !atom.packs_pairs()
        || !atom.k.is_multiple_of(atom.n)
        || atom.a.rows != atom.c.rows
        || atom.a.lanes() != atom.c.lanes()
    {
        return None;
    }
    (0..atom.a.elems())
        .map(|ea| {
            let (m, k) = atom.a.coord(0, ea);
            let (tile, col) = (k / atom.n, k % atom.n);
            let ec = (0..atom.c.elems()).find(|&ec| atom.c.coord(0, ec) == (m, col))?;
            (0..atom.a.lanes())
                .all(|lane| {
                    let (m, k) = atom.a.coord(lane, ea);
                    k / atom.n == tile && atom.c.coord(lane, ec) == (m, k % atom.n)
                })
                .then_some((tile, ec))
        })
        .collect()
}

fn c_to_a_helper(w: &mut String, atom: &MmaAtom, p: &str, map: &[(u32, u32)]) {
    let _ = writeln!(
        w,
        "// The accumulators of C tiles c[0..{}] (columns 0..{}) as one A operand, converted to {}:\n// the layouts put each value in the same lane, so nothing moves between lanes.\nRF_INLINE void {p}_c_to_a({p}_a& a, const {p}_c* c) {{",
        atom.k / atom.n,
        atom.k,
        atom.input
    );
    match atom.kind {
        MmaKind::MmaSync => {
            let pack = match atom.input {
                DType::BF16 => "rf_pack_bf16x2",
                _ => "rf_pack_f16x2",
            };
            for (r, pair) in map.chunks(2).enumerate() {
                let _ = writeln!(
                    w,
                    "    a[{r}] = {pack}(c[{}][{}], c[{}][{}]);",
                    pair[0].0, pair[0].1, pair[1].0, pair[1].1
                );
            }
        }
        MmaKind::Mfma | MmaKind::WmmaGfx11 | MmaKind::WmmaGfx12 => {
            for (ea, (tile, ec)) in map.iter().enumerate() {
                let v = format!("c[{tile}][{ec}]");
                let conv = match atom.input {
                    DType::BF16 => format!("(short)rf_f2b({v})"),
                    _ => format!("(_Float16){v}"),
                };
                let _ = writeln!(w, "    a[{ea}] = {conv};");
            }
        }
    }
    let _ = writeln!(w, "}}");
}

/// Row and column (in the stored matrix) of the address each lane gives `ldmatrix.x4` to load two
/// B fragments: for B stored transposed (`nk`: rows are n) and as is (`kn`: rows are k, loaded
/// with `.trans`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LdmatrixPairs {
    pub nk_row: Linear,
    pub nk_col: Linear,
    pub kn_row: Linear,
    pub kn_col: Linear,
}

/// `ldmatrix` (PTX ISA, "Warp-level matrix load instruction: ldmatrix"): with `.x4`, lane L
/// gives the address of row L % 8 of matrix L / 8, and register j of thread T receives elements
/// (T / 4, 2·(T % 4)) and (T / 4, 2·(T % 4) + 1) of matrix j (with `.trans`, the transposed
/// matrix's). Two B fragments load this way when each register of the fragment is such an 8×8
/// piece of B: its two elements sit at k = k0 + 2·(T % 4) + {0, 1}, n = n0 + T / 4.
pub fn ldmatrix_pairs(atom: &MmaAtom) -> Option<LdmatrixPairs> {
    let regs = atom.b.elems() / 2;
    // ldmatrix moves 16-bit elements in pairs; the TF32 atoms load element by element.
    if atom.kind != MmaKind::MmaSync || !atom.packs_pairs() || regs != 2 || atom.lanes != 32 {
        return None;
    }
    // Origins (k0, n0) of matrix j = 2·fragment + register.
    let mut origin = [(0u32, 0u32); 4];
    for (j, o) in origin.iter_mut().enumerate() {
        let (f, r) = (j as u32 / regs, j as u32 % regs);
        let (k0, n0) = atom.b.coord(0, 2 * r);
        *o = (k0, n0 + f * atom.n);
        for lane in 0..32 {
            for h in 0..2 {
                let (k, n) = atom.b.coord(lane, 2 * r + h);
                if (k, n + f * atom.n) != (k0 + 2 * (lane % 4) + h, n0 + f * atom.n + lane / 4) {
                    return None;
                }
            }
        }
    }
    let k0 = x4_origin_c(&origin, |o| o.0)?;
    let n0 = x4_origin_c(&origin, |o| o.1)?;
    Some(LdmatrixPairs {
        nk_row: with_row_in_matrix(&n0),
        nk_col: k0.clone(),
        kn_row: with_row_in_matrix(&k0),
        kn_col: n0,
    })
}

/// One coordinate of the origins of the four 8×8 matrices of an `ldmatrix.x4` (matrix j is
/// chosen by lane bits 3 and 4) as an expression of the lane; it must be affine in those two
/// bits for one expression to serve every lane.
fn x4_origin_c(origin: &[(u32, u32); 4], pick: fn((u32, u32)) -> u32) -> Option<Linear> {
    let v = |j: usize| pick(origin[j]);
    let (d1, d2) = (v(1).checked_sub(v(0))?, v(2).checked_sub(v(0))?);
    (v(3) == v(0) + d1 + d2).then(|| {
        Linear::new(
            vec![
                Field::bit(Var::Lane, 3, 5, d1),
                Field::bit(Var::Lane, 4, 5, d2),
            ],
            v(0),
        )
        .merged()
    })
}

/// A matrix origin's row plus the row lane L addresses within its matrix (L % 8).
fn with_row_in_matrix(l: &Linear) -> Linear {
    let mut fields = l.fields.clone();
    fields.push(Field {
        var: Var::Lane,
        shift: 0,
        width: 3,
        var_bits: 5,
        mul: 1,
    });
    Linear::new(fields, l.constant).merged()
}

/// Row and column (of A stored row-major: row m, k contiguous) of the address each lane gives
/// `ldmatrix.x4` to load one whole A fragment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LdmatrixA {
    pub row: Linear,
    pub col: Linear,
}

/// The A fragment by one `ldmatrix.x4` (non-transposed), where every register of it is an 8×8
/// piece of A: its two elements sit at m = m0 + T / 4, k = k0 + 2·(T % 4) + {0, 1} for thread T.
/// Register j then receives matrix j, whose row L % 8 lane L addresses.
pub fn ldmatrix_a(atom: &MmaAtom) -> Option<LdmatrixA> {
    if atom.kind != MmaKind::MmaSync
        || !atom.packs_pairs()
        || atom.a.elems() != 8
        || atom.lanes != 32
    {
        return None;
    }
    let mut origin = [(0u32, 0u32); 4];
    for (j, o) in origin.iter_mut().enumerate() {
        let e = 2 * j as u32;
        let (m0, k0) = atom.a.coord(0, e);
        *o = (m0, k0);
        for lane in 0..32 {
            for h in 0..2 {
                if atom.a.coord(lane, e + h) != (m0 + lane / 4, k0 + 2 * (lane % 4) + h) {
                    return None;
                }
            }
        }
    }
    Some(LdmatrixA {
        row: with_row_in_matrix(&x4_origin_c(&origin, |o| o.0)?),
        col: x4_origin_c(&origin, |o| o.1)?,
    })
}

/// The helpers that load fragments by `ldmatrix` from an address the kernel forms itself (a
/// swizzled shared-memory tile is not `row * ld + col`): per operand form the lane's row and
/// column, and the load from the lane's address.
fn ldmatrix_helpers(w: &mut String, atom: &MmaAtom, p: &str) {
    if let Some(a) = ldmatrix_a(atom) {
        let _ = writeln!(
            w,
            "// The A fragment by one ldmatrix.x4 from A stored row-major (k contiguous): lane L passes the address of
// element ({p}_ldsm_a_row(L), {p}_ldsm_a_col(L)) of the tile.
RF_INLINE int {p}_ldsm_a_row(int lane) {{ return {}; }}
RF_INLINE int {p}_ldsm_a_col(int lane) {{ return {}; }}
RF_INLINE void {p}_load_a_ldsm({p}_a& a, const void* at) {{ rf_ldsm_x4(a, at); }}",
            a.row.c(),
            a.col.c()
        );
    }
    if let Some(l) = ldmatrix_pairs(atom) {
        let _ = writeln!(
            w,
            "// B fragments of columns 0..{n} and {n}..{n2} by one ldmatrix.x4: lane L passes the address of element
// ({p}_ldsm_b_nk_row(L), {p}_ldsm_b_nk_col(L)) of B stored transposed (row n, k contiguous; `_ldsm`), or of
// element ({p}_ldsm_b_kn_row(L), {p}_ldsm_b_kn_col(L)) of B stored as is (row k, n contiguous; `_ldsm_trans`).
RF_INLINE int {p}_ldsm_b_nk_row(int lane) {{ return {}; }}
RF_INLINE int {p}_ldsm_b_nk_col(int lane) {{ return {}; }}
RF_INLINE int {p}_ldsm_b_kn_row(int lane) {{ return {}; }}
RF_INLINE int {p}_ldsm_b_kn_col(int lane) {{ return {}; }}",
            l.nk_row.c(),
            l.nk_col.c(),
            l.kn_row.c(),
            l.kn_col.c(),
            n = atom.n,
            n2 = 2 * atom.n,
        );
        for (suffix, ldsm) in [("", "rf_ldsm_x4"), ("_trans", "rf_ldsm_x4_trans")] {
            let _ = writeln!(
                w,
                "RF_INLINE void {p}_load_b_pair_ldsm{suffix}({p}_b& b0, {p}_b& b1, const void* at) {{
    unsigned r[4];
    {ldsm}(r, at);
    b0[0] = r[0]; b0[1] = r[1]; b1[0] = r[2]; b1[1] = r[3];
}}"
            );
        }
    }
}
