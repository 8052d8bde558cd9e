//! A bundle directory: optional Kyutai `config.json` + LM weights + Mimi weights + SentencePiece model.

use std::path::{Path, PathBuf};

use super::{CheckpointError, Component};
use crate::checkpoint::Schema;
use crate::checkpoint::{BundleConfig, MimiConfig};
use crate::checkpoint::{OpenOptions, Weights};

/// LM file names tried, in order, when a bundle has no `config.json` or its `moshi_name` is the
/// default and absent (PyTorch/candle/MLX repositories).
pub const LM_CANDIDATES: &[&str] = &[
    "model.safetensors",
    "model.q8.gguf",
    "model.q8.safetensors",
    "model.q4.safetensors",
];

/// Resolved file paths of a bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleFiles {
    /// `config.json`, if present.
    pub config: Option<PathBuf>,
    /// LM weights.
    pub lm: PathBuf,
    /// Mimi weights.
    pub mimi: PathBuf,
    /// Mimi config JSON (`mimi_config_name`), if any.
    pub mimi_config: Option<PathBuf>,
    /// SentencePiece model.
    pub tokenizer: PathBuf,
}

/// An opened bundle directory (configs parsed and validated, files located; weights not yet mapped).
#[derive(Debug, Clone)]
pub struct Bundle {
    /// The directory.
    pub dir: PathBuf,
    /// `config.json` contents, or the released moshiko v0.1 config when absent.
    pub config: BundleConfig,
    /// Mimi configuration (released, or from `mimi_config_name`).
    pub mimi_config: MimiConfig,
    /// File paths.
    pub files: BundleFiles,
}

/// Resolve a file reference of config.json (`name`, `file://path`, `hf://org/repo/path`) in `dir`.
fn resolve(dir: &Path, name: &str) -> PathBuf {
    if let Some(p) = name.strip_prefix("file://") {
        let p = Path::new(p);
        return if p.is_absolute() {
            p.to_path_buf()
        } else {
            dir.join(p)
        };
    }
    if let Some(rest) = name.strip_prefix("hf://") {
        // hf://org/repo/path: the bundle directory is expected to hold the file itself.
        let file = rest.splitn(3, '/').nth(2).unwrap_or(rest);
        return dir.join(file);
    }
    dir.join(name)
}

impl Bundle {
    /// Open a bundle directory: parse `config.json` (or use the moshiko v0.1 defaults), the Mimi
    /// config, and check that the weight and tokenizer files exist.
    pub fn open(dir: &Path) -> Result<Bundle, CheckpointError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| CheckpointError::Io { path, source }
        };
        let cfg_path = dir.join("config.json");
        let (config, has_cfg) = if cfg_path.is_file() {
            let text = std::fs::read_to_string(&cfg_path).map_err(io(&cfg_path))?;
            (BundleConfig::from_json(&text)?, true)
        } else {
            (BundleConfig::default(), false)
        };
        let missing = |what: &'static str, file: String| CheckpointError::MissingFile {
            dir: dir.to_path_buf(),
            what,
            file,
        };
        let named = resolve(dir, &config.moshi_name);
        // An explicit `moshi_name` must exist; the default name falls back to the other released names.
        let lm = if named.is_file() {
            named
        } else if has_cfg && config.moshi_name != crate::checkpoint::MOSHI_NAME {
            return Err(missing("LM weights", config.moshi_name.clone()));
        } else {
            LM_CANDIDATES
                .iter()
                .map(|n| dir.join(n))
                .find(|p| p.is_file())
                .ok_or_else(|| missing("LM weights", LM_CANDIDATES.join(" | ")))?
        };
        let mimi = resolve(dir, &config.mimi_name);
        if !mimi.is_file() {
            return Err(missing("Mimi weights", config.mimi_name.clone()));
        }
        let tokenizer = resolve(dir, &config.tokenizer_name);
        if !tokenizer.is_file() {
            return Err(missing(
                "SentencePiece model",
                config.tokenizer_name.clone(),
            ));
        }
        let (mimi_config, mimi_cfg_path) = match &config.mimi_config_name {
            None => (MimiConfig::v0_1(), None),
            Some(name) => {
                let p = resolve(dir, name);
                if !p.is_file() {
                    return Err(missing("Mimi config", name.clone()));
                }
                let text = std::fs::read_to_string(&p).map_err(io(&p))?;
                (MimiConfig::from_json(&text)?, Some(p))
            }
        };
        Ok(Bundle {
            dir: dir.to_path_buf(),
            config,
            mimi_config,
            files: BundleFiles {
                config: has_cfg.then_some(cfg_path),
                lm,
                mimi,
                mimi_config: mimi_cfg_path,
                tokenizer,
            },
        })
    }

    /// Expected LM tensors.
    pub fn lm_schema(&self) -> Schema {
        Schema::lm(&self.config.lm)
    }

    /// Expected Mimi tensors.
    pub fn mimi_schema(&self) -> Schema {
        Schema::mimi(&self.mimi_config)
    }

    /// Map the LM weights and check them against the schema.
    pub fn lm_weights(&self) -> Result<Weights, CheckpointError> {
        let mut o = OpenOptions::new(Component::Lm);
        o.allow_extra_heads = self.config.lm.extra_heads_num_heads > 0;
        let w = Weights::open_with(&self.files.lm, &o)?;
        w.check(&self.lm_schema())?;
        Ok(w)
    }

    /// Map the Mimi weights and check them against the schema.
    pub fn mimi_weights(&self) -> Result<Weights, CheckpointError> {
        let mut o = OpenOptions::new(Component::Mimi);
        o.mimi_num_heads = self.mimi_config.transformer.num_heads;
        let w = Weights::open_with(&self.files.mimi, &o)?;
        w.check(&self.mimi_schema())?;
        Ok(w)
    }
}
