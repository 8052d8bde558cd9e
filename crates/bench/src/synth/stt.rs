//! Synthetic speech-to-text bundles: Kyutai's `stt-1b-en_fr` and `stt-2.6b-en` at their released
//! sizes ([`SttRelease`]), or any STT configuration (tests use tiny ones). The temporal transformer
//! without Depformer (`dep_q = 0`) and its extra heads in any [`SynthFormat`], the Mimi file (the
//! released Mimi holds all 32 codebooks the STT models read), a tokenizer of the model's vocabulary
//! under its released name, and an STT `config.json` (`model_type` "stt", `stt_config`).

use std::path::Path;

use model::checkpoint::{CheckpointError, LmConfig, MimiConfig, SttConfig};
use model::stt::SttRelease;

use super::files::{io_err, write_mimi_file, write_tensor_file};
use super::tensors::lm_outputs;
use super::{config_json, mimi_config_json, tiny_spm, SynthFormat, SynthReport};

/// What a synthetic STT bundle is made of.
#[derive(Debug, Clone, PartialEq)]
pub struct SttSynth {
    /// The temporal transformer (`dep_q` must be 0).
    pub lm: LmConfig,
    /// Its `stt_config` (audio delay, silence prefix).
    pub stt: SttConfig,
    /// The codec (its quantizer must hold the `n_q` codebooks the LM reads).
    pub mimi: MimiConfig,
    /// The tokenizer file's name (`tokenizer_name`).
    pub tokenizer_name: String,
}

impl SttSynth {
    /// A released model at full size, with the released Mimi and tokenizer name.
    pub fn release(r: SttRelease) -> Self {
        SttSynth {
            lm: r.lm_config(),
            stt: r.stt_config(),
            mimi: MimiConfig::v0_1(),
            tokenizer_name: r.tokenizer().to_string(),
        }
    }
}

/// Kyutai's STT `config.json` for `s`: Moshi's keys, then `model_type` "stt", the `stt_config`,
/// the extra heads (when there are any) and greedy decoding (`lm_gen_config` temperatures 0).
pub fn stt_config_json(s: &SttSynth, moshi_name: &str, mimi_config_name: Option<&str>) -> String {
    let base = config_json(&s.lm, moshi_name, mimi_config_name);
    let mut v: serde_json::Value = serde_json::from_str(&base).expect("config_json writes JSON");
    v["model_type"] = "stt".into();
    v["tokenizer_name"] = s.tokenizer_name.clone().into();
    v["stt_config"] = serde_json::json!({
        "audio_delay_seconds": s.stt.audio_delay_seconds,
        "audio_silence_prefix_seconds": s.stt.audio_silence_prefix_seconds,
    });
    if s.lm.extra_heads_num_heads > 0 {
        v["extra_heads_num_heads"] = s.lm.extra_heads_num_heads.into();
        v["extra_heads_dim"] = s.lm.extra_heads_dim.into();
    }
    v["lm_gen_config"] = serde_json::json!({"temp": 0.0, "temp_text": 0.0});
    serde_json::to_string_pretty(&v).expect("serialisable")
}

/// Write a speech-to-text bundle with random weights into `dir` (created if needed). The
/// `config.json` is always written: it is what makes the directory an STT bundle.
pub fn write_stt_bundle(
    dir: &Path,
    format: SynthFormat,
    s: &SttSynth,
    seed: u64,
) -> Result<SynthReport, CheckpointError> {
    if s.lm.dep_q != 0 {
        return Err(CheckpointError::ConfigValue {
            key: "dep_q".into(),
            reason: format!("{} (a speech-to-text model has no Depformer)", s.lm.dep_q),
        });
    }
    if s.mimi.quantizer.n_q < s.lm.n_q {
        return Err(CheckpointError::ConfigValue {
            key: "n_q".into(),
            reason: format!(
                "{} codebooks read, the Mimi config has {}",
                s.lm.n_q, s.mimi.quantizer.n_q
            ),
        });
    }
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let lm_path = dir.join(format.lm_file());
    let lm_size = write_tensor_file(&lm_path, format, &lm_outputs(&s.lm, format), seed)?;
    let mimi = write_mimi_file(dir, &s.mimi, seed ^ 0x5eed)?;
    let spm = dir.join(&s.tokenizer_name);
    std::fs::write(&spm, tiny_spm(s.lm.text_card)).map_err(io_err(&spm))?;
    let mimi_cfg = if s.mimi == MimiConfig::v0_1() {
        None
    } else {
        let p = dir.join("mimi_config.json");
        std::fs::write(&p, mimi_config_json(&s.mimi)).map_err(io_err(&p))?;
        Some("mimi_config.json")
    };
    let p = dir.join("config.json");
    std::fs::write(&p, stt_config_json(s, format.lm_file(), mimi_cfg)).map_err(io_err(&p))?;
    Ok(SynthReport {
        lm: (lm_path, lm_size),
        mimi,
        config: true,
    })
}
