//! The frame pass: encode → LM step → (if output) decode + detokenize → output buffers.
//!
//! [`Pipeline`] holds every per-conversation model state (Mimi encoder and decoder streams, LMGen with its KV
//! rings and token cache, the sampler, the detokenizer, the output resampler, the pool) and all buffers,
//! preallocated. [`Pipeline::frame_pass`] is the whole pass in one function; it allocates nothing.

use std::sync::Arc;
use std::time::Instant;

use kernels::Pool;
use model::lm::{LmError, LmGen, LmObserver, StepOptions};
use model::mimi::{MimiDecoder, MimiEncoder};
use model::sampling::{Sampler, SamplerConfig, SamplingError};
use model::text::Detokenizer;

use crate::events::FrameTimings;
use crate::resample::OutputResampler;
use crate::{Engine, RuntimeError, FRAME_SIZE, N_AUDIO};

/// Maps an LM step error; non-finite logits keep their own typed variant.
fn lm_error(e: LmError, frame: u64) -> RuntimeError {
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

/// What one pass produced (the text and PCM stay in the pipeline's buffers).
pub(crate) struct PassResult {
    pub text_token: Option<u32>,
    pub audio_tokens: Option<[u32; N_AUDIO]>,
    pub timings: FrameTimings,
}

/// All per-conversation model state of a session.
pub(crate) struct Pipeline {
    engine: Arc<Engine>,
    pool: Pool,
    enc: MimiEncoder,
    dec: MimiDecoder,
    gen: LmGen,
    sampler: Sampler,
    detok: Option<Detokenizer>,
    resampler: OutputResampler,
    /// Whether to apply the Python server's first-frame rule at frame index 0.
    first_frame_reset: bool,
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

/// Calls the phase hook when the Depformer starts.
struct HookObserver<'a>(Option<&'a PhaseHook>);

impl LmObserver for HookObserver<'_> {
    fn depformer_logits(&mut self, k: usize, _logits: &[f32]) {
        if let (0, Some(h)) = (k, self.0) {
            h(Phase::Depformer);
        }
    }
}

fn us(d: std::time::Duration) -> u32 {
    d.as_micros().min(u32::MAX as u128) as u32
}

impl Pipeline {
    pub(crate) fn new(
        engine: Arc<Engine>,
        sampling: SamplerConfig,
        output_rate: u32,
        first_frame_reset: bool,
    ) -> Result<Pipeline, RuntimeError> {
        let lm = engine.lm();
        let spec = lm.spec();
        let sampler = Sampler::new(sampling, spec.text_card, spec.card)
            .map_err(|e| RuntimeError::InvalidOption(format!("sampling: {e}")))?;
        let gen = LmGen::new(lm, engine.options().kv_dtype)
            .map_err(|e| RuntimeError::Model(e.to_string()))?;
        let mimi = engine.mimi().clone();
        let resampler = OutputResampler::new(output_rate)?;
        let pcm = Vec::with_capacity(resampler.frame_capacity());
        let detok = engine.tokenizer().map(|sp| Detokenizer::new(sp.clone()));
        let text = String::with_capacity(256);
        Ok(Pipeline {
            pool: Pool::new(engine.options().threads),
            enc: MimiEncoder::new(mimi.clone()),
            dec: MimiDecoder::new(mimi.clone()),
            codes: vec![0; mimi.n_codebooks()],
            forced: Vec::with_capacity(64),
            forced_pos: 0,
            decoded: vec![0.0; FRAME_SIZE],
            gen,
            sampler,
            detok,
            resampler,
            first_frame_reset,
            pcm,
            text,
            hook: None,
            engine,
        })
    }

    fn phase(&self, p: Phase) {
        if let Some(h) = &self.hook {
            h(p);
        }
    }

    /// One frame pass over `input` (1920 samples at 24 kHz). `frame_index` is the LM call index since the
    /// stream started. Never interrupted midway; allocation-free.
    pub(crate) fn frame_pass(
        &mut self,
        input: &[f32; FRAME_SIZE],
        frame_index: u64,
    ) -> Result<PassResult, RuntimeError> {
        let t0 = Instant::now();
        self.pcm.clear();
        self.text.clear();

        // 1. Encode the user's frame with the streaming Mimi encoder.
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
        let t_enc = Instant::now();

        // 2. One LMGen step: temporal transformer, text sampling, depformer.
        self.phase(Phase::Lm);
        let lm = self.engine.lm();
        let mut user = [0i64; N_AUDIO];
        for (u, &c) in user.iter_mut().zip(&self.codes) {
            *u = i64::from(c);
        }
        let force_text = self.forced.get(self.forced_pos).copied();
        if force_text.is_some() {
            self.forced_pos += 1;
        }
        let step_opts = StepOptions {
            force_text,
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
                &mut HookObserver(self.hook.as_ref()),
            )
            .map_err(|e| lm_error(e, frame_index))?;
        let t_lm = Instant::now();

        // 3. If LMGen returned a frame: decode its audio, detokenize its text, resample to the output rate.
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
        let card = self.engine.lm().spec().text_card;
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

    /// Soft interrupt: output-side state only (detokenizer pending bytes, resampler history). Mimi, LM and
    /// Depformer state continue untouched.
    pub(crate) fn interrupt(&mut self) {
        if let Some(d) = &mut self.detok {
            d.reset();
        }
        self.resampler.reset();
    }

    /// New stream: back to the state of a freshly created pipeline. Allocates nothing.
    pub(crate) fn reset(&mut self) {
        self.enc.reset();
        self.dec.reset();
        self.gen.reset();
        self.sampler.reset();
        if let Some(d) = &mut self.detok {
            d.reset();
        }
        self.resampler.reset();
        self.pcm.clear();
        self.text.clear();
        self.forced.clear();
        self.forced_pos = 0;
    }
}
