//! GGUF files written field by field for tests and fuzz seeds, and a tiny LLaMA model in that
//! format: hidden 32, 2 query heads and 1 K/V head of 16, FFN 64, 1 layer, a byte-level BPE
//! vocabulary of the 256 byte symbols, 4 merges and 2 control tokens; its tensors in every
//! type the reader supports, filled from a fixed seed. Small enough (about 20 KB) to load,
//! tokenize and interpret in every fuzz iteration.
#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One metadata value, encoded.
#[derive(Clone, Debug)]
pub enum Kv {
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    Strs(Vec<String>),
    I32s(Vec<i32>),
}

impl Kv {
    fn encode(&self, out: &mut Vec<u8>) {
        let string = |out: &mut Vec<u8>, s: &str| {
            out.extend((s.len() as u64).to_le_bytes());
            out.extend(s.as_bytes());
        };
        match self {
            Kv::U32(v) => {
                out.extend(4u32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            Kv::I32(v) => {
                out.extend(5u32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            Kv::F32(v) => {
                out.extend(6u32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            Kv::Bool(v) => {
                out.extend(7u32.to_le_bytes());
                out.push(u8::from(*v));
            }
            Kv::Str(s) => {
                out.extend(8u32.to_le_bytes());
                string(out, s);
            }
            Kv::Strs(v) => {
                out.extend(9u32.to_le_bytes());
                out.extend(8u32.to_le_bytes());
                out.extend((v.len() as u64).to_le_bytes());
                v.iter().for_each(|s| string(out, s));
            }
            Kv::I32s(v) => {
                out.extend(9u32.to_le_bytes());
                out.extend(5u32.to_le_bytes());
                out.extend((v.len() as u64).to_le_bytes());
                v.iter().for_each(|x| out.extend(x.to_le_bytes()));
            }
        }
    }
}

/// A tensor: name, PyTorch-order shape, ggml type id, stored bytes.
#[derive(Clone, Debug)]
pub struct RawTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub type_id: u32,
    pub bytes: Vec<u8>,
}

#[derive(Clone, Debug)]
pub struct GgufFile {
    pub version: u32,
    pub alignment: usize,
    pub kvs: Vec<(String, Kv)>,
    pub tensors: Vec<RawTensor>,
}

impl GgufFile {
    pub fn set(&mut self, key: &str, v: Kv) -> &mut Self {
        match self.kvs.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = v,
            None => self.kvs.push((key.into(), v)),
        }
        self
    }

    pub fn remove(&mut self, key: &str) -> &mut Self {
        self.kvs.retain(|(k, _)| k != key);
        self
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.kvs.len() as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            out.extend((k.len() as u64).to_le_bytes());
            out.extend(k.as_bytes());
            v.encode(&mut out);
        }
        let align = |n: usize| n.div_ceil(self.alignment) * self.alignment;
        let mut offset = 0;
        for t in &self.tensors {
            out.extend((t.name.len() as u64).to_le_bytes());
            out.extend(t.name.as_bytes());
            out.extend((t.shape.len() as u32).to_le_bytes());
            t.shape
                .iter()
                .rev()
                .for_each(|&d| out.extend((d as u64).to_le_bytes()));
            out.extend(t.type_id.to_le_bytes());
            out.extend((offset as u64).to_le_bytes());
            offset = align(offset + t.bytes.len());
        }
        out.resize(align(out.len()), 0);
        for t in &self.tensors {
            out.extend(&t.bytes);
            out.resize(align(out.len()), 0);
        }
        out
    }
}

/// GPT-2's byte → symbol map (printable bytes stand for themselves, the rest are shifted past
/// 255), so every byte has a token.
pub fn byte_symbols() -> Vec<String> {
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut shift = 0;
    (0..256u32)
        .map(|b| {
            let c = if printable(b) {
                b
            } else {
                shift += 1;
                255 + shift
            };
            char::from_u32(c).expect("a char").to_string()
        })
        .collect()
}

fn f16(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_le_bytes()
}

/// Blocks of `ty` (0 F32, 1 F16, 2 Q4_0, 3 Q4_1, 8 Q8_0, 30 BF16) for `n` values drawn from
/// `rng`, scaled around `scale`.
fn random_bytes(rng: &mut ChaCha8Rng, ty: u32, n: usize, scale: f32) -> Vec<u8> {
    let mut out = Vec::new();
    match ty {
        0 => {
            (0..n).for_each(|_| out.extend((rng.random_range(-1.0..1.0f32) * scale).to_le_bytes()))
        }
        1 => (0..n).for_each(|_| out.extend(f16(rng.random_range(-1.0..1.0f32) * scale))),
        30 => (0..n).for_each(|_| {
            out.extend(half::bf16::from_f32(rng.random_range(-1.0..1.0f32) * scale).to_le_bytes())
        }),
        2 | 3 | 8 => {
            for _ in 0..n / 32 {
                out.extend(f16(scale / 8.0 * rng.random_range(0.5..1.0f32)));
                if ty == 3 {
                    out.extend(f16(-scale * rng.random_range(0.5..1.0f32)));
                }
                let packed = if ty == 8 { 32 } else { 16 };
                (0..packed).for_each(|_| out.push(rng.random()));
            }
        }
        _ => panic!("no writer for type {ty}"),
    }
    out
}

pub const TINY_HIDDEN: usize = 32;
pub const TINY_VOCAB: usize = 256 + 4 + 2;

/// The tiny LLaMA model (see the module comment).
pub fn tiny_llama() -> GgufFile {
    let mut rng = ChaCha8Rng::seed_from_u64(15);
    let h = TINY_HIDDEN;
    let (heads, kv, d, ffn) = (2usize, 1usize, 16usize, 64usize);
    let mut tokens = vec!["<|endoftext|>".to_string(), "<|im_start|>".to_string()];
    tokens.extend(byte_symbols());
    let merges = ["h e", "l l", "he ll", "Ġ w"];
    tokens.extend(merges.iter().map(|m| m.replace(' ', "")));
    let mut types = vec![3, 3];
    types.extend(std::iter::repeat_n(1, tokens.len() - 2));
    let vocab = tokens.len();
    assert_eq!(vocab, TINY_VOCAB);
    let kvs = vec![
        ("general.architecture".into(), Kv::Str("llama".into())),
        ("general.alignment".into(), Kv::U32(32)),
        ("llama.block_count".into(), Kv::U32(1)),
        ("llama.context_length".into(), Kv::U32(64)),
        ("llama.embedding_length".into(), Kv::U32(h as u32)),
        ("llama.feed_forward_length".into(), Kv::U32(ffn as u32)),
        ("llama.attention.head_count".into(), Kv::U32(heads as u32)),
        ("llama.attention.head_count_kv".into(), Kv::U32(kv as u32)),
        ("llama.rope.freq_base".into(), Kv::F32(100000.0)),
        (
            "llama.attention.layer_norm_rms_epsilon".into(),
            Kv::F32(1e-5),
        ),
        ("llama.rope.dimension_count".into(), Kv::U32(d as u32)),
        ("tokenizer.ggml.model".into(), Kv::Str("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Kv::Str("smollm".into())),
        ("tokenizer.ggml.tokens".into(), Kv::Strs(tokens)),
        ("tokenizer.ggml.token_type".into(), Kv::I32s(types)),
        (
            "tokenizer.ggml.merges".into(),
            Kv::Strs(merges.iter().map(|m| m.to_string()).collect()),
        ),
        ("tokenizer.ggml.add_bos_token".into(), Kv::Bool(false)),
        ("tokenizer.ggml.bos_token_id".into(), Kv::U32(1)),
        ("tokenizer.ggml.eos_token_id".into(), Kv::U32(0)),
        (
            "tokenizer.chat_template".into(),
            Kv::Str("{% for m in messages %}{{ m['content'] }}{% endfor %}".into()),
        ),
    ];
    let mut t = |name: &str, shape: &[usize], ty: u32, scale: f32| {
        let n = shape.iter().product();
        RawTensor {
            name: name.into(),
            shape: shape.to_vec(),
            type_id: ty,
            bytes: random_bytes(&mut rng, ty, n, scale),
        }
    };
    let norm = |name: &str| RawTensor {
        name: name.into(),
        shape: vec![h],
        type_id: 0,
        bytes: (0..h)
            .flat_map(|i| (1.0 + i as f32 / 64.0).to_le_bytes())
            .collect(),
    };
    let tensors = vec![
        t("token_embd.weight", &[vocab, h], 8, 1.0),
        norm("blk.0.attn_norm.weight"),
        t("blk.0.attn_q.weight", &[heads * d, h], 3, 0.3),
        t("blk.0.attn_k.weight", &[kv * d, h], 2, 0.3),
        t("blk.0.attn_v.weight", &[kv * d, h], 1, 0.3),
        t("blk.0.attn_output.weight", &[h, heads * d], 30, 0.3),
        norm("blk.0.ffn_norm.weight"),
        t("blk.0.ffn_gate.weight", &[ffn, h], 8, 0.3),
        t("blk.0.ffn_up.weight", &[ffn, h], 3, 0.3),
        t("blk.0.ffn_down.weight", &[h, ffn], 0, 0.2),
        norm("output_norm.weight"),
    ];
    GgufFile {
        version: 3,
        alignment: 32,
        kvs,
        tensors,
    }
}

/// The shape of a tiny decoder of one of the LLaMA-family architectures, every tensor f32 (so
/// a test's reference reads the values straight from the file's bytes).
#[derive(Clone, Debug)]
pub struct TinyFamily {
    /// `general.architecture`: "llama" (also Mistral's), "qwen2", "qwen3", "phi3".
    pub arch: &'static str,
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv: usize,
    pub head_dim: usize,
    pub ffn: usize,
    /// `attn_{q,k,v}.bias` (Qwen2).
    pub bias: bool,
    /// `attn_{q,k}_norm.weight` (Qwen3).
    pub qk_norm: bool,
    /// `attn_qkv.weight` and a `ffn_up.weight` holding gate then up (Phi-3).
    pub fused: bool,
    /// `rope.dimension_count` when it differs from the head size.
    pub rotary_dim: Option<usize>,
    /// `rope_freqs.weight` (Llama 3 rope scaling).
    pub rope_freqs: Option<Vec<f32>>,
    /// `attention.sliding_window` (0 is written as Phi-3's converter does for none).
    pub window: Option<u32>,
    /// No `output.weight`: the embedding table is the LM head.
    pub tied: bool,
}

impl TinyFamily {
    /// A Llama-shaped default: 2 layers, hidden 64, 4 query and 2 K/V heads of 16, FFN 96.
    pub fn new(arch: &'static str) -> TinyFamily {
        TinyFamily {
            arch,
            layers: 2,
            hidden: 64,
            heads: 4,
            kv: 2,
            head_dim: 16,
            ffn: 96,
            bias: false,
            qk_norm: false,
            fused: false,
            rotary_dim: None,
            rope_freqs: None,
            window: None,
            tied: true,
        }
    }
}

/// The tokenizer metadata of the tiny models: the 256 byte symbols, 4 merges, 2 control
/// tokens.
fn tiny_tokenizer() -> Vec<(String, Kv)> {
    let mut tokens = vec!["<|endoftext|>".to_string(), "<|im_start|>".to_string()];
    tokens.extend(byte_symbols());
    let merges = ["h e", "l l", "he ll", "Ġ w"];
    tokens.extend(merges.iter().map(|m| m.replace(' ', "")));
    let mut types = vec![3, 3];
    types.extend(std::iter::repeat_n(1, tokens.len() - 2));
    vec![
        ("tokenizer.ggml.model".into(), Kv::Str("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Kv::Str("smollm".into())),
        ("tokenizer.ggml.tokens".into(), Kv::Strs(tokens)),
        ("tokenizer.ggml.token_type".into(), Kv::I32s(types)),
        (
            "tokenizer.ggml.merges".into(),
            Kv::Strs(merges.iter().map(|m| m.to_string()).collect()),
        ),
        ("tokenizer.ggml.add_bos_token".into(), Kv::Bool(false)),
        ("tokenizer.ggml.bos_token_id".into(), Kv::U32(1)),
        ("tokenizer.ggml.eos_token_id".into(), Kv::U32(0)),
    ]
}

/// A tiny decoder of `f`'s architecture with seeded random f32 weights, laid out as llama.cpp's
/// converter writes that architecture (metadata under `{arch}.`, tensor names and shapes).
pub fn tiny_family(f: &TinyFamily) -> GgufFile {
    let mut rng = ChaCha8Rng::seed_from_u64(25);
    let a = f.arch;
    let (h, d) = (f.hidden, f.head_dim);
    let (qd, kvd) = (f.heads * d, f.kv * d);
    let mut kvs: Vec<(String, Kv)> = vec![
        ("general.architecture".into(), Kv::Str(a.into())),
        ("general.alignment".into(), Kv::U32(32)),
        (format!("{a}.block_count"), Kv::U32(f.layers as u32)),
        (format!("{a}.context_length"), Kv::U32(64)),
        (format!("{a}.embedding_length"), Kv::U32(h as u32)),
        (format!("{a}.feed_forward_length"), Kv::U32(f.ffn as u32)),
        (format!("{a}.attention.head_count"), Kv::U32(f.heads as u32)),
        (format!("{a}.attention.head_count_kv"), Kv::U32(f.kv as u32)),
        (format!("{a}.rope.freq_base"), Kv::F32(10000.0)),
        (
            format!("{a}.attention.layer_norm_rms_epsilon"),
            Kv::F32(1e-6),
        ),
    ];
    if d * f.heads != h {
        kvs.push((format!("{a}.attention.key_length"), Kv::U32(d as u32)));
        kvs.push((format!("{a}.attention.value_length"), Kv::U32(d as u32)));
    }
    kvs.push((
        format!("{a}.rope.dimension_count"),
        Kv::U32(f.rotary_dim.unwrap_or(d) as u32),
    ));
    if let Some(w) = f.window {
        kvs.push((format!("{a}.attention.sliding_window"), Kv::U32(w)));
    }
    kvs.extend(tiny_tokenizer());
    let vocab = TINY_VOCAB;
    let mut tensors = Vec::new();
    let mut t = |name: String, shape: &[usize], scale: f32, around: f32| {
        let n: usize = shape.iter().product();
        let bytes = (0..n)
            .flat_map(|_| (around + rng.random_range(-1.0..1.0f32) * scale).to_le_bytes())
            .collect();
        tensors.push(RawTensor {
            name,
            shape: shape.to_vec(),
            type_id: 0,
            bytes,
        });
    };
    let lin = |din: usize| 1.5 / (din as f32).sqrt();
    t("token_embd.weight".into(), &[vocab, h], 1.0, 0.0);
    for l in 0..f.layers {
        let n = |s: &str| format!("blk.{l}.{s}");
        t(n("attn_norm.weight"), &[h], 0.2, 1.0);
        if f.fused {
            t(n("attn_qkv.weight"), &[qd + 2 * kvd, h], lin(h), 0.0);
        } else {
            t(n("attn_q.weight"), &[qd, h], lin(h), 0.0);
            t(n("attn_k.weight"), &[kvd, h], lin(h), 0.0);
            t(n("attn_v.weight"), &[kvd, h], lin(h), 0.0);
        }
        if f.bias {
            t(n("attn_q.bias"), &[qd], 0.5, 0.0);
            t(n("attn_k.bias"), &[kvd], 0.5, 0.0);
            t(n("attn_v.bias"), &[kvd], 0.5, 0.0);
        }
        if f.qk_norm {
            t(n("attn_q_norm.weight"), &[d], 0.3, 1.0);
            t(n("attn_k_norm.weight"), &[d], 0.3, 1.0);
        }
        t(n("attn_output.weight"), &[h, qd], lin(qd), 0.0);
        t(n("ffn_norm.weight"), &[h], 0.2, 1.0);
        if f.fused {
            t(n("ffn_up.weight"), &[2 * f.ffn, h], lin(h), 0.0);
        } else {
            t(n("ffn_gate.weight"), &[f.ffn, h], lin(h), 0.0);
            t(n("ffn_up.weight"), &[f.ffn, h], lin(h), 0.0);
        }
        t(n("ffn_down.weight"), &[h, f.ffn], lin(f.ffn), 0.0);
    }
    t("output_norm.weight".into(), &[h], 0.2, 1.0);
    if !f.tied {
        t("output.weight".into(), &[vocab, h], lin(h), 0.0);
    }
    if let Some(freqs) = &f.rope_freqs {
        tensors.push(RawTensor {
            name: "rope_freqs.weight".into(),
            shape: vec![freqs.len()],
            type_id: 0,
            bytes: freqs.iter().flat_map(|x| x.to_le_bytes()).collect(),
        });
    }
    GgufFile {
        version: 3,
        alignment: 32,
        kvs,
        tensors,
    }
}
