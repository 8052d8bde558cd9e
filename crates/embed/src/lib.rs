//! The part of the embedding layers (`crates/capi`, `crates/python`) that is not binding code, shared
//! with the CLI so the three open models the same way:
//!
//! * [`demo`]: the tiny random-weight demo bundle compiled in, written to a cache folder on first use;
//! * [`demo_stt`]: the same for the tiny random-weight speech-to-text bundle;
//! * [`open_mimi`]: a Mimi codec on its own, from a bundle directory or a weights file (no LM is loaded);
//! * [`describe`]: what a weights file or bundle directory holds, as JSON (`moshi-native inspect`'s facts).
//!
//! Sampling settings as flat values, as the bindings take them, are `model::sampling::SamplingParams`
//! (re-exported here while the CLI and the Python package move to that path).

#![warn(missing_docs)]

pub mod demo;
pub mod demo_stt;
mod describe;
mod mimi;

pub use describe::{describe, guess_component, variant};
pub use mimi::open_mimi;
/// Re-exported from `model::sampling`, where it now lives.
pub use model::sampling::SamplingParams;

use std::path::PathBuf;

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    /// A file or folder could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The path concerned.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A path that should exist does not.
    #[error("{0}: no such file or directory")]
    NotFound(PathBuf),
    /// A configuration file could not be parsed.
    #[error("{path}: {message}")]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The weights were refused by the checkpoint reader or the model builder.
    #[error("{path}: {message}")]
    Model {
        /// The weights file.
        path: PathBuf,
        /// The refusal.
        message: String,
    },
}
