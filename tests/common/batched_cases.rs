//! The batched generator against lone runs (`tests/batched.rs` on the CPU devices, the GPU
//! suite's `serve::` trials on a GPU): sequences started at different steps and decoded
//! together through one paged KV cache, teacher-forced with the tokens each sequence's lone
//! run through its contiguous cache (`generate::Generator`) chose, so every step's logits
//! compare; the pool's bookkeeping returns to empty.

use std::path::{Path, PathBuf};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rocmforge::frontend::llama::Precision;
use rocmforge::frontend::LlamaModel;
use rocmforge::generate::{GenerateOptions, Generator};
use rocmforge::runtime::Device;
use rocmforge::serve::batched::{BatchOptions, BatchedGenerator};

pub fn model_file(name: &str) -> PathBuf {
    let f = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/models")
        .join(name)
        .join("f32.gguf");
    assert!(f.exists(), "no model at {} (committed)", f.display());
    f
}

fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        num += (f64::from(g) - f64::from(w)).powi(2);
        den += f64::from(w).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// The top logit's lead over the second.
fn lead(x: &[f32]) -> f32 {
    let mut v = x.to_vec();
    v.sort_by(|a, b| b.total_cmp(a));
    v[0] - v[1]
}

/// A lone run: the tokens and every step's logits (`n` steps, the first from the prefill).
fn alone(file: &Path, device: &Device, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let options = GenerateOptions {
        precision: Precision::F32,
        max_context: 64,
        replay: false,
        logits: true,
    };
    let mut g = Generator::new(LlamaModel::load(file).unwrap(), device, options).unwrap();
    let mut rows = Vec::new();
    let mut sample = |l: &[f32]| {
        rows.push(l.to_vec());
        argmax(l)
    };
    // The sampler sees every step's logits, also one that ends in EOS (not returned).
    g.generate_with(prompt, n, Some(&mut sample), |_| true)
        .unwrap();
    let ids = rows.iter().map(|r| argmax(r)).collect();
    (ids, rows)
}

pub fn options(kv_memory: usize, max_batch: usize) -> BatchOptions {
    BatchOptions {
        precision: Precision::F32,
        max_context: 64,
        block_size: 4,
        kv_memory,
        max_batch,
        replay: false,
        logits: true,
    }
}

/// Bytes of one block of `file`'s model in f32 (every layer's K and V rows).
pub fn block_bytes(file: &Path, block_size: usize) -> usize {
    let m = LlamaModel::load(file).unwrap();
    let h = m.config.heads();
    m.config.num_hidden_layers * 2 * h.kv * h.dim * block_size * 4
}

fn prompts(vocab: usize) -> Vec<Vec<u32>> {
    let mut rng = StdRng::seed_from_u64(26);
    let mut draw =
        |n: usize| -> Vec<u32> { (0..n).map(|_| rng.random_range(2..vocab as u32)).collect() };
    let a = draw(9);
    // b shares a's first two full blocks (8 tokens) and goes on differently.
    let mut b = a[..8].to_vec();
    b.extend(draw(5));
    vec![a, b, draw(1), draw(17), draw(4)]
}

/// Five sequences of `name`'s f32 model (prompts of 1 to 17 tokens over blocks of 4, two
/// sharing two full blocks), three of them joining after two steps of the others, each step's
/// logits within `tol` (relative L2) of the lone run's and the argmax equal where its lead is
/// clear.
pub fn batch_matches_alone(name: &str, device: &Device, tol: f64) {
    let file = model_file(name);
    let vocab = LlamaModel::load(&file).unwrap().config.vocab_size;
    let prompts = prompts(vocab);
    let steps = 6;
    let lone: Vec<_> = prompts
        .iter()
        .map(|p| alone(&file, device, p, steps))
        .collect();
    let bytes = block_bytes(&file, 4) * 64;
    let model = LlamaModel::load(&file).unwrap();
    let mut bg = BatchedGenerator::new(
        model,
        device,
        options(bytes, 8),
        rocmforge::cpu::Precision::Exact,
    )
    .unwrap();
    let total = bg.num_blocks();
    // got[s][k]: sequence s's logits at its step k.
    let mut got: Vec<Vec<Vec<f32>>> = vec![Vec::new(); prompts.len()];
    // Sequences 0..2 start first; 2..5 join after two steps of those (continuous batching).
    let joins = [0usize, 0, 2, 2, 3];
    let mut done = [false; 5];
    for round in 0..steps + 3 {
        // Every started sequence not yet done advances by the token its lone run chose.
        let batch: Vec<(u64, u32)> = (0..prompts.len())
            .filter(|&s| joins[s] < round && got[s].len() < lone[s].1.len())
            .map(|s| (s as u64, lone[s].0[got[s].len() - 1]))
            .collect();
        let next = bg.step(&batch, true).unwrap();
        for (&(seq, _), n) in batch.iter().zip(next) {
            got[seq as usize].push(n.logits.expect("logits asked for"));
        }
        for s in 0..prompts.len() {
            if joins[s] == round {
                let n = bg.start(s as u64, &prompts[s], true).unwrap();
                assert_eq!(
                    n.token,
                    argmax(n.logits.as_ref().unwrap()),
                    "{name}: token is the argmax"
                );
                got[s].push(n.logits.unwrap());
            }
        }
        for s in 0..prompts.len() {
            if got[s].len() == lone[s].1.len() && !done[s] {
                bg.finish(s as u64).unwrap();
                done[s] = true;
            }
        }
    }
    for (s, (ids, rows)) in lone.iter().enumerate() {
        // A lone run that met EOS stopped there (its sampler saw that step's logits).
        assert!(
            rows.len() >= 2,
            "{name}: sequence {s} ran {} steps",
            rows.len()
        );
        assert_eq!(got[s].len(), rows.len(), "{name}: sequence {s} steps");
        let scale = rows[0].iter().fold(0.0f32, |a, b| a.max(b.abs()));
        for (k, (g, w)) in got[s].iter().zip(rows).enumerate() {
            let err = rel_l2(g, w);
            assert!(
                err <= tol,
                "{name} seq {s} step {k}: logits rel L2 {err:.2e}"
            );
            if lead(w) > 1e-3 * scale {
                assert_eq!(argmax(g), ids[k], "{name} seq {s} step {k}: token");
            }
        }
    }
    assert_eq!(bg.running(), 0, "{name}: every sequence finished");
    assert_eq!(
        bg.free_blocks(),
        total,
        "{name}: every block back in the pool"
    );
    bg.check().unwrap();
}
