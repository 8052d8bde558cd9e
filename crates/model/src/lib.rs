//! Checkpoint formats, the Mimi codec, the Moshi LM and the tokenizer.
//!
//! This crate knows no threads or sockets.
pub mod sampling;
pub mod text;
pub mod mimi;
pub mod checkpoint;
pub mod config;
pub mod schema;
pub mod weights;
pub mod lm;
