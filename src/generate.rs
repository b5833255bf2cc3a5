//! Text generation with a LLaMA-class model: the prompt in one pass (its length rounded up to a
//! bucket, so a few compiled plans serve every prompt), then one decode plan per token, both
//! reading and writing the same KV caches
//! ([`crate::compile::Executable::session_sharing`]). Only the token id
//! comes back to the host per step (the graphs end in an argmax), unless the options ask for the
//! logits too ([`GenerateOptions::logits`]: sampling on the host, as `rocmforge serve` does).
//!
//! Prefill plans are compiled when a prompt first needs their bucket (powers of two from
//! [`MIN_BUCKET`], capped at the maximum context) and kept; the decode plan is compiled once,
//! at load.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use thiserror::Error;

use crate::compile::{CompileError, CompileOptions, Session, SessionOptions};
use crate::frontend::llama::{io, Precision};
use crate::frontend::{LlamaModel, ModelError};
use crate::ir::{DType, Graph, GraphError, Shape, Tensor};
use crate::runtime::Device;

/// A host-side sampler: one step's logits (`[vocab]` f32) to the next token.
pub type SampleFn<'a> = &'a mut dyn FnMut(&[f32]) -> u32;

/// The smallest prefill bucket: shorter prompts are padded to it.
pub const MIN_BUCKET: usize = 16;

/// The bucket a prompt of `n` tokens is padded to under a maximum context of `max_context`:
/// the next power of two from [`MIN_BUCKET`], capped at the context. `compile --model --phase
/// prefill` shows the plan of the same bucket.
pub fn prompt_bucket(n: usize, max_context: usize) -> usize {
    n.max(MIN_BUCKET)
        .checked_next_power_of_two()
        .unwrap_or(usize::MAX)
        .min(max_context)
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GenerateOptions {
    pub precision: Precision,
    /// The KV caches' length: prompt plus generated tokens may not exceed it.
    pub max_context: usize,
    /// Replay the decode plan's captured launches (GPU).
    pub replay: bool,
    /// Compile the plans with the `logits` output as well as the argmax `token`, so that
    /// [`Generator::generate_with`] can sample on the host (one vocabulary row read back per
    /// token).
    pub logits: bool,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            precision: Precision::F32,
            max_context: 2048,
            replay: true,
            logits: false,
        }
    }
}

#[derive(Debug, Error)]
pub enum GenerateError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Graph(#[from] GraphError),
    #[error(transparent)]
    Compile(#[from] CompileError),
    #[error("the prompt is empty: generation needs at least one token")]
    EmptyPrompt,
    #[error(
        "{prompt} prompt tokens and up to {new} new ones need a context of {needed}, past the \
         maximum context {max_context}"
    )]
    ContextExceeded {
        prompt: usize,
        new: usize,
        needed: usize,
        max_context: usize,
    },
    #[error("a maximum context of {max_context} is outside 1..={limit} (the model's)")]
    MaxContext { max_context: usize, limit: usize },
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    TokenId { id: u32, vocab: usize },
    #[error("the model returned token {value}, outside the vocabulary")]
    BadToken { value: i64 },
    #[error("sampling needs the logits: the generator was built without GenerateOptions::logits")]
    NoLogits,
    #[error("the logits output is not f32")]
    LogitsType,
    #[error("the sampler picked token {id}, outside the vocabulary of {vocab}")]
    SampledId { id: u32, vocab: usize },
}

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// `max_new_tokens` were generated.
    Length,
    /// The model produced its end-of-sequence token (not returned).
    Eos,
    /// The callback asked to stop.
    Callback,
}

/// What one [`Generator::generate`] did.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GenerateStats {
    pub prompt_tokens: usize,
    /// The bucket the prompt was padded to.
    pub prompt_bucket: usize,
    /// The prefill, from setting its inputs to its token on the host (compiling excluded).
    pub prompt_seconds: f64,
    /// Decode steps run (the first generated token comes from the prefill).
    pub decode_tokens: usize,
    pub decode_seconds: f64,
    pub prompt_tokens_per_s: f64,
    pub decode_tokens_per_s: f64,
    /// Decode seconds per decode step, in milliseconds (`None` when no step ran): the figure
    /// llama.cpp's `tg` rows compare with.
    pub decode_ms_per_token: Option<f64>,
    /// Kernel launches per decode step (the decode plan's kernels, all launched every token);
    /// `None` on the CPU devices, which launch none.
    pub kernels_per_token: Option<usize>,
    pub stop: Stop,
}

/// The generated ids and the stats.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Generation {
    pub ids: Vec<u32>,
    pub stats: GenerateStats,
}

/// A model compiled for generation on one device.
pub struct Generator {
    pub model: LlamaModel,
    options: GenerateOptions,
    device: Device,
    compile: CompileOptions,
    /// The decode plan's session; it owns the caches every prefill session shares.
    decode: Session<'static>,
    prefills: BTreeMap<usize, Session<'static>>,
}

fn rate(tokens: usize, seconds: f64) -> f64 {
    if seconds > 0.0 {
        tokens as f64 / seconds
    } else {
        0.0
    }
}

impl Generator {
    /// Loads `path`, reads its weights for `options.precision` and compiles the decode plan.
    pub fn load(
        path: &Path,
        device: &Device,
        options: GenerateOptions,
    ) -> Result<Generator, GenerateError> {
        Generator::new(LlamaModel::load(path)?, device, options)
    }

    pub fn new(
        model: LlamaModel,
        device: &Device,
        options: GenerateOptions,
    ) -> Result<Generator, GenerateError> {
        Generator::new_with_cpu_precision(model, device, options, crate::cpu::Precision::Exact)
    }

    /// As [`Generator::new`], with the fast CPU device multiplying by quantized weights as
    /// `cpu_precision` says (8-bit activations are the caller's opt-in: faster, not exact).
    pub fn new_with_cpu_precision(
        model: LlamaModel,
        device: &Device,
        options: GenerateOptions,
        cpu_precision: crate::cpu::Precision,
    ) -> Result<Generator, GenerateError> {
        check_max_context(&model, options.max_context)?;
        let graph = model.kv_graph(1, options.max_context, options.precision, options.logits)?;
        let compile = step_compile_options(&model, &graph, cpu_precision)?;
        let exe = Arc::new(Graph::compile_with(graph, device, &compile)?);
        let decode = Session::new_with(
            exe,
            &SessionOptions {
                replay: options.replay,
            },
        )?;
        Ok(Generator {
            model,
            options,
            device: device.clone(),
            compile,
            decode,
            prefills: BTreeMap::new(),
        })
    }

    pub fn options(&self) -> &GenerateOptions {
        &self.options
    }

    pub fn path(&self) -> &PathBuf {
        &self.model.path
    }

    /// The bucket a prompt of `n` tokens is padded to.
    pub fn bucket(&self, n: usize) -> usize {
        prompt_bucket(n, self.options.max_context)
    }

    /// Kernel launches per decode step: the decode plan's kernels (each runs once a token,
    /// replayed or not); `None` on the CPU devices.
    pub fn kernels_per_token(&self) -> Option<usize> {
        self.decode.executable().plan().map(|p| p.kernels.len())
    }

    /// The prefill session of `bucket`, compiled on first use.
    fn prefill(&mut self, bucket: usize) -> Result<&mut Session<'static>, GenerateError> {
        if !self.prefills.contains_key(&bucket) {
            let graph = self.model.kv_graph(
                bucket,
                self.options.max_context,
                self.options.precision,
                self.options.logits,
            )?;
            let exe = Arc::new(Graph::compile_with(graph, &self.device, &self.compile)?);
            // A prefill runs once per prompt: capturing it would cost more than it saves.
            let session =
                Session::new_sharing(exe, &SessionOptions { replay: false }, &self.decode)?;
            self.prefills.insert(bucket, session);
        }
        Ok(self.prefills.get_mut(&bucket).expect("inserted above"))
    }

    /// Generates up to `max_new_tokens` greedily after `prompt`, calling `on_token` with each
    /// new token as soon as it is known (returning false stops); stops at the model's end of
    /// sequence token (not passed on). A prompt and budget past the maximum context is an error
    /// before anything runs.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        max_new_tokens: usize,
        on_token: impl FnMut(u32) -> bool,
    ) -> Result<Generation, GenerateError> {
        self.generate_with(prompt, max_new_tokens, None, on_token)
    }

    /// As [`Generator::generate`], with each token chosen by `sampler` from the step's logits
    /// (`[vocab]` f32) instead of the plan's argmax when one is given; that needs a generator
    /// built with [`GenerateOptions::logits`] ([`GenerateError::NoLogits`] otherwise, before
    /// anything runs).
    pub fn generate_with(
        &mut self,
        prompt: &[u32],
        max_new_tokens: usize,
        sampler: Option<SampleFn<'_>>,
        on_token: impl FnMut(u32) -> bool,
    ) -> Result<Generation, GenerateError> {
        self.generate_until(prompt, max_new_tokens, sampler, true, on_token)
    }

    /// As [`Generator::generate_with`]; with `stop_at_eos` false the end-of-sequence token is
    /// a token like any other (passed on, generation goes on to the budget), as serving
    /// benchmarks' `ignore_eos` asks.
    pub fn generate_until(
        &mut self,
        prompt: &[u32],
        max_new_tokens: usize,
        mut sampler: Option<SampleFn<'_>>,
        stop_at_eos: bool,
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<Generation, GenerateError> {
        if sampler.is_some() && !self.options.logits {
            return Err(GenerateError::NoLogits);
        }
        let n = prompt.len();
        if n == 0 {
            return Err(GenerateError::EmptyPrompt);
        }
        let max_context = self.options.max_context;
        let needed = n.saturating_add(max_new_tokens);
        if needed > max_context {
            return Err(GenerateError::ContextExceeded {
                prompt: n,
                new: max_new_tokens,
                needed,
                max_context,
            });
        }
        let vocab = self.model.config.vocab_size;
        if let Some(&id) = prompt.iter().find(|&&id| id as usize >= vocab) {
            return Err(GenerateError::TokenId { id, vocab });
        }
        let eos = self.model.tokenizer.eos.filter(|_| stop_at_eos);
        let bucket = self.bucket(n);
        let mut ids = Vec::new();
        let mut stop = Stop::Length;
        let mut token = None;
        // Compiling a bucket's plan the first time is not the prompt's time.
        if max_new_tokens > 0 {
            self.prefill(bucket)?;
        }
        let t0 = Instant::now();
        if max_new_tokens > 0 {
            let session = self.prefill(bucket)?;
            let mut padded: Vec<i64> = prompt.iter().map(|&i| i64::from(i)).collect();
            padded.resize(bucket, 0);
            let positions: Vec<i64> = (0..bucket as i64).collect();
            session.set_input(io::INPUT_IDS, &int(DType::I64, &[1, bucket], padded))?;
            session.set_input(io::POSITIONS, &int(DType::I32, &[bucket], positions))?;
            session.set_input(io::START, &one(0))?;
            session.set_input(io::KV_LEN, &one(bucket as i64))?;
            session.set_input(io::LAST, &one(n as i64 - 1))?;
            session.run()?;
            token = Some(pick(session, vocab, &mut sampler)?);
        }
        let prompt_seconds = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let mut decode_tokens = 0;
        while let Some(t) = token.take() {
            if Some(t) == eos {
                stop = Stop::Eos;
                break;
            }
            ids.push(t);
            if !on_token(t) {
                stop = Stop::Callback;
                break;
            }
            if ids.len() == max_new_tokens {
                break;
            }
            // Token `t` sits at position n + len − 1 and attends to everything before it.
            let pos = (n + ids.len() - 1) as i64;
            let s = &mut self.decode;
            s.set_input(io::INPUT_IDS, &int(DType::I64, &[1, 1], vec![i64::from(t)]))?;
            s.set_input(io::POSITIONS, &int(DType::I32, &[1], vec![pos]))?;
            s.set_input(io::START, &one(pos))?;
            s.set_input(io::KV_LEN, &one(pos + 1))?;
            s.set_input(io::LAST, &one(0))?;
            s.run()?;
            decode_tokens += 1;
            token = Some(pick(s, vocab, &mut sampler)?);
        }
        let decode_seconds = t1.elapsed().as_secs_f64();
        Ok(Generation {
            ids,
            stats: GenerateStats {
                prompt_tokens: n,
                prompt_bucket: bucket,
                prompt_seconds,
                decode_tokens,
                decode_seconds,
                prompt_tokens_per_s: rate(n, prompt_seconds),
                decode_tokens_per_s: rate(decode_tokens, decode_seconds),
                decode_ms_per_token: (decode_tokens > 0)
                    .then(|| decode_seconds * 1e3 / decode_tokens as f64),
                kernels_per_token: self.kernels_per_token(),
                stop,
            },
        })
    }
}

/// `max_context` is within `1..=` the model's positions.
pub(crate) fn check_max_context(
    model: &LlamaModel,
    max_context: usize,
) -> Result<(), GenerateError> {
    let limit = model.config.max_position_embeddings;
    if max_context == 0 || max_context > limit {
        return Err(GenerateError::MaxContext { max_context, limit });
    }
    Ok(())
}

/// The compile options every step plan of `model` shares: the weights `graph` (one step of
/// them) reads, read once for every plan.
pub(crate) fn step_compile_options(
    model: &LlamaModel,
    graph: &Graph,
    cpu_precision: crate::cpu::Precision,
) -> Result<CompileOptions, GenerateError> {
    Ok(CompileOptions {
        weights: model.weights_for(graph)?,
        quantized: model.quantized_for(graph)?,
        progress: false,
        cpu_precision,
        ..CompileOptions::default()
    })
}

fn int(dtype: DType, dims: &[usize], values: Vec<i64>) -> Tensor {
    Tensor::from_i64(dtype, Shape::new(dims.to_vec()), values).expect("sized by the caller")
}

/// An i32 `[1]`.
fn one(v: i64) -> Tensor {
    int(DType::I32, &[1], vec![v])
}

/// The run's token: the sampler's choice from the logits when there is a sampler, else the
/// plan's argmax.
fn pick(
    session: &Session<'_>,
    vocab: usize,
    sampler: &mut Option<SampleFn<'_>>,
) -> Result<u32, GenerateError> {
    let Some(sample) = sampler else {
        return read_token(session, vocab);
    };
    let logits = session.output(io::LOGITS)?;
    // The LM head casts to f32 before the output (frontend::llama::lower), so this is f32.
    let row = logits.as_f32().ok_or(GenerateError::LogitsType)?;
    let id = sample(&row[..vocab.min(row.len())]);
    if id as usize >= vocab {
        return Err(GenerateError::SampledId { id, vocab });
    }
    Ok(id)
}

/// The token a run produced (the argmax output: i32 `[1]`).
fn read_token(session: &Session<'_>, vocab: usize) -> Result<u32, GenerateError> {
    let t = session.output(io::TOKEN)?;
    let value = t.as_i64().and_then(|v| v.first().copied()).unwrap_or(-1);
    match u32::try_from(value) {
        Ok(id) if (id as usize) < vocab => Ok(id),
        _ => Err(GenerateError::BadToken { value }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_pad_to_the_next_power_of_two_from_the_minimum_within_the_context() {
        // (tokens, max context, bucket), worked by hand.
        for (n, max, want) in [
            (1, 2048, 16),
            (16, 2048, 16),
            (17, 2048, 32),
            (100, 2048, 128),
            (128, 2048, 128),
            (129, 2048, 256),
            (1500, 2048, 2048),
            (40, 48, 48),
            (5, 8, 8),
        ] {
            assert_eq!(prompt_bucket(n, max), want, "{n} tokens, context {max}");
        }
    }
}
