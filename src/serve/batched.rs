//! The batched generator (issue 26): many sequences in one paged KV cache, decoded together.
//! Each sequence holds blocks of the pools ([`BlockPool`]: its block table and the slots its
//! next rows go to); a prompt runs alone through a prefill plan (its bucket, as `generate`'s)
//! that also writes its K/V rows into its blocks; then every running sequence advances one
//! token per [`BatchedGenerator::step`], through the decode plan of the smallest batch bucket
//! (1, 2, 4, … `max_batch`) that holds them, the unused rows padded (no slot written, no key
//! read). One plan per bucket, compiled on first use and kept (captured once on a GPU, then
//! replayed); every plan shares the same pools.
//!
//! A prompt longer than [`BatchOptions::prefill_chunk`] runs in chunks instead
//! ([`BatchedGenerator::begin`], then [`BatchedGenerator::prefill`] once per chunk), each
//! through the chunk plan of its bucket ([`LlamaModel::paged_chunk_graph`]: the chunk's rows
//! attend over the rows earlier chunks left in the sequence's blocks), so that the serving
//! worker can run a decode step of the batch between two chunks of a long prompt.
//!
//! Every sequence reads only its own blocks: the table a row reads is its own sequence's, and
//! a shared prefix block is one its own prompt computed the same rows of.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use thiserror::Error;

use super::kv_blocks::{BlockPool, KvBlockError, SeqId};
use crate::compile::{CompileOptions, Session, SessionOptions};
use crate::frontend::llama::{io, paged_io, PoolShape, Precision};
use crate::frontend::LlamaModel;
use crate::generate::{
    check_max_context, prompt_bucket, step_compile_options, GenerateError, MIN_BUCKET,
};
use crate::ir::{DType, Graph, Shape, Tensor};
use crate::runtime::Device;

/// The block size `rocmforge serve` uses (tokens per pool block), as vLLM's default.
pub const BLOCK_SIZE: usize = 16;

/// What a [`BatchedGenerator`] is built for.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchOptions {
    pub precision: Precision,
    /// A sequence's longest context (prompt and generated tokens).
    pub max_context: usize,
    /// Tokens per pool block.
    pub block_size: usize,
    /// Bytes of K/V pools (every layer's K and V): how many blocks there are.
    pub kv_memory: usize,
    /// The largest decode batch (its bucket; rounded up to a power of two).
    pub max_batch: usize,
    /// Replay the decode plans' captured launches (GPU).
    pub replay: bool,
    /// Compile the plans with the `logits` output, for sampling on the host.
    pub logits: bool,
    /// The most prompt tokens one prefill call runs: a longer prompt runs in chunks of this
    /// many (the last one shorter), each its own call. 0: every prompt whole, in one call.
    pub prefill_chunk: usize,
    /// GEMVs of 17-64 rows (decode steps of that many sequences) on the device's tensor
    /// cores where it has them (`CompileOptions::mma_gemv`; `serve` turns it on unless
    /// `--no-tensor-core-gemv`).
    pub tensor_core_gemv: bool,
}

#[derive(Debug, Error)]
pub enum BatchError {
    #[error(transparent)]
    Generate(#[from] GenerateError),
    #[error(transparent)]
    Blocks(#[from] KvBlockError),
    #[error(
        "--kv-memory {bytes} bytes holds {blocks} blocks of {block_bytes} bytes; one sequence \
         of the maximum context {max_context} needs {needed}"
    )]
    PoolTooSmall {
        bytes: usize,
        blocks: usize,
        block_bytes: usize,
        max_context: usize,
        needed: usize,
    },
    #[error("the block size and the largest batch must be at least 1 (got {block_size} and {max_batch})")]
    Options { block_size: usize, max_batch: usize },
    #[error("a step of {got} sequences is past the largest batch, {max}")]
    BatchTooLarge { got: usize, max: usize },
    #[error("sequence {0} is not running")]
    UnknownSequence(SeqId),
    #[error("sequence {0} is still in its prefill: it joins a decode step once its prompt is in")]
    Prefilling(SeqId),
    #[error("sequence {0} has no prompt left to prefill")]
    NoPrefill(SeqId),
    #[error("sequence {seq} is at the maximum context {max_context}")]
    ContextFull { seq: SeqId, max_context: usize },
    #[error("the paged pools' size overflows: {0}")]
    Overflow(String),
}

/// What a prefill or a decode step gives per sequence.
#[derive(Clone, Debug, PartialEq)]
pub struct Next {
    /// The argmax of the sequence's last row.
    pub token: u32,
    /// That row's logits (`[vocab]`), where the plans have them.
    pub logits: Option<Vec<f32>>,
}

/// A sequence whose prompt is not all in its blocks yet ([`BatchedGenerator::begin`]).
struct Pending {
    prompt: Vec<u32>,
    /// Leading tokens shared from other sequences' blocks (their rows are there).
    cached: usize,
    /// Leading tokens whose K/V rows are in the blocks (`cached` and the chunks run).
    done: usize,
    /// The slot of each token past `cached`.
    slots: Vec<i32>,
}

/// What one [`BatchedGenerator::prefill`] call ran.
#[derive(Clone, Debug, PartialEq)]
pub struct Prefilled {
    /// Prompt tokens it computed (a chunk, or the whole prompt).
    pub tokens: usize,
    /// The token after the prompt, once its last chunk ran.
    pub next: Option<Next>,
}

/// A model compiled for batched generation on one device, with its pools.
pub struct BatchedGenerator {
    pub model: LlamaModel,
    options: BatchOptions,
    pool_shape: PoolShape,
    device: Device,
    compile: CompileOptions,
    blocks: BlockPool,
    /// Tokens whose K/V rows each running sequence holds.
    lens: HashMap<SeqId, usize>,
    /// Sequences begun whose prompts are not all in (they hold their blocks already).
    pending: HashMap<SeqId, Pending>,
    /// The batch-1 decode plan's session: it owns the pools every other session shares.
    owner: Session<'static>,
    decodes: BTreeMap<usize, Session<'static>>,
    prefills: BTreeMap<usize, Session<'static>>,
    chunks: BTreeMap<usize, Session<'static>>,
}

/// Bytes of every layer's K and V rows of one pool block of `block_size` tokens in `dtype`
/// (what `--kv-memory` buys a block of); `None` past `usize`.
pub fn kv_block_bytes(model: &LlamaModel, block_size: usize, dtype: DType) -> Option<usize> {
    let c = &model.config;
    let heads = c.heads();
    c.num_hidden_layers
        .checked_mul(2)?
        .checked_mul(heads.kv)?
        .checked_mul(heads.dim)?
        .checked_mul(block_size)?
        .checked_mul(dtype.size_bytes())
}

impl BatchedGenerator {
    pub fn load(path: &Path, device: &Device, options: BatchOptions) -> Result<Self, BatchError> {
        let model = LlamaModel::load(path).map_err(GenerateError::from)?;
        BatchedGenerator::new(model, device, options, crate::cpu::Precision::Exact)
    }

    /// Sizes the pools from `options.kv_memory`, compiles the batch-1 decode plan and makes
    /// the session that owns the pools.
    pub fn new(
        model: LlamaModel,
        device: &Device,
        options: BatchOptions,
        cpu_precision: crate::cpu::Precision,
    ) -> Result<Self, BatchError> {
        check_max_context(&model, options.max_context)?;
        if options.block_size == 0 || options.max_batch == 0 {
            return Err(BatchError::Options {
                block_size: options.block_size,
                max_batch: options.max_batch,
            });
        }
        // A sliding window is the paged attention's attribute (`Op::PagedAttention`): its
        // kernels skip the blocks before the window, so windowed models batch too.
        let bytes = kv_block_bytes(&model, options.block_size, options.precision.dtype)
            .ok_or_else(|| BatchError::Overflow("bytes per block".into()))?;
        let num_blocks = options.kv_memory / bytes.max(1);
        let max_blocks = options.max_context.div_ceil(options.block_size);
        if num_blocks < max_blocks || num_blocks > i32::MAX as usize / options.block_size {
            return Err(BatchError::PoolTooSmall {
                bytes: options.kv_memory,
                blocks: num_blocks,
                block_bytes: bytes,
                max_context: options.max_context,
                needed: max_blocks,
            });
        }
        let pool_shape = PoolShape {
            num_blocks,
            block_size: options.block_size,
            max_blocks,
        };
        let graph = model
            .paged_graph(1, 1, pool_shape, options.precision, options.logits)
            .map_err(GenerateError::from)?;
        let compile = CompileOptions {
            mma_gemv: options.tensor_core_gemv,
            ..step_compile_options(&model, &graph, cpu_precision)?
        };
        let exe =
            Arc::new(Graph::compile_with(graph, device, &compile).map_err(GenerateError::from)?);
        let owner = Session::new_with(
            exe,
            &SessionOptions {
                replay: options.replay,
            },
        )
        .map_err(GenerateError::from)?;
        Ok(BatchedGenerator {
            blocks: BlockPool::new(num_blocks, options.block_size)?,
            model,
            options,
            pool_shape,
            device: device.clone(),
            compile,
            lens: HashMap::new(),
            pending: HashMap::new(),
            owner,
            decodes: BTreeMap::new(),
            prefills: BTreeMap::new(),
            chunks: BTreeMap::new(),
        })
    }

    pub fn options(&self) -> &BatchOptions {
        &self.options
    }

    pub fn pool_shape(&self) -> PoolShape {
        self.pool_shape
    }

    /// Blocks no sequence holds.
    pub fn free_blocks(&self) -> usize {
        self.blocks.free_blocks()
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.num_blocks()
    }

    /// Sequences holding blocks (those in their prefill too).
    pub fn running(&self) -> usize {
        self.lens.len() + self.pending.len()
    }

    /// Sequences begun whose prompts are not all in yet.
    pub fn prefilling(&self) -> usize {
        self.pending.len()
    }

    /// The chunk plan's bucket for a chunk of `c` tokens: the chunk size itself for a full
    /// chunk (so it needs no padding), else the next power of two from [`MIN_BUCKET`], at most
    /// the chunk size. Few plans (five for chunks of 256), and every chunk's `kv_len` is at
    /// least its bucket: a prompt runs in chunks only when it is longer than one, and only
    /// its last chunk is short; so no padding row is left without a key to attend to.
    fn chunk_bucket(&self, c: usize) -> usize {
        let chunk = self.options.prefill_chunk;
        if c >= chunk {
            return chunk;
        }
        c.max(MIN_BUCKET)
            .checked_next_power_of_two()
            .unwrap_or(usize::MAX)
            .min(chunk)
    }

    /// Whether a prompt of `n` tokens runs whole, through the prefill plan of its bucket.
    fn whole(&self, n: usize) -> bool {
        let chunk = self.options.prefill_chunk;
        chunk == 0 || n <= chunk
    }

    /// The decode bucket a step of `n` sequences runs in.
    pub fn batch_bucket(&self, n: usize) -> usize {
        n.max(1)
            .checked_next_power_of_two()
            .unwrap_or(usize::MAX)
            .min(self.options.max_batch.max(1).next_power_of_two())
    }

    /// Blocks a prompt of `n` tokens takes (what [`BatchedGenerator::start`] needs free).
    pub fn blocks_for(&self, n: usize) -> usize {
        n.div_ceil(self.options.block_size)
    }

    /// Kernel launches of the decode plan of `bucket`, once compiled (`None` on the CPU
    /// devices or before).
    pub fn kernels_per_step(&self, bucket: usize) -> Option<usize> {
        let s = if bucket == 1 {
            &self.owner
        } else {
            self.decodes.get(&bucket)?
        };
        s.executable().plan().map(|p| p.kernels.len())
    }

    /// Every kernel of the last decode step of `bucket`, rerun one by one on the device's clock
    /// (the step's inputs as the last [`BatchedGenerator::step`] left them: its K/V rows are
    /// written again, the same values). For the bench's breakdown; an error on the CPU devices.
    pub fn profile_step(&mut self, bucket: usize) -> Result<crate::compile::Profile, BatchError> {
        let s = self.decode_session(bucket)?;
        s.profile().map_err(|e| GenerateError::from(e).into())
    }

    /// Compiles the decode plans of every bucket up to `max_batch`, the prefill plan of every
    /// prompt bucket up to `max_prompt` tokens, and the chunk plans of the buckets up to the
    /// same length (so no request waits on a compile).
    pub fn warm(&mut self, max_prompt: usize) -> Result<(), BatchError> {
        let mut b = 2;
        while b <= self.batch_bucket(self.options.max_batch) {
            self.decode_session(b)?;
            b *= 2;
        }
        let mut n = 1;
        let top = prompt_bucket(max_prompt.max(1), self.options.max_context);
        loop {
            let bucket = prompt_bucket(n, self.options.max_context);
            self.prefill_session(bucket)?;
            if bucket >= top {
                break;
            }
            n = bucket + 1;
        }
        // A chunk as long as the context holds every prompt: no prompt runs in chunks.
        if self.options.prefill_chunk > 0 && self.options.prefill_chunk < self.options.max_context {
            // The full chunk's plan, which every long prompt runs, and the short ones'.
            self.chunk_session(self.options.prefill_chunk)?;
            let top = self.chunk_bucket(top);
            let mut c = 1;
            loop {
                let bucket = self.chunk_bucket(c);
                self.chunk_session(bucket)?;
                if bucket >= top {
                    break;
                }
                c = bucket + 1;
            }
        }
        Ok(())
    }

    fn decode_session(&mut self, bucket: usize) -> Result<&mut Session<'static>, BatchError> {
        if bucket == 1 {
            return Ok(&mut self.owner);
        }
        if !self.decodes.contains_key(&bucket) {
            let o = &self.options;
            let graph = self
                .model
                .paged_graph(bucket, 1, self.pool_shape, o.precision, o.logits)
                .map_err(GenerateError::from)?;
            let exe = Arc::new(
                Graph::compile_with(graph, &self.device, &self.compile)
                    .map_err(GenerateError::from)?,
            );
            let session =
                Session::new_sharing(exe, &SessionOptions { replay: o.replay }, &self.owner)
                    .map_err(GenerateError::from)?;
            self.decodes.insert(bucket, session);
        }
        Ok(self.decodes.get_mut(&bucket).expect("inserted above"))
    }

    fn prefill_session(&mut self, bucket: usize) -> Result<&mut Session<'static>, BatchError> {
        let (model, o, pool) = (&self.model, &self.options, self.pool_shape);
        prompt_session(
            &mut self.prefills,
            bucket,
            (&self.device, &self.compile, &self.owner, o.replay),
            || model.paged_prefill_graph(bucket, pool, o.precision, o.logits),
        )
    }

    fn chunk_session(&mut self, bucket: usize) -> Result<&mut Session<'static>, BatchError> {
        let (model, o, pool) = (&self.model, &self.options, self.pool_shape);
        prompt_session(
            &mut self.chunks,
            bucket,
            (&self.device, &self.compile, &self.owner, o.replay),
            || model.paged_chunk_graph(bucket, pool, o.precision, o.logits),
        )
    }

    /// Starts sequence `seq` on `prompt`: takes its blocks (a full leading block another
    /// sequence computed from the same tokens is shared) and runs its prefill, whole or in
    /// chunks back to back, which writes the K/V rows of the blocks it does not share. Gives
    /// the token after the prompt. Out of blocks ([`KvBlockError::OutOfBlocks`]) changes
    /// nothing: the caller waits for blocks. The logits row comes back where `logits` asks and
    /// the plans have it.
    pub fn start(&mut self, seq: SeqId, prompt: &[u32], logits: bool) -> Result<Next, BatchError> {
        self.begin(seq, prompt)?;
        loop {
            if let Some(next) = self.prefill(seq, logits)?.next {
                return Ok(next);
            }
        }
    }

    /// Begins sequence `seq` on `prompt` without running it: takes every block the prompt
    /// needs (a full leading block another sequence computed from the same tokens is shared),
    /// so its prefill cannot run out half way; [`BatchedGenerator::prefill`] then runs it, a
    /// chunk a call. Its blocks are shared with later prompts only as their rows are computed.
    /// Out of blocks ([`KvBlockError::OutOfBlocks`]) or a bad prompt changes nothing.
    pub fn begin(&mut self, seq: SeqId, prompt: &[u32]) -> Result<(), BatchError> {
        let n = prompt.len();
        if n == 0 {
            return Err(GenerateError::EmptyPrompt.into());
        }
        let max_context = self.options.max_context;
        if n > max_context {
            return Err(GenerateError::ContextExceeded {
                prompt: n,
                new: 0,
                needed: n,
                max_context,
            }
            .into());
        }
        let vocab = self.model.config.vocab_size;
        if let Some(&id) = prompt.iter().find(|&&id| id as usize >= vocab) {
            return Err(GenerateError::TokenId { id, vocab }.into());
        }
        if self.lens.contains_key(&seq) || self.pending.contains_key(&seq) {
            return Err(KvBlockError::SequenceExists(seq).into());
        }
        // Compiled before any block is taken: a failed compile leaves the pool as it was (a
        // short last chunk's plan is compiled when it runs).
        if self.whole(n) {
            self.prefill_session(prompt_bucket(n, max_context))?;
        } else {
            self.chunk_session(self.options.prefill_chunk)?;
        }
        let (cached, appended) = self.blocks.reserve(seq, prompt)?;
        // A new sequence shares full blocks only: nothing to copy.
        debug_assert!(
            appended.copy.is_none(),
            "a new sequence shares full blocks only"
        );
        self.pending.insert(
            seq,
            Pending {
                prompt: prompt.to_vec(),
                cached,
                done: cached,
                slots: appended.slots,
            },
        );
        Ok(())
    }

    /// Runs the next part of begun sequence `seq`'s prefill: the whole prompt where it is no
    /// longer than a chunk (or chunks are off), else its next chunk of at most
    /// [`BatchOptions::prefill_chunk`] tokens. Once the prompt is all in, gives the token after
    /// it (and its logits where `logits` asks and the plans have them) and the sequence joins
    /// the decode steps. A failed run ends the sequence: its blocks go back.
    pub fn prefill(&mut self, seq: SeqId, logits: bool) -> Result<Prefilled, BatchError> {
        let Some(p) = self.pending.get(&seq) else {
            return Err(if self.lens.contains_key(&seq) {
                BatchError::NoPrefill(seq)
            } else {
                BatchError::UnknownSequence(seq)
            });
        };
        let n = p.prompt.len();
        let whole = self.whole(n);
        let ran = if whole {
            self.run_whole(seq, logits)
        } else {
            self.run_chunk(seq, logits)
        };
        if ran.is_err() {
            // The blocks go back: the sequence never started.
            self.pending.remove(&seq);
            self.blocks.free(seq)?;
        }
        let ran = ran?;
        if ran.next.is_some() {
            self.pending.remove(&seq);
            self.lens.insert(seq, n);
        }
        Ok(ran)
    }

    /// Tokens the next [`BatchedGenerator::prefill`] of `seq` computes (`None`: `seq` is not
    /// in its prefill).
    pub fn next_prefill(&self, seq: SeqId) -> Option<usize> {
        let p = self.pending.get(&seq)?;
        let n = p.prompt.len();
        Some(if self.whole(n) {
            n
        } else {
            self.options.prefill_chunk.min(n - p.done)
        })
    }

    /// The whole prompt of pending `seq` through the prefill plan of its bucket; the rows a
    /// shared prefix already holds are computed too (their slots are not written).
    fn run_whole(&mut self, seq: SeqId, logits: bool) -> Result<Prefilled, BatchError> {
        let p = &self.pending[&seq];
        let n = p.prompt.len();
        let bucket = prompt_bucket(n, self.options.max_context);
        let mut slots = vec![-1i64; bucket];
        for (r, &slot) in p.slots.iter().enumerate() {
            slots[p.cached + r] = i64::from(slot);
        }
        let mut ids: Vec<i64> = p.prompt.iter().map(|&i| i64::from(i)).collect();
        ids.resize(bucket, 0);
        let vocab = self.model.config.vocab_size;
        let with_logits = logits && self.options.logits;
        let s = self.prefill_session(bucket)?;
        s.set_input(io::INPUT_IDS, &int(DType::I64, &[1, bucket], ids))
            .map_err(GenerateError::from)?;
        s.set_input(paged_io::SLOTS, &int(DType::I32, &[1, bucket], slots))
            .map_err(GenerateError::from)?;
        s.set_input(io::LAST, &int(DType::I32, &[1], vec![n as i64 - 1]))
            .map_err(GenerateError::from)?;
        s.run().map_err(GenerateError::from)?;
        let next = read_rows(s, 1, vocab, with_logits)?.remove(0);
        self.blocks.written(seq, n)?;
        Ok(Prefilled {
            tokens: n,
            next: Some(next),
        })
    }

    /// The next chunk of pending `seq`: its `c` tokens left-padded to the chunk bucket, the
    /// padding rows writing no slot, `kv_len` the rows in once the chunk's are.
    fn run_chunk(&mut self, seq: SeqId, logits: bool) -> Result<Prefilled, BatchError> {
        let p = &self.pending[&seq];
        let (n, done, cached) = (p.prompt.len(), p.done, p.cached);
        let c = self.options.prefill_chunk.min(n - done);
        let bucket = self.chunk_bucket(c);
        let pad = bucket - c;
        let end = done + c;
        let mut ids = vec![0i64; bucket];
        let mut slots = vec![-1i64; bucket];
        for r in 0..c {
            ids[pad + r] = i64::from(p.prompt[done + r]);
            slots[pad + r] = i64::from(p.slots[done - cached + r]);
        }
        // Row i stands at position end − bucket + i: the real rows at done..end, and a padding
        // row where its causal view ends (at least one key: `chunk_bucket` keeps end ≥ bucket).
        let positions: Vec<i64> = (0..bucket)
            .map(|i| ((end + i).saturating_sub(bucket)) as i64)
            .collect();
        let max_blocks = self.pool_shape.max_blocks;
        let mut table = vec![0i64; max_blocks];
        let blocks = self
            .blocks
            .table(seq)
            .ok_or(BatchError::UnknownSequence(seq))?;
        for (j, &blk) in blocks.iter().enumerate() {
            table[j] = i64::from(blk);
        }
        let last = end == n;
        let vocab = self.model.config.vocab_size;
        let with_logits = logits && last && self.options.logits;
        let s = self.chunk_session(bucket)?;
        set_step_inputs(s, bucket, ids, positions, slots)?;
        s.set_input(
            paged_io::BLOCK_TABLE,
            &int(DType::I32, &[1, max_blocks], table),
        )
        .map_err(GenerateError::from)?;
        s.set_input(io::KV_LEN, &int(DType::I32, &[1], vec![end as i64]))
            .map_err(GenerateError::from)?;
        s.run().map_err(GenerateError::from)?;
        let next = if last {
            Some(read_rows(s, 1, vocab, with_logits)?.remove(0))
        } else {
            None
        };
        self.blocks.written(seq, end)?;
        self.pending
            .get_mut(&seq)
            .ok_or(BatchError::UnknownSequence(seq))?
            .done = end;
        Ok(Prefilled { tokens: c, next })
    }

    /// Advances every sequence of `batch` by one token: `(seq, token)` is the token to append
    /// (the one the last step or the prefill gave). Gives each sequence's next token, in
    /// order. Blocks are taken for all of them or none ([`KvBlockError::OutOfBlocks`]: the
    /// caller preempts a sequence and steps again). The logits rows come back where `logits`
    /// asks (a sampled request in the batch) and the plans have them: reading them costs a
    /// vocabulary row a sequence, which a greedy batch does not pay.
    pub fn step(&mut self, batch: &[(SeqId, u32)], logits: bool) -> Result<Vec<Next>, BatchError> {
        let b = batch.len();
        if b == 0 {
            return Ok(Vec::new());
        }
        let bucket = self.batch_bucket(b);
        if b > bucket {
            return Err(BatchError::BatchTooLarge {
                got: b,
                max: bucket,
            });
        }
        let bs = self.options.block_size;
        let max_context = self.options.max_context;
        let vocab = self.model.config.vocab_size;
        let mut new_blocks = 0;
        for &(seq, t) in batch {
            if self.pending.contains_key(&seq) {
                return Err(BatchError::Prefilling(seq));
            }
            let len = *self
                .lens
                .get(&seq)
                .ok_or(BatchError::UnknownSequence(seq))?;
            if len >= max_context {
                return Err(BatchError::ContextFull { seq, max_context });
            }
            if t as usize >= vocab {
                return Err(GenerateError::TokenId { id: t, vocab }.into());
            }
            if len.is_multiple_of(bs) {
                new_blocks += 1;
            }
        }
        let free = self.blocks.free_blocks();
        if new_blocks > free {
            return Err(KvBlockError::OutOfBlocks {
                needed: new_blocks,
                free,
            }
            .into());
        }
        self.decode_session(bucket)?;
        let max_blocks = self.pool_shape.max_blocks;
        let mut ids = vec![0i64; bucket];
        let mut positions = vec![0i64; bucket];
        let mut slots = vec![-1i64; bucket];
        let mut table = vec![0i64; bucket * max_blocks];
        let mut kv_len = vec![0i64; bucket];
        for (i, &(seq, t)) in batch.iter().enumerate() {
            let len = self.lens[&seq];
            // Cannot run out: the blocks were counted above, and no sequence is forked.
            let appended = self.blocks.append(seq, &[t])?;
            // Copy-on-write comes from forks only (a shared partial block), which this
            // generator never makes: there is no copy to perform.
            debug_assert!(appended.copy.is_none(), "no sequence is forked");
            ids[i] = i64::from(t);
            positions[i] = len as i64;
            slots[i] = i64::from(appended.slots[0]);
            kv_len[i] = len as i64 + 1;
            let blocks = self
                .blocks
                .table(seq)
                .ok_or(BatchError::UnknownSequence(seq))?;
            for (j, &blk) in blocks.iter().enumerate() {
                table[i * max_blocks + j] = i64::from(blk);
            }
            *self.lens.get_mut(&seq).expect("looked up above") += 1;
        }
        let has_logits = self.options.logits;
        let s = self.decode_session(bucket)?;
        set_step_inputs(s, bucket, ids, positions, slots)?;
        s.set_input(
            paged_io::BLOCK_TABLE,
            &int(DType::I32, &[bucket, max_blocks], table),
        )
        .map_err(GenerateError::from)?;
        s.set_input(io::KV_LEN, &int(DType::I32, &[bucket], kv_len))
            .map_err(GenerateError::from)?;
        s.run().map_err(GenerateError::from)?;
        read_rows(s, b, vocab, logits && has_logits)
    }

    /// Ends `seq`, running or in its prefill (cancelled, preempted): its blocks go back to
    /// the pool (those another sequence shares stay).
    pub fn finish(&mut self, seq: SeqId) -> Result<(), BatchError> {
        if self.pending.remove(&seq).is_none() {
            self.lens
                .remove(&seq)
                .ok_or(BatchError::UnknownSequence(seq))?;
        }
        self.blocks.free(seq)?;
        Ok(())
    }

    /// The pool's bookkeeping is consistent (tests).
    pub fn check(&self) -> Result<(), String> {
        self.blocks.check()
    }
}

/// The session of `bucket` in `sessions` (a prompt's or a chunk's plans), compiled from `graph`
/// on first use and sharing the pools of `owner`; captured for replay where the decode plans
/// are (`replay`): a bucket's plan runs again for every prompt or chunk of its size, and at
/// SmolLM2's size a 256-row prefill is ~330 launches whose host cost rivals the GPU's work
/// (a new prompt every ~4 steps at 32 streams; twentieth session, docs/performance.md).
fn prompt_session<'m>(
    sessions: &'m mut BTreeMap<usize, Session<'static>>,
    bucket: usize,
    (device, compile, owner, replay): (&Device, &CompileOptions, &Session<'static>, bool),
    graph: impl FnOnce() -> Result<Graph, crate::ir::GraphError>,
) -> Result<&'m mut Session<'static>, BatchError> {
    if let std::collections::btree_map::Entry::Vacant(slot) = sessions.entry(bucket) {
        let graph = graph().map_err(GenerateError::from)?;
        let exe =
            Arc::new(Graph::compile_with(graph, device, compile).map_err(GenerateError::from)?);
        let session = Session::new_sharing(exe, &SessionOptions { replay }, owner)
            .map_err(GenerateError::from)?;
        slot.insert(session);
    }
    Ok(sessions.get_mut(&bucket).expect("inserted above"))
}

fn int(dtype: DType, dims: &[usize], values: Vec<i64>) -> Tensor {
    Tensor::from_i64(dtype, Shape::new(dims.to_vec()), values).expect("sized by the caller")
}

/// Sets a paged step's `input_ids` (`[1, rows]`), `positions` (`[rows]`) and `slots`
/// (`[1, rows]`).
fn set_step_inputs(
    s: &mut Session<'static>,
    rows: usize,
    ids: Vec<i64>,
    positions: Vec<i64>,
    slots: Vec<i64>,
) -> Result<(), BatchError> {
    s.set_input(io::INPUT_IDS, &int(DType::I64, &[1, rows], ids))
        .map_err(GenerateError::from)?;
    s.set_input(io::POSITIONS, &int(DType::I32, &[rows], positions))
        .map_err(GenerateError::from)?;
    s.set_input(paged_io::SLOTS, &int(DType::I32, &[1, rows], slots))
        .map_err(GenerateError::from)?;
    Ok(())
}

/// The first `rows` tokens of a run, and their logits rows where `logits` asks (the caller
/// asks only of plans that have them).
fn read_rows(
    s: &Session<'_>,
    rows: usize,
    vocab: usize,
    logits: bool,
) -> Result<Vec<Next>, BatchError> {
    let t = s.output(io::TOKEN).map_err(GenerateError::from)?;
    let tokens = t.as_i64().unwrap_or_default();
    let logits = if logits {
        let l = s.output(io::LOGITS).map_err(GenerateError::from)?;
        // The LM head casts to f32 before the output (frontend::llama::lower).
        Some(l.as_f32().ok_or(GenerateError::LogitsType)?.to_vec())
    } else {
        None
    };
    (0..rows)
        .map(|i| {
            let value = tokens.get(i).copied().unwrap_or(-1);
            let token = match u32::try_from(value) {
                Ok(id) if (id as usize) < vocab => id,
                _ => return Err(GenerateError::BadToken { value }.into()),
            };
            let logits = logits
                .as_ref()
                .map(|l| l[i * vocab..(i + 1) * vocab].to_vec());
            Ok(Next { token, logits })
        })
        .collect()
}
