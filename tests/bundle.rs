//! Replay bundles (`compile --emit bundle`): their contents against an independent codegen run
//! and an independent interpreter run, and every kind of malformed bundle refused with a typed
//! error. Code objects are checked where hiprtc is here (`ROCMFORGE_REQUIRE_HIPRTC=1` makes its
//! absence a failure); replaying on a GPU is a trial in tests/gpu/.

#[path = "common/files.rs"]
mod files;
#[path = "common/host_kernels.rs"]
mod host_kernels;
#[path = "common/op_zoo.rs"]
mod op_zoo;
#[path = "bundle/states.rs"]
mod states;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use rocmforge::arch::Target;
use rocmforge::codegen::{self, BufferRole, CodegenOptions};
use rocmforge::compile::bundle::format::{Access, BundlePlan, Role};
use rocmforge::compile::bundle::{self, Bundle, BundleError, EmitOptions, ReplayOptions};
use rocmforge::interp::{self, Bindings};
use rocmforge::ir::{
    format, random_input, random_quant, random_weight, BinaryOp, DType, FileError, Graph, ReduceOp,
    Sample, Tensor, TensorType, UnaryOp,
};
use rocmforge::passes::PassManager;
use rocmforge::runtime::{parse_code_object, Device, Hiprtc};

/// A fresh, absent directory for one bundle.
fn scratch(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "rocmforge-bundle-{}-{name}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn hiprtc_here() -> bool {
    let here = Hiprtc::load().is_ok();
    if !here && std::env::var("ROCMFORGE_REQUIRE_HIPRTC").is_ok_and(|v| v == "1") {
        panic!("ROCMFORGE_REQUIRE_HIPRTC=1 but hiprtc cannot be loaded");
    }
    here
}

fn read_plan(dir: &Path) -> BundlePlan {
    serde_json::from_str(&std::fs::read_to_string(dir.join("plan.json")).unwrap()).unwrap()
}

/// `graph` made an output of each node named in `names` (its own outputs first).
fn with_outputs(graph: &Graph, names: &[&str]) -> Graph {
    let mut g = graph.clone();
    for n in names {
        g.add_output(g.find(n).unwrap()).unwrap();
    }
    g
}

#[test]
fn example_graphs_bundle_the_plan_the_data_and_every_interpreter_value() {
    let rtc = hiprtc_here();
    let target = Target::parse("gfx90a").unwrap();
    for path in files::graph_files() {
        let source = format::load(&path).unwrap();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let dir = scratch(&name);
        let seed = 11;
        let options = EmitOptions {
            seed,
            ..EmitOptions::default()
        };
        let emitted = bundle::emit(&source, &target, &dir, &options).unwrap();
        let plan = read_plan(&dir);
        assert_eq!(
            plan, emitted.plan,
            "{name}: plan.json is what emit returned"
        );
        assert_eq!(plan.format, "rocmforge-bundle/2");
        assert_eq!(
            (plan.target.arch.as_str(), plan.target.wave_size),
            ("gfx90a", 64)
        );

        // Independently: the same passes and codegen.
        let mut fused = source.clone();
        PassManager::default_pipeline().run(&mut fused).unwrap();
        let reference =
            codegen::generate_with(&fused, &target, &CodegenOptions::default()).unwrap();
        assert_eq!(plan.kernels.len(), reference.kernels.len(), "{name}");
        for (k, r) in plan.kernels.iter().zip(&reference.kernels) {
            assert_eq!(k.entry, r.entry);
            assert_eq!(
                (k.grid, k.block, k.shared_bytes),
                (r.launch.grid, r.launch.block, r.launch.shared_bytes)
            );
            let ids: Vec<usize> = k.args.iter().map(|a| a.buffer).collect();
            assert_eq!(ids, r.args, "{name}: {}", k.entry);
            // The written buffer is last, and declared without const.
            assert_eq!(k.args.last().unwrap().access, Access::Write);
            let text = std::fs::read_to_string(dir.join(&k.source)).unwrap();
            assert_eq!(
                text,
                reference.source(r),
                "{name}: full source with prelude"
            );
            match &k.code_object {
                Some(co) => {
                    assert!(rtc, "{name}: a code object without hiprtc");
                    let info = parse_code_object(&std::fs::read(dir.join(co)).unwrap()).unwrap();
                    assert!(
                        info.kernels.iter().any(|r| r.name == k.entry),
                        "{name}: {co} lacks {}",
                        k.entry
                    );
                }
                None => assert!(!rtc && plan.compiler.missing.is_some(), "{name}"),
            }
        }

        // Independently: seeded inputs as `run` draws them, weights (dense and quantized) as
        // the interpreter draws them itself, states' starting values drawn here as inputs are,
        // and one interpreter run of the fused graph with every computed node made an output.
        let bindings = Bindings::random(&source, seed);
        let states = start_states(&fused, seed);
        assert_eq!(plan.buffers.len(), reference.buffers.len());
        let computed: Vec<&str> = reference
            .buffers
            .iter()
            .filter(|b| b.role == BufferRole::Computed)
            .map(|b| b.name.as_str())
            .collect();
        let run = with_outputs(&fused, &computed);
        let (values, next) =
            interp::run_with_state_data(&run, &bindings, &HashMap::new(), &HashMap::new(), &states)
                .unwrap();
        let first = fused.outputs().len();
        let value: HashMap<&str, &Tensor> =
            computed.iter().copied().zip(&values[first..]).collect();
        for (b, r) in plan.buffers.iter().zip(&reference.buffers) {
            assert_eq!((b.id, &b.name), (r.id, &r.name));
            assert_eq!(TensorType::new(b.dtype, b.shape.clone()), r.ty);
            let file =
                |rel: &Option<String>| std::fs::read(dir.join(rel.as_ref().unwrap())).unwrap();
            match &r.role {
                BufferRole::Input(_) => {
                    assert_eq!(b.role, Role::Input);
                    assert_eq!(file(&b.data), bindings.inputs[&r.name].to_bytes(), "{name}");
                }
                BufferRole::Weight(init) => {
                    assert_eq!(b.role, Role::Weight);
                    let w = random_weight(&r.name, &r.ty, init, seed).unwrap();
                    assert_eq!(file(&b.data), w.to_bytes());
                }
                BufferRole::Constant(v) => {
                    assert_eq!(b.role, Role::Constant);
                    assert_eq!(
                        file(&b.data),
                        Tensor::constant(&r.ty, v).unwrap().to_bytes()
                    );
                }
                BufferRole::Computed => {
                    let is_output = reference.outputs.iter().any(|o| o.buffer == r.id);
                    assert_eq!(
                        b.role,
                        if is_output {
                            Role::Output
                        } else {
                            Role::Computed
                        }
                    );
                    assert_eq!(
                        file(&b.expected),
                        value[r.name.as_str()].to_bytes(),
                        "{name}: buffer {} ({})",
                        b.id,
                        b.name
                    );
                }
                BufferRole::Status => assert_eq!(b.role, Role::Status),
                BufferRole::State { name: state } => {
                    assert_eq!(b.role, Role::State);
                    assert_eq!(file(&b.data), states[state].to_bytes(), "{name}: {state}");
                    assert_eq!(file(&b.expected), next[state].to_bytes(), "{name}: {state}");
                }
                BufferRole::QuantWeight(scheme) => {
                    assert_eq!((b.role, b.quant), (Role::Quantized, Some(*scheme)));
                    let q = random_quant(&r.name, *scheme, &r.ty.shape, seed).unwrap();
                    assert_eq!(file(&b.data), q.bytes(), "{name}: {}", r.name);
                    assert_eq!(b.bytes, q.bytes().len() as u64);
                    assert_eq!(b.expected, None);
                }
                BufferRole::Workspace => {
                    assert_eq!(b.role, Role::Workspace);
                    assert_eq!((&b.data, &b.expected), (&None, &None), "{name}");
                }
            }
        }

        // The outputs, seen through their views, are what the unfused graph computes, within
        // the dtype's tolerance (fused against unfused).
        let (unfused, _) = interp::run_with_state_data(
            &source,
            &bindings,
            &HashMap::new(),
            &HashMap::new(),
            &states,
        )
        .unwrap();
        for (o, want) in plan.outputs.iter().zip(&unfused) {
            let bytes = std::fs::read(dir.join(format!("expected/{}.bin", o.buffer))).unwrap();
            let got =
                Tensor::from_bytes(&TensorType::new(o.dtype, o.shape.clone()), &bytes).unwrap();
            assert_eq!(got.ty(), want.ty(), "{name}: output {}", o.name);
            let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
            let num: f64 = g.iter().zip(&w).map(|(a, b)| (a - b).powi(2)).sum();
            let den: f64 = w.iter().map(|b| b * b).sum();
            let err = (num / den.max(1e-300)).sqrt();
            assert!(
                err <= 4.0 * o.dtype.tolerance().max(1e-6),
                "{name}: output {} off by {err}",
                o.name
            );
        }

        // Identical kernels share an entry and its files.
        let unique: std::collections::HashSet<&str> =
            plan.kernels.iter().map(|k| k.entry.as_str()).collect();
        let files = std::fs::read_dir(dir.join("kernels")).unwrap().count();
        assert_eq!(files, unique.len() * if rtc { 2 } else { 1 }, "{name}");

        let opened = Bundle::open(&dir, u64::MAX).unwrap();
        let report = opened.check().unwrap();
        assert_eq!(report.kernels, plan.kernels.len());
        assert_eq!(
            report.expected_files,
            computed.len() + states.len(),
            "{name}: every computed buffer and every state"
        );
        assert_eq!(report.code_objects, if rtc { unique.len() } else { 0 });
        let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
        for part in [
            "plan.json",
            "expected/<id>.bin",
            "| f16 | 2e-3 |",
            "kernelParams",
        ] {
            assert!(readme.contains(part), "{name}: README lacks {part}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// Each state of `graph` at the start of the bundled run, drawn as an input of its type is.
fn start_states(graph: &Graph, seed: u64) -> HashMap<String, Tensor> {
    graph
        .node_ids()
        .filter(|&id| matches!(graph.op(id), rocmforge::ir::Op::State { .. }))
        .map(|id| {
            let n = graph.node(id);
            let t = random_input(&n.name, &n.ty, &Sample::Normal, seed).unwrap();
            (n.name.clone(), t)
        })
        .collect()
}

/// A small bundle to break in one way per test.
fn small_bundle(name: &str) -> PathBuf {
    let source = format::load(Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/graphs/llama_block.json"
    )))
    .unwrap();
    let dir = scratch(name);
    bundle::emit(
        &source,
        &Target::parse("gfx90a").unwrap(),
        &dir,
        &EmitOptions::default(),
    )
    .unwrap();
    Bundle::open(&dir, u64::MAX).unwrap().check().unwrap();
    dir
}

fn edit_plan(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("plan.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, serde_json::to_string(&v).unwrap()).unwrap();
}

fn open_and_check(dir: &Path) -> Result<(), BundleError> {
    Bundle::open(dir, u64::MAX)?.check().map(|_| ())
}

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

/// Pointwise kernels only (the host can run them one thread at a time), odd sizes, three dtypes
/// and a gather with its index check.
fn pointwise_graph() -> Graph {
    let mut g = Graph::new("pointwise");
    let x = g.input("x", DType::F32, &[3, 17]).unwrap();
    let y = g.input("y", DType::F16, &[17]).unwrap();
    let e = g.unary(UnaryOp::Exp, x).unwrap();
    let yf = g.cast(y, DType::F32).unwrap();
    let a = g.binary(BinaryOp::Add, e, yf).unwrap();
    let p = g.permute(a, &[1, 0]).unwrap();
    let r = g.reduce(ReduceOp::Sum, p, &[1], false).unwrap();
    let table = g.weight("table", DType::F16, &[11, 7]).unwrap();
    let idx = g
        .input_sampled(
            "idx",
            DType::I32,
            &[2, 3],
            Sample::Range { low: 0, high: 11 },
        )
        .unwrap();
    let rows = g.gather(table, idx).unwrap();
    for o in [p, r, rows] {
        g.add_output(o).unwrap();
    }
    g
}

/// ‖got − want‖ / ‖want‖ over elements finite in both (absolute when want is zero); `None`
/// when NaN or ±inf differ in place: the bundle's compare rule, written from its README.
fn rule_error(got: &[f64], want: &[f64]) -> Option<f64> {
    let (mut num, mut den) = (0.0, 0.0);
    for (g, w) in got.iter().zip(want) {
        if g.is_finite() && w.is_finite() {
            num += (g - w) * (g - w);
            den += w * w;
        } else if !(g.is_nan() && w.is_nan() || g == w) {
            return None;
        }
    }
    Some(if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    })
}

/// A bundle replayed by hand from its files alone, as its README says, each kernel's source
/// compiled for the host (standing in for a simulator): every computed buffer must match
/// `expected/` under the bundle's own compare rule.
#[test]
fn a_bundle_replays_by_hand_from_its_files_alone() {
    let cxx = match host_kernels::host_cxx() {
        Ok(c) => c,
        Err(why) if std::env::var("ROCMFORGE_REQUIRE_HOST_CXX").is_ok_and(|v| v == "1") => {
            panic!("{why}")
        }
        Err(why) => return eprintln!("not run: {why}"),
    };
    let dir = scratch("by-hand");
    let options = EmitOptions {
        seed: 9,
        ..EmitOptions::default()
    };
    bundle::emit(
        &pointwise_graph(),
        &Target::parse("gfx90a").unwrap(),
        &dir,
        &options,
    )
    .unwrap();
    let opened = Bundle::open(&dir, u64::MAX).unwrap();
    opened.check().unwrap();
    let plan = opened.plan();
    let mut bufs: Vec<Vec<u8>> = plan
        .buffers
        .iter()
        .map(|b| match b.role {
            Role::Input | Role::Weight | Role::Constant | Role::State | Role::Quantized => {
                std::fs::read(dir.join(b.data.as_ref().unwrap())).unwrap()
            }
            Role::Status => vec![0; b.bytes as usize],
            Role::Computed | Role::Output | Role::Workspace => vec![0xFF; b.bytes as usize],
        })
        .collect();
    for k in &plan.kernels {
        let source = std::fs::read_to_string(dir.join(&k.source)).unwrap();
        let args: Vec<usize> = k.args.iter().map(|a| a.buffer).collect();
        let launch = host_kernels::HostLaunch {
            entry: &k.entry,
            grid: k.grid,
            block: k.block,
            args: &args,
            cooperative: host_kernels::COOPERATIVE.contains(&k.family.as_str()),
        };
        host_kernels::run_source(&cxx, &source, launch, &mut bufs).unwrap();
    }
    assert!(!plan.checks.is_empty());
    for c in &plan.checks {
        assert_eq!(&bufs[c.status][..8], &[0; 8], "index check of {}", c.node);
    }
    let mut compared = 0;
    for b in plan.buffers.iter().filter(|b| b.role.is_computed()) {
        let ty = TensorType::new(b.dtype, b.shape.clone());
        let want = std::fs::read(dir.join(b.expected.as_ref().unwrap())).unwrap();
        let got = Tensor::from_bytes(&ty, &bufs[b.id]).unwrap().to_f64_vec();
        let want = Tensor::from_bytes(&ty, &want).unwrap().to_f64_vec();
        let err = rule_error(&got, &want).unwrap_or(f64::INFINITY);
        let tol = plan.compare.tolerances[&b.dtype];
        assert!(
            err <= tol,
            "buffer {} ({}): error {err:e} > {tol:e}",
            b.id,
            b.name
        );
        compared += 1;
    }
    assert!(compared >= 4, "{compared} computed buffers");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_emit_that_fails_leaves_no_half_written_bundle() {
    // Indices drawn past the table: the interpreter refuses them, naming the gather.
    let mut g = Graph::new("bad_indices");
    let table = g.weight("table", DType::F32, &[4, 3]).unwrap();
    let idx = g
        .input_sampled("idx", DType::I32, &[9], Sample::Range { low: 0, high: 40 })
        .unwrap();
    let rows = g.gather(table, idx).unwrap();
    g.add_output(rows).unwrap();
    let dir = scratch("failed");
    match bundle::emit(
        &g,
        &Target::parse("gfx90a").unwrap(),
        &dir,
        &EmitOptions::default(),
    ) {
        Err(BundleError::Compile(e)) => {
            assert!(e.to_string().contains("outside a table of 4 rows"), "{e}")
        }
        other => panic!("{:?}", other.map(|e| e.bytes)),
    }
    assert!(!dir.exists(), "the new directory is removed again");
    std::fs::create_dir_all(&dir).unwrap();
    assert!(bundle::emit(
        &g,
        &Target::parse("gfx90a").unwrap(),
        &dir,
        &EmitOptions::default()
    )
    .is_err());
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "an empty directory stays empty"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Every file name from ids and entries, every name in plan.json as data: hostile names come
/// back byte for byte from plan.json and appear nowhere raw in the README or the file tree,
/// and the kernels are the plain graph's.
#[test]
fn hostile_names_are_data_only() {
    let target = Target::parse("gfx90a").unwrap();
    for g in op_zoo::zoo().into_iter().take(3) {
        let h = op_zoo::with_hostile_names(&g);
        let (plain_dir, dir) = (scratch("plain"), scratch("hostile"));
        let plain = bundle::emit(&g, &target, &plain_dir, &EmitOptions::default()).unwrap();
        let hostile = bundle::emit(&h, &target, &dir, &EmitOptions::default()).unwrap();
        let entries = |p: &BundlePlan| {
            p.kernels
                .iter()
                .map(|k| k.entry.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(entries(&plain.plan), entries(&hostile.plan), "{}", g.name);
        let plan = read_plan(&dir);
        assert_eq!(plan.graph, h.name);
        for b in &plan.buffers {
            assert!(h.find(&b.name).is_some(), "{:?} is a node's name", b.name);
        }
        let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
        for name in op_zoo::HOSTILE_NAMES {
            assert!(!readme.contains(name), "README holds {name:?}");
        }
        for sub in ["kernels", "buffers", "expected"] {
            for e in std::fs::read_dir(dir.join(sub)).unwrap() {
                let f = e.unwrap().file_name().into_string().unwrap();
                assert!(
                    f.bytes()
                        .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'.'),
                    "{sub}/{f}"
                );
            }
        }
        Bundle::open(&dir, u64::MAX).unwrap().check().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_dir_all(&plain_dir).unwrap();
    }
}
