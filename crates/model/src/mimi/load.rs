//! Building [`Mimi`](super::Mimi) from named tensors, in Kyutai's canonical names or the
//! Hugging Face `transformers` layout (`kyutai/mimi`).

use super::conv::{Conv1d, ConvTr1d};
use super::names::{codebook_tensors, layer_prefix, rvq_prefix};
use super::plan::{ConvAt, ConvTrAt, ResAt, Side};
use super::quantizer::{Codebook, Rvq, SplitRvq};
use super::seanet::{ResBlock, SeanetDecoder, SeanetEncoder};
use super::transformer::{Layer, Transformer};
use super::MimiError;
use crate::checkpoint::MimiConfig;
use kernels::Matrix;
use std::collections::HashMap;

/// A tensor as f32 values plus its shape.
pub type F32Tensor = (Vec<f32>, Vec<usize>);

/// A source of named f32 tensors (implemented for checkpoints and in-memory maps).
pub trait MimiTensors {
    /// The tensor as f32 values plus its shape, or `None` if absent.
    fn get_f32(&self, name: &str) -> Result<Option<F32Tensor>, MimiError>;
}

/// An in-memory tensor map (tests, synthetic benchmark weights).
impl MimiTensors for HashMap<String, F32Tensor> {
    fn get_f32(&self, name: &str) -> Result<Option<F32Tensor>, MimiError> {
        Ok(self.get(name).cloned())
    }
}

/// Checkpoints opened by `model::checkpoint` (names already canonical, any stored dtype).
impl MimiTensors for crate::checkpoint::Weights {
    fn get_f32(&self, name: &str) -> Result<Option<F32Tensor>, MimiError> {
        if !self.contains(name) {
            return Ok(None);
        }
        self.f32(name)
            .map(Some)
            .map_err(|e| MimiError::Checkpoint(e.to_string()))
    }
}

/// Which naming scheme a checkpoint uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Kyutai's names (`encoder.model.0.conv.conv.weight`, fused `in_proj_weight`, ...).
    Kyutai,
    /// Hugging Face `transformers` names (`encoder.layers.0.conv.weight`, split q/k/v with
    /// rotate-half permutation, ...).
    HuggingFace,
}

pub(crate) struct Loader<'a> {
    src: &'a dyn MimiTensors,
    layout: Layout,
    heads: Option<usize>,
}

impl<'a> Loader<'a> {
    pub fn new(src: &'a dyn MimiTensors) -> Result<Self, MimiError> {
        let layout = if src.get_f32("encoder.model.0.conv.conv.weight")?.is_some() {
            Layout::Kyutai
        } else if src.get_f32("encoder.layers.0.conv.weight")?.is_some() {
            Layout::HuggingFace
        } else {
            return Err(MimiError::Missing(
                "encoder.model.0.conv.conv.weight".into(),
            ));
        };
        Ok(Loader {
            src,
            layout,
            heads: None,
        })
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Maps a canonical (Kyutai) name to this checkpoint's name.
    fn map(&self, name: &str) -> String {
        self.layout.checkpoint_name(name)
    }

    fn raw(&self, name: &str) -> Result<(Vec<f32>, Vec<usize>), MimiError> {
        let t = self
            .src
            .get_f32(name)?
            .ok_or_else(|| MimiError::Missing(name.to_string()))?;
        if t.0.iter().any(|v| !v.is_finite()) {
            return Err(MimiError::NonFinite {
                name: name.to_string(),
            });
        }
        Ok(t)
    }

    /// Fetches `name` (canonical) and checks its shape.
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, MimiError> {
        if self.layout == Layout::HuggingFace && name.ends_with("self_attn.in_proj_weight") {
            return self.hf_in_proj(name, shape);
        }
        let mapped = self.map(name);
        let (v, s) = self.raw(&mapped)?;
        if s != shape {
            return Err(MimiError::Shape {
                name: mapped,
                expected: shape.to_vec(),
                found: s,
            });
        }
        Ok(v)
    }

    /// HF splits the fused QKV and permutes Q and K rows per head from interleaved pairs to
    /// half-split (view [heads, hd/2, 2, d] → transpose(1, 2)); undo that.
    fn hf_in_proj(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, MimiError> {
        let d = shape[1];
        let prefix = name.trim_end_matches("in_proj_weight");
        let prefix = self.map(prefix);
        let heads = self.heads.unwrap_or(1);
        let hd = d / heads;
        let mut out = Vec::with_capacity(3 * d * d);
        for (i, part) in ["q_proj", "k_proj", "v_proj"].iter().enumerate() {
            let nm = format!("{prefix}{part}.weight");
            let (v, s) = self.raw(&nm)?;
            if s != [d, d] {
                return Err(MimiError::Shape {
                    name: nm,
                    expected: vec![d, d],
                    found: s,
                });
            }
            if i == 2 {
                out.extend_from_slice(&v);
                continue;
            }
            // HF row (h, j, i) with j ∈ {0,1} (half), i < hd/2 ← Kyutai row (h, i, j).
            let mut w = vec![0.0; d * d];
            for h in 0..heads {
                for i2 in 0..hd / 2 {
                    for j in 0..2 {
                        let src = h * hd + j * (hd / 2) + i2;
                        let dst = h * hd + i2 * 2 + j;
                        w[dst * d..(dst + 1) * d].copy_from_slice(&v[src * d..(src + 1) * d]);
                    }
                }
            }
            out.extend_from_slice(&w);
        }
        Ok(out)
    }
}

/// Head count for the HF un-permutation (set before loading transformers).
impl Loader<'_> {
    fn with_heads(mut self, heads: usize) -> Self {
        self.heads = Some(heads);
        self
    }
}

pub(crate) struct Parts {
    pub encoder: SeanetEncoder,
    pub decoder: SeanetDecoder,
    pub enc_tr: Transformer,
    pub dec_tr: Transformer,
    pub down: Conv1d,
    pub up: ConvTr1d,
    pub quant: SplitRvq,
    pub layout: Layout,
}

fn conv(
    l: &Loader,
    prefix: &str,
    cin: usize,
    cout: usize,
    k: usize,
    stride: usize,
    dilation: usize,
) -> Result<Conv1d, MimiError> {
    let weight = l.tensor(&format!("{prefix}.weight"), &[cout, cin, k])?;
    let bias = Some(l.tensor(&format!("{prefix}.bias"), &[cout])?);
    Conv1d::new(cin, cout, k, stride, dilation, weight, bias, false)
}

fn resblocks(
    l: &Loader,
    cfg: &MimiConfig,
    side: Side,
    stage: usize,
    dim: usize,
) -> Result<Vec<ResBlock>, MimiError> {
    let hidden = dim / cfg.seanet.compress;
    (0..cfg.seanet.n_residual_layers)
        .map(|block| {
            let dil = cfg.seanet.dilation_base.pow(block as u32);
            let [p1, p3] = ResAt { side, stage, block }.tensor_prefixes(cfg);
            Ok(ResBlock {
                c1: conv(l, &p1, dim, hidden, cfg.seanet.residual_kernel_size, 1, dil)?,
                c2: conv(l, &p3, hidden, dim, 1, 1, 1)?,
            })
        })
        .collect()
}

/// Builds a transformer weight matrix: f32, or rounded to bf16 (round-to-nearest-even) when
/// `bf16` is set.
fn weight_matrix(
    rows: usize,
    cols: usize,
    w: Vec<f32>,
    bf16: bool,
) -> Result<Matrix, kernels::KernelError> {
    if !bf16 {
        return Matrix::from_f32(rows, cols, w);
    }
    let bytes: Vec<u8> = w
        .iter()
        .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
        .collect();
    Matrix::from_bytes(
        kernels::WeightFormat::Bf16,
        rows,
        cols,
        kernels::Storage::from_vec(bytes),
    )
}

fn transformer(
    l: &Loader,
    cfg: &MimiConfig,
    side: Side,
    bf16: bool,
) -> Result<Transformer, MimiError> {
    let d = cfg.seanet.dimension;
    let ff = cfg.transformer.dim_feedforward;
    let layers = (0..cfg.transformer.num_layers)
        .map(|i| {
            let p = layer_prefix(side, i);
            let t = |n: &str, s: &[usize]| l.tensor(&format!("{p}{n}"), s);
            let mat = |n: &str, r: usize, c: usize| -> Result<Matrix, MimiError> {
                weight_matrix(r, c, t(n, &[r, c])?, bf16)
                    .map_err(|e| MimiError::Config(format!("{p}{n}: {e}")))
            };
            Ok(Layer {
                norm1_w: t("norm1.weight", &[d])?,
                norm1_b: t("norm1.bias", &[d])?,
                in_proj: mat("self_attn.in_proj_weight", 3 * d, d)?,
                out_proj: mat("self_attn.out_proj.weight", d, d)?,
                ls1: t("layer_scale_1.scale", &[d])?,
                norm2_w: t("norm2.weight", &[d])?,
                norm2_b: t("norm2.bias", &[d])?,
                linear1: mat("linear1.weight", ff, d)?,
                linear2: mat("linear2.weight", d, ff)?,
                ls2: t("layer_scale_2.scale", &[d])?,
            })
        })
        .collect::<Result<Vec<_>, MimiError>>()?;
    Ok(Transformer {
        d,
        heads: cfg.transformer.num_heads,
        ff,
        context: cfg
            .transformer
            .context
            .ok_or_else(|| MimiError::Config("Mimi transformer without context".into()))?,
        max_period: cfg.transformer.max_period,
        layers,
    })
}

/// The semantic (`first`) or acoustic quantizer; `levels` are its codebooks' levels in the
/// split RVQ (0 is the semantic one).
fn rvq(
    l: &Loader,
    cfg: &MimiConfig,
    first: bool,
    levels: std::ops::Range<usize>,
) -> Result<Rvq, MimiError> {
    let (d, cd, bins) = (
        cfg.seanet.dimension,
        cfg.quantizer.dimension,
        cfg.quantizer.bins,
    );
    let prefix = rvq_prefix(first);
    let merr = |e: kernels::KernelError| MimiError::Config(format!("{prefix}: {e}"));
    let input_proj = Matrix::from_f32(
        cd,
        d,
        l.tensor(&format!("{prefix}.input_proj.weight"), &[cd, d, 1])?,
    )
    .map_err(merr)?;
    let output_proj = Matrix::from_f32(
        d,
        cd,
        l.tensor(&format!("{prefix}.output_proj.weight"), &[d, cd, 1])?,
    )
    .map_err(merr)?;
    let codebooks = levels
        .map(|level| {
            let [sum, usage] = codebook_tensors(level);
            let sum = l.tensor(&sum, &[bins, cd])?;
            let usage = l.tensor(&usage, &[bins])?;
            Codebook::from_sums(bins, cd, &sum, &usage)
        })
        .collect::<Result<Vec<_>, MimiError>>()?;
    Ok(Rvq {
        input_proj,
        output_proj,
        codebooks,
    })
}

pub(crate) fn load_parts(
    src: &dyn MimiTensors,
    cfg: &MimiConfig,
    n_codebooks: usize,
    opts: &super::MimiOptions,
) -> Result<Parts, MimiError> {
    cfg.validate()
        .map_err(|e| MimiError::Config(e.to_string()))?;
    if n_codebooks < 1 || n_codebooks > cfg.quantizer.n_q {
        return Err(MimiError::Config(format!(
            "n_codebooks {n_codebooks} outside 1..={}",
            cfg.quantizer.n_q
        )));
    }
    let l = Loader::new(src)?.with_heads(cfg.transformer.num_heads);
    let nf = cfg.seanet.n_filters;
    let (enc, dec) = (Side::Encoder, Side::Decoder);
    let at = |a: ConvAt| a.tensor_prefix(cfg);
    // encoder
    let (k, last_k) = (cfg.seanet.kernel_size, cfg.seanet.last_kernel_size);
    let conv0 = conv(&l, &at(ConvAt::Conv0(enc)), cfg.channels, nf, k, 1, 1)?;
    let mut mult = 1;
    let mut stages = Vec::new();
    for (i, &r) in cfg.seanet.ratios.iter().rev().enumerate() {
        let dim = mult * nf;
        let res = resblocks(&l, cfg, enc, i, dim)?;
        let down = conv(&l, &at(ConvAt::Down(i)), dim, dim * 2, 2 * r, r, 1)?;
        mult *= 2;
        stages.push((res, down));
    }
    let d = cfg.seanet.dimension;
    let last = conv(&l, &at(ConvAt::Last(enc)), mult * nf, d, last_k, 1, 1)?;
    let encoder = SeanetEncoder {
        conv0,
        stages,
        last,
    };
    // decoder
    let mut mult = 1 << cfg.seanet.ratios.len();
    let conv0 = conv(&l, &at(ConvAt::Conv0(dec)), d, mult * nf, k, 1, 1)?;
    let mut stages = Vec::new();
    for (i, &r) in cfg.seanet.ratios.iter().enumerate() {
        let (cin, cout) = (mult * nf, mult * nf / 2);
        let p = ConvTrAt::Up(i).tensor_prefix(cfg);
        let w = l.tensor(&format!("{p}.weight"), &[cin, cout, 2 * r])?;
        let b = l.tensor(&format!("{p}.bias"), &[cout])?;
        let up = ConvTr1d::from_torch(cin, cout, 2 * r, r, false, &w, Some(b))?;
        let res = resblocks(&l, cfg, dec, i, cout)?;
        mult /= 2;
        stages.push((up, res));
    }
    let last = conv(&l, &at(ConvAt::Last(dec)), nf, cfg.channels, last_k, 1, 1)?;
    let decoder = SeanetDecoder {
        conv0,
        stages,
        last,
    };
    // transformers
    let enc_tr = transformer(&l, cfg, enc, opts.bf16_transformers)?;
    let dec_tr = transformer(&l, cfg, dec, opts.bf16_transformers)?;
    // resampling
    let s = cfg.resample_stride();
    let down = if s > 1 {
        let w = l.tensor(
            &format!("{}.weight", at(ConvAt::Downsample)),
            &[d, d, 2 * s],
        )?;
        Conv1d::new(d, d, 2 * s, s, 1, w, None, true)?
    } else {
        // No resampling when the encoder rate equals the frame rate: identity 1×1 conv.
        let mut w = vec![0.0; d * d];
        for i in 0..d {
            w[i * d + i] = 1.0;
        }
        Conv1d::new(d, d, 1, 1, 1, w, None, false)?
    };
    let up = if s > 1 {
        let p = ConvTrAt::Upsample.tensor_prefix(cfg);
        let w = l.tensor(&format!("{p}.weight"), &[d, 1, 2 * s])?;
        ConvTr1d::from_torch(d, d, 2 * s, s, true, &w, None)?
    } else {
        ConvTr1d::from_torch(d, d, 1, 1, true, &vec![1.0; d], None)?
    };
    // quantizer
    let quant = SplitRvq {
        d,
        cb_dim: cfg.quantizer.dimension,
        first: rvq(&l, cfg, true, 0..1)?,
        rest: rvq(&l, cfg, false, 1..n_codebooks)?,
    };
    Ok(Parts {
        encoder,
        decoder,
        enc_tr,
        dec_tr,
        down,
        up,
        quant,
        layout: l.layout(),
    })
}
