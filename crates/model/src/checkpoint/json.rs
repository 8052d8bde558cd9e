//! Reading typed values out of config JSON objects, with [`CheckpointError::ConfigValue`] on bad ones
//! and a record of the keys consumed (unknown keys are refused).

use serde_json::{Map, Value};

use super::CheckpointError;

pub(super) fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|x| x != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// `text` parsed as JSON; a syntax error is refused as [`CheckpointError::ConfigJson`] naming
/// `source_name` (the config the text came from).
pub(super) fn parse_json(text: &str, source_name: &str) -> Result<Value, CheckpointError> {
    serde_json::from_str(text).map_err(|e| CheckpointError::ConfigJson {
        source_name: source_name.into(),
        message: e.to_string(),
    })
}

/// The object a config's JSON must be at its top level, anything else refused as
/// [`CheckpointError::ConfigJson`] naming `source_name`.
pub(super) fn top_object<'v>(
    v: &'v Value,
    source_name: &str,
) -> Result<&'v Map<String, Value>, CheckpointError> {
    v.as_object().ok_or_else(|| CheckpointError::ConfigJson {
        source_name: source_name.into(),
        message: "top level is not an object".into(),
    })
}

pub(super) fn bad(key: &str, reason: String) -> CheckpointError {
    CheckpointError::ConfigValue {
        key: key.to_string(),
        reason,
    }
}

pub(super) fn as_usize(key: &str, v: &Value) -> Result<usize, CheckpointError> {
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

pub(super) fn as_f64(key: &str, v: &Value) -> Result<f64, CheckpointError> {
    v.as_f64()
        .filter(|f| f.is_finite())
        .ok_or_else(|| bad(key, format!("expected a number, got {v}")))
}

pub(super) fn as_bool(key: &str, v: &Value) -> Result<bool, CheckpointError> {
    v.as_bool()
        .ok_or_else(|| bad(key, format!("expected a boolean, got {v}")))
}

/// Reads keys of a JSON object, remembering which were consumed.
pub(super) struct Getter<'a> {
    pub(super) obj: &'a Map<String, Value>,
    pub(super) used: Vec<&'a str>,
}

impl<'a> Getter<'a> {
    pub(super) fn get(&mut self, key: &'a str) -> Option<&'a Value> {
        self.used.push(key);
        match self.obj.get(key) {
            None | Some(Value::Null) => None,
            Some(v) => Some(v),
        }
    }
    /// `key` read by `read`, or `d` when it is missing or null.
    fn or_default<T>(
        &mut self,
        key: &'a str,
        d: T,
        read: impl FnOnce(&str, &Value) -> Result<T, CheckpointError>,
    ) -> Result<T, CheckpointError> {
        self.get(key).map_or(Ok(d), |v| read(key, v))
    }
    pub(super) fn usize(&mut self, key: &'a str, d: usize) -> Result<usize, CheckpointError> {
        self.or_default(key, d, as_usize)
    }
    /// `key` when set (not missing or null).
    pub(super) fn opt_usize(&mut self, key: &'a str) -> Result<Option<usize>, CheckpointError> {
        self.get(key).map(|v| as_usize(key, v)).transpose()
    }
    pub(super) fn f64(&mut self, key: &'a str, d: f64) -> Result<f64, CheckpointError> {
        self.or_default(key, d, as_f64)
    }
    /// `key` when set (not missing or null).
    pub(super) fn opt_f64(&mut self, key: &'a str) -> Result<Option<f64>, CheckpointError> {
        self.get(key).map(|v| as_f64(key, v)).transpose()
    }
    pub(super) fn bool(&mut self, key: &'a str, d: bool) -> Result<bool, CheckpointError> {
        self.or_default(key, d, as_bool)
    }
    pub(super) fn opt_string(&mut self, key: &'a str) -> Result<Option<String>, CheckpointError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(bad(key, format!("expected a string, got {v}"))),
        }
    }
    pub(super) fn string(&mut self, key: &'a str, d: &str) -> Result<String, CheckpointError> {
        Ok(self.opt_string(key)?.unwrap_or_else(|| d.to_string()))
    }
    pub(super) fn usize_list(
        &mut self,
        key: &'a str,
        d: &[usize],
    ) -> Result<Vec<usize>, CheckpointError> {
        match self.get(key) {
            None => Ok(d.to_vec()),
            Some(Value::Array(a)) => a.iter().map(|v| as_usize(key, v)).collect(),
            Some(v) => Err(bad(key, format!("expected a list of integers, got {v}"))),
        }
    }
}

pub(super) fn check_unknown(g: &Getter<'_>, prefix: &str) -> Result<(), CheckpointError> {
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

/// A refusal of a configuration this engine does not run.
pub(super) fn unsupported<T>(key: &str, value: String, reason: &str) -> Result<T, CheckpointError> {
    Err(CheckpointError::UnsupportedArchitecture {
        key: key.into(),
        value,
        reason: reason.into(),
    })
}

/// Checks of what this engine runs, in order, each `(ok, key, value, reason)`: the first that is
/// not `ok` is refused as [`unsupported`] (`value` is what the configuration holds for `key`).
pub(super) fn supported(checks: &[(bool, &str, String, &str)]) -> Result<(), CheckpointError> {
    match checks.iter().find(|c| !c.0) {
        Some((_, key, value, reason)) => unsupported(key, value.clone(), reason),
        None => Ok(()),
    }
}

/// Every `(key, value)` must be positive.
pub(super) fn positive(fields: &[(&str, usize)]) -> Result<(), CheckpointError> {
    match fields.iter().find(|(_, v)| *v == 0) {
        Some((k, _)) => Err(bad(k, "must be positive".into())),
        None => Ok(()),
    }
}
