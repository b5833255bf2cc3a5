//! The small files of a BERT-class model directory, read and checked before anything is built:
//! config.json (sizes within bounds, then against the tensors present), sentence-transformers'
//! 1_Pooling/config.json, modules.json and sentence_bert_config.json. Each is a regular file of
//! bounded size, read without blocking (see `ir::file`).

use std::path::Path;

use serde::Deserialize;

use super::{ModelError, SafeTensors};
use crate::ir::file::{self, FileLimit};
use crate::ir::FileError;

/// config.json and the other settings files are a few hundred bytes.
pub const SETTINGS_FILE: FileLimit = FileLimit {
    what: "settings file",
    max_bytes: 1 << 20,
};

/// tokenizer.json: the largest vocabularies in use (256k tokens with merges) take ~35 MB.
pub const TOKENIZER_FILE: FileLimit = FileLimit {
    what: "tokenizer",
    max_bytes: 128 << 20,
};

/// config.json of a BERT model. Unknown fields are refused, so a config this code does not
/// understand is an error naming the field rather than a silently different model.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BertConfig {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub hidden_act: String,
    pub vocab_size: usize,
    pub max_position_embeddings: usize,
    pub type_vocab_size: usize,
    pub layer_norm_eps: f64,
    #[serde(default = "absolute")]
    pub position_embedding_type: String,
    pub model_type: Option<String>,
    // Fields that do not change inference.
    pub architectures: Option<Vec<String>>,
    pub attention_probs_dropout_prob: Option<f64>,
    pub hidden_dropout_prob: Option<f64>,
    pub classifier_dropout: Option<f64>,
    pub gradient_checkpointing: Option<bool>,
    pub initializer_range: Option<f64>,
    pub pad_token_id: Option<i64>,
    pub transformers_version: Option<String>,
    pub use_cache: Option<bool>,
    pub torch_dtype: Option<String>,
    pub dtype: Option<String>,
    #[serde(rename = "_name_or_path")]
    pub name_or_path: Option<String>,
}

fn absolute() -> String {
    "absolute".into()
}

fn config_error<T>(field: &str, reason: String) -> Result<T, ModelError> {
    Err(ModelError::Config {
        field: field.into(),
        reason,
    })
}

impl BertConfig {
    /// Every size within its bound, heads dividing the hidden size, a usable epsilon, and the
    /// activation, position embedding and model type this lowering implements.
    pub fn validate(&self) -> Result<(), ModelError> {
        // Far above any BERT-class model (the largest have hidden 4096, 48 layers, 250k
        // tokens) and far below what would make building the graph or its weights a denial of
        // service: a config past them is corrupt or hostile.
        let sizes = [
            ("hidden_size", self.hidden_size, 1 << 16),
            ("num_hidden_layers", self.num_hidden_layers, 1 << 10),
            ("num_attention_heads", self.num_attention_heads, 1 << 10),
            ("intermediate_size", self.intermediate_size, 1 << 18),
            ("vocab_size", self.vocab_size, 1 << 24),
            (
                "max_position_embeddings",
                self.max_position_embeddings,
                1 << 20,
            ),
            ("type_vocab_size", self.type_vocab_size, 1 << 10),
        ];
        for (field, v, max) in sizes {
            if v == 0 || v > max {
                return config_error(field, format!("{v} is outside 1..={max}"));
            }
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return config_error(
                "num_attention_heads",
                format!(
                    "{} heads do not divide hidden_size {}",
                    self.num_attention_heads, self.hidden_size
                ),
            );
        }
        if !(self.layer_norm_eps > 0.0 && self.layer_norm_eps < 1.0) {
            return config_error(
                "layer_norm_eps",
                format!("{} is not in (0, 1)", self.layer_norm_eps),
            );
        }
        if self.model_type.as_deref().is_some_and(|t| t != "bert") {
            return config_error(
                "model_type",
                format!(
                    "`{}` is not a BERT model",
                    self.model_type.clone().unwrap_or_default()
                ),
            );
        }
        if !matches!(
            self.hidden_act.as_str(),
            "gelu" | "gelu_new" | "gelu_pytorch_tanh"
        ) {
            return config_error(
                "hidden_act",
                format!(
                    "`{}` is not supported (gelu, gelu_new, gelu_pytorch_tanh)",
                    self.hidden_act
                ),
            );
        }
        if self.position_embedding_type != "absolute" {
            return config_error(
                "position_embedding_type",
                format!(
                    "`{}` is not supported (absolute)",
                    self.position_embedding_type
                ),
            );
        }
        Ok(())
    }

    /// The sizes against the tensors present, before any graph is built: the embedding tables,
    /// the first layer's MLP and the number of layers. `prefix` is `""` or `"bert."`.
    pub fn check_against(&self, weights: &SafeTensors, prefix: &str) -> Result<(), ModelError> {
        let (h, file) = (self.hidden_size, weights.path().display().to_string());
        let expect = |field: &str, value: usize, tensor: &str, dims: [usize; 2], axis: usize| {
            let name = format!("{prefix}{tensor}");
            let Some(info) = weights.info(&name) else {
                return Err(ModelError::MissingTensor {
                    path: file.clone(),
                    name,
                });
            };
            if info.shape[..] == dims[..] {
                return Ok(());
            }
            // Name the field whose size disagrees (the other axis is hidden_size).
            let field = if info.shape.len() == 2 && info.shape[axis] == dims[axis] {
                "hidden_size"
            } else {
                field
            };
            Err(ModelError::ConfigMismatch {
                value: if field == "hidden_size" { h } else { value },
                field: field.into(),
                file: file.clone(),
                tensor: name,
                found: info.shape.clone(),
            })
        };
        expect(
            "vocab_size",
            self.vocab_size,
            "embeddings.word_embeddings.weight",
            [self.vocab_size, h],
            0,
        )?;
        expect(
            "max_position_embeddings",
            self.max_position_embeddings,
            "embeddings.position_embeddings.weight",
            [self.max_position_embeddings, h],
            0,
        )?;
        expect(
            "type_vocab_size",
            self.type_vocab_size,
            "embeddings.token_type_embeddings.weight",
            [self.type_vocab_size, h],
            0,
        )?;
        expect(
            "intermediate_size",
            self.intermediate_size,
            "encoder.layer.0.intermediate.dense.weight",
            [self.intermediate_size, h],
            0,
        )?;
        let layer_prefix = format!("{prefix}encoder.layer.");
        let layers = weights
            .names()
            .filter_map(|n| {
                n.strip_prefix(&layer_prefix)?
                    .split('.')
                    .next()?
                    .parse()
                    .ok()
            })
            .map(|l: usize| l.saturating_add(1))
            .max()
            .unwrap_or(0);
        if layers != self.num_hidden_layers {
            return Err(ModelError::ConfigMismatch {
                field: "num_hidden_layers".into(),
                value: self.num_hidden_layers,
                file,
                tensor: format!("{layer_prefix}*"),
                found: vec![layers],
            });
        }
        Ok(())
    }
}

/// Sentence-transformers pooling (1_Pooling/config.json); only mean pooling is supported, and a
/// mode this code does not know is refused rather than ignored.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pooling {
    pub word_embedding_dimension: usize,
    #[serde(default)]
    pub pooling_mode_cls_token: bool,
    #[serde(default)]
    pub pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pub pooling_mode_max_tokens: bool,
    #[serde(default)]
    pub pooling_mode_mean_sqrt_len_tokens: bool,
    #[serde(default)]
    pub pooling_mode_weightedmean_tokens: bool,
    #[serde(default)]
    pub pooling_mode_lasttoken: bool,
    /// Only matters with prompts, which rocmforge does not add.
    pub include_prompt: Option<bool>,
}

impl Pooling {
    fn mean(dim: usize) -> Pooling {
        Pooling {
            word_embedding_dimension: dim,
            pooling_mode_cls_token: false,
            pooling_mode_mean_tokens: true,
            pooling_mode_max_tokens: false,
            pooling_mode_mean_sqrt_len_tokens: false,
            pooling_mode_weightedmean_tokens: false,
            pooling_mode_lasttoken: false,
            include_prompt: None,
        }
    }
}

/// One module of modules.json; only its type matters here.
#[derive(Deserialize)]
struct Module {
    #[serde(rename = "type")]
    kind: String,
}

/// sentence_bert_config.json.
#[derive(Deserialize)]
struct SentenceBertConfig {
    max_seq_length: Option<usize>,
    #[serde(default)]
    do_lower_case: bool,
}

/// What sentence-transformers adds around the encoder.
pub struct SentenceSettings {
    pub pooling: Pooling,
    /// L2-normalise the pooled embedding (a Normalize module).
    pub normalize: bool,
    pub max_seq_length: usize,
    /// Lower-case texts before tokenizing.
    pub lower_case: bool,
}

/// The bytes of `dir/file`, or `None` if it does not exist.
pub fn read_optional(
    dir: &Path,
    file: &str,
    limit: FileLimit,
) -> Result<Option<Vec<u8>>, ModelError> {
    match file::read_limited(&dir.join(file), limit) {
        Ok(b) => Ok(Some(b)),
        Err(FileError::Missing { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The bytes of `dir/file`, which must exist.
pub fn read_required(dir: &Path, file: &str, limit: FileLimit) -> Result<Vec<u8>, ModelError> {
    read_optional(dir, file, limit)?.ok_or_else(|| ModelError::MissingFile {
        dir: dir.display().to_string(),
        file: file.into(),
    })
}

fn parse<T: for<'de> Deserialize<'de>>(file: &str, bytes: &[u8]) -> Result<T, ModelError> {
    serde_json::from_slice(bytes).map_err(|e| ModelError::Json {
        file: file.into(),
        message: e.to_string(),
    })
}

/// config.json, checked within bounds.
pub fn read_config(dir: &Path) -> Result<BertConfig, ModelError> {
    let bytes = read_required(dir, "config.json", SETTINGS_FILE)?;
    // Another architecture's config.json fails on its first unknown field; its model_type says
    // more, so it is looked at first.
    if let Ok(serde_json::Value::Object(fields)) = serde_json::from_slice(&bytes) {
        if let Some(t) = fields.get("model_type").and_then(|t| t.as_str()) {
            if t != "bert" {
                return config_error(
                    "model_type",
                    format!(
                        "`{}` is not a BERT-class encoder (embed takes model_type bert; \
                         LLaMA-family decoders run with `rocmforge generate --model DIR`)",
                        t.escape_debug()
                    ),
                );
            }
        }
    }
    let config: BertConfig = serde_json::from_slice(&bytes).map_err(|e| {
        // serde names the offending field in its message; surface it as such.
        let msg = e.to_string();
        let field = msg.split('`').nth(1).unwrap_or("?").to_string();
        ModelError::Config { field, reason: msg }
    })?;
    config.validate()?;
    Ok(config)
}

/// Pooling, normalisation and sequence length from the sentence-transformers files (defaults
/// where a file is absent: mean pooling, no normalisation, the model's positions).
pub fn read_sentence_settings(
    dir: &Path,
    config: &BertConfig,
) -> Result<SentenceSettings, ModelError> {
    const POOLING: &str = "1_Pooling/config.json";
    let pooling = match read_optional(dir, POOLING, SETTINGS_FILE)? {
        Some(b) => parse::<Pooling>(POOLING, &b)?,
        None => Pooling::mean(config.hidden_size),
    };
    let other_modes = pooling.pooling_mode_cls_token
        || pooling.pooling_mode_max_tokens
        || pooling.pooling_mode_mean_sqrt_len_tokens
        || pooling.pooling_mode_weightedmean_tokens
        || pooling.pooling_mode_lasttoken;
    if !pooling.pooling_mode_mean_tokens || other_modes {
        return Err(ModelError::Setting {
            file: POOLING.into(),
            field: "pooling_mode_*".into(),
            reason: "only mean pooling (alone) is supported".into(),
        });
    }
    if pooling.word_embedding_dimension != config.hidden_size {
        return Err(ModelError::Setting {
            file: POOLING.into(),
            field: "word_embedding_dimension".into(),
            reason: format!(
                "{} is not the model's hidden_size {}",
                pooling.word_embedding_dimension, config.hidden_size
            ),
        });
    }
    let mut normalize = false;
    if let Some(b) = read_optional(dir, "modules.json", SETTINGS_FILE)? {
        for m in parse::<Vec<Module>>("modules.json", &b)? {
            match m.kind.rsplit('.').next().unwrap_or_default() {
                "Transformer" | "Pooling" => {}
                "Normalize" => normalize = true,
                _ => {
                    return Err(ModelError::Setting {
                        file: "modules.json".into(),
                        field: "type".into(),
                        reason: format!(
                            "module `{}` is not supported (Transformer, Pooling, Normalize)",
                            m.kind
                        ),
                    })
                }
            }
        }
    }
    const SBERT: &str = "sentence_bert_config.json";
    let sbert = match read_optional(dir, SBERT, SETTINGS_FILE)? {
        Some(b) => parse::<SentenceBertConfig>(SBERT, &b)?,
        None => SentenceBertConfig {
            max_seq_length: None,
            do_lower_case: false,
        },
    };
    // Longer than the position table cannot be embedded: the table is the limit.
    let max_seq_length = sbert
        .max_seq_length
        .unwrap_or(config.max_position_embeddings)
        .min(config.max_position_embeddings);
    if max_seq_length < 2 {
        return Err(ModelError::Setting {
            file: SBERT.into(),
            field: "max_seq_length".into(),
            reason: format!("{max_seq_length} leaves no room for [CLS] and [SEP]"),
        });
    }
    Ok(SentenceSettings {
        pooling,
        normalize,
        max_seq_length,
        lower_case: sbert.do_lower_case,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A tiny BERT config (hidden 8, 2 heads, 2 layers) with `edit` applied to its JSON.
    fn config(edit: impl FnOnce(&mut serde_json::Value)) -> Result<BertConfig, ModelError> {
        let mut v = serde_json::json!({
            "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
            "intermediate_size": 16, "hidden_act": "gelu", "vocab_size": 10,
            "max_position_embeddings": 6, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
            "model_type": "bert"
        });
        edit(&mut v);
        let c: BertConfig = serde_json::from_value(v).unwrap();
        c.validate().map(|()| c)
    }

    fn refused(edit: impl FnOnce(&mut serde_json::Value)) -> (String, String) {
        match config(edit) {
            Err(ModelError::Config { field, reason }) => (field, reason),
            other => panic!("{:?}", other.map(|_| "accepted")),
        }
    }

    #[test]
    fn absurd_sizes_are_refused_naming_the_field() {
        assert!(config(|_| {}).is_ok());
        for (field, value, why) in [
            ("hidden_size", 1_000_000_000_000u64, "outside 1..=65536"),
            ("num_attention_heads", 0, "outside 1..=1024"),
            ("num_hidden_layers", 1_000_000_000, "outside 1..=1024"),
            ("num_hidden_layers", 0, "outside 1..=1024"),
            ("vocab_size", 1 << 40, "outside 1..=16777216"),
            ("intermediate_size", 0, "outside"),
            ("max_position_embeddings", 0, "outside"),
            ("type_vocab_size", 1 << 20, "outside"),
        ] {
            let (f, reason) = refused(|v| v[field] = value.into());
            assert_eq!(f, field);
            assert!(reason.contains(why), "{field}={value}: {reason}");
        }
        let (f, reason) = refused(|v| v["num_attention_heads"] = 3.into());
        assert_eq!(f, "num_attention_heads");
        assert!(
            reason.contains("3 heads do not divide hidden_size 8"),
            "{reason}"
        );
        for eps in [0.0, -1.0, 2.0] {
            assert_eq!(
                refused(|v| v["layer_norm_eps"] = eps.into()).0,
                "layer_norm_eps"
            );
        }
    }

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rocmforge-cfg-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A safetensors file of zero-filled f32 tensors, ranges tiled in order.
    fn weights(path: &std::path::Path, tensors: &[(&str, Vec<usize>)]) -> SafeTensors {
        let mut header = serde_json::Map::new();
        let mut at = 0usize;
        for (name, shape) in tensors {
            let bytes = shape.iter().product::<usize>() * 4;
            header.insert(
                (*name).into(),
                serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [at, at + bytes]}),
            );
            at += bytes;
        }
        let text = serde_json::Value::Object(header).to_string();
        let mut out = (text.len() as u64).to_le_bytes().to_vec();
        out.extend(text.as_bytes());
        out.resize(out.len() + at, 0);
        std::fs::write(path, out).unwrap();
        SafeTensors::open(path).unwrap()
    }

    fn tiny_tensors(hidden: usize, layers: usize) -> Vec<(String, Vec<usize>)> {
        let mut t = vec![
            (
                "embeddings.word_embeddings.weight".to_string(),
                vec![10, hidden],
            ),
            (
                "embeddings.position_embeddings.weight".into(),
                vec![6, hidden],
            ),
            (
                "embeddings.token_type_embeddings.weight".into(),
                vec![2, hidden],
            ),
        ];
        for l in 0..layers {
            t.push((
                format!("encoder.layer.{l}.intermediate.dense.weight"),
                vec![16, hidden],
            ));
        }
        t
    }

    fn mismatch(c: &BertConfig, tensors: &[(String, Vec<usize>)], name: &str) -> ModelError {
        let d = dir(name);
        let named: Vec<(&str, Vec<usize>)> = tensors
            .iter()
            .map(|(n, s)| (n.as_str(), s.clone()))
            .collect();
        let st = weights(&d.join("model.safetensors"), &named);
        let e = c.check_against(&st, "").unwrap_err();
        std::fs::remove_dir_all(&d).ok();
        e
    }

    #[test]
    fn sizes_that_do_not_match_the_tensors_present_are_refused() {
        let c = config(|_| {}).unwrap();
        let d = dir("match");
        let named: Vec<(String, Vec<usize>)> = tiny_tensors(8, 2);
        let refs: Vec<(&str, Vec<usize>)> =
            named.iter().map(|(n, s)| (n.as_str(), s.clone())).collect();
        assert!(c
            .check_against(&weights(&d.join("w.safetensors"), &refs), "")
            .is_ok());
        std::fs::remove_dir_all(&d).ok();
        let field = |e: ModelError| match e {
            ModelError::ConfigMismatch {
                field,
                value,
                found,
                ..
            } => (field, value, found),
            other => panic!("{other}"),
        };
        assert_eq!(
            field(mismatch(&c, &tiny_tensors(12, 2), "hidden")),
            ("hidden_size".into(), 8, vec![10, 12])
        );
        assert_eq!(
            field(mismatch(&c, &tiny_tensors(8, 3), "layers")),
            ("num_hidden_layers".into(), 2, vec![3])
        );
        let c = config(|v| v["vocab_size"] = 11.into()).unwrap();
        assert_eq!(
            field(mismatch(&c, &tiny_tensors(8, 2), "vocab")),
            ("vocab_size".into(), 11, vec![10, 8])
        );
        let c = config(|v| v["intermediate_size"] = 32.into()).unwrap();
        assert_eq!(
            field(mismatch(&c, &tiny_tensors(8, 2), "mlp")),
            ("intermediate_size".into(), 32, vec![16, 8])
        );
    }
}
