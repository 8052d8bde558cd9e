//! Token sampling on the device: the rules of [`model::sampling`] (repetition penalty, argmax,
//! temperature, `pad_mult`, top-k, one categorical draw) in one WGSL kernel, so that a frame's text
//! token and its codes never visit the host before the frame ends.
//!
//! # The random stream
//!
//! The device continues the host sampler's own streams: before a frame the host writes each
//! session's xoshiro256** states ([`Sampler::stream_states`]) into the row's record; the kernel
//! advances them with the same 64-bit arithmetic (as pairs of 32-bit words) and the host copies the
//! advanced states back ([`Sampler::set_stream_states`]) with the tokens. A draw is taken exactly
//! when the host would take one (a sampled token whose probabilities sum to a positive finite
//! total; never for argmax, a forced token or refused logits), so after any mix of host and device
//! frames a session's generators are where the host alone would have left them, bit for bit.
//!
//! Within one draw the device differs from [`model::sampling`] only in precision:
//! * the uniform number is the top 24 bits of the 64-bit output (`(x >> 40) · 2⁻²⁴`) where the
//!   host takes 53 bits, so it lies below the host's by less than 2⁻²⁴;
//! * probabilities come from the device's `exp` (WGSL allows 3 + 2·|x| ulp) and a tree-ordered
//!   sum, and the candidates' running sum is f32 (the host's is f64), so each normalized
//!   cumulative boundary moves by at most about `2·(e_exp + k·2⁻²⁴)` for `k` candidates.
//!
//! Given the same logits, the device therefore picks the host's token unless the host's uniform
//! falls within that distance of a boundary between two candidates, or two candidates'
//! probabilities are equal to within rounding (their order may then differ). `tests/sampling.rs`
//! checks this against [`model::sampling::Sampler`] draw by draw. Argmax (temperature ≤ 0) is
//! exact: the same token as the host's argmax over the same logits.
//!
//! Non-finite logits are refused as on the host: the row's token is 0, no draw is taken, and the
//! first bad index and its value come back as [`SamplingError::NonFiniteLogits`].
//!
//! # Limits
//!
//! Top-k candidates are sorted in workgroup memory: at most [`MAX_TOP_K`] of them (top-k 0, "all",
//! counts as the vocabulary size). The repetition penalty reads at most [`MAX_PENALTY_CONTEXT`]
//! recent tokens. A sampler beyond these ([`device_samples`] is false) is sampled on the host: the
//! generator then runs the step piecewise.

use model::sampling::{Sampler, SamplingError, TokenSampling};

use crate::context::GpuContext;
use crate::dispatch::{Dispatch, Grid};
use crate::shaders::Module;
use crate::uniforms::SampleParams;
use crate::GpuError;

/// Most top-k candidates the device sorts (workgroup memory); a larger top-k samples on the host.
pub const MAX_TOP_K: usize = 1024;

/// Most recent text tokens the device's repetition penalty reads.
pub const MAX_PENALTY_CONTEXT: usize = 64;

/// Word offsets of a row's sampling record (`array<u32>`, shared with the sampling kernel, `crate::shaders::SAMPLE_WGSL`).
pub(crate) mod rec {
    /// Stream settings at `STREAM * s` (text `s = 0`, audio `s = 1`): argmax flag, 1/temperature,
    /// candidate count.
    pub const STREAM: usize = 3;
    /// PAD id (`NONE` without `pad_mult`).
    pub const PAD_ID: usize = 6;
    /// `exp(pad_mult)` as f32 bits.
    pub const PAD_MUL: usize = 7;
    /// Repetition penalty (f32 bits).
    pub const PENALTY: usize = 8;
    /// Number of history tokens.
    pub const HIST_LEN: usize = 9;
    /// Forced text token (`NONE`: sample).
    pub const FORCED: usize = 10;
    /// Next output slot.
    pub const CURSOR: usize = 11;
    /// First refused logit of stream `s` at `ERR + 2s` (`NONE` when none) and its value's bits.
    pub const ERR: usize = 12;
    /// xoshiro256** state of stream `s` at `RNG + 8s` (four u64, low word first).
    pub const RNG: usize = 16;
    /// History tokens, newest first.
    pub const HIST: usize = 32;
    /// Output tokens (text, then the audio codes in order).
    pub const OUT: usize = HIST + super::MAX_PENALTY_CONTEXT;
    /// "No value".
    pub const NONE: u32 = u32::MAX;
}

/// Candidates of one stream: `top_k` (0 or ≥ vocabulary: all of them).
fn candidates(s: TokenSampling, vocab: usize) -> usize {
    if s.top_k == 0 || s.top_k >= vocab {
        vocab
    } else {
        s.top_k
    }
}

/// Whether the device samples with `sampler` for vocabularies `(text, audio)` (see the module
/// docs' limits); when not, the step runs on the host's sampler.
pub fn device_samples(sampler: &Sampler, text_vocab: usize, audio_vocab: usize) -> bool {
    let c = sampler.config();
    let fits = |s: TokenSampling, n: usize| s.temperature <= 0.0 || candidates(s, n) <= MAX_TOP_K;
    sampler.vocab_sizes() == (text_vocab, audio_vocab)
        && fits(c.text, text_vocab)
        && fits(c.audio, audio_vocab)
        && c.repetition_penalty
            .is_none_or(|p| p.context <= MAX_PENALTY_CONTEXT)
        && c.pad_mult.is_none_or(|m| m.exp().is_finite())
}

/// Words of one row's record for `draws` output tokens.
pub(crate) fn record_words(draws: usize) -> usize {
    rec::OUT + draws
}

/// Fills one row's record from `sampler` (settings, generator states, penalty history) with the
/// forced text token, if any; clears its errors and cursor.
pub(crate) fn encode_record(
    sampler: &Sampler,
    forced: Option<u32>,
    text_vocab: usize,
    audio_vocab: usize,
    out: &mut [u32],
) {
    let c = sampler.config();
    out.fill(0);
    for (s, (settings, vocab)) in [(c.text, text_vocab), (c.audio, audio_vocab)]
        .into_iter()
        .enumerate()
    {
        let o = rec::STREAM * s;
        out[o] = u32::from(settings.temperature <= 0.0);
        // The host's scale factor, rounded as the host rounds it.
        out[o + 1] = (1.0 / settings.temperature).to_bits();
        out[o + 2] = candidates(settings, vocab) as u32;
        out[rec::ERR + 2 * s] = rec::NONE;
    }
    match c.pad_mult {
        Some(m) => {
            out[rec::PAD_ID] = c.pad_id;
            out[rec::PAD_MUL] = m.exp().to_bits();
        }
        None => out[rec::PAD_ID] = rec::NONE,
    }
    if let Some(p) = c.repetition_penalty {
        out[rec::PENALTY] = p.penalty.to_bits();
        let mut n = 0;
        for (slot, t) in out[rec::HIST..rec::OUT]
            .iter_mut()
            .zip(sampler.penalized_text())
        {
            *slot = t;
            n += 1;
        }
        out[rec::HIST_LEN] = n;
    }
    out[rec::FORCED] = forced.unwrap_or(rec::NONE);
    out[rec::CURSOR] = 0;
    for (s, state) in sampler.stream_states().iter().enumerate() {
        for (i, w) in state.iter().enumerate() {
            out[rec::RNG + 8 * s + 2 * i] = *w as u32;
            out[rec::RNG + 8 * s + 2 * i + 1] = (*w >> 32) as u32;
        }
    }
}

/// Reads one row's record back: the advanced generator states go to `sampler`, the tokens to
/// `tokens` (text first), and the first refused logits, the text stream's first, are returned.
pub(crate) fn decode_record(
    record: &[u32],
    sampler: &mut Sampler,
    tokens: &mut [u32],
) -> Option<SamplingError> {
    let mut states = [[0u64; 4]; 2];
    for (s, state) in states.iter_mut().enumerate() {
        for (i, w) in state.iter_mut().enumerate() {
            let o = rec::RNG + 8 * s + 2 * i;
            *w = u64::from(record[o]) | (u64::from(record[o + 1]) << 32);
        }
    }
    sampler.set_stream_states(states);
    tokens.copy_from_slice(&record[rec::OUT..rec::OUT + tokens.len()]);
    [("text", 0), ("audio", 1)]
        .into_iter()
        .find_map(|(stream, s)| {
            let index = record[rec::ERR + 2 * s];
            (index != rec::NONE).then(|| SamplingError::NonFiniteLogits {
                stream,
                index: index as usize,
                value: f32::from_bits(record[rec::ERR + 2 * s + 1]),
            })
        })
}

/// The sampling dispatches of one backend: a record per row (`rows × record_words(draws)` u32),
/// a work row per row, and one recorded launch per stream.
#[derive(Debug)]
pub(crate) struct SampleStage {
    /// Per-row records (settings, states, outputs).
    pub(crate) records: wgpu::Buffer,
    /// Words per row.
    pub(crate) stride: usize,
    /// Text sampling launch (reads the text logits).
    pub(crate) text: Dispatch,
    /// Audio sampling launch (reads one codebook's logits; the same launch for every codebook).
    pub(crate) audio: Dispatch,
    _work: wgpu::Buffer,
    /// Host staging of the records.
    pub(crate) host: Vec<u32>,
    /// Their bytes.
    pub(crate) bytes: Vec<u8>,
}

impl SampleStage {
    /// The stage for `rows` rows and `draws` output tokens per row, reading `text_logits`
    /// (`[rows, text_vocab]`) and `audio_logits` (`[rows, audio_vocab]`) and writing each token
    /// into `step` at word `prev + row`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        ctx: &GpuContext,
        rows: usize,
        draws: usize,
        text_vocab: usize,
        audio_vocab: usize,
        text_logits: &wgpu::Buffer,
        audio_logits: &wgpu::Buffer,
        step: &wgpu::Buffer,
        prev: usize,
    ) -> Result<SampleStage, GpuError> {
        let storage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC;
        let stride = record_words(draws);
        let records = ctx.buffer("sample_records", (rows * stride * 4) as u64, storage)?;
        let work = ctx.buffer(
            "sample_work",
            (rows * text_vocab.max(audio_vocab) * 4) as u64,
            storage,
        )?;
        let launch = |stream: u32, vocab: usize, logits: &wgpu::Buffer| {
            let params = SampleParams {
                stream,
                vocab: vocab as u32,
                ld: vocab as u32,
                stride: stride as u32,
                prev: prev as u32,
            };
            let uni = ctx.uniform("sample", &params.bytes());
            Dispatch {
                pipeline: ctx.pipeline(Module::Sample),
                bind: ctx.bind(Module::Sample, &[&uni, logits, &work, &records, step]),
                grid: Grid::PerRow(1),
                _uniform: uni,
            }
        };
        Ok(SampleStage {
            text: launch(0, text_vocab, text_logits),
            audio: launch(1, audio_vocab, audio_logits),
            records,
            stride,
            _work: work,
            host: vec![0; rows * stride],
            bytes: Vec::with_capacity(rows * stride * 4),
        })
    }

    /// Writes the records of the active rows (`samplers[rows[i]]`, `force_text[i]`).
    pub(crate) fn upload(
        &mut self,
        ctx: &GpuContext,
        rows: &[usize],
        samplers: &[Sampler],
        force_text: &[Option<u32>],
        vocab: (usize, usize),
    ) {
        let n = rows.len();
        for (i, &b) in rows.iter().enumerate() {
            let r = &mut self.host[i * self.stride..(i + 1) * self.stride];
            encode_record(&samplers[b], force_text[i], vocab.0, vocab.1, r);
        }
        self.bytes.clear();
        for w in &self.host[..n * self.stride] {
            self.bytes.extend_from_slice(&w.to_le_bytes());
        }
        ctx.queue().write_buffer(&self.records, 0, &self.bytes);
    }

    /// Parses the mapped records of the active rows into the samplers, `tokens` (`[n, per_row]`)
    /// and `errors`.
    pub(crate) fn download(
        &mut self,
        mapped: &[u8],
        rows: &[usize],
        samplers: &mut [Sampler],
        tokens: &mut [u32],
        per_row: usize,
        errors: &mut [Option<SamplingError>],
    ) {
        let n = rows.len();
        for (w, c) in self.host[..n * self.stride]
            .iter_mut()
            .zip(mapped.chunks_exact(4))
        {
            *w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        for (i, &b) in rows.iter().enumerate() {
            errors[i] = decode_record(
                &self.host[i * self.stride..(i + 1) * self.stride],
                &mut samplers[b],
                &mut tokens[i * per_row..(i + 1) * per_row],
            );
        }
    }
}

/// The device sampler on its own, over logits the caller uploads: for each row one text token,
/// then `draws` audio tokens from the same audio logits, in one submission. The LM backend runs
/// the same kernel on its own logits ([`crate::GpuLm`]); this is how the kernel is tested against
/// [`model::sampling`].
#[derive(Debug)]
pub struct GpuSampler {
    ctx: GpuContext,
    rows: usize,
    draws: usize,
    vocab: (usize, usize),
    text_logits: wgpu::Buffer,
    audio_logits: wgpu::Buffer,
    step: wgpu::Buffer,
    stage: SampleStage,
    readback: wgpu::Buffer,
    bytes: Vec<u8>,
    all_rows: Vec<usize>,
}

impl GpuSampler {
    /// A sampler of `rows` rows (1..=[`crate::shaders::MAX_ROWS`]) drawing one text token and
    /// `draws` audio tokens per row and call.
    pub fn new(
        ctx: &GpuContext,
        rows: usize,
        draws: usize,
        text_vocab: usize,
        audio_vocab: usize,
    ) -> Result<GpuSampler, GpuError> {
        if rows == 0 || rows > crate::shaders::MAX_ROWS || text_vocab == 0 || audio_vocab == 0 {
            return Err(GpuError::Unsupported {
                format: format!("sampling {rows} rows of {text_vocab}/{audio_vocab} tokens"),
                why: format!(
                    "the device sampler takes 1 to {} rows and non-empty vocabularies",
                    crate::shaders::MAX_ROWS
                ),
            });
        }
        let storage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC;
        let text_logits = ctx.buffer("text_logits", (rows * text_vocab * 4) as u64, storage)?;
        let audio_logits = ctx.buffer("audio_logits", (rows * audio_vocab * 4) as u64, storage)?;
        let step = ctx.buffer("step", (rows.max(1) * 4 + 4) as u64, storage)?;
        let stage = SampleStage::new(
            ctx,
            rows,
            1 + draws,
            text_vocab,
            audio_vocab,
            &text_logits,
            &audio_logits,
            &step,
            1,
        )?;
        let readback = ctx.buffer(
            "sample_readback",
            (rows * stage.stride * 4) as u64,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?;
        Ok(GpuSampler {
            ctx: ctx.clone(),
            rows,
            draws,
            vocab: (text_vocab, audio_vocab),
            text_logits,
            audio_logits,
            step,
            stage,
            readback,
            bytes: Vec::new(),
            all_rows: (0..rows).collect(),
        })
    }

    /// Samples the first `n = force_text.len()` rows with `samplers[i]`: `text_logits`
    /// (`[n, text_vocab]`) give one text token per row (or `force_text[i]`), then `audio_logits`
    /// (`[n, audio_vocab]`) give `draws` audio tokens per row. Writes `tokens` (`[n, 1 + draws]`,
    /// text first) and `errors`, and advances the samplers' streams. Returns `Ok(false)`, having
    /// done nothing, when a sampler's settings are beyond the device ([`device_samples`]).
    pub fn sample(
        &mut self,
        samplers: &mut [Sampler],
        text_logits: &[f32],
        audio_logits: &[f32],
        force_text: &[Option<u32>],
        tokens: &mut [u32],
        errors: &mut [Option<SamplingError>],
    ) -> Result<bool, GpuError> {
        let n = force_text.len();
        let (tv, av) = self.vocab;
        if n == 0
            || n > self.rows
            || samplers.len() < n
            || text_logits.len() != n * tv
            || audio_logits.len() != n * av
            || tokens.len() != n * (1 + self.draws)
            || errors.len() != n
        {
            return Err(GpuError::Runtime(format!(
                "device sampler called with inconsistent lengths for {n} rows"
            )));
        }
        if !samplers[..n].iter().all(|s| device_samples(s, tv, av)) {
            return Ok(false);
        }
        let ctx = self.ctx.clone();
        let q = ctx.queue();
        let words = |v: &[f32], out: &mut Vec<u8>| {
            out.clear();
            out.extend(v.iter().flat_map(|x| x.to_le_bytes()));
        };
        words(text_logits, &mut self.bytes);
        q.write_buffer(&self.text_logits, 0, &self.bytes);
        words(audio_logits, &mut self.bytes);
        q.write_buffer(&self.audio_logits, 0, &self.bytes);
        q.write_buffer(&self.step, 0, &(n as i32).to_le_bytes());
        let rows = &self.all_rows[..n];
        self.stage
            .upload(&ctx, rows, samplers, force_text, self.vocab);
        let mut enc = ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            self.stage.text.record(&mut pass, n as u32);
            for _ in 0..self.draws {
                self.stage.audio.record(&mut pass, n as u32);
            }
        }
        let len = (n * self.stage.stride * 4) as u64;
        enc.copy_buffer_to_buffer(&self.stage.records, 0, &self.readback, 0, len);
        ctx.submit(enc.finish());
        let slice = self.readback.slice(..len);
        slice.map_async(wgpu::MapMode::Read, |_| {});
        ctx.wait()?;
        {
            let view = slice
                .get_mapped_range()
                .map_err(|e| GpuError::Runtime(format!("readback: {e:?}")))?;
            self.stage
                .download(&view, rows, samplers, tokens, 1 + self.draws, errors);
        }
        self.readback.unmap();
        Ok(true)
    }
}
