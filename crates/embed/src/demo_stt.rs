//! The speech-to-text demo model: the oracle's tiny stt-1b-shaped bundle (`fixtures/stt/1b`: dep_q 0,
//! 32 codebooks, 4 extra heads, random weights) compiled into the library. It proves the pipeline end
//! to end; it does not transcribe speech. Every front end that uses it says so.

use std::path::PathBuf;

use crate::EmbedError;

/// The label front ends print when they run on the demo model.
pub const LABEL: &str =
    "DEMO MODEL: random weights (tiny bundled speech-to-text model; its words are noise)";

/// The files of the bundle, by the names its `config.json` refers to.
const FILES: &[(&str, &[u8])] = &[
    (
        "config.json",
        include_bytes!("../../../fixtures/stt/1b/config.json"),
    ),
    (
        "model.safetensors",
        include_bytes!("../../../fixtures/stt/1b/model.safetensors"),
    ),
    (
        "mimi.safetensors",
        include_bytes!("../../../fixtures/stt/1b/mimi.safetensors"),
    ),
    (
        "mimi_config.json",
        include_bytes!("../../../fixtures/stt/1b/mimi_config.json"),
    ),
    (
        "tokenizer.model",
        include_bytes!("../../../fixtures/stt/1b/tokenizer.model"),
    ),
];

/// Writes the bundle to a per-user cache folder (once; later calls only compare) and returns the folder.
pub fn materialize() -> Result<PathBuf, EmbedError> {
    crate::demo::write_bundle("demo-stt", FILES)
}

#[cfg(test)]
mod tests {
    #[test]
    fn demo_stt_bundle_opens_as_stt() {
        let dir = super::materialize().unwrap();
        let b = model::checkpoint::Bundle::open(&dir).unwrap();
        assert!(b.config.stt.is_some());
        assert_eq!(b.config.lm.dep_q, 0);
    }
}
