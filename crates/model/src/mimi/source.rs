//! Mimi's weights read straight from a checkpoint by plan place, in PyTorch layouts
//! ([`ConvWeights`] and the other `export` types), without building the CPU model: what a
//! backend that packs its own copy (the GPU) reads, and what the CPU loader builds its model
//! from, so both take each place's tensors and shapes from one reading.

use super::export::{
    ConvTrWeights, ConvWeights, ResBlockWeights, TransformerLayerWeights, TransformerWeights,
};
use super::load::{Loader, MimiTensors};
use super::names::layer_prefix;
use super::plan::{ConvAt, ConvTrAt, ResAt, Side};
use super::MimiError;
use crate::checkpoint::MimiConfig;

/// A checkpoint opened for reading Mimi's weights by place (see the module docs).
pub struct MimiSource<'a> {
    pub(super) loader: Loader<'a>,
    pub(super) config: MimiConfig,
}

impl<'a> MimiSource<'a> {
    /// Opens `src` (either layout) for `config`; fails if the config is invalid or `src` is
    /// not a Mimi checkpoint.
    pub fn new(src: &'a dyn MimiTensors, config: &MimiConfig) -> Result<Self, MimiError> {
        config
            .validate()
            .map_err(|e| MimiError::Config(e.to_string()))?;
        Ok(MimiSource {
            loader: Loader::new(src)?.with_heads(config.transformer.num_heads),
            config: config.clone(),
        })
    }

    /// The checkpoint's naming layout.
    pub fn layout(&self) -> super::Layout {
        self.loader.layout()
    }

    /// Width of SEANet stage `stage` of `side` (the channels its residual units see).
    fn stage_dim(&self, side: Side, stage: usize) -> usize {
        let (nf, n) = (
            self.config.seanet.n_filters,
            self.config.seanet.ratios.len(),
        );
        match side {
            Side::Encoder => nf << stage,
            Side::Decoder => nf << (n - stage - 1),
        }
    }

    fn read_conv(
        &self,
        at: ConvAt,
        shape: [usize; 5],
        replicate: bool,
    ) -> Result<ConvWeights, MimiError> {
        let p = at.tensor_prefix(&self.config);
        self.conv_named(&p, shape, at.has_bias(), replicate)
    }

    /// `{prefix}.weight` of shape `wshape` and `{prefix}.bias` of `cout` values (zeros where
    /// the checkpoint has no bias).
    fn weight_bias(
        &self,
        prefix: &str,
        wshape: &[usize],
        cout: usize,
        bias: bool,
    ) -> Result<(Vec<f32>, Vec<f32>), MimiError> {
        let l = &self.loader;
        let weight = l.tensor(&format!("{prefix}.weight"), wshape)?;
        let bias = match bias {
            true => l.tensor(&format!("{prefix}.bias"), &[cout])?,
            false => vec![0.0; cout],
        };
        Ok((weight, bias))
    }

    fn conv_named(
        &self,
        prefix: &str,
        [cin, cout, k, stride, dilation]: [usize; 5],
        bias: bool,
        replicate: bool,
    ) -> Result<ConvWeights, MimiError> {
        let (weight, bias) = self.weight_bias(prefix, &[cout, cin, k], cout, bias)?;
        Ok(ConvWeights {
            cin,
            cout,
            k,
            stride,
            dilation,
            weight,
            bias,
            replicate,
        })
    }

    /// The convolution at `at` (a bias of zeros where the checkpoint has none; with no
    /// resampling, the downsample is the identity 1×1 convolution).
    pub fn conv_weights(&self, at: ConvAt) -> Result<ConvWeights, MimiError> {
        let c = &self.config;
        let s = &c.seanet;
        let (nf, n, d) = (s.n_filters, s.ratios.len(), s.dimension);
        let shape = match at {
            ConvAt::Conv0(Side::Encoder) => [c.channels, nf, s.kernel_size, 1, 1],
            ConvAt::Conv0(Side::Decoder) => [d, nf << n, s.kernel_size, 1, 1],
            ConvAt::Down(i) => {
                let r = *s.ratios.iter().rev().nth(i).ok_or_else(|| absent(at))?;
                let dim = nf << i;
                [dim, 2 * dim, 2 * r, r, 1]
            }
            ConvAt::Last(Side::Encoder) => [nf << n, d, s.last_kernel_size, 1, 1],
            ConvAt::Last(Side::Decoder) => [nf, c.channels, s.last_kernel_size, 1, 1],
            ConvAt::Downsample => {
                let r = c.resample_stride();
                if r > 1 {
                    return self.read_conv(at, [d, d, 2 * r, r, 1], true);
                }
                // The encoder already runs at the frame rate: the identity.
                let mut weight = vec![0.0; d * d];
                weight.iter_mut().step_by(d + 1).for_each(|w| *w = 1.0);
                return Ok(ConvWeights {
                    cin: d,
                    cout: d,
                    k: 1,
                    stride: 1,
                    dilation: 1,
                    weight,
                    bias: vec![0.0; d],
                    replicate: false,
                });
            }
        };
        self.read_conv(at, shape, false)
    }

    /// The transposed convolution at `at` in PyTorch's layout `[cin, cout, k]` (depthwise
    /// `[cin, 1, k]`; with no resampling, the upsample is the identity).
    pub fn conv_tr_weights(&self, at: ConvTrAt) -> Result<ConvTrWeights, MimiError> {
        let c = &self.config;
        let (cin, cout, k, stride, depthwise) = match at {
            ConvTrAt::Up(i) => {
                let r = *c.seanet.ratios.get(i).ok_or_else(|| absent_tr(at))?;
                let cout = self.stage_dim(Side::Decoder, i);
                (2 * cout, cout, 2 * r, r, false)
            }
            ConvTrAt::Upsample => {
                let (d, r) = (c.seanet.dimension, c.resample_stride());
                if r <= 1 {
                    return Ok(ConvTrWeights {
                        cin: d,
                        cout: d,
                        k: 1,
                        stride: 1,
                        depthwise: true,
                        weight: vec![1.0; d],
                        bias: vec![0.0; d],
                    });
                }
                (d, d, 2 * r, r, true)
            }
        };
        let p = at.tensor_prefix(c);
        let wshape = [cin, if depthwise { 1 } else { cout }, k];
        let (weight, bias) = self.weight_bias(&p, &wshape, cout, at.has_bias())?;
        Ok(ConvTrWeights {
            cin,
            cout,
            k,
            stride,
            depthwise,
            weight,
            bias,
        })
    }

    /// The residual unit at `at`.
    pub fn res_weights(&self, at: ResAt) -> Result<ResBlockWeights, MimiError> {
        let s = &self.config.seanet;
        if at.stage >= s.ratios.len() || at.block >= s.n_residual_layers {
            return Err(MimiError::Config(format!("{at:?} is not in the model")));
        }
        let dim = self.stage_dim(at.side, at.stage);
        let hidden = dim / s.compress;
        let dil = s.dilation_base.pow(at.block as u32);
        let [p1, p3] = at.tensor_prefixes(&self.config);
        Ok(ResBlockWeights {
            c1: self.conv_named(
                &p1,
                [dim, hidden, s.residual_kernel_size, 1, dil],
                true,
                false,
            )?,
            c2: self.conv_named(&p3, [hidden, dim, 1, 1, 1], true, false)?,
        })
    }
}

/// The transformers, read by layer.
impl MimiSource<'_> {
    /// A side's transformer in f32 (Q and K rows in interleaved-pair RoPE order, whichever
    /// layout the checkpoint uses).
    pub fn transformer_weights(&self, side: Side) -> Result<TransformerWeights, MimiError> {
        let c = &self.config.transformer;
        let (d, ff) = (self.config.seanet.dimension, c.dim_feedforward);
        let context = c
            .context
            .ok_or_else(|| MimiError::Config("Mimi transformer without context".into()))?;
        let layers = (0..c.num_layers)
            .map(|i| {
                let p = layer_prefix(side, i);
                let t = |n: &str, s: &[usize]| self.loader.tensor(&format!("{p}{n}"), s);
                Ok(TransformerLayerWeights {
                    norm1_w: t("norm1.weight", &[d])?,
                    norm1_b: t("norm1.bias", &[d])?,
                    in_proj: t("self_attn.in_proj_weight", &[3 * d, d])?,
                    out_proj: t("self_attn.out_proj.weight", &[d, d])?,
                    ls1: t("layer_scale_1.scale", &[d])?,
                    norm2_w: t("norm2.weight", &[d])?,
                    norm2_b: t("norm2.bias", &[d])?,
                    linear1: t("linear1.weight", &[ff, d])?,
                    linear2: t("linear2.weight", &[d, ff])?,
                    ls2: t("layer_scale_2.scale", &[d])?,
                })
            })
            .collect::<Result<Vec<_>, MimiError>>()?;
        Ok(TransformerWeights {
            d,
            heads: c.num_heads,
            ff,
            context,
            max_period: c.max_period,
            layers,
        })
    }
}

fn absent(at: ConvAt) -> MimiError {
    MimiError::Config(format!("{at:?} is not in the model"))
}

fn absent_tr(at: ConvTrAt) -> MimiError {
    MimiError::Config(format!("{at:?} is not in the model"))
}
