//! The streaming generator: Python `LMGen` (`moshi/models/lm.py`, `moshi` 0.2.13), written once
//! for any [`LmBackend`] and any set of rows of a batch.
//!
//! State: a token cache of `K = 1 + n_q` streams × `CT = max_delay + 2` slots filled with
//! [`UNGENERATED`], an offset starting at 0, and the initial tokens (`text_card` for text, `card`
//! for audio). One call of [`LmGen::step`] with the user's codes:
//!
//! 1. writes user code `i` (stream `k = 1 + dep_q + i`) at slot `(offset + delay_k) mod CT`;
//! 2. gathers the input column: stream `k` reads slot `offset mod CT`, replaced by the initial
//!    token when `offset <= delay_k` (so at call 0 every stream is initial and the user codes of
//!    call 0 are never seen by the model);
//! 3. runs the temporal transformer and samples the text token;
//! 4. runs the Depformer for `dep_q` codebooks;
//! 5. `offset += 1`, writes text and audio tokens at slot `offset mod CT`;
//! 6. returns nothing while `offset <= max_delay`, else stream `k ∈ 0..=dep_q` read at slot
//!    `(offset − max_delay + delay_k) mod CT`: text and semantic sampled at the previous call,
//!    acoustic codebooks sampled at this call.

use kernels::Pool;

use super::backend::{CpuLm, LmBackend};
use super::model::{LmModel, LmState};
use super::spec::LmSpec;
use super::{check_active_rows, check_lengths, KvDtype, LmError, NO_TOKEN, UNGENERATED};
use crate::sampling::{Sampler, SamplingError};

/// Largest number of generated audio codebooks an [`LmFrame`] can hold.
pub const MAX_AUDIO_CODEBOOKS: usize = 16;

/// One frame returned by the generator: the text token and `dep_q` audio codes (Mimi codebooks
/// in order), already un-delayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LmFrame {
    /// Text token (inner monologue), time-aligned with the audio frame.
    pub text: u32,
    codes: [u32; MAX_AUDIO_CODEBOOKS],
    n: usize,
}

impl LmFrame {
    /// A frame of `text` and `audio` (at most [`MAX_AUDIO_CODEBOOKS`] codes; `None` above), for
    /// a backend that keeps the delayed token cache on its device and reads the un-delayed frame
    /// back (`gpu::GpuDuplex`).
    pub fn from_parts(text: u32, audio: &[u32]) -> Option<LmFrame> {
        let mut codes = [0; MAX_AUDIO_CODEBOOKS];
        codes.get_mut(..audio.len())?.copy_from_slice(audio);
        Some(LmFrame {
            text,
            codes,
            n: audio.len(),
        })
    }

    /// The audio codes (length `dep_q`, 8 for Moshi).
    pub fn audio(&self) -> &[u32] {
        &self.codes[..self.n]
    }
}

/// Per-call overrides.
#[derive(Debug, Clone, Copy, Default)]
pub struct StepOptions<'a> {
    /// Use this text token instead of sampling one (text prompts; teacher forcing). It is fed to
    /// the Depformer and stored in the text stream like a sampled token.
    pub force_text: Option<u32>,
    /// Use these `dep_q` audio tokens instead of sampling (teacher forcing). The Depformer still
    /// runs with them as its inputs, so its logits stay observable.
    pub force_audio: Option<&'a [u32]>,
}

/// What one conversation's whole frame (Mimi encode -> LM step -> Mimi decode, run by a device as
/// one call: the runtime's frame-level seam over `gpu::GpuDuplexBatch`) is asked to do besides
/// the frame itself. Defined here, where both sides can name it, so the runtime hands its steps
/// to the device as they are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FrameStep {
    /// The text token to force at this call (see [`StepOptions::force_text`]).
    pub force_text: Option<u32>,
    /// Reset both Mimi directions right after this frame's encode (Python's server does so after
    /// encoding the first frame: the runtime's first-frame rule), inside the same call.
    pub reset_codec_after_encode: bool,
}

/// Observation hooks called during a step (tracing). Every method has an empty default; with
/// [`NoObserver`] the calls compile to nothing.
pub trait LmObserver {
    /// Whether the observer reads the tensors of a step. `false` lets a backend that samples on
    /// its device ([`LmBackend::sampled_step`]) keep them there; the methods below are then not
    /// called.
    fn observes(&self) -> bool {
        true
    }
    /// The token column fed to the temporal transformer (length `1 + n_q`; may hold [`NO_TOKEN`]).
    fn input_tokens(&mut self, _tokens: &[u32]) {}
    /// Normalised temporal output (length `dim`).
    fn transformer_out(&mut self, _x: &[f32]) {}
    /// Text logits (length `text_card`).
    fn text_logits(&mut self, _logits: &[f32]) {}
    /// Logits of Depformer step `k` (length `card`).
    fn depformer_logits(&mut self, _k: usize, _logits: &[f32]) {}
}

/// The observer that observes nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoObserver;

impl LmObserver for NoObserver {
    fn observes(&self) -> bool {
        false
    }
}

/// An observer that keeps everything it sees (tracing, tests): flattened per step. Tokens are kept
/// as the oracle's traces store them (i64, [`NO_TOKEN`] as −1, [`UNGENERATED`] as −2).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LmRecorder {
    /// Input columns, `[steps, 1 + n_q]`.
    pub input_tokens: Vec<i64>,
    /// Normalised temporal outputs, `[steps, dim]`.
    pub transformer_out: Vec<f32>,
    /// Text logits, `[steps, text_card]`.
    pub text_logits: Vec<f32>,
    /// Depformer logits, `[steps, dep_q, card]`.
    pub depformer_logits: Vec<f32>,
    /// Text tokens of the returned frames (filled by [`LmRecorder::record_frame`]).
    pub out_text: Vec<i64>,
    /// Audio codes of the returned frames, frame-major `[frames, dep_q]`.
    pub out_audio: Vec<i64>,
}

impl LmRecorder {
    /// Appends a frame returned by [`LmGen::step_with`].
    pub fn record_frame(&mut self, frame: &LmFrame) {
        self.out_text.push(frame.text as i64);
        self.out_audio
            .extend(frame.audio().iter().map(|&x| x as i64));
    }
}

impl LmObserver for LmRecorder {
    fn input_tokens(&mut self, t: &[u32]) {
        self.input_tokens.extend(t.iter().map(|&t| trace_token(t)));
    }
    fn transformer_out(&mut self, x: &[f32]) {
        self.transformer_out.extend_from_slice(x);
    }
    fn text_logits(&mut self, l: &[f32]) {
        self.text_logits.extend_from_slice(l);
    }
    fn depformer_logits(&mut self, _k: usize, l: &[f32]) {
        self.depformer_logits.extend_from_slice(l);
    }
}

/// A token as Python and the oracle's traces write it: the sentinels are negative there.
fn trace_token(t: u32) -> i64 {
    match t {
        NO_TOKEN => -1,
        UNGENERATED => -2,
        t => i64::from(t),
    }
}

/// The delayed token cache of one session (steps 1, 2, 5 and 6 of the module docs).
#[derive(Debug, Clone)]
struct TokenCache {
    /// `[K][CT]` token cache.
    cache: Vec<u32>,
    ct: usize,
    offset: usize,
    initial: Vec<u32>,
    input: Vec<u32>,
}

impl TokenCache {
    fn new(spec: &LmSpec) -> Self {
        let k = spec.num_streams();
        let ct = spec.max_delay() + 2;
        let mut initial = vec![spec.card as u32; k];
        initial[0] = spec.text_card as u32;
        TokenCache {
            cache: vec![UNGENERATED; k * ct],
            ct,
            offset: 0,
            initial,
            input: vec![0; k],
        }
    }

    fn reset(&mut self) {
        self.cache.fill(UNGENERATED);
        self.offset = 0;
    }

    fn seek(&mut self, offset: usize) {
        for (k, &init) in self.initial.iter().enumerate() {
            self.cache[k * self.ct..(k + 1) * self.ct].fill(init);
        }
        self.offset = offset;
    }

    /// Checks a call's overrides (nothing is mutated).
    fn validate(spec: &LmSpec, opts: &StepOptions<'_>) -> Result<(), LmError> {
        let dep_q = spec.dep_q;
        if let Some(t) = opts.force_text {
            if t as usize > spec.text_card {
                return Err(LmError::Token {
                    stream: 0,
                    token: t as i64,
                    max: spec.text_card as i64,
                });
            }
        }
        if let Some(a) = opts.force_audio {
            check_lengths(&[("forced audio tokens", dep_q, a.len())])?;
            if let Some((i, &t)) = a.iter().enumerate().find(|(_, &t)| t as usize > spec.card) {
                return Err(LmError::Token {
                    stream: 1 + i,
                    token: t as i64,
                    max: spec.card as i64,
                });
            }
        }
        Ok(())
    }

    /// Steps 1 and 2: stores the user codes at their delayed slots and gathers `self.input`.
    fn gather(&mut self, spec: &LmSpec, user_codes: &[u32]) {
        let (ct, dep_q) = (self.ct, spec.dep_q);
        for (i, &c) in user_codes[..spec.n_user()].iter().enumerate() {
            let k = 1 + dep_q + i;
            self.cache[k * ct + (self.offset + spec.delays[k]) % ct] = c;
        }
        for k in 0..spec.num_streams() {
            self.input[k] = if self.offset <= spec.delays[k] {
                self.initial[k]
            } else {
                self.cache[k * ct + self.offset % ct]
            };
        }
    }

    /// Steps 5 and 6: advances, stores this call's tokens and applies the output rule.
    fn commit(&mut self, spec: &LmSpec, text: u32, audio: &[u32]) -> Option<LmFrame> {
        let ct = self.ct;
        self.offset += 1;
        let slot = self.offset % ct;
        self.cache[slot] = text;
        for (k, &a) in audio.iter().enumerate() {
            self.cache[(1 + k) * ct + slot] = a;
        }
        let max_delay = spec.max_delay();
        if self.offset <= max_delay {
            return None;
        }
        let base = self.offset - max_delay;
        let read = |k: usize| self.cache[k * ct + (base + spec.delays[k]) % ct];
        let mut frame = LmFrame {
            text: read(0),
            codes: [0; MAX_AUDIO_CODEBOOKS],
            n: audio.len(),
        };
        for k in 0..audio.len() {
            frame.codes[k] = read(1 + k);
        }
        Some(frame)
    }
}

fn check_sizes(spec: &LmSpec) -> Result<(), LmError> {
    if spec.dep_q > MAX_AUDIO_CODEBOOKS || spec.n_user() > MAX_AUDIO_CODEBOOKS {
        return Err(LmError::Config(format!(
            "dep_q = {} / user codebooks = {} above {MAX_AUDIO_CODEBOOKS}",
            spec.dep_q,
            spec.n_user()
        )));
    }
    Ok(())
}

/// User codes of the rows of one call, as the caller holds them.
#[derive(Clone, Copy)]
enum UserCodes<'a> {
    /// Mimi codes, `[rows, n_user]`.
    Codes(&'a [u32]),
    /// Codes as the oracle's traces hold them (−1 = no input, `card` = the initial token),
    /// `[rows, n_user]`.
    Raw(&'a [i64]),
}

impl UserCodes<'_> {
    fn len(&self) -> usize {
        match self {
            UserCodes::Codes(c) => c.len(),
            UserCodes::Raw(c) => c.len(),
        }
    }

    /// One session's codes: at least `n_user`, extra ones ignored as in Python.
    fn of_one_session(self, spec: &LmSpec) -> Result<Self, LmError> {
        let n = spec.n_user();
        if self.len() < n {
            return Err(LmError::Length {
                what: "user codes",
                expected: n,
                got: self.len(),
            });
        }
        Ok(self.first(n))
    }

    /// The first `n` codes.
    fn first(self, n: usize) -> Self {
        match self {
            UserCodes::Codes(c) => UserCodes::Codes(&c[..n]),
            UserCodes::Raw(c) => UserCodes::Raw(&c[..n]),
        }
    }

    /// Row `i` (of `n_user` codes) as tokens of the cache, checked against the audio vocabulary:
    /// a raw −1 becomes [`NO_TOKEN`].
    fn row(&self, i: usize, spec: &LmSpec) -> Result<[u32; MAX_AUDIO_CODEBOOKS], LmError> {
        let nu = spec.n_user();
        let card = spec.card as i64;
        let mut codes = [0u32; MAX_AUDIO_CODEBOOKS];
        for (j, d) in codes[..nu].iter_mut().enumerate() {
            let raw = match self {
                UserCodes::Codes(c) => i64::from(c[i * nu + j]),
                UserCodes::Raw(c) => c[i * nu + j],
            };
            *d = match raw {
                -1 => NO_TOKEN,
                t if (0..=card).contains(&t) => t as u32,
                token => {
                    return Err(LmError::Token {
                        stream: 1 + spec.dep_q + j,
                        token,
                        max: card,
                    })
                }
            };
        }
        Ok(codes)
    }
}

/// The generator proper: one delayed token cache per session plus the per-row buffers of a step.
/// Its [`Core::step`] is the only implementation of a generator step; [`LmGen`], [`LmBatchGen`]
/// and [`Generator`] differ only in how they hold the backend.
#[derive(Debug)]
struct Core {
    spec: LmSpec,
    tcs: Vec<TokenCache>,
    /// `0..n` (the row list of a whole-batch step).
    all_rows: Vec<usize>,
    input: Vec<u32>,
    prev: Vec<u32>,
    text: Vec<u32>,
    audio: Vec<u32>,
    /// Per stepped row: the frame of this step.
    frames: Vec<Option<LmFrame>>,
    /// Per stepped row: the sampling error of this step, if any.
    errors: Vec<Option<LmError>>,
    /// Per stepped row: the forced text token of a [`LmBackend::sampled_step`].
    forced: Vec<Option<u32>>,
    /// Per stepped row: the sampling error a [`LmBackend::sampled_step`] reports.
    sample_errors: Vec<Option<SamplingError>>,
}

impl Core {
    fn new(spec: &LmSpec, n: usize) -> Result<Core, LmError> {
        check_sizes(spec)?;
        if n == 0 {
            return Err(LmError::Config(
                "a generator needs at least one session".into(),
            ));
        }
        Ok(Core {
            tcs: vec![TokenCache::new(spec); n],
            all_rows: (0..n).collect(),
            input: vec![0; n * spec.num_streams()],
            prev: vec![0; n],
            text: vec![0; n],
            audio: vec![0; n * spec.dep_q],
            frames: vec![None; n],
            errors: (0..n).map(|_| None).collect(),
            forced: vec![None; n],
            sample_errors: vec![None; n],
            spec: spec.clone(),
        })
    }

    fn reset_row(&mut self, b: usize) {
        if let Some(tc) = self.tcs.get_mut(b) {
            tc.reset();
        }
    }

    fn seek(&mut self, offset: usize) {
        for tc in &mut self.tcs {
            tc.reset();
            tc.seek(offset);
        }
    }

    /// One call for the sessions `rows` (distinct, `< n`, at least one): validates every argument
    /// before anything moves, then gathers the delayed inputs, runs the temporal step, samples (or
    /// forces) the text token, runs the Depformer and samples (or forces) the audio tokens, and
    /// commits. Row `i`'s frame is left in `self.frames[i]`, its sampling error in
    /// `self.errors[i]` (that session should be reset; the others are unaffected). `samplers[b]`
    /// samples session `b`; `opts(i)` are row `i`'s overrides.
    fn step<'o, B: LmBackend + ?Sized, O: LmObserver>(
        &mut self,
        backend: &mut B,
        rows: &[usize],
        user_codes: UserCodes<'_>,
        samplers: &mut [Sampler],
        opts: &dyn Fn(usize) -> StepOptions<'o>,
        obs: &mut O,
    ) -> Result<(), LmError> {
        let s = &self.spec;
        let (n, m) = (self.tcs.len(), rows.len());
        let (nu, ks, dq) = (s.n_user(), s.num_streams(), s.dep_q);
        if backend.spec() != s || backend.batch_size() != n {
            return Err(LmError::Config("backend and generator sizes differ".into()));
        }
        check_active_rows(rows, n)?;
        check_lengths(&[
            ("user codes", m * nu, user_codes.len()),
            ("samplers", n, samplers.len()),
        ])?;
        for i in 0..m {
            user_codes.row(i, s)?;
            TokenCache::validate(s, &opts(i))?;
        }
        for (i, &b) in rows.iter().enumerate() {
            let tc = &mut self.tcs[b];
            tc.gather(s, &user_codes.row(i, s)?[..nu]);
            self.input[i * ks..(i + 1) * ks].copy_from_slice(&tc.input);
            obs.input_tokens(&tc.input);
        }
        if !obs.observes() && (0..m).all(|i| opts(i).force_audio.is_none()) {
            for i in 0..m {
                self.forced[i] = opts(i).force_text;
            }
            if backend.sampled_step(
                rows,
                &self.input[..m * ks],
                samplers,
                &self.forced[..m],
                &mut self.text[..m],
                &mut self.audio[..m * dq],
                &mut self.sample_errors[..m],
            )? {
                for (i, &b) in rows.iter().enumerate() {
                    self.errors[i] = self.sample_errors[i].take().map(LmError::from);
                    samplers[b].record_text(self.text[i]);
                    self.frames[i] =
                        self.tcs[b].commit(s, self.text[i], &self.audio[i * dq..(i + 1) * dq]);
                }
                return Ok(());
            }
        }
        backend.temporal_step(rows, &self.input[..m * ks])?;
        let (tcard, d) = (s.text_card, s.dim);
        for (i, &b) in rows.iter().enumerate() {
            let logits = &backend.text_logits()[i * tcard..(i + 1) * tcard];
            obs.transformer_out(&backend.transformer_out()[i * d..(i + 1) * d]);
            obs.text_logits(logits);
            self.errors[i] = None;
            let sampler = &mut samplers[b];
            let t = match opts(i).force_text {
                Some(t) => t,
                None => match sampler.sample_text(logits) {
                    Ok(t) => t,
                    Err(e) => {
                        // This session is broken; the others go on (token 0 keeps the shared
                        // Depformer pass well-defined).
                        self.errors[i] = Some(e.into());
                        0
                    }
                },
            };
            sampler.record_text(t);
            self.text[i] = t;
            self.prev[i] = t;
        }
        let card = s.card;
        for k in 0..dq {
            let logits = backend.depformer_step(rows, k, &self.prev[..m])?;
            for (i, &b) in rows.iter().enumerate() {
                let row_logits = &logits[i * card..(i + 1) * card];
                obs.depformer_logits(k, row_logits);
                let t = match opts(i).force_audio {
                    Some(a) => a[k],
                    None => match samplers[b].sample_audio(row_logits) {
                        Ok(t) => t,
                        Err(e) => {
                            if self.errors[i].is_none() {
                                self.errors[i] = Some(e.into());
                            }
                            0
                        }
                    },
                };
                self.audio[i * dq + k] = t;
                self.prev[i] = t;
            }
        }
        for (i, &b) in rows.iter().enumerate() {
            self.frames[i] = self.tcs[b].commit(s, self.text[i], &self.audio[i * dq..(i + 1) * dq]);
        }
        Ok(())
    }

    /// Row `i`'s result of the last step (its error is taken).
    fn take_result(&mut self, i: usize) -> Result<Option<LmFrame>, LmError> {
        match self.errors[i].take() {
            Some(e) => Err(e),
            None => Ok(self.frames[i]),
        }
    }
}

/// The generator of `n` sessions over a backend it owns (the runtime's: any [`LmBackend`], e.g.
/// [`super::CpuLm`]). Each session keeps its own token cache, backend rows and position; a step may
/// advance any subset of them, reading the weights once for all.
#[derive(Debug)]
pub struct Generator<B: LmBackend + ?Sized> {
    core: Core,
    backend: Box<B>,
}

impl<B: LmBackend + ?Sized> Generator<B> {
    /// Fresh sessions, one per row of `backend` (`Box<dyn LmBackend>` for a device chosen at run time).
    pub fn new(backend: Box<B>) -> Result<Self, LmError> {
        let core = Core::new(backend.spec(), backend.batch_size())?;
        Ok(Generator { backend, core })
    }

    /// Number of sessions.
    pub fn batch_size(&self) -> usize {
        self.core.tcs.len()
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Session `b` back to its fresh state (token cache and backend rows; the others continue).
    /// Allocates nothing; an index out of range is ignored. Reset its sampler too for a
    /// reproducible restart.
    pub fn reset_row(&mut self, b: usize) {
        self.core.reset_row(b);
        self.backend.reset_row(b);
    }

    /// Calls made by session `b` since creation or its last reset (0 when out of range).
    pub fn offset(&self, b: usize) -> usize {
        self.core.tcs.get(b).map_or(0, |t| t.offset)
    }

    /// One call for the sessions `active` (distinct indices `< n`, any order; at least one), as
    /// [`LmBatchGen::step_active`] describes it. `force_text[i]`, when given, is row `i`'s forced
    /// text token; `obs` sees every row's tensors in row order.
    pub fn step<O: LmObserver>(
        &mut self,
        active: &[usize],
        user_codes: &[u32],
        samplers: &mut [Sampler],
        force_text: Option<&[Option<u32>]>,
        out: &mut [Result<Option<LmFrame>, LmError>],
        obs: &mut O,
    ) -> Result<(), LmError> {
        step_rows(
            &mut self.core,
            &mut *self.backend,
            active,
            user_codes,
            samplers,
            force_text,
            out,
            obs,
        )
    }

    /// One call of session `b` alone, with its user codes as the oracle's traces hold them (i64:
    /// −1 = no input, `card` = the initial token; at least `n_q − dep_q`, extra ones ignored),
    /// per-call overrides and an observer: [`LmGen::step_with`] on any backend (tracing).
    /// Returns the session's frame (`None` during its first `max_delay` calls) or its sampling
    /// error.
    pub fn step_raw<O: LmObserver>(
        &mut self,
        b: usize,
        user_codes: &[i64],
        samplers: &mut [Sampler],
        opts: &StepOptions<'_>,
        obs: &mut O,
    ) -> Result<Option<LmFrame>, LmError> {
        let codes = UserCodes::Raw(user_codes).of_one_session(&self.core.spec)?;
        self.core
            .step(&mut *self.backend, &[b], codes, samplers, &|_| *opts, obs)?;
        self.core.take_result(0)
    }

    /// Benchmark helper: every session jumps to call `offset` (see [`LmGen::seek_for_bench`]).
    pub fn seek_for_bench(&mut self, offset: usize) {
        self.core.seek(offset);
        self.backend.seek_for_bench(offset);
    }
}

/// The body of [`Generator::step`] and [`LmBatchGen::step_active`].
#[allow(clippy::too_many_arguments)]
fn step_rows<B: LmBackend + ?Sized, O: LmObserver>(
    core: &mut Core,
    backend: &mut B,
    active: &[usize],
    user_codes: &[u32],
    samplers: &mut [Sampler],
    force_text: Option<&[Option<u32>]>,
    out: &mut [Result<Option<LmFrame>, LmError>],
    obs: &mut O,
) -> Result<(), LmError> {
    let m = active.len();
    check_lengths(&[
        ("outputs", m, out.len()),
        ("forced text tokens", m, force_text.map_or(m, <[_]>::len)),
    ])?;
    let opts = |i: usize| StepOptions {
        force_text: force_text.and_then(|f| f[i]),
        force_audio: None,
    };
    core.step(
        backend,
        active,
        UserCodes::Codes(user_codes),
        samplers,
        &opts,
        obs,
    )?;
    for (i, o) in out.iter_mut().enumerate() {
        *o = core.take_result(i);
    }
    Ok(())
}

/// The CPU generator of one session for callers that hold the model and the pool themselves
/// (tests, tracing, benchmarks): an [`LmBatchGen`] of one session, with the single-session calls.
#[derive(Debug)]
pub struct LmGen(LmBatchGen);

impl LmGen {
    /// A fresh generator for `model` with temporal KV caches stored as `kv_dtype`.
    pub fn new(model: &LmModel, kv_dtype: KvDtype) -> Result<Self, LmError> {
        LmBatchGen::new(model, 1, kv_dtype).map(LmGen)
    }

    /// Back to the fresh state: offset 0, cache filled with −2, empty KV caches. Allocates nothing.
    /// (The sampler is separate: call [`Sampler::reset`] too for a reproducible restart.)
    pub fn reset(&mut self) {
        self.0.core.reset_row(0);
        self.0.state.reset();
    }

    /// Benchmark helper: jump to call `offset` with KV caches holding `min(offset, context)` zero
    /// entries and the token cache holding initial tokens (see [`LmState::seek_for_bench`]).
    pub fn seek_for_bench(&mut self, offset: usize) {
        self.reset();
        self.0.seek_for_bench(offset);
    }

    /// Number of calls since creation or reset.
    pub fn offset(&self) -> usize {
        self.0.offset(0)
    }

    /// The model state (last logits, transformer output, position).
    pub fn state(&self) -> &LmState {
        self.0.state()
    }

    /// One call with the user's Mimi codes (at least `n_q - dep_q` = 8; extra ones are ignored as
    /// in Python), sampling with `sampler`. Returns `None` for the first `max_delay` calls.
    pub fn step(
        &mut self,
        model: &LmModel,
        user_codes: &[u32],
        sampler: &mut Sampler,
        pool: &Pool,
    ) -> Result<Option<LmFrame>, LmError> {
        self.run(
            model,
            UserCodes::Codes(user_codes),
            sampler,
            pool,
            &StepOptions::default(),
            &mut NoObserver,
        )
    }

    /// One call with full control: user codes as i64 (−1 = "no input", embedded as zeros; `card`
    /// = the initial token), per-call overrides and an observer.
    pub fn step_with<O: LmObserver>(
        &mut self,
        model: &LmModel,
        user_codes: &[i64],
        sampler: &mut Sampler,
        pool: &Pool,
        opts: &StepOptions<'_>,
        obs: &mut O,
    ) -> Result<Option<LmFrame>, LmError> {
        self.run(model, UserCodes::Raw(user_codes), sampler, pool, opts, obs)
    }

    fn run<O: LmObserver>(
        &mut self,
        model: &LmModel,
        user_codes: UserCodes<'_>,
        sampler: &mut Sampler,
        pool: &Pool,
        opts: &StepOptions<'_>,
        obs: &mut O,
    ) -> Result<Option<LmFrame>, LmError> {
        let LmBatchGen { state, core } = &mut self.0;
        let user_codes = user_codes.of_one_session(&core.spec)?;
        let mut backend = CpuLm::borrowed(&core.spec, model, state, pool)?;
        core.step(
            &mut backend,
            &[0],
            user_codes,
            std::slice::from_mut(sampler),
            &|_| *opts,
            obs,
        )?;
        core.take_result(0)
    }
}

/// The CPU generator of several sessions stepped together, for callers that hold the model and the
/// pool themselves (tests, benchmarks): every weight matrix is read once per step for all of them
/// ([`Pool::matmul`]). Each session keeps its own token cache, KV caches, position and sampler;
/// results equal those of separate [`LmGen`]s up to float summation order.
///
/// [`LmBatchGen::step`] advances every session; [`LmBatchGen::step_active`] advances only a subset
/// (e.g. the conversations that have an input frame ready), reading the weights once for those
/// rows and leaving the other sessions' caches, positions and samplers untouched.
#[derive(Debug)]
pub struct LmBatchGen {
    state: LmState,
    core: Core,
}

impl LmBatchGen {
    /// `n >= 1` fresh sessions.
    pub fn new(model: &LmModel, n: usize, kv_dtype: KvDtype) -> Result<Self, LmError> {
        Ok(LmBatchGen {
            core: Core::new(model.spec(), n)?,
            state: model.new_batch_state(n, kv_dtype)?,
        })
    }

    /// Number of sessions.
    pub fn batch_size(&self) -> usize {
        self.core.tcs.len()
    }

    /// Resets session `b` to its fresh state (the others continue). Allocates nothing; an index out
    /// of range is ignored. (Reset its sampler too for a reproducible restart.)
    pub fn reset_session(&mut self, b: usize) {
        if b < self.core.tcs.len() {
            self.core.reset_row(b);
            self.state.reset_session(b);
        }
    }

    /// Benchmark helper: every session jumps to call `offset` (see [`LmGen::seek_for_bench`]).
    pub fn seek_for_bench(&mut self, offset: usize) {
        self.core.seek(offset);
        self.state.seek_for_bench(offset);
    }

    /// Calls made by session `b` since creation or its last reset (0 when out of range).
    pub fn offset(&self, b: usize) -> usize {
        self.core.tcs.get(b).map_or(0, |t| t.offset)
    }

    /// The shared model state (logits and outputs of the last step, one row per stepped session
    /// in the order they were given).
    pub fn state(&self) -> &LmState {
        &self.state
    }

    /// One call for every session: `user_codes` is `[n, n_q - dep_q]` row-major, `samplers[b]`
    /// samples session `b`, `out[b]` receives its frame (or `None` during its first `max_delay`
    /// calls). A sampling failure of any session is returned (after every session was stepped).
    pub fn step(
        &mut self,
        model: &LmModel,
        user_codes: &[u32],
        samplers: &mut [Sampler],
        pool: &Pool,
        out: &mut [Option<LmFrame>],
    ) -> Result<(), LmError> {
        let n = self.core.tcs.len();
        check_lengths(&[("outputs", n, out.len())])?;
        let mut backend = CpuLm::borrowed(&self.core.spec, model, &mut self.state, pool)?;
        let rows = std::mem::take(&mut self.core.all_rows);
        let r = self.core.step(
            &mut backend,
            &rows,
            UserCodes::Codes(user_codes),
            samplers,
            &|_| StepOptions::default(),
            &mut NoObserver,
        );
        self.core.all_rows = rows;
        r?;
        let mut first_err = None;
        for (b, o) in out.iter_mut().enumerate() {
            match self.core.take_result(b) {
                Ok(f) => *o = f,
                Err(e) => {
                    *o = self.core.frames[b];
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// One call for the sessions `active` only (distinct indices `< n`, any order; at least one).
    /// `user_codes` is `[active.len(), n_q - dep_q]` row-major (row `i` belongs to session
    /// `active[i]`), `samplers[b]` samples session `b` (all `n` are passed; only the active ones
    /// are used), and `out[i]` receives session `active[i]`'s result: its frame (`None` during its
    /// first `max_delay` calls) or its own sampling error (that session should be reset; the others
    /// are unaffected). `force_text`, when given, holds one optional forced text token per active
    /// row. Weights are read once for all active rows; inactive rows are untouched.
    ///
    /// An argument error is returned before anything is mutated.
    #[allow(clippy::too_many_arguments)]
    pub fn step_active(
        &mut self,
        model: &LmModel,
        active: &[usize],
        user_codes: &[u32],
        samplers: &mut [Sampler],
        pool: &Pool,
        force_text: Option<&[Option<u32>]>,
        out: &mut [Result<Option<LmFrame>, LmError>],
    ) -> Result<(), LmError> {
        let mut backend = CpuLm::borrowed(&self.core.spec, model, &mut self.state, pool)?;
        step_rows(
            &mut self.core,
            &mut backend,
            active,
            user_codes,
            samplers,
            force_text,
            out,
            &mut NoObserver,
        )
    }
}
