//! The small-M GEMM (decoding: one to a few rows of activations against a weight): GEMV-style,
//! memory-bound, B read exactly once. A block owns a few columns of the result for a group of
//! up to [`GROUP_ROWS`] rows (all M rows where they fit one group, as at decode; past it the
//! grid has a dimension of row groups, fastest in launch order, so the blocks that read the
//! same columns of B run together and all but the first find them in L2);
//! its threads split K in 16-byte chunks of B, and the waves' sums are added through shared
//! memory in a fixed order. Any float dtype, any views; 16-byte loads where the view allows them
//! (see `vectors`), element loads otherwise. Weights stored `[K, N]` (N-contiguous) are read 16
//! bytes along N instead, the lanes splitting K.

use serde::Serialize;

use super::super::super::limits::launch as checked_launch;
use super::super::super::plan::{BufferId, Kernel, Launch};
use super::super::super::CodegenError;
use super::vectors::{vectorizes, Along};
use super::Problem;
use crate::arch::Target;
use crate::codegen::kernel::finish;
use crate::ir::gemm::Operand;
use crate::ir::{DType, Gemm};

/// The most rows this kernel takes, in groups of [`GROUP_ROWS`]: it is `ir::gemm::GEMV_MAX_M`,
/// which passes read (they may not import codegen) through `ir::gemm::runs_as_gemv`.
pub(crate) const MAX_M: usize = crate::ir::gemm::GEMV_MAX_M;
/// The most rows one block computes: each thread keeps rows × `cols` sums in registers
/// (`MAX_ACC`). `ir::gemm::GEMV_GROUP_ROWS`: up to it a problem is one group, as before row
/// groups existed.
pub(crate) const GROUP_ROWS: usize = crate::ir::gemm::GEMV_GROUP_ROWS;
/// The same with paired columns: the pair's combine and its epilogue also live at the end,
/// and bf16 with the norm prologue spilled on gfx1100/gfx1201 at 16 rows (2 columns, 32
/// sums); 8 rows was the most pairs ever took before row groups.
pub(crate) const PAIRED_GROUP_ROWS: usize = 8;
/// The most rows a block of a normalised GEMV (a norm prologue) takes once M is split in groups:
/// 16-row groups spilled 32-57 VGPRs on gfx1100 and gfx1201 (RMSNorm, f16/bf16, K 1536 → N 576
/// at 64 rows; the 11-row groups of 33 rows did not), the group's row offsets and statistics
/// living beside its sums. One group of up to 16 rows (M ≤ 16) is unchanged.
pub(crate) const NORM_GROUP_ROWS: usize = 12;
/// Accumulators per thread (M × cols) at most: beyond, registers spill on wave64 targets.
const MAX_ACC: usize = 64;
/// Columns per block at most: each column is one 16-byte load in flight per chunk.
pub(crate) const MAX_COLS: usize = 4;
/// The same in a persistent plan: a step's columns in fewer, wider tasks (gate/up's 3,072
/// paired columns in 384, one round over the resident blocks).
pub(crate) const PERSISTENT_MAX_COLS: usize = 8;
/// Waves per block at most.
const MAX_WAVES: usize = 4;
/// Chunks of K each thread should have at least before another wave is added: with fewer, the
/// reduction costs more than the loads it shares out.
const CHUNKS_PER_THREAD: usize = 2;
/// Blocks that keep a large GPU busy (H100: 132 SMs, MI300X: 304 CUs, a few blocks each):
/// fewer columns per block are taken while the grid is smaller than this.
pub(crate) const FILL_BLOCKS: usize = 512;
/// The same in a persistent plan (`codegen::persistent`), whose few hundred resident blocks
/// run its blocks as tasks one at a time: wider blocks (more columns, more loads in flight per
/// thread) and fewer tasks a step, one round over the resident blocks.
pub(crate) const PERSISTENT_FILL_BLOCKS: usize = 128;
/// Bytes one vector load reads.
const VECTOR_BYTES: usize = 16;

/// How one small-M kernel is shaped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Config {
    /// Columns of the result per block.
    pub cols: usize,
    /// Waves (warps) per block, splitting K.
    pub waves: usize,
    /// Elements per chunk of K: 16 bytes of the dtype.
    pub vec: usize,
    /// Whether A (along K) and B (along K) are read 16 bytes at a time.
    pub a_vec: bool,
    pub b_vec: bool,
    /// B read 16 bytes along N instead (N-contiguous weights, `[K, N]`): lanes own `vec`
    /// columns each, `groups` lanes a row, the others further rows.
    pub along_n: bool,
    pub groups: usize,
    /// Rows of M per block (M itself where one group holds them).
    pub rows: usize,
    /// Groups of `rows` rows: ceil(M / rows), the last one partial where `rows` does not
    /// divide M.
    pub row_groups: usize,
    /// The tensor-core form ([`mma_atom`]): the prefix of the target's m16n8k16 atom whose
    /// helpers the kernel calls; `None`: CUDA cores.
    pub mma: Option<String>,
}

/// Waves per block at most in the tensor-core form: paired columns take one pair per thread
/// in the combine, 64 rows × 4 pairs.
const MMA_MAX_WAVES: usize = 8;
/// Elements of K a lane loads per step in the tensor-core form: 16 bytes of f16/bf16, two
/// k16 steps of the atom.
const MMA_LANE_K: usize = 8;

/// The target's atom for the tensor-core form of this problem, where it applies: asked for
/// (`CodegenOptions::mma_gemv`), more rows than one CUDA-core group
/// ([`GROUP_ROWS`]: fewer leave the atom's 16 rows mostly empty), f16/bf16 A and B both read
/// 16 bytes along K, no persistent plan, and an `mma.sync` m16n8k16 atom of that dtype in the
/// target's table. The kernel loads fragments straight from global memory: a lane's 8
/// consecutive K elements of a row of A and of a column of B are its A and B registers of
/// two k16 steps. The atom pairs A's and B's slots by K index within a lane, and every lane
/// holds the same four K indices in A (for each of its rows) as in B, so any fixed
/// assignment of a lane's K slots to memory is the same product, summed in another order
/// ([`mma_k_slots_agree`] checks the layouts the kernel assumes on the atom's).
pub(crate) fn mma_atom(
    p: &Problem,
    dtype: DType,
    a_vec: bool,
    b_vec: bool,
    target: &Target,
) -> Option<&'static crate::arch::mma::MmaAtom> {
    use crate::arch::mma::{MmaKind, Precision};
    if !p.mma_gemv || p.persistent || p.m <= GROUP_ROWS || !a_vec || !b_vec {
        return None;
    }
    if !matches!(dtype, DType::F16 | DType::BF16) {
        return None;
    }
    target.caps.mma.iter().copied().find(|a| {
        a.kind == MmaKind::MmaSync
            && a.precision == Precision::Exact
            && a.input == dtype
            && (a.m, a.n, a.k, a.lanes) == (16, 8, 16, 32)
            && mma_k_slots_agree(a)
    })
}

/// Whether the atom's layouts are the ones the tensor-core form's loads and stores assume
/// (`gemm_small_m.hip`, "tensor cores"), for lane `l` with g = l / 4, q = l % 4:
/// - A element e at row g + 8·((e / 2) % 2) and B element e at column g;
/// - A element e and B element 2·(e / 4) + e % 2 at the same K (the kernel fills A's register
///   r and B's register r / 2 from the same word of the lane's 16-byte loads), that K a
///   function of q and e only (the lanes of one q load the same K offsets);
/// - C element e at row g + 8·(e / 2), column 2q + e % 2.
pub(crate) fn mma_k_slots_agree(atom: &crate::arch::mma::MmaAtom) -> bool {
    if (atom.a.elems(), atom.b.elems(), atom.c.elems()) != (8, 4, 4) {
        return false;
    }
    (0..atom.lanes).all(|l| {
        let (g, q) = (l / 4, l % 4);
        let a_ok = (0..8).all(|e| {
            let (r, k) = atom.a.coord(l, e);
            let (kb, n) = atom.b.coord(l, 2 * (e / 4) + e % 2);
            r == g + 8 * ((e / 2) % 2)
                && n == g
                && k == kb
                && k == atom.a.coord(q, e).1
                && kb == atom.b.coord(q, 2 * (e / 4) + e % 2).0
        });
        let c_ok = (0..4).all(|e| atom.c.coord(l, e) == (g + 8 * (e / 2), 2 * q + e % 2));
        a_ok && c_ok
    })
}

/// Whether this kernel takes the problem: 1 to [`GROUP_ROWS`] rows always, up to [`MAX_M`]
/// where the tiled kernels' grid would be small (`ir::gemm::runs_as_gemv`, which the passes
/// that fold a norm or pair columns read too: what they produce, this kernel takes).
pub(crate) fn takes(p: &Problem) -> bool {
    crate::ir::gemm::runs_as_gemv(p.batch, p.m, p.n)
}

/// Rows per block and groups of rows for `p`: at most [`GROUP_ROWS`] a block
/// ([`PAIRED_GROUP_ROWS`] with paired columns, [`NORM_GROUP_ROWS`] in groups with a norm
/// prologue), split by [`split_rows`].
pub(crate) fn row_groups(p: &Problem) -> (usize, usize) {
    let most = if p.pair {
        PAIRED_GROUP_ROWS
    } else if p.prologue.is_some() && p.m > GROUP_ROWS {
        NORM_GROUP_ROWS
    } else {
        GROUP_ROWS
    };
    split_rows(p.m, most)
}

/// `m` rows as the fewest groups of at most `most`, the rows shared out evenly (17 by 16:
/// 9 + 8, not 16 + 1, so that the rows' sums leave room for columns): (rows a group, groups).
/// Every GEMV kernel with row groups splits its rows so (the quantized one too).
pub(crate) fn split_rows(m: usize, most: usize) -> (usize, usize) {
    let groups = m.div_ceil(most.max(1)).max(1);
    (m.div_ceil(groups).max(1), groups)
}

/// The shape of the kernel for a problem of `dtype` (A's and B's).
pub(crate) fn config(p: &Problem, gemm: &Gemm, dtype: DType, target: &Target) -> Config {
    let vec = VECTOR_BYTES / dtype.size_bytes();
    let wave = target.wave_size as usize;
    let a_vec = vectorizes(&gemm.dims, &gemm.a, Operand::A, Along::Cols, vec);
    let b_vec = vectorizes(&gemm.dims, &gemm.b, Operand::B, Along::Rows, vec);
    if let Some(atom) = mma_atom(p, dtype, a_vec, b_vec, target) {
        // One block per atom column tile (8 columns) and all M rows (≤ 64: four row tiles);
        // its waves split K in steps of 32 (a lane's 16-byte load, two k16 steps).
        let steps = p.k.div_ceil(MMA_LANE_K * 4);
        let pairs = if p.pair { p.m * atom.n as usize / 2 } else { 0 };
        let waves = steps
            .div_ceil(CHUNKS_PER_THREAD)
            .clamp(1, MAX_WAVES)
            .max(pairs.div_ceil(wave))
            .min(MMA_MAX_WAVES);
        return Config {
            cols: atom.n as usize,
            waves,
            vec,
            a_vec,
            b_vec,
            along_n: false,
            groups: 1,
            rows: p.m,
            row_groups: 1,
            mma: Some(atom.prefix()),
        };
    }
    let (rows, row_groups) = row_groups(p);
    let blocks = |cols: usize| {
        p.batch
            .saturating_mul(p.n.div_ceil(cols))
            .saturating_mul(row_groups)
    };
    let fill = p.fill_blocks;
    let waves = |per_wave: usize| {
        p.k.div_ceil(per_wave * CHUNKS_PER_THREAD)
            .clamp(1, MAX_WAVES)
    };
    // Paired columns are read K-contiguous (the interleaved weight is `[2N, K]`): the pair
    // combine takes one pair per thread, which along-N's wider blocks would exceed.
    let along_n = !p.pair
        && !b_vec
        && rows * vec <= MAX_ACC
        && vectorizes(&gemm.dims, &gemm.b, Operand::B, Along::Cols, vec);
    if along_n {
        // Two lanes a row read a whole 32-byte sector; one where that leaves the GPU idle.
        let groups = if blocks(2 * vec) >= fill { 2 } else { 1 };
        return Config {
            cols: groups * vec,
            waves: waves(wave / groups),
            vec,
            a_vec,
            b_vec,
            along_n,
            groups,
            rows,
            row_groups,
            mma: None,
        };
    }
    // Paired columns: a quarter of the sums per thread at most, the pair's combine and its
    // epilogue also live at the end (bf16 with the norm prologue spilled on gfx1100/gfx1201 at
    // 32 sums: M 16, 2 columns).
    let acc = if p.pair { MAX_ACC / 4 } else { MAX_ACC };
    let mut cols = p.max_cols.min(acc / rows).max(1);
    // Paired columns: a block holds whole pairs, so an even count (M 3 and 5 gave 5 and 3
    // columns: a pair split across blocks, its halves combined with the wrong neighbours).
    let least = if p.pair { 2 } else { 1 };
    if p.pair {
        cols -= cols % 2;
    }
    cols = cols.max(least);
    while cols > least && blocks(cols) < fill {
        cols /= 2;
        if p.pair {
            cols = (cols - cols % 2).max(least);
        }
    }
    Config {
        cols,
        // Chunks of `vec` elements of K, one per lane.
        waves: waves(wave * vec),
        vec,
        a_vec,
        b_vec,
        along_n,
        groups: 1,
        rows,
        row_groups,
        mma: None,
    }
}

/// The launch of `c` for `p`: one block per `cols` columns and group of rows (x: the row
/// group fastest, so the groups that read the same columns of B are adjacent in launch order;
/// x rather than a dimension of its own, whose 65,535 blocks an LM head's columns pass) and
/// batch index (y).
pub(crate) fn launch(
    c: &Config,
    p: &Problem,
    node: &str,
    target: &Target,
) -> Result<Launch, CodegenError> {
    let threads = c.waves * target.wave_size as usize;
    let x = p.n.div_ceil(c.cols).saturating_mul(c.row_groups);
    checked_launch(node, target, [x, p.batch, 1], threads)
}

#[derive(Serialize)]
struct Context<'a> {
    p: &'a Problem,
    c: &'a Config,
    chunks: usize,
    threads: usize,
    /// The fused argmax of the one result row (`kernel_with_argmax`); `None` for a plain GEMM.
    argmax: Option<ArgmaxTail>,
    /// The tensor-core form's packing of two normalised floats into A's 16-bit pair.
    mma_pack: &'static str,
}

/// What the argmax tail reads: C's elements as floats, and how many blocks leave a partial.
#[derive(Serialize)]
struct ArgmaxTail {
    c_pre: &'static str,
    c_post: &'static str,
    blocks: usize,
}

pub(crate) fn kernel(
    p: &Problem,
    gemm: &Gemm,
    dtype: DType,
    node: &str,
    args: Vec<BufferId>,
    target: &Target,
) -> Result<Kernel, CodegenError> {
    build(p, gemm, dtype, None, node, args, target)
}

/// How many blocks the kernel of `p` runs: the argmax tail's partials (its workspace holds two
/// f32 per block).
pub(crate) fn blocks(p: &Problem, gemm: &Gemm, dtype: DType, target: &Target) -> usize {
    let c = config(p, gemm, dtype, target);
    p.batch * p.n.div_ceil(c.cols) * c.row_groups
}

/// The kernel of a one-row problem (batch 1, M 1, unpaired) that also writes the argmax of its
/// result row to `token` (`args`: the GEMM's, then the workspace of [`blocks`] partials, the
/// counter and the token). C is still written, so logits asked for stay available; the argmax
/// reads C back as stored (`c`: its dtype), the values the unfused ArgMax reads.
pub(crate) fn kernel_with_argmax(
    p: &Problem,
    gemm: &Gemm,
    dtype: DType,
    c_dtype: DType,
    node: &str,
    args: Vec<BufferId>,
    target: &Target,
) -> Result<Kernel, CodegenError> {
    build(p, gemm, dtype, Some(c_dtype), node, args, target)
}

/// The kernel, with the argmax tail reading C as `argmax` (its dtype) where given.
fn build(
    p: &Problem,
    gemm: &Gemm,
    dtype: DType,
    argmax: Option<DType>,
    node: &str,
    args: Vec<BufferId>,
    target: &Target,
) -> Result<Kernel, CodegenError> {
    let c = config(p, gemm, dtype, target);
    let launch = launch(&c, p, node, target)?;
    let argmax = argmax.map(|c_dtype| {
        let ct = crate::codegen::ctype::ctype(c_dtype);
        ArgmaxTail {
            c_pre: ct.load_pre,
            c_post: ct.load_post,
            blocks: blocks(p, gemm, dtype, target),
        }
    });
    let ctx = Context {
        p,
        c: &c,
        chunks: p.k.div_ceil(c.vec),
        threads: launch.block[0] as usize,
        argmax,
        mma_pack: if dtype == DType::BF16 {
            "rf_pack_bf16x2"
        } else {
            "rf_pack_f16x2"
        },
    };
    finish("gemm_small_m", "gemm_small_m.hip", ctx, launch, args, node)
}
