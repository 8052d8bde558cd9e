//! What a weights file or bundle directory holds, as JSON.

use std::collections::BTreeMap;
use std::path::Path;

use model::checkpoint::names::Layout;
use model::checkpoint::{Bundle, CheckpointError, Component, OpenOptions, Weights};
use serde_json::{json, Value};

use crate::EmbedError;

fn model_err(path: &Path, e: impl std::fmt::Display) -> EmbedError {
    EmbedError::Model {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// Variant name from the layout and the dominant storage of the linear weights (`pytorch-bf16`,
/// `candle-q8_0`, `mlx-q4g32`, ...).
pub fn variant(w: &Weights) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for n in w.names() {
        if n.ends_with(".weight") || n.ends_with("in_proj_weight") {
            *counts
                .entry(w.quant(n).map(|q| q.name()).unwrap_or_default())
                .or_default() += 1;
        }
    }
    let dominant = counts
        .iter()
        .max_by_key(|(_, c)| **c)
        .map(|(q, _)| q.clone())
        .unwrap_or_else(|| "empty".into());
    let family = match w.layout() {
        Layout::PytorchLegacy | Layout::PytorchNew => "pytorch",
        Layout::Candle => "candle",
        Layout::Mlx => "mlx",
        Layout::HfMimi => "hf-transformers",
    };
    if dominant.starts_with("mlx-") {
        dominant
    } else {
        format!("{family}-{dominant}")
    }
}

/// Opens a lone weights file as the component its canonical names show (Mimi or LM).
pub fn guess_component(path: &Path) -> Result<(Weights, Component), CheckpointError> {
    let lm = Weights::open(path, Component::Lm)?;
    let is_mimi = lm.names().any(|n| {
        n.starts_with("encoder.")
            || n.starts_with("decoder.")
            || n.starts_with("quantizer.")
            || n.starts_with("encoder_transformer.")
    });
    if is_mimi {
        Ok((
            Weights::open_with(path, &OpenOptions::new(Component::Mimi))?,
            Component::Mimi,
        ))
    } else {
        Ok((lm, Component::Lm))
    }
}

fn weights_json(w: &Weights) -> Value {
    let mut storage: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut values = 0usize;
    let mut bytes = 0usize;
    for n in w.names() {
        if let Some(info) = w.info(n) {
            let v: usize = info.shape.iter().product();
            let e = storage.entry(info.quant.name()).or_default();
            e.0 += 1;
            e.1 += info.bytes;
            values += v;
            bytes += info.bytes;
        }
    }
    json!({
        "file": w.path().display().to_string(),
        "file_bytes": w.file_len(),
        "format": w.format().to_string(),
        "layout": w.layout().name(),
        "variant": variant(w),
        "tensors": w.len(),
        "values": values,
        "bytes": bytes,
        "storage": storage
            .into_iter()
            .map(|(q, (count, bytes))| (q, json!({"tensors": count, "bytes": bytes})))
            .collect::<serde_json::Map<_, _>>(),
    })
}

/// Describes a weights file (`{"kind": "file", "component": "lm"|"mimi", "weights": {...}}`) or a bundle
/// directory (`{"kind": "bundle", "lm": {dims}, "mimi": {dims}, "lm_weights": {...}, "mimi_weights": {...},
/// "tokenizer": path}`); weights are opened (mapped) and checked, never loaded into a model.
pub fn describe(path: &Path) -> Result<Value, EmbedError> {
    if path.is_file() {
        let (w, comp) = guess_component(path).map_err(|e| model_err(path, e))?;
        let component = match comp {
            Component::Lm => "lm",
            Component::Mimi => "mimi",
        };
        return Ok(json!({"kind": "file", "component": component, "weights": weights_json(&w)}));
    }
    if !path.is_dir() {
        return Err(EmbedError::NotFound(path.to_path_buf()));
    }
    let b = Bundle::open(path).map_err(|e| model_err(path, e))?;
    let lm_w = b.lm_weights().map_err(|e| model_err(&b.files.lm, e))?;
    let mimi_w = b.mimi_weights().map_err(|e| model_err(&b.files.mimi, e))?;
    let c = &b.config.lm;
    let m = &b.mimi_config;
    Ok(json!({
        "kind": "bundle",
        "config": b.files.config.as_ref().map(|p| p.display().to_string()),
        "lm": {
            "dim": c.dim, "num_layers": c.num_layers, "num_heads": c.num_heads, "ffn_hidden": c.ffn_hidden(),
            "depformer_dim": c.depformer_dim, "depformer_num_layers": c.depformer_num_layers,
            "depformer_num_heads": c.depformer_num_heads, "n_q": c.n_q, "dep_q": c.dep_q,
            "card": c.card, "text_card": c.text_card, "context": c.context,
        },
        "mimi": {
            "dimension": m.seanet.dimension, "n_filters": m.seanet.n_filters,
            "transformer_dim": m.transformer.d_model, "transformer_layers": m.transformer.num_layers,
            "transformer_heads": m.transformer.num_heads, "n_q": m.quantizer.n_q, "bins": m.quantizer.bins,
        },
        "lm_weights": weights_json(&lm_w),
        "mimi_weights": weights_json(&mimi_w),
        "tokenizer": b.files.tokenizer.display().to_string(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use testkit::fixtures_dir;

    #[test]
    fn describes_bundles_and_files() {
        let d = describe(&fixtures_dir("lm")).unwrap();
        assert_eq!(d["kind"], "bundle");
        assert_eq!(d["lm"]["dim"], 64);
        assert_eq!(d["mimi_weights"]["variant"], "pytorch-f32");
        let f = describe(&fixtures_dir("mimi/mimi_hf.safetensors")).unwrap();
        assert_eq!(f["component"], "mimi");
        assert_eq!(f["weights"]["variant"], "hf-transformers-f32");
        assert!(describe(&fixtures_dir("missing")).is_err());
    }
}
