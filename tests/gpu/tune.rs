//! Tuning on a fresh tune cache, reloaded after a restart, and through the CLI.

use std::path::{Path, PathBuf};

use crate::attention::check_attention_with;
use crate::common::attention_graphs::{build, Mask, Spec};
use crate::common::*;
use crate::harness::*;
use libtest_mimic::{Failed, Trial};
use rocmforge::compile::CompileOptions;
use rocmforge::interp::{run, Bindings};
use rocmforge::ir::{DType, Graph};
use rocmforge::runtime::{Device, DiskCache, KernelCache};

/// A device handle of its own over the GPU `spec`, with a kernel and tune cache in `dir` only
/// (no results of earlier runs, no memory of other trials).
pub fn device_with_cache_in(spec: &str, dir: &Path) -> Result<Device, Failed> {
    Ok(Device::open_with_cache(
        spec,
        KernelCache::with_disk(Some(DiskCache::new(dir.into()))),
    )
    .map_err(|e| e.to_string())?)
}

pub fn tune_options() -> CompileOptions {
    CompileOptions {
        tune: true,
        ..options()
    }
}

/// The kernels of a compile with their tuned choice: (node, candidate index) per tunable kernel.
pub fn tuned_choices(c: &rocmforge::compile::Compiled) -> Vec<(String, usize)> {
    c.plan()
        .map(|p| {
            p.kernels
                .iter()
                .filter_map(|k| k.tune.as_ref().map(|t| (k.node.clone(), t.chosen)))
                .collect()
        })
        .unwrap_or_default()
}

/// Tuning `g` (odd sizes) on a fresh tune cache: every problem with several candidates is timed
/// (no cache yet) and a candidate chosen; the result matches the reference (`check` runs it on
/// the tuned compile); a second compile on a new device handle over the same directory (a
/// restart) reads every choice from disk without timing and generates the same kernels; the
/// entries are listed as tuning entries.
pub fn tune_then_reload(
    device: &Device,
    g: &Graph,
    check: &dyn Fn(&Device) -> Result<(), Failed>,
) -> Result<(), Failed> {
    // No hold on MEMORY here: these device handles count their own memory, apart from the
    // shared device the memory check measures, and `check` may take the lock itself.
    let dir = std::env::temp_dir().join(format!(
        "rocmforge-gpu-tune-{}-{}",
        g.name,
        std::process::id()
    ));
    std::fs::remove_dir_all(&dir).ok();
    let result = (|| -> Result<(), Failed> {
        let first = device_with_cache_in(device.spec(), &dir)?;
        let c1 = Graph::compile_with(g, &first, &tune_options()).map_err(|e| e.to_string())?;
        let t1 = &c1.stats.tuning;
        if t1.problems == 0 || t1.timed != t1.problems || t1.from_cache != 0 {
            return Err(format!("{}: first compile tuned {t1:?}", g.name).into());
        }
        if t1.candidates_timed <= t1.problems {
            return Err(format!("{}: fewer than two candidates timed: {t1:?}", g.name).into());
        }
        let chosen = tuned_choices(&c1);
        if chosen.is_empty() {
            return Err(format!("{}: no tunable kernel in the plan", g.name).into());
        }
        check(&first)?;
        let tuning_entries = DiskCache::new(dir.clone())
            .list()
            .map_err(|e| e.to_string())?
            .entries
            .into_iter()
            .filter(|e| matches!(e.kind, rocmforge::runtime::EntryKind::Tuning { .. }) && e.valid)
            .count();
        if tuning_entries != t1.problems {
            return Err(format!(
                "{}: {tuning_entries} tuning entries on disk for {} problems",
                g.name, t1.problems
            )
            .into());
        }
        let second = device_with_cache_in(device.spec(), &dir)?;
        let c2 = Graph::compile_with(g, &second, &tune_options()).map_err(|e| e.to_string())?;
        let t2 = &c2.stats.tuning;
        if t2.timed != 0 || t2.candidates_timed != 0 || t2.from_cache != t1.problems {
            return Err(format!("{}: second compile {t2:?} after {t1:?}", g.name).into());
        }
        if tuned_choices(&c2) != chosen {
            return Err(format!(
                "{}: reloaded choices {:?} differ from the tuned {chosen:?}",
                g.name,
                tuned_choices(&c2)
            )
            .into());
        }
        check(&second)
    })();
    std::fs::remove_dir_all(&dir).ok();
    result
}

/// An f16 GEMM at odd sizes on the matrix cores (where the device has an atom), tuned.
pub fn tune_gemm(device: &Device) -> Result<(), Failed> {
    let g = gemm_cases::plain_case(DType::F16, 77, 130, 72, true);
    let check = |d: &Device| -> Result<(), Failed> {
        let c = Graph::compile_with(&g, d, &tune_options()).map_err(|e| e.to_string())?;
        let b = Bindings::random(&g, 5);
        let got = c.run(&b).map_err(|e| e.to_string())?.remove(0);
        let want = run(&g, &with_weights(&g, &b))
            .map_err(|e| e.to_string())?
            .remove(0);
        let err = compare(&got, &want, tolerance(DType::F16), &g.name)?;
        if err > tolerance(DType::F16) {
            return Err(format!("{} tuned: relative L2 {err:e}", g.name).into());
        }
        Ok(())
    };
    tune_then_reload(device, &g, &check)
}

/// f16 causal GQA attention at odd sizes (77 queries, 93 keys, 6 query heads on 2 K/V heads),
/// tuned.
pub fn tune_attention(device: &Device) -> Result<(), Failed> {
    let spec = Spec {
        dtype: DType::F16,
        hkv: 2,
        sk: 93,
        mask: Mask::Causal,
        ..Spec::new(2, 6, 77, 64)
    };
    let mut g = build(&spec);
    rocmforge::passes::PassManager::default_pipeline()
        .run(&mut g)
        .map_err(|e| e.to_string())?;
    g.name = "tune_attention".into();
    let check = |d: &Device| check_attention_with(d, spec, 9, tune_options());
    tune_then_reload(device, &g, &check)
}

/// The rocmforge binary: where cargo built it, else staged beside the test binaries
/// (`cp target/release/rocmforge .gpu/bin/`).
pub fn rocmforge_binary() -> Option<PathBuf> {
    [
        PathBuf::from(env!("CARGO_BIN_EXE_rocmforge")),
        PathBuf::from(".gpu/bin/rocmforge"),
    ]
    .into_iter()
    .find(|p| p.is_file())
}

/// `rocmforge run --tune` with `RUST_LOG=rocmforge=debug`: the first run times the candidates
/// and logs the stages, the second reads the choices from the cache, `cache ls` lists them
/// and `cache clear` removes them.
pub fn tune_cli(device: &Device, exe: &Path) -> Result<(), Failed> {
    let _shared = MEMORY.read().unwrap_or_else(|p| p.into_inner());
    let dir = std::env::temp_dir().join(format!("rocmforge-gpu-tune-cli-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    let graph = Path::new(env!("CARGO_MANIFEST_DIR")).join("graphs/attention_f16.json");
    let cmd = |args: &[&str]| -> Result<(String, String), Failed> {
        let out = std::process::Command::new(exe)
            .args(args)
            .env("ROCMFORGE_CACHE_DIR", &dir)
            .env("RUST_LOG", "rocmforge=debug")
            .output()
            .map_err(|e| e.to_string())?;
        let (o, e) = (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        if !out.status.success() {
            return Err(format!("rocmforge {args:?} failed:\n{o}\n{e}").into());
        }
        Ok((o, e))
    };
    let graph_arg = graph.to_string_lossy().into_owned();
    let run_args = [
        "run",
        graph_arg.as_str(),
        "--tune",
        "--verify",
        "--device",
        device.spec(),
    ];
    let result = (|| -> Result<(), Failed> {
        let (out, err) = cmd(&run_args)?;
        // "tuning: N problems with several candidates, F from the cache, T timed now (...)"
        let numbers = |text: &str| -> Option<Vec<usize>> {
            let line = text.lines().find(|l| l.starts_with("tuning: "))?;
            Some(
                line.split(|c: char| !c.is_ascii_digit())
                    .filter_map(|s| s.parse().ok())
                    .take(3)
                    .collect(),
            )
        };
        let first = numbers(&out).ok_or(format!("no tuning line in:\n{out}"))?;
        if first.len() != 3 || first[0] == 0 || first[1] != 0 || first[2] != first[0] {
            return Err(format!("first --tune run: {first:?}\n{out}").into());
        }
        for stage in [
            "pass done",
            "codegen done",
            "kernel: compiled",
            "tuning: timed",
            "weights uploaded",
        ] {
            if !err.contains(stage) {
                return Err(format!("RUST_LOG=rocmforge=debug lacks `{stage}`:\n{err}").into());
            }
        }
        let (out2, err2) = cmd(&run_args)?;
        let second = numbers(&out2).ok_or(format!("no tuning line in:\n{out2}"))?;
        if second != vec![first[0], first[0], 0] || err2.contains("tuning: timed") {
            return Err(format!("second --tune run: {second:?}\n{out2}").into());
        }
        let (ls, _) = cmd(&["cache", "ls"])?;
        let listed = ls.lines().filter(|l| l.contains(" tuning ")).count();
        let attention = ["attention_wgmma", "attention_mma", "attention_simt"];
        if listed != first[0] || !attention.iter().any(|family| ls.contains(family)) {
            return Err(format!("cache ls lists {listed} tuning entries:\n{ls}").into());
        }
        cmd(&["cache", "clear"])?;
        let (ls, _) = cmd(&["cache", "ls"])?;
        if ls.contains(" tuning ") {
            return Err(format!("tuning entries left after cache clear:\n{ls}").into());
        }
        Ok(())
    })();
    std::fs::remove_dir_all(&dir).ok();
    result
}

/// Tuning on a fresh cache, and the CLI's `--tune`.
pub fn trials(device: &Device, ignored: &Option<String>, trials: &mut Vec<Trial>) {
    let tune_trials: [(&str, DeviceTrial); 2] = [
        ("tune::gemm_f16_odd_sizes", tune_gemm),
        ("tune::attention_f16_gqa_causal_odd_sizes", tune_attention),
    ];
    for (name, f) in tune_trials {
        let d = device.clone();
        push(trials, ignored, name.into(), Box::new(move || f(&d)));
    }
    {
        let d = device.clone();
        let exe = rocmforge_binary();
        // The trial needs the CLI binary as well as a GPU: on the GPU machine under
        // ROCMFORGE_REQUIRE_GPU=1 an unstaged binary fails the trial rather than hiding it.
        let missing = exe.is_none().then(|| {
            "the rocmforge binary is not here (stage it: cp target/release/rocmforge .gpu/bin/)"
                .to_string()
        });
        push_needing(
            trials,
            ignored,
            missing,
            REQUIRE_GPU,
            "tune::cli_run_tune_and_cache_ls".into(),
            Box::new(move || tune_cli(&d, exe.as_deref().ok_or("no rocmforge binary")?)),
        );
    }
}
