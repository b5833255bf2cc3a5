//! The device itself: concurrency stress, a planted bug caught by poisoning, matrix atoms, memory back to its baseline, the disk cache across processes, stream holds and profiling.

use std::path::Path;
use std::sync::Arc;

use crate::common::*;
use crate::harness::*;
use libtest_mimic::{Failed, Trial};
use rocmforge::codegen::mma::MmaAtom;
use rocmforge::codegen::mma_probe_kernel;
use rocmforge::compile::CompileOptions;
use rocmforge::interp::{run, Bindings};
use rocmforge::ir::{format, DType, Graph, Tensor};
use rocmforge::runtime::{Device, DiskCache, KernelCache};

pub fn stress(device_spec: &str) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    // A device of its own, no disk store: every key it needs is compiled here, once.
    let device = Device::open_with_cache(device_spec, KernelCache::with_disk(None))
        .map_err(|e| e.to_string())?;
    let mix: Vec<Graph> = [
        "attention_causal",
        "gqa_attention",
        "llama_block",
        "attention_padding_mask",
    ]
    .iter()
    .map(|n| {
        format::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("graphs/{n}.json")))
            .unwrap()
    })
    .collect();
    let single: Vec<Vec<Tensor>> = mix
        .iter()
        .map(|g| {
            Graph::compile_with(g, &device, &options())
                .and_then(|c| c.run(&Bindings::random(g, 5)))
                .map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    let unique = device.cache().compiles();
    let mix = Arc::new(mix);
    let single = Arc::new(single);
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let (device, mix, single) = (device.clone(), Arc::clone(&mix), Arc::clone(&single));
            std::thread::spawn(move || -> Result<(), String> {
                for it in 0..25 {
                    let k = (t + it) % mix.len();
                    let c = Graph::compile_with(&mix[k], &device, &options())
                        .map_err(|e| e.to_string())?;
                    let out = c
                        .run(&Bindings::random(&mix[k], 5))
                        .map_err(|e| e.to_string())?;
                    if out != single[k] {
                        return Err(format!(
                            "thread {t} iteration {it}: {} differs from the single-threaded run",
                            mix[k].name
                        ));
                    }
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| "a stress thread panicked")??;
    }
    if device.cache().compiles() != unique {
        return Err(format!("{} compiles for {unique} keys", device.cache().compiles()).into());
    }
    Ok(())
}

pub fn planted_bug_is_caught(device: &Device) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let mut g = Graph::new("planted");
    let x = g.input("x", DType::F32, &[1000]).unwrap();
    let y = g.tanh(x).unwrap();
    g.add_output(y).unwrap();
    // The planted bug: the bounds check stops one element early.
    let rewrite: rocmforge::compile::KernelRewrite = Arc::new(|k| {
        k.body = k
            .body
            .replace("if (i >= 1000LL) return;", "if (i >= 999LL) return;");
    });
    let c = Graph::compile_with(
        &g,
        device,
        &CompileOptions {
            rewrite_kernels: Some(rewrite),
            ..options()
        },
    )
    .map_err(|e| e.to_string())?;
    let out = c
        .run(&Bindings::random(&g, 1))
        .map_err(|e| e.to_string())?
        .remove(0);
    let v = out.as_f32().unwrap();
    if !v[999].is_nan() || v[..999].iter().any(|x| x.is_nan()) {
        return Err(format!(
            "poison did not expose the skipped element: last = {}",
            v[999]
        )
        .into());
    }
    let want = run(&g, &Bindings::random(&g, 1)).unwrap().remove(0);
    if compare(&out, &want, tolerance(DType::F32), "planted").is_ok() {
        return Err("the comparison accepted an unwritten element".into());
    }
    Ok(())
}

/// One matrix atom of the device's target, run by its probe kernel (one wave, two accumulating
/// MMAs through the generated fragment helpers) on integer matrices: every product and sum is
/// exact in f16, bf16, TF32 and f32, so the result must equal the f64 product exactly. A wrong
/// fragment layout puts some element in the wrong place and fails this.
pub fn mma_atom_probe(device: &Device, atom: &'static MmaAtom) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let target = device.target().ok_or("the device has no codegen target")?;
    let probe = mma_probe_kernel(target, atom).map_err(|e| e.to_string())?;
    let options = rocmforge::arch::compiler_options(target.platform);
    let image = device
        .compile_source(&probe.source, &probe.entry, &options)
        .map_err(|e| e.to_string())?;
    let kernel = device
        .load_kernel(&image, &probe.entry)
        .map_err(|e| e.to_string())?;
    let (m, n, k) = (probe.m, probe.n, probe.k);
    let a: Vec<f64> = (0..m * k).map(|i| ((i * 7 + 3) % 9) as f64 - 4.0).collect();
    let b: Vec<f64> = (0..k * n).map(|i| ((i * 5 + 1) % 7) as f64 - 3.0).collect();
    let bt: Vec<f64> = (0..n * k).map(|x| b[(x % k) * n + x / k]).collect();
    let bits = |v: &[f64]| -> Vec<u8> {
        v.iter()
            .flat_map(|&x| match atom.input {
                DType::BF16 => half::bf16::from_f64(x).to_bits().to_le_bytes().to_vec(),
                // The TF32 atoms read f32 (small integers are exact at TF32 precision).
                DType::F32 => (x as f32).to_le_bytes().to_vec(),
                _ => half::f16::from_f64(x).to_bits().to_le_bytes().to_vec(),
            })
            .collect()
    };
    let e = |e: rocmforge::runtime::RuntimeError| e.to_string();
    let stream = device.new_stream().map_err(e)?;
    let (da, db, dbt) = (
        stream.upload(&bits(&a)).map_err(e)?,
        stream.upload(&bits(&b)).map_err(e)?,
        stream.upload(&bits(&bt)).map_err(e)?,
    );
    let dc = stream.alloc(m * n * 4, true).map_err(e)?;
    stream
        .launch(
            &kernel,
            [1, 1, 1],
            [probe.lanes, 1, 1],
            0,
            &[&da, &db, &dbt, &dc],
        )
        .map_err(e)?;
    let out = stream.download(&dc).map_err(e)?;
    for r in 0..m {
        for c in 0..n {
            let want: f64 = (0..k).map(|x| a[r * k + x] * b[x * n + c]).sum();
            let at = 4 * (r * n + c);
            let got = f32::from_le_bytes([out[at], out[at + 1], out[at + 2], out[at + 3]]);
            if f64::from(got) != want {
                return Err(format!("{}: C[{r}][{c}] = {got}, want {want}", atom.name).into());
            }
        }
    }
    Ok(())
}

pub fn memory_returns_to_baseline(device: &Device) -> Result<(), Failed> {
    let _exclusive = MEMORY.write().unwrap_or_else(|p| p.into_inner());
    let before = device.memory().in_use();
    // Every example graph and every zoo graph: compiled, run, dropped, and back to baseline.
    let mut graphs: Vec<Graph> = files::graph_files()
        .iter()
        .map(|p| format::load(p).unwrap())
        .collect();
    graphs.extend(op_zoo::zoo());
    for g in &graphs {
        {
            let c = Graph::compile_with(g, device, &options()).map_err(|e| e.to_string())?;
            c.run(&Bindings::random(g, 2)).map_err(|e| e.to_string())?;
        }
        let after = device.memory().in_use();
        if after != before {
            return Err(format!(
                "{}: device memory {before} B before, {after} B after",
                g.name
            )
            .into());
        }
    }
    // An over-budget allocation is a typed error and leaves the model usable.
    let g = &graphs
        .iter()
        .find(|g| g.name == "bert_layer")
        .expect("bert_layer.json");
    let c = Graph::compile_with(*g, device, &options()).map_err(|e| e.to_string())?;
    device
        .memory()
        .set_budget(Some(device.memory().in_use() + 1024));
    let refused = c.run(&Bindings::random(g, 2));
    device.memory().set_budget(None);
    if !matches!(
        refused,
        Err(rocmforge::compile::CompileError::Runtime(
            rocmforge::runtime::RuntimeError::OverBudget { .. }
        ))
    ) {
        return Err(format!("a run past the budget was not refused: {:?}", refused.err()).into());
    }
    c.run(&Bindings::random(g, 2))
        .map_err(|e| format!("unusable after a refused run: {e}"))?;
    drop(c);
    if device.memory().in_use() != before {
        return Err("memory not back to baseline after the budget check".into());
    }
    Ok(())
}

/// In a child process: compile one graph with the disk cache at ROCMFORGE_CACHE_DIR and print
/// how many kernels were compiled and how many came from disk.
pub fn child_compile() {
    let spec = std::env::var("ROCMFORGE_GPU_CHILD_DEVICE").unwrap();
    let device = Device::open(&spec).unwrap();
    let g = format::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("graphs/llama_block.json"))
        .unwrap();
    let c = Graph::compile_with(&g, &device, &options()).unwrap();
    println!("compiled={} disk={}", c.stats.compiled, c.stats.from_disk);
}

pub fn disk_cache_across_processes(spec: &str) -> Result<(), Failed> {
    let dir = std::env::temp_dir().join(format!("rocmforge-gpu-cache-{}", std::process::id()));
    let child = || -> Result<(usize, usize), Failed> {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .env("ROCMFORGE_GPU_CHILD_DEVICE", spec)
            .env("ROCMFORGE_CACHE_DIR", &dir)
            .output()
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let line = text
            .lines()
            .find(|l| l.starts_with("compiled="))
            .ok_or(format!(
                "child said: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            ))?;
        let nums: Vec<usize> = line
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|s| s.parse().ok())
            .collect();
        Ok((nums[0], nums[1]))
    };
    let (c1, d1) = child()?;
    let (c2, d2) = child()?;
    if c1 == 0 || d1 != 0 || c2 != 0 || d2 != c1 {
        return Err(format!(
            "first process compiled {c1} (disk {d1}); second compiled {c2} (disk {d2})"
        )
        .into());
    }
    // Corrupt one entry: it is rebuilt, the others load.
    let entries = DiskCache::new(dir.clone())
        .list()
        .map_err(|e| e.to_string())?
        .entries;
    let victim = &entries[0].file;
    let bytes = std::fs::read(victim).map_err(|e| e.to_string())?;
    std::fs::write(victim, &bytes[..bytes.len() / 2]).map_err(|e| e.to_string())?;
    let (c3, d3) = child()?;
    std::fs::remove_dir_all(&dir).ok();
    if c3 != 1 || d3 != c1 - 1 {
        return Err(
            format!("after corrupting one entry: compiled {c3}, disk {d3} (of {c1})").into(),
        );
    }
    Ok(())
}

/// A graph with an input no kernel reads (the passes remove it): it runs on the device, its
/// output matches the interpreter, and the unused input is still part of the interface (a run
/// that leaves it out or binds the wrong type is refused with a typed error).
pub fn unused_input_runs(device: &Device) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let g = format::from_json_str(
        r#"{"version": 1, "name": "unused_input", "nodes": [
        {"name": "x", "op": "input", "dtype": "f32", "shape": [3, 40]},
        {"name": "unused", "op": "input", "dtype": "f32", "shape": [7]},
        {"name": "o", "op": "tanh", "inputs": ["x"]}], "outputs": ["o"]}"#,
    )
    .map_err(|e| e.to_string())?;
    let c = Graph::compile_with(&g, device, &options()).map_err(|e| e.to_string())?;
    let b = Bindings::random(&g, 6);
    let got = c.run(&b).map_err(|e| e.to_string())?;
    let want = run(&g, &b).map_err(|e| e.to_string())?;
    let err = compare(&got[0], &want[0], tolerance(DType::F32), "unused_input %o")?;
    if err > tolerance(DType::F32) {
        return Err(format!("unused_input: relative L2 {err:e}").into());
    }
    let mut missing = b.clone();
    missing.inputs.remove("unused");
    match c.run(&missing) {
        Err(rocmforge::compile::CompileError::Interp(
            rocmforge::interp::InterpError::MissingInput { name, .. },
        )) if name == "unused" => Ok(()),
        other => Err(format!("run without `unused`: {:?}", other.map(|_| "ran")).into()),
    }
}

/// `verify` on the device: NaN and ±inf where the interpreter has them count as equal, and the
/// error is over the finite values.
pub fn verify_with_non_finite_outputs(device: &Device) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let g = format::from_json_str(
        r#"{"version": 1, "name": "non_finite", "nodes": [
        {"name": "x", "op": "input", "dtype": "f32", "shape": [5, 64]},
        {"name": "zero", "op": "constant", "dtype": "f32", "value": 0.0},
        {"name": "ln", "op": "log", "inputs": ["x"]},
        {"name": "q", "op": "div", "inputs": ["x", "zero"]}], "outputs": ["ln", "q"]}"#,
    )
    .map_err(|e| e.to_string())?;
    let c = Graph::compile_with(&g, device, &options()).map_err(|e| e.to_string())?;
    let b = Bindings::random(&g, 8);
    let (_, v) = c.verify(&b).map_err(|e| e.to_string())?;
    let negatives = b.inputs["x"]
        .to_f64_vec()
        .iter()
        .filter(|x| **x < 0.0)
        .count();
    let counts: Vec<usize> = v.outputs.iter().map(|o| o.non_finite).collect();
    if counts != [negatives, 5 * 64] || v.max_error() > tolerance(DType::F32) {
        return Err(format!(
            "non-finite counts {counts:?} (want [{negatives}, 320]), error {:e}",
            v.max_error()
        )
        .into());
    }
    Ok(())
}

/// A device number past the last GPU is "no device", not a driver error or a panic.
pub fn ordinal_past_the_last_gpu(device: &Device) -> Result<(), Failed> {
    let kind = device.spec().split(':').next().unwrap_or_default();
    let spec = format!("{kind}:2147483647");
    match Device::open(&spec) {
        Err(rocmforge::runtime::RuntimeError::NoDevice { reason, .. })
            if reason.contains("GPU(s) present") =>
        {
            Ok(())
        }
        other => Err(format!("{spec}: {:?}", other.map(|d| d.label().to_string())).into()),
    }
}

/// A held stream starts nothing queued behind the hold until it is released: a marker queued
/// behind it is not reached while held (the event itself is asked), and is once the hold is
/// released. A hold never released gives up at its limit and says so: synchronising the stream
/// returns once it has.
pub fn hold_keeps_the_stream_until_released(device: &Device) -> Result<(), Failed> {
    use std::time::Duration;
    // Alone on the device: CUDA runs every stream's host functions on one driver thread, so
    // another trial's hold queued ahead of this one delays when this one starts waiting (seen
    // on the H100 under the parallel harness: the 10 s hold reported expired).
    let _alone = MEMORY.write().unwrap_or_else(|p| p.into_inner());
    let stream = device.new_stream().map_err(|e| e.to_string())?;
    let err = |e: rocmforge::runtime::RuntimeError| Failed::from(e.to_string());
    let mut hold = stream.hold(Duration::from_secs(10)).map_err(err)?;
    let behind = stream.mark().map_err(err)?;
    if behind.reached().map_err(err)? {
        return Err("a marker behind a held stream was reached before the release".into());
    }
    hold.release();
    stream.synchronize().map_err(err)?;
    if !behind.reached().map_err(err)? || hold.expired() {
        return Err(format!(
            "after the release: reached {:?}, expired {}",
            behind.reached(),
            hold.expired()
        )
        .into());
    }
    let unreleased = stream.hold(Duration::from_millis(5)).map_err(err)?;
    let after = stream.mark().map_err(err)?;
    stream.synchronize().map_err(err)?;
    if !unreleased.expired() || !after.reached().map_err(err)? {
        return Err("a 5 ms hold never released did not give up".into());
    }
    Ok(())
}

/// `Prepared::profile` on the fused BERT layer: one time per kernel of the plan, in its order,
/// each positive, their sum within the span, the span within a plain run's host-timed pass
/// (which adds launch latency), and the profiled run's outputs still the interpreter's.
pub fn profile_times_every_kernel(device: &Device) -> Result<(), Failed> {
    use std::time::{Duration, Instant};
    // Alone on the device: while the profiled stream is held, another thread's device-wide
    // synchronising call (freeing memory, loading a module) waits for it, and a lock that thread
    // holds can keep this host from enqueueing; the hold then gives up after its limit (seen
    // once on the H100 under the parallel harness: ProfileHoldExpired).
    let _alone = MEMORY.write().unwrap_or_else(|p| p.into_inner());
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("graphs/bert_layer.json");
    let g = format::load(&path).map_err(|e| e.to_string())?;
    let c = Graph::compile_with(&g, device, &options()).map_err(|e| e.to_string())?;
    let plan = c.plan().ok_or("a GPU compile has a plan")?;
    let b = Bindings::random(&g, 5);
    let mut p = c.prepare(&b).map_err(|e| e.to_string())?;
    let profile = p.profile().map_err(|e| e.to_string())?;
    let order: Vec<(&str, &str)> = profile
        .kernels
        .iter()
        .map(|k| (k.entry.as_str(), k.family))
        .collect();
    let want: Vec<(&str, &str)> = plan
        .kernels
        .iter()
        .map(|k| (k.entry.as_str(), k.family))
        .collect();
    if order != want {
        return Err(format!("profile kernels {order:?}, plan {want:?}").into());
    }
    if let Some(k) = profile.kernels.iter().find(|k| k.time.is_zero()) {
        return Err(format!("kernel {} ({}) timed at zero", k.index, k.entry).into());
    }
    // Event stamps are about half a microsecond apart at best: one of rounding per kernel.
    let slack = Duration::from_micros(plan.kernels.len() as u64);
    if profile.total() > profile.span + slack {
        return Err(format!("sum {:?} past span {:?}", profile.total(), profile.span).into());
    }
    let families: usize = profile.by_family().iter().map(|f| f.kernels).sum();
    if families != plan.kernels.len() {
        return Err(format!(
            "families count {families} of {} kernels",
            plan.kernels.len()
        )
        .into());
    }
    let mut walls: Vec<Duration> = (0..5)
        .map(|_| {
            let t = Instant::now();
            p.launch()
                .and_then(|_| p.synchronize())
                .map(|_| t.elapsed())
        })
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    walls.sort();
    if profile.span > walls[2] * 2 {
        return Err(format!("span {:?}, a host-timed pass {:?}", profile.span, walls[2]).into());
    }
    let got = p.outputs().map_err(|e| e.to_string())?;
    let want = run(&g, &with_weights(&g, &b)).map_err(|e| e.to_string())?;
    for (i, (x, y)) in got.iter().zip(&want).enumerate() {
        let err = compare(x, y, tolerance(x.ty().dtype), &format!("output {i}"))?;
        if err > tolerance(x.ty().dtype) {
            return Err(format!("output {i} after profiling: relative L2 {err:e}").into());
        }
    }
    Ok(())
}

/// The matrix atoms of the device's target.
pub fn mma_atoms(device: &Device, ignored: &Option<String>, trials: &mut Vec<Trial>) {
    // The matrix atoms of the device's target, each through its probe kernel.
    match device.target().map(|t| t.caps.mma) {
        Some(atoms) => {
            for &atom in atoms {
                let d = device.clone();
                push(
                    trials,
                    ignored,
                    format!("mma::{}::exact_product", atom.name),
                    Box::new(move || mma_atom_probe(&d, atom)),
                );
            }
        }
        None => push(
            trials,
            ignored,
            "mma::atoms_of_the_device".into(),
            // Only a device without a codegen target gets here: with a GPU that is a failure
            // (this used to pass), without one the trial is ignored or required by `push`.
            Box::new(|| {
                Err("the device has no codegen target, so no matrix atoms to probe".into())
            }),
        ),
    }
}

/// Stress, poisoning, memory, the disk cache and the device's own checks.
pub fn trials(device: &Device, ignored: &Option<String>, trials: &mut Vec<Trial>) {
    let spec = device.spec().to_string();
    let s2 = spec.clone();
    push(
        trials,
        ignored,
        "stress::16_threads_x_25_iterations".into(),
        Box::new(move || stress(&s2)),
    );
    let d = device.clone();
    push(
        trials,
        ignored,
        "run::unused_input_is_bound_but_not_uploaded".into(),
        Box::new(move || unused_input_runs(&d)),
    );
    let d = device.clone();
    push(
        trials,
        ignored,
        "verify::nan_and_inf_at_the_same_places".into(),
        Box::new(move || verify_with_non_finite_outputs(&d)),
    );
    let d = device.clone();
    push(
        trials,
        ignored,
        "device::ordinal_past_the_last_gpu".into(),
        Box::new(move || ordinal_past_the_last_gpu(&d)),
    );
    let d = device.clone();
    push(
        trials,
        ignored,
        "poison::planted_bug_is_caught".into(),
        Box::new(move || planted_bug_is_caught(&d)),
    );
    let d = device.clone();
    push(
        trials,
        ignored,
        "memory::returns_to_baseline".into(),
        Box::new(move || memory_returns_to_baseline(&d)),
    );
    push(
        trials,
        ignored,
        "cache::disk_across_processes".into(),
        Box::new(move || disk_cache_across_processes(&spec)),
    );
}
