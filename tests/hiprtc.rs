//! Every generated kernel of every example graph, fused and unfused, compiles with a real AMD
//! compiler (hiprtc) for gfx90a and gfx1030, and none spills. The resource reports are
//! snapshots. The metadata reader is tested on a real code object and on truncated and corrupt
//! ones.
//!
//! Without hiprtc these tests are reported as ignored, with the reason. `ROCMFORGE_REQUIRE_HIPRTC=1`
//! (set by `.ci/run`) turns that into a failure, so CI always compiles them.

#[path = "common/files.rs"]
mod files;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use libtest_mimic::{Arguments, Failed, Trial};
use rayon::prelude::*;
use rocmforge::codegen::{generate_with, mma_probe_kernel, CodegenOptions, Target};
use rocmforge::ir::format;
use rocmforge::passes::PassManager;
use rocmforge::runtime::{parse_code_object, report_table, Hiprtc, MetadataError};

#[path = "common/op_zoo.rs"]
mod op_zoo;

const AMD_TARGETS: [&str; 2] = ["gfx90a", "gfx1030"];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Compiles every kernel of every graph for one target (unique sources once); returns
/// (node, resources) per kernel, or the spills and failures.
fn compile_all(
    rtc: &Hiprtc,
    graphs: &[rocmforge::ir::Graph],
    fused: bool,
    arch: &str,
) -> Result<Vec<(String, rocmforge::runtime::KernelResources)>, Failed> {
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    let mut unique: HashMap<String, (String, String)> = HashMap::new();
    for g in graphs {
        let plan = generate_with(
            g,
            &target,
            &CodegenOptions {
                matmul_epilogues: fused,
            },
        )
        .map_err(|e| format!("{}: {e}", g.name))?;
        for k in &plan.kernels {
            unique
                .entry(k.entry.clone())
                .or_insert_with(|| (plan.source(k), k.node.clone()));
        }
    }
    let mut entries: Vec<_> = unique.into_iter().collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let compiled: Vec<Result<(String, rocmforge::runtime::KernelResources), String>> = entries
        .par_iter()
        .map(|(entry, (src, node))| {
            let code = rtc
                .compile(src, entry, arch, &["-O3".to_string()])
                .map_err(|e| e.to_string())?;
            let info = parse_code_object(&code).map_err(|e| format!("{entry}: {e}"))?;
            let k = info
                .kernels
                .into_iter()
                .find(|r| &r.name == entry)
                .ok_or(format!("{entry} not in its code object"))?;
            Ok((node.clone(), k))
        })
        .collect();
    let rows = compiled.into_iter().collect::<Result<Vec<_>, _>>()?;
    let spilling: Vec<String> = rows
        .iter()
        .filter(|(_, r)| r.spills())
        .map(|(n, r)| format!("{} (%{n}): {r:?}", r.name))
        .collect();
    if !spilling.is_empty() {
        return Err(format!("kernels spill on {arch}:\n{}", spilling.join("\n")).into());
    }
    let wave = target.wave_size as u64;
    if let Some((_, bad)) = rows.iter().find(|(_, r)| r.wave_size != wave) {
        return Err(format!("{} reports wave {} on {arch}", bad.name, bad.wave_size).into());
    }
    Ok(rows)
}

fn compile_graph(rtc: &Hiprtc, path: &Path, fused: bool, arch: &str) -> Result<(), Failed> {
    let mut g = format::load(path).map_err(|e| e.to_string())?;
    let pm = if fused {
        PassManager::default_pipeline()
    } else {
        PassManager::cleanup()
    };
    pm.run(&mut g).map_err(|e| e.to_string())?;
    let rows = compile_all(rtc, &[g], fused, arch)?;
    let name = path.file_stem().unwrap().to_string_lossy().into_owned();
    let mode = if fused { "fused" } else { "unfused" };
    let table = report_table(&rows);
    let result = std::panic::catch_unwind(|| {
        files::snapshot_settings()
            .bind(|| insta::assert_snapshot!(format!("resources__{name}__{mode}__{arch}"), table))
    });
    result.map_err(|_| {
        Failed::from(format!(
            "resource report of {name} ({mode}, {arch}) differs from its snapshot"
        ))
    })
}

/// The MMA probe kernel of every matrix atom of `arch` (the fragment helpers generated into its
/// prelude) compiles with hiprtc without spilling.
fn mma_probes(rtc: &Hiprtc, arch: &str) -> Result<(), Failed> {
    let target = Target::parse(arch).map_err(|e| e.to_string())?;
    for atom in target.caps.mma {
        let probe = mma_probe_kernel(&target, atom).map_err(|e| e.to_string())?;
        let code = rtc
            .compile(&probe.source, &probe.entry, arch, &["-O3".to_string()])
            .map_err(|e| e.to_string())?;
        let info = parse_code_object(&code).map_err(|e| e.to_string())?;
        match info.kernels.iter().find(|k| k.name == probe.entry) {
            Some(k) if !k.spills() => {}
            Some(k) => return Err(format!("{} spills on {arch}: {k:?}", probe.entry).into()),
            None => return Err(format!("{} not in its code object", probe.entry).into()),
        }
    }
    Ok(())
}

fn metadata_reader_on_real_and_corrupt_input() -> Result<(), Failed> {
    let bytes = std::fs::read(root().join("tests/data/code_objects/add_gfx90a.co"))
        .map_err(|e| e.to_string())?;
    let info = parse_code_object(&bytes).map_err(|e| e.to_string())?;
    if !info.target.ends_with("gfx90a")
        || info.kernels.len() != 1
        || info.kernels[0].name != "add"
        || info.kernels[0].wave_size != 64
    {
        return Err(format!("unexpected metadata: {info:?}").into());
    }
    if info.kernels[0].vgprs == 0 || info.kernels[0].sgprs == 0 || info.kernels[0].lds_bytes != 1024
    {
        return Err(format!("implausible resources: {:?}", info.kernels[0]).into());
    }
    // Every truncation gives a typed error, or (when it only cuts bytes the reader never needs)
    // the same metadata; corruptions give an error or some parse, never a panic.
    for cut in (0..bytes.len()).step_by(7) {
        match parse_code_object(&bytes[..cut]) {
            Err(_) => {}
            Ok(same) if same == info => {}
            Ok(other) => {
                return Err(
                    format!("truncated to {cut} bytes, the metadata changed: {other:?}").into(),
                )
            }
        }
    }
    if parse_code_object(&bytes[..bytes.len() / 2]).is_ok() {
        return Err("a code object cut in half parsed".into());
    }
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..2000 {
        let mut b = bytes.clone();
        for _ in 0..4 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let i = (state % b.len() as u64) as usize;
            b[i] = (state >> 32) as u8;
        }
        let _ = parse_code_object(&b);
    }
    if parse_code_object(b"not an elf") != Err(MetadataError::NotElf) {
        return Err("plain text is not reported as NotElf".into());
    }
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let required = std::env::var("ROCMFORGE_REQUIRE_HIPRTC").is_ok_and(|v| v == "1");
    let rtc = Hiprtc::load().map(Arc::new);
    type Body = Box<dyn FnOnce(&Hiprtc) -> Result<(), Failed> + Send>;
    // A trial that needs hiprtc: run, failed (hiprtc required but missing) or ignored.
    let trial = |name: String, body: Body| -> Trial {
        match &rtc {
            Ok(rtc) => {
                let rtc = Arc::clone(rtc);
                Trial::test(name, move || body(&rtc))
            }
            Err(e) if required => {
                let msg = format!("ROCMFORGE_REQUIRE_HIPRTC=1 but {e}");
                Trial::test(name, move || Err(msg.clone().into()))
            }
            Err(e) => Trial::test(name, || Ok(()))
                .with_ignored_flag(true)
                .with_kind(format!("ignored: {e}")),
        }
    };
    let mut trials = vec![
        Trial::test(
            "metadata_reader_on_real_and_corrupt_input",
            metadata_reader_on_real_and_corrupt_input,
        ),
        trial(
            "compile::gfx90a::mma_probes".into(),
            Box::new(|rtc| mma_probes(rtc, "gfx90a")),
        ),
    ];
    for arch in AMD_TARGETS {
        trials.push(trial(
            format!("compile::{arch}::every_op_and_dtype"),
            Box::new(move |rtc| compile_all(rtc, &op_zoo::zoo(), true, arch).map(|_| ())),
        ));
        for path in files::graph_files() {
            for fused in [true, false] {
                let name = format!(
                    "compile::{arch}::{}::{}",
                    path.file_stem().unwrap().to_string_lossy(),
                    if fused { "fused" } else { "unfused" }
                );
                let path = path.clone();
                trials.push(trial(
                    name,
                    Box::new(move |rtc| compile_graph(rtc, &path, fused, arch)),
                ));
            }
        }
    }
    libtest_mimic::run(&args, trials).exit();
}
