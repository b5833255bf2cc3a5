//! LayerNorm and RMSNorm over the last axis.

use serde::Serialize;

use crate::arch::Target;
use crate::codegen::ctype::{ctype, f32_literal};
use crate::codegen::kernel::finish;
use crate::codegen::limits::{int_index, launch, BLOCK_1D};
use crate::codegen::plan::{BufferId, Kernel};
use crate::codegen::CodegenError;
use crate::ir::{DType, TensorType};

/// The longest row, in elements per lane, that a norm kernel holds in one wave's registers.
const NORM_WAVE_ELEMS: usize = 32;

/// Which norm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Norm {
    Layer,
    Rms,
}

/// How a row is spread: one wave's registers (reduced with shuffles, several rows a block)
/// or one block's (read again through shared-memory reductions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Config {
    pub per_wave: bool,
    pub per_lane: usize,
}

#[derive(Serialize)]
struct Context {
    d: usize,
    rows: usize,
    eps: f64,
    eps_f: String,
    ctype: &'static str,
    wtype: &'static str,
    load_pre: &'static str,
    load_post: &'static str,
    store_pre: &'static str,
    store_post: &'static str,
    w_pre: &'static str,
    w_post: &'static str,
    per_wave: bool,
    per_lane: usize,
}

/// The norm of `ty` (rows of its last axis) with weights of `wdt`.
pub(crate) fn kernel(
    norm: Norm,
    eps: f64,
    ty: &TensorType,
    wdt: DType,
    args: Vec<BufferId>,
    node: &str,
    target: &Target,
) -> Result<Kernel, CodegenError> {
    let d = *ty.shape.dims().last().expect("checked by inference");
    let rows = ty.shape.numel() / d.max(1);
    int_index(node, "the normalised axis length", d)?;
    let (c, w) = (ctype(ty.dtype), ctype(wdt));
    // A row of up to NORM_WAVE_ELEMS per lane is one wave's, held in registers and
    // reduced with shuffles, several rows a block; a longer row is one block's, read
    // twice (LayerNorm three times) through shared-memory reductions.
    let wave = target.wave_size as usize;
    let per_lane = d.div_ceil(wave);
    let cfg = Config {
        per_wave: per_lane <= NORM_WAVE_ELEMS,
        per_lane: per_lane.max(1),
    };
    let ctx = Context {
        d,
        rows,
        eps,
        eps_f: f32_literal(eps),
        ctype: c.storage,
        wtype: w.storage,
        load_pre: c.load_pre,
        load_post: c.load_post,
        store_pre: c.store_pre,
        store_post: c.store_post,
        w_pre: w.load_pre,
        w_post: w.load_post,
        per_wave: cfg.per_wave,
        per_lane: cfg.per_lane,
    };
    let blocks = if cfg.per_wave {
        rows.div_ceil(BLOCK_1D / wave)
    } else {
        rows
    };
    let launch = launch(node, target, [blocks, 1, 1], BLOCK_1D)?;
    let (family, template) = match norm {
        Norm::Layer => ("layernorm", "layernorm.hip"),
        Norm::Rms => ("rmsnorm", "rmsnorm.hip"),
    };
    finish(family, template, ctx, launch, args, node)
}
