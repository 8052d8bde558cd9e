//! The Moshi language model: temporal transformer, Depformer and the streaming generator
//! ([`LmGen`], the state machine of Python `moshi.models.lm.LMGen`, `moshi` 0.2.13).
//!
//! * [`LmPlan`] is the layer sequence, written once: the ops of a temporal step and of each
//!   Depformer step over named weights and buffers, which the CPU executes and a device records.
//! * [`LmModel`] holds the weights (any format [`kernels::Matrix`] supports) and computes one
//!   temporal step ([`LmModel::forward_temporal`]) and one Depformer step
//!   ([`LmModel::depformer_step`]) into a per-session [`LmState`] (KV caches and buffers,
//!   preallocated).
//! * [`LmBackend`] is the seam a compute device plugs into: the temporal step and the Depformer step of
//!   a batch of rows, with the logits in host memory. [`CpuLm`] is the CPU backend (weights, state and
//!   the `kernels::Pool` it splits matrix products over).
//! * [`Generator`] (over any backend), and its CPU conveniences [`LmGen`] (one session) and
//!   [`LmBatchGen`] (several), own the delayed token caches and turn user codes into Moshi's
//!   (text, audio) frames exactly as Python `LMGen.step` does; the step is written once.
//! * Sampling lives in [`crate::sampling`]. The pools are created by the caller; this module
//!   spawns no threads.
//!
//! Nothing in a step allocates once the state has been created.

mod backend;
mod gen;
mod load;
mod model;
mod plan;
mod source;
mod spec;
mod table;

pub use backend::{CpuLm, LmBackend};
pub use gen::{
    FrameStep, Generator, LmBatchGen, LmFrame, LmGen, LmObserver, LmRecorder, NoObserver,
    StepOptions, MAX_AUDIO_CODEBOOKS,
};
pub use kernels::attention::KvDtype;
pub use model::{LmModel, LmState};
#[cfg(any(test, feature = "testing"))]
pub use plan::broken_plans;
pub use plan::{AttendAt, Buf, LmPlan, Mat, Op, Pass, Proj, Stack, Token, Vector};
#[cfg(any(test, feature = "testing"))]
pub use source::DequantizedSource;
pub use source::TensorSource;
pub use spec::LmSpec;
pub use table::{DepLayer, Layer, LmTensors, MatrixRef, Projections, VectorRef};

/// An input slot that holds no token (Python's −1, e.g. a user stream without input): the model
/// embeds it as a zero vector. Tokens are `u32` everywhere; the two sentinels sit above every
/// vocabulary.
pub const NO_TOKEN: u32 = u32::MAX;

/// A token-cache slot that nothing has written yet (Python's `ungenerated_token_id`, −2). Python's
/// embedding clamps it to id 0, and so does [`LmModel`]; the generator's delays never let it reach
/// the model.
pub const UNGENERATED: u32 = u32::MAX - 1;

use crate::checkpoint::CheckpointError;
use crate::sampling::SamplingError;

/// Checks the `rows` argument of a batched LM step (the active rows, one per conversation or
/// stream, see [`LmBackend`]) against a batch of `batch` rows: at least one, each below `batch`,
/// none repeated. Every backend refuses a bad list with this same error before it touches any state.
pub fn check_active_rows(rows: &[usize], batch: usize) -> Result<(), LmError> {
    if rows.is_empty() || rows.len() > batch {
        return Err(LmError::Length {
            what: "active rows",
            expected: batch,
            got: rows.len(),
        });
    }
    for (i, &b) in rows.iter().enumerate() {
        if b >= batch || rows[..i].contains(&b) {
            return Err(LmError::Config(format!(
                "row {b} is out of range or repeated (batch of {batch} rows)"
            )));
        }
    }
    Ok(())
}

/// Checks the lengths of a step's arguments: each `(what, expected, got)` must have `got ==
/// expected`; the first that does not is refused as [`LmError::Length`]. Every backend and the
/// generator check their buffers with it before they touch any state.
pub fn check_lengths(checks: &[(&'static str, usize, usize)]) -> Result<(), LmError> {
    match checks.iter().find(|(_, expected, got)| expected != got) {
        Some(&(what, expected, got)) => Err(LmError::Length {
            what,
            expected,
            got,
        }),
        None => Ok(()),
    }
}

/// Errors of the LM: loading (missing or mis-shaped tensors, unsupported configuration) and
/// stepping (tokens out of range).
#[derive(Debug, thiserror::Error)]
pub enum LmError {
    /// The checkpoint layer failed.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A kernel constructor failed.
    #[error(transparent)]
    Kernel(#[from] kernels::KernelError),
    /// Sampling failed.
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    /// A tensor has the wrong shape.
    #[error("tensor {name}: expected shape {expected:?}, got {got:?}")]
    Shape {
        /// Canonical tensor name.
        name: String,
        /// Expected shape.
        expected: Vec<usize>,
        /// Shape found.
        got: Vec<usize>,
    },
    /// The configuration is not one this engine runs.
    #[error("unsupported LM configuration: {0}")]
    Config(String),
    /// A device backend failed (the GPU's error, kept whole: `model` cannot name the backend crates,
    /// which depend on it, so the error travels boxed and a caller downcasts it to the backend's type).
    #[error(transparent)]
    Backend(Box<dyn std::error::Error + Send + Sync>),
    /// A token fed to the model is outside its embedding table.
    #[error("stream {stream}: token {token} outside [-1, {max}]")]
    Token {
        /// Stream index (0 = text, 1.. = audio).
        stream: usize,
        /// The token.
        token: i64,
        /// Largest valid id.
        max: i64,
    },
    /// A slice argument has the wrong length.
    #[error("{what}: expected length {expected}, got {got}")]
    Length {
        /// What was passed.
        what: &'static str,
        /// Expected length.
        expected: usize,
        /// Given length.
        got: usize,
    },
}

#[cfg(test)]
pub(crate) mod tests;
