//! The batched generator (`serve::batched`, issue 26): sequences in one paged KV cache, started
//! at different steps and decoded together, against each sequence generated alone through
//! its contiguous cache (`generate::Generator`, the path `tests/llama_models.rs` checks against
//! transformers). Teacher-forced: every step of the batch is fed the token the lone run chose,
//! so every step's logits compare (relative L2 ≤ 1e-4 in f32) and the argmax must agree where
//! the lone run's lead is clear of f32 noise. On the interpreter and on the fast CPU device,
//! with blocks of 4 tokens (prompts across several blocks, shared prefixes, odd lengths), Q/K
//! norms (Qwen3) and Q/K/V biases (Qwen2) included; the pool's bookkeeping returns to empty.

use std::path::{Path, PathBuf};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rocmforge::frontend::llama::Precision;
use rocmforge::frontend::LlamaModel;
use rocmforge::generate::{GenerateOptions, Generator};
use rocmforge::runtime::Device;
use rocmforge::serve::batched::{BatchError, BatchOptions, BatchedGenerator};
use rocmforge::serve::kv_blocks::KvBlockError;

fn model_file(name: &str) -> PathBuf {
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

fn options(kv_memory: usize, max_batch: usize) -> BatchOptions {
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
fn block_bytes(file: &Path, block_size: usize) -> usize {
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

fn batch_matches_alone(name: &str, device: &Device) {
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
        let next = bg.step(&batch).unwrap();
        for (&(seq, _), n) in batch.iter().zip(next) {
            got[seq as usize].push(n.logits.expect("logits asked for"));
        }
        for s in 0..prompts.len() {
            if joins[s] == round {
                let n = bg.start(s as u64, &prompts[s]).unwrap();
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
                err <= 1e-4,
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

#[test]
fn batch_matches_alone_llama3_interp() {
    batch_matches_alone("llama3-tiny", &Device::interp());
}

#[test]
fn batch_matches_alone_llama3_cpu() {
    batch_matches_alone("llama3-tiny", &Device::cpu());
}

#[test]
fn batch_matches_alone_qwen3_cpu() {
    batch_matches_alone("qwen3-tiny", &Device::cpu());
}

#[test]
fn batch_matches_alone_qwen2_cpu() {
    batch_matches_alone("qwen2-tiny", &Device::cpu());
}

#[test]
fn out_of_blocks_changes_nothing_and_blocks_come_back() {
    let file = model_file("llama3-tiny");
    let device = Device::cpu();
    // 16 blocks of 4 tokens: exactly one sequence of the maximum context (64).
    let bytes = block_bytes(&file, 4) * 16;
    let model = LlamaModel::load(&file).unwrap();
    let mut bg = BatchedGenerator::new(
        model,
        &device,
        options(bytes, 4),
        rocmforge::cpu::Precision::Exact,
    )
    .unwrap();
    assert_eq!(bg.num_blocks(), 16);
    let long: Vec<u32> = (0..60).map(|i| 2 + i % 50).collect();
    let first = bg.start(1, &long).unwrap();
    assert_eq!(bg.free_blocks(), 1);
    // A second prompt of two blocks does not fit: refused, nothing taken.
    let e = bg.start(2, &[3, 4, 5, 6, 7]).unwrap_err();
    assert!(
        matches!(
            e,
            BatchError::Blocks(KvBlockError::OutOfBlocks { needed: 2, free: 1 })
        ),
        "{e}"
    );
    assert_eq!(bg.free_blocks(), 1);
    assert_eq!(bg.running(), 1);
    // A prompt of one block fits; then both need a block at the next step and one is left:
    // the step is refused whole.
    let mut t2 = bg.start(2, &[3, 4, 5, 6]).unwrap().token;
    assert_eq!(bg.free_blocks(), 0);
    let e = bg.step(&[(1, first.token), (2, t2)]).unwrap_err();
    assert!(
        matches!(e, BatchError::Blocks(KvBlockError::OutOfBlocks { .. })),
        "{e}"
    );
    // Preempting sequence 1 frees its blocks; sequence 2 goes on.
    bg.finish(1).unwrap();
    for _ in 0..5 {
        t2 = bg.step(&[(2, t2)]).unwrap()[0].token;
    }
    bg.finish(2).unwrap();
    assert_eq!(bg.free_blocks(), 16);
    bg.check().unwrap();
    // Unknown sequences and oversized batches are typed errors.
    assert!(matches!(
        bg.step(&[(9, 3)]),
        Err(BatchError::UnknownSequence(9))
    ));
    assert!(matches!(bg.finish(9), Err(BatchError::UnknownSequence(9))));
    let many: Vec<(u64, u32)> = (0..5).map(|i| (i, 3)).collect();
    assert!(matches!(
        bg.step(&many),
        Err(BatchError::BatchTooLarge { got: 5, max: 4 })
    ));
}

#[test]
fn bad_options_are_typed_errors() {
    let file = model_file("llama3-tiny");
    let device = Device::cpu();
    let load = || LlamaModel::load(&file).unwrap();
    let x = rocmforge::cpu::Precision::Exact;
    // Fewer blocks than one sequence of the maximum context needs.
    let small = block_bytes(&file, 4) * 15;
    let e = BatchedGenerator::new(load(), &device, options(small, 4), x)
        .err()
        .unwrap();
    assert!(
        matches!(
            e,
            BatchError::PoolTooSmall {
                blocks: 15,
                needed: 16,
                ..
            }
        ),
        "{e}"
    );
    let mut o = options(small * 2, 4);
    o.block_size = 0;
    let e = BatchedGenerator::new(load(), &device, o, x).err().unwrap();
    assert!(matches!(e, BatchError::Options { .. }), "{e}");
    // Mistral's sliding window (4 tokens in the tiny model) is not a paged attention's.
    let mistral = model_file("mistral-tiny");
    let e = BatchedGenerator::new(
        LlamaModel::load(&mistral).unwrap(),
        &device,
        options(1 << 24, 4),
        x,
    )
    .err()
    .unwrap();
    assert!(matches!(e, BatchError::SlidingWindow { window: 4 }), "{e}");
    // Bad prompts: empty, past the context, ids outside the vocabulary; nothing taken.
    let mut bg = BatchedGenerator::new(load(), &device, options(small * 2, 4), x).unwrap();
    let free = bg.free_blocks();
    assert!(bg.start(1, &[]).is_err());
    assert!(bg.start(1, &vec![3; 65]).is_err());
    assert!(bg.start(1, &[3, 1 << 30]).is_err());
    assert_eq!(bg.free_blocks(), free);
    assert_eq!(bg.running(), 0);
}
