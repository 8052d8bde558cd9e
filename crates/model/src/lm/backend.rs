//! The LM backend seam: where the temporal transformer and the Depformer of a batch of sessions run.
//!
//! The generator above it ([`super::LmBatchGen`], [`super::LmGen`]: delays, sampling, forcing) is
//! written once against [`LmBackend`]; a backend only computes. [`CpuLm`] is the CPU backend: the
//! weights, the KV caches and work buffers ([`LmState`]) and the worker pool the matrix products are
//! split over.

use std::borrow::BorrowMut;
use std::ops::Deref;
use std::sync::Arc;

use kernels::Pool;

use super::model::{LmModel, LmState};
use super::spec::LmSpec;
use super::{KvDtype, LmError};
use crate::sampling::{Sampler, SamplingError};

/// One LM step for a batch of `batch_size()` sessions ("rows"), in two parts: the temporal step of a
/// set of rows, then the `dep_q` Depformer steps of the same rows.
///
/// What a backend must guarantee:
/// * **No allocation, lock or syscall in a step** once it is built: every buffer (KV caches, work
///   buffers, logits) is allocated by its constructor for `batch_size()` rows.
/// * **Determinism:** the same inputs from the same state give the same logits, bit for bit, whatever
///   the other rows do and whatever rows are stepped together (each row's reductions run in a fixed
///   order). A row's state moves only when that row is stepped or reset.
/// * **Where logits live:** [`LmBackend::text_logits`] and the slice returned by
///   [`LmBackend::depformer_step`] are host memory, `[rows.len(), text_card]` and
///   `[rows.len(), card]`, valid until the next call. They are the only data that must reach the host in
///   a step (the generator samples from them); a device backend keeps activations and caches on the
///   device and copies these logits back once per call, never per matrix product.
/// * **Order:** `depformer_step(rows, k, ..)` is called for `k = 0..dep_q` in order after
///   `temporal_step(rows, ..)`, with the same `rows`.
/// * **Sampling on the device:** a backend may also run a whole step with sampling
///   ([`LmBackend::sampled_step`]); the generator tries it first when nobody observes the tensors.
pub trait LmBackend: Send {
    /// The sizes of the model this backend runs.
    fn spec(&self) -> &LmSpec;

    /// Number of sessions (rows) the backend holds state for.
    fn batch_size(&self) -> usize;

    /// Temporal step of the sessions `rows` (distinct, each `< batch_size()`): `tokens` holds one
    /// column of `1 + n_q` input tokens per row (text, Moshi audio, user audio; [`NO_TOKEN`](super::NO_TOKEN) embeds as
    /// zeros).
    /// Afterwards [`LmBackend::text_logits`] holds `[rows.len(), text_card]` and the rows' positions
    /// have advanced.
    fn temporal_step(&mut self, rows: &[usize], tokens: &[u32]) -> Result<(), LmError>;

    /// Text logits of the last temporal step, `[rows.len(), text_card]`, host memory.
    fn text_logits(&self) -> &[f32];

    /// Normalised temporal output of the last temporal step, `[rows.len(), dim]` (tracing only; a
    /// device backend may copy it on demand).
    fn transformer_out(&self) -> &[f32];

    /// Depformer step `k` of the same `rows`, with `prev_tokens[i]` the text token of this frame for
    /// `k = 0`, else row `i`'s audio token of step `k − 1`. Returns the codebook-`k` logits
    /// `[rows.len(), card]`, host memory.
    fn depformer_step(
        &mut self,
        rows: &[usize],
        k: usize,
        prev_tokens: &[u32],
    ) -> Result<&[f32], LmError>;

    /// The whole step of `rows` on the backend, sampling where the logits are (a device backend:
    /// one submission and one small readback instead of a host round trip per Depformer step):
    /// the temporal step with `tokens` as in [`LmBackend::temporal_step`], the text token sampled
    /// with `samplers[b]` (session `b`'s sampler) or `force_text[i]` when set, then the `dep_q`
    /// Depformer steps, each sampling its code and feeding it to the next. Writes `text[i]`,
    /// `audio[i * dep_q + k]` and `errors[i]` (row `i`'s first sampling error, the text stream's
    /// before the audio stream's, its token 0, as the generator's host sampling does) and advances
    /// the samplers' random streams as host sampling would; the caller records the text tokens
    /// ([`Sampler::record_text`]).
    ///
    /// Returns `Ok(false)` having changed nothing when the backend does not sample (the default)
    /// or cannot with these samplers' settings: the generator then runs the step piecewise.
    #[allow(clippy::too_many_arguments)]
    fn sampled_step(
        &mut self,
        _rows: &[usize],
        _tokens: &[u32],
        _samplers: &mut [Sampler],
        _force_text: &[Option<u32>],
        _text: &mut [u32],
        _audio: &mut [u32],
        _errors: &mut [Option<SamplingError>],
    ) -> Result<bool, LmError> {
        Ok(false)
    }

    /// Session `b` back to position 0 with empty caches (the others continue). Allocates nothing.
    fn reset_row(&mut self, b: usize);

    /// Benchmark helper: every row at position `offset` with caches holding `min(offset, context)`
    /// meaningless entries. Not behind a feature: a backend crate (the GPU's) then implements the
    /// trait the same way whoever turns what on, and the benchmarks (`moshi-bench`) reach it.
    fn seek_for_bench(&mut self, offset: usize);
}

/// The CPU backend: the weights, this batch's [`LmState`] and the worker pool its matrix products are
/// split over (the calling thread plus `n_threads − 1` workers).
///
/// Owned (`CpuLm`, what the runtime holds: shared weights, its own state, a pool it may share with the
/// codec) or borrowed for one call (`CpuLm<&LmModel, &mut LmState, &Pool>`, what [`super::LmGen`] and
/// [`super::LmBatchGen`] build from the model and pool they are handed).
#[derive(Debug)]
pub struct CpuLm<M = Arc<LmModel>, S = LmState, P = Arc<Pool>> {
    model: M,
    state: S,
    pool: P,
}

impl CpuLm {
    /// A backend for `rows` sessions of `model`, temporal KV caches stored as `kv_dtype` (built, and
    /// their pages backed, on the threads of `pool`), running on `pool` (which the caller may share
    /// with other work of the same thread, e.g. the codec).
    pub fn new(
        model: Arc<LmModel>,
        rows: usize,
        kv_dtype: KvDtype,
        pool: Arc<Pool>,
    ) -> Result<CpuLm, LmError> {
        let context = model.spec().context;
        let state = model.batch_state_on(rows, kv_dtype, context, Some(&pool))?;
        Ok(CpuLm { model, state, pool })
    }

    /// [`CpuLm::new`] with temporal KV caches of `kv_capacity` entries instead of the model's context
    /// (see [`LmModel::new_batch_state_with_capacity`]: the same steps for the first `kv_capacity`
    /// calls).
    pub fn with_kv_capacity(
        model: Arc<LmModel>,
        rows: usize,
        kv_dtype: KvDtype,
        kv_capacity: usize,
        pool: Arc<Pool>,
    ) -> Result<CpuLm, LmError> {
        let state = model.batch_state_on(rows, kv_dtype, kv_capacity, Some(&pool))?;
        Ok(CpuLm { model, state, pool })
    }
}

impl<'a> CpuLm<&'a LmModel, &'a mut LmState, &'a Pool> {
    /// The backend over borrowed parts, after checking that `state` was made for `spec`'s model.
    pub(crate) fn borrowed(
        spec: &LmSpec,
        model: &'a LmModel,
        state: &'a mut LmState,
        pool: &'a Pool,
    ) -> Result<Self, LmError> {
        if model.spec() != spec {
            return Err(LmError::Config("model and generator sizes differ".into()));
        }
        Ok(CpuLm { model, state, pool })
    }
}

impl<M, S, P> CpuLm<M, S, P>
where
    P: Deref<Target = Pool>,
{
    /// The pool the matrix products run on.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }
}

impl<M, S, P> LmBackend for CpuLm<M, S, P>
where
    M: Deref<Target = LmModel> + Send,
    S: BorrowMut<LmState> + Send,
    P: Deref<Target = Pool> + Send,
{
    fn spec(&self) -> &LmSpec {
        self.model.spec()
    }
    fn batch_size(&self) -> usize {
        self.state.borrow().batch_size()
    }
    fn temporal_step(&mut self, rows: &[usize], tokens: &[u32]) -> Result<(), LmError> {
        self.model
            .forward_temporal_rows(self.state.borrow_mut(), rows, tokens, &self.pool)
    }
    fn text_logits(&self) -> &[f32] {
        self.state.borrow().text_logits()
    }
    fn transformer_out(&self) -> &[f32] {
        self.state.borrow().transformer_out()
    }
    fn depformer_step(
        &mut self,
        rows: &[usize],
        k: usize,
        prev_tokens: &[u32],
    ) -> Result<&[f32], LmError> {
        self.model
            .depformer_step_rows(self.state.borrow_mut(), rows, k, prev_tokens, &self.pool)
    }
    fn reset_row(&mut self, b: usize) {
        let state = self.state.borrow_mut();
        if b < state.batch_size() {
            state.reset_session(b);
        }
    }
    fn seek_for_bench(&mut self, offset: usize) {
        self.state.borrow_mut().seek_for_bench(offset);
    }
}
