//! `rocmforge serve` end to end on the CPU device, no GPU: the server on 127.0.0.1 (an
//! ephemeral port) over the tiny LLaMA of tests/common/tiny_gguf.rs, spoken to by the small
//! HTTP/1.1 client below. The reference for every text is the library's `Generator` run
//! directly, one prompt at a time, and the tokenizer's decoding of its ids. The shared server
//! batches (the paged KV cache, up to 4 requests a step, as `rocmforge serve` runs by default);
//! the gated ones run version 1 (one at a time), and the completions are checked on both.

#[path = "common/tiny_gguf.rs"]
mod tiny_gguf;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rocmforge::frontend::llama::Precision;
use rocmforge::frontend::LlamaModel;
use rocmforge::generate::{GenerateOptions, Generator, SampleFn, Stop};
use rocmforge::runtime::Device;
use rocmforge::serve::batched::{BatchOptions, BatchedGenerator, BLOCK_SIZE};
use rocmforge::serve::sample::{Sampler, SamplingParams};
use rocmforge::serve::scheduler::Decoder;
use rocmforge::serve::{AppState, Engine, ModelInfo, Scheduler};
use serde_json::{json, Value};

/// The tiny model's context (its `llama.context_length`).
const CONTEXT: usize = 64;
const MODEL_ID: &str = "tiny.gguf";

fn tiny_path() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("rocmforge-serve-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(MODEL_ID);
        std::fs::write(&p, tiny_gguf::tiny_llama().to_bytes()).unwrap();
        p
    })
}

fn options(logits: bool) -> GenerateOptions {
    GenerateOptions {
        max_context: CONTEXT,
        logits,
        ..GenerateOptions::default()
    }
}

/// The reference: `Generator` (argmax plans, no logits output) on the CPU, greedy.
fn reference(prompt: &str, max_tokens: usize) -> (String, usize, usize, Stop) {
    static G: OnceLock<std::sync::Mutex<Generator>> = OnceLock::new();
    let g = G.get_or_init(|| {
        let m = LlamaModel::load(tiny_path()).unwrap();
        std::sync::Mutex::new(Generator::new(m, &Device::cpu(), options(false)).unwrap())
    });
    let mut g = g.lock().unwrap();
    let ids = g.model.tokenizer.encode(prompt).unwrap();
    let out = g.generate(&ids, max_tokens, |_| true).unwrap();
    let text = g.model.tokenizer.decode(&out.ids).unwrap();
    (text, ids.len(), out.ids.len(), out.stats.stop)
}

/// What the test lets the gated engine do: how many more tokens it may hand out (`None`:
/// without limit); whether the engine waits for a permit; whether the server has stopped
/// taking tokens.
struct GateState {
    permits: Option<usize>,
    waiting: bool,
    refused: bool,
}

struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

impl Gate {
    fn new(permits: Option<usize>) -> Arc<Gate> {
        Arc::new(Gate {
            state: Mutex::new(GateState {
                permits,
                waiting: false,
                refused: false,
            }),
            changed: Condvar::new(),
        })
    }

    /// Blocks until a token may go, and takes its permit.
    fn pass(&self) {
        let mut g = self.state.lock().unwrap();
        while g.permits == Some(0) {
            g.waiting = true;
            self.changed.notify_all();
            g = self.changed.wait(g).unwrap();
        }
        g.waiting = false;
        if let Some(n) = g.permits.as_mut() {
            *n -= 1;
        }
    }

    /// Notes that the server's callback refused a token (it stops generation).
    fn note_refused(&self) {
        self.state.lock().unwrap().refused = true;
        self.changed.notify_all();
    }

    /// Lets one more token go.
    fn give(&self) {
        if let Some(n) = self.state.lock().unwrap().permits.as_mut() {
            *n += 1;
        }
        self.changed.notify_all();
    }

    /// Waits until `done` holds of the state, or `timeout` passes; whether it does.
    fn wait(&self, timeout: Duration, done: impl Fn(&GateState) -> bool) -> bool {
        let g = self.state.lock().unwrap();
        let (g, _) = self
            .changed
            .wait_timeout_while(g, timeout, |g| !done(g))
            .unwrap();
        done(&g)
    }

    /// Lets every further token go.
    fn open(&self) {
        self.state.lock().unwrap().permits = None;
        self.changed.notify_all();
    }
}

/// The generator behind a gate the test holds, so a test can act while a request runs: each
/// token waits for a permit before it is handed out.
struct Gated {
    gen: Generator,
    gate: Arc<Gate>,
}

impl Engine for Gated {
    fn generate(
        &mut self,
        prompt: &[u32],
        max_tokens: usize,
        stop_at_eos: bool,
        sampler: Option<SampleFn<'_>>,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Stop, String> {
        let gate = self.gate.clone();
        let mut gated = |t| {
            gate.pass();
            let more = on_token(t);
            if !more {
                gate.note_refused();
            }
            more
        };
        Engine::generate(
            &mut self.gen,
            prompt,
            max_tokens,
            stop_at_eos,
            sampler,
            &mut gated,
        )
    }

    fn decoder(&self) -> Decoder {
        self.gen.decoder()
    }
}

struct Server {
    addr: SocketAddr,
    state: Arc<AppState>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.state.scheduler.cancel_all();
        self.state.scheduler.shutdown();
    }
}

fn start(max_queue: usize, api_key: Option<&str>, gate: Arc<Gate>) -> Server {
    let (scheduler, info) = Scheduler::start(max_queue, move || {
        let m = LlamaModel::load(tiny_path()).map_err(|e| e.to_string())?;
        let gen = Generator::new(m, &Device::cpu(), options(true)).map_err(|e| e.to_string())?;
        let info = ModelInfo {
            id: MODEL_ID.into(),
            tokenizer: gen.model.tokenizer.clone(),
            vocab: gen.model.config.vocab_size,
            max_context: CONTEXT,
            logits: true,
        };
        Ok((Gated { gen, gate }, info))
    })
    .unwrap();
    serving(scheduler, info, api_key)
}

/// A batching server (version 2) of up to 4 requests a step over a pool of `blocks` blocks.
fn start_batched(max_queue: usize, blocks: usize) -> Server {
    let (scheduler, info) = Scheduler::start_batched(max_queue, move || {
        let m = LlamaModel::load(tiny_path()).map_err(|e| e.to_string())?;
        let h = m.config.heads();
        let block_bytes = m.config.num_hidden_layers * 2 * h.kv * h.dim * BLOCK_SIZE * 4;
        let options = BatchOptions {
            precision: Precision::F32,
            max_context: CONTEXT,
            block_size: BLOCK_SIZE,
            kv_memory: blocks * block_bytes,
            max_batch: 4,
            replay: false,
            logits: true,
            // Chunks of 5 tokens: every batched test's longer prompts (and preempted requests'
            // restarts) run in chunks between decode steps.
            prefill_chunk: 5,
            tensor_core_gemv: true,
        };
        let info = ModelInfo {
            id: MODEL_ID.into(),
            tokenizer: m.tokenizer.clone(),
            vocab: m.config.vocab_size,
            max_context: CONTEXT,
            logits: true,
        };
        let gen =
            BatchedGenerator::new(m, &Device::cpu(), options, rocmforge::cpu::Precision::Exact)
                .map_err(|e| e.to_string())?;
        Ok((gen, info))
    })
    .unwrap();
    serving(scheduler, info, None)
}

/// The HTTP side over `scheduler`, on a thread of its own.
fn serving(scheduler: Scheduler, info: ModelInfo, api_key: Option<&str>) -> Server {
    let state = Arc::new(AppState::new(info, scheduler, api_key.map(String::from)));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let s = state.clone();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx.send(l.local_addr().unwrap()).unwrap();
            rocmforge::serve::serve(l, s, async move {
                let _ = stop_rx.await;
            })
            .await
            .unwrap();
        });
    });
    Server {
        addr: addr_rx.recv().unwrap(),
        state,
        stop: Some(stop_tx),
        thread: Some(thread),
    }
}

/// The shared plain server: batching, no key, queue 16, room for 4 sequences of the whole
/// context.
fn plain() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(|| start_batched(16, 4 * CONTEXT.div_ceil(BLOCK_SIZE)))
}

/// The shared version-1 server (one request at a time, an open gate, queue 16).
fn plain_v1() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(|| start(16, None, Gate::new(None)))
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of a server-sent event stream.
    fn events(&self) -> Vec<String> {
        self.body
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }
}

fn send(stream: &mut TcpStream, method: &str, path: &str, headers: &[(&str, &str)], body: &str) {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        req.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    stream.write_all(req.as_bytes()).unwrap();
}

/// Undoes `Transfer-Encoding: chunked`.
fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = raw
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("a chunk size line");
        let size_text = std::str::from_utf8(&raw[..line_end]).unwrap();
        let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16).unwrap();
        raw = &raw[line_end + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

fn http(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    send(&mut s, method, path, headers, body);
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a header block");
    let head = String::from_utf8(raw[..split].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let rest = &raw[split + 4..];
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_vec()
    };
    Reply {
        status,
        headers,
        body: String::from_utf8(body).unwrap(),
    }
}

fn post(addr: SocketAddr, path: &str, body: &Value) -> Reply {
    http(addr, "POST", path, &[], &body.to_string())
}

fn completion(prompt: &str, max_tokens: usize) -> Value {
    json!({"model": MODEL_ID, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
}

fn finish_reason(stop: Stop) -> &'static str {
    match stop {
        Stop::Eos => "stop",
        Stop::Length | Stop::Callback => "length",
    }
}

const PROMPTS: &[&str] = &["hello world", "The cat sat", "well, well", "abc"];

#[test]
fn greedy_completions_equal_the_generator() {
    greedy_completions_on(plain());
    greedy_completions_on(plain_v1());
}

fn greedy_completions_on(s: &Server) {
    for &p in PROMPTS {
        let (want, prompt_tokens, n, stop) = reference(p, 12);
        let r = post(s.addr, "/v1/completions", &completion(p, 12));
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["model"], MODEL_ID);
        assert_eq!(v["choices"][0]["text"], want.as_str(), "{p:?}");
        assert_eq!(v["choices"][0]["finish_reason"], finish_reason(stop));
        assert_eq!(v["usage"]["prompt_tokens"], prompt_tokens);
        assert_eq!(v["usage"]["completion_tokens"], n);
        assert_eq!(v["usage"]["total_tokens"], prompt_tokens + n);
    }
    // The tiny model's chat template concatenates the contents: a chat is the same prompt.
    let (want, ..) = reference("hello world", 10);
    let r = post(
        s.addr,
        "/v1/chat/completions",
        &json!({"model": MODEL_ID, "max_tokens": 10, "temperature": 0,
                "messages": [{"role": "system", "content": "hello"},
                             {"role": "user", "content": " world"}]}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], want.as_str());
}

#[test]
fn a_stop_string_ends_the_text_before_it() {
    let s = plain();
    let (full, ..) = reference("The cat sat", 20);
    // A stop string from the middle of the greedy text (past its first character).
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() >= 6, "{full:?}");
    let stop: String = chars[3..5].iter().collect();
    let at = full.find(&stop).unwrap();
    let mut body = completion("The cat sat", 20);
    body["stop"] = json!([stop]);
    let v = post(s.addr, "/v1/completions", &body).json();
    assert_eq!(v["choices"][0]["text"], &full[..at]);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
}

#[test]
fn streamed_chunks_concatenate_to_the_whole_text() {
    let s = plain();
    for (path, chat) in [("/v1/completions", false), ("/v1/chat/completions", true)] {
        let mut body = if chat {
            json!({"model": MODEL_ID, "max_tokens": 14, "temperature": 0,
                   "messages": [{"role": "user", "content": "well, well"}]})
        } else {
            completion("well, well", 14)
        };
        let whole = post(s.addr, path, &body).json();
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let r = post(s.addr, path, &body);
        assert_eq!(r.status, 200);
        assert!(r
            .header("content-type")
            .unwrap()
            .starts_with("text/event-stream"));
        let events = r.events();
        assert_eq!(
            events.last().map(String::as_str),
            Some("[DONE]"),
            "{}",
            r.body
        );
        let chunks: Vec<Value> = events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(e).unwrap())
            .collect();
        let (usage, chunks) = chunks.split_last().unwrap();
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"], whole["usage"]);
        let mut text = String::new();
        for (i, c) in chunks.iter().enumerate() {
            let choice = &c["choices"][0];
            let last = i + 1 == chunks.len();
            assert_eq!(c["id"], chunks[0]["id"]);
            if chat {
                assert_eq!(c["object"], "chat.completion.chunk");
                if i == 0 {
                    assert_eq!(choice["delta"]["role"], "assistant");
                }
                text.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
            } else {
                assert_eq!(c["object"], "text_completion");
                text.push_str(choice["text"].as_str().unwrap());
            }
            if last {
                assert_eq!(
                    choice["finish_reason"],
                    whole["choices"][0]["finish_reason"]
                );
            } else {
                assert_eq!(choice["finish_reason"], Value::Null);
            }
        }
        let want = if chat {
            &whole["choices"][0]["message"]["content"]
        } else {
            &whole["choices"][0]["text"]
        };
        assert_eq!(text, want.as_str().unwrap(), "{path}");
        assert!(chunks.len() >= 3, "the text came in pieces: {}", r.body);
    }
}

#[test]
fn concurrent_requests_each_equal_their_one_at_a_time_result() {
    concurrent_on(plain(), 10);
    concurrent_on(plain_v1(), 10);
}

/// A pool of 5 blocks (80 tokens) for 4 requests of 3 blocks each (prompt + 40 tokens): two
/// running requests outgrow it, the one that joined last is preempted and started again later
/// from its prompt and the tokens it had; every text is still the one-at-a-time text, and every
/// block comes back. Whether two requests run at once depends on when they arrive, so the load
/// repeats (up to 5 rounds, each checked) until a preemption has happened.
#[test]
fn preempted_requests_finish_with_the_same_text_and_free_their_blocks() {
    let s = start_batched(16, 5);
    for _ in 0..5 {
        concurrent_on(&s, 40);
        if metric(s.addr, "rocmforge_preemptions_total") >= 1.0 {
            break;
        }
    }
    assert!(metric(s.addr, "rocmforge_preemptions_total") >= 1.0);
    assert_eq!(metric(s.addr, "rocmforge_kv_blocks_used"), 0.0);
    assert_eq!(metric(s.addr, "rocmforge_kv_blocks_total"), 5.0);
    assert_eq!(metric(s.addr, "rocmforge_requests_running"), 0.0);
}

fn concurrent_on(s: &Server, max_tokens: usize) {
    let want: Vec<String> = PROMPTS.iter().map(|p| reference(p, max_tokens).0).collect();
    let addr = s.addr;
    let threads: Vec<_> = PROMPTS
        .iter()
        .map(|&p| {
            std::thread::spawn(move || post(addr, "/v1/completions", &completion(p, max_tokens)))
        })
        .collect();
    for (t, want) in threads.into_iter().zip(want) {
        let r = t.join().unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.json()["choices"][0]["text"], want.as_str());
    }
}

/// The text `Generator::generate_with` gives with a `Sampler` of `params` (the logits plans).
fn reference_sampled(prompt: &str, max_tokens: usize, params: SamplingParams) -> String {
    static G: OnceLock<std::sync::Mutex<Generator>> = OnceLock::new();
    let g = G.get_or_init(|| {
        let m = LlamaModel::load(tiny_path()).unwrap();
        std::sync::Mutex::new(Generator::new(m, &Device::cpu(), options(true)).unwrap())
    });
    let mut g = g.lock().unwrap();
    let ids = g.model.tokenizer.encode(prompt).unwrap();
    let mut sampler = Sampler::new(params);
    let mut pick = |logits: &[f32]| sampler.sample(logits);
    let out = g
        .generate_with(&ids, max_tokens, Some(&mut pick), |_| true)
        .unwrap();
    g.model.tokenizer.decode(&out.ids).unwrap()
}

#[test]
fn sampling_follows_the_seed_as_the_library_sampler_does() {
    let s = plain();
    for seed in [1u64, 2, 3] {
        let body = json!({"model": MODEL_ID, "prompt": "abc", "max_tokens": 16,
                          "temperature": 1.7, "top_p": 0.98, "top_k": 200, "seed": seed});
        let v = post(s.addr, "/v1/completions", &body).json();
        assert_eq!(v["usage"]["prompt_tokens"], 3);
        let text = v["choices"][0]["text"].as_str().unwrap().to_string();
        let params = SamplingParams {
            temperature: 1.7,
            top_k: 200,
            top_p: 0.98,
            seed,
        };
        assert_eq!(text, reference_sampled("abc", 16, params), "seed {seed}");
        // The same seed again, the same text.
        let again = post(s.addr, "/v1/completions", &body).json();
        assert_eq!(again["choices"][0]["text"], text.as_str());
    }
}

#[test]
fn bad_input_is_a_4xx_with_an_openai_error_and_the_server_goes_on() {
    let s = plain();
    let long = "hello world ".repeat(40);
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("/v1/completions", "{not json".into(), 400, "body"),
        ("/v1/completions", "[]".into(), 400, "body"),
        (
            "/v1/completions",
            json!({"model": MODEL_ID, "prompt": 5}).to_string(),
            400,
            "prompt",
        ),
        (
            "/v1/completions",
            json!({"model": MODEL_ID, "prompt": "x", "max_tokens": "many"}).to_string(),
            400,
            "max_tokens",
        ),
        (
            "/v1/completions",
            json!({"model": MODEL_ID, "prompt": "x", "temperature": "hot"}).to_string(),
            400,
            "temperature",
        ),
        (
            "/v1/completions",
            json!({"model": MODEL_ID, "prompt": "x", "stream": 1}).to_string(),
            400,
            "stream",
        ),
        (
            "/v1/completions",
            json!({"model": "gpt-4", "prompt": "x"}).to_string(),
            400,
            "model",
        ),
        (
            "/v1/completions",
            json!({"model": MODEL_ID, "prompt": long}).to_string(),
            400,
            "prompt",
        ),
        (
            "/v1/completions",
            json!({"model": MODEL_ID, "prompt": "x", "max_tokens": 1_000_000_000_000u64})
                .to_string(),
            400,
            "max_tokens",
        ),
        (
            "/v1/completions",
            json!({"model": MODEL_ID, "prompt": "x", "max_tokens": -1}).to_string(),
            400,
            "max_tokens",
        ),
        (
            "/v1/completions",
            json!({"model": MODEL_ID, "prompt": "x", "n": 2}).to_string(),
            400,
            "n",
        ),
        (
            "/v1/completions",
            json!({"model": MODEL_ID, "prompt": ""}).to_string(),
            400,
            "prompt",
        ),
        (
            "/v1/completions",
            json!({"model": MODEL_ID, "prompt": [1, 99999]}).to_string(),
            400,
            "prompt",
        ),
        (
            "/v1/chat/completions",
            json!({"model": MODEL_ID, "messages": "hi"}).to_string(),
            400,
            "messages",
        ),
        (
            "/v1/chat/completions",
            json!({"model": MODEL_ID, "messages": [{"role": "user"}], "n": 3}).to_string(),
            400,
            "n",
        ),
        (
            "/v1/chat/completions",
            json!({"model": MODEL_ID, "messages": [{"role": "user", "content": long}]}).to_string(),
            400,
            "messages",
        ),
    ];
    for (path, body, status, param) in &cases {
        let r = http(s.addr, "POST", path, &[], body);
        assert_eq!(r.status, *status, "{body}: {}", r.body);
        let e = &r.json()["error"];
        assert!(
            e["message"].is_string() && e["type"].is_string(),
            "{}",
            r.body
        );
        assert_eq!(e["param"], *param, "{body}: {}", r.body);
        assert!(e.get("code").is_some());
    }
    let codes = |body: &str| {
        http(s.addr, "POST", "/v1/completions", &[], body).json()["error"]["code"].clone()
    };
    assert_eq!(codes(&cases[6].1), "model_not_found");
    assert_eq!(codes(&cases[7].1), "context_length_exceeded");
    assert_eq!(codes(&cases[8].1), "context_length_exceeded");
    // Unknown routes and methods.
    assert_eq!(http(s.addr, "GET", "/v1/engines", &[], "").status, 404);
    assert_eq!(http(s.addr, "GET", "/v1/completions", &[], "").status, 405);
    let r = http(s.addr, "GET", "/health", &[], "");
    assert_eq!((r.status, r.json()["status"].clone()), (200, json!("ok")));
    let r = http(s.addr, "GET", "/v1/models", &[], "");
    assert_eq!(r.json()["data"][0]["id"], MODEL_ID);
    // The 400s are counted.
    let m = http(s.addr, "GET", "/metrics", &[], "").body;
    let line = m
        .lines()
        .find(|l| {
            l.starts_with("rocmforge_requests_total{route=\"/v1/completions\",status=\"400\"}")
        })
        .unwrap_or_else(|| panic!("{m}"));
    assert!(
        line.rsplit(' ').next().unwrap().parse::<f64>().unwrap() >= 13.0,
        "{line}"
    );
}

fn metric(addr: SocketAddr, name: &str) -> f64 {
    let m = http(addr, "GET", "/metrics", &[], "").body;
    m.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("{name} not in\n{m}"))
        .parse()
        .unwrap()
}

/// A prompt whose greedy continuation runs `n` tokens without EOS on the tiny model.
fn long_running_prompt(n: usize) -> &'static str {
    ["hello world", "abc", "The cat sat", "well, well", "zz", "q"]
        .into_iter()
        .find(|p| reference(p, n).3 == Stop::Length)
        .expect("a prompt that runs to the budget")
}

#[test]
fn a_full_queue_is_429_and_a_disconnect_frees_the_worker() {
    // No permits: A's first token waits at the gate, holding the worker until the test lets
    // tokens go.
    let gate = Gate::new(Some(0));
    let s = start(1, None, gate.clone());
    let p = long_running_prompt(50);
    let mut body = completion(p, 50);
    body["stream"] = json!(true);
    let mut a = TcpStream::connect(s.addr).unwrap();
    send(&mut a, "POST", "/v1/completions", &[], &body.to_string());
    // Read the response head: A's stream has begun ...
    let mut reader = BufReader::new(a.try_clone().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert!(line.contains("200"), "{line}");
    while line != "\r\n" {
        line.clear();
        reader.read_line(&mut line).unwrap();
    }
    // ... and the worker is generating it.
    assert!(
        gate.wait(Duration::from_secs(10), |g| g.waiting),
        "A never reached its first token"
    );
    // B waits in the queue (its limit is 1) ...
    let addr = s.addr;
    let want_b = reference("abc", 3).0;
    let b = std::thread::spawn(move || {
        let r = post(addr, "/v1/completions", &completion("abc", 3));
        (r, Instant::now())
    });
    assert!(
        s.state
            .scheduler
            .stats
            .wait_queue(Duration::from_secs(10), |q| q == 1),
        "B never queued: {}",
        http(s.addr, "GET", "/metrics", &[], "").body
    );
    assert_eq!(metric(s.addr, "rocmforge_queue_depth"), 1.0);
    // ... so C is refused.
    let c = post(s.addr, "/v1/completions", &completion("abc", 3));
    assert_eq!(c.status, 429, "{}", c.body);
    assert_eq!(c.header("retry-after"), Some("1"));
    assert_eq!(c.json()["error"]["code"], "rate_limit_exceeded");
    // A hangs up, its stream begun but no token sent: the server notices, and the worker stops
    // A at the next token it hands out. Tokens go one at a time until one is refused (in
    // practice the first: each wait ends as soon as it is); 45 stays an upper bound.
    let hung_up = Instant::now();
    drop(reader);
    drop(a);
    let mut given = 0;
    while given < 45 {
        gate.give();
        given += 1;
        if gate.wait(Duration::from_millis(100), |g| g.refused) {
            break;
        }
    }
    // ... and B's 3 tokens go through an open gate.
    gate.open();
    let (rb, done) = b.join().unwrap();
    assert_eq!(rb.status, 200, "{}", rb.body);
    assert_eq!(rb.json()["choices"][0]["text"], want_b.as_str());
    // B's turn came within a few tokens of A's hang-up, not after A's remaining 45-odd.
    assert!(
        done - hung_up < Duration::from_secs(2),
        "B was served {:?} after A hung up",
        done - hung_up
    );
    assert_eq!(
        metric(s.addr, "rocmforge_jobs_total{outcome=\"cancelled\"}"),
        1.0
    );
    assert_eq!(metric(s.addr, "rocmforge_queue_depth"), 0.0);
    assert!(metric(s.addr, "rocmforge_generated_tokens_total") < 50.0);
    assert_eq!(http(s.addr, "GET", "/health", &[], "").status, 200);
}

#[test]
fn an_api_key_guards_every_route_but_health() {
    let s = start(4, Some("sekrit"), Gate::new(None));
    let good = [("Authorization", "Bearer sekrit")];
    let bad = [("Authorization", "Bearer wrong")];
    assert_eq!(http(s.addr, "GET", "/health", &[], "").status, 200);
    for path in ["/v1/models", "/metrics"] {
        assert_eq!(http(s.addr, "GET", path, &[], "").status, 401, "{path}");
        assert_eq!(http(s.addr, "GET", path, &bad, "").status, 401, "{path}");
        assert_eq!(http(s.addr, "GET", path, &good, "").status, 200, "{path}");
    }
    let body = completion("abc", 2).to_string();
    let r = http(s.addr, "POST", "/v1/completions", &[], &body);
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    let r = http(s.addr, "POST", "/v1/completions", &good, &body);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.json()["choices"][0]["text"],
        reference("abc", 2).0.as_str()
    );
}

/// OpenAI's Python client (tests/openai_client.py: models, a completion whole and streamed, a
/// chat, three bad requests as typed errors) and curl against the server at `addr`, their texts
/// the generator's. Where no Python with `openai` is found (ROCMFORGE_PYTHON, else python3) the
/// client part is skipped with a note, or fails under ROCMFORGE_REQUIRE_OPENAI=1 (CI sets it);
/// curl's part is skipped where there is no curl.
fn openai_client_and_curl(addr: SocketAddr) {
    use std::process::Command;
    let (want, ..) = reference("hello world", 12);
    let url = format!("http://{addr}");
    let python = std::env::var("ROCMFORGE_PYTHON").unwrap_or_else(|_| "python3".into());
    let has_openai = Command::new(&python)
        .args(["-c", "import openai"])
        .output()
        .is_ok_and(|o| o.status.success());
    if has_openai {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
        let out = Command::new(&python)
            .arg(script)
            .args([url.as_str(), MODEL_ID, "hello world", "12", want.as_str()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "the openai client: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    } else if std::env::var("ROCMFORGE_REQUIRE_OPENAI").is_ok_and(|v| v == "1") {
        panic!("no `openai` module for {python} (ROCMFORGE_REQUIRE_OPENAI=1)");
    } else {
        eprintln!("note: no `openai` module for {python}: the client check is skipped");
    }
    let body = completion("hello world", 12).to_string();
    match Command::new("curl")
        .args(["-s", "-H", "Content-Type: application/json", "-d", &body])
        .arg(format!("{url}/v1/completions"))
        .output()
    {
        Ok(out) => {
            assert!(out.status.success(), "curl: {out:?}");
            let v: Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(v["choices"][0]["text"], want.as_str(), "curl");
        }
        Err(e) => eprintln!("note: no curl ({e}): the curl check is skipped"),
    }
}

/// The command itself: loopback by default and said so, a port of 0 picks one, and SIGTERM
/// ends it with status 0.
#[cfg(unix)]
#[test]
fn the_command_serves_and_exits_cleanly_on_sigterm() {
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_rocmforge"))
        .args([
            "serve",
            "--device",
            "cpu",
            "--port",
            "0",
            "--max-context",
            "64",
            "--model",
        ])
        .arg(tiny_path())
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let addr: SocketAddr = loop {
        let mut line = String::new();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "no address in:\n{seen}"
        );
        seen.push_str(&line);
        if let Some(rest) = line.strip_prefix("listening on http://") {
            assert!(rest.contains("loopback only"), "{line}");
            break rest.split_whitespace().next().unwrap().parse().unwrap();
        }
    };
    assert!(addr.ip().is_loopback());
    let r = post(addr, "/v1/completions", &completion("abc", 4));
    assert_eq!(
        r.json()["choices"][0]["text"],
        reference("abc", 4).0.as_str()
    );
    openai_client_and_curl(addr);
    // SAFETY: kill(2) on our own child's pid, which has not been waited for, so it is ours.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}: {seen}{rest}");
    assert!(rest.contains("shutting down"), "{rest}");
}
