//! One decode step of a small GQA attention layer with a KV cache held as state (the example
//! graph `graphs/decode_step.json`), and the same layer over a whole prompt without state (a
//! prefill), so that decoding token by token through the cache can be checked against it.
#![allow(dead_code)]

use rocmforge::ir::{DType, Graph, NodeId, Sample};

/// Sizes of the layer: odd everywhere, 9 query heads over 3 K/V heads.
#[derive(Clone, Copy, Debug)]
pub struct Layer {
    pub hidden: usize,
    pub hq: usize,
    pub hkv: usize,
    pub d: usize,
    /// Positions the cache holds.
    pub max_ctx: usize,
    pub vocab: usize,
    pub theta: f64,
}

pub const SMALL: Layer = Layer {
    hidden: 40,
    hq: 9,
    hkv: 3,
    d: 16,
    max_ctx: 37,
    vocab: 29,
    theta: 100000.0,
};

impl Layer {
    fn scale(&self) -> f64 {
        1.0 / (self.d as f64).sqrt()
    }

    /// Projects `x` [1, S, hidden] to heads [1, H, S, d] with weight `w`.
    fn heads(&self, g: &mut Graph, x: NodeId, w: &str, h: usize, s: usize) -> NodeId {
        let w = g.weight(w, DType::F32, &[self.hidden, h * self.d]).unwrap();
        let y = g.matmul(x, w).unwrap();
        let y = g
            .reshape(y, &[1, s as i64, h as i64, self.d as i64])
            .unwrap();
        g.permute(y, &[0, 2, 1, 3]).unwrap()
    }

    /// Attention output [1, hq, S, d] → logits [1, S, vocab] and the argmax token ids [1, S].
    fn head_out(&self, g: &mut Graph, att: NodeId, s: usize) -> (NodeId, NodeId) {
        let a = g.permute(att, &[0, 2, 1, 3]).unwrap();
        let a = g
            .reshape(a, &[1, s as i64, (self.hq * self.d) as i64])
            .unwrap();
        let wo = g
            .weight("w_out", DType::F32, &[self.hq * self.d, self.vocab])
            .unwrap();
        let logits = g.matmul(a, wo).unwrap();
        g.rename(logits, "logits").unwrap();
        let token = g.argmax(logits, -1).unwrap();
        g.rename(token, "token").unwrap();
        (logits, token)
    }

    /// One decode step: input `x` [1, 1, hidden] at position `pos` (i32 [1]), with `kv_len`
    /// (i32 [1], pos + 1) valid keys after the write; states `k_cache`, `v_cache`
    /// [1, hkv, max_ctx, d]. Outputs the logits and the token id.
    pub fn decode_step(&self) -> Graph {
        let mut g = Graph::new("decode_step");
        g.description = format!(
            "One decode step of a GQA attention layer ({} query heads over {} K/V heads of {}) with its KV cache \
             as state ({} positions): projections, rope at the position `pos` holds, the new K/V written into the \
             cache at `pos`, attention over the `kv_len` valid keys, the output projection and the argmax token",
            self.hq, self.hkv, self.d, self.max_ctx
        );
        let x = g.input("x", DType::F32, &[1, 1, self.hidden]).unwrap();
        let last = self.max_ctx as i64 - 1;
        let pos = g
            .input_sampled(
                "pos",
                DType::I32,
                &[1],
                Sample::Range { low: 0, high: last },
            )
            .unwrap();
        let kv_len = g
            .input_sampled(
                "kv_len",
                DType::I32,
                &[1],
                Sample::Range {
                    low: 1,
                    high: last + 1,
                },
            )
            .unwrap();
        let shape = [1, self.hkv, self.max_ctx, self.d];
        let k_cache = g.state("k_cache", DType::F32, &shape).unwrap();
        let v_cache = g.state("v_cache", DType::F32, &shape).unwrap();
        let q = self.heads(&mut g, x, "w_q", self.hq, 1);
        let k = self.heads(&mut g, x, "w_k", self.hkv, 1);
        let v = self.heads(&mut g, x, "w_v", self.hkv, 1);
        let q = g.rope_at(q, pos, self.theta).unwrap();
        let k = g.rope_at(k, pos, self.theta).unwrap();
        let k_all = g.cache_write(k_cache, k, pos, 2).unwrap();
        g.rename(k_all, "k_cache_next").unwrap();
        let v_all = g.cache_write(v_cache, v, pos, 2).unwrap();
        g.rename(v_all, "v_cache_next").unwrap();
        let att = g
            .flash_attention_len((q, k_all, v_all), kv_len, self.scale(), true)
            .unwrap();
        let (logits, token) = self.head_out(&mut g, att, 1);
        g.set_outputs(&[logits, token]).unwrap();
        g
    }

    /// The same layer over `s` positions at once, causal, no state: its logits at position
    /// `t` are what the decode step gives at `t` after steps 0..t wrote the cache.
    pub fn prefill(&self, s: usize) -> Graph {
        let mut g = Graph::new("prefill");
        let x = g.input("x", DType::F32, &[1, s, self.hidden]).unwrap();
        let q = self.heads(&mut g, x, "w_q", self.hq, s);
        let k = self.heads(&mut g, x, "w_k", self.hkv, s);
        let v = self.heads(&mut g, x, "w_v", self.hkv, s);
        let q = g.rope(q, self.theta, 0).unwrap();
        let k = g.rope(k, self.theta, 0).unwrap();
        let att = g
            .flash_attention(q, k, v, None, self.scale(), Some(0))
            .unwrap();
        let (logits, token) = self.head_out(&mut g, att, s);
        g.set_outputs(&[logits, token]).unwrap();
        g
    }
}
