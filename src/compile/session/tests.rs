//! Sessions on the CPU: the interpreter behind the session API, typed errors, shared states.

use std::sync::Arc;

use super::*;
use crate::codegen::KernelPlan;
use crate::compile::CompileOptions;
use crate::interp::{self, Bindings};
use crate::ir::{DType, Graph, Shape};
use crate::runtime::Device;

/// Rows of a weight table gathered by an i32 index input, plus an input the passes drop.
fn gather_graph() -> Graph {
    let mut g = Graph::new("session_gather");
    let table = g.weight("table", DType::F32, &[9, 4]).unwrap();
    let ids = g.input("ids", DType::I32, &[3]).unwrap();
    let x = g.input("x", DType::F32, &[3, 4]).unwrap();
    g.input("unused", DType::F32, &[2]).unwrap();
    let rows = g.gather(table, ids).unwrap();
    let sum = g.add(rows, x).unwrap();
    g.add_output(sum).unwrap();
    g
}

fn ids(v: &[i64]) -> Tensor {
    Tensor::from_i64(DType::I32, Shape::new(vec![v.len()]), v.to_vec()).unwrap()
}

fn compiled() -> Executable {
    Graph::compile_with(gather_graph(), &Device::cpu(), &CompileOptions::default()).unwrap()
}

#[test]
fn a_cpu_session_runs_each_step_as_the_interpreter_does() {
    let g = gather_graph();
    let exe = compiled();
    let mut s = exe.session().unwrap();
    assert_eq!(s.replay_off(), Some(&ReplayOff::Cpu));
    assert!(matches!(s.outputs(), Err(CompileError::NotRun)));
    let base = Bindings::random(&g, 7);
    for name in ["x", "unused"] {
        s.set_input(name, &base.inputs[name]).unwrap();
    }
    for step in 0..5i64 {
        let v = [step % 9, (step * 4 + 1) % 9, 8 - step];
        s.set_input("ids", &ids(&v)).unwrap();
        s.run().unwrap();
        let b = base.clone().with_input("ids", ids(&v));
        let want = interp::run_with_weights(&g, &b, &exe.weights).unwrap();
        assert_eq!(s.outputs().unwrap(), want, "step {step}");
        let name = &exe.output_names()[0];
        assert_eq!(s.output(name).unwrap(), want[0]);
        let mut host = vec![0u8; 3 * 4 * 4];
        s.output_to_host(name, &mut host).unwrap();
        assert_eq!(host, want[0].to_bytes());
    }
    // An index out of range is the interpreter's error, at the run.
    s.set_input("ids", &ids(&[0, 9, 1])).unwrap();
    assert!(matches!(
        s.run(),
        Err(CompileError::Interp(InterpError::IndexOutOfRange {
            index: 9,
            ..
        }))
    ));
}

#[test]
fn session_errors_are_typed() {
    let exe = compiled();
    let mut s = exe.session().unwrap();
    let f32s = |dims: &[usize]| {
        Tensor::from_f64(DType::F32, dims.to_vec(), &vec![0.5; dims.iter().product()]).unwrap()
    };
    assert!(matches!(
        s.set_input("nope", &f32s(&[3, 4])),
        Err(CompileError::Interp(InterpError::UnknownBinding { name })) if name == "nope"
    ));
    assert!(matches!(
        s.set_input("table", &f32s(&[9, 4])),
        Err(CompileError::WeightAtRun { name }) if name == "table"
    ));
    // Wrong shape, then wrong dtype.
    assert!(matches!(
        s.set_input("x", &f32s(&[4, 3])),
        Err(CompileError::Interp(InterpError::BindingType { name, .. })) if name == "x"
    ));
    let i32s = Tensor::from_i64(DType::I32, Shape::new(vec![3, 4]), vec![0; 12]).unwrap();
    assert!(matches!(
        s.set_input("x", &i32s),
        Err(CompileError::Interp(InterpError::BindingType { name, .. })) if name == "x"
    ));
    s.set_input("x", &f32s(&[3, 4])).unwrap();
    s.set_input("ids", &ids(&[1, 2, 3])).unwrap();
    // `unused` is part of the interface even though the passes removed it.
    assert!(matches!(
        s.run(),
        Err(CompileError::Interp(InterpError::MissingInput { name, .. })) if name == "unused"
    ));
    s.set_input("unused", &f32s(&[2])).unwrap();
    s.run().unwrap();
    assert!(matches!(
        s.output("nope"),
        Err(CompileError::UnknownOutput { name }) if name == "nope"
    ));
    let name = exe.output_names()[0].clone();
    let mut short = vec![0u8; 5];
    assert!(matches!(
        s.output_to_host(&name, &mut short),
        Err(CompileError::OutputSize {
            want: 48,
            got: 5,
            ..
        })
    ));
    assert!(matches!(
        s.state("kv"),
        Err(CompileError::UnknownState { name }) if name == "kv"
    ));
    assert!(s.state_names().is_empty());
    s.reset_state().unwrap();
}

/// A cache `kv` `[1, 1, rows, 2]` with `s` rows written at `start`; outputs its next value.
fn cache_graph(s: usize, rows: usize) -> Executable {
    let mut g = Graph::new(format!("cache_s{s}"));
    let kv = g.state("kv", DType::F32, &[1, 1, rows, 2]).unwrap();
    let vals = g.input("vals", DType::F32, &[1, 1, s, 2]).unwrap();
    let start = g.input("start", DType::I32, &[1]).unwrap();
    let next = g.cache_write(kv, vals, start, 2).unwrap();
    let out = g.add(next, next).unwrap();
    g.add_output(out).unwrap();
    Graph::compile_with(g, &Device::cpu(), &CompileOptions::default()).unwrap()
}

fn f32s(dims: &[usize], v: &[f64]) -> Tensor {
    Tensor::from_f64(DType::F32, dims.to_vec(), v).unwrap()
}

/// A prefill-like executable writes two rows, a decode-like one sharing its states writes
/// the third and sees all three; each session's `state` reads the same cache; a poisoned
/// cache reads back NaN in both.
#[test]
fn sessions_sharing_states_see_each_others_writes() {
    let (wide, one) = (cache_graph(2, 5), cache_graph(1, 5));
    let mut a = wide.session().unwrap();
    let mut b = one.session_sharing(&SessionOptions::default(), &a).unwrap();
    a.set_input("vals", &f32s(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]))
        .unwrap();
    a.set_input("start", &ids(&[0])).unwrap();
    a.run().unwrap();
    b.set_input("vals", &f32s(&[1, 1, 1, 2], &[5.0, 6.0]))
        .unwrap();
    b.set_input("start", &ids(&[2])).unwrap();
    b.run().unwrap();
    let want = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 0.0, 0.0, 0.0, 0.0];
    let doubled: Vec<f64> = want.iter().map(|v| 2.0 * v).collect();
    assert_eq!(b.outputs().unwrap()[0].to_f64_vec(), doubled);
    assert_eq!(a.state("kv").unwrap().to_f64_vec(), want);
    assert_eq!(b.state("kv").unwrap().to_f64_vec(), want);
    // A session of its own does not see them.
    let c = one.session().unwrap();
    assert_eq!(c.state("kv").unwrap().to_f64_vec(), vec![0.0; 10]);
    b.poison_state().unwrap();
    assert!(a
        .state("kv")
        .unwrap()
        .to_f64_vec()
        .iter()
        .all(|v| v.is_nan()));
    a.reset_state().unwrap();
    assert_eq!(b.state("kv").unwrap().to_f64_vec(), vec![0.0; 10]);
}

#[test]
fn sharing_states_of_another_type_is_a_typed_error() {
    let (short, long) = (cache_graph(1, 5), cache_graph(1, 6));
    let a = short.session().unwrap();
    assert!(matches!(
        long.session_sharing(&SessionOptions::default(), &a),
        Err(CompileError::StateMismatch { name, found: Some(_), .. }) if name == "kv"
    ));
    // No states where the other has one.
    let plain = compiled();
    assert!(matches!(
        plain.session_sharing(&SessionOptions::default(), &a),
        Err(CompileError::StateMismatch { name, .. }) if name == "kv"
    ));
}

#[test]
fn many_sessions_of_one_executable_run_on_threads() {
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync>() {}
    send::<Session<'static>>();
    send_sync::<Executable>();
    let g = gather_graph();
    let exe = Arc::new(compiled());
    let base = Bindings::random(&g, 3);
    let threads: Vec<_> = (0..4i64)
        .map(|t| {
            let (exe, base, g) = (exe.clone(), base.clone(), g.clone());
            std::thread::spawn(move || {
                let mut s = Session::new(exe.clone()).unwrap();
                for name in ["x", "unused"] {
                    s.set_input(name, &base.inputs[name]).unwrap();
                }
                for step in 0..3 {
                    let v = [t, step, (t + step) % 9];
                    s.set_input("ids", &ids(&v)).unwrap();
                    s.run().unwrap();
                    let b = base.clone().with_input("ids", ids(&v));
                    let want = interp::run_with_weights(&g, &b, &exe.weights).unwrap();
                    assert_eq!(s.outputs().unwrap(), want);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// `|x| → -|x| → |-|x||`, one kernel per op: the last kernel's output takes the slot of the
/// first's (dead by then), and holds the same value. The graph the poison trials plant a bug in.
fn reused_slot_plan() -> (KernelPlan, crate::compile::MemoryPlan) {
    let mut g = Graph::new("reused_slot");
    let x = g.input("x", DType::F32, &[1000]).unwrap();
    let a = g.unary(crate::ir::UnaryOp::Abs, x).unwrap();
    let n = g.unary(crate::ir::UnaryOp::Neg, a).unwrap();
    let b = g.unary(crate::ir::UnaryOp::Abs, n).unwrap();
    g.add_output(b).unwrap();
    let graph = crate::compile::optimise(&g, false).unwrap();
    let plan =
        crate::compile::lower(&graph, &crate::arch::Target::parse("sm_90").unwrap()).unwrap();
    let memory = crate::compile::plan_memory(&plan);
    (plan, memory)
}

/// Every computed buffer is poisoned once, right before the first kernel that uses it; the
/// reused slot is poisoned again before the kernel that takes it over.
#[test]
fn poison_points_cover_each_computed_buffer_before_its_first_use() {
    let (plan, memory) = reused_slot_plan();
    assert_eq!(plan.kernels.len(), 3, "one kernel per op without fusion");
    let out = |i: usize| *plan.kernels[i].args.last().unwrap();
    assert_eq!(
        memory.slot_of[&out(2)],
        memory.slot_of[&out(0)],
        "the last kernel's output reuses the first's slot"
    );
    let points = super::poison::poison_points(&plan);
    assert_eq!(points, vec![vec![out(0)], vec![out(1)], vec![out(2)]]);
    // Inputs, weights and states are never poisoned; each computed buffer exactly once.
    let mut all: Vec<usize> = points.concat();
    all.sort();
    let mut computed: Vec<usize> = memory.slot_of.keys().copied().collect();
    computed.sort();
    assert_eq!(all, computed);
    // The bound check the GPU trial rewrites to plant its bug.
    assert!(plan.kernels[2].body.contains("if (i >= 1000LL) return;"));
}
