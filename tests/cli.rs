//! The command line as a user drives it.

use std::process::Command;

fn rocmforge(args: &[&str]) -> (bool, String, String) {
    rocmforge_with(args, &[])
}

/// Runs the CLI from the repository root with `env` set (and no ROCMFORGE_DEVICE from outside).
fn rocmforge_with(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rocmforge"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .envs(env.iter().copied())
        .env_remove("ROCMFORGE_DEVICE")
        .output()
        .expect("run rocmforge");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
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
    assert!(!ok && err.contains("cannot read"), "{err}");
}

#[test]
fn help_answers_for_every_command() {
    for args in [
        vec!["--help"],
        vec!["run", "--help"],
        vec!["show", "--help"],
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

#[test]
fn compile_report_prints_resources_when_hiprtc_is_present() {
    if rocmforge::runtime::Hiprtc::load().is_err() {
        return; // covered by tests/hiprtc.rs, which reports the reason
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
        stderr.contains("libcuda not found")
            && stderr.contains("no HIP runtime found (tried /nonexistent/libamdhip64.so)")
            && stderr.contains("running on the CPU interpreter"),
        "{stderr}"
    );
    assert!(
        stdout.contains("device: cpu") && stdout.contains("relative L2 error"),
        "{stdout}"
    );
    assert!(!stderr.contains("panicked"));
}
