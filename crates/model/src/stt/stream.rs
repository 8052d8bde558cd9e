//! The STT model ([`SttModel`]), the step of a batch of streams over any LM backend ([`SttBatch`]) and
//! one stream from PCM to events ([`SttStream`]).

use std::sync::Arc;

use kernels::Pool;

use super::words::{SttEvent, WordAssembler, MAX_EXTRA_HEADS};
use super::{SttError, SttPlan, FRAME_RATE};
use crate::checkpoint::Bundle;
use crate::lm::{CpuLm, KvDtype, LmBackend, LmModel, LmSpec, TensorSource, UNGENERATED};
use crate::mimi::{Mimi, MimiEncoder};

/// A loaded speech-to-text bundle: the temporal transformer (shared with Moshi's code, `dep_q = 0`),
/// the extra heads, the 32-codebook Mimi (encoder used) and the stream plan. Immutable; share it
/// between streams behind an `Arc`.
#[derive(Debug)]
pub struct SttModel {
    lm: Arc<LmModel>,
    mimi: Arc<Mimi>,
    /// Extra heads' weights, f32 `[n_heads, head_dim, dim]` (a few KB: kept dense whatever the
    /// checkpoint's format).
    heads: Vec<f32>,
    n_heads: usize,
    head_dim: usize,
    plan: SttPlan,
}

impl SttModel {
    /// Load an STT bundle (`model_type` "stt"): the LM matrices built on the threads of `pool`, in
    /// the checkpoint's own format (f32 / bf16 / q8_0 / q4_0 / MLX, as Moshi's LM).
    pub fn load(bundle: &Bundle, pool: &Pool) -> Result<Self, SttError> {
        let cfg = &bundle.config;
        let stt = cfg
            .stt
            .as_ref()
            .ok_or_else(|| SttError::Config("not a speech-to-text bundle (model_type)".into()))?;
        let weights = bundle.lm_weights()?;
        let lm = LmModel::load_on(&weights, &cfg.lm, pool)?;
        let spec = LmSpec::from_config(&cfg.lm)?;
        let mimi_w = bundle.mimi_weights()?;
        let mimi = Mimi::load(&mimi_w, &bundle.mimi_config, cfg.lm.mimi_codebooks())?;
        let (n_heads, head_dim) = (cfg.lm.extra_heads_num_heads, cfg.lm.extra_heads_dim);
        Self::from_parts(
            lm,
            mimi,
            &weights,
            n_heads,
            head_dim,
            spec,
            SttPlan::from_config(stt),
        )
    }

    /// Assemble from a loaded LM and Mimi, reading the `n_heads` extra heads (`[head_dim, dim]`
    /// each) from `src`.
    pub fn from_parts<S: TensorSource + ?Sized>(
        lm: LmModel,
        mimi: Mimi,
        src: &S,
        n_heads: usize,
        head_dim: usize,
        spec: LmSpec,
        plan: SttPlan,
    ) -> Result<Self, SttError> {
        if spec.dep_q != 0 {
            return Err(SttError::Config(format!(
                "dep_q = {} (the STT step has no Depformer)",
                spec.dep_q
            )));
        }
        if n_heads > MAX_EXTRA_HEADS {
            return Err(SttError::Config(format!(
                "{n_heads} extra heads (at most {MAX_EXTRA_HEADS})"
            )));
        }
        if mimi.n_codebooks() != spec.n_q {
            return Err(SttError::Config(format!(
                "Mimi gives {} codebooks, the LM reads {}",
                mimi.n_codebooks(),
                spec.n_q
            )));
        }
        let mut heads = Vec::with_capacity(n_heads * head_dim * spec.dim);
        for h in 0..n_heads {
            heads.extend(src.vector(&format!("extra_heads.{h}.weight"), head_dim * spec.dim)?);
        }
        Ok(SttModel {
            lm: Arc::new(lm),
            mimi: Arc::new(mimi),
            heads,
            n_heads,
            head_dim,
            plan,
        })
    }

    /// The temporal transformer.
    pub fn lm(&self) -> &Arc<LmModel> {
        &self.lm
    }

    /// The codec.
    pub fn mimi(&self) -> &Arc<Mimi> {
        &self.mimi
    }

    /// The stream plan (prefix, delay, flush).
    pub fn plan(&self) -> SttPlan {
        self.plan
    }

    /// Number of extra (voice-activity) heads.
    pub fn n_heads(&self) -> usize {
        self.n_heads
    }

    /// Outputs per extra head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// A CPU batch of `rows` streams on `pool`.
    pub fn cpu_batch(
        self: &Arc<Self>,
        rows: usize,
        kv_dtype: KvDtype,
        pool: Arc<Pool>,
    ) -> Result<SttBatch<CpuLm>, SttError> {
        let backend = CpuLm::new(self.lm.clone(), rows, kv_dtype, pool)?;
        SttBatch::new(self.clone(), Box::new(backend))
    }
}

/// One stream's token cache and word rules.
#[derive(Debug)]
struct Row {
    /// Python `LMGen`'s `offsets`: steps run.
    offset: usize,
    /// `[num_streams][max_delay + 2]` ring of tokens (Python `LMGen`'s `cache`).
    cache: Vec<u32>,
    words: WordAssembler,
}

/// The step of a batch of streams: `moshi` 0.2.13 `LMGen.step_with_extra_heads` with `dep_q = 0`
/// (greedy text), then the word rules, over any [`LmBackend`].
///
/// Per stream and step, with `o` its offset and `CT = max_delay + 2`: the 32 codes are written at
/// `(o + delay) % CT` of their streams; stream `s`'s input is the initial token (`text_card`, `card`)
/// while `o ≤ delay[s]`, else the cache at `o % CT`; after the temporal step the argmax of the text
/// logits is written at `(o + 1) % CT` and, once `o + 1 > max_delay`, the text token at
/// `(o + 1 − max_delay + delay[0]) % CT` is the step's output. With the released delays (all 0) step 0
/// sees only initial tokens (frame 0's codes are never read) and step `t` sees the text token of step
/// `t − 1` and frame `t`.
#[derive(Debug)]
pub struct SttBatch<B: LmBackend + ?Sized> {
    model: Arc<SttModel>,
    backend: Box<B>,
    rows: Vec<Row>,
    ct: usize,
    /// Input tokens of the active rows, `[rows.len(), num_streams]`.
    tokens: Vec<u32>,
    /// Output text token per active row (`None` while the delays hold it back).
    text: Vec<Option<u32>>,
    /// Extra heads' softmax per active row, `[rows.len(), n_heads, head_dim]`.
    probs: Vec<f32>,
    /// Class-0 probabilities of one row.
    prs: [f32; MAX_EXTRA_HEADS],
    /// Rows of the last step.
    last_rows: usize,
}

impl<B: LmBackend + ?Sized> SttBatch<B> {
    /// A batch over `backend` (its `batch_size()` streams, all fresh).
    pub fn new(model: Arc<SttModel>, backend: Box<B>) -> Result<Self, SttError> {
        let spec = backend.spec().clone();
        if &spec != model.lm.spec() {
            return Err(SttError::Config(
                "backend and model sizes differ".to_string(),
            ));
        }
        let n = backend.batch_size();
        let ct = spec.max_delay() + 2;
        let k = spec.num_streams();
        let plan = model.plan;
        let rows = (0..n)
            .map(|_| Row {
                offset: 0,
                cache: vec![UNGENERATED; k * ct],
                words: WordAssembler::new(plan.skip(), spec.pad_id, spec.epad_id, FRAME_RATE),
            })
            .collect();
        let heads = model.n_heads * model.head_dim;
        Ok(SttBatch {
            backend,
            rows,
            ct,
            tokens: vec![0; n * k],
            text: vec![None; n],
            probs: vec![0.0; n * heads],
            prs: [0.0; MAX_EXTRA_HEADS],
            last_rows: 0,
            model,
        })
    }

    /// Number of streams.
    pub fn batch_size(&self) -> usize {
        self.rows.len()
    }

    /// The model.
    pub fn model(&self) -> &Arc<SttModel> {
        &self.model
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Stream `b` back to its start (the others continue). Allocates nothing.
    pub fn reset_row(&mut self, b: usize) {
        if let Some(r) = self.rows.get_mut(b) {
            r.offset = 0;
            r.cache.fill(UNGENERATED);
            r.words.reset();
            self.backend.reset_row(b);
        }
    }

    /// Output text token of each row of the last step (`None` while held back by the delays).
    pub fn text_tokens(&self) -> &[Option<u32>] {
        &self.text
    }

    /// Input tokens the last step fed the temporal transformer, `[rows.len(), 1 + n_q]` (text, then
    /// the audio codebooks).
    pub fn last_inputs(&self) -> &[u32] {
        let k = self.model.lm.spec().num_streams();
        &self.tokens[..self.text.len().min(self.last_rows) * k]
    }

    /// Extra heads' softmax of the last step, `[rows.len(), n_heads, head_dim]`.
    pub fn head_probs(&self) -> &[f32] {
        &self.probs
    }

    /// The word rules' pending tokens of stream `b`.
    pub fn pending_word(&self, b: usize) -> &[u32] {
        self.rows.get(b).map_or(&[], |r| r.words.pending())
    }

    /// One step of the streams `rows` (distinct, each `< batch_size()`), `codes` holding `n_q` codes
    /// per row (row-major). Each stream's events are appended to `events` as `(stream, event)`.
    pub fn step(
        &mut self,
        rows: &[usize],
        codes: &[u32],
        events: &mut Vec<(usize, SttEvent)>,
    ) -> Result<(), SttError> {
        let spec = self.model.lm.spec();
        let (k, nq, ct, n) = (spec.num_streams(), spec.n_q, self.ct, rows.len());
        crate::lm::check_active_rows(rows, self.rows.len())?;
        if codes.len() != n * nq {
            return Err(SttError::Length {
                what: "codes",
                expected: n * nq,
                got: codes.len(),
            });
        }
        if let Some(&c) = codes.iter().find(|&&c| c as usize >= spec.card) {
            return Err(SttError::Config(format!(
                "code {c} outside the codebook ({})",
                spec.card
            )));
        }
        for (i, &b) in rows.iter().enumerate() {
            let r = &mut self.rows[b];
            let o = r.offset;
            for q in 0..nq {
                let s = q + 1;
                r.cache[s * ct + (o + spec.delays[s]) % ct] = codes[i * nq + q];
            }
            for s in 0..k {
                self.tokens[i * k + s] = if o <= spec.delays[s] {
                    if s == 0 {
                        spec.text_card as u32
                    } else {
                        spec.card as u32
                    }
                } else {
                    r.cache[s * ct + o % ct]
                };
            }
        }
        self.last_rows = n;
        self.backend.temporal_step(rows, &self.tokens[..n * k])?;
        let logits = self.backend.text_logits();
        let tout = self.backend.transformer_out();
        let (nh, hd, d) = (self.model.n_heads, self.model.head_dim, spec.dim);
        let max_delay = spec.max_delay();
        for (i, &b) in rows.iter().enumerate() {
            let tok = argmax(&logits[i * spec.text_card..(i + 1) * spec.text_card]);
            let x = &tout[i * d..(i + 1) * d];
            for h in 0..nh {
                let p = &mut self.probs[(i * nh + h) * hd..(i * nh + h + 1) * hd];
                for (j, pj) in p.iter_mut().enumerate() {
                    let w = &self.model.heads[(h * hd + j) * d..(h * hd + j + 1) * d];
                    *pj = w.iter().zip(x).map(|(a, b)| a * b).sum();
                }
                softmax(p);
                self.prs[h] = p[0];
            }
            let r = &mut self.rows[b];
            r.offset += 1;
            let o = r.offset;
            r.cache[o % ct] = tok;
            self.text[i] = (o > max_delay).then(|| r.cache[(o - max_delay + spec.delays[0]) % ct]);
            if let Some(t) = self.text[i] {
                r.words.push(t, &self.prs[..nh], |e| events.push((b, e)));
            }
        }
        Ok(())
    }
}

/// First index of the largest value (`torch.argmax`'s tie rule).
fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// In-place softmax (max subtracted first, as torch does).
fn softmax(x: &mut [f32]) {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - m).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

/// One stream from PCM to events: the silence prefix, Mimi's streaming encoder (32 codebooks), the
/// [`SttBatch`] step, and the flush.
#[derive(Debug)]
pub struct SttStream<B: LmBackend + ?Sized> {
    batch: SttBatch<B>,
    encoder: MimiEncoder,
    pool: Arc<Pool>,
    /// PCM not yet a whole frame.
    pending: Vec<f32>,
    started: bool,
    codes: Vec<u32>,
    events: Vec<(usize, SttEvent)>,
    /// The events of one step, handed to the caller.
    step_events: Vec<SttEvent>,
    /// One frame of silence.
    zeros: Vec<f32>,
}

impl SttStream<CpuLm> {
    /// A CPU stream of `model` on `pool`, KV caches in f32.
    pub fn cpu(model: &Arc<SttModel>, pool: Arc<Pool>) -> Result<Self, SttError> {
        let batch = model.cpu_batch(1, KvDtype::F32, pool.clone())?;
        Ok(SttStream::new(batch, pool))
    }
}

impl<B: LmBackend + ?Sized> SttStream<B> {
    /// A stream over a one-row batch; Mimi runs on `pool`.
    pub fn new(batch: SttBatch<B>, pool: Arc<Pool>) -> Self {
        let mimi = batch.model().mimi().clone();
        let fs = mimi.frame_size();
        SttStream {
            encoder: MimiEncoder::new(mimi),
            pool,
            pending: Vec::with_capacity(fs),
            started: false,
            codes: Vec::new(),
            events: Vec::with_capacity(16),
            step_events: Vec::with_capacity(16),
            zeros: vec![0.0; fs],
            batch,
        }
    }

    /// The batch (text tokens and head probabilities of the last step).
    pub fn batch(&self) -> &SttBatch<B> {
        &self.batch
    }

    /// Steps run so far (prefix and flush included).
    pub fn steps(&self) -> usize {
        self.batch.rows[0].offset
    }

    /// Feed 24 kHz mono PCM; `on_step` is called after every step with that step's events.
    pub fn push_pcm(
        &mut self,
        mut pcm: &[f32],
        mut on_step: impl FnMut(&SttBatch<B>, &[SttEvent]),
    ) -> Result<(), SttError> {
        let fs = self.batch.model().mimi().frame_size();
        if !self.started {
            self.started = true;
            for _ in 0..self.batch.model().plan().prefix_frames {
                self.frame_of_silence(&mut on_step)?;
            }
        }
        while !pcm.is_empty() {
            let take = (fs - self.pending.len()).min(pcm.len());
            self.pending.extend_from_slice(&pcm[..take]);
            pcm = &pcm[take..];
            if self.pending.len() == fs {
                let frame = std::mem::take(&mut self.pending);
                let r = self.frame(&frame, &mut on_step);
                self.pending = frame;
                self.pending.clear();
                r?;
            }
        }
        Ok(())
    }

    /// End of the audio: the partial frame zero-padded, then the plan's flush frames of silence.
    pub fn flush(
        &mut self,
        mut on_step: impl FnMut(&SttBatch<B>, &[SttEvent]),
    ) -> Result<(), SttError> {
        let fs = self.batch.model().mimi().frame_size();
        if !self.started {
            self.push_pcm(&[], &mut on_step)?;
        }
        if !self.pending.is_empty() {
            let mut frame = std::mem::take(&mut self.pending);
            frame.resize(fs, 0.0);
            let r = self.frame(&frame, &mut on_step);
            frame.clear();
            self.pending = frame;
            r?;
        }
        for _ in 0..self.batch.model().plan().flush_frames {
            self.frame_of_silence(&mut on_step)?;
        }
        Ok(())
    }

    /// Back to a fresh stream.
    pub fn reset(&mut self) {
        self.batch.reset_row(0);
        self.encoder.reset();
        self.pending.clear();
        self.started = false;
    }

    fn frame_of_silence(
        &mut self,
        on_step: &mut impl FnMut(&SttBatch<B>, &[SttEvent]),
    ) -> Result<(), SttError> {
        let zeros = std::mem::take(&mut self.zeros);
        let r = self.frame(&zeros, on_step);
        self.zeros = zeros;
        r
    }

    fn frame(
        &mut self,
        pcm: &[f32],
        on_step: &mut impl FnMut(&SttBatch<B>, &[SttEvent]),
    ) -> Result<(), SttError> {
        let codes = self
            .encoder
            .encode_frame_with(pcm, Some(&self.pool), None)?;
        self.codes.clear();
        self.codes.extend_from_slice(codes);
        self.events.clear();
        self.batch.step(&[0], &self.codes, &mut self.events)?;
        self.step_events.clear();
        self.step_events
            .extend(self.events.drain(..).map(|(_, e)| e));
        on_step(&self.batch, &self.step_events);
        Ok(())
    }
}
