//! Checkpoint formats, the Mimi codec, the Moshi LM and the tokenizer.
//!
//! This crate knows no threads or sockets.
mod assembly;
pub mod checkpoint;
pub mod lm;
pub mod mimi;
pub mod sampling;
pub mod stt;
pub mod tensor_stats;
pub mod text;

pub use assembly::{Bundled, LoadError, LoadTimings, MoshiModel};
