//! The model side of the frame pass (codec and LM), shared by both drivers: a [`crate::Session`] is a
//! batch of one row and one codec slot, a [`crate::BatchRunner`] steps the rows of its conversations
//! that have input.
//!
//! A tick: [`Stepper::begin`] each conversation (apply its commands, pop and stage a frame), one
//! [`Stepper::encode`] of every staged frame and [`Stepper::admit`] of each, one [`Stepper::step_lm`]
//! for every admitted row, one [`Stepper::decode`] of every frame it produced (each call reads the
//! weights once for all the rows in it), then [`Stepper::finish`] each of them (detokenize, resample,
//! fill its frame). Nothing here allocates per frame.

use std::sync::Arc;
use std::time::Instant;

use model::lm::{Generator, LmBackend, LmError, LmFrame, LmObserver};
use model::mimi::CodecBackend;
use model::sampling::{Sampler, SamplerConfig, SamplingError};

use crate::conversation::{micros as us, Conversation, PassSlots};
use crate::engine::Workers;
use crate::events::FrameTimings;
use crate::inlet::Begin;
use crate::{Engine, RuntimeError, FRAME_SIZE, N_AUDIO};

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
        e => RuntimeError::Lm(e),
    }
}

/// A sampler for `engine`'s LM (a bad configuration is an invalid option).
pub(crate) fn new_sampler(
    engine: &Engine,
    sampling: SamplerConfig,
) -> Result<Sampler, RuntimeError> {
    let spec = engine.lm_spec();
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

/// The model side of a driver: its codec (one slot per row) and LM generator (one row per
/// conversation slot) with their samplers and the buffers of a tick.
pub(crate) struct Stepper {
    gen: Generator<dyn LmBackend>,
    samplers: Vec<Sampler>,
    codec: Box<dyn CodecBackend>,
    /// Codes per frame of the codec (the LM reads the first [`N_AUDIO`]).
    nq: usize,
    /// Rows whose frame is staged for this tick's encode, in order; their frames side by side, then
    /// their codes.
    staged: Vec<usize>,
    pcm: Vec<f32>,
    encoded: Vec<u32>,
    /// Rows stepped this tick, in order.
    active: Vec<usize>,
    /// `[active, 8]` user codes of this tick.
    codes: Vec<u32>,
    forced: Vec<Option<u32>>,
    out: Vec<Result<Option<LmFrame>, LmError>>,
    /// The rows of this tick's decode, in order; their audio codes and samples; per LM result, its
    /// place in them.
    decoding: Vec<usize>,
    audio: Vec<u32>,
    decoded: Vec<f32>,
    decoded_at: Vec<Option<usize>>,
    encode_us: u32,
    lm_us: u32,
    decode_us: u32,
    pub(crate) hook: Option<PhaseHook>,
}

impl Stepper {
    /// A codec of `rows` slots and a generator of `rows` fresh rows on `compute` (greedy samplers until
    /// [`Stepper::set_sampler`]); `kv_capacity`: see [`Engine::lm_backend`].
    pub(crate) fn new(
        engine: &Engine,
        compute: &Workers,
        rows: usize,
        kv_capacity: Option<usize>,
    ) -> Result<Stepper, RuntimeError> {
        let backend = engine.lm_backend(compute, rows, kv_capacity)?;
        let gen = Generator::new(backend)?;
        let codec = engine.codec_backend(compute, rows)?;
        let nq = codec.n_codebooks();
        let samplers = (0..rows)
            .map(|_| new_sampler(engine, SamplerConfig::greedy()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Stepper {
            gen,
            samplers,
            codec,
            nq,
            staged: Vec::with_capacity(rows),
            pcm: vec![0.0; rows * FRAME_SIZE],
            encoded: vec![0; rows * nq],
            active: Vec::with_capacity(rows),
            codes: vec![0; rows * N_AUDIO],
            forced: vec![None; rows],
            out: (0..rows).map(|_| Ok(None)).collect(),
            decoding: Vec::with_capacity(rows),
            audio: vec![0; rows * N_AUDIO],
            decoded: vec![0.0; rows * FRAME_SIZE],
            decoded_at: vec![None; rows],
            encode_us: 0,
            lm_us: 0,
            decode_us: 0,
            hook: None,
        })
    }

    fn phase(&self, p: Phase) {
        if let Some(h) = &self.hook {
            h(p);
        }
    }

    /// The generator over `backend` instead (tests: a backend that injects a fault).
    #[cfg(test)]
    pub(crate) fn set_backend(&mut self, backend: Box<dyn LmBackend>) -> Result<(), RuntimeError> {
        self.gen = Generator::new(backend)?;
        Ok(())
    }

    /// Benchmark helper: every row at call `offset` with KV caches holding `min(offset, context)`
    /// meaningless entries, so a step attends over as many keys as a conversation that long (the
    /// start-up real-time probe, [`crate::realtime::probe`]). Returns row 0's call count after it.
    #[cfg(feature = "bench")]
    pub(crate) fn seek(&mut self, offset: usize) -> usize {
        self.gen.seek_for_bench(offset);
        self.gen.offset(0)
    }

    /// One joint encode and decode of silence on every row, twice, then every row's codec reset: the work
    /// buffers that grow with the number of slots coded together (here and in the codec) and every slot's
    /// attention scratch reach their final size before the first conversation, so no later tick allocates
    /// (a batch driver's start; a session's warm-up is its own pass).
    pub(crate) fn warm_up_codec(&mut self) {
        let n = self.samplers.len();
        self.staged.clear();
        self.staged.extend(0..n);
        self.pcm.fill(0.0);
        self.audio.fill(0);
        // Two frames, so buffers that a stream's second frame touches first are sized too (a single
        // session's warm-up is one frame; one has not been shown enough for the joint codec here).
        for _ in 0..2 {
            if self.codec.encode_frames(&self.staged, &self.pcm).is_ok() {
                let _ = self
                    .codec
                    .decode_frames(&self.staged, &self.audio, &mut self.decoded);
            }
        }
        for b in 0..n {
            self.codec.reset(b);
        }
        self.staged.clear();
    }

    /// Start a tick: nothing staged, no row admitted.
    pub(crate) fn begin_tick(&mut self) {
        self.staged.clear();
        self.active.clear();
        self.encode_us = 0;
        self.decode_us = 0;
    }

    /// The rows prepared this tick, in order (row `active()[i]` is result `i` of the LM step).
    pub(crate) fn active(&self) -> &[usize] {
        &self.active
    }

    /// The rows staged for this tick's encode, in order (row `staged()[j]` is frame `j` of
    /// [`Stepper::encode`]).
    pub(crate) fn staged(&self) -> &[usize] {
        &self.staged
    }

    /// Apply the commands of the conversation in `row` (resetting its LM row and codec streams as they
    /// ask) and pop its next frame: what the conversation's inlet found. On [`Begin::Ready`] the frame is
    /// staged for [`Stepper::encode`].
    pub(crate) fn begin(&mut self, row: usize, conv: &mut Conversation) -> Begin {
        let begin = conv.begin_in(self, row);
        if begin == Begin::Ready {
            self.stage(row, conv.input());
        }
        begin
    }

    /// Stage `pcm` (one frame) as row `row`'s frame of this tick's encode.
    pub(crate) fn stage(&mut self, row: usize, pcm: &[f32]) {
        let j = self.staged.len();
        self.pcm[j * FRAME_SIZE..(j + 1) * FRAME_SIZE].copy_from_slice(pcm);
        self.staged.push(row);
    }

    /// Encode every staged frame in one codec call. On an error no row is admitted; the staged rows
    /// ([`Stepper::staged`]) are those it concerns.
    pub(crate) fn encode(&mut self) -> Result<(), RuntimeError> {
        let k = self.staged.len();
        if k == 0 {
            return Ok(());
        }
        self.phase(Phase::Encode);
        let t0 = Instant::now();
        let codes = self
            .codec
            .encode_frames(&self.staged, &self.pcm[..k * FRAME_SIZE])?;
        self.encoded[..k * self.nq].copy_from_slice(codes);
        self.encode_us = us(t0.elapsed());
        Ok(())
    }

    /// The codes [`Stepper::encode`] gave staged frame `j`.
    pub(crate) fn encoded(&self, j: usize) -> &[u32] {
        &self.encoded[j * self.nq..(j + 1) * self.nq]
    }

    /// Staged frame `j` (of the conversation `conv`) joins this tick's LM step with its encoded user codes
    /// and its next forced text token; a codec reset the encode made due (the first-frame rule) is applied
    /// right away.
    pub(crate) fn admit(&mut self, j: usize, conv: &mut Conversation) {
        let row = self.staged[j];
        let user = *conv.set_encoded(&self.encoded[j * self.nq..(j + 1) * self.nq]);
        let forced = conv.next_forced();
        self.admit_with(row, &user, forced);
        if conv.take_codec_reset() {
            self.codec.reset(row);
        }
    }

    /// Row `row` joins this tick's LM step with user codes `codes` and the forced text token given (the
    /// warm-up forces none and consumes none of the conversation's).
    pub(crate) fn admit_with(&mut self, row: usize, codes: &[u32; N_AUDIO], forced: Option<u32>) {
        let i = self.active.len();
        self.codes[i * N_AUDIO..(i + 1) * N_AUDIO].copy_from_slice(codes);
        self.forced[i] = forced;
        self.active.push(row);
    }

    /// Takes result `i` of this tick's LM step (leaving `Ok(None)`), for a driver that does not
    /// [`Stepper::finish`] it (the warm-up). The LM time of the step is [`Stepper::lm_us`].
    pub(crate) fn take_result(&mut self, i: usize) -> Result<Option<LmFrame>, LmError> {
        std::mem::replace(&mut self.out[i], Ok(None))
    }

    /// Microseconds of this tick's encode, LM step and decode.
    pub(crate) fn phase_us(&self) -> (u32, u32, u32) {
        (self.encode_us, self.lm_us, self.decode_us)
    }

    /// Microseconds of this tick's LM step.
    pub(crate) fn lm_us(&self) -> u32 {
        self.lm_us
    }

    /// One LM step for every row prepared this tick (at least one). An error here is an argument error:
    /// nothing was stepped. A row's own sampling error is reported by [`Stepper::finish`].
    pub(crate) fn step_lm(&mut self) -> Result<(), RuntimeError> {
        self.phase(Phase::Lm);
        let t0 = Instant::now();
        let m = self.active.len();
        self.gen.step(
            &self.active,
            &self.codes[..m * N_AUDIO],
            &mut self.samplers,
            Some(&self.forced[..m]),
            &mut self.out[..m],
            &mut HookObserver(self.hook.as_ref()),
        )?;
        self.lm_us = us(t0.elapsed());
        Ok(())
    }

    /// Decode, in one codec call, the frames this tick's LM step produced. On an error no frame is
    /// decoded; the rows it concerns are [`Stepper::decoding`].
    pub(crate) fn decode(&mut self) -> Result<(), RuntimeError> {
        self.phase(Phase::Decode);
        self.decoding.clear();
        for i in 0..self.active.len() {
            self.decoded_at[i] = None;
            if let Ok(Some(f)) = &self.out[i] {
                let k = self.decoding.len();
                self.audio[k * N_AUDIO..(k + 1) * N_AUDIO].copy_from_slice(&f.audio()[..N_AUDIO]);
                self.decoding.push(self.active[i]);
                self.decoded_at[i] = Some(k);
            }
        }
        let k = self.decoding.len();
        if k == 0 {
            return Ok(());
        }
        let t0 = Instant::now();
        let r = self.codec.decode_frames(
            &self.decoding,
            &self.audio[..k * N_AUDIO],
            &mut self.decoded[..k * FRAME_SIZE],
        );
        self.decode_us = us(t0.elapsed());
        if r.is_err() {
            self.decoded_at[..self.active.len()].fill(None);
        }
        Ok(r?)
    }

    /// The rows of this tick's decode.
    pub(crate) fn decoding(&self) -> &[usize] {
        &self.decoding
    }

    /// Decodes `codes` as row `row`'s frame into `out` (the warm-up: placeholder codes); returns its
    /// microseconds.
    pub(crate) fn decode_codes(
        &mut self,
        row: usize,
        codes: &[u32; N_AUDIO],
        out: &mut [f32],
    ) -> Result<u32, RuntimeError> {
        let t0 = Instant::now();
        self.codec.decode_frames(&[row], codes, out)?;
        Ok(us(t0.elapsed()))
    }

    /// Finish result `i` of this tick into `conv` (the conversation of row `active()[i]`): its decoded
    /// samples, detokenize, resample and fill `conv.frame`.
    pub(crate) fn finish(&mut self, i: usize, conv: &mut Conversation) -> Result<(), RuntimeError> {
        let frame = self
            .take_result(i)
            .map_err(|e| lm_error(e, conv.inlet.frame_index))?;
        let t0 = Instant::now();
        if let Some(j) = self.decoded_at[i] {
            conv.decoded_mut()
                .copy_from_slice(&self.decoded[j * FRAME_SIZE..(j + 1) * FRAME_SIZE]);
        }
        let (encode_us, lm_us) = (self.encode_us, self.lm_us);
        conv.finish(frame)?;
        let end = Instant::now();
        let decode_us = us(end - t0).saturating_add(self.decode_us);
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

impl PassSlots for Stepper {
    /// Token cache, LM state and sampler of row `slot`.
    fn reset_row(&mut self, slot: usize) {
        self.gen.reset_row(slot);
        self.samplers[slot].reset();
    }

    fn reset_codec(&mut self, slot: usize) {
        self.codec.reset(slot);
    }

    fn set_sampler(&mut self, slot: usize, sampler: Sampler) {
        self.samplers[slot] = sampler;
    }
}
