//! Model configurations: the Moshi LM ([`LmConfig`]), Mimi ([`MimiConfig`]), generation defaults
//! ([`LmGenConfig`]) and the Kyutai `config.json` of a bundle ([`BundleConfig`]).
//!
//! Defaults and derived sizes follow `moshi` 0.2.13 (`moshi/models/loaders.py`, `models/lm.py`,
//! `modules/transformer.py`, `modules/gating.py`).

use serde_json::{Map, Value};

use crate::checkpoint::CheckpointError;

/// Normalisation layer kind (`norm` key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormKind {
    /// `layer_norm`: LayerNorm with bias, eps 1e-5.
    LayerNorm,
    /// `layer_norm_f32`: LayerNorm computed in f32, eps 1e-8.
    LayerNormF32,
    /// `rms_norm`: RMSNorm, eps 1e-5.
    RmsNorm,
    /// `rms_norm_f32`: RMSNorm computed in f32, eps 1e-8 (Moshi LM).
    RmsNormF32,
}

impl NormKind {
    /// Parse the Python name.
    pub fn parse(key: &str, s: &str) -> Result<Self, CheckpointError> {
        Ok(match s {
            "layer_norm" => NormKind::LayerNorm,
            "layer_norm_f32" => NormKind::LayerNormF32,
            "rms_norm" => NormKind::RmsNorm,
            "rms_norm_f32" => NormKind::RmsNormF32,
            _ => return Err(bad(key, format!("unknown norm `{s}`"))),
        })
    }
    /// Epsilon as in Python `create_norm_fn`.
    pub fn eps(self) -> f32 {
        match self {
            NormKind::LayerNorm | NormKind::RmsNorm => 1e-5,
            NormKind::LayerNormF32 | NormKind::RmsNormF32 => 1e-8,
        }
    }
    /// The Python name.
    pub fn name(self) -> &'static str {
        match self {
            NormKind::LayerNorm => "layer_norm",
            NormKind::LayerNormF32 => "layer_norm_f32",
            NormKind::RmsNorm => "rms_norm",
            NormKind::RmsNormF32 => "rms_norm_f32",
        }
    }
    /// True for RMSNorm variants (weight `alpha` [1,1,d], no bias).
    pub fn is_rms(self) -> bool {
        matches!(self, NormKind::RmsNorm | NormKind::RmsNormF32)
    }
}

/// Feed-forward kind (`gating` key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gating {
    /// `none`: plain FFN `linear2(gelu(linear1(x)))`.
    None,
    /// `silu`: gated `linear_out(silu(a) * b)` with `[a; b] = linear_in(x)`.
    Silu,
    /// `gelu`: gated with GELU.
    Gelu,
    /// `relu`: gated with ReLU.
    Relu,
    /// `sigmoid`: gated with sigmoid.
    Sigmoid,
}

impl Gating {
    /// Parse the Python name.
    pub fn parse(key: &str, s: &str) -> Result<Self, CheckpointError> {
        Ok(match s {
            "none" => Gating::None,
            "silu" => Gating::Silu,
            "gelu" => Gating::Gelu,
            "relu" => Gating::Relu,
            "sigmoid" => Gating::Sigmoid,
            _ => return Err(bad(key, format!("unknown gating `{s}`"))),
        })
    }
    /// The Python name.
    pub fn name(self) -> &'static str {
        match self {
            Gating::None => "none",
            Gating::Silu => "silu",
            Gating::Gelu => "gelu",
            Gating::Relu => "relu",
            Gating::Sigmoid => "sigmoid",
        }
    }
}

/// Hidden size of the FFN as `modules/gating.py` / `transformer.py` compute it.
///
/// For a gated FFN: `21*dim/8` when `dim_feedforward == 4*dim`, else `2*dim_feedforward/3`
/// (integer division); for `gating = none` the hidden size is `dim_feedforward` itself.
pub fn ffn_hidden(gating: Gating, dim: usize, dim_feedforward: usize) -> usize {
    match gating {
        Gating::None => dim_feedforward,
        _ => {
            if dim_feedforward == 4 * dim {
                (21 * dim) / 8
            } else {
                (2 * dim_feedforward) / 3
            }
        }
    }
}

/// Positional embedding kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PosEmb {
    /// `none`.
    None,
    /// `rope` (interleaved pairs).
    Rope,
    /// `sin`.
    Sin,
    /// `sin_rope`.
    SinRope,
    /// `rope_concat` (half-split RoPE).
    RopeConcat,
}

impl PosEmb {
    /// Parse the Python name.
    pub fn parse(key: &str, s: &str) -> Result<Self, CheckpointError> {
        Ok(match s {
            "none" => PosEmb::None,
            "rope" => PosEmb::Rope,
            "sin" => PosEmb::Sin,
            "sin_rope" => PosEmb::SinRope,
            "rope_concat" => PosEmb::RopeConcat,
            _ => return Err(bad(key, format!("unknown positional embedding `{s}`"))),
        })
    }
    /// The Python name.
    pub fn name(self) -> &'static str {
        match self {
            PosEmb::None => "none",
            PosEmb::Rope => "rope",
            PosEmb::Sin => "sin",
            PosEmb::SinRope => "sin_rope",
            PosEmb::RopeConcat => "rope_concat",
        }
    }
}

/// Configuration of the Moshi LM (`LMModel` kwargs).
#[derive(Debug, Clone, PartialEq)]
pub struct LmConfig {
    /// Temporal transformer width (`dim`).
    pub dim: usize,
    /// Temporal transformer heads (`num_heads`).
    pub num_heads: usize,
    /// Temporal transformer layers (`num_layers`).
    pub num_layers: usize,
    /// `hidden_scale`; `dim_feedforward = int(hidden_scale * dim)`.
    pub hidden_scale: f64,
    /// Normalisation (`norm`), shared by the depformer.
    pub norm: NormKind,
    /// FFN kind of the temporal transformer (`gating`).
    pub gating: Gating,
    /// Positional embedding of the temporal transformer.
    pub positional_embedding: PosEmb,
    /// RoPE max period of the temporal transformer.
    pub max_period: f64,
    /// Attention context in steps (`context`); `None` = unbounded.
    pub context: Option<usize>,
    /// Causal attention.
    pub causal: bool,
    /// LayerScale init (`layer_scale`); `None` = no LayerScale tensors.
    pub layer_scale: Option<f64>,
    /// Key/value head repetition (`kv_repeat`), 1 = plain MHA.
    pub kv_repeat: usize,
    /// Text output vocabulary (`text_card`); the text embedding has `text_card + 1` rows.
    pub text_card: usize,
    /// Text output vocabulary of the head (`text_card_out`, defaults to `text_card`).
    pub text_card_out: usize,
    /// Text PAD id (`existing_text_padding_id`).
    pub existing_text_padding_id: u32,
    /// Text EPAD id (`existing_text_end_padding_id`).
    pub existing_text_end_padding_id: u32,
    /// Audio vocabulary per codebook (`card`); embeddings have `card + 1` rows.
    pub card: usize,
    /// Audio streams input to the temporal transformer (`n_q`).
    pub n_q: usize,
    /// Audio codebooks generated by the depformer (`dep_q`).
    pub dep_q: usize,
    /// Per-stream delays, `n_q + 1` entries (index 0 = text).
    pub delays: Vec<usize>,
    /// Depformer width.
    pub depformer_dim: usize,
    /// Depformer heads.
    pub depformer_num_heads: usize,
    /// Depformer layers.
    pub depformer_num_layers: usize,
    /// Depformer `dim_feedforward` (before the gating rule).
    pub depformer_dim_feedforward: usize,
    /// Depformer FFN kind.
    pub depformer_gating: Gating,
    /// One `depformer_in` linear per codebook.
    pub depformer_multi_linear: bool,
    /// Per-step depformer weights (in_proj/out_proj/gating per codebook step).
    pub depformer_weights_per_step: bool,
    /// Depformer positional embedding.
    pub depformer_pos_emb: PosEmb,
    /// Depformer RoPE max period (unused with `none`).
    pub depformer_max_period: f64,
    /// Depformer LayerScale init.
    pub depformer_layer_scale: Option<f64>,
    /// `depformer_context` as written (Python overrides it with None; the KV capacity is `dep_q`).
    pub depformer_context: Option<usize>,
}

impl LmConfig {
    /// The released moshiko/moshika v0.1 configuration (`_lm_kwargs` in `loaders.py`).
    pub fn moshiko_v0_1() -> Self {
        LmConfig {
            dim: 4096,
            num_heads: 32,
            num_layers: 32,
            hidden_scale: 4.125,
            norm: NormKind::RmsNormF32,
            gating: Gating::Silu,
            positional_embedding: PosEmb::Rope,
            max_period: 10000.0,
            context: Some(3000),
            causal: true,
            layer_scale: None,
            kv_repeat: 1,
            text_card: 32000,
            text_card_out: 32000,
            existing_text_padding_id: 3,
            existing_text_end_padding_id: 0,
            card: 2048,
            n_q: 16,
            dep_q: 8,
            delays: vec![0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1],
            depformer_dim: 1024,
            depformer_num_heads: 16,
            depformer_num_layers: 6,
            depformer_dim_feedforward: (4.125f64 * 1024.0) as usize,
            depformer_gating: Gating::Silu,
            depformer_multi_linear: true,
            depformer_weights_per_step: true,
            depformer_pos_emb: PosEmb::None,
            depformer_max_period: 10000.0,
            depformer_layer_scale: None,
            depformer_context: Some(8),
        }
    }

    /// Parse Kyutai's `config.json` (LMModel kwargs plus loader keys) and validate it.
    ///
    /// Missing LM keys take the `LMModel` / `StreamingTransformer` defaults of `moshi` 0.2.13, as the
    /// Python loader would. Refusals (LoRA, conditioners, ...) are typed errors.
    pub fn from_json(text: &str) -> Result<Self, CheckpointError> {
        Ok(BundleConfig::from_json(text)?.lm)
    }

    /// Temporal transformer `dim_feedforward = int(hidden_scale * dim)`.
    pub fn dim_feedforward(&self) -> usize {
        (self.hidden_scale * self.dim as f64) as usize
    }
    /// Temporal transformer FFN hidden size (11264 for moshiko).
    pub fn ffn_hidden(&self) -> usize {
        ffn_hidden(self.gating, self.dim, self.dim_feedforward())
    }
    /// Depformer FFN hidden size (2816 for moshiko).
    pub fn depformer_ffn_hidden(&self) -> usize {
        ffn_hidden(
            self.depformer_gating,
            self.depformer_dim,
            self.depformer_dim_feedforward,
        )
    }
    /// Temporal head dimension.
    pub fn head_dim(&self) -> usize {
        self.dim / self.num_heads.max(1)
    }
    /// Depformer head dimension.
    pub fn depformer_head_dim(&self) -> usize {
        self.depformer_dim / self.depformer_num_heads.max(1)
    }
    /// Number of streams (`n_q + 1`: text + audio).
    pub fn num_codebooks(&self) -> usize {
        self.n_q + 1
    }
    /// Maximum delay.
    pub fn max_delay(&self) -> usize {
        self.delays.iter().copied().max().unwrap_or(0)
    }
    /// Norm epsilon (1e-8 for `rms_norm_f32`).
    pub fn norm_eps(&self) -> f32 {
        self.norm.eps()
    }
    /// Rows of the text input embedding (`text_card + 1`).
    pub fn text_in_vocab(&self) -> usize {
        self.text_card + 1
    }
    /// Rows of the audio input embeddings (`card + 1`).
    pub fn audio_in_vocab(&self) -> usize {
        self.card + 1
    }
    /// Number of depformer weight sets (steps with own weights).
    pub fn depformer_weight_steps(&self) -> usize {
        if self.depformer_weights_per_step {
            self.dep_q
        } else {
            1
        }
    }
    /// Number of `depformer_in` linears.
    pub fn depformer_in_count(&self) -> usize {
        if self.depformer_multi_linear {
            self.dep_q
        } else {
            1
        }
    }
    /// Mimi codebooks the LM needs (`max(dep_q, n_q - dep_q)`, as `CheckpointInfo.get_mimi`).
    pub fn mimi_codebooks(&self) -> usize {
        self.dep_q.max(self.n_q.saturating_sub(self.dep_q))
    }

    /// Check that the configuration is the Moshi v0.1 architecture (any sizes) that this engine runs.
    pub fn validate(&self) -> Result<(), CheckpointError> {
        let arch = |key: &str, value: String, reason: &str| {
            Err(CheckpointError::UnsupportedArchitecture {
                key: key.into(),
                value,
                reason: reason.into(),
            })
        };
        for (k, v) in [
            ("dim", self.dim),
            ("num_heads", self.num_heads),
            ("num_layers", self.num_layers),
            ("card", self.card),
            ("text_card", self.text_card),
            ("n_q", self.n_q),
            ("dep_q", self.dep_q),
            ("depformer_dim", self.depformer_dim),
            ("depformer_num_heads", self.depformer_num_heads),
            ("depformer_num_layers", self.depformer_num_layers),
        ] {
            if v == 0 {
                return Err(bad(k, "must be positive".into()));
            }
        }
        if !self.dim.is_multiple_of(self.num_heads) {
            return Err(bad("num_heads", "must divide dim".into()));
        }
        if !self.depformer_dim.is_multiple_of(self.depformer_num_heads) {
            return Err(bad(
                "depformer_num_heads",
                "must divide depformer_dim".into(),
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err(bad("num_heads", "head dim must be even for RoPE".into()));
        }
        if self.delays.len() != self.n_q + 1 {
            return Err(bad(
                "delays",
                format!(
                    "{} entries, expected n_q + 1 = {}",
                    self.delays.len(),
                    self.n_q + 1
                ),
            ));
        }
        if self.dep_q > self.n_q {
            return Err(bad("dep_q", "larger than n_q".into()));
        }
        if !self.norm.is_rms() {
            return arch(
                "norm",
                self.norm.name().into(),
                "only rms_norm / rms_norm_f32",
            );
        }
        if self.gating != Gating::Silu {
            return arch("gating", self.gating.name().into(), "only silu");
        }
        if self.depformer_gating != Gating::Silu {
            return arch(
                "depformer_gating",
                self.depformer_gating.name().into(),
                "only silu",
            );
        }
        if self.positional_embedding != PosEmb::Rope {
            return arch(
                "positional_embedding",
                self.positional_embedding.name().into(),
                "only rope",
            );
        }
        if self.depformer_pos_emb != PosEmb::None {
            return arch(
                "depformer_pos_emb",
                self.depformer_pos_emb.name().into(),
                "only none",
            );
        }
        if let Some(v) = self.layer_scale {
            return arch("layer_scale", v.to_string(), "only null");
        }
        if let Some(v) = self.depformer_layer_scale {
            return arch("depformer_layer_scale", v.to_string(), "only null");
        }
        if self.kv_repeat != 1 {
            return arch("kv_repeat", self.kv_repeat.to_string(), "only 1");
        }
        if self.text_card_out != self.text_card {
            return arch(
                "text_card_out",
                self.text_card_out.to_string(),
                "must equal text_card",
            );
        }
        if !self.causal {
            return arch("causal", "false".into(), "only causal");
        }
        if !self.depformer_multi_linear {
            return arch("depformer_multi_linear", "false".into(), "only true");
        }
        if !self.depformer_weights_per_step {
            return arch("depformer_weights_per_step", "false".into(), "only true");
        }
        Ok(())
    }
}

/// Generation defaults (`lm_gen_config` in config.json; `LMGen` keyword defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct LmGenConfig {
    /// Sample (true) or argmax (false).
    pub use_sampling: bool,
    /// Audio temperature (0.8).
    pub temp: f32,
    /// Text temperature (0.7).
    pub temp_text: f32,
    /// Audio top-k (250).
    pub top_k: usize,
    /// Text top-k (25).
    pub top_k_text: usize,
}

impl Default for LmGenConfig {
    fn default() -> Self {
        LmGenConfig {
            use_sampling: true,
            temp: 0.8,
            temp_text: 0.7,
            top_k: 250,
            top_k_text: 25,
        }
    }
}

impl LmGenConfig {
    fn from_value(v: &Value) -> Result<Self, CheckpointError> {
        let obj = v
            .as_object()
            .ok_or_else(|| bad("lm_gen_config", "must be an object".into()))?;
        let mut g = LmGenConfig::default();
        let mut unknown = Vec::new();
        for (k, v) in obj {
            let key = format!("lm_gen_config.{k}");
            match k.as_str() {
                "use_sampling" => g.use_sampling = as_bool(&key, v)?,
                "temp" => g.temp = as_f64(&key, v)? as f32,
                "temp_text" => g.temp_text = as_f64(&key, v)? as f32,
                "top_k" => g.top_k = as_usize(&key, v)?,
                "top_k_text" => g.top_k_text = as_usize(&key, v)?,
                "cfg_coef" => {
                    if as_f64(&key, v)? != 1.0 {
                        return Err(CheckpointError::Conditioning { keys: vec![key] });
                    }
                }
                "check" | "support_out_of_sync" => {}
                "cfg_is_masked_until" | "cfg_is_no_text" | "condition_tensors" => {
                    if !v.is_null() && v != &Value::Bool(false) {
                        return Err(CheckpointError::Conditioning { keys: vec![key] });
                    }
                }
                _ => unknown.push(key),
            }
        }
        if !unknown.is_empty() {
            return Err(CheckpointError::UnknownConfigKeys { keys: unknown });
        }
        Ok(g)
    }
}

/// Everything a Kyutai `config.json` holds that this engine uses.
#[derive(Debug, Clone, PartialEq)]
pub struct BundleConfig {
    /// LM architecture.
    pub lm: LmConfig,
    /// `moshi_name` (LM weights file; default `model.safetensors`).
    pub moshi_name: String,
    /// `mimi_name` (Mimi weights file).
    pub mimi_name: String,
    /// `mimi_config_name`: optional Mimi config JSON for a non-default Mimi.
    pub mimi_config_name: Option<String>,
    /// `tokenizer_name` (SentencePiece model).
    pub tokenizer_name: String,
    /// `model_type` (must be "moshi").
    pub model_type: String,
    /// Generation defaults.
    pub lm_gen: LmGenConfig,
}

/// Default LM weights file name.
pub const MOSHI_NAME: &str = "model.safetensors";
/// Default Mimi weights file name.
pub const MIMI_NAME: &str = "tokenizer-e351c8d8-checkpoint125.safetensors";
/// Default SentencePiece model file name.
pub const TOKENIZER_NAME: &str = "tokenizer_spm_32k_3.model";

impl Default for BundleConfig {
    fn default() -> Self {
        BundleConfig {
            lm: LmConfig::moshiko_v0_1(),
            moshi_name: MOSHI_NAME.into(),
            mimi_name: MIMI_NAME.into(),
            mimi_config_name: None,
            tokenizer_name: TOKENIZER_NAME.into(),
            model_type: "moshi".into(),
            lm_gen: LmGenConfig::default(),
        }
    }
}

impl BundleConfig {
    /// Parse and validate a Kyutai `config.json`.
    pub fn from_json(text: &str) -> Result<Self, CheckpointError> {
        let v: Value = serde_json::from_str(text).map_err(|e| CheckpointError::ConfigJson {
            source_name: "config.json".into(),
            message: e.to_string(),
        })?;
        let obj = v.as_object().ok_or_else(|| CheckpointError::ConfigJson {
            source_name: "config.json".into(),
            message: "top level is not an object".into(),
        })?;
        Self::from_map(obj)
    }

    fn from_map(obj: &Map<String, Value>) -> Result<Self, CheckpointError> {
        refuse_unsupported_keys(obj)?;
        let string = |k: &str, d: &str| -> Result<String, CheckpointError> {
            match obj.get(k) {
                None | Some(Value::Null) => Ok(d.to_string()),
                Some(Value::String(s)) => Ok(s.clone()),
                Some(_) => Err(bad(k, "must be a string".into())),
            }
        };
        let model_type = string("model_type", "moshi")?;
        if model_type != "moshi" {
            return Err(CheckpointError::UnsupportedModelType { model_type });
        }
        let mimi_config_name = match obj.get("mimi_config_name") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(bad("mimi_config_name", "must be a string".into())),
        };
        let lm_gen = match obj.get("lm_gen_config") {
            None | Some(Value::Null) => LmGenConfig::default(),
            Some(v) => LmGenConfig::from_value(v)?,
        };
        let lm = lm_from_map(obj)?;
        lm.validate()?;
        Ok(BundleConfig {
            lm,
            moshi_name: string("moshi_name", MOSHI_NAME)?,
            mimi_name: string("mimi_name", MIMI_NAME)?,
            mimi_config_name,
            tokenizer_name: string("tokenizer_name", TOKENIZER_NAME)?,
            model_type,
            lm_gen,
        })
    }
}

fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|x| x != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// Typed refusals on config keys (LoRA, conditioning, cross-attention, int8, demux, extra heads, ...).
fn refuse_unsupported_keys(obj: &Map<String, Value>) -> Result<(), CheckpointError> {
    // Hugging Face `transformers` configs (`MoshiConfig`: `architectures`, `hidden_size`, ...) are a
    // different format from Kyutai's config.json.
    let hf: Vec<String> = [
        "architectures",
        "transformers_version",
        "hidden_size",
        "audio_encoder_config",
    ]
    .iter()
    .filter(|k| obj.contains_key(**k))
    .map(|k| k.to_string())
    .collect();
    if !hf.is_empty() {
        return Err(CheckpointError::UnsupportedLayout {
            what: "Hugging Face transformers config (use the Kyutai repositories' config.json)"
                .into(),
            keys: hf,
        });
    }
    let present = |keys: &[&str]| -> Vec<String> {
        keys.iter()
            .filter(|k| obj.get(**k).is_some_and(truthy))
            .map(|k| k.to_string())
            .collect()
    };
    let k = present(&["lora", "lora_name"]);
    if !k.is_empty() {
        return Err(CheckpointError::Lora { keys: k });
    }
    let mut k = present(&["conditioners", "fuser", "condition_provider"]);
    if obj.contains_key("conditioners") && !k.contains(&"conditioners".to_string()) {
        // `conditioners` present at all makes Python build a condition provider.
        k.push("conditioners".into());
    }
    if !k.is_empty() {
        return Err(CheckpointError::Conditioning { keys: k });
    }
    let k = present(&["cross_attention"]);
    if !k.is_empty() {
        return Err(CheckpointError::CrossAttention { keys: k });
    }
    let k = present(&["quantize"]);
    if !k.is_empty() {
        return Err(CheckpointError::BitsAndBytes { keys: k });
    }
    let k = present(&["demux_second_stream", "demux_second_text_stream"]);
    if !k.is_empty() {
        return Err(CheckpointError::Demux { keys: k });
    }
    let k = present(&["extra_heads_num_heads"]);
    if !k.is_empty() {
        return Err(CheckpointError::ExtraHeads { keys: k });
    }
    let k = present(&["depformer_low_rank_embeddings"]);
    if !k.is_empty() {
        return Err(CheckpointError::LowRankEmbeddings { keys: k });
    }
    let k = present(&["tts_config", "stt_config"]);
    if !k.is_empty() {
        return Err(CheckpointError::TaskConfig { keys: k });
    }
    if obj
        .get("depformer_weights_per_step_schedule")
        .is_some_and(truthy)
    {
        return Err(CheckpointError::UnsupportedArchitecture {
            key: "depformer_weights_per_step_schedule".into(),
            value: obj["depformer_weights_per_step_schedule"].to_string(),
            reason: "only null".into(),
        });
    }
    Ok(())
}

/// Keys of config.json consumed by the loader, not the LM.
const LOADER_KEYS: &[&str] = &[
    "moshi_name",
    "mimi_name",
    "mimi_config_name",
    "tokenizer_name",
    "lora_name",
    "model_type",
    "lm_gen_config",
    "tts_config",
    "stt_config",
    "model_id",
];

/// LM keys that are accepted and either used or irrelevant to inference.
const IGNORED_LM_KEYS: &[&str] = &[
    "depformer_causal",
    "gradient_checkpointing",
    "norm_emb",
    "bias_proj",
    "depformer_norm",
    "positional_scale",
    "lora",
    "lora_rank",
    "lora_scaling",
    "quantize",
    "cross_attention",
    "conditioners",
    "fuser",
    "demux_second_stream",
    "demux_second_text_stream",
    "extra_heads_num_heads",
    "extra_heads_dim",
    "depformer_low_rank_embeddings",
    "depformer_weights_per_step_schedule",
    "depformer_kv_repeat",
];

fn lm_from_map(obj: &Map<String, Value>) -> Result<LmConfig, CheckpointError> {
    // Defaults: `LMModel.__init__` / `StreamingTransformer` keyword defaults in moshi 0.2.13.
    let mut known: Vec<&str> = LOADER_KEYS.to_vec();
    known.extend_from_slice(IGNORED_LM_KEYS);
    let mut g = Getter { obj, used: known };
    let dim = g.usize("dim", 128)?;
    let num_heads = g.usize("num_heads", 8)?;
    let num_layers = g.usize("num_layers", 2)?;
    let hidden_scale = g.f64("hidden_scale", 4.0)?;
    let norm = NormKind::parse("norm", &g.string("norm", "layer_norm")?)?;
    let gating = Gating::parse("gating", &g.string("gating", "none")?)?;
    let positional_embedding = PosEmb::parse(
        "positional_embedding",
        &g.string("positional_embedding", "sin")?,
    )?;
    let max_period = g.f64("max_period", 10000.0)?;
    let context = g.opt_usize("context", None)?;
    let causal = g.bool("causal", true)?;
    let layer_scale = g.opt_f64("layer_scale", None)?;
    let kv_repeat = g.usize("kv_repeat", 1)?;
    let text_card = g.usize("text_card", 32000)?;
    let text_card_out = g.opt_usize("text_card_out", None)?.unwrap_or(text_card);
    let existing_text_padding_id = g.usize("existing_text_padding_id", 3)? as u32;
    let existing_text_end_padding_id = g.usize("existing_text_end_padding_id", 0)? as u32;
    let card = g.usize("card", 1024)?;
    let n_q = g.usize("n_q", 8)?;
    let dep_q = g.usize("dep_q", 8)?;
    let delays = g.usize_list("delays", &[0])?;
    let depformer_dim = g.usize("depformer_dim", 256)?;
    // Depformer kwargs inherit the main kwargs unless a `depformer_` key overrides them.
    let depformer_num_heads = g.usize("depformer_num_heads", num_heads)?;
    let depformer_num_layers = g.usize("depformer_num_layers", num_layers)?;
    let depformer_dim_feedforward = match obj.get("depformer_dim_feedforward") {
        Some(Value::Array(_)) => {
            return Err(CheckpointError::UnsupportedArchitecture {
                key: "depformer_dim_feedforward".into(),
                value: obj["depformer_dim_feedforward"].to_string(),
                reason: "per-step lists are not supported".into(),
            })
        }
        _ => g
            .opt_usize("depformer_dim_feedforward", None)?
            .unwrap_or((hidden_scale * depformer_dim as f64) as usize),
    };
    let depformer_gating = match g.opt_string("depformer_gating")? {
        Some(s) => Gating::parse("depformer_gating", &s)?,
        None => gating,
    };
    let depformer_multi_linear = g.bool("depformer_multi_linear", false)?;
    let depformer_weights_per_step = g.bool("depformer_weights_per_step", false)?;
    let depformer_pos_emb =
        PosEmb::parse("depformer_pos_emb", &g.string("depformer_pos_emb", "sin")?)?;
    let depformer_max_period = g.f64("depformer_max_period", max_period)?;
    let depformer_layer_scale = if obj.contains_key("depformer_layer_scale") {
        g.opt_f64("depformer_layer_scale", None)?
    } else {
        layer_scale
    };
    let depformer_context = g.opt_usize("depformer_context", None)?;
    let unknown: Vec<String> = obj
        .keys()
        .filter(|k| !g.used.contains(&k.as_str()))
        .cloned()
        .collect();
    if !unknown.is_empty() {
        return Err(CheckpointError::UnknownConfigKeys { keys: unknown });
    }
    Ok(LmConfig {
        dim,
        num_heads,
        num_layers,
        hidden_scale,
        norm,
        gating,
        positional_embedding,
        max_period,
        context,
        causal,
        layer_scale,
        kv_repeat,
        text_card,
        text_card_out,
        existing_text_padding_id,
        existing_text_end_padding_id,
        card,
        n_q,
        dep_q,
        delays,
        depformer_dim,
        depformer_num_heads,
        depformer_num_layers,
        depformer_dim_feedforward,
        depformer_gating,
        depformer_multi_linear,
        depformer_weights_per_step,
        depformer_pos_emb,
        depformer_max_period,
        depformer_layer_scale,
        depformer_context,
    })
}

fn bad(key: &str, reason: String) -> CheckpointError {
    CheckpointError::ConfigValue {
        key: key.to_string(),
        reason,
    }
}

fn as_usize(key: &str, v: &Value) -> Result<usize, CheckpointError> {
    if let Some(u) = v.as_u64() {
        return usize::try_from(u).map_err(|_| bad(key, "too large".into()));
    }
    // Python configs sometimes hold integral floats (e.g. 4224.0).
    if let Some(f) = v.as_f64() {
        if f >= 0.0 && f.fract() == 0.0 && f < 1e15 {
            return Ok(f as usize);
        }
    }
    Err(bad(
        key,
        format!("expected a non-negative integer, got {v}"),
    ))
}

fn as_f64(key: &str, v: &Value) -> Result<f64, CheckpointError> {
    v.as_f64()
        .filter(|f| f.is_finite())
        .ok_or_else(|| bad(key, format!("expected a number, got {v}")))
}

fn as_bool(key: &str, v: &Value) -> Result<bool, CheckpointError> {
    v.as_bool()
        .ok_or_else(|| bad(key, format!("expected a boolean, got {v}")))
}

/// Reads keys of a JSON object, remembering which were consumed.
struct Getter<'a> {
    obj: &'a Map<String, Value>,
    used: Vec<&'a str>,
}

impl<'a> Getter<'a> {
    fn get(&mut self, key: &'a str) -> Option<&'a Value> {
        self.used.push(key);
        match self.obj.get(key) {
            None | Some(Value::Null) => None,
            Some(v) => Some(v),
        }
    }
    fn usize(&mut self, key: &'a str, d: usize) -> Result<usize, CheckpointError> {
        self.get(key).map_or(Ok(d), |v| as_usize(key, v))
    }
    fn opt_usize(
        &mut self,
        key: &'a str,
        d: Option<usize>,
    ) -> Result<Option<usize>, CheckpointError> {
        self.get(key).map_or(Ok(d), |v| as_usize(key, v).map(Some))
    }
    fn f64(&mut self, key: &'a str, d: f64) -> Result<f64, CheckpointError> {
        self.get(key).map_or(Ok(d), |v| as_f64(key, v))
    }
    fn opt_f64(&mut self, key: &'a str, d: Option<f64>) -> Result<Option<f64>, CheckpointError> {
        self.get(key).map_or(Ok(d), |v| as_f64(key, v).map(Some))
    }
    fn bool(&mut self, key: &'a str, d: bool) -> Result<bool, CheckpointError> {
        self.get(key).map_or(Ok(d), |v| as_bool(key, v))
    }
    fn opt_string(&mut self, key: &'a str) -> Result<Option<String>, CheckpointError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(bad(key, format!("expected a string, got {v}"))),
        }
    }
    fn string(&mut self, key: &'a str, d: &str) -> Result<String, CheckpointError> {
        Ok(self.opt_string(key)?.unwrap_or_else(|| d.to_string()))
    }
    fn usize_list(&mut self, key: &'a str, d: &[usize]) -> Result<Vec<usize>, CheckpointError> {
        match self.get(key) {
            None => Ok(d.to_vec()),
            Some(Value::Array(a)) => a.iter().map(|v| as_usize(key, v)).collect(),
            Some(v) => Err(bad(key, format!("expected a list of integers, got {v}"))),
        }
    }
}

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
    /// Output dimensions ([512]).
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
        let v: Value = serde_json::from_str(text).map_err(|e| CheckpointError::ConfigJson {
            source_name: "mimi config".into(),
            message: e.to_string(),
        })?;
        let obj = v.as_object().ok_or_else(|| CheckpointError::ConfigJson {
            source_name: "mimi config".into(),
            message: "top level is not an object".into(),
        })?;
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
            g.opt_f64("layer_scale", None)?
        } else {
            dt.layer_scale
        };
        let context = if t.contains_key("context") {
            g.opt_usize("context", None)?
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

    /// Check that the configuration is the released Mimi architecture (any sizes).
    pub fn validate(&self) -> Result<(), CheckpointError> {
        let arch = |key: &str, value: String, reason: &str| {
            Err(CheckpointError::UnsupportedArchitecture {
                key: key.into(),
                value,
                reason: reason.into(),
            })
        };
        let s = &self.seanet;
        let t = &self.transformer;
        let q = &self.quantizer;
        for (k, v) in [
            ("sample_rate", self.sample_rate),
            ("seanet.dimension", s.dimension),
            ("seanet.n_filters", s.n_filters),
            ("seanet.compress", s.compress),
            ("transformer.d_model", t.d_model),
            ("transformer.num_heads", t.num_heads),
            ("quantizer.dimension", q.dimension),
            ("quantizer.bins", q.bins),
        ] {
            if v == 0 {
                return Err(bad(k, "must be positive".into()));
            }
        }
        if s.ratios.is_empty() || s.ratios.contains(&0) {
            return Err(bad(
                "seanet.ratios",
                "must be non-empty and positive".into(),
            ));
        }
        if self.frame_rate.is_nan() || self.frame_rate <= 0.0 {
            return Err(bad("frame_rate", "must be positive".into()));
        }
        if s.activation != "ELU" {
            return arch("seanet.activation", s.activation.clone(), "only ELU");
        }
        if s.norm != "none" && s.norm != "weight_norm" {
            return arch("seanet.norm", s.norm.clone(), "only none (weights folded)");
        }
        if s.lstm != 0 {
            return arch("seanet.lstm", s.lstm.to_string(), "only 0");
        }
        if !s.true_skip {
            return arch("seanet.true_skip", "false".into(), "only true");
        }
        if !s.causal {
            return arch("seanet.causal", "false".into(), "only causal");
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
            return arch(
                "transformer.d_model",
                t.d_model.to_string(),
                "must equal seanet.dimension, input_dimension and output_dimensions (no projections)",
            );
        }
        if t.gating != Gating::None {
            return arch("transformer.gating", t.gating.name().into(), "only none");
        }
        if t.norm != NormKind::LayerNorm {
            return arch("transformer.norm", t.norm.name().into(), "only layer_norm");
        }
        if t.positional_embedding != PosEmb::Rope {
            return arch(
                "transformer.positional_embedding",
                t.positional_embedding.name().into(),
                "only rope",
            );
        }
        if q.n_q <= q.n_q_semantic || q.n_q_semantic != 1 {
            return Err(bad("quantizer.n_q", "need n_q_semantic = 1 < n_q".into()));
        }
        if q.input_dimension != s.dimension || q.output_dimension != s.dimension {
            return arch(
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

fn check_unknown(g: &Getter<'_>, prefix: &str) -> Result<(), CheckpointError> {
    let unknown: Vec<String> = g
        .obj
        .keys()
        .filter(|k| !g.used.contains(&k.as_str()))
        .map(|k| format!("{prefix}{k}"))
        .collect();
    if unknown.is_empty() {
        Ok(())
    } else {
        Err(CheckpointError::UnknownConfigKeys { keys: unknown })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moshiko_derived_sizes() {
        let c = LmConfig::moshiko_v0_1();
        c.validate().unwrap();
        assert_eq!(c.dim_feedforward(), 16896);
        assert_eq!(c.ffn_hidden(), 11264);
        assert_eq!(c.depformer_dim_feedforward, 4224);
        assert_eq!(c.depformer_ffn_hidden(), 2816);
        assert_eq!(c.head_dim(), 128);
        assert_eq!(c.depformer_head_dim(), 64);
        assert_eq!(c.mimi_codebooks(), 8);
        assert_eq!(c.norm_eps(), 1e-8);
    }

    #[test]
    fn gating_rule_four_times_dim() {
        // Python gating.py: dim_feedforward == 4*dim -> 21*dim//8.
        assert_eq!(ffn_hidden(Gating::Silu, 4096, 4 * 4096), 10752);
        assert_eq!(ffn_hidden(Gating::Silu, 64, 264), 176);
        assert_eq!(ffn_hidden(Gating::None, 512, 2048), 2048);
    }

    const MOSHIKO_JSON: &str = r#"{"dim": 4096, "text_card": 32000, "existing_text_padding_id": 3,
      "n_q": 16, "dep_q": 8, "card": 2048, "num_heads": 32, "num_layers": 32, "hidden_scale": 4.125,
      "causal": true, "layer_scale": null, "context": 3000, "max_period": 10000, "gating": "silu",
      "norm": "rms_norm_f32", "positional_embedding": "rope", "depformer_dim": 1024,
      "depformer_dim_feedforward": 4224, "depformer_num_heads": 16, "depformer_num_layers": 6,
      "depformer_layer_scale": null, "depformer_multi_linear": true, "depformer_context": 8,
      "depformer_max_period": 10000, "depformer_gating": "silu", "depformer_pos_emb": "none",
      "depformer_weights_per_step": true, "delays": [0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1],
      "moshi_name": "model.safetensors", "mimi_name": "tokenizer-e351c8d8-checkpoint125.safetensors",
      "tokenizer_name": "tokenizer_spm_32k_3.model", "model_type": "moshi",
      "lm_gen_config": {"temp": 0.6, "top_k_text": 20}}"#;

    #[test]
    fn parses_released_config() {
        let b = BundleConfig::from_json(MOSHIKO_JSON).unwrap();
        assert_eq!(b.lm, LmConfig::moshiko_v0_1());
        assert_eq!(b.lm_gen.temp, 0.6);
        assert_eq!(b.lm_gen.top_k_text, 20);
        assert_eq!(b.lm_gen.top_k, 250);
    }

    fn with(extra: &str) -> Result<BundleConfig, CheckpointError> {
        let t = MOSHIKO_JSON.trim_end().strip_suffix('}').unwrap();
        BundleConfig::from_json(&format!("{t}, {extra}}}"))
    }

    #[test]
    fn refusals_are_typed() {
        assert!(matches!(
            with(r#""lora": true"#),
            Err(CheckpointError::Lora { .. })
        ));
        assert!(matches!(
            with(r#""lora_name": "x.safetensors""#),
            Err(CheckpointError::Lora { .. })
        ));
        assert!(matches!(
            with(r#""conditioners": {}"#),
            Err(CheckpointError::Conditioning { .. })
        ));
        assert!(matches!(
            with(r#""fuser": {"sum": ["x"]}"#),
            Err(CheckpointError::Conditioning { .. })
        ));
        assert!(matches!(
            with(r#""cross_attention": true"#),
            Err(CheckpointError::CrossAttention { .. })
        ));
        assert!(matches!(
            with(r#""quantize": true"#),
            Err(CheckpointError::BitsAndBytes { .. })
        ));
        assert!(matches!(
            with(r#""demux_second_stream": true"#),
            Err(CheckpointError::Demux { .. })
        ));
        assert!(matches!(
            with(r#""extra_heads_num_heads": 2"#),
            Err(CheckpointError::ExtraHeads { .. })
        ));
        assert!(matches!(
            with(r#""depformer_low_rank_embeddings": 64"#),
            Err(CheckpointError::LowRankEmbeddings { .. })
        ));
        assert!(matches!(
            with(r#""frobnicate": 1"#),
            Err(CheckpointError::UnknownConfigKeys { .. })
        ));
        assert!(matches!(
            with(r#""kv_repeat": 2"#),
            Err(CheckpointError::UnsupportedArchitecture { .. })
        ));
        assert!(matches!(
            with(r#""stt_config": {"audio_delay_seconds": 2.5}"#),
            Err(CheckpointError::TaskConfig { .. })
        ));
        // Accepted when explicitly off.
        assert!(with(r#""lora": false, "cross_attention": false, "quantize": false"#).is_ok());
        let t = MOSHIKO_JSON.replace(r#""model_type": "moshi""#, r#""model_type": "hibiki""#);
        assert!(matches!(
            BundleConfig::from_json(&t),
            Err(CheckpointError::UnsupportedModelType { .. })
        ));
        let t = MOSHIKO_JSON.replace(r#""temp": 0.6"#, r#""cfg_coef": 3.0"#);
        assert!(matches!(
            BundleConfig::from_json(&t),
            Err(CheckpointError::Conditioning { .. })
        ));
        assert!(matches!(
            BundleConfig::from_json("[1, 2]"),
            Err(CheckpointError::ConfigJson { .. })
        ));
        assert!(matches!(
            BundleConfig::from_json("{\"dim\": -3}"),
            Err(CheckpointError::ConfigValue { .. })
        ));
    }

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
