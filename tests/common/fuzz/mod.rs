//! A mutation fuzzer on stable Rust for rocmforge's parsers, shared by `tests/fuzz.rs` (a few
//! thousand deterministic iterations per target under `cargo test`) and `examples/fuzz.rs` (the
//! timed run, `cargo run --release --example fuzz -- --minutes 10`).
//!
//! Each target feeds bytes to a public parsing entry point and then checks what the parser
//! promised (a parsed graph saves and reloads unchanged, fused and unfused graphs agree, ...).
//! A panic, a broken promise, a hang or an allocation past the memory limit is a finding. There
//! is no coverage instrumentation on stable, so an input joins the corpus when it reaches an
//! outcome (an error kind, a pipeline stage) no earlier input reached; that steers mutation past
//! the first check a parser makes.
//!
//! Runs are reproducible: the RNG is seeded from `--seed` and the target's name, and a finding
//! names the seed and iteration and is saved to a file that `--replay` runs again.
#![allow(dead_code)]

mod code_object;
mod config;
mod gguf;
mod graph;
pub mod guard;
mod json;
mod mutate;
mod safetensors;
#[path = "../tiny_gguf.rs"]
pub mod tiny_gguf;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub use code_object::CodeObjectTarget;
pub use config::ConfigTarget;
pub use gguf::GgufTarget;
pub use graph::GraphTarget;
pub use guard::install_memory_limit;
pub use safetensors::SafetensorsTarget;

/// What a target makes of one input: `Ok(label)` names the outcome (an error kind or the last
/// stage reached) and steers the corpus; `Err(message)` is a broken promise, a finding.
pub type Outcome = Result<String, String>;

/// How inputs of a target are built, beyond bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Structure {
    /// JSON text: mutated as a tree (extreme numbers, swapped types, deep nesting, duplicate
    /// keys) as well as bytes.
    Json,
    /// An 8-byte little-endian header length, a JSON header, then data.
    Safetensors,
    /// Binary: bytes, plus interesting integers written over the numeric fields the target
    /// points out.
    Binary,
}

/// One parser under test.
pub trait Target {
    fn name(&self) -> &'static str;
    fn structure(&self) -> Structure;
    /// The file name the input is written to in the target's work directory.
    fn input_file(&self) -> &'static str;
    /// The corpus the run starts from; every seed also runs once unmutated.
    fn seeds(&self) -> Vec<Vec<u8>>;
    /// Words worth inserting (op names, dtypes, field names) beyond those found in the seeds.
    fn dictionary(&self) -> Vec<String> {
        Vec::new()
    }
    /// Numeric fields of a binary input, for `Structure::Binary`.
    fn fields(&self, _input: &[u8]) -> Vec<mutate::Field> {
        Vec::new()
    }
    /// Called once with the work directory before the first input (files the parser needs
    /// beside the input go there).
    fn prepare(&mut self, _work: &Path) -> std::io::Result<()> {
        Ok(())
    }
    /// Runs one input; `input` has just been written to `path`.
    fn run(&mut self, input: &[u8], path: &Path) -> Outcome;
}

/// Every target, by name.
pub fn targets() -> Vec<Box<dyn Target>> {
    vec![
        Box::new(GraphTarget::default()),
        Box::new(SafetensorsTarget),
        Box::new(ConfigTarget),
        Box::new(GgufTarget),
        Box::new(CodeObjectTarget),
    ]
}

pub fn target(name: &str) -> Option<Box<dyn Target>> {
    targets().into_iter().find(|t| t.name() == name)
}

/// The repository root, where the seed corpora live.
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The files directly in `dir` (sorted, so runs are reproducible), skipping `except`.
pub fn read_dir_files(dir: &Path, except: &[&str]) -> Vec<Vec<u8>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .filter(|p| {
            !p.file_name()
                .is_some_and(|n| except.iter().any(|x| n == *x))
        })
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .collect()
}

#[derive(Clone, Debug)]
pub enum Budget {
    Iterations(u64),
    Until(Instant),
}

#[derive(Clone, Debug)]
pub struct Options {
    pub seed: u64,
    pub budget: Budget,
    /// Time one input may take before the run stops as hung.
    pub timeout: Duration,
    /// Inputs are cut to this many bytes.
    pub max_len: usize,
    /// Where findings are saved.
    pub crash_dir: PathBuf,
    /// Where each target writes its input (one subdirectory per target).
    pub work_dir: PathBuf,
    /// Called every `progress_every` iterations with the count so far.
    pub progress_every: u64,
}

impl Options {
    pub fn iterations(seed: u64, n: u64) -> Options {
        Options {
            seed,
            budget: Budget::Iterations(n),
            timeout: Duration::from_secs(20),
            max_len: 64 * 1024,
            crash_dir: root().join("target/fuzz/crashes"),
            work_dir: unique_work_dir(),
            progress_every: 0,
        }
    }
}

/// Where inputs are written before they run: memory (`/dev/shm`) where there is one, since
/// rewriting a file on disk thousands of times a second costs milliseconds a time (ext4 flushes
/// a file truncated and rewritten when it is closed); else `target/fuzz`.
pub fn work_base() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        root().join("target/fuzz")
    }
}

/// A work directory no other run in this process uses (tests run targets in parallel).
fn unique_work_dir() -> PathBuf {
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    work_base().join(format!("rocmforge-fuzz-{}-{n}", std::process::id()))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FindingKind {
    Panic,
    Wrong,
}

#[derive(Clone, Debug)]
pub struct Finding {
    pub target: &'static str,
    pub kind: FindingKind,
    pub seed: u64,
    pub iteration: u64,
    /// The first input that showed it, as saved.
    pub file: PathBuf,
    pub message: String,
    /// How many inputs showed it.
    pub count: u64,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {:?} (seed {}, iteration {}, {} input(s)), saved to {}: {}",
            self.target,
            self.kind,
            self.seed,
            self.iteration,
            self.count,
            self.file.display(),
            self.message
        )
    }
}

#[derive(Clone, Debug, Default)]
pub struct Report {
    pub target: &'static str,
    pub iterations: u64,
    pub seeds: usize,
    pub corpus: usize,
    /// How many inputs reached each outcome.
    pub outcomes: BTreeMap<String, u64>,
    pub findings: Vec<Finding>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{}: {} iterations, {} seeds, corpus {}, {} outcomes, {} findings",
            self.target,
            self.iterations,
            self.seeds,
            self.corpus,
            self.outcomes.len(),
            self.findings.len()
        )?;
        // The most frequent outcomes; a long tail of rare error messages says little.
        let mut by_count: Vec<(&String, &u64)> = self.outcomes.iter().collect();
        by_count.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        for (label, n) in by_count.iter().take(OUTCOMES_SHOWN) {
            writeln!(f, "  {n:>9}  {label}")?;
        }
        if by_count.len() > OUTCOMES_SHOWN {
            let rest: u64 = by_count[OUTCOMES_SHOWN..].iter().map(|(_, n)| **n).sum();
            writeln!(
                f,
                "  {rest:>9}  ({} rarer outcomes)",
                by_count.len() - OUTCOMES_SHOWN
            )?;
        }
        for finding in &self.findings {
            writeln!(f, "  FINDING {finding}")?;
        }
        Ok(())
    }
}

/// The report lists this many outcomes.
const OUTCOMES_SHOWN: usize = 40;

/// The corpus keeps at most this many inputs beyond the seeds.
const CORPUS_GROWTH: usize = 512;

/// A stable 64-bit hash (FNV-1a) for file names and per-target seeds.
pub fn fnv(bytes: &[u8]) -> u64 {
    rocmforge::ir::fnv1a(bytes)
}

fn save_finding(
    opts: &Options,
    target: &str,
    what: &str,
    input: &[u8],
    details: impl FnOnce(&Path) -> String,
) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(&opts.crash_dir)?;
    let stem = format!("{target}-{what}-{:016x}", fnv(input));
    let file = opts.crash_dir.join(format!("{stem}.bin"));
    std::fs::write(&file, input)?;
    std::fs::write(opts.crash_dir.join(format!("{stem}.txt")), details(&file))?;
    Ok(file)
}

/// What went wrong with one input, before it is saved as a finding.
struct Problem {
    kind: FindingKind,
    /// What tells this problem from others: the panic's location, or the broken promise.
    key: String,
    message: String,
    backtrace: Option<std::backtrace::Backtrace>,
}

impl Problem {
    /// Saves the input and the details (with the backtrace, resolved now) beside it.
    fn save(self, opts: &Options, target: &'static str, iteration: u64, input: &[u8]) -> Finding {
        let what = match self.kind {
            FindingKind::Panic => "panic",
            FindingKind::Wrong => "wrong",
        };
        let file = save_finding(opts, target, what, input, |file| {
            let backtrace = self.backtrace.map(|b| format!("backtrace:\n{b}\n"));
            format!(
                "target {target}, seed {}, iteration {iteration}\n{}\nreplay: {}\n{}",
                opts.seed,
                self.message,
                replay_command(target, file),
                backtrace.unwrap_or_default()
            )
        })
        .unwrap_or_else(|e| panic!("saving a finding: {e}"));
        Finding {
            target,
            kind: self.kind,
            seed: opts.seed,
            iteration,
            file,
            message: self.message,
            count: 1,
        }
    }
}

/// Replays a saved input: `cargo run --release --example fuzz -- --target T --replay FILE`.
pub fn replay_command(target: &str, file: &Path) -> String {
    format!(
        "cargo run --release --example fuzz -- --target {target} --replay {}",
        file.display()
    )
}

/// Fuzzes `target` within `opts.budget`; `progress` hears the iteration count now and then.
pub fn run(target: &mut dyn Target, opts: &Options, mut progress: impl FnMut(u64)) -> Report {
    guard::install_panic_capture();
    let name = target.name();
    let work = opts.work_dir.join(name);
    std::fs::create_dir_all(&work)
        .unwrap_or_else(|e| panic!("fuzz work directory {}: {e}", work.display()));
    target
        .prepare(&work)
        .unwrap_or_else(|e| panic!("preparing {name} in {}: {e}", work.display()));
    let path = work.join(target.input_file());
    let flight = guard::Flight::register(name, opts.seed, &path, opts.timeout, &opts.crash_dir);

    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed ^ fnv(name.as_bytes()));
    let seeds = target.seeds();
    assert!(!seeds.is_empty(), "{name}: no seeds");
    let mut corpus = mutate::Corpus::new(target.structure(), &seeds, &target.dictionary());
    let mut report = Report {
        target: name,
        seeds: seeds.len(),
        ..Report::default()
    };
    let mut seen: HashMap<(FindingKind, String), usize> = HashMap::new();
    let mut i: u64 = 0;
    loop {
        let done = match opts.budget {
            Budget::Iterations(n) => i >= n,
            Budget::Until(t) => Instant::now() >= t,
        };
        if done {
            break;
        }
        let input = match usize::try_from(i).ok().and_then(|k| seeds.get(k)) {
            Some(seed) => seed.clone(),
            None => {
                let fields = |b: &[u8]| target.fields(b);
                corpus.mutant(&mut rng, opts.max_len, &fields)
            }
        };
        std::fs::write(&path, &input)
            .unwrap_or_else(|e| panic!("writing the input to {}: {e}", path.display()));
        flight.begin(i);
        let result = guard::catch(|| target.run(&input, &path));
        flight.end();
        let problem = match result {
            Ok(Ok(label)) => {
                let first = !report.outcomes.contains_key(&label);
                if first && corpus.len() < seeds.len() + CORPUS_GROWTH {
                    corpus.add(input.clone(), !label.contains("err"));
                }
                *report.outcomes.entry(label).or_default() += 1;
                None
            }
            // Findings are told apart by what promise broke, or where they panicked.
            Ok(Err(wrong)) => Some(Problem {
                kind: FindingKind::Wrong,
                key: message_label(&wrong),
                message: wrong,
                backtrace: None,
            }),
            Err(caught) => Some(Problem {
                kind: FindingKind::Panic,
                key: caught.location,
                message: caught.message,
                backtrace: caught.backtrace,
            }),
        };
        if let Some(p) = problem {
            *report
                .outcomes
                .entry(format!("FINDING {:?}", p.kind))
                .or_default() += 1;
            match seen.get(&(p.kind, p.key.clone())) {
                Some(&k) => report.findings[k].count += 1,
                None => {
                    seen.insert((p.kind, p.key.clone()), report.findings.len());
                    report.findings.push(p.save(opts, name, i, &input));
                }
            }
        }
        i += 1;
        if opts.progress_every > 0 && i.is_multiple_of(opts.progress_every) {
            progress(i);
        }
    }
    report.iterations = i;
    report.corpus = corpus.len();
    drop(flight);
    let _ = std::fs::remove_dir_all(&work);
    // The run's own directory, when nothing else is in it.
    let _ = std::fs::remove_dir(&opts.work_dir);
    report
}

/// Runs one saved input through `target` in this process, panics included, so a debugger or
/// `RUST_BACKTRACE=1` sees them as they happen.
pub fn replay(target: &mut dyn Target, input: &[u8], work_dir: &Path) -> Outcome {
    let work = work_dir.join(target.name());
    std::fs::create_dir_all(&work).expect("work directory");
    target.prepare(&work).expect("preparing the target");
    let path = work.join(target.input_file());
    std::fs::write(&path, input).expect("writing the input");
    target.run(input, &path)
}

/// A random seed for a run that names none.
pub fn fresh_seed() -> u64 {
    rand::rng().random()
}

/// An error message as an outcome label, so that inputs failing the same check share a label
/// whatever they hold: everything from the first quote to the last (parsers quote what they
/// read in backticks or double quotes, and what they read may itself hold quotes), bracketed
/// shapes and JSON cut off, and numbers blanked out.
pub fn message_label(message: &str) -> String {
    let message = message.split(" at line ").next().unwrap_or(message);
    let quote = |c: char| c == '`' || c == '"';
    let message = match (message.find(quote), message.rfind(quote)) {
        (Some(first), Some(last)) if first < last => {
            format!("{}_{}", &message[..first], &message[last + 1..])
        }
        _ => message.to_string(),
    };
    let mut out = String::new();
    for c in message.chars() {
        match c {
            // Shapes and JSON values come last in a message; what follows says nothing new.
            '[' | ']' | '{' | '}' => break,
            // A number, or a list of them, is one `#`.
            '0'..='9' | '.' | ',' | '-' | '+' | 'e' | 'E' if out.ends_with('#') => {}
            '0'..='9' => out.push('#'),
            _ => out.push(c),
        }
    }
    out.chars().take(80).collect()
}
