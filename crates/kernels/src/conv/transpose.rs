//! [`ConvTranspose1d`]: a 1-D transposed convolution as a GEMM and an overlap-add, or a direct loop
//! when grouped.

use crate::arch::{self, Kernels, SKINNY};
use crate::gemm::{gemm, with_panels};
use crate::layout::{BView, PackedA, NR};
use crate::{KernelError, KernelSet, Pool};

use super::entry::{bad, entry_points};
use super::par::{each_stream, rows_pregathered, share, share_units, SendPtr, CHUNKS_PER_THREAD};
use super::scratch::{fitted, ConvScratch, SCRATCH};

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
    /// [`super::Conv1d::forward_streams`]: `input` `[in, m·t_in]`, `output` `[out, m·t_out]` with
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
