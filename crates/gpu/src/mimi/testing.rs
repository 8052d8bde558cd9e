//! Hidden entry points of the kernel property tests (`crates/gpu/tests/mimi_kernels.rs`): each
//! records one of the codec's launch sequences (the same [`Recorder`] methods a frame records)
//! at shapes the test picks, over buffers filled from the test's values, runs it and reads the
//! result back. For tests only: everything is allocated per call.

use model::mimi::{ConvTrWeights, ConvWeights};

use super::record::{ConvOut, Recorder, SlotBuf};
use super::shaders::MimiKernel;
use super::weights::{GpuMimiWeights, Uploader};
use super::{f32_bytes, storage_usage};
use crate::GpuError;

/// How a tested convolution writes its output (see the codec's `ConvOut`).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestConvOut {
    /// The value.
    Raw,
    /// The value, and its ELU into a second buffer.
    Dual,
    /// Only the ELU of the value.
    Elu,
}

impl GpuMimiWeights {
    /// A storage buffer holding `v` as one slot's region, that the readback may copy from.
    fn test_buffer(&self, v: &[f32]) -> Result<SlotBuf, GpuError> {
        let stride = v.len().max(1);
        let buf = self
            .ctx
            .buffer("mimi test", (stride * 4) as u64, storage_usage())?;
        self.ctx.queue().write_buffer(&buf, 0, &f32_bytes(v));
        Ok(SlotBuf { buf, stride })
    }

    /// The slot list of a one-slot test: slot 0.
    fn test_list(&self) -> Result<wgpu::Buffer, GpuError> {
        let list = [1u32, 0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>();
        self.ctx.storage_init("mimi test slot list", &list)
    }

    /// Runs `r`'s launches in one submission (after `first` is written to `input`, when given)
    /// and reads back the first `floats` values of each of `outs`, back to back.
    fn test_run(
        &self,
        r: &mut Recorder<'_>,
        input: Option<(&SlotBuf, &[f32])>,
        outs: &[(&SlotBuf, usize)],
    ) -> Result<Vec<f32>, GpuError> {
        let ctx = &self.ctx;
        if let Some((b, v)) = input {
            ctx.queue().write_buffer(&b.buf, 0, &f32_bytes(v));
        }
        let total: usize = outs.iter().map(|o| o.1).sum();
        let read = wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST;
        let rb = ctx.buffer("mimi test readback", (total.max(1) * 4) as u64, read)?;
        let mut enc = ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            super::record::dispatch(&mut pass, &r.launches, 1);
        }
        let mut off = 0;
        for (b, n) in outs {
            enc.copy_buffer_to_buffer(&b.buf, 0, &rb, off, (*n * 4) as u64);
            off += (*n * 4) as u64;
        }
        ctx.submit(enc.finish());
        let mut out = vec![0.0; total];
        crate::context::read_mapped(ctx, &rb, &mut out)?;
        Ok(out)
    }

    /// `y` after the codec's Linear launch `mode` (0 write, 1 `y += scale·xWᵀ`, 2 GELU) on
    /// `rows × cols` activations `x`, `outs × cols` weights `w` and the initial `y`.
    #[doc(hidden)]
    pub fn test_linear(
        &self,
        (x, w, y, scale): (&[f32], &[f32], &[f32], &[f32]),
        (rows, cols, outs): (usize, usize, usize),
        mode: u32,
    ) -> Result<Vec<f32>, GpuError> {
        let counters = self.test_buffer(&[0.0; 4])?;
        let list = self.test_list()?;
        let mut r = Recorder::new(self, 1, &counters, &list)?;
        let (xb, wb, yb, sb) = (
            self.test_buffer(x)?,
            self.test_buffer(w)?,
            self.test_buffer(y)?,
            self.test_buffer(scale)?,
        );
        r.linear(&xb, &wb.buf, &yb, &sb.buf, (rows, cols, outs), mode);
        self.test_run(&mut r, None, &[(&yb, rows * outs)])
    }

    /// The codec's LayerNorm (eps 1e-5) of `rows` rows of `d` values.
    #[doc(hidden)]
    pub fn test_layer_norm(
        &self,
        x: &[f32],
        (weight, bias): (&[f32], &[f32]),
        rows: usize,
        d: usize,
    ) -> Result<Vec<f32>, GpuError> {
        let counters = self.test_buffer(&[0.0; 4])?;
        let list = self.test_list()?;
        let mut r = Recorder::new(self, 1, &counters, &list)?;
        let (xb, wb, bb) = (
            self.test_buffer(x)?,
            self.test_buffer(weight)?,
            self.test_buffer(bias)?,
        );
        let yb = self.test_buffer(&vec![0.0; rows * d])?;
        r.layer_norm(&xb, (&wb.buf, &bb.buf), &yb, rows, d);
        self.test_run(&mut r, None, &[(&yb, rows * d)])
    }

    /// A streaming convolution over `frames` (each `[cin, tin]`), one submission per frame: per
    /// frame its output `[cout, tin/stride]` (added to `y0` when given), then under
    /// [`TestConvOut::Dual`] the ELU output.
    #[doc(hidden)]
    pub fn test_conv(
        &self,
        c: &ConvWeights,
        frames: &[Vec<f32>],
        tin: usize,
        out: TestConvOut,
        y0: Option<&[f32]>,
    ) -> Result<Vec<f32>, GpuError> {
        let up = Uploader { ctx: &self.ctx };
        let cg = up.conv(c)?;
        let counters = self.test_buffer(&[0.0; 4])?;
        let list = self.test_list()?;
        let mut r = Recorder::new(self, 1, &counters, &list)?;
        let n = c.cout * (tin / c.stride);
        let x = self.test_buffer(&vec![0.0; c.cin * tin])?;
        let init = y0.map(<[f32]>::to_vec).unwrap_or_else(|| vec![0.0; n]);
        let y = self.test_buffer(&init)?;
        let ye = self.test_buffer(&vec![0.0; n])?;
        let o = match out {
            TestConvOut::Raw => ConvOut::Raw(&y),
            TestConvOut::Dual => ConvOut::Dual(&y, &ye),
            TestConvOut::Elu => ConvOut::Elu(&y),
        };
        // Recorded once (its history buffer with it), run once per frame.
        r.conv(&cg, &x, tin, o, y0.is_some(), 0)?;
        r.launch_grid(MimiKernel::Advance, &[0, 1], &[&counters], 1, (1, 1));
        let mut all = Vec::new();
        for f in frames {
            self.ctx.queue().write_buffer(&y.buf, 0, &f32_bytes(&init));
            let outs: &[(&SlotBuf, usize)] = if out == TestConvOut::Dual {
                &[(&y, n), (&ye, n)]
            } else {
                &[(&y, n)]
            };
            all.extend(self.test_run(&mut r, Some((&x, f)), outs)?);
        }
        Ok(all)
    }

    /// A streaming convolution (output `Raw`) over `slots` slots, one submission per tick: tick
    /// `i` lists the slots `ticks[i].0` (in that order) with their inputs `ticks[i].1`, one
    /// `[cin, tin]` frame per listed slot, back to back. Returns per tick the whole output
    /// buffer: every slot's region `[cout, tin/stride]` in slot order (a slot left out of a
    /// tick keeps what it had).
    #[doc(hidden)]
    pub fn test_conv_slots(
        &self,
        c: &ConvWeights,
        slots: usize,
        ticks: &[(Vec<usize>, Vec<f32>)],
        tin: usize,
    ) -> Result<Vec<Vec<f32>>, GpuError> {
        let ctx = &self.ctx;
        let up = Uploader { ctx };
        let cg = up.conv(c)?;
        let counters = SlotBuf {
            buf: ctx.buffer("mimi test counters", (slots * 16) as u64, storage_usage())?,
            stride: 4,
        };
        let list = ctx.buffer(
            "mimi test slot list",
            ((slots + 1) * 4) as u64,
            storage_usage(),
        )?;
        let mut r = Recorder::new(self, slots, &counters, &list)?;
        let n = c.cout * (tin / c.stride);
        let x = r.buffer("mimi test x", c.cin * tin)?;
        let y = r.buffer("mimi test y", n)?;
        r.conv(&cg, &x, tin, ConvOut::Raw(&y), false, 0)?;
        r.launch_grid(MimiKernel::Advance, &[0, 1], &[&counters], 1, (1, 1));
        let read = wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST;
        let rb = ctx.buffer("mimi test readback", (slots * n * 4) as u64, read)?;
        let mut all = Vec::new();
        for (listed, input) in ticks {
            let words: Vec<u32> = std::iter::once(listed.len() as u32)
                .chain(listed.iter().map(|&s| s as u32))
                .collect();
            let bytes: Vec<u8> = words.iter().flat_map(|v| v.to_le_bytes()).collect();
            ctx.queue().write_buffer(&list, 0, &bytes);
            for (i, &s) in listed.iter().enumerate() {
                let frame = &input[i * c.cin * tin..(i + 1) * c.cin * tin];
                ctx.queue()
                    .write_buffer(&x.buf, x.region(s).0, &f32_bytes(frame));
            }
            let mut enc = ctx
                .device()
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
            {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
                super::record::dispatch(&mut pass, &r.launches, listed.len());
            }
            enc.copy_buffer_to_buffer(&y.buf, 0, &rb, 0, (slots * n * 4) as u64);
            ctx.submit(enc.finish());
            let mut out = vec![0.0; slots * n];
            crate::context::read_mapped(ctx, &rb, &mut out)?;
            all.push(out);
        }
        Ok(all)
    }

    /// A streaming transposed convolution over `frames` (each `[cin, tin]`), one submission per
    /// frame: per frame its output `[cout, tin·stride]`.
    #[doc(hidden)]
    pub fn test_conv_tr(
        &self,
        c: &ConvTrWeights,
        frames: &[Vec<f32>],
        tin: usize,
    ) -> Result<Vec<f32>, GpuError> {
        let up = Uploader { ctx: &self.ctx };
        let cg = up.conv_tr(c)?;
        let counters = self.test_buffer(&[0.0; 4])?;
        let list = self.test_list()?;
        let mut r = Recorder::new(self, 1, &counters, &list)?;
        let n = c.cout * tin * c.stride;
        let x = self.test_buffer(&vec![0.0; c.cin * tin])?;
        let y = self.test_buffer(&vec![0.0; n])?;
        // Recorded once (its tail buffer with it), run once per frame.
        r.conv_tr(&cg, &x, tin, ConvOut::Raw(&y))?;
        let mut all = Vec::new();
        for f in frames {
            all.extend(self.test_run(&mut r, Some((&x, f)), &[(&y, n)])?);
        }
        Ok(all)
    }

    /// The codec's attention launch: `rows` query rows of `qkv` (`[rows, 3d]`, only Q read) at
    /// positions `pos ..`, over K/V rings `[cap, d]` already holding every position up to
    /// `pos + rows − 1` (at slot `position % cap`), limited to `context`. Returns `[rows, d]`.
    #[doc(hidden)]
    pub fn test_attention(
        &self,
        (qkv, kc, vc): (&[f32], &[f32], &[f32]),
        (rows, d, heads): (usize, usize, usize),
        (cap, context, pos): (usize, usize, u32),
    ) -> Result<Vec<f32>, GpuError> {
        let counters = self.test_buffer(&[f32::from_bits(pos), 0.0, 0.0, 0.0])?;
        let list = self.test_list()?;
        let mut r = Recorder::new(self, 1, &counters, &list)?;
        let (qb, kb, vb) = (
            self.test_buffer(qkv)?,
            self.test_buffer(kc)?,
            self.test_buffer(vc)?,
        );
        let att = self.test_buffer(&vec![0.0; rows * d])?;
        let hd = d / heads;
        let scale = 1.0 / (hd as f32).sqrt();
        let words = [
            rows as u32,
            d as u32,
            heads as u32,
            hd as u32,
            cap as u32,
            context as u32,
            0,
            scale.to_bits(),
        ];
        r.launch_grid(
            MimiKernel::Attention,
            &words,
            &[&qb, &kb, &vb, &att, &counters],
            rows * heads,
            (heads as u32, rows as u32),
        );
        self.test_run(&mut r, None, &[(&att, rows * d)])
    }

    /// The codec's split-RVQ search on the projected latents `first` and `rest` (`cb_dim`
    /// each) with the uploaded codebooks: every level's code, then the number of levels the
    /// device's bound could not prove.
    #[doc(hidden)]
    pub fn test_rvq_search(&self, first: &[f32], rest: &[f32]) -> Result<Vec<u32>, GpuError> {
        let nq = self.mimi.n_codebooks();
        let counters = self.test_buffer(&[0.0; 4])?;
        let list = self.test_list()?;
        let mut r = Recorder::new(self, 1, &counters, &list)?;
        let (fb, rb) = (self.test_buffer(first)?, self.test_buffer(rest)?);
        let codes = self.test_buffer(&vec![0.0; nq + 1])?;
        r.rvq_search(&fb, &rb, &codes)?;
        let words = self.test_run(&mut r, None, &[(&codes, nq + 1)])?;
        Ok(words.iter().map(|v| v.to_bits()).collect())
    }

    /// The codec's RVQ decode of one frame's `codes` (one per level): the latent `[dim]`.
    #[doc(hidden)]
    pub fn test_rvq_decode(&self, codes: &[u32]) -> Result<Vec<f32>, GpuError> {
        let d = self.mimi.dimension();
        let counters = self.test_buffer(&[0.0; 4])?;
        let list = self.test_list()?;
        let mut r = Recorder::new(self, 1, &counters, &list)?;
        let words: Vec<f32> = codes.iter().map(|&c| f32::from_bits(c)).collect();
        let cb = self.test_buffer(&words)?;
        let y = self.test_buffer(&vec![0.0; d])?;
        r.rvq_decode(&cb, &y);
        self.test_run(&mut r, None, &[(&y, d)])
    }
}
