//! Kyutai's streaming speech-to-text models (`kyutai/stt-1b-en_fr`, `kyutai/stt-2.6b-en`) on the same
//! temporal transformer as Moshi (`docs/stt.md`).
//!
//! What is STT-specific lives here and only here: the configuration ([`SttPlan`], from the bundle's
//! `stt_config`), the step rules of `moshi` 0.2.13's `LMGen` with `dep_q = 0` and its extra heads
//! ([`SttBatch`]), and the word rules ([`WordAssembler`]). The layers run on any [`LmBackend`]
//! (the CPU one today); nothing here knows how.
//!
//! [`LmBackend`]: crate::lm::LmBackend

mod release;
mod stream;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod words;

pub use release::SttRelease;
pub use stream::{SttBatch, SttModel, SttStream};
pub use words::{SttEvent, WordAssembler, WordTokens, MAX_EXTRA_HEADS, MAX_WORD_TOKENS};

use crate::checkpoint::{CheckpointError, SttConfig};
use crate::lm::LmError;
use crate::mimi::MimiError;

/// Mimi frames per second (24 kHz / 1920).
pub const FRAME_RATE: f64 = 12.5;

/// Errors of the speech-to-text path.
#[derive(Debug, thiserror::Error)]
pub enum SttError {
    /// The bundle or its weights.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The language model.
    #[error(transparent)]
    Lm(#[from] LmError),
    /// The codec.
    #[error(transparent)]
    Mimi(#[from] MimiError),
    /// A configuration this path does not run (not an STT bundle, too many extra heads, ...).
    #[error("speech-to-text: {0}")]
    Config(String),
    /// A slice argument has the wrong length.
    #[error("{what}: expected length {expected}, got {got}")]
    Length {
        /// What was passed.
        what: &'static str,
        /// Expected length.
        expected: usize,
        /// Given length.
        got: usize,
    },
}

/// How one stream is fed and read, from the bundle's `stt_config` (`docs/stt.md`, "Stream").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SttPlan {
    /// Whole frames of silence fed before the audio: `ceil(audio_silence_prefix_seconds × 12.5)`
    /// (Kyutai's PyTorch script); 0 for stt-1b, 13 for stt-2.6b.
    pub prefix_frames: usize,
    /// The text's lag behind the audio in steps: `floor(audio_delay_seconds × 12.5)` (Kyutai's
    /// `stt-rs`); 6 for stt-1b, 31 for stt-2.6b.
    pub delay_tokens: usize,
    /// Frames of silence appended to flush the last words: `ceil((audio_delay_seconds + 1) × 12.5)`
    /// (the delay plus one second, as `stt-rs`); 19 for stt-1b, 44 for stt-2.6b.
    pub flush_frames: usize,
}

impl SttPlan {
    /// The plan of a bundle's `stt_config`.
    pub fn from_config(c: &SttConfig) -> Self {
        SttPlan {
            prefix_frames: (c.audio_silence_prefix_seconds * FRAME_RATE).ceil() as usize,
            delay_tokens: (c.audio_delay_seconds * FRAME_RATE) as usize,
            flush_frames: ((c.audio_delay_seconds + 1.0) * FRAME_RATE).ceil() as usize,
        }
    }

    /// Steps the word rules ignore, and the origin of timestamps: delay + prefix.
    pub fn skip(&self) -> usize {
        self.delay_tokens + self.prefix_frames
    }
}

#[cfg(test)]
mod tests;
