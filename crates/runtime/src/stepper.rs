//! The LM side of the frame pass, shared by both drivers: a [`crate::Session`] is a batch of one row,
//! a [`crate::BatchRunner`] steps the rows of its conversations that have input.
//!
//! A tick: [`Stepper::prepare`] each conversation (apply its commands, pop a frame, encode it), one
//! [`Stepper::step_lm`] for every prepared row (the weights are read once for all of them), then
//! [`Stepper::finish`] each of them (decode, detokenize, resample, fill its frame). Nothing here
//! allocates per frame.

use std::sync::Arc;
use std::time::Instant;

use model::lm::{Generator, LmBackend, LmError, LmFrame, LmObserver};
use model::sampling::{Sampler, SamplerConfig, SamplingError};

use crate::conversation::{micros as us, Conversation};
use crate::engine::Workers;
use crate::events::{FrameTimings, StopReason};
use crate::inlet::Begin;
use crate::{Engine, RuntimeError, N_AUDIO};

/// A phase of the frame pass (for the test hook).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[doc(hidden)]
pub enum Phase {
    /// Mimi encode.
    Encode,
    /// LM temporal step (and text sampling).
    Lm,
    /// Depformer (first audio codebook of the step).
    Depformer,
    /// Mimi decode + detokenize + resample.
    Decode,
}

/// Test hook called at the start of each phase (costs a branch when `None`).
#[doc(hidden)]
pub type PhaseHook = Arc<dyn Fn(Phase) + Send + Sync>;

/// Maps an LM step error; non-finite logits keep their own typed variant.
pub(crate) fn lm_error(e: LmError, frame: u64) -> RuntimeError {
    match e {
        LmError::Sampling(SamplingError::NonFiniteLogits {
            stream,
            index,
            value,
        }) => RuntimeError::NonFiniteLogits {
            frame,
            stream,
            index,
            value,
        },
        e => RuntimeError::Model(e.to_string()),
    }
}

/// A sampler for `engine`'s LM (a bad configuration is an invalid option).
pub(crate) fn new_sampler(
    engine: &Engine,
    sampling: SamplerConfig,
) -> Result<Sampler, RuntimeError> {
    let spec = engine.lm().spec();
    Sampler::new(sampling, spec.text_card, spec.card)
        .map_err(|e| RuntimeError::InvalidOption(format!("sampling: {e}")))
}

/// Calls the phase hook when the Depformer starts.
struct HookObserver<'a>(Option<&'a PhaseHook>);

impl LmObserver for HookObserver<'_> {
    fn observes(&self) -> bool {
        self.0.is_some()
    }
    fn depformer_logits(&mut self, k: usize, _logits: &[f32]) {
        if let (0, Some(h)) = (k, self.0) {
            h(Phase::Depformer);
        }
    }
}

/// What [`Stepper::prepare`] found for one conversation.
pub(crate) enum Prepared {
    /// No whole frame of the current stream is queued.
    Idle,
    /// Paused: nothing consumed.
    Paused,
    /// Stopped.
    Stopped(StopReason),
    /// The conversation's frame is encoded and its row joins this tick's LM step.
    Ready,
    /// Encoding failed.
    Failed(RuntimeError),
}

/// The LM generator of a driver (one row per conversation slot) with its samplers and the buffers of a
/// tick.
pub(crate) struct Stepper {
    gen: Generator<dyn LmBackend>,
    samplers: Vec<Sampler>,
    /// Rows stepped this tick, in order.
    active: Vec<usize>,
    /// `[active, 8]` user codes of this tick.
    codes: Vec<u32>,
    forced: Vec<Option<u32>>,
    out: Vec<Result<Option<LmFrame>, LmError>>,
    encode_us: Vec<u32>,
    lm_us: u32,
    /// Time of a driver's joint decode of this tick's frames (0 when each conversation decodes its own).
    joint_decode_us: u32,
    pub(crate) hook: Option<PhaseHook>,
}

impl Stepper {
    /// A generator of `rows` fresh rows on `compute` (greedy samplers until [`Stepper::set_sampler`]);
    /// `kv_capacity`: see [`Engine::lm_backend`].
    pub(crate) fn new(
        engine: &Engine,
        compute: &Workers,
        rows: usize,
        kv_capacity: Option<usize>,
    ) -> Result<Stepper, RuntimeError> {
        let backend = engine.lm_backend(compute, rows, kv_capacity)?;
        let gen = Generator::new(backend).map_err(|e| RuntimeError::Model(e.to_string()))?;
        let samplers = (0..rows)
            .map(|_| new_sampler(engine, SamplerConfig::greedy()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Stepper {
            gen,
            samplers,
            active: Vec::with_capacity(rows),
            codes: vec![0; rows * N_AUDIO],
            forced: vec![None; rows],
            out: (0..rows).map(|_| Ok(None)).collect(),
            encode_us: vec![0; rows],
            lm_us: 0,
            joint_decode_us: 0,
            hook: None,
        })
    }

    fn phase(&self, p: Phase) {
        if let Some(h) = &self.hook {
            h(p);
        }
    }

    /// Give row `row` its conversation's sampler.
    pub(crate) fn set_sampler(&mut self, row: usize, sampler: Sampler) {
        self.samplers[row] = sampler;
    }

    /// Row `row` back to fresh: token cache, LM state and sampler (the other rows continue).
    pub(crate) fn reset_row(&mut self, row: usize) {
        self.gen.reset_row(row);
        self.samplers[row].reset();
    }

    /// Benchmark helper: every row at call `offset` with KV caches holding `min(offset, context)`
    /// meaningless entries, so a step attends over as many keys as a conversation that long (the
    /// start-up real-time probe, [`crate::realtime::probe`]). Returns row 0's call count after it.
    #[cfg(feature = "bench")]
    pub(crate) fn seek(&mut self, offset: usize) -> usize {
        self.gen.seek_for_bench(offset);
        self.gen.offset(0)
    }

    /// Start a tick: no row prepared yet.
    pub(crate) fn begin_tick(&mut self) {
        self.active.clear();
        self.joint_decode_us = 0;
    }

    /// The rows prepared this tick, in order (row `active()[i]` is result `i` of the LM step).
    pub(crate) fn active(&self) -> &[usize] {
        &self.active
    }

    /// Apply the commands of the conversation in `row`, pop its next frame and encode it. On
    /// [`Prepared::Ready`] the row joins this tick's LM step.
    pub(crate) fn prepare(&mut self, row: usize, conv: &mut Conversation) -> Prepared {
        match self.begin(row, conv) {
            Prepared::Ready => {
                self.phase(Phase::Encode);
                let t0 = Instant::now();
                let codes = match conv.encode() {
                    Ok(c) => *c,
                    Err(e) => return Prepared::Failed(e),
                };
                self.admit(row, conv, &codes, us(t0.elapsed()));
                Prepared::Ready
            }
            other => other,
        }
    }

    /// The first half of [`Stepper::prepare`], for a driver that encodes several conversations' frames
    /// together: apply the commands of the conversation in `row` and pop its next frame. On
    /// [`Prepared::Ready`] the frame is in [`Conversation::input`]; the driver encodes it and calls
    /// [`Stepper::admit`].
    pub(crate) fn begin(&mut self, row: usize, conv: &mut Conversation) -> Prepared {
        let (begin, reset) = conv.begin();
        if reset {
            self.reset_row(row);
        }
        match begin {
            Begin::Idle => Prepared::Idle,
            Begin::Paused => Prepared::Paused,
            Begin::Stopped(r) => Prepared::Stopped(r),
            Begin::Ready => Prepared::Ready,
        }
    }

    /// Row `row` joins this tick's LM step with the user codes of its frame (encoded in `encode_us`).
    pub(crate) fn admit(
        &mut self,
        row: usize,
        conv: &mut Conversation,
        codes: &[u32; N_AUDIO],
        encode_us: u32,
    ) {
        let forced = conv.next_forced();
        self.admit_with(row, codes, forced, encode_us);
    }

    /// [`Stepper::admit`] with the forced text token given (the warm-up forces none and consumes none of
    /// the conversation's).
    pub(crate) fn admit_with(
        &mut self,
        row: usize,
        codes: &[u32; N_AUDIO],
        forced: Option<u32>,
        encode_us: u32,
    ) {
        let i = self.active.len();
        self.codes[i * N_AUDIO..(i + 1) * N_AUDIO].copy_from_slice(codes);
        self.forced[i] = forced;
        self.encode_us[i] = encode_us;
        self.active.push(row);
    }

    /// Takes result `i` of this tick's LM step (leaving `Ok(None)`), for a driver that does not
    /// [`Stepper::finish`] it (the warm-up). The LM time of the step is [`Stepper::lm_us`].
    pub(crate) fn take_result(&mut self, i: usize) -> Result<Option<LmFrame>, LmError> {
        std::mem::replace(&mut self.out[i], Ok(None))
    }

    /// Microseconds of this tick's LM step.
    pub(crate) fn lm_us(&self) -> u32 {
        self.lm_us
    }

    /// Mark the start of the encode phase (test hook) for a driver that encodes itself.
    pub(crate) fn encode_phase(&self) {
        self.phase(Phase::Encode);
    }

    /// The audio codes of result `i` of this tick's LM step, if it produced a frame (for a driver that decodes
    /// several conversations' frames together before [`Stepper::finish`]).
    pub(crate) fn audio(&self, i: usize) -> Option<&[u32]> {
        match &self.out[i] {
            Ok(Some(f)) => Some(f.audio()),
            _ => None,
        }
    }

    /// A driver's joint decode of this tick's frames: marks the decode phase (test hook) and returns the start
    /// time for [`Stepper::end_joint_decode`].
    pub(crate) fn start_joint_decode(&self) -> Instant {
        self.phase(Phase::Decode);
        Instant::now()
    }

    /// The joint decode that began at `t0` is done: its time counts in every finished frame's decode time.
    pub(crate) fn end_joint_decode(&mut self, t0: Instant) {
        self.joint_decode_us = us(t0.elapsed());
    }

    /// One LM step for every row prepared this tick (at least one). An error here is an argument error:
    /// nothing was stepped. A row's own sampling error is reported by [`Stepper::finish`].
    pub(crate) fn step_lm(&mut self) -> Result<(), RuntimeError> {
        self.phase(Phase::Lm);
        let t0 = Instant::now();
        let m = self.active.len();
        self.gen
            .step(
                &self.active,
                &self.codes[..m * N_AUDIO],
                &mut self.samplers,
                Some(&self.forced[..m]),
                &mut self.out[..m],
                &mut HookObserver(self.hook.as_ref()),
            )
            .map_err(|e| RuntimeError::Model(e.to_string()))?;
        self.lm_us = us(t0.elapsed());
        Ok(())
    }

    /// Finish result `i` of this tick into `conv` (the conversation of row `active()[i]`): decode,
    /// detokenize, resample and fill `conv.frame`.
    pub(crate) fn finish(&mut self, i: usize, conv: &mut Conversation) -> Result<(), RuntimeError> {
        let frame = self
            .take_result(i)
            .map_err(|e| lm_error(e, conv.inlet.frame_index))?;
        self.phase(Phase::Decode);
        let t0 = Instant::now();
        let (encode_us, lm_us) = (self.encode_us[i], self.lm_us);
        conv.finish(frame)?;
        let end = Instant::now();
        let decode_us = us(end - t0).saturating_add(self.joint_decode_us);
        let t = &mut conv.frame.timings;
        *t = FrameTimings {
            encode_us,
            lm_us,
            decode_us,
            total_us: encode_us.saturating_add(lm_us).saturating_add(decode_us),
            lag_us: us(end.saturating_duration_since(conv.inlet.arrived)),
            ..*t
        };
        Ok(())
    }
}
