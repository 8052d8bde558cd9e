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
    /// device error to carry, such as a build without GPU support). Its own text is only "device": the
    /// device's message is the `source()`, which a chain printer (anyhow's `{:#}`,
    /// [`RuntimeError::message`]) writes after it, once.
    #[error("device")]
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

impl RuntimeError {
    /// Whether the compute device failed: opening or using it ([`RuntimeError::Device`]), or inside the
    /// frame pass (a device backend's error in the LM or the codec, `LmError::Backend` /
    /// `MimiError::Backend`, alone or shared by a batch). The C ABI's `MN_STATUS_DEVICE` and Python's
    /// `DeviceError`.
    pub fn is_device(&self) -> bool {
        match self {
            RuntimeError::Device(_) => true,
            RuntimeError::Lm(e) | RuntimeError::Stt(SttError::Lm(e)) => {
                matches!(e, LmError::Backend(_))
            }
            RuntimeError::Codec(e) | RuntimeError::Stt(SttError::Mimi(e)) => {
                matches!(e, MimiError::Backend(_))
            }
            RuntimeError::Batch(shared) => shared.is_device(),
            _ => false,
        }
    }

    /// The whole message on one line ([`one_line`]).
    pub fn message(&self) -> String {
        one_line(self)
    }
}

/// An error's whole message on one line, for a caller that shows one line and does not walk
/// `source()` (the C ABI's last error, Python's exceptions, the server's error messages): the error's
/// text, then the text of each cause in its `source()` chain that the line does not hold yet (some
/// errors already repeat their cause's text in their own).
pub fn one_line(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = c.source();
    }
    line
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

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("adapter 9 lost")]
    struct Lost;

    /// The error and its causes as anyhow's `{:#}` prints them: each one's text, joined by ": ".
    fn chain(e: &dyn std::error::Error) -> String {
        let mut line = e.to_string();
        let mut cause = e.source();
        while let Some(c) = cause {
            line = format!("{line}: {c}");
            cause = c.source();
        }
        line
    }

    #[test]
    fn a_device_error_shows_the_device_message_once() {
        let e = RuntimeError::Device(Box::new(Lost));
        assert_eq!(chain(&e), "device: adapter 9 lost");
        assert_eq!(e.message(), "device: adapter 9 lost");
        // Shared by a batch, still once.
        let shared = RuntimeError::Batch(Arc::new(e));
        assert_eq!(chain(&shared), "device: adapter 9 lost");
        assert_eq!(shared.message(), "device: adapter 9 lost");
    }

    #[test]
    fn one_line_adds_only_the_causes_the_text_does_not_hold() {
        let io = || std::io::Error::other("no threads left");
        let e = RuntimeError::Spawn(io());
        assert_eq!(
            e.message(),
            e.to_string(),
            "its text already holds the cause"
        );
        assert_eq!(
            one_line(&RuntimeError::Lm(LmError::Backend(Box::new(Lost)))),
            "adapter 9 lost"
        );
    }

    #[test]
    fn a_device_failure_is_told_apart_wherever_it_happened() {
        let lm = || RuntimeError::Lm(LmError::Backend(Box::new(Lost)));
        let device = [
            RuntimeError::Device(Box::new(Lost)),
            lm(),
            RuntimeError::Codec(MimiError::Backend(Box::new(Lost))),
            RuntimeError::Stt(SttError::Lm(LmError::Backend(Box::new(Lost)))),
            RuntimeError::Batch(Arc::new(lm())),
        ];
        for e in &device {
            assert!(e.is_device(), "{e:?}");
        }
        let not = [
            RuntimeError::Lm(LmError::Config("bad".into())),
            RuntimeError::Model("bad bundle".into()),
            RuntimeError::Batch(Arc::new(RuntimeError::Model("bad".into()))),
            RuntimeError::WorkerPanicked,
        ];
        for e in &not {
            assert!(!e.is_device(), "{e:?}");
        }
    }
}
