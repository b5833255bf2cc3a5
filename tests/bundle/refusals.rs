//! Bundles that are damaged, contradictory, oversized or for a target without a compiler here are
//! refused with a typed error; index and status buffers in their storage layout.

use super::*;

#[test]
fn truncated_or_padded_buffer_files_are_size_errors() {
    let dir = small_bundle("truncated");
    let plan = read_plan(&dir);
    let data = plan.buffers.iter().find(|b| b.data.is_some()).unwrap();
    let path = dir.join(data.data.as_ref().unwrap());
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
    match open_and_check(&dir) {
        Err(BundleError::Size {
            path: p,
            expected,
            found,
        }) => {
            assert!(p.ends_with(data.data.as_ref().unwrap()), "{p}");
            assert_eq!((expected, found), (data.bytes, data.bytes - 3));
        }
        other => panic!("{other:?}"),
    }
    std::fs::write(&path, &bytes).unwrap();
    let exp = plan.buffers.iter().find(|b| b.expected.is_some()).unwrap();
    let path = dir.join(exp.expected.as_ref().unwrap());
    let mut longer = std::fs::read(&path).unwrap();
    longer.push(0);
    std::fs::write(&path, &longer).unwrap();
    assert!(matches!(
        open_and_check(&dir),
        Err(BundleError::Size { expected, found, .. }) if found == expected + 1
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn missing_files_are_named() {
    let dir = small_bundle("missing");
    let plan = read_plan(&dir);
    let k = &plan.kernels[1];
    let src = dir.join(&k.source);
    let text = std::fs::read(&src).unwrap();
    std::fs::remove_file(&src).unwrap();
    match open_and_check(&dir) {
        Err(BundleError::File(FileError::Missing { path })) => {
            assert!(path.ends_with(&k.source), "{path}")
        }
        other => panic!("{other:?}"),
    }
    std::fs::write(&src, text).unwrap();
    if let Some(co) = &k.code_object {
        std::fs::remove_file(dir.join(co)).unwrap();
        assert!(matches!(
            open_and_check(&dir),
            Err(BundleError::File(FileError::Missing { path })) if path.ends_with(co.as_str())
        ));
    }
    std::fs::remove_file(dir.join("plan.json")).unwrap();
    assert!(matches!(
        Bundle::open(&dir, u64::MAX),
        Err(BundleError::File(FileError::Missing { .. }))
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_json_unknown_fields_and_other_versions_are_refused() {
    let dir = small_bundle("json");
    let path = dir.join("plan.json");
    let good = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, &good[..good.len() / 2]).unwrap();
    assert!(matches!(
        open_and_check(&dir),
        Err(BundleError::Json { .. })
    ));
    std::fs::write(&path, &good).unwrap();

    edit_plan(&dir, |v| v["format"] = "rocmforge-bundle/3".into());
    match open_and_check(&dir) {
        Err(BundleError::Version { found, .. }) => assert_eq!(found, "rocmforge-bundle/3"),
        other => panic!("{other:?}"),
    }
    // A version-1 plan (no states, no quantized weights) is still read.
    std::fs::write(&path, &good).unwrap();
    edit_plan(&dir, |v| v["format"] = "rocmforge-bundle/1".into());
    open_and_check(&dir).unwrap();
    std::fs::write(&path, &good).unwrap();
    edit_plan(&dir, |v| v["kernels"][0]["stream"] = 1.into());
    match open_and_check(&dir) {
        Err(BundleError::Json { message, .. }) => assert!(message.contains("stream"), "{message}"),
        other => panic!("{other:?}"),
    }
    std::fs::write(&path, &good).unwrap();
    edit_plan(&dir, |v| {
        v.as_object_mut().unwrap().remove("format");
    });
    assert!(matches!(
        open_and_check(&dir),
        Err(BundleError::Json { .. })
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn plans_that_contradict_themselves_are_malformed() {
    let dir = small_bundle("malformed");
    let path = dir.join("plan.json");
    let good = std::fs::read_to_string(&path).unwrap();
    let n = read_plan(&dir).buffers.len();
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let cases: Vec<(&str, Edit)> = vec![
        (
            "bytes, not 48",
            Box::new(|v| v["buffers"][0]["bytes"] = 48.into()),
        ),
        (
            "ids must count up",
            Box::new(|v| v["buffers"][1]["id"] = 7.into()),
        ),
        (
            "not in the table",
            Box::new(move |v| v["kernels"][0]["args"][0]["buffer"] = n.into()),
        ),
        (
            "not a C identifier",
            Box::new(|v| v["kernels"][0]["entry"] = "../../etc/x".into()),
        ),
        (
            "must be kernels/",
            Box::new(|v| v["kernels"][0]["source"] = "/etc/passwd".into()),
        ),
        (
            "data file",
            Box::new(|v| v["buffers"][0]["data"] = "../outside.bin".into()),
        ),
        (
            "writes buffer",
            Box::new(|v| v["kernels"][0]["args"][0]["access"] = "write".into()),
        ),
        (
            "declares parameters",
            Box::new(|v| v["kernels"][0]["args"][0]["ctype"] = "const double*".into()),
        ),
        (
            "declares parameters",
            Box::new(|v| {
                let a = v["kernels"][0]["args"][0].clone();
                v["kernels"][0]["args"].as_array_mut().unwrap().insert(0, a);
            }),
        ),
        (
            "too large to address",
            Box::new(|v| v["buffers"][0]["shape"] = serde_json::json!([usize::MAX, 4])),
        ),
        (
            "target",
            Box::new(|v| v["target"]["arch"] = "gfx9999".into()),
        ),
        (
            "wave size",
            Box::new(|v| v["target"]["wave_size"] = 32.into()),
        ),
        (
            "output viewed as",
            Box::new(|v| v["outputs"][0]["shape"] = serde_json::json!([3])),
        ),
    ];
    for (why, edit) in cases {
        std::fs::write(&path, &good).unwrap();
        edit_plan(&dir, edit);
        match open_and_check(&dir) {
            Err(BundleError::Malformed { reason }) => {
                assert!(reason.contains(why), "{why}: {reason}")
            }
            other => panic!("{why}: {other:?}"),
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn size_limits_and_occupied_directories_are_refused() {
    let source = format::load(Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/graphs/attention.json"
    )))
    .unwrap();
    let target = Target::parse("gfx90a").unwrap();
    let dir = scratch("limits");
    let small = EmitOptions {
        max_bytes: 1000,
        ..EmitOptions::default()
    };
    match bundle::emit(&source, &target, &dir, &small) {
        Err(BundleError::TooLarge { bytes, limit }) => assert!(bytes > limit && limit == 1000),
        other => panic!("{other:?}"),
    }
    assert!(!dir.exists(), "refused before anything is written");
    let emitted = bundle::emit(&source, &target, &dir, &EmitOptions::default()).unwrap();
    assert!(matches!(
        bundle::emit(&source, &target, &dir, &EmitOptions::default()),
        Err(BundleError::NotEmpty { .. })
    ));
    let opened = Bundle::open(&dir, u64::MAX).unwrap();
    assert!(opened.data_bytes() <= emitted.bytes);
    assert!(matches!(
        Bundle::open(&dir, opened.data_bytes() - 1),
        Err(BundleError::TooLarge { .. })
    ));
    // No GPU is needed to check, and replaying on the CPU says what is missing.
    match opened.replay(&Device::cpu(), &ReplayOptions::default()) {
        Err(BundleError::NoGpu { reason }) => assert!(reason.contains("interpreter"), "{reason}"),
        other => panic!("{:?}", other.map(|r| r.passed)),
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_target_without_a_compiler_here_gets_sources_and_the_reason() {
    let source = format::load(Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/graphs/gqa_attention.json"
    )))
    .unwrap();
    // No NVIDIA driver or NVRTC is needed to emit; with NVRTC found, PTX comes with it.
    let dir = scratch("nvidia");
    let emitted = bundle::emit(
        &source,
        &Target::parse("sm_90").unwrap(),
        &dir,
        &EmitOptions::default(),
    )
    .unwrap();
    let plan = &emitted.plan;
    assert_eq!(plan.target.wave_size, 32);
    let report = Bundle::open(&dir, u64::MAX).unwrap().check().unwrap();
    match &plan.compiler.name {
        Some(name) => {
            assert!(name.starts_with("nvrtc "), "{name}");
            assert_eq!(report.code_objects, plan.kernels.len());
            for k in &plan.kernels {
                let ptx =
                    std::fs::read_to_string(dir.join(k.code_object.as_ref().unwrap())).unwrap();
                assert!(ptx.contains(&format!(".entry {}", k.entry)), "{}", k.entry);
            }
        }
        None => {
            let why = plan.compiler.missing.as_ref().unwrap();
            assert!(why.contains("NVRTC"), "{why}");
            // Where NVRTC must be here (CI installs it), emitting sources only is a failure.
            assert!(
                std::env::var("ROCMFORGE_REQUIRE_NVRTC").map_or(true, |v| v != "1"),
                "ROCMFORGE_REQUIRE_NVRTC=1 but {why}"
            );
            assert_eq!(report.code_objects, 0);
            let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
            assert!(readme.contains("No code objects"), "{readme}");
        }
    }
    assert_eq!(
        report.expected_files,
        plan.buffers.iter().filter(|b| b.role.is_computed()).count()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn index_and_status_buffers_in_their_storage_layout() {
    // A gather: f16 table rows picked by i32 indices, and its index check's status buffer.
    let mut g = Graph::new("layouts");
    let table = g.weight("table", DType::F16, &[7, 5]).unwrap();
    let idx = g
        .input_sampled(
            "idx",
            DType::I32,
            &[3, 2],
            rocmforge::ir::Sample::Range { low: 0, high: 7 },
        )
        .unwrap();
    let rows = g.gather(table, idx).unwrap();
    g.add_output(rows).unwrap();
    let dir = scratch("layouts");
    let emitted = bundle::emit(
        &g,
        &Target::parse("gfx90a").unwrap(),
        &dir,
        &EmitOptions {
            seed: 3,
            ..EmitOptions::default()
        },
    )
    .unwrap();
    let plan = &emitted.plan;
    assert_eq!(plan.checks.len(), 1, "the gather's index check");
    let status = &plan.buffers[plan.checks[0].status];
    assert_eq!(
        (status.role, status.bytes, status.data.as_ref()),
        (Role::Status, 16, None)
    );
    let idx_buf = plan.buffers.iter().find(|b| b.name == "idx").unwrap();
    let bytes = std::fs::read(dir.join(idx_buf.data.as_ref().unwrap())).unwrap();
    assert_eq!(bytes.len(), 6 * 4);
    let indices: Vec<i32> = bytes
        .chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert!(indices.iter().all(|&i| (0..7).contains(&i)), "{indices:?}");
    // The gathered rows, by hand from the table's bytes and the indices.
    let table_buf = plan.buffers.iter().find(|b| b.name == "table").unwrap();
    let t = std::fs::read(dir.join(table_buf.data.as_ref().unwrap())).unwrap();
    let out = plan.outputs[0].buffer;
    let got = std::fs::read(dir.join(format!("expected/{out}.bin"))).unwrap();
    let want: Vec<u8> = indices
        .iter()
        .flat_map(|&i| t[i as usize * 10..i as usize * 10 + 10].to_vec())
        .collect();
    assert_eq!(got, want);
    std::fs::remove_dir_all(&dir).unwrap();
}
