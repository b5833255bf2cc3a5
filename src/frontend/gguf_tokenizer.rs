//! The tokenizer a GGUF file describes in its `tokenizer.ggml.*` metadata, built with the
//! `tokenizers` crate: GPT-2-style byte-level BPE from the token list and the merges, the
//! pre-tokenizer `tokenizer.ggml.pre` names (as llama.cpp's `llama-vocab.cpp` defines it),
//! control tokens (token type 3) as special tokens, byte-level decoding. A tokenizer model or
//! pre-tokenizer this code does not implement is an error, never an approximation.

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{AddedToken, Tokenizer};

use super::gguf::{Gguf, GgufArray};
use super::ModelError;

/// llama.cpp's token types (`llama_token_type`).
const TOKEN_CONTROL: i64 = 3;
const TOKEN_USER_DEFINED: i64 = 4;

/// The pre-tokenizers implemented, by their `tokenizer.ggml.pre` name.
const PRE_TOKENIZERS: &str = "smollm, gpt-2 (or gpt2)";

/// A tokenizer read from GGUF metadata, or from a Hugging Face directory's tokenizer.json
/// (`hf_tokenizer.rs`): the decoders' one tokenizer type.
#[derive(Clone)]
pub struct GgufTokenizer {
    tokenizer: Tokenizer,
    /// `tokenizer.ggml.bos_token_id`, prepended when `add_bos` is set.
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// `tokenizer.ggml.add_bos_token` (false when absent, as llama.cpp's BPE default is).
    pub add_bos: bool,
    /// `tokenizer.chat_template`, when the file has one.
    pub chat_template: Option<String>,
    /// The ids of the control tokens (`<|im_start|>`, ...).
    pub control: Vec<u32>,
    /// Encode through the tokenizer's post-processor (a Hugging Face tokenizer.json, whose
    /// template adds BOS as transformers does); a GGUF tokenizer has none and uses `add_bos`.
    post_process: bool,
}

fn unsupported(field: &str, value: &str, supported: &str) -> ModelError {
    ModelError::Unsupported {
        field: field.into(),
        value: value.into(),
        supported: supported.into(),
    }
}

fn tok_err(e: impl std::fmt::Display) -> ModelError {
    ModelError::Tokenizer(e.to_string())
}

/// An optional token id that must name a token.
fn token_id(g: &Gguf, key: &str, vocab: usize) -> Result<Option<u32>, ModelError> {
    if g.get(key).is_none() {
        return Ok(None);
    }
    let id = g.u32(key)?;
    if id as usize >= vocab {
        return Err(tok_err(format!(
            "{key} is {id}, past the {vocab} tokens of tokenizer.ggml.tokens"
        )));
    }
    Ok(Some(id))
}

impl GgufTokenizer {
    pub fn from_gguf(g: &Gguf) -> Result<GgufTokenizer, ModelError> {
        let model = g.str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(unsupported(
                "tokenizer.ggml.model",
                model,
                "gpt2 (byte-level BPE)",
            ));
        }
        // llama.cpp reads an absent `pre` as "default", which for BPE is a regex of its own;
        // a file without it is refused rather than guessed at.
        let pre = g.str("tokenizer.ggml.pre")?;
        let pre_tokenizer = match pre {
            // llama.cpp: `\p{N}` (each digit alone), then GPT-2's regex, then bytes to symbols.
            "smollm" => Sequence::new(vec![
                Digits::new(true).into(),
                ByteLevel::new(false, false, true).into(),
            ]),
            // llama.cpp's name is "gpt-2"; "gpt2" is kept for the files that used it here.
            "gpt-2" | "gpt2" => Sequence::new(vec![ByteLevel::new(false, false, true).into()]),
            other => return Err(unsupported("tokenizer.ggml.pre", other, PRE_TOKENIZERS)),
        };
        let tokens = g.strings("tokenizer.ggml.tokens")?;
        let n = tokens.len();
        if n == 0 || n > u32::MAX as usize {
            return Err(tok_err(format!("{n} tokens in tokenizer.ggml.tokens")));
        }
        let types: Vec<i64> = match g.get("tokenizer.ggml.token_type") {
            None => vec![1; n],
            Some(_) => g
                .array("tokenizer.ggml.token_type")?
                .to_i64()
                .filter(|t| t.len() == n)
                .ok_or_else(|| tok_err("tokenizer.ggml.token_type is not one integer per token"))?,
        };
        let mut vocab = Vocab::default();
        for (id, t) in tokens.iter().enumerate() {
            if vocab.insert(t.clone(), id as u32).is_some() {
                return Err(tok_err(format!(
                    "token `{t}` appears twice in tokenizer.ggml.tokens"
                )));
            }
        }
        let merges = match g.array("tokenizer.ggml.merges")? {
            GgufArray::String(m) => m
                .iter()
                .map(|m| {
                    m.split_once(' ')
                        .map(|(a, b)| (a.to_string(), b.to_string()))
                        .ok_or_else(|| tok_err(format!("merge `{m}` is not two tokens")))
                })
                .collect::<Result<Vec<_>, _>>()?,
            _ => return Err(tok_err("tokenizer.ggml.merges is not an array of strings")),
        };
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(tok_err)?;
        let mut tokenizer = Tokenizer::new(bpe);
        tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
        tokenizer.with_decoder(Some(ByteLevel::default()));
        let mut control = Vec::new();
        let mut special = Vec::new();
        let mut user = Vec::new();
        for (id, (t, &ty)) in tokens.iter().zip(&types).enumerate() {
            match ty {
                TOKEN_CONTROL => {
                    control.push(id as u32);
                    special.push(AddedToken::from(t.clone(), true));
                }
                TOKEN_USER_DEFINED => user.push(AddedToken::from(t.clone(), false)),
                _ => {}
            }
        }
        tokenizer.add_special_tokens(&special);
        tokenizer.add_tokens(&user);
        let add_bos = match g.get("tokenizer.ggml.add_bos_token") {
            None => false,
            Some(_) => g.bool("tokenizer.ggml.add_bos_token")?,
        };
        let bos = token_id(g, "tokenizer.ggml.bos_token_id", n)?;
        if add_bos && bos.is_none() {
            return Err(tok_err(
                "tokenizer.ggml.add_bos_token is true but there is no bos_token_id",
            ));
        }
        let chat_template = match g.get("tokenizer.chat_template") {
            None => None,
            Some(_) => Some(g.str("tokenizer.chat_template")?.to_string()),
        };
        Ok(GgufTokenizer {
            tokenizer,
            bos,
            eos: token_id(g, "tokenizer.ggml.eos_token_id", n)?,
            add_bos,
            chat_template,
            control,
            post_process: false,
        })
    }

    /// A Hugging Face tokenizer.json's tokenizer: special tokens added as its post-processor
    /// says (no `add_bos`), control tokens its added special tokens.
    pub(super) fn from_hf(
        tokenizer: Tokenizer,
        bos: Option<u32>,
        eos: Option<u32>,
        chat_template: Option<String>,
    ) -> GgufTokenizer {
        let mut control: Vec<u32> = tokenizer
            .get_added_tokens_decoder()
            .iter()
            .filter(|(_, t)| t.special)
            .map(|(&id, _)| id)
            .collect();
        control.sort_unstable();
        GgufTokenizer {
            tokenizer,
            bos,
            eos,
            add_bos: false,
            chat_template,
            control,
            post_process: true,
        }
    }

    /// Token ids of `text` (control tokens written in it are recognised as such), with BOS
    /// first when the file asks for it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        let e = self
            .tokenizer
            .encode(text, self.post_process)
            .map_err(tok_err)?;
        let mut ids = Vec::with_capacity(e.len() + 1);
        if self.add_bos {
            ids.extend(self.bos);
        }
        ids.extend_from_slice(e.get_ids());
        Ok(ids)
    }

    /// The text of `ids` (control tokens included, as their text).
    pub fn decode(&self, ids: &[u32]) -> Result<String, ModelError> {
        self.tokenizer.decode(ids, false).map_err(tok_err)
    }

    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &Tokenizer {
        &self.tokenizer
    }
}
