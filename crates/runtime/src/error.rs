//! The runtime's error type.

use thiserror::Error;

/// Errors of the runtime (opening an engine, creating or driving a session).
#[derive(Debug, Error)]
pub enum RuntimeError {
    /// A session or engine option is out of range.
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// The compute device could not be used (no GPU adapter, a format or size the device refuses;
    /// the message carries a hint).
    #[error("device: {0}")]
    Device(String),
    /// The bundle could not be opened or a component could not be built from it.
    #[error("model: {0}")]
    Model(String),
    /// The producer end of the input queue was already taken with `take_producer`.
    #[error("the PCM producer was taken; push through it instead")]
    ProducerTaken,
    /// The worker thread could not be spawned.
    #[error("could not spawn the session worker: {0}")]
    Spawn(#[source] std::io::Error),
    /// The LM produced NaN or infinite logits (corrupt weights or a numerical blow-up). The frame is
    /// refused rather than sampled; the session cannot continue meaningfully and should be ended.
    #[error("frame {frame}: {stream} logits are not finite (logit {index} is {value}); the model weights may be corrupt")]
    NonFiniteLogits {
        /// LM call index of the frame.
        frame: u64,
        /// `"text"` or `"audio"`.
        stream: &'static str,
        /// Index of the first non-finite logit.
        index: usize,
        /// Its value.
        value: f32,
    },
    /// Every slot of a [`crate::BatchRunner`] is taken.
    #[error("all {slots} batch slots are taken")]
    NoFreeSlot {
        /// Number of slots of the batch.
        slots: usize,
    },
    /// The [`crate::BatchRunner`] was stopped; it takes no new conversation.
    #[error("the batch runner was stopped")]
    RunnerStopped,
    /// The worker thread panicked.
    #[error("the session worker panicked")]
    WorkerPanicked,
}

/// A failure of the GPU backend is a device error, with the backend's message.
#[cfg(feature = "gpu")]
impl From<gpu::GpuError> for RuntimeError {
    fn from(e: gpu::GpuError) -> Self {
        RuntimeError::Device(e.to_string())
    }
}
