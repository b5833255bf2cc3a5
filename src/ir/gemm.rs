//! The attributes of a Gemm node: a batched matrix product whose operands are read, and whose
//! result is written, in place through strided views, followed by an elementwise epilogue.
//!
//! The problem has batch axes, M, N and K. Each is a list of sub-axes (outer first): a head
//! merge reads K as (head, d) and a flattened batch reads M as (batch, seq), so one Gemm covers a
//! matmul together with the transposes, head splits and merges around it. Every tensor the node
//! touches (A, B, the result, each epilogue operand) has a [`View`]: an element stride per
//! sub-axis into its own contiguous storage (0 where it is broadcast).
//!
//! Operands: A (slot 0), B (slot 1), then the epilogue's extra operands, then the prologue's
//! parameters. The epilogue is an expression where `$0` is the product, already rounded to A's
//! dtype (the value an unfused MatMul holds), and `$i` (i ≥ 1) is operand `i + 1`, read through
//! `extras[i - 1]`.
//!
//! The prologue (optional) is a normalisation of A's rows over K applied before the product: a
//! RMSNorm or LayerNorm folded into the GEMM that reads it (`passes::norm_gemv`). Row (batch, m)
//! of A, taken over K's flat index, becomes `a/√(mean(a²)+eps)·w` (RMSNorm) or
//! `(a−mean)/√(var+eps)·w + b` (LayerNorm), rounded to A's dtype exactly as the unfused norm
//! node's output is, so the product reads the values the norm would have stored. Its parameters
//! come after the extras (so the epilogue's `$i` numbering is the same with or without one): the
//! weight `[K]` at slot `2 + extras.len()`, then for LayerNorm the bias `[K]`; any float dtype,
//! indexed by K's flat index (row-major over K's sub-axes).
//!
//! Paired columns (`paired`): the product's columns come in adjacent pairs that the epilogue
//! combines into one result column, `out[.., j] = epilogue($0 = c[.., 2j], $1 = c[.., 2j + 1])`
//! (a GLU: `silu($0)·$1` for SwiGLU, `gelu($0)·$1` for GeGLU: the activation is the
//! expression's, not the form's). Gate and up projections merged into one GEMM over their
//! weights' rows interleaved (`passes::merge_gemms`) take this form. N counts the product's
//! columns (the weight's rows); the result, its view and the extras run over N/2 columns (the
//! last N sub-axis halved, [`Gemm::out_dims`]); both products are rounded to A's dtype as each
//! unfused GEMM's stored result is; the extras are `$2..` (operand `i`, `extras[i - 2]`).

use serde::{Deserialize, Serialize};

use super::{Expr, Shape};

/// Sub-axis sizes of the problem, outer first. An empty list is a single index (size 1).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GemmDims {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub batch: Vec<usize>,
    pub m: Vec<usize>,
    pub n: Vec<usize>,
    pub k: Vec<usize>,
}

/// Element strides of one tensor, per sub-axis of the problem. For A the rows are M's sub-axes
/// and the columns K's; for B rows are K and columns N; for the result and the epilogue
/// operands rows are M and columns N.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct View {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub batch: Vec<usize>,
    pub rows: Vec<usize>,
    pub cols: Vec<usize>,
}

/// Which problem axes a view's rows and columns run over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operand {
    /// Rows M, columns K.
    A,
    /// Rows K, columns N.
    B,
    /// Rows M, columns N: the result and every epilogue operand.
    Out,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Gemm {
    pub dims: GemmDims,
    pub a: View,
    pub b: View,
    /// Where element (batch, m, n) of the result is stored in the result tensor.
    pub out: View,
    /// One view per epilogue operand (operands 2..).
    pub extras: Vec<View>,
    /// `$0` the product, `$i` operand `i + 1`; `None` stores the product itself.
    pub epilogue: Option<Expr>,
    /// The result tensor's shape (stored contiguously; `out` indexes into it).
    pub shape: Shape,
    /// A's rows normalised over K before the product; `None` reads A as it is.
    pub prologue: Option<Prologue>,
    /// Product columns 2j and 2j + 1 combined by the epilogue into result column j (see the
    /// module comment); the epilogue is then required and N's last sub-axis even.
    pub paired: bool,
}

/// The most rows (M) one GEMV block computes: it keeps rows × columns sums per thread in
/// registers (64 at most: 16 rows leave 4 columns). Up to this many rows a GEMM always runs as
/// a GEMV-style kernel (codegen's small-M and quantized GEMV kernels), in one group of rows.
pub const GEMV_GROUP_ROWS: usize = 16;

/// The most rows (M) a GEMM runs as a GEMV-style kernel at all: past [`GEMV_GROUP_ROWS`] the
/// kernel's grid has a dimension of row groups (each block computes up to that many rows of its
/// columns, the groups sharing columns launched together, so B comes from DRAM once and from
/// L2 for the others). Passes that only pay off there (a norm folded into its GEMVs recomputes
/// the row statistics in every block; column pairs are combined by the GEMV kernels alone)
/// read [`runs_as_gemv`], since passes may not import codegen.
pub const GEMV_MAX_M: usize = 64;

/// Rows and columns of the tiled (matrix-core) kernels' usual tile, for [`runs_as_gemv`]'s
/// estimate of their grid.
pub const TILED_TILE: usize = 64;

/// Tiles below which the tiled kernels leave a large GPU idle (H100: 132 SMs; each tile's
/// block walks K alone): SmolLM2's projections at 32 rows give 3, 9 and 24 (issue 26). There,
/// M up to [`GEMV_MAX_M`] runs as a GEMV in row groups instead; at more tiles the tiled kernels
/// keep M above [`GEMV_GROUP_ROWS`] (a GEMV's M × N × K multiply-adds on the CUDA cores pass its
/// DRAM time from about 20 rows on an H100). Not yet placed by measurement.
pub const TILED_FILL_TILES: usize = 128;

/// Whether a GEMM of `batch` × `m` rows × `n` columns (product columns: paired ones counted
/// each) runs as a GEMV-style kernel: up to [`GEMV_GROUP_ROWS`] rows always, up to
/// [`GEMV_MAX_M`] where the tiled kernels' grid would be small (see [`TILED_FILL_TILES`]).
/// Codegen's choice and the passes that fold into GEMVs both read it, so a fold always finds
/// a kernel that takes it.
pub fn runs_as_gemv(batch: usize, m: usize, n: usize) -> bool {
    let tiles = batch
        .saturating_mul(m.div_ceil(TILED_TILE))
        .saturating_mul(n.div_ceil(TILED_TILE));
    let most = if tiles < TILED_FILL_TILES {
        GEMV_MAX_M
    } else {
        GEMV_GROUP_ROWS
    };
    (1..=most).contains(&m)
}

/// Which normalisation a [`Prologue`] applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormKind {
    /// `a/√(mean(a²)+eps)·w`: one parameter, the weight.
    Rms,
    /// `(a−mean)/√(var+eps)·w + b`: two parameters, the weight then the bias.
    Layer,
}

impl NormKind {
    /// How many `[K]` parameters (operands) the normalisation reads.
    pub fn params(self) -> usize {
        match self {
            NormKind::Rms => 1,
            NormKind::Layer => 2,
        }
    }
}

/// A normalisation of A's rows over K applied before the product (see the module comment).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prologue {
    pub norm: NormKind,
    pub eps: f64,
}

impl Gemm {
    /// The operand slots of the prologue's parameters (weight, then bias): after A, B and the
    /// extras; empty without a prologue.
    pub fn prologue_slots(&self) -> std::ops::Range<usize> {
        let first = 2 + self.extras.len();
        first..first + self.prologue.map_or(0, |p| p.norm.params())
    }

    /// The problem as the result and the epilogue operands see it: N's last sub-axis halved
    /// when the columns are paired, else the dims themselves. Views of [`Operand::Out`] are
    /// checked and walked against these.
    pub fn out_dims(&self) -> std::borrow::Cow<'_, GemmDims> {
        if !self.paired {
            return std::borrow::Cow::Borrowed(&self.dims);
        }
        let mut d = self.dims.clone();
        if let Some(last) = d.n.last_mut() {
            *last /= 2;
        }
        std::borrow::Cow::Owned(d)
    }

    /// The epilogue variable `$i` of an extra operand: `$1..` (paired: `$2..`) for
    /// `extras[0..]`.
    pub fn first_extra_var(&self) -> usize {
        if self.paired {
            2
        } else {
            1
        }
    }
}

/// One sub-axis as a tensor walks it: its size and the tensor's stride along it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Axis {
    pub size: usize,
    pub stride: usize,
}

impl GemmDims {
    /// The number of (batch, M, N, K) indices, each the product of its sub-axes, or `None`
    /// when a product overflows.
    pub fn sizes(&self) -> Option<[usize; 4]> {
        let p = |v: &[usize]| v.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        Some([p(&self.batch)?, p(&self.m)?, p(&self.n)?, p(&self.k)?])
    }

    /// The sub-axis sizes a view of `operand` pairs its strides with: batch, rows, columns.
    pub fn of(&self, operand: Operand) -> [&[usize]; 3] {
        match operand {
            Operand::A => [&self.batch, &self.m, &self.k],
            Operand::B => [&self.batch, &self.k, &self.n],
            Operand::Out => [&self.batch, &self.m, &self.n],
        }
    }
}

impl View {
    /// A view's sub-axes in order (batch, rows, columns; outer first), paired with the
    /// problem's sizes. The caller has checked the lengths (shape inference does).
    pub fn axes(&self, dims: &GemmDims, operand: Operand) -> Vec<Axis> {
        let [batch, rows, cols] = dims.of(operand);
        [(batch, &self.batch), (rows, &self.rows), (cols, &self.cols)]
            .into_iter()
            .flat_map(|(sizes, strides)| {
                sizes
                    .iter()
                    .zip(strides)
                    .map(|(&size, &stride)| Axis { size, stride })
            })
            .collect()
    }

    /// The row-major strides of a contiguous tensor whose axes are the given sub-axes.
    pub fn contiguous(dims: &GemmDims, operand: Operand) -> View {
        let [batch, rows, cols] = dims.of(operand);
        let all: Vec<usize> = batch.iter().chain(rows).chain(cols).copied().collect();
        let strides = Shape(all).strides();
        let (b, rest) = strides.split_at(batch.len());
        let (r, c) = rest.split_at(rows.len());
        View {
            batch: b.to_vec(),
            rows: r.to_vec(),
            cols: c.to_vec(),
        }
    }

    /// Checks the view against the problem and the tensor it reads (`numel` elements): one
    /// stride per sub-axis, and every offset it forms inside the tensor.
    pub fn check(
        &self,
        dims: &GemmDims,
        operand: Operand,
        numel: usize,
        what: &str,
    ) -> Result<(), String> {
        let [batch, rows, cols] = dims.of(operand);
        for (part, sizes, strides) in [
            ("batch", batch, &self.batch),
            ("rows", rows, &self.rows),
            ("cols", cols, &self.cols),
        ] {
            if sizes.len() != strides.len() {
                return Err(format!(
                    "{what}: {} {part} strides for {} sub-axes",
                    strides.len(),
                    sizes.len()
                ));
            }
        }
        let axes = self.axes(dims, operand);
        if axes.iter().any(|a| a.size == 0) {
            return Ok(()); // nothing is read
        }
        let last = axes.iter().try_fold(0usize, |acc, a| {
            (a.size - 1)
                .checked_mul(a.stride)
                .and_then(|x| acc.checked_add(x))
        });
        match last {
            Some(l) if l < numel => Ok(()),
            Some(l) => Err(format!(
                "{what}: the view reaches element {l} of a tensor of {numel}"
            )),
            None => Err(format!("{what}: the view's offsets overflow")),
        }
    }

    /// Whether the view writes every element of a tensor of `numel` elements exactly once:
    /// its sub-axes of size > 1, ordered by stride, are the contiguous strides of their sizes.
    pub fn is_bijection(&self, dims: &GemmDims, operand: Operand, numel: usize) -> bool {
        let mut axes: Vec<Axis> = self
            .axes(dims, operand)
            .into_iter()
            .filter(|a| a.size != 1)
            .collect();
        if axes.iter().any(|a| a.size == 0) {
            return numel == 0;
        }
        axes.sort_by_key(|a| a.stride);
        let mut expect = 1usize;
        for a in axes {
            if a.stride != expect {
                return false;
            }
            match expect.checked_mul(a.size) {
                Some(e) => expect = e,
                None => return false,
            }
        }
        expect == numel
    }
}
