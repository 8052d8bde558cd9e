//! Generation defaults of a bundle (`lm_gen_config` in `config.json`).

use serde_json::Value;

use super::json::{as_bool, as_f64, as_usize, bad};
use super::CheckpointError;

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
    pub(super) fn from_value(v: &Value) -> Result<Self, CheckpointError> {
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
