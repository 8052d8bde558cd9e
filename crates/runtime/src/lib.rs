//! The full-duplex runtime: engine, sessions and the frame pass.
//!
//! See `docs/CONTRACTS.md` (runtime section) for the API contract and its semantics.

pub mod audio;
mod control;
mod error;
mod events;
mod ring;
mod runner;

pub use control::SessionControl;
pub use error::RuntimeError;
pub use events::{Counters, Event, FrameEvent, FrameOutput, FrameTimings, Step, StopReason};
pub use ring::{PcmProducer, PushReport};
pub use runner::{EventReceiver, SessionRunner};

/// The model's sample rate (Hz).
pub const SAMPLE_RATE: u32 = 24_000;
/// Samples per model frame (80 ms at 24 kHz): one LM step.
pub const FRAME_SIZE: usize = 1920;
