//! Flash-decoding (`kernel_templates/flash_decode.hip`): attention for a few query rows over
//! many keys, split along the keys, the splits combined by the last block to finish.
//!
//! The prefill kernels give each (batch, query head) its own blocks of 64–128 query rows. At
//! Sq = 1 that is a handful of blocks on a GPU of a hundred or more SMs, each streaming all of
//! K/V, and every query head of a GQA group reads the same K/V again. Here one block serves all
//! `group × sq` query rows of a K/V head (K/V read once per group) over one split of the keys;
//! splits multiply the blocks until the GPU is full. Each block writes its (row, split)s'
//! unnormalised output and softmax statistics (m, l, base 2) into a workspace and counts itself
//! in its K/V head's counter; the last block of the head to count rescales and sums the splits
//! of its rows, in split order, and writes the output in its dtype. One kernel instead of a
//! kernel and a combine kernel: a launch fewer per layer and token. The counters are a
//! [`BufferRole::Counters`] buffer: zeroed once, never poisoned, put back to 0 by the kernel.
//! With a `kv_len` operand the grid has the splits of the largest context, but only the
//! splits kv_len reaches run (the kernel computes them): the others return at once, and the
//! last of the active ones to count combines the active ones.

use serde::Serialize;

use super::super::super::ctype::f32_literal;
use super::super::super::limits::launch as checked_launch;
use super::super::super::plan::{BufferId, KernelPlan, Launch};
use super::super::super::CodegenError;
use super::Problem;
use crate::arch::Target;
use crate::codegen::kernel::finish;

/// Most query rows (`group × sq`) one block holds: all rows of a K/V head in one block.
pub(crate) const MAX_ROWS: usize = 16;

/// Fewest keys a split takes when there are several: about one round of a block (every lane
/// group a few keys); shorter splits only add workspace traffic and combine work.
pub(crate) const MIN_SPLIT_KEYS: usize = 64;

/// Blocks that fill the largest targets about twice: 2 × 304 CUs of an MI300X (an H100 has
/// 132 SMs, which then hold about four of these small blocks each). Splits stop growing at
/// this many blocks.
pub(crate) const FILL_BLOCKS: usize = 2 * 304;

/// Static shared memory the kernel may take (the waves' merged output and statistics): at
/// most 48 KiB (NVIDIA's static limit), never more than the target allows statically, and at
/// most half of what a block may have, so that two blocks share an SM/CU.
const SHARED_BUDGET: usize = 48 * 1024;

fn shared_budget(target: &Target) -> usize {
    SHARED_BUDGET
        .min(target.caps.static_shared_bytes as usize)
        .min(target.caps.shared_bytes_per_block as usize / 2)
}

/// Most waves per block of kernel 1, each streaming its own keys of the split: fewer (2, 1)
/// where their merge slices (`waves × rows × Dv` floats) would not fit the shared budget.
const WAVES: usize = 4;

/// Most f32 registers a lane gives to its Q pieces and output accumulators (all rows): beyond
/// this, narrower loads spread a row over more lanes.
const LANE_FLOATS: usize = 128;

/// Registers a lane gives to the keys of a round: their K/V pieces in flight and their
/// scores (one per row), which bounds the keys loaded ahead.
const LOAD_REGS: usize = 48;

/// Most keys per lane group whose loads are in flight together.
const MAX_UNROLL: usize = 4;

/// One tiling of the split-K decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Config {
    /// Splits of the valid keys (grid y).
    pub splits: usize,
    /// Keys per split: a multiple of the block's round, and `(splits - 1) × keys_per_split`
    /// is below the valid keys, so no split starts past the last visible key.
    pub keys_per_split: usize,
    /// Waves of a block; `threads` = waves × the wave size.
    pub waves: usize,
    pub threads: usize,
    /// Elements per K/V/Q load: the widest power of two of at most 16 bytes that divides D
    /// and Dv, so that every row's pieces are aligned.
    pub vec: usize,
    /// Lanes that hold one key's row (a power of two up to the wave size).
    pub lanes_per_key: usize,
    /// Pieces of `vec` elements a lane holds of a K row and of a V row.
    pub pieces_k: usize,
    pub pieces_v: usize,
    /// Keys per lane group loaded together before the first is used.
    pub unroll: usize,
}

impl Config {
    /// Keys the block takes per round of its key loop: every lane group `unroll` keys.
    pub fn round_keys(&self, wave: usize) -> usize {
        self.waves * (wave / self.lanes_per_key) * self.unroll
    }
}

/// Keys that any query row can see: all `sk` without a causal mask; with one, up to the last
/// row's last visible key, `(sq - 1) + offset` (the offset is clamped to `[-sq, sk]`). With a
/// `kv_len` operand the bound is data: all `sk` here, `kv_len` in the kernel.
pub(crate) fn valid_keys(p: &Problem) -> usize {
    if !p.causal || !p.kv_len.is_static() {
        return p.sk;
    }
    let end = i64::try_from(p.sq)
        .unwrap_or(i64::MAX)
        .saturating_add(p.offset_text);
    usize::try_from(end.max(0)).unwrap_or(usize::MAX).min(p.sk)
}

/// Keys the splits partition: the [`valid_keys`], or with a sliding window only those from the
/// first row's window start on (the kernel starts split 0 there): `valid − (offset − window +
/// 1)` for a static offset, and at most `sq − 1 + window` with kv_len (the keys from
/// `kv_len − sq − window + 1` to `kv_len`).
pub(crate) fn span_keys(p: &Problem) -> usize {
    let valid = valid_keys(p);
    if p.window == 0 {
        return valid;
    }
    let w = usize::try_from(p.window).unwrap_or(usize::MAX);
    if p.kv_len.is_static() {
        let lo = i128::from(p.offset_text) - i128::from(p.window) + 1;
        let lo = usize::try_from(lo.max(0)).unwrap_or(usize::MAX);
        valid.saturating_sub(lo)
    } else {
        valid.min(p.sq.saturating_sub(1).saturating_add(w))
    }
}

/// Query rows one block holds: the group's heads × sq.
fn rows(p: &Problem) -> Option<usize> {
    p.group.checked_mul(p.sq)
}

/// Bytes of shared memory kernel 1 takes with `waves` waves: each wave's output rows (the
/// waves merge in one step, a slice each, summed after one barrier) and each wave's per-row
/// (m, l).
fn shared_bytes(rows: usize, p: &Problem, waves: usize) -> Option<usize> {
    let floats = waves
        .checked_mul(rows)?
        .checked_mul(p.dv)?
        .checked_add(waves.checked_mul(2)?.checked_mul(rows)?)?;
    floats.checked_mul(4)
}

/// How a lane holds the rows: (vec, lanes per key, pieces of K, pieces of V). The widest
/// aligned load whose Q and accumulator registers fit [`LANE_FLOATS`]; a row of `n` pieces
/// takes the next power of two of lanes (up to the wave), each lane `n / lanes` pieces.
fn lane_layout(rows: usize, p: &Problem, wave: usize) -> Option<(usize, usize, usize, usize)> {
    let widest = 16 / p.dtype.size_bytes().max(1);
    let mut vec = widest.max(1);
    while vec > 1 && !(p.d.is_multiple_of(vec) && p.dv.is_multiple_of(vec)) {
        vec /= 2;
    }
    loop {
        let pieces = (p.d.max(p.dv) / vec).max(1);
        let lanes = pieces.checked_next_power_of_two()?.min(wave);
        let pk = (p.d / vec).div_ceil(lanes);
        let pv = (p.dv / vec).div_ceil(lanes);
        let floats = rows.checked_mul(pk.checked_add(pv)?.checked_mul(vec)?)?;
        if floats <= LANE_FLOATS {
            return Some((vec, lanes, pk, pv));
        }
        if vec == 1 {
            return None;
        }
        vec /= 2;
    }
}

/// The configuration for a problem, or `None` where the decode kernel does not apply: more
/// than [`MAX_ROWS`] query rows per K/V head, an empty head, more Q and accumulator registers
/// per lane than [`LANE_FLOATS`] at any load width, or merged rows that do not fit in shared
/// memory. With a single query head per K/V head it is taken only when the keys split, since
/// then it reads no less K/V than the prefill kernels and only adds the combine.
#[cfg(test)]
pub(crate) fn choose(p: &Problem, target: &Target) -> Option<Config> {
    choose_for(p, target, false)
}

/// [`choose`], or with `append` the configuration even where it saves nothing over the
/// prefill kernels (one query head per K/V head, one split): the append form has no other
/// kernel.
pub(crate) fn choose_for(p: &Problem, target: &Target, append: bool) -> Option<Config> {
    let rows = rows(p)?;
    if rows == 0 || rows > MAX_ROWS || p.d == 0 || p.dv == 0 {
        return None;
    }
    // The most waves whose merge slices fit (one wave takes what the block's merged rows
    // took before the one-step merge).
    let budget = shared_budget(target);
    let waves = [WAVES, WAVES / 2, 1]
        .into_iter()
        .find(|&w| shared_bytes(rows, p, w).is_some_and(|b| b <= budget))?;
    let wave = target.wave_size as usize;
    let (vec, lanes_per_key, pieces_k, pieces_v) = lane_layout(rows, p, wave)?;
    // 32-bit registers per key of a round: its pieces (at least one each) and its scores.
    let piece_regs = (vec * p.dtype.size_bytes()).div_ceil(4).max(1);
    let key_regs = (pieces_k + pieces_v) * piece_regs + rows;
    let unroll = (LOAD_REGS / key_regs).clamp(1, MAX_UNROLL);
    let mut c = Config {
        splits: 1,
        keys_per_split: 0,
        waves,
        threads: waves * wave,
        vec,
        lanes_per_key,
        pieces_k,
        pieces_v,
        unroll,
    };
    let round = c.round_keys(wave);
    // With a window the splits share its keys only (the kernel starts them at its start).
    let valid = span_keys(p);
    let kv_blocks = p.b.checked_mul(p.hkv)?.max(1);
    let wanted = FILL_BLOCKS.div_ceil(kv_blocks);
    let most = (valid / MIN_SPLIT_KEYS.max(round)).max(1);
    let first = wanted.clamp(1, most);
    // Whole rounds per split, then as many splits as that takes: the last split is the only
    // short one, and none starts at or past `valid`.
    c.keys_per_split = valid.div_ceil(first).next_multiple_of(round).max(round);
    c.splits = valid.div_ceil(c.keys_per_split).max(1);
    if p.group == 1 && c.splits == 1 && !append {
        return None;
    }
    Some(c)
}

/// The launch geometry: one block per (batch × K/V heads, split).
pub(crate) fn launch(
    c: &Config,
    p: &Problem,
    node: &str,
    target: &Target,
) -> Result<Launch, CodegenError> {
    let kv_blocks =
        p.b.checked_mul(p.hkv)
            .ok_or_else(|| CodegenError::LaunchLimit {
                node: node.to_string(),
                what: "grid.x (batch × K/V heads)".into(),
                value: u64::MAX,
                limit: u64::from(target.limits().grid[0]),
            })?;
    checked_launch(node, target, [kv_blocks, c.splits, 1], c.threads)
}

/// f32 elements of the workspace: per output row and split, Dv partial outputs, then (m, l)
/// pairs after all of them.
fn workspace(p: &Problem, c: &Config) -> Option<(usize, usize)> {
    let pairs =
        p.b.checked_mul(p.hq)?
            .checked_mul(p.sq)?
            .checked_mul(c.splits)?;
    let partials = pairs.checked_mul(p.dv)?;
    Some((partials, partials.checked_add(pairs.checked_mul(2)?)?))
}

/// Where the keys split, appends the workspace and the arrival counters to `args` (the paged
/// kernel shares this); the offset of the (m, l) pairs in the workspace.
pub(crate) fn split_buffers(
    p: &Problem,
    c: &Config,
    node: &str,
    args: &mut Vec<BufferId>,
    plan: &mut KernelPlan,
) -> Result<usize, CodegenError> {
    let (stats_at, elems) = workspace(p, c).ok_or_else(|| CodegenError::Unsupported {
        node: node.to_string(),
        reason: "its split-K workspace is too large to address".into(),
    })?;
    if c.splits > 1 {
        args.push(plan.add_workspace(node, elems));
        // One arrival counter per block row of the grid (batch × K/V head); `launch` refuses
        // a grid whose row count overflows, so the product holds where it runs.
        args.push(plan.add_counters(node, p.b.saturating_mul(p.hkv)));
    }
    Ok(stats_at)
}

#[derive(Serialize)]
struct SplitContext<'a> {
    #[serde(flatten)]
    p: &'a Problem,
    #[serde(flatten)]
    c: Config,
    rows: usize,
    valid_keys: usize,
    /// Bytes of an element of q, k, v.
    elem: usize,
    /// scale · log2(e), folded into Q so that scores are base-2 logits.
    qscale: String,
    /// log2(e), for an additive mask in the same base.
    log2e: String,
    /// Where the (m, l) pairs start in the workspace.
    stats_at: usize,
    /// The append form (`ir::Append`): q rotated on load, this step's rows from the inputs.
    append: Option<AppendContext>,
}

/// What the append form's template takes: the rope's inverse frequencies (C double literals,
/// `ir::rope_inv_freq`), half a row, and the largest valid start (`Sk − Sq`).
#[derive(Serialize)]
pub(crate) struct AppendContext {
    pub(crate) inv_freq: Vec<String>,
    pub(crate) half: usize,
    pub(crate) max_start: usize,
}

/// The kernel, appended to `plan` with the workspace and counters it takes when the keys
/// split; `false` (nothing appended) where [`choose`] declines. `args` are q, k, v (and the
/// mask, kv_len; with `append`, then positions, k_new, v_new, start and the write's status);
/// `out` the node's buffer.
pub(crate) fn kernels(
    p: &Problem,
    node: &str,
    mut args: Vec<BufferId>,
    out: BufferId,
    target: &Target,
    plan: &mut KernelPlan,
    append: Option<AppendContext>,
) -> Result<bool, CodegenError> {
    let Some(c) = choose_for(p, target, append.is_some()) else {
        return Ok(false);
    };
    let rows = rows(p).expect("checked by choose");
    let stats_at = split_buffers(p, &c, node, &mut args, plan)?;
    args.push(out);
    let split = SplitContext {
        p,
        c,
        rows,
        valid_keys: valid_keys(p),
        elem: p.dtype.size_bytes(),
        qscale: p.scale_log2e(),
        log2e: f32_literal(std::f64::consts::LOG2_E),
        stats_at,
        append,
    };
    let kernel = finish(
        "flash_decode",
        "flash_decode.hip",
        split,
        launch(&c, p, node, target)?,
        args,
        node,
    )?;
    plan.kernels.push(kernel);
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{DType, Graph, Op};

    struct Shape {
        b: usize,
        hq: usize,
        hkv: usize,
        sq: usize,
        sk: usize,
        d: usize,
    }

    fn problem(s: &Shape, causal: Option<i64>) -> Problem {
        let mut g = Graph::new("decode");
        let dt = DType::F16;
        let q = g.input("q", dt, &[s.b, s.hq, s.sq, s.d]).unwrap();
        let k = g.input("k", dt, &[s.b, s.hkv, s.sk, s.d]).unwrap();
        let v = g.input("v", dt, &[s.b, s.hkv, s.sk, s.d]).unwrap();
        let o = g.flash_attention(q, k, v, None, 0.125, causal).unwrap();
        let Op::FlashAttention(att) = g.op(o).clone() else {
            unreachable!("a FlashAttention node")
        };
        Problem::new(&g, o, &att).unwrap()
    }

    fn smollm(sq: usize, sk: usize) -> Shape {
        Shape {
            b: 1,
            hq: 9,
            hkv: 3,
            sq,
            sk,
            d: 64,
        }
    }

    #[test]
    fn valid_keys_end_at_the_last_rows_causal_end() {
        // Sq = 3, Sk = 10: the last row (q = 2) sees keys k <= 2 + offset.
        for (causal, want) in [
            (None, 10),
            (Some(7), 10),
            (Some(2), 5),
            (Some(-1), 2),
            (Some(-3), 0),
            (Some(-1000), 0),
            (Some(1000), 10),
        ] {
            let p = problem(&smollm(3, 10), causal);
            assert_eq!(valid_keys(&p), want, "{causal:?}");
        }
    }

    /// Every split starts before the last visible key and the splits cover them all, in
    /// whole tiles; several splits are each at least MIN_SPLIT_KEYS long; the grid stops
    /// growing at about FILL_BLOCKS; shared memory and threads fit the target.
    #[test]
    fn splits_cover_the_valid_keys_and_none_is_empty() {
        let mut checked = 0;
        for arch in ["sm_90", "gfx90a", "gfx1100"] {
            let target = Target::parse(arch).unwrap();
            let wave = target.wave_size as usize;
            for (b, hq, hkv, d) in [
                (1, 9, 3, 64),
                (1, 4, 1, 128),
                (2, 8, 8, 80),
                (64, 16, 4, 64),
            ] {
                for sq in 1..=3 {
                    for sk in [0, 1, 17, 255, 256, 513, 1000, 4097, 100_003] {
                        let s = Shape {
                            b,
                            hq,
                            hkv,
                            sq,
                            sk,
                            d,
                        };
                        let sk_i = sk as i64;
                        let sq_i = sq as i64;
                        for causal in [
                            None,
                            Some(sk_i - sq_i),
                            Some(sk_i / 2 - sq_i),
                            Some(-1),
                            Some(-sq_i),
                        ] {
                            let p = problem(&s, causal);
                            let Some(c) = choose(&p, &target) else {
                                continue;
                            };
                            checked += 1;
                            let valid = valid_keys(&p);
                            let what =
                                format!("{arch} b{b} {hq}/{hkv} sq{sq} sk{sk} {causal:?}: {c:?}");
                            assert!(c.splits >= 1, "{what}");
                            assert!(
                                valid == 0 || (c.splits - 1) * c.keys_per_split < valid,
                                "{what}"
                            );
                            assert!(c.splits * c.keys_per_split >= valid, "{what}");
                            assert_eq!(c.keys_per_split % c.round_keys(wave), 0, "{what}");
                            if c.splits > 1 {
                                assert!(c.keys_per_split >= MIN_SPLIT_KEYS, "{what}");
                                assert!(c.splits <= FILL_BLOCKS.div_ceil(b * hkv), "{what}");
                            }
                            assert_eq!(c.threads % wave, 0, "{what}");
                            let rows = p.group * p.sq;
                            let bytes = shared_bytes(rows, &p, c.waves).unwrap();
                            assert!(bytes <= shared_budget(&target), "{what}");
                            assert!(
                                2 * bytes <= target.caps.shared_bytes_per_block as usize,
                                "{what}"
                            );
                            // Every piece of a row has a lane, every lane's registers fit,
                            // and the pieces are aligned loads of at most 16 bytes.
                            let lanes = c.lanes_per_key;
                            assert!(
                                lanes.is_power_of_two() && wave.is_multiple_of(lanes),
                                "{what}"
                            );
                            assert!(c.pieces_k * lanes * c.vec >= p.d, "{what}");
                            assert!(c.pieces_v * lanes * c.vec >= p.dv, "{what}");
                            assert!((c.pieces_k - 1) * lanes * c.vec < p.d, "{what}");
                            assert!(
                                p.d.is_multiple_of(c.vec) && p.dv.is_multiple_of(c.vec),
                                "{what}"
                            );
                            assert!(c.vec * p.dtype.size_bytes() <= 16, "{what}");
                            let floats = rows * (c.pieces_k + c.pieces_v) * c.vec;
                            assert!(floats <= LANE_FLOATS, "{what}");
                            assert!((1..=MAX_UNROLL).contains(&c.unroll), "{what}");
                        }
                    }
                }
            }
        }
        assert!(checked > 100, "only {checked} decode problems");
    }

    #[test]
    fn smollm_decode_splits_by_hand() {
        // f16, D 64: 16-byte pieces, 8 lanes a key, 4 keys a warp per load; Q and the
        // accumulators of 3 rows are 3 × 16 floats a lane; a key's K and V pieces are 8
        // registers and its scores 3, so 48 / 11 = 4 keys are loaded together; a round is
        // 4 warps × 4 keys × 4 = 64 keys.
        let target = Target::parse("sm_90").unwrap();
        let c = choose(&problem(&smollm(1, 4096), None), &target).unwrap();
        assert_eq!(
            (c.vec, c.lanes_per_key, c.pieces_k, c.pieces_v, c.unroll),
            (8, 8, 1, 1, 4)
        );
        assert_eq!((c.threads, c.round_keys(32)), (128, 64));
        // 3 K/V heads want ceil(608 / 3) = 203 splits; 4096 keys allow 4096 / 64 = 64 of one
        // round each.
        assert_eq!((c.splits, c.keys_per_split), (64, 64));
        // 4097 keys: 64 splits of ceil(4097 / 64) = 65 keys, 128 in whole rounds, which takes 33.
        let c = choose(&problem(&smollm(1, 4097), None), &target).unwrap();
        assert_eq!((c.splits, c.keys_per_split), (33, 128));
        // 512 keys: 8 splits of one round.
        let c = choose(&problem(&smollm(1, 512), None), &target).unwrap();
        assert_eq!((c.splits, c.keys_per_split), (8, 64));
        // 32 keys: one split, taken for the group of 3 (K/V read once for three heads).
        let c = choose(&problem(&smollm(1, 32), None), &target).unwrap();
        assert_eq!((c.splits, c.keys_per_split), (1, 64));
        // 5 positions × 3 heads = 15 rows: 16-byte pieces would be 15 × 16 floats a lane
        // (over 128); 8-byte ones spread a row over 16 lanes, 15 × 8 floats. A key then
        // takes 4 registers of pieces and 15 of scores: 48 / 19 = 2 keys loaded together.
        let c = choose(&problem(&smollm(5, 4096), None), &target).unwrap();
        assert_eq!(
            (c.vec, c.lanes_per_key, c.pieces_k, c.unroll),
            (4, 16, 1, 2)
        );
    }

    #[test]
    fn the_append_forms_bound_is_the_kernels() {
        // `passes::DecodeAppend` refuses above `ir::Append::MAX_ROWS` (it cannot see codegen);
        // the form has no other kernel, so the two bounds must be one.
        assert_eq!(MAX_ROWS, crate::ir::Append::MAX_ROWS);
    }

    #[test]
    fn declines_what_it_does_not_serve() {
        let target = Target::parse("gfx90a").unwrap();
        // 3 query heads per K/V head × 6 positions = 18 rows > 16; 5 positions fit.
        assert_eq!(choose(&problem(&smollm(6, 4097), None), &target), None);
        assert!(choose(&problem(&smollm(5, 4097), None), &target).is_some());
        let mha = |sk| Shape {
            b: 1,
            hq: 4,
            hkv: 4,
            sq: 1,
            sk,
            d: 64,
        };
        // One head per K/V head and one split (fewer keys than a round of 4 waves × 8 keys ×
        // 4 on gfx90a): nothing saved over the prefill kernels.
        assert_eq!(choose(&problem(&mha(100), None), &target), None);
        assert!(choose(&problem(&mha(4097), None), &target).is_some());
        // Causal with no visible key: a single (empty) split.
        assert_eq!(choose(&problem(&mha(4097), Some(-1)), &target), None);
    }
}
