//! The streaming generator: Python `LMGen` (`moshi/models/lm.py`, `moshi` 0.2.13) for batch 1.
//!
//! State: a token cache of `K = 1 + n_q` streams × `CT = max_delay + 2` slots filled with −2
//! ("ungenerated"), an offset starting at 0, and the initial tokens (`text_card` for text, `card`
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

use super::model::{LmModel, LmState};
use super::spec::LmSpec;
use super::{KvDtype, LmError};
use crate::sampling::Sampler;

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

/// Observation hooks called during a step (tracing). Every method has an empty default; with
/// [`NoObserver`] the calls compile to nothing.
pub trait LmObserver {
    /// The token column fed to the temporal transformer (length `1 + n_q`).
    fn input_tokens(&mut self, _tokens: &[i64]) {}
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

impl LmObserver for NoObserver {}

/// An observer that keeps everything it sees (tracing, tests): flattened per step.
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
    fn input_tokens(&mut self, t: &[i64]) {
        self.input_tokens.extend_from_slice(t);
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

/// The value the token cache is filled with (Python `ungenerated_token_id`).
const UNGENERATED: i64 = -2;

/// The delayed token cache of one session (steps 1, 2, 5 and 6 of the module docs).
#[derive(Debug, Clone)]
struct TokenCache {
    /// `[K][CT]` token cache.
    cache: Vec<i64>,
    ct: usize,
    offset: usize,
    initial: Vec<i64>,
    input: Vec<i64>,
}

impl TokenCache {
    fn new(spec: &LmSpec) -> Self {
        let k = spec.num_streams();
        let ct = spec.max_delay() + 2;
        let mut initial = vec![spec.card as i64; k];
        initial[0] = spec.text_card as i64;
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

    /// Checks a call's arguments (nothing is mutated).
    fn validate(spec: &LmSpec, user_codes: &[i64], opts: &StepOptions<'_>) -> Result<(), LmError> {
        let (dep_q, n_user) = (spec.dep_q, spec.n_user());
        if user_codes.len() < n_user {
            return Err(LmError::Length {
                what: "user codes",
                expected: n_user,
                got: user_codes.len(),
            });
        }
        for (i, &c) in user_codes[..n_user].iter().enumerate() {
            if !(-1..=spec.card as i64).contains(&c) {
                return Err(LmError::Token {
                    stream: 1 + dep_q + i,
                    token: c,
                    max: spec.card as i64,
                });
            }
        }
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
            if a.len() != dep_q {
                return Err(LmError::Length {
                    what: "forced audio tokens",
                    expected: dep_q,
                    got: a.len(),
                });
            }
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
    fn gather(&mut self, spec: &LmSpec, user_codes: &[i64]) {
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
        self.cache[slot] = text as i64;
        for (k, &a) in audio.iter().enumerate() {
            self.cache[(1 + k) * ct + slot] = a as i64;
        }
        let max_delay = spec.max_delay();
        if self.offset <= max_delay {
            return None;
        }
        let base = self.offset - max_delay;
        let read = |k: usize| self.cache[k * ct + (base + spec.delays[k]) % ct];
        let mut frame = LmFrame {
            text: read(0) as u32,
            codes: [0; MAX_AUDIO_CODEBOOKS],
            n: audio.len(),
        };
        for k in 0..audio.len() {
            frame.codes[k] = read(1 + k) as u32;
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

/// The streaming generator of one session (batch 1).
#[derive(Debug)]
pub struct LmGen {
    spec: LmSpec,
    state: LmState,
    tc: TokenCache,
}

impl LmGen {
    /// A fresh generator for `model` with temporal KV caches stored as `kv_dtype`.
    pub fn new(model: &LmModel, kv_dtype: KvDtype) -> Result<Self, LmError> {
        let spec = model.spec().clone();
        check_sizes(&spec)?;
        Ok(LmGen {
            state: model.new_state(kv_dtype)?,
            tc: TokenCache::new(&spec),
            spec,
        })
    }

    /// Back to the fresh state: offset 0, cache filled with −2, empty KV caches. Allocates nothing.
    /// (The sampler is separate: call [`Sampler::reset`] too for a reproducible restart.)
    pub fn reset(&mut self) {
        self.tc.reset();
        self.state.reset();
    }

    /// Benchmark helper: jump to call `offset` with KV caches holding `min(offset, context)` zero
    /// entries and the token cache holding initial tokens (see [`LmState::seek_for_bench`]).
    pub fn seek_for_bench(&mut self, offset: usize) {
        self.reset();
        self.tc.seek(offset);
        self.state.seek_for_bench(offset);
    }

    /// Number of calls since creation or reset.
    pub fn offset(&self) -> usize {
        self.tc.offset
    }

    /// The model state (last logits, transformer output, position).
    pub fn state(&self) -> &LmState {
        &self.state
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
        let n = self.spec.n_user();
        if user_codes.len() < n {
            return Err(LmError::Length {
                what: "user codes",
                expected: n,
                got: user_codes.len(),
            });
        }
        // `new` checked n <= MAX_AUDIO_CODEBOOKS.
        let mut codes = [0i64; MAX_AUDIO_CODEBOOKS];
        for (c, &u) in codes.iter_mut().zip(&user_codes[..n]) {
            *c = u as i64;
        }
        self.step_with(
            model,
            &codes[..n],
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
        let s = &self.spec;
        if model.spec() != s {
            return Err(LmError::Config("model and generator sizes differ".into()));
        }
        TokenCache::validate(s, user_codes, opts)?;
        self.tc.gather(s, user_codes);
        obs.input_tokens(&self.tc.input);

        model.forward_temporal(&mut self.state, &self.tc.input, pool)?;
        obs.transformer_out(self.state.transformer_out());
        obs.text_logits(self.state.text_logits());
        let text = match opts.force_text {
            Some(t) => t,
            None => sampler.sample_text(self.state.text_logits())?,
        };
        sampler.record_text(text);

        let mut audio = [0u32; MAX_AUDIO_CODEBOOKS];
        let mut prev = text as i64;
        for k in 0..s.dep_q {
            let logits = model.depformer_step(&mut self.state, k, &[prev], pool)?;
            obs.depformer_logits(k, logits);
            let tok = match opts.force_audio {
                Some(a) => a[k],
                None => sampler.sample_audio(logits)?,
            };
            audio[k] = tok;
            prev = tok as i64;
        }
        Ok(self.tc.commit(s, text, &audio[..s.dep_q]))
    }
}

/// Several sessions stepped together: every weight matrix is read once per step for all of them
/// ([`Pool::matmul`]). Each session keeps its own token cache, KV caches, position and sampler;
/// results equal those of separate [`LmGen`]s up to float summation order.
///
/// [`LmBatchGen::step`] advances every session; [`LmBatchGen::step_active`] advances only a subset
/// (e.g. the conversations that have an input frame ready), reading the weights once for those
/// rows and leaving the other sessions' caches, positions and samplers untouched.
#[derive(Debug)]
pub struct LmBatchGen {
    spec: LmSpec,
    state: LmState,
    tcs: Vec<TokenCache>,
    /// `0..n` (the row list of [`LmBatchGen::step`]).
    all_rows: Vec<usize>,
    input: Vec<i64>,
    prev: Vec<i64>,
    text: Vec<u32>,
    audio: Vec<u32>,
    /// Per active row: the frame of this step.
    frames: Vec<Option<LmFrame>>,
    /// Per active row: the sampling error of this step, if any.
    errors: Vec<Option<LmError>>,
}

impl LmBatchGen {
    /// `n >= 1` fresh sessions.
    pub fn new(model: &LmModel, n: usize, kv_dtype: KvDtype) -> Result<Self, LmError> {
        let spec = model.spec().clone();
        check_sizes(&spec)?;
        let state = model.new_batch_state(n, kv_dtype)?;
        Ok(LmBatchGen {
            tcs: vec![TokenCache::new(&spec); n],
            all_rows: (0..n).collect(),
            input: vec![0; n * spec.num_streams()],
            prev: vec![0; n],
            text: vec![0; n],
            audio: vec![0; n * spec.dep_q],
            frames: vec![None; n],
            errors: (0..n).map(|_| None).collect(),
            state,
            spec,
        })
    }

    /// Number of sessions.
    pub fn batch_size(&self) -> usize {
        self.tcs.len()
    }

    /// Resets session `b` to its fresh state (the others continue). Allocates nothing; an index out
    /// of range is ignored. (Reset its sampler too for a reproducible restart.)
    pub fn reset_session(&mut self, b: usize) {
        if b < self.tcs.len() {
            self.tcs[b].reset();
            self.state.reset_session(b);
        }
    }

    /// Benchmark helper: every session jumps to call `offset` (see [`LmGen::seek_for_bench`]).
    pub fn seek_for_bench(&mut self, offset: usize) {
        for tc in &mut self.tcs {
            tc.reset();
            tc.seek(offset);
        }
        self.state.seek_for_bench(offset);
    }

    /// Calls made by session `b` since creation or its last reset (0 when out of range).
    pub fn offset(&self, b: usize) -> usize {
        self.tcs.get(b).map_or(0, |t| t.offset)
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
        let n = self.tcs.len();
        if out.len() != n {
            return Err(LmError::Length {
                what: "outputs",
                expected: n,
                got: out.len(),
            });
        }
        let rows = std::mem::take(&mut self.all_rows);
        let r = self.run(model, &rows, user_codes, samplers, pool, None);
        self.all_rows = rows;
        r?;
        let mut first_err = None;
        for (b, o) in out.iter_mut().enumerate() {
            *o = self.frames[b];
            if let Some(e) = self.errors[b].take() {
                first_err.get_or_insert(e);
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
    /// row. Weights are read once for all active rows; inactive sessions are untouched.
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
        if out.len() != active.len() {
            return Err(LmError::Length {
                what: "outputs",
                expected: active.len(),
                got: out.len(),
            });
        }
        self.run(model, active, user_codes, samplers, pool, force_text)?;
        for (i, o) in out.iter_mut().enumerate() {
            *o = match self.errors[i].take() {
                Some(e) => Err(e),
                None => Ok(self.frames[i]),
            };
        }
        Ok(())
    }

    /// The shared body of both steps: validates everything, then steps the sessions `rows` and
    /// leaves row `i`'s frame in `self.frames[i]` and its sampling error in `self.errors[i]`.
    fn run(
        &mut self,
        model: &LmModel,
        rows: &[usize],
        user_codes: &[u32],
        samplers: &mut [Sampler],
        pool: &Pool,
        force_text: Option<&[Option<u32>]>,
    ) -> Result<(), LmError> {
        let s = &self.spec;
        let (n, m) = (self.tcs.len(), rows.len());
        let (nu, ks, dq) = (s.n_user(), s.num_streams(), s.dep_q);
        if model.spec() != s {
            return Err(LmError::Config("model and generator sizes differ".into()));
        }
        if m == 0 || m > n {
            return Err(LmError::Length {
                what: "active sessions",
                expected: n,
                got: m,
            });
        }
        for (i, &b) in rows.iter().enumerate() {
            if b >= n || rows[..i].contains(&b) {
                return Err(LmError::Config(format!(
                    "session {b} is out of range or repeated (batch of {n})"
                )));
            }
        }
        for (what, expected, got) in [
            ("user codes", m * nu, user_codes.len()),
            ("samplers", n, samplers.len()),
            ("forced text tokens", m, force_text.map_or(m, <[_]>::len)),
        ] {
            if expected != got {
                return Err(LmError::Length {
                    what,
                    expected,
                    got,
                });
            }
        }
        // Row `i`'s user codes widened to the i64 of the token cache.
        let row_codes = |i: usize| {
            let mut codes = [0i64; MAX_AUDIO_CODEBOOKS];
            for (c, &u) in codes.iter_mut().zip(&user_codes[i * nu..(i + 1) * nu]) {
                *c = u as i64;
            }
            codes
        };
        for i in 0..m {
            let codes = row_codes(i);
            let opts = StepOptions {
                force_text: force_text.and_then(|f| f[i]),
                force_audio: None,
            };
            TokenCache::validate(s, &codes[..nu], &opts)?;
        }
        for (i, &b) in rows.iter().enumerate() {
            let codes = row_codes(i);
            let tc = &mut self.tcs[b];
            tc.gather(s, &codes[..nu]);
            self.input[i * ks..(i + 1) * ks].copy_from_slice(&tc.input);
        }
        model.forward_temporal_rows(&mut self.state, rows, &self.input[..m * ks], pool)?;
        let tcard = s.text_card;
        for (i, &b) in rows.iter().enumerate() {
            self.errors[i] = None;
            let sampler = &mut samplers[b];
            let forced = force_text.and_then(|f| f[i]);
            let t = match forced {
                Some(t) => t,
                None => {
                    let logits = &self.state.text_logits()[i * tcard..(i + 1) * tcard];
                    match sampler.sample_text(logits) {
                        Ok(t) => t,
                        Err(e) => {
                            // This session is broken; the others go on (token 0 keeps the
                            // shared Depformer pass well-defined).
                            self.errors[i] = Some(e.into());
                            0
                        }
                    }
                }
            };
            sampler.record_text(t);
            self.text[i] = t;
            self.prev[i] = t as i64;
        }
        for k in 0..dq {
            let logits =
                model.depformer_step_rows(&mut self.state, rows, k, &self.prev[..m], pool)?;
            for (i, &b) in rows.iter().enumerate() {
                let t = match samplers[b].sample_audio(&logits[i * s.card..(i + 1) * s.card]) {
                    Ok(t) => t,
                    Err(e) => {
                        if self.errors[i].is_none() {
                            self.errors[i] = Some(e.into());
                        }
                        0
                    }
                };
                self.audio[i * dq + k] = t;
                self.prev[i] = t as i64;
            }
        }
        for (i, &b) in rows.iter().enumerate() {
            self.frames[i] = self.tcs[b].commit(s, self.text[i], &self.audio[i * dq..(i + 1) * dq]);
        }
        Ok(())
    }
}
