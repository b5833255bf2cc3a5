//! Building blocks of transformer decoders, written with the IR's ops the way PyTorch modules
//! compute them, so the passes find the same patterns in every model (the GEMM pass reads a
//! weight's transpose in place; the attention pass fuses QKᵀ → scale → mask → softmax → ·V,
//! K and V read un-expanded under GQA).
//!
//! Weights are PyTorch-shaped (`[out, in]` for a linear layer) and named by the caller.

use crate::ir::{DType, Graph, GraphError, Init, NodeId};

/// `x · Wᵀ` for a bias-free linear layer stored `[dout, din]`.
pub fn linear(
    g: &mut Graph,
    x: NodeId,
    weight: &str,
    din: usize,
    dout: usize,
    dt: DType,
) -> Result<NodeId, GraphError> {
    let w = g.weight(weight, dt, &[dout, din])?;
    let wt = g.permute(w, &[1, 0])?;
    g.matmul(x, wt)
}

/// RMSNorm over the last axis with a learned scale of `dim` values.
pub fn rms_norm(
    g: &mut Graph,
    x: NodeId,
    weight: &str,
    dim: usize,
    eps: f64,
    dt: DType,
) -> Result<NodeId, GraphError> {
    let w = g.weight_init(weight, dt, &[dim], Init::Ones)?;
    g.rms_norm(x, w, eps)
}

/// The weights of a SwiGLU MLP: `down(silu(gate(x)) · up(x))`.
pub struct SwiGlu<'a> {
    pub gate: &'a str,
    pub up: &'a str,
    pub down: &'a str,
    pub hidden: usize,
    pub ffn: usize,
}

pub fn swiglu(g: &mut Graph, x: NodeId, m: &SwiGlu<'_>, dt: DType) -> Result<NodeId, GraphError> {
    let gate = linear(g, x, m.gate, m.hidden, m.ffn, dt)?;
    let up = linear(g, x, m.up, m.hidden, m.ffn, dt)?;
    let act = g.silu(gate)?;
    let h = g.mul(act, up)?;
    linear(g, h, m.down, m.ffn, m.hidden, dt)
}

/// Head counts and size of a multi-head attention with grouped K/V heads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heads {
    pub q: usize,
    pub kv: usize,
    pub dim: usize,
}

/// `[B, S, H·D]` → `[B, H, S, D]`.
pub fn split_heads(
    g: &mut Graph,
    x: NodeId,
    b: usize,
    s: usize,
    heads: usize,
    d: usize,
) -> Result<NodeId, GraphError> {
    let r = g.reshape(x, &[b as i64, s as i64, heads as i64, d as i64])?;
    g.permute(r, &[0, 2, 1, 3])
}

/// `[B, H, S, D]` → `[B, S, H·D]`.
pub fn merge_heads(
    g: &mut Graph,
    x: NodeId,
    b: usize,
    s: usize,
    heads: usize,
    d: usize,
) -> Result<NodeId, GraphError> {
    let p = g.permute(x, &[0, 2, 1, 3])?;
    g.reshape(p, &[b as i64, s as i64, (heads * d) as i64])
}

/// `[B, Hkv, S, D]` → `[B, Hkv·group, S, D]`, each K/V head serving `group` query heads in a
/// row (transformers' `repeat_kv`: reshape, expand, reshape, which the attention pass reads
/// un-expanded).
pub fn repeat_kv(
    g: &mut Graph,
    x: NodeId,
    b: usize,
    kv: usize,
    group: usize,
    s: usize,
    d: usize,
) -> Result<NodeId, GraphError> {
    if group == 1 {
        return Ok(x);
    }
    let r = g.reshape(x, &[b as i64, kv as i64, 1, s as i64, d as i64])?;
    let e = g.expand(r, &[b, kv, group, s, d])?;
    g.reshape(e, &[b as i64, (kv * group) as i64, s as i64, d as i64])
}

/// Scaled dot-product attention with GQA: `q [B, Hq, Sq, D]` against `k`, `v`
/// `[B, Hkv, Sk, D]`, causal with query `i` seeing keys `j ≤ i + causal_offset` (0 for a
/// whole prompt; `Sk − Sq` when the keys include `Sk − Sq` earlier positions). The keys and
/// values are whatever the caller passes: this step's projections for a full prefill, or a
/// cache's contents for a decoder that keeps one. Returns `[B, Sq, Hq·D]`.
#[allow(clippy::too_many_arguments)]
pub fn causal_attention(
    g: &mut Graph,
    q: NodeId,
    k: NodeId,
    v: NodeId,
    heads: Heads,
    b: usize,
    sq: usize,
    sk: usize,
    causal_offset: i64,
    dt: DType,
) -> Result<NodeId, GraphError> {
    let group = heads.q / heads.kv;
    let k = repeat_kv(g, k, b, heads.kv, group, sk, heads.dim)?;
    let v = repeat_kv(g, v, b, heads.kv, group, sk, heads.dim)?;
    let kt = g.permute(k, &[0, 1, 3, 2])?;
    let scores = g.matmul(q, kt)?;
    let scale = g.scalar(1.0 / (heads.dim as f64).sqrt(), dt)?;
    let scaled = g.mul(scores, scale)?;
    let keep = g.causal_mask(sq, sk, causal_offset)?;
    let neg = g.scalar(f64::NEG_INFINITY, dt)?;
    let masked = g.where_(keep, scaled, neg)?;
    let probs = g.softmax(masked, -1)?;
    let ctx = g.matmul(probs, v)?;
    merge_heads(g, ctx, b, sq, heads.q, heads.dim)
}
