//! Causal streaming convolutions (`StreamingConv1d`, `StreamingConvTranspose1d` of `moshi`
//! 0.2.13). Weights live in [`Conv1d`] / [`ConvTr1d`] (shared, immutable); the streaming
//! state lives in [`ConvState`] / [`ConvTrState`], preallocated for a maximum chunk length.
//!
//! Layout: activations are channel-major `[C, T]` row-major slices.

use super::linalg;

/// A causal 1-D convolution: weight `[out, in, k]` (groups = 1), optional bias.
#[derive(Debug, Clone)]
pub(crate) struct Conv1d {
    pub cin: usize,
    pub cout: usize,
    pub k: usize,
    pub stride: usize,
    pub dilation: usize,
    /// `[cout, cin * k]` row-major (the PyTorch layout flattened).
    pub weight: Vec<f32>,
    pub bias: Option<Vec<f32>>,
    /// `pad_mode = "replicate"`: the first call fills the left context with the first sample.
    pub replicate: bool,
}

/// Streaming state of one [`Conv1d`]: the last `pad()` input samples per channel, plus
/// work buffers sized for `max_tin` input samples per call.
#[derive(Debug, Clone)]
pub(crate) struct ConvState {
    hist: Vec<f32>,
    xbuf: Vec<f32>,
    col: Vec<f32>,
    first: bool,
    max_tin: usize,
}

impl Conv1d {
    /// Left context (= effective kernel − stride), the padding_total of PyTorch.
    pub fn pad(&self) -> usize {
        (self.k - 1) * self.dilation + 1 - self.stride
    }

    /// A fresh streaming state for calls of at most `max_tin` input samples.
    pub fn state(&self, max_tin: usize) -> ConvState {
        let p = self.pad();
        let tout = max_tin / self.stride;
        let direct = self.k == 1 && self.stride == 1;
        ConvState {
            hist: vec![0.0; self.cin * p],
            xbuf: vec![0.0; self.cin * (p + max_tin)],
            col: if direct { Vec::new() } else { vec![0.0; self.cin * self.k * tout] },
            first: true,
            max_tin,
        }
    }

    /// One streaming call: `x` is `[cin, tin]` (tin a multiple of the stride, ≤ max_tin),
    /// `out` receives `[cout, tin / stride]`. With `elu_in`, ELU is applied to the input
    /// first (the activation module preceding the conv in SEANet).
    pub fn forward(&self, st: &mut ConvState, x: &[f32], tin: usize, elu_in: bool, out: &mut [f32]) {
        debug_assert!(tin % self.stride == 0 && tin <= st.max_tin);
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
        for c in 0..self.cin {
            let row = &mut st.xbuf[c * w..(c + 1) * w];
            row[..p].copy_from_slice(&st.hist[c * p..(c + 1) * p]);
            let src = &x[c * tin..(c + 1) * tin];
            if elu_in {
                for (d, &s) in row[p..].iter_mut().zip(src) {
                    *d = linalg::elu(s);
                }
            } else {
                row[p..].copy_from_slice(src);
            }
            st.hist[c * p..(c + 1) * p].copy_from_slice(&row[tin..]);
        }
        let kk = self.cin * self.k;
        let bias = self.bias.as_deref();
        if self.k == 1 && self.stride == 1 {
            linalg::gemm(self.cout, tout, kk, &self.weight, &st.xbuf, w, out, bias);
            return;
        }
        for c in 0..self.cin {
            let row = &st.xbuf[c * w..(c + 1) * w];
            for j in 0..self.k {
                let dst = &mut st.col[(c * self.k + j) * tout..(c * self.k + j + 1) * tout];
                let off = j * self.dilation;
                if self.stride == 1 {
                    dst.copy_from_slice(&row[off..off + tout]);
                } else {
                    for (t, d) in dst.iter_mut().enumerate() {
                        *d = row[off + t * self.stride];
                    }
                }
            }
        }
        linalg::gemm(self.cout, tout, kk, &self.weight, &st.col, tout, out, bias);
    }
}

impl ConvState {
    /// Back to the fresh state (zero history, replicate flag re-armed).
    pub fn reset(&mut self) {
        self.hist.fill(0.0);
        self.first = true;
    }
}

/// A causal transposed 1-D convolution. Dense: PyTorch weight `[in, out, k]`, stored
/// transposed as `[out * k, in]`; depthwise (groups = channels): `[C, 1, k]` kept as `[C, k]`.
#[derive(Debug, Clone)]
pub(crate) struct ConvTr1d {
    pub cin: usize,
    pub cout: usize,
    pub k: usize,
    pub stride: usize,
    pub depthwise: bool,
    /// Dense: `[cout * k, cin]`; depthwise: `[cin, k]`.
    pub weight: Vec<f32>,
    pub bias: Option<Vec<f32>>,
}

/// Streaming state of a [`ConvTr1d`]: the overlap tail (minus bias) and work buffers.
#[derive(Debug, Clone)]
pub(crate) struct ConvTrState {
    partial: Vec<f32>,
    xa: Vec<f32>,
    z: Vec<f32>,
    y: Vec<f32>,
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
    ) -> Self {
        let weight = if depthwise {
            w.to_vec()
        } else {
            let mut t = vec![0.0; cout * k * cin];
            for c in 0..cin {
                for o in 0..cout {
                    for j in 0..k {
                        t[(o * k + j) * cin + c] = w[(c * cout + o) * k + j];
                    }
                }
            }
            t
        };
        ConvTr1d { cin, cout, k, stride, depthwise, weight, bias }
    }

    fn overlap(&self) -> usize {
        self.k.saturating_sub(self.stride)
    }

    /// A fresh streaming state for calls of at most `max_tin` input frames.
    pub fn state(&self, max_tin: usize) -> ConvTrState {
        let full = (max_tin.max(1) - 1) * self.stride + self.k;
        ConvTrState {
            partial: vec![0.0; self.cout * self.overlap()],
            xa: if self.depthwise { Vec::new() } else { vec![0.0; self.cin * max_tin] },
            z: if self.depthwise { Vec::new() } else { vec![0.0; self.cout * self.k * max_tin] },
            y: vec![0.0; self.cout * full],
            max_tin,
        }
    }

    /// One streaming call: `x` `[cin, tin]` → `out` `[cout, tin * stride]`. With `elu_in`,
    /// ELU is applied to the input first.
    pub fn forward(&self, st: &mut ConvTrState, x: &[f32], tin: usize, elu_in: bool, out: &mut [f32]) {
        debug_assert!(tin >= 1 && tin <= st.max_tin);
        let (k, s) = (self.k, self.stride);
        let full = (tin - 1) * s + k;
        let pt = self.overlap();
        let tout = tin * s;
        let y = &mut st.y[..self.cout * full];
        y.fill(0.0);
        if self.depthwise {
            for c in 0..self.cin {
                let wr = &self.weight[c * k..(c + 1) * k];
                let yr = &mut y[c * full..(c + 1) * full];
                for t in 0..tin {
                    let v = x[c * tin + t];
                    let v = if elu_in { linalg::elu(v) } else { v };
                    for j in 0..k {
                        yr[t * s + j] += v * wr[j];
                    }
                }
            }
        } else {
            // z[(o, j), t] = Σ_c w[(o, j), c] · x[c, t]
            let z = &mut st.z[..self.cout * k * tin];
            if elu_in {
                let xa = &mut st.xa[..self.cin * tin];
                for (d, &v) in xa.iter_mut().zip(&x[..self.cin * tin]) {
                    *d = linalg::elu(v);
                }
                linalg::gemm(self.cout * k, tin, self.cin, &self.weight, xa, tin, z, None);
            } else {
                linalg::gemm(self.cout * k, tin, self.cin, &self.weight, x, tin, z, None);
            }
            for o in 0..self.cout {
                let yr = &mut y[o * full..(o + 1) * full];
                for j in 0..k {
                    let zr = &z[(o * k + j) * tin..(o * k + j + 1) * tin];
                    for t in 0..tin {
                        yr[t * s + j] += zr[t];
                    }
                }
            }
        }
        for o in 0..self.cout {
            let b = self.bias.as_ref().map_or(0.0, |b| b[o]);
            let yr = &mut y[o * full..(o + 1) * full];
            if b != 0.0 {
                for v in yr.iter_mut() {
                    *v += b;
                }
            }
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

    fn naive_conv(c: &Conv1d, x: &[f32], t: usize) -> Vec<f32> {
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
                        s += c.weight[o * c.cin * c.k + ci * c.k + j] as f64 * v as f64;
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
        for (k, s, d, rep) in [(7, 1, 1, false), (8, 4, 1, false), (3, 1, 2, false), (4, 2, 1, true), (1, 1, 1, false)] {
            let (cin, cout, t) = (3, 5, 48);
            let n = cout * cin * k;
            let conv = Conv1d {
                cin,
                cout,
                k,
                stride: s,
                dilation: d,
                weight: (0..n).map(|i| ((i * 37) % 19) as f32 / 9.0 - 1.0).collect(),
                bias: Some((0..cout).map(|i| i as f32 * 0.3).collect()),
                replicate: rep,
            };
            let x: Vec<f32> = (0..cin * t).map(|i| ((i * 53) % 23) as f32 / 11.0 - 1.0).collect();
            let want = naive_conv(&conv, &x, t);
            let mut st = conv.state(t);
            let mut whole = vec![0.0; cout * t / s];
            conv.forward(&mut st, &x, t, false, &mut whole);
            let err = want.iter().zip(&whole).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(err < 1e-4, "whole {k} {s} {d} {err}");
            // streaming in chunks of 8 samples
            let mut st = conv.state(8);
            let mut got = vec![0.0; cout * t / s];
            for c0 in (0..t).step_by(8) {
                let xc = split_cols(&x, cin, t, c0, c0 + 8);
                let mut oc = vec![0.0; cout * 8 / s];
                conv.forward(&mut st, &xc, 8, false, &mut oc);
                for o in 0..cout {
                    got[o * t / s + c0 / s..o * t / s + (c0 + 8) / s].copy_from_slice(&oc[o * 8 / s..(o + 1) * 8 / s]);
                }
            }
            let err = want.iter().zip(&got).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(err < 1e-4, "stream {k} {s} {d} {err}");
        }
    }

    #[test]
    fn streaming_convtr_equals_whole() {
        for depthwise in [false, true] {
            let (cin, k, s, t) = (4, 8, 4, 12);
            let cout = if depthwise { cin } else { 3 };
            let wl = if depthwise { cin * k } else { cin * cout * k };
            let w: Vec<f32> = (0..wl).map(|i| ((i * 29) % 17) as f32 / 8.0 - 1.0).collect();
            let bias: Vec<f32> = (0..cout).map(|i| 0.2 * i as f32 - 0.1).collect();
            let ct = ConvTr1d::from_torch(cin, cout, k, s, depthwise, &w, Some(bias.clone()));
            let x: Vec<f32> = (0..cin * t).map(|i| ((i * 41) % 13) as f32 / 6.0 - 1.0).collect();
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
                            let wv = if depthwise { w[c * k + j] } else { w[(c * cout + o) * k + j] };
                            want[o * full + tt * s + j] += wv as f64 * x[c * t + tt] as f64;
                        }
                    }
                }
            }
            let mut st = ct.state(3);
            for c0 in (0..t).step_by(3) {
                let xc = split_cols(&x, cin, t, c0, c0 + 3);
                let mut oc = vec![0.0; cout * 3 * s];
                ct.forward(&mut st, &xc, 3, false, &mut oc);
                for o in 0..cout {
                    for i in 0..3 * s {
                        let e = want[o * full + c0 * s + i];
                        assert!((oc[o * 3 * s + i] as f64 - e).abs() < 1e-4, "{depthwise} {o} {c0} {i}");
                    }
                }
            }
        }
    }
}
