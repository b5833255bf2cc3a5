//! The warpgroup GEMM (sm_90a): f16 or bf16 A and B, f32 accumulation by
//! `wgmma.mma_async` from shared memory. A block computes a `BM × BN` output tile; each of its
//! `BM / 64` warpgroups owns 64 rows and issues `m64n{BN}k16` for each 16-wide K step of a
//! stage. Stages of A and B (64 wide along K: one 128-byte line per row) arrive by 16-byte
//! `cp.async` into a ring of [`STAGES`] buffers in dynamic shared memory, `STAGES - 2` ahead
//! of use while one step's wgmma group stays in flight during the next, stored in the
//! 128-byte-swizzled K-major layout of the atom's rows (`arch::mma::wgmma`), whose descriptors
//! the kernel hands the tensor cores; the accumulators' places come from the atom's C layout,
//! and the epilogue (bias, activation, residual: the family's `Problem`) runs on them in
//! registers.
//!
//! What this kernel does not do yet (see docs/decisions.md): TMA loads, an mbarrier ring with
//! producer and consumer warpgroups (`setmaxnreg`), persistent tile scheduling. Every thread
//! both copies and multiplies, and stages hand over at block barriers, as in `mma.rs`.

use serde::Serialize;

use super::super::super::limits::launch as checked_launch;
use super::super::super::plan::{BufferId, Kernel};
use super::super::super::CodegenError;
use super::mma::{access, atom_for, BForm};
use super::Problem;
use crate::arch::mma::wgmma::{WgmmaAtom, WARPGROUP};
use crate::arch::Target;
use crate::codegen::kernel::finish;
use crate::ir::Gemm;

/// Rows of the block tile: two consumer warpgroups of 64 rows.
const BM: usize = 128;
/// Columns of the block tile: the N of every wgmma (64 accumulator floats per thread).
const BN: usize = 128;
/// Stages in the shared-memory ring: three tiles in flight, one being multiplied and one still
/// read by the wgmma group left in flight from the step before (160 KiB of the 227).
pub(crate) const STAGES: usize = 5;
/// Smallest M and N the kernel is chosen for: below a full tile the mma.sync kernel's smaller
/// tiles waste less.
pub(crate) const MIN_MN: usize = 128;

#[derive(Serialize)]
struct Context<'a> {
    p: &'a Problem,
    atom_name: &'static str,
    bm: usize,
    bn: usize,
    bk: usize,
    stages: usize,
    threads: usize,
    warpgroups: usize,
    /// Bytes of one stage's A and B tiles.
    a_bytes: usize,
    b_bytes: usize,
    /// 16-byte chunks of A and B per thread and stage.
    a_iters: usize,
    b_iters: usize,
    /// The wgmma instruction and its accumulator floats per thread.
    instruction: String,
    acc_n: u32,
    /// Where the atom's C layout puts accumulator `e` of thread `lane` of a warpgroup.
    c_row: String,
    c_col: String,
    /// The swizzled byte offset of (`r`, `k`) in a tile, and the descriptor of an address `a`.
    smem_at: String,
    desc: String,
}

/// The atom for a problem on a target, if the target has warpgroup MMA for its input type.
fn wgmma_atom(p: &Problem, target: &Target) -> Option<&'static WgmmaAtom> {
    target
        .caps
        .wgmma
        .iter()
        .copied()
        .find(|a| a.input == p.input)
}

/// The kernel where the target has wgmma for the operands, both are read in 16-byte pieces
/// along K (A row-major, B with K contiguous per column) and M and N fill a tile; `None`
/// otherwise (the mma.sync kernel takes it).
pub(crate) fn kernel(
    p: &Problem,
    g: &Gemm,
    node: &str,
    args: Vec<BufferId>,
    target: &Target,
) -> Result<Option<Kernel>, CodegenError> {
    let Some(atom) = wgmma_atom(p, target) else {
        return Ok(None);
    };
    // The access analysis of the mma.sync kernel decides the same question: may A and B be
    // read in 16-byte pieces along K. It needs a fragment atom of the input type, which every
    // wgmma row also has.
    let Some(frag) = atom_for(p, target.caps) else {
        return Ok(None);
    };
    let acc = access(g, frag, target.caps);
    if !(acc.a_vec && acc.b_vec && acc.b_form == BForm::Nk) || p.m < MIN_MN || p.n < MIN_MN {
        return Ok(None);
    }
    let c = atom.c(BN as u32).expect("BN is a modelled N");
    let smem = atom.smem;
    let bk = smem.k_tile() as usize;
    let warpgroups = BM / atom.m as usize;
    let threads = warpgroups * WARPGROUP as usize;
    let (a_bytes, b_bytes) = (BM * bk * 2, BN * bk * 2);
    let mut launch = checked_launch(
        node,
        target,
        [p.n.div_ceil(BN), p.m.div_ceil(BM), p.batch],
        threads,
    )?;
    // The ring, plus the slack that lets the kernel align its base to the swizzle atom.
    let shared = STAGES * (a_bytes + b_bytes) + smem.swizzle.atom_bytes() as usize;
    if shared > target.caps.shared_bytes_per_block as usize {
        return Ok(None);
    }
    launch.shared_bytes = shared as u32;
    let chunk = 16;
    let ctx = Context {
        p,
        atom_name: atom.name,
        bm: BM,
        bn: BN,
        bk,
        stages: STAGES,
        threads,
        warpgroups,
        a_bytes,
        b_bytes,
        a_iters: a_bytes / chunk / threads,
        b_iters: b_bytes / chunk / threads,
        instruction: atom.instruction(BN as u32),
        acc_n: c.elems(),
        c_row: c.row().c(),
        c_col: c.col().c(),
        smem_at: smem.offset_c("r", "k"),
        desc: smem.descriptor_c("a"),
    };
    finish("gemm_wgmma", "gemm_wgmma.hip", ctx, launch, args, node).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each thread's chunks cover a stage exactly, and the ring fits the sm_90a row.
    #[test]
    fn tiles_divide_among_threads_and_fit() {
        let t = Target::parse("sm_90a").unwrap();
        let atom = t.caps.wgmma[0];
        let bk = atom.smem.k_tile() as usize;
        let threads = BM / atom.m as usize * WARPGROUP as usize;
        assert_eq!((BM * bk * 2 / 16) % threads, 0);
        assert_eq!((BN * bk * 2 / 16) % threads, 0);
        let shared = STAGES * (BM + BN) * bk * 2 + 1024;
        assert!(shared <= t.caps.shared_bytes_per_block as usize);
        assert!(
            shared > t.caps.static_shared_bytes as usize,
            "needs the opt-in"
        );
    }
}
