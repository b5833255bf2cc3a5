//! The scheduler's worker, version 2: continuous batching over a paged KV cache
//! ([`super::batched`]). Each iteration admits queued requests while the batch has room and
//! the pool has blocks (an admitted request takes every block its prompt needs at once), runs
//! prefill work up to the engine's budget, then advances every running request by one token
//! in one decode step. The budget ([`BatchEngine::prefill_budget`], `--prefill-chunk`) is
//! what keeps a burst of new prompts from stalling the running ones: a long prompt runs a
//! chunk per iteration, each followed by a decode step of the batch, instead of whole
//! prompts back to back between two steps. A request whose prompt is all in gets its first
//! token and joins the batch. A request leaves the batch the step it ends (EOS, a stop
//! string, its budget, its client gone: mid-prefill too), and its blocks go back at once.
//! When a step needs a block the pool does not have, the request that joined last is
//! preempted (one still in its prefill first): its blocks are freed and it waits at the head
//! of the queue, to be started again from its prompt and the tokens it already has
//! (recomputed, as vLLM does).
//!
//! The HTTP side is the same as version 1's ([`super::scheduler`]): jobs in, events out, one
//! [`Event::Done`] or [`Event::Failed`] per job.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Instant;

use super::batched::{BatchError, BatchedGenerator, Next, Prefilled};
use super::kv_blocks::{KvBlockError, SeqId};
use super::sample::Sampler;
use super::scheduler::{conclude, Decoder, Event, FinishReason, Job, Scheduler, WorkerStats};
use super::text::{Piece, TextStream};

/// What the batching worker drives: a model that starts sequences in a paged cache and
/// advances many at once. [`BatchedGenerator`] is the real one; tests use a fake.
pub trait BatchEngine {
    /// The most sequences one step advances.
    fn max_batch(&self) -> usize;
    /// Takes the blocks of `seq`'s `prompt` and runs nothing yet (its prefill runs in
    /// [`BatchEngine::prefill`] calls). Out of blocks changes nothing.
    fn begin(&mut self, seq: SeqId, prompt: &[u32]) -> Result<(), BatchError>;
    /// Prompt tokens the next [`BatchEngine::prefill`] of `seq` computes (0: none pending).
    fn next_prefill(&self, seq: SeqId) -> usize;
    /// Runs the next part of `seq`'s prefill (a chunk, or the whole prompt): once the prompt
    /// is in, the next token's argmax, and its logits where `logits` asks. A failed prefill
    /// has freed the sequence's blocks.
    fn prefill(&mut self, seq: SeqId, logits: bool) -> Result<Prefilled, BatchError>;
    /// The most prompt tokens to prefill between two decode steps (at least one part runs);
    /// `None`: every admitted prompt whole before the next step.
    fn prefill_budget(&self) -> Option<usize>;
    /// Appends each `(seq, token)` and gives each sequence's next (the logits where `logits`
    /// asks: some request of the batch samples).
    fn step(&mut self, batch: &[(SeqId, u32)], logits: bool) -> Result<Vec<Next>, BatchError>;
    /// Ends `seq`, running or in its prefill, its blocks back in the pool.
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

    fn begin(&mut self, seq: SeqId, prompt: &[u32]) -> Result<(), BatchError> {
        BatchedGenerator::begin(self, seq, prompt)
    }

    fn next_prefill(&self, seq: SeqId) -> usize {
        BatchedGenerator::next_prefill(self, seq).unwrap_or(0)
    }

    fn prefill(&mut self, seq: SeqId, logits: bool) -> Result<Prefilled, BatchError> {
        BatchedGenerator::prefill(self, seq, logits)
    }

    fn prefill_budget(&self) -> Option<usize> {
        match self.options().prefill_chunk {
            0 => None,
            chunk => Some(chunk),
        }
    }

    fn step(&mut self, batch: &[(SeqId, u32)], logits: bool) -> Result<Vec<Next>, BatchError> {
        BatchedGenerator::step(self, batch, logits)
    }

    fn finish(&mut self, seq: SeqId) {
        // Only begun sequences are finished here; an unknown one has nothing to free.
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

/// A request in the batch or its prefill (or preempted, waiting to be started again).
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

const PANICKED: &str = "internal error: the engine panicked";

/// The worker's state between iterations.
struct Worker<'a, E: BatchEngine> {
    engine: E,
    cancel: &'a AtomicBool,
    stats: &'a WorkerStats,
    decode: Decoder,
    eos: Option<u32>,
    max_batch: usize,
    waiting: VecDeque<Waiting>,
    /// Admitted, their blocks taken, their prompts not all in: oldest first.
    prefilling: VecDeque<Active>,
    running: Vec<Active>,
    next_seq: SeqId,
}

fn work_batched<E: BatchEngine>(
    engine: E,
    rx: Receiver<Job>,
    cancel: &AtomicBool,
    stats: &WorkerStats,
) {
    let mut w = Worker {
        decode: engine.decoder(),
        eos: engine.eos(),
        max_batch: engine.max_batch().max(1),
        engine,
        cancel,
        stats,
        waiting: VecDeque::new(),
        prefilling: VecDeque::new(),
        running: Vec::new(),
        next_seq: 0,
    };
    let mut open = true;
    loop {
        // Take what arrived; sleep on the queue only when there is nothing to do.
        if w.idle() {
            if !open {
                break;
            }
            match rx.recv() {
                Ok(job) => w.enqueue(job),
                Err(_) => break,
            }
        }
        while open {
            match rx.try_recv() {
                Ok(job) => w.enqueue(job),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => open = false,
            }
        }
        w.admit();
        w.drop_gone();
        w.prefill();
        w.publish();
        if !w.running.is_empty() {
            w.step();
            w.publish();
        }
    }
    stats.running.store(0, Ordering::SeqCst);
}

impl<E: BatchEngine> Worker<'_, E> {
    fn idle(&self) -> bool {
        self.running.is_empty() && self.prefilling.is_empty() && self.waiting.is_empty()
    }

    fn enqueue(&mut self, job: Job) {
        self.stats.add_queued(false);
        self.waiting.push_back(Waiting::New(job));
    }

    /// Requests admitted or in the batch.
    fn busy(&self) -> usize {
        self.running.len() + self.prefilling.len()
    }

    /// Admits waiting requests while the batch has room and the pool has blocks: each takes
    /// its prompt's blocks and waits for its prefill.
    fn admit(&mut self) {
        while self.busy() < self.max_batch {
            let Some(w) = self.waiting.pop_front() else {
                break;
            };
            if gone(w.job(), self.cancel) {
                let a = match w {
                    Waiting::New(job) => activate(job, self.next_seq),
                    Waiting::Started(a) => *a,
                };
                self.end(a, Ok(FinishReason::Cancelled), false);
                continue;
            }
            self.next_seq += 1;
            let a = match w {
                Waiting::New(job) => activate(job, self.next_seq),
                Waiting::Started(mut a) => {
                    a.seq = self.next_seq;
                    *a
                }
            };
            if a.job.max_tokens == 0 {
                self.end(a, Ok(FinishReason::Length), true);
                continue;
            }
            if !self.begin(a) {
                break;
            }
        }
    }

    /// Takes `a`'s blocks; false when it must wait for blocks (put back at the head).
    fn begin(&mut self, a: Active) -> bool {
        let mut prompt = a.job.prompt.clone();
        prompt.extend_from_slice(&a.ids);
        // Admit only with a block of headroom per request in the batch or on its way there
        // (their next step): admitting into a pool they are about to fill would preempt one
        // of them at once, and a preempted request let straight back in thrashes.
        let (used, total) = self.engine.blocks();
        let busy = self.busy();
        let needed = self
            .engine
            .blocks_for(prompt.len())
            .saturating_add(busy + 1);
        if busy > 0 && total.saturating_sub(used) < needed {
            self.waiting.push_front(Waiting::Started(Box::new(a)));
            return false;
        }
        let engine = &mut self.engine;
        let begun = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            engine.begin(a.seq, &prompt)
        }));
        match begun {
            Ok(Ok(())) => {
                self.stats.prefills.fetch_add(1, Ordering::Relaxed);
                self.prefilling.push_back(a);
            }
            Ok(Err(BatchError::Blocks(KvBlockError::OutOfBlocks { .. }))) if busy > 0 => {
                // Blocks come back as the requests in the batch end: wait at the head.
                self.waiting.push_front(Waiting::Started(Box::new(a)));
                return false;
            }
            Ok(Err(e)) => self.end(a, Err(e.to_string()), false),
            Err(_) => {
                self.retire(a.seq);
                self.end(a, Err(PANICKED.into()), false);
            }
        }
        true
    }

    /// Requests whose clients left end now, in the batch or mid-prefill, their blocks back
    /// before anything runs.
    fn drop_gone(&mut self) {
        let cancel = self.cancel;
        let (gone_now, kept): (VecDeque<Active>, VecDeque<Active>) = self
            .prefilling
            .drain(..)
            .partition(|a| gone(&a.job, cancel));
        self.prefilling = kept;
        let (gone_too, kept): (Vec<Active>, Vec<Active>) =
            self.running.drain(..).partition(|a| gone(&a.job, cancel));
        self.running = kept;
        for a in gone_now.into_iter().chain(gone_too) {
            self.retire(a.seq);
            self.end(a, Ok(FinishReason::Cancelled), false);
        }
    }

    /// Runs prefill parts, the oldest request's first, until the engine's budget of tokens
    /// is spent (at least one part); a request whose prompt is in takes its first token and
    /// joins the batch.
    fn prefill(&mut self) {
        let budget = self.engine.prefill_budget();
        let mut spent = 0usize;
        while let Some(front) = self.prefilling.front() {
            let tokens = self.engine.next_prefill(front.seq);
            if budget.is_some_and(|b| spent > 0 && spent.saturating_add(tokens) > b) {
                break;
            }
            let a = self.prefilling.pop_front().expect("looked at above");
            let sampled = !a.job.sampling.is_greedy();
            let t = Instant::now();
            let engine = &mut self.engine;
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                engine.prefill(a.seq, sampled)
            }));
            self.stats.prefill_chunks.fetch_add(1, Ordering::Relaxed);
            add_micros(&self.stats.prefill_micros, t);
            match ran {
                Ok(Ok(p)) => {
                    spent = spent.saturating_add(p.tokens);
                    self.prefilled(a, p.next);
                }
                Ok(Err(e)) => {
                    // The engine freed the blocks; the count is published before the event.
                    self.retire(a.seq);
                    self.end(a, Err(e.to_string()), false);
                }
                Err(_) => {
                    self.retire(a.seq);
                    self.end(a, Err(PANICKED.into()), false);
                }
            }
        }
    }

    /// After a prefill part of `a`: back at the head of the prefills while its prompt is not
    /// all in, else its first token taken and into the batch (or ended).
    fn prefilled(&mut self, a: Active, next: Option<Next>) {
        let Some(next) = next else {
            self.prefilling.push_front(a);
            return;
        };
        self.advance(a, next);
    }

    /// `a` takes its token `next`: it runs on in the batch, or ends (its blocks freed).
    fn advance(&mut self, mut a: Active, next: Next) {
        match take(&mut a, next, self.eos, self.cancel, &self.decode) {
            After::Continue => self.running.push(a),
            After::Finished(outcome, flush) => {
                self.retire(a.seq);
                self.end(a, outcome, flush);
            }
        }
    }

    /// One decode step of the batch, and what its tokens do to each request.
    fn step(&mut self) {
        let batch: Vec<(SeqId, u32)> = self.running.iter().map(|a| (a.seq, a.last)).collect();
        // Logits rows only where a request of the batch samples.
        let sampled = self.running.iter().any(|a| !a.job.sampling.is_greedy());
        let stats = self.stats;
        let t = Instant::now();
        let engine = &mut self.engine;
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
            Ok(Ok(nexts)) => self.stepped(nexts),
            Ok(Err(BatchError::Blocks(KvBlockError::OutOfBlocks { .. })))
                if !self.prefilling.is_empty() || self.running.len() > 1 =>
            {
                self.preempt()
            }
            Ok(Err(BatchError::ContextFull { seq, .. })) => {
                // The HTTP layer keeps prompt + max_tokens within the context, so this is a
                // request at its limit: it ends as "length".
                if let Some(i) = self.running.iter().position(|a| a.seq == seq) {
                    let a = self.running.remove(i);
                    self.retire(a.seq);
                    self.end(a, Ok(FinishReason::Length), true);
                }
            }
            Ok(Err(e)) => self.fail_running(&e.to_string()),
            Err(_) => self.fail_running(PANICKED),
        }
        add_micros(&stats.host_micros, t);
    }

    /// Each running request takes its token of the step.
    fn stepped(&mut self, nexts: Vec<Next>) {
        let running = std::mem::take(&mut self.running);
        for (a, next) in running.into_iter().zip(nexts) {
            self.advance(a, next);
        }
    }

    /// Frees the blocks of the request that joined last (one still in its prefill first: it
    /// has generated nothing yet); it waits at the head of the queue, and the others step
    /// again next time.
    fn preempt(&mut self) {
        let Some(a) = self.prefilling.pop_back().or_else(|| self.running.pop()) else {
            return;
        };
        self.retire(a.seq);
        self.stats.preempted.fetch_add(1, Ordering::Relaxed);
        self.waiting.push_front(Waiting::Started(Box::new(a)));
    }

    /// A failed step fails the requests in it; the server goes on.
    fn fail_running(&mut self, msg: &str) {
        for a in std::mem::take(&mut self.running) {
            self.retire(a.seq);
            self.end(a, Err(msg.to_string()), false);
        }
    }

    /// Frees `seq`'s blocks and publishes the count before its client hears it ended, so a
    /// client (or a test) that reads /metrics after its last chunk sees the blocks back.
    fn retire(&mut self, seq: SeqId) {
        self.engine.finish(seq);
        self.publish();
    }

    fn publish(&self) {
        let (used, total) = self.engine.blocks();
        let stats = self.stats;
        stats.kv_blocks_used.store(used, Ordering::Relaxed);
        stats.kv_blocks_total.store(total, Ordering::Relaxed);
        stats.running.store(self.busy(), Ordering::SeqCst);
    }

    /// Counts a request and sends its last events (`flush`: the held-back text first).
    fn end(&self, a: Active, outcome: Result<FinishReason, String>, flush: bool) {
        end(a, outcome, flush, self.stats, &self.decode);
    }
}

fn add_micros(to: &std::sync::atomic::AtomicU64, since: Instant) {
    to.fetch_add(since.elapsed().as_micros() as u64, Ordering::Relaxed);
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
    use std::sync::mpsc::{channel, Receiver, Sender};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;
    use crate::serve::sample::SamplingParams;
    use crate::serve::scheduler::tests::{collect, done, job};

    /// An engine call, as the counting engine saw it.
    #[derive(Clone, Debug, PartialEq)]
    enum Call {
        Begin(SeqId),
        /// A prefill part of so many tokens.
        Prefill(SeqId, usize),
        /// A decode step of these sequences.
        Step(Vec<SeqId>),
        Finish(SeqId),
    }

    type Log = Arc<Mutex<Vec<Call>>>;

    /// A paged engine that counts up from each sequence's last token (EOS at 100), with a pool
    /// of `blocks` one-token blocks, prompts prefilled in parts of `chunk` tokens (0: whole),
    /// and a log of its calls.
    struct Counting {
        /// The worker's first call (for the decoder, before its loop) waits here until the
        /// test has queued its jobs: the first iteration sees them all.
        hold: Mutex<Option<Receiver<()>>>,
        /// The prefill call of this number (from 1) says so on the sender and waits on the
        /// receiver.
        pause: Option<(usize, Sender<()>, Receiver<()>)>,
        prefills: usize,
        blocks: usize,
        chunk: usize,
        held: HashMap<SeqId, usize>,
        /// Each begun sequence's prompt and the tokens of it prefilled.
        pending: HashMap<SeqId, (Vec<u32>, usize)>,
        log: Log,
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

        fn log(&self, call: Call) {
            self.log.lock().unwrap().push(call);
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

        fn begin(&mut self, seq: SeqId, prompt: &[u32]) -> Result<(), BatchError> {
            self.take(seq, prompt.len())?;
            self.pending.insert(seq, (prompt.to_vec(), 0));
            self.log(Call::Begin(seq));
            Ok(())
        }

        fn next_prefill(&self, seq: SeqId) -> usize {
            self.pending.get(&seq).map_or(0, |(p, done)| {
                let left = p.len() - done;
                if self.chunk == 0 {
                    left
                } else {
                    left.min(self.chunk)
                }
            })
        }

        fn prefill(&mut self, seq: SeqId, _: bool) -> Result<Prefilled, BatchError> {
            self.prefills += 1;
            if let Some((at, reached, resume)) = &self.pause {
                if *at == self.prefills {
                    reached.send(()).unwrap();
                    let _ = resume.recv_timeout(Duration::from_secs(10));
                }
            }
            let tokens = self.next_prefill(seq);
            let (prompt, done) = self
                .pending
                .get_mut(&seq)
                .ok_or(BatchError::UnknownSequence(seq))?;
            *done += tokens;
            let next = (*done == prompt.len()).then(|| next(*prompt.last().unwrap()));
            if next.is_some() {
                self.pending.remove(&seq);
            }
            self.log(Call::Prefill(seq, tokens));
            Ok(Prefilled { tokens, next })
        }

        fn prefill_budget(&self) -> Option<usize> {
            (self.chunk > 0).then_some(self.chunk)
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
                assert!(
                    !self.pending.contains_key(&seq),
                    "{seq} stepped in its prefill"
                );
                self.take(seq, 1)?;
            }
            self.log(Call::Step(batch.iter().map(|&(s, _)| s).collect()));
            Ok(batch.iter().map(|&(_, t)| next(t)).collect())
        }

        fn finish(&mut self, seq: SeqId) {
            self.held.remove(&seq);
            self.pending.remove(&seq);
            self.log(Call::Finish(seq));
        }

        fn blocks(&self) -> (usize, usize) {
            (self.held.values().sum(), self.blocks)
        }

        fn blocks_for(&self, tokens: usize) -> usize {
            tokens
        }

        fn decoder(&self) -> Decoder {
            if let Some(h) = self.hold.lock().unwrap().take() {
                let _ = h.recv_timeout(Duration::from_secs(10));
            }
            Arc::new(|ids: &[u32]| Ok(ids.iter().map(|i| format!("<{i}>")).collect()))
        }

        fn eos(&self) -> Option<u32> {
            Some(100)
        }
    }

    /// The scheduler over a counting engine of `blocks` and prefill parts of `chunk`, its worker
    /// held until the returned sender sends; `pause` as [`Counting::pause`].
    fn start_paused(
        blocks: usize,
        chunk: usize,
        pause: Option<(usize, Sender<()>, Receiver<()>)>,
    ) -> (Scheduler, Log, Sender<()>) {
        let log = Arc::new(Mutex::new(Vec::new()));
        let l2 = log.clone();
        let (go, hold) = channel();
        let (s, ()) = Scheduler::start_batched(16, move || {
            Ok((
                Counting {
                    hold: Mutex::new(Some(hold)),
                    pause,
                    prefills: 0,
                    blocks,
                    chunk,
                    held: HashMap::new(),
                    pending: HashMap::new(),
                    log: l2,
                },
                (),
            ))
        })
        .unwrap();
        (s, log, go)
    }

    fn start(blocks: usize, chunk: usize) -> (Scheduler, Log, Sender<()>) {
        start_paused(blocks, chunk, None)
    }

    /// The sizes of the decode steps in `log`.
    fn step_sizes(log: &Log) -> Vec<usize> {
        log.lock()
            .unwrap()
            .iter()
            .filter_map(|c| match c {
                Call::Step(b) => Some(b.len()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn jobs_end_as_on_version_one_and_run_together() {
        // Whole prompts, and prompts in parts of one token.
        for chunk in [0, 1] {
            jobs_end_as_on_version_one(chunk);
        }
    }

    fn jobs_end_as_on_version_one(chunk: usize) {
        let (s, log, go) = start(1000, chunk);
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
        let steps = step_sizes(&log);
        assert!(steps.iter().any(|&n| n > 1), "{steps:?}");
        assert!(steps.iter().all(|&n| n <= 4), "{steps:?}");
        assert_eq!(s.stats.completed.load(Ordering::Relaxed), 6);
        s.shutdown();
    }

    #[test]
    fn out_of_blocks_preempts_the_last_and_every_text_is_whole() {
        for chunk in [0, 1, 3] {
            out_of_blocks_preempts(chunk);
        }
    }

    fn out_of_blocks_preempts(chunk: usize) {
        // 12 blocks: three prompts of 2 take 6; their steps run out after two tokens each,
        // the last-joined request is preempted and started again from prompt + its tokens.
        let (s, log, go) = start(12, chunk);
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
        let parts = prefill_parts(&log);
        assert!(
            parts
                .iter()
                .all(|&(_, t)| t >= 1 && (chunk == 0 || t <= chunk)),
            "{parts:?}"
        );
    }

    /// The prefill parts in `log`: (sequence, tokens).
    fn prefill_parts(log: &Log) -> Vec<(SeqId, usize)> {
        log.lock()
            .unwrap()
            .iter()
            .filter_map(|c| match c {
                Call::Prefill(seq, t) => Some((*seq, *t)),
                _ => None,
            })
            .collect()
    }

    /// Where in `log` sequence `seq`'s prefill parts are.
    fn parts_of(log: &[Call], seq: SeqId) -> Vec<usize> {
        log.iter()
            .enumerate()
            .filter(|(_, c)| matches!(c, Call::Prefill(s, _) if *s == seq))
            .map(|(i, _)| i)
            .collect()
    }

    /// A job whose prompt is `n` tokens ending in `last`.
    fn long_job(
        n: usize,
        last: u32,
        max_tokens: usize,
    ) -> (Job, tokio::sync::mpsc::UnboundedReceiver<Event>) {
        let (mut j, rx) = job(last, max_tokens, &[]);
        j.prompt = vec![1; n - 1];
        j.prompt.push(last);
        (j, rx)
    }

    #[test]
    fn a_long_prompt_runs_in_chunks_between_decode_steps() {
        // A (2 tokens) and B (13 tokens) are admitted together. With chunks of 4, A's whole
        // prompt and then one chunk of B's a step: A steps between B's chunks, and B joins the
        // batch after its fourth chunk (4 + 4 + 4 + 1).
        let (s, log, go) = start(1000, 4);
        let (a, ra) = job(10, 8, &[]);
        let (b, rb) = long_job(13, 40, 3);
        s.submit(a).unwrap();
        s.submit(b).unwrap();
        go.send(()).unwrap();
        let want: String = (11..=18).map(|i| format!("<{i}>")).collect();
        assert_eq!(collect(ra), (want, done(FinishReason::Length, 8)));
        let (text, end) = collect(rb);
        assert_eq!(text, "<41><42><43>");
        assert!(matches!(end, Event::Done(f) if f.prompt_tokens == 13));
        s.shutdown();
        let log = log.lock().unwrap().clone();
        let b_parts: Vec<usize> = parts_of(&log, 2)
            .iter()
            .map(|&i| match log[i] {
                Call::Prefill(_, t) => t,
                _ => unreachable!("parts_of gives prefills"),
            })
            .collect();
        assert_eq!(b_parts, [4, 4, 4, 1], "{log:?}");
        // Between every two of B's chunks, a decode step of A alone.
        let at = parts_of(&log, 2);
        for w in at.windows(2) {
            assert!(
                log[w[0]..w[1]].contains(&Call::Step(vec![1])),
                "no step between chunks: {log:?}"
            );
        }
        // B is in a step only after its last chunk.
        let first_b_step = log
            .iter()
            .position(|c| matches!(c, Call::Step(b) if b.contains(&2)))
            .unwrap();
        assert!(first_b_step > at[3], "{log:?}");
        assert_eq!(s.stats.prefill_chunks.load(Ordering::Relaxed), 5);
        assert_eq!(s.stats.prefills.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn whole_prompts_run_before_the_next_step() {
        // --prefill-chunk 0: B's 13 tokens in one part, before any step.
        let (s, log, go) = start(1000, 0);
        let (a, ra) = job(10, 3, &[]);
        let (b, rb) = long_job(13, 40, 3);
        s.submit(a).unwrap();
        s.submit(b).unwrap();
        go.send(()).unwrap();
        collect(ra);
        collect(rb);
        s.shutdown();
        let log = log.lock().unwrap().clone();
        assert_eq!(
            log[..4],
            [
                Call::Begin(1),
                Call::Begin(2),
                Call::Prefill(1, 2),
                Call::Prefill(2, 13)
            ],
            "{log:?}"
        );
    }

    #[test]
    fn short_prompts_share_one_budget() {
        // Chunks of 8: prompts of 2, 2, 2 and 5 tokens; the first three fit one budget (6),
        // the fourth would pass it and waits for the next.
        let (s, log, go) = start(1000, 8);
        let rx: Vec<_> = [(2, 10), (2, 20), (2, 30), (5, 40)]
            .into_iter()
            .map(|(n, last)| {
                let (j, rx) = long_job(n, last, 2);
                s.submit(j).unwrap();
                rx
            })
            .collect();
        go.send(()).unwrap();
        for rx in rx {
            assert!(matches!(collect(rx).1, Event::Done(_)));
        }
        s.shutdown();
        let log = log.lock().unwrap().clone();
        let first_step = log.iter().position(|c| matches!(c, Call::Step(_))).unwrap();
        let before: Vec<&Call> = log[..first_step]
            .iter()
            .filter(|c| matches!(c, Call::Prefill(..)))
            .collect();
        assert_eq!(
            before,
            [
                &Call::Prefill(1, 2),
                &Call::Prefill(2, 2),
                &Call::Prefill(3, 2)
            ],
            "{log:?}"
        );
    }

    #[test]
    fn a_request_cancelled_mid_prefill_frees_its_blocks() {
        // A generates; B's prompt of 40 runs a token a step. The engine pauses in B's second
        // chunk (the fourth prefill call: A's two, then B's first two), B's client leaves, and
        // the next iteration frees B's blocks before running anything else of it.
        let (reached, on_reach) = channel();
        let (resume, on_resume) = channel();
        let (s, log, go) = start_paused(1000, 1, Some((4, reached, on_resume)));
        let (mut a, ra) = job(10, 30, &[]);
        a.ignore_eos = true;
        let (b, rb) = long_job(40, 50, 5);
        s.submit(a).unwrap();
        s.submit(b).unwrap();
        go.send(()).unwrap();
        on_reach.recv_timeout(Duration::from_secs(10)).unwrap();
        drop(rb);
        resume.send(()).unwrap();
        let want: String = (11..=40).map(|i| format!("<{i}>")).collect();
        assert_eq!(collect(ra), (want, done(FinishReason::Length, 30)));
        s.shutdown();
        assert_eq!(s.stats.cancelled.load(Ordering::Relaxed), 1);
        assert_eq!(s.stats.kv_blocks_used.load(Ordering::Relaxed), 0);
        let log = log.lock().unwrap().clone();
        let finish = log.iter().position(|c| *c == Call::Finish(2)).unwrap();
        let parts = parts_of(&log, 2);
        assert_eq!(parts.len(), 2, "{log:?}");
        assert!(parts.iter().all(|&i| i < finish), "{log:?}");
        // Freed in the iteration after the pause: at most A's step in between.
        assert!(finish - parts[1] <= 2, "{log:?}");
        assert!(!log
            .iter()
            .any(|c| matches!(c, Call::Step(b) if b.contains(&2))));
    }
}
