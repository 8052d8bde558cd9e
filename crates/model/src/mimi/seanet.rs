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
struct ResState {
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
        self.c1.forward(
            &mut st.s1,
            active,
            work,
            &a[..dim * mt],
            t,
            true,
            &mut h[..hid * mt],
            pool,
        );
        self.c2.forward(
            &mut st.s2,
            active,
            work,
            &h[..hid * mt],
            t,
            true,
            &mut r[..dim * mt],
            pool,
        );
        for (x, y) in a[..dim * mt].iter_mut().zip(&r[..dim * mt]) {
            *x += *y;
        }
    }

    fn reset(st: &mut ResState, i: usize) {
        st.s1[i].reset();
        st.s2[i].reset();
    }
}

/// Encoder: conv0, then per ratio (reversed) residual blocks + ELU + strided conv, then
/// ELU + last conv.
#[derive(Debug)]
pub(crate) struct SeanetEncoder {
    pub conv0: Conv1d,
    pub stages: Vec<(Vec<ResBlock>, Conv1d)>,
    pub last: Conv1d,
}

/// Decoder: conv0, then per ratio ELU + transposed conv + residual blocks, then ELU + last conv.
#[derive(Debug)]
pub(crate) struct SeanetDecoder {
    pub conv0: Conv1d,
    pub stages: Vec<(ConvTr1d, Vec<ResBlock>)>,
    pub last: Conv1d,
}

/// Streaming state of the encoder's streams for chunks of at most `max_t` samples each.
#[derive(Debug)]
pub(crate) struct SeanetEncState {
    conv0: Vec<ConvState>,
    stages: Vec<(Vec<ResState>, Vec<ConvState>)>,
    last: Vec<ConvState>,
    work: ConvWork,
    a: Vec<f32>,
    b: Vec<f32>,
    h: Vec<f32>,
    r: Vec<f32>,
}

/// Streaming state of the decoder's streams for chunks of at most `max_t` latent frames each.
#[derive(Debug)]
pub(crate) struct SeanetDecState {
    conv0: Vec<ConvState>,
    stages: Vec<(Vec<ConvTrState>, Vec<ResState>)>,
    last: Vec<ConvState>,
    work: ConvWork,
    a: Vec<f32>,
    b: Vec<f32>,
    h: Vec<f32>,
    r: Vec<f32>,
}

impl SeanetEncoder {
    /// Fresh states of `streams` streams for chunks of at most `max_t` samples (a multiple of
    /// the hop).
    pub fn state(&self, max_t: usize, streams: usize) -> SeanetEncState {
        let mut t = max_t;
        let mut amax = self.conv0.cout * t;
        let mut hmax = 0;
        let mut stages = Vec::new();
        let mut work = ConvWork::default();
        let conv0 = conv_states(&self.conv0, max_t, streams, &mut work);
        for (res, down) in &self.stages {
            let rs: Vec<ResState> = res.iter().map(|r| r.state(t, streams, &mut work)).collect();
            for r in res {
                hmax = hmax.max(r.c1.cout * t);
            }
            let ds = conv_states(down, t, streams, &mut work);
            t /= down.stride;
            amax = amax.max(down.cout * t);
            stages.push((rs, ds));
        }
        let last = conv_states(&self.last, t, streams, &mut work);
        SeanetEncState {
            conv0,
            stages,
            last,
            work,
            a: vec![0.0; amax * streams],
            b: vec![0.0; amax * streams],
            h: vec![0.0; hmax * streams],
            r: vec![0.0; amax * streams],
        }
    }

    /// `x` `[1, m·t]` samples (stream j's `t` at `j·t`) → `out` `[dim, m·(t / hop)]`.
    pub fn forward(
        &self,
        st: &mut SeanetEncState,
        active: &[usize],
        x: &[f32],
        t: usize,
        out: &mut [f32],
        pool: Option<&Pool>,
    ) {
        let SeanetEncState {
            conv0,
            stages,
            last,
            work,
            a,
            b,
            h,
            r,
        } = st;
        let m = active.len();
        let mut t = t;
        self.conv0
            .forward(conv0, active, work, x, t, false, a, pool);
        for ((res, down), (rs, ds)) in self.stages.iter().zip(stages.iter_mut()) {
            for (blk, bs) in res.iter().zip(rs.iter_mut()) {
                blk.forward(bs, active, work, a, t, h, r, pool);
            }
            let cin = down.cin;
            down.forward(ds, active, work, &a[..cin * m * t], t, true, b, pool);
            t /= down.stride;
            std::mem::swap(a, b);
        }
        let cin = self.last.cin;
        self.last
            .forward(last, active, work, &a[..cin * m * t], t, true, out, pool);
    }
}

impl SeanetEncState {
    /// Stream `i` back to the fresh state.
    pub fn reset(&mut self, i: usize) {
        self.conv0[i].reset();
        for (rs, ds) in &mut self.stages {
            for r in rs {
                ResBlock::reset(r, i);
            }
            ds[i].reset();
        }
        self.last[i].reset();
    }
}

impl SeanetDecoder {
    /// Fresh states of `streams` streams for chunks of at most `max_t` latent frames
    /// (encoder rate).
    pub fn state(&self, max_t: usize, streams: usize) -> SeanetDecState {
        let mut t = max_t;
        let mut amax = self.conv0.cout * t;
        let mut hmax = 0;
        let mut stages = Vec::new();
        let mut work = ConvWork::default();
        let conv0 = conv_states(&self.conv0, max_t, streams, &mut work);
        for (up, res) in &self.stages {
            work.fit_tr(up, t, streams);
            let us = (0..streams).map(|_| up.state(t)).collect();
            t *= up.stride;
            amax = amax.max(up.cout * t);
            let rs: Vec<ResState> = res.iter().map(|r| r.state(t, streams, &mut work)).collect();
            for r in res {
                hmax = hmax.max(r.c1.cout * t);
            }
            stages.push((us, rs));
        }
        let last = conv_states(&self.last, t, streams, &mut work);
        SeanetDecState {
            conv0,
            stages,
            last,
            work,
            a: vec![0.0; amax * streams],
            b: vec![0.0; amax * streams],
            h: vec![0.0; hmax * streams],
            r: vec![0.0; amax * streams],
        }
    }

    /// `z` `[dim, m·t]` → `out` `[1, m·t·hop]` (stream j's samples at `j·t·hop`).
    pub fn forward(
        &self,
        st: &mut SeanetDecState,
        active: &[usize],
        z: &[f32],
        t: usize,
        out: &mut [f32],
        pool: Option<&Pool>,
    ) {
        let SeanetDecState {
            conv0,
            stages,
            last,
            work,
            a,
            b,
            h,
            r,
        } = st;
        let m = active.len();
        let mut t = t;
        self.conv0
            .forward(conv0, active, work, z, t, false, a, pool);
        for ((up, res), (us, rs)) in self.stages.iter().zip(stages.iter_mut()) {
            let cin = up.cin;
            up.forward(us, active, work, &a[..cin * m * t], t, true, b, pool);
            t *= up.stride;
            std::mem::swap(a, b);
            for (blk, bs) in res.iter().zip(rs.iter_mut()) {
                blk.forward(bs, active, work, a, t, h, r, pool);
            }
        }
        let cin = self.last.cin;
        self.last
            .forward(last, active, work, &a[..cin * m * t], t, true, out, pool);
    }
}

impl SeanetDecState {
    /// Stream `i` back to the fresh state.
    pub fn reset(&mut self, i: usize) {
        self.conv0[i].reset();
        for (us, rs) in &mut self.stages {
            us[i].reset();
            for r in rs {
                ResBlock::reset(r, i);
            }
        }
        self.last[i].reset();
    }
}
