//! SEANet encoder and decoder (`moshi/modules/seanet.py`), causal, ELU, identity skips.
//!
//! A call runs the streams listed in `active`. A stack has two parts ([`CHAIN_MIN`]): the
//! high-rate stages (the encoder's first, the decoder's last), which each stream runs on its
//! own as one chain of layers with its own states and buffers, and the low-rate stages, which
//! run all the streams together, their activations side by side (`[C, m·T]`, see `conv.rs`),
//! with one [`ConvState`] per stream and layer and the work buffers of one call for all of
//! them. One stream is the plain streaming case of both.

use super::conv::{Conv1d, ConvState, ConvTr1d, ConvTrState, ConvWork, SyncPtr};
use kernels::conv::Workspace;
use kernels::Pool;

/// Residual unit: `y = x + conv_1(ELU(conv_k(ELU(x))))`.
#[derive(Debug)]
pub(crate) struct ResBlock {
    pub c1: Conv1d,
    pub c2: Conv1d,
}

/// Per-stream states of one residual unit.
#[derive(Debug)]
pub(crate) struct ResState {
    s1: Vec<ConvState>,
    s2: Vec<ConvState>,
}

/// `streams` fresh states of `conv` for calls of at most `t` samples, with `work` fitted.
fn conv_states(conv: &Conv1d, t: usize, streams: usize, work: &mut ConvWork) -> Vec<ConvState> {
    work.fit_conv(conv, t, streams);
    (0..streams).map(|_| conv.state(t)).collect()
}

impl ResBlock {
    fn state(&self, t: usize, streams: usize, work: &mut ConvWork) -> ResState {
        ResState {
            s1: conv_states(&self.c1, t, streams, work),
            s2: conv_states(&self.c2, t, streams, work),
        }
    }

    /// In place on `a` (`[dim, m·t]`), using `h` (`[hidden, m·t]`) and `r` (`[dim, m·t]`) as
    /// scratch.
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        st: &mut ResState,
        active: &[usize],
        work: &mut ConvWork,
        a: &mut [f32],
        t: usize,
        h: &mut [f32],
        r: &mut [f32],
        pool: Option<&Pool>,
    ) {
        let mt = active.len() * t;
        let dim = self.c1.cin;
        let hid = self.c1.cout;
        let (a, h, r) = (&mut a[..dim * mt], &mut h[..hid * mt], &mut r[..dim * mt]);
        self.c1
            .forward(&mut st.s1, active, work, a, t, true, h, pool);
        self.c2
            .forward(&mut st.s2, active, work, h, t, true, r, pool);
        for (x, y) in a.iter_mut().zip(r.iter()) {
            *x += *y;
        }
    }

    fn reset(st: &mut ResState, i: usize) {
        st.s1[i].reset();
        st.s2[i].reset();
    }
}
/// A SEANet stack: conv0, the stages (one per ratio), last conv. `S` is one stage: the
/// encoder's residual blocks + strided conv, or the decoder's transposed conv + residual blocks.
#[derive(Debug)]
pub(crate) struct Seanet<S> {
    pub conv0: Conv1d,
    pub stages: Vec<S>,
    pub last: Conv1d,
}

/// Encoder: conv0, then per ratio (reversed) residual blocks + ELU + strided conv, then
/// ELU + last conv.
pub(crate) type SeanetEncoder = Seanet<(Vec<ResBlock>, Conv1d)>;

/// Decoder: conv0, then per ratio ELU + transposed conv + residual blocks, then ELU + last conv.
pub(crate) type SeanetDecoder = Seanet<(ConvTr1d, Vec<ResBlock>)>;

/// Above this many activation values per stream (a stage's largest), a stage belongs to the
/// stack's high-rate chain, which each stream runs on its own.
///
/// Several streams run layer by layer through the high-rate stages hold megabytes of
/// activations per layer (4 streams of a 1920-sample layer: ~2 MB in, ~1 MB out), and on a pool
/// every layer hands each stream's data from core to core. Run as a chain, one stream through
/// all its high-rate layers, on a pool whole streams go to the threads: one dispatch for the
/// chain, each stream's data in one core. Measured for 4 slots on 2 threads: the SEANets cost
/// 2.35–2.45× one slot's instead of 2.65–2.96× (`docs/bench-log.md`); on one thread the order makes
/// no measurable difference. Their weights are small and stay in cache, so nothing is lost by
/// not sharing them. The low-rate stages, whose weights outweigh their activations, keep
/// running all streams together (each weight read once).
const CHAIN_MIN: usize = 32 * 1024;

/// The states and work buffers of some of a stack's layers: conv0 (when the part has it), the
/// stages of its range, last (when it has it), for some number of streams.
#[derive(Debug)]
struct PartState<S: SeanetStage> {
    conv0: Vec<ConvState>,
    stages: Vec<S::State>,
    last: Vec<ConvState>,
    scratch: Scratch,
}

/// Streaming state of a stack's streams for chunks of at most `max_t` input frames each.
#[derive(Debug)]
pub(crate) struct SeanetState<S: SeanetStage> {
    /// The stages that run all active streams at once (layer-major states of every stream).
    joined: PartState<S>,
    /// The high-rate chain ([`CHAIN_MIN`]): per stream, the one-stream states of its layers.
    chains: Vec<Chain<S>>,
    /// The convolutions' scratch of the chains run on a pool, one per place in a call, so that
    /// whichever thread runs a chain finds its scratch grown (see `Seanet::each_chain`).
    workspaces: Vec<Workspace>,
    /// The stages of the chain: `0..split` for the encoder, `split..` for the decoder.
    split: usize,
}

/// What [`Seanet::each_chain`] runs for one stream: `(its chain, its place j in the call, the
/// pool the chain may use)`.
type ChainFn<'a, S> = dyn Fn(&mut Chain<S>, usize, Option<&Pool>) + Sync + 'a;

/// One stream's high-rate chain: its layers' states and its activations.
#[derive(Debug)]
struct Chain<S: SeanetStage> {
    part: PartState<S>,
    /// The chain's input (encoder) or output (decoder), `[C, t]`.
    io: Vec<f32>,
}

/// Streaming state of the encoder's streams for chunks of at most `max_t` samples each.
pub(crate) type SeanetEncState = SeanetState<(Vec<ResBlock>, Conv1d)>;

/// Streaming state of the decoder's streams for chunks of at most `max_t` latent frames each.
pub(crate) type SeanetDecState = SeanetState<(ConvTr1d, Vec<ResBlock>)>;

/// Work buffers of one call: `a`/`b` the activations (ping-pong), `h`/`r` a residual unit's
/// scratch.
#[derive(Debug)]
pub(crate) struct Scratch {
    work: ConvWork,
    a: Vec<f32>,
    b: Vec<f32>,
    h: Vec<f32>,
    r: Vec<f32>,
}

/// Walks a stack while the states of a part are built: the frame count `t` at the current stage
/// and the largest activation (`amax`) and residual hidden (`hmax`) sizes seen so far.
pub(crate) struct Sizer {
    t: usize,
    streams: usize,
    amax: usize,
    hmax: usize,
    work: ConvWork,
}

impl Sizer {
    fn new(t: usize, streams: usize) -> Self {
        Sizer {
            t,
            streams,
            amax: 0,
            hmax: 0,
            work: ConvWork::default(),
        }
    }

    fn conv(&mut self, conv: &Conv1d) -> Vec<ConvState> {
        self.amax = self.amax.max(conv.cin * self.t);
        conv_states(conv, self.t, self.streams, &mut self.work)
    }

    fn res(&mut self, res: &[ResBlock]) -> Vec<ResState> {
        for r in res {
            self.hmax = self.hmax.max(r.c1.cout * self.t);
            self.amax = self.amax.max(r.c1.cin * self.t);
        }
        res.iter()
            .map(|r| r.state(self.t, self.streams, &mut self.work))
            .collect()
    }

    /// The frame count becomes `t`, with `cout` channels after the resampling conv.
    fn resampled(&mut self, t: usize, cout: usize) {
        self.t = t;
        self.amax = self.amax.max(cout * t);
    }

    /// The work buffers for the part walked, for `self.streams` streams.
    fn scratch(self) -> Scratch {
        let n = self.streams;
        Scratch {
            work: self.work,
            a: vec![0.0; self.amax * n],
            b: vec![0.0; self.amax * n],
            h: vec![0.0; self.hmax * n],
            r: vec![0.0; self.amax * n],
        }
    }
}

/// One stage of a stack (the encoder's and the decoder's differ in order and resampling).
pub(crate) trait SeanetStage: Sync {
    /// Per-stream states of the stage.
    type State: std::fmt::Debug + Send;
    /// Whether the high rate is at the start of the stack (the encoder) or at its end.
    const HIGH_RATE_FIRST: bool;
    /// Channels in and out.
    fn channels(&self) -> (usize, usize);
    fn state(&self, z: &mut Sizer) -> Self::State;
    /// Frame count after the stage for `t` frames in.
    fn out_t(&self, t: usize) -> usize;
    /// The stage's largest activation of one stream, for `t` frames in.
    fn values(&self, t: usize) -> usize;
    /// Runs the stage on `s.a` (`t` frames per stream), leaving its output in `s.a`; returns the
    /// new frame count.
    fn forward(&self, st: &mut Self::State, c: Call<'_>, s: &mut Scratch, t: usize) -> usize;
    fn reset(st: &mut Self::State, i: usize);
}

/// The streams one call runs (`active`) and the pool that splits its products.
#[derive(Clone, Copy)]
pub(crate) struct Call<'a> {
    active: &'a [usize],
    pool: Option<&'a Pool>,
}

/// Residual blocks on `s.a` in place.
fn res_forward(res: &[ResBlock], rs: &mut [ResState], c: Call<'_>, s: &mut Scratch, t: usize) {
    let Scratch { work, a, h, r, .. } = s;
    for (blk, bs) in res.iter().zip(rs.iter_mut()) {
        blk.forward(bs, c.active, work, a, t, h, r, c.pool);
    }
}

fn res_reset(rs: &mut [ResState], i: usize) {
    for r in rs {
        ResBlock::reset(r, i);
    }
}

impl SeanetStage for (Vec<ResBlock>, Conv1d) {
    type State = (Vec<ResState>, Vec<ConvState>);
    const HIGH_RATE_FIRST: bool = true;

    fn state(&self, z: &mut Sizer) -> Self::State {
        let (res, down) = self;
        let rs = z.res(res);
        let ds = z.conv(down);
        z.resampled(z.t / down.stride, down.cout);
        (rs, ds)
    }

    fn channels(&self) -> (usize, usize) {
        (self.1.cin, self.1.cout)
    }

    fn out_t(&self, t: usize) -> usize {
        t / self.1.stride
    }

    fn values(&self, t: usize) -> usize {
        self.1.cin * t
    }

    fn forward(&self, st: &mut Self::State, c: Call<'_>, s: &mut Scratch, t: usize) -> usize {
        let ((res, down), (rs, ds)) = (self, st);
        res_forward(res, rs, c, s, t);
        let x = &s.a[..down.cin * c.active.len() * t];
        down.forward(ds, c.active, &mut s.work, x, t, true, &mut s.b, c.pool);
        std::mem::swap(&mut s.a, &mut s.b);
        t / down.stride
    }

    fn reset((rs, ds): &mut Self::State, i: usize) {
        res_reset(rs, i);
        ds[i].reset();
    }
}

impl SeanetStage for (ConvTr1d, Vec<ResBlock>) {
    type State = (Vec<ConvTrState>, Vec<ResState>);
    const HIGH_RATE_FIRST: bool = false;

    fn state(&self, z: &mut Sizer) -> Self::State {
        let (up, res) = self;
        z.work.fit_tr(up, z.t, z.streams);
        z.amax = z.amax.max(up.cin * z.t);
        let us = (0..z.streams).map(|_| up.state(z.t)).collect();
        z.resampled(z.t * up.stride, up.cout);
        (us, z.res(res))
    }

    fn channels(&self) -> (usize, usize) {
        (self.0.cin, self.0.cout)
    }

    fn out_t(&self, t: usize) -> usize {
        t * self.0.stride
    }

    fn values(&self, t: usize) -> usize {
        self.0.cout * t * self.0.stride
    }

    fn forward(&self, st: &mut Self::State, c: Call<'_>, s: &mut Scratch, t: usize) -> usize {
        let ((up, res), (us, rs)) = (self, st);
        let x = &s.a[..up.cin * c.active.len() * t];
        up.forward(us, c.active, &mut s.work, x, t, true, &mut s.b, c.pool);
        std::mem::swap(&mut s.a, &mut s.b);
        let t = t * up.stride;
        res_forward(res, rs, c, s, t);
        t
    }

    fn reset((us, rs): &mut Self::State, i: usize) {
        us[i].reset();
        res_reset(rs, i);
    }
}

/// Copies stream `j`'s columns of `joined` (`[c, m·t]`, its `t` columns at `j·t`) into `dst`
/// (`[c, t]`).
fn gather_stream(joined: &[f32], dst: &mut [f32], (c, m, t, j): (usize, usize, usize, usize)) {
    for (ch, d) in dst[..c * t].chunks_exact_mut(t).enumerate() {
        d.copy_from_slice(&joined[(ch * m + j) * t..(ch * m + j + 1) * t]);
    }
}

/// Copies `src` (`[c, t]`) into stream `j`'s columns of `joined` (`[c, m·t]`).
///
/// # Safety
/// `joined` is valid for `c·m·t` values and nobody else touches stream `j`'s columns meanwhile.
unsafe fn scatter_stream(
    src: &[f32],
    joined: *mut f32,
    (c, m, t, j): (usize, usize, usize, usize),
) {
    for (ch, s) in src[..c * t].chunks_exact(t).enumerate() {
        // SAFETY: row ch's stream-j span, inside the caller's bound.
        let d = unsafe { std::slice::from_raw_parts_mut(joined.add((ch * m + j) * t), t) };
        d.copy_from_slice(s);
    }
}

impl<S: SeanetStage> Seanet<S> {
    /// Fresh states of `streams` streams for chunks of at most `max_t` input frames (for the
    /// encoder samples, a multiple of the hop; for the decoder latent frames at the encoder rate).
    pub fn state(&self, max_t: usize, streams: usize) -> SeanetState<S> {
        // Frames in of every stage, and where the high-rate chain ends (encoder) or starts
        // (decoder).
        let mut ts = Vec::with_capacity(self.stages.len());
        let mut t = max_t;
        for s in &self.stages {
            ts.push(t);
            t = s.out_t(t);
        }
        ts.push(t);
        let high = |i: usize| self.stages[i].values(ts[i]) >= CHAIN_MIN;
        let n = self.stages.len();
        let split = if S::HIGH_RATE_FIRST {
            (0..n).find(|&i| !high(i)).unwrap_or(n)
        } else {
            (0..n).rev().find(|&i| !high(i)).map_or(0, |i| i + 1)
        };
        let (chain, joined) = if S::HIGH_RATE_FIRST {
            (0..split, split..n)
        } else {
            (split..n, 0..split)
        };
        let (chain_has_conv0, chain_has_last) = (S::HIGH_RATE_FIRST, !S::HIGH_RATE_FIRST);
        let chains = (0..streams)
            .map(|_| {
                let part = self.part_state(&ts, chain.clone(), chain_has_conv0, chain_has_last, 1);
                let io_len = if S::HIGH_RATE_FIRST {
                    self.conv0.cin * max_t
                } else {
                    self.last.cout * t
                };
                Chain {
                    part,
                    io: vec![0.0; io_len],
                }
            })
            .collect();
        SeanetState {
            joined: self.part_state(&ts, joined, !chain_has_conv0, !chain_has_last, streams),
            chains,
            workspaces: (0..streams).map(|_| Workspace::new()).collect(),
            split,
        }
    }

    /// States and work buffers of conv0 (`conv0`), the stages `range` and last (`last`), for
    /// `streams` streams; `ts[i]` is the frame count into stage i (into conv0 for i = 0, into
    /// last for i = the number of stages).
    fn part_state(
        &self,
        ts: &[usize],
        range: std::ops::Range<usize>,
        conv0: bool,
        last: bool,
        streams: usize,
    ) -> PartState<S> {
        let mut z = Sizer::new(ts[range.start], streams);
        // The part's input: conv0's output, or the activations the part starts from.
        let cin = match self.stages.get(range.start) {
            _ if conv0 => self.conv0.cout,
            Some(s) => s.channels().0,
            None => self.last.cin,
        };
        z.amax = cin * z.t;
        let c0 = if conv0 {
            z.conv(&self.conv0)
        } else {
            Vec::new()
        };
        let mut stages = Vec::with_capacity(range.len());
        for i in range.clone() {
            z.t = ts[i];
            stages.push(self.stages[i].state(&mut z));
        }
        z.t = ts[range.end];
        let l = if last { z.conv(&self.last) } else { Vec::new() };
        PartState {
            conv0: c0,
            stages,
            last: l,
            scratch: z.scratch(),
        }
    }

    /// Runs a part for the streams `active`: conv0 on `x` when the part has it (else its input is
    /// in `s.a`), the stages from `first` on (`t` frames in per stream), last into `out` when the
    /// part has it (else the output stays in `s.a`). Returns the frame count out.
    #[allow(clippy::too_many_arguments)]
    fn run_part(
        &self,
        ps: &mut PartState<S>,
        first: usize,
        active: &[usize],
        x: Option<&[f32]>,
        mut t: usize,
        out: Option<&mut [f32]>,
        pool: Option<&Pool>,
    ) -> usize {
        let s = &mut ps.scratch;
        let m = active.len();
        if let Some(x) = x {
            let x = &x[..self.conv0.cin * m * t];
            self.conv0.forward(
                &mut ps.conv0,
                active,
                &mut s.work,
                x,
                t,
                false,
                &mut s.a,
                pool,
            );
        }
        let c = Call { active, pool };
        for (stage, ss) in self.stages[first..].iter().zip(ps.stages.iter_mut()) {
            t = stage.forward(ss, c, s, t);
        }
        if let Some(out) = out {
            let x = &s.a[..self.last.cin * m * t];
            self.last
                .forward(&mut ps.last, active, &mut s.work, x, t, true, out, pool);
        }
        t
    }

    /// `x` `[cin, m·t]` (stream j's `t` frames at `j·t`) → `out` `[cout, m·t']`: for the encoder
    /// samples → latents (`t' = t / hop`), for the decoder latents → samples (`t' = t·hop`).
    pub fn forward(
        &self,
        st: &mut SeanetState<S>,
        active: &[usize],
        x: &[f32],
        t: usize,
        out: &mut [f32],
        pool: Option<&Pool>,
    ) {
        let m = active.len();
        if m == 0 {
            return;
        }
        let SeanetState {
            joined,
            chains,
            workspaces,
            split,
        } = st;
        let chains = (&mut chains[..], &mut workspaces[..]);
        let split = *split;
        if S::HIGH_RATE_FIRST {
            // Each stream's chain from its samples to its columns of the joined activations.
            let c = split
                .checked_sub(1)
                .map_or(self.conv0.cout, |i| self.stages[i].channels().1);
            let cin = self.conv0.cin;
            let ja = SyncPtr(joined.scratch.a.as_mut_ptr());
            let t_mid = self.stages[..split].iter().fold(t, |t, s| s.out_t(t));
            self.each_chain(chains, active, pool, &|ch, j, pool| {
                let ja = &ja;
                let Chain { part, io, .. } = ch;
                gather_stream(x, io, (cin, m, t, j));
                self.run_part(part, 0, &[0], Some(&io[..cin * t]), t, None, pool);
                // SAFETY: the joined activations hold at least [c, m·t_mid] values (the input of
                // the joined stages); stream j's columns are this task's alone.
                unsafe { scatter_stream(&part.scratch.a, ja.0, (c, m, t_mid, j)) };
            });
            self.run_part(joined, split, active, None, t_mid, Some(out), pool);
        } else {
            let t_mid = self.run_part(joined, 0, active, Some(x), t, None, pool);
            let c = self
                .stages
                .get(split)
                .map_or(self.last.cin, |s| s.channels().0);
            let cout = self.last.cout;
            let ja: &[f32] = &joined.scratch.a;
            let op = SyncPtr(out.as_mut_ptr());
            self.each_chain(chains, active, pool, &|ch, j, pool| {
                let op = &op;
                let Chain { part, io, .. } = ch;
                gather_stream(ja, &mut part.scratch.a, (c, m, t_mid, j));
                let to = self.run_part(part, split, &[0], None, t_mid, Some(&mut io[..]), pool);
                // SAFETY: out holds [cout, m·to]; stream j's columns are this task's alone.
                unsafe { scatter_stream(io, op.0, (cout, m, to, j)) };
            });
        }
    }

    /// Runs `f(chain, j, pool)` for every active stream `j` (its chain `chains[active[j]]`).
    ///
    /// A state of several streams on a pool of several threads gives whole streams to the
    /// threads ([`Pool::run_affine`]: a stream's chain on the same core from call to call), each
    /// chain with no pool of its own, inside the workspace of its place `j` in the call. The
    /// choice depends on the state and the pool only, never on how many streams are active: a
    /// call with fewer streams then uses no scratch that the warm-up with all of them did not
    /// grow (one active stream of a batch runs its chain on one thread). Otherwise (one stream,
    /// or no pool) the streams run one after the other, each on the whole pool.
    fn each_chain(
        &self,
        st: (&mut [Chain<S>], &mut [Workspace]),
        active: &[usize],
        pool: Option<&Pool>,
        f: &ChainFn<'_, S>,
    ) {
        let (chains, workspaces) = st;
        let cp = SyncPtr(chains.as_mut_ptr());
        let chain = |j: usize| {
            let cp = &cp;
            debug_assert!(active[..j].iter().all(|&a| a != active[j]));
            // SAFETY: `active` holds distinct indices into `chains`, so chain active[j] is
            // touched by the task of stream j alone.
            unsafe { &mut *cp.0.add(active[j]) }
        };
        match pool {
            Some(p) if p.n_threads() > 1 && chains.len() > 1 => {
                let wp = SyncPtr(workspaces.as_mut_ptr());
                p.run_affine(active.len(), &|j| {
                    let wp = &wp;
                    // SAFETY: one workspace per stream of the state, j < active.len() ≤ that
                    // many, and task j alone uses workspace j.
                    let ws = unsafe { &mut *wp.0.add(j) };
                    ws.enter(|| f(chain(j), j, None));
                });
            }
            _ => (0..active.len()).for_each(|j| f(chain(j), j, pool)),
        }
    }
}

impl<S: SeanetStage> SeanetState<S> {
    /// Stream `i` back to the fresh state.
    pub fn reset(&mut self, i: usize) {
        let j = &mut self.joined;
        if let Some(c) = j.conv0.get_mut(i) {
            c.reset();
        }
        for ss in &mut j.stages {
            S::reset(ss, i);
        }
        if let Some(c) = j.last.get_mut(i) {
            c.reset();
        }
        let ch = &mut self.chains[i].part;
        for c in ch.conv0.iter_mut().chain(ch.last.iter_mut()) {
            c.reset();
        }
        for ss in &mut ch.stages {
            S::reset(ss, 0);
        }
    }
}
