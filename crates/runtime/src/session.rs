//! A conversation: input queue, commands, epochs and the frame pass.

use std::sync::Arc;

use model::sampling::SamplerConfig;

use crate::control::SessionControl;
use crate::events::{Counters, FrameEvent, FrameOutput, Step, StopReason};
use crate::frame::{PhaseHook, Pipeline};
use crate::ring::{FrameRing, PcmProducer, PushReport};
use crate::runner::{Drive, Driven, SessionRunner};
use crate::{Engine, RuntimeError, FRAME_SIZE, SAMPLE_RATE};

/// Options of [`Session::new`].
#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// Sampling (temperatures, top-k, seeds...). Default: Python `LMGen` defaults with seed 42424242.
    /// `SamplerConfig::greedy()` for argmax.
    pub sampling: SamplerConfig,
    /// Bounded input queue, in 1920-sample frames (>= 1). Default 4 (320 ms). When full, the oldest queued
    /// frame is dropped and counted.
    pub max_queued_frames: usize,
    /// Rate of the output PCM (24000 = no resampling). Default 24000.
    pub output_rate: u32,
    /// Stop after this many LM steps of one stream (`Step::Stopped(StopReason::MaxSteps)`). Default None
    /// (unbounded: the LM's KV ring keeps wrapping past its context).
    pub max_steps: Option<u64>,
    /// Apply the Python server's first-frame rule (encode frame 0, reset Mimi, pass its codes to LMGen call 0).
    /// Default true.
    pub first_frame_reset: bool,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            sampling: SamplerConfig::default(),
            max_queued_frames: 4,
            output_rate: SAMPLE_RATE,
            max_steps: None,
            first_frame_reset: true,
        }
    }
}

/// All per-conversation state, preallocated at creation. Drive it with [`Session::step`] on one thread,
/// feed it through its [`PcmProducer`] from any thread, command it through [`SessionControl`] from any thread,
/// or hand it to a [`SessionRunner`].
pub struct Session {
    pipeline: Pipeline,
    control: SessionControl,
    ring: Arc<FrameRing>,
    producer: Option<PcmProducer>,
    opts: SessionOptions,
    input: Box<[f32; FRAME_SIZE]>,
    frame_index: u64,
    epoch: u64,
    resets_seen: u64,
    /// Input frames with a sequence number below this belong to a stream that was reset.
    stream_start: u64,
    processed: u64,
    stopped: Option<StopReason>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("frame_index", &self.frame_index)
            .field("epoch", &self.epoch)
            .field("stopped", &self.stopped)
            .field("counters", &self.counters())
            .finish()
    }
}

impl Session {
    /// Create a session; every buffer and stream state is allocated here.
    pub fn new(engine: Arc<Engine>, opts: SessionOptions) -> Result<Session, RuntimeError> {
        if opts.max_queued_frames == 0 {
            return Err(RuntimeError::InvalidOption(
                "max_queued_frames must be >= 1".into(),
            ));
        }
        let pipeline = Pipeline::new(
            engine,
            opts.sampling.clone(),
            opts.output_rate,
            opts.first_frame_reset,
        )?;
        let ring = FrameRing::new(opts.max_queued_frames);
        Ok(Session {
            pipeline,
            control: SessionControl::new(ring.clone()),
            producer: Some(PcmProducer::new(ring.clone())),
            ring,
            opts,
            input: Box::new([0.0; FRAME_SIZE]),
            frame_index: 0,
            epoch: 0,
            resets_seen: 0,
            stream_start: 0,
            processed: 0,
            stopped: None,
        })
    }

    /// The options the session was created with.
    pub fn options(&self) -> &SessionOptions {
        &self.opts
    }

    /// Take the producer end of the input queue (once) to push from another thread.
    pub fn take_producer(&mut self) -> Option<PcmProducer> {
        self.producer.take()
    }

    /// Push 24 kHz mono samples (any chunk size) through the internal producer. Never blocks.
    pub fn push_pcm(&mut self, pcm: &[f32]) -> Result<PushReport, RuntimeError> {
        match &mut self.producer {
            Some(p) => Ok(p.push(pcm)),
            None => Err(RuntimeError::ProducerTaken),
        }
    }

    /// Force these text tokens into Moshi's text stream, one per LM step from the next step on (text prompts,
    /// `generate --prompt`). Replaces tokens still pending from an earlier call; a reset clears them.
    pub fn force_text(&mut self, ids: &[u32]) -> Result<(), RuntimeError> {
        self.pipeline.force_text(ids)
    }

    /// A command handle (cloneable, usable from any thread).
    pub fn control(&self) -> SessionControl {
        self.control.clone()
    }

    /// Soft interrupt (see [`SessionControl::interrupt`]); applied at the next `step`.
    pub fn interrupt(&self) -> u64 {
        self.control.interrupt()
    }

    /// Mic pause (see [`SessionControl::pause`]).
    pub fn pause(&self) {
        self.control.pause()
    }

    /// Resume after pause.
    pub fn resume(&self) {
        self.control.resume()
    }

    /// New stream (see [`SessionControl::reset`]); applied at the next `step`.
    pub fn reset(&self) -> u64 {
        self.control.reset()
    }

    /// Stop (irreversible).
    pub fn stop(&self) {
        self.control.stop()
    }

    /// Counters now.
    pub fn counters(&self) -> Counters {
        Counters {
            frames_in: self.ring.published(),
            frames_dropped: self.ring.dropped(),
            frames_discarded: self.ring.discarded(),
            frames_processed: self.processed,
            queued: self.ring.len(),
            epoch: self.epoch,
        }
    }

    /// LM call index of the next frame (0 right after creation or reset).
    pub fn frame_index(&self) -> u64 {
        self.frame_index
    }

    /// Install a hook called at the start of every phase of the frame pass (tests of stop-during-phase).
    #[doc(hidden)]
    pub fn set_phase_hook(&mut self, hook: Option<PhaseHook>) {
        self.pipeline.hook = hook;
    }

    /// Apply a pending reset (new stream): discard the old stream's queued input, reset every state.
    fn apply_reset(&mut self) {
        let resets = self.control.resets();
        if resets != self.resets_seen {
            self.resets_seen = resets;
            self.stream_start = self.control.reset_mark();
            self.ring.discard_before(self.stream_start);
            self.pipeline.reset();
            self.frame_index = 0;
            // A new stream gets a new step budget; an explicit stop stays.
            if self.stopped == Some(StopReason::MaxSteps) {
                self.stopped = None;
            }
        }
    }

    /// Apply pending commands; they are only ever observed here, between frames.
    fn apply_commands(&mut self) {
        if self.stopped.is_none() && self.control.is_stop_requested() {
            self.stopped = Some(StopReason::Requested);
        }
        self.apply_reset();
        let epoch = self.control.epoch();
        if epoch != self.epoch {
            self.epoch = epoch;
            self.pipeline.interrupt();
        }
    }

    /// Run one frame pass if a whole input frame is queued; otherwise return at once. Commands are applied
    /// first (between frames). After warm-up this allocates nothing.
    pub fn step(&mut self) -> Result<Step<'_>, RuntimeError> {
        self.apply_commands();
        if let Some(r) = self.stopped {
            return Ok(Step::Stopped(r));
        }
        if self.control.is_paused() {
            return Ok(Step::Paused);
        }
        if let Some(max) = self.opts.max_steps {
            if self.frame_index >= max {
                self.stopped = Some(StopReason::MaxSteps);
                return Ok(Step::Stopped(StopReason::MaxSteps));
            }
        }
        loop {
            let Some(seq) = self.ring.pop(&mut self.input) else {
                return Ok(Step::Idle);
            };
            // A reset may have been requested while we were popping: re-check so that a frame of the new
            // stream is never run on the old state, and a frame of the old stream never on the new one.
            self.apply_commands();
            if seq >= self.stream_start {
                break;
            }
            self.ring.count_discarded();
        }
        let index = self.frame_index;
        let r = self.pipeline.frame_pass(&self.input, index)?;
        self.frame_index += 1;
        self.processed += 1;
        let counters = self.counters();
        Ok(Step::Frame(FrameOutput {
            epoch: self.epoch,
            frame_index: index,
            text_token: r.text_token,
            audio_tokens: r.audio_tokens,
            text: &self.pipeline.text,
            pcm: &self.pipeline.pcm,
            timings: r.timings,
            counters,
        }))
    }

    /// Move this session onto a worker thread (see [`SessionRunner`]).
    pub fn spawn(self, event_capacity: usize) -> Result<SessionRunner, RuntimeError> {
        SessionRunner::spawn_driver(self, event_capacity)
    }
}

impl Drive for Session {
    fn drive(&mut self, spare: &mut Option<FrameEvent>) -> Result<Driven, RuntimeError> {
        Ok(match self.step()? {
            Step::Idle => Driven::Idle,
            Step::Paused => Driven::Paused,
            Step::Stopped(r) => Driven::Stopped(r),
            Step::Frame(f) => match spare.take() {
                Some(mut ev) => {
                    f.copy_into(&mut ev);
                    Driven::Frame(ev)
                }
                None => Driven::Frame(f.to_event()),
            },
        })
    }
    fn control(&self) -> SessionControl {
        self.control.clone()
    }
    fn ring(&self) -> Arc<FrameRing> {
        self.ring.clone()
    }
    fn take_producer(&mut self) -> Option<PcmProducer> {
        self.producer.take()
    }
    fn counters(&self) -> Counters {
        Session::counters(self)
    }
}
