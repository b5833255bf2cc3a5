//! `rocmforge serve`: an OpenAI-compatible HTTP server over [`crate::generate::Generator`].
//!
//! - [`api`]: request bodies read field by field (every bad field a 400 naming it) and the
//!   OpenAI error body;
//! - [`chat`]: messages through the model's own Jinja chat template;
//! - [`sample`]: greedy, temperature, top-k, top-p with a per-request seed, on the host from
//!   the step's logits;
//! - [`text`]: ids to text as they arrive, stop strings, never half a character or half a stop
//!   string sent;
//! - [`scheduler`]: version 1, one worker thread owning the generator, one request at a time
//!   from a bounded queue; cancellation at the next token;
//! - [`http`]: the thin axum layer (routes, bearer key, SSE), and [`metrics`] (Prometheus).
//!
//! The paged KV cache and continuous batching (issue 26's first two parts) replace the worker
//! loop later; the routes and the job's event channel stay.

pub mod api;
pub mod batched;
pub mod chat;
pub mod http;
pub mod kv_blocks;
pub mod metrics;
pub mod sample;
pub mod scheduler;
pub mod text;

pub use http::{router, serve, AppState, ModelInfo};
pub use scheduler::{Engine, Scheduler};
