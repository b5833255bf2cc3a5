//! `compile --model FILE.gguf --phase decode|prefill|batched`: the plan of a real model's step, made
//! without a GPU, checked against the library's own lowering, passes and codegen of the same
//! step; and the errors a user meets (missing file, not a GGUF, bad phase, no target).

use std::collections::{BTreeMap, HashSet};

use rocmforge::arch::Target;
use rocmforge::codegen::{self, CodegenOptions, KernelPlan};
use rocmforge::frontend::llama::Precision;
use rocmforge::frontend::LlamaModel;
use rocmforge::ir::DType;
use rocmforge::passes::PassManager;

use super::*;

/// The tiny GGUF (1 layer, context 64) written into `dir`.
fn tiny_model(dir: &Path) -> PathBuf {
    let path = dir.join("tiny.gguf");
    std::fs::write(&path, tiny_gguf::tiny_llama().to_bytes()).unwrap();
    path
}

/// The plan the library makes for `tokens` tokens of `model`, the way `generate` compiles it.
fn library_plan(model: &Path, tokens: usize, max_context: usize, p: Precision) -> KernelPlan {
    let m = LlamaModel::load(model).unwrap();
    let g = m.kv_graph(tokens, max_context, p, false).unwrap();
    // As a compile (and the CLI) does: the passes, then merged weights folded into one bound
    // weight (a 16-token prefill pairs gate/up since the GEMVs' row groups: without the fold
    // its interleaved weight would be concatenated by kernels of its own).
    let g = rocmforge::compile::optimise(&g, true).unwrap();
    let target = Target::parse("sm_90").unwrap();
    codegen::generate_with(&g, &target, &CodegenOptions::default()).unwrap()
}

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: not JSON:\n{out}"))
}

/// Decode with quantized blocks: the JSON summary counts what the library plans, plan.txt lists
/// every launch in order with its node, grid and block, and each distinct kernel has its .hip
/// file holding exactly the source the runtime would compile.
#[test]
fn compile_model_decode_writes_the_plan_and_counts_kernels_per_token() {
    let dir = scratch("model-decode");
    let model = tiny_model(&dir);
    let out_dir = dir.join("decode");
    let (ok, out, err) = rocmforge(&[
        "compile",
        "--model",
        model.to_str().unwrap(),
        "--phase",
        "decode",
        "--precision",
        "q",
        "--max-context",
        "48",
        "--target",
        "sm_90",
        "--emit",
        "hip",
        "--out",
        out_dir.to_str().unwrap(),
        "--json",
    ]);
    assert!(ok, "{err}");
    let v = json(&out);
    let plan = library_plan(&model, 1, 48, Precision::quantized(DType::F16));
    let n = plan.kernels.len();
    assert!(n > 0);
    assert_eq!(v["kernels"], n, "{v}");
    assert_eq!(v["kernels_per_token"].as_f64(), Some(n as f64), "{v}");
    assert_eq!(v["tokens"], 1);
    assert_eq!(v["max_context"], 48);
    assert_eq!(v["phase"], "decode");
    assert_eq!(v["precision"]["quantized"], true);
    assert_eq!(v["layers"], 1);
    // The one layer spans its first to its last launch binding a `blk.0.` weight or a layer-0
    // cache; the rest (embedding, final norm, head) is outside, and both were seen.
    let touches = |k: &rocmforge::codegen::Kernel| {
        k.args.iter().any(|&b| {
            let name = &plan.buffers[b].name;
            name.starts_with("blk.0.") || name == "cache.k.0" || name == "cache.v.0"
        })
    };
    let first = plan.kernels.iter().position(touches).unwrap();
    let last = plan.kernels.iter().rposition(touches).unwrap();
    let in_layer = last - first + 1;
    assert!(in_layer > 0 && in_layer < n, "{in_layer} of {n}");
    assert_eq!(v["kernels_per_layer"].as_f64(), Some(in_layer as f64));
    assert_eq!(v["kernels_outside_layers"], n - in_layer);
    let mut families = BTreeMap::new();
    for k in &plan.kernels {
        *families.entry(k.family.to_string()).or_insert(0usize) += 1;
    }
    let got: BTreeMap<String, usize> = serde_json::from_value(v["families"].clone()).unwrap();
    assert_eq!(got, families);
    let distinct: HashSet<&str> = plan.kernels.iter().map(|k| k.entry.as_str()).collect();
    assert_eq!(v["distinct_kernels"], distinct.len());
    // One .hip per distinct kernel, holding the whole source; nothing else but plan.txt.
    let mut files: Vec<String> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let mut expected: Vec<String> = distinct.iter().map(|e| format!("{e}.hip")).collect();
    expected.push("plan.txt".into());
    expected.sort();
    assert_eq!(files, expected);
    for k in &plan.kernels {
        let text = std::fs::read_to_string(out_dir.join(format!("{}.hip", k.entry))).unwrap();
        assert_eq!(text, plan.source(k), "{}", k.entry);
    }
    // plan.txt: a line per launch, in order, naming kernel, node, grid and block.
    let listing = std::fs::read_to_string(out_dir.join("plan.txt")).unwrap();
    let lines: Vec<&str> = listing.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(lines.len(), n, "{listing}");
    for (i, (line, k)) in lines.iter().zip(&plan.kernels).enumerate() {
        let g = k.launch.grid;
        let b = k.launch.block;
        let want = format!(
            "{i} {} %{} grid {}x{}x{} block {}x{}x{} ",
            k.entry,
            codegen::display_name(&k.node),
            g[0],
            g[1],
            g[2],
            b[0],
            b[1],
            b[2]
        );
        assert!(line.starts_with(&want), "{line:?} vs {want:?}");
        // Every bound buffer is listed, the written ones marked.
        let args = line.rsplit(' ').next().unwrap();
        assert_eq!(args.split(',').count(), k.args.len(), "{line}");
        assert_eq!(args.matches("(w)").count(), k.written().count(), "{line}");
    }
    assert!(
        err.contains(&format!("{n} kernels per token")),
        "stderr should say the kernels per token:\n{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Prefill of a 5-token prompt plans the bucket `generate` pads it to (16) and counts kernels
/// per token over it; without --emit or --json the launch list goes to stdout.
#[test]
fn compile_model_prefill_plans_the_prompt_bucket() {
    let dir = scratch("model-prefill");
    let model = tiny_model(&dir);
    let m = model.to_str().unwrap();
    let args = [
        "compile",
        "--model",
        m,
        "--phase",
        "prefill",
        "--prompt-len",
        "5",
        "--max-context",
        "64",
        "--precision",
        "f16",
        "--target",
        "sm_90",
    ];
    let (ok, out, err) = rocmforge(&[&args[..], &["--json"]].concat());
    assert!(ok, "{err}");
    let v = json(&out);
    let plan = library_plan(&model, 16, 64, Precision::F16);
    let n = plan.kernels.len();
    assert_eq!(v["tokens"], 16, "{v}");
    assert_eq!(v["prompt_len"], 5);
    assert_eq!(v["kernels"], n);
    assert_eq!(v["kernels_per_token"].as_f64(), Some(n as f64 / 16.0));
    assert_eq!(v["precision"]["quantized"], false);
    let (ok, out, err) = rocmforge(&args);
    assert!(ok, "{err}");
    assert_eq!(
        out.lines().filter(|l| !l.starts_with('#')).count(),
        n,
        "{out}"
    );
    // A decode plan differs from the prefill's (one token, not sixteen).
    let decode = library_plan(&model, 1, 64, Precision::F16);
    assert_ne!(
        decode.kernels.iter().map(|k| &k.entry).collect::<Vec<_>>(),
        plan.kernels.iter().map(|k| &k.entry).collect::<Vec<_>>()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--phase batched --batch 5`: serve's decode step of the bucket of 8 sequences through the
/// paged cache, the same launches as the library's paged graph of that bucket after the same
/// passes and codegen.
#[test]
fn compile_model_batched_plans_the_batch_bucket() {
    let dir = scratch("model-batched");
    let model = tiny_model(&dir);
    let m = model.to_str().unwrap();
    let (ok, out, err) = rocmforge(&[
        "compile",
        "--model",
        m,
        "--phase",
        "batched",
        "--batch",
        "5",
        "--max-context",
        "40",
        "--precision",
        "f16",
        "--target",
        "sm_90",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v = json(&out);
    let lm = LlamaModel::load(&model).unwrap();
    let pool = rocmforge::frontend::llama::PoolShape {
        num_blocks: 3 * 8,
        block_size: 16,
        max_blocks: 3,
    };
    let mut g = lm.paged_graph(8, 1, pool, Precision::F16, false).unwrap();
    PassManager::pipeline(true).run(&mut g).unwrap();
    // As a compile does: the gate/up weights concatenated once, not a kernel a step.
    rocmforge::compile::fold::fold_weight_concats(&mut g).unwrap();
    let target = Target::parse("sm_90").unwrap();
    let plan = codegen::generate_with(&g, &target, &CodegenOptions::default()).unwrap();
    assert_eq!(v["phase"], "batched", "{v}");
    assert_eq!(v["tokens"], 8, "{v}");
    assert_eq!(v["kernels"], plan.kernels.len(), "{v}");
    assert!(
        v["families"]["paged_decode"]
            .as_u64()
            .is_some_and(|n| n > 0),
        "{v}"
    );
    assert!(err.contains("a step of 8 sequences"), "{err}");
    // --batch belongs to the batched phase; a batch of none is refused.
    let (ok, _, err) = rocmforge(&["compile", "--model", m, "--batch", "4", "--target", "sm_90"]);
    assert_clean_error("batch for decode", ok, &err);
    assert!(err.contains("--phase batched"), "{err}");
    let (ok, _, err) = rocmforge(&[
        "compile", "--model", m, "--phase", "batched", "--batch", "0", "--target", "sm_90",
    ]);
    assert_clean_error("batch of none", ok, &err);
    let _ = std::fs::remove_dir_all(&dir);
}

/// What a user gets wrong is said in one line, without a panic.
#[test]
fn compile_model_errors_are_clear() {
    let dir = scratch("model-errors");
    let model = tiny_model(&dir);
    let m = model.to_str().unwrap();
    let missing = dir.join("missing.gguf");
    let (ok, _, err) = rocmforge(&[
        "compile",
        "--model",
        missing.to_str().unwrap(),
        "--target",
        "sm_90",
    ]);
    assert_clean_error("missing model", ok, &err);
    assert!(err.contains("missing.gguf"), "{err}");
    let (ok, _, err) = rocmforge(&[
        "compile",
        "--model",
        "graphs/attention.json",
        "--target",
        "sm_90",
    ]);
    assert_clean_error("a graph file as the model", ok, &err);
    assert!(err.to_lowercase().contains("gguf"), "{err}");
    // clap refuses an unknown phase with the ones it knows (usage error, exit 2).
    let (code, _, err) = rocmforge_code(
        &[
            "compile", "--model", m, "--phase", "sample", "--target", "sm_90",
        ],
        &[],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("decode") && err.contains("prefill"), "{err}");
    let (ok, _, err) = rocmforge(&["compile", "--model", m]);
    assert_clean_error("no target", ok, &err);
    assert!(err.contains("--target"), "{err}");
    let (ok, _, err) = rocmforge(&["compile", "--model", m, "--target", "gfx9999"]);
    assert_clean_error("unknown target", ok, &err);
    let (ok, _, err) = rocmforge(&[
        "compile",
        "--model",
        m,
        "--prompt-len",
        "4",
        "--target",
        "sm_90",
    ]);
    assert_clean_error("prompt length for decode", ok, &err);
    assert!(err.contains("--phase prefill"), "{err}");
    let (ok, _, err) = rocmforge(&[
        "compile",
        "--model",
        m,
        "--max-context",
        "65",
        "--target",
        "sm_90",
    ]);
    assert_clean_error("context past the model's", ok, &err);
    assert!(err.contains("1..=64"), "{err}");
    let (ok, _, err) = rocmforge(&[
        "compile",
        "--model",
        m,
        "--phase",
        "prefill",
        "--prompt-len",
        "65",
        "--target",
        "sm_90",
    ]);
    assert_clean_error("prompt past the context", ok, &err);
    let (ok, _, err) = rocmforge(&[
        "compile", "--model", m, "--target", "sm_90", "--emit", "bundle",
    ]);
    assert_clean_error("bundle of a model", ok, &err);
    assert!(err.contains("--emit hip"), "{err}");
    // A graph file and a model at once is a usage error.
    let (code, _, err) = rocmforge_code(&["compile", "graphs/attention.json", "--model", m], &[]);
    assert_eq!(code, Some(2), "{err}");
    let (ok, out, err) = rocmforge(&["compile", "--help"]);
    assert!(ok, "{err}");
    for part in [
        "--model",
        "--phase",
        "--prompt-len",
        "--precision",
        "--json",
        "Examples:",
    ] {
        assert!(out.contains(part), "compile --help lacks {part}:\n{out}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--megakernel`: the decode step is one persistent kernel whose source lists every launch of
/// the same command's per-kernel plan in order (kernel, node, grid, block), so a reviewer reads
/// what runs; one kernel per token, said on stderr and in the JSON.
#[test]
fn compile_model_megakernel_is_one_kernel_listing_every_step() {
    let dir = scratch("model-megakernel");
    let model = tiny_model(&dir);
    let run = |out_dir: &Path, extra: &[&str]| {
        let mut args = vec![
            "compile",
            "--model",
            model.to_str().unwrap(),
            "--phase",
            "decode",
            "--max-context",
            "48",
            "--target",
            "sm_90",
            "--emit",
            "hip",
            "--out",
            out_dir.to_str().unwrap(),
            "--json",
        ];
        args.extend_from_slice(extra);
        let (ok, out, err) = rocmforge(&args);
        assert!(ok, "{err}");
        (json(&out), err)
    };
    let (per_kernel, _) = run(&dir.join("per-kernel"), &[]);
    let (v, err) = run(&dir.join("decode"), &["--megakernel"]);
    assert_eq!(v["kernels"], 1, "{v}");
    assert_eq!(v["kernels_per_token"].as_f64(), Some(1.0), "{v}");
    assert!(err.contains("1 kernels per token"), "{err}");
    let files: Vec<PathBuf> = std::fs::read_dir(dir.join("decode"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "hip"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let source = std::fs::read_to_string(&files[0]).unwrap();
    let listing = std::fs::read_to_string(dir.join("per-kernel").join("plan.txt")).unwrap();
    let launches: Vec<&str> = listing.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(
        launches.len(),
        per_kernel["kernels"].as_u64().unwrap() as usize
    );
    for line in launches {
        // `i entry %node grid XxYxZ block Tx1x1 shared 0 buffers`
        let f: Vec<&str> = line.split(' ').collect();
        let threads = f[6].split('x').next().unwrap();
        let want = format!(
            "// step {}: {} for {}, grid {} block {threads},",
            f[0], f[1], f[2], f[4]
        );
        assert!(source.contains(&want), "missing {want:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
