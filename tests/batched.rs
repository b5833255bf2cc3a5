//! The batched generator (`serve::batched`, issue 26): sequences in one paged KV cache, started
//! at different steps and decoded together, against each sequence generated alone through
//! its contiguous cache (`generate::Generator`, the path `tests/llama_models.rs` checks against
//! transformers). Teacher-forced: every step of the batch is fed the token the lone run chose,
//! so every step's logits compare (relative L2 ≤ 1e-4 in f32) and the argmax must agree where
//! the lone run's lead is clear of f32 noise. On the interpreter and on the fast CPU device,
//! with blocks of 4 tokens (prompts across several blocks, shared prefixes, odd lengths), Q/K
//! norms (Qwen3) and Q/K/V biases (Qwen2) included; the pool's bookkeeping returns to empty.
//! The same cases run on a GPU in the GPU suite (`serve::`).

#[path = "common/batched_cases.rs"]
mod batched_cases;

use batched_cases::{batch_matches_alone, block_bytes, model_file, options};
use rocmforge::arch::Target;
use rocmforge::codegen;
use rocmforge::frontend::llama::{PoolShape, Precision};
use rocmforge::frontend::LlamaModel;
use rocmforge::runtime::Device;
use rocmforge::serve::batched::{BatchError, BatchedGenerator};
use rocmforge::serve::kv_blocks::KvBlockError;

#[test]
fn batch_matches_alone_llama3_interp() {
    batch_matches_alone("llama3-tiny", &Device::interp(), 1e-4);
}

#[test]
fn batch_matches_alone_llama3_cpu() {
    batch_matches_alone("llama3-tiny", &Device::cpu(), 1e-4);
}

#[test]
fn batch_matches_alone_qwen3_cpu() {
    batch_matches_alone("qwen3-tiny", &Device::cpu(), 1e-4);
}

#[test]
fn batch_matches_alone_qwen2_cpu() {
    batch_matches_alone("qwen2-tiny", &Device::cpu(), 1e-4);
}

/// Mistral's sliding window (4 tokens in the tiny model, blocks of 4): the paged attention's
/// window attribute against the contiguous cache's; prompts longer than the window, so the
/// first blocks of a sequence fall out of it.
#[test]
fn batch_matches_alone_mistral_interp() {
    batch_matches_alone("mistral-tiny", &Device::interp(), 1e-4);
}

#[test]
fn batch_matches_alone_mistral_cpu() {
    batch_matches_alone("mistral-tiny", &Device::cpu(), 1e-4);
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
    let first = bg.start(1, &long, true).unwrap();
    assert_eq!(bg.free_blocks(), 1);
    // A second prompt of two blocks does not fit: refused, nothing taken.
    let e = bg.start(2, &[3, 4, 5, 6, 7], true).unwrap_err();
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
    let mut t2 = bg.start(2, &[3, 4, 5, 6], true).unwrap().token;
    assert_eq!(bg.free_blocks(), 0);
    let e = bg.step(&[(1, first.token), (2, t2)], true).unwrap_err();
    assert!(
        matches!(e, BatchError::Blocks(KvBlockError::OutOfBlocks { .. })),
        "{e}"
    );
    // Preempting sequence 1 frees its blocks; sequence 2 goes on.
    bg.finish(1).unwrap();
    for _ in 0..5 {
        t2 = bg.step(&[(2, t2)], true).unwrap()[0].token;
    }
    bg.finish(2).unwrap();
    assert_eq!(bg.free_blocks(), 16);
    bg.check().unwrap();
    // Unknown sequences and oversized batches are typed errors.
    assert!(matches!(
        bg.step(&[(9, 3)], false),
        Err(BatchError::UnknownSequence(9))
    ));
    assert!(matches!(bg.finish(9), Err(BatchError::UnknownSequence(9))));
    let many: Vec<(u64, u32)> = (0..5).map(|i| (i, 3)).collect();
    assert!(matches!(
        bg.step(&many, false),
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
    // Mistral's sliding window (4 tokens in the tiny model) is the paged attention's
    // attribute: such a model batches (it was refused before issue 25).
    let mistral = model_file("mistral-tiny");
    BatchedGenerator::new(
        LlamaModel::load(&mistral).unwrap(),
        &device,
        options(1 << 24, 4),
        x,
    )
    .unwrap();
    // Bad prompts: empty, past the context, ids outside the vocabulary; nothing taken.
    let mut bg = BatchedGenerator::new(load(), &device, options(small * 2, 4), x).unwrap();
    let free = bg.free_blocks();
    assert!(bg.start(1, &[], true).is_err());
    assert!(bg.start(1, &vec![3; 65], false).is_err());
    assert!(bg.start(1, &[3, 1 << 30], true).is_err());
    assert_eq!(bg.free_blocks(), free);
    assert_eq!(bg.running(), 0);
}

/// Prompts prefilled in chunks (sizes odd and even, one a block, one above the smallest
/// padded bucket) against the same prompts whole (tests/common/batched_cases.rs).
#[test]
fn chunked_prefill_matches_whole_llama3_cpu() {
    for chunk in [3, 4, 5, 20] {
        batched_cases::chunked_matches_whole("llama3-tiny", &Device::cpu(), chunk, 1e-4);
    }
}

#[test]
fn chunked_prefill_matches_whole_llama3_interp() {
    batched_cases::chunked_matches_whole("llama3-tiny", &Device::interp(), 7, 1e-4);
}

#[test]
fn chunked_prefill_matches_whole_qwen3_cpu() {
    batched_cases::chunked_matches_whole("qwen3-tiny", &Device::cpu(), 5, 1e-4);
}

#[test]
fn chunked_prefill_matches_whole_qwen2_cpu() {
    batched_cases::chunked_matches_whole("qwen2-tiny", &Device::cpu(), 16, 1e-4);
}

/// Chunks smaller than, equal to and larger than Mistral's window of 4.
#[test]
fn chunked_prefill_matches_whole_mistral_cpu() {
    for chunk in [3, 4, 5] {
        batched_cases::chunked_matches_whole("mistral-tiny", &Device::cpu(), chunk, 1e-4);
    }
}

#[test]
fn chunked_prefill_errors_and_cancellation_free_every_block() {
    let file = model_file("llama3-tiny");
    let device = Device::cpu();
    // 20 blocks of 4 tokens.
    let bytes = block_bytes(&file, 4) * 20;
    let mut o = options(bytes, 4);
    o.prefill_chunk = 5;
    let x = rocmforge::cpu::Precision::Exact;
    let mut bg =
        BatchedGenerator::new(LlamaModel::load(&file).unwrap(), &device, o.clone(), x).unwrap();
    bg.warm(40).unwrap();
    let total = bg.num_blocks();
    let long: Vec<u32> = (0..30).map(|i| 2 + i % 50).collect();
    // A chunk past the context (the command's default of 256 over a short context): every
    // prompt runs whole, and no chunk plan is compiled.
    o.prefill_chunk = 256;
    let mut wide = BatchedGenerator::new(LlamaModel::load(&file).unwrap(), &device, o, x).unwrap();
    wide.warm(40).unwrap();
    wide.begin(1, &long).unwrap();
    assert_eq!(wide.next_prefill(1), Some(30));
    assert!(wide.prefill(1, false).unwrap().next.is_some());
    // Begun: every block of the prompt taken at once, nothing run.
    bg.begin(1, &long).unwrap();
    assert_eq!(bg.free_blocks(), total - 8);
    assert_eq!(bg.next_prefill(1), Some(5));
    assert!(bg.prefill(1, false).unwrap().next.is_none());
    assert_eq!((bg.running(), bg.prefilling()), (1, 1));
    // Mid-prefill it takes no decode step, and a second begin of it is refused.
    assert!(matches!(
        bg.step(&[(1, 3)], false),
        Err(BatchError::Prefilling(1))
    ));
    assert!(matches!(
        bg.begin(1, &long),
        Err(BatchError::Blocks(KvBlockError::SequenceExists(1)))
    ));
    // Cancelled mid-prefill: every block back at once.
    bg.finish(1).unwrap();
    assert_eq!(bg.free_blocks(), total);
    assert_eq!(bg.running(), 0);
    bg.check().unwrap();
    assert!(matches!(
        bg.prefill(1, false),
        Err(BatchError::UnknownSequence(1))
    ));
    // Out of blocks at begin changes nothing.
    let huge: Vec<u32> = (0..60).map(|i| 2 + i % 50).collect();
    bg.begin(2, &huge).unwrap();
    let e = bg.begin(3, &long).unwrap_err();
    assert!(
        matches!(e, BatchError::Blocks(KvBlockError::OutOfBlocks { .. })),
        "{e}"
    );
    assert_eq!(bg.free_blocks(), total - 15);
    // A running sequence has no prefill left.
    let next = bg.start(4, &[3, 4], false).unwrap();
    assert!(matches!(
        bg.prefill(4, false),
        Err(BatchError::NoPrefill(4))
    ));
    assert_eq!(bg.next_prefill(4), None);
    bg.step(&[(4, next.token)], false).unwrap();
    for s in [2, 4] {
        bg.finish(s).unwrap();
    }
    assert_eq!(bg.free_blocks(), total);
    bg.check().unwrap();
}

/// The chunk plan lowers for GPU targets (no GPU needed), where a paged step of as many rows
/// does not: `Op::PagedAttention`'s kernels serve a decode step's few query rows per K/V head,
/// which is why a chunk gathers its rows for the prompt's flash attention instead.
#[test]
fn a_chunk_of_256_lowers_for_gpu_targets_where_a_paged_step_cannot() {
    let m = LlamaModel::load(&model_file("llama3-tiny")).unwrap();
    let pool = PoolShape {
        num_blocks: 64,
        block_size: 16,
        max_blocks: 32,
    };
    for arch in ["gfx90a", "gfx942", "sm_90a"] {
        let target = Target::parse(arch).unwrap();
        for p in [Precision::F32, Precision::F16] {
            let chunk = m.paged_chunk_graph(256, pool, p, true).unwrap();
            let fused = rocmforge::compile::optimise(&chunk, true).unwrap();
            if let Err(e) = codegen::generate(&fused, &target) {
                panic!("{arch} {p:?}: the chunk plan: {e}");
            }
            let step = m.paged_graph(1, 256, pool, p, true).unwrap();
            let fused = rocmforge::compile::optimise(&step, true).unwrap();
            let e = codegen::generate(&fused, &target).unwrap_err().to_string();
            assert!(e.contains("query rows per K/V head"), "{arch}: {e}");
        }
    }
}
