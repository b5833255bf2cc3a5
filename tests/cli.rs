//! The command line as a user drives it. Every run has a time limit, so a regression that
//! blocks (on a FIFO, an endless stream) fails instead of hanging the suite; stdin is a pipe
//! that stays open and empty, as a terminal waiting for input would.

#[path = "common/smollm2.rs"]
mod smollm2;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Longer than any command here takes on a loaded machine, far shorter than a hang.
const LIMIT: Duration = Duration::from_secs(180);

fn rocmforge(args: &[&str]) -> (bool, String, String) {
    rocmforge_with(args, &[])
}

/// Runs the CLI from the repository root with `env` set (and no ROCMFORGE_DEVICE from outside),
/// killing it and failing the test if it runs past [`LIMIT`].
fn rocmforge_with(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let (code, out, err) = rocmforge_code(args, env);
    (code == Some(0), out, err)
}

/// As [`rocmforge_with`], with the exit code (`None` for a signal).
fn rocmforge_code(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rocmforge"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("ROCMFORGE_DEVICE")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run rocmforge");
    // Drained on threads, so a chatty child never blocks on a full pipe.
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = Vec::new();
            r.read_to_end(&mut s).ok();
            String::from_utf8_lossy(&s).into_owned()
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let _stdin = child.stdin.take();
    // The exit is waited for on a thread, so the test wakes on the exit itself, or at LIMIT.
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait()).ok());
    let status = match rx.recv_timeout(LIMIT) {
        Ok(status) => status.unwrap(),
        Err(_) => {
            Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status()
                .ok();
            panic!("rocmforge {args:?} still running after {LIMIT:?}: it blocked");
        }
    };
    (status.code(), out.join().unwrap(), err.join().unwrap())
}

/// A failure as the CLI must report one: a non-zero exit (not a signal) and one paragraph
/// starting `error: `, no panic.
fn assert_clean_error(what: &str, ok: bool, err: &str) {
    assert!(!ok, "{what}: succeeded");
    let body = err.trim_end();
    let error_line = body
        .lines()
        .position(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("{what}: no `error: ` line in:\n{err}"));
    assert_eq!(
        error_line + 1,
        body.lines().count(),
        "{what}: the error is not one last paragraph:\n{err}"
    );
    assert!(!err.contains("panicked"), "{what}: {err}");
}

/// A fresh scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rocmforge-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn mkfifo(path: &Path) {
    let ok = Command::new("mkfifo").arg(path).status().unwrap().success();
    assert!(ok, "mkfifo {}", path.display());
}

#[test]
fn run_prints_device_time_and_output_statistics() {
    let (ok, out, err) = rocmforge(&[
        "run",
        "graphs/attention.json",
        "--seed",
        "5",
        "--values",
        "3",
    ]);
    assert!(ok, "{err}");
    for part in [
        "device: ",
        "compile: ",
        "time:",
        "output out: f32[2, 4, 64, 32]",
        "mean",
        "std",
        "first [",
    ] {
        assert!(out.contains(part), "missing `{part}` in:\n{out}");
    }
    let (_, again, _) = rocmforge(&[
        "run",
        "graphs/attention.json",
        "--seed",
        "5",
        "--values",
        "3",
    ]);
    let stats = |s: &str| {
        s.lines()
            .filter(|l| !l.starts_with("time") && !l.starts_with("compile"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(
        stats(&out),
        stats(&again),
        "same seed must print the same numbers"
    );
}

#[test]
fn show_prints_text_and_writes_dot() {
    let dir = std::env::temp_dir().join(format!("rocmforge-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dot = dir.join("g.dot");
    let (ok, out, err) = rocmforge(&[
        "show",
        "graphs/gqa_attention.json",
        "--dot",
        dot.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(out.starts_with("graph gqa_attention"));
    assert!(std::fs::read_to_string(&dot)
        .unwrap()
        .starts_with("digraph"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_files_fail_with_a_message_not_a_panic() {
    let (ok, _, err) = rocmforge(&["run", "tests/data/bad_graphs/cycle.json"]);
    assert!(!ok);
    assert!(err.starts_with("error: ") && err.contains("cycle"), "{err}");
    assert!(!err.contains("panicked"));
    let (ok, _, err) = rocmforge(&["show", "no/such/file.json"]);
    assert!(
        !ok && err.contains("cannot read no/such/file.json: no such file"),
        "{err}"
    );
}

#[test]
fn help_answers_for_every_command() {
    for args in [
        vec!["--help"],
        vec!["run", "--help"],
        vec!["show", "--help"],
        vec!["generate", "--help"],
        vec!["embed", "--help"],
    ] {
        let (ok, out, _) = rocmforge(&args);
        assert!(ok && out.contains("Usage"), "{args:?}: {out}");
    }
}

#[test]
fn compile_dumps_passes_and_explains() {
    let (ok, out, err) = rocmforge(&["compile", "graphs/llama_block.json", "--dump-passes"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("// after fuse_attention")
            && out.contains("flash_attention[scale=0.125, causal=true]"),
        "{out}"
    );
    let (ok, out, err) = rocmforge(&["compile", "graphs/bert_layer.json", "--explain"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("attention %matmul_24: fused: flash_attention"),
        "{out}"
    );
    let (ok, out, _) = rocmforge(&["compile", "tests/data/bad_graphs/cycle.json", "--explain"]);
    assert!(!ok && out.is_empty());
}

#[test]
fn explain_says_why_attention_was_left_alone() {
    let dir = std::env::temp_dir().join(format!("rocmforge-explain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("axis.json");
    std::fs::write(
        &file,
        r#"{"version": 1, "nodes": [
        {"name": "q", "op": "input", "dtype": "f32", "shape": [1, 2, 8, 8]},
        {"name": "k", "op": "input", "dtype": "f32", "shape": [1, 2, 8, 8]},
        {"name": "kt", "op": "permute", "inputs": ["k"], "perm": [0, 1, 3, 2]},
        {"name": "s", "op": "matmul", "inputs": ["q", "kt"]},
        {"name": "p", "op": "softmax", "inputs": ["s"], "axis": 2},
        {"name": "o", "op": "matmul", "inputs": ["p", "k"]}], "outputs": ["o"]}"#,
    )
    .unwrap();
    let (ok, out, err) = rocmforge(&["compile", file.to_str().unwrap(), "--explain"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("attention %o: not fused: softmax_axis"),
        "{out}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn show_fused_marks_fused_nodes_in_dot() {
    let dir = std::env::temp_dir().join(format!("rocmforge-fused-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dot = dir.join("f.dot");
    let (ok, out, err) = rocmforge(&[
        "show",
        "graphs/attention_causal.json",
        "--fused",
        "--dot",
        dot.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("flash_attention"));
    let text = std::fs::read_to_string(&dot).unwrap();
    assert!(
        text.contains("flash_attention") && text.contains("fillcolor"),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn compile_for_a_target_emits_sources_and_names_bad_arches() {
    let dir = std::env::temp_dir().join(format!("rocmforge-emit-{}", std::process::id()));
    let (ok, _, err) = rocmforge(&[
        "compile",
        "graphs/llama_block.json",
        "--target",
        "gfx1030",
        "--emit",
        "hip",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let plan = std::fs::read_to_string(dir.join("plan.txt")).unwrap();
    assert!(
        plan.contains("target gfx1030 (wave 32)") && plan.contains("rf_flash_attention_"),
        "{plan}"
    );
    let sources: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "hip")
        })
        .collect();
    assert!(sources.len() >= 10, "{} sources", sources.len());
    std::fs::remove_dir_all(&dir).ok();
    let (ok, _, err) = rocmforge(&["compile", "graphs/attention.json", "--target", "gfx9000"]);
    assert!(
        !ok && err.contains("unknown target arch `gfx9000`"),
        "{err}"
    );
}

/// A chain of tanh → softmax pairs: 12 kernels of two kinds. `--emit hip` writes each distinct
/// source once (the files are named by the entry, the hash of the body), and `--report`
/// (where hiprtc is here) compiles and lists each once, with the number of nodes sharing it.
#[test]
fn identical_kernels_are_emitted_and_reported_once() {
    let dir = std::env::temp_dir().join(format!("rocmforge-chain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut nodes = vec![serde_json::json!(
        {"name": "x", "op": "input", "dtype": "f32", "shape": [4, 96]}
    )];
    let mut prev = "x".to_string();
    for i in 0..12 {
        let name = format!("n{i}");
        nodes.push(if i % 2 == 0 {
            serde_json::json!({"name": name, "op": "tanh", "inputs": [prev]})
        } else {
            serde_json::json!({"name": name, "op": "softmax", "inputs": [prev], "axis": -1})
        });
        prev = name;
    }
    let graph = serde_json::json!({
        "format": "rocmforge-graph", "version": 1, "name": "chain",
        "nodes": nodes, "outputs": [prev],
    });
    let file = dir.join("chain.json");
    std::fs::write(&file, graph.to_string()).unwrap();
    let out = dir.join("emit");
    let (ok, _, err) = rocmforge(&[
        "compile",
        file.to_str().unwrap(),
        "--target",
        "gfx90a",
        "--emit",
        "hip",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    // The plan's distinct entries, read from its listing, against the files written.
    let plan = std::fs::read_to_string(out.join("plan.txt")).unwrap();
    // Each kernel's header: `// ---- kernel N: ENTRY for %node`.
    let entries: std::collections::BTreeSet<String> = plan
        .lines()
        .filter(|l| l.starts_with("// ---- kernel "))
        .filter_map(|l| l.split(": ").nth(1)?.split(' ').next().map(str::to_string))
        .collect();
    assert_eq!(plan.matches("// ---- kernel ").count(), 12, "{plan}");
    let files: std::collections::BTreeSet<String> = std::fs::read_dir(&out)
        .unwrap()
        .filter_map(|e| {
            let p = e.unwrap().path();
            (p.extension()? == "hip").then(|| p.file_stem().unwrap().to_str().unwrap().into())
        })
        .collect();
    assert_eq!(files, entries, "{plan}");
    assert_eq!(files.len(), 2, "{plan}");
    assert!(
        err.contains("wrote 2 kernel source(s) for 12 kernel(s)"),
        "{err}"
    );
    if rocmforge::runtime::Hiprtc::load().is_ok() {
        let (ok, out, err) = rocmforge(&[
            "compile",
            file.to_str().unwrap(),
            "--target",
            "gfx90a",
            "--report",
        ]);
        assert!(ok, "{err}");
        assert!(out.contains("(12 kernel(s), 2 distinct"), "{out}");
        for entry in &entries {
            assert_eq!(out.matches(entry.as_str()).count(), 1, "{entry}: {out}");
        }
        assert!(
            out.contains("%n0 (×6)") && out.contains("%n1 (×6)"),
            "{out}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn compile_report_prints_resources_when_hiprtc_is_present() {
    if let Err(e) = rocmforge::runtime::Hiprtc::load() {
        // A skip that passes: where hiprtc must be here (CI), it fails instead.
        assert!(
            std::env::var("ROCMFORGE_REQUIRE_HIPRTC").map_or(true, |v| v != "1"),
            "ROCMFORGE_REQUIRE_HIPRTC=1 but no hiprtc: {e}"
        );
        eprintln!("skipped: no hiprtc ({e})");
        return;
    }
    let (ok, out, err) = rocmforge(&[
        "compile",
        "graphs/attention_causal.json",
        "--target",
        "gfx90a",
        "--report",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("vgpr") && out.contains("rf_flash_attention_") && out.contains("%out"),
        "{out}"
    );
}

#[test]
fn without_gpu_libraries_run_falls_back_to_the_cpu_with_a_message() {
    let (ok, stdout, stderr) = rocmforge_with(
        &["run", "graphs/attention.json", "--verify"],
        &[
            ("ROCMFORGE_CUDA_LIBRARY", "/nonexistent/libcuda.so.1"),
            ("ROCMFORGE_NVRTC_LIBRARY", "/nonexistent/libnvrtc.so"),
            ("ROCMFORGE_HIP_LIBRARY", "/nonexistent/libamdhip64.so"),
        ],
    );
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("ROCMFORGE_CUDA_LIBRARY=/nonexistent/libcuda.so.1: No such file")
            && stderr.contains("ROCMFORGE_HIP_LIBRARY=/nonexistent/libamdhip64.so: No such file")
            && stderr.contains("note: no GPU available; running on the CPU ("),
        "{stderr}"
    );
    assert!(
        stdout.contains("device: cpu") && stdout.contains("relative L2 error"),
        "{stdout}"
    );
    assert!(!stderr.contains("panicked"));
}

/// `interp` (the reference interpreter) is a device of its own, by `--device` and by
/// ROCMFORGE_DEVICE; `--threads N` / ROCMFORGE_THREADS size the fast CPU device, whose note
/// says how many threads it runs, in one line.
#[test]
fn interp_is_a_device_and_threads_size_the_cpu() {
    let hide = [
        ("ROCMFORGE_CUDA_LIBRARY", "/nonexistent/libcuda.so.1"),
        ("ROCMFORGE_NVRTC_LIBRARY", "/nonexistent/libnvrtc.so"),
        ("ROCMFORGE_HIP_LIBRARY", "/nonexistent/libamdhip64.so"),
    ];
    let (ok, out, err) = rocmforge_with(
        &[
            "run",
            "graphs/attention.json",
            "--device",
            "interp",
            "--verify",
        ],
        &hide,
    );
    assert!(ok, "{err}");
    assert!(
        out.contains("device: interp (reference interpreter)"),
        "{out}"
    );
    assert!(out.contains("verify out: relative L2 error"), "{out}");
    let mut env = hide.to_vec();
    env.push(("ROCMFORGE_DEVICE", "interp"));
    let (ok, out, err) = rocmforge_with(&["run", "graphs/attention.json"], &env);
    assert!(ok, "{err}");
    assert!(out.contains("device: interp"), "{out}");
    assert!(
        err.contains("note: running on the reference interpreter"),
        "{err}"
    );

    let (ok, out, err) = rocmforge_with(&["run", "graphs/attention.json", "--threads", "2"], &hide);
    assert!(ok, "{err}");
    let notes: Vec<&str> = err.lines().filter(|l| l.contains("running on")).collect();
    assert_eq!(
        notes,
        ["note: no GPU available; running on the CPU (2 threads)"],
        "{err}"
    );
    assert!(
        out.contains("device: cpu (fast CPU executor, 2 threads)"),
        "{out}"
    );
    let mut env = hide.to_vec();
    env.push(("ROCMFORGE_THREADS", "3"));
    let (ok, _, err) = rocmforge_with(&["run", "graphs/attention.json"], &env);
    assert!(ok, "{err}");
    assert!(err.contains("running on the CPU (3 threads)"), "{err}");
    // The flag wins over the variable.
    let (ok, _, err) = rocmforge_with(&["run", "graphs/attention.json", "--threads", "1"], &env);
    assert!(ok, "{err}");
    assert!(err.contains("running on the CPU (1 thread)"), "{err}");

    for bad in ["0", "x", "-2"] {
        let mut env = hide.to_vec();
        env.push(("ROCMFORGE_THREADS", bad));
        let (ok, _, err) = rocmforge_with(&["run", "graphs/attention.json"], &env);
        assert_clean_error(bad, ok, &err);
        assert!(err.contains("must be a positive integer"), "{bad}: {err}");
    }
    let (ok, _, err) = rocmforge_with(&["run", "graphs/attention.json", "--threads", "0"], &hide);
    assert!(!ok && err.contains("--threads"), "{err}");
}

/// Graph files that are not regular files are refused without being read: a FIFO (whose
/// `open` would block), endless streams, a directory, a symlink loop; every command that reads
/// a graph says so in one paragraph.
#[test]
fn special_files_are_refused_without_hanging() {
    let dir = scratch("special");
    let fifo = dir.join("graph.json");
    mkfifo(&fifo);
    let looped = dir.join("loop.json");
    std::os::unix::fs::symlink(&looped, &looped).unwrap();
    let dirpath = dir.join("adir.json");
    std::fs::create_dir(&dirpath).unwrap();
    let cases: [(&Path, &str); 5] = [
        (&fifo, "is a FIFO, not a regular file"),
        (
            Path::new("/dev/zero"),
            "is a character device, not a regular file",
        ),
        // stdin is an open pipe nobody writes: reading it would never end.
        (Path::new("/dev/stdin"), "is a FIFO, not a regular file"),
        (&dirpath, "is a directory, not a regular file"),
        (&looped, "cannot read"),
    ];
    for (path, why) in cases {
        let p = path.to_str().unwrap();
        for args in [
            vec!["run", p, "--device", "cpu"],
            vec!["show", p],
            vec!["compile", p],
            vec!["compile", p, "--target", "gfx90a"],
        ] {
            let (ok, _, err) = rocmforge(&args);
            assert_clean_error(&format!("{args:?}"), ok, &err);
            assert!(err.contains(why), "{args:?}: {err}");
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A graph whose inputs are not all read (the passes remove the unused one) runs and verifies;
/// bindings are checked against the graph as written.
#[test]
fn a_graph_with_an_unused_input_runs_and_verifies() {
    let dir = scratch("unused");
    let file = dir.join("unused.json");
    std::fs::write(
        &file,
        r#"{"version": 1, "name": "unused", "nodes": [
        {"name": "x", "op": "input", "dtype": "f32", "shape": [2, 3]},
        {"name": "y", "op": "input", "dtype": "f32", "shape": [4]},
        {"name": "o", "op": "exp", "inputs": ["x"]}], "outputs": ["o"]}"#,
    )
    .unwrap();
    let (ok, out, err) = rocmforge(&["run", file.to_str().unwrap(), "--device", "cpu", "--verify"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("graph:  unused (3 nodes, 2 after passes)")
            && out.contains("verify o: relative L2 error 0.000e0"),
        "{out}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// NaN and ±inf at the same places in the run and the interpreter are equal; the error figure
/// is over the finite values (here exactly 0), and the statistics say how many are not finite.
#[test]
fn verify_treats_nan_and_inf_at_the_same_places_as_equal() {
    let dir = scratch("nonfinite");
    let file = dir.join("nonfinite.json");
    std::fs::write(
        &file,
        r#"{"version": 1, "name": "nonfinite", "nodes": [
        {"name": "x", "op": "input", "dtype": "f32", "shape": [4, 8]},
        {"name": "zero", "op": "constant", "dtype": "f32", "value": 0.0},
        {"name": "ln", "op": "log", "inputs": ["x"]},
        {"name": "q", "op": "div", "inputs": ["x", "zero"]}], "outputs": ["ln", "q"]}"#,
    )
    .unwrap();
    let (ok, out, err) = rocmforge(&["run", file.to_str().unwrap(), "--device", "cpu", "--verify"]);
    assert!(ok, "{err}");
    for line in [
        "verify ln: relative L2 error 0.000e0 against the interpreter (unfused) over the finite values; ",
        "verify q: relative L2 error 0.000e0 against the interpreter (unfused) over the finite values; 32 NaN/±inf at the same places",
        "  no finite values  ±inf 32",
    ] {
        assert!(out.contains(line), "missing `{line}` in:\n{out}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Malformed device names are errors, from `--device` and from ROCMFORGE_DEVICE alike (not a
/// quiet fall back to the CPU).
#[test]
fn malformed_device_names_are_errors() {
    let hide = [
        ("ROCMFORGE_CUDA_LIBRARY", "/nonexistent/libcuda.so.1"),
        ("ROCMFORGE_HIP_LIBRARY", "/nonexistent/libamdhip64.so"),
    ];
    for (spec, why) in [
        ("cuda:99", "no device `cuda:99`"),
        ("hip:-1", "`-1` is not a device number"),
        ("cuda:18446744073709551616", "is past 2147483647"),
        ("tpu", "unknown kind of device `tpu`"),
        ("interp:0", "the interpreter has no device number"),
    ] {
        let (ok, _, err) =
            rocmforge_with(&["run", "graphs/attention.json", "--device", spec], &hide);
        assert_clean_error(spec, ok, &err);
        assert!(err.contains(why), "--device {spec}: {err}");
        let mut env = hide.to_vec();
        env.push(("ROCMFORGE_DEVICE", spec));
        let (ok, _, err) = rocmforge_with(&["run", "graphs/attention.json"], &env);
        assert_clean_error(spec, ok, &err);
        assert!(
            err.contains("error: ROCMFORGE_DEVICE: ") && err.contains(why),
            "ROCMFORGE_DEVICE={spec}: {err}"
        );
    }
}

/// ROCMFORGE_CUDA_LIBRARY, ROCMFORGE_NVRTC_LIBRARY, ROCMFORGE_HIP_LIBRARY and ROCMFORGE_HIPRTC
/// name the file to use; a file that is not a usable library of that kind is a "no device" (or
/// no compiler) with the reason, never a panic.
#[test]
fn library_variables_refuse_files_that_are_not_the_library() {
    let dir = scratch("libs");
    let text = dir.join("libcuda.so.1");
    std::fs::write(&text, "this is not a shared library\n").unwrap();
    let fifo = dir.join("fifo.so");
    mkfifo(&fifo);
    let cases = [
        (text.to_str().unwrap(), "cannot load it"),
        ("/dev/null", "a character device, not a library file"),
        (dir.to_str().unwrap(), "a directory, not a library file"),
        (fifo.to_str().unwrap(), "a FIFO, not a library file"),
        // A real library without the entry points (the dynamic loader finds it by name).
        ("libm.so.6", "libm.so.6 lacks "),
    ];
    for (file, why) in cases {
        for (var, device) in [
            ("ROCMFORGE_CUDA_LIBRARY", "cuda:0"),
            ("ROCMFORGE_HIP_LIBRARY", "hip:0"),
        ] {
            let (ok, _, err) = rocmforge_with(
                &["run", "graphs/attention.json", "--device", device],
                &[(var, file)],
            );
            assert_clean_error(&format!("{var}={file}"), ok, &err);
            // The HIP runtime names the first entry point missing, cudarc's path all of them.
            let why = match (why, var) {
                ("libm.so.6 lacks ", "ROCMFORGE_HIP_LIBRARY") => "has no symbol hipInit",
                _ => why,
            };
            assert!(
                err.contains(&format!("no device `{device}`: {var}={file}")) && err.contains(why),
                "{var}={file}: {err}"
            );
        }
        let (ok, _, err) = rocmforge_with(
            &[
                "compile",
                "graphs/attention.json",
                "--target",
                "gfx90a",
                "--report",
            ],
            &[("ROCMFORGE_HIPRTC", file)],
        );
        assert_clean_error(&format!("ROCMFORGE_HIPRTC={file}"), ok, &err);
        let why = if file == "libm.so.6" {
            "has no symbol hiprtcVersion"
        } else {
            why
        };
        assert!(err.contains(why), "ROCMFORGE_HIPRTC={file}: {err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Where no NVIDIA driver is found, the note says so in one line naming the usual file; the
/// names searched (each once) are logged only at debug level (`RUST_LOG=rocmforge=debug`).
#[test]
fn no_device_notes_are_one_line_and_the_search_is_logged_at_debug() {
    let (ok, _, err) = rocmforge_with(&["run", "graphs/attention.json"], &[("RUST_LOG", "warn")]);
    assert!(ok, "{err}");
    assert!(!err.contains("(tried "), "a search list in a note:\n{err}");
    let absent = "no NVIDIA driver: libcuda.so.1 not found";
    let cuda_note = err.lines().find(|l| l.contains("no device `cuda:0`"));
    let no_driver = cuda_note.is_some_and(|l| l.contains(absent));
    if let Some(line) = cuda_note.filter(|_| no_driver) {
        assert!(line.ends_with(absent), "more than the one line: {line}");
    }

    let (ok, _, err) = rocmforge_with(
        &["run", "graphs/attention.json"],
        &[("RUST_LOG", "rocmforge=debug")],
    );
    assert!(ok, "{err}");
    let search = err
        .lines()
        .find(|l| l.contains("library=\"NVIDIA driver\"") && l.contains("absent="));
    // The debug line is there exactly when the driver is absent, and lists each name once.
    assert_eq!(search.is_some(), no_driver, "{err}");
    if let Some(line) = search {
        let names = line.split("absent=").nth(1).unwrap();
        let names = names.split(" failed=").next().unwrap();
        let names: Vec<&str> = names.split(", ").collect();
        assert!(names.contains(&"libcuda.so.1"), "{line}");
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(names.len(), unique.len(), "a name repeats in: {line}");
    }
}

/// AMD target ids are checked against what the loaded hiprtc supports before it compiles
/// anything: ROCm 5.2's hiprtc aborts the process on an unknown processor or feature.
#[test]
fn report_refuses_targets_the_compiler_does_not_support() {
    if rocmforge::runtime::Hiprtc::load().is_err() {
        assert!(
            std::env::var("ROCMFORGE_REQUIRE_HIPRTC").map_or(true, |v| v != "1"),
            "ROCMFORGE_REQUIRE_HIPRTC=1 but no hiprtc"
        );
        eprintln!("skipped: no hiprtc");
        return;
    }
    for (arch, why) in [
        ("gfx9999", "unknown processor `gfx9999`"),
        ("gfx940", "unknown processor `gfx940`"),
        ("gfx90a:foo+", "unknown feature `foo+`"),
        ("gfx90a:sramecc+:sramecc-", "feature sramecc is given twice"),
        ("gfx1030:xnack+", "gfx1030 has no xnack feature"),
        ("sm_9x", "unknown processor `sm_9x`"),
        ("", "no processor"),
        ("gfx90a -mllvm -print-after-all", "unknown processor"),
    ] {
        let (ok, out, err) = rocmforge(&[
            "compile",
            "graphs/attention.json",
            "--target",
            arch,
            "--report",
        ]);
        assert_clean_error(arch, ok, &err);
        assert!(
            err.contains(&format!("hiprtc cannot compile for target `{arch}`: {why}"))
                && err.contains("it supports ")
                && err.contains("gfx90a[:sramecc±][:xnack±]"),
            "{arch}: {err}"
        );
        assert!(out.is_empty(), "{arch}: {out}");
    }
    let (ok, _, err) = rocmforge(&[
        "compile",
        "graphs/attention.json",
        "--target",
        "gfx90a:xnack-:sramecc+",
        "--report",
    ]);
    assert!(ok, "{err}");
}

/// `cache ls` and `cache clear` list the entries they can handle, carry on past those they
/// cannot (a FIFO, a directory, an unreadable or oversized file, a symlink loop) and say which
/// they skipped and why; a corrupt entry is listed as such and cleared. Nothing blocks.
#[test]
fn cache_commands_skip_special_entries_and_list_them() {
    use rocmforge::runtime::{CacheKey, DiskCache};
    let dir = scratch("cache");
    let key = CacheKey {
        arch: "gfx90a".into(),
        wave_size: 64,
        toolchain: "test".into(),
        options: vec![],
        entry: "rf_test_kernel".into(),
        source: "source".into(),
    };
    DiskCache::new(dir.clone()).write(&key, b"code").unwrap();
    std::fs::write(dir.join("corrupt.bin"), b"not an entry").unwrap();
    mkfifo(&dir.join("fifo.bin"));
    std::fs::create_dir(dir.join("adir.bin")).unwrap();
    let looped = dir.join("loop.bin");
    std::os::unix::fs::symlink(&looped, &looped).unwrap();
    let big = std::fs::File::create(dir.join("big.bin")).unwrap();
    big.set_len(rocmforge::runtime::CACHE_ENTRY.max_bytes + 1)
        .unwrap();
    let unreadable = dir.join("unreadable.bin");
    std::fs::write(&unreadable, b"secret").unwrap();
    std::fs::set_permissions(
        &unreadable,
        std::os::unix::fs::PermissionsExt::from_mode(0o000),
    )
    .unwrap();
    // root reads a file of mode 000 anyway: then it is an entry (a corrupt one), else skipped.
    let readable = std::fs::File::open(&unreadable).is_ok();
    std::fs::write(dir.join("notes.txt"), b"not a cache file").unwrap();
    let env = [("ROCMFORGE_CACHE_DIR", dir.to_str().unwrap())];

    let (ok, out, err) = rocmforge_with(&["cache", "ls"], &env);
    assert!(ok, "{err}");
    let entries = if readable { 3 } else { 2 };
    let skipped = if readable { 4 } else { 5 };
    for part in [
        format!("({entries} entries)"),
        "rf_test_kernel".into(),
        "corrupt.bin".into(),
        "(corrupt: will be rebuilt)".into(),
        format!("skipped {skipped} file(s)"),
        "fifo.bin  a FIFO, not a regular file".into(),
        "adir.bin  a directory, not a regular file".into(),
        "loop.bin  a symbolic link, not a regular file".into(),
        "big.bin  ".into(),
        "more than the limit of 67108864".into(),
    ] {
        assert!(out.contains(&part), "missing `{part}` in:\n{out}");
    }
    assert!(!out.contains("notes.txt"), "{out}");
    if !readable {
        assert!(out.contains("unreadable.bin  cannot read"), "{out}");
    }

    let (ok, out, err) = rocmforge_with(&["cache", "clear"], &env);
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!("removed {entries} entries"))
            && out.contains(&format!("skipped {skipped} file(s)")),
        "{out}"
    );
    for left in ["fifo.bin", "adir.bin", "big.bin", "notes.txt"] {
        assert!(dir.join(left).exists(), "{left} was removed");
    }
    assert!(
        std::fs::symlink_metadata(&looped).is_ok(),
        "the link was removed"
    );
    assert!(!dir.join("corrupt.bin").exists());

    // A cache directory that is not a directory is an error, not an empty cache.
    let fifo_dir = dir.join("fifo.bin");
    let (ok, _, err) = rocmforge_with(
        &["cache", "ls"],
        &[("ROCMFORGE_CACHE_DIR", fifo_dir.to_str().unwrap())],
    );
    assert_clean_error("cache dir is a FIFO", ok, &err);
    assert!(err.contains("kernel cache at"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `cache clear` that cannot remove an entry names it and exits non-zero (the cache is not
/// clear); what it could remove is gone.
#[test]
fn cache_clear_fails_on_entries_it_cannot_remove() {
    use rocmforge::runtime::{CacheKey, DiskCache};
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("cache-stuck");
    let key = CacheKey {
        arch: "gfx90a".into(),
        wave_size: 64,
        toolchain: "test".into(),
        options: vec![],
        entry: "rf_stuck_kernel".into(),
        source: "source".into(),
    };
    DiskCache::new(dir.clone()).write(&key, b"code").unwrap();
    let entry = dir.join(format!("{}.bin", key.digest()));
    assert!(entry.is_file());
    // A read-only directory keeps its files from anyone but root; root is kept off by the
    // immutable attribute where the filesystem and the capabilities allow it.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o555)).unwrap();
    let immutable = Command::new("chattr")
        .arg("+i")
        .arg(&entry)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let env = [("ROCMFORGE_CACHE_DIR", dir.to_str().unwrap())];
    let (code, out, err) = rocmforge_code(&["cache", "clear"], &env);
    let stuck = entry.exists();
    if immutable {
        Command::new("chattr")
            .arg("-i")
            .arg(&entry)
            .status()
            .unwrap();
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    if stuck {
        assert_ne!(code, Some(0), "the entry is still there:\n{out}\n{err}");
        assert!(err.contains("could not remove 1 cache entry"), "{err}");
        assert!(err.contains(&format!("{}.bin", key.digest())), "{err}");
        assert!(out.contains("removed 0 entries"), "{out}");
    } else {
        // Nothing here could keep this process from removing a file (root without the
        // immutable attribute): then the clear succeeds, and must say so.
        eprintln!("note: the entry could not be made unremovable here");
        assert_eq!(code, Some(0), "{err}");
        assert!(out.contains("removed 1 entries"), "{out}");
    }
}

/// A model directory whose files are special or oversized is refused before anything is read.
#[test]
fn embed_refuses_special_model_files() {
    let dir = scratch("model");
    mkfifo(&dir.join("config.json"));
    let (ok, _, err) = rocmforge(&[
        "embed",
        "--model",
        dir.to_str().unwrap(),
        "--device",
        "cpu",
        "hi",
    ]);
    assert_clean_error("config.json FIFO", ok, &err);
    assert!(
        err.contains("config.json: the settings file is a FIFO"),
        "{err}"
    );
    std::fs::remove_file(dir.join("config.json")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.join("config.json")).unwrap();
    let (ok, _, err) = rocmforge(&[
        "embed",
        "--model",
        dir.to_str().unwrap(),
        "--device",
        "cpu",
        "hi",
    ]);
    assert_clean_error("config.json -> /dev/zero", ok, &err);
    assert!(err.contains("is a character device"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn compile_emits_a_bundle_that_replay_checks_and_refuses_to_run_without_a_gpu() {
    let dir = scratch("bundle").join("b");
    let d = dir.to_str().unwrap();
    let (ok, _, err) = rocmforge(&[
        "compile",
        "graphs/attention_padding_mask.json",
        "--target",
        "gfx90a",
        "--emit",
        "bundle",
        "--out",
        d,
        "--seed",
        "4",
    ]);
    assert!(ok && err.contains("wrote a bundle to"), "{err}");
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("plan.json")).unwrap()).unwrap();
    assert_eq!(plan["format"], "rocmforge-bundle/2");
    assert_eq!(plan["seed"], 4);
    let (ok, out, err) = rocmforge(&["replay", d, "--check"]);
    assert!(ok && out.contains("consistent"), "{out}{err}");
    let (ok, out, _) = rocmforge(&["replay", d, "--check", "--json"]);
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(ok);
    assert_eq!(report["kernels"], plan["kernels"].as_array().unwrap().len());
    // The CPU runs no kernels: exit 4, said in one clean error.
    let (code, _, err) = rocmforge_code(&["replay", d, "--device", "cpu"], &[]);
    assert_eq!(code, Some(4), "{err}");
    assert_clean_error("replay on the CPU", false, &err);
    assert!(err.contains("needs a GPU"), "{err}");
    // A second bundle into the same directory is refused.
    let (ok, _, err) = rocmforge(&[
        "compile",
        "graphs/attention.json",
        "--target",
        "gfx90a",
        "--emit",
        "bundle",
        "--out",
        d,
    ]);
    assert_clean_error("bundle into a full directory", ok, &err);
    assert!(err.contains("not empty"), "{err}");
    // Malformed bundles: exit 3.
    let data = std::fs::read_dir(dir.join("buffers"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let bytes = std::fs::read(&data).unwrap();
    std::fs::write(&data, &bytes[1..]).unwrap();
    let (code, _, err) = rocmforge_code(&["replay", d, "--check"], &[]);
    assert_eq!(code, Some(3), "{err}");
    assert_clean_error("truncated buffer", false, &err);
    assert!(err.contains("the buffer table says"), "{err}");
    std::fs::remove_file(dir.join("plan.json")).unwrap();
    let (code, _, err) = rocmforge_code(&["replay", d], &[]);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("no such file"), "{err}");
    std::fs::remove_dir_all(dir.parent().unwrap()).ok();
}

#[test]
fn a_bundle_for_a_target_without_a_compiler_has_sources_and_says_so() {
    let dir = scratch("bundle-nvrtc").join("b");
    let d = dir.to_str().unwrap();
    let (ok, _, err) = rocmforge_with(
        &[
            "compile",
            "graphs/gqa_attention.json",
            "--target",
            "sm_90",
            "--emit",
            "bundle",
            "--out",
            d,
        ],
        &[("ROCMFORGE_NVRTC_LIBRARY", "/nonexistent/libnvrtc.so")],
    );
    assert!(ok, "{err}");
    assert!(
        err.contains("note: no compiler for sm_90 here") && err.contains("sources only"),
        "{err}"
    );
    let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
    assert!(readme.contains("No code objects"), "{readme}");
    let kernels: Vec<String> = std::fs::read_dir(dir.join("kernels"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !kernels.is_empty() && kernels.iter().all(|k| k.ends_with(".hip")),
        "{kernels:?}"
    );
    let (ok, out, err) = rocmforge(&["replay", d, "--check"]);
    assert!(ok && out.contains("0 code object(s)"), "{out}{err}");
    std::fs::remove_dir_all(dir.parent().unwrap()).ok();
    // --compiler only means something where a compiler is used.
    let (code, _, err) = rocmforge_code(
        &["compile", "graphs/attention.json", "--compiler", "clang"],
        &[],
    );
    assert_eq!(code, Some(2), "{err}");
}

/// `generate --json` on the CPU: the reference's prompt ids and first greedy tokens (from
/// ../shared/reference/smollm2), their text, and timings; past the context, a clean error.
#[test]
fn generate_json_gives_the_reference_tokens_on_the_cpu() {
    let Some(model) = smollm2::gguf_if_present() else {
        return;
    };
    let model = model.to_str().unwrap();
    let prompt = "The capital of France is";
    let (ok, out, err) = rocmforge(&[
        "generate",
        "--model",
        model,
        "--device",
        "cpu",
        "--max-tokens",
        "3",
        "--max-context",
        "32",
        "--json",
        prompt,
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let ids = |k: &str| -> Vec<u64> { serde_json::from_value(v[k].clone()).unwrap() };
    assert_eq!(ids("prompt_ids"), [504, 3575, 282, 4649, 314]);
    assert_eq!(ids("generated_ids"), [7042, 30, 198]);
    assert_eq!(v["text"], " Paris.\n");
    assert_eq!(v["stats"]["prompt_tokens"], 5);
    assert_eq!(v["stats"]["decode_tokens"], 2);
    assert!(v["stats"]["decode_tokens_per_s"].as_f64().unwrap() > 0.0);
    let (ok, _, err) = rocmforge(&[
        "generate",
        "--model",
        model,
        "--device",
        "cpu",
        "--max-tokens",
        "40",
        "--max-context",
        "32",
        prompt,
    ]);
    assert!(!ok && err.contains("maximum context 32"), "{err}");
    assert_clean_error("generate past the context", ok, &err);
}
