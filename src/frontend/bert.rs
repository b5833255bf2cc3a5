//! BERT-class encoders (all-MiniLM-L6-v2 and its family) lowered to the IR the way Hugging Face's
//! `BertModel` computes them, attention written out (QKᵀ / √d + the additive padding mask,
//! softmax, ·V) so the fusion pass must find it; then sentence-transformers' pooling.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::bert_config::{
    read_config, read_required, read_sentence_settings, BertConfig, Pooling, TOKENIZER_FILE,
};
use super::{ModelError, SafeTensors};
use crate::ir::{
    DType, FileError, Graph, GraphError, Init, NodeId, ReduceOp, Sample, Tensor, UnaryOp,
};

/// A tokenized batch, padded on the right to its longest sequence.
#[derive(Clone, Debug, PartialEq)]
pub struct Encoded {
    pub input_ids: Vec<Vec<i64>>,
    pub attention_mask: Vec<Vec<i64>>,
    pub seq_len: usize,
}

pub struct BertEncoder {
    pub dir: PathBuf,
    pub config: BertConfig,
    pub pooling: Pooling,
    pub normalize: bool,
    pub max_seq_length: usize,
    /// sentence_bert_config.json's do_lower_case: texts are lower-cased before tokenizing.
    pub lower_case: bool,
    weights: SafeTensors,
    prefix: String,
    tokenizer: tokenizers::Tokenizer,
}

/// tokenizer.json (a regular file within [`TOKENIZER_FILE`]), with padding and truncation off
/// (they are the batch's business), and no token id past the embedding table.
fn read_tokenizer(dir: &Path, config: &BertConfig) -> Result<tokenizers::Tokenizer, ModelError> {
    let bytes = read_required(dir, "tokenizer.json", TOKENIZER_FILE)?;
    let mut tokenizer = tokenizers::Tokenizer::from_bytes(&bytes)
        .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
    tokenizer.with_padding(None);
    tokenizer
        .with_truncation(None)
        .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
    let ids = tokenizer.get_vocab_size(true);
    if ids > config.vocab_size {
        return Err(ModelError::Config {
            field: "vocab_size".into(),
            reason: format!(
                "{} rows of embeddings, but tokenizer.json has {ids} tokens",
                config.vocab_size
            ),
        });
    }
    Ok(tokenizer)
}

impl BertEncoder {
    /// Reads a Hugging Face model directory: config.json (its sizes checked within bounds,
    /// then against the tensors present, before any graph is built), model.safetensors (mapped,
    /// not read), tokenizer.json, and sentence-transformers' 1_Pooling/config.json, modules.json
    /// and sentence_bert_config.json. Every file must be a regular file within its size limit.
    pub fn load(dir: &Path) -> Result<BertEncoder, ModelError> {
        // A file (a GGUF decoder, say) is not an encoder directory: said as such rather than
        // as "cannot read FILE/config.json".
        if dir.is_file() {
            return Err(ModelError::Io {
                path: dir.display().to_string(),
                message: "a file, not a directory: embed takes a BERT-class Hugging Face \
                          directory (config.json, model.safetensors, tokenizer.json); GGUF \
                          decoders run with `rocmforge generate`"
                    .into(),
            });
        }
        let config = read_config(dir)?;
        let st = dir.join("model.safetensors");
        let weights = match SafeTensors::open(&st) {
            Err(ModelError::File(FileError::Missing { .. })) => {
                return Err(ModelError::MissingFile {
                    dir: dir.display().to_string(),
                    file: "model.safetensors".into(),
                })
            }
            other => other?,
        };
        let prefix = if weights.info("embeddings.word_embeddings.weight").is_some() {
            ""
        } else {
            "bert."
        }
        .to_string();
        config.check_against(&weights, &prefix)?;
        let settings = read_sentence_settings(dir, &config)?;
        let tokenizer = read_tokenizer(dir, &config)?;
        let enc = BertEncoder {
            dir: dir.to_path_buf(),
            config,
            pooling: settings.pooling,
            normalize: settings.normalize,
            max_seq_length: settings.max_seq_length,
            lower_case: settings.lower_case,
            weights,
            prefix,
            tokenizer,
        };
        // Every weight the graph will read exists with the shape the config implies.
        let g = enc.graph(1, 1)?;
        for id in g.node_ids() {
            if let crate::ir::Op::Weight { .. } = g.op(id) {
                let n = g.node(id);
                let info = enc
                    .weights
                    .info(&n.name)
                    .ok_or_else(|| ModelError::MissingTensor {
                        path: st.display().to_string(),
                        name: n.name.clone(),
                    })?;
                if info.shape != n.ty.shape.dims() {
                    return Err(ModelError::TensorShape {
                        name: n.name.clone(),
                        expected: n.ty.shape.dims().to_vec(),
                        found: info.shape.clone(),
                    });
                }
                if !info.dtype.is_float() {
                    return Err(ModelError::TensorDType {
                        name: n.name.clone(),
                        found: info.dtype,
                    });
                }
            }
        }
        Ok(enc)
    }

    /// Token ids with [CLS]/[SEP], truncated to the model's max sequence length, right-padded.
    pub fn tokenize(&self, texts: &[&str]) -> Result<Encoded, ModelError> {
        let mut ids = Vec::with_capacity(texts.len());
        for t in texts {
            let text = if self.lower_case {
                t.to_lowercase()
            } else {
                t.to_string()
            };
            let e = self
                .tokenizer
                .encode(text, true)
                .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
            let mut v: Vec<i64> = e.get_ids().iter().map(|&i| i64::from(i)).collect();
            if v.len() > self.max_seq_length {
                let sep = *v.last().expect("non-empty");
                v.truncate(self.max_seq_length - 1);
                v.push(sep);
            }
            ids.push(v);
        }
        let seq_len = ids.iter().map(Vec::len).max().unwrap_or(1).max(1);
        let mask = ids
            .iter()
            .map(|v| (0..seq_len).map(|i| i64::from(i < v.len())).collect())
            .collect();
        let input_ids = ids
            .into_iter()
            .map(|mut v| {
                v.resize(seq_len, 0);
                v
            })
            .collect();
        Ok(Encoded {
            input_ids,
            attention_mask: mask,
            seq_len,
        })
    }

    fn w(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// `x · Wᵀ + b` for a PyTorch Linear stored `[out, in]`.
    fn linear(
        &self,
        g: &mut Graph,
        x: NodeId,
        name: &str,
        din: usize,
        dout: usize,
        dt: DType,
    ) -> Result<NodeId, GraphError> {
        let w = g.weight(&self.w(&format!("{name}.weight")), dt, &[dout, din])?;
        let wt = g.permute(w, &[1, 0])?;
        let y = g.matmul(x, wt)?;
        let b = g.weight(&self.w(&format!("{name}.bias")), dt, &[dout])?;
        g.add(y, b)
    }

    fn layer_norm(
        &self,
        g: &mut Graph,
        x: NodeId,
        name: &str,
        dt: DType,
    ) -> Result<NodeId, GraphError> {
        let h = self.config.hidden_size;
        let w = g.weight_init(&self.w(&format!("{name}.weight")), dt, &[h], Init::Ones)?;
        let b = g.weight_init(&self.w(&format!("{name}.bias")), dt, &[h], Init::Zeros)?;
        g.layer_norm(x, w, b, self.config.layer_norm_eps)
    }

    /// The encoder for a batch of `b` sequences of `s` tokens: inputs `input_ids` (i64 [b, s]),
    /// `token_type_ids` (i64 [b, s]) and `attention_mask` (f32 [b, s], 1 for tokens, 0 for
    /// padding); output `embeddings` [b, hidden] (pooled, normalised when modules.json says so).
    pub fn graph(&self, b: usize, s: usize) -> Result<Graph, GraphError> {
        self.graph_typed(b, s, DType::F32)
    }

    /// As [`BertEncoder::graph`], computing in `dtype` (f32, f16 or bf16) as PyTorch does after
    /// `model.to(dtype)`: weights are converted when read, the padding mask uses `dtype`'s most
    /// negative value, and pooling and normalisation run in f32 on the cast last hidden state.
    pub fn graph_typed(&self, b: usize, s: usize, dtype: DType) -> Result<Graph, GraphError> {
        let c = &self.config;
        let dt = dtype;
        let (hd, heads) = (c.hidden_size, c.num_attention_heads);
        let d = hd / heads;
        let mut g = Graph::new(if dt == DType::F32 {
            "bert_encoder".to_string()
        } else {
            format!("bert_encoder_{dt}")
        });
        g.description = format!(
            "{} ({} layers, hidden {hd}, {heads} heads)",
            self.dir.display(),
            c.num_hidden_layers
        );
        let ids = g.input_sampled(
            "input_ids",
            DType::I64,
            &[b, s],
            Sample::Range {
                low: 0,
                high: c.vocab_size as i64,
            },
        )?;
        let types = g.input_sampled(
            "token_type_ids",
            DType::I64,
            &[b, s],
            Sample::Range { low: 0, high: 1 },
        )?;
        let mask = g.input_sampled("attention_mask", DType::F32, &[b, s], Sample::PaddingMask)?;

        let we = g.weight(
            &self.w("embeddings.word_embeddings.weight"),
            dt,
            &[c.vocab_size, hd],
        )?;
        let pe = g.weight(
            &self.w("embeddings.position_embeddings.weight"),
            dt,
            &[c.max_position_embeddings, hd],
        )?;
        let te = g.weight(
            &self.w("embeddings.token_type_embeddings.weight"),
            dt,
            &[c.type_vocab_size, hd],
        )?;
        let words = g.gather(we, ids)?;
        let positions = g.slice(pe, 0, 0, s as i64)?;
        let tt = g.gather(te, types)?;
        let e = g.add(words, positions)?;
        let e = g.add(e, tt)?;
        let mut x = self.layer_norm(&mut g, e, "embeddings.LayerNorm", dt)?;

        // HF's extended attention mask: (1 − mask) · min(dtype), added to the scores.
        let m4 = g.reshape(mask, &[b as i64, 1, 1, s as i64])?;
        let m4 = if dt == DType::F32 {
            m4
        } else {
            g.cast(m4, dt)?
        };
        let one = g.scalar(1.0, dt)?;
        let inv = g.sub(one, m4)?;
        let min = g.scalar(dt.min_value(), dt)?;
        let ext = g.mul(inv, min)?;
        let root = g.scalar((d as f64).sqrt(), dt)?;
        let split = |g: &mut Graph, t: NodeId| -> Result<NodeId, GraphError> {
            let r = g.reshape(t, &[b as i64, s as i64, heads as i64, d as i64])?;
            g.permute(r, &[0, 2, 1, 3])
        };
        for l in 0..c.num_hidden_layers {
            let p = format!("encoder.layer.{l}.");
            let q = self.linear(&mut g, x, &format!("{p}attention.self.query"), hd, hd, dt)?;
            let k = self.linear(&mut g, x, &format!("{p}attention.self.key"), hd, hd, dt)?;
            let v = self.linear(&mut g, x, &format!("{p}attention.self.value"), hd, hd, dt)?;
            let (q, k, v) = (split(&mut g, q)?, split(&mut g, k)?, split(&mut g, v)?);
            let kt = g.permute(k, &[0, 1, 3, 2])?;
            let scores = g.matmul(q, kt)?;
            let scaled = g.div(scores, root)?;
            let masked = g.add(scaled, ext)?;
            let probs = g.softmax(masked, -1)?;
            let ctx = g.matmul(probs, v)?;
            let ctx = g.permute(ctx, &[0, 2, 1, 3])?;
            let ctx = g.reshape(ctx, &[b as i64, s as i64, hd as i64])?;
            let o = self.linear(
                &mut g,
                ctx,
                &format!("{p}attention.output.dense"),
                hd,
                hd,
                dt,
            )?;
            let r = g.add(o, x)?;
            let h = self.layer_norm(&mut g, r, &format!("{p}attention.output.LayerNorm"), dt)?;
            let up = self.linear(
                &mut g,
                h,
                &format!("{p}intermediate.dense"),
                hd,
                c.intermediate_size,
                dt,
            )?;
            let act = g.unary(
                if c.hidden_act == "gelu" {
                    UnaryOp::Gelu
                } else {
                    UnaryOp::GeluTanh
                },
                up,
            )?;
            let down = self.linear(
                &mut g,
                act,
                &format!("{p}output.dense"),
                c.intermediate_size,
                hd,
                dt,
            )?;
            let r = g.add(down, h)?;
            x = self.layer_norm(&mut g, r, &format!("{p}output.LayerNorm"), dt)?;
        }
        g.rename(x, "last_hidden_state")?;
        if dt != DType::F32 {
            x = g.cast(x, DType::F32)?;
        }

        // Mean over tokens where attention_mask = 1 (sentence-transformers clamps the count).
        let m3 = g.reshape(mask, &[b as i64, s as i64, 1])?;
        let kept = g.mul(x, m3)?;
        let summed = g.reduce(ReduceOp::Sum, kept, &[1], false)?;
        let count = g.reduce(ReduceOp::Sum, m3, &[1], false)?;
        let floor = g.scalar(1e-9, DType::F32)?;
        let count = g.maximum(count, floor)?;
        let mut pooled = g.div(summed, count)?;
        if self.normalize {
            // F.normalize(p=2, eps=1e-12)
            let sq = g.mul(pooled, pooled)?;
            let ss = g.reduce(ReduceOp::Sum, sq, &[-1], true)?;
            let norm = g.sqrt(ss)?;
            let eps = g.scalar(1e-12, DType::F32)?;
            let norm = g.maximum(norm, eps)?;
            pooled = g.div(pooled, norm)?;
        }
        g.rename(pooled, "embeddings")?;
        g.set_outputs(&[pooled])?;
        Ok(g)
    }

    /// The weights `graph` reads, read from the mapped file now (that is, when needed).
    pub fn weights_for(&self, graph: &Graph) -> Result<HashMap<String, Tensor>, ModelError> {
        let mut out = HashMap::new();
        for id in graph.node_ids() {
            if let crate::ir::Op::Weight { .. } = graph.op(id) {
                let n = graph.node(id);
                let t = self.weights.tensor(&n.name, n.ty.shape.dims())?;
                let t = if t.dtype() == n.ty.dtype {
                    t
                } else {
                    t.cast(n.ty.dtype)
                };
                out.insert(n.name.clone(), t);
            }
        }
        Ok(out)
    }

    /// The graph inputs for a tokenized batch, by name.
    pub fn inputs(&self, enc: &Encoded) -> Vec<(String, Tensor)> {
        let b = enc.input_ids.len();
        let flat = |v: &Vec<Vec<i64>>| v.iter().flatten().copied().collect::<Vec<i64>>();
        let ids = Tensor::from_i64(DType::I64, vec![b, enc.seq_len], flat(&enc.input_ids))
            .expect("b×s ids");
        let types = Tensor::from_i64(DType::I64, vec![b, enc.seq_len], vec![0; b * enc.seq_len])
            .expect("b×s");
        let mask: Vec<f32> = flat(&enc.attention_mask)
            .iter()
            .map(|&m| m as f32)
            .collect();
        let mask = Tensor::from_f32(DType::F32, vec![b, enc.seq_len], mask).expect("b×s mask");
        vec![
            ("input_ids".into(), ids),
            ("token_type_ids".into(), types),
            ("attention_mask".into(), mask),
        ]
    }
}
