//! What the server needs from a speech model: open a conversation, push PCM, receive frames.
//!
//! The product implementation is [`RuntimeBackend`] (the `runtime` crate's `Engine`/`SessionRunner`).
//! The trait exists so that the protocol layer can also be exercised with a test double (the echo
//! backend of the `testing` feature, which only this crate's tests turn on).
//!
//! A conversation's output is the runtime's own [`Event`]: a frame, the stop reason ([`StopReason`]) or
//! the typed [`runtime::RuntimeError`]. `ws.rs` turns it into protocol messages and the close frame; nothing
//! between the runtime and the socket translates it.

use crate::protocol::SessionParams;
pub use crate::protocol::{BackendInfo, SessionCommand};
pub use runtime::{Event, FrameEvent, StopReason};

/// A conversation could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The runtime refused the conversation or failed to start it (a bad option, no free slot, a worker
    /// that could not be spawned, a device failure while warming up).
    #[error(transparent)]
    Runtime(#[from] runtime::RuntimeError),
    /// This backend serves no conversation: the speech-to-text server's `/api/chat`, or a test double.
    #[error("{0}")]
    Unavailable(String),
}

/// What happened to pushed input.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InputReport {
    /// 1920-sample frames completed by this push.
    pub frames_completed: u32,
    /// Queued frames dropped (oldest first) by this push because the model is behind.
    pub frames_dropped: u32,
    /// Frames waiting after this push.
    pub queued: usize,
}

/// The non-blocking input end of a conversation (24 kHz mono PCM, any chunk size).
pub trait AudioInput: Send {
    /// Queues samples; never blocks. When the model is behind, old frames are dropped.
    fn push(&mut self, pcm: &[f32]) -> InputReport;
}

/// The output end of a conversation.
pub trait EventSource: Send {
    /// Blocks until the next event; `None` once the conversation has ended and all events were read.
    /// A frame's audio is 24 kHz mono (it may be empty, e.g. the first frame); [`Event::Stopped`] and
    /// [`Event::Error`] are last.
    fn recv(&mut self) -> Option<Event>;
    /// Hands a frame's buffers back for reuse by a later frame (optional; the default drops them). With it the
    /// runtime backend allocates nothing per frame.
    fn recycle(&mut self, frame: FrameEvent) {
        drop(frame);
    }
}

/// Ends a conversation, and passes it the commands its client sends while it runs.
pub trait Stopper: Send {
    /// Requests stop and joins the worker (idempotent; afterwards [`EventSource::recv`] returns
    /// `None`).
    fn stop(&mut self);
    /// Applies a client command between frames, without blocking on the frame pass. Returns
    /// whether the backend supports it (the default supports none).
    fn command(&self, command: SessionCommand) -> bool {
        let _ = command;
        false
    }
}

/// A started conversation, split into the parts used by different threads.
pub struct OpenSession {
    /// Where decoded client audio goes.
    pub input: Box<dyn AudioInput>,
    /// Where model output comes from.
    pub events: Box<dyn EventSource>,
    /// How to end it.
    pub stopper: Box<dyn Stopper>,
}

/// A model that can hold many conversations at once.
pub trait Backend: Send + Sync + 'static {
    /// Static information for the metadata message.
    fn info(&self) -> BackendInfo;
    /// Starts a conversation (may allocate a lot; called on a blocking thread). The CPU work of the
    /// conversation runs on threads owned by the returned session, never on the caller's.
    fn open(&self, params: &SessionParams) -> Result<OpenSession, BackendError>;
}

mod runtime_backend;
pub use runtime_backend::RuntimeBackend;
