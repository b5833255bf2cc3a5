//! `rocmforge generate`: text from a LLaMA-class model (GGUF file or Hugging Face directory)
//! through the KV-cache decoder.

use std::path::Path;
use std::time::Instant;

use rocmforge::frontend::llama::Precision;
use rocmforge::generate::{GenerateOptions, GenerateStats, Generator};
use rocmforge::ir::DType;
use serde::Serialize;

use crate::common::{file_name, pick_device};

/// `generate --json`.
#[derive(Serialize)]
pub(crate) struct GenerateReport {
    model: String,
    device: String,
    precision: Precision,
    prompt: String,
    prompt_ids: Vec<u32>,
    generated_ids: Vec<u32>,
    text: String,
    stats: GenerateStats,
}

/// What `generate` was asked for.
pub(crate) struct GenerateArgs<'a> {
    pub(crate) model: &'a Path,
    pub(crate) max_tokens: usize,
    pub(crate) device: Option<&'a str>,
    pub(crate) dtype: &'a str,
    pub(crate) max_context: Option<usize>,
    pub(crate) chat: bool,
    pub(crate) json: bool,
    pub(crate) replay: bool,
}

/// The ChatML turn `prompt` becomes under `--chat`, when the model's template
/// (`tokenizer.chat_template`) is ChatML-shaped; an error naming what it is otherwise.
pub(crate) fn chat_prompt(gen: &Generator, prompt: &str) -> Result<String, String> {
    let template = gen
        .model
        .tokenizer
        .chat_template
        .as_deref()
        .ok_or("--chat: the model has no chat template (tokenizer.chat_template)")?;
    if !(template.contains("<|im_start|>") && template.contains("<|im_end|>")) {
        return Err(format!(
            "--chat: the model's chat template is not ChatML (no <|im_start|>/<|im_end|>); \
             only ChatML is supported. It begins: {:?}",
            template.chars().take(120).collect::<String>()
        ));
    }
    Ok(format!(
        "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    ))
}

pub(crate) fn cmd_generate(prompt: &str, a: &GenerateArgs<'_>) -> Result<(), String> {
    let device = pick_device(a.device)?;
    let precision = match a.dtype {
        "f32" => Precision::F32,
        "f16" => Precision::F16,
        _ => Precision::quantized(if device.is_gpu() {
            DType::F16
        } else {
            DType::F32
        }),
    };
    let t0 = Instant::now();
    let model = rocmforge::frontend::LlamaModel::load(a.model).map_err(|e| e.to_string())?;
    // Which of the two forms --model named, so a directory taken for a file (or the reverse)
    // shows at once; on stderr, so --json output stays one document.
    eprintln!("{}: {}", a.model.display(), model.format);
    // A model with float weights only (most Hugging Face directories) has no blocks for `q4`
    // to keep: said, and run as floats.
    let precision = match (model.holds_blocks(), precision.quantized) {
        (false, true) => {
            eprintln!(
                "note: --dtype q4 keeps quantized blocks; {} has float weights only, so they \
                 run as {}",
                a.model.display(),
                precision.dtype
            );
            if precision.dtype == DType::F16 {
                Precision::F16
            } else {
                Precision::F32
            }
        }
        _ => precision,
    };
    // Without --max-context: the device's default, or the model's context where that is
    // shorter (tiny test models, small-context files), so `generate --model FILE` runs.
    let max_context = a.max_context.unwrap_or_else(|| {
        let default = if device.is_gpu() { 2048 } else { 512 };
        default.min(model.config.max_position_embeddings)
    });
    let options = GenerateOptions {
        precision,
        max_context,
        replay: a.replay,
        logits: false,
    };
    // `--dtype q4` asks for the stored blocks, i.e. for speed over exactness: on the fast CPU
    // device that is the integer path (8-bit activations times the weight blocks, as llama.cpp
    // does). f32 and f16 stay exact (within f32 rounding of the interpreter).
    let cpu_precision = if precision.quantized {
        rocmforge::cpu::Precision::Q8Activations
    } else {
        rocmforge::cpu::Precision::Exact
    };
    let mut gen = Generator::new_with_cpu_precision(model, &device, options, cpu_precision)
        .map_err(|e| e.to_string())?;
    let text_in = if a.chat {
        chat_prompt(&gen, prompt)?
    } else {
        prompt.to_string()
    };
    let prompt_ids = gen
        .model
        .tokenizer
        .encode(&text_in)
        .map_err(|e| e.to_string())?;
    if !a.json {
        eprintln!(
            "{} on {} ({}{}), loaded and compiled in {:.2} s",
            file_name(a.model),
            device.label(),
            precision.dtype,
            if precision.quantized {
                ", quantized blocks"
            } else {
                ""
            },
            t0.elapsed().as_secs_f64()
        );
    }
    // Streamed text: the decoding of every id so far minus what was printed, held back while
    // it ends in an incomplete UTF-8 sequence (a byte-level token's first half).
    let mut ids = Vec::new();
    let mut printed = String::new();
    let tokenizer = gen.model.tokenizer.clone();
    let json = a.json;
    let mut failed = None;
    // A context chosen for the model (no --max-context) ends generation at its end rather
    // than refusing a default --max-tokens that does not fit.
    let max_tokens = match a.max_context {
        None => a
            .max_tokens
            .min(max_context.saturating_sub(prompt_ids.len()).max(1)),
        Some(_) => a.max_tokens,
    };
    let out = gen
        .generate(&prompt_ids, max_tokens, |t| {
            ids.push(t);
            if json {
                return true;
            }
            match tokenizer.decode(&ids) {
                Ok(text) if !text.ends_with('\u{fffd}') => {
                    if let Some(new) = text.strip_prefix(printed.as_str()) {
                        out!("{new}");
                        use std::io::Write as _;
                        let _ = std::io::stdout().flush();
                    }
                    printed = text;
                }
                Ok(_) => {}
                Err(e) => {
                    failed = Some(e.to_string());
                    return false;
                }
            }
            true
        })
        .map_err(|e| e.to_string())?;
    if let Some(e) = failed {
        return Err(e);
    }
    let text = tokenizer.decode(&out.ids).map_err(|e| e.to_string())?;
    let st = &out.stats;
    if json {
        let report = GenerateReport {
            model: a.model.display().to_string(),
            device: device.label().to_string(),
            precision,
            prompt: text_in,
            prompt_ids,
            generated_ids: out.ids.clone(),
            text,
            stats: out.stats.clone(),
        };
        outln!(
            "{}",
            serde_json::to_string(&report).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    if let Some(rest) = text.strip_prefix(printed.as_str()) {
        out!("{rest}");
    }
    outln!();
    eprintln!(
        "prompt: {} tokens in {:.3} s ({:.1} tokens/s, bucket {}); decode: {} tokens in {:.3} s \
         ({:.1} tokens/s{}{}); stop: {:?}",
        st.prompt_tokens,
        st.prompt_seconds,
        st.prompt_tokens_per_s,
        st.prompt_bucket,
        st.decode_tokens,
        st.decode_seconds,
        st.decode_tokens_per_s,
        st.decode_ms_per_token
            .map(|ms| format!(", {ms:.3} ms/token"))
            .unwrap_or_default(),
        st.kernels_per_token
            .map(|k| format!(", {k} kernels/token"))
            .unwrap_or_default(),
        st.stop
    );
    Ok(())
}
