//! Strided copies: permute, expand, slice and each part of a concat.

use serde::Serialize;

use crate::arch::Target;
use crate::codegen::ctype::ctype;
use crate::codegen::kernel::finish;
use crate::codegen::limits::launch_1d;
use crate::codegen::plan::{BufferId, Kernel};
use crate::codegen::CodegenError;
use crate::ir::{DType, Shape};

/// One iterated axis (innermost first, size-1 axes skipped) with its element strides.
#[derive(Serialize)]
struct Axis {
    size: usize,
    src: usize,
    dst: usize,
}

#[derive(Serialize)]
struct Context {
    /// What the copy is, for the kernel's comment.
    what: String,
    n: usize,
    ctype: &'static str,
    src_base: usize,
    dst_base: usize,
    axes: Vec<Axis>,
}

/// Where a copy reads and writes: element strides of the source and destination over the
/// iterated shape, from element offsets (source, destination).
pub(crate) struct Strides<'a> {
    pub src: &'a [usize],
    pub dst: &'a [usize],
    pub bases: (usize, usize),
}

/// A strided copy over `iter`; `args` are the source and the destination.
pub(crate) fn kernel(
    what: String,
    iter: &Shape,
    s: Strides<'_>,
    dt: DType,
    args: Vec<BufferId>,
    (node, target): (&str, &Target),
) -> Result<Kernel, CodegenError> {
    let axes: Vec<Axis> = (0..iter.rank())
        .rev()
        .filter(|&a| iter.dims()[a] > 1)
        .map(|a| Axis {
            size: iter.dims()[a],
            src: s.src[a],
            dst: s.dst[a],
        })
        .collect();
    let ctx = Context {
        what,
        n: iter.numel(),
        ctype: ctype(dt).storage,
        src_base: s.bases.0,
        dst_base: s.bases.1,
        axes,
    };
    let launch = launch_1d(node, target, iter.numel())?;
    finish("copy", "copy.hip", ctx, launch, args, node)
}
