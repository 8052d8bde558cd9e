//! WebSocket server speaking Kyutai's `/api/chat` protocol, with Ogg/Opus audio, Prometheus
//! metrics and a built-in web page.
//!
//! Entry points: [`Server::bind`] + [`Server::run_until`] (async), or [`run_blocking`]; a caller that
//! must bind before it builds its backend (`serve` binds, then loads the model) uses
//! [`Listener::bind`], then [`Server::on`] or [`run_blocking_on`]. The model
//! is anything implementing [`backend::Backend`]; [`backend::RuntimeBackend`] serves the `runtime`
//! crate's engine.

mod app;
pub mod asr;
pub mod asr_protocol;
mod asr_service;
pub mod auth;
pub mod backend;
pub mod codec;
mod error;
pub mod metrics;
pub mod protocol;
mod socket;
mod state;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tls;
mod ws;

pub use app::{
    run_blocking, run_blocking_asr, run_blocking_on, shutdown_signal, validate, Listener,
    ServeConfig, Server, MAX_MESSAGE_BYTES, WORKER_THREADS,
};
pub use error::ServerError;
pub use ws::{OUT_QUEUE, WIRE_BUFFER};
