//! The paged KV cache's kernels: `Op::PagedCacheWrite` (`kernel_templates/paged_write.hip`)
//! and `Op::PagedAttention` (`kernel_templates/paged_decode.hip`).
//!
//! The attention is flash-decoding over blocks: the split decode kernel's structure and tiling
//! (`decode.rs`: one block per (sequence, K/V head, split) serving the head group's rows, splits
//! over the key range, the last block of a head merging them in one step), with every key's row
//! found through the sequence's block table instead of at a fixed stride. The configuration is
//! the decode kernel's for the same problem read as a contiguous one of `max_blocks ·
//! block_size` keys with `kv_len` per sequence, causal with the queries the last s. Where the
//! decode kernel would decline (more than `decode::MAX_ROWS` query rows per K/V head), so does
//! this one, with a typed error: the op is for decode steps.
//!
//! Out-of-range data never reaches memory outside the buffers: a slot outside the pool writes
//! nothing, kv_len is clamped to the table's keys, and a key whose block id lies outside the
//! pool is invisible (docs/ops.md; the interpreter reports these as errors instead).

use std::collections::HashMap;

use serde::Serialize;

use super::super::super::ctype::{ctype, f32_literal};
use super::super::super::limits::{int_index, launch_1d};
use super::super::super::plan::{BufferId, KernelPlan};
use super::super::super::CodegenError;
use super::decode::{self, Config};
use super::{KvLen, Problem};
use crate::arch::Target;
use crate::codegen::kernel::finish;
use crate::ir::{Append, DType, Graph, MaskKind, NodeId};

#[derive(Serialize)]
struct WriteContext {
    ctype: &'static str,
    /// New rows per sequence, sequences, K/V heads, row size, block size, pool rows.
    s: usize,
    b: usize,
    hkv: usize,
    d: usize,
    block_size: usize,
    capacity: usize,
    /// Elements of the values; threads (at least one).
    n: usize,
    threads: usize,
}

/// Appends the kernel of paged write `id` (operands pool, values, slots); its buffer is the
/// pool's (aliased by `lower`).
pub(crate) fn paged_write(
    g: &Graph,
    id: NodeId,
    ops: &[NodeId],
    buf: &HashMap<NodeId, BufferId>,
    target: &Target,
    plan: &mut KernelPlan,
) -> Result<(), CodegenError> {
    let name = &g.node(id).name;
    let (pool, values) = (g.ty(ops[0]), g.ty(ops[1]));
    let [num_blocks, hkv, block_size, d] = pool.shape.dims()[..] else {
        unreachable!("rank 4 by inference")
    };
    let [b, _, s, _] = values.shape.dims()[..] else {
        unreachable!("rank 4 by inference")
    };
    let n = values.shape.numel();
    int_index(name, "the pool's elements", pool.shape.numel())?;
    int_index(name, "the values' elements", n)?;
    let ctx = WriteContext {
        ctype: ctype(pool.dtype).storage,
        s: s.max(1),
        b,
        hkv: hkv.max(1),
        d: d.max(1),
        block_size: block_size.max(1),
        capacity: num_blocks * block_size,
        n,
        threads: n.max(1),
    };
    let args = vec![buf[&ops[1]], buf[&ops[2]], buf[&id]];
    plan.kernels.push(finish(
        "paged_cache_write",
        "paged_write.hip",
        ctx,
        launch_1d(name, target, n.max(1))?,
        args,
        name,
    )?);
    Ok(())
}

#[derive(Serialize)]
struct DecodeContext<'a> {
    #[serde(flatten)]
    p: &'a Problem,
    #[serde(flatten)]
    c: Config,
    rows: usize,
    /// Keys a split covers at most in all: a full table's (`kvn` bounds them at run time).
    valid_keys: usize,
    elem: usize,
    qscale: String,
    stats_at: usize,
    num_blocks: usize,
    block_size: usize,
    max_blocks: usize,
    /// The append form (`ir::Append`): q rotated on load, this step's rows from the inputs and
    /// written into the pools.
    append: Option<decode::AppendContext>,
}

/// The attention problem of paged node `id` as the decode kernel's: q's sizes, `sk` the keys a
/// table can name, kv_len per sequence, causal at `kv_len − s`.
fn problem(
    g: &Graph,
    id: NodeId,
    (scale, window): (f64, Option<u32>),
) -> Result<(Problem, [usize; 3]), CodegenError> {
    let name = &g.node(id).name;
    let ops = g.operands(id);
    let (q, k, v, table) = (g.ty(ops[0]), g.ty(ops[1]), g.ty(ops[2]), g.ty(ops[3]));
    // The output's sizes: the append form's q holds the same rows as `[1, Hq, B·s, D]`.
    let [b, hq, sq, _] = g.ty(id).shape.dims()[..] else {
        unreachable!("rank 4 by inference")
    };
    let d = q.shape.dims()[3];
    let [num_blocks, hkv, block_size, _] = k.shape.dims()[..] else {
        unreachable!("rank 4 by inference")
    };
    let dv = v.shape.dims()[3];
    let max_blocks = table.shape.dims()[1];
    let sk = max_blocks
        .checked_mul(block_size)
        .ok_or_else(|| CodegenError::Unsupported {
            node: name.clone(),
            reason: "its block table names more keys than can be counted".into(),
        })?;
    for (what, value) in [
        ("the query length (s)", sq),
        ("the keys of a block table", sk),
        ("the head size (D)", d),
        ("the value head size (Dv)", dv),
        ("the pool's elements", k.shape.numel().max(v.shape.numel())),
    ] {
        int_index(name, what, value)?;
    }
    let c = ctype(q.dtype);
    let m = ctype(DType::F32);
    let p = Problem {
        b,
        hq,
        hkv,
        group: hq / hkv.max(1),
        sq,
        sk,
        d,
        dv,
        dtype: q.dtype,
        scale,
        scale_f: f32_literal(scale),
        causal: true,
        offset: "kv_off".to_string(),
        offset_text: 0,
        window: super::effective_window(window, true, true, sq, sk, 0).map_or(0, u64::from),
        mask: MaskKind::None,
        mask_ctype: m.storage,
        mask_load_pre: m.load_pre,
        mask_load_post: m.load_post,
        ms: vec![0; 4],
        kv_len: KvLen::PerBatch,
        keys: "kvn".to_string(),
        ctype: c.storage,
        load_pre: c.load_pre,
        load_post: c.load_post,
        store_pre: c.store_pre,
        store_post: c.store_post,
    };
    Ok((p, [num_blocks, block_size, max_blocks]))
}

/// Appends the kernel of paged attention `id` (operands q, k pool, v pool, table, kv_len, and
/// with `append` positions, k_new, v_new, slots), with the workspace and counters it takes
/// when the keys split. In the append form the pools' paged cache writes, read only by this
/// attention, have no kernel (`realised_by_append`): this one writes their rows.
pub(crate) fn paged_attention(
    g: &Graph,
    id: NodeId,
    scale: (f64, Option<u32>),
    append: Option<&Append>,
    buf: &HashMap<NodeId, BufferId>,
    target: &Target,
    plan: &mut KernelPlan,
) -> Result<(), CodegenError> {
    let name = &g.node(id).name;
    let (p, [num_blocks, block_size, max_blocks]) = problem(g, id, scale)?;
    let append = match append {
        None => None,
        Some(ap) => {
            let ops = g.operands(id);
            for &w in &ops[1..3] {
                if !super::realised_by_append(g, w) {
                    return Err(CodegenError::Unsupported {
                        node: name.clone(),
                        reason: format!(
                            "the appending paged attention's pool `{}` is not a paged cache \
                             write read only by it",
                            g.node(w).name
                        ),
                    });
                }
            }
            int_index(name, "this step's rows", p.b * p.sq)?;
            Some(decode::AppendContext {
                inv_freq: super::super::rope::inv_freq_literals(ap.theta, p.d, &ap.factors, name)?,
                half: (p.d / 2).max(1),
                // Unused by the paged template: a slot outside the pool writes nothing.
                max_start: 0,
            })
        }
    };
    let empty = p.b * p.hq * p.sq * p.dv == 0;
    if empty {
        // No output element: nothing to launch.
        return Ok(());
    }
    // The append flag takes the decode tiling even for one query head per K/V head and one
    // split: this op has no other kernel.
    let c = decode::choose_for(&p, target, true).ok_or_else(|| CodegenError::Unsupported {
        node: name.clone(),
        reason: format!(
            "paged attention serves at most {} query rows per K/V head (heads per group × s), \
             got {} × {}",
            decode::MAX_ROWS,
            p.group,
            p.sq
        ),
    })?;
    let rows = p.group * p.sq;
    let mut args: Vec<BufferId> = g.operands(id).iter().map(|o| buf[o]).collect();
    let stats_at = decode::split_buffers(&p, &c, name, &mut args, plan)?;
    args.push(buf[&id]);
    let ctx = DecodeContext {
        p: &p,
        c,
        rows,
        valid_keys: p.sk,
        elem: p.dtype.size_bytes(),
        qscale: p.scale_log2e(),
        stats_at,
        num_blocks,
        block_size,
        max_blocks,
        append,
    };
    let launch = decode::launch(&c, &p, name, target)?;
    plan.kernels.push(finish(
        "paged_decode",
        "paged_decode.hip",
        ctx,
        launch,
        args,
        name,
    )?);
    Ok(())
}
