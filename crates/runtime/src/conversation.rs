//! One conversation's state around the LM: its input and commands ([`Inlet`]), its codec streams, the
//! detokenizer, the output resampler, forced text and the frame it reports. Shared as is by a
//! [`crate::Session`] and the slots of a [`crate::BatchRunner`]; the LM and codec side is in `stepper.rs`.
//! A conversation owns no codec streams: its driver's codec holds them (a slot each), encodes and decodes
//! its frames and takes the resets the conversation asks for ([`Conversation::take_codec_reset`]).

use std::time::Instant;

use model::lm::LmFrame;
use model::sampling::Sampler;
use model::text::Detokenizer;

use crate::engine::Engine;
use crate::error::RuntimeError;
use crate::events::FrameEvent;
use crate::inlet::{Begin, Command, Inlet};
use crate::resample::OutputResampler;
use crate::{FRAME_SIZE, N_AUDIO};

/// The slots of a frame pass (the split `Stepper`, the fused `FusedFrames`): what a conversation's commands and
/// a new conversation in a slot reset.
pub(crate) trait PassSlots {
    /// Slot `slot`'s LM side and sampler back to fresh (the other slots continue).
    fn reset_row(&mut self, slot: usize);

    /// Slot `slot`'s codec streams back to fresh before its next frame.
    fn reset_codec(&mut self, slot: usize);

    /// Gives slot `slot` its conversation's sampler.
    fn set_sampler(&mut self, slot: usize, sampler: Sampler);
}

pub(crate) struct Conversation {
    pub(crate) inlet: Inlet,
    /// A reset of the codec streams is due (taken by the driver, see [`Conversation::take_codec_reset`]).
    codec_reset: bool,
    detok: Option<Detokenizer>,
    resampler: OutputResampler,
    /// Whether to apply the Python server's first-frame rule at frame index 0.
    first_frame_reset: bool,
    /// Text vocabulary size (forced tokens are checked against it).
    text_card: usize,
    /// Text tokens to force at the next LM steps (`Session::force_text`), consumed from `forced_pos`.
    forced: Vec<u32>,
    forced_pos: usize,
    /// User codes of the current frame (copied out of the codec).
    user: [u32; N_AUDIO],
    /// Decoded 24 kHz frame.
    decoded: Vec<f32>,
    /// The last frame produced (its buffers are reused frame after frame).
    pub(crate) frame: FrameEvent,
}

/// A duration in whole microseconds, saturating (a frame pass is far below the 71 minutes of `u32`).
pub(crate) fn micros(d: std::time::Duration) -> u32 {
    d.as_micros().min(u32::MAX as u128) as u32
}

impl Conversation {
    /// A fresh conversation of `engine` with output at `output_rate` and the first-frame rule on or off
    /// (see `SessionOptions`). Its driver encodes and decodes its frames ([`Conversation::input`],
    /// [`Conversation::set_encoded`], [`Conversation::decoded_mut`], [`Conversation::take_codec_reset`]).
    /// Every buffer is allocated here.
    pub(crate) fn new(
        engine: &Engine,
        inlet: Inlet,
        output_rate: u32,
        first_frame_reset: bool,
    ) -> Result<Conversation, RuntimeError> {
        let resampler = OutputResampler::new(output_rate)?;
        let frame = FrameEvent::with_capacity(resampler.frame_capacity(), 256);
        Ok(Conversation {
            inlet,
            codec_reset: false,
            detok: engine.tokenizer().map(|sp| Detokenizer::new(sp.clone())),
            resampler,
            first_frame_reset,
            text_card: engine.lm_spec().text_card,
            forced: Vec::with_capacity(64),
            forced_pos: 0,
            user: [0; N_AUDIO],
            decoded: vec![0.0; FRAME_SIZE],
            frame,
        })
    }

    /// Apply pending commands and pop the next frame (see [`Inlet::begin`]). Returns what was found and whether
    /// a reset was applied (the LM row must then be reset too).
    pub(crate) fn begin(&mut self) -> (Begin, bool) {
        let (mut reset, mut interrupt) = (false, false);
        let begin = self.inlet.begin(|c| match c {
            Command::Reset => reset = true,
            Command::Interrupt => interrupt = true,
        });
        // A reset includes everything an interrupt does, so applying them here, once each, in this order, has
        // the effect of applying them as they were observed.
        if reset {
            self.reset();
        } else if interrupt {
            self.interrupt();
        }
        (begin, reset)
    }

    /// [`Conversation::begin`] for the conversation in slot `slot` of `pass`: a reset resets the slot's LM side,
    /// then a codec reset due (a reset's or an interrupt's) its codec streams, before the frame is staged.
    pub(crate) fn begin_in(&mut self, pass: &mut impl PassSlots, slot: usize) -> Begin {
        let (begin, reset) = self.begin();
        if reset {
            pass.reset_row(slot);
        }
        if self.take_codec_reset() {
            pass.reset_codec(slot);
        }
        begin
    }

    /// The frame [`Inlet::begin`] popped, for the driver to encode.
    pub(crate) fn input(&self) -> &[f32] {
        &self.inlet.input[..]
    }

    /// Whether the first-frame rule applies to the frame just popped (see `after_encode`): a driver
    /// that encodes inside a larger call resets the codec streams right after the encode itself.
    pub(crate) fn first_frame_rule_due(&self) -> bool {
        self.inlet.frame_index == 0 && self.first_frame_reset
    }

    /// The codes the driver encoded [`Conversation::input`] to; returns the user codes the LM reads.
    pub(crate) fn set_encoded(&mut self, codes: &[u32]) -> &[u32; N_AUDIO] {
        self.user.copy_from_slice(&codes[..N_AUDIO]);
        self.after_encode();
        &self.user
    }

    fn after_encode(&mut self) {
        if self.inlet.frame_index == 0 && self.first_frame_reset {
            // Python server (`moshi/server.py`, moshi 0.2.13): after encoding the first chunk it calls
            // `mimi.reset_streaming()` (encoder and decoder), then still passes those codes to LMGen call 0,
            // where they are replaced by the initial tokens. The next frame starts a fresh Mimi stream.
            self.reset_codec();
        }
    }

    fn reset_codec(&mut self) {
        self.codec_reset = true;
    }

    /// Whether the codec streams must be reset now (a reset command, or the first-frame rule after
    /// encoding); the driver resets them before its next encode or decode. Clears the request.
    pub(crate) fn take_codec_reset(&mut self) -> bool {
        std::mem::take(&mut self.codec_reset)
    }

    /// Where the driver writes the decoded 24 kHz frame before [`Conversation::finish`].
    pub(crate) fn decoded_mut(&mut self) -> &mut [f32] {
        &mut self.decoded
    }

    /// The text token to force at this LM step, if any (consumes it).
    pub(crate) fn next_forced(&mut self) -> Option<u32> {
        let t = self.forced.get(self.forced_pos).copied();
        if t.is_some() {
            self.forced_pos += 1;
        }
        t
    }

    /// After the LM step: if it returned a frame (whose audio the driver has already decoded into
    /// [`Conversation::decoded_mut`]), detokenize its text and resample to the output rate; then count the frame and fill [`Conversation::frame`] (its timings: resampling and
    /// detokenization; the caller fills the rest).
    pub(crate) fn finish(&mut self, out: Option<LmFrame>) -> Result<(), RuntimeError> {
        let f = &mut self.frame;
        f.pcm.clear();
        f.text.clear();
        f.text_token = None;
        f.audio_tokens = None;
        f.timings.resample_us = 0;
        f.timings.detok_us = 0;
        if let Some(lm) = out {
            let mut audio = [0u32; N_AUDIO];
            audio.copy_from_slice(lm.audio());
            let t0 = Instant::now();
            self.resampler.process(&self.decoded, &mut f.pcm)?;
            let t1 = Instant::now();
            if let Some(d) = &mut self.detok {
                f.text.push_str(d.push(lm.text));
            }
            f.timings.resample_us = micros(t1 - t0);
            f.timings.detok_us = micros(t1.elapsed());
            f.text_token = Some(lm.text);
            f.audio_tokens = Some(audio);
        }
        f.frame_index = self.inlet.frame_index;
        self.inlet.advance();
        f.epoch = self.inlet.epoch;
        f.counters = self.inlet.counters();
        Ok(())
    }

    /// Queue text tokens to force into Moshi's text stream, one per LM step from the next step on.
    pub(crate) fn force_text(&mut self, ids: &[u32]) -> Result<(), RuntimeError> {
        let card = self.text_card;
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= card) {
            return Err(RuntimeError::InvalidOption(format!(
                "text token {bad} outside the vocabulary (0..{card})"
            )));
        }
        self.forced.drain(..self.forced_pos);
        self.forced_pos = 0;
        self.forced.extend_from_slice(ids);
        Ok(())
    }

    /// Soft interrupt: output-side state only (detokenizer pending bytes, resampler history).
    pub(crate) fn interrupt(&mut self) {
        if let Some(d) = &mut self.detok {
            d.reset();
        }
        self.resampler.reset();
    }

    /// New stream: codec streams, detokenizer, resampler, buffers and forced text back to fresh. Allocates
    /// nothing.
    pub(crate) fn reset(&mut self) {
        self.reset_streams();
        self.forced.clear();
        self.forced_pos = 0;
    }

    /// [`Conversation::reset`] except the forced text, which stays pending (the warm-up runs before
    /// the stream starts and consumes none of it).
    pub(crate) fn reset_streams(&mut self) {
        self.reset_codec();
        self.interrupt();
        self.frame.pcm.clear();
        self.frame.text.clear();
    }

    /// Resamples the decoded-frame buffer (the driver has decoded into [`Conversation::decoded_mut`])
    /// into the frame's PCM, as [`Conversation::finish`] does, without detokenizing or counting a frame
    /// (the warm-up: LM call 0 has no audio to decode, so it decodes placeholder codes to time and touch
    /// the decode path). The caller resets the streams afterwards.
    pub(crate) fn resample_only(&mut self) -> Result<(), RuntimeError> {
        self.frame.pcm.clear();
        self.resampler.process(&self.decoded, &mut self.frame.pcm)
    }
}
