//! The timed fuzz run (see docs/fuzzing.md):
//!
//! ```text
//! cargo run --release --example fuzz -- --minutes 10            # every target, 10 minutes in all
//! cargo run --release --example fuzz -- --target graph --iterations 100000 --seed 1
//! cargo run --release --example fuzz -- --target graph --replay target/fuzz/crashes/graph-panic-….bin
//! ```
//!
//! The targets run one after another, each in a worker process of this same binary, so that an
//! input that aborts the process (an allocation past the memory limit, a stack overflow) or
//! hangs it is saved as a finding and the run goes on with a fresh worker.

#[path = "../tests/common/fuzz/mod.rs"]
mod fuzz;

use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;

#[derive(Parser, Debug, Clone)]
#[command(
    about = "Fuzz rocmforge's parsers: graph files, safetensors, config.json, AMD code objects"
)]
struct Args {
    /// Wall-clock minutes for the whole run, shared evenly by the targets.
    #[arg(long, conflicts_with = "iterations")]
    minutes: Option<f64>,
    /// Inputs per target instead of a time budget.
    #[arg(long)]
    iterations: Option<u64>,
    /// A target to run (graph, safetensors, config, code_object); repeat for several; all by default.
    #[arg(long = "target")]
    targets: Vec<String>,
    /// The RNG seed; a random one (printed) by default.
    #[arg(long)]
    seed: Option<u64>,
    /// Seconds one input may take before it counts as a hang.
    #[arg(long, default_value_t = 10)]
    timeout_secs: u64,
    /// Inputs are cut to this many bytes.
    #[arg(long, default_value_t = 64 * 1024)]
    max_len: usize,
    /// The most memory a worker may hold; more aborts it, and the input is a finding.
    #[arg(long, default_value_t = 4096)]
    memory_mib: usize,
    /// Where findings go.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Run one saved input through the target (named by --target) in this process.
    #[arg(long, requires = "targets")]
    replay: Option<PathBuf>,
    /// Internal: fuzz in this process (what the supervisor starts).
    #[arg(long, hide = true)]
    worker: bool,
    /// Internal: the worker's deadline, in milliseconds from its start.
    #[arg(long, hide = true)]
    until_ms: Option<u64>,
    /// Internal: the worker's work directory.
    #[arg(long, hide = true)]
    work: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let names: Vec<String> = if args.targets.is_empty() {
        fuzz::targets()
            .iter()
            .map(|t| t.name().to_string())
            .collect()
    } else {
        args.targets.clone()
    };
    if let Some(bad) = names.iter().find(|n| fuzz::target(n).is_none()) {
        eprintln!("unknown target `{bad}` (graph, safetensors, config, code_object)");
        return ExitCode::from(2);
    }
    if let Some(file) = &args.replay {
        return replay(&names[0], file);
    }
    if args.worker {
        return worker(&args, &names[0]);
    }
    supervise(&args, &names)
}

fn crash_dir(args: &Args) -> PathBuf {
    args.out
        .clone()
        .unwrap_or_else(|| fuzz::root().join("target/fuzz/crashes"))
}

fn replay(name: &str, file: &Path) -> ExitCode {
    let mut target = fuzz::target(name).expect("checked");
    let input = match std::fs::read(file) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            return ExitCode::from(2);
        }
    };
    let work = fuzz::work_base().join(format!("rocmforge-fuzz-replay-{}", std::process::id()));
    let outcome = fuzz::replay(&mut *target, &input, &work);
    let _ = std::fs::remove_dir_all(&work);
    match outcome {
        Ok(label) => {
            println!("ok: {label}");
            ExitCode::SUCCESS
        }
        Err(wrong) => {
            println!("WRONG: {wrong}");
            ExitCode::from(1)
        }
    }
}

/// Fuzzes one target in this process; prints `PROGRESS n` now and then and the report at the
/// end. Exit code 1 when it found something.
fn worker(args: &Args, name: &str) -> ExitCode {
    fuzz::install_memory_limit(args.memory_mib.saturating_mul(1 << 20));
    let mut target = fuzz::target(name).expect("checked");
    let seed = args.seed.expect("the supervisor passes a seed");
    let budget = match (args.iterations, args.until_ms) {
        (Some(n), _) => fuzz::Budget::Iterations(n),
        (None, Some(ms)) => fuzz::Budget::Until(Instant::now() + Duration::from_millis(ms)),
        (None, None) => fuzz::Budget::Iterations(10_000),
    };
    let opts = fuzz::Options {
        seed,
        budget,
        timeout: Duration::from_secs(args.timeout_secs),
        max_len: args.max_len,
        crash_dir: crash_dir(args),
        work_dir: args
            .work
            .clone()
            .expect("the supervisor passes a work directory"),
        progress_every: 200,
    };
    let report = fuzz::run(&mut *target, &opts, |n| println!("PROGRESS {n}"));
    print!("{report}");
    // Every outcome, rare ones included (the report shows the most frequent), for tuning.
    let all: String = report
        .outcomes
        .iter()
        .map(|(label, n)| format!("{n:>9}  {label}\n"))
        .collect();
    let outcomes = opts.crash_dir.join(format!("../outcomes-{name}.txt"));
    if let Err(e) = std::fs::write(&outcomes, all) {
        eprintln!("{}: {e}", outcomes.display());
    }
    println!("DONE {}", report.iterations);
    if report.findings.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

#[derive(Default)]
struct Tally {
    iterations: u64,
    workers: u32,
    findings: Vec<String>,
}

/// Runs each target in worker processes until its share of the time (or its iterations) is
/// spent, restarting a worker that died on an input.
fn supervise(args: &Args, names: &[String]) -> ExitCode {
    let seed = args.seed.unwrap_or_else(fuzz::fresh_seed);
    let exe = std::env::current_exe().expect("this executable's path");
    let work = fuzz::work_base().join(format!("rocmforge-fuzz-{}", std::process::id()));
    let start = Instant::now();
    println!(
        "fuzzing {} with seed {seed}; findings go to {}",
        names.join(", "),
        crash_dir(args).display()
    );
    let mut tallies = Vec::new();
    for (k, name) in names.iter().enumerate() {
        // Each target gets an even share of what is left, so an early finish helps the rest.
        let deadline = args.minutes.map(|m| {
            let total = Duration::from_secs_f64(m * 60.0);
            let left = total.saturating_sub(start.elapsed());
            Instant::now() + left / u32::try_from(names.len() - k).expect("few targets")
        });
        let mut tally = Tally::default();
        loop {
            let worker_seed = seed.wrapping_add(u64::from(tally.workers));
            let mut cmd = Command::new(&exe);
            cmd.args(["--worker", "--target", name])
                .args(["--seed", &worker_seed.to_string()])
                .args(["--timeout-secs", &args.timeout_secs.to_string()])
                .args(["--max-len", &args.max_len.to_string()])
                .args(["--memory-mib", &args.memory_mib.to_string()])
                .arg("--out")
                .arg(crash_dir(args))
                .arg("--work")
                .arg(&work);
            match (deadline, args.iterations) {
                (Some(d), _) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left < Duration::from_millis(500) {
                        break;
                    }
                    cmd.args(["--until-ms", &left.as_millis().to_string()]);
                }
                (None, Some(n)) => {
                    cmd.args([
                        "--iterations",
                        &n.saturating_sub(tally.iterations).to_string(),
                    ]);
                }
                (None, None) => {}
            }
            tally.workers += 1;
            let ended = run_worker(cmd, &work, name, worker_seed, args, &mut tally);
            let spent = match (deadline, args.iterations) {
                (Some(d), _) => Instant::now() >= d,
                (None, Some(n)) => tally.iterations >= n,
                (None, None) => true,
            };
            if ended || spent {
                break;
            }
        }
        println!(
            "== {name}: {} iterations, {} worker(s), {} finding(s)",
            tally.iterations,
            tally.workers,
            tally.findings.len()
        );
        tallies.push((name.clone(), tally));
    }
    let _ = std::fs::remove_dir_all(&work);
    println!(
        "\nsummary (seed {seed}, {:.1} minutes):",
        start.elapsed().as_secs_f64() / 60.0
    );
    let mut found = 0;
    for (name, t) in &tallies {
        println!(
            "  {name:<12} {:>10} iterations  {:>3} finding(s)",
            t.iterations,
            t.findings.len()
        );
        for f in &t.findings {
            println!("      {f}");
        }
        found += t.findings.len();
    }
    if found == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// Runs one worker to its end, echoing its report. Returns whether it ended normally (its
/// budget spent); a worker that died had its input saved as a finding here.
fn run_worker(
    mut cmd: Command,
    work: &Path,
    name: &str,
    seed: u64,
    args: &Args,
    tally: &mut Tally,
) -> bool {
    std::fs::create_dir_all(work).expect("work directory");
    let stderr_path = work.join(format!("{name}.stderr"));
    let stderr = std::fs::File::create(&stderr_path).expect("worker stderr file");
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("starting a fuzz worker");
    let mut last = 0;
    let mut done = false;
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let Ok(line) = line else { break };
        if let Some(n) = line.strip_prefix("PROGRESS ") {
            last = n.parse().unwrap_or(last);
        } else if let Some(n) = line.strip_prefix("DONE ") {
            last = n.parse().unwrap_or(last);
            done = true;
        } else {
            if let Some(f) = line.trim_start().strip_prefix("FINDING ") {
                tally.findings.push(f.to_string());
            }
            println!("{line}");
        }
    }
    let status = child.wait().expect("waiting for a fuzz worker");
    tally.iterations += last;
    let tail = tail_of(&stderr_path, 4000);
    if done && (status.success() || status.code() == Some(1)) {
        return true;
    }
    // The worker died on an input: a hang (the watchdog saved it and said so on stderr), or an
    // abort, whose input is still in the work directory.
    tally.iterations += 1;
    if status.code() == Some(fuzz::guard::HANG_EXIT_CODE) {
        let line = tail
            .lines()
            .find(|l| l.starts_with("FINDING"))
            .unwrap_or("FINDING hang (no report)")
            .to_string();
        println!("{line}");
        tally
            .findings
            .push(line.trim_start_matches("FINDING ").to_string());
        return false;
    }
    let target = fuzz::target(name).expect("checked");
    let in_flight = work.join(name).join(target.input_file());
    let message = match std::fs::read(&in_flight) {
        Ok(input) => {
            let dir = crash_dir(args);
            let stem = format!("{name}-abort-{:016x}", fuzz::fnv(&input));
            let file = dir.join(format!("{stem}.bin"));
            let saved = std::fs::create_dir_all(&dir)
                .and_then(|()| std::fs::write(&file, &input))
                .and_then(|()| {
                    std::fs::write(
                        dir.join(format!("{stem}.txt")),
                        format!(
                            "target {name}, seed {seed}, after iteration {last}\nworker ended with {status}\nreplay: {}\nstderr:\n{tail}\n",
                            fuzz::replay_command(name, &file)
                        ),
                    )
                });
            match saved {
                Ok(()) => format!(
                    "{name} Abort (seed {seed}, after iteration {last}): worker ended with {status}; saved to {}: {}",
                    file.display(),
                    tail.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("")
                ),
                Err(e) => format!("{name} Abort: worker ended with {status}; saving the input failed: {e}"),
            }
        }
        Err(e) => format!(
            "{name} Abort: worker ended with {status} and no input in flight ({e}); stderr: {tail}"
        ),
    };
    println!("FINDING {message}");
    tally.findings.push(message);
    false
}

/// The last `n` bytes of a file, as text.
fn tail_of(path: &Path, n: u64) -> String {
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(n)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}
