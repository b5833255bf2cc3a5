//! The scalar FlashAttention (`kernel_templates/flash_attention.hip`): any dtype on any target,
//! f32 arithmetic. `tpr` lanes share a query row, each holding `dper` of its D columns; K/V
//! tiles of `block_n` keys are staged in shared memory as f32.

use serde::Serialize;

use super::super::super::plan::{BufferId, Kernel, Launch};
use super::super::super::CodegenError;
use super::Problem;
use crate::arch::Target;
use crate::codegen::kernel::finish;

/// One tiling of the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Config {
    /// Lanes per query row (a power of two up to 16).
    pub tpr: usize,
    pub block_m: usize,
    pub block_n: usize,
}

/// Enough lanes per row that each holds at most 8 columns, 256 threads a block, and K and V
/// tiles in f32 within 48 KiB of shared memory.
pub(crate) fn choose(p: &Problem) -> Config {
    let tpr = p.d.div_ceil(8).next_power_of_two().clamp(1, 16);
    Config {
        tpr,
        block_m: 256 / tpr,
        block_n: (12288 / (p.d + p.dv + 2)).clamp(1, 32),
    }
}

/// The launch geometry: grid x over (batch, head), y over query tiles.
pub(crate) fn launch(
    c: &Config,
    p: &Problem,
    node: &str,
    target: &Target,
) -> Result<Launch, CodegenError> {
    p.query_tiles_launch(c.block_m, c.block_m * c.tpr, node, target)
}

#[derive(Serialize)]
struct Context<'a> {
    #[serde(flatten)]
    p: &'a Problem,
    #[serde(flatten)]
    c: Config,
    threads: usize,
    /// Columns of q and of v per lane; at least one register per thread even for D = 0 (no
    /// zero-length arrays in C++): its column is past D, so it holds 0 and adds nothing.
    dper: usize,
    dvper: usize,
}

pub(crate) fn kernel(
    p: &Problem,
    node: &str,
    args: Vec<BufferId>,
    target: &Target,
) -> Result<Kernel, CodegenError> {
    let c = choose(p);
    let launch = launch(&c, p, node, target)?;
    let ctx = Context {
        p,
        c,
        threads: c.block_m * c.tpr,
        dper: p.d.div_ceil(c.tpr).max(1),
        dvper: p.dv.div_ceil(c.tpr).max(1),
    };
    finish(
        "flash_attention",
        "flash_attention.hip",
        ctx,
        launch,
        args,
        node,
    )
}
