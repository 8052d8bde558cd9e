//! Where each weight of [`MimiPlan`](super::MimiPlan)'s places lives in a checkpoint: the one
//! table from place to tensor name, read by the CPU loader (`load.rs`) and by any backend that
//! reads the checkpoint itself.
//!
//! Names are Kyutai's canonical ones (`encoder.model.{i}.conv.conv.weight`, ...); a
//! checkpoint in the Hugging Face layout is read through [`Layout::checkpoint_name`], which
//! maps a canonical name to that layout's. Kyutai numbers the SEANet's modules in one
//! `Sequential` per side, ELUs included, so a place's index follows from the config: per stage
//! its residual units, an ELU and the strided convolution (encoder), or an ELU, the transposed
//! convolution and the residual units (decoder).

use super::load::Layout;
use super::plan::{ConvAt, ConvTrAt, ResAt, Side};
use crate::checkpoint::MimiConfig;

fn model(side: Side) -> &'static str {
    match side {
        Side::Encoder => "encoder.model",
        Side::Decoder => "decoder.model",
    }
}

/// Modules per SEANet stage in Kyutai's `Sequential`: the residual units, an ELU, the
/// (transposed) convolution.
fn per_stage(config: &MimiConfig) -> usize {
    config.seanet.n_residual_layers + 2
}

impl ConvAt {
    /// The convolution's tensor-name prefix: its weight is `{prefix}.weight`, its bias (where
    /// [`ConvAt::has_bias`]) `{prefix}.bias`.
    pub fn tensor_prefix(self, config: &MimiConfig) -> String {
        let (n, nres) = (config.seanet.ratios.len(), config.seanet.n_residual_layers);
        let idx = match self {
            ConvAt::Conv0(side) => return format!("{}.0.conv.conv", model(side)),
            ConvAt::Downsample => return "downsample.conv.conv.conv".into(),
            ConvAt::Down(i) => 1 + i * per_stage(config) + nres + 1,
            // After the stages, one ELU.
            ConvAt::Last(_) => 1 + n * per_stage(config) + 1,
        };
        let side = match self {
            ConvAt::Last(side) => side,
            _ => Side::Encoder,
        };
        format!("{}.{idx}.conv.conv", model(side))
    }

    /// Whether the checkpoint holds a bias (the learnt downsample has none).
    pub fn has_bias(self) -> bool {
        self != ConvAt::Downsample
    }
}

impl ConvTrAt {
    /// The transposed convolution's tensor-name prefix: its weight is `{prefix}.weight`, its
    /// bias (where [`ConvTrAt::has_bias`]) `{prefix}.bias`.
    pub fn tensor_prefix(self, config: &MimiConfig) -> String {
        match self {
            // An ELU opens each decoder stage.
            ConvTrAt::Up(i) => format!("decoder.model.{}.convtr.convtr", 2 + i * per_stage(config)),
            ConvTrAt::Upsample => "upsample.convtr.convtr.convtr".into(),
        }
    }

    /// Whether the checkpoint holds a bias (the depthwise upsample has none).
    pub fn has_bias(self) -> bool {
        self != ConvTrAt::Upsample
    }
}

impl ResAt {
    /// The tensor-name prefixes of the unit's two convolutions (the dilated one, the 1×1 one),
    /// each with a weight and a bias.
    pub fn tensor_prefixes(self, config: &MimiConfig) -> [String; 2] {
        let first = match self.side {
            Side::Encoder => 1,
            Side::Decoder => 3,
        };
        let idx = first + self.stage * per_stage(config) + self.block;
        let p = model(self.side);
        [
            format!("{p}.{idx}.block.1.conv.conv"),
            format!("{p}.{idx}.block.3.conv.conv"),
        ]
    }
}

/// Tensor names within one transformer layer, by their CPU field: LayerNorms, the fused QKV
/// projection, the output projection, the LayerScales, the FFN.
pub const LAYER_TENSORS: [&str; 10] = [
    "norm1.weight",
    "norm1.bias",
    "self_attn.in_proj_weight",
    "self_attn.out_proj.weight",
    "layer_scale_1.scale",
    "norm2.weight",
    "norm2.bias",
    "linear1.weight",
    "linear2.weight",
    "layer_scale_2.scale",
];

/// The tensor-name prefix of a side's transformer layer (ends in `.`; append one of
/// [`LAYER_TENSORS`]).
pub fn layer_prefix(side: Side, layer: usize) -> String {
    let t = match side {
        Side::Encoder => "encoder_transformer",
        Side::Decoder => "decoder_transformer",
    };
    format!("{t}.transformer.layers.{layer}.")
}

/// The tensor-name prefix of the split RVQ's semantic (`first`) or acoustic quantizer: its
/// projections are `{prefix}.input_proj.weight` and `{prefix}.output_proj.weight`.
pub fn rvq_prefix(first: bool) -> &'static str {
    if first {
        "quantizer.rvq_first"
    } else {
        "quantizer.rvq_rest"
    }
}

/// The tensor names of codebook `level` of the split RVQ (0 is the semantic one): its
/// `embedding_sum` and `cluster_usage`, from which the centroids are computed.
pub fn codebook_tensors(level: usize) -> [String; 2] {
    let p = match level {
        0 => format!("{}.vq.layers.0._codebook", rvq_prefix(true)),
        l => format!("{}.vq.layers.{}._codebook", rvq_prefix(false), l - 1),
    };
    [format!("{p}.embedding_sum"), format!("{p}.cluster_usage")]
}

/// Every canonical tensor name the codec reads for `config` with `n_codebooks` codebooks, in
/// the order of the places of [`MimiPlan::new`](super::MimiPlan::new) (encoder side, then
/// decoder side, then the RVQ).
pub fn tensor_names(config: &MimiConfig, n_codebooks: usize) -> Vec<String> {
    let plan = super::MimiPlan::new(config);
    let mut out = Vec::new();
    let wb = |out: &mut Vec<String>, prefix: String, bias: bool| {
        out.push(format!("{prefix}.weight"));
        if bias {
            out.push(format!("{prefix}.bias"));
        }
    };
    for step in plan.encoder.iter().chain(&plan.decoder) {
        match *step {
            super::Step::Conv { at, .. } => wb(&mut out, at.tensor_prefix(config), at.has_bias()),
            super::Step::ConvTr { at, .. } => wb(&mut out, at.tensor_prefix(config), at.has_bias()),
            super::Step::Res(at) => at
                .tensor_prefixes(config)
                .into_iter()
                .for_each(|p| wb(&mut out, p, true)),
            super::Step::Layer { side, layer } => {
                let p = layer_prefix(side, layer);
                out.extend(LAYER_TENSORS.iter().map(|t| format!("{p}{t}")));
            }
            _ => {}
        }
    }
    for first in [true, false] {
        for proj in ["input_proj", "output_proj"] {
            out.push(format!("{}.{proj}.weight", rvq_prefix(first)));
        }
    }
    out.extend((0..n_codebooks).flat_map(codebook_tensors));
    out
}

impl Layout {
    /// `canonical`'s name in a checkpoint of this layout. A Hugging Face checkpoint splits a
    /// layer's `self_attn.in_proj_weight` into `q_proj`, `k_proj`, `v_proj` (with the Q and K
    /// rows permuted); that one has no single name here and the loader reads it apart.
    pub fn checkpoint_name(self, canonical: &str) -> String {
        if self == Layout::Kyutai {
            return canonical.to_string();
        }
        const HF: [(&str, &str); 20] = [
            // the quantizer first (its `_codebook` part)
            (
                "quantizer.rvq_first.vq.layers.",
                "quantizer.semantic_residual_vector_quantizer.layers.",
            ),
            (
                "quantizer.rvq_rest.vq.layers.",
                "quantizer.acoustic_residual_vector_quantizer.layers.",
            ),
            (
                "quantizer.rvq_first.",
                "quantizer.semantic_residual_vector_quantizer.",
            ),
            (
                "quantizer.rvq_rest.",
                "quantizer.acoustic_residual_vector_quantizer.",
            ),
            ("._codebook.embedding_sum", ".codebook.embed_sum"),
            ("._codebook.cluster_usage", ".codebook.cluster_usage"),
            ("downsample.conv.conv.conv.", "downsample.conv."),
            ("upsample.convtr.convtr.convtr.", "upsample.conv."),
            ("encoder.model.", "encoder.layers."),
            ("decoder.model.", "decoder.layers."),
            (".conv.conv.", ".conv."),
            (".convtr.convtr.", ".conv."),
            ("_transformer.transformer.layers.", "_transformer.layers."),
            ("self_attn.out_proj.", "self_attn.o_proj."),
            (".linear1.", ".mlp.fc1."),
            (".linear2.", ".mlp.fc2."),
            (".norm1.", ".input_layernorm."),
            (".norm2.", ".post_attention_layernorm."),
            (".layer_scale_1.", ".self_attn_layer_scale."),
            (".layer_scale_2.", ".mlp_layer_scale."),
        ];
        HF.iter()
            .fold(canonical.to_string(), |n, (from, to)| n.replace(from, to))
    }
}
