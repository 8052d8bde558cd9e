//! The resident, immutable weight image shared by sessions, and the device the sessions compute on.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use kernels::{Pool, WeightFormat};
use model::lm::{CpuLm, KvDtype, LmBackend, LmModel, LmSpec};
use model::mimi::{CodecBackend, CpuMimi, Mimi};
use model::text::SentencePiece;
use model::{Bundled, LoadTimings, MoshiModel};

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
    /// together). The LM and Mimi weights are uploaded once, at [`Engine::open`] (the LM's straight
    /// from the checkpoint: the engine keeps no CPU copy of it).
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
        check_threads(self)?;
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
/// GPU's (weights uploaded here from `lm`, to a context of its own). For an LM driven alone (the
/// speech-to-text step, `trace lm`); an [`Engine`]'s sessions share the weights it loaded once.
pub fn lm_backend(
    device: Device,
    lm: &Arc<LmModel>,
    rows: usize,
    kv_dtype: KvDtype,
    pool: Arc<Pool>,
) -> Result<Box<dyn LmBackend>, RuntimeError> {
    Compute::open(device, lm.clone(), None, None)?.lm_backend(rows, kv_dtype, None, &Workers(pool))
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
    /// The CPU: the LM model (and the engine's [`Mimi`]), split over each driver's pool.
    Cpu(Arc<LmModel>),
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

/// The GPU context of `adapter`: `ctx` when the caller opened one, else a new one.
#[cfg(feature = "gpu")]
fn gpu_context(
    adapter: Option<usize>,
    ctx: Option<gpu::GpuContext>,
) -> Result<gpu::GpuContext, RuntimeError> {
    match ctx {
        Some(c) => Ok(c),
        None => Ok(gpu::GpuContext::new(
            gpu::AdapterChoice::Gpu(adapter),
            gpu::GpuOptions::default(),
        )?),
    }
}

impl Compute {
    /// Opens `device` for the CPU model `lm` and (when given) `mimi`: on a GPU, on the context `ctx`
    /// the caller opened or else on a new one for the device's adapter, uploading the weights once
    /// (the LM from `lm`'s matrices, which the caller keeps or drops).
    pub(crate) fn open(
        device: Device,
        lm: Arc<LmModel>,
        mimi: Option<&Arc<Mimi>>,
        ctx: Option<OpenedGpu>,
    ) -> Result<Compute, RuntimeError> {
        match device {
            Device::Cpu { .. } => Ok(Compute::Cpu(lm)),
            #[cfg(feature = "gpu")]
            Device::Gpu { adapter, .. } => {
                let ctx = gpu_context(adapter, ctx)?;
                let weights = gpu::GpuLmWeights::upload(&ctx, &lm)?;
                Compute::on_gpu(weights, mimi)
            }
            #[cfg(not(feature = "gpu"))]
            Device::Gpu { .. } => {
                let _ = (lm, mimi, ctx);
                Err(no_gpu_support())
            }
        }
    }

    /// The GPU of the LM weights `lm` (already on the device), with `mimi` uploaded to the same context.
    #[cfg(feature = "gpu")]
    fn on_gpu(
        lm: Arc<gpu::GpuLmWeights>,
        mimi: Option<&Arc<Mimi>>,
    ) -> Result<Compute, RuntimeError> {
        let mimi = match mimi {
            Some(m) => Some(gpu::GpuMimiWeights::upload(lm.context(), m.clone())?),
            None => None,
        };
        Ok(Compute::Gpu(Arc::new(GpuResident { lm, mimi })))
    }

    /// The adapter the model runs on, for logs (`None` on the CPU).
    fn adapter(&self) -> Option<String> {
        match self {
            Compute::Cpu(_) => None,
            #[cfg(feature = "gpu")]
            Compute::Gpu(g) => Some(g.lm.context().adapter().to_string()),
        }
    }

    /// The LM backend of `rows` rows, KV caches in `kv_dtype`; `kv_capacity` (CPU only) shortens the
    /// temporal KV caches below the model's context (see `CpuLm::with_kv_capacity`).
    pub(crate) fn lm_backend(
        &self,
        rows: usize,
        kv_dtype: KvDtype,
        kv_capacity: Option<usize>,
        workers: &Workers,
    ) -> Result<Box<dyn LmBackend>, RuntimeError> {
        match self {
            Compute::Cpu(lm) => {
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
            Compute::Cpu(_) => Ok(Box::new(CpuMimi::new(
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

/// The CPU LM of an engine and of the engines [`Engine::with_options`] makes from it (shared). A CPU
/// engine holds it from the start; a GPU engine opened from a bundle builds it from that bundle the
/// first time a CPU driver needs it ([`Engine::with_options`] to the CPU), and until then holds none.
struct CpuLmCell {
    model: Mutex<Option<Arc<LmModel>>>,
    /// The bundle to build it from; `None` when it was given, or cannot be built (device weights given).
    bundle: Option<PathBuf>,
}

impl CpuLmCell {
    fn held(lm: Arc<LmModel>) -> Arc<CpuLmCell> {
        Arc::new(CpuLmCell {
            model: Mutex::new(Some(lm)),
            bundle: None,
        })
    }

    #[cfg_attr(not(feature = "gpu"), allow(dead_code))]
    fn lazy(bundle: Option<PathBuf>) -> Arc<CpuLmCell> {
        Arc::new(CpuLmCell {
            model: Mutex::new(None),
            bundle,
        })
    }

    fn get(&self) -> Option<Arc<LmModel>> {
        self.model.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The model, built now from the bundle (on every physical core) when it is not held yet.
    fn get_or_build(&self) -> Result<Arc<LmModel>, RuntimeError> {
        let mut held = self.model.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(lm) = held.as_ref() {
            return Ok(lm.clone());
        }
        let Some(dir) = &self.bundle else {
            return Err(RuntimeError::InvalidOption(
                "this GPU engine was built from device weights and holds no CPU LM: open the \
                 bundle with Device::Cpu for CPU sessions"
                    .into(),
            ));
        };
        let pool = Pool::new(physical_cores());
        let m = Bundled::open_with(dir, pool.n_threads(), |weights, spec| {
            Ok::<_, model::LoadError>(LmModel::from_source_on(weights, spec, &pool)?)
        })?;
        tracing::info!(
            "the CPU copy of the LM was built from {} for a CPU driver of a GPU engine",
            dir.display()
        );
        Ok(held.insert(Arc::new(m.lm)).clone())
    }
}

/// The resident weight image: LM, Mimi and (optionally) the SentencePiece tokenizer of one bundle.
///
/// Opened once, immutable, shared by any number of sessions through `Arc`. It owns no threads: every
/// [`crate::Session`] (and every [`crate::BatchRunner`]) gets its own worker pool from
/// [`EngineOptions::device`], so concurrent sessions never contend on a pool.
///
/// The LM's weights live where the device reads them: on the CPU, an [`LmModel`] in the kernels'
/// layouts; on a GPU opened from a bundle ([`Engine::open`]), device buffers packed from the checkpoint
/// (`gpu::GpuLmWeights::from_source`) with no CPU copy of the LM in memory ([`Engine::cpu_lm`] is `None`
/// until a CPU driver asks for one). Mimi is held on the host in both cases.
pub struct Engine {
    spec: LmSpec,
    mimi: Arc<Mimi>,
    tokenizer: Option<Arc<SentencePiece>>,
    opts: EngineOptions,
    /// The device the sessions compute on, opened from `opts.device`.
    compute: Compute,
    /// The format of the LM's matrices (the first temporal layer's; see `LmModel::weight_format`).
    format: WeightFormat,
    cpu_lm: Arc<CpuLmCell>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("lm", self.lm_spec())
            .field("mimi_codebooks", &self.mimi.n_codebooks())
            .field("tokenizer", &self.tokenizer.is_some())
            .field("opts", &self.opts)
            .finish()
    }
}

/// Checks the LM's sizes against what the runtime drives (8 generated and 8 user codebooks).
fn check_lm(spec: &LmSpec) -> Result<(), RuntimeError> {
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
    Ok(())
}

/// Checks Mimi against the LM of `spec` and the runtime's frame size.
fn check_mimi(spec: &LmSpec, mimi: &Mimi) -> Result<(), RuntimeError> {
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
    Ok(())
}

impl Engine {
    /// Open a bundle directory (`config.json` + LM weights + Mimi weights + SentencePiece model; see
    /// `model::checkpoint::Bundle`) and build the three components ([`MoshiModel::open`]; on a GPU the
    /// LM's weights go from the checkpoint to the device, see [`Engine`]).
    pub fn open(bundle_dir: &Path, opts: EngineOptions) -> Result<Arc<Engine>, RuntimeError> {
        Ok(Engine::open_timed(bundle_dir, opts)?.0)
    }

    /// [`Engine::open`], also returning where the load's time went. On the CPU the LM's matrices are
    /// built on one thread per physical core ([`physical_cores`]; a pool that lives for the load only),
    /// whatever thread count the sessions will use; on a GPU each matrix is read from the checkpoint and
    /// uploaded in turn (the device is opened first, so a missing adapter is named before any weight is
    /// read).
    pub fn open_timed(
        bundle_dir: &Path,
        opts: EngineOptions,
    ) -> Result<(Arc<Engine>, LoadTimings), RuntimeError> {
        check_threads(&opts.device)?;
        #[cfg(feature = "gpu")]
        if let Device::Gpu { adapter, .. } = opts.device {
            let ctx = gpu_context(adapter, None)?;
            let m = Bundled::open_with(bundle_dir, 1, |weights, spec| {
                check_lm(&spec)?;
                Ok::<_, RuntimeError>(gpu::GpuLmWeights::from_source(&ctx, weights, spec)?)
            })?;
            let lm = Loaded::Gpu {
                format: m.lm.format(),
                weights: m.lm,
                bundle: Some(bundle_dir.to_path_buf()),
            };
            let engine = Engine::assemble(lm, Arc::new(m.mimi), Some(Arc::new(m.tokenizer)), opts)?;
            return Ok((engine, m.timings));
        }
        let m = MoshiModel::open_on(bundle_dir, &Pool::new(physical_cores()))?;
        let timings = m.timings;
        let engine = Engine::from_parts(m.lm, Arc::new(m.mimi), Some(Arc::new(m.tokenizer)), opts)?;
        Ok((engine, timings))
    }

    /// Build an engine from already-loaded components (tests, custom loaders). The engine keeps `lm`
    /// (on a GPU too, after uploading it: its CPU drivers use it).
    pub fn from_parts(
        lm: LmModel,
        mimi: Arc<Mimi>,
        tokenizer: Option<Arc<SentencePiece>>,
        opts: EngineOptions,
    ) -> Result<Arc<Engine>, RuntimeError> {
        Engine::assemble(Loaded::Cpu(Box::new(lm), None), mimi, tokenizer, opts)
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
        Engine::gpu_only(&opts, "from_parts_on")?;
        Engine::assemble(Loaded::Cpu(Box::new(lm), Some(ctx)), mimi, tokenizer, opts)
    }

    /// An engine over LM weights already on a GPU (`gpu::GpuLmWeights::from_source`: a checkpoint or
    /// synthetic weights packed for the device, no CPU LM built), on their context; `mimi` is uploaded
    /// there. `format`: the format of the LM's matrices, for reports. `opts.device` must be
    /// [`Device::Gpu`]. The engine holds no CPU LM and cannot make one ([`Engine::with_options`] to the
    /// CPU is refused).
    #[cfg(feature = "gpu")]
    pub fn from_device_weights(
        lm: Arc<gpu::GpuLmWeights>,
        format: WeightFormat,
        mimi: Arc<Mimi>,
        tokenizer: Option<Arc<SentencePiece>>,
        opts: EngineOptions,
    ) -> Result<Arc<Engine>, RuntimeError> {
        Engine::gpu_only(&opts, "from_device_weights")?;
        let lm = Loaded::Gpu {
            weights: lm,
            format,
            bundle: None,
        };
        Engine::assemble(lm, mimi, tokenizer, opts)
    }

    /// Refuses options that do not name the GPU, for the constructors that take GPU state.
    #[cfg(feature = "gpu")]
    fn gpu_only(opts: &EngineOptions, what: &str) -> Result<(), RuntimeError> {
        if matches!(opts.device, Device::Gpu { .. }) {
            return Ok(());
        }
        Err(RuntimeError::InvalidOption(format!(
            "Engine::{what} takes GPU state: opts.device must be Device::Gpu"
        )))
    }

    fn assemble(
        lm: Loaded,
        mimi: Arc<Mimi>,
        tokenizer: Option<Arc<SentencePiece>>,
        opts: EngineOptions,
    ) -> Result<Arc<Engine>, RuntimeError> {
        check_threads(&opts.device)?;
        let (spec, compute, format, cpu_lm) = match lm {
            Loaded::Cpu(lm, ctx) => {
                let spec = lm.spec().clone();
                check_lm(&spec)?;
                check_mimi(&spec, &mimi)?;
                let format = lm.weight_format();
                let lm = Arc::new(*lm);
                let compute = Compute::open(opts.device, lm.clone(), Some(&mimi), ctx)?;
                (spec, compute, format, CpuLmCell::held(lm))
            }
            #[cfg(feature = "gpu")]
            Loaded::Gpu {
                weights,
                format,
                bundle,
            } => {
                let spec = weights.spec().clone();
                check_lm(&spec)?;
                check_mimi(&spec, &mimi)?;
                let compute = Compute::on_gpu(weights, Some(&mimi))?;
                (spec, compute, format, CpuLmCell::lazy(bundle))
            }
        };
        Ok(Arc::new(Engine {
            spec,
            mimi,
            tokenizer,
            opts,
            compute,
            format,
            cpu_lm,
        }))
    }

    /// The same resident components with other options (another thread count, say): nothing is copied
    /// or reloaded, the new engine shares the weights with this one. An engine opened for the CPU cannot
    /// be moved to the GPU this way. A GPU engine can be moved to the CPU: one that holds no CPU LM
    /// ([`Engine::cpu_lm`]) builds it here from its bundle (a full load of the LM, kept from then on and
    /// shared with the engines made from this one), and one built from device weights alone refuses
    /// ([`RuntimeError::InvalidOption`]).
    pub fn with_options(&self, opts: EngineOptions) -> Result<Arc<Engine>, RuntimeError> {
        check_threads(&opts.device)?;
        let compute = match (opts.device, &self.compute) {
            (Device::Cpu { .. }, _) => Compute::Cpu(self.cpu_lm.get_or_build()?),
            #[cfg(feature = "gpu")]
            (Device::Gpu { .. }, Compute::Gpu(_)) => self.compute.clone(),
            _ => {
                return Err(RuntimeError::InvalidOption(
                    "with_options cannot move an engine to the GPU: open it with Device::Gpu"
                        .into(),
                ))
            }
        };
        Ok(Arc::new(Engine {
            spec: self.spec.clone(),
            mimi: self.mimi.clone(),
            tokenizer: self.tokenizer.clone(),
            opts,
            compute,
            format: self.format,
            cpu_lm: self.cpu_lm.clone(),
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

    /// The LM's sizes.
    pub fn lm_spec(&self) -> &LmSpec {
        &self.spec
    }

    /// The format of the LM's matrices (of its first temporal layer, as `LmModel::weight_format`).
    pub fn weight_format(&self) -> WeightFormat {
        self.format
    }

    /// The CPU LM, when this engine holds one: always on the CPU; on a GPU only when it was given
    /// ([`Engine::from_parts`]) or built for a CPU driver ([`Engine::with_options`]). A GPU engine opened
    /// from a bundle holds none.
    pub fn cpu_lm(&self) -> Option<Arc<LmModel>> {
        self.cpu_lm.get()
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
            .lm_backend(rows, self.opts.kv_dtype, kv_capacity, workers)
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
            Compute::Cpu(_) => {
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

/// What [`Engine::assemble`] builds the engine's LM from.
enum Loaded {
    /// A CPU model (kept), and the GPU context the caller opened, if any.
    Cpu(Box<LmModel>, Option<OpenedGpu>),
    /// LM weights on a GPU already, the format of their matrices, and the bundle a CPU copy would be
    /// built from.
    #[cfg(feature = "gpu")]
    Gpu {
        weights: Arc<gpu::GpuLmWeights>,
        format: WeightFormat,
        bundle: Option<PathBuf>,
    },
}

/// A thread count of 0 is refused.
fn check_threads(device: &Device) -> Result<(), RuntimeError> {
    if device.threads() == 0 {
        return Err(RuntimeError::InvalidOption("threads must be >= 1".into()));
    }
    Ok(())
}
