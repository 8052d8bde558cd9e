//! [`GpuMimiWeights`]: every codec weight in device memory (f32, uploaded once per engine, shared
//! by all slots and conversations) and the compiled kernels.

use std::collections::HashMap;
use std::sync::Arc;

use model::mimi::{
    ConvAt, ConvTrAt, ConvTrWeights, ConvWeights, Mimi, ResAt, ResBlockWeights, Side, Step,
    TransformerWeights,
};

use super::shaders::MimiKernel;
use super::{f32_bytes, MAX_HEAD_DIM};
use crate::context::GpuContext;
use crate::GpuError;

/// A (transposed) convolution's weight and bias on the device, with its shape (the host's
/// description without its weights).
#[derive(Debug)]
pub(super) struct OnDevice<S> {
    pub(super) shape: S,
    pub(super) weight: wgpu::Buffer,
    pub(super) bias: wgpu::Buffer,
}

/// A convolution on the device.
pub(super) type ConvGpu = OnDevice<ConvWeights>;

/// A transposed convolution on the device.
pub(super) type ConvTrGpu = OnDevice<ConvTrWeights>;

#[derive(Debug)]
pub(super) struct ResGpu {
    pub(super) c1: ConvGpu,
    pub(super) c2: ConvGpu,
}

#[derive(Debug)]
pub(super) struct LayerGpu {
    pub(super) norm1_w: wgpu::Buffer,
    pub(super) norm1_b: wgpu::Buffer,
    pub(super) in_proj: wgpu::Buffer,
    pub(super) out_proj: wgpu::Buffer,
    pub(super) ls1: wgpu::Buffer,
    pub(super) norm2_w: wgpu::Buffer,
    pub(super) norm2_b: wgpu::Buffer,
    pub(super) linear1: wgpu::Buffer,
    pub(super) linear2: wgpu::Buffer,
    pub(super) ls2: wgpu::Buffer,
}

#[derive(Debug)]
pub(super) struct TransformerGpu {
    pub(super) d: usize,
    pub(super) heads: usize,
    pub(super) ff: usize,
    pub(super) context: usize,
    /// RoPE frequencies `[head_dim / 2]`, computed as the CPU computes them.
    pub(super) freqs: wgpu::Buffer,
    pub(super) layers: Vec<LayerGpu>,
}

/// The split RVQ on the device.
#[derive(Debug)]
pub(super) struct RvqGpu {
    /// Every codebook in use, `[n_codebooks, bins, cb_dim]` (one copy both directions read).
    pub(super) centroids: wgpu::Buffer,
    /// Per centroid: `½‖c‖²` (rounded from f64) and `‖c‖`.
    pub(super) stats: wgpu::Buffer,
    pub(super) first_input_proj: wgpu::Buffer,
    pub(super) rest_input_proj: wgpu::Buffer,
    pub(super) first_output_proj: wgpu::Buffer,
    pub(super) rest_output_proj: wgpu::Buffer,
    /// Relative error bound of the search's f32 dot products (see [`rvq_bound`]).
    pub(super) bound: f32,
}

/// Every Mimi weight in device memory (f32) and the compiled kernels; shared (behind an `Arc`)
/// by the [`GpuMimi`](crate::GpuMimi) backends of one engine. The layers are kept by the place the
/// codec's plan ([`MimiPlan`](model::mimi::MimiPlan)) names them with, so the recorder resolves a
/// step's weights as the CPU does.
pub struct GpuMimiWeights {
    pub(super) ctx: GpuContext,
    pub(super) mimi: Arc<Mimi>,
    pub(super) kernels:
        HashMap<MimiKernel, (Arc<wgpu::ComputePipeline>, Arc<wgpu::BindGroupLayout>)>,
    pub(super) cb_dim: usize,
    pub(super) convs: HashMap<ConvAt, ConvGpu>,
    pub(super) conv_trs: HashMap<ConvTrAt, ConvTrGpu>,
    pub(super) res: HashMap<ResAt, ResGpu>,
    pub(super) transformers: HashMap<Side, TransformerGpu>,
    pub(super) rvq: RvqGpu,
    pub(super) weight_bytes: u64,
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
pub(super) fn rvq_bound(n: usize) -> f32 {
    let gamma = |u: f64| {
        let nu = n as f64 * u;
        nu / (1.0 - nu).max(0.5)
    };
    (2.0 * (gamma(f32::EPSILON as f64 / 2.0) + gamma(f64::EPSILON / 2.0))) as f32
}

pub(super) struct Uploader<'a> {
    pub(super) ctx: &'a GpuContext,
}

impl Uploader<'_> {
    pub(super) fn f32s(&self, label: &str, v: &[f32]) -> Result<wgpu::Buffer, GpuError> {
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

    pub(super) fn conv(&self, c: &ConvWeights) -> Result<ConvGpu, GpuError> {
        let shape = ConvWeights {
            weight: Vec::new(),
            bias: Vec::new(),
            ..c.clone()
        };
        self.on_device("conv", &c.weight, &c.bias, shape)
    }

    pub(super) fn conv_tr(&self, c: &ConvTrWeights) -> Result<ConvTrGpu, GpuError> {
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

    fn res(&self, r: &ResBlockWeights) -> Result<ResGpu, GpuError> {
        Ok(ResGpu {
            c1: self.conv(&r.c1)?,
            c2: self.conv(&r.c2)?,
        })
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
    /// Uploads every weight `mimi`'s plan names (as f32, each once) and compiles the kernels
    /// (load time).
    pub fn upload(ctx: &GpuContext, mimi: Arc<Mimi>) -> Result<Arc<GpuMimiWeights>, GpuError> {
        let before = ctx.bytes_allocated();
        let up = Uploader { ctx };
        let books = mimi.rvq_weights();
        let cb = books.cb_dim;
        let stats: Vec<f32> = books
            .centroids
            .chunks_exact(cb)
            .flat_map(|c| {
                let sq: f64 = c.iter().map(|&v| v as f64 * v as f64).sum();
                [(0.5 * sq) as f32, sq.sqrt() as f32]
            })
            .collect();
        let rvq = RvqGpu {
            centroids: up.f32s("centroids", &books.centroids)?,
            stats: up.f32s("centroid stats", &stats)?,
            first_input_proj: up.f32s("rvq first input", &books.first_input_proj)?,
            rest_input_proj: up.f32s("rvq rest input", &books.rest_input_proj)?,
            first_output_proj: up.f32s("rvq first output", &books.first_output_proj)?,
            rest_output_proj: up.f32s("rvq rest output", &books.rest_output_proj)?,
            bound: rvq_bound(cb),
        };
        let (mut convs, mut conv_trs) = (HashMap::new(), HashMap::new());
        let (mut res, mut transformers) = (HashMap::new(), HashMap::new());
        let absent = |what: String| GpuError::Unsupported {
            format: "Mimi plan".into(),
            why: format!("{what} is not in the model"),
        };
        let plan = mimi.plan();
        for &step in plan.encoder.iter().chain(&plan.decoder) {
            match step {
                Step::Conv { at, .. } if !convs.contains_key(&at) => {
                    let c = mimi
                        .conv_weights(at)
                        .ok_or_else(|| absent(format!("{at:?}")))?;
                    convs.insert(at, up.conv(&c)?);
                }
                Step::ConvTr { at, .. } if !conv_trs.contains_key(&at) => {
                    let c = mimi
                        .conv_tr_weights(at)
                        .ok_or_else(|| absent(format!("{at:?}")))?;
                    conv_trs.insert(at, up.conv_tr(&c)?);
                }
                Step::Res(at) if !res.contains_key(&at) => {
                    let r = mimi
                        .res_weights(at)
                        .ok_or_else(|| absent(format!("{at:?}")))?;
                    res.insert(at, up.res(&r)?);
                }
                Step::Layer { side, .. } if !transformers.contains_key(&side) => {
                    let t = up.transformer(&mimi.transformer_weights(side))?;
                    transformers.insert(side, t);
                }
                _ => {}
            }
        }
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
            convs,
            conv_trs,
            res,
            transformers,
            rvq,
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
