//! Building [`Mimi`](super::Mimi) from named tensors, in Kyutai's canonical names or the
//! Hugging Face `transformers` layout (`kyutai/mimi`).

use super::conv::{Conv1d, ConvTr1d};
use super::export::{ConvTrWeights, ConvWeights};
use super::names::{codebook_tensors, rvq_prefix};
use super::plan::{ConvAt, ConvTrAt, ResAt, Side};
use super::quantizer::{Codebook, Rvq, SplitRvq};
use super::seanet::{ResBlock, SeanetDecoder, SeanetEncoder};
use super::source::MimiSource;
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
    pub(super) fn new(src: &'a dyn MimiTensors) -> Result<Self, MimiError> {
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
    pub(super) fn with_heads(mut self, heads: usize) -> Self {
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

/// The CPU convolution of `w` (no bias where the checkpoint has none: adding zeros would not
/// be bitwise the same).
fn cpu_conv(w: ConvWeights, bias: bool) -> Result<Conv1d, MimiError> {
    let b = bias.then_some(w.bias);
    Conv1d::new(
        w.cin,
        w.cout,
        w.k,
        w.stride,
        w.dilation,
        w.weight,
        b,
        w.replicate,
    )
}

fn cpu_conv_tr(w: ConvTrWeights, bias: bool) -> Result<ConvTr1d, MimiError> {
    let b = bias.then_some(w.bias);
    ConvTr1d::from_torch(w.cin, w.cout, w.k, w.stride, w.depthwise, &w.weight, b)
}

fn cpu_res(src: &MimiSource, at: ResAt) -> Result<ResBlock, MimiError> {
    let w = src.res_weights(at)?;
    Ok(ResBlock {
        c1: cpu_conv(w.c1, true)?,
        c2: cpu_conv(w.c2, true)?,
    })
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

fn transformer(src: &MimiSource, side: Side, bf16: bool) -> Result<Transformer, MimiError> {
    let t = src.transformer_weights(side)?;
    let (d, ff) = (t.d, t.ff);
    let mat = |w: Vec<f32>, r: usize, c: usize| {
        weight_matrix(r, c, w, bf16).map_err(|e| MimiError::Config(format!("{side:?}: {e}")))
    };
    let layers = t
        .layers
        .into_iter()
        .map(|l| {
            Ok(Layer {
                norm1_w: l.norm1_w,
                norm1_b: l.norm1_b,
                in_proj: mat(l.in_proj, 3 * d, d)?,
                out_proj: mat(l.out_proj, d, d)?,
                ls1: l.ls1,
                norm2_w: l.norm2_w,
                norm2_b: l.norm2_b,
                linear1: mat(l.linear1, ff, d)?,
                linear2: mat(l.linear2, d, ff)?,
                ls2: l.ls2,
            })
        })
        .collect::<Result<Vec<_>, MimiError>>()?;
    Ok(Transformer {
        d,
        heads: t.heads,
        ff,
        context: t.context,
        max_period: t.max_period,
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
    if n_codebooks < 1 || n_codebooks > cfg.quantizer.n_q {
        return Err(MimiError::Config(format!(
            "n_codebooks {n_codebooks} outside 1..={}",
            cfg.quantizer.n_q
        )));
    }
    let src = MimiSource::new(src, cfg)?;
    let l = &src.loader;
    let (enc, dec) = (Side::Encoder, Side::Decoder);
    let conv = |at: ConvAt| cpu_conv(src.conv_weights(at)?, at.has_bias());
    let conv_tr = |at: ConvTrAt| cpu_conv_tr(src.conv_tr_weights(at)?, at.has_bias());
    let units = |side, stage| {
        (0..cfg.seanet.n_residual_layers)
            .map(|block| cpu_res(&src, ResAt { side, stage, block }))
            .collect::<Result<Vec<_>, MimiError>>()
    };
    let n = cfg.seanet.ratios.len();
    let encoder = SeanetEncoder {
        conv0: conv(ConvAt::Conv0(enc))?,
        stages: (0..n)
            .map(|i| Ok((units(enc, i)?, conv(ConvAt::Down(i))?)))
            .collect::<Result<_, MimiError>>()?,
        last: conv(ConvAt::Last(enc))?,
    };
    let decoder = SeanetDecoder {
        conv0: conv(ConvAt::Conv0(dec))?,
        stages: (0..n)
            .map(|i| Ok((conv_tr(ConvTrAt::Up(i))?, units(dec, i)?)))
            .collect::<Result<_, MimiError>>()?,
        last: conv(ConvAt::Last(dec))?,
    };
    // transformers
    let enc_tr = transformer(&src, enc, opts.bf16_transformers)?;
    let dec_tr = transformer(&src, dec, opts.bf16_transformers)?;
    let down = conv(ConvAt::Downsample)?;
    let up = conv_tr(ConvTrAt::Upsample)?;
    let d = cfg.seanet.dimension;
    // quantizer
    let quant = SplitRvq {
        d,
        cb_dim: cfg.quantizer.dimension,
        first: rvq(l, cfg, true, 0..1)?,
        rest: rvq(l, cfg, false, 1..n_codebooks)?,
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
