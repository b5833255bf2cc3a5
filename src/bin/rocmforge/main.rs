//! The rocmforge command line: the clap definitions and the dispatch to one module per command.
//! It uses the library's public API only.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use rocmforge::compile::bundle::DEFAULT_MAX_BUNDLE_BYTES;
use rocmforge::frontend;
use rocmforge::runtime::AmdCompilerChoice;

/// `println!` that ends the program quietly when stdout is closed (`rocmforge ... | head`).
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout(), $($arg)*) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
        }
    }};
}

/// `print!` with the same behaviour.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = write!(std::io::stdout(), $($arg)*) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
        }
    }};
}

mod cache;
mod common;
mod compile;
mod compile_model;
mod embed;
mod generate;
mod replay;
mod run;
mod serve;
mod show;

use compile::CodegenArgs;
use compile_model::ModelArgs;
use generate::GenerateArgs;
use replay::ReplayArgs;
use serve::ServeArgs;

#[derive(Parser)]
#[command(
    name = "rocmforge",
    version,
    about = "A compute-graph compiler for transformer models",
    long_about = "rocmforge lowers transformer models into an op graph, fuses attention and the \
                  elementwise chains around it, emits HIP kernels and runs them. Its CPU \
                  interpreter is the numeric reference for every other path.\n\n\
                  Graphs are JSON files (see docs/graph-format.md); examples are in graphs/.",
    after_help = "Examples:\n  rocmforge run graphs/llama_block.json\n  rocmforge run graphs/attention.json --tune\n  RUST_LOG=rocmforge=debug rocmforge run graphs/bert_layer.json   (stage times on stderr)\n  rocmforge run graphs/attention.json --seed 7 --values 4\n  rocmforge show graphs/bert_layer.json --dot bert.dot && dot -Tsvg bert.dot -o bert.svg"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Worker threads of the fast CPU device (default: ROCMFORGE_THREADS, else one per
    /// physical core).
    #[arg(long, global = true, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    threads: Option<u16>,
}

#[derive(Subcommand)]
enum Command {
    /// Run a graph on seeded random inputs and print statistics of each output.
    ///
    /// Inputs are drawn as each input's `sample` attribute says (standard normal by default;
    /// padding masks and token ranges are supported); weights a file does not supply are drawn
    /// from the same seed. The same seed gives the same numbers on every machine.
    Run {
        /// The graph file (JSON).
        file: PathBuf,
        /// Seed for random inputs and weights.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// How many leading values of each output to print.
        #[arg(long, default_value_t = 8)]
        values: usize,
        /// Device: cpu (fast), interp (the reference interpreter), cuda:N or hip:N (default: ROCMFORGE_DEVICE, else the best one found).
        #[arg(long)]
        device: Option<String>,
        /// Also run the interpreter on the unfused graph and print the error of each output.
        #[arg(long)]
        verify: bool,
        /// Compile without fusion (the baseline).
        #[arg(long)]
        no_fuse: bool,
        /// Time every candidate configuration (tile sizes, warps, stages) of the kernels that
        /// have several and keep the fastest. Results are kept per device in the kernel cache
        /// (`rocmforge cache ls` lists them), so only the first compile of a problem pays for it.
        #[arg(long)]
        tune: bool,
        /// Opt-in TF32: f32 matrix products (GEMMs, attention's QKᵀ and P·V) on the GPU's TF32
        /// matrix instructions (NVIDIA sm_80+, AMD gfx942): operands rounded to a 10-bit
        /// mantissa, f32 accumulation, so results differ from exact f32 by about 1e-3 relative
        /// (exact f32: ~1e-6). Never the default; a target without TF32 runs exact f32 and its
        /// plan says so. f16/bf16 are unaffected.
        #[arg(long)]
        tf32: bool,
    },
    /// Sentence embeddings with a BERT-class model directory (all-MiniLM-L6-v2: scripts/fetch-models).
    ///
    /// Prints each embedding (first values and norm) and the cosine similarity matrix. Texts of
    /// different lengths are padded and masked in one batch.
    Embed {
        /// A Hugging Face model directory (config.json, model.safetensors, tokenizer.json).
        #[arg(long, value_name = "DIR", default_value_os_t = frontend::model_cache_dir(frontend::MINILM))]
        model: PathBuf,
        /// Device: cpu (fast), interp (the reference interpreter), cuda:N or hip:N (default: the best one found).
        #[arg(long)]
        device: Option<String>,
        /// How many leading values of each embedding to print.
        #[arg(long, default_value_t = 6)]
        values: usize,
        /// Compute dtype: f32, or f16/bf16 as after PyTorch's `model.to(dtype)` (weights converted
        /// on load; pooling and normalisation stay f32). f16 runs on tensor cores on NVIDIA sm_80+.
        #[arg(long, default_value = "f32", value_parser = ["f32", "f16", "bf16"])]
        dtype: String,
        /// Time every candidate configuration (tile sizes, warps, stages) of the kernels that
        /// have several and keep the fastest. Results are kept per device in the kernel cache
        /// (`rocmforge cache ls` lists them), so only the first compile of a problem pays for it.
        #[arg(long)]
        tune: bool,
        /// Opt-in TF32: f32 matrix products (GEMMs, attention's QKᵀ and P·V) on the GPU's TF32
        /// matrix instructions (NVIDIA sm_80+, AMD gfx942): operands rounded to a 10-bit
        /// mantissa, f32 accumulation, so results differ from exact f32 by about 1e-3 relative
        /// (exact f32: ~1e-6). Never the default; a target without TF32 runs exact f32 and its
        /// plan says so. f16/bf16 are unaffected.
        #[arg(long)]
        tf32: bool,
        /// Print one JSON object instead: the embeddings (every value) and the cosine
        /// similarity matrix.
        #[arg(long)]
        json: bool,
        /// The texts.
        #[arg(required = true)]
        texts: Vec<String>,
    },
    /// Generate text with a LLaMA-class model: a GGUF file or a Hugging Face directory
    /// (SmolLM2-135M-Instruct's GGUF by default: scripts/fetch-models).
    ///
    /// The prompt runs in one pass (padded to a power-of-two bucket, each bucket's plan compiled
    /// once), then one replayed decode plan per token reading and writing the KV cache; only
    /// the token id comes back per step. Greedy (argmax) decoding; stops at the model's end of
    /// sequence token or after --max-tokens. Text streams to stdout as tokens arrive; the
    /// prompt and decode speeds (tokens/s) go to stderr at the end.
    #[command(
        after_help = "Examples:\n  rocmforge generate \"The capital of France is\"\n  rocmforge generate --chat --max-tokens 64 \"What is the capital of France?\"\n  rocmforge generate --device cpu --max-tokens 3 --json \"Hello\"\n  rocmforge generate --model ~/models/Qwen2.5-0.5B-Instruct --chat \"Hi\"   (a Hugging Face directory)"
    )]
    Generate {
        /// A GGUF file, or a Hugging Face directory (config.json, model.safetensors or its
        /// shards, tokenizer.json); stderr says which was found.
        #[arg(long, value_name = "FILE|DIR", default_value_os_t = frontend::model_cache_dir(frontend::SMOLLM2).join(frontend::SMOLLM2_GGUF))]
        model: PathBuf,
        /// The most tokens to generate.
        #[arg(long, value_name = "N", default_value_t = 128)]
        max_tokens: usize,
        /// Device: cpu (fast), interp (the reference interpreter), cuda:N or hip:N (default: ROCMFORGE_DEVICE, else the best one found).
        #[arg(long)]
        device: Option<String>,
        /// Weights and activations: f32 (weights dequantized), f16 (weights dequantized once to
        /// f16, f16 activations), or q4 (the file's Q4_1/Q8_0 blocks kept as stored and
        /// dequantized inside the matrix products; f16 activations on a GPU, f32 on the CPU).
        #[arg(long, default_value = "f32", value_parser = ["f32", "f16", "q4"])]
        dtype: String,
        /// The KV cache's length in tokens: prompt plus --max-tokens may not exceed it.
        /// Default: 2048 on a GPU, 512 on the CPU devices.
        #[arg(long, value_name = "N")]
        max_context: Option<usize>,
        /// Wrap the prompt in the model's ChatML template (a user turn, then the assistant's).
        #[arg(long)]
        chat: bool,
        /// Print one JSON object at the end instead of streaming: prompt and generated token
        /// ids, the text and the timings.
        #[arg(long)]
        json: bool,
        /// Launch the decode plan's kernels one by one instead of replaying a captured graph.
        #[arg(long)]
        no_replay: bool,
        /// The prompt.
        prompt: String,
    },
    /// Serve a LLaMA-class model (GGUF file or Hugging Face directory) over an OpenAI-compatible HTTP API.
    ///
    /// POST /v1/completions and /v1/chat/completions (the model's chat template; `stream: true`
    /// for server-sent events), GET /v1/models, /health and /metrics (Prometheus text). Up to
    /// --max-batch requests generate at once, decoded together through a paged KV cache
    /// (continuous batching: a request joins the batch when it arrives and leaves when it ends);
    /// up to --max-queue more wait, further ones are answered 429 with Retry-After. Greedy at temperature 0, else temperature/top-k/top-p with the
    /// request's seed; stop strings, EOS and max_tokens end a completion. Binds loopback by
    /// default. Ctrl-C or SIGTERM stops accepting, lets in-flight requests finish (at most
    /// --shutdown-grace seconds, then cancels them) and exits 0.
    #[command(
        after_help = "Examples:\n  rocmforge serve --port 8080\n  curl -s localhost:8080/v1/completions -H 'Content-Type: application/json' -d '{\"model\":\"SmolLM2-135M-Instruct.Q4_1.gguf\",\"prompt\":\"The capital of France is\",\"max_tokens\":16,\"temperature\":0}'"
    )]
    Serve {
        /// A GGUF file, or a Hugging Face directory (config.json, model.safetensors or its
        /// shards, tokenizer.json); stderr says which was found.
        #[arg(long, value_name = "FILE|DIR", default_value_os_t = frontend::model_cache_dir(frontend::SMOLLM2).join(frontend::SMOLLM2_GGUF))]
        model: PathBuf,
        /// The address to listen on (loopback by default: 0.0.0.0 listens on every interface).
        #[arg(long, default_value = "127.0.0.1")]
        host: std::net::IpAddr,
        /// The port (0: any free one, printed at start).
        #[arg(long, default_value_t = 8080)]
        port: u16,
        /// Device: cpu (fast), interp (the reference interpreter), cuda:N or hip:N (default: ROCMFORGE_DEVICE, else the best one found).
        #[arg(long)]
        device: Option<String>,
        /// Weights and activations, as for `generate`: f32, f16 or q4.
        #[arg(long, default_value = "f32", value_parser = ["f32", "f16", "q4"])]
        dtype: String,
        /// The KV cache's length in tokens: a request's prompt plus max_tokens may not exceed
        /// it. Default: 2048 on a GPU, 512 on the CPU devices.
        #[arg(long, value_name = "N")]
        max_context: Option<usize>,
        /// The most requests waiting besides those generating; more are answered 429.
        #[arg(long, value_name = "N", default_value_t = 16)]
        max_queue: usize,
        /// The most requests generating at once (one decode step advances them all). 1: one
        /// at a time through a contiguous cache.
        /// Default: 64 on a GPU, 8 on the CPU devices.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
        max_batch: Option<u16>,
        /// Bytes of the paged KV cache (every layer's K and V blocks of 16 tokens). Default:
        /// room for --max-batch requests of the full --max-context; said at start.
        #[arg(long, value_name = "BYTES")]
        kv_memory: Option<usize>,
        /// The most prompt tokens prefilled between two decode steps of the running requests:
        /// a longer prompt runs in chunks of N, each followed by a step, so a burst of new
        /// prompts does not stall the streams already generating (their inter-token latency).
        /// 0: every new prompt whole before the next step.
        #[arg(long, value_name = "N", default_value_t = 256)]
        prefill_chunk: usize,
        /// Require `Authorization: Bearer KEY` on every route but /health.
        #[arg(long, value_name = "KEY")]
        api_key: Option<String>,
        /// Compile the plans without the logits output: greedy only (temperature 0), one token
        /// id read back per step instead of a vocabulary row.
        #[arg(long)]
        greedy: bool,
        /// Launch the decode plan's kernels one by one instead of replaying a captured graph.
        #[arg(long)]
        no_replay: bool,
        /// Run the GEMVs of decode steps of 17 to 64 requests on CUDA cores instead of the
        /// GPU's tensor cores (NVIDIA's mma.sync m16n8k16 with f16/bf16 weights, the default
        /// there: 1.4-1.5× faster steps at 32-64 requests on an H100, docs/performance.md).
        #[arg(long)]
        no_tensor_core_gemv: bool,
        /// Seconds in-flight requests get to finish after Ctrl-C/SIGTERM before they are
        /// cancelled.
        #[arg(long, value_name = "SECONDS", default_value_t = 30)]
        shutdown_grace: u64,
    },
    /// Inspect or clear the on-disk kernel cache (ROCMFORGE_CACHE_DIR, else ~/.cache/rocmforge):
    /// compiled kernels and tuning results.
    Cache {
        #[command(subcommand)]
        action: CacheAction,
    },
    /// Optimise a graph with the default pass pipeline and print the result.
    ///
    /// The pipeline cleans up (canonicalisation, constant folding, CSE, dead code), recognises
    /// decomposed softmax, norms and activations, fuses attention into FlashAttention and fuses
    /// the elementwise chains left around it.
    ///
    /// With --model FILE.gguf (or a Hugging Face directory) instead of a graph file: the plan a LLaMA-class model runs in
    /// `generate` (the decode step, or the prompt's pass), made for --target without a GPU.
    /// It prints every launch in order (kernel, node, grid, block, buffers) and one line on
    /// stderr with the kernels per token; --emit hip writes one .hip per distinct kernel and
    /// that list as plan.txt; --json prints a summary (kernels per token and per layer,
    /// launches per family); --report compiles every distinct kernel (AMD targets).
    #[command(
        after_help = "Examples:\n  rocmforge compile graphs/llama_block.json --target gfx90a --emit hip --out kernels\n  rocmforge compile --model SmolLM2-135M-Instruct.Q4_1.gguf --phase decode --precision q --target sm_90 --emit hip --out decode\n  rocmforge compile --model model.gguf --phase prefill --prompt-len 100 --target gfx90a --json\n  rocmforge compile --model model.gguf --phase decode --target gfx1100 --report\n  rocmforge compile --model model.gguf --phase batched --batch 8 --precision f16 --target sm_90 --json"
    )]
    Compile {
        /// The graph file (JSON).
        #[arg(required_unless_present = "model", conflicts_with = "model")]
        file: Option<PathBuf>,
        /// A LLaMA-class model (GGUF file or Hugging Face directory) instead of a graph file
        /// (needs --target).
        #[arg(long, value_name = "FILE|DIR")]
        model: Option<PathBuf>,
        /// With --model: `decode` (one token through the KV cache, what every generated token
        /// runs), `prefill` (the prompt in one pass, padded to its power-of-two bucket) or
        /// `batched` (`serve`'s decode step of --batch sequences through the paged KV cache,
        /// in blocks of 16 tokens).
        #[arg(long, requires = "model", value_parser = ["decode", "prefill", "batched"])]
        phase: Option<String>,
        /// With --phase prefill: the prompt's tokens (default 128); the plan is of the bucket
        /// `generate` pads it to.
        #[arg(long, value_name = "N", requires = "model")]
        prompt_len: Option<usize>,
        /// With --phase batched: the sequences decoded together (default 32); the plan is of
        /// the power-of-two bucket `serve` runs them in.
        #[arg(long, value_name = "N", requires = "model")]
        batch: Option<u16>,
        /// With --model: the KV cache's length (default 2048, as `generate` on a GPU, capped
        /// at the model's context length).
        #[arg(long, value_name = "N", requires = "model")]
        max_context: Option<usize>,
        /// With --model: f32, f16 (weights dequantized to f16), or q (the file's Q4_1/Q8_0
        /// blocks kept, f16 activations: `generate --dtype q4` on a GPU).
        #[arg(long, requires = "model", value_parser = ["f32", "f16", "q", "q4"], default_value = "f32")]
        precision: String,
        /// With --model: print a JSON summary on stdout instead of the launch list.
        #[arg(long, requires = "model")]
        json: bool,
        /// Print the graph (text form) after every pass that changed it.
        #[arg(long)]
        dump_passes: bool,
        /// Print every attention candidate with "fused" or the reason it was left alone, and
        /// every other candidate a pass left alone.
        #[arg(long)]
        explain: bool,
        /// Only clean up: no recognition or fusion (the unfused baseline).
        #[arg(long)]
        no_fuse: bool,
        /// Generate kernels for this target: gfx90a, gfx90a:sramecc+:xnack-, gfx1030, sm_90, ...
        #[arg(long, value_name = "ARCH")]
        target: Option<String>,
        /// Compile every kernel (AMD targets) and print VGPRs, AGPRs, SGPRs, LDS, scratch and
        /// spills per kernel, and with clang LLVM's occupancy (waves per SIMD).
        #[arg(long, requires = "target")]
        report: bool,
        /// The AMD compiler for --report and --emit bundle: hiprtc where the installed one
        /// knows the target (auto), else the offline clang (17+ with the ROCm device libraries).
        #[arg(long, value_name = "WHICH", value_parser = ["auto", "hiprtc", "clang"], default_value = "auto")]
        compiler: String,
        /// Write the generated sources (`hip`: one .hip file per kernel plus plan.txt), or a
        /// replay bundle (`bundle`: plan.json, README.md, kernel sources and code objects, the
        /// seeded inputs and weights, and the interpreter's value of every computed buffer;
        /// see docs/bundle.md and `rocmforge replay`). Without a compiler for the target, a
        /// bundle holds sources only (said on stderr and in the bundle).
        #[arg(long, value_name = "WHAT", requires = "target", value_parser = ["hip", "bundle"])]
        emit: Option<String>,
        /// Directory for --emit (for a bundle: new or empty).
        #[arg(long, value_name = "DIR", requires = "emit")]
        out: Option<PathBuf>,
        /// Seed for a bundle's inputs and weights (the data `rocmforge run --seed` draws).
        #[arg(long, default_value_t = 0, requires = "emit")]
        seed: u64,
        /// Refuse to write a bundle of more than this many bytes.
        #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_BUNDLE_BYTES, requires = "emit")]
        max_bundle_bytes: u64,
        /// Plan one persistent kernel instead of one launch per kernel: the per-kernel plan's
        /// kernels become its steps, its blocks claim their blocks in order and wait only for
        /// the steps they read (see docs/decisions.md, "The persistent decode kernel").
        #[arg(long)]
        megakernel: bool,
        /// Opt-in TF32: f32 matrix products (GEMMs, attention's QKᵀ and P·V) on the GPU's TF32
        /// matrix instructions (NVIDIA sm_80+, AMD gfx942): operands rounded to a 10-bit
        /// mantissa, f32 accumulation, so results differ from exact f32 by about 1e-3 relative
        /// (exact f32: ~1e-6). Never the default; a target without TF32 runs exact f32 and its
        /// plan says so. f16/bf16 are unaffected.
        #[arg(long)]
        tf32: bool,
    },
    /// Replay a bundle (`compile --emit bundle`) on a GPU and compare every computed buffer.
    ///
    /// Loads each kernel from the bundle's code object (compiling its source instead when the
    /// code object does not load, e.g. PTX from a newer NVRTC than this driver, or when the
    /// bundle has none), uploads the bundle's inputs, weights and constants, launches the
    /// kernels in order, downloads every computed buffer and compares it with the
    /// interpreter's value in expected/ (relative L2 error per buffer against the dtype's
    /// tolerance). Reports the first kernel, in launch order, whose output does not match.
    ///
    /// Exit status: 0 every buffer matches; 1 a buffer or index check does not; 3 the bundle
    /// is malformed (missing or truncated files, bad plan.json, unknown format version);
    /// 4 no GPU here, or not the bundle's processor; 5 a device or compiler call failed.
    Replay {
        /// The bundle directory.
        dir: PathBuf,
        /// Device: cuda:N or hip:N (default: ROCMFORGE_DEVICE, else the best one found).
        #[arg(long)]
        device: Option<String>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Only check the bundle (files present, sizes as the buffer table says, kernel
        /// signatures as plan.json binds them); needs no GPU.
        #[arg(long)]
        check: bool,
        /// Compile every kernel from its source here instead of loading the code objects.
        #[arg(long)]
        recompile: bool,
        /// Refuse a bundle whose data files hold more than this many bytes.
        #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_BUNDLE_BYTES)]
        max_bundle_bytes: u64,
    },
    /// Print a graph in the text form (one line per node) and optionally write Graphviz DOT.
    Show {
        /// The graph file (JSON).
        file: PathBuf,
        /// Write a Graphviz DOT picture of the graph here (render with `dot -Tsvg`).
        #[arg(long, value_name = "PATH")]
        dot: Option<PathBuf>,
        /// Show the graph after the default pass pipeline; fused nodes are highlighted in DOT.
        #[arg(long)]
        fused: bool,
    },
}

#[derive(Subcommand)]
pub(crate) enum CacheAction {
    /// List the cached kernels (file, size, arch, entry point) and tuning results (family,
    /// problem, choice), and whether each checksum holds.
    Ls,
    /// Remove every cached kernel and tuning result.
    Clear,
}

/// `RUST_LOG` (e.g. `rocmforge=debug`) turns on the library's stage timings on stderr: passes,
/// codegen, each kernel's compile (from memory, disk, or compiled, with the time), tuning and
/// the weights' upload. Without it nothing is logged but warnings.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

fn main() -> ExitCode {
    init_logging();
    let cli = Cli::parse();
    if let Some(n) = cli.threads {
        // Set once, before any device is opened.
        let _ = common::THREADS.set(usize::from(n));
    }
    let result = match &cli.command {
        Command::Run {
            file,
            seed,
            values,
            device,
            verify,
            no_fuse,
            tune,
            tf32,
        } => run::cmd_run(
            file,
            *seed,
            *values,
            device.as_deref(),
            *verify,
            *no_fuse,
            common::Choices {
                tune: *tune,
                f32_matmul: common::f32_matmul(*tf32),
            },
        ),
        Command::Cache { action } => cache::cmd_cache(action),
        Command::Embed {
            model,
            device,
            values,
            dtype,
            texts,
            tune,
            tf32,
            json,
        } => embed::cmd_embed(
            model,
            device.as_deref(),
            *values,
            dtype,
            texts,
            common::Choices {
                tune: *tune,
                f32_matmul: common::f32_matmul(*tf32),
            },
            *json,
        ),
        Command::Generate {
            model,
            max_tokens,
            device,
            dtype,
            max_context,
            chat,
            json,
            no_replay,
            prompt,
        } => generate::cmd_generate(
            prompt,
            &GenerateArgs {
                model,
                max_tokens: *max_tokens,
                device: device.as_deref(),
                dtype,
                max_context: *max_context,
                chat: *chat,
                json: *json,
                replay: !*no_replay,
            },
        ),
        Command::Serve {
            model,
            host,
            port,
            device,
            dtype,
            max_context,
            max_queue,
            max_batch,
            kv_memory,
            prefill_chunk,
            api_key,
            greedy,
            no_replay,
            no_tensor_core_gemv,
            shutdown_grace,
        } => serve::cmd_serve(&ServeArgs {
            model,
            host: *host,
            port: *port,
            device: device.as_deref(),
            dtype,
            max_context: *max_context,
            max_queue: *max_queue,
            max_batch: max_batch.map(usize::from),
            kv_memory: *kv_memory,
            prefill_chunk: *prefill_chunk,
            api_key: api_key.as_deref(),
            greedy: *greedy,
            replay: !*no_replay,
            tensor_core_gemv: !*no_tensor_core_gemv,
            shutdown_grace: std::time::Duration::from_secs(*shutdown_grace),
        }),
        Command::Compile {
            file,
            model,
            phase,
            prompt_len,
            batch,
            max_context,
            precision,
            json,
            dump_passes,
            explain,
            no_fuse,
            target,
            report,
            compiler,
            emit,
            out,
            seed,
            max_bundle_bytes,
            megakernel,
            tf32,
        } => {
            let is_bundle = emit.as_deref() == Some("bundle");
            let emit_dir = emit.as_ref().map(|_| {
                out.clone()
                    .unwrap_or_else(|| PathBuf::from(if is_bundle { "bundle" } else { "kernels" }))
            });
            if compiler != "auto" && !*report && !is_bundle {
                eprintln!("error: --compiler applies to --report and --emit bundle");
                return ExitCode::from(2);
            }
            if *megakernel && is_bundle {
                eprintln!(
                    "error: --megakernel applies to the launch list, --emit hip and --report; a \
                     replay bundle of a persistent kernel is not supported yet"
                );
                return ExitCode::from(2);
            }
            let cg = CodegenArgs {
                bundle: is_bundle.then_some((*seed, *max_bundle_bytes)),
                target: target.as_deref(),
                report: *report,
                compiler: match compiler.as_str() {
                    "hiprtc" => AmdCompilerChoice::Hiprtc,
                    "clang" => AmdCompilerChoice::Clang,
                    _ => AmdCompilerChoice::Auto,
                },
                emit_dir: emit_dir.as_deref(),
                megakernel: *megakernel,
                f32_matmul: common::f32_matmul(*tf32),
            };
            match (model, file) {
                (Some(model), _) => compile_model::Phase::parse(
                    phase.as_deref().unwrap_or("decode"),
                )
                .and_then(|phase| {
                    let m = ModelArgs {
                        model,
                        phase,
                        prompt_len: *prompt_len,
                        batch: *batch,
                        max_context: *max_context,
                        precision,
                        json: *json,
                    };
                    compile_model::cmd_compile_model(&m, *dump_passes, *explain, *no_fuse, cg)
                }),
                (None, Some(file)) => {
                    compile::cmd_compile(file, *dump_passes, *explain, *no_fuse, cg)
                }
                // clap requires one of them.
                (None, None) => Err("compile needs a graph file or --model FILE.gguf".into()),
            }
        }
        Command::Show { file, dot, fused } => show::cmd_show(file, dot.as_deref(), *fused),
        Command::Replay {
            dir,
            device,
            json,
            check,
            recompile,
            max_bundle_bytes,
        } => {
            let args = ReplayArgs {
                device: device.as_deref(),
                json: *json,
                check: *check,
                recompile: *recompile,
                max_bytes: *max_bundle_bytes,
            };
            return match replay::cmd_replay(dir, &args) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::from(1),
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(replay::replay_exit_code(&e))
                }
            };
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("error: {msg}");
            ExitCode::FAILURE
        }
    }
}
