//! The HTTP layer (axum): routes, the bearer-token check, request counting, and the mapping
//! from a parsed request to a scheduler [`Job`] and from its events to an OpenAI response,
//! whole or as server-sent events. Thin on purpose: everything that decides what a request
//! means is in `api`, `chat` and the scheduler.

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{Request as HttpRequest, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::api::{self, ApiError, Prompt, Request};
use super::chat;
use super::metrics::HttpMetrics;
use super::scheduler::{Event, Finish, FinishReason, Job, Scheduler, SubmitError};
use crate::frontend::GgufTokenizer;

/// What the routes need to know about the model.
#[derive(Clone)]
pub struct ModelInfo {
    /// The name clients pass as `model` (the GGUF file's name).
    pub id: String,
    pub tokenizer: GgufTokenizer,
    pub vocab: usize,
    /// Prompt plus completion tokens may not exceed it.
    pub max_context: usize,
    /// Whether the plans return the logits (sampling); greedy only otherwise.
    pub logits: bool,
}

/// The server's shared state.
pub struct AppState {
    pub model: ModelInfo,
    pub scheduler: Scheduler,
    pub api_key: Option<String>,
    pub http: HttpMetrics,
    /// Set when shutdown begins: new requests are answered 503.
    draining: AtomicBool,
    next_id: AtomicU64,
}

impl AppState {
    pub fn new(model: ModelInfo, scheduler: Scheduler, api_key: Option<String>) -> AppState {
        AppState {
            model,
            scheduler,
            api_key,
            http: HttpMetrics::default(),
            draining: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
        }
    }

    /// Stops accepting requests; after `grace`, cancels whatever is still generating (the
    /// running job at its next token, the queued ones before they start). Needs a tokio
    /// runtime for the timer.
    pub fn begin_shutdown(self: &Arc<Self>, grace: Duration) {
        self.draining.store(true, Ordering::SeqCst);
        let s = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            s.scheduler.cancel_all();
        });
    }
}

fn error(e: ApiError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(e.body())).into_response()
}

fn server_error(message: String) -> Response {
    error(ApiError {
        status: 500,
        message,
        kind: "server_error",
        param: None,
        code: None,
    })
}

fn unavailable() -> Response {
    error(ApiError {
        status: 503,
        message: "the server is shutting down".into(),
        kind: "server_error",
        param: None,
        code: Some("shutting_down"),
    })
}

/// The routes, with the bearer check and the request counter around them.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), authorize))
        .layer(middleware::from_fn_with_state(state.clone(), count))
        .with_state(state)
}

/// Serves `router(state)` on `listener` until `shutdown` completes, then until every open
/// response (streams included) has ended.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

async fn count(State(s): State<Arc<AppState>>, req: HttpRequest, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let response = next.run(req).await;
    s.http.count(&path, response.status().as_u16());
    response
}

/// Compares in time independent of where the strings differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn authorize(State(s): State<Arc<AppState>>, req: HttpRequest, next: Next) -> Response {
    if let Some(key) = &s.api_key {
        if req.uri().path() != "/health" {
            let given = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "));
            if !given.is_some_and(|g| same(g.as_bytes(), key.as_bytes())) {
                let e = ApiError {
                    status: 401,
                    message: "a valid API key is required: Authorization: Bearer KEY".into(),
                    kind: "authentication_error",
                    param: None,
                    code: Some("invalid_api_key"),
                };
                let mut r = error(e);
                r.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                return r;
            }
        }
    }
    next.run(req).await
}

async fn not_found(req: HttpRequest) -> Response {
    error(ApiError {
        status: 404,
        message: format!("no route {} {}", req.method(), req.uri().path()),
        kind: "invalid_request_error",
        param: None,
        code: Some("not_found"),
    })
}

async fn health(State(s): State<Arc<AppState>>) -> Response {
    if s.draining.load(Ordering::SeqCst) {
        return unavailable();
    }
    Json(json!({"status": "ok"})).into_response()
}

async fn models(State(s): State<Arc<AppState>>) -> Response {
    Json(json!({
        "object": "list",
        "data": [{
            "id": s.model.id,
            "object": "model",
            "created": 0,
            "owned_by": "rocmforge",
            "max_context": s.model.max_context,
        }],
    }))
    .into_response()
}

async fn metrics(State(s): State<Arc<AppState>>) -> Response {
    let text = s.http.render(&s.scheduler.stats, s.scheduler.queue_limit());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn completions(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    handle(s, &body, false).await
}

async fn chat_completions(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    handle(s, &body, true).await
}

/// The prompt's ids and the completion budget, checked against the model.
fn prepare(s: &AppState, r: &Request) -> Result<(Vec<u32>, usize), ApiError> {
    let m = &s.model;
    if r.model != m.id {
        return Err(ApiError {
            status: 400,
            message: format!(
                "the model '{}' does not exist; this server has '{}'",
                r.model, m.id
            ),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
        });
    }
    let token_text = |id: Option<u32>| {
        id.and_then(|i| m.tokenizer.decode(&[i]).ok())
            .unwrap_or_default()
    };
    let tokenize = |text: &str| {
        m.tokenizer
            .encode(text)
            .map_err(|e| ApiError::bad("prompt", format!("tokenizing the prompt: {e}")))
    };
    let ids = match &r.prompt {
        Prompt::Text(t) => tokenize(t)?,
        Prompt::Ids(ids) => {
            if let Some(&id) = ids.iter().find(|&&i| i as usize >= m.vocab) {
                return Err(ApiError::bad(
                    "prompt",
                    format!("token id {id} is outside the vocabulary of {}", m.vocab),
                ));
            }
            ids.clone()
        }
        Prompt::Chat(messages) => {
            let template = m.tokenizer.chat_template.as_deref().ok_or_else(|| {
                ApiError::bad(
                    "messages",
                    "the model has no chat template (tokenizer.chat_template)",
                )
            })?;
            let text = chat::render(
                template,
                messages,
                &token_text(m.tokenizer.bos),
                &token_text(m.tokenizer.eos),
            )
            .map_err(|e| ApiError::bad("messages", e))?;
            tokenize(&text)?
        }
    };
    let param = if matches!(r.prompt, Prompt::Chat(_)) {
        "messages"
    } else {
        "prompt"
    };
    if ids.is_empty() {
        return Err(ApiError::bad(param, "the prompt is empty (no tokens)"));
    }
    let room = m.max_context.saturating_sub(ids.len());
    if ids.len() > m.max_context {
        return Err(ApiError::bad(
            param,
            format!(
                "the prompt has {} tokens; the maximum context is {}",
                ids.len(),
                m.max_context
            ),
        )
        .with_code("context_length_exceeded"));
    }
    let max_tokens = match r.max_tokens {
        Some(n) if n > room as u64 => {
            return Err(ApiError::bad(
                "max_tokens",
                format!(
                    "the maximum context is {} tokens; the prompt has {} and max_tokens asks for \
                     {n} more",
                    m.max_context,
                    ids.len()
                ),
            )
            .with_code("context_length_exceeded"))
        }
        Some(n) => n as usize,
        // OpenAI's defaults: 16 for completions, the rest of the context for chat.
        None if matches!(r.prompt, Prompt::Chat(_)) => room,
        None => room.min(16),
    };
    Ok((ids, max_tokens))
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn handle(s: Arc<AppState>, body: &[u8], chat: bool) -> Response {
    if s.draining.load(Ordering::SeqCst) {
        return unavailable();
    }
    let mut r = match api::parse(body, chat) {
        Ok(r) => r,
        Err(e) => return error(e),
    };
    let (prompt, max_tokens) = match prepare(&s, &r) {
        Ok(p) => p,
        Err(e) => return error(e),
    };
    if !r.sampling.is_greedy() && !s.model.logits {
        if r.temperature_given {
            return error(
                ApiError::bad(
                    "temperature",
                    "this server runs greedy only (started with --greedy): sampling needs the \
                     logits; pass temperature 0",
                )
                .with_code("unsupported_parameter"),
            );
        }
        // OpenAI's default temperature is 1; a greedy-only server answers greedily instead.
        r.sampling.temperature = 0.0;
    }
    let (tx, rx) = unbounded_channel();
    let job = Job {
        prompt,
        max_tokens,
        sampling: r.sampling.clone(),
        stop: r.stop.clone(),
        ignore_eos: r.ignore_eos,
        events: tx,
    };
    match s.scheduler.submit(job) {
        Ok(()) => {}
        Err(e @ SubmitError::QueueFull { .. }) => {
            let mut resp = error(ApiError {
                status: 429,
                message: format!("{e}; retry shortly"),
                kind: "rate_limit_error",
                param: None,
                code: Some("rate_limit_exceeded"),
            });
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return resp;
        }
        Err(SubmitError::ShuttingDown) => return unavailable(),
    }
    let n = s.next_id.fetch_add(1, Ordering::Relaxed);
    let shape = Shape {
        chat,
        id: format!("{}-{n}", if chat { "chatcmpl" } else { "cmpl" }),
        created: now(),
        model: s.model.id.clone(),
    };
    if r.stream {
        stream(shape, rx, r.stream_usage)
    } else {
        whole(shape, rx).await
    }
}

/// The fields every response and chunk of one request shares.
struct Shape {
    chat: bool,
    id: String,
    created: u64,
    model: String,
}

fn usage(f: &Finish) -> Value {
    json!({
        "prompt_tokens": f.prompt_tokens,
        "completion_tokens": f.completion_tokens,
        "total_tokens": f.prompt_tokens + f.completion_tokens,
    })
}

impl Shape {
    fn object(&self, choice: Value, chunk: bool) -> Value {
        let object = match (self.chat, chunk) {
            (true, true) => "chat.completion.chunk",
            (true, false) => "chat.completion",
            (false, _) => "text_completion",
        };
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        })
    }

    fn whole(&self, text: String, f: &Finish) -> Value {
        let reason = f.reason.as_str();
        let choice = if self.chat {
            json!({"index": 0, "message": {"role": "assistant", "content": text},
                   "logprobs": null, "finish_reason": reason})
        } else {
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": reason})
        };
        let mut v = self.object(choice, false);
        v["usage"] = usage(f);
        v
    }

    /// A chunk with `text`, or the last one (empty text, the finish reason).
    fn chunk(&self, text: Option<&str>, reason: Option<FinishReason>) -> Value {
        let reason = reason.map(FinishReason::as_str);
        let choice = if self.chat {
            let delta = match text {
                Some(t) => json!({"content": t}),
                None => json!({}),
            };
            json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": reason})
        } else {
            json!({"index": 0, "text": text.unwrap_or(""), "logprobs": null,
                   "finish_reason": reason})
        };
        self.object(choice, true)
    }
}

async fn whole(shape: Shape, mut rx: UnboundedReceiver<Event>) -> Response {
    let mut text = String::new();
    // If this future is dropped (the client went away), `rx` goes with it and the worker
    // stops the job at its next token.
    while let Some(event) = rx.recv().await {
        match event {
            Event::Text(t) => text.push_str(&t),
            Event::Done(f) if f.reason == FinishReason::Cancelled => return unavailable(),
            Event::Done(f) => return Json(shape.whole(text, &f)).into_response(),
            Event::Failed(e) => return server_error(format!("generation failed: {e}")),
        }
    }
    server_error("the worker ended the request without a result".into())
}

fn sse(v: &Value) -> String {
    format!("data: {v}\n\n")
}

struct Streaming {
    shape: Shape,
    rx: UnboundedReceiver<Event>,
    include_usage: bool,
    /// The chat role chunk is still to send.
    role_pending: bool,
    done: bool,
}

/// Server-sent events as OpenAI sends them: one `data: {chunk}` per piece of text (chat
/// streams begin with a chunk carrying the role), a last chunk with the finish reason, with
/// `stream_options.include_usage` one more with the usage and no choices, then
/// `data: [DONE]`. A failure after the 200 is sent is a `data: {"error": ...}` event.
fn stream(shape: Shape, rx: UnboundedReceiver<Event>, include_usage: bool) -> Response {
    let st = Streaming {
        role_pending: shape.chat,
        shape,
        rx,
        include_usage,
        done: false,
    };
    let events = futures_util::stream::unfold(st, |mut st| async move {
        if st.done {
            return None;
        }
        if st.role_pending {
            st.role_pending = false;
            let mut c = st.shape.chunk(Some(""), None);
            c["choices"][0]["delta"]["role"] = json!("assistant");
            return Some((Ok::<_, Infallible>(sse(&c)), st));
        }
        let out = match st.rx.recv().await {
            Some(Event::Text(t)) => sse(&st.shape.chunk(Some(&t), None)),
            Some(Event::Done(f)) if f.reason == FinishReason::Cancelled => {
                st.done = true;
                sse(&unavailable_body())
            }
            Some(Event::Done(f)) => {
                st.done = true;
                let mut out = sse(&st.shape.chunk(None, Some(f.reason)));
                if st.include_usage {
                    let mut u = st.shape.object(Value::Null, true);
                    u["choices"] = json!([]);
                    u["usage"] = usage(&f);
                    out.push_str(&sse(&u));
                }
                out.push_str("data: [DONE]\n\n");
                out
            }
            Some(Event::Failed(e)) => {
                st.done = true;
                let e = ApiError {
                    status: 500,
                    message: format!("generation failed: {e}"),
                    kind: "server_error",
                    param: None,
                    code: None,
                };
                sse(&e.body())
            }
            None => return None,
        };
        Some((Ok(out), st))
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(events),
    )
        .into_response()
}

fn unavailable_body() -> Value {
    ApiError {
        status: 503,
        message: "the server is shutting down; the request was cancelled".into(),
        kind: "server_error",
        param: None,
        code: Some("shutting_down"),
    }
    .body()
}
