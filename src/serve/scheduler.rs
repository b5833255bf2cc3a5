//! The scheduler, version 1: one worker thread owns the engine (today's [`Generator`], one
//! sequence at a time through its contiguous KV cache) and runs jobs in arrival order from a
//! bounded queue. Plain Rust (std threads and channels), testable without a model or a GPU.
//!
//! The HTTP layer talks to it through [`Scheduler::submit`] and a job's event channel only, so
//! a batching scheduler (paged KV cache, continuous batching: the next step, see
//! docs/decisions.md) can replace the worker loop without touching the routes: a job is
//! already "a prompt, a budget, a sampler, stop strings, and a channel to stream into".
//!
//! A job ends, in every case, with exactly one [`Event::Done`] or [`Event::Failed`] (unless its
//! receiver is gone, which is what cancels it).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use thiserror::Error;
use tokio::sync::mpsc::UnboundedSender;

use super::sample::{Sampler, SamplingParams};
use super::text::{Piece, TextStream};
use crate::generate::{Generator, SampleFn, Stop};

/// What runs a job: the model behind the worker.
pub trait Engine {
    /// Generates up to `max_tokens` after `prompt` (ids already checked against the context),
    /// each token from `sampler` when given, else the argmax, stopping at the model's EOS
    /// where `stop_at_eos`; calls `on_token` with each new token (false stops). Returns why it
    /// stopped.
    fn generate(
        &mut self,
        prompt: &[u32],
        max_tokens: usize,
        stop_at_eos: bool,
        sampler: Option<SampleFn<'_>>,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Stop, String>;

    /// Turns ids into text; called from inside [`Engine::generate`]'s callback, so it must
    /// not borrow the engine.
    fn decoder(&self) -> Decoder;
}

/// Ids to text (the tokenizer, shared).
pub type Decoder = Arc<dyn Fn(&[u32]) -> Result<String, String> + Send + Sync>;

impl Engine for Generator {
    fn generate(
        &mut self,
        prompt: &[u32],
        max_tokens: usize,
        stop_at_eos: bool,
        sampler: Option<SampleFn<'_>>,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Stop, String> {
        self.generate_until(prompt, max_tokens, sampler, stop_at_eos, on_token)
            .map(|g| g.stats.stop)
            .map_err(|e| e.to_string())
    }

    fn decoder(&self) -> Decoder {
        let tokenizer = self.model.tokenizer.clone();
        Arc::new(move |ids: &[u32]| tokenizer.decode(ids).map_err(|e| e.to_string()))
    }
}

/// One request, ready to run.
#[derive(Debug)]
pub struct Job {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// Generate past EOS up to `max_tokens` (the request's `ignore_eos`).
    pub ignore_eos: bool,
    /// Where the text goes; dropping the receiver cancels the job at its next token.
    pub events: UnboundedSender<Event>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS or a stop string (OpenAI's "stop").
    Stop,
    /// `max_tokens` reached (OpenAI's "length").
    Length,
    /// The client went away or the server is shutting down.
    Cancelled,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Finish {
    pub reason: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// More text (never empty).
    Text(String),
    Done(Finish),
    /// The engine failed: this job ends, the worker goes on.
    Failed(String),
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum SubmitError {
    #[error("{waiting} requests are waiting already (the queue holds {limit})")]
    QueueFull { waiting: usize, limit: usize },
    #[error("the server is shutting down")]
    ShuttingDown,
}

/// Counters the worker keeps, read by `/metrics`.
#[derive(Debug, Default)]
pub struct WorkerStats {
    /// Jobs waiting in the queue (not the one running).
    pub queued: AtomicUsize,
    /// Jobs generating (version 1: 0 or 1; the batching worker: the batch).
    pub running: AtomicUsize,
    pub prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Time spent generating, in microseconds (tokens/s = generated / this).
    pub generate_micros: AtomicU64,
    pub completed: AtomicU64,
    pub cancelled: AtomicU64,
    pub failed: AtomicU64,
    /// The last finished job's generated tokens per second, as f64 bits.
    pub last_tokens_per_s: AtomicU64,
    /// Requests preempted (blocks freed, started again later) by the batching worker.
    pub preempted: AtomicU64,
    /// The batching worker's time: prefills (prompts begun, the parts they ran in: chunks or
    /// whole prompts, µs), decode steps (count, µs, and the batch size histogram: steps of at
    /// most 2^i requests, i < 7, then more), and the host work between steps (sampling, text,
    /// events; µs).
    pub prefills: AtomicU64,
    pub prefill_chunks: AtomicU64,
    pub prefill_micros: AtomicU64,
    pub steps: AtomicU64,
    pub step_micros: AtomicU64,
    pub step_sizes: [AtomicU64; 8],
    /// Requests advanced, over every step (the histogram's sum).
    pub step_rows: AtomicU64,
    pub host_micros: AtomicU64,
    /// KV-cache blocks in use and in all (the batching worker's pool; 0 for version 1).
    pub kv_blocks_used: AtomicUsize,
    pub kv_blocks_total: AtomicUsize,
    /// Signalled whenever `queued` changes (see [`WorkerStats::wait_queue`]).
    queue_lock: Mutex<()>,
    queue_changed: Condvar,
}

impl WorkerStats {
    /// Counts a job into (`up`) or out of the queue and wakes whoever waits on the count.
    pub(super) fn add_queued(&self, up: bool) {
        if up {
            self.queued.fetch_add(1, Ordering::SeqCst);
        } else {
            self.queued.fetch_sub(1, Ordering::SeqCst);
        }
        // Taken after the change: a waiter checks and sleeps under this lock, so it cannot
        // miss the wake-up.
        let _g = self.queue_lock.lock().unwrap_or_else(|p| p.into_inner());
        self.queue_changed.notify_all();
    }

    /// Waits until `done` holds of the number of queued jobs, or `timeout` passes; whether
    /// it does.
    pub fn wait_queue(&self, timeout: Duration, done: impl Fn(usize) -> bool) -> bool {
        let queued = || self.queued.load(Ordering::SeqCst);
        let g = self.queue_lock.lock().unwrap_or_else(|p| p.into_inner());
        let _g = self
            .queue_changed
            .wait_timeout_while(g, timeout, |_| !done(queued()))
            .unwrap_or_else(|p| p.into_inner());
        done(queued())
    }
}

/// A worker loop: the engine, the queue, the cancel flag, the counters.
pub(super) type Worker<E> = fn(E, Receiver<Job>, &AtomicBool, &WorkerStats);

/// The submitting side; shared by the HTTP handlers.
pub struct Scheduler {
    queue: Mutex<Option<SyncSender<Job>>>,
    limit: usize,
    /// Set by [`Scheduler::cancel_all`]: the running job stops at its next token, queued ones
    /// end as cancelled.
    cancel: Arc<AtomicBool>,
    pub stats: Arc<WorkerStats>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl Scheduler {
    /// Starts the worker thread, which builds its engine with `make` (so the engine need not
    /// be `Send`: GPU sessions stay on the thread that made them) and sends back `make`'s
    /// second value. At most `max_queue` jobs wait besides the one running.
    pub fn start<E, T, F>(max_queue: usize, make: F) -> Result<(Scheduler, T), String>
    where
        E: Engine + 'static,
        T: Send + 'static,
        F: FnOnce() -> Result<(E, T), String> + Send + 'static,
    {
        Scheduler::spawn(max_queue, make, work::<E>)
    }

    /// The worker thread running `run` over the engine `make` builds (see
    /// [`Scheduler::start`]; the batching worker's `Scheduler::start_batched` is in
    /// [`super::batch_worker`]).
    pub(super) fn spawn<E, T, F>(
        max_queue: usize,
        make: F,
        run: Worker<E>,
    ) -> Result<(Scheduler, T), String>
    where
        E: 'static,
        T: Send + 'static,
        F: FnOnce() -> Result<(E, T), String> + Send + 'static,
    {
        let (tx, rx) = sync_channel::<Job>(max_queue);
        let (ready_tx, ready_rx) = sync_channel::<Result<T, String>>(1);
        let cancel = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(WorkerStats::default());
        let (c, s) = (cancel.clone(), stats.clone());
        let worker = std::thread::Builder::new()
            .name("rocmforge-serve-worker".into())
            .spawn(move || match make() {
                Ok((engine, info)) => {
                    // The receiver waits for this message; if it went away there is no one
                    // to serve.
                    if ready_tx.send(Ok(info)).is_ok() {
                        run(engine, rx, &c, &s);
                    }
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            })
            .map_err(|e| format!("starting the worker thread: {e}"))?;
        let info = ready_rx
            .recv()
            .map_err(|_| "the worker thread ended before its engine was ready".to_string())??;
        Ok((
            Scheduler {
                queue: Mutex::new(Some(tx)),
                limit: max_queue,
                cancel,
                stats,
                worker: Mutex::new(Some(worker)),
            },
            info,
        ))
    }

    /// Queues `job`, or says why not (a full queue is the caller's 429).
    pub fn submit(&self, job: Job) -> Result<(), SubmitError> {
        let guard = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let Some(tx) = guard.as_ref() else {
            return Err(SubmitError::ShuttingDown);
        };
        // Counted before sending so that the worker's decrement never goes below zero.
        self.stats.add_queued(true);
        match tx.try_send(job) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.stats.add_queued(false);
                match e {
                    TrySendError::Full(_) => Err(SubmitError::QueueFull {
                        waiting: self.stats.queued.load(Ordering::SeqCst),
                        limit: self.limit,
                    }),
                    TrySendError::Disconnected(_) => Err(SubmitError::ShuttingDown),
                }
            }
        }
    }

    pub fn queue_limit(&self) -> usize {
        self.limit
    }

    /// Stops the running job at its next token and ends the queued ones as cancelled.
    pub fn cancel_all(&self) {
        self.cancel.store(true, Ordering::SeqCst);
    }

    /// Refuses new jobs, lets the worker finish what is queued (or cancel it, after
    /// [`Scheduler::cancel_all`]) and waits for it.
    pub fn shutdown(&self) {
        drop(self.queue.lock().unwrap_or_else(|p| p.into_inner()).take());
        let worker = self.worker.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(w) = worker {
            // A panic in the worker has already failed its job's channel (dropped sender).
            let _ = w.join();
        }
    }
}

fn work<E: Engine>(mut engine: E, rx: Receiver<Job>, cancel: &AtomicBool, stats: &WorkerStats) {
    let decode = engine.decoder();
    while let Ok(job) = rx.recv() {
        stats.add_queued(false);
        if job.events.is_closed() || cancel.load(Ordering::SeqCst) {
            stats.cancelled.fetch_add(1, Ordering::Relaxed);
            let _ = job.events.send(Event::Done(Finish {
                reason: FinishReason::Cancelled,
                prompt_tokens: job.prompt.len(),
                completion_tokens: 0,
            }));
            continue;
        }
        stats.running.store(1, Ordering::SeqCst);
        let events = job.events.clone();
        // A panic in the engine fails its request, not the server: the next job starts from
        // its own prefill, which rewrites the cache it reads.
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_job(&mut engine, &decode, job, cancel, stats)
        }));
        if run.is_err() {
            stats.failed.fetch_add(1, Ordering::Relaxed);
            let _ = events.send(Event::Failed("internal error: the engine panicked".into()));
        }
        stats.running.store(0, Ordering::SeqCst);
    }
}

fn run_job<E: Engine>(
    engine: &mut E,
    decode: &Decoder,
    job: Job,
    cancel: &AtomicBool,
    stats: &WorkerStats,
) {
    let t0 = Instant::now();
    let mut text = TextStream::new(job.stop.clone());
    let mut generated = 0usize;
    // Set by the callback when it stops generation: a stop string, or the client gone.
    let mut ended: Option<FinishReason> = None;
    let mut failure: Option<String> = None;
    let mut sampler = Sampler::new(job.sampling.clone());
    let mut sample = |logits: &[f32]| sampler.sample(logits);
    let sampler: Option<SampleFn<'_>> = if job.sampling.is_greedy() {
        None
    } else {
        Some(&mut sample)
    };
    let events = &job.events;
    let mut on_token = |t: u32| -> bool {
        generated += 1;
        if cancel.load(Ordering::SeqCst) || events.is_closed() {
            ended = Some(FinishReason::Cancelled);
            return false;
        }
        let (piece, more) = match text.push(t, |ids| decode(ids)) {
            Ok(Piece::Text(s)) => (s, true),
            Ok(Piece::Stop(s)) => {
                ended = Some(FinishReason::Stop);
                (s, false)
            }
            Err(e) => {
                failure = Some(e);
                return false;
            }
        };
        // A send fails only when the receiver is gone: the next token sees that and stops.
        if !piece.is_empty() {
            let _ = events.send(Event::Text(piece));
        }
        more
    };
    let result = engine.generate(
        &job.prompt,
        job.max_tokens,
        !job.ignore_eos,
        sampler,
        &mut on_token,
    );
    let micros = t0.elapsed().as_micros() as u64;
    let outcome = match (result, failure, ended) {
        (Err(e), _, _) | (Ok(_), Some(e), _) => Err(e),
        (Ok(_), None, Some(reason)) => Ok(reason),
        (Ok(Stop::Eos), None, None) => Ok(FinishReason::Stop),
        (Ok(Stop::Length), None, None) => Ok(FinishReason::Length),
        // Only this callback stops generation, and it says why when it does.
        (Ok(Stop::Callback), None, None) => Ok(FinishReason::Cancelled),
    };
    // After EOS or the budget, the held-back text is sent; after a stop string the text ends
    // before it.
    let flush = ended.is_none();
    conclude(
        &job, &mut text, outcome, flush, generated, micros, stats, decode,
    );
}

/// Counts a finished job (`generated` tokens in `micros`) and sends its last events: the
/// held-back text where `flush` says, then [`Event::Done`]; or [`Event::Failed`].
#[allow(clippy::too_many_arguments)]
pub(super) fn conclude(
    job: &Job,
    text: &mut TextStream,
    outcome: Result<FinishReason, String>,
    flush: bool,
    generated: usize,
    micros: u64,
    stats: &WorkerStats,
    decode: &Decoder,
) {
    let events = &job.events;
    stats
        .prompt_tokens
        .fetch_add(job.prompt.len() as u64, Ordering::Relaxed);
    stats
        .generated_tokens
        .fetch_add(generated as u64, Ordering::Relaxed);
    stats.generate_micros.fetch_add(micros, Ordering::Relaxed);
    if micros > 0 {
        let rate = generated as f64 / (micros as f64 * 1e-6);
        stats
            .last_tokens_per_s
            .store(rate.to_bits(), Ordering::Relaxed);
    }
    let finish = |reason| {
        Event::Done(Finish {
            reason,
            prompt_tokens: job.prompt.len(),
            completion_tokens: generated,
        })
    };
    match outcome {
        Err(e) => {
            stats.failed.fetch_add(1, Ordering::Relaxed);
            let _ = events.send(Event::Failed(e));
        }
        Ok(FinishReason::Cancelled) => {
            stats.cancelled.fetch_add(1, Ordering::Relaxed);
            let _ = events.send(finish(FinishReason::Cancelled));
        }
        Ok(reason) => {
            let rest = if flush {
                text.finish(|ids| decode(ids))
            } else {
                Ok(String::new())
            };
            match rest {
                Ok(rest) => {
                    if !rest.is_empty() {
                        let _ = events.send(Event::Text(rest));
                    }
                    stats.completed.fetch_add(1, Ordering::Relaxed);
                    let _ = events.send(finish(reason));
                }
                Err(e) => {
                    stats.failed.fetch_add(1, Ordering::Relaxed);
                    let _ = events.send(Event::Failed(e));
                }
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::mpsc::channel;
    use std::time::Duration;

    use tokio::sync::mpsc::unbounded_channel;

    use super::*;

    /// An engine that counts up from the prompt's last id (EOS at 100, "fail" at 66 as an
    /// error, a panic at 77) and can be held at a token until the test lets it go.
    struct Counter {
        gate: Option<Receiver<()>>,
    }

    impl Engine for Counter {
        fn generate(
            &mut self,
            prompt: &[u32],
            max_tokens: usize,
            stop_at_eos: bool,
            mut sampler: Option<SampleFn<'_>>,
            on_token: &mut dyn FnMut(u32) -> bool,
        ) -> Result<Stop, String> {
            let mut t = *prompt.last().unwrap();
            for _ in 0..max_tokens {
                t = match sampler.as_mut() {
                    // A one-hot row: every sampler must pick its token.
                    Some(s) => s(&(0..200)
                        .map(|i| if i == t + 1 { 50.0 } else { -50.0 })
                        .collect::<Vec<_>>()),
                    None => t + 1,
                };
                match t {
                    66 => return Err("device fault".into()),
                    77 => panic!("engine bug"),
                    100 if stop_at_eos => return Ok(Stop::Eos),
                    _ => {}
                }
                if let Some(g) = &self.gate {
                    let _ = g.recv_timeout(Duration::from_secs(5));
                }
                if !on_token(t) {
                    return Ok(Stop::Callback);
                }
            }
            Ok(Stop::Length)
        }

        fn decoder(&self) -> Decoder {
            Arc::new(|ids: &[u32]| Ok(ids.iter().map(|i| format!("<{i}>")).collect()))
        }
    }

    /// A greedy job whose prompt ends in `last`.
    pub(in crate::serve) fn job(
        last: u32,
        max_tokens: usize,
        stop: &[&str],
    ) -> (Job, tokio::sync::mpsc::UnboundedReceiver<Event>) {
        let (tx, rx) = unbounded_channel();
        let j = Job {
            prompt: vec![1, last],
            max_tokens,
            sampling: SamplingParams::greedy(),
            stop: stop.iter().map(|s| s.to_string()).collect(),
            ignore_eos: false,
            events: tx,
        };
        (j, rx)
    }

    /// The job's text and its last event.
    pub(in crate::serve) fn collect(
        mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
    ) -> (String, Event) {
        let mut text = String::new();
        loop {
            match rx
                .blocking_recv()
                .expect("every job ends with Done or Failed")
            {
                Event::Text(t) => text.push_str(&t),
                end => return (text, end),
            }
        }
    }

    pub(in crate::serve) fn done(reason: FinishReason, completion_tokens: usize) -> Event {
        Event::Done(Finish {
            reason,
            prompt_tokens: 2,
            completion_tokens,
        })
    }

    #[test]
    fn jobs_run_in_order_and_end_as_they_should() {
        let (s, ()) = Scheduler::start(4, || Ok((Counter { gate: None }, ()))).unwrap();
        let (j, rx) = job(10, 3, &[]);
        s.submit(j).unwrap();
        assert_eq!(
            collect(rx),
            ("<11><12><13>".into(), done(FinishReason::Length, 3))
        );
        let (j, rx) = job(97, 10, &[]);
        s.submit(j).unwrap();
        assert_eq!(
            collect(rx),
            ("<98><99>".into(), done(FinishReason::Stop, 2))
        );
        // With ignore_eos the EOS token (100) is text like any other, up to the budget.
        let (mut j, rx) = job(97, 5, &[]);
        j.ignore_eos = true;
        s.submit(j).unwrap();
        assert_eq!(
            collect(rx),
            (
                "<98><99><100><101><102>".into(),
                done(FinishReason::Length, 5)
            )
        );
        let (j, rx) = job(10, 10, &["<13>"]);
        s.submit(j).unwrap();
        assert_eq!(
            collect(rx),
            ("<11><12>".into(), done(FinishReason::Stop, 3))
        );
        // Sampling goes through the logits.
        let (mut j, rx) = job(20, 2, &[]);
        j.sampling = SamplingParams {
            temperature: 0.8,
            top_k: 0,
            top_p: 0.9,
            seed: 1,
        };
        s.submit(j).unwrap();
        assert_eq!(
            collect(rx),
            ("<21><22>".into(), done(FinishReason::Length, 2))
        );
        // An engine error and an engine panic fail their job; the worker goes on.
        let (j, rx) = job(64, 10, &[]);
        s.submit(j).unwrap();
        assert_eq!(
            collect(rx),
            ("<65>".into(), Event::Failed("device fault".into()))
        );
        let (j, rx) = job(75, 10, &[]);
        s.submit(j).unwrap();
        assert!(matches!(collect(rx).1, Event::Failed(m) if m.contains("panicked")));
        let (j, rx) = job(1, 1, &[]);
        s.submit(j).unwrap();
        assert_eq!(collect(rx), ("<2>".into(), done(FinishReason::Length, 1)));
        assert_eq!(s.stats.failed.load(Ordering::Relaxed), 2);
        assert_eq!(s.stats.completed.load(Ordering::Relaxed), 6);
        s.shutdown();
        let (j, _rx) = job(1, 1, &[]);
        assert_eq!(s.submit(j), Err(SubmitError::ShuttingDown));
    }

    #[test]
    fn a_full_queue_refuses_and_a_dropped_receiver_cancels() {
        let (gate_tx, gate_rx) = channel();
        let (s, ()) = Scheduler::start(1, move || {
            Ok((
                Counter {
                    gate: Some(gate_rx),
                },
                (),
            ))
        })
        .unwrap();
        // The first job runs (held at its first token), the second waits, the third is refused.
        let (a, mut rx_a) = job(10, 50, &[]);
        s.submit(a).unwrap();
        assert!(s.stats.wait_queue(Duration::from_secs(10), |q| q == 0));
        let (b, rx_b) = job(30, 2, &[]);
        s.submit(b).unwrap();
        let (c, _rx_c) = job(40, 2, &[]);
        assert_eq!(
            s.submit(c),
            Err(SubmitError::QueueFull {
                waiting: 1,
                limit: 1
            })
        );
        assert_eq!(s.stats.queued.load(Ordering::SeqCst), 1);
        // Let a go two tokens, read them, then hang up: a stops at its next token.
        gate_tx.send(()).unwrap();
        gate_tx.send(()).unwrap();
        assert_eq!(rx_a.blocking_recv(), Some(Event::Text("<11>".into())));
        drop(rx_a);
        for _ in 0..100 {
            let _ = gate_tx.send(());
        }
        assert_eq!(
            collect(rx_b),
            ("<31><32>".into(), done(FinishReason::Length, 2))
        );
        assert_eq!(s.stats.cancelled.load(Ordering::Relaxed), 1);
        assert!(s.stats.generated_tokens.load(Ordering::Relaxed) < 50 + 2);
        s.shutdown();
    }

    #[test]
    fn cancel_all_stops_the_running_job_and_the_queued_ones() {
        let (gate_tx, gate_rx) = channel();
        let (s, ()) = Scheduler::start(2, move || {
            Ok((
                Counter {
                    gate: Some(gate_rx),
                },
                (),
            ))
        })
        .unwrap();
        let (a, rx_a) = job(10, 50, &[]);
        s.submit(a).unwrap();
        let (b, rx_b) = job(30, 2, &[]);
        s.submit(b).unwrap();
        s.cancel_all();
        for _ in 0..10 {
            let _ = gate_tx.send(());
        }
        assert!(matches!(
            collect(rx_a).1,
            Event::Done(Finish {
                reason: FinishReason::Cancelled,
                ..
            })
        ));
        assert_eq!(
            collect(rx_b),
            (
                String::new(),
                Event::Done(Finish {
                    reason: FinishReason::Cancelled,
                    prompt_tokens: 2,
                    completion_tokens: 0,
                })
            )
        );
        s.shutdown();
        // A failing factory is the caller's error, not a hang.
        let r = Scheduler::start(1, || Err::<(Counter, ()), _>("no model".to_string()));
        assert_eq!(r.err(), Some("no model".to_string()));
    }
}
