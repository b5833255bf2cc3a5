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
use rocmforge::serve::batched::{BatchOptions, BatchedGenerator, Next};

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
        prefill_chunk: 0,
        tensor_core_gemv: true,
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

/// Prompts for the chunked prefill: lengths 37, 16 (four full blocks of 4), 9 and 1, and 23
/// whose first 12 tokens (three full blocks) are the first prompt's.
fn chunk_prompts(vocab: usize) -> Vec<Vec<u32>> {
    let mut rng = StdRng::seed_from_u64(2626);
    let mut draw =
        |n: usize| -> Vec<u32> { (0..n).map(|_| rng.random_range(2..vocab as u32)).collect() };
    let a = draw(37);
    let mut e = a[..12].to_vec();
    e.extend(draw(11));
    vec![a, draw(16), draw(9), draw(1), e]
}

/// Runs `seq`'s prefill in `bg` to its end (after `begin`): the next token's logits and the
/// tokens of each part.
fn prefill_all(bg: &mut BatchedGenerator, seq: u64) -> (Next, Vec<usize>) {
    let mut parts = Vec::new();
    loop {
        let p = bg.prefill(seq, true).unwrap();
        parts.push(p.tokens);
        if let Some(next) = p.next {
            return (next, parts);
        }
    }
}

/// Asserts `got` within `tol` (relative L2) of `want`, and the same argmax where `want`'s
/// lead is clear of f32 noise.
fn close(what: &str, got: &[f32], want: &[f32], tol: f64) {
    let err = rel_l2(got, want);
    assert!(err <= tol, "{what}: logits rel L2 {err:.2e}");
    let scale = want.iter().fold(0.0f32, |a, b| a.max(b.abs()));
    if lead(want) > 1e-3 * scale {
        assert_eq!(argmax(got), argmax(want), "{what}: token");
    }
}

/// The same prompts prefilled whole and in chunks of `chunk` tokens (odd sizes, prompts not
/// a multiple of the chunk, chunk ends on a block boundary and not, a shared prefix, a prompt
/// started while another is half prefilled), in two generators of the same pool: the token
/// after each prompt and its logits agree within `tol`, so do three decode steps of all of
/// them together (which read the K/V rows the chunks wrote), the block accounting is the same
/// after each prompt, and every block comes back.
#[allow(dead_code)] // the GPU trials call the replayed form
pub fn chunked_matches_whole(name: &str, device: &Device, chunk: usize, tol: f64) {
    chunked_matches_whole_replayed(name, device, chunk, tol, false)
}

/// [`chunked_matches_whole`] with the chunked generator's plans replayed where `replay` (on a
/// GPU: every chunk plan after its first run replays its captured launches, the whole prompts
/// run launch by launch).
pub fn chunked_matches_whole_replayed(
    name: &str,
    device: &Device,
    chunk: usize,
    tol: f64,
    replay: bool,
) {
    let file = model_file(name);
    let vocab = LlamaModel::load(&file).unwrap().config.vocab_size;
    let bytes = block_bytes(&file, 4) * 128;
    let x = rocmforge::cpu::Precision::Exact;
    let load = || LlamaModel::load(&file).unwrap();
    let mut whole = BatchedGenerator::new(load(), device, options(bytes, 8), x).unwrap();
    let mut o = options(bytes, 8);
    o.prefill_chunk = chunk;
    o.replay = replay;
    let mut chunked = BatchedGenerator::new(load(), device, o, x).unwrap();
    let total = chunked.num_blocks();
    let prompts = chunk_prompts(vocab);
    let mut last = Vec::new();
    for (s, p) in prompts.iter().enumerate() {
        let seq = s as u64;
        let want = whole.start(seq, p, true).unwrap();
        chunked.begin(seq, p).unwrap();
        let (got, parts) = prefill_all(&mut chunked, seq);
        let what = format!("{name} chunk {chunk} prompt {s} ({} tokens)", p.len());
        // The shared prefix (prompt 4: 12 tokens) is not computed again.
        let cached = if s == 4 { 12 } else { 0 };
        if p.len() > chunk {
            assert!(parts.iter().all(|&t| t <= chunk), "{what}: {parts:?}");
            assert_eq!(parts.iter().sum::<usize>(), p.len() - cached, "{what}");
        } else {
            assert_eq!(parts, [p.len()], "{what}");
        }
        close(
            &what,
            got.logits.as_ref().unwrap(),
            want.logits.as_ref().unwrap(),
            tol,
        );
        assert_eq!(got.token, argmax(got.logits.as_ref().unwrap()), "{what}");
        assert_eq!(chunked.free_blocks(), whole.free_blocks(), "{what}: blocks");
        chunked.check().unwrap();
        last.push(want.token);
    }
    // A prompt sharing a new prompt's opening 12 tokens begins while that one is half
    // prefilled: it shares only blocks whose rows are in (sharing the others would read rows
    // not written yet, and its logits would show it).
    let (twin, late) = (prompts.len() as u64, prompts.len() as u64 + 1);
    let mut rng = StdRng::seed_from_u64(77);
    let twin_p: Vec<u32> = (0..37).map(|_| rng.random_range(2..vocab as u32)).collect();
    let mut late_p = twin_p[..12].to_vec();
    late_p.extend([5, 6, 7]);
    chunked.begin(twin, &twin_p).unwrap();
    let first = chunked.prefill(twin, true).unwrap();
    assert!(first.next.is_none() || twin_p.len() <= chunk);
    let want_late = whole.start(late, &late_p, true).unwrap();
    let got_late = chunked.start(late, &late_p, true).unwrap();
    let want_twin = whole.start(twin, &twin_p, true).unwrap();
    let got_twin = match first.next {
        Some(n) => n,
        None => prefill_all(&mut chunked, twin).0,
    };
    for (what, got, want) in [
        ("late", &got_late, &want_late),
        ("twin", &got_twin, &want_twin),
    ] {
        close(
            &format!("{name} chunk {chunk}: the {what} prompt"),
            got.logits.as_ref().unwrap(),
            want.logits.as_ref().unwrap(),
            tol,
        );
    }
    last.push(want_twin.token);
    last.push(want_late.token);
    chunked.check().unwrap();
    let seqs = last.len();
    for step in 0..3 {
        let batch: Vec<(u64, u32)> = (0..seqs).map(|s| (s as u64, last[s])).collect();
        let want = whole.step(&batch, true).unwrap();
        let got = chunked.step(&batch, true).unwrap();
        for (s, (g, w)) in got.iter().zip(&want).enumerate() {
            let what = format!("{name} chunk {chunk} seq {s} step {step}");
            close(
                &what,
                g.logits.as_ref().unwrap(),
                w.logits.as_ref().unwrap(),
                tol,
            );
            last[s] = w.token;
        }
    }
    for s in 0..seqs {
        chunked.finish(s as u64).unwrap();
    }
    assert_eq!(chunked.running(), 0, "{name}: every sequence finished");
    assert_eq!(chunked.free_blocks(), total, "{name}: every block back");
    chunked.check().unwrap();
}
