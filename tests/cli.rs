//! The command line as a user drives it. Every run has a time limit, so a regression that
//! blocks (on a FIFO, an endless stream) fails instead of hanging the suite; stdin is a pipe
//! that stays open and empty, as a terminal waiting for input would.

#[path = "common/smollm2.rs"]
mod smollm2;
#[path = "common/tiny_gguf.rs"]
mod tiny_gguf;

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
        vec!["serve", "--help"],
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

/// `rocmforge compile GRAPH --target TARGET --emit hip --out DIR`, which must succeed: the
/// plan listing it wrote, and its stderr.
fn emit_hip(graph: &str, target: &str, dir: &std::path::Path) -> (String, String) {
    let (ok, _, err) = rocmforge(&[
        "compile",
        graph,
        "--target",
        target,
        "--emit",
        "hip",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    (std::fs::read_to_string(dir.join("plan.txt")).unwrap(), err)
}

#[test]
fn compile_for_a_target_emits_sources_and_names_bad_arches() {
    let dir = std::env::temp_dir().join(format!("rocmforge-emit-{}", std::process::id()));
    let (plan, _) = emit_hip("graphs/llama_block.json", "gfx1030", &dir);
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

/// `sm_90a` (the arch-specific Hopper row: wgmma, setmaxnreg) is a target of its own that
/// compiles to sources without a GPU.
#[test]
fn compile_for_sm_90a_emits_sources() {
    let dir = std::env::temp_dir().join(format!("rocmforge-sm90a-{}", std::process::id()));
    let (plan, _) = emit_hip("graphs/bert_layer.json", "sm_90a", &dir);
    assert!(plan.contains("target sm_90a (wave 32)"), "{plan}");
    std::fs::remove_dir_all(&dir).ok();
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
    // The plan's distinct entries, read from its listing, against the files written.
    let (plan, err) = emit_hip(file.to_str().unwrap(), "gfx90a", &out);
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

#[path = "cli/devices.rs"]
mod devices;

#[path = "cli/cache_bundles_generate.rs"]
mod cache_bundles_generate;

#[path = "cli/compile_model.rs"]
mod compile_model;

/// `--tf32` is opt-in and never silent: on a target without a TF32 atom every f32 matmul of the
/// plan carries a note that it runs exact f32; on sm_90 the plan takes it without a note, and
/// without the flag nothing changes.
#[test]
fn compile_tf32_is_opt_in_and_notes_a_fallback() {
    let g = "graphs/bert_layer.json";
    let (ok, out, err) = rocmforge(&["compile", g, "--target", "gfx90a", "--tf32"]);
    assert!(ok, "{err}");
    let notes: Vec<&str> = out.lines().filter(|l| l.starts_with("// note: ")).collect();
    assert!(!notes.is_empty(), "{out}");
    assert!(notes
        .iter()
        .all(|n| n.ends_with("gfx90a has no TF32 matrix instruction: exact f32")));
    assert!(notes.iter().any(|n| n.contains("flash_attention")), "{out}");
    for args in [
        &["compile", g, "--target", "sm_90", "--tf32"][..],
        &["compile", g, "--target", "gfx90a"][..],
    ] {
        let (ok, out, err) = rocmforge(args);
        assert!(ok, "{err}");
        assert!(!out.contains("// note: "), "{args:?}: {out}");
    }
    let (ok, help, _) = rocmforge(&["compile", "--help"]);
    assert!(ok && help.contains("--tf32") && help.contains("1e-3 relative"));
}
