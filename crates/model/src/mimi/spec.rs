//! Mimi dimensions: the released values and those read from a Mimi config JSON
//! (the dict `loaders._mimi_config` of `moshi` 0.2.13, as written by `tools/oracle`).

use super::MimiError;
use serde_json::Value;

/// Every size and flag the Mimi implementation depends on.
#[derive(Debug, Clone, PartialEq)]
pub struct MimiSpec {
    /// Audio sample rate in Hz (24000).
    pub sample_rate: usize,
    /// Codec frame rate in Hz (12.5).
    pub frame_rate: f64,
    /// Audio channels (1).
    pub channels: usize,
    /// Latent dimension (SEANet `dimension`, transformer `d_model`), 512.
    pub dimension: usize,
    /// SEANet base number of filters (64).
    pub n_filters: usize,
    /// Decoder-order ratios ([8, 6, 5, 4]); the encoder uses them reversed.
    pub ratios: Vec<usize>,
    /// First conv kernel (7).
    pub kernel_size: usize,
    /// Last conv kernel (3).
    pub last_kernel_size: usize,
    /// Residual conv kernel (3).
    pub residual_kernel_size: usize,
    /// Residual layers per stage (1).
    pub n_residual_layers: usize,
    /// Dilation base of the residual layers (2).
    pub dilation_base: usize,
    /// Residual hidden size divisor (2).
    pub compress: usize,
    /// Transformer heads (8).
    pub num_heads: usize,
    /// Transformer layers (8).
    pub num_layers: usize,
    /// FFN hidden size (2048).
    pub dim_feedforward: usize,
    /// Attention context in 25 Hz steps (250).
    pub context: usize,
    /// RoPE max period (10000).
    pub max_period: f64,
    /// Codebook dimension (256).
    pub codebook_dim: usize,
    /// Codebook size (2048).
    pub bins: usize,
    /// Total quantizers in the checkpoint (32: 1 semantic + 31 acoustic).
    pub n_q: usize,
}

impl MimiSpec {
    /// The released Mimi (`tokenizer-e351c8d8-checkpoint125.safetensors`).
    pub fn v0_1() -> Self {
        MimiSpec {
            sample_rate: 24000,
            frame_rate: 12.5,
            channels: 1,
            dimension: 512,
            n_filters: 64,
            ratios: vec![8, 6, 5, 4],
            kernel_size: 7,
            last_kernel_size: 3,
            residual_kernel_size: 3,
            n_residual_layers: 1,
            dilation_base: 2,
            compress: 2,
            num_heads: 8,
            num_layers: 8,
            dim_feedforward: 2048,
            context: 250,
            max_period: 10000.0,
            codebook_dim: 256,
            bins: 2048,
            n_q: 32,
        }
    }

    /// Parses a Mimi config JSON (keys `sample_rate`, `frame_rate`, `channels`, `seanet`,
    /// `transformer`, `quantizer`, as in `moshi.models.loaders._mimi_config`). Missing keys
    /// take the released values; flags that select another architecture are refused.
    pub fn from_json(text: &str) -> Result<Self, MimiError> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| MimiError::Config(format!("invalid JSON: {e}")))?;
        Self::from_value(&v)
    }

    /// Parses either a Kyutai-style Mimi config or a Hugging Face `transformers` Mimi config
    /// (`"model_type": "mimi"`, keys `hidden_size`, `num_filters`, `upsampling_ratios`, ...).
    pub fn from_any_json(text: &str) -> Result<Self, MimiError> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| MimiError::Config(format!("invalid JSON: {e}")))?;
        if v.get("model_type").and_then(|m| m.as_str()) == Some("mimi") {
            Self::from_hf_value(&v)
        } else {
            Self::from_value(&v)
        }
    }

    /// Parses a Hugging Face `MimiConfig` dict.
    pub fn from_hf_value(v: &Value) -> Result<Self, MimiError> {
        let mut s = Self::v0_1();
        let u = |key: &str, dst: &mut usize| -> Result<(), MimiError> {
            if let Some(x) = v.get(key) {
                *dst = x.as_u64().filter(|&n| n > 0).ok_or_else(|| {
                    MimiError::Config(format!("`{key}` must be a positive integer"))
                })? as usize;
            }
            Ok(())
        };
        u("sampling_rate", &mut s.sample_rate)?;
        u("audio_channels", &mut s.channels)?;
        u("hidden_size", &mut s.dimension)?;
        u("num_filters", &mut s.n_filters)?;
        u("kernel_size", &mut s.kernel_size)?;
        u("last_kernel_size", &mut s.last_kernel_size)?;
        u("residual_kernel_size", &mut s.residual_kernel_size)?;
        u("dilation_growth_rate", &mut s.dilation_base)?;
        u("compress", &mut s.compress)?;
        u("num_attention_heads", &mut s.num_heads)?;
        u("num_hidden_layers", &mut s.num_layers)?;
        u("intermediate_size", &mut s.dim_feedforward)?;
        u("sliding_window", &mut s.context)?;
        u("codebook_dim", &mut s.codebook_dim)?;
        u("codebook_size", &mut s.bins)?;
        u("num_quantizers", &mut s.n_q)?;
        if let Some(x) = v.get("num_residual_layers") {
            s.n_residual_layers = x
                .as_u64()
                .ok_or_else(|| MimiError::Config("`num_residual_layers`".into()))?
                as usize;
        }
        if let Some(x) = v.get("frame_rate") {
            s.frame_rate = x
                .as_f64()
                .filter(|f| *f > 0.0)
                .ok_or_else(|| MimiError::Config("`frame_rate`".into()))?;
        }
        if let Some(x) = v.get("rope_theta") {
            s.max_period = x
                .as_f64()
                .filter(|f| *f > 0.0)
                .ok_or_else(|| MimiError::Config("`rope_theta`".into()))?;
        }
        if let Some(r) = v.get("upsampling_ratios").and_then(|r| r.as_array()) {
            s.ratios = r
                .iter()
                .map(|x| x.as_u64().filter(|&n| n > 0).map(|n| n as usize))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    MimiError::Config("`upsampling_ratios` must hold positive integers".into())
                })?;
        }
        if v.get("num_semantic_quantizers")
            .and_then(|x| x.as_u64())
            .is_some_and(|n| n != 1)
        {
            return Err(MimiError::Config(
                "only 1 semantic quantizer is supported".into(),
            ));
        }
        if v.get("use_conv_shortcut").and_then(|x| x.as_bool()) == Some(true) {
            return Err(MimiError::Config("conv shortcuts are not supported".into()));
        }
        check_str(v, "pad_mode", "constant")?;
        check_str(v, "hidden_act", "gelu")?;
        s.validate()?;
        Ok(s)
    }

    /// Like [`MimiSpec::from_json`] on an already parsed value.
    pub fn from_value(v: &Value) -> Result<Self, MimiError> {
        let mut s = Self::v0_1();
        let bad = |m: String| MimiError::Config(m);
        let get_usize = |obj: &Value, key: &str, dst: &mut usize| -> Result<(), MimiError> {
            if let Some(x) = obj.get(key) {
                *dst = x.as_u64().filter(|&n| n > 0).ok_or_else(|| {
                    MimiError::Config(format!("`{key}` must be a positive integer"))
                })? as usize;
            }
            Ok(())
        };
        get_usize(v, "sample_rate", &mut s.sample_rate)?;
        get_usize(v, "channels", &mut s.channels)?;
        if let Some(x) = v.get("frame_rate") {
            s.frame_rate = x
                .as_f64()
                .filter(|f| *f > 0.0)
                .ok_or_else(|| bad("`frame_rate` must be positive".into()))?;
        }
        if let Some(se) = v.get("seanet") {
            get_usize(se, "dimension", &mut s.dimension)?;
            get_usize(se, "n_filters", &mut s.n_filters)?;
            get_usize(se, "kernel_size", &mut s.kernel_size)?;
            get_usize(se, "last_kernel_size", &mut s.last_kernel_size)?;
            get_usize(se, "residual_kernel_size", &mut s.residual_kernel_size)?;
            get_usize(se, "dilation_base", &mut s.dilation_base)?;
            get_usize(se, "compress", &mut s.compress)?;
            if let Some(x) = se.get("n_residual_layers") {
                s.n_residual_layers = x
                    .as_u64()
                    .ok_or_else(|| bad("`n_residual_layers` must be an integer".into()))?
                    as usize;
            }
            if let Some(r) = se.get("ratios") {
                let arr = r
                    .as_array()
                    .ok_or_else(|| bad("`ratios` must be a list".into()))?;
                s.ratios = arr
                    .iter()
                    .map(|x| x.as_u64().filter(|&n| n > 0).map(|n| n as usize))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| bad("`ratios` must hold positive integers".into()))?;
            }
            if let Some(ch) = se.get("channels") {
                if ch.as_u64() != Some(s.channels as u64) {
                    return Err(bad(
                        "seanet `channels` differs from top-level `channels`".into()
                    ));
                }
            }
            check_str(se, "activation", "ELU")?;
            check_str(se, "norm", "none")?;
            check_str(se, "pad_mode", "constant")?;
            check_bool(se, "causal", true)?;
            check_bool(se, "true_skip", true)?;
            if let Some(l) = se.get("lstm") {
                if l.as_u64().unwrap_or(1) != 0 {
                    return Err(bad("SEANet LSTM is not supported".into()));
                }
            }
        }
        if let Some(tr) = v.get("transformer") {
            let mut d_model = s.dimension;
            get_usize(tr, "d_model", &mut d_model)?;
            if d_model != s.dimension {
                return Err(bad(format!(
                    "transformer d_model {d_model} differs from SEANet dimension {} (projections unsupported)",
                    s.dimension
                )));
            }
            get_usize(tr, "num_heads", &mut s.num_heads)?;
            get_usize(tr, "num_layers", &mut s.num_layers)?;
            get_usize(tr, "dim_feedforward", &mut s.dim_feedforward)?;
            get_usize(tr, "context", &mut s.context)?;
            if let Some(x) = tr.get("max_period") {
                s.max_period = x
                    .as_f64()
                    .filter(|f| *f > 0.0)
                    .ok_or_else(|| bad("`max_period` must be positive".into()))?;
            }
            check_str(tr, "gating", "none")?;
            check_str(tr, "norm", "layer_norm")?;
            check_str(tr, "positional_embedding", "rope")?;
            check_bool(tr, "causal", true)?;
            check_bool(tr, "conv_layout", true)?;
            if let Some(x) = tr.get("input_dimension") {
                if x.as_u64() != Some(s.dimension as u64) {
                    return Err(bad("transformer input_dimension must equal d_model".into()));
                }
            }
            if let Some(x) = tr.get("output_dimensions") {
                let ok = x
                    .as_array()
                    .is_some_and(|a| a.len() == 1 && a[0].as_u64() == Some(s.dimension as u64));
                if !ok {
                    return Err(bad("transformer output_dimensions must be [d_model]".into()));
                }
            }
        }
        if let Some(q) = v.get("quantizer") {
            get_usize(q, "dimension", &mut s.codebook_dim)?;
            get_usize(q, "bins", &mut s.bins)?;
            get_usize(q, "n_q", &mut s.n_q)?;
            for key in ["input_dimension", "output_dimension"] {
                if let Some(x) = q.get(key) {
                    if x.as_u64() != Some(s.dimension as u64) {
                        return Err(bad(format!(
                            "quantizer `{key}` must equal the SEANet dimension"
                        )));
                    }
                }
            }
        }
        s.validate()?;
        Ok(s)
    }

    /// Checks the derived sizes (frame size, hop, down-sampling stride) are integral.
    pub fn validate(&self) -> Result<(), MimiError> {
        let bad = |m: String| Err(MimiError::Config(m));
        if self.channels != 1 {
            return bad(format!(
                "only mono Mimi is supported (channels = {})",
                self.channels
            ));
        }
        if self.ratios.is_empty() {
            return bad("`ratios` is empty".into());
        }
        let fs = self.sample_rate as f64 / self.frame_rate;
        if (fs - fs.round()).abs() > 1e-9 || fs < 1.0 {
            return bad(format!("sample_rate / frame_rate = {fs} is not an integer"));
        }
        let fs = fs.round() as usize;
        let hop = self.hop();
        if !fs.is_multiple_of(hop) {
            return bad(format!(
                "frame size {fs} is not a multiple of the SEANet hop {hop}"
            ));
        }
        if !self.dimension.is_multiple_of(self.num_heads)
            || !(self.dimension / self.num_heads).is_multiple_of(2)
        {
            return bad("d_model must split into heads of even size".into());
        }
        if self.n_q < 1 {
            return bad("n_q must be at least 1".into());
        }
        if !self.n_filters.is_multiple_of(self.compress) && self.n_residual_layers > 0 {
            return bad("n_filters must be divisible by compress".into());
        }
        Ok(())
    }

    /// Samples per codec frame (sample_rate / frame_rate, 1920 for the release).
    pub fn frame_size(&self) -> usize {
        (self.sample_rate as f64 / self.frame_rate).round() as usize
    }

    /// SEANet hop = product of the ratios (960).
    pub fn hop(&self) -> usize {
        self.ratios.iter().product()
    }

    /// Encoder-rate steps per codec frame = stride of the learnt down/upsampling (2).
    pub fn downsample_stride(&self) -> usize {
        self.frame_size() / self.hop()
    }

    /// Attention head dimension (64).
    pub fn head_dim(&self) -> usize {
        self.dimension / self.num_heads
    }
}

fn check_str(obj: &Value, key: &str, want: &str) -> Result<(), MimiError> {
    match obj.get(key) {
        None => Ok(()),
        Some(x) if x.as_str() == Some(want) => Ok(()),
        Some(x) => Err(MimiError::Config(format!(
            "unsupported `{key}` = {x} (only {want:?} is implemented)"
        ))),
    }
}

fn check_bool(obj: &Value, key: &str, want: bool) -> Result<(), MimiError> {
    match obj.get(key) {
        None => Ok(()),
        Some(x) if x.as_bool() == Some(want) => Ok(()),
        Some(x) => Err(MimiError::Config(format!(
            "unsupported `{key}` = {x} (only {want} is implemented)"
        ))),
    }
}

impl TryFrom<&crate::checkpoint::MimiConfig> for MimiSpec {
    type Error = MimiError;

    /// Takes the sizes of the checkpoint owner's [`crate::checkpoint::MimiConfig`].
    fn try_from(c: &crate::checkpoint::MimiConfig) -> Result<Self, MimiError> {
        let t = &c.transformer;
        let s = MimiSpec {
            sample_rate: c.sample_rate,
            frame_rate: c.frame_rate,
            channels: c.channels,
            dimension: c.seanet.dimension,
            n_filters: c.seanet.n_filters,
            ratios: c.seanet.ratios.clone(),
            kernel_size: c.seanet.kernel_size,
            last_kernel_size: c.seanet.last_kernel_size,
            residual_kernel_size: c.seanet.residual_kernel_size,
            n_residual_layers: c.seanet.n_residual_layers,
            dilation_base: c.seanet.dilation_base,
            compress: c.seanet.compress,
            num_heads: t.num_heads,
            num_layers: t.num_layers,
            dim_feedforward: t.dim_feedforward,
            context: t
                .context
                .ok_or_else(|| MimiError::Config("Mimi transformer without context".into()))?,
            max_period: t.max_period,
            codebook_dim: c.quantizer.dimension,
            bins: c.quantizer.bins,
            n_q: c.quantizer.n_q,
        };
        if t.d_model != s.dimension {
            return Err(MimiError::Config(
                "transformer d_model differs from the SEANet dimension".into(),
            ));
        }
        s.validate()?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_sizes() {
        let s = MimiSpec::v0_1();
        assert_eq!(s.frame_size(), 1920);
        assert_eq!(s.hop(), 960);
        assert_eq!(s.downsample_stride(), 2);
        s.validate().unwrap();
    }

    #[test]
    fn parses_and_refuses() {
        let j = r#"{"sample_rate":24000,"channels":1,"frame_rate":12.5,
            "seanet":{"dimension":32,"n_filters":4,"ratios":[8,6,5,4],"norm":"none"},
            "transformer":{"d_model":32,"num_heads":4,"num_layers":2,"context":8,"dim_feedforward":64},
            "quantizer":{"dimension":16,"n_q":16,"bins":64,"input_dimension":32,"output_dimension":32}}"#;
        let s = MimiSpec::from_json(j).unwrap();
        assert_eq!(
            (s.dimension, s.n_filters, s.context, s.bins, s.n_q),
            (32, 4, 8, 64, 16)
        );
        assert!(MimiSpec::from_json(&j.replace("\"none\"", "\"weight_norm\"")).is_err());
        assert!(MimiSpec::from_json(&j.replace("12.5", "11.0")).is_err());
        assert!(MimiSpec::from_json("{").is_err());
    }
}
