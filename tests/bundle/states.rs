//! Bundles of graphs with persistent states (a KV cache) and quantized weights: emitted,
//! checked, and every expected file equal to an interpreter run from the bundle's own data
//! files; malformed state and quantized entries refused with typed errors. A module of
//! tests/bundle.rs, whose helpers it uses.

use std::collections::HashMap;
use std::path::Path;

use rocmforge::arch::Target;
use rocmforge::compile::bundle::format::{BundleBuffer, BundlePlan, Role};
use rocmforge::compile::bundle::{self, Bundle, BundleError, EmitOptions};
use rocmforge::interp::{self, Bindings};
use rocmforge::ir::{format, Graph, QuantTensor, Shape, Tensor, TensorType};
use rocmforge::passes::PassManager;

use super::{edit_plan, open_and_check, read_plan, scratch};

#[path = "../common/decode_step.rs"]
mod decode_step;

/// The interpreter's values from a bundle's own files: inputs, weights, quantized blocks and
/// states' starting values read back from `buffers/`, the optimised graph run once with every
/// buffer's node an output. By buffer id: computed buffers' values and states' next values.
fn interpret_files(fused: &Graph, dir: &Path, plan: &BundlePlan) -> HashMap<usize, Vec<u8>> {
    let read = |b: &BundleBuffer| std::fs::read(dir.join(b.data.as_ref().unwrap())).unwrap();
    let ty = |b: &BundleBuffer| TensorType::new(b.dtype, b.shape.clone());
    let (mut bindings, mut weights, mut quantized, mut states) = (
        Bindings::default(),
        HashMap::new(),
        HashMap::new(),
        HashMap::new(),
    );
    let mut g = fused.clone();
    let first = g.outputs().len();
    let mut wanted = Vec::new();
    for b in &plan.buffers {
        match b.role {
            Role::Input => {
                let t = Tensor::from_bytes(&ty(b), &read(b)).unwrap();
                bindings.inputs.insert(b.name.clone(), t);
            }
            Role::Weight => {
                weights.insert(
                    b.name.clone(),
                    Tensor::from_bytes(&ty(b), &read(b)).unwrap(),
                );
            }
            Role::Quantized => {
                let q = QuantTensor::new(b.quant.unwrap(), Shape::new(b.shape.clone()), read(b))
                    .unwrap();
                quantized.insert(b.name.clone(), q);
            }
            Role::State => {
                states.insert(
                    b.name.clone(),
                    Tensor::from_bytes(&ty(b), &read(b)).unwrap(),
                );
            }
            Role::Computed | Role::Output if b.expected.is_some() => {
                let id = g.find(&b.name).unwrap();
                g.add_output(id).unwrap();
                wanted.push(b.id);
            }
            Role::Computed
            | Role::Output
            | Role::Constant
            | Role::Status
            | Role::Workspace
            | Role::Counters => {}
        }
    }
    let (values, next) =
        interp::run_with_state_data(&g, &bindings, &weights, &quantized, &states).unwrap();
    let mut out: HashMap<usize, Vec<u8>> = wanted
        .into_iter()
        .zip(values[first..].iter().map(Tensor::to_bytes))
        .collect();
    for b in plan.buffers.iter().filter(|b| b.role == Role::State) {
        out.insert(b.id, next[&b.name].to_bytes());
    }
    out
}

/// A graph with a KV cache (the decode step of tests/common/decode_step.rs) and graphs with
/// quantized weights round-trip: emitted for an AMD and an NVIDIA target, opened and checked,
/// every data file where the table says, and every expected file (computed buffers, and each
/// state after the run) what the interpreter computes from the bundle's own data files.
#[test]
fn bundles_with_states_and_quantized_weights_round_trip() {
    let load = |name: &str| {
        format::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("graphs/{name}.json")))
            .unwrap()
    };
    let graphs = [
        ("decode_step_small", decode_step::SMALL.decode_step()),
        ("quant_linear", load("quant_linear")),
        ("quant_prefill_f16", load("quant_prefill_f16")),
    ];
    for (name, source) in graphs {
        for arch in ["gfx90a", "sm_90"] {
            let target = Target::parse(arch).unwrap();
            let dir = scratch(&format!("{name}-{arch}"));
            let options = EmitOptions {
                seed: 5,
                ..EmitOptions::default()
            };
            let emitted = bundle::emit(&source, &target, &dir, &options).unwrap();
            let plan = read_plan(&dir);
            assert_eq!(plan, emitted.plan, "{name}");
            let roles = |r: Role| plan.buffers.iter().filter(|b| b.role == r).count();
            if name.starts_with("decode") {
                assert!(roles(Role::State) >= 2, "{name}: the K and V caches");
                // The cache write changes the state: its expected value is not its start.
                for b in plan.buffers.iter().filter(|b| b.role == Role::State) {
                    let start = std::fs::read(dir.join(b.data.as_ref().unwrap())).unwrap();
                    let end = std::fs::read(dir.join(b.expected.as_ref().unwrap())).unwrap();
                    assert_ne!(start, end, "{name}: state {}", b.name);
                }
            } else {
                assert!(roles(Role::Quantized) >= 1, "{name}");
            }
            let report = Bundle::open(&dir, u64::MAX).unwrap().check().unwrap();
            assert_eq!(report.kernels, plan.kernels.len());

            let mut fused = source.clone();
            PassManager::default_pipeline().run(&mut fused).unwrap();
            let want = interpret_files(&fused, &dir, &plan);
            let with_expected = plan.buffers.iter().filter(|b| b.expected.is_some());
            assert_eq!(with_expected.clone().count(), want.len(), "{name}");
            for b in with_expected {
                let got = std::fs::read(dir.join(b.expected.as_ref().unwrap())).unwrap();
                assert_eq!(
                    got, want[&b.id],
                    "{name} {arch}: buffer {} ({})",
                    b.id, b.name
                );
            }
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}

/// The new parts of the buffer table are checked like the rest: a quantized buffer names its
/// scheme and has the scheme's size, no other buffer names one, a state has its expected
/// file, and a version-1 plan holds neither.
#[test]
fn malformed_states_and_quantized_buffers_are_typed_errors() {
    let quant = scratch("quant-malformed");
    bundle::emit(
        &format::load(Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/graphs/quant_linear.json"
        )))
        .unwrap(),
        &Target::parse("gfx90a").unwrap(),
        &quant,
        &EmitOptions::default(),
    )
    .unwrap();
    let state = scratch("state-malformed");
    bundle::emit(
        &decode_step::SMALL.decode_step(),
        &Target::parse("gfx90a").unwrap(),
        &state,
        &EmitOptions::default(),
    )
    .unwrap();
    let plan_text = |dir: &Path| std::fs::read(dir.join("plan.json")).unwrap();
    let (good_quant, good_state) = (plan_text(&quant), plan_text(&state));
    let index = |dir: &Path, role: Role| {
        read_plan(dir)
            .buffers
            .iter()
            .position(|b| b.role == role)
            .unwrap()
    };
    let (q, w, st) = (
        index(&quant, Role::Quantized),
        index(&quant, Role::Input),
        index(&state, Role::State),
    );
    let malformed = |dir: &Path, what: &str, edit: &dyn Fn(&mut serde_json::Value)| {
        edit_plan(dir, edit);
        match open_and_check(dir) {
            Err(BundleError::Malformed { reason }) => reason,
            other => panic!("{what}: {other:?}"),
        }
    };
    let reason = malformed(&quant, "no scheme", &|v| {
        v["buffers"][q].as_object_mut().unwrap().remove("quant");
    });
    assert!(reason.contains("quant"), "{reason}");
    std::fs::write(quant.join("plan.json"), &good_quant).unwrap();
    let reason = malformed(&quant, "a scheme on an input", &|v| {
        v["buffers"][w]["quant"] = "q8_0".into();
    });
    assert!(reason.contains("q8_0"), "{reason}");
    std::fs::write(quant.join("plan.json"), &good_quant).unwrap();
    let reason = malformed(&quant, "blocks of another size", &|v| {
        let bytes = v["buffers"][q]["bytes"].as_u64().unwrap();
        v["buffers"][q]["bytes"] = (bytes + 34).into();
    });
    assert!(reason.contains("bytes"), "{reason}");
    std::fs::write(quant.join("plan.json"), &good_quant).unwrap();
    let reason = malformed(&quant, "version 1 with quantized blocks", &|v| {
        v["format"] = "rocmforge-bundle/1".into();
    });
    assert!(reason.contains("rocmforge-bundle/1"), "{reason}");
    std::fs::write(quant.join("plan.json"), &good_quant).unwrap();
    open_and_check(&quant).unwrap();

    let reason = malformed(&state, "a state without its final value", &|v| {
        v["buffers"][st]["expected"] = serde_json::Value::Null;
    });
    assert!(reason.contains("after the run"), "{reason}");
    std::fs::write(state.join("plan.json"), &good_state).unwrap();
    // The state's file truncated: a size error, as for any data file.
    let data = state.join(format!("buffers/{st}.bin"));
    let bytes = std::fs::read(&data).unwrap();
    std::fs::write(&data, &bytes[..bytes.len() - 1]).unwrap();
    assert!(matches!(
        open_and_check(&state),
        Err(BundleError::Size { found, expected, .. }) if found + 1 == expected
    ));
    std::fs::write(&data, &bytes).unwrap();
    open_and_check(&state).unwrap();
    std::fs::remove_dir_all(&quant).unwrap();
    std::fs::remove_dir_all(&state).unwrap();
}
