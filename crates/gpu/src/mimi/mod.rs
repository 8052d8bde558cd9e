//! Mimi on the device: [`GpuMimiWeights`] (every codec weight, uploaded once per engine, and the
//! compiled kernels) and [`GpuMimi`] (one conversation's streaming state and the recorded
//! launches of a frame; a [`CodecBackend`]).
//!
//! A frame is one submission: the decoder takes the frame's codes (a `Queue::write_buffer` of
//! `n_codebooks` words) and returns its PCM through one mapped readback buffer; the encoder
//! takes the PCM and returns the codes. Every buffer and bind group is created by
//! [`GpuMimi::new`]; the streaming state (convolution histories, transposed-convolution tails,
//! the transformers' K/V rings, positions) stays in device memory.
//!
//! **Exact codes.** The split-RVQ search runs on the device in f32 and carries a rigorous bound
//! on its own rounding error (see [`MimiKernel::RvqScore`] and [`MimiKernel::RvqPick`]): a level's code is proven when no
//! other centroid's lower bound reaches the winner's upper bound, and then it is the argmin of
//! the exactly evaluated distance, the same code the CPU's f64 decision gives for the same
//! latent. When a level cannot be proven (a near-tie within ~1e-5 relative), the frame's two
//! projected latents (still in device memory) are read back and the host decides every level
//! with the CPU's exact f64 search ([`Mimi::rvq_codes_exact`]).

/// The accessors [`GpuMimi`] and [`GpuMimiBatch`] share, over the fields both keep: the weights
/// `w` and the [`Decider`] `d`.
macro_rules! device_codec_accessors {
    ($codec:ty) => {
        impl $codec {
            /// The device context.
            pub fn context(&self) -> &GpuContext {
                &self.w.ctx
            }

            /// Queue submissions so far: one per call that runs frames (a batch call, one for
            /// all its listed slots), one more per encoded frame whose codes the host decided,
            /// one per reset.
            pub fn submissions(&self) -> u64 {
                self.d.submissions
            }

            /// Encoded frames whose codes the host decided (a level the device's bound could not
            /// prove, or `force_host_decision`).
            pub fn host_decisions(&self) -> u64 {
                self.d.host_decisions
            }

            /// Makes every encoded frame take the host's exact decision path (tests compare it
            /// with the device's proven codes).
            pub fn force_host_decision(&mut self, on: bool) {
                self.d.force_host = on;
            }
        }
    };
}

mod batch;
mod shaders;
mod testing;

pub use batch::GpuMimiBatch;
pub use shaders::MimiKernel;
#[doc(hidden)]
pub use testing::TestConvOut;

use std::collections::HashMap;
use std::sync::Arc;

use model::mimi::{
    CodecBackend, ConvTrWeights, ConvWeights, Mimi, MimiError, ResBlockWeights, Stage,
    TransformerWeights,
};

use crate::context::GpuContext;
use crate::GpuError;

impl From<GpuError> for MimiError {
    fn from(e: GpuError) -> Self {
        MimiError::Config(e.to_string())
    }
}

/// Counter slots (`u32` each) of a [`GpuMimi`]'s counter buffer.
const DEC_POS: u32 = 0;
const ENC_POS: u32 = 2;
const ENC_FRAMES: u32 = 3;
const COUNTERS: usize = 4;

/// Longest attention head the attention kernel holds (its private accumulator).
const MAX_HEAD_DIM: usize = 128;

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn storage_usage() -> wgpu::BufferUsages {
    wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC
}

/// A (transposed) convolution's weight and bias on the device, with its shape (the host's
/// description without its weights).
#[derive(Debug)]
struct OnDevice<S> {
    shape: S,
    weight: wgpu::Buffer,
    bias: wgpu::Buffer,
}

/// A convolution on the device.
type ConvGpu = OnDevice<ConvWeights>;

/// A transposed convolution on the device.
type ConvTrGpu = OnDevice<ConvTrWeights>;

#[derive(Debug)]
struct ResGpu {
    c1: ConvGpu,
    c2: ConvGpu,
}

#[derive(Debug)]
struct LayerGpu {
    norm1_w: wgpu::Buffer,
    norm1_b: wgpu::Buffer,
    in_proj: wgpu::Buffer,
    out_proj: wgpu::Buffer,
    ls1: wgpu::Buffer,
    norm2_w: wgpu::Buffer,
    norm2_b: wgpu::Buffer,
    linear1: wgpu::Buffer,
    linear2: wgpu::Buffer,
    ls2: wgpu::Buffer,
}

#[derive(Debug)]
struct TransformerGpu {
    d: usize,
    heads: usize,
    ff: usize,
    context: usize,
    /// RoPE frequencies `[head_dim / 2]`, computed as the CPU computes them.
    freqs: wgpu::Buffer,
    layers: Vec<LayerGpu>,
}

#[derive(Debug)]
struct DecoderGpu {
    centroids: wgpu::Buffer,
    first_output_proj: wgpu::Buffer,
    rest_output_proj: wgpu::Buffer,
    upsample: ConvTrGpu,
    transformer: TransformerGpu,
    conv0: ConvGpu,
    stages: Vec<(ConvTrGpu, Vec<ResGpu>)>,
    last: ConvGpu,
}

#[derive(Debug)]
struct EncoderGpu {
    /// Per centroid: `½‖c‖²` (rounded from f64) and `‖c‖`.
    stats: wgpu::Buffer,
    first_input_proj: wgpu::Buffer,
    rest_input_proj: wgpu::Buffer,
    conv0: ConvGpu,
    stages: Vec<(Vec<ResGpu>, ConvGpu)>,
    last: ConvGpu,
    transformer: TransformerGpu,
    downsample: ConvGpu,
    /// Relative error bound of the search's f32 dot products (see [`rvq_bound`]).
    bound: f32,
}

/// Every Mimi weight in device memory (f32) and the compiled kernels; shared (behind an `Arc`)
/// by the [`GpuMimi`] backends of one engine.
pub struct GpuMimiWeights {
    ctx: GpuContext,
    mimi: Arc<Mimi>,
    kernels: HashMap<MimiKernel, (Arc<wgpu::ComputePipeline>, Arc<wgpu::BindGroupLayout>)>,
    cb_dim: usize,
    dec: DecoderGpu,
    enc: EncoderGpu,
    weight_bytes: u64,
}

impl std::fmt::Debug for GpuMimiWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuMimiWeights")
            .field("adapter", self.ctx.adapter())
            .field("n_codebooks", &self.mimi.n_codebooks())
            .finish()
    }
}

/// Relative error bound of an f32 dot product of `n` terms in any summation order, as a multiple
/// of `‖c‖·‖x‖`: γₙ = n·u / (1 − n·u) with u = 2⁻²⁴ (Cauchy–Schwarz bounds Σ|cⱼxⱼ|), plus the
/// f64 evaluation's own γₙ (so a proven code is also the f64 argmin), doubled to cover the f32
/// arithmetic of `‖x‖` and of the bound itself.
fn rvq_bound(n: usize) -> f32 {
    let gamma = |u: f64| {
        let nu = n as f64 * u;
        nu / (1.0 - nu).max(0.5)
    };
    (2.0 * (gamma(f32::EPSILON as f64 / 2.0) + gamma(f64::EPSILON / 2.0))) as f32
}

struct Uploader<'a> {
    ctx: &'a GpuContext,
}

impl Uploader<'_> {
    fn f32s(&self, label: &str, v: &[f32]) -> Result<wgpu::Buffer, GpuError> {
        self.ctx.storage_init(label, &f32_bytes(v))
    }

    /// Uploads a (transposed) convolution's `weight` and `bias` (labelled `what`), keeping `shape`.
    fn on_device<S>(
        &self,
        what: &str,
        weight: &[f32],
        bias: &[f32],
        shape: S,
    ) -> Result<OnDevice<S>, GpuError> {
        Ok(OnDevice {
            weight: self.f32s(&format!("{what} weight"), weight)?,
            bias: self.f32s(&format!("{what} bias"), bias)?,
            shape,
        })
    }

    fn conv(&self, c: &ConvWeights) -> Result<ConvGpu, GpuError> {
        let shape = ConvWeights {
            weight: Vec::new(),
            bias: Vec::new(),
            ..c.clone()
        };
        self.on_device("conv", &c.weight, &c.bias, shape)
    }

    fn conv_tr(&self, c: &ConvTrWeights) -> Result<ConvTrGpu, GpuError> {
        if c.k < c.stride || c.k - c.stride > c.stride {
            return Err(GpuError::Unsupported {
                format: "Mimi transposed convolution".into(),
                why: format!(
                    "kernel {} with stride {} (the device keeps a tail of at most one stride)",
                    c.k, c.stride
                ),
            });
        }
        let shape = ConvTrWeights {
            weight: Vec::new(),
            bias: Vec::new(),
            ..c.clone()
        };
        // On the device `[cout, cin, k]` (a depthwise `[cout, 1, k]` is already that): a
        // workgroup of one output channel reads its weights as one contiguous block.
        let weight = if c.depthwise {
            c.weight.clone()
        } else {
            let (cin, cout, k) = (c.cin, c.cout, c.k);
            let mut w = vec![0.0; cin * cout * k];
            for ci in 0..cin {
                for o in 0..cout {
                    let from = (ci * cout + o) * k;
                    let to = (o * cin + ci) * k;
                    w[to..to + k].copy_from_slice(&c.weight[from..from + k]);
                }
            }
            w
        };
        self.on_device("convtr", &weight, &c.bias, shape)
    }

    fn res(&self, r: &[ResBlockWeights]) -> Result<Vec<ResGpu>, GpuError> {
        r.iter()
            .map(|b| {
                Ok(ResGpu {
                    c1: self.conv(&b.c1)?,
                    c2: self.conv(&b.c2)?,
                })
            })
            .collect()
    }

    fn transformer(&self, t: &TransformerWeights) -> Result<TransformerGpu, GpuError> {
        let hd = t.d / t.heads.max(1);
        if t.heads == 0
            || !t.d.is_multiple_of(t.heads)
            || !hd.is_multiple_of(2)
            || hd > MAX_HEAD_DIM
        {
            return Err(GpuError::Unsupported {
                format: "Mimi transformer".into(),
                why: format!(
                    "width {} over {} heads (head size must be even and at most {MAX_HEAD_DIM})",
                    t.d, t.heads
                ),
            });
        }
        // As the CPU: freq_i = exp(i · (−ln(max_period)·2/hd)) in f32.
        let scale = (-(t.max_period.ln()) * 2.0 / hd as f64) as f32;
        let freqs: Vec<f32> = (0..hd / 2).map(|i| (i as f32 * scale).exp()).collect();
        let layers = t
            .layers
            .iter()
            .map(|l| {
                Ok(LayerGpu {
                    norm1_w: self.f32s("norm1 w", &l.norm1_w)?,
                    norm1_b: self.f32s("norm1 b", &l.norm1_b)?,
                    in_proj: self.f32s("in_proj", &l.in_proj)?,
                    out_proj: self.f32s("out_proj", &l.out_proj)?,
                    ls1: self.f32s("ls1", &l.ls1)?,
                    norm2_w: self.f32s("norm2 w", &l.norm2_w)?,
                    norm2_b: self.f32s("norm2 b", &l.norm2_b)?,
                    linear1: self.f32s("linear1", &l.linear1)?,
                    linear2: self.f32s("linear2", &l.linear2)?,
                    ls2: self.f32s("ls2", &l.ls2)?,
                })
            })
            .collect::<Result<Vec<_>, GpuError>>()?;
        Ok(TransformerGpu {
            d: t.d,
            heads: t.heads,
            ff: t.ff,
            context: t.context,
            freqs: self.f32s("rope freqs", &freqs)?,
            layers,
        })
    }
}

impl GpuMimiWeights {
    /// Uploads every weight of `mimi` (as f32) and compiles the kernels (load time).
    pub fn upload(ctx: &GpuContext, mimi: Arc<Mimi>) -> Result<Arc<GpuMimiWeights>, GpuError> {
        // Both directions read the same centroids (one device copy, the decoder's).
        let books = mimi.codebook_weights();
        let dw = mimi.decoder_weights();
        let ew = mimi.encoder_weights();
        let before = ctx.bytes_allocated();
        let up = Uploader { ctx };
        let dec = DecoderGpu {
            centroids: up.f32s("centroids", &books.centroids)?,
            first_output_proj: up.f32s("rvq first output", &dw.first_output_proj)?,
            rest_output_proj: up.f32s("rvq rest output", &dw.rest_output_proj)?,
            upsample: up.conv_tr(&dw.upsample)?,
            transformer: up.transformer(&dw.transformer)?,
            conv0: up.conv(&dw.conv0)?,
            stages: dw
                .stages
                .iter()
                .map(|(u, r)| Ok((up.conv_tr(u)?, up.res(r)?)))
                .collect::<Result<Vec<_>, GpuError>>()?,
            last: up.conv(&dw.last)?,
        };
        let cb = books.cb_dim;
        let stats: Vec<f32> = books
            .centroids
            .chunks_exact(cb)
            .flat_map(|c| {
                let sq: f64 = c.iter().map(|&v| v as f64 * v as f64).sum();
                [(0.5 * sq) as f32, sq.sqrt() as f32]
            })
            .collect();
        let enc = EncoderGpu {
            stats: up.f32s("centroid stats", &stats)?,
            first_input_proj: up.f32s("rvq first input", &ew.first_input_proj)?,
            rest_input_proj: up.f32s("rvq rest input", &ew.rest_input_proj)?,
            conv0: up.conv(&ew.conv0)?,
            stages: ew
                .stages
                .iter()
                .map(|(r, d)| Ok((up.res(r)?, up.conv(d)?)))
                .collect::<Result<Vec<_>, GpuError>>()?,
            last: up.conv(&ew.last)?,
            transformer: up.transformer(&ew.transformer)?,
            downsample: up.conv(&ew.downsample)?,
            bound: rvq_bound(cb),
        };
        let weight_bytes = ctx.bytes_allocated() - before;
        let kernels = MimiKernel::ALL
            .iter()
            .map(|&k| (k, compile(ctx, k)))
            .collect();
        Ok(Arc::new(GpuMimiWeights {
            ctx: ctx.clone(),
            mimi,
            kernels,
            cb_dim: cb,
            dec,
            enc,
            weight_bytes,
        }))
    }

    /// Bytes of the codec's weights on the device (f32): what an encoder frame plus a decoder
    /// frame read at least once (the centroids, shared by both directions, counted once).
    pub fn weight_bytes(&self) -> u64 {
        self.weight_bytes
    }

    /// The device context.
    pub fn context(&self) -> &GpuContext {
        &self.ctx
    }

    /// The CPU model the weights came from.
    pub fn mimi(&self) -> &Arc<Mimi> {
        &self.mimi
    }
}

fn compile(
    ctx: &GpuContext,
    k: MimiKernel,
) -> (Arc<wgpu::ComputePipeline>, Arc<wgpu::BindGroupLayout>) {
    let pipeline = ctx.compile(&format!("mimi {k:?}"), k.access(), &k.source());
    (Arc::new(pipeline), ctx.layout(k.access()))
}

/// Sum length (input channels × taps per output) from which a convolution splits its sum
/// across a workgroup instead of running a thread per output (the SEANet's low-rate stages:
/// 256–1024 channels, 2–96 columns, where a thread per output leaves most of the device idle
/// and each thread a serial loop of thousands of terms).
const SPLIT_SUM: usize = 256;

/// Outputs below which a thread per output leaves most of the device idle (a few hundred
/// workgroups of 64).
const FEW_THREADS: usize = 16384;

/// Where a convolution's output goes.
#[derive(Debug, Clone, Copy)]
enum ConvOut<'b> {
    /// The value.
    Raw(&'b wgpu::Buffer),
    /// The value to the first buffer, its ELU to the second (the input of the next ELU
    /// convolution: the ELU runs once per value).
    Dual(&'b wgpu::Buffer, &'b wgpu::Buffer),
    /// Only the ELU of the value (a buffer read by nothing else).
    Elu(&'b wgpu::Buffer),
}

impl<'b> ConvOut<'b> {
    /// The kernel's `y` and `ye` bindings (`unused` where it writes no `ye`) and its `elu_y`
    /// and `dual` flags.
    fn parts(self, unused: &'b wgpu::Buffer) -> (&'b wgpu::Buffer, &'b wgpu::Buffer, bool, bool) {
        match self {
            ConvOut::Raw(y) => (y, unused, false, false),
            ConvOut::Dual(y, ye) => (y, ye, false, true),
            ConvOut::Elu(y) => (y, unused, true, false),
        }
    }
}

/// One recorded kernel launch.
#[derive(Debug)]
struct Launch {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
    groups: (u32, u32),
    _uniform: wgpu::Buffer,
}

/// Builds the launches and state of one direction.
struct Recorder<'a> {
    w: &'a GpuMimiWeights,
    launches: Vec<Launch>,
    /// Streaming state zeroed by a reset.
    state: Vec<wgpu::Buffer>,
    counters: &'a wgpu::Buffer,
    taps: Vec<Tap>,
    /// Bound where a convolution writes no ELU output (never written then).
    dummy: wgpu::Buffer,
}

impl<'a> Recorder<'a> {
    fn new(w: &'a GpuMimiWeights, counters: &'a wgpu::Buffer) -> Result<Recorder<'a>, GpuError> {
        Ok(Recorder {
            w,
            launches: Vec::new(),
            state: Vec::new(),
            counters,
            taps: Vec::new(),
            dummy: w.ctx.buffer("mimi unused output", 16, storage_usage())?,
        })
    }

    fn buffer(&self, label: &str, floats: usize) -> Result<wgpu::Buffer, GpuError> {
        self.w
            .ctx
            .buffer(label, (floats * 4) as u64, storage_usage())
    }

    /// Marks `buffer`'s first `floats` values, as they stand after the launches recorded so
    /// far, as the frame's `stage` (read back by a traced frame only).
    fn tap(&mut self, stage: Stage, buffer: &wgpu::Buffer, floats: usize) {
        self.taps.push(Tap {
            after: self.launches.len(),
            stage,
            buffer: buffer.clone(),
            floats,
        });
    }

    fn finish(self) -> Direction {
        Direction {
            launches: self.launches,
            state: self.state,
            taps: self.taps,
        }
    }

    fn state(&mut self, label: &str, floats: usize) -> Result<wgpu::Buffer, GpuError> {
        let b = self.buffer(label, floats)?;
        self.state.push(b.clone());
        Ok(b)
    }

    /// Records `k` over `threads` threads (one per index, 64 to a workgroup); `words` are its
    /// fields of the uniform block in the order of [`MimiKernel::params`], after the thread
    /// count.
    fn launch(&mut self, k: MimiKernel, words: &[u32], bufs: &[&wgpu::Buffer], threads: usize) {
        let groups = threads.div_ceil(64).max(1) as u32;
        let x = groups.min(32768);
        self.launch_grid(k, words, bufs, threads, (x, groups.div_ceil(x)));
    }

    /// Records `k` over the workgroup grid `groups` (a kernel with its own entry point, see
    /// [`MimiKernel::grid_launched`]); word 0 of its uniform block is `threads`.
    fn launch_grid(
        &mut self,
        k: MimiKernel,
        words: &[u32],
        bufs: &[&wgpu::Buffer],
        threads: usize,
        groups: (u32, u32),
    ) {
        let ctx = &self.w.ctx;
        let mut block = [0u32; 16];
        block[0] = threads as u32;
        block[1..=words.len()].copy_from_slice(words);
        let bytes: Vec<u8> = block.iter().flat_map(|v| v.to_le_bytes()).collect();
        let uniform = ctx.uniform("mimi params", &bytes);
        let (pipeline, layout) = &self.w.kernels[&k];
        let mut all = vec![&uniform];
        all.extend_from_slice(bufs);
        let bind = ctx.bind_layout(layout, &all);
        self.launches.push(Launch {
            pipeline: pipeline.clone(),
            bind,
            groups,
            _uniform: uniform,
        });
    }

    /// `y [cout, tin/stride] (+)= conv(x [cin, tin])` with the convolution's history, the
    /// output going to `out`. The input is read as it is (an ELU convolution reads the ELU
    /// buffer its producer wrote). A long sum (`cin·k` ≥ [`SPLIT_SUM`], or a quarter of it over
    /// fewer than [`FEW_THREADS`] outputs) runs as [`MimiKernel::ConvSplit`], a workgroup per
    /// output channel and 8 columns; a short one as [`MimiKernel::Conv`], a thread per output.
    fn conv(
        &mut self,
        c: &ConvGpu,
        x: &wgpu::Buffer,
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
        let bufs = [x, &hist, &c.weight, &c.bias, y, ye, counters];
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
    fn conv_tr(
        &mut self,
        c: &ConvTrGpu,
        x: &wgpu::Buffer,
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
    fn linear(
        &mut self,
        x: &wgpu::Buffer,
        w: &wgpu::Buffer,
        y: &wgpu::Buffer,
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
    fn layer_norm(
        &mut self,
        x: &wgpu::Buffer,
        (weight, bias): (&wgpu::Buffer, &wgpu::Buffer),
        y: &wgpu::Buffer,
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
    fn rvq_search(
        &mut self,
        u_first: &wgpu::Buffer,
        u_rest: &wgpu::Buffer,
        codes_out: &wgpu::Buffer,
    ) -> Result<(), GpuError> {
        let w = self.w;
        let m = &w.mimi;
        let (cb, bins, nq) = (w.cb_dim, m.cardinality(), m.n_codebooks());
        let resid = self.buffer("rvq residual", cb)?;
        let scored = self.buffer("rvq scored", 2 * bins)?;
        for q in 0..nq {
            self.launch_grid(
                MimiKernel::RvqScore,
                &[cb as u32, bins as u32, q as u32, w.enc.bound.to_bits()],
                &[u_first, &resid, &w.dec.centroids, &w.enc.stats, &scored],
                bins,
                (bins.div_ceil(8) as u32, 1),
            );
            self.launch_grid(
                MimiKernel::RvqPick,
                &[cb as u32, bins as u32, nq as u32, q as u32],
                &[u_rest, &w.dec.centroids, &scored, &resid, codes_out],
                1,
                (1, 1),
            );
        }
        Ok(())
    }

    /// The latent `y` (`[dim]`) of one frame's `codes` ([`MimiKernel::RvqDecode`]).
    fn rvq_decode(&mut self, codes: &wgpu::Buffer, y: &wgpu::Buffer) {
        let w = self.w;
        let m = &w.mimi;
        let (d, bins, nq) = (m.dimension(), m.cardinality(), m.n_codebooks());
        let g = &w.dec;
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
    fn res(
        &mut self,
        r: &ResGpu,
        (a, ea): (&wgpu::Buffer, &wgpu::Buffer),
        h: &wgpu::Buffer,
        t: usize,
    ) -> Result<(), GpuError> {
        self.conv(&r.c1, ea, t, ConvOut::Elu(h), false, 0)?;
        self.conv(&r.c2, h, t, ConvOut::Dual(a, ea), true, 0)
    }

    /// The transformer on `io` (`[d, t]` channel-major, in place), its position at `pos`.
    fn transformer(
        &mut self,
        tr: &TransformerGpu,
        io: &wgpu::Buffer,
        t: usize,
        pos: u32,
    ) -> Result<(), GpuError> {
        let (d, ff) = (tr.d, tr.ff);
        let hd = d / tr.heads;
        if t > tr.context {
            return Err(GpuError::Unsupported {
                format: "Mimi transformer".into(),
                why: format!("{t} steps per frame exceed the context {}", tr.context),
            });
        }
        let x = self.buffer("tr x", t * d)?;
        let h = self.buffer("tr h", t * d)?;
        let qkv = self.buffer("tr qkv", t * 3 * d)?;
        let att = self.buffer("tr att", t * d)?;
        let f = self.buffer("tr ff", t * ff)?;
        let counters = self.counters;
        self.launch(
            MimiKernel::Transpose,
            &[d as u32, t as u32],
            &[io, &x],
            t * d,
        );
        let cap = tr.context;
        for l in &tr.layers {
            let kc = self.state("k ring", cap * d)?;
            let vc = self.state("v ring", cap * d)?;
            self.layer_norm(&x, (&l.norm1_w, &l.norm1_b), &h, t, d);
            self.linear(&h, &l.in_proj, &qkv, &l.ls1, (t, d, 3 * d), 0);
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
                &[&qkv, &kc, &vc, &tr.freqs, counters],
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
                &[&qkv, &kc, &vc, &att, counters],
                t * tr.heads,
                (tr.heads as u32, t as u32),
            );
            self.linear(&att, &l.out_proj, &x, &l.ls1, (t, d, d), 1);
            self.layer_norm(&x, (&l.norm2_w, &l.norm2_b), &h, t, d);
            self.linear(&h, &l.linear1, &f, &l.ls2, (t, d, ff), 2);
            self.linear(&f, &l.linear2, &x, &l.ls2, (t, ff, d), 1);
        }
        self.launch_grid(
            MimiKernel::Advance,
            &[pos, t as u32],
            &[counters],
            1,
            (1, 1),
        );
        self.launch(
            MimiKernel::Transpose,
            &[t as u32, d as u32],
            &[&x, io],
            t * d,
        );
        Ok(())
    }
}

/// A point of a frame whose intermediate a traced frame reads back.
#[derive(Debug)]
struct Tap {
    /// The tap reads the buffer after this many launches of the direction.
    after: usize,
    stage: Stage,
    buffer: wgpu::Buffer,
    floats: usize,
}

/// One direction's recorded frame.
#[derive(Debug)]
struct Direction {
    launches: Vec<Launch>,
    state: Vec<wgpu::Buffer>,
    taps: Vec<Tap>,
}

impl Direction {
    /// Floats a traced frame of this direction reads back (every tap, back to back).
    fn tap_floats(&self) -> usize {
        self.taps.iter().map(|t| t.floats).sum()
    }
}

/// Records `launches` into an open compute pass.
fn dispatch(pass: &mut wgpu::ComputePass<'_>, launches: &[Launch]) {
    for l in launches {
        pass.set_pipeline(&l.pipeline);
        pass.set_bind_group(0, &l.bind, &[]);
        let (x, y) = l.groups;
        let mark = crate::profile::before(pass, &l.pipeline, &l.bind, [x, y, 1]);
        pass.dispatch_workgroups(x, y, 1);
        crate::profile::after(pass, mark);
    }
}

/// Maps `rb`'s first `out.len()` words into `out` (as raw bits).
fn read_words(ctx: &GpuContext, rb: &wgpu::Buffer, out: &mut [u32]) -> Result<(), GpuError> {
    crate::context::read_mapped_as(ctx, rb, out, u32::from_le_bytes)
}

/// One conversation's streaming state in device memory and the recorded launches of its
/// encoder and decoder frames: the device part of a [`GpuMimi`], and one slot of a
/// [`GpuMimiBatch`].
#[derive(Debug)]
struct Streams {
    counters: wgpu::Buffer,
    dec: Direction,
    enc: Direction,
    codes_in: wgpu::Buffer,
    pcm_out: wgpu::Buffer,
    pcm_in: wgpu::Buffer,
    /// Codes of every level, then the number of levels the device could not prove.
    codes_out: wgpu::Buffer,
    /// The projected latents of the last encoder frame (semantic, acoustic).
    u_first: wgpu::Buffer,
    u_rest: wgpu::Buffer,
}

impl Streams {
    /// One direction's recorded frame with its input and output buffers: the encoder's (PCM in,
    /// codes out) when `encoder_side`, else the decoder's (codes in, PCM out).
    fn side(&self, encoder_side: bool) -> (&Direction, &wgpu::Buffer, &wgpu::Buffer) {
        if encoder_side {
            (&self.enc, &self.pcm_in, &self.codes_out)
        } else {
            (&self.dec, &self.codes_in, &self.pcm_out)
        }
    }

    /// Fresh streams over the uploaded weights: allocates the state and work buffers and records
    /// both directions' launches.
    fn new(w: &GpuMimiWeights) -> Result<Streams, GpuError> {
        let ctx = &w.ctx;
        let m = &w.mimi;
        let fs = m.frame_size();
        let nq = m.n_codebooks();
        let d = m.dimension();
        let s = m.config().resample_stride();
        let t2 = s;
        let counters = ctx.buffer("mimi counters", (COUNTERS * 4) as u64, storage_usage())?;
        let codes_in = ctx.buffer("codes in", (nq * 4) as u64, storage_usage())?;
        let pcm_out = ctx.buffer("pcm out", (fs * 4) as u64, storage_usage())?;
        let pcm_in = ctx.buffer("pcm in", (fs * 4) as u64, storage_usage())?;
        let codes_out = ctx.buffer("codes out", ((nq + 1) * 4) as u64, storage_usage())?;
        let cb = w.cb_dim;
        let u_first = ctx.buffer("u first", (cb * 4) as u64, storage_usage())?;
        let u_rest = ctx.buffer("u rest", (cb * 4) as u64, storage_usage())?;

        // Decoder: codes → latent [d, 1] → upsample [d, s] → transformer → SEANet → PCM.
        let dec = {
            let g = &w.dec;
            let mut r = Recorder::new(w, &counters)?;
            let lat = r.buffer("dec latent", d)?;
            let emb = r.buffer("dec emb", d * t2)?;
            r.rvq_decode(&codes_in, &lat);
            r.tap(Stage::DecLatent, &lat, d);
            r.conv_tr(&g.upsample, &lat, 1, ConvOut::Raw(&emb))?;
            r.tap(Stage::DecUpsample, &emb, d * t2);
            r.transformer(&g.transformer, &emb, t2, DEC_POS)?;
            r.tap(Stage::DecTransformer, &emb, d * t2);
            let (amax, hmax) = seanet_dec_sizes(g, t2);
            let mut a = r.buffer("dec a", amax)?;
            let mut ea = r.buffer("dec elu a", amax)?;
            let mut b = r.buffer("dec b", amax)?;
            let mut eb = r.buffer("dec elu b", amax)?;
            let h = r.buffer("dec h", hmax)?;
            let mut t = t2;
            r.conv(&g.conv0, &emb, t, ConvOut::Dual(&a, &ea), false, 0)?;
            for (up, res) in &g.stages {
                r.conv_tr(up, &ea, t, ConvOut::Dual(&b, &eb))?;
                t *= up.shape.stride;
                std::mem::swap(&mut a, &mut b);
                std::mem::swap(&mut ea, &mut eb);
                for blk in res {
                    r.res(blk, (&a, &ea), &h, t)?;
                }
            }
            if t != fs {
                return Err(GpuError::Unsupported {
                    format: "Mimi".into(),
                    why: format!("the decoder gives {t} samples per frame, not {fs}"),
                });
            }
            r.conv(&g.last, &ea, t, ConvOut::Raw(&pcm_out), false, 0)?;
            r.finish()
        };

        // Encoder: PCM → SEANet [d, s] → transformer → downsample [d, 1] → projections → search.
        let enc = {
            let g = &w.enc;
            let mut r = Recorder::new(w, &counters)?;
            let (amax, hmax) = seanet_enc_sizes(g, fs);
            let mut a = r.buffer("enc a", amax)?;
            let mut ea = r.buffer("enc elu a", amax)?;
            let mut b = r.buffer("enc b", amax)?;
            let mut eb = r.buffer("enc elu b", amax)?;
            let h = r.buffer("enc h", hmax)?;
            let emb = r.buffer("enc emb", d * t2)?;
            let lat = r.buffer("enc latent", d)?;
            let mut t = fs;
            r.conv(&g.conv0, &pcm_in, t, ConvOut::Dual(&a, &ea), false, 0)?;
            for (res, down) in &g.stages {
                for blk in res {
                    r.res(blk, (&a, &ea), &h, t)?;
                }
                r.conv(down, &ea, t, ConvOut::Dual(&b, &eb), false, 0)?;
                t /= down.shape.stride;
                std::mem::swap(&mut a, &mut b);
                std::mem::swap(&mut ea, &mut eb);
            }
            if t != t2 {
                return Err(GpuError::Unsupported {
                    format: "Mimi".into(),
                    why: format!("the encoder gives {t} steps per frame, not {t2}"),
                });
            }
            r.conv(&g.last, &ea, t, ConvOut::Raw(&emb), false, 0)?;
            r.tap(Stage::EncSeanet, &emb, d * t2);
            r.transformer(&g.transformer, &emb, t2, ENC_POS)?;
            r.tap(Stage::EncTransformer, &emb, d * t2);
            r.conv(
                &g.downsample,
                &emb,
                t2,
                ConvOut::Raw(&lat),
                false,
                ENC_FRAMES,
            )?;
            r.tap(Stage::Latent, &lat, d);
            // [d, 1] is also the row [1, d].
            // (The stats only fill the unread LayerScale binding.)
            r.linear(&lat, &g.first_input_proj, &u_first, &g.stats, (1, d, cb), 0);
            r.linear(&lat, &g.rest_input_proj, &u_rest, &g.stats, (1, d, cb), 0);
            r.rvq_search(&u_first, &u_rest, &codes_out)?;
            r.launch_grid(
                MimiKernel::Advance,
                &[ENC_FRAMES, 1],
                &[&counters],
                1,
                (1, 1),
            );
            r.finish()
        };
        Ok(Streams {
            counters,
            dec,
            enc,
            codes_in,
            pcm_out,
            pcm_in,
            codes_out,
            u_first,
            u_rest,
        })
    }

    /// Records the zeroing of every streaming buffer (back to a fresh stream).
    fn clear(&self, enc: &mut wgpu::CommandEncoder) {
        enc.clear_buffer(&self.counters, 0, None);
        for b in self.dec.state.iter().chain(&self.enc.state) {
            enc.clear_buffer(b, 0, None);
        }
    }
}

/// A device codec's submission count and the host's part in the encoder's code decisions: its
/// scratch, how many frames it decided, and whether it decides every frame.
#[derive(Debug)]
struct Decider {
    lat_words: Vec<u32>,
    latents: Vec<f32>,
    host_decisions: u64,
    submissions: u64,
    force_host: bool,
}

impl Decider {
    /// Counters at zero and the scratch of a codec whose latents have `cb` values per
    /// projection.
    fn new(cb: usize) -> Decider {
        Decider {
            lat_words: vec![0; 2 * cb],
            latents: vec![0.0; 2 * cb],
            host_decisions: 0,
            submissions: 0,
            force_host: false,
        }
    }

    /// The codes of one encoder frame from its readback words (`nq` codes, then the number of
    /// levels the device could not prove): the device's when proven, else the host's exact
    /// decision on the frame's latents (read back from `s` through `readback` in one more
    /// submission).
    fn decide(
        &mut self,
        w: &GpuMimiWeights,
        s: &Streams,
        readback: &wgpu::Buffer,
        words: &[u32],
        codes: &mut [u32],
    ) -> Result<(), GpuError> {
        let nq = codes.len();
        codes.copy_from_slice(&words[..nq]);
        if words[nq] == 0 && !self.force_host {
            return Ok(());
        }
        self.decide_on_host(w, s, readback, codes)?;
        self.host_decisions += 1;
        Ok(())
    }

    fn decide_on_host(
        &mut self,
        w: &GpuMimiWeights,
        s: &Streams,
        readback: &wgpu::Buffer,
        codes: &mut [u32],
    ) -> Result<(), GpuError> {
        let (lat_words, latents) = (&mut self.lat_words, &mut self.latents);
        // The exact decision on the host, from the latents still in device memory.
        let cb = latents.len() / 2;
        let bytes = (cb * 4) as u64;
        let ctx = &w.ctx;
        let mut enc = ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        enc.copy_buffer_to_buffer(&s.u_first, 0, readback, 0, bytes);
        enc.copy_buffer_to_buffer(&s.u_rest, 0, readback, bytes, bytes);
        ctx.queue().submit([enc.finish()]);
        self.submissions += 1;
        read_words(ctx, readback, lat_words)?;
        for (v, b) in latents.iter_mut().zip(lat_words.iter()) {
            *v = f32::from_bits(*b);
        }
        let (first, rest) = latents.split_at_mut(cb);
        w.mimi.rvq_codes_exact(first, rest, codes);
        Ok(())
    }
}

/// The device codec of one conversation: its streaming state in device memory and every launch
/// of an encoder frame and of a decoder frame recorded at construction.
pub struct GpuMimi {
    w: Arc<GpuMimiWeights>,
    s: Streams,
    readback: wgpu::Buffer,
    /// Where a traced frame's intermediates land (see [`GpuMimi::encode_frame_traced`]).
    trace_readback: wgpu::Buffer,
    codes_bytes: Vec<u8>,
    /// Codes of every level, then the number of unproven levels (as read back).
    words: Vec<u32>,
    codes: Vec<u32>,
    d: Decider,
}

impl std::fmt::Debug for GpuMimi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuMimi")
            .field("adapter", self.w.ctx.adapter())
            .finish()
    }
}

device_codec_accessors!(GpuMimi);

impl GpuMimi {
    /// Fresh streams over the uploaded weights: allocates the state, work and readback buffers
    /// and records both directions' launches.
    pub fn new(w: Arc<GpuMimiWeights>) -> Result<GpuMimi, GpuError> {
        let s = Streams::new(&w)?;
        let m = &w.mimi;
        let (fs, nq, cb) = (m.frame_size(), m.n_codebooks(), w.cb_dim);
        let rb_bytes = (fs.max(nq + 1).max(2 * cb) * 4) as u64;
        let read = wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST;
        let readback = w.ctx.buffer("mimi readback", rb_bytes, read)?;
        let tap_floats = s.enc.tap_floats().max(s.dec.tap_floats());
        let trace_readback = w
            .ctx
            .buffer("mimi trace readback", (tap_floats * 4) as u64, read)?;
        Ok(GpuMimi {
            s,
            readback,
            trace_readback,
            codes_bytes: vec![0; nq * 4],
            words: vec![0; nq + 1],
            codes: vec![0; nq],
            d: Decider::new(cb),
            w,
        })
    }

    /// Kernel launches of a decoder frame and of an encoder frame.
    pub fn launches_per_frame(&self) -> (usize, usize) {
        (self.s.dec.launches.len(), self.s.enc.launches.len())
    }

    /// Records one direction's frame in one submission: its launches (split into one compute
    /// pass per tap when `traced`, each tap's buffer copied to the trace readback), then
    /// `copies` to the readback buffer, back to back.
    fn run(&mut self, encoder_side: bool, traced: bool, copies: &[(&wgpu::Buffer, u64)]) {
        let ctx = &self.w.ctx;
        let (d, _, _) = self.s.side(encoder_side);
        let mut enc = ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        let mut from = 0;
        if traced {
            let mut off = 0;
            for tap in &d.taps {
                {
                    let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
                    dispatch(&mut pass, &d.launches[from..tap.after]);
                }
                let bytes = (tap.floats * 4) as u64;
                enc.copy_buffer_to_buffer(&tap.buffer, 0, &self.trace_readback, off, bytes);
                off += bytes;
                from = tap.after;
            }
        }
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            dispatch(&mut pass, &d.launches[from..]);
        }
        let mut off = 0;
        for (b, len) in copies {
            enc.copy_buffer_to_buffer(b, 0, &self.readback, off, *len);
            off += len;
        }
        ctx.queue().submit([enc.finish()]);
        self.d.submissions += 1;
    }

    /// Reads a traced frame's intermediates back and reports each to `trace`.
    fn report_taps(
        &self,
        encoder_side: bool,
        trace: &mut dyn FnMut(Stage, &[f32]),
    ) -> Result<(), GpuError> {
        let (d, _, _) = self.s.side(encoder_side);
        let mut all = vec![0.0f32; d.tap_floats()];
        crate::context::read_mapped(&self.w.ctx, &self.trace_readback, &mut all)?;
        let mut off = 0;
        for tap in &d.taps {
            trace(tap.stage, &all[off..off + tap.floats]);
            off += tap.floats;
        }
        Ok(())
    }

    fn encode(&mut self, pcm: &[f32], traced: bool) -> Result<(), GpuError> {
        let nq = self.codes.len();
        self.w
            .ctx
            .queue()
            .write_buffer(&self.s.pcm_in, 0, bytes_of_f32(pcm));
        let codes_out = self.s.codes_out.clone();
        self.run(true, traced, &[(&codes_out, ((nq + 1) * 4) as u64)]);
        read_words(&self.w.ctx, &self.readback, &mut self.words)?;
        self.d.decide(
            &self.w,
            &self.s,
            &self.readback,
            &self.words,
            &mut self.codes,
        )?;
        Ok(())
    }

    fn decode(&mut self, codes: &[u32], out: &mut [f32], traced: bool) -> Result<(), GpuError> {
        let nq = self.codes.len();
        for (b, c) in self.codes_bytes.chunks_exact_mut(4).zip(&codes[..nq]) {
            b.copy_from_slice(&c.to_le_bytes());
        }
        self.w
            .ctx
            .queue()
            .write_buffer(&self.s.codes_in, 0, &self.codes_bytes);
        let bytes = (out.len() * 4) as u64;
        let pcm_out = self.s.pcm_out.clone();
        self.run(false, traced, &[(&pcm_out, bytes)]);
        crate::context::read_mapped(&self.w.ctx, &self.readback, out)
    }

    fn check_pcm(&self, pcm: &[f32]) -> Result<(), MimiError> {
        let fs = self.frame_size();
        if pcm.len() != fs {
            return Err(MimiError::Input(format!(
                "encode_frame needs {fs} samples, got {}",
                pcm.len()
            )));
        }
        Ok(())
    }

    fn check_codes(&self, codes: &[u32], out: &[f32]) -> Result<(), MimiError> {
        let (fs, nq) = (self.frame_size(), self.n_codebooks());
        if out.len() != fs {
            return Err(MimiError::Input(format!(
                "decode_frame writes {fs} samples, buffer has {}",
                out.len()
            )));
        }
        if codes.len() < nq {
            return Err(MimiError::Input(format!(
                "decode_frame needs {nq} codes, got {}",
                codes.len()
            )));
        }
        check_code_range(&codes[..nq], self.w.mimi.cardinality())
    }

    /// [`CodecBackend::encode_frame`], also reporting the frame's encoder intermediates
    /// ([`Stage::EncSeanet`], [`Stage::EncTransformer`], [`Stage::Latent`], each `[dim, t]`
    /// channel-major) to `trace`, as the CPU encoder's traced frame does. For parity tooling:
    /// the frame is split into one compute pass per stage and the intermediates are read back
    /// into a vector allocated per call.
    pub fn encode_frame_traced(
        &mut self,
        pcm: &[f32],
        trace: &mut dyn FnMut(Stage, &[f32]),
    ) -> Result<&[u32], MimiError> {
        self.check_pcm(pcm)?;
        self.encode(pcm, true)?;
        self.report_taps(true, trace)?;
        Ok(&self.codes)
    }

    /// [`CodecBackend::decode_frame`], also reporting the decoder intermediates
    /// ([`Stage::DecLatent`], [`Stage::DecUpsample`], [`Stage::DecTransformer`]) to `trace`
    /// (see [`GpuMimi::encode_frame_traced`]).
    pub fn decode_frame_traced(
        &mut self,
        codes: &[u32],
        out: &mut [f32],
        trace: &mut dyn FnMut(Stage, &[f32]),
    ) -> Result<(), MimiError> {
        self.check_codes(codes, out)?;
        self.decode(codes, out, true)?;
        Ok(self.report_taps(false, trace)?)
    }
}

/// Refuses a code at or above the codebook size `bins`.
fn check_code_range(codes: &[u32], bins: usize) -> Result<(), MimiError> {
    match codes.iter().find(|&&c| c as usize >= bins) {
        Some(bad) => Err(MimiError::Input(format!(
            "code {bad} out of range (codebook size {bins})"
        ))),
        None => Ok(()),
    }
}

fn bytes_of_f32(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and any byte is a valid u8; the length covers exactly `v`.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// Largest activation (`[C, T]`) and hidden buffer of the SEANet decoder for `t` latent steps.
fn seanet_dec_sizes(g: &DecoderGpu, t: usize) -> (usize, usize) {
    let mut t = t;
    let mut amax = g.conv0.shape.cout * t;
    let mut hmax = 1;
    for (up, res) in &g.stages {
        t *= up.shape.stride;
        amax = amax.max(up.shape.cout * t);
        for r in res {
            hmax = hmax.max(r.c1.shape.cout * t);
        }
    }
    (amax, hmax)
}

/// Largest activation and hidden buffer of the SEANet encoder for `t` samples.
fn seanet_enc_sizes(g: &EncoderGpu, t: usize) -> (usize, usize) {
    let mut t = t;
    let mut amax = g.conv0.shape.cout * t;
    let mut hmax = 1;
    for (res, down) in &g.stages {
        for r in res {
            hmax = hmax.max(r.c1.shape.cout * t);
        }
        t /= down.shape.stride;
        amax = amax.max(down.shape.cout * t);
    }
    (amax, hmax)
}

impl CodecBackend for GpuMimi {
    fn frame_size(&self) -> usize {
        self.w.mimi.frame_size()
    }

    fn n_codebooks(&self) -> usize {
        self.w.mimi.n_codebooks()
    }

    fn encode_frame(&mut self, pcm: &[f32]) -> Result<&[u32], MimiError> {
        self.check_pcm(pcm)?;
        self.encode(pcm, false)?;
        Ok(&self.codes)
    }

    fn decode_frame(&mut self, codes: &[u32], out: &mut [f32]) -> Result<(), MimiError> {
        self.check_codes(codes, out)?;
        Ok(self.decode(codes, out, false)?)
    }

    fn reset(&mut self) {
        let ctx = &self.w.ctx;
        let mut enc = ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        self.s.clear(&mut enc);
        ctx.queue().submit([enc.finish()]);
        self.d.submissions += 1;
    }
}
