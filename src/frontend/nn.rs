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

/// `x + b` for a bias `bias` of `dim` values over the last axis (an add the GEMM pass folds
/// into the projection's epilogue).
pub fn bias(
    g: &mut Graph,
    x: NodeId,
    bias: &str,
    dim: usize,
    dt: DType,
) -> Result<NodeId, GraphError> {
    let b = g.weight_init(bias, dt, &[dim], Init::Zeros)?;
    g.add(x, b)
}

/// `[.., n]` → its consecutive parts of `sizes` along the last axis (a fused projection's
/// outputs: Phi-3's Q/K/V, or gate and up).
pub fn split_last(g: &mut Graph, x: NodeId, sizes: &[usize]) -> Result<Vec<NodeId>, GraphError> {
    let mut start = 0i64;
    sizes
        .iter()
        .map(|&n| {
            let part = g.slice(x, -1, start, start + n as i64);
            start += n as i64;
            part
        })
        .collect()
}

/// How a decoder rotates positions: rope over the leading `rotary_dim` of each head of
/// `head_dim` (the rest pass through, Phi-3's partial rotary), each pair's frequency divided by
/// its entry of `factors` (Llama 3's rope scaling; empty for none).
#[derive(Clone, Debug, PartialEq)]
pub struct RopeSpec {
    pub theta: f64,
    pub head_dim: usize,
    pub rotary_dim: usize,
    pub factors: Vec<f64>,
}

/// Rope by `spec` over `x` `[.., S, head_dim]` at positions `0..S`, or those `positions`
/// (i32 `[S]`) holds.
pub fn rope(
    g: &mut Graph,
    x: NodeId,
    positions: Option<NodeId>,
    spec: &RopeSpec,
) -> Result<NodeId, GraphError> {
    let (theta, factors) = (spec.theta, spec.factors.clone());
    if spec.rotary_dim == spec.head_dim {
        return g.rope_scaled(x, positions, theta, 0, factors);
    }
    let rd = spec.rotary_dim as i64;
    let rot = g.slice(x, -1, 0, rd)?;
    let pass = g.slice(x, -1, rd, spec.head_dim as i64)?;
    let rot = g.rope_scaled(rot, positions, theta, 0, factors)?;
    g.concat(&[rot, pass], -1)
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
/// whole prompt; `Sk − Sq` when the keys include `Sk − Sq` earlier positions), and with a
/// sliding `window` only keys `j > i + causal_offset − window` (Mistral's, as transformers
/// masks it: a query sees itself and the `window − 1` keys before it). A window that hides a
/// key is lowered straight to a FlashAttention with the window attribute (`Attention::window`:
/// its kernels skip the key tiles before the window) rather than to a dense mask the attention
/// pass would have to recognise; without one the unfused form below is what the pass fuses.
/// The keys and
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
    window: Option<usize>,
    dt: DType,
) -> Result<NodeId, GraphError> {
    if let Some(w) = window_u32(window, sk as i64 + causal_offset.max(0)) {
        // q [B, Hq, Sq, D] against the un-expanded k, v [B, Hkv, Sk, D]: the op reads GQA.
        let scale = 1.0 / (heads.dim as f64).sqrt();
        let ctx = g.flash_attention_windowed((q, k, v), None, scale, causal_offset, Some(w))?;
        return merge_heads(g, ctx, b, sq, heads.q, heads.dim);
    }
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

/// The window as the attention attribute, where it hides a key: `None` when it reaches past
/// `reach` (the largest `q + offset + 1`, so every key is in it) or past `u32::MAX` (no
/// position that far exists: positions are i32).
pub fn window_u32(window: Option<usize>, reach: i64) -> Option<u32> {
    let w = window.filter(|&w| i64::try_from(w).is_ok_and(|w| w < reach))?;
    u32::try_from(w).ok()
}

/// Attention of a step's queries `q [1, Hq, s, D]` over the first `kv_len` rows of caches `k`,
/// `v` `[1, Hkv, max, D]` (row `j` holds position `j`), causal (the queries the last `s` of
/// the kv_len positions), and with a sliding `window` to keys `j > kv_len − s + i − window`
/// (the attribute: the kernels skip the cache rows before it). Returns `[1, Hq, s, D]`.
#[allow(clippy::too_many_arguments)]
pub fn cached_attention(
    g: &mut Graph,
    (q, k, v): (NodeId, NodeId, NodeId),
    kv_len: NodeId,
    max: usize,
    d: usize,
    window: Option<usize>,
) -> Result<NodeId, GraphError> {
    let scale = 1.0 / (d as f64).sqrt();
    match window_u32(window, max as i64) {
        None => g.flash_attention_len((q, k, v), kv_len, scale, true),
        Some(w) => g.flash_attention_windowed((q, k, v), Some(kv_len), scale, 0, Some(w)),
    }
}
