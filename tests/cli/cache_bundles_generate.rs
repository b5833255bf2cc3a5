//! The kernel cache commands, model files, bundles emitted and replayed, and `generate --json`.

use super::*;

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
    // ms per token is decode seconds over decode steps; the CPU launches no kernels.
    let (secs, ms) = (
        v["stats"]["decode_seconds"].as_f64().unwrap(),
        v["stats"]["decode_ms_per_token"].as_f64().unwrap(),
    );
    assert!(
        (ms - secs * 1e3 / 2.0).abs() <= 1e-9 * ms.max(1.0),
        "{ms} vs {secs}"
    );
    assert!(v["stats"]["kernels_per_token"].is_null(), "{v}");
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
