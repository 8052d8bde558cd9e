//! The resident, immutable weight image shared by sessions, and the device the sessions compute on.

use std::path::Path;
use std::sync::Arc;

use kernels::Pool;
use model::lm::{CpuLm, KvDtype, LmBackend, LmModel};
use model::mimi::{BatchCodecBackend, CodecBackend, CpuMimi, CpuMimiBatch, Mimi};
use model::text::SentencePiece;
use model::{LoadTimings, MoshiModel};

use crate::RuntimeError;

/// A device context opened by the caller ([`Engine::from_parts_on`]); without the `gpu` feature
/// there is none.
#[cfg(feature = "gpu")]
type OpenedGpu = gpu::GpuContext;
#[cfg(not(feature = "gpu"))]
type OpenedGpu = std::convert::Infallible;

/// Where a session's LM and codec run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// The CPU: each session (or batch) owns a worker pool of `threads` threads (the calling thread plus
    /// `threads - 1` workers) that the LM and Mimi split their matrix products over.
    Cpu {
        /// Threads per session, >= 1.
        threads: usize,
    },
    /// A GPU through wgpu (Vulkan, Metal, DX12; the `gpu` cargo feature): the LM and Mimi run on
    /// adapter `adapter` of `gpu::adapters()` (`None`: the best adapter of any type, software ones
    /// included): a session's Mimi as `gpu::GpuMimi`, a batch driver's (all slots coded together) as
    /// `gpu::GpuMimiBatch`. The LM and Mimi weights are uploaded once, at [`Engine::open`].
    Gpu {
        /// Adapter index, or `None` for the best one.
        adapter: Option<usize>,
        /// Threads of the driver's CPU worker pool, >= 1 (with the LM and Mimi on the device, the
        /// model's work does not use it).
        threads: usize,
    },
}

impl Device {
    /// The CPU with one thread per physical core ([`physical_cores`]).
    pub fn cpu_all_cores() -> Device {
        Device::Cpu {
            threads: physical_cores(),
        }
    }

    /// CPU threads per session (on the GPU, the size of the driver's worker pool, unused by the model).
    pub fn threads(&self) -> usize {
        match self {
            Device::Cpu { threads } | Device::Gpu { threads, .. } => *threads,
        }
    }
}

impl Default for Device {
    /// One CPU thread.
    fn default() -> Self {
        Device::Cpu { threads: 1 }
    }
}

/// Physical cores of this machine (hyper-threads of one core counted once): the thread count at which the
/// memory-bound LM step stops getting faster. Read from Linux's CPU topology; elsewhere, or when it cannot be
/// read, the logical CPU count.
pub fn physical_cores() -> usize {
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
    linux_physical_cores().unwrap_or(logical).clamp(1, logical)
}

fn linux_physical_cores() -> Option<usize> {
    let mut cores = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir("/sys/devices/system/cpu").ok()? {
        let entry = entry.ok()?;
        let name = entry.file_name();
        let name = name.to_str()?;
        if !name
            .strip_prefix("cpu")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        let topo = entry.path().join("topology");
        let read = |f: &str| {
            std::fs::read_to_string(topo.join(f))
                .ok()
                .map(|s| s.trim().to_string())
        };
        let (Some(pkg), Some(core)) = (read("physical_package_id"), read("core_id")) else {
            continue;
        };
        cores.insert((pkg, core));
    }
    (!cores.is_empty()).then_some(cores.len())
}

/// Options of [`Engine::open`].
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Where sessions compute. Default: the CPU with one thread.
    pub device: Device,
    /// Element type of the LM's temporal KV ring, on the CPU and on the GPU. Default F32.
    pub kv_dtype: KvDtype,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            device: Device::default(),
            kv_dtype: KvDtype::F32,
        }
    }
}

impl EngineOptions {
    /// The CPU with `threads` threads per session, f32 KV cache.
    pub fn cpu(threads: usize) -> EngineOptions {
        EngineOptions {
            device: Device::Cpu { threads },
            ..EngineOptions::default()
        }
    }
}

/// The compute context of one driver (a session, or a batch of them): what its LM backend and its codec
/// backends share. On the CPU, the worker pool (on the GPU device the pool is unused by the model: the
/// device state of the LM and of the codecs is created per driver by [`Engine::lm_backend`],
/// [`Engine::codec_backend`] and [`Engine::batch_codec_backend`] over the engine's uploaded weights).
pub(crate) enum Compute {
    Cpu(Arc<Pool>),
}

/// The resident weight image: LM, Mimi and (optionally) the SentencePiece tokenizer of one bundle.
///
/// Opened once, immutable, shared by any number of sessions through `Arc`. It owns no threads: every
/// [`crate::Session`] (and every [`crate::BatchRunner`]) gets its own compute context from
/// [`EngineOptions::device`], so concurrent sessions never contend on a pool.
pub struct Engine {
    lm: Arc<LmModel>,
    mimi: Arc<Mimi>,
    tokenizer: Option<Arc<SentencePiece>>,
    opts: EngineOptions,
    /// The LM weights on the GPU ([`Device::Gpu`]).
    #[cfg(feature = "gpu")]
    gpu_lm: Option<Arc<gpu::GpuLmWeights>>,
    /// The Mimi weights on the GPU ([`Device::Gpu`]), on the LM's device.
    #[cfg(feature = "gpu")]
    gpu_mimi: Option<Arc<gpu::GpuMimiWeights>>,
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
    /// `model::checkpoint::Bundle`) and build the three components ([`MoshiModel::open`]).
    pub fn open(bundle_dir: &Path, opts: EngineOptions) -> Result<Arc<Engine>, RuntimeError> {
        Ok(Engine::open_timed(bundle_dir, opts)?.0)
    }

    /// [`Engine::open`], also returning where the load's time went. The LM's matrices are built on one
    /// thread per physical core ([`physical_cores`]; a pool that lives for the load only), whatever
    /// thread count the sessions will use.
    pub fn open_timed(
        bundle_dir: &Path,
        opts: EngineOptions,
    ) -> Result<(Arc<Engine>, LoadTimings), RuntimeError> {
        let m = MoshiModel::open_on(bundle_dir, &Pool::new(physical_cores()))
            .map_err(|e| RuntimeError::Model(e.to_string()))?;
        let timings = m.timings;
        let engine = Engine::from_parts(m.lm, Arc::new(m.mimi), Some(Arc::new(m.tokenizer)), opts)?;
        Ok((engine, timings))
    }

    /// Build an engine from already-loaded components (tests, custom loaders).
    pub fn from_parts(
        lm: LmModel,
        mimi: Arc<Mimi>,
        tokenizer: Option<Arc<SentencePiece>>,
        opts: EngineOptions,
    ) -> Result<Arc<Engine>, RuntimeError> {
        Engine::assemble(lm, mimi, tokenizer, opts, None)
    }

    /// [`Engine::from_parts`] on a GPU context the caller opened (one that profiles its launches,
    /// say: `gpu::GpuOptions::profile`, read back through the caller's handle). `opts.device` must
    /// be [`Device::Gpu`]; the context's adapter is used whatever its `adapter` says.
    #[cfg(feature = "gpu")]
    pub fn from_parts_on(
        lm: LmModel,
        mimi: Arc<Mimi>,
        tokenizer: Option<Arc<SentencePiece>>,
        opts: EngineOptions,
        ctx: gpu::GpuContext,
    ) -> Result<Arc<Engine>, RuntimeError> {
        if !matches!(opts.device, Device::Gpu { .. }) {
            return Err(RuntimeError::InvalidOption(
                "Engine::from_parts_on takes a GPU context: opts.device must be Device::Gpu".into(),
            ));
        }
        Engine::assemble(lm, mimi, tokenizer, opts, Some(ctx))
    }

    fn assemble(
        lm: LmModel,
        mimi: Arc<Mimi>,
        tokenizer: Option<Arc<SentencePiece>>,
        opts: EngineOptions,
        ctx: Option<OpenedGpu>,
    ) -> Result<Arc<Engine>, RuntimeError> {
        if opts.device.threads() == 0 {
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
        #[cfg(feature = "gpu")]
        let (gpu_lm, gpu_mimi) = match opts.device {
            Device::Gpu { adapter, .. } => {
                let ctx = match ctx {
                    Some(c) => c,
                    None => gpu::GpuContext::new(
                        gpu::AdapterChoice::Gpu(adapter),
                        gpu::GpuOptions::default(),
                    )?,
                };
                let lm_w = gpu::GpuLmWeights::upload(&ctx, &lm)?;
                let mimi_w = gpu::GpuMimiWeights::upload(&ctx, mimi.clone())?;
                (Some(lm_w), Some(mimi_w))
            }
            Device::Cpu { .. } => (None, None),
        };
        #[cfg(not(feature = "gpu"))]
        let _ = ctx;
        #[cfg(not(feature = "gpu"))]
        if let Device::Gpu { .. } = opts.device {
            return Err(RuntimeError::Device(
                "this build has no GPU support (hint: build with the runtime's `gpu` feature, as the \
                 moshi-native binary is, or use the CPU)"
                    .into(),
            ));
        }
        Ok(Arc::new(Engine {
            lm: Arc::new(lm),
            mimi,
            tokenizer,
            opts,
            #[cfg(feature = "gpu")]
            gpu_lm,
            #[cfg(feature = "gpu")]
            gpu_mimi,
        }))
    }

    /// The same resident components with other options (another thread count, say): nothing is copied
    /// or reloaded, the new engine shares the weights with this one (on the GPU too; an engine opened
    /// for the CPU cannot be moved to the GPU this way).
    pub fn with_options(&self, opts: EngineOptions) -> Result<Arc<Engine>, RuntimeError> {
        if opts.device.threads() == 0 {
            return Err(RuntimeError::InvalidOption("threads must be >= 1".into()));
        }
        #[cfg(feature = "gpu")]
        let (gpu_lm, gpu_mimi) = match opts.device {
            Device::Gpu { .. } if self.gpu_lm.is_none() => {
                return Err(RuntimeError::InvalidOption(
                    "with_options cannot move an engine to the GPU: open it with Device::Gpu"
                        .into(),
                ))
            }
            Device::Gpu { .. } => (self.gpu_lm.clone(), self.gpu_mimi.clone()),
            Device::Cpu { .. } => (None, None),
        };
        #[cfg(not(feature = "gpu"))]
        if let Device::Gpu { .. } = opts.device {
            return Err(RuntimeError::Device("this build has no GPU support".into()));
        }
        Ok(Arc::new(Engine {
            lm: self.lm.clone(),
            mimi: self.mimi.clone(),
            tokenizer: self.tokenizer.clone(),
            opts,
            #[cfg(feature = "gpu")]
            gpu_lm,
            #[cfg(feature = "gpu")]
            gpu_mimi,
        }))
    }

    /// The GPU adapter the LM runs on (`None` on the CPU).
    pub fn gpu_adapter(&self) -> Option<String> {
        #[cfg(feature = "gpu")]
        if let Some(w) = &self.gpu_lm {
            return Some(w.context().adapter().to_string());
        }
        None
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

    /// A fresh compute context for one driver.
    pub(crate) fn compute(&self) -> Compute {
        match self.opts.device {
            Device::Cpu { threads } | Device::Gpu { threads, .. } => {
                Compute::Cpu(Arc::new(Pool::new(threads)))
            }
        }
    }

    /// The LM backend of a driver with `rows` conversation slots; `kv_capacity` (CPU only) shortens
    /// its temporal KV caches below the model's context (see `CpuLm::with_kv_capacity`).
    pub(crate) fn lm_backend(
        &self,
        compute: &Compute,
        rows: usize,
        kv_capacity: Option<usize>,
    ) -> Result<Box<dyn LmBackend>, RuntimeError> {
        #[cfg(feature = "gpu")]
        if let Some(w) = &self.gpu_lm {
            // The engine's KV element type holds on the device too (bf16: half the bytes).
            let opts = gpu::GpuLmOptions {
                kv_dtype: self.opts.kv_dtype,
                ..Default::default()
            };
            return Ok(Box::new(gpu::GpuLm::with_options(w.clone(), rows, opts)?));
        }
        match compute {
            Compute::Cpu(pool) => {
                let (lm, kv, pool) = (self.lm.clone(), self.opts.kv_dtype, pool.clone());
                let backend = match kv_capacity {
                    Some(c) => CpuLm::with_kv_capacity(lm, rows, kv, c, pool),
                    None => CpuLm::new(lm, rows, kv, pool),
                };
                Ok(Box::new(
                    backend.map_err(|e| RuntimeError::Model(e.to_string()))?,
                ))
            }
        }
    }

    /// The codec backend of one conversation: on the GPU device, Mimi on the device (its streaming state
    /// allocated here).
    pub(crate) fn codec_backend(
        &self,
        compute: &Compute,
    ) -> Result<Box<dyn CodecBackend>, RuntimeError> {
        #[cfg(feature = "gpu")]
        if let Some(w) = &self.gpu_mimi {
            return Ok(Box::new(gpu::GpuMimi::new(w.clone())?));
        }
        match compute {
            Compute::Cpu(pool) => Ok(Box::new(CpuMimi::new(self.mimi.clone(), pool.clone()))),
        }
    }

    /// The codec of a batch driver with `slots` conversation slots (every slot's streams, coded together):
    /// on the GPU device, every slot's Mimi streams on the device (`gpu::GpuMimiBatch`, its state
    /// allocated here; one submission per tick and direction).
    pub(crate) fn batch_codec_backend(
        &self,
        compute: &Compute,
        slots: usize,
    ) -> Result<Box<dyn BatchCodecBackend>, RuntimeError> {
        #[cfg(feature = "gpu")]
        if let Some(w) = &self.gpu_mimi {
            return Ok(Box::new(gpu::GpuMimiBatch::new(w.clone(), slots)?));
        }
        match compute {
            Compute::Cpu(pool) => Ok(Box::new(CpuMimiBatch::new(
                self.mimi.clone(),
                slots,
                pool.clone(),
            ))),
        }
    }
}
