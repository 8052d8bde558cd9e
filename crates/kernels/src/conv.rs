//! 1-D convolutions (`Conv1d`, `ConvTranspose1d`) over `[channels, time]` f32 buffers,
//! computed as a blocked GEMM (weights packed at construction, input gathered per
//! panel, no im2col buffer). Grouped transposed convolutions (Mimi's depthwise
//! upsampler) use a direct loop. `forward_reference` is the plain scalar definition.
//!
//! Micro-kernels come from the kernel table: scalar (reference), AVX2+FMA (6×16 blocks) and
//! AVX-512F (24×16 / 12×32 blocks). All run the same FMA chain per output, so their results
//! are bitwise equal; `forward_kernel` names a [`KernelSet`] explicitly for tests and A/B
//! benchmarks. On a pool, wide
//! outputs are split by column panels (each share gathers its own input panels), narrow
//! ones by row panels with the input gathered once and shared.

use std::cell::RefCell;

use crate::arch::{self, Kernels, SKINNY};
use crate::gemm::{
    gather_groups, gathered_len, gemm, gemm_pregathered, groups, panel_len, swap_panels,
    with_panels, with_scratch,
};
use crate::layout::{BView, PackedA, NR};
use crate::{KernelError, KernelSet, Pool};

struct SendPtr(*mut f32);
// SAFETY: shares write disjoint regions.
unsafe impl Sync for SendPtr {}
unsafe impl Send for SendPtr {}

fn bad(msg: String) -> KernelError {
    KernelError::BadShape(msg)
}

/// The public entry points and the argument checks shared by [`Conv1d`] and
/// [`ConvTranspose1d`] (both have `in_ch`, `out_ch`, `out_len`, a private
/// `run(table, input, t_in, t_out, output, pool)` and a private scalar
/// `reference(input, t_in, t_out, output)`).
macro_rules! entry_points {
    ($what:literal, $doc:literal) => {
        /// The checks both constructors make once the sizes are known to be non-zero: channels
        /// divisible by `groups`, a weight of `weight_len` values and a bias of `out_ch` values.
        /// Returns the bias, zeros when none is given.
        fn checked_bias(
            (in_ch, out_ch, groups): (usize, usize, usize),
            weight: &[f32],
            weight_len: usize,
            bias: Option<Vec<f32>>,
        ) -> Result<Vec<f32>, KernelError> {
            if !in_ch.is_multiple_of(groups) || !out_ch.is_multiple_of(groups) {
                return Err(bad(format!(
                    "{} channels {in_ch}/{out_ch} not divisible by groups {groups}",
                    $what
                )));
            }
            crate::check_len(concat!($what, " weight"), weight_len, weight.len())?;
            match bias {
                Some(b) => {
                    crate::check_len(concat!($what, " bias"), out_ch, b.len())?;
                    Ok(b)
                }
                None => Ok(vec![0.0; out_ch]),
            }
        }

        /// Input channels.
        pub fn in_channels(&self) -> usize {
            self.in_ch
        }
        /// Output channels.
        pub fn out_channels(&self) -> usize {
            self.out_ch
        }
        /// Kernel size.
        pub fn kernel_size(&self) -> usize {
            self.k
        }
        /// Stride.
        pub fn stride(&self) -> usize {
            self.stride
        }
        /// Groups.
        pub fn groups(&self) -> usize {
            self.groups
        }

        /// `(t_in, t_out)` of a call of `m` streams side by side (`forward_streams`).
        fn stream_dims(
            &self,
            input: &[f32],
            m: usize,
            output: &[f32],
        ) -> Result<(usize, usize), KernelError> {
            if m == 0 || !input.len().is_multiple_of(self.in_ch * m) {
                return Err(bad(format!(
                    "{} input of {} values for {} channels × {m} streams",
                    $what,
                    input.len(),
                    self.in_ch
                )));
            }
            let t_in = input.len() / (self.in_ch * m);
            let t_out = self.out_len(t_in);
            crate::check_len(
                concat!($what, " output"),
                self.out_ch * m * t_out,
                output.len(),
            )?;
            Ok((t_in, t_out))
        }

        fn dims(&self, input: &[f32], output: &[f32]) -> Result<(usize, usize), KernelError> {
            if !input.len().is_multiple_of(self.in_ch) {
                return Err(bad(format!(
                    "{} input of {} values for {} channels",
                    $what,
                    input.len(),
                    self.in_ch
                )));
            }
            let t_in = input.len() / self.in_ch;
            let t_out = self.out_len(t_in);
            crate::check_len(concat!($what, " output"), self.out_ch * t_out, output.len())?;
            Ok((t_in, t_out))
        }

        #[doc = $doc]
        /// on the calling thread. Returns `t_out`.
        pub fn forward(&self, input: &[f32], output: &mut [f32]) -> Result<usize, KernelError> {
            self.forward_with(arch::active(), input, output, None)
        }

        /// Like [`Self::forward`], split over the pool's threads.
        pub fn forward_pool(
            &self,
            input: &[f32],
            output: &mut [f32],
            pool: &Pool,
        ) -> Result<usize, KernelError> {
            self.forward_with(arch::active(), input, output, Some(pool))
        }

        /// The same GEMM path with the scalar micro-kernel (reference for the SIMD kernel).
        pub fn forward_scalar_gemm(
            &self,
            input: &[f32],
            output: &mut [f32],
        ) -> Result<usize, KernelError> {
            self.forward_with(arch::table(KernelSet::Scalar), input, output, None)
        }

        /// [`Self::forward`] with the kernels of an explicit set, on `pool` when given. Refuses
        /// a set this CPU cannot run ([`KernelError::Unsupported`]).
        pub fn forward_kernel(
            &self,
            kernel: KernelSet,
            input: &[f32],
            output: &mut [f32],
            pool: Option<&Pool>,
        ) -> Result<usize, KernelError> {
            self.forward_with(conv_table(kernel)?, input, output, pool)
        }

        /// Plain scalar definition (direct loops) for tests.
        pub fn forward_reference(
            &self,
            input: &[f32],
            output: &mut [f32],
        ) -> Result<usize, KernelError> {
            let (t_in, t_out) = self.dims(input, output)?;
            self.reference(input, t_in, t_out, output);
            Ok(t_out)
        }

        fn forward_with(
            &self,
            kern: &Kernels,
            input: &[f32],
            output: &mut [f32],
            pool: Option<&Pool>,
        ) -> Result<usize, KernelError> {
            let (t_in, t_out) = self.dims(input, output)?;
            self.run(kern, input, t_in, t_out, output, pool);
            Ok(t_out)
        }
    };
}

/// A 1-D convolution, PyTorch `nn.Conv1d` semantics without padding: the caller pads
/// the input on the left (causal streaming), `t_out = (t_in − (k−1)·dilation − 1)/stride + 1`.
#[derive(Clone, Debug)]
pub struct Conv1d {
    in_ch: usize,
    out_ch: usize,
    k: usize,
    stride: usize,
    dilation: usize,
    groups: usize,
    weight: Vec<f32>,
    bias: Vec<f32>,
    packed: Vec<PackedA>,
}

impl Conv1d {
    /// Builds a convolution from a PyTorch weight `[out_ch, in_ch/groups, k]` (row-major)
    /// and an optional bias `[out_ch]`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        weight: Vec<f32>,
        bias: Option<Vec<f32>>,
        in_ch: usize,
        out_ch: usize,
        k: usize,
        stride: usize,
        dilation: usize,
        groups: usize,
    ) -> Result<Conv1d, KernelError> {
        if in_ch == 0 || out_ch == 0 || k == 0 || stride == 0 || dilation == 0 || groups == 0 {
            return Err(bad(format!("conv1d in {in_ch} out {out_ch} k {k} stride {stride} dilation {dilation} groups {groups}")));
        }
        let (ig, og) = (in_ch / groups, out_ch / groups);
        let bias = Self::checked_bias((in_ch, out_ch, groups), &weight, out_ch * ig * k, bias)?;
        let kk = ig * k;
        let packed = (0..groups)
            .map(|g| PackedA::new(og, kk, |r, c| weight[(g * og + r) * kk + c]))
            .collect();
        Ok(Conv1d {
            in_ch,
            out_ch,
            k,
            stride,
            dilation,
            groups,
            weight,
            bias,
            packed,
        })
    }

    /// Dilation.
    pub fn dilation(&self) -> usize {
        self.dilation
    }
    /// Effective kernel span `(k−1)·dilation + 1`.
    pub fn effective_kernel(&self) -> usize {
        (self.k - 1) * self.dilation + 1
    }
    /// Output length for an input of `t_in` steps (0 when shorter than the kernel span).
    pub fn out_len(&self, t_in: usize) -> usize {
        let ke = self.effective_kernel();
        if t_in < ke {
            0
        } else {
            (t_in - ke) / self.stride + 1
        }
    }

    entry_points!("conv1d", "`output [out, t_out] = conv(input [in, t_in])`");

    fn run(
        &self,
        level: &Kernels,
        input: &[f32],
        t_in: usize,
        t_out: usize,
        output: &mut [f32],
        pool: Option<&Pool>,
    ) {
        if t_out == 0 {
            return;
        }
        SCRATCH.with(|scratch| {
            let ConvScratch { rows, phases, .. } = &mut *scratch.borrow_mut();
            let src = self.gemm_view(input, 1, t_in, pool, rows, phases);
            let rows = &rows[..self.in_ch * self.k];
            self.run_on(level, src, rows, t_out, output, pool);
        })
    }

    /// The GEMM view of `m` streams side by side (`[in, m·t_in]`; one stream is `m = 1`): fills
    /// `rows` with stream j's rows of B at `j·in·k` (row `c·k + i`: channel `c`, tap `i`) and
    /// returns what they index. With a stride, tap i of output t reads input t·s + i·d: a strided
    /// run. Split into phases (phase r of a channel holds its inputs r, r + s, r + 2s, ...), the
    /// same tap reads the consecutive values from (i·d) / s of phase (i·d) % s. Stride 1 reads
    /// the input itself, as its one phase.
    fn gemm_view<'a>(
        &self,
        input: &'a [f32],
        m: usize,
        t_in: usize,
        pool: Option<&Pool>,
        rows: &mut Vec<usize>,
        phases: &'a mut Vec<f32>,
    ) -> &'a [f32] {
        let (k, d, s) = (self.k, self.dilation, self.stride);
        let (src, lp): (&[f32], usize) = if s == 1 {
            (input, t_in)
        } else {
            let lp = t_in.div_ceil(s);
            let ph = fitted(phases, self.in_ch * m * s * lp);
            // Channel c of stream j is row c·m + j of `t_in` values.
            split_phases(input, t_in, s, lp, ph, pool);
            (ph, lp)
        };
        let per_stream = self.in_ch * k;
        for (j, stream) in fitted(rows, m * per_stream)
            .chunks_exact_mut(per_stream)
            .enumerate()
        {
            for (c, taps) in stream.chunks_exact_mut(k).enumerate() {
                for (i, o) in taps.iter_mut().enumerate() {
                    let e = i * d;
                    *o = ((c * m + j) * s + e % s) * lp + e / s;
                }
            }
        }
        src
    }

    /// `m` streams convolved at once, each on its own: every row of `input` holds one channel
    /// of each stream in turn (`[in, m·t_in]`, stream `j`'s `t_in` values at `j·t_in`), and
    /// `output` receives `[out, m·t_out]` the same way. Each output is the one [`Self::forward`]
    /// computes for that stream alone (the same kernel and summation order). On a pool, the
    /// streams are its units of work, one thread each: a stream's input and output then stay
    /// in one core's cache, and the call costs one dispatch instead of one per stream (Mimi's
    /// SEANets for 4 streams on 2 threads: 2.78× one stream's time, against 3.06× with each
    /// stream split over both threads; medians, `docs/bench-log.md`). Returns `t_out`.
    pub fn forward_streams(
        &self,
        input: &[f32],
        m: usize,
        output: &mut [f32],
        pool: Option<&Pool>,
    ) -> Result<usize, KernelError> {
        let (t_in, t_out) = self.stream_dims(input, m, output)?;
        if t_out > 0 {
            self.run_streams(arch::active(), input, m, t_in, t_out, output, pool);
        }
        Ok(t_out)
    }

    /// [`Self::forward_streams`] with the sizes checked.
    #[allow(clippy::too_many_arguments)]
    fn run_streams(
        &self,
        level: &Kernels,
        input: &[f32],
        m: usize,
        t_in: usize,
        t_out: usize,
        output: &mut [f32],
        pool: Option<&Pool>,
    ) {
        SCRATCH.with(|scratch| {
            let ConvScratch { rows, phases, .. } = &mut *scratch.borrow_mut();
            let (k, d, s) = (self.k, self.dilation, self.stride);
            let src = self.gemm_view(input, m, t_in, pool, rows, phases);
            let per_stream = self.in_ch * k;
            let rows: &[usize] = rows;
            let (ig, og) = (self.in_ch / self.groups, self.out_ch / self.groups);
            let ldc = m * t_out;
            let out = SendPtr(output.as_mut_ptr());
            let npanels_n = t_out.div_ceil(NR);
            let in_place = s == 1 && k > 1 && d < NR;
            let one = |j: usize, buf: &mut [f32]| {
                let stream = &rows[j * per_stream..(j + 1) * per_stream];
                for g in 0..self.groups {
                    let b = BView {
                        src,
                        offs: &stream[g * ig * k..(g + 1) * ig * k],
                        n: t_out,
                        in_place,
                    };
                    let out = &out;
                    // SAFETY: output holds out_ch·m·t_out values; stream j writes only its
                    // columns j·t_out.. of every row (row stride ldc).
                    unsafe {
                        gemm(
                            level,
                            &self.packed[g],
                            &b,
                            out.0.add(g * og * ldc + j * t_out),
                            ldc,
                            Some(&self.bias[g * og..]),
                            (0, self.packed[g].panels()),
                            (0, npanels_n),
                            buf,
                        )
                    }
                }
            };
            each_stream(ig * k, t_out, m, pool, &one);
        })
    }

    /// [`Self::run`] on the GEMM view of the input: row `c·k + i` of B (channel `c`, tap `i`)
    /// is `src[rows[c·k + i]..]`, `t_out` consecutive values.
    fn run_on(
        &self,
        level: &Kernels,
        src: &[f32],
        rows: &[usize],
        t_out: usize,
        output: &mut [f32],
        pool: Option<&Pool>,
    ) {
        let (ig, og) = (self.in_ch / self.groups, self.out_ch / self.groups);
        let k = self.k;
        let out = SendPtr(output.as_mut_ptr());
        let npanels_n = t_out.div_ceil(NR);
        // Group g's rows of B.
        let in_place = self.stride == 1 && k > 1 && self.dilation < NR;
        let view = |g: usize| BView {
            src,
            offs: &rows[g * ig * k..(g + 1) * ig * k],
            n: t_out,
            in_place,
        };
        let work = |g: usize, pr: (usize, usize), qr: (usize, usize), buf: &mut [f32]| {
            let b = view(g);
            let out = &out;
            // SAFETY: output holds out_ch·t_out values; shares write disjoint rows/cols.
            unsafe {
                gemm(
                    level,
                    &self.packed[g],
                    &b,
                    out.0.add(g * og * t_out),
                    t_out,
                    Some(&self.bias[g * og..]),
                    pr,
                    qr,
                    buf,
                )
            }
        };
        // Runs `chunks` shares on the pool, each with its own panel buffer. The buffers are sized
        // for the most shares a call of this layer can take (threads · `CHUNKS_PER_THREAD`), whatever
        // `chunks` is now: fewer columns (one stream after a warm-up with four) can switch a
        // layer from a column split to a row split with more chunks, which grew the scratch
        // after warm-up on NEON.
        let split = |pool: &Pool, chunks: usize, share: &(dyn Fn(usize, &mut [f32]) + Sync)| {
            with_panels(ig * k, pool.n_threads() * CHUNKS_PER_THREAD, |panels| {
                pool.run(chunks, &|c| {
                    // SAFETY: chunk c is run once, by one thread.
                    share(c, unsafe { panels.share(c) })
                })
            })
        };
        let nt = pool.map_or(1, |p| p.n_threads());
        if nt <= 1 || (self.out_ch * t_out * ig * k) < 200_000 {
            return with_panels(ig * k, 1, |panels| {
                for g in 0..self.groups {
                    // SAFETY: one share, on this thread.
                    work(g, (0, self.packed[g].panels()), (0, npanels_n), unsafe {
                        panels.share(0)
                    });
                }
            });
        }
        let pool = pool.expect("nt > 1 implies a pool");
        // Chunks of panels (a few per thread), claimed dynamically by the pool's threads;
        // each chunk gathers its own B panels, so chunks are kept coarse.
        // Shares are cut at multiples of the kernel's block (AVX-512: 2 column panels, or
        // 4 row panels when there is a single column panel) so no block is split.
        // With AVX-512, 4–7 column panels on 2 threads are split one panel at a time (24×16
        // blocks) rather than by rows, so every share gathers only its own panel.
        let wide = level.gemm_wide.is_some();
        let (qu, pu) = match () {
            _ if !wide => (1, 1),
            _ if npanels_n >= 4 * nt => (2, 2),
            _ if npanels_n >= 2 * nt => (1, 2),
            _ if npanels_n >= 2 => (2, 2),
            _ => (1, 4),
        };
        for g in 0..self.groups {
            let mp = self.packed[g].panels();
            if npanels_n >= 2 * nt * qu {
                let chunks = npanels_n.div_ceil(qu).min(nt * CHUNKS_PER_THREAD);
                split(pool, chunks, &|c, buf| {
                    work(g, (0, mp), share_units(npanels_n, qu, chunks, c), buf)
                });
            } else if let (Some(wf), true, false) = (level.gemm_wide, t_out > SKINNY, in_place) {
                // B gathered once for all row shares (a view read in place needs no copy: it
                // takes the row split below).
                let b = view(g);
                // SAFETY: output holds out_ch·t_out values; shares write disjoint rows.
                unsafe {
                    rows_pregathered(
                        wf,
                        pool,
                        &self.packed[g],
                        &b,
                        out.0.add(g * og * t_out),
                        t_out,
                        Some(&self.bias[g * og..]),
                        pu,
                    )
                }
            } else {
                let chunks = mp.div_ceil(pu).min(nt * CHUNKS_PER_THREAD);
                split(pool, chunks, &|c, buf| {
                    work(g, share_units(mp, pu, chunks, c), (0, npanels_n), buf)
                });
            }
        }
    }

    /// The direct definition behind `forward_reference` (sizes checked).
    fn reference(&self, input: &[f32], t_in: usize, t_out: usize, output: &mut [f32]) {
        let (ig, og) = (self.in_ch / self.groups, self.out_ch / self.groups);
        for oc in 0..self.out_ch {
            let g = oc / og;
            for t in 0..t_out {
                let mut s = self.bias[oc];
                for ic in 0..ig {
                    for kk in 0..self.k {
                        let w = self.weight[(oc * ig + ic) * self.k + kk];
                        s += w * input[(g * ig + ic) * t_in + t * self.stride + kk * self.dilation];
                    }
                }
                output[oc * t_out + t] = s;
            }
        }
    }
}

/// The scratch buffers of the convolutions, owned by the caller instead of the thread.
///
/// A convolution's scratch (its input's GEMM view, a strided input's phases, a transposed
/// convolution's product, the B panels) lives in the calling thread and grows during warm-up.
/// Work that a pool may hand to any of its threads, such as one conversation's chain of layers
/// run as one task, would grow a worker's scratch whenever that worker first ran it, at an
/// unpredictable frame. Inside [`Workspace::enter`] the thread uses this workspace's buffers
/// instead, so the growth follows the work (warmed up once, wherever it runs next).
#[derive(Debug, Default)]
pub struct Workspace {
    rows: Vec<usize>,
    phases: Vec<f32>,
    z: Vec<f32>,
    panels: Vec<f32>,
}

impl Workspace {
    /// An empty workspace (it grows on first use).
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `f` with this workspace as the calling thread's convolution scratch: the
    /// convolutions `f` runs on this thread (with or without a pool) take their scratch from
    /// here. Not to be nested inside a convolution call.
    pub fn enter<R>(&mut self, f: impl FnOnce() -> R) -> R {
        /// Swaps the buffers in on creation and back on drop (also when `f` panics).
        struct Entered<'a>(&'a mut Workspace);
        impl Entered<'_> {
            fn swap(&mut self) {
                let w = &mut *self.0;
                SCRATCH.with(|s| {
                    let s = &mut *s.borrow_mut();
                    std::mem::swap(&mut s.rows, &mut w.rows);
                    std::mem::swap(&mut s.phases, &mut w.phases);
                    std::mem::swap(&mut s.z, &mut w.z);
                });
                swap_panels(&mut w.panels);
            }
        }
        impl Drop for Entered<'_> {
            fn drop(&mut self) {
                self.swap();
            }
        }
        let mut entered = Entered(self);
        entered.swap();
        f()
    }
}

/// Scratch of the convolutions a thread runs, grown during warm-up.
struct ConvScratch {
    /// The row offsets of the GEMM view of the input.
    rows: Vec<usize>,
    /// A strided convolution's input split into its phases ([`split_phases`]).
    phases: Vec<f32>,
    /// A transposed convolution's GEMM output, before the overlap-add.
    z: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<ConvScratch> = const {
        RefCell::new(ConvScratch {
            rows: Vec::new(),
            phases: Vec::new(),
            z: Vec::new(),
        })
    };
}

/// The first `n` values of a scratch buffer that grows (during warm-up) but never shrinks.
fn fitted<T: Copy + Default>(v: &mut Vec<T>, n: usize) -> &mut [T] {
    if v.len() < n {
        v.resize(n, T::default());
    }
    &mut v[..n]
}

/// Below this many input values a strided input is split on the calling thread.
const PHASES_PAR_MIN: usize = 64 * 1024;

/// Splits `input` (`[channels, t_in]`) into `dst` (`[channels][s][lp]`, `lp = ⌈t_in / s⌉`):
/// phase `r` of a channel holds its values `r, r + s, …`, zero past the end.
fn split_phases(
    input: &[f32],
    t_in: usize,
    s: usize,
    lp: usize,
    dst: &mut [f32],
    pool: Option<&Pool>,
) {
    let channels = input.len() / t_in;
    let split = |c0: usize, c1: usize, dst: &mut [f32]| {
        for (row, out) in input[c0 * t_in..c1 * t_in]
            .chunks_exact(t_in)
            .zip(dst.chunks_exact_mut(s * lp))
        {
            for (r, ph) in out.chunks_exact_mut(lp).enumerate() {
                let n = (t_in - r.min(t_in)).div_ceil(s);
                for (d, v) in ph.iter_mut().zip(row[r.min(t_in)..].iter().step_by(s)) {
                    *d = *v;
                }
                ph[n..].fill(0.0);
            }
        }
    };
    match pool {
        Some(p) if p.n_threads() > 1 && input.len() >= PHASES_PAR_MIN => {
            let parts = p.n_threads().min(channels);
            let out = SendPtr(dst.as_mut_ptr());
            p.run(parts, &|i| {
                let (c0, c1) = share(channels, parts, i);
                let out = &out;
                // SAFETY: share i writes only the phases of channels c0..c1.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(out.0.add(c0 * s * lp), (c1 - c0) * s * lp)
                };
                split(c0, c1, dst)
            });
        }
        _ => split(0, channels, dst),
    }
}

/// `C = A·B` split by row panels over `pool` (shares of `pu` panels), with B gathered once
/// (split by column groups) instead of by every share: for the few-column layers where the
/// rows are what can be split.
///
/// # Safety
/// `wide` belongs to an available table; `c` is valid for `a.m` rows of `ldc` and nobody else writes them.
#[allow(clippy::too_many_arguments)]
unsafe fn rows_pregathered(
    wide: arch::WideFn,
    pool: &Pool,
    a: &PackedA,
    b: &BView<'_>,
    c: *mut f32,
    ldc: usize,
    bias: Option<&[f32]>,
    pu: usize,
) {
    let nt = pool.n_threads();
    with_scratch(gathered_len(a.k, b.n), |buf| {
        let pre = SendPtr(buf.as_mut_ptr());
        let ng = groups(b.n);
        let parts = ng.min(nt);
        pool.run(parts, &|i| {
            let pre = &pre;
            // SAFETY: each share gathers its own groups into the buffer sized above.
            unsafe { gather_groups(b, a.k, share(ng, parts, i), pre.0) }
        });
        let mp = a.panels();
        let chunks = mp.div_ceil(pu).min(nt * CHUNKS_PER_THREAD);
        let out = SendPtr(c);
        pool.run(chunks, &|i| {
            let (pre, out) = (&pre, &out);
            // SAFETY: B is fully gathered (the previous run returned); shares write disjoint
            // row panels of C.
            unsafe {
                gemm_pregathered(
                    wide,
                    a,
                    pre.0,
                    b.n,
                    out.0,
                    ldc,
                    bias,
                    share_units(mp, pu, chunks, i),
                )
            }
        });
    })
}

/// Runs `one(j, panels)` for the streams `0..m` of a `forward_streams` call whose GEMMs have
/// depth `k` and `n` columns: on a pool a stream per share (each with its own panel buffer), else
/// one after the other on this thread. It first grows the panel scratch to what a call of one
/// stream of the same layer can take (its row or column shares, or a pre-gathered B), so a
/// warm-up with several streams also covers later calls of one.
fn each_stream(
    k: usize,
    n: usize,
    m: usize,
    pool: Option<&Pool>,
    one: &(dyn Fn(usize, &mut [f32]) + Sync),
) {
    let nt = pool.map_or(1, |p| p.n_threads());
    with_scratch(
        (panel_len(k) * nt * CHUNKS_PER_THREAD).max(gathered_len(k, n)),
        |_| (),
    );
    match pool {
        Some(p) if nt > 1 => with_panels(k, m, |panels| {
            // SAFETY: stream j is run once, by one thread.
            p.run(m, &|j| one(j, unsafe { panels.share(j) }))
        }),
        _ => with_panels(k, 1, |panels| {
            for j in 0..m {
                // SAFETY: one share, on this thread.
                one(j, unsafe { panels.share(0) })
            }
        }),
    }
}

/// Work chunks per pool thread for the threaded convolutions.
const CHUNKS_PER_THREAD: usize = 3;

/// [`share`] of `n` items in whole units of `unit` items (the last unit may be short).
fn share_units(n: usize, unit: usize, parts: usize, i: usize) -> (usize, usize) {
    let (a, b) = share(n.div_ceil(unit), parts, i);
    ((a * unit).min(n), (b * unit).min(n))
}

fn share(n: usize, parts: usize, i: usize) -> (usize, usize) {
    let base = n / parts;
    let rem = n % parts;
    let a = i * base + i.min(rem);
    (a.min(n), (a + base + usize::from(i < rem)).min(n))
}

/// The table of an explicitly named set, refused when this CPU cannot run it.
fn conv_table(set: KernelSet) -> Result<&'static Kernels, KernelError> {
    if set.available() {
        Ok(arch::table(set))
    } else {
        Err(KernelError::Unsupported(format!(
            "{set:?} convolution kernel on this CPU"
        )))
    }
}

/// A 1-D transposed convolution, PyTorch `nn.ConvTranspose1d` without padding:
/// `t_out = (t_in − 1)·stride + k` (the caller trims / overlap-adds for streaming).
#[derive(Clone, Debug)]
pub struct ConvTranspose1d {
    in_ch: usize,
    out_ch: usize,
    k: usize,
    stride: usize,
    groups: usize,
    weight: Vec<f32>,
    bias: Vec<f32>,
    /// For groups == 1: `A[(oc·k + kk), ic] = W[ic, oc, kk]`.
    packed: Option<PackedA>,
}

impl ConvTranspose1d {
    /// Builds a transposed convolution from a PyTorch weight `[in_ch, out_ch/groups, k]`
    /// and an optional bias `[out_ch]`.
    pub fn new(
        weight: Vec<f32>,
        bias: Option<Vec<f32>>,
        in_ch: usize,
        out_ch: usize,
        k: usize,
        stride: usize,
        groups: usize,
    ) -> Result<ConvTranspose1d, KernelError> {
        if in_ch == 0 || out_ch == 0 || k == 0 || stride == 0 || groups == 0 {
            return Err(bad(format!(
                "conv_transpose1d in {in_ch} out {out_ch} k {k} stride {stride} groups {groups}"
            )));
        }
        let og = out_ch / groups;
        let bias = Self::checked_bias((in_ch, out_ch, groups), &weight, in_ch * og * k, bias)?;
        let packed = (groups == 1).then(|| {
            PackedA::new(out_ch * k, in_ch, |r, ic| {
                weight[(ic * out_ch + r / k) * k + r % k]
            })
        });
        Ok(ConvTranspose1d {
            in_ch,
            out_ch,
            k,
            stride,
            groups,
            weight,
            bias,
            packed,
        })
    }

    /// Output length `(t_in − 1)·stride + k` (0 for an empty input).
    pub fn out_len(&self, t_in: usize) -> usize {
        if t_in == 0 {
            0
        } else {
            (t_in - 1) * self.stride + self.k
        }
    }

    /// The weight `[in_ch, out_ch / groups, k]` as given to [`ConvTranspose1d::new`].
    pub fn weight(&self) -> &[f32] {
        &self.weight
    }

    entry_points!(
        "conv_transpose1d",
        "`output [out, (t−1)·stride + k] = conv_transpose(input [in, t])` (bias included)"
    );

    /// `m` streams transposed-convolved at once, each on its own, laid out as in
    /// [`Conv1d::forward_streams`]: `input` `[in, m·t_in]`, `output` `[out, m·t_out]` with
    /// `t_out = out_len(t_in)`. Each output is the one [`Self::forward`] computes for that
    /// stream alone; on a pool each thread takes whole streams. Needs `groups = 1` (the GEMM
    /// form). Returns `t_out`.
    pub fn forward_streams(
        &self,
        input: &[f32],
        m: usize,
        output: &mut [f32],
        pool: Option<&Pool>,
    ) -> Result<usize, KernelError> {
        if self.packed.is_none() {
            return Err(bad(format!(
                "conv_transpose1d of {} groups: streams need groups = 1",
                self.groups
            )));
        }
        let (t_in, t_out) = self.stream_dims(input, m, output)?;
        if t_out > 0 {
            self.run_streams(arch::active(), input, m, t_in, t_out, output, pool);
        }
        Ok(t_out)
    }

    /// Output row `oc` (`(t_in − 1)·stride + k` values) from the GEMM output `z` (`[out·k,
    /// t_in]`): the bias, then each tap's row added at its stride.
    ///
    /// # Safety
    /// `z` holds `out_ch·k·t_in` values.
    unsafe fn overlap_add(&self, oc: usize, z: *const f32, t_in: usize, y: &mut [f32]) {
        let (k, s) = (self.k, self.stride);
        y.fill(self.bias[oc]);
        for kk in 0..k {
            // SAFETY: row oc·k + kk of z, inside the caller's bound.
            let zr = unsafe { std::slice::from_raw_parts(z.add((oc * k + kk) * t_in), t_in) };
            for (t, v) in zr.iter().enumerate() {
                y[t * s + kk] += v;
            }
        }
    }

    /// [`Self::forward_streams`] with the sizes checked and the packed weight present.
    #[allow(clippy::too_many_arguments)]
    fn run_streams(
        &self,
        level: &Kernels,
        input: &[f32],
        m: usize,
        t_in: usize,
        t_out: usize,
        output: &mut [f32],
        pool: Option<&Pool>,
    ) {
        let Some(pa) = &self.packed else {
            return;
        };
        let k = self.k;
        SCRATCH.with(|scratch| {
            let ConvScratch { rows, z, .. } = &mut *scratch.borrow_mut();
            // Stream j's GEMM output `[out·k, t_in]` at j·zlen of z.
            let zlen = self.out_ch * k * t_in;
            let zp = SendPtr(fitted(z, m * zlen).as_mut_ptr());
            let rows = fitted(rows, m * self.in_ch);
            for (r, o) in rows.iter_mut().enumerate() {
                let (j, c) = (r / self.in_ch, r % self.in_ch);
                *o = (c * m + j) * t_in;
            }
            let rows: &[usize] = rows;
            let nq = t_in.div_ceil(NR);
            let out = SendPtr(output.as_mut_ptr());
            let ldo = m * t_out;
            let one = |j: usize, buf: &mut [f32]| {
                let b = BView {
                    src: input,
                    offs: &rows[j * self.in_ch..(j + 1) * self.in_ch],
                    n: t_in,
                    in_place: false,
                };
                let (zp, out) = (&zp, &out);
                // SAFETY: z holds m·zlen values and stream j writes only its own zlen.
                let zj = unsafe { zp.0.add(j * zlen) };
                unsafe {
                    gemm(
                        level,
                        pa,
                        &b,
                        zj,
                        t_in,
                        None,
                        (0, pa.panels()),
                        (0, nq),
                        buf,
                    )
                };
                for oc in 0..self.out_ch {
                    // SAFETY: stream j owns columns j·t_out.. of every output row; z is its own.
                    let y = unsafe {
                        std::slice::from_raw_parts_mut(out.0.add(oc * ldo + j * t_out), t_out)
                    };
                    // SAFETY: stream j's z holds out_ch·k·t_in values.
                    unsafe { self.overlap_add(oc, zj, t_in, y) };
                }
            };
            each_stream(pa.k, t_in, m, pool, &one);
        })
    }

    fn run(
        &self,
        level: &Kernels,
        input: &[f32],
        t_in: usize,
        t_out: usize,
        output: &mut [f32],
        pool: Option<&Pool>,
    ) {
        if t_out == 0 {
            return;
        }
        let k = self.k;
        let Some(pa) = &self.packed else {
            return self.direct(input, t_in, t_out, output);
        };
        SCRATCH.with(|scratch| {
            let ConvScratch { rows, z, .. } = &mut *scratch.borrow_mut();
            let m = self.out_ch * k;
            let zp = SendPtr(fitted(z, m * t_in).as_mut_ptr());
            let rows = fitted(rows, self.in_ch);
            for (c, o) in rows.iter_mut().enumerate() {
                *o = c * t_in;
            }
            let b = BView {
                src: input,
                offs: rows,
                n: t_in,
                in_place: false,
            };
            let nq = t_in.div_ceil(NR);
            let nt = pool.map_or(1, |p| p.n_threads());
            let big = m * t_in * self.in_ch >= 200_000;
            let zw = |pr: (usize, usize), buf: &mut [f32]| {
                let zp = &zp;
                // SAFETY: z holds m·t_in values; shares write disjoint rows.
                unsafe { gemm(level, pa, &b, zp.0, t_in, None, pr, (0, nq), buf) }
            };
            let out = SendPtr(output.as_mut_ptr());
            let col2im = |o0: usize, o1: usize| {
                let (zp, out) = (&zp, &out);
                for oc in o0..o1 {
                    // SAFETY: row oc of the output belongs to this share only; z is read-only now.
                    let y = unsafe { std::slice::from_raw_parts_mut(out.0.add(oc * t_out), t_out) };
                    // SAFETY: z holds out_ch·k·t_in values.
                    unsafe { self.overlap_add(oc, zp.0, t_in, y) };
                }
            };
            match pool {
                Some(p) if nt > 1 && big => {
                    let pu = match level.gemm_wide {
                        None => 1,
                        Some(_) if nq >= 2 => 2,
                        Some(_) => 4,
                    };
                    if let (Some(wf), true) = (level.gemm_wide, t_in > SKINNY) {
                        // SAFETY: z holds m·t_in values, written by row shares only.
                        unsafe { rows_pregathered(wf, p, pa, &b, zp.0, t_in, None, pu) }
                    } else {
                        let chunks = pa.panels().div_ceil(pu).min(nt * CHUNKS_PER_THREAD);
                        // Sized for the most chunks any call can take (see `run_on`'s `split`).
                        with_panels(pa.k, nt * CHUNKS_PER_THREAD, |panels| {
                            p.run(chunks, &|c| {
                                // SAFETY: chunk c is run once, by one thread.
                                zw(share_units(pa.panels(), pu, chunks, c), unsafe {
                                    panels.share(c)
                                })
                            })
                        });
                    }
                    p.run(nt, &|i| {
                        let (a, b) = share(self.out_ch, nt, i);
                        col2im(a, b)
                    });
                }
                _ => {
                    // SAFETY: one share, on this thread.
                    with_panels(pa.k, 1, |panels| {
                        zw((0, pa.panels()), unsafe { panels.share(0) })
                    });
                    col2im(0, self.out_ch);
                }
            }
        })
    }

    fn direct(&self, input: &[f32], t_in: usize, t_out: usize, output: &mut [f32]) {
        let (ig, og) = (self.in_ch / self.groups, self.out_ch / self.groups);
        let (k, s) = (self.k, self.stride);
        for oc in 0..self.out_ch {
            output[oc * t_out..(oc + 1) * t_out].fill(self.bias[oc]);
        }
        for ic in 0..self.in_ch {
            let g = ic / ig;
            let x = &input[ic * t_in..(ic + 1) * t_in];
            for o in 0..og {
                let oc = g * og + o;
                let w = &self.weight[(ic * og + o) * k..(ic * og + o + 1) * k];
                let y = &mut output[oc * t_out..(oc + 1) * t_out];
                for (t, &xv) in x.iter().enumerate() {
                    for (kk, &wv) in w.iter().enumerate() {
                        y[t * s + kk] += wv * xv;
                    }
                }
            }
        }
    }

    /// The direct definition behind `forward_reference` (sizes checked).
    fn reference(&self, input: &[f32], t_in: usize, t_out: usize, output: &mut [f32]) {
        let (ig, og) = (self.in_ch / self.groups, self.out_ch / self.groups);
        for oc in 0..self.out_ch {
            let g = oc / og;
            let o = oc % og;
            for tt in 0..t_out {
                let mut acc = self.bias[oc];
                for ic in g * ig..(g + 1) * ig {
                    for kk in 0..self.k {
                        if tt >= kk && (tt - kk) % self.stride == 0 {
                            let t = (tt - kk) / self.stride;
                            if t < t_in {
                                acc +=
                                    self.weight[(ic * og + o) * self.k + kk] * input[ic * t_in + t];
                            }
                        }
                    }
                }
                output[oc * t_out + tt] = acc;
            }
        }
    }
}
