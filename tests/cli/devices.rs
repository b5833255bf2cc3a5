//! Devices and targets: the interpreter and CPU devices, special and unused inputs, verification,
//! device names, library variables, no-device notes and unsupported targets.

use super::*;

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
    // The fast CPU device's exp is vectorised (a few ulps from libm's), so the figure is small, not 0.
    let error: f64 = out
        .lines()
        .find_map(|l| l.strip_prefix("verify o: relative L2 error "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|e| e.parse().ok())
        .unwrap_or_else(|| panic!("no verify line: {out}"));
    assert!(
        out.contains("graph:  unused (3 nodes, 2 after passes)") && error < 1e-6,
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
