//! The matrix-core FlashAttention (`kernel_templates/flash_attention_mma.hip`): f16 or bf16
//! q, k, v with f32 accumulation on the target's MMA atom. A block of `warps` warps takes
//! `block_m` query rows of one (batch, head); K/V tiles of `block_n` keys are staged in shared
//! memory; each warp computes its rows' scores, online softmax and P·V in registers.

use serde::Serialize;

use super::super::super::limits::launch as checked_launch;
use super::super::super::lower::finish;
use super::super::super::mma::MmaAtom;
use super::super::super::plan::{BufferId, Kernel, Launch};
use super::super::super::{CodegenError, Target};
use super::Problem;
use crate::ir::DType;

/// One tiling of the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Config {
    pub warps: usize,
    /// Query rows per block (the atom's M per warp).
    pub block_m: usize,
    /// Keys per K/V tile.
    pub block_n: usize,
}

/// The matrix atom the kernel runs on, if the target's table has one for `dtype`: f32
/// accumulation, S accumulators that become the P·V operand in registers, K and V fragments by
/// `ldmatrix` pairs, and `cp.async` for the K/V tiles.
pub(crate) fn atom_for(target: &Target, dtype: DType) -> Option<&'static MmaAtom> {
    if !target.caps.async_copy.has_cp_async() {
        return None;
    }
    target.caps.mma.iter().copied().find(|a| {
        a.input == dtype
            && a.acc == DType::F32
            && a.accumulators_feed_a()
            && a.loads_b_pairs_by_ldmatrix()
    })
}

/// Whether the head sizes suit the atom: D in whole K steps, Dv in pairs of N tiles, and the
/// fragments in registers (up to 128; a head size of 0 has no fragment to hold).
fn fits(p: &Problem, atom: &MmaAtom) -> bool {
    p.d.is_multiple_of(atom.k as usize)
        && p.dv.is_multiple_of(2 * atom.n as usize)
        && (1..=128).contains(&p.d)
        && (1..=128).contains(&p.dv)
}

/// The configuration for a problem: four warps of one atom's rows each, 64-key tiles.
pub(crate) fn choose(atom: &MmaAtom) -> Config {
    let warps = 4;
    Config {
        warps,
        block_m: atom.m as usize * warps,
        block_n: 64,
    }
}

/// The launch geometry of a configuration: grid x over (batch, head), y over query tiles.
pub(crate) fn launch(
    c: &Config,
    atom: &MmaAtom,
    p: &Problem,
    node: &str,
    target: &Target,
) -> Result<Launch, CodegenError> {
    checked_launch(
        node,
        target,
        [p.heads(node, target)?, p.sq.div_ceil(c.block_m), 1],
        c.warps * atom.lanes as usize,
    )
}

#[derive(Serialize)]
struct Context<'a> {
    #[serde(flatten)]
    p: &'a Problem,
    #[serde(flatten)]
    c: Config,
    threads: usize,
    dtype: String,
    /// The atom's helper prefix (`rf_m16n8k16_f16`) and its shape.
    atom: String,
    am: u32,
    an: u32,
    ak: u32,
}

/// The kernel, or `None` where the target has no suitable atom or the head sizes do not fit.
pub(crate) fn kernel(
    p: &Problem,
    node: &str,
    args: Vec<BufferId>,
    target: &Target,
) -> Result<Option<Kernel>, CodegenError> {
    let Some(atom) = atom_for(target, p.dtype).filter(|a| fits(p, a)) else {
        return Ok(None);
    };
    let c = choose(atom);
    let launch = launch(&c, atom, p, node, target)?;
    let ctx = Context {
        p,
        c,
        threads: launch.block[0] as usize,
        dtype: p.dtype.to_string(),
        atom: atom.prefix(),
        am: atom.m,
        an: atom.n,
        ak: atom.k,
    };
    let ctx = serde_json::to_value(ctx).expect("a context serialises");
    finish(
        "flash_attention",
        "flash_attention_mma.hip",
        ctx,
        launch,
        args,
        node,
    )
    .map(Some)
}
