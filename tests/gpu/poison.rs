//! GPU trials of re-poisoning (issue 21): an element a kernel fails to write must read as NaN
//! even when its slot was written by an earlier kernel of the same run, in every run, replayed
//! or not. The graph is `b = |-|x||` with one kernel per op (`fuse: false`): `b`'s kernel writes
//! into the slot `a = |x|` held, and `a` holds exactly `b`'s value, so a planted bug that leaves
//! `b`'s last element unwritten passes silently unless the slot is poisoned again before `b`'s
//! kernel. Included by `tests/gpu.rs`, whose helpers they use.

use std::sync::Arc;

use libtest_mimic::Failed;
use rocmforge::compile::{CompileOptions, Executable, KernelRewrite, Poison, SessionOptions};
use rocmforge::interp::{run, Bindings};
use rocmforge::ir::{DType, Graph, Tensor, UnaryOp};
use rocmforge::runtime::Device;

use crate::harness::{compare, options, push, tolerance, DeviceTrial, MEMORY};
use libtest_mimic::Trial;

const N: usize = 1000;

/// The graph and the name of the node whose kernel gets the planted bug.
fn graph() -> (Graph, String) {
    let mut g = Graph::new("reused_slot");
    let x = g.input("x", DType::F32, &[N]).unwrap();
    let a = g.unary(UnaryOp::Abs, x).unwrap();
    let n = g.unary(UnaryOp::Neg, a).unwrap();
    let b = g.unary(UnaryOp::Abs, n).unwrap();
    g.add_output(b).unwrap();
    let name = g.node(b).name.clone();
    (g, name)
}

/// Compiled unfused with `poison`, `b`'s kernel stopping one element early; checks that the
/// plan is the one the trial needs (three kernels, `b`'s output in `a`'s slot).
fn compile(device: &Device, poison: Poison) -> Result<(Graph, Executable), Failed> {
    let (g, planted) = graph();
    let bound = format!("if (i >= {N}LL) return;");
    let short = format!("if (i >= {}LL) return;", N - 1);
    let rewrite: KernelRewrite = Arc::new(move |k| {
        if k.node == planted {
            k.body = k.body.replace(&bound, &short);
        }
    });
    let exe = Graph::compile_with(
        &g,
        device,
        &CompileOptions {
            fuse: false,
            poison,
            rewrite_kernels: Some(rewrite),
            ..options()
        },
    )
    .map_err(|e| e.to_string())?;
    let (plan, memory) = exe
        .plan()
        .zip(exe.memory())
        .ok_or("no kernel plan on a GPU")?;
    if plan.kernels.len() != 3 {
        return Err(format!("{} kernels, not one per op", plan.kernels.len()).into());
    }
    let out = |i: usize| plan.kernels[i].args.last().copied().unwrap_or(usize::MAX);
    if memory.slot_of.get(&out(2)) != memory.slot_of.get(&out(0)) {
        return Err("b's output does not reuse a's slot: the trial tests nothing".into());
    }
    if !plan.kernels[2].body.contains(&format!("{}LL", N - 1)) {
        return Err("the planted bug did not land in b's kernel".into());
    }
    Ok((g, exe))
}

/// Inputs drawn from a normal distribution (both signs), so `|x|`, `x` and `-|x|` differ.
fn inputs(g: &Graph, seed: u64) -> Bindings {
    Bindings::random(g, seed)
}

/// The last element is NaN, every other one equals `|x|`, and the comparison fails.
fn caught(out: &Tensor, want: &Tensor, what: &str) -> Result<(), Failed> {
    let (v, w) = (out.to_f64_vec(), want.to_f64_vec());
    if !v[N - 1].is_nan() {
        return Err(format!("{what}: the unwritten element reads {}, not NaN", v[N - 1]).into());
    }
    if let Some(i) = (0..N - 1).find(|&i| v[i] != w[i]) {
        return Err(format!("{what}: element {i} is {}, not {}", v[i], w[i]).into());
    }
    if compare(out, want, tolerance(DType::F32), what).is_ok() {
        return Err(format!("{what}: the comparison accepted an unwritten element").into());
    }
    Ok(())
}

/// With re-poisoning, one run (`Executable::run`, no replay) and several runs of one session
/// with replay on (the poisoning launches are part of the captured graph) all show the
/// unwritten element as NaN.
fn reused_slot_is_caught(device: &Device) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let (g, exe) = compile(device, Poison::On)?;
    let b = inputs(&g, 1);
    let want = run(&g, &b).map_err(|e| e.to_string())?.remove(0);
    let out = exe.run(&b).map_err(|e| e.to_string())?.remove(0);
    caught(&out, &want, "run")?;
    let mut s = exe
        .session_with(&SessionOptions { replay: true })
        .map_err(|e| e.to_string())?;
    for step in 0..3u64 {
        let b = inputs(&g, 10 + step);
        let want = run(&g, &b).map_err(|e| e.to_string())?.remove(0);
        s.set_input("x", &b.inputs["x"])
            .map_err(|e| e.to_string())?;
        s.run().map_err(|e| e.to_string())?;
        let out = s.outputs().map_err(|e| e.to_string())?.remove(0);
        caught(&out, &want, &format!("session run {step}"))?;
    }
    if s.replay_off().is_none() && s.captures() != 1 {
        return Err(format!("{} captures, not one", s.captures()).into());
    }
    Ok(())
}

/// The control: without poisoning (the same as poisoning fresh buffers only, since `a`'s
/// kernel writes the whole slot before `b`'s runs) the planted bug passes unnoticed, the
/// output equal to the interpreter's bit for bit. If this fails, the trial above proves
/// nothing about re-poisoning.
fn reused_slot_hides_it_without_poison(device: &Device) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let (g, exe) = compile(device, Poison::Off)?;
    let b = inputs(&g, 1);
    let want = run(&g, &b).map_err(|e| e.to_string())?.remove(0);
    let out = exe.run(&b).map_err(|e| e.to_string())?.remove(0);
    if out.to_bytes() != want.to_bytes() {
        return Err(
            "without poison the planted bug should pass unseen, yet the output differs".into(),
        );
    }
    let (_, v) = exe.verify(&b).map_err(|e| e.to_string())?;
    if v.max_error() != 0.0 {
        return Err(format!("verify found error {} without poison", v.max_error()).into());
    }
    Ok(())
}

/// `poison::reused_slot_is_caught` and its control.
pub fn trials(device: &Device, ignored: &Option<String>, out: &mut Vec<Trial>) {
    let cases: [(&str, DeviceTrial); 2] = [
        ("poison::reused_slot_is_caught", reused_slot_is_caught),
        (
            "poison::reused_slot_hides_it_without_poison",
            reused_slot_hides_it_without_poison,
        ),
    ];
    for (name, f) in cases {
        let d = device.clone();
        push(out, ignored, name.into(), Box::new(move || f(&d)));
    }
}
