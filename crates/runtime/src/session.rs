//! A conversation: input queue, commands, epochs and the frame pass.

use std::sync::Arc;

use model::sampling::SamplerConfig;

use crate::control::SessionControl;
use crate::conversation::Conversation;
use crate::engine::Compute;
use crate::events::{Counters, FrameEvent, Step};
use crate::inlet::Inlet;
use crate::ring::{FrameRing, PcmProducer, PushReport};
use crate::runner::{Drive, Driven, SessionRunner};
use crate::stepper::{new_sampler, PhaseHook, Prepared, Stepper};
use crate::{Engine, RuntimeError, SAMPLE_RATE};

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
///
/// A session is a batch of one: the same conversation state and the same LM stepper as a slot of a
/// [`crate::BatchRunner`], with its own compute context (on the CPU, its own worker pool, which Mimi and the
/// LM share).
pub struct Session {
    conv: Conversation,
    stepper: Stepper,
    /// The compute context the LM and codec backends share.
    compute: Compute,
    producer: Option<PcmProducer>,
    opts: SessionOptions,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("frame_index", &self.conv.inlet.frame_index)
            .field("epoch", &self.conv.inlet.epoch)
            .field("stopped", &self.conv.inlet.stopped())
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
        let compute = engine.compute();
        let mut stepper = Stepper::new(&engine, &compute, 1)?;
        stepper.set_sampler(0, new_sampler(&engine, opts.sampling.clone())?);
        let ring = FrameRing::new(opts.max_queued_frames);
        let producer = Some(PcmProducer::new(ring.clone()));
        let inlet = Inlet::new(ring, opts.max_steps);
        let codec = engine.codec_backend(&compute);
        let conv = Conversation::new(
            &engine,
            codec,
            inlet,
            opts.output_rate,
            opts.first_frame_reset,
        )?;
        Ok(Session {
            conv,
            stepper,
            compute,
            producer,
            opts,
        })
    }

    /// The options the session was created with.
    pub fn options(&self) -> &SessionOptions {
        &self.opts
    }

    /// Threads this session computes on (Mimi and the LM share them).
    pub fn threads(&self) -> usize {
        match &self.compute {
            Compute::Cpu(pool) => pool.n_threads(),
        }
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
        self.conv.force_text(ids)
    }

    /// A command handle (cloneable, usable from any thread).
    pub fn control(&self) -> SessionControl {
        self.conv.inlet.control.clone()
    }

    /// Soft interrupt (see [`SessionControl::interrupt`]); applied at the next `step`.
    pub fn interrupt(&self) -> u64 {
        self.conv.inlet.control.interrupt()
    }

    /// Mic pause (see [`SessionControl::pause`]).
    pub fn pause(&self) {
        self.conv.inlet.control.pause()
    }

    /// Resume after pause.
    pub fn resume(&self) {
        self.conv.inlet.control.resume()
    }

    /// New stream (see [`SessionControl::reset`]); applied at the next `step`.
    pub fn reset(&self) -> u64 {
        self.conv.inlet.control.reset()
    }

    /// Stop (irreversible).
    pub fn stop(&self) {
        self.conv.inlet.control.stop()
    }

    /// Counters now.
    pub fn counters(&self) -> Counters {
        self.conv.inlet.counters()
    }

    /// LM call index of the next frame (0 right after creation or reset).
    pub fn frame_index(&self) -> u64 {
        self.conv.inlet.frame_index
    }

    /// Install a hook called at the start of every phase of the frame pass (tests of stop-during-phase).
    #[doc(hidden)]
    pub fn set_phase_hook(&mut self, hook: Option<PhaseHook>) {
        self.stepper.hook = hook;
    }

    /// Run one frame pass if a whole input frame is queued; otherwise return at once. Commands are applied
    /// first (between frames). After warm-up this allocates nothing.
    pub fn step(&mut self) -> Result<Step<'_>, RuntimeError> {
        self.stepper.begin_tick();
        match self.stepper.prepare(0, &mut self.conv) {
            Prepared::Idle => return Ok(Step::Idle),
            Prepared::Paused => return Ok(Step::Paused),
            Prepared::Stopped(r) => return Ok(Step::Stopped(r)),
            Prepared::Failed(e) => return Err(e),
            Prepared::Ready => {}
        }
        self.stepper.step_lm()?;
        self.stepper.finish(0, &mut self.conv)?;
        Ok(Step::Frame(&self.conv.frame))
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
        self.conv.inlet.control.clone()
    }
    fn ring(&self) -> Arc<FrameRing> {
        self.conv.inlet.ring.clone()
    }
    fn take_producer(&mut self) -> Option<PcmProducer> {
        self.producer.take()
    }
    fn counters(&self) -> Counters {
        Session::counters(self)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::stepper::Phase;
    use crate::{EngineOptions, FRAME_SIZE};

    /// Mimi runs on the session's pool: the pool's count of parallel calls moves during the encode and
    /// the decode phase of every frame, not only during the LM phases.
    #[test]
    fn mimi_runs_on_the_session_pool() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/lm");
        let engine = Engine::open(&dir, EngineOptions::cpu(2)).unwrap();
        let opts = SessionOptions {
            sampling: SamplerConfig::greedy(),
            ..Default::default()
        };
        let mut s = Session::new(engine, opts).unwrap();
        let Compute::Cpu(pool) = &s.compute;
        let pool = pool.clone();
        assert_eq!(pool.n_threads(), 2);
        let marks = Arc::new(Mutex::new(Vec::new()));
        let (m, p) = (marks.clone(), pool.clone());
        s.set_phase_hook(Some(Arc::new(move |phase| {
            m.lock().unwrap().push((phase, p.dispatches()))
        })));
        let frames = 4;
        let pcm: Vec<f32> = (0..frames * FRAME_SIZE)
            .map(|i| 0.3 * (i as f32 * 0.05).sin())
            .collect();
        s.push_pcm(&pcm).unwrap();
        let mut produced = 0;
        while let Step::Frame(_) = s.step().unwrap() {
            produced += 1;
        }
        assert_eq!(produced, frames);
        let mut marks = marks.lock().unwrap().clone();
        marks.push((Phase::Encode, pool.dispatches()));
        let during = |from: Phase, to: Phase| -> Vec<u32> {
            marks
                .windows(2)
                .filter(|w| w[0].0 == from && w[1].0 == to)
                .map(|w| w[1].1.wrapping_sub(w[0].1))
                .collect()
        };
        let encode = during(Phase::Encode, Phase::Lm);
        let decode = during(Phase::Decode, Phase::Encode);
        assert_eq!(encode.len(), frames);
        assert_eq!(decode.len(), frames);
        assert!(
            encode.iter().all(|&n| n > 0),
            "encode calls on the pool: {encode:?}"
        );
        // Frame 0 has no LM output, so nothing to decode; every later frame decodes on the pool.
        assert_eq!(decode[0], 0, "{decode:?}");
        assert!(
            decode[1..].iter().all(|&n| n > 0),
            "decode calls on the pool: {decode:?}"
        );
    }
}
