//! Mimi's weights as plain f32 arrays in PyTorch layouts, for a backend that keeps its own copy
//! (the GPU backend uploads them once at load), and the exact nearest-centroid search that such a
//! backend defers to when its own arithmetic cannot prove a code.

use super::conv::{Conv1d, ConvTr1d};
use super::plan::{ConvAt, ConvTrAt, ResAt, Side};
use super::seanet::ResBlock;
use super::transformer::Transformer;
use super::Mimi;
use kernels::Matrix;

/// A causal convolution (`StreamingConv1d`).
#[derive(Debug, Clone)]
pub struct ConvWeights {
    /// Input channels.
    pub cin: usize,
    /// Output channels.
    pub cout: usize,
    /// Kernel size.
    pub k: usize,
    /// Stride.
    pub stride: usize,
    /// Dilation.
    pub dilation: usize,
    /// Weight `[cout, cin, k]`.
    pub weight: Vec<f32>,
    /// Bias `[cout]` (zeros where the layer has none).
    pub bias: Vec<f32>,
    /// Replicate padding: the first call's left context is its first input sample.
    pub replicate: bool,
}

impl ConvWeights {
    /// Left context kept between calls (`(k − 1)·dilation + 1 − stride`).
    pub fn pad(&self) -> usize {
        (self.k - 1) * self.dilation + 1 - self.stride
    }
}

/// A causal transposed convolution (`StreamingConvTranspose1d`), groups 1 or depthwise.
#[derive(Debug, Clone)]
pub struct ConvTrWeights {
    /// Input channels.
    pub cin: usize,
    /// Output channels.
    pub cout: usize,
    /// Kernel size.
    pub k: usize,
    /// Stride.
    pub stride: usize,
    /// Depthwise (groups = channels; then `cin == cout`).
    pub depthwise: bool,
    /// Weight `[cin, cout, k]`, or `[cin, 1, k]` when depthwise.
    pub weight: Vec<f32>,
    /// Bias `[cout]` (zeros where the layer has none).
    pub bias: Vec<f32>,
}

/// A SEANet residual unit: `x + c2(ELU(c1(ELU(x))))`.
#[derive(Debug, Clone)]
pub struct ResBlockWeights {
    /// The dilated convolution.
    pub c1: ConvWeights,
    /// The 1×1 convolution.
    pub c2: ConvWeights,
}

/// One transformer layer (LayerNorm, attention with RoPE, LayerScale, GELU FFN; no biases in
/// the linears). Matrices are row-major `[out, in]`.
#[derive(Debug, Clone)]
pub struct TransformerLayerWeights {
    /// First LayerNorm weight `[d]`.
    pub norm1_w: Vec<f32>,
    /// First LayerNorm bias `[d]`.
    pub norm1_b: Vec<f32>,
    /// Fused Q, K, V projection `[3d, d]` (Q and K rows in interleaved-pair RoPE order).
    pub in_proj: Vec<f32>,
    /// Output projection `[d, d]`.
    pub out_proj: Vec<f32>,
    /// LayerScale of the attention branch `[d]`.
    pub ls1: Vec<f32>,
    /// Second LayerNorm weight `[d]`.
    pub norm2_w: Vec<f32>,
    /// Second LayerNorm bias `[d]`.
    pub norm2_b: Vec<f32>,
    /// FFN up projection `[ff, d]`.
    pub linear1: Vec<f32>,
    /// FFN down projection `[d, ff]`.
    pub linear2: Vec<f32>,
    /// LayerScale of the FFN branch `[d]`.
    pub ls2: Vec<f32>,
}

/// A Mimi transformer stack.
#[derive(Debug, Clone)]
pub struct TransformerWeights {
    /// Width.
    pub d: usize,
    /// Attention heads.
    pub heads: usize,
    /// FFN width.
    pub ff: usize,
    /// Attention context (the KV ring's capacity when streaming).
    pub context: usize,
    /// RoPE max period.
    pub max_period: f64,
    /// The layers.
    pub layers: Vec<TransformerLayerWeights>,
}

/// The split RVQ's weights, which both directions read (the encoder projects its latent and
/// searches the codebooks, the decoder sums their rows and projects back).
#[derive(Debug, Clone)]
pub struct RvqWeights {
    /// Latent width.
    pub dim: usize,
    /// Codebook width.
    pub cb_dim: usize,
    /// Codebook size.
    pub bins: usize,
    /// Centroids of every codebook in use, `[n_codebooks, bins, cb_dim]` (semantic first).
    pub centroids: Vec<f32>,
    /// Semantic input projection `[cb_dim, dim]`.
    pub first_input_proj: Vec<f32>,
    /// Acoustic input projection `[cb_dim, dim]`.
    pub rest_input_proj: Vec<f32>,
    /// Semantic output projection `[dim, cb_dim]`.
    pub first_output_proj: Vec<f32>,
    /// Acoustic output projection `[dim, cb_dim]`.
    pub rest_output_proj: Vec<f32>,
}

fn matrix_f32(m: &Matrix) -> Vec<f32> {
    let (rows, cols) = (m.rows(), m.cols());
    let mut out = vec![0.0; rows * cols];
    for (r, row) in out.chunks_exact_mut(cols.max(1)).enumerate().take(rows) {
        m.row_f32(r, row);
    }
    out
}

fn conv(c: &Conv1d) -> ConvWeights {
    ConvWeights {
        cin: c.cin,
        cout: c.cout,
        k: c.k,
        stride: c.stride,
        dilation: c.dilation,
        weight: c.weight_f32(),
        bias: c.bias.clone().unwrap_or_else(|| vec![0.0; c.cout]),
        replicate: c.replicate,
    }
}

fn conv_tr(c: &ConvTr1d) -> ConvTrWeights {
    ConvTrWeights {
        cin: c.cin,
        cout: c.cout,
        k: c.k,
        stride: c.stride,
        depthwise: c.depthwise(),
        weight: c.weight_f32(),
        bias: c.bias.clone().unwrap_or_else(|| vec![0.0; c.cout]),
    }
}

fn res(b: &ResBlock) -> ResBlockWeights {
    ResBlockWeights {
        c1: conv(&b.c1),
        c2: conv(&b.c2),
    }
}

fn transformer(t: &Transformer) -> TransformerWeights {
    TransformerWeights {
        d: t.d,
        heads: t.heads,
        ff: t.ff,
        context: t.context,
        max_period: t.max_period,
        layers: t
            .layers
            .iter()
            .map(|l| TransformerLayerWeights {
                norm1_w: l.norm1_w.clone(),
                norm1_b: l.norm1_b.clone(),
                in_proj: matrix_f32(&l.in_proj),
                out_proj: matrix_f32(&l.out_proj),
                ls1: l.ls1.clone(),
                norm2_w: l.norm2_w.clone(),
                norm2_b: l.norm2_b.clone(),
                linear1: matrix_f32(&l.linear1),
                linear2: matrix_f32(&l.linear2),
                ls2: l.ls2.clone(),
            })
            .collect(),
    }
}

/// The weights a plan names ([`super::MimiPlan`]), one by place, as f32 arrays (allocates;
/// load-time only).
impl Mimi {
    /// The split RVQ's codebooks and projections.
    pub fn rvq_weights(&self) -> RvqWeights {
        let q = &self.quant;
        RvqWeights {
            dim: q.d,
            cb_dim: q.cb_dim,
            bins: q.bins(),
            centroids: std::iter::once(&q.first.codebooks[0])
                .chain(&q.rest.codebooks)
                .flat_map(|c| c.centroids.iter().copied())
                .collect(),
            first_input_proj: matrix_f32(&q.first.input_proj),
            rest_input_proj: matrix_f32(&q.rest.input_proj),
            first_output_proj: matrix_f32(&q.first.output_proj),
            rest_output_proj: matrix_f32(&q.rest.output_proj),
        }
    }

    /// The convolution at `at`, if the model has it.
    pub fn conv_weights(&self, at: ConvAt) -> Option<ConvWeights> {
        self.conv_at(at).map(conv)
    }

    /// The transposed convolution at `at`, if the model has it.
    pub fn conv_tr_weights(&self, at: ConvTrAt) -> Option<ConvTrWeights> {
        self.conv_tr_at(at).map(conv_tr)
    }

    /// The residual unit at `at`, if the model has it.
    pub fn res_weights(&self, at: ResAt) -> Option<ResBlockWeights> {
        self.res_at(at).map(res)
    }

    /// A side's transformer.
    pub fn transformer_weights(&self, side: Side) -> TransformerWeights {
        transformer(self.transformer(side))
    }

    /// The split RVQ's codes for one latent step given its two projected latents (`first`:
    /// the semantic input projection's output, `rest`: the acoustic one, `cb_dim` values each),
    /// decided exactly as the CPU encoder decides them: per level, the argmin over all centroids
    /// of `½‖c‖² − x·c` evaluated in f64 (first index on ties), the acoustic residual updated in
    /// f32. `rest` is used as scratch. Allocation-free.
    pub fn rvq_codes_exact(&self, first: &[f32], rest: &mut [f32], codes: &mut [u32]) {
        let q = &self.quant;
        codes[0] = q.first.codebooks[0].nearest_exact(first) as u32;
        for (j, book) in q.rest.codebooks.iter().enumerate() {
            let i = book.nearest_exact(rest);
            codes[j + 1] = i as u32;
            for (v, e) in rest.iter_mut().zip(book.row(i)) {
                *v -= *e;
            }
        }
    }
}
