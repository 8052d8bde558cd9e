//! The frame-level device seam: a device that runs one conversation's whole frame pass (Mimi
//! encode → LM step with the delayed token cache on the device → Mimi decode) as one call, so that
//! the codes never visit the host between the parts. A [`crate::Session`] on such a device drives a
//! [`FusedPass`] instead of the split pass (`stepper.rs`'s `Stepper` over an
//! [`LmBackend`](model::lm::LmBackend) and the conversation's own
//! [`CodecBackend`](model::mimi::CodecBackend)), which the CPU keeps. The GPU implements it
//! (`gpu::GpuDuplex`, one submission per frame; `gpu_frame.rs`) when the session's sampler runs on
//! the device; [`crate::Engine`] says which ([`crate::Engine`]'s `frame_backend`).
//!
//! The frames are those of the split pass, bit for bit in tokens: the backend keeps the delays,
//! the initial tokens, the first-frame rule and the sampler's random streams as the generator
//! (`model::lm::Generator`) and the conversation do. Timings: the encode and the decode run inside
//! the one call, so a frame's `encode_us` is 0, its `lm_us` the whole call, and its `decode_us`
//! what follows on the host (resampling, detokenization).

use std::time::Instant;

use model::lm::{LmError, LmFrame};
use model::sampling::Sampler;

use crate::conversation::{micros as us, Conversation};
use crate::events::FrameTimings;
use crate::inlet::Begin;
use crate::stepper::{lm_error, Phase, PhaseHook};
use crate::{RuntimeError, N_AUDIO};

/// One conversation's whole frame pass on a device (module docs).
pub(crate) trait FrameBackend: Send {
    /// One frame: encodes `input` (one frame of 24 kHz samples), runs the LM step with `sampler`
    /// (`force_text`, when given, replaces the sampled text token), resets the codec streams right
    /// after the encode when `reset_after_encode` (the first-frame rule), and decodes the frame
    /// the delays make ready into `decoded` (left as it is when none is). Returns that frame
    /// (`None` during the first `max_delay` calls) or the step's error; a sampling error comes
    /// after the call is committed, as the generator reports it.
    fn frame(
        &mut self,
        input: &[f32],
        sampler: &mut Sampler,
        force_text: Option<u32>,
        reset_after_encode: bool,
        decoded: &mut [f32],
    ) -> Result<Option<LmFrame>, LmError>;

    /// The LM side back to call 0 (the caller resets the sampler).
    fn reset_lm(&mut self);

    /// Both codec streams back to fresh before the next frame.
    fn reset_codec(&mut self);

    /// Decodes `codes` alone into `decoded` (the warm-up times the decode path with placeholder
    /// codes: call 0 has no frame).
    fn decode_only(
        &mut self,
        codes: &[u32; N_AUDIO],
        decoded: &mut [f32],
    ) -> Result<(), RuntimeError>;
}

/// The frame pass of a session whose device runs it as one call: the backend, the session's
/// sampler and the phase hook.
pub(crate) struct FusedPass {
    backend: Box<dyn FrameBackend>,
    sampler: Sampler,
    pub(crate) hook: Option<PhaseHook>,
}

impl FusedPass {
    /// The pass of `backend` sampling with `sampler`.
    pub(crate) fn new(backend: Box<dyn FrameBackend>, sampler: Sampler) -> FusedPass {
        FusedPass {
            backend,
            sampler,
            hook: None,
        }
    }

    fn phase(&self, p: Phase) {
        if let Some(h) = &self.hook {
            h(p);
        }
    }

    /// The LM side and the sampler back to fresh (the conversation asks for the codec's reset
    /// itself, taken before the next frame).
    pub(crate) fn reset_row(&mut self) {
        self.backend.reset_lm();
        self.sampler.reset();
    }

    /// Applies the conversation's commands, pops its next frame and, when one is ready, runs the
    /// whole pass into `conv.frame`. The phase hook sees `Encode` before the call, `Lm` right
    /// before it and `Decode` after it.
    pub(crate) fn step(&mut self, conv: &mut Conversation) -> Result<Begin, RuntimeError> {
        let (begin, reset) = conv.begin();
        if reset {
            self.reset_row();
        }
        if begin != Begin::Ready {
            return Ok(begin);
        }
        self.phase(Phase::Encode);
        let forced = conv.next_forced();
        let rule = conv.first_frame_rule_due();
        self.phase(Phase::Lm);
        let t0 = Instant::now();
        let frame = self.run(conv, forced, rule);
        let lm_us = us(t0.elapsed());
        self.phase(Phase::Decode);
        let frame = frame.map_err(|e| lm_error(e, conv.inlet.frame_index))?;
        let t1 = Instant::now();
        conv.finish(frame)?;
        let end = Instant::now();
        let decode_us = us(end - t1);
        let t = &mut conv.frame.timings;
        *t = FrameTimings {
            encode_us: 0,
            lm_us,
            decode_us,
            total_us: lm_us.saturating_add(decode_us),
            lag_us: us(end.saturating_duration_since(conv.inlet.arrived)),
            ..*t
        };
        Ok(Begin::Ready)
    }

    fn run(
        &mut self,
        conv: &mut Conversation,
        forced: Option<u32>,
        rule: bool,
    ) -> Result<Option<LmFrame>, LmError> {
        if conv.take_codec_reset() {
            self.backend.reset_codec();
        }
        let (input, decoded) = conv.io_mut();
        self.backend
            .frame(input, &mut self.sampler, forced, rule, decoded)
    }

    /// The pass of [`crate::Session::warm_up`] (no forced text, no first-frame rule): the frame,
    /// then a decode of placeholder codes (or of the frame's, had it one) and its resampling;
    /// returns the microseconds of (encode, LM, decode): the encode runs inside the LM's call.
    pub(crate) fn warm_up_pass(
        &mut self,
        conv: &mut Conversation,
    ) -> Result<(u32, u32, u32), RuntimeError> {
        let t0 = Instant::now();
        let frame = self.run(conv, None, false).map_err(|e| lm_error(e, 0))?;
        let lm_us = us(t0.elapsed());
        let mut codes = [0u32; N_AUDIO];
        if let Some(f) = frame {
            codes.copy_from_slice(f.audio());
        }
        let t1 = Instant::now();
        self.backend.decode_only(&codes, conv.decoded_mut())?;
        conv.resample_only()?;
        Ok((0, lm_us, us(t1.elapsed())))
    }
}
