//! Writes the example graphs in `graphs/` with the builder API:
//! `cargo run --example write_graphs [-- DIR]`. The files are the source of truth afterwards; this
//! is how they were made, in the form models write them (unfused, decomposed where models
//! decompose).

use std::path::PathBuf;

use rocmforge::ir::{format, DType, Graph, GraphError, Init, NodeId, Sample};

type R<T> = Result<T, GraphError>;

/// `[B, S, H·D]` → `[B, H, S, D]`.
fn split_heads(g: &mut Graph, x: NodeId, b: usize, s: usize, h: usize, d: usize) -> R<NodeId> {
    let r = g.reshape(x, &[b as i64, s as i64, h as i64, d as i64])?;
    g.permute(r, &[0, 2, 1, 3])
}

/// `[B, H, S, D]` → `[B, S, H·D]`.
fn merge_heads(g: &mut Graph, x: NodeId, b: usize, s: usize, hd: usize) -> R<NodeId> {
    let p = g.permute(x, &[0, 2, 1, 3])?;
    g.reshape(p, &[b as i64, s as i64, hd as i64])
}

fn linear(
    g: &mut Graph,
    x: NodeId,
    prefix: &str,
    din: usize,
    dout: usize,
    bias: bool,
) -> R<NodeId> {
    let w = g.weight(&format!("{prefix}.weight"), DType::F32, &[din, dout])?;
    let y = g.matmul(x, w)?;
    if !bias {
        return Ok(y);
    }
    let b = g.weight(&format!("{prefix}.bias"), DType::F32, &[dout])?;
    g.add(y, b)
}

/// LLaMA's repeat_kv: `[B, Hkv, S, D]` → `[B, Hkv·n, S, D]` by Reshape → Expand → Reshape.
fn repeat_kv(
    g: &mut Graph,
    x: NodeId,
    b: usize,
    hkv: usize,
    n: usize,
    s: usize,
    d: usize,
) -> R<NodeId> {
    let r = g.reshape(x, &[b as i64, hkv as i64, 1, s as i64, d as i64])?;
    let e = g.expand(r, &[b, hkv, n, s, d])?;
    g.reshape(e, &[b as i64, (hkv * n) as i64, s as i64, d as i64])
}

fn qkv_inputs(g: &mut Graph, q: [usize; 4], kv: [usize; 4]) -> R<(NodeId, NodeId, NodeId)> {
    Ok((
        g.input("q", DType::F32, &q)?,
        g.input("k", DType::F32, &kv)?,
        g.input("v", DType::F32, &kv)?,
    ))
}

fn attention() -> R<Graph> {
    let mut g = Graph::new("attention");
    g.description = "Unfused scaled dot-product attention: softmax(Q·Kᵀ/√D)·V".into();
    let (q, k, v) = qkv_inputs(&mut g, [2, 4, 64, 32], [2, 4, 64, 32])?;
    let kt = g.permute(k, &[0, 1, 3, 2])?;
    let s = g.matmul(q, kt)?;
    let c = g.scalar(1.0 / 32f64.sqrt(), DType::F32)?;
    let scaled = g.mul(s, c)?;
    let p = g.softmax(scaled, -1)?;
    let o = g.matmul(p, v)?;
    g.rename(o, "out")?;
    g.add_output(o)?;
    Ok(g)
}

fn attention_causal() -> R<Graph> {
    let mut g = Graph::new("attention_causal");
    g.description = "Causal attention: scores masked with Where(CausalMask, S, -inf)".into();
    let (q, k, v) = qkv_inputs(&mut g, [2, 4, 64, 32], [2, 4, 64, 32])?;
    let kt = g.permute(k, &[0, 1, 3, 2])?;
    let s = g.matmul(q, kt)?;
    let c = g.scalar(1.0 / 32f64.sqrt(), DType::F32)?;
    let scaled = g.mul(s, c)?;
    let mask = g.causal_mask(64, 64, 0)?;
    let ninf = g.scalar(f64::NEG_INFINITY, DType::F32)?;
    let masked = g.where_(mask, scaled, ninf)?;
    let p = g.softmax(masked, -1)?;
    let o = g.matmul(p, v)?;
    g.rename(o, "out")?;
    g.add_output(o)?;
    Ok(g)
}

fn attention_padding_mask() -> R<Graph> {
    let mut g = Graph::new("attention_padding_mask");
    g.description = "Attention with an additive padding mask built as (1 - mask)·min(f32) from a [B, Sk] 0/1 mask".into();
    let (q, k, v) = qkv_inputs(&mut g, [2, 4, 64, 32], [2, 4, 64, 32])?;
    let mask = g.input_sampled("attention_mask", DType::F32, &[2, 64], Sample::PaddingMask)?;
    let m4 = g.reshape(mask, &[2, 1, 1, 64])?;
    let one = g.scalar(1.0, DType::F32)?;
    let inv = g.sub(one, m4)?;
    let big = g.scalar(DType::F32.min_value(), DType::F32)?;
    let additive = g.mul(inv, big)?;
    let kt = g.permute(k, &[0, 1, 3, 2])?;
    let s = g.matmul(q, kt)?;
    let c = g.scalar(32f64.sqrt(), DType::F32)?;
    let scaled = g.div(s, c)?;
    let masked = g.add(scaled, additive)?;
    let p = g.softmax(masked, -1)?;
    let o = g.matmul(p, v)?;
    g.rename(o, "out")?;
    g.add_output(o)?;
    Ok(g)
}

fn gqa_attention() -> R<Graph> {
    let mut g = Graph::new("gqa_attention");
    g.description =
        "Grouped-query attention: 8 query heads over 2 K/V heads expanded as LLaMA's repeat_kv"
            .into();
    let (q, k, v) = qkv_inputs(&mut g, [1, 8, 64, 32], [1, 2, 64, 32])?;
    let kr = repeat_kv(&mut g, k, 1, 2, 4, 64, 32)?;
    let vr = repeat_kv(&mut g, v, 1, 2, 4, 64, 32)?;
    let kt = g.permute(kr, &[0, 1, 3, 2])?;
    let s = g.matmul(q, kt)?;
    let c = g.scalar(1.0 / 32f64.sqrt(), DType::F32)?;
    let scaled = g.mul(s, c)?;
    let p = g.softmax(scaled, -1)?;
    let o = g.matmul(p, vr)?;
    g.rename(o, "out")?;
    g.add_output(o)?;
    Ok(g)
}

fn bert_layer() -> R<Graph> {
    let (b, s, hidden, heads, ffn) = (2usize, 128usize, 384usize, 12usize, 1536usize);
    let d = hidden / heads;
    let mut g = Graph::new("bert_layer");
    g.description =
        "One BERT encoder layer at all-MiniLM-L6-v2 sizes, written as HF BertLayer computes it"
            .into();
    let x = g.input("hidden_states", DType::F32, &[b, s, hidden])?;
    let mask = g.input_sampled("attention_mask", DType::F32, &[b, s], Sample::PaddingMask)?;
    let m4 = g.reshape(mask, &[b as i64, 1, 1, s as i64])?;
    let one = g.scalar(1.0, DType::F32)?;
    let inv = g.sub(one, m4)?;
    let min = g.scalar(DType::F32.min_value(), DType::F32)?;
    let ext = g.mul(inv, min)?;

    let q = linear(&mut g, x, "attention.self.query", hidden, hidden, true)?;
    let k = linear(&mut g, x, "attention.self.key", hidden, hidden, true)?;
    let v = linear(&mut g, x, "attention.self.value", hidden, hidden, true)?;
    let (q, k, v) = (
        split_heads(&mut g, q, b, s, heads, d)?,
        split_heads(&mut g, k, b, s, heads, d)?,
        split_heads(&mut g, v, b, s, heads, d)?,
    );
    let kt = g.permute(k, &[0, 1, 3, 2])?;
    let scores = g.matmul(q, kt)?;
    let root = g.scalar((d as f64).sqrt(), DType::F32)?;
    let scaled = g.div(scores, root)?;
    let masked = g.add(scaled, ext)?;
    let probs = g.softmax(masked, -1)?;
    let ctx = g.matmul(probs, v)?;
    let ctx = merge_heads(&mut g, ctx, b, s, hidden)?;
    let attn_out = linear(&mut g, ctx, "attention.output.dense", hidden, hidden, true)?;
    let res1 = g.add(attn_out, x)?;
    let ln1_w = g.weight_init(
        "attention.output.LayerNorm.weight",
        DType::F32,
        &[hidden],
        Init::Ones,
    )?;
    let ln1_b = g.weight_init(
        "attention.output.LayerNorm.bias",
        DType::F32,
        &[hidden],
        Init::Zeros,
    )?;
    let h = g.layer_norm(res1, ln1_w, ln1_b, 1e-12)?;

    let up = linear(&mut g, h, "intermediate.dense", hidden, ffn, true)?;
    let act = g.gelu(up)?;
    let down = linear(&mut g, act, "output.dense", ffn, hidden, true)?;
    let res2 = g.add(down, h)?;
    let ln2_w = g.weight_init("output.LayerNorm.weight", DType::F32, &[hidden], Init::Ones)?;
    let ln2_b = g.weight_init("output.LayerNorm.bias", DType::F32, &[hidden], Init::Zeros)?;
    let out = g.layer_norm(res2, ln2_w, ln2_b, 1e-12)?;
    g.rename(out, "out")?;
    g.add_output(out)?;
    Ok(g)
}

/// LlamaRMSNorm as HF writes it: x · rsqrt(mean(x²) + eps) · weight.
fn rms_norm_decomposed(g: &mut Graph, x: NodeId, name: &str, dim: usize, eps: f64) -> R<NodeId> {
    let two = g.scalar(2.0, DType::F32)?;
    let sq = g.pow(x, two)?;
    let mean = g.reduce(rocmforge::ir::ReduceOp::Mean, sq, &[-1], true)?;
    let e = g.scalar(eps, DType::F32)?;
    let shifted = g.add(mean, e)?;
    let inv = g.rsqrt(shifted)?;
    let normed = g.mul(x, inv)?;
    let w = g.weight_init(name, DType::F32, &[dim], Init::Ones)?;
    g.mul(normed, w)
}

fn llama_block() -> R<Graph> {
    let (b, s, hidden, hq, hkv, d, ffn) = (
        1usize, 128usize, 576usize, 9usize, 3usize, 64usize, 1536usize,
    );
    let (theta, eps) = (100000.0, 1e-5);
    let mut g = Graph::new("llama_block");
    g.description = "One LLaMA decoder block at SmolLM2-135M sizes, written as HF LlamaDecoderLayer computes it".into();
    let x = g.input("hidden_states", DType::F32, &[b, s, hidden])?;
    let h = rms_norm_decomposed(&mut g, x, "input_layernorm.weight", hidden, eps)?;
    let q = linear(&mut g, h, "self_attn.q_proj", hidden, hq * d, false)?;
    let k = linear(&mut g, h, "self_attn.k_proj", hidden, hkv * d, false)?;
    let v = linear(&mut g, h, "self_attn.v_proj", hidden, hkv * d, false)?;
    let q = split_heads(&mut g, q, b, s, hq, d)?;
    let k = split_heads(&mut g, k, b, s, hkv, d)?;
    let v = split_heads(&mut g, v, b, s, hkv, d)?;
    let q = g.rope(q, theta, 0)?;
    let k = g.rope(k, theta, 0)?;
    let k = repeat_kv(&mut g, k, b, hkv, hq / hkv, s, d)?;
    let v = repeat_kv(&mut g, v, b, hkv, hq / hkv, s, d)?;
    let kt = g.permute(k, &[0, 1, 3, 2])?;
    let scores = g.matmul(q, kt)?;
    let scale = g.scalar(1.0 / (d as f64).sqrt(), DType::F32)?;
    let scaled = g.mul(scores, scale)?;
    let causal = g.causal_mask(s, s, 0)?;
    let ninf = g.scalar(f64::NEG_INFINITY, DType::F32)?;
    let masked = g.where_(causal, scaled, ninf)?;
    let probs = g.softmax(masked, -1)?;
    let ctx = g.matmul(probs, v)?;
    let ctx = merge_heads(&mut g, ctx, b, s, hq * d)?;
    let o = linear(&mut g, ctx, "self_attn.o_proj", hq * d, hidden, false)?;
    let res1 = g.add(x, o)?;
    let h2 = rms_norm_decomposed(&mut g, res1, "post_attention_layernorm.weight", hidden, eps)?;
    let gate = linear(&mut g, h2, "mlp.gate_proj", hidden, ffn, false)?;
    let up = linear(&mut g, h2, "mlp.up_proj", hidden, ffn, false)?;
    let sig = g.sigmoid(gate)?;
    let silu = g.mul(gate, sig)?;
    let act = g.mul(silu, up)?;
    let down = linear(&mut g, act, "mlp.down_proj", ffn, hidden, false)?;
    let out = g.add(res1, down)?;
    g.rename(out, "out")?;
    g.add_output(out)?;
    Ok(g)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "graphs".into()));
    std::fs::create_dir_all(&dir)?;
    let graphs = [
        attention()?,
        attention_causal()?,
        attention_padding_mask()?,
        gqa_attention()?,
        bert_layer()?,
        llama_block()?,
    ];
    for g in graphs {
        g.validate()?;
        let path = dir.join(format!("{}.json", g.name));
        format::save(&g, &path)?;
        println!("wrote {} ({} nodes)", path.display(), g.node_count());
    }
    Ok(())
}
