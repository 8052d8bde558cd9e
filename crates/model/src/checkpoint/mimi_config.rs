//! The Mimi codec configuration ([`MimiConfig`], the dict `loaders._mimi_config` of `moshi` 0.2.13).

use serde_json::{Map, Value};

use super::json::{
    as_f64, bad, check_unknown, parse_json, positive, top_object, unsupported, Getter,
};
use super::layers::{ffn_hidden, Gating, NormKind, PosEmb};
use super::CheckpointError;

/// SEANet encoder/decoder configuration (`seanet` sub-dict).
#[derive(Debug, Clone, PartialEq)]
pub struct SeanetConfig {
    /// Audio channels (1).
    pub channels: usize,
    /// Latent dimension (512).
    pub dimension: usize,
    /// Causal convolutions.
    pub causal: bool,
    /// Base filters (64).
    pub n_filters: usize,
    /// Residual layers per block (1).
    pub n_residual_layers: usize,
    /// Activation name ("ELU").
    pub activation: String,
    /// ELU alpha (`activation_params.alpha`, 1.0).
    pub activation_alpha: f32,
    /// Residual compression (2).
    pub compress: usize,
    /// Dilation base (2).
    pub dilation_base: usize,
    /// `disable_norm_outer_blocks` (0).
    pub disable_norm_outer_blocks: usize,
    /// First conv kernel (7).
    pub kernel_size: usize,
    /// Residual conv kernel (3).
    pub residual_kernel_size: usize,
    /// Last conv kernel (3).
    pub last_kernel_size: usize,
    /// Norm ("none").
    pub norm: String,
    /// Pad mode ("constant").
    pub pad_mode: String,
    /// Ratios in decoder order ([8, 6, 5, 4]); the encoder uses them reversed.
    pub ratios: Vec<usize>,
    /// Identity skip in residual blocks.
    pub true_skip: bool,
    /// LSTM layers (0).
    pub lstm: usize,
}

/// Mimi transformer configuration (`transformer` sub-dict).
#[derive(Debug, Clone, PartialEq)]
pub struct MimiTransformerConfig {
    /// Width (512).
    pub d_model: usize,
    /// Heads (8).
    pub num_heads: usize,
    /// Layers (8).
    pub num_layers: usize,
    /// Causal.
    pub causal: bool,
    /// LayerScale init (0.01); `None` = no LayerScale.
    pub layer_scale: Option<f64>,
    /// Attention context (250).
    pub context: Option<usize>,
    /// `[B, C, T]` layout.
    pub conv_layout: bool,
    /// RoPE max period (10000).
    pub max_period: f64,
    /// FFN kind ("none" = GELU FFN).
    pub gating: Gating,
    /// Norm ("layer_norm").
    pub norm: NormKind,
    /// Positional embedding ("rope").
    pub positional_embedding: PosEmb,
    /// FFN width (2048).
    pub dim_feedforward: usize,
    /// Input dimension (512; equal to `d_model` means no input projection).
    pub input_dimension: usize,
    /// Output dimensions (`[512]`).
    pub output_dimensions: Vec<usize>,
}

impl MimiTransformerConfig {
    /// Head dimension.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.num_heads.max(1)
    }
    /// FFN hidden size (as `modules/gating.py` computes it).
    pub fn ffn_hidden(&self) -> usize {
        ffn_hidden(self.gating, self.d_model, self.dim_feedforward)
    }
    /// Norm epsilon.
    pub fn norm_eps(&self) -> f32 {
        self.norm.eps()
    }
}

/// Split RVQ configuration (`quantizer` sub-dict).
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizerConfig {
    /// Codebook dimension (256).
    pub dimension: usize,
    /// Total codebooks (32).
    pub n_q: usize,
    /// Semantic codebooks (1).
    pub n_q_semantic: usize,
    /// Codebook size (2048).
    pub bins: usize,
    /// Input dimension (512).
    pub input_dimension: usize,
    /// Output dimension (512).
    pub output_dimension: usize,
}

/// Mimi codec configuration (`_mimi_config` in `loaders.py`).
#[derive(Debug, Clone, PartialEq)]
pub struct MimiConfig {
    /// Sample rate (24000).
    pub sample_rate: usize,
    /// Channels (1).
    pub channels: usize,
    /// Frame rate (12.5).
    pub frame_rate: f64,
    /// SEANet.
    pub seanet: SeanetConfig,
    /// Transformers (encoder and decoder share the config).
    pub transformer: MimiTransformerConfig,
    /// Quantizer.
    pub quantizer: QuantizerConfig,
}

impl MimiConfig {
    /// The released Mimi configuration (`tokenizer-e351c8d8-checkpoint125`).
    pub fn v0_1() -> Self {
        MimiConfig {
            sample_rate: 24000,
            channels: 1,
            frame_rate: 12.5,
            seanet: SeanetConfig {
                channels: 1,
                dimension: 512,
                causal: true,
                n_filters: 64,
                n_residual_layers: 1,
                activation: "ELU".into(),
                activation_alpha: 1.0,
                compress: 2,
                dilation_base: 2,
                disable_norm_outer_blocks: 0,
                kernel_size: 7,
                residual_kernel_size: 3,
                last_kernel_size: 3,
                norm: "none".into(),
                pad_mode: "constant".into(),
                ratios: vec![8, 6, 5, 4],
                true_skip: true,
                lstm: 0,
            },
            transformer: MimiTransformerConfig {
                d_model: 512,
                num_heads: 8,
                num_layers: 8,
                causal: true,
                layer_scale: Some(0.01),
                context: Some(250),
                conv_layout: true,
                max_period: 10000.0,
                gating: Gating::None,
                norm: NormKind::LayerNorm,
                positional_embedding: PosEmb::Rope,
                dim_feedforward: 2048,
                input_dimension: 512,
                output_dimensions: vec![512],
            },
            quantizer: QuantizerConfig {
                dimension: 256,
                n_q: 32,
                n_q_semantic: 1,
                bins: 2048,
                input_dimension: 512,
                output_dimension: 512,
            },
        }
    }

    /// SEANet hop length (`prod(ratios)`, 960).
    pub fn hop_length(&self) -> usize {
        self.seanet.ratios.iter().product()
    }
    /// Samples per Mimi frame (`sample_rate / frame_rate`, 1920).
    pub fn frame_size(&self) -> usize {
        (self.sample_rate as f64 / self.frame_rate).round() as usize
    }
    /// Encoder frame rate (`sample_rate / hop_length`, 25 Hz).
    pub fn encoder_frame_rate(&self) -> f64 {
        self.sample_rate as f64 / self.hop_length().max(1) as f64
    }
    /// Down/upsampling stride (`encoder_frame_rate / frame_rate`, 2).
    pub fn resample_stride(&self) -> usize {
        (self.encoder_frame_rate() / self.frame_rate).round() as usize
    }

    /// Parse a Mimi config JSON (`{sample_rate, channels, frame_rate, seanet, transformer, quantizer}`).
    ///
    /// Keys absent from the JSON take the released values ([`MimiConfig::v0_1`]); unknown keys are an error.
    pub fn from_json(text: &str) -> Result<Self, CheckpointError> {
        let v = parse_json(text, "mimi config")?;
        let obj = top_object(&v, "mimi config")?;
        let d = MimiConfig::v0_1();
        let mut g = Getter {
            obj,
            used: vec!["seanet", "transformer", "quantizer"],
        };
        let sample_rate = g.usize("sample_rate", d.sample_rate)?;
        let channels = g.usize("channels", d.channels)?;
        let frame_rate = g.f64("frame_rate", d.frame_rate)?;
        check_unknown(&g, "")?;
        let sub = |k: &str| -> Result<Map<String, Value>, CheckpointError> {
            match obj.get(k) {
                None | Some(Value::Null) => Ok(Map::new()),
                Some(Value::Object(m)) => Ok(m.clone()),
                Some(_) => Err(bad(k, "must be an object".into())),
            }
        };
        let s = sub("seanet")?;
        let mut g = Getter {
            obj: &s,
            used: vec!["norm_params", "mask_fn", "mask_position"],
        };
        let ds = &d.seanet;
        let alpha = match g.get("activation_params") {
            None => ds.activation_alpha,
            Some(Value::Object(m)) => match m.get("alpha") {
                Some(v) => as_f64("seanet.activation_params.alpha", v)? as f32,
                None => ds.activation_alpha,
            },
            Some(_) => return Err(bad("seanet.activation_params", "must be an object".into())),
        };
        let seanet = SeanetConfig {
            channels: g.usize("channels", ds.channels)?,
            dimension: g.usize("dimension", ds.dimension)?,
            causal: g.bool("causal", ds.causal)?,
            n_filters: g.usize("n_filters", ds.n_filters)?,
            n_residual_layers: g.usize("n_residual_layers", ds.n_residual_layers)?,
            activation: g.string("activation", &ds.activation)?,
            activation_alpha: alpha,
            compress: g.usize("compress", ds.compress)?,
            dilation_base: g.usize("dilation_base", ds.dilation_base)?,
            disable_norm_outer_blocks: g.usize("disable_norm_outer_blocks", 0)?,
            kernel_size: g.usize("kernel_size", ds.kernel_size)?,
            residual_kernel_size: g.usize("residual_kernel_size", ds.residual_kernel_size)?,
            last_kernel_size: g.usize("last_kernel_size", ds.last_kernel_size)?,
            norm: g.string("norm", &ds.norm)?,
            pad_mode: g.string("pad_mode", &ds.pad_mode)?,
            ratios: g.usize_list("ratios", &ds.ratios)?,
            true_skip: g.bool("true_skip", ds.true_skip)?,
            lstm: g.usize("lstm", 0)?,
        };
        check_unknown(&g, "seanet.")?;
        let t = sub("transformer")?;
        let mut g = Getter {
            obj: &t,
            used: vec![],
        };
        let dt = &d.transformer;
        let layer_scale = if t.contains_key("layer_scale") {
            g.opt_f64("layer_scale")?
        } else {
            dt.layer_scale
        };
        let context = if t.contains_key("context") {
            g.opt_usize("context")?
        } else {
            dt.context
        };
        let d_model = g.usize("d_model", dt.d_model)?;
        let transformer = MimiTransformerConfig {
            d_model,
            num_heads: g.usize("num_heads", dt.num_heads)?,
            num_layers: g.usize("num_layers", dt.num_layers)?,
            causal: g.bool("causal", dt.causal)?,
            layer_scale,
            context,
            conv_layout: g.bool("conv_layout", dt.conv_layout)?,
            max_period: g.f64("max_period", dt.max_period)?,
            gating: Gating::parse("transformer.gating", &g.string("gating", dt.gating.name())?)?,
            norm: NormKind::parse("transformer.norm", &g.string("norm", dt.norm.name())?)?,
            positional_embedding: PosEmb::parse(
                "transformer.positional_embedding",
                &g.string("positional_embedding", dt.positional_embedding.name())?,
            )?,
            dim_feedforward: g.usize("dim_feedforward", dt.dim_feedforward)?,
            input_dimension: g.usize("input_dimension", d_model)?,
            output_dimensions: g.usize_list("output_dimensions", &[d_model])?,
        };
        check_unknown(&g, "transformer.")?;
        let q = sub("quantizer")?;
        let mut g = Getter {
            obj: &q,
            used: vec![
                "q_dropout",
                "no_quantization_rate",
                "threshold_usage_ratio",
                "replaced_usage_ratio",
                "codebook_offset",
                "decay",
                "epsilon",
                "force_projection",
            ],
        };
        let dq = &d.quantizer;
        let quantizer = QuantizerConfig {
            dimension: g.usize("dimension", dq.dimension)?,
            n_q: g.usize("n_q", dq.n_q)?,
            n_q_semantic: g.usize("n_q_semantic", 1)?,
            bins: g.usize("bins", dq.bins)?,
            input_dimension: g.usize("input_dimension", dq.input_dimension)?,
            output_dimension: g.usize("output_dimension", dq.output_dimension)?,
        };
        check_unknown(&g, "quantizer.")?;
        let cfg = MimiConfig {
            sample_rate,
            channels,
            frame_rate,
            seanet,
            transformer,
            quantizer,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Parse either a Kyutai Mimi config ([`MimiConfig::from_json`]) or a Hugging Face `transformers`
    /// Mimi config (`"model_type": "mimi"`, see [`MimiConfig::from_hf_json`]).
    pub fn from_any_json(text: &str) -> Result<Self, CheckpointError> {
        let v = parse_json(text, "mimi config")?;
        if v.get("model_type").and_then(Value::as_str) == Some("mimi") {
            Self::from_hf_value(&v)
        } else {
            Self::from_json(text)
        }
    }

    /// Parse a Hugging Face `transformers` `MimiConfig` JSON (`hidden_size`, `num_filters`,
    /// `upsampling_ratios`, ...). Keys it does not name take the released values.
    pub fn from_hf_json(text: &str) -> Result<Self, CheckpointError> {
        let v = parse_json(text, "mimi config")?;
        Self::from_hf_value(&v)
    }

    fn from_hf_value(v: &Value) -> Result<Self, CheckpointError> {
        let obj = top_object(v, "mimi config")?;
        let mut c = MimiConfig::v0_1();
        // Read-only: `transformers` configs hold many training-only keys, so unknown keys are not refused.
        let mut g = Getter { obj, used: vec![] };
        c.sample_rate = g.usize("sampling_rate", c.sample_rate)?;
        c.channels = g.usize("audio_channels", c.channels)?;
        c.seanet.channels = c.channels;
        let dim = g.usize("hidden_size", c.seanet.dimension)?;
        c.seanet.dimension = dim;
        c.transformer.d_model = dim;
        c.transformer.input_dimension = dim;
        c.transformer.output_dimensions = vec![dim];
        c.quantizer.input_dimension = dim;
        c.quantizer.output_dimension = dim;
        c.seanet.n_filters = g.usize("num_filters", c.seanet.n_filters)?;
        c.seanet.kernel_size = g.usize("kernel_size", c.seanet.kernel_size)?;
        c.seanet.last_kernel_size = g.usize("last_kernel_size", c.seanet.last_kernel_size)?;
        c.seanet.residual_kernel_size =
            g.usize("residual_kernel_size", c.seanet.residual_kernel_size)?;
        c.seanet.n_residual_layers = g.usize("num_residual_layers", c.seanet.n_residual_layers)?;
        c.seanet.dilation_base = g.usize("dilation_growth_rate", c.seanet.dilation_base)?;
        c.seanet.compress = g.usize("compress", c.seanet.compress)?;
        c.seanet.ratios = g.usize_list("upsampling_ratios", &c.seanet.ratios)?;
        c.seanet.pad_mode = g.string("pad_mode", &c.seanet.pad_mode)?;
        c.transformer.num_heads = g.usize("num_attention_heads", c.transformer.num_heads)?;
        c.transformer.num_layers = g.usize("num_hidden_layers", c.transformer.num_layers)?;
        c.transformer.dim_feedforward =
            g.usize("intermediate_size", c.transformer.dim_feedforward)?;
        c.transformer.context =
            Some(g.usize("sliding_window", c.transformer.context.unwrap_or(250))?);
        c.transformer.max_period = g.f64("rope_theta", c.transformer.max_period)?;
        c.frame_rate = g.f64("frame_rate", c.frame_rate)?;
        c.quantizer.dimension = g.usize("codebook_dim", c.quantizer.dimension)?;
        c.quantizer.bins = g.usize("codebook_size", c.quantizer.bins)?;
        c.quantizer.n_q = g.usize("num_quantizers", c.quantizer.n_q)?;
        c.quantizer.n_q_semantic = g.usize("num_semantic_quantizers", 1)?;
        if g.bool("use_conv_shortcut", false)? {
            return Err(CheckpointError::UnsupportedArchitecture {
                key: "use_conv_shortcut".into(),
                value: "true".into(),
                reason: "only false".into(),
            });
        }
        let act = g.string("hidden_act", "gelu")?;
        if act != "gelu" {
            return Err(CheckpointError::UnsupportedArchitecture {
                key: "hidden_act".into(),
                value: act,
                reason: "only gelu".into(),
            });
        }
        c.validate()?;
        Ok(c)
    }

    /// Check that the configuration is the released Mimi architecture (any sizes).
    pub fn validate(&self) -> Result<(), CheckpointError> {
        let s = &self.seanet;
        let t = &self.transformer;
        let q = &self.quantizer;
        positive(&[
            ("sample_rate", self.sample_rate),
            ("seanet.dimension", s.dimension),
            ("seanet.n_filters", s.n_filters),
            ("seanet.compress", s.compress),
            ("transformer.d_model", t.d_model),
            ("transformer.num_heads", t.num_heads),
            ("quantizer.dimension", q.dimension),
            ("quantizer.bins", q.bins),
        ])?;
        if s.ratios.is_empty() || s.ratios.contains(&0) {
            return Err(bad(
                "seanet.ratios",
                "must be non-empty and positive".into(),
            ));
        }
        if self.frame_rate.is_nan() || self.frame_rate <= 0.0 {
            return Err(bad("frame_rate", "must be positive".into()));
        }
        if self.channels != 1 || s.channels != 1 {
            return unsupported("channels", self.channels.to_string(), "only mono");
        }
        if s.n_residual_layers > 0 && !s.n_filters.is_multiple_of(s.compress) {
            return Err(bad(
                "seanet.n_filters",
                "must be divisible by seanet.compress".into(),
            ));
        }
        if s.activation != "ELU" {
            return unsupported("seanet.activation", s.activation.clone(), "only ELU");
        }
        if s.norm != "none" && s.norm != "weight_norm" {
            return unsupported("seanet.norm", s.norm.clone(), "only none (weights folded)");
        }
        if s.pad_mode != "constant" {
            return unsupported("seanet.pad_mode", s.pad_mode.clone(), "only constant");
        }
        if s.lstm != 0 {
            return unsupported("seanet.lstm", s.lstm.to_string(), "only 0");
        }
        if !s.true_skip {
            return unsupported("seanet.true_skip", "false".into(), "only true");
        }
        if !s.causal {
            return unsupported("seanet.causal", "false".into(), "only causal");
        }
        if !t.d_model.is_multiple_of(t.num_heads) || !t.head_dim().is_multiple_of(2) {
            return Err(bad(
                "transformer.num_heads",
                "must divide d_model into even head dims".into(),
            ));
        }
        if t.d_model != s.dimension
            || t.input_dimension != t.d_model
            || t.output_dimensions != vec![t.d_model]
        {
            return unsupported(
                "transformer.d_model",
                t.d_model.to_string(),
                "must equal seanet.dimension, input_dimension and output_dimensions (no projections)",
            );
        }
        if t.gating != Gating::None {
            return unsupported("transformer.gating", t.gating.name().into(), "only none");
        }
        if t.norm != NormKind::LayerNorm {
            return unsupported("transformer.norm", t.norm.name().into(), "only layer_norm");
        }
        if t.positional_embedding != PosEmb::Rope {
            return unsupported(
                "transformer.positional_embedding",
                t.positional_embedding.name().into(),
                "only rope",
            );
        }
        if q.n_q <= q.n_q_semantic || q.n_q_semantic != 1 {
            return Err(bad("quantizer.n_q", "need n_q_semantic = 1 < n_q".into()));
        }
        if q.input_dimension != s.dimension || q.output_dimension != s.dimension {
            return unsupported(
                "quantizer.input_dimension",
                q.input_dimension.to_string(),
                "must equal seanet.dimension",
            );
        }
        let hop = self.hop_length();
        let enc_rate = self.sample_rate as f64 / hop as f64;
        let stride = enc_rate / self.frame_rate;
        if (stride - stride.round()).abs() > 1e-9 || stride.round() < 1.0 {
            return Err(bad(
                "frame_rate",
                "encoder frame rate must be an integer multiple of frame_rate".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mimi_config_roundtrip_and_tiny() {
        let json = r#"{"sample_rate": 24000, "channels": 1, "frame_rate": 12.5,
          "seanet": {"channels": 1, "dimension": 32, "causal": true, "n_filters": 4, "n_residual_layers": 1,
            "activation": "ELU", "compress": 2, "dilation_base": 2, "disable_norm_outer_blocks": 0,
            "kernel_size": 7, "residual_kernel_size": 3, "last_kernel_size": 3, "norm": "none",
            "pad_mode": "constant", "ratios": [8, 6, 5, 4], "true_skip": true},
          "quantizer": {"dimension": 16, "n_q": 16, "bins": 64, "input_dimension": 32, "output_dimension": 32},
          "transformer": {"d_model": 32, "num_heads": 4, "num_layers": 2, "causal": true, "layer_scale": 0.01,
            "context": 8, "conv_layout": true, "max_period": 10000, "gating": "none", "norm": "layer_norm",
            "positional_embedding": "rope", "dim_feedforward": 64, "input_dimension": 32,
            "output_dimensions": [32]}}"#;
        let c = MimiConfig::from_json(json).unwrap();
        assert_eq!(c.seanet.dimension, 32);
        assert_eq!(c.transformer.context, Some(8));
        assert_eq!(c.quantizer.bins, 64);
        assert_eq!(c.frame_size(), 1920);
        assert_eq!(c.hop_length(), 960);
        assert_eq!(c.resample_stride(), 2);
        assert_eq!(MimiConfig::from_json("{}").unwrap(), MimiConfig::v0_1());
        assert!(matches!(
            MimiConfig::from_json(r#"{"seanet": {"lstm": 2}}"#),
            Err(CheckpointError::UnsupportedArchitecture { .. })
        ));
        assert!(matches!(
            MimiConfig::from_json(r#"{"seanet": {"bogus": 2}}"#),
            Err(CheckpointError::UnknownConfigKeys { .. })
        ));
    }
}
