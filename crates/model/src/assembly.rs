//! One bundle directory into a ready model: the LM, Mimi and the tokenizer, each built from the
//! bundle's own configs and checked against its schema.

use std::path::Path;

use crate::checkpoint::{Bundle, CheckpointError};
use crate::lm::{LmError, LmModel};
use crate::mimi::{Mimi, MimiError};
use crate::text::{SentencePiece, TextError};

/// Why a bundle could not be opened into a [`MoshiModel`].
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The bundle directory, its configs or a weights file was refused.
    #[error("{what}: {source}")]
    Checkpoint {
        /// Which part of the bundle (`bundle`, `LM weights`, `Mimi weights`).
        what: &'static str,
        /// The refusal.
        source: CheckpointError,
    },
    /// The LM weights do not build an LM.
    #[error("LM: {0}")]
    Lm(#[from] LmError),
    /// The Mimi weights do not build a codec.
    #[error("Mimi: {0}")]
    Mimi(#[from] MimiError),
    /// The SentencePiece model could not be read.
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] TextError),
}

fn refused(what: &'static str) -> impl Fn(CheckpointError) -> LoadError {
    move |source| LoadError::Checkpoint { what, source }
}

/// The three components of a bundle, loaded and immutable.
#[derive(Debug)]
pub struct MoshiModel {
    /// The Moshi LM.
    pub lm: LmModel,
    /// The Mimi codec (as many codebooks as the LM reads from the user stream).
    pub mimi: Mimi,
    /// The SentencePiece text tokenizer.
    pub tokenizer: SentencePiece,
}

impl MoshiModel {
    /// Open a bundle directory (see [`Bundle::open`]) and build its components.
    pub fn open(dir: &Path) -> Result<MoshiModel, LoadError> {
        let bundle = Bundle::open(dir).map_err(refused("bundle"))?;
        Self::from_bundle(&bundle)
    }

    /// Build the components of an opened bundle. Each weights file is mapped, checked against its
    /// schema and dropped once its component is built, so the LM's mapping is gone before Mimi's opens.
    pub fn from_bundle(bundle: &Bundle) -> Result<MoshiModel, LoadError> {
        let lm_weights = bundle
            .lm_weights()
            .map_err(|source| LoadError::Checkpoint {
                what: "LM weights",
                source,
            })?;
        let lm = LmModel::load(&lm_weights, &bundle.config.lm)?;
        drop(lm_weights);
        let mimi_weights = bundle.mimi_weights().map_err(refused("Mimi weights"))?;
        let mimi = Mimi::load(&mimi_weights, &bundle.mimi_config, lm.spec().n_user())?;
        drop(mimi_weights);
        let tokenizer = SentencePiece::load(&bundle.files.tokenizer)?;
        Ok(MoshiModel {
            lm,
            mimi,
            tokenizer,
        })
    }
}
