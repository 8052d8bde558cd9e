//! Opening a Mimi codec on its own (no LM), from a bundle directory or a weights file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use model::checkpoint::{Component, MimiConfig, OpenOptions, Weights, MIMI_NAME};
use model::mimi::Mimi;

use crate::EmbedError;

/// A bundle-relative name (`file://` prefix allowed) as a path.
fn resolve(dir: &Path, name: &str) -> PathBuf {
    let name = name.strip_prefix("file://").unwrap_or(name);
    let p = Path::new(name);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        dir.join(p)
    }
}

fn config_err(path: &Path, e: impl std::fmt::Display) -> EmbedError {
    EmbedError::Config {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// The Mimi weights file and optional Mimi config named by a bundle directory's `config.json`
/// (`mimi_name`, `mimi_config_name`); the released file name when there is no `config.json`.
fn bundle_files(dir: &Path) -> Result<(PathBuf, Option<PathBuf>), EmbedError> {
    let cfg_path = dir.join("config.json");
    if !cfg_path.is_file() {
        return Ok((dir.join(MIMI_NAME), None));
    }
    let text = std::fs::read_to_string(&cfg_path).map_err(|source| EmbedError::Io {
        path: cfg_path.clone(),
        source,
    })?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| config_err(&cfg_path, e))?;
    let weights = v
        .get("mimi_name")
        .and_then(|x| x.as_str())
        .unwrap_or(MIMI_NAME);
    let config = v.get("mimi_config_name").and_then(|x| x.as_str());
    Ok((resolve(dir, weights), config.map(|c| resolve(dir, c))))
}

/// Opens a Mimi codec with `n_codebooks` codebooks (8 for Moshi).
///
/// `path` is a bundle directory (`config.json` naming `mimi_name` and optionally `mimi_config_name`, or the
/// released Mimi file name in the directory) or a Mimi weights file (Kyutai or Hugging Face `transformers`
/// names). `config` overrides the Mimi configuration (Kyutai or `transformers` JSON); without one, a
/// directory's `mimi_config_name` applies, else the released Mimi v0.1 dimensions.
pub fn open_mimi(
    path: &Path,
    config: Option<&Path>,
    n_codebooks: usize,
) -> Result<Arc<Mimi>, EmbedError> {
    let (weights, bundle_config) = if path.is_dir() {
        bundle_files(path)?
    } else if path.is_file() {
        (path.to_path_buf(), None)
    } else {
        return Err(EmbedError::NotFound(path.to_path_buf()));
    };
    let spec = match config.map(Path::to_path_buf).or(bundle_config) {
        Some(p) => {
            let text = std::fs::read_to_string(&p).map_err(|source| EmbedError::Io {
                path: p.clone(),
                source,
            })?;
            MimiConfig::from_any_json(&text).map_err(|e| config_err(&p, e))?
        }
        None => MimiConfig::v0_1(),
    };
    if !weights.is_file() {
        return Err(EmbedError::NotFound(weights));
    }
    let model_err = |e: &dyn std::fmt::Display| EmbedError::Model {
        path: weights.clone(),
        message: e.to_string(),
    };
    let mut opts = OpenOptions::new(Component::Mimi);
    opts.mimi_num_heads = spec.transformer.num_heads;
    let w = Weights::open_with(&weights, &opts).map_err(|e| model_err(&e))?;
    let mimi = Mimi::from_tensors(&w, &spec, n_codebooks).map_err(|e| model_err(&e))?;
    Ok(Arc::new(mimi))
}

#[cfg(test)]
mod tests {
    use super::*;
    use testkit::fixtures_dir;

    #[test]
    fn opens_from_a_bundle_or_a_file_and_refuses_what_is_missing() {
        let a = open_mimi(&fixtures_dir("lm"), None, 8).unwrap();
        let b = open_mimi(
            &fixtures_dir("mimi/mimi.safetensors"),
            Some(&fixtures_dir("mimi/mimi_config.json")),
            8,
        )
        .unwrap();
        assert_eq!(a.config(), b.config());
        assert_eq!(a.n_codebooks(), 8);
        // Without a config, the released dimensions apply and the tiny weights are refused.
        let e = open_mimi(&fixtures_dir("mimi/mimi.safetensors"), None, 8).unwrap_err();
        assert!(matches!(e, EmbedError::Model { .. }), "{e}");
        let e = open_mimi(&fixtures_dir("nope"), None, 8).unwrap_err();
        assert!(matches!(e, EmbedError::NotFound(_)), "{e}");
    }
}
