//! The frame pass: encode → LM step → (if output) decode + detokenize → output buffers.
//!
//! [`Codec`] holds the per-conversation state around the LM (Mimi encoder and decoder streams, the detokenizer,
//! the output resampler, forced text) and its buffers; [`Pipeline`] adds the LM of one session (LMGen with its KV
//! rings and token cache, the sampler, the pool). [`Pipeline::frame_pass`] is the whole single-session pass; the
//! batched runner (`batch.rs`) runs [`Codec::encode`] / one shared LM step / [`Codec::finish`] per slot. Nothing
//! here allocates per frame.

use std::sync::Arc;
use std::time::Instant;

use kernels::Pool;
use model::lm::{LmError, LmFrame, LmGen, LmObserver, StepOptions};
use model::mimi::{MimiDecoder, MimiEncoder};
use model::sampling::{Sampler, SamplerConfig, SamplingError};
use model::text::Detokenizer;

use crate::events::FrameTimings;
use crate::resample::OutputResampler;
use crate::{Engine, RuntimeError, FRAME_SIZE, N_AUDIO};

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

/// What one pass produced (the text and PCM stay in the codec's buffers).
pub(crate) struct PassResult {
    pub text_token: Option<u32>,
    pub audio_tokens: Option<[u32; N_AUDIO]>,
    pub timings: FrameTimings,
}

/// The per-conversation state around the LM: Mimi streams, detokenizer, resampler, forced text, buffers.
pub(crate) struct Codec {
    enc: MimiEncoder,
    dec: MimiDecoder,
    detok: Option<Detokenizer>,
    resampler: OutputResampler,
    /// Whether to apply the Python server's first-frame rule at frame index 0.
    first_frame_reset: bool,
    /// Text vocabulary size (forced tokens are checked against it).
    text_card: usize,
    /// User codes of the current frame (copied out of the encoder).
    codes: Vec<u32>,
    /// Text tokens to force at the next LM steps (`Session::force_text`), consumed from `forced_pos`.
    forced: Vec<u32>,
    forced_pos: usize,
    /// Decoded 24 kHz frame.
    decoded: Vec<f32>,
    /// Output audio of the last pass, at the output rate.
    pub(crate) pcm: Vec<f32>,
    /// Text of the last pass.
    pub(crate) text: String,
    pub(crate) hook: Option<PhaseHook>,
}

impl Codec {
    pub(crate) fn new(
        engine: &Engine,
        output_rate: u32,
        first_frame_reset: bool,
    ) -> Result<Codec, RuntimeError> {
        let mimi = engine.mimi().clone();
        let resampler = OutputResampler::new(output_rate)?;
        let pcm = Vec::with_capacity(resampler.frame_capacity());
        let detok = engine.tokenizer().map(|sp| Detokenizer::new(sp.clone()));
        Ok(Codec {
            enc: MimiEncoder::new(mimi.clone()),
            dec: MimiDecoder::new(mimi.clone()),
            codes: vec![0; mimi.n_codebooks()],
            text_card: engine.lm().spec().text_card,
            forced: Vec::with_capacity(64),
            forced_pos: 0,
            decoded: vec![0.0; FRAME_SIZE],
            detok,
            resampler,
            first_frame_reset,
            pcm,
            text: String::with_capacity(256),
            hook: None,
        })
    }

    pub(crate) fn phase(&self, p: Phase) {
        if let Some(h) = &self.hook {
            h(p);
        }
    }

    /// Phase 1: clear the output buffers and encode the user's frame (`frame_index` = LM call index since
    /// the stream started) with the streaming Mimi encoder; the codes are then in [`Codec::user_codes`].
    pub(crate) fn encode(
        &mut self,
        input: &[f32; FRAME_SIZE],
        frame_index: u64,
    ) -> Result<(), RuntimeError> {
        self.pcm.clear();
        self.text.clear();
        self.phase(Phase::Encode);
        let codes = self
            .enc
            .encode_frame(input)
            .map_err(|e| RuntimeError::Model(e.to_string()))?;
        self.codes.copy_from_slice(codes);
        if frame_index == 0 && self.first_frame_reset {
            // Python server (`moshi/server.py`, moshi 0.2.13): after encoding the first chunk it calls
            // `mimi.reset_streaming()` (encoder and decoder), then still passes those codes to LMGen call 0,
            // where they are replaced by the initial tokens. The next frame starts a fresh Mimi stream.
            self.enc.reset();
            self.dec.reset();
        }
        Ok(())
    }

    /// The user codes of the frame just encoded (the 8 the LM reads).
    pub(crate) fn user_codes(&self) -> &[u32] {
        &self.codes[..N_AUDIO]
    }

    /// The text token to force at this LM step, if any (consumes it).
    pub(crate) fn next_forced(&mut self) -> Option<u32> {
        let t = self.forced.get(self.forced_pos).copied();
        if t.is_some() {
            self.forced_pos += 1;
        }
        t
    }

    /// Phase 3: if the LM returned a frame, decode its audio, detokenize its text and resample to the output
    /// rate into [`Codec::pcm`] / [`Codec::text`].
    pub(crate) fn finish(&mut self, out: Option<LmFrame>) -> Result<PassResult, RuntimeError> {
        self.phase(Phase::Decode);
        let mut result = PassResult {
            text_token: None,
            audio_tokens: None,
            timings: FrameTimings::default(),
        };
        if let Some(frame) = out {
            let mut audio = [0u32; N_AUDIO];
            audio.copy_from_slice(frame.audio());
            self.dec
                .decode_frame(&audio, &mut self.decoded)
                .map_err(|e| RuntimeError::Model(e.to_string()))?;
            self.resampler.process(&self.decoded, &mut self.pcm)?;
            if let Some(d) = &mut self.detok {
                self.text.push_str(d.push(frame.text));
            }
            result.text_token = Some(frame.text);
            result.audio_tokens = Some(audio);
        }
        Ok(result)
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

    /// New stream: Mimi streams, detokenizer, resampler, buffers and forced text back to fresh. Allocates
    /// nothing.
    pub(crate) fn reset(&mut self) {
        self.enc.reset();
        self.dec.reset();
        self.interrupt();
        self.pcm.clear();
        self.text.clear();
        self.forced.clear();
        self.forced_pos = 0;
    }
}

/// All per-conversation model state of a single session: its codec plus its own LM state and pool.
pub(crate) struct Pipeline {
    engine: Arc<Engine>,
    pool: Pool,
    gen: LmGen,
    sampler: Sampler,
    pub(crate) codec: Codec,
}

/// Calls the phase hook when the Depformer starts.
struct HookObserver<'a>(Option<&'a PhaseHook>);

impl LmObserver for HookObserver<'_> {
    fn depformer_logits(&mut self, k: usize, _logits: &[f32]) {
        if let (0, Some(h)) = (k, self.0) {
            h(Phase::Depformer);
        }
    }
}

pub(crate) fn us(d: std::time::Duration) -> u32 {
    d.as_micros().min(u32::MAX as u128) as u32
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

impl Pipeline {
    pub(crate) fn new(
        engine: Arc<Engine>,
        sampling: SamplerConfig,
        output_rate: u32,
        first_frame_reset: bool,
    ) -> Result<Pipeline, RuntimeError> {
        let sampler = new_sampler(&engine, sampling)?;
        let gen = LmGen::new(engine.lm(), engine.options().kv_dtype)
            .map_err(|e| RuntimeError::Model(e.to_string()))?;
        Ok(Pipeline {
            pool: Pool::new(engine.options().threads),
            codec: Codec::new(&engine, output_rate, first_frame_reset)?,
            gen,
            sampler,
            engine,
        })
    }

    /// One frame pass over `input` (1920 samples at 24 kHz). `frame_index` is the LM call index since the
    /// stream started. Never interrupted midway; allocation-free.
    pub(crate) fn frame_pass(
        &mut self,
        input: &[f32; FRAME_SIZE],
        frame_index: u64,
    ) -> Result<PassResult, RuntimeError> {
        let t0 = Instant::now();
        // 1. Encode the user's frame with the streaming Mimi encoder.
        self.codec.encode(input, frame_index)?;
        let t_enc = Instant::now();

        // 2. One LMGen step: temporal transformer, text sampling, depformer.
        self.codec.phase(Phase::Lm);
        let lm = self.engine.lm();
        let mut user = [0i64; N_AUDIO];
        for (u, &c) in user.iter_mut().zip(self.codec.user_codes()) {
            *u = i64::from(c);
        }
        let step_opts = StepOptions {
            force_text: self.codec.next_forced(),
            force_audio: None,
        };
        let out = self
            .gen
            .step_with(
                lm,
                &user,
                &mut self.sampler,
                &self.pool,
                &step_opts,
                &mut HookObserver(self.codec.hook.as_ref()),
            )
            .map_err(|e| lm_error(e, frame_index))?;
        let t_lm = Instant::now();

        // 3. If LMGen returned a frame: decode its audio, detokenize its text, resample to the output rate.
        let mut result = self.codec.finish(out)?;
        let t_end = Instant::now();
        result.timings = FrameTimings {
            encode_us: us(t_enc - t0),
            lm_us: us(t_lm - t_enc),
            decode_us: us(t_end - t_lm),
            total_us: us(t_end - t0),
        };
        Ok(result)
    }

    /// Queue text tokens to force into Moshi's text stream, one per LM step from the next step on.
    pub(crate) fn force_text(&mut self, ids: &[u32]) -> Result<(), RuntimeError> {
        self.codec.force_text(ids)
    }

    /// Soft interrupt: output-side state only (detokenizer pending bytes, resampler history). Mimi, LM and
    /// Depformer state continue untouched.
    pub(crate) fn interrupt(&mut self) {
        self.codec.interrupt();
    }

    /// New stream: back to the state of a freshly created pipeline. Allocates nothing.
    pub(crate) fn reset(&mut self) {
        self.codec.reset();
        self.gen.reset();
        self.sampler.reset();
    }
}
