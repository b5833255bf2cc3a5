//! Reductions (sum, mean, max) over any set of axes: one thread per result element.

use serde::Serialize;

use crate::arch::Target;
use crate::codegen::ctype::{ctype, f32_literal};
use crate::codegen::kernel::finish;
use crate::codegen::limits::launch_1d;
use crate::codegen::plan::{BufferId, Kernel};
use crate::codegen::CodegenError;
use crate::ir::{ReduceOp, TensorType};

/// An axis (innermost first, size-1 axes skipped) with its element stride in the input.
#[derive(Serialize)]
struct Axis {
    size: usize,
    stride: usize,
}

#[derive(Serialize)]
struct Context {
    op: &'static str,
    n: usize,
    count: usize,
    kept: Vec<Axis>,
    reduced: Vec<Axis>,
    init: &'static str,
    combine: &'static str,
    finish: String,
    ctype: &'static str,
    load_pre: &'static str,
    load_post: &'static str,
    store_pre: &'static str,
    store_post: &'static str,
}

/// The reduction `op` of `x` over `axes` into `n` results; `args` are the input and result.
pub(crate) fn kernel(
    op: ReduceOp,
    axes: &[i64],
    x: &TensorType,
    n: usize,
    args: Vec<BufferId>,
    node: &str,
    target: &Target,
) -> Result<Kernel, CodegenError> {
    let red = crate::ir::reduce_axes(axes, &x.shape).expect("checked by inference");
    let strides = x.shape.strides();
    let pick = |keep: bool| -> Vec<Axis> {
        (0..x.shape.rank())
            .rev()
            .filter(|a| red.contains(a) != keep && x.shape.dims()[*a] > 1)
            .map(|a| Axis {
                size: x.shape.dims()[a],
                stride: strides[a],
            })
            .collect()
    };
    // Over an empty axis the loop never runs: a sum is 0, a max -inf, and a mean NaN (0/0),
    // PyTorch's results and the interpreter's.
    let count: usize = red.iter().map(|&a| x.shape.dims()[a]).product();
    let c = ctype(x.dtype);
    let (init, combine, finish_expr) = match op {
        ReduceOp::Sum => ("0.0f", "acc + v", "acc".to_string()),
        ReduceOp::Mean if count == 0 => ("0.0f", "acc + v", "NAN".to_string()),
        ReduceOp::Mean => (
            "0.0f",
            "acc + v",
            format!("acc / {}", f32_literal(count as f64)),
        ),
        // rf_max: NaN propagates, as in the interpreter (fmaxf would drop it).
        ReduceOp::Max => ("(-INFINITY)", "rf_max(acc, v)", "acc".to_string()),
    };
    let ctx = Context {
        op: op.name(),
        n,
        count,
        kept: pick(true),
        reduced: pick(false),
        init,
        combine,
        finish: finish_expr,
        ctype: c.storage,
        load_pre: c.load_pre,
        load_post: c.load_post,
        store_pre: c.store_pre,
        store_post: c.store_post,
    };
    let launch = launch_1d(node, target, n)?;
    finish("reduce", "reduce.hip", ctx, launch, args, node)
}
