//! The resident, immutable weight image shared by sessions, and the device the sessions compute on.

use std::path::Path;
use std::sync::Arc;

use kernels::Pool;
use model::lm::{CpuLm, KvDtype, LmBackend, LmModel};
use model::mimi::{CodecBackend, CpuMimi, Mimi};
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
    /// included): Mimi as `gpu::GpuMimi` (one slot for a session, every slot of a batch driver coded
    /// together). The LM and Mimi weights are uploaded once, at [`Engine::open`].
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

    /// The device's name in flags and reports: "cpu" or "gpu".
    pub fn name(&self) -> &'static str {
        match self {
            Device::Cpu { .. } => "cpu",
            Device::Gpu { .. } => "gpu",
        }
    }

    /// Checks that the device can be opened, without opening it: a thread count of 0, a GPU adapter that
    /// does not exist or a build without GPU support is named here, before a multi-gigabyte read
    /// ([`RuntimeError::InvalidOption`], [`RuntimeError::Device`]).
    pub fn check(&self) -> Result<(), RuntimeError> {
        if self.threads() == 0 {
            return Err(RuntimeError::InvalidOption("threads must be >= 1".into()));
        }
        match self {
            Device::Cpu { .. } => Ok(()),
            #[cfg(feature = "gpu")]
            Device::Gpu { adapter, .. } => {
                gpu::choose_adapter(&gpu::adapters(), gpu::AdapterChoice::Gpu(*adapter))?;
                Ok(())
            }
            #[cfg(not(feature = "gpu"))]
            Device::Gpu { .. } => Err(no_gpu_support()),
        }
    }
}

/// Without the `gpu` feature: what [`Device::Gpu`] gets.
#[cfg(not(feature = "gpu"))]
fn no_gpu_support() -> RuntimeError {
    RuntimeError::Device(
        "this build has no GPU support (hint: build with the runtime's `gpu` feature, as the \
         moshi-native binary is, or use the CPU)"
            .into(),
    )
}

/// The LM backend of `rows` rows of `lm` on `device`, KV caches in `kv_dtype`: the CPU's on `pool`, or a
/// GPU's (weights uploaded here, to a context of its own). For an LM driven alone (the speech-to-text
/// step, `trace lm`); an [`Engine`]'s sessions share the weights it uploaded once.
pub fn lm_backend(
    device: Device,
    lm: &Arc<LmModel>,
    rows: usize,
    kv_dtype: KvDtype,
    pool: Arc<Pool>,
) -> Result<Box<dyn LmBackend>, RuntimeError> {
    Compute::open(device, lm, None, None)?.lm_backend(lm, rows, kv_dtype, None, &Workers(pool))
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

/// The compute context of one driver (a session, or a batch of them): the worker pool its LM backend and
/// its codec backends share (on a device that runs the model itself, the pool serves the driver's host
/// work only). The device state of the backends is made per driver from the engine's [`Compute`].
pub(crate) struct Workers(pub(crate) Arc<Pool>);

/// The device an engine computes on, chosen once when the engine is opened: that device's handles on the
/// LM and codec weights, from which every driver's backends are made. Each per-device choice of the runtime
/// is one `match` on this value (or, before it exists, on [`Device`] in [`Compute::open`]); a new device is
/// a new variant and one arm in each (see `docs/ARCHITECTURE.md`, "Adding a device").
#[derive(Clone)]
pub(crate) enum Compute {
    /// The CPU: the engine's own [`LmModel`] and [`Mimi`], split over each driver's pool.
    Cpu,
    /// A GPU: the weights uploaded once to its context, shared by every driver of the engine.
    #[cfg(feature = "gpu")]
    Gpu(Arc<GpuResident>),
}

/// The weights one GPU context holds for an engine (or for a speech-to-text step: [`crate::stt_batch`]).
#[cfg(feature = "gpu")]
pub(crate) struct GpuResident {
    lm: Arc<gpu::GpuLmWeights>,
    /// Mimi on the device; `None` for the speech-to-text step, whose 32-codebook encoder runs on the CPU.
    mimi: Option<Arc<gpu::GpuMimiWeights>>,
}

impl Compute {
    /// Opens `device` for `lm` and (when given) `mimi`: on a GPU, on the context `ctx` the caller
    /// opened or else on a new one for the device's adapter, uploading the weights once.
    pub(crate) fn open(
        device: Device,
        lm: &LmModel,
        mimi: Option<&Arc<Mimi>>,
        ctx: Option<OpenedGpu>,
    ) -> Result<Compute, RuntimeError> {
        match device {
            Device::Cpu { .. } => Ok(Compute::Cpu),
            #[cfg(feature = "gpu")]
            Device::Gpu { adapter, .. } => {
                let ctx = match ctx {
                    Some(c) => c,
                    None => gpu::GpuContext::new(
                        gpu::AdapterChoice::Gpu(adapter),
                        gpu::GpuOptions::default(),
                    )?,
                };
                let lm = gpu::GpuLmWeights::upload(&ctx, lm)?;
                let mimi = match mimi {
                    Some(m) => Some(gpu::GpuMimiWeights::upload(&ctx, m.clone())?),
                    None => None,
                };
                Ok(Compute::Gpu(Arc::new(GpuResident { lm, mimi })))
            }
            #[cfg(not(feature = "gpu"))]
            Device::Gpu { .. } => {
                let _ = (lm, mimi, ctx);
                Err(no_gpu_support())
            }
        }
    }

    /// This compute for options naming `device` ([`Engine::with_options`]): the weights stay where they
    /// are, so a GPU engine may run on the CPU (it keeps the CPU weights) but not the other way round.
    fn for_device(&self, device: &Device) -> Option<Compute> {
        match (self, device) {
            (_, Device::Cpu { .. }) => Some(Compute::Cpu),
            #[cfg(feature = "gpu")]
            (Compute::Gpu(_), Device::Gpu { .. }) => Some(self.clone()),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// The adapter the model runs on, for logs (`None` on the CPU).
    fn adapter(&self) -> Option<String> {
        match self {
            Compute::Cpu => None,
            #[cfg(feature = "gpu")]
            Compute::Gpu(g) => Some(g.lm.context().adapter().to_string()),
        }
    }

    /// The LM backend of `rows` rows of `lm` (the CPU model the device was opened for), KV caches in
    /// `kv_dtype`; `kv_capacity` (CPU only) shortens the temporal KV caches below the model's context
    /// (see `CpuLm::with_kv_capacity`).
    pub(crate) fn lm_backend(
        &self,
        lm: &Arc<LmModel>,
        rows: usize,
        kv_dtype: KvDtype,
        kv_capacity: Option<usize>,
        workers: &Workers,
    ) -> Result<Box<dyn LmBackend>, RuntimeError> {
        match self {
            Compute::Cpu => {
                let (lm, pool) = (lm.clone(), workers.0.clone());
                let backend = match kv_capacity {
                    Some(c) => CpuLm::with_kv_capacity(lm, rows, kv_dtype, c, pool),
                    None => CpuLm::new(lm, rows, kv_dtype, pool),
                };
                Ok(Box::new(backend?))
            }
            #[cfg(feature = "gpu")]
            Compute::Gpu(g) => {
                let opts = gpu::GpuLmOptions {
                    kv_dtype,
                    ..Default::default()
                };
                Ok(Box::new(gpu::GpuLm::with_options(
                    g.lm.clone(),
                    rows,
                    opts,
                )?))
            }
        }
    }

    /// The codec of a driver with `slots` conversation slots over `mimi` (one for a session; every
    /// slot's streams, coded together: on a GPU one submission per call for all listed slots).
    fn codec_backend(
        &self,
        mimi: &Arc<Mimi>,
        slots: usize,
        workers: &Workers,
    ) -> Result<Box<dyn CodecBackend>, RuntimeError> {
        match self {
            Compute::Cpu => Ok(Box::new(CpuMimi::new(
                mimi.clone(),
                slots,
                workers.0.clone(),
            ))),
            #[cfg(feature = "gpu")]
            Compute::Gpu(g) => Ok(Box::new(gpu::GpuMimi::new(g.mimi()?, slots)?)),
        }
    }
}

#[cfg(feature = "gpu")]
impl GpuResident {
    fn mimi(&self) -> Result<Arc<gpu::GpuMimiWeights>, RuntimeError> {
        self.mimi.clone().ok_or_else(|| {
            RuntimeError::Device("this GPU context holds no Mimi weights (an LM-only step)".into())
        })
    }
}

/// The resident weight image: LM, Mimi and (optionally) the SentencePiece tokenizer of one bundle.
///
/// Opened once, immutable, shared by any number of sessions through `Arc`. It owns no threads: every
/// [`crate::Session`] (and every [`crate::BatchRunner`]) gets its own worker pool from
/// [`EngineOptions::device`], so concurrent sessions never contend on a pool.
pub struct Engine {
    lm: Arc<LmModel>,
    mimi: Arc<Mimi>,
    tokenizer: Option<Arc<SentencePiece>>,
    opts: EngineOptions,
    /// The device the sessions compute on, opened from `opts.device`.
    compute: Compute,
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
        let compute = Compute::open(opts.device, &lm, Some(&mimi), ctx)?;
        Ok(Arc::new(Engine {
            lm: Arc::new(lm),
            mimi,
            tokenizer,
            opts,
            compute,
        }))
    }

    /// The same resident components with other options (another thread count, say): nothing is copied
    /// or reloaded, the new engine shares the weights with this one (on the GPU too; an engine opened
    /// for the CPU cannot be moved to the GPU this way).
    pub fn with_options(&self, opts: EngineOptions) -> Result<Arc<Engine>, RuntimeError> {
        if opts.device.threads() == 0 {
            return Err(RuntimeError::InvalidOption("threads must be >= 1".into()));
        }
        let Some(compute) = self.compute.for_device(&opts.device) else {
            return Err(RuntimeError::InvalidOption(
                "with_options cannot move an engine to the GPU: open it with Device::Gpu".into(),
            ));
        };
        Ok(Arc::new(Engine {
            lm: self.lm.clone(),
            mimi: self.mimi.clone(),
            tokenizer: self.tokenizer.clone(),
            opts,
            compute,
        }))
    }

    /// The GPU adapter the LM runs on (`None` on the CPU).
    pub fn gpu_adapter(&self) -> Option<String> {
        self.compute.adapter()
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

    /// A fresh worker pool for one driver.
    pub(crate) fn workers(&self) -> Workers {
        Workers(Arc::new(Pool::new(self.opts.device.threads())))
    }

    /// The LM backend of a driver with `rows` conversation slots; `kv_capacity` (CPU only) shortens
    /// its temporal KV caches below the model's context (see `CpuLm::with_kv_capacity`).
    pub(crate) fn lm_backend(
        &self,
        workers: &Workers,
        rows: usize,
        kv_capacity: Option<usize>,
    ) -> Result<Box<dyn LmBackend>, RuntimeError> {
        self.compute
            .lm_backend(&self.lm, rows, self.opts.kv_dtype, kv_capacity, workers)
    }

    /// A conversation's whole frame pass as one call (`fused.rs`) when the device has one and
    /// samples with `sampler`: on the GPU, `gpu::GpuDuplexBatch` of one slot (one submission per
    /// frame); `None` on the CPU, whose sessions keep [`Engine::lm_backend`] and
    /// [`Engine::codec_backend`].
    pub(crate) fn frame_backend(
        &self,
        sampler: &model::sampling::Sampler,
    ) -> Result<Option<Box<dyn crate::fused::FrameBackend>>, RuntimeError> {
        self.frames(1, Some(sampler))
    }

    /// The whole frame passes of a batch driver's `slots` slots as one call per tick when the
    /// device has one (the GPU: `gpu::GpuDuplexBatch`; each joining conversation's sampler must
    /// run on the device); `None` on the CPU, whose batches keep the split pass.
    pub(crate) fn batch_frame_backend(
        &self,
        slots: usize,
    ) -> Result<Option<Box<dyn crate::fused::FrameBackend>>, RuntimeError> {
        self.frames(slots, None)
    }

    fn frames(
        &self,
        slots: usize,
        sampler: Option<&model::sampling::Sampler>,
    ) -> Result<Option<Box<dyn crate::fused::FrameBackend>>, RuntimeError> {
        match &self.compute {
            Compute::Cpu => {
                let _ = (slots, sampler);
                Ok(None)
            }
            #[cfg(feature = "gpu")]
            Compute::Gpu(g) => {
                crate::gpu_frame::open(&g.lm, &g.mimi()?, self.opts.kv_dtype, slots, sampler)
            }
        }
    }

    /// The codec of a driver with `slots` conversation slots (a session: one; every slot's streams
    /// allocated here, coded together).
    pub(crate) fn codec_backend(
        &self,
        workers: &Workers,
        slots: usize,
    ) -> Result<Box<dyn CodecBackend>, RuntimeError> {
        self.compute.codec_backend(&self.mimi, slots, workers)
    }
}
