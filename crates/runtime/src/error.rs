//! The runtime's error type.

use thiserror::Error;

/// Errors of the runtime (opening an engine, creating or driving a session).
#[derive(Debug, Error)]
pub enum RuntimeError {
    /// A session or engine option is out of range.
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// The bundle could not be opened or a component could not be built from it.
    #[error("model: {0}")]
    Model(String),
    /// The producer end of the input queue was already taken with `take_producer`.
    #[error("the PCM producer was taken; push through it instead")]
    ProducerTaken,
    /// The worker thread could not be spawned.
    #[error("could not spawn the session worker: {0}")]
    Spawn(#[source] std::io::Error),
    /// The worker thread panicked.
    #[error("the session worker panicked")]
    WorkerPanicked,
}
