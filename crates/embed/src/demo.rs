//! The demo model: a tiny random-weight bundle compiled into the library.
//!
//! It is the oracle's tiny Moshi bundle (`fixtures/lm`, built with Kyutai's own loaders, exact
//! architecture, random weights). It proves the pipeline end to end on a machine with no network;
//! it does not speak. Every front end that uses it says so.

use std::path::PathBuf;

use model::checkpoint::{MIMI_NAME, TOKENIZER_NAME};

use crate::EmbedError;

/// The label front ends print when they run on the demo model.
pub const LABEL: &str = "DEMO MODEL: random weights (tiny bundled model, not Moshi's voice)";

/// The files of the bundle, by the names its `config.json` refers to.
const FILES: &[(&str, &[u8])] = &[
    (
        "config.json",
        include_bytes!("../../../fixtures/lm/config.json"),
    ),
    (
        "model.safetensors",
        include_bytes!("../../../fixtures/lm/model.safetensors"),
    ),
    (
        MIMI_NAME,
        include_bytes!("../../../fixtures/mimi/mimi.safetensors"),
    ),
    (
        "mimi_config.json",
        include_bytes!("../../../fixtures/mimi/mimi_config.json"),
    ),
    (
        TOKENIZER_NAME,
        include_bytes!("../../../fixtures/lm/tokenizer_spm_32k_3.model"),
    ),
];

/// Writes the bundle to a per-user cache folder (once; later calls only compare) and returns the folder.
pub fn materialize() -> Result<PathBuf, EmbedError> {
    write_bundle("demo", FILES)
}

/// Writes `files` to the cache folder `<tag>-<version>-<total bytes>` (once; later calls only
/// compare) and returns the folder.
pub(crate) fn write_bundle(tag: &str, files: &[(&str, &[u8])]) -> Result<PathBuf, EmbedError> {
    let total: usize = files.iter().map(|(_, b)| b.len()).sum();
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    let dir = base
        .join("moshi-native")
        .join(format!("{tag}-{}-{total}", env!("CARGO_PKG_VERSION")));
    let io = |source| EmbedError::Io {
        path: dir.clone(),
        source,
    };
    std::fs::create_dir_all(&dir).map_err(io)?;
    for (name, bytes) in files {
        let path = dir.join(name);
        let same = std::fs::read(&path).map(|b| b == *bytes).unwrap_or(false);
        if !same {
            // Write then rename, so a concurrent run never sees a half-written file.
            let tmp = dir.join(format!("{name}.tmp{}", std::process::id()));
            std::fs::write(&tmp, bytes)
                .and_then(|_| std::fs::rename(&tmp, &path))
                .map_err(io)?;
        }
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    #[test]
    fn demo_bundle_is_complete_and_idempotent() {
        let a = super::materialize().unwrap();
        let b = super::materialize().unwrap();
        assert_eq!(a, b);
        let cfg: serde_json::Value =
            serde_json::from_slice(&std::fs::read(a.join("config.json")).unwrap()).unwrap();
        for key in [
            "moshi_name",
            "mimi_name",
            "tokenizer_name",
            "mimi_config_name",
        ] {
            let f = cfg[key].as_str().unwrap();
            assert!(a.join(f).is_file(), "{key} = {f} missing");
        }
    }
}
