//! The full-duplex runtime: engine, sessions and the frame pass.
//!
//! * [`Engine`]: the resident, immutable weight image (LM + Mimi + tokenizer), shared by sessions (`Arc`), and
//!   the [`Device`] sessions compute on ([`EngineOptions`]).
//! * [`Session`]: all per-conversation state, preallocated; [`Session::step`] runs one frame pass
//!   (encode → LM step → decode + detokenize; `conversation.rs` and `stepper.rs`, or `fused.rs` where the
//!   device runs the whole pass as one call: the GPU) and returns borrowed output.
//! * [`PcmProducer`]: non-blocking input (any chunk size, lock-free ring with drop-oldest).
//! * [`SessionControl`]: interrupt / pause / resume / reset / stop from any thread, applied between frames.
//! * [`SessionRunner`]: a worker thread per session with an event queue; stop joins exactly once.
//! * [`BatchRunner`]: several conversations ([`BatchSession`]s, same producer / control / events as a
//!   `SessionRunner`) on one worker thread, stepped together by one batched LM step (weights read once). A
//!   `Session` is a batch of one: both run the same conversation and stepper code.
//! * [`SttRunner`]: many speech-to-text streams on one worker thread, one batched step per tick (servers).
//! * [`SttEngine`] / [`Transcriber`]: one speech-to-text stream driven by the caller (push PCM, pull word,
//!   voice-activity and end-of-turn events; the C ABI's and Python's transcriber).
//!
//! See `docs/CONTRACTS.md` (runtime section) for the contract and `examples/duplex.rs` for a runnable example.
//!
//! ```no_run
//! use runtime::{Engine, EngineOptions, Event, Session, SessionOptions};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let engine = Engine::open("fixtures/lm".as_ref(), EngineOptions::default())?;
//! let session = Session::new(engine.clone(), SessionOptions { output_rate: 48_000, ..Default::default() })?;
//! let mut runner = session.spawn(16)?;
//! let mut mic = runner.producer().unwrap(); // push 24 kHz mono PCM from anywhere, never blocks
//! let events = runner.events().unwrap();
//! mic.push(&vec![0.0; 4 * runtime::FRAME_SIZE]);
//! runner.control().interrupt(); // output of the old epoch is dropped; the model state continues
//! if let Some(Event::Frame(f)) = events.recv() {
//!     println!("frame {} epoch {}: {} samples, text {:?}", f.frame_index, f.epoch, f.pcm.len(), f.text);
//!     events.recycle(f); // optional: reuse the buffers
//! }
//! runner.stop()?; // joins the worker exactly once
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

pub mod audio;
mod batch;
mod control;
mod conversation;
mod engine;
mod error;
mod events;
mod fused;
#[cfg(feature = "gpu")]
mod gpu_frame;
mod inlet;
pub mod realtime;
mod resample;
mod ring;
mod runner;
mod session;
mod stepper;
mod stt_driver;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod transcriber;
mod worker;

#[doc(hidden)]
pub use batch::BatchBench;
pub use batch::{BatchOptions, BatchRunner, BatchSession};
pub use control::SessionControl;
pub use engine::{lm_backend, physical_cores, Device, Engine, EngineOptions};
pub use error::{one_line, RuntimeError};
pub use events::{Counters, Event, FrameEvent, FrameTimings, Step, StopReason};
pub use ring::{PcmProducer, PushReport};
pub use runner::{EventReceiver, SessionRunner};
pub use session::{Session, SessionOptions};
#[doc(hidden)]
pub use stepper::{Phase, PhaseHook};
pub use stt_driver::{
    stt_batch, SttNotify, SttOutput, SttRunner, SttRunnerOptions, SttSession, SttStepOutput,
};
pub use transcriber::{SttEngine, Transcriber, TranscriberOptions, TranscriptEvent};

/// The model's sample rate (Hz).
pub const SAMPLE_RATE: u32 = 24_000;
/// Samples per model frame (80 ms at 24 kHz): one LM step.
pub const FRAME_SIZE: usize = 1920;
/// Audio codebooks generated per step (and read from the user) by Moshi.
pub const N_AUDIO: usize = 8;
