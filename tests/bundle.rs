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
        // As a bundle is made: the pipeline with concatenated weights folded, every slice a
        // copy (the bundle format binds buffers at their start).
        let fused = rocmforge::compile::optimise(&source, true).unwrap();
        let options = CodegenOptions {
            copy_slices: true,
            ..CodegenOptions::default()
        };
        let reference = codegen::generate_with(&fused, &target, &options).unwrap();
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
                BufferRole::Alias { .. } => panic!("{name}: bundles lower slices as copies"),
                BufferRole::TensorMap { .. } => {
                    panic!("{name}: bundles are lowered without the TMA GEMM")
                }
                BufferRole::Counters => {
                    assert_eq!(
                        (b.role, &b.data, &b.expected),
                        (Role::Counters, &None, &None)
                    );
                }
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

#[path = "bundle/refusals.rs"]
mod refusals;

#[path = "bundle/replay.rs"]
mod replay;
