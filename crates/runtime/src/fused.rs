//! The frame-level device seam: a device that runs its conversations' whole frame passes (Mimi
//! encode → LM step with the delayed token cache on the device → Mimi decode) as one call per
//! tick for every listed slot, so that the codes never visit the host between the parts. A
//! [`crate::Session`] on such a device drives a [`FusedPass`] (a [`FusedFrames`] of one slot)
//! instead of the split pass (`stepper.rs`'s `Stepper` over an
//! [`LmBackend`](model::lm::LmBackend) and a [`CodecBackend`](model::mimi::CodecBackend)), which
//! the CPU keeps; a [`crate::BatchRunner`] on it drives a [`FusedFrames`] of its slots. The GPU
//! implements it (`gpu::GpuDuplexBatch`, one submission per tick; `gpu_frame.rs`) when the
//! samplers run on the device; [`crate::Engine`] says which (its `frame_backend` for a session,
//! `batch_frame_backend` for a batch).
//!
//! The frames are those of the split pass, bit for bit in tokens: the backend keeps the delays,
//! the initial tokens, the first-frame rule and the sampler's random streams as the generator
//! (`model::lm::Generator`) and the conversation do. Timings: the encode and the decode run inside
//! the one call, so a frame's `encode_us` is 0, its `lm_us` the whole call, and its `decode_us`
//! what follows on the host (resampling, detokenization).

use std::time::Instant;

use model::lm::{FrameStep, LmError, LmFrame};
use model::sampling::Sampler;

use crate::conversation::{micros as us, Conversation, PassSlots};
use crate::events::FrameTimings;
use crate::inlet::Begin;
use crate::stepper::{lm_error, Phase, PhaseHook};
use crate::{RuntimeError, FRAME_SIZE, N_AUDIO};

/// The whole frame passes of a device's conversation slots (module docs).
pub(crate) trait FrameBackend: Send {
    /// One tick for the listed `slots` (distinct): slot `slots[i]` encodes
    /// `pcm[i·FRAME_SIZE..]` (one frame of 24 kHz samples), runs its LM step with
    /// `samplers[slots[i]]` and `steps[i]`, and decodes the frame its delays make ready into
    /// `decoded[i·FRAME_SIZE..]` (left as it is when none is); `results[i]` gets that frame
    /// (`None` during the slot's first `max_delay` calls) or its sampling error (the call
    /// committed, as the generator reports it). An argument or device error is returned for the
    /// whole call. Unlisted slots do not move.
    fn tick(
        &mut self,
        slots: &[usize],
        pcm: &[f32],
        steps: &[FrameStep],
        samplers: &mut [Sampler],
        decoded: &mut [f32],
        results: &mut [Result<Option<LmFrame>, LmError>],
    ) -> Result<(), LmError>;

    /// `slot`'s LM side back to call 0 (the caller resets its sampler).
    fn reset_lm(&mut self, slot: usize);

    /// `slot`'s codec streams back to fresh before its next frame.
    fn reset_codec(&mut self, slot: usize);

    /// Decodes `codes` alone through `slot`'s decoder into `decoded` (a warm-up touches the
    /// decode path with placeholder codes: call 0 has no frame).
    fn decode_only(
        &mut self,
        slot: usize,
        codes: &[u32; N_AUDIO],
        decoded: &mut [f32],
    ) -> Result<(), RuntimeError>;
}

/// The frame passes of a driver whose device runs them as one call per tick: the backend, one
/// sampler per slot and the buffers of a tick, with the same calls as the split `Stepper`
/// (`begin` each conversation, one `run`, `finish` each). Nothing here allocates per tick.
pub(crate) struct FusedFrames {
    backend: Box<dyn FrameBackend>,
    samplers: Vec<Sampler>,
    /// The slots staged this tick, in order; their frames, steps, decoded frames and results.
    staged: Vec<usize>,
    pcm: Vec<f32>,
    steps: Vec<FrameStep>,
    decoded: Vec<f32>,
    out: Vec<Result<Option<LmFrame>, LmError>>,
    lm_us: u32,
}

/// Calls the phase hook, if any.
fn phase(hook: Option<&PhaseHook>, p: Phase) {
    if let Some(h) = hook {
        h(p);
    }
}

impl FusedFrames {
    /// The passes of `backend`, slot `b` sampling with `samplers[b]` (one per slot of the
    /// backend).
    pub(crate) fn new(backend: Box<dyn FrameBackend>, samplers: Vec<Sampler>) -> FusedFrames {
        let n = samplers.len();
        FusedFrames {
            backend,
            samplers,
            staged: Vec::with_capacity(n),
            pcm: vec![0.0; n * FRAME_SIZE],
            steps: vec![FrameStep::default(); n],
            decoded: vec![0.0; n * FRAME_SIZE],
            out: (0..n).map(|_| Ok(None)).collect(),
            lm_us: 0,
        }
    }

    /// Slots of the backend.
    pub(crate) fn slots(&self) -> usize {
        self.samplers.len()
    }

    /// Start a tick: nothing staged.
    pub(crate) fn begin_tick(&mut self) {
        self.staged.clear();
    }

    /// The slots staged this tick, in order (slot `staged()[j]` is result `j`).
    pub(crate) fn staged(&self) -> &[usize] {
        &self.staged
    }

    /// Applies the commands of the conversation in `slot` (resetting its LM side, sampler and
    /// codec as they ask) and pops its next frame; on [`Begin::Ready`] the frame is staged
    /// with its forced text token and first-frame rule.
    pub(crate) fn begin(&mut self, slot: usize, conv: &mut Conversation) -> Begin {
        let begin = conv.begin_in(self, slot);
        if begin == Begin::Ready {
            let step = FrameStep {
                force_text: conv.next_forced(),
                reset_codec_after_encode: conv.first_frame_rule_due(),
            };
            self.stage(slot, conv.input(), step);
        }
        begin
    }

    /// Stage `pcm` (one frame) as slot `slot`'s frame of this tick with `step`.
    pub(crate) fn stage(&mut self, slot: usize, pcm: &[f32], step: FrameStep) {
        let j = self.staged.len();
        self.pcm[j * FRAME_SIZE..(j + 1) * FRAME_SIZE].copy_from_slice(pcm);
        self.steps[j] = step;
        self.staged.push(slot);
    }

    /// The one call of this tick for every staged slot (at least one). An error here concerns
    /// the whole call (an argument or device error: no slot has a result); a slot's own sampling
    /// error is reported by [`FusedFrames::finish`]. The phase hook (a session's) sees `Encode`
    /// and `Lm` before the call and `Decode` after it.
    pub(crate) fn run(&mut self, hook: Option<&PhaseHook>) -> Result<(), LmError> {
        let n = self.staged.len();
        phase(hook, Phase::Encode);
        phase(hook, Phase::Lm);
        let t0 = Instant::now();
        let r = self.backend.tick(
            &self.staged,
            &self.pcm[..n * FRAME_SIZE],
            &self.steps[..n],
            &mut self.samplers,
            &mut self.decoded[..n * FRAME_SIZE],
            &mut self.out[..n],
        );
        self.lm_us = us(t0.elapsed());
        phase(hook, Phase::Decode);
        r
    }

    /// Takes result `j` of this tick (leaving `Ok(None)`).
    fn take_result(&mut self, j: usize) -> Result<Option<LmFrame>, LmError> {
        std::mem::replace(&mut self.out[j], Ok(None))
    }

    /// Finish result `j` of this tick into `conv` (the conversation of slot `staged()[j]`): its
    /// decoded samples, detokenize, resample and fill `conv.frame`.
    pub(crate) fn finish(&mut self, j: usize, conv: &mut Conversation) -> Result<(), RuntimeError> {
        let frame = self
            .take_result(j)
            .map_err(|e| lm_error(e, conv.inlet.frame_index))?;
        let t1 = Instant::now();
        if frame.is_some() {
            conv.decoded_mut()
                .copy_from_slice(&self.decoded[j * FRAME_SIZE..(j + 1) * FRAME_SIZE]);
        }
        conv.finish(frame)?;
        let end = Instant::now();
        let (lm_us, decode_us) = (self.lm_us, us(end - t1));
        let t = &mut conv.frame.timings;
        *t = FrameTimings {
            encode_us: 0,
            lm_us,
            decode_us,
            total_us: lm_us.saturating_add(decode_us),
            lag_us: us(end.saturating_duration_since(conv.inlet.arrived)),
            ..*t
        };
        Ok(())
    }

    /// A batch driver's start: every slot runs `ticks` frames of silence together (the last one
    /// decoding, given `ticks > max_delay`), then every slot's LM side, sampler and codec are
    /// back to fresh, so that the first conversation's tick is not the first use of any part.
    pub(crate) fn warm_up(&mut self, ticks: usize) -> Result<(), LmError> {
        let n = self.slots();
        let mut r = Ok(());
        for _ in 0..ticks {
            self.staged.clear();
            self.staged.extend(0..n);
            self.pcm.fill(0.0);
            self.steps.fill(FrameStep::default());
            r = r.and(self.run(None));
        }
        self.staged.clear();
        for b in 0..n {
            self.out[b] = Ok(None);
            self.reset_row(b);
            self.reset_codec(b);
        }
        r
    }
}

impl PassSlots for FusedFrames {
    fn reset_row(&mut self, slot: usize) {
        self.backend.reset_lm(slot);
        self.samplers[slot].reset();
    }

    fn reset_codec(&mut self, slot: usize) {
        self.backend.reset_codec(slot);
    }

    fn set_sampler(&mut self, slot: usize, sampler: Sampler) {
        self.samplers[slot] = sampler;
    }
}

/// The frame pass of a session whose device runs it as one call: a [`FusedFrames`] of one slot.
pub(crate) struct FusedPass {
    frames: FusedFrames,
    pub(crate) hook: Option<PhaseHook>,
}

impl FusedPass {
    /// The pass of `backend` (one slot) sampling with `sampler`.
    pub(crate) fn new(backend: Box<dyn FrameBackend>, sampler: Sampler) -> FusedPass {
        FusedPass {
            frames: FusedFrames::new(backend, vec![sampler]),
            hook: None,
        }
    }

    /// The LM side and the sampler back to fresh (the conversation asks for the codec's reset
    /// itself, taken before the next frame).
    pub(crate) fn reset_row(&mut self) {
        self.frames.reset_row(0);
    }

    /// Applies the conversation's commands, pops its next frame and, when one is ready, runs the
    /// whole pass into `conv.frame`.
    pub(crate) fn step(&mut self, conv: &mut Conversation) -> Result<Begin, RuntimeError> {
        let f = &mut self.frames;
        f.begin_tick();
        let begin = f.begin(0, conv);
        if begin != Begin::Ready {
            return Ok(begin);
        }
        f.run(self.hook.as_ref())
            .map_err(|e| lm_error(e, conv.inlet.frame_index))?;
        f.finish(0, conv)?;
        Ok(Begin::Ready)
    }

    /// The pass of [`crate::Session::warm_up`] (no forced text, no first-frame rule): the frame,
    /// then a decode of placeholder codes (or of the frame's, had it one) and its resampling;
    /// returns the microseconds of (encode, LM, decode): the encode runs inside the LM's call.
    pub(crate) fn warm_up_pass(
        &mut self,
        conv: &mut Conversation,
    ) -> Result<(u32, u32, u32), RuntimeError> {
        let f = &mut self.frames;
        if conv.take_codec_reset() {
            f.reset_codec(0);
        }
        f.begin_tick();
        f.stage(0, conv.input(), FrameStep::default());
        f.run(None).map_err(|e| lm_error(e, 0))?;
        let lm_us = f.lm_us;
        let frame = f.take_result(0).map_err(|e| lm_error(e, 0))?;
        let mut codes = [0u32; N_AUDIO];
        if let Some(fr) = frame {
            codes.copy_from_slice(fr.audio());
        }
        let t1 = Instant::now();
        f.backend.decode_only(0, &codes, conv.decoded_mut())?;
        conv.resample_only()?;
        Ok((0, lm_us, us(t1.elapsed())))
    }
}
