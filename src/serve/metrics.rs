//! `/metrics` in the Prometheus text format: requests by route and status (counted by the HTTP
//! layer), and the worker's counters (tokens, generation time, queue depth, jobs by outcome).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use super::scheduler::WorkerStats;

/// The routes a request is counted under; anything else is `other`, so a client cannot grow
/// the label set.
pub const ROUTES: &[&str] = &[
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/models",
    "/health",
    "/metrics",
];

#[derive(Debug, Default)]
pub struct HttpMetrics {
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
}

impl HttpMetrics {
    pub fn count(&self, path: &str, status: u16) {
        let route = ROUTES
            .iter()
            .copied()
            .find(|r| *r == path)
            .unwrap_or("other");
        let mut m = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry((route, status)).or_default() += 1;
    }

    /// The text of `/metrics`.
    pub fn render(&self, w: &WorkerStats, queue_limit: usize) -> String {
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, lines: Vec<(String, f64)>| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (labels, v) in lines {
                let _ = writeln!(out, "{name}{labels} {v}");
            }
        };
        let requests = self
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|((route, status), n)| {
                (
                    format!("{{route=\"{route}\",status=\"{status}\"}}"),
                    *n as f64,
                )
            })
            .collect();
        metric(
            "rocmforge_requests_total",
            "counter",
            "HTTP requests answered, by route and status.",
            requests,
        );
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed) as f64;
        let jobs = vec![
            ("{outcome=\"completed\"}".to_string(), get(&w.completed)),
            ("{outcome=\"cancelled\"}".to_string(), get(&w.cancelled)),
            ("{outcome=\"failed\"}".to_string(), get(&w.failed)),
        ];
        metric(
            "rocmforge_jobs_total",
            "counter",
            "Generation jobs ended, by outcome.",
            jobs,
        );
        let one = |v: f64| vec![(String::new(), v)];
        metric(
            "rocmforge_prompt_tokens_total",
            "counter",
            "Prompt tokens of the jobs run.",
            one(get(&w.prompt_tokens)),
        );
        metric(
            "rocmforge_generated_tokens_total",
            "counter",
            "Tokens generated.",
            one(get(&w.generated_tokens)),
        );
        let seconds = get(&w.generate_micros) * 1e-6;
        metric(
            "rocmforge_generate_seconds_total",
            "counter",
            "Time the worker spent generating (prefill included).",
            one(seconds),
        );
        let rate = if seconds > 0.0 {
            get(&w.generated_tokens) / seconds
        } else {
            0.0
        };
        metric(
            "rocmforge_tokens_per_second",
            "gauge",
            "Generated tokens per second of generating time, since start.",
            one(rate),
        );
        metric(
            "rocmforge_last_request_tokens_per_second",
            "gauge",
            "Generated tokens per second of the last finished job.",
            one(f64::from_bits(w.last_tokens_per_s.load(Ordering::Relaxed))),
        );
        metric(
            "rocmforge_queue_depth",
            "gauge",
            "Requests waiting for the worker (not the one running).",
            one(w.queued.load(Ordering::SeqCst) as f64),
        );
        metric(
            "rocmforge_queue_limit",
            "gauge",
            "The most requests that may wait (--max-queue); more are answered 429.",
            one(queue_limit as f64),
        );
        metric(
            "rocmforge_requests_running",
            "gauge",
            "Requests generating now (the batch, with --max-batch above 1).",
            one(w.running.load(Ordering::SeqCst) as f64),
        );
        metric(
            "rocmforge_prefills_total",
            "counter",
            "Prompts run through a prefill by the batching worker (preempted ones again).",
            one(get(&w.prefills)),
        );
        metric(
            "rocmforge_prefill_chunks_total",
            "counter",
            "Prefill runs of the batching worker: chunks of at most --prefill-chunk tokens, or \
             whole prompts (a decode step of the batch may run between two).",
            one(get(&w.prefill_chunks)),
        );
        metric(
            "rocmforge_prefill_seconds_total",
            "counter",
            "Time the batching worker spent in prefills and their chunks (the batch waits \
             meanwhile).",
            one(get(&w.prefill_micros) * 1e-6),
        );
        metric(
            "rocmforge_decode_step_seconds_total",
            "counter",
            "Time the batching worker spent in decode steps (inputs, the plan, tokens back).",
            one(get(&w.step_micros) * 1e-6),
        );
        metric(
            "rocmforge_host_seconds_total",
            "counter",
            "Time the batching worker spent between steps on the steps' tokens (sampling, \
             text, stop strings, events).",
            one(get(&w.host_micros) * 1e-6),
        );
        // Requests a decode step advanced, as a Prometheus histogram (cumulative buckets).
        let mut sizes = Vec::new();
        let mut cumulative = 0.0;
        for (i, c) in w.step_sizes.iter().enumerate() {
            cumulative += get(c);
            let le = if i < 7 {
                format!("{}", 1u32 << i)
            } else {
                "+Inf".to_string()
            };
            sizes.push((format!("_bucket{{le=\"{le}\"}}"), cumulative));
        }
        sizes.push(("_sum".to_string(), get(&w.step_rows)));
        sizes.push(("_count".to_string(), get(&w.steps)));
        metric(
            "rocmforge_batch_size",
            "histogram",
            "Requests each decode step advanced.",
            sizes,
        );
        metric(
            "rocmforge_preemptions_total",
            "counter",
            "Requests whose KV blocks were freed when a step ran out, to be started again.",
            one(w.preempted.load(Ordering::Relaxed) as f64),
        );
        metric(
            "rocmforge_kv_blocks_used",
            "gauge",
            "Paged KV-cache blocks that running requests hold (0 at rest).",
            one(w.kv_blocks_used.load(Ordering::Relaxed) as f64),
        );
        metric(
            "rocmforge_kv_blocks_total",
            "gauge",
            "Paged KV-cache blocks in the pool (0 without the paged cache: --max-batch 1).",
            one(w.kv_blocks_total.load(Ordering::Relaxed) as f64),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counts_and_folds_unknown_routes() {
        let m = HttpMetrics::default();
        m.count("/health", 200);
        m.count("/health", 200);
        m.count("/v1/completions", 400);
        m.count("/nope/1", 404);
        m.count("/nope/2", 404);
        let w = WorkerStats::default();
        w.generated_tokens.store(30, Ordering::Relaxed);
        w.generate_micros.store(2_000_000, Ordering::Relaxed);
        w.queued.store(3, Ordering::SeqCst);
        w.kv_blocks_used.store(5, Ordering::Relaxed);
        w.kv_blocks_total.store(64, Ordering::Relaxed);
        w.prefill_chunks.store(7, Ordering::Relaxed);
        // Steps of 1, 3, 4 and 200 requests.
        for (i, n) in [(0, 1), (2, 2), (7, 1)] {
            w.step_sizes[i].store(n, Ordering::Relaxed);
        }
        w.steps.store(4, Ordering::Relaxed);
        let text = m.render(&w, 8);
        for line in [
            "rocmforge_requests_total{route=\"/health\",status=\"200\"} 2",
            "rocmforge_requests_total{route=\"/v1/completions\",status=\"400\"} 1",
            "rocmforge_requests_total{route=\"other\",status=\"404\"} 2",
            "rocmforge_generated_tokens_total 30",
            "rocmforge_tokens_per_second 15",
            "rocmforge_queue_depth 3",
            "rocmforge_queue_limit 8",
            "rocmforge_kv_blocks_used 5",
            "rocmforge_kv_blocks_total 64",
            "rocmforge_prefill_chunks_total 7",
            "rocmforge_batch_size_bucket{le=\"4\"} 3",
            "rocmforge_batch_size_bucket{le=\"+Inf\"} 4",
            "rocmforge_batch_size_count 4",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
    }
}
