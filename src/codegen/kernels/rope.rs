//! Rotary position embedding over the last axis (pairs `i`, `i + d/2`).

use serde::Serialize;

use crate::arch::Target;
use crate::codegen::ctype::{ctype, f64_literal};
use crate::codegen::kernel::finish;
use crate::codegen::limits::{int_index, launch_1d};
use crate::codegen::plan::{BufferId, Kernel};
use crate::codegen::CodegenError;
use crate::ir::TensorType;

#[derive(Serialize)]
struct Context {
    s: usize,
    d: usize,
    half: usize,
    /// Threads: rows × half.
    n: usize,
    /// Positions come from an operand (else `offset + s`).
    positions: bool,
    theta: String,
    /// Whether Llama 3 factors divide the frequencies (comments only: they are in `inv_freq`).
    factors: bool,
    /// The inverse frequency of each pair as C double literals (`ir::rope_inv_freq`).
    inv_freq: Vec<String>,
    /// The offset as a C double literal, and as written (comments).
    offset: String,
    offset_text: i64,
    ctype: &'static str,
    load_pre: &'static str,
    load_post: &'static str,
    store_pre: &'static str,
    store_post: &'static str,
}

pub(crate) fn kernel(
    (theta, offset, factors): (f64, i64, &[f64]),
    ty: &TensorType,
    positions: bool,
    args: Vec<BufferId>,
    node: &str,
    target: &Target,
) -> Result<Kernel, CodegenError> {
    let dims = ty.shape.dims();
    let (s, d) = (dims[dims.len() - 2], dims[dims.len() - 1]);
    let rows = ty.shape.numel() / d.max(1);
    let half = d / 2;
    int_index(node, "half the rotated axis", half)?;
    // Positions are `offset + s` in double, as the interpreter computes them; the offset is
    // written as a double literal, which any i64 has.
    let c = ctype(ty.dtype);
    let theta_value = theta;
    let theta = f64_literal(theta).ok_or(CodegenError::NonFinite {
        node: node.to_string(),
        what: "theta",
        value: theta,
    })?;
    let inv_freq = inv_freq_literals(theta_value, d, factors, node)?;
    let ctx = Context {
        s,
        d,
        half,
        n: rows * half,
        positions,
        theta,
        factors: !factors.is_empty(),
        inv_freq,
        offset: format!("({offset}.0)"),
        offset_text: offset,
        ctype: c.storage,
        load_pre: c.load_pre,
        load_post: c.load_post,
        store_pre: c.store_pre,
        store_post: c.store_post,
    };
    let launch = launch_1d(node, target, rows * half)?;
    finish("rope", "rope.hip", ctx, launch, args, node)
}

/// The inverse frequencies of a rope over rows of `d` as C double literals, computed on the
/// host in f64 by the interpreter's own definition (`ir::rope_inv_freq`); a non-finite one (a
/// zero factor, an overflowing theta) is a typed error naming the node.
pub(crate) fn inv_freq_literals(
    theta: f64,
    d: usize,
    factors: &[f64],
    node: &str,
) -> Result<Vec<String>, CodegenError> {
    crate::ir::rope_inv_freq(theta, d, factors)
        .into_iter()
        .map(|f| {
            f64_literal(f).ok_or(CodegenError::NonFinite {
                node: node.to_string(),
                what: "rope inverse frequency",
                value: f,
            })
        })
        .collect()
}
