//! Causal streaming convolutions (`StreamingConv1d`, `StreamingConvTranspose1d` of `moshi`
//! 0.2.13). Weights live in [`Conv1d`] / [`ConvTr1d`] (shared, immutable); the streaming
//! state of each stream lives in a [`ConvState`] / [`ConvTrState`]. The arithmetic runs in the
//! `kernels` crate (blocked GEMM convolution for long chunks, weight-streaming matmul for the
//! few output steps of the 12.5/25 Hz layers).
//!
//! Every call serves a set of independent streams at once (`active`: their indices into the
//! state slice; one stream is the plain streaming case). Where the weights outweigh the
//! activations (the low-rate layers), the streams share one product, so the weights are read
//! once per call for all of them: one GEMM over the streams' padded inputs laid side by side (the
//! few columns that straddle two streams are computed and dropped), or one matmul whose
//! activation rows are every stream's output steps. The high-rate layers, whose small weights
//! stay in cache anyway, run the streams one after the other, or on a pool a stream per thread
//! ([`PER_STREAM_MIN`]; the SEANets run their high-rate stages one stream at a time as chains,
//! `seanet.rs`, so this is for a layer that is large and still called with several streams). Each
//! output
//! is computed by the same kernel with the same summation order as for the stream alone (the
//! GEMM micro-kernels and the dense matmul tiles compute every output as one chain over `k`,
//! whatever the other columns or rows), so a stream's results do not depend on the others.
//!
//! Layout: activations are channel-major `[C, m·T]` row-major slices: row `c` holds stream 0's
//! `T` values, then stream 1's, and so on (`m` = number of active streams).

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

/// A raw pointer shared by the pool's threads, each writing its own rows or streams.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SyncPtr<T = f32>(pub(crate) *mut T);
// SAFETY: users write disjoint regions only (per-channel or per-stream shares).
unsafe impl<T> Sync for SyncPtr<T> {}
unsafe impl<T> Send for SyncPtr<T> {}

/// Above this many activation values (input with history, plus output) per stream, a
/// high-rate convolution runs several streams one by one (on a pool, a stream per thread)
/// rather than as one joined GEMM. The
/// choice depends on the layer and the call's length only, never on how many streams are
/// active: the scratch buffers that the joined and the single products size on first use are
/// then all grown by the warm-up.
const PER_STREAM_MIN: usize = 64 * 1024;

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

/// Streaming state of one stream of a [`Conv1d`]: the last `pad()` input samples per channel.
#[derive(Debug)]
pub(crate) struct ConvState {
    hist: Vec<f32>,
    first: bool,
    max_tin: usize,
}

/// Work buffers shared by all the convolutions of a stack (one call at a time), so the
/// padded-input and ELU buffers stay in cache from layer to layer instead of each layer
/// touching its own cold copy every frame. Sized with [`ConvWork::fit_conv`] /
/// [`ConvWork::fit_tr`] for the most streams and steps per call; never grows during a frame.
#[derive(Debug, Default)]
pub(crate) struct ConvWork {
    /// Conv1d: history + new input per stream, `[cin, m · seg]`.
    xbuf: Vec<f32>,
    /// ConvTr1d: (ELU of) the input, `[cin, m · tin]`, or with gap columns between streams.
    xa: Vec<f32>,
    /// ConvTr1d: full transposed-conv outputs; Conv1d: the GEMM output of several streams.
    y: Vec<f32>,
    /// Small Conv1d path: gathered columns `[m · tout, cin · k]` and `yᵀ [m · tout, cout]`.
    col: Vec<f32>,
    yt: Vec<f32>,
    /// Small ConvTr1d path: `Xᵀ [m · tin, cin]` and `Zᵀ [m · tin, cout · k]`.
    xt: Vec<f32>,
    zt: Vec<f32>,
    /// History pointers of the active streams (capacity fixed at fit time).
    hist: Vec<SyncPtr>,
    scratch: Scratch,
}

impl ConvWork {
    /// Grows the buffers for calls of `conv` with at most `max_tin` input samples for each of
    /// at most `streams` streams.
    pub fn fit_conv(&mut self, conv: &Conv1d, max_tin: usize, streams: usize) {
        let seg = conv.segment(max_tin, streams);
        grow(&mut self.xbuf, conv.cin * streams * seg);
        if streams > 1 {
            grow(&mut self.y, conv.cout * conv.packed.out_len(streams * seg));
        }
        let small = (max_tin / conv.stride).min(SMALL_N - 1);
        grow(&mut self.col, streams * small * conv.cin * conv.k);
        grow(&mut self.yt, streams * small * conv.cout);
        if self.hist.capacity() < streams {
            self.hist.reserve(streams);
        }
    }

    /// Grows the buffers for calls of `conv` with at most `max_tin` input frames for each of at
    /// most `streams` streams.
    pub fn fit_tr(&mut self, conv: &ConvTr1d, max_tin: usize, streams: usize) {
        let max_tin = max_tin.max(1);
        let g = conv.gap();
        grow(&mut self.xa, conv.cin * streams * (max_tin + g));
        let full = (max_tin - 1) * conv.stride + conv.k;
        let joined = (streams * (max_tin + g) - 1) * conv.stride + conv.k;
        grow(&mut self.y, conv.cout * (streams * full).max(joined));
        if conv.mat.is_some() {
            let small = max_tin.min(SMALL_N - 1);
            grow(&mut self.xt, streams * small * conv.cin);
            grow(&mut self.zt, streams * small * conv.cout * conv.k);
        }
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

    /// Columns of one stream in the joined GEMM input: its history and input, rounded up to a
    /// whole number of strides when several streams share the call, so every stream's first
    /// window starts on the stride grid (the rounding columns are zeros no kept output reads:
    /// the last kept window ends at `pad + tin`).
    fn segment(&self, tin: usize, streams: usize) -> usize {
        let w = self.pad() + tin;
        if streams > 1 {
            w.next_multiple_of(self.stride)
        } else {
            w
        }
    }

    /// A fresh streaming state for calls of at most `max_tin` input samples.
    pub fn state(&self, max_tin: usize) -> ConvState {
        ConvState {
            hist: vec![0.0; self.cin * self.pad()],
            first: true,
            max_tin,
        }
    }

    /// One streaming call for the streams `active` (indices into `st`): `x` is `[cin, m·tin]`
    /// (tin a multiple of the stride, ≤ max_tin), `out` receives `[cout, m·(tin / stride)]`.
    /// With `elu_in`, ELU is applied to the input first (the activation module preceding the
    /// conv in SEANet). `work` must have been fitted to this convolution and at least `m`
    /// streams ([`ConvWork::fit_conv`]).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        st: &mut [ConvState],
        active: &[usize],
        work: &mut ConvWork,
        x: &[f32],
        tin: usize,
        elu_in: bool,
        out: &mut [f32],
        pool: Option<&Pool>,
    ) {
        let m = active.len();
        debug_assert!(tin.is_multiple_of(self.stride));
        let p = self.pad();
        let tout = tin / self.stride;
        let w = p + tin;
        let seg = self.segment(tin, m);
        let (cin, xw) = (self.cin, m * tin);
        let ConvWork {
            xbuf,
            y,
            col,
            yt,
            hist,
            scratch,
            ..
        } = work;
        hist.clear();
        for (j, &s) in active.iter().enumerate() {
            let sj = &mut st[s];
            debug_assert!(tin <= sj.max_tin);
            if self.replicate && sj.first {
                for c in 0..cin {
                    let v0 = x[c * xw + j * tin];
                    sj.hist[c * p..(c + 1) * p].fill(v0);
                }
            }
            sj.first = false;
            debug_assert!(hist.len() < hist.capacity());
            hist.push(SyncPtr(sj.hist.as_mut_ptr()));
        }
        let xb = SyncPtr(xbuf.as_mut_ptr());
        let hs: &[SyncPtr] = hist;
        // Channels c0..c1 of the streams `js`: history + (ELU of) the new input into xbuf (row
        // `(c, j)` at `(c·|js| + j − js.start)·sg`), new history out.
        let prologue = |c0: usize, c1: usize, js: std::ops::Range<usize>, sg: usize| {
            let xb = &xb;
            let mj = js.len();
            for c in c0..c1 {
                for j in js.clone() {
                    // SAFETY: xbuf holds cin·m·seg ≥ cin·|js|·sg values and every history
                    // cin·p; each channel's rows are written by one share only.
                    let row = unsafe {
                        std::slice::from_raw_parts_mut(xb.0.add((c * mj + j - js.start) * sg), sg)
                    };
                    let hist = unsafe { std::slice::from_raw_parts_mut(hs[j].0.add(c * p), p) };
                    row[..p].copy_from_slice(hist);
                    let src = &x[c * xw + j * tin..c * xw + (j + 1) * tin];
                    if elu_in {
                        kernels::ops::elu_into(src, &mut row[p..w]);
                    } else {
                        row[p..w].copy_from_slice(src);
                    }
                    hist.copy_from_slice(&row[tin..w]);
                    row[w..].fill(0.0);
                }
            }
        };
        if tout >= SMALL_N && m > 1 && cin * w + self.cout * tout > PER_STREAM_MIN {
            // The high-rate layers: their weights are small and stay in cache, while the joined
            // input and output of several streams outgrow the L2 cache (4 streams of the
            // 1920-sample layers: ~6 MB). One stream at a time keeps a stream's working set in
            // cache, as when it runs alone; a joined call of 4 streams cost 4.3–5.3× one
            // stream's there (`bench batch`, per-layer timers, one thread). On a pool, each thread
            // takes whole streams: one dispatch for the layer, and each stream's data in one core.
            if pool.is_some_and(|p| p.n_threads() > 1) {
                per_channel(cin, cin * m * w, pool, &|c0, c1| prologue(c0, c1, 0..m, w));
                let r = self.packed.forward_streams(
                    &xbuf[..cin * m * w],
                    m,
                    &mut out[..self.cout * m * tout],
                    pool,
                );
                debug_assert!(r.is_ok());
                return;
            }
            for j in 0..m {
                per_channel(cin, cin * w, pool, &|c0, c1| prologue(c0, c1, j..j + 1, w));
                let r = self.run_packed(&xbuf[..cin * w], &mut y[..self.cout * tout], pool);
                debug_assert!(r.is_ok());
                for (o, src) in y[..self.cout * tout].chunks_exact(tout).enumerate() {
                    out[(o * m + j) * tout..(o * m + j + 1) * tout].copy_from_slice(src);
                }
            }
            return;
        }
        per_channel(cin, cin * m * seg, pool, &|c0, c1| {
            prologue(c0, c1, 0..m, seg)
        });
        let xbuf = &xbuf[..cin * m * seg];
        if tout >= SMALL_N {
            let r = if m == 1 || (p == 0 && seg == tin) {
                // One stream, or streams whose GEMM columns are exactly their outputs side by
                // side (no history and no rounding: the k = 1 layers): the GEMM writes `out`.
                self.run_packed(xbuf, &mut out[..self.cout * m * tout], pool)
            } else {
                // One GEMM over the streams side by side; stream j's outputs start at column
                // j·seg / stride, the columns in between straddle two streams and are dropped.
                let n = self.packed.out_len(m * seg);
                let r = self.run_packed(xbuf, &mut y[..self.cout * n], pool);
                let step = seg / self.stride;
                for o in 0..self.cout {
                    for j in 0..m {
                        let src = &y[o * n + j * step..o * n + j * step + tout];
                        out[(o * m + j) * tout..(o * m + j + 1) * tout].copy_from_slice(src);
                    }
                }
                r
            };
            debug_assert!(r.is_ok());
            return;
        }
        // colT[(j, t), (c, i)] = xbuf[c, j·seg + t·s + i·d]; yT = colT · Wᵀ; out = yTᵀ + bias
        let kk = cin * self.k;
        let rows = m * tout;
        let colt = &mut col[..rows * kk];
        for j in 0..m {
            for t in 0..tout {
                let dst_row = &mut colt[(j * tout + t) * kk..(j * tout + t + 1) * kk];
                for c in 0..cin {
                    let row = &xbuf[(c * m + j) * seg..(c * m + j + 1) * seg];
                    let dst = &mut dst_row[c * self.k..(c + 1) * self.k];
                    for (i, d) in dst.iter_mut().enumerate() {
                        *d = row[t * self.stride + i * self.dilation];
                    }
                }
            }
        }
        let yt = &mut yt[..rows * self.cout];
        matmul(&self.mat, colt, rows, yt, pool, scratch);
        let bias = self.bias.as_deref();
        for o in 0..self.cout {
            let b = bias.map_or(0.0, |b| b[o]);
            for r in 0..rows {
                out[o * rows + r] = yt[r * self.cout + o] + b;
            }
        }
    }

    /// The weight `[cout, cin, k]` as f32.
    pub fn weight_f32(&self) -> Vec<f32> {
        let kk = self.cin * self.k;
        let mut w = vec![0.0; self.cout * kk];
        for (o, row) in w.chunks_exact_mut(kk).enumerate() {
            self.mat.row_f32(o, row);
        }
        w
    }

    fn run_packed(
        &self,
        input: &[f32],
        output: &mut [f32],
        pool: Option<&Pool>,
    ) -> Result<usize, kernels::KernelError> {
        match pool {
            Some(pl) if pl.n_threads() > 1 => self.packed.forward_pool(input, output, pl),
            _ => self.packed.forward(input, output),
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

/// Streaming state of one stream of a [`ConvTr1d`]: the overlap tail (minus bias).
#[derive(Debug)]
pub(crate) struct ConvTrState {
    partial: Vec<f32>,
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

    /// Depthwise (groups = channels).
    pub fn depthwise(&self) -> bool {
        // Only groups = 1 keeps the matmul form.
        self.mat.is_none()
    }

    /// The PyTorch weight `[cin, cout / groups, k]`.
    pub fn weight_f32(&self) -> Vec<f32> {
        self.kc.weight().to_vec()
    }

    fn overlap(&self) -> usize {
        self.k.saturating_sub(self.stride)
    }

    /// Zero input columns between two streams in a joined transposed convolution, so that no
    /// input step of one stream reaches the output span of the next: `(tin + gap)·stride ≥
    /// (tin − 1)·stride + k`.
    fn gap(&self) -> usize {
        self.overlap().div_ceil(self.stride)
    }

    /// A fresh streaming state for calls of at most `max_tin` input frames.
    pub fn state(&self, max_tin: usize) -> ConvTrState {
        ConvTrState {
            partial: vec![0.0; self.cout * self.overlap()],
            max_tin,
        }
    }

    /// One streaming call for the streams `active` (indices into `st`): `x` `[cin, m·tin]` →
    /// `out` `[cout, m·tin·stride]`. With `elu_in`, ELU is applied to the input first. `work`
    /// must have been fitted to this convolution and at least `m` streams
    /// ([`ConvWork::fit_tr`]).
    ///
    /// Several streams share one product: the matmul path takes every stream's steps as rows;
    /// the GEMM path joins the streams' inputs with [`ConvTr1d::gap`] zero columns between
    /// them, so each stream's span of the full output receives its own steps' terms and, from
    /// the gap, exact zeros only (which leave every sum unchanged, up to the sign of an exactly
    /// zero value).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        st: &mut [ConvTrState],
        active: &[usize],
        work: &mut ConvWork,
        x: &[f32],
        tin: usize,
        elu_in: bool,
        out: &mut [f32],
        pool: Option<&Pool>,
    ) {
        let m = active.len();
        debug_assert!(tin >= 1);
        let (k, s, cin) = (self.k, self.stride, self.cin);
        let full = (tin - 1) * s + k;
        let xw = m * tin;
        let ConvWork {
            xa,
            y,
            xt,
            zt,
            scratch,
            ..
        } = work;
        let small = self.mat.is_some() && tin < SMALL_N;
        // Like the high-rate Conv1d layers (see `PER_STREAM_MIN`): with several streams of many
        // steps, one stream at a time keeps the product's `[cout·k, tin]` output in cache.
        let per_stream = !small && m > 1 && (cin + self.cout * k) * tin > PER_STREAM_MIN;
        // The input of the product: `[cin, m·tin]`, or joined with gaps for the GEMM path of
        // several streams (`[cin, m·(tin + gap)]`, gaps zero), or one stream's `[cin, tin]`.
        let joined = !small && m > 1 && !per_stream;
        let seg = if joined { tin + self.gap() } else { tin };
        let xap = SyncPtr(xa.as_mut_ptr());
        // Channels c0..c1 of the streams `js` into xa (row `(c, j)` at `(c·|js| + j −
        // js.start)·seg`).
        let prep = |c0: usize, c1: usize, js: std::ops::Range<usize>| {
            let xap = &xap;
            let mj = js.len();
            for c in c0..c1 {
                for j in js.clone() {
                    // SAFETY: xa holds cin·m·seg values; shares write disjoint channel rows.
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(
                            xap.0.add((c * mj + j - js.start) * seg),
                            seg,
                        )
                    };
                    let src = &x[c * xw + j * tin..c * xw + (j + 1) * tin];
                    if elu_in {
                        kernels::ops::elu_into(src, &mut dst[..tin]);
                    } else {
                        dst[..tin].copy_from_slice(src);
                    }
                    dst[tin..].fill(0.0);
                }
            }
        };
        if per_stream && pool.is_some_and(|p| p.n_threads() > 1) {
            // As in `Conv1d::forward`: on a pool each thread takes whole streams.
            per_channel(cin, cin * m * tin, pool, &|c0, c1| prep(c0, c1, 0..m));
            let y = &mut y[..m * self.cout * full];
            let r = self.kc.forward_streams(&xa[..cin * m * tin], m, y, pool);
            debug_assert!(r.is_ok());
            for (j, &sl) in active.iter().enumerate() {
                self.finish(&mut st[sl], &mut y[j * full..], m * full, (j, m), tin, out);
            }
            return;
        }
        if per_stream {
            for (j, &sl) in active.iter().enumerate() {
                per_channel(cin, cin * tin, pool, &|c0, c1| prep(c0, c1, j..j + 1));
                let y = &mut y[..self.cout * full];
                let r = match pool {
                    Some(pl) if pl.n_threads() > 1 => self.kc.forward_pool(&xa[..cin * tin], y, pl),
                    _ => self.kc.forward(&xa[..cin * tin], y),
                };
                debug_assert!(r.is_ok());
                self.finish(&mut st[sl], y, full, (j, m), tin, out);
            }
            return;
        }
        let input: &[f32] = if elu_in || joined {
            per_channel(cin, cin * m * seg, pool, &|c0, c1| prep(c0, c1, 0..m));
            &xa[..cin * m * seg]
        } else {
            &x[..cin * xw]
        };
        // Where stream j's full output row o starts in `y`.
        let (row_len, stream_off) = match (&self.mat, small) {
            (Some(mat), true) => {
                let ck = self.cout * k;
                let rows = m * tin;
                let xt = &mut xt[..rows * cin];
                for c in 0..cin {
                    for r in 0..rows {
                        xt[r * cin + c] = input[c * xw + r];
                    }
                }
                let zt = &mut zt[..rows * ck];
                matmul(mat, xt, rows, zt, pool, scratch);
                // Stream j's rows of y: `[cout, full]` at j·cout·full.
                let y = &mut y[..m * self.cout * full];
                for j in 0..m {
                    for o in 0..self.cout {
                        let b = self.bias.as_ref().map_or(0.0, |b| b[o]);
                        let yr = &mut y[(j * self.cout + o) * full..(j * self.cout + o + 1) * full];
                        yr.fill(b);
                        for t in 0..tin {
                            let r = j * tin + t;
                            let z = &zt[r * ck + o * k..r * ck + (o + 1) * k];
                            for (v, zv) in yr[t * s..t * s + k].iter_mut().zip(z) {
                                *v += *zv;
                            }
                        }
                    }
                }
                (full, self.cout * full)
            }
            _ => {
                let n = self.kc.out_len(m * seg);
                let y = &mut y[..self.cout * n];
                let r = match pool {
                    Some(pl) if pl.n_threads() > 1 => self.kc.forward_pool(input, y, pl),
                    _ => self.kc.forward(input, y),
                };
                debug_assert!(r.is_ok());
                (n, seg * s)
            }
        };
        for (j, &sl) in active.iter().enumerate() {
            let yj = &mut y[j * stream_off..];
            self.finish(&mut st[sl], yj, row_len, (j, m), tin, out);
        }
    }

    /// Stream `j` of `m`: adds its overlap tail to the start of its full output rows in `y`
    /// (row `o` at `o·row_len`), keeps the new tail (minus bias) and writes its `tin·stride`
    /// finished samples per channel to `out` (`[cout, m·tin·stride]`).
    fn finish(
        &self,
        sj: &mut ConvTrState,
        y: &mut [f32],
        row_len: usize,
        (j, m): (usize, usize),
        tin: usize,
        out: &mut [f32],
    ) {
        debug_assert!(tin <= sj.max_tin);
        let (pt, tout) = (self.overlap(), tin * self.stride);
        let full = (tin - 1) * self.stride + self.k;
        for o in 0..self.cout {
            let b = self.bias.as_ref().map_or(0.0, |b| b[o]);
            let yr = &mut y[o * row_len..o * row_len + full];
            let part = &mut sj.partial[o * pt..(o + 1) * pt];
            for (v, p) in yr[..pt].iter_mut().zip(part.iter()) {
                *v += *p;
            }
            for (p, v) in part.iter_mut().zip(&yr[full - pt..]) {
                *p = *v - b;
            }
            out[(o * m + j) * tout..(o * m + j + 1) * tout].copy_from_slice(&yr[..tout]);
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
            let mut st = vec![conv.state(t)];
            let mut work = ConvWork::default();
            work.fit_conv(&conv, t, 1);
            let mut whole = vec![0.0; cout * t / s];
            conv.forward(&mut st, &[0], &mut work, &x, t, false, &mut whole, None);
            let err = testkit::compare::max_abs_diff(&whole, &want);
            assert!(err < 1e-4, "whole {k} {s} {d} {err}");
            // streaming in chunks of 8 samples
            let mut st = vec![conv.state(8)];
            let mut got = vec![0.0; cout * t / s];
            for c0 in (0..t).step_by(8) {
                let xc = split_cols(&x, cin, t, c0, c0 + 8);
                let mut oc = vec![0.0; cout * 8 / s];
                conv.forward(&mut st, &[0], &mut work, &xc, 8, false, &mut oc, None);
                for o in 0..cout {
                    got[o * t / s + c0 / s..o * t / s + (c0 + 8) / s]
                        .copy_from_slice(&oc[o * 8 / s..(o + 1) * 8 / s]);
                }
            }
            let err = testkit::compare::max_abs_diff(&got, &want);
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
            let mut st = vec![ct.state(ch)];
            let mut work = ConvWork::default();
            work.fit_tr(&ct, ch, 1);
            for c0 in (0..t).step_by(ch) {
                let n = ch.min(t - c0);
                let xc = split_cols(&x, cin, t, c0, c0 + n);
                let mut oc = vec![0.0; cout * n * s];
                ct.forward(&mut st, &[0], &mut work, &xc, n, false, &mut oc, None);
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
