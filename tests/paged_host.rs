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
