//! A decoder's tokenizer from a Hugging Face directory: tokenizer.json (the `tokenizers` crate
//! reads it whole, post-processor included), BOS/EOS ids from generation_config.json, then
//! config.json, then tokenizer_config.json's token strings (transformers' `generate` prefers
//! the generation config the same way), the chat template from tokenizer_config.json's
//! `chat_template` or, as transformers 5 saves it, chat_template.jinja.

use std::path::Path;

use serde_json::Value;

use super::bert_config::{read_optional, read_required};
use super::gguf_tokenizer::GgufTokenizer;
use super::{ModelError, SETTINGS_FILE, TOKENIZER_FILE};

fn json(file: &str, bytes: &[u8]) -> Result<Value, ModelError> {
    serde_json::from_slice(bytes).map_err(|e| ModelError::Json {
        file: file.into(),
        message: e.to_string(),
    })
}

/// An optional JSON file of `dir` as a value (`Null` when absent).
fn optional_json(dir: &Path, file: &str) -> Result<Value, ModelError> {
    match read_optional(dir, file, SETTINGS_FILE)? {
        Some(b) => json(file, &b),
        None => Ok(Value::Null),
    }
}

/// A token id field (`eos_token_id` may be a list: its first is the one generation stops at
/// first, and the CLI stops at one id), checked against the vocabulary.
fn id_field(file: &str, v: &Value, key: &str, vocab: usize) -> Result<Option<u32>, ModelError> {
    let field = match v.get(key) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(a)) => a.first(),
        Some(x) => Some(x),
    };
    let Some(x) = field else { return Ok(None) };
    match x.as_u64() {
        Some(id) if (id as usize) < vocab => Ok(Some(id as u32)),
        _ => Err(ModelError::Tokenizer(format!(
            "{file}: `{key}` is {x}, not a token id below {vocab}"
        ))),
    }
}

/// tokenizer_config.json's `bos_token`/`eos_token` (a string or `{"content": ...}`) as an id.
fn token_field(t: &tokenizers::Tokenizer, v: &Value, key: &str) -> Result<Option<u32>, ModelError> {
    let text = match v.get(key) {
        Some(Value::String(s)) => s.as_str(),
        Some(Value::Object(o)) => match o.get("content") {
            Some(Value::String(s)) => s.as_str(),
            _ => return Ok(None),
        },
        _ => return Ok(None),
    };
    t.token_to_id(text).map(Some).ok_or_else(|| {
        ModelError::Tokenizer(format!(
            "tokenizer_config.json: `{key}` is `{text}`, which tokenizer.json does not have"
        ))
    })
}

/// The chat template: tokenizer_config.json's `chat_template` (a string, or a list of named
/// templates of which the `default` one), else chat_template.jinja.
fn chat_template(dir: &Path, tc: &Value) -> Result<Option<String>, ModelError> {
    match tc.get("chat_template") {
        Some(Value::String(s)) => return Ok(Some(s.clone())),
        Some(Value::Array(list)) => {
            let default = list.iter().find(|t| t["name"] == "default");
            if let Some(Value::String(s)) = default.map(|t| &t["template"]) {
                return Ok(Some(s.clone()));
            }
        }
        _ => {}
    }
    match read_optional(dir, "chat_template.jinja", TOKENIZER_FILE)? {
        Some(b) => String::from_utf8(b)
            .map(Some)
            .map_err(|e| ModelError::Json {
                file: "chat_template.jinja".into(),
                message: e.to_string(),
            }),
        None => Ok(None),
    }
}

/// The tokenizer of the model in `dir`, whose config.json is `config`.
pub fn read(dir: &Path, config: &Value) -> Result<GgufTokenizer, ModelError> {
    let bytes = read_required(dir, "tokenizer.json", TOKENIZER_FILE)?;
    let tokenizer = tokenizers::Tokenizer::from_bytes(&bytes)
        .map_err(|e| ModelError::Tokenizer(format!("tokenizer.json: {e}")))?;
    let vocab = tokenizer.get_vocab_size(true);
    let gen = optional_json(dir, "generation_config.json")?;
    let tc = optional_json(dir, "tokenizer_config.json")?;
    let mut ids = [None, None];
    for (slot, key) in ["bos_token_id", "eos_token_id"].iter().enumerate() {
        ids[slot] = match id_field("generation_config.json", &gen, key, vocab)? {
            Some(id) => Some(id),
            None => id_field("config.json", config, key, vocab)?,
        };
    }
    let bos = match ids[0] {
        Some(id) => Some(id),
        None => token_field(&tokenizer, &tc, "bos_token")?,
    };
    let eos = match ids[1] {
        Some(id) => Some(id),
        None => token_field(&tokenizer, &tc, "eos_token")?,
    };
    let template = chat_template(dir, &tc)?;
    Ok(GgufTokenizer::from_hf(tokenizer, bos, eos, template))
}
