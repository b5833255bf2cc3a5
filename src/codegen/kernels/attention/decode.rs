//! Flash-decoding (`kernel_templates/flash_decode.hip`, `flash_decode_combine.hip`): attention
//! for a few query rows over many keys, split along the keys with a combine step.
//!
//! The prefill kernels give each (batch, query head) its own blocks of 64–128 query rows. At
//! Sq = 1 that is a handful of blocks on a GPU of a hundred or more SMs, each streaming all of
//! K/V, and every query head of a GQA group reads the same K/V again. Here one block serves all
//! `group × sq` query rows of a K/V head (K/V read once per group) over one split of the keys;
//! splits multiply the blocks until the GPU is full. Kernel 1 writes each (row, split)'s
//! unnormalised output and its softmax statistics (m, l, base 2) into a workspace; kernel 2
//! rescales and sums the splits of a row and writes the output in its dtype.

use serde::Serialize;

use super::super::super::ctype::f32_literal;
use super::super::super::limits::launch as checked_launch;
use super::super::super::lower::finish;
use super::super::super::plan::{BufferId, Kernel, Launch};
use super::super::super::{CodegenError, Target};
use super::Problem;

/// Most query rows (`group × sq`) one block holds: all rows of a K/V head fit one tile.
pub(crate) const MAX_ROWS: usize = 16;

/// Fewest keys a split takes when there are several: below a few hundred keys a split's
/// fixed costs (its Q tile, the workspace round trip, the combine) outweigh what it streams.
pub(crate) const MIN_SPLIT_KEYS: usize = 256;

/// Blocks that fill the largest targets about twice: 2 × 304 CUs of an MI300X (an H100 has
/// 132 SMs). Splits stop growing at this many blocks.
pub(crate) const FILL_BLOCKS: usize = 2 * 304;

/// Most keys per K/V tile in shared memory.
const MAX_BLOCK_N: usize = 64;

/// Static shared memory the kernel may take: at most 48 KiB (NVIDIA's static limit) so that
/// several blocks share an SM, and never more than the target has.
const SHARED_BUDGET: usize = 48 * 1024;

/// Waves per block of kernel 1 (each takes rows of the online-softmax step).
const WAVES: usize = 4;

/// Most output accumulators a thread holds in registers (rows × Dv over the block).
const MAX_PER_THREAD: usize = 32;

/// One tiling of the split-K decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Config {
    /// Splits of the valid keys (grid y of kernel 1).
    pub splits: usize,
    /// Keys per split: a multiple of `block_n`, and `(splits - 1) × keys_per_split` is below
    /// the valid keys, so no split starts past the last visible key.
    pub keys_per_split: usize,
    /// Keys per K/V tile staged in shared memory.
    pub block_n: usize,
    /// Threads of kernel 1 and of the combine.
    pub threads: usize,
    pub combine_threads: usize,
    /// Elements per K/V load: 16 bytes where every row starts 16-byte aligned, else 1.
    pub vec: usize,
}

/// Keys that any query row can see: all `sk` without a causal mask; with one, up to the last
/// row's last visible key, `(sq - 1) + offset` (the offset is clamped to `[-sq, sk]`).
pub(crate) fn valid_keys(p: &Problem) -> usize {
    if !p.causal {
        return p.sk;
    }
    let end = i64::try_from(p.sq)
        .unwrap_or(i64::MAX)
        .saturating_add(p.offset_text);
    usize::try_from(end.max(0)).unwrap_or(usize::MAX).min(p.sk)
}

/// Query rows one block holds: the group's heads × sq.
fn rows(p: &Problem) -> Option<usize> {
    p.group.checked_mul(p.sq)
}

/// Bytes of shared memory a tile of `block_n` keys takes: Q rows, K (padded a column so the
/// lanes of the score step, one key each, hit distinct banks), V, the scores, and the three
/// per-row statistics.
fn shared_bytes(rows: usize, p: &Problem, block_n: usize) -> Option<usize> {
    let floats = rows
        .checked_mul(p.d)?
        .checked_add(block_n.checked_mul(p.d.checked_add(1)?)?)?
        .checked_add(block_n.checked_mul(p.dv)?)?
        .checked_add(block_n.checked_mul(rows)?)?
        .checked_add(3 * rows)?;
    floats.checked_mul(4)
}

/// The configuration for a problem, or `None` where the decode kernel does not apply: more
/// than [`MAX_ROWS`] query rows per K/V head, an empty head, or tiles that do not fit in shared
/// memory, or more accumulators per thread than [`MAX_PER_THREAD`]. With a single query head per K/V head it is taken only when the keys split, since
/// then it reads no less K/V than the prefill kernels and only adds the combine.
pub(crate) fn choose(p: &Problem, target: &Target) -> Option<Config> {
    let rows = rows(p)?;
    if rows == 0 || rows > MAX_ROWS || p.d == 0 || p.dv == 0 {
        return None;
    }
    let budget = SHARED_BUDGET.min(target.caps.static_shared_bytes as usize);
    let block_n = [MAX_BLOCK_N, 32, 16, 8]
        .into_iter()
        .find(|&n| shared_bytes(rows, p, n).is_some_and(|b| b <= budget))?;
    let valid = valid_keys(p);
    let kv_blocks = p.b.checked_mul(p.hkv)?.max(1);
    let wanted = FILL_BLOCKS.div_ceil(kv_blocks);
    let most = (valid / MIN_SPLIT_KEYS).max(1);
    let first = wanted.clamp(1, most);
    // Whole tiles per split, then as many splits as that takes: the last split is the only
    // short one, and none starts at or past `valid`.
    let keys_per_split = valid.div_ceil(first).next_multiple_of(block_n).max(block_n);
    let splits = valid.div_ceil(keys_per_split).max(1);
    if p.group == 1 && splits == 1 {
        return None;
    }
    let wave = target.wave_size as usize;
    if (rows * p.dv).div_ceil(WAVES * wave) > MAX_PER_THREAD {
        return None;
    }
    let elem = p.dtype.size_bytes();
    let per16 = 16 / elem.max(1);
    let vec = if per16 > 1 && p.d % per16 == 0 && p.dv % per16 == 0 {
        per16
    } else {
        1
    };
    Some(Config {
        splits,
        keys_per_split,
        block_n,
        threads: WAVES * wave,
        combine_threads: p.dv.div_ceil(wave).clamp(1, WAVES) * wave,
        vec,
    })
}

/// The launch geometry of both kernels: kernel 1 over (batch × K/V heads, splits), the
/// combine one block per output row.
pub(crate) fn launch(
    c: &Config,
    p: &Problem,
    node: &str,
    target: &Target,
) -> Result<[Launch; 2], CodegenError> {
    let too_many = |what: &str| CodegenError::LaunchLimit {
        node: node.to_string(),
        what: what.into(),
        value: u64::MAX,
        limit: u64::from(target.limits().grid[0]),
    };
    let kv_blocks = p
        .b
        .checked_mul(p.hkv)
        .ok_or_else(|| too_many("grid.x (batch × K/V heads)"))?;
    let out_rows = p
        .heads(node, target)?
        .checked_mul(p.sq)
        .ok_or_else(|| too_many("grid.x (output rows)"))?;
    Ok([
        checked_launch(node, target, [kv_blocks, c.splits, 1], c.threads)?,
        checked_launch(node, target, [out_rows, 1, 1], c.combine_threads)?,
    ])
}

/// f32 elements of the workspace: per output row and split, Dv partial outputs, then (m, l)
/// pairs after all of them.
fn workspace(p: &Problem, c: &Config) -> Option<(usize, usize)> {
    let pairs = p.b.checked_mul(p.hq)?.checked_mul(p.sq)?.checked_mul(c.splits)?;
    let partials = pairs.checked_mul(p.dv)?;
    Some((partials, partials.checked_add(pairs.checked_mul(2)?)?))
}

#[derive(Serialize)]
struct SplitContext<'a> {
    #[serde(flatten)]
    p: &'a Problem,
    #[serde(flatten)]
    c: Config,
    rows: usize,
    valid_keys: usize,
    /// Outputs (row, column) each thread accumulates.
    per_thread: usize,
    /// scale · log2(e), folded into Q so that scores are base-2 logits.
    qscale: String,
    /// log2(e), for an additive mask in the same base.
    log2e: String,
    /// Where the (m, l) pairs start in the workspace.
    stats_at: usize,
}

#[derive(Serialize)]
struct CombineContext<'a> {
    #[serde(flatten)]
    p: &'a Problem,
    splits: usize,
    threads: usize,
    stats_at: usize,
}

/// The two kernels and the workspace they share, or `None` where [`choose`] declines.
/// `args` are q, k, v (and the mask); `out` the node's buffer; `add_workspace` makes the
/// workspace buffer of the given f32 elements.
pub(crate) fn kernels(
    p: &Problem,
    node: &str,
    args: Vec<BufferId>,
    out: BufferId,
    target: &Target,
    add_workspace: impl FnOnce(usize) -> BufferId,
) -> Result<Option<Vec<Kernel>>, CodegenError> {
    let Some(c) = choose(p, target) else {
        return Ok(None);
    };
    let rows = rows(p).expect("checked by choose");
    let [split_launch, combine_launch] = launch(&c, p, node, target)?;
    let (stats_at, elems) = workspace(p, &c).ok_or_else(|| CodegenError::Unsupported {
        node: node.to_string(),
        reason: "its split-K workspace is too large to address".into(),
    })?;
    let ws = add_workspace(elems);
    let split = SplitContext {
        p,
        c,
        rows,
        valid_keys: valid_keys(p),
        per_thread: (rows * p.dv).div_ceil(c.threads),
        qscale: f32_literal(p.scale * std::f64::consts::LOG2_E),
        log2e: f32_literal(std::f64::consts::LOG2_E),
        stats_at,
    };
    let mut split_args = args;
    split_args.push(ws);
    let first = finish(
        "flash_decode",
        "flash_decode.hip",
        serde_json::to_value(split).expect("a context serialises"),
        split_launch,
        split_args,
        node,
    )?;
    let combine = CombineContext {
        p,
        splits: c.splits,
        threads: c.combine_threads,
        stats_at,
    };
    let second = finish(
        "flash_decode_combine",
        "flash_decode_combine.hip",
        serde_json::to_value(combine).expect("a context serialises"),
        combine_launch,
        vec![ws, out],
        node,
    )?;
    Ok(Some(vec![first, second]))
}
