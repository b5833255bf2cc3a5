//! The GEMM family: kernels for `Op::Gemm`. A [`Problem`] is what every kernel of the family
//! reads from the node: sizes, dtypes, each view's address arithmetic as C, and the epilogue as
//! C statements. `lower` picks the kernel; the views are read in place by all of them.

pub(crate) mod argmax_fold;
mod mma;
pub(crate) mod quant;
mod quant_dot;
mod scalar;
pub(crate) mod small_m;
#[cfg(test)]
mod tests;
mod vectors;
mod wgmma;

/// The shared-memory tile geometry (swizzled for ldmatrix, padded for element loads), which the
/// attention kernel's K/V tiles use too.
use std::collections::HashMap;

use serde::Serialize;

use super::super::ctype::{ctype, f32_literal};
use super::super::expr_c::{describe, render, round_to};
use super::super::limits::int_index;
use super::super::names::display_name;
use super::super::plan::{BufferId, Kernel, KernelPlan};
use super::super::CodegenError;
use crate::arch::Target;
use crate::ir::gemm::{Axis, Operand};
use crate::ir::{DType, Gemm, Graph, NodeId, NormKind, Shape, TensorType, View};

/// One epilogue operand as kernels read it.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Extra {
    /// Operand slot (the kernel parameter is `in{index}`, its value `x{index}`).
    pub index: usize,
    pub ctype: &'static str,
    pub vtype: &'static str,
    /// `in{index}[...]` converted to its value type, at problem coordinates `(bz, row, col)`.
    pub load: String,
}

/// A prologue (a folded RMSNorm/LayerNorm, `ir::gemm::Prologue`) as the GEMV kernels apply it:
/// `gemm_parts.hip`'s `norm_*` macros compute each row's statistics per block, then map every
/// A value they load through `value`.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct NormPrologue {
    /// LayerNorm (mean subtracted, a bias added) rather than RMSNorm.
    pub layer: bool,
    pub eps_f: String,
    /// Storage types of the weight (`NW`) and bias (`NB`) parameters.
    pub w_t: &'static str,
    pub b_t: &'static str,
    /// The normalised value of `v` (f32) at `k`, from the row's `mean` and `inv`, rounded to
    /// A's dtype as the unfused norm's stored output is.
    pub value: String,
}

/// What every GEMM kernel needs to know about the node.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Problem {
    /// Products of the batch, M, N and K sub-axes.
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// The element type of A and B (they agree: shape inference checks it).
    #[serde(skip)]
    pub input: DType,
    /// Storage types of A, B and the result.
    pub a_t: &'static str,
    pub b_t: &'static str,
    pub c_t: &'static str,
    /// Element offsets (C expressions of `long long bz, m, k` / `bz, k, n` / `bz, m, n`).
    pub a_at: String,
    pub b_at: String,
    pub c_at: String,
    /// The conversions around a loaded A or B element that make it a float.
    pub a_pre: &'static str,
    pub a_post: &'static str,
    pub b_pre: &'static str,
    pub b_post: &'static str,
    pub extras: Vec<Extra>,
    /// Offsets of each extra, as `rf_x{index}_at(bz, row, col)` bodies.
    pub extra_at: Vec<(usize, String)>,
    /// The epilogue: statements, then the stored value (of `acc_v`, the f32 product).
    pub lines: Vec<String>,
    pub store: String,
    /// The product as the epilogue reads it (rounded to A's dtype, as a MatMul's value is).
    pub acc: String,
    /// Whether there is an epilogue (then `acc_r` holds the rounded product).
    pub epilogue: bool,
    /// Paired columns (`ir::gemm`): product columns 2j (`acc_v`, rounded `acc_r`, `$0`) and
    /// 2j + 1 (`acc_u`, rounded `acc_r1`, `$1`) make result column j. Only the GEMV kernels
    /// (small-M, quantized) take it; `n` counts the product's columns.
    pub pair: bool,
    /// The odd column's product as the epilogue reads it (paired only).
    pub acc1: String,
    /// A one-line description for the kernel's comment.
    pub what: String,
    /// A's rows normalised over K before the product (GEMV kernels only).
    pub prologue: Option<NormPrologue>,
    /// Blocks that keep the GPU busy, for the GEMV kernel's columns per block
    /// (`small_m::FILL_BLOCKS`; fewer in a persistent plan, whose resident blocks run its tasks).
    pub fill_blocks: usize,
    /// The most columns a GEMV block takes (`small_m::MAX_COLS`; more in a persistent plan).
    pub max_cols: usize,
    /// Whether the kernel runs as tasks of a persistent plan (`codegen::persistent`).
    pub persistent: bool,
    /// Whether the GEMV may take 17-64 rows on the target's mma.sync atom
    /// (`CodegenOptions::mma_gemv`).
    pub mma_gemv: bool,
}

/// `Σ digit_j(var) · stride_j` over the sub-axes (outer first), as C: the digits of a
/// mixed-radix index. Size-1 and stride-0 sub-axes add nothing and are left out.
pub(crate) fn offset_c(var: &str, axes: &[Axis]) -> String {
    let mut terms = Vec::new();
    let mut inner: usize = 1;
    for (j, a) in axes.iter().enumerate().rev() {
        if a.size != 1 && a.stride != 0 {
            let mut digit = if inner == 1 {
                format!("({var})")
            } else {
                format!("(({var}) / {inner}LL)")
            };
            // The outermost digit needs no modulo: the index is below the axis's size.
            if j != 0 {
                digit = format!("({digit} % {}LL)", a.size);
            }
            terms.push(if a.stride == 1 {
                digit
            } else {
                format!("{digit} * {}LL", a.stride)
            });
        }
        inner = inner.saturating_mul(a.size);
    }
    if terms.is_empty() {
        "0LL".into()
    } else {
        terms.reverse();
        terms.join(" + ")
    }
}

/// The C offset of a view at problem coordinates (`b`, `rows`, `cols`); the result's and the
/// extras' columns are the paired problem's where columns pair.
fn view_c(g: &Gemm, view: &View, operand: Operand, [b, r, c]: [&str; 3]) -> String {
    let dims = match operand {
        Operand::Out => g.out_dims(),
        Operand::A | Operand::B => std::borrow::Cow::Borrowed(&g.dims),
    };
    let [batch, rows, cols] = dims.of(operand);
    let axes = |sizes: &[usize], strides: &[usize]| -> Vec<Axis> {
        sizes
            .iter()
            .zip(strides)
            .map(|(&size, &stride)| Axis { size, stride })
            .collect()
    };
    [
        offset_c(b, &axes(batch, &view.batch)),
        offset_c(r, &axes(rows, &view.rows)),
        offset_c(c, &axes(cols, &view.cols)),
    ]
    .into_iter()
    .filter(|t| t != "0LL")
    .reduce(|a, b| format!("{a} + {b}"))
    .unwrap_or_else(|| "0LL".into())
}

impl Problem {
    pub(crate) fn new(g: &Graph, id: NodeId, gemm: &Gemm) -> Result<Problem, CodegenError> {
        let name = &g.node(id).name;
        let ops = g.operands(id);
        let (at, bt, ot) = (g.ty(ops[0]), g.ty(ops[1]), g.ty(id));
        let [batch, m, n, k] = gemm.dims.sizes().expect("checked by shape inference");
        for (what, v) in [
            ("rows (M)", m),
            ("the contraction (K)", k),
            ("columns (N)", n),
            ("the batch", batch),
        ] {
            int_index(name, what, v)?;
        }
        let (ac, bc, oc) = (ctype(at.dtype), ctype(bt.dtype), ctype(ot.dtype));
        let a_at = view_c(gemm, &gemm.a, Operand::A, ["bz", "m", "k"]);
        let b_at = view_c(gemm, &gemm.b, Operand::B, ["bz", "k", "n"]);
        let c_at = view_c(gemm, &gemm.out, Operand::Out, ["bz", "m", "n"]);
        let problem_t = |dt: DType| TensorType::new(dt, Shape(vec![batch, m, n]));
        let mut extras = Vec::new();
        let mut extra_at = Vec::new();
        let extra_ops = &ops[2..2 + gemm.extras.len()];
        let first = gemm.first_extra_var();
        for (i, (view, &o)) in gemm.extras.iter().zip(extra_ops).enumerate() {
            let index = i + first;
            let c = ctype(g.ty(o).dtype);
            extra_at.push((index, view_c(gemm, view, Operand::Out, ["bz", "m", "n"])));
            extras.push(Extra {
                index,
                ctype: c.storage,
                vtype: c.value,
                load: format!(
                    "{}in{index}[rf_x{index}_at(bz, row, col)]{}",
                    c.load_pre, c.load_post
                ),
            });
        }
        let (lines, store, acc, what) = match &gemm.epilogue {
            None => (
                vec![],
                format!("{}acc_v{}", oc.store_pre, oc.store_post),
                "acc_v".to_string(),
                "product stored".to_string(),
            ),
            Some(expr) => {
                let ins: Vec<TensorType> = std::iter::repeat_n(problem_t(at.dtype), first)
                    .chain(extra_ops.iter().map(|&o| problem_t(g.ty(o).dtype)))
                    .collect();
                let vars: Vec<String> = (0..ins.len())
                    .map(|i| match i {
                        0 => "acc_r".to_string(),
                        1 if gemm.paired => "acc_r1".to_string(),
                        _ => format!("x{i}"),
                    })
                    .collect();
                let code = render(expr, &vars, &ins, "t", name)?;
                (
                    code.lines,
                    format!("{}{}{}", oc.store_pre, code.value, oc.store_post),
                    round_to(at.dtype, "acc_v".into()),
                    if gemm.paired {
                        format!(
                            "column pairs combined by {}, $0 the even column's product, $1 the odd's",
                            describe(expr)
                        )
                    } else {
                        format!("epilogue {}, $0 the product", describe(expr))
                    },
                )
            }
        };
        let prologue = match &gemm.prologue {
            None => None,
            Some(pro) => {
                let slots = gemm.prologue_slots();
                let (w, bias) = (ops[slots.start], ops.get(slots.start + 1));
                let wc = ctype(g.ty(w).dtype);
                let bc = bias.map(|&b| ctype(g.ty(b).dtype));
                if !(pro.eps as f32).is_finite() {
                    return Err(CodegenError::NonFinite {
                        node: name.clone(),
                        what: "prologue eps",
                        value: pro.eps,
                    });
                }
                let mut value = format!("(v - mean) * inv * {}NW[k]{}", wc.load_pre, wc.load_post);
                if let Some(bc) = &bc {
                    value = format!("{value} + {}NB[k]{}", bc.load_pre, bc.load_post);
                }
                Some(NormPrologue {
                    layer: pro.norm == NormKind::Layer,
                    eps_f: f32_literal(pro.eps),
                    w_t: wc.storage,
                    b_t: bc.map_or(wc.storage, |c| c.storage),
                    value: round_to(at.dtype, value),
                })
            }
        };
        Ok(Problem {
            prologue,
            input: at.dtype,
            batch,
            m,
            n,
            k,
            a_t: ac.storage,
            b_t: bc.storage,
            c_t: oc.storage,
            a_pre: ac.load_pre,
            a_post: ac.load_post,
            b_pre: bc.load_pre,
            b_post: bc.load_post,
            a_at,
            b_at,
            c_at,
            extras,
            extra_at,
            lines,
            store,
            acc,
            what,
            fill_blocks: small_m::FILL_BLOCKS,
            persistent: false,
            mma_gemv: false,
            max_cols: small_m::MAX_COLS,
            epilogue: gemm.epilogue.is_some(),
            pair: gemm.paired,
            acc1: if gemm.paired {
                round_to(at.dtype, "acc_u".into())
            } else {
                String::new()
            },
        })
    }
}

/// The kernel for Gemm node `id`: operands A, B, the extras, then the result.
pub(crate) fn lower(
    g: &Graph,
    id: NodeId,
    gemm: &Gemm,
    buf: &HashMap<NodeId, BufferId>,
    target: &Target,
    options: &crate::codegen::CodegenOptions,
    plan: &mut KernelPlan,
) -> Result<Kernel, CodegenError> {
    let (tuned, int8_gemv) = (&options.tuned, options.int8_gemv);
    let mut p = Problem::new(g, id, gemm)?;
    if options.persistent != crate::codegen::Persistent::Off {
        p.fill_blocks = small_m::PERSISTENT_FILL_BLOCKS;
        p.max_cols = small_m::PERSISTENT_MAX_COLS;
        p.persistent = true;
    } else {
        p.mma_gemv = options.mma_gemv;
    }
    let mut args: Vec<BufferId> = g.operands(id).iter().map(|o| buf[o]).collect();
    args.push(buf[&id]);
    let node = &g.node(id).name;
    let dtype = g.ty(g.operands(id)[0]).dtype;
    if let Some(scheme) = quant::reads_blocks(g, id, gemm) {
        // Int8 activations and 4-way dot products where asked for (`CodegenOptions::int8_gemv`)
        // or by default for the K-quants (`quant_dot::by_default`), where that kernel takes the
        // problem. The int8 kernel does not combine column pairs: the float one does.
        if (int8_gemv || quant_dot::by_default(scheme)) && !gemm.paired {
            if let Some(k) = quant_dot::kernel(
                &p,
                scheme,
                node,
                args.clone(),
                target,
                options.quant_split,
                plan,
            )? {
                return Ok(k);
            }
        }
        return quant::kernel(&p, gemm, scheme, node, args, target);
    }
    if small_m::takes(&p) {
        // Decoding: memory-bound on the weights whatever the dtype.
        return small_m::kernel(&p, gemm, dtype, node, args, target);
    }
    if gemm.paired {
        // Only the GEMV kernels combine adjacent product columns; `passes::merge_gemms` pairs
        // only Gemms that `ir::gemm::runs_as_gemv` (`paired_needs_gemv`), the rule
        // `small_m::takes` reads, so only a hand-written graph gets here.
        return Err(CodegenError::Unsupported {
            node: node.clone(),
            reason: format!(
                "paired columns with M = {} rows and N = {} (the GEMV kernels that combine them \
                 take 1..={} rows, past {} only where the tiled kernels' grid is small)",
                p.m,
                p.n,
                small_m::MAX_M,
                small_m::GROUP_ROWS
            ),
        });
    }
    if gemm.prologue.is_some() {
        // The tiled kernels share A's tiles between rows of M; a per-row normalisation there is
        // not written. `passes::norm_gemv` folds a norm only into Gemms that
        // `ir::gemm::runs_as_gemv`, the rule `small_m::takes` reads, so only a hand-written
        // graph gets here; it gets an error rather than an unnormalised product.
        return Err(CodegenError::Unsupported {
            node: node.clone(),
            reason: format!(
                "a normalisation prologue with M = {} rows and N = {} (the GEMV kernels that \
                 apply one take 1..={} rows, past {} only where the tiled kernels' grid is small)",
                p.m,
                p.n,
                small_m::MAX_M,
                small_m::GROUP_ROWS
            ),
        });
    }
    // f16 and bf16 go to the warpgroup MMA where asked for (`CodegenOptions::wgmma_gemm`), the
    // target has it (sm_90a) and the problem fills its tiles, else to the matrix cores where the
    // target has an atom for them.
    if options.wgmma_gemm {
        if options.wgmma_tma != crate::codegen::TmaWidth::Off {
            let width = options.wgmma_tma;
            if let Some(k) = wgmma::tma_kernel(&p, gemm, node, args.clone(), target, plan, width)? {
                return Ok(k);
            }
        }
        if let Some(k) = wgmma::kernel(&p, gemm, node, args.clone(), target)? {
            return Ok(k);
        }
    }
    // f32 reaches the matrix cores only on a TF32 atom the caller opted in to
    // (`CodegenOptions::f32_matmul`); where none serves, the plan says so and runs exact f32.
    if let Some(k) = mma::kernel(
        &p,
        gemm,
        node,
        args.clone(),
        target,
        tuned,
        options.f32_matmul,
    )? {
        return Ok(k);
    }
    if dtype == DType::F32 && options.f32_matmul == crate::codegen::F32Matmul::Tf32 {
        plan.notes.push(tf32_fallback_note(node, target));
    }
    scalar::kernel(&p, gemm, dtype, node, args, target)
}

/// The plan's note for an f32 matmul that asked for TF32 and runs exact f32 instead.
pub(crate) fn tf32_fallback_note(node: &str, target: &Target) -> String {
    let why = if target
        .caps
        .mma
        .iter()
        .any(|a| a.precision == crate::arch::mma::Precision::Tf32)
    {
        "no TF32 configuration of its kernel fits this problem".to_string()
    } else {
        format!("{} has no TF32 matrix instruction", target.caps.name)
    };
    format!(
        "{}: TF32 was asked for, but {why}: exact f32",
        display_name(node)
    )
}

#[cfg(test)]
impl Problem {
    /// A problem of the given sizes with nothing else set, for tests of tiling choices.
    pub(crate) fn empty_for_tests() -> Problem {
        Problem {
            input: DType::F16,
            batch: 1,
            m: 1,
            n: 1,
            k: 1,
            a_t: "rf_half",
            b_t: "rf_half",
            c_t: "rf_half",
            a_at: String::new(),
            b_at: String::new(),
            c_at: String::new(),
            a_pre: "",
            a_post: "",
            b_pre: "",
            b_post: "",
            extras: vec![],
            extra_at: vec![],
            lines: vec![],
            store: String::new(),
            acc: String::new(),
            epilogue: false,
            pair: false,
            acc1: String::new(),
            what: String::new(),
            prologue: None,
            fill_blocks: small_m::FILL_BLOCKS,
            persistent: false,
            mma_gemv: false,
            max_cols: small_m::MAX_COLS,
        }
    }
}
