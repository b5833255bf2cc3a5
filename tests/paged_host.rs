//! The serving plans' generated kernels run on this CPU (the AMD source compiled by the host's
//! clang++, `common/host_kernels.rs`) against the interpreter, on a real model's graph: a
//! prompt chunk of llama3-tiny (`LlamaModel::paged_chunk_graph`) at chunk sizes whose row
//! counts are not powers of two — the GEMVs' paired gate/up columns once split a pair across
//! blocks at M 3 and 5 and gave NaN logits on the GPU, which the CPU device (its own kernels)
//! and the interpreter could not show. Needs clang++ (CI installs clang-19); without one the
//! test fails and says so.

#[path = "common/host_kernels.rs"]
mod host_kernels;

use std::collections::HashMap;

use rocmforge::arch::Target;
use rocmforge::codegen::{self, CodegenOptions};
use rocmforge::frontend::llama::{io, paged_io, PoolShape, Precision};
use rocmforge::frontend::LlamaModel;
use rocmforge::interp::{self, Bindings};
use rocmforge::ir::{DType, Op, Shape, Tensor};
use rocmforge::passes::PassManager;

fn ints(dt: DType, dims: &[usize], v: Vec<i64>) -> Tensor {
    Tensor::from_i64(dt, Shape::new(dims.to_vec()), v).unwrap()
}

fn rel_l2(got: &Tensor, want: &Tensor) -> f64 {
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let num: f64 = g.iter().zip(&w).map(|(a, b)| (a - b) * (a - b)).sum();
    let den: f64 = w.iter().map(|a| a * a).sum();
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// A chunk of `s` rows at positions `done..done + s` of a sequence whose rows before `done` are
/// in the pools (seeded values), through blocks 0, 1, 2, ... of its table: the logits and the
/// token of the host run equal the interpreter's, and so do the pools it writes.
fn chunk_matches_interpreter(s: usize, done: usize, arch: &str) {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/models/llama3-tiny/f32.gguf");
    let m = LlamaModel::load(&file).unwrap();
    let pool = PoolShape {
        num_blocks: 32,
        block_size: 4,
        max_blocks: 16,
    };
    let mut g = m.paged_chunk_graph(s, pool, Precision::F32, true).unwrap();
    PassManager::pipeline(true).run(&mut g).unwrap();
    let plan = codegen::generate_with(
        &g,
        &Target::parse(arch).unwrap(),
        &CodegenOptions::default(),
    )
    .unwrap();
    let weights = m.weights_for(&g).unwrap();
    let end = done + s;
    let mut b = Bindings::random(&g, 3);
    b.weights = weights.clone();
    let ids = (0..s as i64).map(|i| (i * 37 + 3) % 256).collect();
    b.inputs
        .insert(io::INPUT_IDS.into(), ints(DType::I64, &[1, s], ids));
    let rows: Vec<i64> = (done as i64..end as i64).collect();
    b.inputs
        .insert(io::POSITIONS.into(), ints(DType::I32, &[s], rows.clone()));
    // Blocks 0.. in order: row r of the sequence is slot r.
    b.inputs
        .insert(paged_io::SLOTS.into(), ints(DType::I32, &[1, s], rows));
    let used = end.div_ceil(pool.block_size);
    let table = (0..pool.max_blocks as i64)
        .map(|j| if (j as usize) < used { j } else { 0 })
        .collect();
    b.inputs.insert(
        paged_io::BLOCK_TABLE.into(),
        ints(DType::I32, &[1, pool.max_blocks], table),
    );
    b.inputs
        .insert(io::KV_LEN.into(), ints(DType::I32, &[1], vec![end as i64]));
    let mut states = HashMap::new();
    for id in g.node_ids() {
        if let Op::State { .. } = g.op(id) {
            let ty = g.ty(id);
            let v: Vec<f64> = (0..ty.shape.numel())
                .map(|i| (i * 7919 % 1000) as f64 / 1000.0 - 0.5)
                .collect();
            let t = Tensor::from_f64(ty.dtype, ty.shape.clone(), &v).unwrap();
            states.insert(g.node(id).name.clone(), t);
        }
    }
    let (want, want_states) = interp::run_with_state(&g, &b, &weights, &states).unwrap();
    let cxx = host_kernels::host_cxx().unwrap_or_else(|e| panic!("no host C++ compiler: {e}"));
    let (got, got_states) = host_kernels::run_plan_with_states(&cxx, &g, &plan, &b, &states)
        .unwrap()
        .unwrap();
    let what = format!("chunk of {s} after {done} on {arch}");
    for (i, (gt, w)) in got.iter().zip(&want).enumerate() {
        let err = rel_l2(gt, w);
        assert!(err <= 1e-5, "{what}: output {i} relative L2 {err:e}");
    }
    for (name, w) in &want_states {
        let err = rel_l2(&got_states[name], w);
        assert!(err <= 1e-5, "{what}: pool {name} relative L2 {err:e}");
    }
}

#[test]
fn chunks_of_odd_row_counts_match_the_interpreter() {
    for (s, done) in [(5, 5), (3, 10), (7, 0)] {
        chunk_matches_interpreter(s, done, "gfx90a");
    }
}

/// A batched decode step (`LlamaModel::paged_graph`) of `lens.len()` sequences of `s` new rows
/// each, sequence b holding `lens[b]` keys once they are in: sequences 0 and 1 share block 0 (a
/// full prefix block, written by neither this step), every other block is a sequence's own, in
/// order from 1; the table's unused entries are −1. The new rows go to the slots the table puts
/// them at, except the rows `padding` names (sequence, row), whose slot is −1: their key is then
/// the pool's old row on both paths. The default pipeline makes the paged attention's append
/// form (`passes::PagedAppend`): the kernel rotates q, takes this step's rows from its operands
/// and writes them into the pools; its logits, tokens and pools equal the interpreter's.
/// The table reaches a block past the longest sequence. `splits` says whether the keys split
/// (long sequences, no window): then the blocks other than the writer take this step's rows
/// from the operands too.
fn step_matches_interpreter(
    model: &str,
    lens: &[usize],
    s: usize,
    padding: &[(usize, usize)],
    splits: bool,
) {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("tests/data/models/{model}/f32.gguf"));
    let m = LlamaModel::load(&file).unwrap();
    let longest = lens.iter().max().unwrap();
    let pool = PoolShape {
        num_blocks: lens.iter().map(|l| l.div_ceil(4)).sum::<usize>() + 3,
        block_size: 4,
        max_blocks: longest.div_ceil(4) + 1,
    };
    let seqs = lens.len();
    let mut g = m.paged_graph(seqs, s, pool, Precision::F32, true).unwrap();
    PassManager::pipeline(true).run(&mut g).unwrap();
    let appending = g
        .node_ids()
        .filter(|&id| {
            matches!(
                g.op(id),
                Op::PagedAttention {
                    append: Some(_),
                    ..
                }
            )
        })
        .count();
    assert_eq!(
        appending, m.config.num_hidden_layers,
        "{model}: every layer's attention appends"
    );
    let plan = codegen::generate_with(
        &g,
        &Target::parse("gfx90a").unwrap(),
        &CodegenOptions::default(),
    )
    .unwrap();
    let split = plan
        .kernels
        .iter()
        .any(|k| k.family == "paged_decode" && k.launch.grid[1] > 1);
    assert_eq!(split, splits, "{model}: the keys split or not as meant");
    for family in ["paged_cache_write", "rope"] {
        assert!(
            plan.kernels.iter().all(|k| k.family != family),
            "{model}: a {family} kernel is left"
        );
    }
    let bs = pool.block_size;
    let mut table = vec![-1i64; seqs * pool.max_blocks];
    let mut next = 1;
    for (b, &len) in lens.iter().enumerate() {
        for j in 0..len.div_ceil(bs) {
            table[b * pool.max_blocks + j] = if j == 0 && b < 2 {
                0
            } else {
                next += 1;
                next - 1
            };
        }
    }
    let (mut positions, mut slots) = (vec![], vec![]);
    for (b, &len) in lens.iter().enumerate() {
        for i in 0..s {
            let j = len - s + i;
            positions.push(j as i64);
            let slot = table[b * pool.max_blocks + j / bs] * bs as i64 + (j % bs) as i64;
            slots.push(if padding.contains(&(b, i)) { -1 } else { slot });
        }
    }
    let weights = m.weights_for(&g).unwrap();
    let rows = seqs * s;
    let mut bd = Bindings::random(&g, 11);
    bd.weights = weights.clone();
    let ids = (0..rows as i64).map(|i| (i * 37 + 5) % 256).collect();
    bd.inputs
        .insert(io::INPUT_IDS.into(), ints(DType::I64, &[1, rows], ids));
    bd.inputs
        .insert(io::POSITIONS.into(), ints(DType::I32, &[rows], positions));
    bd.inputs
        .insert(paged_io::SLOTS.into(), ints(DType::I32, &[1, rows], slots));
    bd.inputs.insert(
        paged_io::BLOCK_TABLE.into(),
        ints(DType::I32, &[seqs, pool.max_blocks], table),
    );
    let kv_len = lens.iter().map(|&l| l as i64).collect();
    bd.inputs
        .insert(io::KV_LEN.into(), ints(DType::I32, &[seqs], kv_len));
    let mut states = HashMap::new();
    for id in g.node_ids() {
        if let Op::State { .. } = g.op(id) {
            let ty = g.ty(id);
            let v: Vec<f64> = (0..ty.shape.numel())
                .map(|i| (i * 7919 % 1000) as f64 / 1000.0 - 0.5)
                .collect();
            let t = Tensor::from_f64(ty.dtype, ty.shape.clone(), &v).unwrap();
            states.insert(g.node(id).name.clone(), t);
        }
    }
    let (want, want_states) = interp::run_with_state(&g, &bd, &weights, &states).unwrap();
    let cxx = host_kernels::host_cxx().unwrap_or_else(|e| panic!("no host C++ compiler: {e}"));
    let (got, got_states) = host_kernels::run_plan_with_states(&cxx, &g, &plan, &bd, &states)
        .unwrap()
        .unwrap();
    let what = format!("{model}: {seqs} sequence(s) of {s} row(s)");
    for (i, (gt, w)) in got.iter().zip(&want).enumerate() {
        let err = rel_l2(gt, w);
        assert!(err <= 1e-5, "{what}: output {i} relative L2 {err:e}");
    }
    for (name, w) in &want_states {
        let err = rel_l2(&got_states[name], w);
        assert!(err <= 1e-5, "{what}: pool {name} relative L2 {err:e}");
    }
}

/// Four programs in all (CI's time): Llama 3's scaled rope at 3 sequences of 1 row (a shared
/// prefix, odd lengths); 2 rows a sequence with a padding row (the kernel's fresh-row test
/// compares slots, not only positions) over split keys; Mistral's sliding window (4 keys, so
/// its keys never split) at 5 sequences, and at sequences whose first blocks fall out of it.
#[test]
fn appending_steps_match_the_interpreter() {
    step_matches_interpreter("llama3-tiny", &[9, 7, 3], 1, &[], false);
    step_matches_interpreter("llama3-tiny", &[701, 300, 5], 2, &[(2, 0)], true);
    step_matches_interpreter("mistral-tiny", &[9, 7, 3, 13, 6], 1, &[], false);
    step_matches_interpreter("mistral-tiny", &[150, 7, 99], 1, &[], false);
}
