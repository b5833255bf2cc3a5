//! GPU trials of sessions (issue 14): warm sessions against `Compiled::run` and the
//! interpreter, replay on and off bitwise equal, sessions of one executable on many threads, a
//! warm run allocating nothing, inputs changed in place every step of a loop (the device-side
//! scalars a decode loop needs) without recompiling or re-capturing, and a captured graph
//! keeping its buffers alive. Part of the `gpu` test binary (`tests/gpu/main.rs`); uses its harness.

use std::path::Path;
use std::sync::Arc;

use libtest_mimic::Failed;
use rocmforge::arch::Platform;
use rocmforge::compile::{CompileError, Executable, Session, SessionOptions};
use rocmforge::interp::{run, Bindings, InterpError};
use rocmforge::ir::{format, DType, Graph, Shape, Tensor};
use rocmforge::runtime::{Device, DeviceKind, HipLibraries, KernelCache, KernelLaunch, ReplayOff};

use crate::harness::{compare, options, push, tolerance, with_weights, DeviceTrial, MEMORY};
use libtest_mimic::Trial;

/// The example graphs the session trials run: f32 and f16.
pub const GRAPHS: [&str; 6] = [
    "bert_layer",
    "llama_block",
    "attention_causal",
    "gqa_attention",
    "attention_f16",
    "gqa_decode_f16",
];

fn load(name: &str) -> Result<Graph, Failed> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("graphs/{name}.json"));
    Ok(format::load(&path).map_err(|e| e.to_string())?)
}

fn err(e: CompileError) -> Failed {
    e.to_string().into()
}

fn bytes(ts: &[Tensor]) -> Vec<Vec<u8>> {
    ts.iter().map(Tensor::to_bytes).collect()
}

/// A device of the same GPU with its own memory counter and kernel cache (no disk store), so
/// counts are this trial's alone under the parallel harness.
/// A HIP device is reopened through the runtime library it was opened with (the test shim on
/// an NVIDIA machine, whose hiprtc is the same file: HIP's NVIDIA platform).
fn own_device(device: &Device) -> Result<Device, Failed> {
    let cache = KernelCache::with_disk(None);
    let opened = match device.kind() {
        DeviceKind::Hip => {
            let runtime = std::path::PathBuf::from(device.runtime_library().unwrap_or_default());
            let nvidia = device.target().map(|t| t.platform) == Some(Platform::Nvidia);
            let libraries = HipLibraries {
                hiprtc: nvidia.then(|| runtime.clone()),
                runtime: Some(runtime),
            };
            let ordinal = device
                .spec()
                .trim_start_matches("hip:")
                .parse()
                .unwrap_or(0);
            Device::open_hip(ordinal, &libraries, cache)
        }
        _ => Device::open_with_cache(device.spec(), cache),
    };
    Ok(opened.map_err(|e| e.to_string())?)
}

/// On CUDA a session replays; a HIP runtime may lack the graph entry points, which the
/// session must then say.
fn replay_expected(device: &Device, s: &Session<'_>) -> Result<bool, Failed> {
    match (device.kind(), s.replay_off()) {
        (_, None) => Ok(true),
        (DeviceKind::Hip, Some(ReplayOff::Unsupported { reason })) => {
            eprintln!("session: no replay on this HIP runtime: {reason}");
            Ok(false)
        }
        (_, Some(why)) => Err(format!("replay off on {}: {why}", device.label()).into()),
    }
}

/// Sets every input of `b` on `s`.
fn set_all(s: &mut Session<'_>, b: &Bindings) -> Result<(), Failed> {
    for (name, t) in &b.inputs {
        s.set_input(name, t).map_err(err)?;
    }
    Ok(())
}

/// A warm session (replay on, and another with replay off) over three steps of fresh inputs:
/// each step bitwise equal to `Compiled::run` on the same inputs and within the dtype
/// tolerance of the interpreter; replay on and off bitwise equal; one capture in all.
pub fn warm_session_matches_run(device: &Device, name: &str) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let g = load(name)?;
    let c = Graph::compile_with(&g, device, &options()).map_err(err)?;
    let mut on = c.session().map_err(err)?;
    let mut off = c
        .session_with(&SessionOptions { replay: false })
        .map_err(err)?;
    let replays = replay_expected(device, &on)?;
    if off.replay_off() != Some(&ReplayOff::Disabled) {
        return Err(format!("replay: false gives {:?}", off.replay_off()).into());
    }
    for step in 0..3u64 {
        let b = Bindings::random(&g, 100 + step);
        set_all(&mut on, &b)?;
        set_all(&mut off, &b)?;
        on.run().map_err(err)?;
        off.run().map_err(err)?;
        let (got_on, got_off) = (on.outputs().map_err(err)?, off.outputs().map_err(err)?);
        let plain = c.run(&b).map_err(err)?;
        if bytes(&got_on) != bytes(&got_off) {
            return Err(format!("{name} step {step}: replay on and off differ").into());
        }
        if bytes(&got_on) != bytes(&plain) {
            return Err(format!("{name} step {step}: the session differs from run").into());
        }
        let want = run(&g, &with_weights(&g, &b)).map_err(|e| e.to_string())?;
        for (i, (x, y)) in got_on.iter().zip(&want).enumerate() {
            let e = compare(
                x,
                y,
                tolerance(y.dtype()),
                &format!("{name} step {step} output {i}"),
            )?;
            if e > tolerance(y.dtype()) {
                return Err(format!("{name} step {step} output {i}: relative L2 {e:e}").into());
            }
        }
    }
    let want_captures = usize::from(replays);
    if (on.captures(), off.captures()) != (want_captures, 0) {
        return Err(format!(
            "{name}: {} and {} captures, want {want_captures} and 0",
            on.captures(),
            off.captures()
        )
        .into());
    }
    Ok(())
}

/// Sessions of one `Arc<Executable>` on eight threads at once, each over its own steps, every
/// output bitwise the single-threaded `Compiled::run`'s.
pub fn sessions_on_threads(device: &Device) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let g = Arc::new(load("llama_block")?);
    let exe = Arc::new(Graph::compile_with(&*g, device, &options()).map_err(err)?);
    let seeds: Vec<u64> = (0..4).collect();
    let want: Arc<Vec<Vec<Vec<u8>>>> = Arc::new(
        seeds
            .iter()
            .map(|&s| exe.run(&Bindings::random(&g, s)).map(|o| bytes(&o)))
            .collect::<Result<_, _>>()
            .map_err(err)?,
    );
    let threads: Vec<_> = (0..8usize)
        .map(|t| {
            let (exe, g, want) = (exe.clone(), g.clone(), want.clone());
            std::thread::spawn(move || -> Result<(), String> {
                let mut s = Session::new_with(exe, &SessionOptions { replay: t % 2 == 0 })
                    .map_err(|e| e.to_string())?;
                for it in 0..6 {
                    let k = (t + it) % want.len();
                    for (name, v) in &Bindings::random(&g, k as u64).inputs {
                        s.set_input(name, v).map_err(|e| e.to_string())?;
                    }
                    s.run().map_err(|e| e.to_string())?;
                    let got = s.outputs().map_err(|e| e.to_string())?;
                    if bytes(&got) != want[k] {
                        return Err(format!("thread {t} step {it}: differs from run"));
                    }
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| "a session thread panicked")??;
    }
    Ok(())
}

/// `table` rows gathered by an i32 index input `ids` (the position-like input), plus `x`.
fn gather_graph() -> Graph {
    let mut g = Graph::new("session_scalars");
    let table = g.weight("table", DType::F32, &[37, 19]).unwrap();
    let ids = g.input("ids", DType::I32, &[5]).unwrap();
    let x = g.input("x", DType::F32, &[5, 19]).unwrap();
    let rows = g.gather(table, ids).unwrap();
    let sum = g.add(rows, x).unwrap();
    g.add_output(sum).unwrap();
    g
}

fn ids(v: &[i64]) -> Tensor {
    Tensor::from_i64(DType::I32, Shape::new(vec![v.len()]), v.to_vec()).unwrap()
}

/// One warm session, 40 steps, the index input changed in place every step (and `x` every
/// fifth): each step bitwise the interpreter's, with no kernel compiled, no device allocation
/// and at most one capture in the whole loop. A step with an index out of range is the
/// interpreter's error, and the next step runs clean (status buffers are re-zeroed per run).
pub fn device_scalar_loop(device: &Device, replay: bool) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let device = own_device(device)?;
    let g = gather_graph();
    let exe = Graph::compile_with(&g, &device, &options()).map_err(err)?;
    let mut s = exe.session_with(&SessionOptions { replay }).map_err(err)?;
    let replays = replay && replay_expected(&device, &s)?;
    let (compiles, allocations) = (device.cache().compiles(), device.memory().allocations());
    let in_use = device.memory().in_use();
    let mut b = with_weights(&g, &Bindings::random(&g, 9));
    for step in 0..40i64 {
        if step % 5 == 0 {
            b = b.with_input("x", Bindings::random(&g, step as u64).inputs["x"].clone());
            s.set_input("x", &b.inputs["x"]).map_err(err)?;
        }
        let v: Vec<i64> = (0..5).map(|k| (step * 7 + k * 11) % 37).collect();
        b = b.with_input("ids", ids(&v));
        s.set_input("ids", &b.inputs["ids"]).map_err(err)?;
        s.run().map_err(err)?;
        let got = s.outputs().map_err(err)?;
        let want = run(&g, &b).map_err(|e| e.to_string())?;
        if bytes(&got) != bytes(&want) {
            return Err(format!("step {step} (ids {v:?}): differs from the interpreter").into());
        }
        if step == 20 {
            s.set_input("ids", &ids(&[0, 3, 37, 1, -2])).map_err(err)?;
            s.run().map_err(err)?;
            match s.outputs() {
                Err(CompileError::Interp(InterpError::IndexOutOfRange { index: 37, .. })) => {}
                other => return Err(format!("out of range: {other:?}").into()),
            }
        }
    }
    if device.cache().compiles() != compiles {
        return Err("the loop compiled kernels".into());
    }
    if device.memory().allocations() != allocations || device.memory().in_use() != in_use {
        return Err(format!(
            "the loop allocated: {} allocations and {} B in use, before {allocations} and \
             {in_use} B",
            device.memory().allocations(),
            device.memory().in_use()
        )
        .into());
    }
    if s.captures() != usize::from(replays) {
        return Err(format!("{} captures, want {}", s.captures(), usize::from(replays)).into());
    }
    Ok(())
}

/// Warm runs of a session allocate nothing on the device (its own device's counter: no
/// allocation, bytes in use unchanged), with replay and without, outputs read to the host, to a
/// host slice and to a device buffer allocated beforehand.
pub fn warm_runs_allocate_nothing(device: &Device) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let device = own_device(device)?;
    let g = load("attention_causal")?;
    let exe = Graph::compile_with(&g, &device, &options()).map_err(err)?;
    let name = exe.output_names()[0].clone();
    let out_ty = g.node(g.outputs()[0]).ty.clone();
    let out_bytes = out_ty.shape.numel() * out_ty.dtype.size_bytes();
    for replay in [true, false] {
        let mut s = exe.session_with(&SessionOptions { replay }).map_err(err)?;
        let b = Bindings::random(&g, 1);
        set_all(&mut s, &b)?;
        s.run().map_err(err)?;
        let first = s.outputs().map_err(err)?;
        let stream = device.new_stream().map_err(|e| e.to_string())?;
        let dst = stream.alloc(out_bytes, true).map_err(|e| e.to_string())?;
        let mut host = vec![0u8; out_bytes];
        let (allocations, in_use) = (device.memory().allocations(), device.memory().in_use());
        for step in 0..5 {
            let b = Bindings::random(&g, 1 + step);
            set_all(&mut s, &b)?;
            s.run().map_err(err)?;
            s.output_to_host(&name, &mut host).map_err(err)?;
            s.output_to_device(&name, &dst).map_err(err)?;
            let _ = s.output(&name).map_err(err)?;
        }
        if (device.memory().allocations(), device.memory().in_use()) != (allocations, in_use) {
            return Err(format!(
                "replay {replay}: warm runs allocated ({} allocations, {} B in use; before \
                 {allocations}, {in_use} B)",
                device.memory().allocations(),
                device.memory().in_use()
            )
            .into());
        }
        // The last step's output, three ways, all the same bytes.
        let via_device = stream.download(&dst).map_err(|e| e.to_string())?;
        let last = s.output(&name).map_err(err)?.to_bytes();
        if host != last || via_device[..out_bytes] != last[..] {
            return Err(format!("replay {replay}: the output read three ways differs").into());
        }
        if first[0].to_bytes() == last {
            return Err("fresh inputs gave the same output: inputs not written".into());
        }
    }
    Ok(())
}

/// Drop order. A captured graph holds the buffers it touches: with the caller's handles and
/// the launch list dropped, the graph still replays into live memory, and the input's bytes
/// stay counted until the graph goes. A session sharing an executable keeps it alive after the
/// caller's handle is gone; dropping the session brings the device back to its baseline.
pub fn buffers_outlive_the_graph(device: &Device) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let device = own_device(device)?;
    let mem = device.memory();
    let baseline = mem.in_use();
    let mut g = Graph::new("graph_drop");
    let x = g.input("x", DType::F32, &[301]).unwrap();
    let y = g.neg(x).unwrap();
    g.add_output(y).unwrap();
    let target = device.target().ok_or("no target")?.clone();
    let plan = rocmforge::codegen::generate(&g, &target).map_err(|e| e.to_string())?;
    let k = &plan.kernels[0];
    let opts = rocmforge::arch::compiler_options(target.platform);
    let image = device
        .compile_source(&plan.source(k), &k.entry, &opts)
        .map_err(|e| e.to_string())?;
    let kernel = Arc::new(
        device
            .load_kernel(&image, &k.entry)
            .map_err(|e| e.to_string())?,
    );
    let stream = device.new_stream().map_err(|e| e.to_string())?;
    let values: Vec<f64> = (0..301).map(|i| i as f64 * 0.25 - 30.0).collect();
    let input = Tensor::from_f64(DType::F32, vec![301], &values).unwrap();
    let a = Arc::new(
        stream
            .upload(&input.to_bytes())
            .map_err(|e| e.to_string())?,
    );
    let o = Arc::new(stream.alloc(301 * 4, true).map_err(|e| e.to_string())?);
    let list = Arc::new(
        stream
            .bind(&[KernelLaunch {
                kernel,
                grid: k.launch.grid,
                block: k.launch.block,
                shared_bytes: k.launch.shared_bytes,
                args: vec![a.clone(), o.clone()],
                offsets: vec![],
                programmatic: false,
            }])
            .map_err(|e| e.to_string())?,
    );
    if let Err(why) = stream.replay_support() {
        return match device.kind() {
            DeviceKind::Hip => Ok(()),
            _ => Err(format!("no replay on {}: {why}", device.label()).into()),
        };
    }
    let graph = stream.capture(&list).map_err(|e| e.to_string())?;
    drop(list);
    drop(a);
    let held = mem.in_use();
    stream.replay(&graph).map_err(|e| e.to_string())?;
    let got = stream.download(&o).map_err(|e| e.to_string())?;
    let want: Vec<u8> = values
        .iter()
        .flat_map(|v| (-(*v as f32)).to_le_bytes())
        .collect();
    if got != want {
        return Err(
            "the replay with the caller's handles dropped computed the wrong values".into(),
        );
    }
    drop(graph);
    stream.synchronize().map_err(|e| e.to_string())?;
    if mem.in_use() + 301 * 4 != held {
        return Err(format!(
            "the graph's drop freed {} B, want the input's {}",
            held - mem.in_use(),
            301 * 4
        )
        .into());
    }
    drop(o);
    // A session outliving the caller's handle on its executable.
    let exe: Arc<Executable> = Arc::new(Graph::compile_with(&g, &device, &options()).map_err(err)?);
    let mut s = Session::new(exe.clone()).map_err(err)?;
    drop(exe);
    s.set_input("x", &input).map_err(err)?;
    s.run().map_err(err)?;
    if s.outputs().map_err(err)?[0].to_bytes() != want {
        return Err("a session whose executable handle was dropped computed wrongly".into());
    }
    drop(s);
    drop(stream);
    if mem.in_use() != baseline {
        return Err(format!(
            "{} B in use after everything dropped",
            mem.in_use() - baseline
        )
        .into());
    }
    Ok(())
}

/// Sessions: warm runs, replay, threads, drop order.
pub fn trials(device: &Device, ignored: &Option<String>, trials: &mut Vec<Trial>) {
    // Sessions: warm runs against run and the interpreter, replay, threads, drop order.
    for name in crate::sessions::GRAPHS {
        let d = device.clone();
        push(
            trials,
            ignored,
            format!("session::warm_matches_run::{name}"),
            Box::new(move || crate::sessions::warm_session_matches_run(&d, name)),
        );
    }
    for replay in [true, false] {
        let d = device.clone();
        push(
            trials,
            ignored,
            format!(
                "session::device_scalar_loop::{}",
                if replay { "replay" } else { "plain" }
            ),
            Box::new(move || crate::sessions::device_scalar_loop(&d, replay)),
        );
    }
    let session_device_trials: [(&str, DeviceTrial); 3] = [
        (
            "session::many_sessions_on_threads",
            crate::sessions::sessions_on_threads,
        ),
        (
            "session::warm_runs_allocate_nothing",
            crate::sessions::warm_runs_allocate_nothing,
        ),
        (
            "session::buffers_outlive_the_graph",
            crate::sessions::buffers_outlive_the_graph,
        ),
    ];
    for (name, f) in session_device_trials {
        let d = device.clone();
        push(trials, ignored, name.into(), Box::new(move || f(&d)));
    }
}
