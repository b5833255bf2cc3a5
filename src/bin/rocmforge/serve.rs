//! `rocmforge serve`: the OpenAI-compatible server (rocmforge::serve) on a tokio runtime.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rocmforge::frontend::llama::Precision;
use rocmforge::generate::{GenerateOptions, Generator};
use rocmforge::ir::DType;
use rocmforge::serve::batched::{kv_block_bytes, BatchOptions, BatchedGenerator, BLOCK_SIZE};
use rocmforge::serve::{AppState, ModelInfo, Scheduler};

use crate::common::{file_name, pick_device};

/// What `serve` was asked for.
pub(crate) struct ServeArgs<'a> {
    pub(crate) model: &'a Path,
    pub(crate) host: IpAddr,
    pub(crate) port: u16,
    pub(crate) device: Option<&'a str>,
    pub(crate) dtype: &'a str,
    pub(crate) max_context: Option<usize>,
    pub(crate) max_queue: usize,
    pub(crate) max_batch: Option<usize>,
    pub(crate) kv_memory: Option<usize>,
    pub(crate) prefill_chunk: usize,
    pub(crate) api_key: Option<&'a str>,
    pub(crate) greedy: bool,
    pub(crate) replay: bool,
    pub(crate) tensor_core_gemv: bool,
    pub(crate) shutdown_grace: Duration,
}

pub(crate) fn cmd_serve(a: &ServeArgs<'_>) -> Result<(), String> {
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
    let options = GenerateOptions {
        precision,
        max_context: a
            .max_context
            .unwrap_or(if device.is_gpu() { 2048 } else { 512 }),
        replay: a.replay,
        logits: !a.greedy,
    };
    // As `generate`: q4 on the fast CPU device is the integer path.
    let cpu_precision = if precision.quantized {
        rocmforge::cpu::Precision::Q8Activations
    } else {
        rocmforge::cpu::Precision::Exact
    };
    let t0 = Instant::now();
    let id = file_name(a.model);
    let path = a.model.to_path_buf();
    let label = device.label().to_string();
    let max_context = options.max_context;
    let logits = options.logits;
    let model_id = id.clone();
    let max_batch = a.max_batch.unwrap_or(if device.is_gpu() { 64 } else { 8 });
    let model = rocmforge::frontend::LlamaModel::load(&path).map_err(|e| e.to_string())?;
    // A sliding window (Mistral) is an attribute of the paged attention too: such a model
    // batches like any other.
    let batched = max_batch > 1;
    let info_of = move |model: &rocmforge::frontend::LlamaModel| ModelInfo {
        id: model_id,
        tokenizer: model.tokenizer.clone(),
        vocab: model.config.vocab_size,
        max_context,
        logits,
    };
    let mut batch_note = String::new();
    // The worker thread compiles the model and keeps it: device sessions stay on the thread
    // that made them.
    let (scheduler, info) = if batched {
        let block_bytes = kv_block_bytes(&model, BLOCK_SIZE, precision.dtype)
            .ok_or("the model's KV block size overflows")?;
        let kv_memory = a.kv_memory.unwrap_or_else(|| {
            max_batch.saturating_mul(max_context.div_ceil(BLOCK_SIZE)) * block_bytes
        });
        let blocks = kv_memory / block_bytes.max(1);
        let prefill_chunk = a.prefill_chunk;
        let chunks = match prefill_chunk {
            0 => "whole prompts".to_string(),
            n => format!("prompts in chunks of {n} tokens"),
        };
        batch_note = format!(
            ", up to {max_batch} requests at once, KV cache {:.1} MiB = {blocks} blocks of \
             {BLOCK_SIZE} tokens, {chunks} between decode steps",
            kv_memory as f64 / (1u64 << 20) as f64
        );
        let options = BatchOptions {
            precision,
            max_context,
            block_size: BLOCK_SIZE,
            kv_memory,
            max_batch,
            replay: a.replay,
            logits,
            prefill_chunk,
            tensor_core_gemv: a.tensor_core_gemv,
        };
        Scheduler::start_batched(a.max_queue, move || {
            let info = info_of(&model);
            let mut gen = BatchedGenerator::new(model, &device, options, cpu_precision)
                .map_err(|e| e.to_string())?;
            // Every batch size's decode plan now, so no step waits on a compile (prompt
            // plans are compiled per length bucket when a prompt first needs one).
            gen.warm(1).map_err(|e| e.to_string())?;
            Ok((gen, info))
        })?
    } else {
        Scheduler::start(a.max_queue, move || {
            let info = info_of(&model);
            let gen = Generator::new_with_cpu_precision(model, &device, options, cpu_precision)
                .map_err(|e| e.to_string())?;
            Ok((gen, info))
        })?
    };
    eprintln!(
        "{id} on {label} ({}{}, context {max_context}{}{batch_note}), loaded and compiled in \
         {:.2} s",
        precision.dtype,
        if precision.quantized {
            ", quantized blocks"
        } else {
            ""
        },
        if logits { "" } else { ", greedy only" },
        t0.elapsed().as_secs_f64()
    );
    let state = Arc::new(AppState::new(
        info,
        scheduler,
        a.api_key.map(str::to_string),
    ));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting the tokio runtime: {e}"))?;
    let grace = a.shutdown_grace;
    let addr = SocketAddr::new(a.host, a.port);
    let loopback = a.host.is_loopback();
    let has_key = a.api_key.is_some();
    let s = state.clone();
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("binding {addr}: {e}"))?;
        let bound = listener
            .local_addr()
            .map_err(|e| format!("the bound address: {e}"))?;
        if loopback {
            eprintln!(
                "listening on http://{bound} (loopback only; --host 0.0.0.0 listens on every \
                 interface)"
            );
        } else {
            eprintln!("listening on http://{bound} (reachable from other machines)");
            if !has_key {
                eprintln!("warning: no --api-key: anyone who can reach this port can use it");
            }
        }
        let s2 = s.clone();
        let shutdown = async move {
            wait_for_signal().await;
            eprintln!(
                "shutting down: no new requests; in-flight ones have {:.0} s to finish",
                grace.as_secs_f64()
            );
            s2.begin_shutdown(grace);
        };
        rocmforge::serve::serve(listener, s, shutdown)
            .await
            .map_err(|e| format!("serving: {e}"))
    })?;
    // Every connection is closed: the worker finishes (or cancels) what is queued and ends.
    state.scheduler.cancel_all();
    state.scheduler.shutdown();
    eprintln!("stopped");
    Ok(())
}

/// Ctrl-C, or SIGTERM on Unix.
async fn wait_for_signal() {
    let ctrl_c = async {
        // Without a handler there is nothing to wait for but SIGTERM.
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => ctrl_c.await,
        }
    }
    #[cfg(not(unix))]
    ctrl_c.await;
}
