//! The scheduler's worker, version 2: continuous batching over a paged KV cache
//! ([`super::batched`]). Each iteration admits queued requests while the batch has room and
//! the pool has blocks (a request's prompt runs as its own prefill, which gives its first
//! token), then advances every running request by one token in one decode step. A request
//! leaves the batch the step it ends (EOS, a stop string, its budget, its client gone), and its
//! blocks go back at once. When a step needs a block the pool does not have, the request that
//! joined last is preempted: its blocks are freed and it waits at the head of the queue, to be
//! started again from its prompt and the tokens it already has (recomputed, as vLLM does).
//!
//! The HTTP side is the same as version 1's ([`super::scheduler`]): jobs in, events out, one
//! [`Event::Done`] or [`Event::Failed`] per job.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Instant;

use super::batched::{BatchError, BatchedGenerator, Next};
use super::kv_blocks::{KvBlockError, SeqId};
use super::sample::Sampler;
use super::scheduler::{conclude, Decoder, Event, FinishReason, Job, WorkerStats};
use super::text::{Piece, TextStream};

/// What the batching worker drives: a model that starts sequences in a paged cache and
/// advances many at once. [`BatchedGenerator`] is the real one; tests use a fake.
pub trait BatchEngine {
    /// The most sequences one step advances.
    fn max_batch(&self) -> usize;
    /// Starts `seq` on `prompt` (its prefill) and gives the next token's argmax, and its
    /// logits where `logits` asks.
    fn start(&mut self, seq: SeqId, prompt: &[u32], logits: bool) -> Result<Next, BatchError>;
    /// Appends each `(seq, token)` and gives each sequence's next (the logits where `logits`
    /// asks: some request of the batch samples).
    fn step(&mut self, batch: &[(SeqId, u32)], logits: bool) -> Result<Vec<Next>, BatchError>;
    /// Ends `seq`, its blocks back in the pool.
    fn finish(&mut self, seq: SeqId);
    /// (blocks in use, blocks in all).
    fn blocks(&self) -> (usize, usize);
    fn decoder(&self) -> Decoder;
    fn eos(&self) -> Option<u32>;
}

impl BatchEngine for BatchedGenerator {
    fn max_batch(&self) -> usize {
        self.options().max_batch
    }

    fn start(&mut self, seq: SeqId, prompt: &[u32], logits: bool) -> Result<Next, BatchError> {
        BatchedGenerator::start(self, seq, prompt, logits)
    }

    fn step(&mut self, batch: &[(SeqId, u32)], logits: bool) -> Result<Vec<Next>, BatchError> {
        BatchedGenerator::step(self, batch, logits)
    }

    fn finish(&mut self, seq: SeqId) {
        // Only running sequences are finished here; an unknown one has nothing to free.
        let _ = BatchedGenerator::finish(self, seq);
    }

    fn blocks(&self) -> (usize, usize) {
        (self.num_blocks() - self.free_blocks(), self.num_blocks())
    }

    fn decoder(&self) -> Decoder {
        let tokenizer = self.model.tokenizer.clone();
        std::sync::Arc::new(move |ids: &[u32]| tokenizer.decode(ids).map_err(|e| e.to_string()))
    }

    fn eos(&self) -> Option<u32> {
        self.model.tokenizer.eos
    }
}

/// A request in the batch (or preempted, waiting to be started again).
struct Active {
    job: Job,
    seq: SeqId,
    text: TextStream,
    sampler: Sampler,
    /// The tokens generated so far (a preempted request restarts from prompt + these).
    ids: Vec<u32>,
    /// The token the next step appends.
    last: u32,
    t0: Instant,
}

/// A queued request, or a preempted one.
enum Waiting {
    New(Job),
    Preempted(Box<Active>),
}

impl Waiting {
    fn job(&self) -> &Job {
        match self {
            Waiting::New(j) => j,
            Waiting::Preempted(a) => &a.job,
        }
    }
}

/// How a token left a request.
enum After {
    Continue,
    Finished(Result<FinishReason, String>, bool),
}

pub(super) fn work_batched<E: BatchEngine>(
    mut engine: E,
    rx: Receiver<Job>,
    cancel: &AtomicBool,
    stats: &WorkerStats,
) {
    let decode = engine.decoder();
    let eos = engine.eos();
    let max_batch = engine.max_batch().max(1);
    let mut waiting: VecDeque<Waiting> = VecDeque::new();
    let mut running: Vec<Active> = Vec::new();
    let mut next_seq: SeqId = 0;
    let mut open = true;
    loop {
        // Take what arrived; sleep on the queue only when there is nothing to do.
        if running.is_empty() && waiting.is_empty() {
            if !open {
                break;
            }
            match rx.recv() {
                Ok(job) => {
                    stats.add_queued(false);
                    waiting.push_back(Waiting::New(job));
                }
                Err(_) => break,
            }
        }
        while open {
            match rx.try_recv() {
                Ok(job) => {
                    stats.add_queued(false);
                    waiting.push_back(Waiting::New(job));
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => open = false,
            }
        }
        // Admit while the batch has room and the pool has blocks.
        while running.len() < max_batch {
            let Some(w) = waiting.pop_front() else { break };
            if gone(w.job(), cancel) {
                let a = match w {
                    Waiting::New(job) => activate(job, next_seq),
                    Waiting::Preempted(a) => *a,
                };
                end(a, Ok(FinishReason::Cancelled), false, stats, &decode);
                continue;
            }
            let mut a = match w {
                Waiting::New(job) => {
                    next_seq += 1;
                    activate(job, next_seq)
                }
                Waiting::Preempted(mut a) => {
                    next_seq += 1;
                    a.seq = next_seq;
                    *a
                }
            };
            if a.job.max_tokens == 0 {
                end(a, Ok(FinishReason::Length), true, stats, &decode);
                continue;
            }
            let mut prompt = a.job.prompt.clone();
            prompt.extend_from_slice(&a.ids);
            let sampled = !a.job.sampling.is_greedy();
            let t = Instant::now();
            let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                engine.start(a.seq, &prompt, sampled)
            }));
            stats.prefills.fetch_add(1, Ordering::Relaxed);
            add_micros(&stats.prefill_micros, t);
            match started {
                Ok(Ok(next)) => match take(&mut a, next, eos, cancel, &decode) {
                    After::Continue => running.push(a),
                    After::Finished(outcome, flush) => {
                        engine.finish(a.seq);
                        end(a, outcome, flush, stats, &decode);
                    }
                },
                Ok(Err(BatchError::Blocks(KvBlockError::OutOfBlocks { .. })))
                    if !running.is_empty() =>
                {
                    // Blocks come back as the running requests end: wait at the head.
                    waiting.push_front(Waiting::Preempted(Box::new(a)));
                    break;
                }
                Ok(Err(e)) => end(a, Err(e.to_string()), false, stats, &decode),
                Err(_) => end(
                    a,
                    Err("internal error: the engine panicked".into()),
                    false,
                    stats,
                    &decode,
                ),
            }
        }
        stats.running.store(running.len(), Ordering::SeqCst);
        publish_blocks(&engine, stats);
        if running.is_empty() {
            continue;
        }
        // Requests whose clients left end now, their blocks back before the step.
        let mut i = 0;
        while i < running.len() {
            if gone(&running[i].job, cancel) {
                let a = running.remove(i);
                engine.finish(a.seq);
                end(a, Ok(FinishReason::Cancelled), false, stats, &decode);
            } else {
                i += 1;
            }
        }
        if running.is_empty() {
            continue;
        }
        let batch: Vec<(SeqId, u32)> = running.iter().map(|a| (a.seq, a.last)).collect();
        // Logits rows only where a request of the batch samples.
        let sampled = running.iter().any(|a| !a.job.sampling.is_greedy());
        let t = Instant::now();
        let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            engine.step(&batch, sampled)
        }));
        stats.steps.fetch_add(1, Ordering::Relaxed);
        add_micros(&stats.step_micros, t);
        let size = batch.len().max(1).next_power_of_two().trailing_zeros() as usize;
        stats.step_sizes[size.min(7)].fetch_add(1, Ordering::Relaxed);
        stats
            .step_rows
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        let t = Instant::now();
        match stepped {
            Ok(Ok(nexts)) => {
                let mut kept = Vec::with_capacity(running.len());
                for (mut a, next) in running.drain(..).zip(nexts) {
                    match take(&mut a, next, eos, cancel, &decode) {
                        After::Continue => kept.push(a),
                        After::Finished(outcome, flush) => {
                            engine.finish(a.seq);
                            end(a, outcome, flush, stats, &decode);
                        }
                    }
                }
                running = kept;
            }
            Ok(Err(BatchError::Blocks(KvBlockError::OutOfBlocks { .. }))) if running.len() > 1 => {
                // Preempt the request that joined last; the others step again next time.
                let a = running.pop().expect("more than one");
                engine.finish(a.seq);
                stats.preempted.fetch_add(1, Ordering::Relaxed);
                waiting.push_front(Waiting::Preempted(Box::new(a)));
            }
            Ok(Err(BatchError::ContextFull { seq, .. })) => {
                // The HTTP layer keeps prompt + max_tokens within the context, so this is a
                // request at its limit: it ends as "length".
                if let Some(i) = running.iter().position(|a| a.seq == seq) {
                    let a = running.remove(i);
                    engine.finish(a.seq);
                    end(a, Ok(FinishReason::Length), true, stats, &decode);
                }
            }
            Ok(Err(e)) => {
                // A failed step fails the requests in it; the server goes on.
                let msg = e.to_string();
                for a in running.drain(..) {
                    engine.finish(a.seq);
                    end(a, Err(msg.clone()), false, stats, &decode);
                }
            }
            Err(_) => {
                for a in running.drain(..) {
                    engine.finish(a.seq);
                    let msg = "internal error: the engine panicked".to_string();
                    end(a, Err(msg), false, stats, &decode);
                }
            }
        }
        add_micros(&stats.host_micros, t);
        stats.running.store(running.len(), Ordering::SeqCst);
        publish_blocks(&engine, stats);
    }
    stats.running.store(0, Ordering::SeqCst);
}

fn add_micros(to: &std::sync::atomic::AtomicU64, since: Instant) {
    to.fetch_add(since.elapsed().as_micros() as u64, Ordering::Relaxed);
}

fn publish_blocks<E: BatchEngine>(engine: &E, stats: &WorkerStats) {
    let (used, total) = engine.blocks();
    stats.kv_blocks_used.store(used, Ordering::Relaxed);
    stats.kv_blocks_total.store(total, Ordering::Relaxed);
}

fn activate(job: Job, seq: SeqId) -> Active {
    Active {
        text: TextStream::new(job.stop.clone()),
        sampler: Sampler::new(job.sampling.clone()),
        ids: Vec::new(),
        last: 0,
        seq,
        t0: Instant::now(),
        job,
    }
}

/// The client is gone or the server cancels everything.
fn gone(job: &Job, cancel: &AtomicBool) -> bool {
    cancel.load(Ordering::SeqCst) || job.events.is_closed()
}

/// Takes the next token of `a` (the sampler's from the logits, or the argmax), streams its
/// text and says whether the request goes on.
fn take(
    a: &mut Active,
    next: Next,
    eos: Option<u32>,
    cancel: &AtomicBool,
    decode: &Decoder,
) -> After {
    let token = match (&next.logits, a.job.sampling.is_greedy()) {
        (Some(l), false) => a.sampler.sample(l),
        _ => next.token,
    };
    if Some(token) == eos {
        return After::Finished(Ok(FinishReason::Stop), true);
    }
    a.ids.push(token);
    a.last = token;
    if gone(&a.job, cancel) {
        return After::Finished(Ok(FinishReason::Cancelled), false);
    }
    let (piece, stop) = match a.text.push(token, |ids| decode(ids)) {
        Ok(Piece::Text(s)) => (s, false),
        Ok(Piece::Stop(s)) => (s, true),
        Err(e) => return After::Finished(Err(e), false),
    };
    if !piece.is_empty() {
        // A send fails only when the receiver is gone: the next token sees that.
        let _ = a.job.events.send(Event::Text(piece));
    }
    if stop {
        After::Finished(Ok(FinishReason::Stop), false)
    } else if a.ids.len() >= a.job.max_tokens {
        After::Finished(Ok(FinishReason::Length), true)
    } else {
        After::Continue
    }
}

/// Counts a request and sends its last events (`flush`: the held-back text first).
fn end(
    mut a: Active,
    outcome: Result<FinishReason, String>,
    flush: bool,
    stats: &WorkerStats,
    decode: &Decoder,
) {
    let micros = a.t0.elapsed().as_micros() as u64;
    conclude(
        &a.job,
        &mut a.text,
        outcome,
        flush,
        a.ids.len(),
        micros,
        stats,
        decode,
    );
}
