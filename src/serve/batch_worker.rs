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
use super::scheduler::{conclude, Decoder, Event, FinishReason, Job, Scheduler, WorkerStats};
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
    /// Blocks a prompt of `tokens` tokens takes at most (prefix sharing may take fewer).
    fn blocks_for(&self, tokens: usize) -> usize;
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

    fn blocks_for(&self, tokens: usize) -> usize {
        BatchedGenerator::blocks_for(self, tokens)
    }

    fn decoder(&self) -> Decoder {
        let tokenizer = self.model.tokenizer.clone();
        std::sync::Arc::new(move |ids: &[u32]| tokenizer.decode(ids).map_err(|e| e.to_string()))
    }

    fn eos(&self) -> Option<u32> {
        self.model.tokenizer.eos
    }
}

impl Scheduler {
    /// As [`Scheduler::start`], with this batching worker (version 2): up to the engine's
    /// largest batch of jobs generate at once.
    pub fn start_batched<E, T, F>(max_queue: usize, make: F) -> Result<(Scheduler, T), String>
    where
        E: BatchEngine + 'static,
        T: Send + 'static,
        F: FnOnce() -> Result<(E, T), String> + Send + 'static,
    {
        Scheduler::spawn(max_queue, make, work_batched::<E>)
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

/// A queued request, or one already started: preempted, or put back until the pool has room.
enum Waiting {
    New(Job),
    Started(Box<Active>),
}

impl Waiting {
    fn job(&self) -> &Job {
        match self {
            Waiting::New(j) => j,
            Waiting::Started(a) => &a.job,
        }
    }
}

/// How a token left a request.
enum After {
    Continue,
    Finished(Result<FinishReason, String>, bool),
}

fn work_batched<E: BatchEngine>(
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
                    Waiting::Started(a) => *a,
                };
                end(a, Ok(FinishReason::Cancelled), false, stats, &decode);
                continue;
            }
            let mut a = match w {
                Waiting::New(job) => {
                    next_seq += 1;
                    activate(job, next_seq)
                }
                Waiting::Started(mut a) => {
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
            // Admit only with a block of headroom per running request (their next step):
            // admitting into a pool the running requests are about to fill would preempt one
            // of them at once, and a preempted request let straight back in thrashes.
            let (used, total) = engine.blocks();
            if !running.is_empty()
                && total - used < engine.blocks_for(prompt.len()) + running.len() + 1
            {
                waiting.push_front(Waiting::Started(Box::new(a)));
                break;
            }
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
                        retire(&mut engine, a.seq, stats);
                        end(a, outcome, flush, stats, &decode);
                    }
                },
                Ok(Err(BatchError::Blocks(KvBlockError::OutOfBlocks { .. })))
                    if !running.is_empty() =>
                {
                    // Blocks come back as the running requests end: wait at the head.
                    waiting.push_front(Waiting::Started(Box::new(a)));
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
                retire(&mut engine, a.seq, stats);
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
                            retire(&mut engine, a.seq, stats);
                            end(a, outcome, flush, stats, &decode);
                        }
                    }
                }
                running = kept;
            }
            Ok(Err(BatchError::Blocks(KvBlockError::OutOfBlocks { .. }))) if running.len() > 1 => {
                // Preempt the request that joined last; the others step again next time.
                let a = running.pop().expect("more than one");
                retire(&mut engine, a.seq, stats);
                stats.preempted.fetch_add(1, Ordering::Relaxed);
                waiting.push_front(Waiting::Started(Box::new(a)));
            }
            Ok(Err(BatchError::ContextFull { seq, .. })) => {
                // The HTTP layer keeps prompt + max_tokens within the context, so this is a
                // request at its limit: it ends as "length".
                if let Some(i) = running.iter().position(|a| a.seq == seq) {
                    let a = running.remove(i);
                    retire(&mut engine, a.seq, stats);
                    end(a, Ok(FinishReason::Length), true, stats, &decode);
                }
            }
            Ok(Err(e)) => {
                // A failed step fails the requests in it; the server goes on.
                let msg = e.to_string();
                for a in running.drain(..) {
                    retire(&mut engine, a.seq, stats);
                    end(a, Err(msg.clone()), false, stats, &decode);
                }
            }
            Err(_) => {
                for a in running.drain(..) {
                    retire(&mut engine, a.seq, stats);
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

/// Frees `seq`'s blocks and publishes the count before its client hears it ended, so a client
/// (or a test) that reads /metrics after its last chunk sees the blocks back.
fn retire<E: BatchEngine>(engine: &mut E, seq: SeqId, stats: &WorkerStats) {
    engine.finish(seq);
    publish_blocks(engine, stats);
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
    if Some(token) == eos && !a.job.ignore_eos {
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use super::*;
    use crate::serve::sample::SamplingParams;
    use crate::serve::scheduler::tests::{collect, done, job};

    /// A paged engine that counts up from each sequence's last token (EOS at 100), with a pool
    /// of `blocks` one-token blocks, and records the batch sizes it stepped.
    struct Counting {
        /// The first start waits here until the test has queued its jobs.
        hold: Option<std::sync::mpsc::Receiver<()>>,
        blocks: usize,
        held: HashMap<SeqId, usize>,
        steps: Arc<std::sync::Mutex<Vec<usize>>>,
    }

    impl Counting {
        fn take(&mut self, seq: SeqId, n: usize) -> Result<(), BatchError> {
            let used: usize = self.held.values().sum();
            if used + n > self.blocks {
                return Err(KvBlockError::OutOfBlocks {
                    needed: n,
                    free: self.blocks - used,
                }
                .into());
            }
            *self.held.entry(seq).or_default() += n;
            Ok(())
        }
    }

    fn next(t: u32) -> Next {
        Next {
            token: t + 1,
            logits: None,
        }
    }

    impl BatchEngine for Counting {
        fn max_batch(&self) -> usize {
            4
        }

        fn start(&mut self, seq: SeqId, prompt: &[u32], _: bool) -> Result<Next, BatchError> {
            if let Some(h) = self.hold.take() {
                let _ = h.recv_timeout(std::time::Duration::from_secs(10));
            }
            self.take(seq, prompt.len())?;
            Ok(next(*prompt.last().unwrap()))
        }

        fn step(&mut self, batch: &[(SeqId, u32)], _: bool) -> Result<Vec<Next>, BatchError> {
            let free = self.blocks - self.held.values().sum::<usize>();
            if batch.len() > free {
                return Err(KvBlockError::OutOfBlocks {
                    needed: batch.len(),
                    free,
                }
                .into());
            }
            for &(seq, _) in batch {
                self.take(seq, 1)?;
            }
            self.steps.lock().unwrap().push(batch.len());
            Ok(batch.iter().map(|&(_, t)| next(t)).collect())
        }

        fn finish(&mut self, seq: SeqId) {
            self.held.remove(&seq);
        }

        fn blocks(&self) -> (usize, usize) {
            (self.held.values().sum(), self.blocks)
        }

        fn blocks_for(&self, tokens: usize) -> usize {
            tokens
        }

        fn decoder(&self) -> Decoder {
            Arc::new(|ids: &[u32]| Ok(ids.iter().map(|i| format!("<{i}>")).collect()))
        }

        fn eos(&self) -> Option<u32> {
            Some(100)
        }
    }

    type Steps = Arc<std::sync::Mutex<Vec<usize>>>;

    /// The scheduler over a counting engine of `blocks`, its first prefill held until the
    /// returned sender sends.
    fn start(blocks: usize) -> (Scheduler, Steps, std::sync::mpsc::Sender<()>) {
        let steps = Arc::new(std::sync::Mutex::new(Vec::new()));
        let s2 = steps.clone();
        let (go, hold) = std::sync::mpsc::channel();
        let (s, ()) = Scheduler::start_batched(16, move || {
            Ok((
                Counting {
                    hold: Some(hold),
                    blocks,
                    held: HashMap::new(),
                    steps: s2,
                },
                (),
            ))
        })
        .unwrap();
        (s, steps, go)
    }

    #[test]
    fn jobs_end_as_on_version_one_and_run_together() {
        let (s, steps, go) = start(1000);
        let (a, ra) = job(10, 3, &[]);
        let (b, rb) = job(97, 10, &[]);
        let (mut c, rc) = job(97, 5, &[]);
        c.ignore_eos = true;
        let (d, rd) = job(10, 10, &["<13>"]);
        let (mut e, re) = job(20, 2, &[]);
        // Sampled without logits from this engine: the argmax stands.
        e.sampling = SamplingParams {
            temperature: 0.8,
            top_k: 0,
            top_p: 0.9,
            seed: 1,
        };
        let (f, rf) = job(5, 0, &[]);
        for j in [a, b, c, d, e, f] {
            s.submit(j).unwrap();
        }
        go.send(()).unwrap();
        assert_eq!(
            collect(ra),
            ("<11><12><13>".into(), done(FinishReason::Length, 3))
        );
        assert_eq!(
            collect(rb),
            ("<98><99>".into(), done(FinishReason::Stop, 2))
        );
        assert_eq!(
            collect(rc),
            (
                "<98><99><100><101><102>".into(),
                done(FinishReason::Length, 5)
            )
        );
        assert_eq!(
            collect(rd),
            ("<11><12>".into(), done(FinishReason::Stop, 3))
        );
        assert_eq!(
            collect(re),
            ("<21><22>".into(), done(FinishReason::Length, 2))
        );
        assert_eq!(collect(rf), (String::new(), done(FinishReason::Length, 0)));
        // More than one request advanced in a step, never more than the largest batch.
        let steps = steps.lock().unwrap().clone();
        assert!(steps.iter().any(|&n| n > 1), "{steps:?}");
        assert!(steps.iter().all(|&n| n <= 4), "{steps:?}");
        assert_eq!(s.stats.completed.load(Ordering::Relaxed), 6);
        s.shutdown();
    }

    #[test]
    fn out_of_blocks_preempts_the_last_and_every_text_is_whole() {
        // 12 blocks: three prompts of 2 take 6; their steps run out after two tokens each,
        // the last-joined request is preempted and started again from prompt + its tokens.
        let (s, _, go) = start(12);
        let rx: Vec<_> = [10, 30, 50]
            .into_iter()
            .map(|last| {
                let (j, rx) = job(last, 6, &[]);
                s.submit(j).unwrap();
                rx
            })
            .collect();
        go.send(()).unwrap();
        for (last, rx) in [10u32, 30, 50].into_iter().zip(rx) {
            let want: String = (1..=6).map(|i| format!("<{}>", last + i)).collect();
            assert_eq!(collect(rx), (want, done(FinishReason::Length, 6)));
        }
        assert!(s.stats.preempted.load(Ordering::Relaxed) >= 1);
        assert_eq!(s.stats.kv_blocks_used.load(Ordering::Relaxed), 0);
        // A prompt larger than the whole pool fails alone; the worker goes on.
        let (big, rb) = job(1, 2, &[]);
        let big = Job {
            prompt: vec![1; 13],
            ..big
        };
        s.submit(big).unwrap();
        assert!(matches!(collect(rb).1, Event::Failed(m) if m.contains("out of blocks")));
        let (j, r) = job(1, 1, &[]);
        s.submit(j).unwrap();
        assert_eq!(collect(r), ("<2>".into(), done(FinishReason::Length, 1)));
        s.shutdown();
    }
}
