//! SEANet encoder and decoder (`moshi/modules/seanet.py`), causal, ELU, identity skips.

use super::conv::{Conv1d, ConvState, ConvTr1d, ConvTrState, ConvWork};
use kernels::Pool;

/// Residual unit: `y = x + conv_1(ELU(conv_k(ELU(x))))`.
#[derive(Debug)]
pub(crate) struct ResBlock {
    pub c1: Conv1d,
    pub c2: Conv1d,
}

#[derive(Debug)]
struct ResState {
    s1: ConvState,
    s2: ConvState,
}

impl ResBlock {
    fn state(&self, t: usize, work: &mut ConvWork) -> ResState {
        work.fit_conv(&self.c1, t);
        work.fit_conv(&self.c2, t);
        ResState {
            s1: self.c1.state(t),
            s2: self.c2.state(t),
        }
    }

    /// In place on `a` (`[dim, t]`), using `h` (`[hidden, t]`) and `r` (`[dim, t]`) as scratch.
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        st: &mut ResState,
        work: &mut ConvWork,
        a: &mut [f32],
        t: usize,
        h: &mut [f32],
        r: &mut [f32],
        pool: Option<&Pool>,
    ) {
        let dim = self.c1.cin;
        let hid = self.c1.cout;
        self.c1.forward(
            &mut st.s1,
            work,
            &a[..dim * t],
            t,
            true,
            &mut h[..hid * t],
            pool,
        );
        self.c2.forward(
            &mut st.s2,
            work,
            &h[..hid * t],
            t,
            true,
            &mut r[..dim * t],
            pool,
        );
        for (x, y) in a[..dim * t].iter_mut().zip(&r[..dim * t]) {
            *x += *y;
        }
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

/// Streaming state of the encoder for chunks of at most `max_t` samples.
#[derive(Debug)]
pub(crate) struct SeanetEncState {
    conv0: ConvState,
    stages: Vec<(Vec<ResState>, ConvState)>,
    last: ConvState,
    work: ConvWork,
    a: Vec<f32>,
    b: Vec<f32>,
    h: Vec<f32>,
    r: Vec<f32>,
}

/// Streaming state of the decoder for chunks of at most `max_t` latent frames.
#[derive(Debug)]
pub(crate) struct SeanetDecState {
    conv0: ConvState,
    stages: Vec<(ConvTrState, Vec<ResState>)>,
    last: ConvState,
    work: ConvWork,
    a: Vec<f32>,
    b: Vec<f32>,
    h: Vec<f32>,
    r: Vec<f32>,
}

impl SeanetEncoder {
    /// A fresh state for chunks of at most `max_t` samples (a multiple of the hop).
    pub fn state(&self, max_t: usize) -> SeanetEncState {
        let mut t = max_t;
        let mut amax = self.conv0.cout * t;
        let mut hmax = 0;
        let mut stages = Vec::new();
        let mut work = ConvWork::default();
        work.fit_conv(&self.conv0, max_t);
        for (res, down) in &self.stages {
            let rs: Vec<ResState> = res.iter().map(|r| r.state(t, &mut work)).collect();
            for r in res {
                hmax = hmax.max(r.c1.cout * t);
            }
            work.fit_conv(down, t);
            let ds = down.state(t);
            t /= down.stride;
            amax = amax.max(down.cout * t);
            stages.push((rs, ds));
        }
        work.fit_conv(&self.last, t);
        SeanetEncState {
            conv0: self.conv0.state(max_t),
            stages,
            last: self.last.state(t),
            work,
            a: vec![0.0; amax],
            b: vec![0.0; amax],
            h: vec![0.0; hmax],
            r: vec![0.0; amax],
        }
    }

    /// `x` `[1, t]` samples → `out` `[dim, t / hop]`.
    pub fn forward(
        &self,
        st: &mut SeanetEncState,
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
        let mut t = t;
        self.conv0.forward(conv0, work, x, t, false, a, pool);
        for ((res, down), (rs, ds)) in self.stages.iter().zip(stages.iter_mut()) {
            for (blk, bs) in res.iter().zip(rs.iter_mut()) {
                blk.forward(bs, work, a, t, h, r, pool);
            }
            let cin = down.cin;
            down.forward(ds, work, &a[..cin * t], t, true, b, pool);
            t /= down.stride;
            std::mem::swap(a, b);
        }
        let cin = self.last.cin;
        self.last
            .forward(last, work, &a[..cin * t], t, true, out, pool);
    }
}

impl SeanetEncState {
    /// Back to the fresh state.
    pub fn reset(&mut self) {
        self.conv0.reset();
        for (rs, ds) in &mut self.stages {
            for r in rs {
                r.s1.reset();
                r.s2.reset();
            }
            ds.reset();
        }
        self.last.reset();
    }
}

impl SeanetDecoder {
    /// A fresh state for chunks of at most `max_t` latent frames (encoder rate).
    pub fn state(&self, max_t: usize) -> SeanetDecState {
        let mut t = max_t;
        let mut amax = self.conv0.cout * t;
        let mut hmax = 0;
        let mut stages = Vec::new();
        let mut work = ConvWork::default();
        work.fit_conv(&self.conv0, max_t);
        for (up, res) in &self.stages {
            work.fit_tr(up, t);
            let us = up.state(t);
            t *= up.stride;
            amax = amax.max(up.cout * t);
            let rs: Vec<ResState> = res.iter().map(|r| r.state(t, &mut work)).collect();
            for r in res {
                hmax = hmax.max(r.c1.cout * t);
            }
            stages.push((us, rs));
        }
        work.fit_conv(&self.last, t);
        SeanetDecState {
            conv0: self.conv0.state(max_t),
            stages,
            last: self.last.state(t),
            work,
            a: vec![0.0; amax],
            b: vec![0.0; amax],
            h: vec![0.0; hmax],
            r: vec![0.0; amax],
        }
    }

    /// `z` `[dim, t]` → `out` `[1, t * hop]`.
    pub fn forward(
        &self,
        st: &mut SeanetDecState,
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
        let mut t = t;
        self.conv0.forward(conv0, work, z, t, false, a, pool);
        for ((up, res), (us, rs)) in self.stages.iter().zip(stages.iter_mut()) {
            let cin = up.cin;
            up.forward(us, work, &a[..cin * t], t, true, b, pool);
            t *= up.stride;
            std::mem::swap(a, b);
            for (blk, bs) in res.iter().zip(rs.iter_mut()) {
                blk.forward(bs, work, a, t, h, r, pool);
            }
        }
        let cin = self.last.cin;
        self.last
            .forward(last, work, &a[..cin * t], t, true, out, pool);
    }
}

impl SeanetDecState {
    /// Back to the fresh state.
    pub fn reset(&mut self) {
        self.conv0.reset();
        for (us, rs) in &mut self.stages {
            us.reset();
            for r in rs {
                r.s1.reset();
                r.s2.reset();
            }
        }
        self.last.reset();
    }
}
