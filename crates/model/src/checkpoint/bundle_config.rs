//! The Kyutai `config.json` of a bundle ([`BundleConfig`]): LM configuration, file names and
//! generation defaults, with typed refusals of unsupported features.

use serde_json::{Map, Value};

use super::gen_config::LmGenConfig;
use super::json::{bad, parse_json, top_object, truthy};
use super::lm_config::{lm_from_map, LmConfig};
use super::CheckpointError;

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
    /// `model_type`: "moshi" (duplex, needs a Depformer) or "stt" (speech-to-text, `dep_q = 0`).
    pub model_type: String,
    /// Generation defaults.
    pub lm_gen: LmGenConfig,
    /// `stt_config` of a speech-to-text bundle (`model_type` "stt"); `None` otherwise.
    pub stt: Option<SttConfig>,
}

/// The `stt_config` of a Kyutai speech-to-text `config.json`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SttConfig {
    /// How far the text lags the audio (`audio_delay_seconds`: 0.5 for stt-1b-en_fr, 2.5 for
    /// stt-2.6b-en); also the silence appended to flush a stream.
    pub audio_delay_seconds: f64,
    /// Silence fed before the audio (`audio_silence_prefix_seconds`: 0 / 1.0).
    pub audio_silence_prefix_seconds: f64,
}

impl SttConfig {
    /// Parse the `stt_config` object. Kyutai's example scripts default a missing delay to 5.0 s
    /// and a missing prefix to 1.0 s (`stt_from_file_pytorch.py`); both released configs set them.
    fn from_value(v: &Value) -> Result<Self, CheckpointError> {
        let obj = match v {
            Value::Object(o) => o,
            _ => return Err(bad("stt_config", "must be an object".into())),
        };
        let num = |k: &str, d: f64| -> Result<f64, CheckpointError> {
            match obj.get(k) {
                None | Some(Value::Null) => Ok(d),
                Some(Value::Number(n)) => match n.as_f64() {
                    Some(x) if x.is_finite() && (0.0..=3600.0).contains(&x) => Ok(x),
                    _ => Err(bad(k, "must be a number of seconds in [0, 3600]".into())),
                },
                Some(_) => Err(bad(k, "must be a number".into())),
            }
        };
        if let Some(k) = obj
            .keys()
            .find(|k| *k != "audio_delay_seconds" && *k != "audio_silence_prefix_seconds")
        {
            return Err(CheckpointError::UnknownConfigKeys {
                keys: vec![format!("stt_config.{k}")],
            });
        }
        Ok(SttConfig {
            audio_delay_seconds: num("audio_delay_seconds", 5.0)?,
            audio_silence_prefix_seconds: num("audio_silence_prefix_seconds", 1.0)?,
        })
    }
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
            stt: None,
        }
    }
}

impl BundleConfig {
    /// Parse and validate a Kyutai `config.json`.
    pub fn from_json(text: &str) -> Result<Self, CheckpointError> {
        let v = parse_json(text, "config.json")?;
        let obj = top_object(&v, "config.json")?;
        Self::from_map(obj)
    }

    fn from_map(obj: &Map<String, Value>) -> Result<Self, CheckpointError> {
        let string = |k: &str, d: &str| -> Result<String, CheckpointError> {
            match obj.get(k) {
                None | Some(Value::Null) => Ok(d.to_string()),
                Some(Value::String(s)) => Ok(s.clone()),
                Some(_) => Err(bad(k, "must be a string".into())),
            }
        };
        let model_type = string("model_type", "moshi")?;
        let is_stt = model_type == "stt";
        refuse_unsupported_keys(obj, is_stt)?;
        if model_type != "moshi" && !is_stt {
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
        // The duplex model needs its Depformer; the speech-to-text models have none (and the STT
        // step here only runs `dep_q = 0`).
        if is_stt != (lm.dep_q == 0) {
            return Err(bad(
                "dep_q",
                format!("{} with model_type \"{model_type}\"", lm.dep_q),
            ));
        }
        let stt = match obj.get("stt_config") {
            Some(v) if is_stt => Some(SttConfig::from_value(v)?),
            _ if is_stt => return Err(bad("stt_config", "missing for model_type \"stt\"".into())),
            _ => None,
        };
        Ok(BundleConfig {
            lm,
            moshi_name: string("moshi_name", MOSHI_NAME)?,
            mimi_name: string("mimi_name", MIMI_NAME)?,
            mimi_config_name,
            tokenizer_name: string("tokenizer_name", TOKENIZER_NAME)?,
            model_type,
            lm_gen,
            stt,
        })
    }
}

/// Config keys that select one unsupported variant, and the refusal that lists those present.
type KeyRefusal = (&'static [&'static str], fn(Vec<String>) -> CheckpointError);

/// The unsupported variants' config keys, in the order they are checked.
const REFUSED_KEYS: [KeyRefusal; 8] = [
    (&["lora", "lora_name"], |keys| CheckpointError::Lora {
        keys,
    }),
    (&["conditioners", "fuser", "condition_provider"], |keys| {
        CheckpointError::Conditioning { keys }
    }),
    (&["cross_attention"], |keys| {
        CheckpointError::CrossAttention { keys }
    }),
    (&["quantize"], |keys| CheckpointError::BitsAndBytes { keys }),
    (
        &["demux_second_stream", "demux_second_text_stream"],
        |keys| CheckpointError::Demux { keys },
    ),
    (&["extra_heads_num_heads"], |keys| {
        CheckpointError::ExtraHeads { keys }
    }),
    (&["depformer_low_rank_embeddings"], |keys| {
        CheckpointError::LowRankEmbeddings { keys }
    }),
    (&["tts_config", "stt_config"], |keys| {
        CheckpointError::TaskConfig { keys }
    }),
];

/// Typed refusals on config keys (LoRA, conditioning, cross-attention, int8, demux, extra heads, ...).
/// A speech-to-text config (`stt`) may have extra heads and its `stt_config`.
fn refuse_unsupported_keys(obj: &Map<String, Value>, stt: bool) -> Result<(), CheckpointError> {
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
    for (keys, refuse) in REFUSED_KEYS {
        let mut k = present(keys);
        if stt {
            k.retain(|x| x != "extra_heads_num_heads" && x != "stt_config");
        }
        if keys.contains(&"conditioners")
            && obj.contains_key("conditioners")
            && !k.iter().any(|x| x == "conditioners")
        {
            // `conditioners` present at all makes Python build a condition provider.
            k.push("conditioners".into());
        }
        if !k.is_empty() {
            return Err(refuse(k));
        }
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

/// Config members appended to a valid `config.json`, each with the variant it must give
/// (`err_variant` of the result): the config parser and the bundle opener both check them.
#[cfg(test)]
pub(super) const CONFIG_EXTRAS: [(&str, &str); 15] = [
    (r#""lora": true"#, "Lora"),
    (r#""lora_name": "x.safetensors""#, "Lora"),
    (r#""conditioners": {}"#, "Conditioning"),
    (
        r#""conditioners": {"description": {"type": "lut"}}"#,
        "Conditioning",
    ),
    (r#""fuser": {"sum": ["x"]}"#, "Conditioning"),
    (r#""cross_attention": true"#, "CrossAttention"),
    (r#""quantize": true"#, "BitsAndBytes"),
    (r#""demux_second_stream": true"#, "Demux"),
    (r#""extra_heads_num_heads": 2"#, "ExtraHeads"),
    (
        r#""depformer_low_rank_embeddings": 64"#,
        "LowRankEmbeddings",
    ),
    (
        r#""depformer_low_rank_embeddings": 128"#,
        "LowRankEmbeddings",
    ),
    (r#""frobnicate": 1"#, "UnknownConfigKeys"),
    (r#""kv_repeat": 2"#, "UnsupportedArchitecture"),
    (
        r#""stt_config": {"audio_delay_seconds": 2.5}"#,
        "TaskConfig",
    ),
    // Accepted when explicitly off.
    (
        r#""lora": false, "cross_attention": false, "quantize": false"#,
        "Ok",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{err_variant, ffn_hidden, Gating};

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
        for (extra, want) in CONFIG_EXTRAS {
            assert_eq!(err_variant(&with(extra)), want, "{extra}");
        }
        let replaced =
            |from: &str, to: &str| BundleConfig::from_json(&MOSHIKO_JSON.replace(from, to));
        for (result, want) in [
            (
                replaced(r#""model_type": "moshi""#, r#""model_type": "hibiki""#),
                "UnsupportedModelType",
            ),
            (
                replaced(r#""temp": 0.6"#, r#""cfg_coef": 3.0"#),
                "Conditioning",
            ),
            (BundleConfig::from_json("[1, 2]"), "ConfigJson"),
            (BundleConfig::from_json("{\"dim\": -3}"), "ConfigValue"),
        ] {
            assert_eq!(err_variant(&result), want);
        }
    }
}
