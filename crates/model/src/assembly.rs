//! One bundle directory into a ready model: the LM, Mimi and the tokenizer, each built from the
//! bundle's own configs and checked against its schema.

use std::path::Path;
use std::time::{Duration, Instant};

use kernels::Pool;

use crate::checkpoint::{Bundle, CheckpointError, Weights};
use crate::lm::{LmError, LmModel, LmSpec};
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

/// The three components of a bundle, loaded and immutable, with the LM as `L`: the CPU's
/// [`LmModel`] ([`MoshiModel`]), or the weights a device built from the checkpoint itself
/// ([`Bundled::open_with`]).
#[derive(Debug)]
pub struct Bundled<L> {
    /// The Moshi LM.
    pub lm: L,
    /// The Mimi codec (as many codebooks as the LM reads from the user stream).
    pub mimi: Mimi,
    /// The SentencePiece text tokenizer.
    pub tokenizer: SentencePiece,
    /// Where the time of the load went.
    pub timings: LoadTimings,
}

/// A bundle with its LM built for the CPU kernels.
pub type MoshiModel = Bundled<LmModel>;

/// Where the time of [`MoshiModel::open_on`] went, phase by phase (wall time).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LoadTimings {
    /// Opening the bundle, mapping both weights files and checking their headers against the
    /// schemas (no weight byte is read).
    pub map: Duration,
    /// Reading the LM weights from the mapping and converting / repacking them into the kernels'
    /// layouts (the bulk of a load).
    pub lm: Duration,
    /// Reading and building Mimi.
    pub mimi: Duration,
    /// Reading the tokenizer.
    pub tokenizer: Duration,
    /// Size of the LM weights file in bytes.
    pub lm_file_bytes: u64,
    /// Threads the LM matrices were built on.
    pub threads: usize,
    /// Share of the LM weights file found in the page cache before the build (`None` where it cannot
    /// be told): a load far slower than a warm one is a cold (or partly evicted) file, and the load line
    /// says so.
    pub lm_resident: Option<f64>,
}

impl LoadTimings {
    /// The whole load.
    pub fn total(&self) -> Duration {
        self.map + self.lm + self.mimi + self.tokenizer
    }
}

impl Bundled<LmModel> {
    /// Open a bundle directory (see [`Bundle::open`]) and build its components on the calling thread.
    pub fn open(dir: &Path) -> Result<MoshiModel, LoadError> {
        Self::open_on(dir, &Pool::new(1))
    }

    /// [`MoshiModel::open`] with the LM's matrices built on every thread of `pool`.
    pub fn open_on(dir: &Path, pool: &Pool) -> Result<MoshiModel, LoadError> {
        let t0 = Instant::now();
        let bundle = Bundle::open(dir).map_err(refused("bundle"))?;
        Self::cpu(&bundle, pool, t0)
    }

    /// Build the components of an opened bundle. Each weights file is mapped, checked against its
    /// schema and dropped once its component is built, so the LM's mapping is gone before Mimi's opens.
    pub fn from_bundle(bundle: &Bundle) -> Result<MoshiModel, LoadError> {
        Self::cpu(bundle, &Pool::new(1), Instant::now())
    }

    fn cpu(bundle: &Bundle, pool: &Pool, t0: Instant) -> Result<MoshiModel, LoadError> {
        Bundled::build(bundle, pool.n_threads(), t0, |weights, spec| {
            Ok(LmModel::from_source_on(weights, spec, pool)?)
        })
    }
}

impl<L> Bundled<L> {
    /// Open a bundle directory as [`MoshiModel::open`] does, the LM built by `build_lm` from the
    /// bundle's LM weights file (mapped and checked against its schema, dropped when `build_lm`
    /// returns) and the [`LmSpec`] of the bundle's LM config: a device that packs the checkpoint
    /// itself (the GPU's weights) builds them here, and no CPU [`LmModel`] is made. `threads`: what
    /// [`LoadTimings::threads`] reports for that build. Errors of the bundle, Mimi and the
    /// tokenizer are [`LoadError`]s, turned into `E`.
    pub fn open_with<E: From<LoadError>>(
        dir: &Path,
        threads: usize,
        build_lm: impl FnOnce(&Weights, LmSpec) -> Result<L, E>,
    ) -> Result<Bundled<L>, E> {
        let t0 = Instant::now();
        let bundle = Bundle::open(dir).map_err(refused("bundle"))?;
        Self::build(&bundle, threads, t0, build_lm)
    }

    fn build<E: From<LoadError>>(
        bundle: &Bundle,
        threads: usize,
        t0: Instant,
        build_lm: impl FnOnce(&Weights, LmSpec) -> Result<L, E>,
    ) -> Result<Bundled<L>, E> {
        let lm_weights = bundle
            .lm_weights()
            .map_err(|source| LoadError::Checkpoint {
                what: "LM weights",
                source,
            })?;
        // mincore on a sample of pages: reads nothing, costs ~1 ms. Reported only: the build runs on
        // every thread of the pool whatever the share. A one-thread build for a mostly evicted file was
        // tried and measured slower on a 2-vCPU KVM guest (`git show 17b5486:BENCHMARKS.md`, "Start-up",
        // quiet rerun: 35 s cold and 39 s at 28 % resident, against 6.3 s cold and 3.5 s warm on two
        // threads).
        let lm_resident = lm_weights.resident_share();
        let mut timings = LoadTimings {
            lm_file_bytes: lm_weights.file_len() as u64,
            threads,
            lm_resident,
            ..LoadTimings::default()
        };
        let t1 = Instant::now();
        let spec = LmSpec::from_config(&bundle.config.lm).map_err(LoadError::from)?;
        let n_user = spec.n_user();
        let lm = build_lm(&lm_weights, spec)?;
        drop(lm_weights);
        let t2 = Instant::now();
        let mimi_weights = bundle.mimi_weights().map_err(refused("Mimi weights"))?;
        let t3 = Instant::now();
        let mimi =
            Mimi::load(&mimi_weights, &bundle.mimi_config, n_user).map_err(LoadError::from)?;
        drop(mimi_weights);
        let t4 = Instant::now();
        let tokenizer = SentencePiece::load(&bundle.files.tokenizer).map_err(LoadError::from)?;
        timings.map = (t1 - t0) + (t3 - t2);
        timings.lm = t2 - t1;
        timings.mimi = t4 - t3;
        timings.tokenizer = t4.elapsed();
        Ok(Bundled {
            lm,
            mimi,
            tokenizer,
            timings,
        })
    }
}
