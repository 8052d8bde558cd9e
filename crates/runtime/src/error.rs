//! The runtime's error type.

use std::sync::Arc;

use model::lm::LmError;
use model::mimi::MimiError;
use model::stt::SttError;
use thiserror::Error;

use crate::audio::AudioError;

/// Errors of the runtime (opening an engine, creating or driving a session).
#[derive(Debug, Error)]
pub enum RuntimeError {
    /// A session or engine option is out of range.
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// The compute device could not be opened or used. The source is the device's own error, kept whole
    /// (a `gpu::GpuError` under the `gpu` feature: downcast it; a message with a hint where there is no
    /// device error to carry, such as a build without GPU support).
    #[error("device: {0}")]
    Device(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The bundle could not be opened or a component could not be built from it (opening only; the
    /// frame pass reports [`RuntimeError::Lm`], [`RuntimeError::Codec`], [`RuntimeError::Stt`]).
    #[error("model: {0}")]
    Model(String),
    /// The LM failed (building its state or stepping). A device failure inside it is
    /// `LmError::Backend`, whose box holds the device's error.
    #[error(transparent)]
    Lm(#[from] LmError),
    /// The Mimi codec failed (encoding or decoding a frame). A device failure inside it is
    /// `MimiError::Backend`.
    #[error(transparent)]
    Codec(#[from] MimiError),
    /// The speech-to-text model failed (a batched step, or its warm-up).
    #[error(transparent)]
    Stt(#[from] SttError),
    /// A batched call (the codec or the LM step of several conversations, or a speech-to-text tick) failed:
    /// every conversation in it ends with this one error, shared.
    #[error(transparent)]
    Batch(Arc<RuntimeError>),
    /// The output resampler failed.
    #[error("output resampler: {0}")]
    Resample(#[source] AudioError),
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

/// A bundle that could not be opened into its components is a model error, its message kept.
impl From<model::LoadError> for RuntimeError {
    fn from(e: model::LoadError) -> Self {
        RuntimeError::Model(e.to_string())
    }
}

/// A failure of the GPU backend outside the LM and the codec (opening the device, uploading weights) is a
/// device error carrying the `GpuError` itself.
#[cfg(feature = "gpu")]
impl From<gpu::GpuError> for RuntimeError {
    fn from(e: gpu::GpuError) -> Self {
        RuntimeError::Device(Box::new(e))
    }
}
