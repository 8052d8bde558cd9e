//! The resident, immutable weight image shared by sessions.

use std::path::Path;
use std::sync::Arc;

use model::lm::{KvDtype, LmModel};
use model::mimi::Mimi;
use model::text::SentencePiece;
use model::MoshiModel;

use crate::RuntimeError;

/// Options of [`Engine::open`].
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Matvec threads per session (the calling thread plus `threads - 1` pool workers). Default 1.
    pub threads: usize,
    /// Element type of the LM's temporal KV ring. Default F32.
    pub kv_dtype: KvDtype,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            threads: 1,
            kv_dtype: KvDtype::F32,
        }
    }
}

/// The resident weight image: LM, Mimi and (optionally) the SentencePiece tokenizer of one bundle.
///
/// Opened once, immutable, shared by any number of sessions through `Arc`. It owns no threads: every
/// [`crate::Session`] owns its own `kernels::Pool`, so concurrent sessions never contend on a pool.
pub struct Engine {
    lm: LmModel,
    mimi: Arc<Mimi>,
    tokenizer: Option<Arc<SentencePiece>>,
    opts: EngineOptions,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("lm", self.lm.spec())
            .field("mimi_codebooks", &self.mimi.n_codebooks())
            .field("tokenizer", &self.tokenizer.is_some())
            .field("opts", &self.opts)
            .finish()
    }
}

impl Engine {
    /// Open a bundle directory (`config.json` + LM weights + Mimi weights + SentencePiece model; see
    /// `model::checkpoint::Bundle`) and build the three components.
    pub fn open(bundle_dir: &Path, opts: EngineOptions) -> Result<Arc<Engine>, RuntimeError> {
        let m = MoshiModel::open(bundle_dir).map_err(|e| RuntimeError::Model(e.to_string()))?;
        Engine::from_parts(m.lm, Arc::new(m.mimi), Some(Arc::new(m.tokenizer)), opts)
    }

    /// Build an engine from already-loaded components (tests, custom loaders).
    pub fn from_parts(
        lm: LmModel,
        mimi: Arc<Mimi>,
        tokenizer: Option<Arc<SentencePiece>>,
        opts: EngineOptions,
    ) -> Result<Arc<Engine>, RuntimeError> {
        if opts.threads == 0 {
            return Err(RuntimeError::InvalidOption("threads must be >= 1".into()));
        }
        let spec = lm.spec();
        if spec.dep_q != crate::N_AUDIO {
            return Err(RuntimeError::Model(format!(
                "the runtime drives 8 generated codebooks; this LM generates {}",
                spec.dep_q
            )));
        }
        if spec.n_user() != crate::N_AUDIO {
            return Err(RuntimeError::Model(format!(
                "the runtime feeds 8 user codebooks; this LM reads {}",
                spec.n_user()
            )));
        }
        if mimi.n_codebooks() < spec.n_user() {
            return Err(RuntimeError::Model(format!(
                "Mimi gives {} codebooks, the LM reads {}",
                mimi.n_codebooks(),
                spec.n_user()
            )));
        }
        if mimi.frame_size() != crate::FRAME_SIZE {
            return Err(RuntimeError::Model(format!(
                "Mimi frame size {} (the runtime needs {})",
                mimi.frame_size(),
                crate::FRAME_SIZE
            )));
        }
        Ok(Arc::new(Engine {
            lm,
            mimi,
            tokenizer,
            opts,
        }))
    }

    /// The options the engine was opened with.
    pub fn options(&self) -> &EngineOptions {
        &self.opts
    }

    /// The LM.
    pub fn lm(&self) -> &LmModel {
        &self.lm
    }

    /// The Mimi codec.
    pub fn mimi(&self) -> &Arc<Mimi> {
        &self.mimi
    }

    /// The text tokenizer, if the engine has one.
    pub fn tokenizer(&self) -> Option<&Arc<SentencePiece>> {
        self.tokenizer.as_ref()
    }
}
