//! Fuzzing the parsers, briefly: every target runs its seeds and then a fixed number of
//! mutated inputs from a fixed seed, so CI is deterministic. The timed run is
//! `cargo run --release --example fuzz -- --minutes 10` (docs/fuzzing.md).
//!
//! Also checks the harness itself: a panicking target is a finding with its input saved and
//! reproducible, runs repeat exactly from a seed, and the JSON mutations make the bad inputs
//! they promise.

#[path = "common/fuzz/mod.rs"]
mod fuzz;

use std::path::Path;

use fuzz::{FindingKind, Options, Outcome, Structure, Target};

const SEED: u64 = 0x5eed_f022;

/// Mutated inputs per target under `cargo test` (after the seeds).
const ITERATIONS: u64 = 10_000;

fn options(seed: u64, iterations: u64) -> Options {
    fuzz::install_memory_limit(4 << 30);
    Options::iterations(seed, iterations)
}

/// Options for the harness's own checks, whose findings are planted: kept apart from real ones.
fn self_test_options(seed: u64, iterations: u64) -> Options {
    Options {
        crash_dir: fuzz::root().join("target/fuzz/self-test"),
        ..options(seed, iterations)
    }
}

/// Runs `name` and fails with every finding (input file, seed, iteration, message).
fn fuzz_briefly(name: &str) {
    let mut target = fuzz::target(name).expect("a target");
    let seeds = target.seeds().len() as u64;
    let report = fuzz::run(&mut *target, &options(SEED, seeds + ITERATIONS), |_| {});
    println!("{report}");
    assert!(
        report.findings.is_empty(),
        "fuzzing found problems:\n{report}"
    );
    assert_eq!(report.iterations, seeds + ITERATIONS);
    // Mutation gets past the first check: inputs end in more than a handful of ways.
    assert!(
        report.outcomes.len() >= 5,
        "mutated inputs reach only {} outcomes:\n{report}",
        report.outcomes.len()
    );
}

#[test]
fn graph_files() {
    fuzz_briefly("graph");
}

#[test]
fn safetensors_files() {
    fuzz_briefly("safetensors");
}

#[test]
fn bert_config_json() {
    fuzz_briefly("config");
}

#[test]
fn gguf_files() {
    fuzz_briefly("gguf");
}

#[test]
fn amd_code_objects() {
    fuzz_briefly("code_object");
}

/// A target with a planted bug: it panics on any input holding the byte 0xff.
struct Planted;

impl Target for Planted {
    fn name(&self) -> &'static str {
        "planted"
    }
    fn structure(&self) -> Structure {
        Structure::Binary
    }
    fn input_file(&self) -> &'static str {
        "input.bin"
    }
    fn seeds(&self) -> Vec<Vec<u8>> {
        vec![b"rocmforge".to_vec()]
    }
    fn run(&mut self, input: &[u8], path: &Path) -> Outcome {
        assert_eq!(std::fs::read(path).unwrap(), input, "the input is on disk");
        if input.contains(&0xff) {
            panic!("planted bug: 0xff in the input");
        }
        Ok(format!("length {}", input.len().min(12)))
    }
}

#[test]
fn a_panicking_input_is_a_finding_that_replays() {
    let report = fuzz::run(&mut Planted, &self_test_options(3, 300), |_| {});
    assert_eq!(report.findings.len(), 1, "{report}");
    let f = &report.findings[0];
    assert_eq!(f.kind, FindingKind::Panic);
    assert!(
        f.message.contains("planted bug") && f.message.contains("tests/fuzz.rs"),
        "the finding names the panic and where: {}",
        f.message
    );
    assert_eq!((f.target, f.seed), ("planted", 3));
    assert!(f.iteration > 0 && f.iteration < 300);
    let saved = std::fs::read(&f.file).expect("the finding's input is saved");
    assert!(saved.contains(&0xff));
    let details = std::fs::read_to_string(f.file.with_extension("txt")).unwrap();
    assert!(
        details.contains("seed 3") && details.contains("backtrace"),
        "{details}"
    );
    // The saved input reproduces the panic.
    let work = fuzz::root().join(format!("target/fuzz/replay-test-{}", std::process::id()));
    let replayed = std::panic::catch_unwind(|| fuzz::replay(&mut Planted, &saved, &work));
    assert!(replayed.is_err(), "replaying the saved input panics again");
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn a_run_repeats_exactly_from_its_seed() {
    let run = |seed| {
        let r = fuzz::run(&mut Planted, &self_test_options(seed, 200), |_| {});
        let first = r.findings.first().map(|f| f.iteration);
        (r.outcomes, first)
    };
    assert_eq!(run(11), run(11));
    assert_ne!(run(11), run(12), "another seed, other inputs");
}

/// A target that records what the mutator makes of a JSON seed.
struct Recorder(Vec<Vec<u8>>);

impl Target for Recorder {
    fn name(&self) -> &'static str {
        "recorder"
    }
    fn structure(&self) -> Structure {
        Structure::Json
    }
    fn input_file(&self) -> &'static str {
        "input.json"
    }
    fn seeds(&self) -> Vec<Vec<u8>> {
        vec![br#"{"name": "x", "shape": [2, 3], "axis": -1, "nodes": [{"op": "add"}]}"#.to_vec()]
    }
    fn run(&mut self, input: &[u8], _: &Path) -> Outcome {
        self.0.push(input.to_vec());
        Ok("seen".into())
    }
}

#[test]
fn json_mutations_make_the_promised_bad_inputs() {
    let mut rec = Recorder(Vec::new());
    fuzz::run(&mut rec, &self_test_options(5, 3000), |_| {});
    let texts: Vec<String> = rec
        .0
        .iter()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .collect();
    let any = |what: &str, p: &dyn Fn(&str) -> bool| {
        assert!(texts.iter().any(|t| p(t)), "no mutant with {what}");
    };
    let depth = |t: &str| {
        t.bytes()
            .scan(0i64, |d, b| {
                *d += match b {
                    b'[' | b'{' => 1,
                    b']' | b'}' => -1,
                    _ => 0,
                };
                Some(*d)
            })
            .max()
            .unwrap_or(0)
    };
    any("nesting past serde_json's limit of 128", &|t| {
        depth(t) > 128
    });
    any("a number past u64", &|t| t.contains("18446744073709551616"));
    any("a number past f64", &|t| t.contains("1e400"));
    any("2^63", &|t| t.contains("9223372036854775808"));
    any("a duplicate key", &|t| {
        ["\"name\"", "\"shape\"", "\"axis\"", "\"nodes\""]
            .iter()
            .any(|k| t.matches(k).count() > 1)
    });
    any("a swapped type", &|t| {
        t.contains("\"shape\":\"") || t.contains("\"axis\":[")
    });
    any("invalid JSON", &|t| {
        serde_json::from_str::<serde_json::Value>(t).is_err()
    });
    any("a truncated input", &|t| t.len() < 20);
}

// Bugs the fuzzer found, each also in its target's corpus (which every run starts with).

/// A config.json claiming more layers than its weights hold built the graph one layer at a time
/// (2^31 of them) before any weight was checked: a hang, then the memory limit.
#[test]
fn a_config_with_more_layers_than_its_weights_is_refused_at_once() {
    use rocmforge::frontend::{BertEncoder, ModelError};
    fuzz::install_memory_limit(4 << 30);
    let dir = fuzz::root().join(format!("target/fuzz/layers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tiny = fuzz::root().join("tests/data/fuzz/bert_tiny");
    for f in ["model.safetensors", "tokenizer.json", "modules.json"] {
        std::fs::copy(tiny.join(f), dir.join(f)).unwrap();
    }
    std::fs::copy(
        fuzz::root().join("tests/data/fuzz/config/num_hidden_layers_2147483647.json"),
        dir.join("config.json"),
    )
    .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let load_dir = dir.clone();
    std::thread::spawn(move || tx.send(BertEncoder::load(&load_dir).err()));
    let err = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("load returns within a minute")
        .expect("load refuses the config");
    match &err {
        ModelError::Config { field, reason } => {
            assert_eq!(field, "num_hidden_layers");
            assert!(reason.contains("2147483647"), "{reason}");
        }
        other => panic!("expected a config error, got {other:?}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The watchdog stops a process whose input runs past its time budget, with the hang exit
/// code, after saving the input as a finding. The hung input runs in a child process (this test
/// binary, asked for by an environment variable), blocked on a channel nothing ever sends to.
#[test]
fn watchdog_stops_a_process_whose_input_hangs() {
    const CHILD: &str = "ROCMFORGE_FUZZ_HANG_CHILD";
    if let Some(dir) = std::env::var_os(CHILD) {
        let dir = std::path::PathBuf::from(dir);
        let input = dir.join("input.bin");
        std::fs::write(&input, b"the hung input").unwrap();
        let flight = fuzz::guard::Flight::register(
            "graph",
            7,
            &input,
            std::time::Duration::from_millis(200),
            &dir.join("crashes"),
        );
        flight.begin(1);
        let (_never, blocked) = std::sync::mpsc::channel::<()>();
        let _ = blocked.recv();
        unreachable!("the watchdog ends the process");
    }
    let dir = std::env::temp_dir().join(format!("rocmforge-hang-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "watchdog_stops_a_process_whose_input_hangs",
            "--nocapture",
        ])
        .env(CHILD, &dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Waits on the child's exit itself, with a bound in case the watchdog never fires.
    let (tx, rx) = std::sync::mpsc::channel();
    let pid = child.id();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let status = match rx.recv_timeout(std::time::Duration::from_secs(60)) {
        Ok(status) => status.unwrap(),
        Err(_) => {
            let _ = std::process::Command::new("kill")
                .arg(pid.to_string())
                .status();
            panic!("the watchdog did not stop a hung input within 60 s");
        }
    };
    assert_eq!(status.code(), Some(fuzz::guard::HANG_EXIT_CODE));
    let saved: Vec<_> = std::fs::read_dir(dir.join("crashes"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        saved
            .iter()
            .any(|n| n.starts_with("graph-hang-") && n.ends_with(".bin")),
        "{saved:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
