//! A conversation: input queue, commands, epochs and the frame pass.

use std::sync::Arc;
use std::time::Instant;

use model::sampling::SamplerConfig;

use crate::control::SessionControl;
use crate::conversation::{micros, Conversation, PassSlots};
use crate::engine::Workers;
use crate::events::{Counters, Event, FrameEvent, FrameTimings, Step};
use crate::fused::FusedPass;
use crate::inlet::{Begin, Inlet};
use crate::ring::{FrameRing, PcmProducer, PushReport};
use crate::runner::{Drive, SessionRunner};
use crate::stepper::{lm_error, new_sampler, PhaseHook, Stepper};
use crate::{Engine, RuntimeError, N_AUDIO, SAMPLE_RATE};

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
    pass: Pass,
    /// The worker pool the LM and codec backends share.
    compute: Workers,
    producer: Option<PcmProducer>,
    opts: SessionOptions,
}

/// How a session runs its frame pass.
enum Pass {
    /// Encode, LM step and decode apart (the CPU; a GPU session whose sampler needs the host).
    Split(Box<Stepper>),
    /// The whole pass as one call of the device (`fused.rs`: the GPU).
    Fused(Box<FusedPass>),
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
        Self::build(engine, opts, None)
    }

    /// A session whose LM keeps `kv_capacity` temporal KV entries instead of the model's context
    /// (on the CPU; a GPU LM keeps its full cache): its frames are the same as a full session's for the
    /// first `kv_capacity` frames. For a timing pass at start-up, or a benchmark of a few hundred frames,
    /// that should not allocate and touch a full-context cache (3.1 GB in f32 for Moshi) per session.
    pub fn with_kv_capacity(
        engine: Arc<Engine>,
        opts: SessionOptions,
        kv_capacity: usize,
    ) -> Result<Session, RuntimeError> {
        Self::build(engine, opts, Some(kv_capacity))
    }

    fn build(
        engine: Arc<Engine>,
        opts: SessionOptions,
        kv_capacity: Option<usize>,
    ) -> Result<Session, RuntimeError> {
        if opts.max_queued_frames == 0 {
            return Err(RuntimeError::InvalidOption(
                "max_queued_frames must be >= 1".into(),
            ));
        }
        let compute = engine.workers();
        let sampler = new_sampler(&engine, opts.sampling.clone())?;
        let ring = FrameRing::new(opts.max_queued_frames);
        let producer = Some(PcmProducer::new(ring.clone()));
        let inlet = Inlet::new(ring, opts.max_steps);
        let (rate, rule) = (opts.output_rate, opts.first_frame_reset);
        let pass = match engine.frame_backend(&sampler)? {
            Some(backend) => Pass::Fused(Box::new(FusedPass::new(backend, sampler))),
            None => {
                let mut stepper = Stepper::new(&engine, &compute, 1, kv_capacity)?;
                stepper.set_sampler(0, sampler);
                Pass::Split(Box::new(stepper))
            }
        };
        let conv = Conversation::new(&engine, inlet, rate, rule)?;
        Ok(Session {
            conv,
            pass,
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
        self.compute.0.n_threads()
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
        match &mut self.pass {
            Pass::Split(st) => st.hook = hook,
            Pass::Fused(f) => f.hook = hook,
        }
    }

    /// Run one frame pass if a whole input frame is queued; otherwise return at once. Commands are applied
    /// first (between frames). After warm-up this allocates nothing.
    pub fn step(&mut self) -> Result<Step<'_>, RuntimeError> {
        let stepper = match &mut self.pass {
            Pass::Split(st) => st,
            Pass::Fused(f) => {
                let begin = f.step(&mut self.conv)?;
                return Ok(waiting(begin).unwrap_or(Step::Frame(&self.conv.frame)));
            }
        };
        stepper.begin_tick();
        if let Some(step) = waiting(stepper.begin(0, &mut self.conv)) {
            return Ok(step);
        }
        stepper.encode()?;
        stepper.admit(0, &mut self.conv);
        stepper.step_lm()?;
        stepper.decode()?;
        stepper.finish(0, &mut self.conv)?;
        Ok(Step::Frame(&self.conv.frame))
    }

    /// Runs one frame pass of quiet noise through this session and puts the session back exactly as
    /// it was: at the start of its stream, with the same queued input, pending forced text, counters
    /// and epoch (the tests compare a warmed-up session's output with a fresh one's, bit for bit).
    /// It faults in the weights and buffers a frame touches, so the first real frame does not pay for
    /// them, and returns the pass's timings, for the real-time check ([`crate::realtime`]).
    ///
    /// LM call 0 produces no audio (the acoustic delay), so the decode phase decodes a frame of
    /// placeholder codes: the returned timings are those of a full pass (encode, LM, decode). Only at
    /// the start of a stream (before the first frame, or right after a reset was applied); otherwise
    /// [`RuntimeError::InvalidOption`].
    pub fn warm_up(&mut self) -> Result<FrameTimings, RuntimeError> {
        if self.conv.inlet.frame_index != 0 {
            return Err(RuntimeError::InvalidOption(format!(
                "warm_up runs at the start of a stream (this session is at frame {})",
                self.conv.inlet.frame_index
            )));
        }
        // Low-level noise from a fixed LCG, not silence: the pass does the same work either way, but
        // nothing downstream special-cases noise. Written straight into the popped-frame buffer, not
        // through the input queue, so the counters and the queued input do not move.
        let mut x = 0x2545_f491u32;
        for v in self.conv.inlet.input.iter_mut() {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            *v = ((x >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 0.01;
        }
        let start = Instant::now();
        let result = self.warm_up_pass();
        // Back to the fresh stream whatever happened: LM row (token cache, KV positions), sampler
        // (seeds, history), codec streams, detokenizer, resampler.
        match &mut self.pass {
            Pass::Split(st) => st.reset_row(0),
            Pass::Fused(f) => f.reset_row(),
        }
        self.conv.reset_streams();
        let (encode_us, lm_us, decode_us) = result?;
        Ok(FrameTimings {
            encode_us,
            lm_us,
            decode_us,
            total_us: encode_us.saturating_add(lm_us).saturating_add(decode_us),
            lag_us: micros(start.elapsed()),
            ..FrameTimings::default()
        })
    }

    /// The pass of [`Session::warm_up`]: encode, LM step (no forced text), decode; returns the
    /// microseconds of each.
    fn warm_up_pass(&mut self) -> Result<(u32, u32, u32), RuntimeError> {
        let stepper = match &mut self.pass {
            Pass::Split(st) => st,
            Pass::Fused(f) => return f.warm_up_pass(&mut self.conv),
        };
        stepper.begin_tick();
        stepper.stage(0, self.conv.input());
        stepper.encode()?;
        let (encode_us, _, _) = stepper.phase_us();
        // The codes reach the conversation as a frame's do (the first-frame rule included), but the
        // step forces no text and consumes none of the conversation's.
        let codes = *self.conv.set_encoded(stepper.encoded(0));
        if self.conv.take_codec_reset() {
            stepper.reset_codec(0);
        }
        stepper.admit_with(0, &codes, None);
        stepper.step_lm()?;
        let lm_us = stepper.lm_us();
        let audio = match stepper.take_result(0).map_err(|e| lm_error(e, 0))? {
            Some(f) => {
                let mut a = [0u32; N_AUDIO];
                a.copy_from_slice(f.audio());
                a
            }
            None => [0; N_AUDIO],
        };
        let t1 = Instant::now();
        stepper.decode_codes(0, &audio, self.conv.decoded_mut())?;
        self.conv.resample_only()?;
        Ok((encode_us, lm_us, micros(t1.elapsed())))
    }

    /// Move this session onto a worker thread (see [`SessionRunner`]).
    pub fn spawn(self, event_capacity: usize) -> Result<SessionRunner, RuntimeError> {
        SessionRunner::spawn_driver(self, event_capacity)
    }
}

/// The step of a conversation whose begin found no frame to run; `None` when it found one
/// ([`Begin::Ready`]: the pass runs).
fn waiting(begin: Begin) -> Option<Step<'static>> {
    match begin {
        Begin::Idle => Some(Step::Idle),
        Begin::Paused => Some(Step::Paused),
        Begin::Stopped(r) => Some(Step::Stopped(r)),
        Begin::Ready => None,
    }
}

impl Drive for Session {
    fn drive(&mut self, spare: &mut Option<FrameEvent>) -> Option<Event> {
        match self.step() {
            Err(e) => Some(Event::Error(e)),
            Ok(Step::Idle | Step::Paused) => None,
            Ok(Step::Stopped(r)) => Some(Event::Stopped(r)),
            Ok(Step::Frame(f)) => Some(Event::Frame(match spare.take() {
                Some(mut ev) => {
                    f.copy_into(&mut ev);
                    ev
                }
                None => f.to_event(),
            })),
        }
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

    use model::lm::{LmBackend, LmError};

    use super::*;
    use crate::stepper::Phase;
    use crate::{EngineOptions, Event, FRAME_SIZE};

    fn fixture_engine(threads: usize) -> Arc<Engine> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/lm");
        Engine::open(&dir, EngineOptions::cpu(threads)).unwrap()
    }

    /// Every frame of `frames` frames of speech-like input, all fields but the timings.
    fn run(s: &mut Session, frames: usize) -> Vec<FrameEvent> {
        let pcm: Vec<f32> = (0..frames * FRAME_SIZE)
            .map(|i| 0.3 * (i as f32 * 0.031).sin() * (1.0 + (i as f32 * 0.0007).cos()))
            .collect();
        let out = crate::testing::frames_of(s, &pcm).unwrap();
        assert_eq!(out.len(), frames);
        out
    }

    /// A warmed-up session is a fresh session: with seeded sampling (the random streams are part of
    /// the state), forced text set before the warm-up, more frames than the fixture's KV context (10),
    /// and with the first-frame rule off too (it resets the codec after frame 0's encode, which would
    /// hide a codec left dirty by the warm-up), its frames (tokens, text, PCM bit for bit, counters,
    /// epochs) equal a fresh session's.
    #[test]
    fn a_warmed_up_session_runs_as_a_fresh_one() {
        for (threads, first_frame_reset) in [(1, true), (2, false)] {
            let engine = fixture_engine(threads);
            let opts = SessionOptions {
                sampling: SamplerConfig::seeded(7),
                max_queued_frames: 16,
                first_frame_reset,
                ..Default::default()
            };
            let frames = 14;
            let mut fresh = Session::new(engine.clone(), opts.clone()).unwrap();
            fresh.force_text(&[5, 9, 3]).unwrap();
            let want = run(&mut fresh, frames);
            let mut warmed = Session::new(engine, opts).unwrap();
            warmed.force_text(&[5, 9, 3]).unwrap();
            let before = warmed.counters();
            let t = warmed.warm_up().unwrap();
            assert_eq!(t.total_us, t.encode_us + t.lm_us + t.decode_us);
            assert_eq!(warmed.counters(), before, "the warm-up is not counted");
            assert_eq!(warmed.frame_index(), 0);
            let got = run(&mut warmed, frames);
            assert!(want.iter().any(|f| !f.pcm.is_empty()));
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.pcm.len(), w.pcm.len(), "threads {threads} frame {i}");
                let bits = |f: &FrameEvent| f.pcm.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(g), bits(w), "threads {threads} frame {i}: PCM");
                assert_eq!(g, w, "threads {threads} frame {i}");
            }
        }
    }

    /// A session with a short KV cache runs as a full one for as many frames as the cache holds (the
    /// fixture's context is 10; with 4 entries, frame 5 attends to 5 entries and must differ, which
    /// shows the comparison can fail).
    #[test]
    fn a_short_kv_cache_matches_the_full_one_while_it_holds_every_step() {
        let engine = fixture_engine(1);
        let opts = SessionOptions {
            sampling: SamplerConfig::greedy(),
            max_queued_frames: 16,
            ..Default::default()
        };
        let want = run(&mut Session::new(engine.clone(), opts.clone()).unwrap(), 8);
        let got = run(&mut Session::with_kv_capacity(engine, opts, 4).unwrap(), 8);
        assert_eq!(got[..4], want[..4]);
        assert_ne!(got[4..], want[4..]);
    }

    /// The warm-up leaves queued input queued, and runs only at the start of a stream.
    #[test]
    fn warm_up_keeps_queued_input_and_refuses_mid_stream() {
        let mut s = Session::new(fixture_engine(1), SessionOptions::default()).unwrap();
        s.push_pcm(&vec![0.1; 2 * FRAME_SIZE]).unwrap();
        s.warm_up().unwrap();
        assert_eq!(s.counters().queued, 2);
        assert!(matches!(s.step().unwrap(), Step::Frame(_)));
        assert!(matches!(s.warm_up(), Err(RuntimeError::InvalidOption(_))));
        // After a reset the stream starts again: the warm-up is allowed once the reset is applied.
        s.reset();
        assert!(matches!(s.step().unwrap(), Step::Idle));
        s.warm_up().unwrap();
    }

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
        let pool = s.compute.0.clone();
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

    /// A device's error in the LM step, as a GPU reports one (`LmError::Backend`), injected on
    /// the third LM call of a threaded session on the CPU.
    #[derive(Debug, thiserror::Error)]
    #[error("injected device fault")]
    struct DeviceFault;

    /// An LM backend that fails its `fail_at`-th temporal step (0-based) with [`DeviceFault`].
    struct Faulty {
        inner: Box<dyn LmBackend>,
        calls: usize,
        fail_at: usize,
    }

    impl LmBackend for Faulty {
        fn spec(&self) -> &model::lm::LmSpec {
            self.inner.spec()
        }
        fn batch_size(&self) -> usize {
            self.inner.batch_size()
        }
        fn temporal_step(&mut self, rows: &[usize], tokens: &[u32]) -> Result<(), LmError> {
            self.calls += 1;
            if self.calls - 1 == self.fail_at {
                return Err(LmError::Backend(Box::new(DeviceFault)));
            }
            self.inner.temporal_step(rows, tokens)
        }
        fn text_logits(&self) -> &[f32] {
            self.inner.text_logits()
        }
        fn transformer_out(&self) -> &[f32] {
            self.inner.transformer_out()
        }
        fn depformer_step(
            &mut self,
            rows: &[usize],
            k: usize,
            prev_tokens: &[u32],
        ) -> Result<&[f32], LmError> {
            self.inner.depformer_step(rows, k, prev_tokens)
        }
        fn reset_row(&mut self, b: usize) {
            self.inner.reset_row(b)
        }
        fn seek_for_bench(&mut self, offset: usize) {
            self.inner.seek_for_bench(offset)
        }
    }

    /// A device error in the frame pass reaches the runner's caller as the last event with its type:
    /// `RuntimeError::Lm(LmError::Backend(_))` holding the backend's own error, not a message.
    #[test]
    fn a_device_error_reaches_the_caller_typed() {
        let engine = fixture_engine(1);
        let mut s = Session::new(engine.clone(), SessionOptions::default()).unwrap();
        let Pass::Split(stepper) = &mut s.pass else {
            panic!("a CPU session runs the split pass");
        };
        let inner = engine.lm_backend(&s.compute, 1, None).unwrap();
        let faulty = Faulty {
            inner,
            calls: 0,
            fail_at: 2,
        };
        stepper.set_backend(Box::new(faulty)).unwrap();
        let mut runner = s.spawn(16).unwrap();
        let mut producer = runner.producer().unwrap();
        let events = runner.events().unwrap();
        producer.push(&vec![0.1; 4 * FRAME_SIZE]);
        let mut frames = 0;
        let last = loop {
            match events.recv_timeout(std::time::Duration::from_secs(30)) {
                Ok(Event::Frame(_)) => frames += 1,
                Ok(other) => break other,
                Err(e) => panic!("no last event: {e:?}"),
            }
        };
        assert_eq!(frames, 2, "two frames before the fault");
        let Event::Error(RuntimeError::Lm(LmError::Backend(source))) = last else {
            panic!("expected the LM's backend error, got {last:?}");
        };
        assert!(source.downcast_ref::<DeviceFault>().is_some(), "{source:?}");
        runner.stop().unwrap();
    }
}
