//! The attention family: kernels for `Op::FlashAttention`. A [`Problem`] is what every kernel of
//! the family reads from the node (sizes, scale, causal offset, mask addressing, storage types);
//! `lower` picks the kernel:
//! - `decode`: flash-decoding for few query rows per K/V head (Sq·group ≤ 16), split along
//!   the keys, the splits combined by the last block of each K/V head (one kernel);
//! - `wgmma`: on sm_90a, the warpgroup-MMA FlashAttention (f16/bf16, head sizes in 64-column
//!   panels), where `CodegenOptions::wgmma_attention` asks for it (by default);
//! - `mma`: the matrix-core FlashAttention (FlashAttention-2's recipe), on the target's MMA atom
//!   for f16/bf16: mma.sync on NVIDIA, MFMA and WMMA on AMD;
//! - `simt`: f32 on CUDA cores, both products register-tiled, head sizes up to 256;
//! - `scalar`: one query row per group of lanes, f32 arithmetic, any target and dtype.

pub(crate) mod decode;
mod mma;
pub(crate) mod paged;
mod scalar;
mod simt;
mod wgmma;

pub use mma::AttentionAccess;

use std::collections::HashMap;

use serde::Serialize;

use super::super::ctype::{ctype, f32_literal, i64_literal};
use super::super::limits::{int_index, launch as checked_launch};
use super::super::plan::{Buffer, BufferId, BufferRole, IndexCheck, KernelPlan, Launch};
use super::super::{CodegenError, CodegenOptions, WgmmaAttention};
use crate::arch::tuning::{Family, TuneKey, TuneProblem};
use crate::arch::Target;
use crate::ir::{Append, Attention, DType, Graph, MaskKind, NodeId, Op, Shape, TensorType};

/// A causal offset clamped to `[-sq, sk]`, which gives the same mask: key `k` is visible from
/// query `q` when `k - q <= offset`, and `k - q` lies in `[-(sq - 1), sk - 1]`, so any offset
/// of at least `sk - 1` shows every key and any of at most `-sq` none. Clamped, `q + offset`
/// cannot overflow in a kernel, whatever offset the graph holds.
pub(crate) fn clamp_offset(offset: i64, sq: usize, sk: usize) -> i64 {
    let sq = i64::try_from(sq).unwrap_or(i64::MAX);
    let sk = i64::try_from(sk).unwrap_or(i64::MAX);
    offset.clamp(-sq, sk)
}

/// The window a kernel must apply, or `None` where it hides no key: key `k ≥ 0` is hidden from
/// query `q` only when `k ≤ q + offset − window`, so a window larger than every row's
/// `q + offset` hides nothing. With kv_len the offset is `kv_len − sq ≤ sk − sq`, so
/// `q + offset ≤ sk − 1`; without, `q + offset ≤ sq − 1 + offset` (offset clamped).
pub(crate) fn effective_window(
    window: Option<u32>,
    causal: bool,
    kv_len: bool,
    sq: usize,
    sk: usize,
    offset: i64,
) -> Option<u32> {
    let w = window.filter(|_| causal)?;
    let last = if kv_len {
        i128::try_from(sk).unwrap_or(i128::MAX) - 1
    } else {
        i128::try_from(sq).unwrap_or(i128::MAX) - 1 + i128::from(offset)
    };
    (i128::from(w) <= last).then_some(w)
}

/// Where an attention kernel's number of valid keys comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KvLen {
    /// Every one of the `sk` keys is valid (no `kv_len` operand).
    Static,
    /// One `kv_len` element for every batch.
    Shared,
    /// One `kv_len` element per batch.
    PerBatch,
}

impl KvLen {
    pub(crate) fn is_static(self) -> bool {
        self == KvLen::Static
    }
}

/// The templates test `{% if kv_len %}` and `kv_len == "batch"`: "" is falsy there, so the
/// enum reaches them as the strings they were written against.
impl Serialize for KvLen {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match self {
            KvLen::Static => "",
            KvLen::Shared => "one",
            KvLen::PerBatch => "batch",
        })
    }
}

/// The mask kind as the templates test it (`{% if mask %}`, `mask == "additive"`): "" for none.
fn mask_template<S: serde::Serializer>(m: &MaskKind, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match m {
        MaskKind::None => "",
        MaskKind::Additive => "additive",
        MaskKind::Boolean => "boolean",
    })
}

/// What every attention kernel needs to know about the node. Serialised flat into each
/// kernel's template context (`{{ sq }}`, `{{ mask }}`, ...).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Problem {
    /// q [b, hq, sq, d], k [b, hkv, sk, d], v [b, hkv, sk, dv]; `group` query heads share a
    /// K/V head.
    pub b: usize,
    pub hq: usize,
    pub hkv: usize,
    pub group: usize,
    pub sq: usize,
    pub sk: usize,
    pub d: usize,
    pub dv: usize,
    #[serde(skip)]
    pub dtype: DType,
    pub scale: f64,
    /// The scale as a C float literal.
    pub scale_f: String,
    pub causal: bool,
    /// The clamped causal offset, as a C literal and as a number (for comments).
    pub offset: String,
    pub offset_text: i64,
    /// The sliding window (`Attention::window`), 0 for none: templates test `{% if window %}`
    /// and skip the key tiles wholly before `row + offset − window + 1`. A window that hides
    /// no key of this problem ([`effective_window`]) is 0 here, so such a node gets the
    /// unwindowed kernel.
    pub window: u64,
    /// The mask operand's kind (`None` also where the node has no mask operand); templates
    /// read it as "" / "additive" / "boolean".
    #[serde(serialize_with = "mask_template")]
    pub mask: MaskKind,
    pub mask_ctype: &'static str,
    pub mask_load_pre: &'static str,
    pub mask_load_post: &'static str,
    /// The mask's strides over (b, h, q, k), broadcast axes 0.
    pub ms: Vec<usize>,
    /// Where the number of valid keys comes from; with a `kv_len` operand the kernel reads
    /// `kvn`, the valid keys, from it (after the mask).
    pub kv_len: KvLen,
    /// The key loops' bound as C: `sk`, or the kernel's `kvn`.
    pub keys: String,
    pub ctype: &'static str,
    pub load_pre: &'static str,
    pub load_post: &'static str,
    pub store_pre: &'static str,
    pub store_post: &'static str,
}

impl Problem {
    pub(crate) fn new(g: &Graph, id: NodeId, att: &Attention) -> Result<Problem, CodegenError> {
        let name = &g.node(id).name;
        let ops = g.operands(id);
        let (q, k, v) = (g.ty(ops[0]), g.ty(ops[1]), g.ty(ops[2]));
        let [b, hq, sq, d] = q.shape.dims()[..] else {
            unreachable!("rank 4 by inference")
        };
        let [_, hkv, sk, _] = k.shape.dims()[..] else {
            unreachable!("rank 4 by inference")
        };
        let dv = v.shape.dims()[3];
        for (what, value) in [
            ("the query length (Sq)", sq),
            ("the key length (Sk)", sk),
            ("the head size (D)", d),
            ("the value head size (Dv)", dv),
        ] {
            int_index(name, what, value)?;
        }
        let c = ctype(q.dtype);
        let (mask, mask_t, ms) = match (att.mask, ops.get(3)) {
            (MaskKind::None, _) | (_, None) => (MaskKind::None, DType::F32, vec![0usize; 4]),
            (kind, Some(&m)) => {
                let mt = g.ty(m);
                let padded = Shape(
                    std::iter::repeat_n(1, 4 - mt.shape.rank())
                        .chain(mt.shape.dims().iter().copied())
                        .collect(),
                );
                let strides = padded.broadcast_strides(&Shape::new(vec![b, hq, sq, sk]));
                (kind, mt.dtype, strides)
            }
        };
        let mc = ctype(mask_t);
        let kv_len = match att.kv_len_slot().map(|slot| g.ty(ops[slot]).shape.numel()) {
            None => KvLen::Static,
            Some(1) => KvLen::Shared,
            _ => KvLen::PerBatch,
        };
        // With kv_len the offset is the kernel's `kv_off` (kv_len − Sq, in [-Sq, Sk]); the
        // attribute is 0 (inference), so the number below only names it in comments.
        let offset = clamp_offset(att.causal_offset, sq, sk);
        Ok(Problem {
            b,
            hq,
            hkv,
            group: hq / hkv.max(1),
            sq,
            sk,
            d,
            dv,
            dtype: q.dtype,
            scale: att.scale,
            scale_f: f32_literal(att.scale),
            causal: att.causal,
            window: effective_window(att.window, att.causal, att.kv_len, sq, sk, offset)
                .map_or(0, u64::from),
            offset: if att.kv_len {
                "kv_off".to_string()
            } else {
                i64_literal(offset)
            },
            offset_text: offset,
            mask,
            mask_ctype: mc.storage,
            mask_load_pre: mc.load_pre,
            mask_load_post: mc.load_post,
            ms,
            kv_len,
            keys: if att.kv_len {
                "kvn".to_string()
            } else {
                sk.to_string()
            },
            ctype: c.storage,
            load_pre: c.load_pre,
            load_post: c.load_post,
            store_pre: c.store_pre,
            store_post: c.store_post,
        })
    }

    /// The scale times log2(e), as a C float literal: every kernel of the family computes the
    /// softmax in base 2, with the scale folded into the exponent's multiply.
    pub(crate) fn scale_log2e(&self) -> String {
        f32_literal(self.scale * std::f64::consts::LOG2_E)
    }

    /// The launch of a kernel that tiles the queries: grid x over (batch, head), y over tiles of
    /// `block_m` query rows, `threads` per block (the prefill kernels' shared geometry).
    pub(crate) fn query_tiles_launch(
        &self,
        block_m: usize,
        threads: usize,
        node: &str,
        target: &Target,
    ) -> Result<Launch, CodegenError> {
        checked_launch(
            node,
            target,
            [self.heads(node, target)?, self.sq.div_ceil(block_m), 1],
            threads,
        )
    }

    /// What a tiling's speed depends on, for `family`: sizes, dtype, causality and the mask.
    pub(crate) fn tune_key(&self, family: Family) -> TuneKey {
        TuneKey {
            family,
            problem: TuneProblem::Attention {
                dtype: self.dtype,
                b: self.b,
                hq: self.hq,
                hkv: self.hkv,
                sq: self.sq,
                sk: self.sk,
                d: self.d,
                dv: self.dv,
                causal: self.causal,
                mask: self.mask.into(),
                window: u32::try_from(self.window).ok().filter(|&w| w > 0),
            },
        }
    }

    /// Batch × query heads: grid x of every kernel of the family.
    pub(crate) fn heads(&self, node: &str, target: &Target) -> Result<usize, CodegenError> {
        self.b
            .checked_mul(self.hq)
            .ok_or_else(|| CodegenError::LaunchLimit {
                node: node.to_string(),
                what: "grid.x (batch × heads)".into(),
                value: u64::MAX,
                limit: u64::from(target.limits().grid[0]),
            })
    }
}

/// The kernels for FlashAttention node `id` (operands q, k, v and the mask, then the result),
/// appended to `plan`: the split-K decode kernel (with its workspace) where few query rows meet
/// many keys, else the matrix-core kernel where the target has an atom, else the scalar one.
/// `options` may limit the matrix-core kernel's memory-access choices (tests) and hold tuned
/// configurations.
pub(crate) fn lower(
    g: &Graph,
    id: NodeId,
    att: &Attention,
    buf: &HashMap<NodeId, BufferId>,
    target: &Target,
    plan: &mut KernelPlan,
    options: &CodegenOptions,
) -> Result<(), CodegenError> {
    let (access, tuned) = (options.attention_access, &options.tuned);
    let node = &g.node(id).name;
    if let Some(ap) = &att.append {
        return lower_append(g, id, att, ap, buf, target, plan);
    }
    let p = Problem::new(g, id, att)?;
    let mut args: Vec<BufferId> = g.operands(id).iter().map(|o| buf[o]).collect();
    let out = buf[&id];
    if decode::kernels(&p, node, args.clone(), out, target, plan, None)? {
        return Ok(());
    }
    args.push(out);
    let wgmma = if options.wgmma_attention != WgmmaAttention::Off && access.is_none() {
        wgmma::kernel(
            &p,
            node,
            args.clone(),
            target,
            tuned,
            options.wgmma_attention,
        )?
    } else {
        None
    };
    let tf32_asked = p.dtype == DType::F32 && options.f32_matmul == crate::codegen::F32Matmul::Tf32;
    let kernel = if let Some(k) = wgmma {
        k
    } else if let Some(k) = mma::kernel(
        &p,
        node,
        args.clone(),
        target,
        access,
        tuned,
        options.f32_matmul,
    )? {
        k
    } else {
        // f32 that asked for TF32 and found no atom or configuration for it: exact f32, and the
        // plan says so.
        if tf32_asked {
            plan.notes
                .push(super::gemm::tf32_fallback_note(node, target));
        }
        if let Some(k) = simt::kernel(&p, node, args.clone(), target, tuned)? {
            k
        } else {
            scalar::kernel(&p, node, args, target)?
        }
    };
    plan.kernels.push(kernel);
    Ok(())
}

/// Whether `id` is realised inside an appending attention's kernel, so has no kernel of its
/// own: a cache write (contiguous or paged) read only by such an attention (flash or paged), as
/// its k or v (the kernel writes this step's rows into the cache or pool), or a rope read only
/// by such a write as its rows (Llama 3's k, and every paged k: the kernel rotates them in
/// registers).
pub(crate) fn realised_by_append(g: &Graph, id: NodeId) -> bool {
    let sole_reader = |id: NodeId| match g.consumers(id)[..] {
        [c] if g.use_count(id) == 1 && !g.is_output(id) => Some(c),
        _ => None,
    };
    match g.op(id) {
        Op::CacheWrite { .. } => sole_reader(id).is_some_and(|a| {
            matches!(g.op(a), Op::FlashAttention(att) if att.append.is_some())
                && g.operands(a)[1..3].contains(&id)
        }),
        Op::PagedCacheWrite => sole_reader(id).is_some_and(|a| {
            matches!(
                g.op(a),
                Op::PagedAttention {
                    append: Some(_),
                    ..
                }
            ) && g.operands(a)[1..3].contains(&id)
        }),
        Op::Rope { .. } => sole_reader(id).is_some_and(|w| {
            matches!(
                g.op(w),
                Op::CacheWrite { rope: None, .. } | Op::PagedCacheWrite
            ) && g.operands(w)[1] == id
                && realised_by_append(g, w)
        }),
        _ => false,
    }
}

/// The append form (`ir::Append`): the decode kernel rotates q on load, takes this step's K/V
/// rows from their operands and writes them into the caches (the cache writes, read only by
/// it, have no kernel: [`realised_by_append`]); the start is checked as the cache write's
/// kernel checks it (a status buffer naming the first write). No other kernel of the family
/// reads the extra operands, so a problem the decode kernel does not serve is a typed error.
fn lower_append(
    g: &Graph,
    id: NodeId,
    att: &Attention,
    ap: &Append,
    buf: &HashMap<NodeId, BufferId>,
    target: &Target,
    plan: &mut KernelPlan,
) -> Result<(), CodegenError> {
    let node = &g.node(id).name;
    let p = Problem::new(g, id, att)?;
    let ops = g.operands(id);
    for &w in &ops[1..3] {
        if !realised_by_append(g, w) {
            return Err(CodegenError::Unsupported {
                node: node.clone(),
                reason: format!(
                    "the appending attention's cache `{}` is not a cache write read only by it",
                    g.node(w).name
                ),
            });
        }
    }
    // The write the interpreter runs first names the error of a start outside the cache.
    let order = g.topo_order().map_err(|e| CodegenError::Unsupported {
        node: node.clone(),
        reason: e.to_string(),
    })?;
    let first = *order
        .iter()
        .find(|o| ops[1..3].contains(o))
        .expect("the writes are in the graph");
    let status = plan.buffers.len();
    plan.buffers.push(Buffer {
        id: status,
        name: g.node(first).name.clone(),
        ty: TensorType::new(DType::I64, vec![2]),
        role: BufferRole::Status,
    });
    plan.checks.push(IndexCheck {
        node: g.node(first).name.clone(),
        table_rows: p.sk,
        status,
        write_rows: Some(p.sq),
    });
    let append = decode::AppendContext {
        inv_freq: super::rope::inv_freq_literals(ap.theta, p.d, &ap.factors, node)?,
        half: (p.d / 2).max(1),
        // Inference keeps the written rows within the cache (Sq ≤ Sk).
        max_start: p.sk - p.sq,
    };
    let mut args: Vec<BufferId> = ops.iter().map(|o| buf[o]).collect();
    args.push(status);
    if decode::kernels(&p, node, args, buf[&id], target, plan, Some(append))? {
        return Ok(());
    }
    Err(CodegenError::Unsupported {
        node: node.clone(),
        reason: format!(
            "the decode kernel does not serve this appending attention ({} query rows per K/V \
             head, head size {}); no other attention kernel takes the append form",
            p.group * p.sq,
            p.d
        ),
    })
}
