//! `rocmforge compile --model FILE.gguf --phase decode|prefill|batched`: the plan a LLaMA-class
//! model runs (the graph `generate` or `serve` compiles, after the same passes and codegen) for a
//! target, without a GPU: the launch list, the kernel sources, the resource report, and a summary
//! with the kernels per token.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::path::Path;

use rocmforge::arch::Target;
use rocmforge::codegen::{self, display_name, Access, KernelPlan};
use rocmforge::compile::report;
use rocmforge::frontend::llama::{PoolShape, Precision};
use rocmforge::frontend::LlamaModel;
use rocmforge::generate::prompt_bucket;
use rocmforge::ir::DType;
use rocmforge::serve::batched::BLOCK_SIZE;
use serde::Serialize;

use crate::compile::{optimise, resource_report, write_sources, CodegenArgs};

/// What `generate` runs per token after the prompt, the prompt's one pass, or `serve`'s decode
/// step of a batch of sequences through the paged KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Phase {
    Decode,
    Prefill,
    Batched,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Phase::Decode => "decode",
            Phase::Prefill => "prefill",
            Phase::Batched => "batched",
        })
    }
}

impl Phase {
    pub(crate) fn parse(s: &str) -> Result<Phase, String> {
        match s {
            "decode" => Ok(Phase::Decode),
            "prefill" => Ok(Phase::Prefill),
            "batched" => Ok(Phase::Batched),
            other => Err(format!(
                "unknown phase {other:?}: expected decode, prefill or batched"
            )),
        }
    }
}

/// The model half of `compile`'s arguments.
pub(crate) struct ModelArgs<'a> {
    pub(crate) model: &'a Path,
    pub(crate) phase: Phase,
    pub(crate) prompt_len: Option<usize>,
    /// With `Phase::Batched`: the sequences of the step (its plan is of their bucket).
    pub(crate) batch: Option<u16>,
    pub(crate) max_context: Option<usize>,
    /// `f32`, `f16`, or `q`/`q4` (the file's blocks kept, f16 activations as on a GPU).
    pub(crate) precision: &'a str,
    pub(crate) json: bool,
}

/// `generate`'s KV cache length on a GPU, the default here (capped at the model's limit).
const DEFAULT_MAX_CONTEXT: usize = 2048;
/// The prompt length `--phase prefill` assumes without `--prompt-len`.
const DEFAULT_PROMPT_LEN: usize = 128;
/// The sequences `--phase batched` assumes without `--batch`.
const DEFAULT_BATCH: usize = 32;

/// `compile --model --json`.
#[derive(Serialize)]
struct Summary {
    model: String,
    phase: Phase,
    target: String,
    precision: Precision,
    /// Tokens the step computes: 1 for decode, the padded prompt bucket for prefill, the
    /// batch bucket for batched.
    tokens: usize,
    /// The prompt length asked for (prefill), before padding to `tokens`.
    prompt_len: Option<usize>,
    max_context: usize,
    layers: usize,
    nodes_before: usize,
    nodes_after: usize,
    fused_nodes: usize,
    /// Kernel launches of one run of the plan, in order.
    kernels: usize,
    /// Distinct kernels (by entry: identical bodies share one).
    distinct_kernels: usize,
    /// `kernels / tokens`: for decode, the launches every generated token costs.
    kernels_per_token: f64,
    /// Launches whose node belongs to a layer (`blk.N.`), divided by the layers.
    kernels_per_layer: f64,
    /// Launches outside the layers (embedding, final norm, LM head, argmax).
    kernels_outside_layers: usize,
    /// Launches per kernel family.
    families: BTreeMap<&'static str, usize>,
    /// Where `--emit hip` wrote the sources and plan.txt.
    out: Option<String>,
}

pub(crate) fn cmd_compile_model(
    m: &ModelArgs<'_>,
    dump: bool,
    explain: bool,
    no_fuse: bool,
    cg: CodegenArgs,
) -> Result<(), String> {
    if cg.bundle.is_some() {
        return Err("--emit bundle takes a graph file; with --model use --emit hip".into());
    }
    let Some(arch) = cg.target else {
        return Err(
            "--model needs --target ARCH: the plan is made for one target (e.g. --target \
             sm_90 or --target gfx90a)"
                .into(),
        );
    };
    if m.phase != Phase::Prefill && m.prompt_len.is_some() {
        return Err(
            "--prompt-len applies to --phase prefill: a decode step's plan is the same at every \
             position"
                .into(),
        );
    }
    if m.phase != Phase::Batched && m.batch.is_some() {
        return Err("--batch applies to --phase batched (serve's decode step of a batch)".into());
    }
    // With --report, hiprtc's own list of targets decides first (as for graph files).
    let target = if cg.report {
        report::report_target(arch, cg.compiler).map_err(|e| e.to_string())?
    } else {
        Target::parse(arch).map_err(|e| e.to_string())?
    };
    let model = LlamaModel::load(m.model).map_err(|e| e.to_string())?;
    let limit = model.config.max_position_embeddings;
    let max_context = m.max_context.unwrap_or(DEFAULT_MAX_CONTEXT.min(limit));
    if max_context == 0 || max_context > limit {
        return Err(format!(
            "--max-context {max_context} is outside 1..={limit} (the model's context length)"
        ));
    }
    let (tokens, prompt_len) = match m.phase {
        Phase::Decode => (1, None),
        Phase::Batched => {
            let n = m.batch.map_or(DEFAULT_BATCH, usize::from);
            if n == 0 {
                return Err("--batch 0: a step decodes at least one sequence".into());
            }
            // The bucket `serve` runs a step of n sequences in.
            (n.next_power_of_two(), None)
        }
        Phase::Prefill => {
            let n = m.prompt_len.unwrap_or(DEFAULT_PROMPT_LEN.min(max_context));
            if n == 0 || n > max_context {
                return Err(format!(
                    "--prompt-len {n} is outside 1..={max_context} (the maximum context)"
                ));
            }
            (prompt_bucket(n, max_context), Some(n))
        }
    };
    let precision = match m.precision {
        "f32" => Precision::F32,
        "f16" => Precision::F16,
        // The blocks as `generate --dtype q4` keeps them on a GPU: f16 activations.
        _ => Precision::quantized(DType::F16),
    };
    let mut graph = match m.phase {
        Phase::Decode | Phase::Prefill => model.kv_graph(tokens, max_context, precision, false),
        Phase::Batched => {
            // Every sequence can reach the maximum context: the pool's size does not change
            // the plan's kernels, only a buffer's length.
            let max_blocks = max_context.div_ceil(BLOCK_SIZE);
            let pool = PoolShape {
                num_blocks: max_blocks * tokens,
                block_size: BLOCK_SIZE,
                max_blocks,
            };
            model.paged_graph(tokens, 1, pool, precision, false)
        }
    }
    .map_err(|e| e.to_string())?;
    let nodes_before = graph.node_count();
    optimise(&mut graph, dump, explain, no_fuse)?;
    let plan = codegen::generate_with(&graph, &target, &cg.options()).map_err(|e| e.to_string())?;
    let distinct = plan
        .kernels
        .iter()
        .map(|k| k.entry.as_str())
        .collect::<HashSet<_>>()
        .len();
    let layers = model.config.num_hidden_layers;
    let in_layers = launches_in_layers(&plan, layers);
    let mut families = BTreeMap::new();
    for k in &plan.kernels {
        *families.entry(k.family).or_insert(0) += 1;
    }
    let summary = Summary {
        model: m.model.display().to_string(),
        phase: m.phase,
        target: target.arch.to_string(),
        precision,
        tokens,
        prompt_len,
        max_context,
        layers,
        nodes_before,
        nodes_after: graph.node_count(),
        fused_nodes: graph
            .node_ids()
            .filter(|&id| graph.op(id).is_fused())
            .count(),
        kernels: plan.kernels.len(),
        distinct_kernels: distinct,
        kernels_per_token: plan.kernels.len() as f64 / tokens as f64,
        kernels_per_layer: if layers > 0 {
            in_layers as f64 / layers as f64
        } else {
            0.0
        },
        kernels_outside_layers: plan.kernels.len() - in_layers,
        families,
        out: cg.emit_dir.map(|d| d.display().to_string()),
    };
    let listing = launch_table(&plan, &summary);
    if let Some(dir) = cg.emit_dir {
        let written = write_sources(&plan, dir)?;
        std::fs::write(dir.join("plan.txt"), &listing)
            .map_err(|e| format!("cannot write {}: {e}", dir.join("plan.txt").display()))?;
        eprintln!(
            "wrote {written} kernel source(s) for {} launch(es) and plan.txt to {}",
            plan.kernels.len(),
            dir.display()
        );
    }
    if m.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&summary).map_err(|e| e.to_string())?
        );
    } else if cg.emit_dir.is_none() && !cg.report {
        out!("{listing}");
    }
    eprintln!("{}", headline(&summary));
    if cg.report {
        resource_report(&graph, &plan, &target, cg.compiler)?;
    }
    Ok(())
}

/// The layer a buffer belongs to: `N` of a weight named `blk.N.…` (the GGUF tensor names) or
/// of a KV cache state `cache.k.N` / `cache.v.N`. Computed nodes have generic names.
fn layer_of(buffer: &str) -> Option<usize> {
    let n = buffer
        .strip_prefix("blk.")
        .or_else(|| buffer.strip_prefix("cache.k."))
        .or_else(|| buffer.strip_prefix("cache.v."))?;
    n.split('.').next()?.parse().ok()
}

/// Launches that belong to a layer: layer N spans its first to its last launch binding one of
/// its weights or caches, so what runs between (RoPE, the attention combine) counts for it;
/// the embedding before the first span and the head after the last are outside.
fn launches_in_layers(plan: &KernelPlan, layers: usize) -> usize {
    let mut spans: Vec<Option<(usize, usize)>> = vec![None; layers];
    for (i, k) in plan.kernels.iter().enumerate() {
        for &b in &k.args {
            if let Some(span) = layer_of(&plan.buffers[b].name).and_then(|l| spans.get_mut(l)) {
                let (first, _) = span.unwrap_or((i, i));
                *span = Some((first, i));
            }
        }
    }
    (0..plan.kernels.len())
        .filter(|&i| spans.iter().flatten().any(|&(a, b)| a <= i && i <= b))
        .count()
}

/// One line: what was planned and what it costs per token.
fn headline(s: &Summary) -> String {
    let per_token = match s.phase {
        Phase::Decode => format!("{} kernels per token", s.kernels),
        Phase::Batched => format!(
            "{} kernels a step of {} sequences ({:.2} per token)",
            s.kernels, s.tokens, s.kernels_per_token
        ),
        Phase::Prefill => format!(
            "{:.2} kernels per token over a bucket of {}",
            s.kernels_per_token, s.tokens
        ),
    };
    format!(
        "{} of {} on {}: {} launch(es) of {} distinct kernel(s), {per_token}; {:.1} per layer \
         x {} layers + {} outside; {} -> {} nodes ({} fused)",
        s.phase,
        Path::new(&s.model)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        s.target,
        s.kernels,
        s.distinct_kernels,
        s.kernels_per_layer,
        s.layers,
        s.kernels_outside_layers,
        s.nodes_before,
        s.nodes_after,
        s.fused_nodes,
    )
}

/// plan.txt: every launch in order, one line each (index, kernel entry, node, grid, block,
/// shared memory, buffers with the written ones marked); the sources are the .hip files.
fn launch_table(plan: &KernelPlan, s: &Summary) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# rocmforge launch plan: {} ({}, {} token(s), max context {}), target {}, {}{}",
        display_name(&s.model),
        s.phase,
        s.tokens,
        s.max_context,
        s.target,
        s.precision.dtype,
        if s.precision.quantized {
            " with quantized blocks"
        } else {
            ""
        }
    );
    let _ = writeln!(
        out,
        "# {} launch(es), {} distinct kernel(s), {:.2} kernel(s) per token, {:.1} per layer",
        s.kernels, s.distinct_kernels, s.kernels_per_token, s.kernels_per_layer
    );
    let _ = writeln!(out, "# index kernel node grid block shared buffers");
    for (i, k) in plan.kernels.iter().enumerate() {
        let args: Vec<String> = k
            .args
            .iter()
            .zip(&k.access)
            .map(|(&b, a)| {
                let name = display_name(&plan.buffers[b].name);
                match a {
                    Access::Write => format!("%{name}(w)"),
                    Access::Read => format!("%{name}"),
                }
            })
            .collect();
        let dims = |d: [u32; 3]| format!("{}x{}x{}", d[0], d[1], d[2]);
        let _ = writeln!(
            out,
            "{i} {} %{} grid {} block {} shared {} {}",
            k.entry,
            display_name(&k.node),
            dims(k.launch.grid),
            dims(k.launch.block),
            k.launch.shared_bytes,
            args.join(",")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_of_reads_the_block_index() {
        assert_eq!(layer_of("blk.0.attn_q.weight"), Some(0));
        assert_eq!(layer_of("blk.29.ffn_down.weight"), Some(29));
        assert_eq!(layer_of("cache.k.7"), Some(7));
        assert_eq!(layer_of("cache.v.12"), Some(12));
        assert_eq!(layer_of("output_norm.weight"), None);
        assert_eq!(layer_of("blk.x.attn_q"), None);
        assert_eq!(layer_of("token_embd.weight"), None);
        assert_eq!(layer_of("gemm_1030"), None);
    }

    #[test]
    fn phases_parse_and_refuse_others() {
        assert_eq!(Phase::parse("decode"), Ok(Phase::Decode));
        assert_eq!(Phase::parse("prefill"), Ok(Phase::Prefill));
        assert_eq!(Phase::parse("batched"), Ok(Phase::Batched));
        assert!(Phase::parse("Decode").is_err());
    }
}
