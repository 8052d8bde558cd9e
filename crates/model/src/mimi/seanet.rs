//! SEANet encoder and decoder (`moshi/modules/seanet.py`), causal, ELU, identity skips.
//!
//! The states hold every stream of a batch (one [`ConvState`] per stream and layer) and the
//! work buffers of one call for all of them; a call runs the streams listed in `active`, their
//! activations side by side (`[C, m·T]`, see `conv.rs`).

use super::conv::{Conv1d, ConvState, ConvTr1d, ConvTrState, ConvWork};
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

/// Streaming state of a stack's streams for chunks of at most `max_t` input frames each.
#[derive(Debug)]
pub(crate) struct SeanetState<S: SeanetStage> {
    conv0: Vec<ConvState>,
    stages: Vec<S::State>,
    last: Vec<ConvState>,
    scratch: Scratch,
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

/// Walks a stack while its states are built: the frame count `t` at the current stage and the
/// largest activation (`amax`) and residual hidden (`hmax`) sizes seen so far.
pub(crate) struct Sizer {
    t: usize,
    streams: usize,
    amax: usize,
    hmax: usize,
    work: ConvWork,
}

impl Sizer {
    fn conv(&mut self, conv: &Conv1d) -> Vec<ConvState> {
        conv_states(conv, self.t, self.streams, &mut self.work)
    }

    fn res(&mut self, res: &[ResBlock]) -> Vec<ResState> {
        for r in res {
            self.hmax = self.hmax.max(r.c1.cout * self.t);
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
}

/// One stage of a stack (the encoder's and the decoder's differ in order and resampling).
pub(crate) trait SeanetStage {
    /// Per-stream states of the stage.
    type State: std::fmt::Debug;
    fn state(&self, z: &mut Sizer) -> Self::State;
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

    fn state(&self, z: &mut Sizer) -> Self::State {
        let (res, down) = self;
        let rs = z.res(res);
        let ds = z.conv(down);
        z.resampled(z.t / down.stride, down.cout);
        (rs, ds)
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

    fn state(&self, z: &mut Sizer) -> Self::State {
        let (up, res) = self;
        z.work.fit_tr(up, z.t, z.streams);
        let us = (0..z.streams).map(|_| up.state(z.t)).collect();
        z.resampled(z.t * up.stride, up.cout);
        (us, z.res(res))
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

impl<S: SeanetStage> Seanet<S> {
    /// Fresh states of `streams` streams for chunks of at most `max_t` input frames (for the
    /// encoder samples, a multiple of the hop; for the decoder latent frames at the encoder rate).
    pub fn state(&self, max_t: usize, streams: usize) -> SeanetState<S> {
        let mut z = Sizer {
            t: max_t,
            streams,
            amax: self.conv0.cout * max_t,
            hmax: 0,
            work: ConvWork::default(),
        };
        let conv0 = z.conv(&self.conv0);
        let stages = self.stages.iter().map(|s| s.state(&mut z)).collect();
        let last = z.conv(&self.last);
        SeanetState {
            conv0,
            stages,
            last,
            scratch: Scratch {
                work: z.work,
                a: vec![0.0; z.amax * streams],
                b: vec![0.0; z.amax * streams],
                h: vec![0.0; z.hmax * streams],
                r: vec![0.0; z.amax * streams],
            },
        }
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
        let s = &mut st.scratch;
        let m = active.len();
        let mut t = t;
        self.conv0.forward(
            &mut st.conv0,
            active,
            &mut s.work,
            x,
            t,
            false,
            &mut s.a,
            pool,
        );
        let c = Call { active, pool };
        for (stage, ss) in self.stages.iter().zip(st.stages.iter_mut()) {
            t = stage.forward(ss, c, s, t);
        }
        let x = &s.a[..self.last.cin * m * t];
        self.last
            .forward(&mut st.last, active, &mut s.work, x, t, true, out, pool);
    }
}

impl<S: SeanetStage> SeanetState<S> {
    /// Stream `i` back to the fresh state.
    pub fn reset(&mut self, i: usize) {
        self.conv0[i].reset();
        for ss in &mut self.stages {
            S::reset(ss, i);
        }
        self.last[i].reset();
    }
}
