//! `rocmforge serve`: an OpenAI-compatible HTTP server over [`crate::generate::Generator`].
//!
//! - [`api`]: request bodies read field by field (every bad field a 400 naming it) and the
//!   OpenAI error body;
//! - [`chat`]: messages through the model's own Jinja chat template;
//! - [`sample`]: greedy, temperature, top-k, top-p with a per-request seed, on the host from
//!   the step's logits;
//! - [`text`]: ids to text as they arrive, stop strings, never half a character or half a stop
//!   string sent;
//! - [`scheduler`]: the bounded queue and the worker thread that owns the model; version 1
//!   runs one request at a time; [`batch_worker`] (version 2) batches them continuously over
//!   the paged KV cache of [`batched`] ([`kv_blocks`]: the block pool);
//! - [`http`]: the thin axum layer (routes, bearer key, SSE), and [`metrics`] (Prometheus).
//!
//! Both workers take the same jobs and send the same events: the routes do not know which
//! one runs.

pub mod api;
pub mod batch_worker;
pub mod batched;
pub mod chat;
pub mod http;
pub mod kv_blocks;
pub mod metrics;
pub mod sample;
pub mod scheduler;
pub mod text;

pub use batch_worker::BatchEngine;
pub use http::{router, serve, AppState, ModelInfo};
pub use scheduler::{Engine, Scheduler};
