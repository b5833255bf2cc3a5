//! Softmax along one axis: one block per row (safe: a row of −∞ gives zeros).

use serde::Serialize;

use crate::arch::Target;
use crate::codegen::ctype::ctype;
use crate::codegen::kernel::finish;
use crate::codegen::limits::{int_index, launch, BLOCK_1D};
use crate::codegen::plan::{BufferId, Kernel};
use crate::codegen::CodegenError;
use crate::ir::{Shape, TensorType};

#[derive(Serialize)]
struct Context {
    /// The axis' length, the elements after it (its stride), the rows, and a row's span.
    len: usize,
    inner: usize,
    rows: usize,
    row_span: usize,
    ctype: &'static str,
    load_pre: &'static str,
    load_post: &'static str,
    store_pre: &'static str,
    store_post: &'static str,
}

/// The softmax of `x` along axis `ax` (normalised) into `out`.
pub(crate) fn kernel(
    x: &Shape,
    ax: usize,
    out: &TensorType,
    args: Vec<BufferId>,
    node: &str,
    target: &Target,
) -> Result<Kernel, CodegenError> {
    let len = x.dims()[ax];
    let inner: usize = x.dims()[ax + 1..].iter().product();
    let rows = x.numel() / len.max(1);
    int_index(node, "the softmax axis length", len)?;
    let c = ctype(out.dtype);
    let ctx = Context {
        len,
        inner,
        rows,
        row_span: len * inner,
        ctype: c.storage,
        load_pre: c.load_pre,
        load_post: c.load_post,
        store_pre: c.store_pre,
        store_post: c.store_post,
    };
    let launch = launch(node, target, [rows, 1, 1], BLOCK_1D)?;
    finish("softmax", "softmax.hip", ctx, launch, args, node)
}
