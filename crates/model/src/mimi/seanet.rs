//! SEANet weights (`moshi/modules/seanet.py`): causal convolutions, ELU, residual units with
//! identity skips. The order of the layers is the plan's (`plan.rs`); the CPU runs them in
//! `walk.rs`, which also says how several streams share a call.

use super::conv::{Conv1d, ConvState, ConvTr1d, ConvWork};
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
    /// `streams` fresh states for calls of at most `t` steps, with `work` fitted.
    pub(crate) fn state(&self, t: usize, streams: usize, work: &mut ConvWork) -> ResState {
        ResState {
            s1: conv_states(&self.c1, t, streams, work),
            s2: conv_states(&self.c2, t, streams, work),
        }
    }

    /// In place on `a` (`[dim, m·t]`), using `h` (`[hidden, m·t]`) and `r` (`[dim, m·t]`) as
    /// scratch.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
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

    /// Stream `i` of `st` back to fresh.
    pub(crate) fn reset(st: &mut ResState, i: usize) {
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
