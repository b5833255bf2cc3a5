//! The rocmforge command line. It uses the library's public API only.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};

use rayon::prelude::*;
use rocmforge::arch::{Platform, Target};
use rocmforge::codegen::{self, CodegenOptions};
use rocmforge::compile::bundle::{
    self, Bundle, BundleError, EmitOptions, ReplayOptions, ReplayReport, DEFAULT_MAX_BUNDLE_BYTES,
};
use rocmforge::compile::{CompileOptions, TuneStats};
use rocmforge::frontend::llama::Precision;
use rocmforge::frontend::{self, BertEncoder};
use rocmforge::generate::{GenerateOptions, GenerateStats, Generator};
use rocmforge::interp::Bindings;
use rocmforge::ir::{self, format, DType, Graph, GraphError, Tensor};
use rocmforge::passes::{explain_text, PassManager};
use rocmforge::runtime::{
    amd_compiler_for, occupancy_table, parse_code_object, report_table, AmdCompiler,
    AmdCompilerChoice, Device, DiskCache, EntryKind, Hiprtc, KernelResources,
};
use serde::Serialize;

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
        /// Device: cpu, cuda:N or hip:N (default: ROCMFORGE_DEVICE, else the best one found).
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
    },
    /// Sentence embeddings with a BERT-class model directory (all-MiniLM-L6-v2: scripts/fetch-models).
    ///
    /// Prints each embedding (first values and norm) and the cosine similarity matrix. Texts of
    /// different lengths are padded and masked in one batch.
    Embed {
        /// A Hugging Face model directory (config.json, model.safetensors, tokenizer.json).
        #[arg(long, value_name = "DIR", default_value_os_t = frontend::model_cache_dir(frontend::MINILM))]
        model: PathBuf,
        /// Device: cpu, cuda:N or hip:N (default: the best one found).
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
        /// Print one JSON object instead: the embeddings (every value) and the cosine
        /// similarity matrix.
        #[arg(long)]
        json: bool,
        /// The texts.
        #[arg(required = true)]
        texts: Vec<String>,
    },
    /// Generate text with a LLaMA-class GGUF model (SmolLM2-135M-Instruct: scripts/fetch-models).
    ///
    /// The prompt runs in one pass (padded to a power-of-two bucket, each bucket's plan compiled
    /// once), then one replayed decode plan per token reading and writing the KV cache; only
    /// the token id comes back per step. Greedy (argmax) decoding; stops at the model's end of
    /// sequence token or after --max-tokens. Text streams to stdout as tokens arrive; the
    /// prompt and decode speeds (tokens/s) go to stderr at the end.
    #[command(
        after_help = "Examples:\n  rocmforge generate \"The capital of France is\"\n  rocmforge generate --chat --max-tokens 64 \"What is the capital of France?\"\n  rocmforge generate --device cpu --max-tokens 3 --json \"Hello\""
    )]
    Generate {
        /// The GGUF file.
        #[arg(long, value_name = "FILE", default_value_os_t = frontend::model_cache_dir(frontend::SMOLLM2).join(frontend::SMOLLM2_GGUF))]
        model: PathBuf,
        /// The most tokens to generate.
        #[arg(long, value_name = "N", default_value_t = 128)]
        max_tokens: usize,
        /// Device: cpu, cuda:N or hip:N (default: ROCMFORGE_DEVICE, else the best one found).
        #[arg(long)]
        device: Option<String>,
        /// Weights and activations: f32 (weights dequantized), f16 (weights dequantized once to
        /// f16, f16 activations), or q4 (the file's Q4_1/Q8_0 blocks kept as stored and
        /// dequantized inside the matrix products; f16 activations on a GPU, f32 on the CPU).
        #[arg(long, default_value = "f32", value_parser = ["f32", "f16", "q4"])]
        dtype: String,
        /// The KV cache's length in tokens: prompt plus --max-tokens may not exceed it.
        /// Default: 2048 on a GPU, 512 on the CPU (whose interpreter copies the cache each step).
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
    Compile {
        /// The graph file (JSON).
        file: PathBuf,
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
enum CacheAction {
    /// List the cached kernels (file, size, arch, entry point) and tuning results (family,
    /// problem, choice), and whether each checksum holds.
    Ls,
    /// Remove every cached kernel and tuning result.
    Clear,
}

fn cmd_cache(action: &CacheAction) -> Result<(), String> {
    let Some(dir) = DiskCache::default_dir() else {
        return Err("no cache directory: set ROCMFORGE_CACHE_DIR or HOME".into());
    };
    let disk = DiskCache::new(dir.clone());
    let mut not_removed = Vec::new();
    let skipped = match action {
        CacheAction::Ls => {
            let listing = disk.list().map_err(|e| e.to_string())?;
            outln!("{} ({} entries)", dir.display(), listing.entries.len());
            for e in listing.entries {
                let what = match &e.kind {
                    EntryKind::Kernel => e.entry.clone(),
                    EntryKind::Tuning {
                        family,
                        problem,
                        choice,
                    } => format!("tuning {family} [{problem}] -> {choice}"),
                };
                outln!(
                    "  {}  {:>8} B  {:<24} {}{}",
                    file_name(&e.file),
                    e.bytes,
                    e.arch,
                    what,
                    if e.valid {
                        ""
                    } else {
                        "  (corrupt: will be rebuilt)"
                    }
                );
            }
            listing.skipped
        }
        CacheAction::Clear => {
            let cleared = disk.clear().map_err(|e| e.to_string())?;
            outln!("removed {} entries from {}", cleared.removed, dir.display());
            not_removed = cleared.not_removed;
            cleared.skipped
        }
    };
    if !skipped.is_empty() {
        outln!(
            "skipped {} file(s) that are not cache entries rocmforge can handle:",
            skipped.len()
        );
        for s in skipped {
            outln!("  {}  {}", file_name(&s.file), s.reason);
        }
    }
    // Entries `clear` meant to remove and could not: the cache is not clear, so say which and
    // fail.
    if !not_removed.is_empty() {
        let lines: Vec<String> = not_removed
            .iter()
            .map(|n| format!("  {}  {}", n.file.display(), n.message))
            .collect();
        return Err(format!(
            "could not remove {} cache entr{}:\n{}",
            not_removed.len(),
            if not_removed.len() == 1 { "y" } else { "ies" },
            lines.join("\n")
        ));
    }
    Ok(())
}

/// What `--tune` did, in one line.
fn tuning_line(t: &TuneStats) -> String {
    format!(
        "tuning: {} problems with several candidates, {} from the cache, {} timed now \
         ({} candidate kernels, {:.1} ms)",
        t.problems,
        t.from_cache,
        t.timed,
        t.candidates_timed,
        t.time.as_secs_f64() * 1e3
    )
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn pick_device(spec: Option<&str>) -> Result<Device, String> {
    match spec {
        Some(spec) => Device::open(spec).map_err(|e| e.to_string()),
        None => {
            let (d, notes) = Device::best().map_err(|e| e.to_string())?;
            if !d.is_gpu() {
                for n in notes {
                    eprintln!("note: {n}");
                }
                eprintln!("note: no GPU available; running on the CPU interpreter");
            }
            Ok(d)
        }
    }
}

fn cmd_embed(
    model: &Path,
    device: Option<&str>,
    values: usize,
    dtype: &str,
    texts: &[String],
    tune: bool,
    json: bool,
) -> Result<(), String> {
    let dtype = DType::parse(dtype).ok_or_else(|| format!("--dtype {dtype}: not a dtype"))?;
    let enc = BertEncoder::load(model).map_err(|e| e.to_string())?;
    let device = pick_device(device)?;
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let batch = enc.tokenize(&refs).map_err(|e| e.to_string())?;
    let graph = enc
        .graph_typed(texts.len(), batch.seq_len, dtype)
        .map_err(|e| e.to_string())?;
    let weights = enc.weights_for(&graph).map_err(|e| e.to_string())?;
    let options = CompileOptions {
        weights,
        tune,
        ..CompileOptions::default()
    };
    let compiled = Graph::compile_with(&graph, &device, &options).map_err(|e| e.to_string())?;
    let mut bindings = Bindings::default();
    for (n, t) in enc.inputs(&batch) {
        bindings.inputs.insert(n, t);
    }
    let start = Instant::now();
    let out = compiled
        .run(&bindings)
        .map_err(|e| e.to_string())?
        .remove(0)
        .to_f64_vec();
    let h = enc.config.hidden_size;
    let rows: Vec<&[f64]> = out.chunks(h).collect();
    let cosine = |a: &[f64], b: &[f64]| {
        let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
        let n =
            (a.iter().map(|x| x * x).sum::<f64>() * b.iter().map(|x| x * x).sum::<f64>()).sqrt();
        dot / n.max(1e-30)
    };
    let similarity: Vec<Vec<f64>> = rows
        .iter()
        .map(|a| rows.iter().map(|b| cosine(a, b)).collect())
        .collect();
    if json {
        let report = EmbedReport {
            model: model.display().to_string(),
            device: device.label().to_string(),
            dtype: dtype.to_string(),
            texts: texts.to_vec(),
            seconds: start.elapsed().as_secs_f64(),
            embeddings: rows.iter().map(|r| r.to_vec()).collect(),
            similarity,
        };
        outln!(
            "{}",
            serde_json::to_string(&report).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    outln!(
        "model:  {} ({} layers, hidden {})",
        model.display(),
        enc.config.num_hidden_layers,
        enc.config.hidden_size
    );
    outln!("device: {}", device.label());
    if tune {
        outln!("{}", tuning_line(&compiled.stats.tuning));
    }
    outln!("dtype:  {dtype}");
    outln!(
        "batch:  {} texts, {} tokens each after padding; {:.3} ms",
        texts.len(),
        batch.seq_len,
        start.elapsed().as_secs_f64() * 1e3
    );
    for (i, (t, e)) in texts.iter().zip(&rows).enumerate() {
        let norm = e.iter().map(|x| x * x).sum::<f64>().sqrt();
        let head: Vec<String> = e.iter().take(values).map(|x| format!("{x:.6}")).collect();
        outln!("[{i}] {t:?}");
        outln!("    norm {norm:.6}  first [{}]", head.join(", "));
    }
    outln!("cosine similarity:");
    for row in &similarity {
        let line: Vec<String> = row.iter().map(|c| format!("{c:7.4}")).collect();
        outln!("  {}", line.join(" "));
    }
    Ok(())
}

/// `embed --json`.
#[derive(Serialize)]
struct EmbedReport {
    model: String,
    device: String,
    dtype: String,
    texts: Vec<String>,
    /// The batch's run, compile excluded.
    seconds: f64,
    embeddings: Vec<Vec<f64>>,
    similarity: Vec<Vec<f64>>,
}

/// `generate --json`.
#[derive(Serialize)]
struct GenerateReport {
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
struct GenerateArgs<'a> {
    model: &'a Path,
    max_tokens: usize,
    device: Option<&'a str>,
    dtype: &'a str,
    max_context: Option<usize>,
    chat: bool,
    json: bool,
    replay: bool,
}

/// The ChatML turn `prompt` becomes under `--chat`, when the model's template
/// (`tokenizer.chat_template`) is ChatML-shaped; an error naming what it is otherwise.
fn chat_prompt(gen: &Generator, prompt: &str) -> Result<String, String> {
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

fn cmd_generate(prompt: &str, a: &GenerateArgs<'_>) -> Result<(), String> {
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
    };
    let t0 = Instant::now();
    let mut gen = Generator::load(a.model, &device, options).map_err(|e| e.to_string())?;
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
    let out = gen
        .generate(&prompt_ids, a.max_tokens, |t| {
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
         ({:.1} tokens/s); stop: {:?}",
        st.prompt_tokens,
        st.prompt_seconds,
        st.prompt_tokens_per_s,
        st.prompt_bucket,
        st.decode_tokens,
        st.decode_seconds,
        st.decode_tokens_per_s,
        st.stop
    );
    Ok(())
}

fn load(path: &Path) -> Result<Graph, String> {
    format::load(path).map_err(|e| match e {
        // These name the file already.
        GraphError::File(_) | GraphError::Io { .. } => e.to_string(),
        _ => format!("{}: {e}", path.display()),
    })
}

/// Statistics of one output: mean and standard deviation of its finite values (none if it has
/// none), how many are NaN, how many ±inf.
struct Stats {
    mean_std: Option<(f64, f64)>,
    nans: usize,
    infs: usize,
}

fn stats(t: &Tensor) -> Stats {
    let v = t.to_f64_vec();
    let finite: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    let nans = v.iter().filter(|x| x.is_nan()).count();
    let n = finite.len() as f64;
    let mean_std = (!finite.is_empty()).then(|| {
        let mean = finite.iter().sum::<f64>() / n;
        let var = finite.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
        (mean, var.sqrt())
    });
    Stats {
        mean_std,
        nans,
        infs: v.len() - finite.len() - nans,
    }
}

fn cmd_run(
    file: &Path,
    seed: u64,
    values: usize,
    device: Option<&str>,
    verify: bool,
    no_fuse: bool,
    tune: bool,
) -> Result<(), String> {
    let graph = load(file)?;
    let device = pick_device(device)?;
    let options = CompileOptions {
        fuse: !no_fuse,
        seed,
        tune,
        ..CompileOptions::default()
    };
    let compiled = Graph::compile_with(&graph, &device, &options).map_err(|e| e.to_string())?;
    let bindings = Bindings::random(&graph, seed);
    outln!(
        "graph:  {} ({} nodes, {} after passes)",
        graph.name,
        graph.node_count(),
        compiled.graph.node_count()
    );
    outln!("device: {}", device.label());
    let s = &compiled.stats;
    let how = if !device.is_gpu() {
        "no kernels".to_string()
    } else if s.compiled == 0 {
        format!(
            "{} kernels, all from cache ({} from disk)",
            s.kernels, s.from_disk
        )
    } else {
        format!(
            "{} kernels, {} compiled now (cold), {} from disk",
            s.kernels, s.compiled, s.from_disk
        )
    };
    outln!("compile: {:.3} ms ({how})", s.time.as_secs_f64() * 1e3);
    if tune {
        outln!("{}", tuning_line(&s.tuning));
    }
    if let Some(m) = &compiled.memory {
        outln!(
            "memory: {} B planned for intermediates ({} B without reuse)",
            m.planned_bytes,
            m.unplanned_bytes
        );
    }
    let start = Instant::now();
    let (outputs, check) = if verify {
        let (o, v) = compiled.verify(&bindings).map_err(|e| e.to_string())?;
        (o, Some(v))
    } else {
        (compiled.run(&bindings).map_err(|e| e.to_string())?, None)
    };
    let elapsed = start.elapsed();
    outln!(
        "time:   {:.3} ms{}",
        elapsed.as_secs_f64() * 1e3,
        if verify { " (run + interpreter)" } else { "" }
    );
    for (&id, t) in graph.outputs().iter().zip(&outputs) {
        let st = stats(t);
        let head: Vec<String> = t
            .to_f64_vec()
            .iter()
            .take(values)
            .map(|x| format!("{x:.6}"))
            .collect();
        outln!("output {}: {}", graph.node(id).name, t.ty());
        let count = |n: usize, what: &str| {
            if n > 0 {
                format!("  {what} {n}")
            } else {
                String::new()
            }
        };
        let moments = match st.mean_std {
            Some((mean, std)) => format!("mean {mean:.6}  std {std:.6}"),
            None => "no finite values".to_string(),
        };
        outln!(
            "  {moments}{}{}",
            count(st.nans, "NaN"),
            count(st.infs, "±inf")
        );
        outln!("  first [{}]", head.join(", "));
    }
    if let Some(v) = check {
        for o in &v.outputs {
            outln!(
                "verify {}: relative L2 error {:.3e} against the interpreter (unfused){}",
                o.name,
                o.error,
                if o.non_finite > 0 {
                    format!(
                        " over the finite values; {} NaN/±inf at the same places",
                        o.non_finite
                    )
                } else {
                    String::new()
                }
            );
        }
    }
    Ok(())
}

struct CodegenArgs<'a> {
    target: Option<&'a str>,
    report: bool,
    compiler: AmdCompilerChoice,
    emit_dir: Option<&'a Path>,
    /// `--emit bundle`: the seed and size limit.
    bundle: Option<(u64, u64)>,
}

fn cmd_compile(
    file: &Path,
    dump: bool,
    explain: bool,
    no_fuse: bool,
    cg: CodegenArgs,
) -> Result<(), String> {
    let mut graph = load(file)?;
    // A bundle runs the passes itself, from the graph as given, as `run` does.
    let source = cg.bundle.is_some().then(|| graph.clone());
    let before = graph.node_count();
    let manager = if no_fuse {
        PassManager::cleanup()
    } else {
        PassManager::default_pipeline()
    };
    let reports = manager
        .run_observed(&mut graph, |report, g| {
            if dump && report.changed() {
                outln!("// after {}", report.pass);
                out!("{}", ir::to_text(g).unwrap_or_else(|e| e.to_string()));
                outln!();
            }
        })
        .map_err(|e| e.to_string())?;
    if explain {
        out!("{}", explain_text(&reports));
    }
    if let (Some(source), Some(arch), Some(dir)) = (&source, cg.target, cg.emit_dir) {
        emit_bundle(source, arch, no_fuse, dir, &cg)?;
        if !cg.report {
            return Ok(());
        }
        let report_only = CodegenArgs {
            emit_dir: None,
            ..cg
        };
        return codegen_for(&graph, arch, &report_only);
    }
    if let Some(arch) = cg.target {
        return codegen_for(&graph, arch, &cg);
    }
    if !dump {
        out!("{}", ir::to_text(&graph).map_err(|e| e.to_string())?);
    }
    let fused = graph
        .node_ids()
        .filter(|&id| graph.op(id).is_fused())
        .count();
    eprintln!(
        "{}: {before} → {} nodes, {fused} fused node(s), passes: {}",
        graph.name,
        graph.node_count(),
        manager.names().join(", ")
    );
    Ok(())
}

fn emit_bundle(
    source: &Graph,
    arch: &str,
    no_fuse: bool,
    dir: &Path,
    cg: &CodegenArgs,
) -> Result<(), String> {
    let (seed, max_bytes) = cg.bundle.unwrap_or((0, DEFAULT_MAX_BUNDLE_BYTES));
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let options = EmitOptions {
        fuse: !no_fuse,
        seed,
        compiler: cg.compiler,
        max_bytes,
    };
    let emitted = bundle::emit(source, &target, dir, &options).map_err(|e| e.to_string())?;
    let plan = &emitted.plan;
    if let Some(why) = &plan.compiler.missing {
        eprintln!(
            "note: no compiler for {arch} here, so the bundle has sources only (no code \
             objects): {why}"
        );
    }
    eprintln!(
        "wrote a bundle to {}: {} kernel(s){}, {} buffer(s), {} bytes",
        dir.display(),
        plan.kernels.len(),
        plan.compiler
            .name
            .as_ref()
            .map(|c| format!(" compiled by {c}"))
            .unwrap_or_default(),
        plan.buffers.len(),
        emitted.bytes
    );
    Ok(())
}

fn codegen_for(graph: &Graph, arch: &str, cg: &CodegenArgs) -> Result<(), String> {
    // With --report, hiprtc's own list of targets decides first (and lists them), so hiprtc is
    // never handed one it cannot take. Under `auto` a target hiprtc lacks but our table has a
    // row for goes to clang (see `amd_compiler_for`); one neither knows is hiprtc's error, as
    // is a hiprtc library ROCMFORGE_HIPRTC names that cannot be loaded.
    if cg.report {
        if Target::parse(arch).is_ok_and(|t| t.platform == Platform::Nvidia) {
            return Err(format!(
                "--report reads AMD code objects; {arch} is an NVIDIA target"
            ));
        }
        if cg.compiler != AmdCompilerChoice::Clang {
            let forced = cg.compiler == AmdCompilerChoice::Hiprtc;
            match Hiprtc::load() {
                Ok(rtc) => {
                    if let Err(e) = rtc.check_target(arch) {
                        if forced || Target::parse(arch).is_err() {
                            return Err(e.to_string());
                        }
                    }
                }
                Err(e) if forced || std::env::var_os("ROCMFORGE_HIPRTC").is_some() => {
                    return Err(e.to_string())
                }
                Err(_) => {}
            }
        }
    }
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let options = CodegenOptions::default();
    let plan = codegen::generate_with(graph, &target, &options).map_err(|e| e.to_string())?;
    if let Some(dir) = cg.emit_dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        for k in &plan.kernels {
            let path = dir.join(format!("{}.hip", k.entry));
            std::fs::write(&path, plan.source(k))
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
        std::fs::write(dir.join("plan.txt"), plan.listing()).map_err(|e| e.to_string())?;
        eprintln!(
            "wrote {} kernel source(s) and plan.txt to {}",
            plan.kernels.len(),
            dir.display()
        );
    }
    if !cg.report {
        if cg.emit_dir.is_none() {
            out!("{}", plan.listing());
        }
        return Ok(());
    }
    let total = plan.kernels.len();
    let options = ["-O3".to_string()];
    let (table, compiler, rows) = match amd_compiler_for(&target, cg.compiler)? {
        AmdCompiler::Hiprtc(rtc) => {
            let rows = compile_kernels(&plan, |k| {
                let code = rtc
                    .compile(&plan.source(k), &k.entry, &target.arch, &options)
                    .map_err(|e| e.to_string())?;
                Ok((k.node.clone(), resources_of(&code, &k.entry)?))
            })?;
            let compiler = format!(
                "hiprtc {}.{} from {}",
                rtc.version.0, rtc.version.1, rtc.library
            );
            (report_table(&rows), compiler, rows)
        }
        AmdCompiler::Clang(clang) => {
            // Many kernels to a clang run: each run costs mostly headers and device libraries.
            let prelude = codegen::prelude(&target);
            let batches: Vec<Result<Vec<_>, String>> = plan
                .kernels
                .par_chunks(24)
                .map(|chunk| {
                    let pairs: Vec<(&str, &str)> = chunk
                        .iter()
                        .map(|k| (k.entry.as_str(), k.body.as_str()))
                        .collect();
                    let rows = clang
                        .compile_batch(&prelude, &pairs, &target, &options)
                        .map_err(|e| e.to_string())?;
                    Ok(chunk
                        .iter()
                        .zip(rows)
                        .map(|(k, (r, occupancy))| (k.node.clone(), r, occupancy))
                        .collect())
                })
                .collect();
            let rows: Vec<(String, KernelResources, u32)> = batches
                .into_iter()
                .collect::<Result<Vec<_>, _>>()?
                .into_iter()
                .flatten()
                .collect();
            let table = occupancy_table(&rows);
            let rows = rows.into_iter().map(|(n, r, _)| (n, r)).collect();
            (table, clang.describe(), rows)
        }
    };
    outln!("{} on {} ({}, {})", graph.name, target, total, compiler);
    out!("{table}");
    let spilling: Vec<&str> = rows
        .iter()
        .filter(|(_, r)| r.spills())
        .map(|(_, r)| r.name.as_str())
        .collect();
    if !spilling.is_empty() {
        outln!(
            "warning: {} kernel(s) spill: {}",
            spilling.len(),
            spilling.join(", ")
        );
    }
    Ok(())
}

/// The resources of `entry` in an AMD code object.
fn resources_of(code: &[u8], entry: &str) -> Result<KernelResources, String> {
    parse_code_object(code)
        .map_err(|e| format!("{entry}: {e}"))?
        .kernels
        .into_iter()
        .find(|r| r.name == entry)
        .ok_or_else(|| format!("{entry} missing from its code object"))
}

/// Runs `compile` on every kernel of `plan` in parallel, with a progress bar on a terminal;
/// the results in plan order, or the first error.
fn compile_kernels<T: Send>(
    plan: &codegen::KernelPlan,
    compile: impl Fn(&codegen::Kernel) -> Result<T, String> + Sync,
) -> Result<Vec<T>, String> {
    let target = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        indicatif::ProgressDrawTarget::stderr()
    } else {
        indicatif::ProgressDrawTarget::hidden()
    };
    let bar = indicatif::ProgressBar::with_draw_target(Some(plan.kernels.len() as u64), target);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "compiling {pos}/{len} kernels for {msg} [{elapsed_precise}] {wide_bar}",
    ) {
        bar.set_style(style);
    }
    bar.set_message(plan.target.arch.clone());
    let results: Vec<Result<T, String>> = plan
        .kernels
        .par_iter()
        .map(|k| {
            let row = compile(k);
            bar.inc(1);
            row
        })
        .collect();
    bar.finish_and_clear();
    results.into_iter().collect()
}

fn cmd_show(file: &Path, dot: Option<&Path>, fused: bool) -> Result<(), String> {
    let mut graph = load(file)?;
    if fused {
        PassManager::default_pipeline()
            .run(&mut graph)
            .map_err(|e| e.to_string())?;
    }
    out!("{}", ir::to_text(&graph).map_err(|e| e.to_string())?);
    if let Some(path) = dot {
        let text = ir::to_dot(&graph).map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

struct ReplayArgs<'a> {
    device: Option<&'a str>,
    json: bool,
    check: bool,
    recompile: bool,
    max_bytes: u64,
}

/// The exit status `rocmforge replay --help` documents for each error.
fn replay_exit_code(e: &BundleError) -> u8 {
    match e {
        BundleError::File(_)
        | BundleError::Json { .. }
        | BundleError::Version { .. }
        | BundleError::Malformed { .. }
        | BundleError::Size { .. }
        | BundleError::TooLarge { .. } => 3,
        BundleError::NoGpu { .. } | BundleError::TargetMismatch { .. } => 4,
        BundleError::Compile(_)
        | BundleError::NoCompiler { .. }
        | BundleError::CodeObject { .. }
        | BundleError::Write { .. }
        | BundleError::NotEmpty { .. }
        | BundleError::State { .. }
        | BundleError::Unsupported { .. }
        | BundleError::Runtime { .. } => 5,
    }
}

fn json_out(value: &impl serde::Serialize) -> Result<(), BundleError> {
    let text = serde_json::to_string_pretty(value).map_err(|e| BundleError::Malformed {
        reason: e.to_string(),
    })?;
    outln!("{text}");
    Ok(())
}

/// Checks or replays the bundle in `dir`; `Ok(false)` when the replay ran and did not match.
fn cmd_replay(dir: &Path, args: &ReplayArgs) -> Result<bool, BundleError> {
    let bundle = Bundle::open(dir, args.max_bytes)?;
    if args.check {
        let report = bundle.check()?;
        if args.json {
            json_out(&report)?;
        } else {
            outln!(
                "{}: consistent: {} kernel(s), {} code object(s), {} buffer(s), {} data and {} \
                 expected file(s), {} bytes",
                dir.display(),
                report.kernels,
                report.code_objects,
                report.buffers,
                report.data_files,
                report.expected_files,
                report.bytes
            );
        }
        return Ok(true);
    }
    let device = match args.device {
        Some(spec) => Device::open(spec),
        None => Device::best().map(|(d, _)| d),
    }
    .map_err(|e| BundleError::NoGpu {
        reason: e.to_string(),
    })?;
    let options = ReplayOptions {
        recompile: args.recompile,
    };
    let report = bundle.replay(&device, &options)?;
    if args.json {
        json_out(&report)?;
    } else {
        print_replay(&bundle, &report);
    }
    Ok(report.passed)
}

fn print_replay(bundle: &Bundle, r: &ReplayReport) {
    let plan = bundle.plan();
    outln!(
        "bundle: {} (graph {}, target {}, {} kernels, {} buffers)",
        bundle.dir().display(),
        codegen::display_name(&plan.graph),
        plan.target.arch,
        plan.kernels.len(),
        plan.buffers.len()
    );
    outln!("device: {}", r.device);
    for k in &r.kernels {
        if let bundle::KernelSource::Compiled { reason } = &k.loaded {
            outln!("kernel {} {}: compiled here ({reason})", k.index, k.entry);
        }
    }
    for b in &r.buffers {
        let error = b
            .error
            .map(|e| format!("rel-L2 {e:.3e}"))
            .unwrap_or_else(|| "not compared".into());
        outln!(
            "buffer {:>4} {:<6} {:<32} {error} (tolerance {:e}){}{}",
            b.id,
            b.dtype.to_string(),
            codegen::display_name(&b.name),
            b.tolerance,
            if b.passed { "" } else { "  MISMATCH" },
            b.note
                .as_ref()
                .filter(|_| !b.passed)
                .map(|n| format!(": {n}"))
                .unwrap_or_default()
        );
    }
    for c in &r.checks {
        if let Some(index) = c.failed_index {
            outln!(
                "check {}: index {index} outside its table",
                codegen::display_name(&c.node)
            );
        }
    }
    if let Some(m) = &r.first_mismatch {
        outln!(
            "first mismatch: kernel {} writes buffer {} ({})",
            match (m.kernel, &m.entry) {
                (Some(i), Some(e)) => format!("{i} ({e})"),
                _ => "(none)".into(),
            },
            m.buffer,
            codegen::display_name(&m.name)
        );
    }
    outln!(
        "result: {}",
        if r.passed {
            "every computed buffer matches the interpreter"
        } else {
            "MISMATCH"
        }
    );
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
    let result = match &cli.command {
        Command::Run {
            file,
            seed,
            values,
            device,
            verify,
            no_fuse,
            tune,
        } => cmd_run(
            file,
            *seed,
            *values,
            device.as_deref(),
            *verify,
            *no_fuse,
            *tune,
        ),
        Command::Cache { action } => cmd_cache(action),
        Command::Embed {
            model,
            device,
            values,
            dtype,
            texts,
            tune,
            json,
        } => cmd_embed(
            model,
            device.as_deref(),
            *values,
            dtype,
            texts,
            *tune,
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
        } => cmd_generate(
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
        Command::Compile {
            file,
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
            };
            cmd_compile(file, *dump_passes, *explain, *no_fuse, cg)
        }
        Command::Show { file, dot, fused } => cmd_show(file, dot.as_deref(), *fused),
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
            return match cmd_replay(dir, &args) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::from(1),
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(replay_exit_code(&e))
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
