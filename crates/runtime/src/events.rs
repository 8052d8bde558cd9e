//! What a frame pass reports: output, timings and counters.

use crate::RuntimeError;

/// Why a session stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// `stop` was requested.
    Requested,
    /// `SessionOptions::max_steps` LM steps were run.
    MaxSteps,
}

/// Wall-clock time spent in each phase of one frame pass, in microseconds. A session on the GPU runs
/// encode, LM step and decode as one device call: there `encode_us` is 0, `lm_us` is the whole call and
/// `decode_us` the detokenization and resampling after it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameTimings {
    /// Mimi encode of the input frame.
    pub encode_us: u32,
    /// LM step (temporal transformer, sampling and depformer).
    pub lm_us: u32,
    /// Mimi decode, detokenization and output resampling.
    pub decode_us: u32,
    /// Of `decode_us`: the output resampling.
    pub resample_us: u32,
    /// Of `decode_us`: the detokenization.
    pub detok_us: u32,
    /// Whole frame pass (encode + LM + decode).
    pub total_us: u32,
    /// From the frame's arrival (the push that completed it) to the end of its pass: the lag a user
    /// feels, which adds the time the frame waited in the input queue to `total_us`.
    pub lag_us: u32,
}

/// Running counters of a session (since creation; a reset does not clear them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Complete input frames ever queued by the producer.
    pub frames_in: u64,
    /// Input frames dropped (oldest first) because the queue was full.
    pub frames_dropped: u64,
    /// Input frames discarded by a reset (queued input of the old stream).
    pub frames_discarded: u64,
    /// Frame passes run (LM steps).
    pub frames_processed: u64,
    /// Input frames waiting in the queue (the lag behind the producer, in 80 ms frames).
    pub queued: usize,
    /// Current epoch.
    pub epoch: u64,
}

/// Result of [`crate::Session::step`].
#[derive(Debug)]
pub enum Step<'a> {
    /// No whole frame is queued; nothing was done.
    Idle,
    /// The session is paused; nothing was consumed or produced.
    Paused,
    /// The session is stopped (and stays stopped).
    Stopped(StopReason),
    /// One frame pass ran; the frame is borrowed from the session's buffers (no allocation).
    Frame(&'a FrameEvent),
}

/// What one frame pass produced: returned borrowed by [`crate::Session::step`], sent owned by
/// [`crate::SessionRunner`] and [`crate::BatchSession`] (whose receivers can recycle its buffers).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FrameEvent {
    /// Epoch at which the frame was produced.
    pub epoch: u64,
    /// LM call index since the stream started or was reset.
    pub frame_index: u64,
    /// Text token returned by LMGen (None at call 0).
    pub text_token: Option<u32>,
    /// The 8 Moshi audio tokens returned by LMGen (None at call 0).
    pub audio_tokens: Option<[u32; 8]>,
    /// Detokenized text produced by this frame.
    pub text: String,
    /// Output audio at the session's output rate.
    pub pcm: Vec<f32>,
    /// Time spent in each phase.
    pub timings: FrameTimings,
    /// Counters after this frame.
    pub counters: Counters,
}

impl FrameEvent {
    /// An empty frame whose buffers hold `pcm` samples and `text` bytes without growing.
    pub(crate) fn with_capacity(pcm: usize, text: usize) -> FrameEvent {
        FrameEvent {
            epoch: 0,
            frame_index: 0,
            text_token: None,
            audio_tokens: None,
            text: String::with_capacity(text),
            pcm: Vec::with_capacity(pcm),
            timings: FrameTimings::default(),
            counters: Counters::default(),
        }
    }

    /// Copy into `ev`, reusing its buffers (no allocation when they are large enough).
    pub fn copy_into(&self, ev: &mut FrameEvent) {
        ev.epoch = self.epoch;
        ev.frame_index = self.frame_index;
        ev.text_token = self.text_token;
        ev.audio_tokens = self.audio_tokens;
        ev.text.clear();
        ev.text.push_str(&self.text);
        ev.pcm.clear();
        ev.pcm.extend_from_slice(&self.pcm);
        ev.timings = self.timings;
        ev.counters = self.counters;
    }

    /// A copy with headroom in its buffers, so that a recycled copy rarely has to grow (output lengths vary
    /// when resampling). Allocates.
    pub fn to_event(&self) -> FrameEvent {
        let mut ev = FrameEvent::with_capacity(self.pcm.len() * 2 + 64, self.text.len().max(64));
        self.copy_into(&mut ev);
        ev
    }
}

/// An event from a [`crate::SessionRunner`].
#[derive(Debug)]
pub enum Event {
    /// One frame pass (of the current epoch; older epochs are dropped by the receiver).
    Frame(FrameEvent),
    /// The session stopped; last event.
    Stopped(StopReason),
    /// The frame pass failed; last event.
    Error(RuntimeError),
}
