//! [`Conv1d`]: a 1-D convolution as a blocked GEMM over a view of its input.

use crate::arch::{self, Kernels, SKINNY};
use crate::gemm::{gemm, with_panels};
use crate::layout::{BView, PackedA, NR};
use crate::{KernelError, KernelSet, Pool};

use super::entry::{bad, entry_points};
use super::par::{
    each_stream, rows_pregathered, share_units, split_phases, SendPtr, CHUNKS_PER_THREAD,
};
use super::scratch::{fitted, ConvScratch, SCRATCH};

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
            let ig = self.in_ch / self.groups;
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
                        self.gemm_group(
                            level,
                            g,
                            &b,
                            out.0.add(j * t_out),
                            ldc,
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
            unsafe { self.gemm_group(level, g, &b, out.0, t_out, pr, qr, buf) }
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

    /// Group `g`'s product (bias included) over row panels `pr` and column panels `qr` of its
    /// GEMM, written to its rows of an output whose first column is at `c` (row stride `ldc`).
    ///
    /// # Safety
    /// `c` is valid for `out_ch` rows of `ldc` values and nobody else writes the block this call
    /// writes; `buf` holds a panel share.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm_group(
        &self,
        level: &Kernels,
        g: usize,
        b: &BView<'_>,
        c: *mut f32,
        ldc: usize,
        pr: (usize, usize),
        qr: (usize, usize),
        buf: &mut [f32],
    ) {
        let og = self.out_ch / self.groups;
        // SAFETY: group g's rows start g·og rows into the caller's output.
        unsafe {
            gemm(
                level,
                &self.packed[g],
                b,
                c.add(g * og * ldc),
                ldc,
                Some(&self.bias[g * og..]),
                pr,
                qr,
                buf,
            )
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
