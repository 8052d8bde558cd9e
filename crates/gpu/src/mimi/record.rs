//! Recording a direction's frame: [`Recorder`] makes every launch (its uniform block and bind
//! group) once, when a codec is made; a call then replays them. Each launch runs for every slot
//! listed in the call at once: its workgroup grid carries the listed slots (innermost in x for a
//! grid-launched kernel, one layer of z each for a kernel with a thread per output:
//! [`dispatch`]), and the kernel finds its slot's region of every per-slot buffer through the
//! call's slot list and the strides in its uniform block (see [`super::shaders`]).

use std::sync::Arc;

use model::mimi::Stage;

use super::shaders::{MimiKernel, UNIFORM_WORDS};
use super::storage_usage;
use super::weights::{ConvGpu, ConvTrGpu, GpuMimiWeights, ResGpu, TransformerGpu};
use crate::GpuError;

/// A buffer with one region per slot: slot `s`'s values are `stride` values from `s·stride`.
#[derive(Debug, Clone)]
pub(super) struct SlotBuf {
    pub(super) buf: wgpu::Buffer,
    /// Values (4 bytes each) per slot.
    pub(super) stride: usize,
}

impl SlotBuf {
    /// The byte range of `slot`'s region.
    pub(super) fn region(&self, slot: usize) -> (u64, u64) {
        let bytes = (self.stride * 4) as u64;
        (slot as u64 * bytes, bytes)
    }
}

/// A buffer as a launch binds it, with its slot stride in values (0: one region all slots read,
/// the weights).
pub(super) trait Bind {
    /// The buffer and its slot stride.
    fn bound(&self) -> (&wgpu::Buffer, u32);
}

impl Bind for wgpu::Buffer {
    fn bound(&self) -> (&wgpu::Buffer, u32) {
        (self, 0)
    }
}

impl Bind for SlotBuf {
    fn bound(&self) -> (&wgpu::Buffer, u32) {
        (&self.buf, self.stride as u32)
    }
}

/// Sum length (input channels × taps per output) from which a convolution splits its sum
/// across a workgroup instead of running a thread per output (the SEANet's low-rate stages:
/// 256–1024 channels, 2–96 columns, where a thread per output leaves most of the device idle
/// and each thread a serial loop of thousands of terms).
pub(super) const SPLIT_SUM: usize = 256;

/// Outputs below which a thread per output leaves most of the device idle (a few hundred
/// workgroups of 64).
pub(super) const FEW_THREADS: usize = 16384;

/// Where a convolution's output goes.
#[derive(Debug, Clone, Copy)]
pub(super) enum ConvOut<'b> {
    /// The value.
    Raw(&'b SlotBuf),
    /// The value to the first buffer, its ELU to the second (the input of the next ELU
    /// convolution: the ELU runs once per value).
    Dual(&'b SlotBuf, &'b SlotBuf),
    /// Only the ELU of the value (a buffer read by nothing else).
    Elu(&'b SlotBuf),
}

impl<'b> ConvOut<'b> {
    /// The kernel's `y` and `ye` bindings (`unused` where it writes no `ye`) and its `elu_y`
    /// and `dual` flags.
    fn parts(self, unused: &'b SlotBuf) -> (&'b SlotBuf, &'b SlotBuf, bool, bool) {
        match self {
            ConvOut::Raw(y) => (y, unused, false, false),
            ConvOut::Dual(y, ye) => (y, ye, false, true),
            ConvOut::Elu(y) => (y, unused, true, false),
        }
    }
}

/// One recorded kernel launch.
#[derive(Debug)]
pub(super) struct Launch {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
    /// Workgroups of one slot (x, y); a call launches them for every listed slot.
    groups: (u32, u32),
    /// Whether the listed slots are innermost in x (a grid-launched kernel, see the shaders'
    /// `slot_x`) rather than one layer of z each.
    slots_in_x: bool,
    _uniform: wgpu::Buffer,
}

/// Builds the launches and state of one direction.
pub(super) struct Recorder<'a> {
    pub(super) w: &'a GpuMimiWeights,
    /// Slots of every per-slot buffer.
    slots: usize,
    pub(super) launches: Vec<Launch>,
    /// Streaming state zeroed by a reset.
    state: Vec<SlotBuf>,
    /// Which of `state` are K/V rings.
    rings: Vec<usize>,
    counters: &'a SlotBuf,
    /// The calls' slot list, bound to every launch.
    list: &'a wgpu::Buffer,
    taps: Vec<Tap>,
    /// Bound where a convolution writes no ELU output (never written then).
    dummy: SlotBuf,
}

impl<'a> Recorder<'a> {
    /// A recorder of launches over `slots` slots (`counters` and every buffer it makes have
    /// that many regions), reading the call's slot list from `list`.
    pub(super) fn new(
        w: &'a GpuMimiWeights,
        slots: usize,
        counters: &'a SlotBuf,
        list: &'a wgpu::Buffer,
    ) -> Result<Recorder<'a>, GpuError> {
        Ok(Recorder {
            w,
            slots,
            launches: Vec::new(),
            state: Vec::new(),
            rings: Vec::new(),
            counters,
            list,
            taps: Vec::new(),
            dummy: SlotBuf {
                buf: w.ctx.buffer("mimi unused output", 16, storage_usage())?,
                stride: 0,
            },
        })
    }

    /// A buffer of `floats` values per slot.
    pub(super) fn buffer(&self, label: &str, floats: usize) -> Result<SlotBuf, GpuError> {
        let stride = floats.max(1);
        let bytes = (self.slots * stride * 4) as u64;
        Ok(SlotBuf {
            buf: self.w.ctx.buffer(label, bytes, storage_usage())?,
            stride,
        })
    }

    /// Marks `buffer`'s first `floats` values, as they stand after the launches recorded so
    /// far, as the frame's `stage` (read back by a traced frame only).
    pub(super) fn tap(&mut self, stage: Stage, buffer: &SlotBuf, floats: usize) {
        self.taps.push(Tap {
            after: self.launches.len(),
            stage,
            buffer: buffer.clone(),
            floats,
        });
    }

    /// The recorded direction, once every grid-launched kernel's x times the slots fits in the
    /// device's grid (the slots are innermost in x).
    pub(super) fn finish(self) -> Result<Direction, GpuError> {
        let most = self
            .w
            .ctx
            .device()
            .limits()
            .max_compute_workgroups_per_dimension as usize;
        let widest = self
            .launches
            .iter()
            .filter(|l| l.slots_in_x)
            .map(|l| l.groups.0 as usize);
        if let Some(x) = widest.max().filter(|&x| x * self.slots > most) {
            return Err(GpuError::Unsupported {
                format: "Mimi batch".into(),
                why: format!(
                    "{} slots × {x} workgroups exceed the device's {most} per grid dimension",
                    self.slots
                ),
            });
        }
        Ok(Direction {
            launches: self.launches,
            state: self.state,
            rings: self.rings,
            taps: self.taps,
        })
    }

    fn state(&mut self, label: &str, floats: usize) -> Result<SlotBuf, GpuError> {
        let b = self.buffer(label, floats)?;
        self.state.push(b.clone());
        Ok(b)
    }

    /// Records `k` over `threads` threads (one per index, 64 to a workgroup); `words` are its
    /// fields of the uniform block in the order of [`MimiKernel::params`], after the thread
    /// count.
    pub(super) fn launch(
        &mut self,
        k: MimiKernel,
        words: &[u32],
        bufs: &[&dyn Bind],
        threads: usize,
    ) {
        let groups = threads.div_ceil(64).max(1) as u32;
        let x = groups.min(32768);
        self.launch_grid(k, words, bufs, threads, (x, groups.div_ceil(x)));
    }

    /// Records `k` over the workgroup grid `groups` of one slot (a kernel with its own entry
    /// point, see [`MimiKernel::grid_launched`]); word 0 of its uniform block is `threads`, then
    /// `words`, then the slot stride of each of `bufs` (its storage bindings in order; the slot
    /// list is bound after them).
    pub(super) fn launch_grid(
        &mut self,
        k: MimiKernel,
        words: &[u32],
        bufs: &[&dyn Bind],
        threads: usize,
        groups: (u32, u32),
    ) {
        let ctx = &self.w.ctx;
        let mut block = [0u32; UNIFORM_WORDS];
        block[0] = threads as u32;
        block[1..=words.len()].copy_from_slice(words);
        let bound: Vec<(&wgpu::Buffer, u32)> = bufs.iter().map(|b| b.bound()).collect();
        let strides = &mut block[1 + words.len()..1 + words.len() + bound.len()];
        for (s, (_, stride)) in strides.iter_mut().zip(&bound) {
            *s = *stride;
        }
        let bytes: Vec<u8> = block.iter().flat_map(|v| v.to_le_bytes()).collect();
        let uniform = ctx.uniform("mimi params", &bytes);
        let (pipeline, layout) = &self.w.kernels[&k];
        let mut all = vec![&uniform];
        all.extend(bound.iter().map(|(b, _)| *b));
        all.push(self.list);
        let bind = ctx.bind_layout(layout, &all);
        self.launches.push(Launch {
            pipeline: pipeline.clone(),
            bind,
            groups,
            slots_in_x: k.grid_launched(),
            _uniform: uniform,
        });
    }

    /// `y [cout, tin/stride] (+)= conv(x [cin, tin])` with the convolution's history, the
    /// output going to `out`. The input is read as it is (an ELU convolution reads the ELU
    /// buffer its producer wrote). A long sum (`cin·k` ≥ [`SPLIT_SUM`], or a quarter of it over
    /// fewer than [`FEW_THREADS`] outputs) runs as [`MimiKernel::ConvSplit`], a workgroup per
    /// output channel and 8 columns; a short one as [`MimiKernel::Conv`], a thread per output.
    pub(super) fn conv(
        &mut self,
        c: &ConvGpu,
        x: &SlotBuf,
        tin: usize,
        out: ConvOut<'_>,
        accumulate: bool,
        frames_counter: u32,
    ) -> Result<(), GpuError> {
        let s = &c.shape;
        let pad = s.pad();
        let tout = tin / s.stride;
        let hist = self.state("conv history", s.cin * pad)?;
        let dummy = self.dummy.clone();
        let (y, ye, elu_y, dual) = out.parts(&dummy);
        let words = [
            s.cin as u32,
            s.cout as u32,
            s.k as u32,
            s.stride as u32,
            s.dilation as u32,
            pad as u32,
            tin as u32,
            tout as u32,
            s.replicate as u32,
            frames_counter,
            accumulate as u32,
            elu_y as u32,
            dual as u32,
        ];
        let counters = self.counters;
        let bufs: [&dyn Bind; 7] = [x, &hist, &c.weight, &c.bias, y, ye, counters];
        let sum = s.cin * s.k;
        // A medium sum splits too where a thread per output would fill few workgroups (the
        // decoder's last convolution: 1920 outputs of 192 terms).
        if sum >= SPLIT_SUM || (sum >= SPLIT_SUM / 4 && s.cout * tout < FEW_THREADS) {
            let groups = (s.cout as u32, tout.div_ceil(8) as u32);
            self.launch_grid(MimiKernel::ConvSplit, &words, &bufs, s.cout * tout, groups);
        } else {
            self.launch(MimiKernel::Conv, &words, &bufs, s.cout * tout);
        }
        if pad > 0 {
            let words = [
                s.cin as u32,
                pad as u32,
                tin as u32,
                s.replicate as u32,
                frames_counter,
            ];
            self.launch(
                MimiKernel::ConvHistory,
                &words,
                &[x, &hist, counters],
                s.cin,
            );
        }
        Ok(())
    }

    /// `y [cout, tin·stride] = convtr(x [cin, tin])` with its tail, the output going to `out`.
    /// Groups 1 with a long sum (`cin·⌈k/stride⌉` ≥ [`SPLIT_SUM`]) runs as
    /// [`MimiKernel::ConvTrSplit`] and a copy of the new tail; otherwise
    /// [`MimiKernel::ConvTranspose`], a thread per output.
    pub(super) fn conv_tr(
        &mut self,
        c: &ConvTrGpu,
        x: &SlotBuf,
        tin: usize,
        out: ConvOut<'_>,
    ) -> Result<(), GpuError> {
        let s = &c.shape;
        let tout = tin * s.stride;
        let pt = s.k - s.stride;
        let tail = self.state("convtr tail", s.cout * pt)?;
        let dummy = self.dummy.clone();
        let (y, ye, elu_y, dual) = out.parts(&dummy);
        let words = [
            s.cin as u32,
            s.cout as u32,
            s.k as u32,
            s.stride as u32,
            tin as u32,
            tout as u32,
            pt as u32,
            s.depthwise as u32,
            0,
            elu_y as u32,
            dual as u32,
        ];
        if !s.depthwise && s.cin * s.k.div_ceil(s.stride) >= SPLIT_SUM {
            let tail_new = self.buffer("convtr new tail", (s.cout * pt).max(1))?;
            let groups = (s.cout as u32, (tout + pt).div_ceil(8) as u32);
            self.launch_grid(
                MimiKernel::ConvTrSplit,
                &words,
                &[x, &tail, &c.weight, &c.bias, y, ye, &tail_new],
                s.cout * (tout + pt),
                groups,
            );
            if pt > 0 {
                // A transpose of [n, 1] is a copy of n values.
                let n = s.cout * pt;
                self.launch(
                    MimiKernel::Transpose,
                    &[n as u32, 1],
                    &[&tail_new, &tail],
                    n,
                );
            }
        } else {
            self.launch(
                MimiKernel::ConvTranspose,
                &words,
                &[x, &tail, &c.weight, &c.bias, y, ye],
                s.cout * tout,
            );
        }
        Ok(())
    }

    /// `y = x · Wᵀ` for `rows` rows of `cols` values, `outs` outputs each; `mode` as in
    /// [`MimiKernel::Linear`] (0 written, 1 added to `y` through the LayerScale `scale`, 2
    /// through GELU).
    pub(super) fn linear(
        &mut self,
        x: &SlotBuf,
        w: &wgpu::Buffer,
        y: &SlotBuf,
        scale: &wgpu::Buffer,
        (rows, cols, outs): (usize, usize, usize),
        mode: u32,
    ) {
        self.launch_grid(
            MimiKernel::Linear,
            &[rows as u32, cols as u32, outs as u32, mode],
            &[x, w, y, scale],
            rows * outs,
            (outs.div_ceil(8) as u32, rows.div_ceil(4) as u32),
        );
    }

    /// `y` = LayerNorm (with `weight` and `bias`, eps 1e-5) of the `rows` rows of `d` values of `x`.
    pub(super) fn layer_norm(
        &mut self,
        x: &SlotBuf,
        (weight, bias): (&wgpu::Buffer, &wgpu::Buffer),
        y: &SlotBuf,
        rows: usize,
        d: usize,
    ) {
        let words = [rows as u32, d as u32, 1e-5f32.to_bits()];
        self.launch_grid(
            MimiKernel::LayerNorm,
            &words,
            &[x, weight, bias, y],
            rows,
            (rows as u32, 1),
        );
    }

    /// The split-RVQ search of one latent step (projected latents `u_first`, `u_rest`), every
    /// level in order: per level a [`MimiKernel::RvqScore`] over all centroids and a
    /// [`MimiKernel::RvqPick`]; `codes_out` gets the codes and the number of unproven levels.
    pub(super) fn rvq_search(
        &mut self,
        u_first: &SlotBuf,
        u_rest: &SlotBuf,
        codes_out: &SlotBuf,
    ) -> Result<(), GpuError> {
        let w = self.w;
        let m = &w.mimi;
        let (cb, bins, nq) = (w.cb_dim, m.cardinality(), m.n_codebooks());
        let resid = self.buffer("rvq residual", cb)?;
        let scored = self.buffer("rvq scored", 2 * bins)?;
        for q in 0..nq {
            self.launch_grid(
                MimiKernel::RvqScore,
                &[cb as u32, bins as u32, q as u32, w.rvq.bound.to_bits()],
                &[u_first, &resid, &w.rvq.centroids, &w.rvq.stats, &scored],
                bins,
                (bins.div_ceil(8) as u32, 1),
            );
            self.launch_grid(
                MimiKernel::RvqPick,
                &[cb as u32, bins as u32, nq as u32, q as u32],
                &[u_rest, &w.rvq.centroids, &scored, &resid, codes_out],
                1,
                (1, 1),
            );
        }
        Ok(())
    }

    /// The latent `y` (`[dim]`) of one frame's `codes` ([`MimiKernel::RvqDecode`]).
    pub(super) fn rvq_decode(&mut self, codes: &SlotBuf, y: &SlotBuf) {
        let w = self.w;
        let m = &w.mimi;
        let (d, bins, nq) = (m.dimension(), m.cardinality(), m.n_codebooks());
        let g = &w.rvq;
        self.launch_grid(
            MimiKernel::RvqDecode,
            &[d as u32, w.cb_dim as u32, bins as u32, nq as u32],
            &[
                codes,
                &g.centroids,
                &g.first_output_proj,
                &g.rest_output_proj,
                y,
            ],
            d,
            (d.div_ceil(8) as u32, 1),
        );
    }

    /// A residual unit in place on `a` (`[dim, t]`) and its ELU `ea`, `h` its hidden scratch
    /// (which holds the ELU of the first convolution's output, all the second one reads).
    pub(super) fn res(
        &mut self,
        r: &ResGpu,
        (a, ea): (&SlotBuf, &SlotBuf),
        h: &SlotBuf,
        t: usize,
    ) -> Result<(), GpuError> {
        self.conv(&r.c1, ea, t, ConvOut::Elu(h), false, 0)?;
        self.conv(&r.c2, h, t, ConvOut::Dual(a, ea), true, 0)
    }

    /// Opens a run of `tr`'s layers on `io` (`[d, t]` channel-major): its rows into the run's
    /// work buffers. Then [`Recorder::transformer_layer`] per layer of the run and
    /// [`Recorder::transformer_leave`].
    pub(super) fn transformer_enter(
        &mut self,
        tr: &TransformerGpu,
        io: &SlotBuf,
        t: usize,
    ) -> Result<TrBufs, GpuError> {
        let (d, ff) = (tr.d, tr.ff);
        if t > tr.context {
            return Err(GpuError::Unsupported {
                format: "Mimi transformer".into(),
                why: format!("{t} steps per frame exceed the context {}", tr.context),
            });
        }
        let b = TrBufs {
            x: self.buffer("tr x", t * d)?,
            h: self.buffer("tr h", t * d)?,
            qkv: self.buffer("tr qkv", t * 3 * d)?,
            att: self.buffer("tr att", t * d)?,
            f: self.buffer("tr ff", t * ff)?,
        };
        self.launch(
            MimiKernel::Transpose,
            &[d as u32, t as u32],
            &[io, &b.x],
            t * d,
        );
        Ok(b)
    }

    /// Layer `l` of `tr` on the run's rows (its own K/V rings), its position at counter `pos`.
    pub(super) fn transformer_layer(
        &mut self,
        tr: &TransformerGpu,
        b: &TrBufs,
        l: usize,
        t: usize,
        pos: u32,
    ) -> Result<(), GpuError> {
        let d = tr.d;
        let hd = d / tr.heads;
        let (l, cap) = (&tr.layers[l], tr.context);
        let counters = self.counters;
        // A frame writes its entries at the slots its position names before it reads any:
        // replaying it from the same position needs no copy of the rings (see
        // `Direction::rings`).
        self.rings.extend([self.state.len(), self.state.len() + 1]);
        let kc = self.state("k ring", cap * d)?;
        let vc = self.state("v ring", cap * d)?;
        let TrBufs { x, h, qkv, att, f } = b;
        self.layer_norm(x, (&l.norm1_w, &l.norm1_b), h, t, d);
        self.linear(h, &l.in_proj, qkv, &l.ls1, (t, d, 3 * d), 0);
        let rope = [
            t as u32,
            d as u32,
            tr.heads as u32,
            hd as u32,
            cap as u32,
            pos,
        ];
        self.launch(
            MimiKernel::RopeStore,
            &rope,
            &[qkv, &kc, &vc, &tr.freqs, counters],
            t * d / 2,
        );
        let scale = 1.0 / (hd as f32).sqrt();
        let attn = [
            t as u32,
            d as u32,
            tr.heads as u32,
            hd as u32,
            cap as u32,
            tr.context as u32,
            pos,
            scale.to_bits(),
        ];
        self.launch_grid(
            MimiKernel::Attention,
            &attn,
            &[qkv, &kc, &vc, att, counters],
            t * tr.heads,
            (tr.heads as u32, t as u32),
        );
        self.linear(att, &l.out_proj, x, &l.ls1, (t, d, d), 1);
        self.layer_norm(x, (&l.norm2_w, &l.norm2_b), h, t, d);
        self.linear(h, &l.linear1, f, &l.ls2, (t, d, tr.ff), 2);
        self.linear(f, &l.linear2, x, &l.ls2, (t, tr.ff, d), 1);
        Ok(())
    }

    /// Closes a run: the position at counter `pos` advances by `t` and the rows go back to `io`.
    pub(super) fn transformer_leave(
        &mut self,
        tr: &TransformerGpu,
        b: &TrBufs,
        io: &SlotBuf,
        t: usize,
        pos: u32,
    ) {
        self.launch_grid(
            MimiKernel::Advance,
            &[pos, t as u32],
            &[self.counters],
            1,
            (1, 1),
        );
        self.launch(
            MimiKernel::Transpose,
            &[t as u32, tr.d as u32],
            &[&b.x, io],
            t * tr.d,
        );
    }
}

/// The work buffers of a run of transformer layers (rows `[t, ·]` per slot).
#[derive(Debug)]
pub(super) struct TrBufs {
    x: SlotBuf,
    h: SlotBuf,
    qkv: SlotBuf,
    att: SlotBuf,
    f: SlotBuf,
}

/// A point of a frame whose intermediate a traced frame reads back.
#[derive(Debug)]
pub(super) struct Tap {
    /// The tap reads the buffer after this many launches of the direction.
    pub(super) after: usize,
    pub(super) stage: Stage,
    pub(super) buffer: SlotBuf,
    pub(super) floats: usize,
}

/// One direction's recorded frame.
#[derive(Debug)]
pub(super) struct Direction {
    pub(super) launches: Vec<Launch>,
    /// Streaming state zeroed by a reset (one region per slot).
    pub(super) state: Vec<SlotBuf>,
    /// The indices in `state` of the transformer's K/V rings: a frame overwrites the ring slots
    /// of its positions before it attends, so a frame replayed from the same position (counters
    /// restored) reads what the first run read; the other state (convolution histories,
    /// transposed-convolution tails) is read before it is rewritten and must be restored.
    pub(super) rings: Vec<usize>,
    pub(super) taps: Vec<Tap>,
}

impl Direction {
    /// Floats a traced frame of this direction reads back (every tap, back to back).
    pub(super) fn tap_floats(&self) -> usize {
        self.taps.iter().map(|t| t.floats).sum()
    }
}

/// Records `launches` into an open compute pass for the `listed` slots of the call's slot list:
/// each launch once, over its grid for every listed slot: the slots innermost in x for a
/// grid-launched kernel (the workgroups that read the same weights run side by side), else one
/// layer of z per slot (a kernel with a thread per output, whose weights are small).
pub(super) fn dispatch(pass: &mut wgpu::ComputePass<'_>, launches: &[Launch], listed: usize) {
    let n = listed as u32;
    for l in launches {
        pass.set_pipeline(&l.pipeline);
        pass.set_bind_group(0, &l.bind, &[]);
        let (x, y) = l.groups;
        let grid = if l.slots_in_x {
            [x * n, y, 1]
        } else {
            [x, y, n]
        };
        let mark = crate::profile::before(pass, &l.pipeline, &l.bind, grid);
        pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
        crate::profile::after(pass, mark);
    }
}
