//! The input and command side of one conversation: the frame ring, the control handle, epochs, resets,
//! stop and `max_steps`. Shared by [`crate::Session`] and the slots of [`crate::BatchRunner`] so that both have
//! exactly the same command semantics (see `docs/CONTRACTS.md`).

use std::sync::Arc;
use std::time::Instant;

use crate::control::SessionControl;
use crate::events::{Counters, StopReason};
use crate::ring::FrameRing;
use crate::FRAME_SIZE;

/// A state change the model side must apply (between frames).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Command {
    /// New stream: every model state back to fresh.
    Reset,
    /// Soft interrupt: output-side state only.
    Interrupt,
}

/// What [`Inlet::begin`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Begin {
    /// No whole frame of the current stream is queued.
    Idle,
    /// Paused: nothing consumed.
    Paused,
    /// Stopped (stays stopped unless a reset clears a `MaxSteps` stop).
    Stopped(StopReason),
    /// A frame was popped into [`Inlet::input`]; run the pass for [`Inlet::frame_index`], then call
    /// [`Inlet::advance`].
    Ready,
}

pub(crate) struct Inlet {
    pub(crate) control: SessionControl,
    pub(crate) ring: Arc<FrameRing>,
    max_steps: Option<u64>,
    /// The frame popped by the last `begin` that returned `Ready`.
    pub(crate) input: Box<[f32; FRAME_SIZE]>,
    /// When that frame was completed by the producer (its arrival).
    pub(crate) arrived: Instant,
    /// LM call index of the next frame of the current stream.
    pub(crate) frame_index: u64,
    /// Epoch of the output being produced.
    pub(crate) epoch: u64,
    resets_seen: u64,
    /// Input frames with a sequence number below this belong to a stream that was reset.
    stream_start: u64,
    processed: u64,
    stopped: Option<StopReason>,
}

impl Inlet {
    pub(crate) fn new(ring: Arc<FrameRing>, max_steps: Option<u64>) -> Inlet {
        Inlet {
            control: SessionControl::new(ring.clone()),
            ring,
            max_steps,
            input: Box::new([0.0; FRAME_SIZE]),
            arrived: Instant::now(),
            frame_index: 0,
            epoch: 0,
            resets_seen: 0,
            stream_start: 0,
            processed: 0,
            stopped: None,
        }
    }

    pub(crate) fn stopped(&self) -> Option<StopReason> {
        self.stopped
    }

    /// Counters now.
    pub(crate) fn counters(&self) -> Counters {
        Counters {
            frames_in: self.ring.published(),
            frames_dropped: self.ring.dropped(),
            frames_discarded: self.ring.discarded(),
            frames_processed: self.processed,
            queued: self.ring.len(),
            epoch: self.epoch,
        }
    }

    /// Apply a pending reset (new stream): discard the old stream's queued input and ask for a model reset.
    fn apply_reset(&mut self, apply: &mut impl FnMut(Command)) {
        let resets = self.control.resets();
        if resets != self.resets_seen {
            self.resets_seen = resets;
            self.stream_start = self.control.reset_mark();
            self.ring.discard_before(self.stream_start);
            apply(Command::Reset);
            self.frame_index = 0;
            // A new stream gets a new step budget; an explicit stop stays.
            if self.stopped == Some(StopReason::MaxSteps) {
                self.stopped = None;
            }
        }
    }

    /// Apply pending commands; they are only ever observed here, between frames.
    fn apply_commands(&mut self, apply: &mut impl FnMut(Command)) {
        if self.stopped.is_none() && self.control.is_stop_requested() {
            self.stopped = Some(StopReason::Requested);
        }
        self.apply_reset(apply);
        let epoch = self.control.epoch();
        if epoch != self.epoch {
            self.epoch = epoch;
            apply(Command::Interrupt);
        }
    }

    /// Start of a step: apply commands (through `apply`), check stop / pause / `max_steps`, then pop the next
    /// frame of the current stream into `input`. Allocation-free.
    pub(crate) fn begin(&mut self, mut apply: impl FnMut(Command)) -> Begin {
        self.apply_commands(&mut apply);
        if let Some(r) = self.stopped {
            return Begin::Stopped(r);
        }
        if self.control.is_paused() {
            return Begin::Paused;
        }
        if let Some(max) = self.max_steps {
            if self.frame_index >= max {
                self.stopped = Some(StopReason::MaxSteps);
                return Begin::Stopped(StopReason::MaxSteps);
            }
        }
        loop {
            let Some((seq, arrived)) = self.ring.pop_stamped(&mut self.input) else {
                return Begin::Idle;
            };
            self.arrived = arrived;
            // A reset may have been requested while we were popping: re-check so that a frame of the new
            // stream is never run on the old state, and a frame of the old stream never on the new one.
            self.apply_commands(&mut apply);
            if seq >= self.stream_start {
                return Begin::Ready;
            }
            self.ring.count_discarded();
        }
    }

    /// After a successful pass of the frame popped by `begin`.
    pub(crate) fn advance(&mut self) {
        self.frame_index += 1;
        self.processed += 1;
    }
}
