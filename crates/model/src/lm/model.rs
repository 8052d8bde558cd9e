//! LM weights and the two forward passes (temporal step, Depformer step), each the execution of
//! a pass of the model's [`LmPlan`] (`lm/plan.rs`: the layer sequence, written there once).

use std::sync::Mutex;

use kernels::attention::{KvDtype, KvRing};
use kernels::{ops, Matrix, Pool};

use super::plan::{AttendAt, Buf, LmPlan, Op, Pass, Stack, Token};
use super::source::TensorSource;
use super::spec::LmSpec;
use super::table::{LmTensors, Projections};
use super::{check_active_rows, check_lengths, LmError, NO_TOKEN, UNGENERATED};
use crate::checkpoint::LmConfig;
use crate::checkpoint::Weights;

/// The Moshi LM weights (immutable; share one between sessions behind an `Arc`).
#[derive(Debug)]
pub struct LmModel {
    spec: LmSpec,
    /// Every weight, loaded from [`LmTensors::table`].
    w: LmTensors<Matrix, Vec<f32>>,
    /// The ops of a temporal step and of each Depformer step ([`LmPlan::new`] unless replaced).
    plan: LmPlan,
}

/// LM state of `n` sessions stepped together (`n = 1` for one session): temporal and Depformer
/// KV caches plus every work buffer (row-major `[n, ...]`), all allocated by
/// [`LmModel::new_state`] / [`LmModel::new_batch_state`]. A step allocates nothing.
#[derive(Debug)]
pub struct LmState {
    n: usize,
    /// `[n][num_layers]` temporal caches.
    kv: Vec<KvRing>,
    /// `[n][dep_layers]` Depformer caches.
    dep_kv: Vec<KvRing>,
    pos: Vec<usize>,
    /// `0..n` (the row map of a whole-batch step).
    all_rows: Vec<usize>,
    dep_next: usize,
    /// Work buffers of the temporal transformer (width `dim`).
    temporal: Scratch,
    tout: Vec<f32>,
    text_logits: Vec<f32>,
    /// Work buffers of the Depformer (width `dep_dim`).
    dep: Scratch,
    dep_logits: Vec<f32>,
}

/// The work buffers of one transformer's layers for `n` rows of width `d` (row-major `[n, ...]`):
/// the temporal transformer and the Depformer run the same ops at different widths.
#[derive(Debug)]
struct Scratch {
    /// [`Buf::X`] to [`Buf::U`] (indexed by [`Buf`]'s order), each `[n, width]` with the width of
    /// [`Pass::width`].
    bufs: [Vec<f32>; 7],
    /// One embedding row `[d]`.
    row: Vec<f32>,
}

impl Scratch {
    fn new(n: usize, d: usize, hidden: usize) -> Scratch {
        let b = |w: usize| vec![0.0; n * w];
        Scratch {
            // X, H, Qkv, Attn, Tmp, G, U.
            bufs: [b(d), b(d), b(3 * d), b(d), b(d), b(2 * hidden), b(hidden)],
            row: vec![0.0; d],
        }
    }
}

/// The buffers of one pass: its stack's work buffers, `transformer_out` and its logits.
struct PassBufs<'a> {
    work: &'a mut Scratch,
    out: &'a mut Vec<f32>,
    logits: &'a mut Vec<f32>,
}

impl PassBufs<'_> {
    fn get(&mut self, b: Buf) -> &mut Vec<f32> {
        match b {
            Buf::Out => &mut *self.out,
            Buf::Logits => &mut *self.logits,
            // X ..= U, in declaration order.
            b => &mut self.work.bufs[b as usize],
        }
    }

    /// `f(from, to)` over two distinct buffers (the plan's check refuses an op whose two are the
    /// same): `to` is moved out for the call and back after it, which allocates nothing.
    fn pair<R>(&mut self, from: Buf, to: Buf, f: impl FnOnce(&mut [f32], &mut [f32]) -> R) -> R {
        let mut dst = std::mem::take(self.get(to));
        let r = f(self.get(from), &mut dst);
        *self.get(to) = dst;
        r
    }
}

impl LmState {
    /// Number of sessions (rows).
    pub fn batch_size(&self) -> usize {
        self.n
    }

    /// Number of temporal steps run by session 0 since creation or reset (its next RoPE position).
    pub fn position(&self) -> usize {
        self.pos[0]
    }

    /// Position of session `b`.
    pub fn position_of(&self, b: usize) -> usize {
        self.pos[b]
    }

    /// Normalised temporal output of the last step (`transformer_out`, input of the text head and
    /// of the Depformer), `[n, dim]`.
    pub fn transformer_out(&self) -> &[f32] {
        &self.tout
    }

    /// Text logits of the last temporal step, `[n, text_card]`.
    pub fn text_logits(&self) -> &[f32] {
        &self.text_logits
    }

    /// Logits of the last Depformer step, `[n, card]`.
    pub fn depformer_logits(&self) -> &[f32] {
        &self.dep_logits
    }

    /// Benchmark helper: reset, then fill every temporal KV cache with `min(pos, context)` zero
    /// entries and set the positions to `pos`, as if `pos` steps had run (values are meaningless).
    pub fn seek_for_bench(&mut self, pos: usize) {
        self.reset();
        if let Some(first) = self.kv.first() {
            let d = first.n_heads() * first.head_dim();
            let zeros = vec![0.0f32; d];
            for r in &mut self.kv {
                for _ in 0..pos.min(r.capacity()) {
                    r.push(&zeros, &zeros);
                }
            }
        }
        self.pos.fill(pos);
    }

    /// Back to position 0 with empty caches for every session (no deallocation).
    pub fn reset(&mut self) {
        for b in 0..self.n {
            self.reset_session(b);
        }
        self.dep_next = 0;
    }

    /// Back to position 0 with empty caches for session `b` only.
    pub fn reset_session(&mut self, b: usize) {
        let l = self.kv.len() / self.n;
        for r in &mut self.kv[b * l..(b + 1) * l] {
            r.reset();
        }
        self.pos[b] = 0;
    }
}

fn add_embedding(
    table: &Matrix,
    token: u32,
    stream: usize,
    acc: &mut [f32],
    row: &mut [f32],
) -> Result<(), LmError> {
    // Python `ScaledEmbedding`: -1 gives an exact zero vector; other negative ids (-2, ungenerated)
    // are clamped to 0 (LMGen never feeds them); ids past the table are an error.
    let id = match token {
        NO_TOKEN => return Ok(()),
        UNGENERATED => 0,
        t => t as usize,
    };
    if id >= table.rows() {
        return Err(LmError::Token {
            stream,
            token: i64::from(token),
            max: table.rows() as i64 - 1,
        });
    }
    table.row_f32(id, row);
    ops::add(acc, row);
    Ok(())
}

/// RMS norm of the first `n` rows (`d` values each) of `x` into `out`.
fn rms_norm_rows(x: &[f32], w: &[f32], eps: f32, d: usize, n: usize, out: &mut [f32]) {
    for b in 0..n {
        let r = b * d..(b + 1) * d;
        ops::rms_norm(&x[r.clone()], w, eps, &mut out[r]);
    }
}

impl LmModel {
    /// Load from a checkpoint (any format the checkpoint layer maps to canonical names) with the
    /// sizes of `cfg`.
    pub fn load(weights: &Weights, cfg: &LmConfig) -> Result<Self, LmError> {
        Self::from_source(weights, LmSpec::from_config(cfg)?)
    }

    /// Load every tensor of the weight table ([`LmTensors::table`]) from `src` for `spec`.
    pub fn from_source<S: TensorSource + ?Sized>(src: &S, spec: LmSpec) -> Result<Self, LmError> {
        let w = LmTensors::table(&spec).try_map(|m| src.load(m), |v| src.vector(&v.name, v.len))?;
        let plan = LmPlan::new(&spec);
        Ok(LmModel { spec, w, plan })
    }

    /// The same weights running `plan` instead of the model's own ([`LmPlan::new`]): a model whose
    /// layers are these ops in another order, or a test's broken plan. Refused, with a typed
    /// error, unless the plan fits the model ([`LmPlan::check`]).
    pub fn with_plan(mut self, plan: LmPlan) -> Result<LmModel, LmError> {
        plan.check(&self.spec)?;
        self.plan = plan;
        Ok(self)
    }

    /// The ops the steps run.
    pub fn plan(&self) -> &LmPlan {
        &self.plan
    }

    /// Every weight, in the table's structure ([`LmTensors`]).
    pub fn tensors(&self) -> &LmTensors<Matrix, Vec<f32>> {
        &self.w
    }

    /// Sizes and token conventions.
    pub fn spec(&self) -> &LmSpec {
        &self.spec
    }

    /// Storage format of the temporal transformer's matrices (the bulk of the bytes read per frame).
    pub fn weight_format(&self) -> kernels::WeightFormat {
        self.w
            .layers
            .first()
            .map_or(self.w.text_linear.format(), |l| l.proj.in_proj.format())
    }

    /// Bytes of matrix weights streamed per frame (temporal layers, text head, 8 Depformer steps).
    pub fn streamed_weight_bytes(&self) -> usize {
        let w = &self.w;
        let proj = |p: &Projections<Matrix>| {
            p.in_proj.weight_bytes()
                + p.out_proj.weight_bytes()
                + p.lin_in.weight_bytes()
                + p.lin_out.weight_bytes()
        };
        let mut b = w.text_linear.weight_bytes();
        b += w.layers.iter().map(|l| proj(&l.proj)).sum::<usize>();
        for m in w.dep_in.iter().chain(&w.dep_linear) {
            b += m.weight_bytes();
        }
        for l in &w.dep_layers {
            b += l.steps.iter().map(proj).sum::<usize>();
        }
        b
    }

    /// A fresh per-session state with temporal KV caches of `context` steps stored as `kv_dtype`
    /// (f32 for parity, bf16 halves the memory).
    pub fn new_state(&self, kv_dtype: KvDtype) -> Result<LmState, LmError> {
        self.new_batch_state(1, kv_dtype)
    }

    /// A state for `n >= 1` sessions stepped together (each matrix is read once per step for all
    /// of them through [`Pool::matmul`]).
    pub fn new_batch_state(&self, n: usize, kv_dtype: KvDtype) -> Result<LmState, LmError> {
        self.new_batch_state_with_capacity(n, kv_dtype, self.spec.context)
    }

    /// [`LmModel::new_batch_state`] with temporal KV rings of `kv_capacity` entries instead of the
    /// model's context. Its steps match the model's for the first `kv_capacity` calls; after that it
    /// forgets entries the model would still attend to. For short-lived states (a start-up timing
    /// pass of one frame) that should not pay for a full-context cache.
    pub fn new_batch_state_with_capacity(
        &self,
        n: usize,
        kv_dtype: KvDtype,
        kv_capacity: usize,
    ) -> Result<LmState, LmError> {
        self.batch_state_on(n, kv_dtype, kv_capacity, None)
    }

    /// [`LmModel::new_batch_state_with_capacity`], the temporal KV rings built on the threads of `pool`:
    /// each ring backs all its pages when it is built (so no frame faults), which for Moshi in f32 is
    /// 3.1 GB of fresh memory the OS zeroes, on the path to a session's first frame.
    pub(crate) fn batch_state_on(
        &self,
        n: usize,
        kv_dtype: KvDtype,
        kv_capacity: usize,
        pool: Option<&Pool>,
    ) -> Result<LmState, LmError> {
        if n == 0 {
            return Err(LmError::Config("batch size must be >= 1".into()));
        }
        let s = &self.spec;
        let new_ring = || KvRing::new(kv_capacity, s.num_heads, s.head_dim, kv_dtype);
        let rings = n * s.num_layers;
        let kv = match pool.filter(|p| p.n_threads() > 1) {
            None => (0..rings)
                .map(|_| new_ring())
                .collect::<Result<Vec<_>, _>>()?,
            Some(pool) => {
                let built: Vec<Mutex<Option<_>>> = (0..rings).map(|_| Mutex::new(None)).collect();
                pool.run(rings, &|i| {
                    let r = new_ring();
                    *built[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
                });
                built
                    .into_iter()
                    .map(|m| {
                        let r = m.into_inner().unwrap_or_else(|e| e.into_inner());
                        r.unwrap_or_else(new_ring)
                    })
                    .collect::<Result<Vec<_>, _>>()?
            }
        };
        let dep_kv = (0..n * s.dep_layers)
            .map(|_| KvRing::new(s.dep_q, s.dep_heads, s.dep_head_dim, KvDtype::F32))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(LmState {
            n,
            kv,
            dep_kv,
            pos: vec![0; n],
            all_rows: (0..n).collect(),
            dep_next: 0,
            temporal: Scratch::new(n, s.dim, s.hidden),
            tout: vec![0.0; n * s.dim],
            text_logits: vec![0.0; n * s.text_card],
            dep: Scratch::new(n, s.dep_dim, s.dep_hidden),
            dep_logits: vec![0.0; n * s.card],
        })
    }

    /// One temporal step for every session of `st`: `tokens` holds `n` columns of `1 + n_q`
    /// tokens (text, Moshi audio, user audio), row-major. Embedding sum, transformer layers at each
    /// session's position, out norm, text head. Results are in [`LmState::transformer_out`] and
    /// [`LmState::text_logits`]; positions advance.
    pub fn forward_temporal(
        &self,
        st: &mut LmState,
        tokens: &[u32],
        pool: &Pool,
    ) -> Result<(), LmError> {
        let rows = std::mem::take(&mut st.all_rows);
        let r = self.forward_temporal_rows(st, &rows, tokens, pool);
        st.all_rows = rows;
        r
    }

    /// [`LmModel::forward_temporal`] for the sessions `rows` only (distinct, each `< n`): `tokens`
    /// holds `rows.len()` columns; output row `i` of [`LmState::transformer_out`] and
    /// [`LmState::text_logits`] belongs to session `rows[i]`. The caches and positions of the
    /// other sessions are untouched.
    pub fn forward_temporal_rows(
        &self,
        st: &mut LmState,
        rows: &[usize],
        tokens: &[u32],
        pool: &Pool,
    ) -> Result<(), LmError> {
        check_active_rows(rows, st.n)?;
        // Validate everything before touching the state.
        self.spec.check_input_tokens(rows.len(), tokens)?;
        self.run_pass(&self.plan.temporal, st, rows, tokens, pool)?;
        for &b in rows {
            st.pos[b] += 1;
        }
        st.dep_next = 0;
        Ok(())
    }

    /// Depformer step `k` (0..dep_q, in order after a temporal step) for every session, with
    /// `prev_tokens[b]` = the text token of this frame for `k = 0`, else the audio token of step
    /// `k - 1`. Step 0 starts fresh Depformer caches. Returns the codebook-`k` logits `[n, card]`
    /// (also in [`LmState::depformer_logits`]).
    pub fn depformer_step<'s>(
        &self,
        st: &'s mut LmState,
        k: usize,
        prev_tokens: &[u32],
        pool: &Pool,
    ) -> Result<&'s [f32], LmError> {
        let rows = std::mem::take(&mut st.all_rows);
        let r = self
            .depformer_step_rows(st, &rows, k, prev_tokens, pool)
            .err();
        st.all_rows = rows;
        match r {
            Some(e) => Err(e),
            None => Ok(&st.dep_logits),
        }
    }

    /// [`LmModel::depformer_step`] for the sessions `rows` only (the rows of the preceding
    /// [`LmModel::forward_temporal_rows`]): `prev_tokens[i]` and logits row `i` belong to session
    /// `rows[i]`.
    pub fn depformer_step_rows<'s>(
        &self,
        st: &'s mut LmState,
        rows: &[usize],
        k: usize,
        prev_tokens: &[u32],
        pool: &Pool,
    ) -> Result<&'s [f32], LmError> {
        let s = &self.spec;
        let n = rows.len();
        check_active_rows(rows, st.n)?;
        check_lengths(&[("previous tokens", n, prev_tokens.len())])?;
        if k >= s.dep_q || (k != 0 && k != st.dep_next) {
            return Err(LmError::Config(format!(
                "depformer step {k} out of order (expected {})",
                st.dep_next
            )));
        }
        // Step 0 empties the Depformer's rings (its attention ops, `AttendAt::Step(0)`).
        self.run_pass(&self.plan.depformer[k], st, rows, prev_tokens, pool)?;
        st.dep_next = k + 1;
        Ok(&st.dep_logits)
    }

    /// Runs the ops of `pass` over the `rows` of `st` (`tokens`: the rows' input columns for a
    /// temporal pass, their previous tokens for a Depformer step). Allocates nothing.
    fn run_pass(
        &self,
        pass: &Pass,
        st: &mut LmState,
        rows: &[usize],
        tokens: &[u32],
        pool: &Pool,
    ) -> Result<(), LmError> {
        let (s, w, n) = (&self.spec, &self.w, rows.len());
        // The stack's work buffers, logits and KV rings (`per_row` layers per row, row-major).
        let (work, logits, kv, per_row) = match pass.stack {
            Stack::Temporal => (
                &mut st.temporal,
                &mut st.text_logits,
                &mut st.kv,
                s.num_layers,
            ),
            Stack::Depformer => (
                &mut st.dep,
                &mut st.dep_logits,
                &mut st.dep_kv,
                s.dep_layers,
            ),
        };
        let out = &mut st.tout;
        let mut bufs = PassBufs { work, out, logits };
        let width = |b: Buf| pass.width(b, s);
        for op in &pass.ops {
            match *op {
                Op::Zero { to } => bufs.get(to)[..n * width(to)].fill(0.0),
                Op::Embed { table, token, to } => {
                    let (table, d) = (table.of(w), width(to));
                    let mut x = std::mem::take(bufs.get(to));
                    let row = &mut bufs.work.row;
                    let r = (0..n).try_for_each(|b| {
                        let (t, stream) = match token {
                            Token::Input(i) => (tokens[b * s.num_streams() + i], i),
                            Token::Previous(k) => (tokens[b], k),
                        };
                        add_embedding(table, t, stream, &mut x[b * d..(b + 1) * d], row)
                    });
                    *bufs.get(to) = x;
                    r?;
                }
                Op::RmsNorm { weight, from, to } => {
                    let (v, d) = (weight.of(w), width(from));
                    bufs.pair(from, to, |x, y| rms_norm_rows(x, v, s.eps, d, n, y));
                }
                Op::MatMul { weight, from, to } => {
                    let m = weight.of(w);
                    bufs.pair(from, to, |x, y| pool.matmul(m, x, n, y));
                }
                Op::Attend { layer, at } => {
                    let d = width(Buf::Attn);
                    bufs.pair(Buf::Qkv, Buf::Attn, |qkv, att| {
                        let rows_qkv = qkv.chunks_exact_mut(3 * d).zip(att.chunks_exact_mut(d));
                        for (b, (qkv, out)) in rows_qkv.take(n).enumerate() {
                            let row = rows[b];
                            let ring = &mut kv[row * per_row + layer];
                            if at == AttendAt::Rotary {
                                // q and k are adjacent: one call rotates both with one set of
                                // angles.
                                let (heads, pos) = (2 * s.num_heads, st.pos[row]);
                                let qk = &mut qkv[..2 * d];
                                ops::rope_interleaved(qk, heads, s.head_dim, pos, s.max_period);
                            } else if at == AttendAt::Step(0) {
                                ring.reset();
                            }
                            let (q, kvp) = qkv.split_at_mut(d);
                            let (k, v) = kvp.split_at_mut(d);
                            ring.push(k, v);
                            match at {
                                // Heads split over the pool (bit-identical to `attend`;
                                // single-threaded below 16 entries). Its per-thread score scratch
                                // grows once, at the first call with >= 16 entries for a given
                                // thread count.
                                AttendAt::Rotary => ring.attend_pool(q, out, s.context, pool),
                                // Slot k of a ring emptied at step 0: the k-th push.
                                AttendAt::Step(_) => ring.attend(q, out, s.dep_q),
                            }
                        }
                    });
                }
                Op::SiluGate { from, to } => {
                    let h = width(to);
                    bufs.pair(from, to, |g, u| {
                        for (g, u) in g.chunks_exact(2 * h).zip(u.chunks_exact_mut(h)).take(n) {
                            ops::silu_gate(g, u);
                        }
                    });
                }
                Op::AddInto { from, to } => {
                    let d = width(to);
                    bufs.pair(from, to, |a, x| ops::add(&mut x[..n * d], &a[..n * d]));
                }
            }
        }
        Ok(())
    }
}
