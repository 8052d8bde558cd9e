//! Causal streaming convolutions (`StreamingConv1d`, `StreamingConvTranspose1d` of `moshi`
//! 0.2.13). Weights live in [`Conv1d`] / [`ConvTr1d`] (shared, immutable); the streaming
//! state lives in [`ConvState`] / [`ConvTrState`], preallocated for a maximum chunk length.
//! The arithmetic runs in the `kernels` crate (blocked GEMM convolution for long chunks,
//! weight-streaming matmul for the few output steps of the 12.5/25 Hz layers).
//!
//! Layout: activations are channel-major `[C, T]` row-major slices.

use kernels::{Matrix, Pool, Scratch};

/// Below this many output steps, a convolution runs as a matmul of the gathered input
/// columns against the weight rows (weights read once for all steps).
const SMALL_N: usize = 16;

/// `y [n, rows] = x [n, cols] · Wᵀ`, on the pool when given.
pub(crate) fn matmul(
    m: &Matrix,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    pool: Option<&Pool>,
    scratch: &mut Scratch,
) {
    match pool {
        Some(p) if p.n_threads() > 1 => p.matmul(m, x, n, y),
        _ => m.matmul(x, n, y, scratch),
    }
}

/// A raw pointer shared by the pool's threads, each writing its own channel rows.
struct SyncPtr(*mut f32);
// SAFETY: users write disjoint regions only (per-channel shares).
unsafe impl Sync for SyncPtr {}
unsafe impl Send for SyncPtr {}

/// Below this many values, per-channel pre-processing runs on the calling thread.
const PAR_MIN: usize = 32 * 1024;

/// Runs `f(c0, c1)` over `0..channels` in shares on the pool when there is enough work
/// (`values` touched in all), else at once on the calling thread.
fn per_channel(
    channels: usize,
    values: usize,
    pool: Option<&Pool>,
    f: &(dyn Fn(usize, usize) + Sync),
) {
    match pool {
        Some(p) if p.n_threads() > 1 && values >= PAR_MIN && channels > 1 => {
            let parts = (2 * p.n_threads()).min(channels);
            p.run(parts, &|i| {
                let (a, b) = (i * channels / parts, (i + 1) * channels / parts);
                f(a, b)
            });
        }
        _ => f(0, channels),
    }
}

/// A causal 1-D convolution: weight `[out, in, k]` (groups = 1), optional bias.
#[derive(Debug)]
pub(crate) struct Conv1d {
    pub cin: usize,
    pub cout: usize,
    pub k: usize,
    pub stride: usize,
    pub dilation: usize,
    pub bias: Option<Vec<f32>>,
    /// `pad_mode = "replicate"`: the first call fills the left context with the first sample.
    pub replicate: bool,
    /// Blocked-GEMM convolution (long chunks).
    packed: kernels::conv::Conv1d,
    /// The weight as a `[cout, cin * k]` matrix (short chunks).
    mat: Matrix,
}

/// Streaming state of one [`Conv1d`]: the last `pad()` input samples per channel, plus
/// the small-chunk work buffers sized for `max_tin` input samples per call.
#[derive(Debug)]
pub(crate) struct ConvState {
    hist: Vec<f32>,
    col: Vec<f32>,
    yt: Vec<f32>,
    scratch: Scratch,
    first: bool,
    max_tin: usize,
}

/// Work buffers shared by all the convolutions of a stack (one call at a time), so the
/// padded-input and ELU buffers stay in cache from layer to layer instead of each layer
/// touching its own cold copy every frame. Sized with [`ConvWork::fit_conv`] /
/// [`ConvWork::fit_tr`] when the states are built; never grows during a frame.
#[derive(Debug, Default)]
pub(crate) struct ConvWork {
    /// Conv1d: history + new input `[cin, pad + tin]`.
    xbuf: Vec<f32>,
    /// ConvTr1d: ELU of the input `[cin, tin]`.
    xa: Vec<f32>,
    /// ConvTr1d: full transposed-conv output `[cout, (tin − 1)·stride + k]`.
    y: Vec<f32>,
}

impl ConvWork {
    /// Grows the buffers for calls of `conv` with at most `max_tin` input samples.
    pub fn fit_conv(&mut self, conv: &Conv1d, max_tin: usize) {
        grow(&mut self.xbuf, conv.cin * (conv.pad() + max_tin));
    }

    /// Grows the buffers for calls of `conv` with at most `max_tin` input frames.
    pub fn fit_tr(&mut self, conv: &ConvTr1d, max_tin: usize) {
        grow(&mut self.xa, conv.cin * max_tin);
        grow(
            &mut self.y,
            conv.cout * ((max_tin.max(1) - 1) * conv.stride + conv.k),
        );
    }
}

fn grow(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

fn kerr(e: kernels::KernelError) -> super::MimiError {
    super::MimiError::Config(format!("convolution: {e}"))
}

impl Conv1d {
    /// Builds the convolution (PyTorch weight `[cout, cin, k]`).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cin: usize,
        cout: usize,
        k: usize,
        stride: usize,
        dilation: usize,
        weight: Vec<f32>,
        bias: Option<Vec<f32>>,
        replicate: bool,
    ) -> Result<Self, super::MimiError> {
        let packed = kernels::conv::Conv1d::new(
            weight.clone(),
            bias.clone(),
            cin,
            cout,
            k,
            stride,
            dilation,
            1,
        )
        .map_err(kerr)?;
        let mat = Matrix::from_f32(cout, cin * k, weight).map_err(kerr)?;
        Ok(Conv1d {
            cin,
            cout,
            k,
            stride,
            dilation,
            bias,
            replicate,
            packed,
            mat,
        })
    }

    /// Left context (= effective kernel − stride), the padding_total of PyTorch.
    pub fn pad(&self) -> usize {
        (self.k - 1) * self.dilation + 1 - self.stride
    }

    /// A fresh streaming state for calls of at most `max_tin` input samples.
    pub fn state(&self, max_tin: usize) -> ConvState {
        let p = self.pad();
        let tout = max_tin / self.stride;
        let small = tout.min(SMALL_N - 1);
        ConvState {
            hist: vec![0.0; self.cin * p],
            col: vec![0.0; self.cin * self.k * small],
            yt: vec![0.0; self.cout * small],
            scratch: Scratch::new(),
            first: true,
            max_tin,
        }
    }

    /// One streaming call: `x` is `[cin, tin]` (tin a multiple of the stride, ≤ max_tin),
    /// `out` receives `[cout, tin / stride]`. With `elu_in`, ELU is applied to the input
    /// first (the activation module preceding the conv in SEANet). `work` must have been
    /// fitted to this convolution ([`ConvWork::fit_conv`]).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        st: &mut ConvState,
        work: &mut ConvWork,
        x: &[f32],
        tin: usize,
        elu_in: bool,
        out: &mut [f32],
        pool: Option<&Pool>,
    ) {
        debug_assert!(tin.is_multiple_of(self.stride) && tin <= st.max_tin);
        let p = self.pad();
        let tout = tin / self.stride;
        let w = p + tin;
        if self.replicate && st.first {
            for c in 0..self.cin {
                let v0 = x[c * tin];
                st.hist[c * p..(c + 1) * p].fill(v0);
            }
        }
        st.first = false;
        let xbuf = &mut work.xbuf[..self.cin * w];
        let (xb, hs) = (SyncPtr(xbuf.as_mut_ptr()), SyncPtr(st.hist.as_mut_ptr()));
        // Channels c0..c1: history + (ELU of) the new input into xbuf, new history out.
        let prologue = |c0: usize, c1: usize| {
            let (xb, hs) = (&xb, &hs);
            for c in c0..c1 {
                // SAFETY: xbuf holds cin·w and hist cin·p values; every channel's rows are
                // written by one share only.
                let row = unsafe { std::slice::from_raw_parts_mut(xb.0.add(c * w), w) };
                let hist = unsafe { std::slice::from_raw_parts_mut(hs.0.add(c * p), p) };
                row[..p].copy_from_slice(hist);
                let src = &x[c * tin..(c + 1) * tin];
                if elu_in {
                    kernels::ops::elu_into(src, &mut row[p..]);
                } else {
                    row[p..].copy_from_slice(src);
                }
                hist.copy_from_slice(&row[tin..]);
            }
        };
        per_channel(self.cin, self.cin * w, pool, &prologue);
        if tout >= SMALL_N {
            let (input, output) = (&xbuf[..], &mut out[..self.cout * tout]);
            let r = match pool {
                Some(pl) if pl.n_threads() > 1 => self.packed.forward_pool(input, output, pl),
                _ => self.packed.forward(input, output),
            };
            debug_assert!(r.is_ok());
            return;
        }
        // colT[t, (c, j)] = xbuf[c, t·s + j·d]; yT = colT · Wᵀ; out = yTᵀ + bias
        let kk = self.cin * self.k;
        let colt = &mut st.col[..tout * kk];
        for t in 0..tout {
            for c in 0..self.cin {
                let row = &xbuf[c * w..(c + 1) * w];
                let dst = &mut colt[t * kk + c * self.k..t * kk + (c + 1) * self.k];
                for (j, d) in dst.iter_mut().enumerate() {
                    *d = row[t * self.stride + j * self.dilation];
                }
            }
        }
        let yt = &mut st.yt[..tout * self.cout];
        matmul(&self.mat, colt, tout, yt, pool, &mut st.scratch);
        let bias = self.bias.as_deref();
        for o in 0..self.cout {
            let b = bias.map_or(0.0, |b| b[o]);
            for t in 0..tout {
                out[o * tout + t] = yt[t * self.cout + o] + b;
            }
        }
    }
}

impl ConvState {
    /// Back to the fresh state (zero history, replicate flag re-armed).
    pub fn reset(&mut self) {
        self.hist.fill(0.0);
        self.first = true;
    }
}

/// A causal transposed 1-D convolution, PyTorch weight `[in, out / groups, k]` (groups = 1,
/// or depthwise with groups = channels).
#[derive(Debug)]
pub(crate) struct ConvTr1d {
    pub cin: usize,
    pub cout: usize,
    pub k: usize,
    pub stride: usize,
    pub bias: Option<Vec<f32>>,
    kc: kernels::conv::ConvTranspose1d,
    /// groups = 1 only: `A [cout·k, cin]` with `A[o·k + j, c] = W[c, o, j]`, for calls of
    /// fewer than [`SMALL_N`] input steps (the 12.5/25 Hz layers): `Zᵀ = Xᵀ · Aᵀ` as a
    /// weight-streaming matmul (each weight read once), then overlap-add.
    mat: Option<Matrix>,
}

/// Streaming state of a [`ConvTr1d`]: the overlap tail (minus bias) and work buffers.
#[derive(Debug)]
pub(crate) struct ConvTrState {
    partial: Vec<f32>,
    /// `Xᵀ [tin, cin]` and `Zᵀ [tin, cout·k]` of the matmul path.
    xt: Vec<f32>,
    zt: Vec<f32>,
    scratch: Scratch,
    max_tin: usize,
}

impl ConvTr1d {
    /// Builds from the PyTorch weight `[cin, cout / groups, k]`.
    pub fn from_torch(
        cin: usize,
        cout: usize,
        k: usize,
        stride: usize,
        depthwise: bool,
        w: &[f32],
        bias: Option<Vec<f32>>,
    ) -> Result<Self, super::MimiError> {
        let groups = if depthwise { cin } else { 1 };
        let kc = kernels::conv::ConvTranspose1d::new(
            w.to_vec(),
            bias.clone(),
            cin,
            cout,
            k,
            stride,
            groups,
        )
        .map_err(kerr)?;
        let mat = if depthwise {
            None
        } else {
            let mut a = vec![0.0; cout * k * cin];
            for c in 0..cin {
                for o in 0..cout {
                    for j in 0..k {
                        a[(o * k + j) * cin + c] = w[(c * cout + o) * k + j];
                    }
                }
            }
            Some(Matrix::from_f32(cout * k, cin, a).map_err(kerr)?)
        };
        Ok(ConvTr1d {
            cin,
            cout,
            k,
            stride,
            bias,
            kc,
            mat,
        })
    }

    fn overlap(&self) -> usize {
        self.k.saturating_sub(self.stride)
    }

    /// A fresh streaming state for calls of at most `max_tin` input frames.
    pub fn state(&self, max_tin: usize) -> ConvTrState {
        let small = if self.mat.is_some() {
            max_tin.min(SMALL_N - 1)
        } else {
            0
        };
        ConvTrState {
            partial: vec![0.0; self.cout * self.overlap()],
            xt: vec![0.0; self.cin * small],
            zt: vec![0.0; self.cout * self.k * small],
            scratch: Scratch::new(),
            max_tin,
        }
    }

    /// One streaming call: `x` `[cin, tin]` → `out` `[cout, tin * stride]`. With `elu_in`,
    /// ELU is applied to the input first. `work` must have been fitted to this convolution
    /// ([`ConvWork::fit_tr`]).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        st: &mut ConvTrState,
        work: &mut ConvWork,
        x: &[f32],
        tin: usize,
        elu_in: bool,
        out: &mut [f32],
        pool: Option<&Pool>,
    ) {
        debug_assert!(tin >= 1 && tin <= st.max_tin);
        let (k, s) = (self.k, self.stride);
        let full = (tin - 1) * s + k;
        let pt = self.overlap();
        let tout = tin * s;
        let ConvWork { xa, y, .. } = work;
        let y = &mut y[..self.cout * full];
        let input: &[f32] = if elu_in {
            let xa_all = &mut xa[..self.cin * tin];
            let xa = SyncPtr(xa_all.as_mut_ptr());
            let elu = |c0: usize, c1: usize| {
                let xa = &xa;
                // SAFETY: xa holds cin·max_tin values; shares write disjoint channel rows.
                let dst =
                    unsafe { std::slice::from_raw_parts_mut(xa.0.add(c0 * tin), (c1 - c0) * tin) };
                kernels::ops::elu_into(&x[c0 * tin..c1 * tin], dst);
            };
            per_channel(self.cin, self.cin * tin, pool, &elu);
            xa_all
        } else {
            &x[..self.cin * tin]
        };
        match &self.mat {
            Some(mat) if tin < SMALL_N => {
                let (cin, ck) = (self.cin, self.cout * k);
                let xt = &mut st.xt[..tin * cin];
                for c in 0..cin {
                    for t in 0..tin {
                        xt[t * cin + c] = input[c * tin + t];
                    }
                }
                let zt = &mut st.zt[..tin * ck];
                matmul(mat, xt, tin, zt, pool, &mut st.scratch);
                for o in 0..self.cout {
                    let b = self.bias.as_ref().map_or(0.0, |b| b[o]);
                    let yr = &mut y[o * full..(o + 1) * full];
                    yr.fill(b);
                    for t in 0..tin {
                        let z = &zt[t * ck + o * k..t * ck + (o + 1) * k];
                        for (v, zv) in yr[t * s..t * s + k].iter_mut().zip(z) {
                            *v += *zv;
                        }
                    }
                }
            }
            _ => {
                let r = match pool {
                    Some(pl) if pl.n_threads() > 1 => self.kc.forward_pool(input, y, pl),
                    _ => self.kc.forward(input, y),
                };
                debug_assert!(r.is_ok());
            }
        }
        for o in 0..self.cout {
            let b = self.bias.as_ref().map_or(0.0, |b| b[o]);
            let yr = &mut y[o * full..(o + 1) * full];
            let part = &mut st.partial[o * pt..(o + 1) * pt];
            for (v, p) in yr[..pt].iter_mut().zip(part.iter()) {
                *v += *p;
            }
            for (p, v) in part.iter_mut().zip(&yr[full - pt..]) {
                *p = *v - b;
            }
            out[o * tout..(o + 1) * tout].copy_from_slice(&yr[..tout]);
        }
    }
}

impl ConvTrState {
    /// Back to the fresh state (zero overlap tail).
    pub fn reset(&mut self) {
        self.partial.fill(0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive_conv(c: &Conv1d, wt: &[f32], x: &[f32], t: usize) -> Vec<f32> {
        // zero (or replicate) left padding, no right padding, whole signal at once
        let p = c.pad();
        let tout = t / c.stride;
        let mut out = vec![0.0; c.cout * tout];
        for o in 0..c.cout {
            for to in 0..tout {
                let mut s = c.bias.as_ref().map_or(0.0, |b| b[o]) as f64;
                for ci in 0..c.cin {
                    for j in 0..c.k {
                        let idx = (to * c.stride + j * c.dilation) as isize - p as isize;
                        let v = if idx < 0 {
                            if c.replicate {
                                x[ci * t]
                            } else {
                                0.0
                            }
                        } else {
                            x[ci * t + idx as usize]
                        };
                        s += wt[o * c.cin * c.k + ci * c.k + j] as f64 * v as f64;
                    }
                }
                out[o * tout + to] = s as f32;
            }
        }
        out
    }

    fn split_cols(x: &[f32], c: usize, t: usize, a: usize, b: usize) -> Vec<f32> {
        let mut o = Vec::new();
        for ci in 0..c {
            o.extend_from_slice(&x[ci * t + a..ci * t + b]);
        }
        o
    }

    #[test]
    fn streaming_conv_equals_whole() {
        for (k, s, d, rep) in [
            (7, 1, 1, false),
            (8, 4, 1, false),
            (3, 1, 2, false),
            (4, 2, 1, true),
            (1, 1, 1, false),
        ] {
            let (cin, cout, t) = (3, 5, 48);
            let n = cout * cin * k;
            let wt: Vec<f32> = (0..n).map(|i| ((i * 37) % 19) as f32 / 9.0 - 1.0).collect();
            let conv = Conv1d::new(
                cin,
                cout,
                k,
                s,
                d,
                wt.clone(),
                Some((0..cout).map(|i| i as f32 * 0.3).collect()),
                rep,
            )
            .unwrap();
            let x: Vec<f32> = (0..cin * t)
                .map(|i| ((i * 53) % 23) as f32 / 11.0 - 1.0)
                .collect();
            let want = naive_conv(&conv, &wt, &x, t);
            let mut st = conv.state(t);
            let mut work = ConvWork::default();
            work.fit_conv(&conv, t);
            let mut whole = vec![0.0; cout * t / s];
            conv.forward(&mut st, &mut work, &x, t, false, &mut whole, None);
            let err = want
                .iter()
                .zip(&whole)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(err < 1e-4, "whole {k} {s} {d} {err}");
            // streaming in chunks of 8 samples
            let mut st = conv.state(8);
            let mut got = vec![0.0; cout * t / s];
            for c0 in (0..t).step_by(8) {
                let xc = split_cols(&x, cin, t, c0, c0 + 8);
                let mut oc = vec![0.0; cout * 8 / s];
                conv.forward(&mut st, &mut work, &xc, 8, false, &mut oc, None);
                for o in 0..cout {
                    got[o * t / s + c0 / s..o * t / s + (c0 + 8) / s]
                        .copy_from_slice(&oc[o * 8 / s..(o + 1) * 8 / s]);
                }
            }
            let err = want
                .iter()
                .zip(&got)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(err < 1e-4, "stream {k} {s} {d} {err}");
        }
    }

    #[test]
    fn streaming_convtr_equals_whole() {
        for (depthwise, ch) in [(false, 3), (true, 3), (false, 16), (true, 16)] {
            let (cin, k, s, t) = (4, 8, 4, 32);
            let cout = if depthwise { cin } else { 3 };
            let wl = if depthwise { cin * k } else { cin * cout * k };
            let w: Vec<f32> = (0..wl)
                .map(|i| ((i * 29) % 17) as f32 / 8.0 - 1.0)
                .collect();
            let bias: Vec<f32> = (0..cout).map(|i| 0.2 * i as f32 - 0.1).collect();
            let ct =
                ConvTr1d::from_torch(cin, cout, k, s, depthwise, &w, Some(bias.clone())).unwrap();
            let x: Vec<f32> = (0..cin * t)
                .map(|i| ((i * 41) % 13) as f32 / 6.0 - 1.0)
                .collect();
            // naive: full transposed conv, then keep the first t * s samples
            let full = (t - 1) * s + k;
            let mut want = vec![0.0f64; cout * full];
            for o in 0..cout {
                for v in &mut want[o * full..(o + 1) * full] {
                    *v = bias[o] as f64;
                }
                for c in 0..cin {
                    if depthwise && c != o {
                        continue;
                    }
                    for tt in 0..t {
                        for j in 0..k {
                            let wv = if depthwise {
                                w[c * k + j]
                            } else {
                                w[(c * cout + o) * k + j]
                            };
                            want[o * full + tt * s + j] += wv as f64 * x[c * t + tt] as f64;
                        }
                    }
                }
            }
            let mut st = ct.state(ch);
            let mut work = ConvWork::default();
            work.fit_tr(&ct, ch);
            for c0 in (0..t).step_by(ch) {
                let n = ch.min(t - c0);
                let xc = split_cols(&x, cin, t, c0, c0 + n);
                let mut oc = vec![0.0; cout * n * s];
                ct.forward(&mut st, &mut work, &xc, n, false, &mut oc, None);
                for o in 0..cout {
                    for i in 0..n * s {
                        let e = want[o * full + c0 * s + i];
                        assert!(
                            (oc[o * n * s + i] as f64 - e).abs() < 1e-4,
                            "{depthwise} {o} {c0} {i}"
                        );
                    }
                }
            }
        }
    }
}
