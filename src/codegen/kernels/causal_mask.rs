//! CausalMask: the boolean [sq, sk] mask of a causal offset, one thread per element.

use serde::Serialize;

use super::attention::clamp_offset;
use crate::arch::Target;
use crate::codegen::ctype::i64_literal;
use crate::codegen::kernel::finish;
use crate::codegen::limits::launch_1d;
use crate::codegen::plan::{BufferId, Kernel};
use crate::codegen::CodegenError;

#[derive(Serialize)]
struct Context {
    sq: usize,
    sk: usize,
    n: usize,
    /// The clamped offset as a C literal (`attention::clamp_offset`).
    offset: String,
}

pub(crate) fn kernel(
    (sq, sk, offset): (usize, usize, i64),
    n: usize,
    args: Vec<BufferId>,
    node: &str,
    target: &Target,
) -> Result<Kernel, CodegenError> {
    let ctx = Context {
        sq,
        sk,
        n,
        offset: i64_literal(clamp_offset(offset, sq, sk)),
    };
    let launch = launch_1d(node, target, n)?;
    finish("causal_mask", "causal_mask.hip", ctx, launch, args, node)
}
