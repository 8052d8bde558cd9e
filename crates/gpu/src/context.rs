//! Adapter discovery and choice, the device, the compiled kernels and the buffer-creation counter.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use wgpu::util::DeviceExt;

use crate::bindings::Access;
use crate::profile::{ProfileReport, Profiler};
use crate::shaders::Module;
use crate::GpuError;

/// One adapter as wgpu reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterDesc {
    /// Index in [`adapters`]' list (what `--gpu N` takes).
    pub index: usize,
    /// Adapter name (e.g. "llvmpipe (LLVM 15.0.6, 256 bits)").
    pub name: String,
    /// Graphics API (Vulkan, Metal, Dx12).
    pub backend: String,
    /// Discrete, integrated, virtual, CPU or other.
    pub device_type: wgpu::DeviceType,
    /// Driver name and version.
    pub driver: String,
}

impl AdapterDesc {
    /// A real GPU (`auto` takes only these).
    pub fn is_hardware_gpu(&self) -> bool {
        matches!(
            self.device_type,
            wgpu::DeviceType::DiscreteGpu | wgpu::DeviceType::IntegratedGpu
        )
    }
}

impl std::fmt::Display for AdapterDesc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "#{} {} ({:?}, {}, {})",
            self.index, self.name, self.device_type, self.backend, self.driver
        )
    }
}

/// The process's one wgpu instance, created on first use. One instance for every context: wgpu
/// identifies a resource (its `Eq` and `Hash`) by an id unique within its instance only, and the
/// profiler maps pipelines of several contexts to their profilers by that identity.
fn instance() -> wgpu::Instance {
    static INSTANCE: std::sync::OnceLock<wgpu::Instance> = std::sync::OnceLock::new();
    INSTANCE
        .get_or_init(|| {
            let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
            desc.backends = wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12;
            wgpu::Instance::new(desc)
        })
        .clone()
}

fn describe(index: usize, a: &wgpu::Adapter) -> AdapterDesc {
    let i = a.get_info();
    AdapterDesc {
        index,
        name: i.name,
        backend: format!("{:?}", i.backend),
        device_type: i.device_type,
        driver: format!("{} {}", i.driver, i.driver_info).trim().to_string(),
    }
}

fn enumerate() -> (wgpu::Instance, Vec<wgpu::Adapter>) {
    let inst = instance();
    let list =
        pollster::block_on(inst.enumerate_adapters(
            wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12,
        ));
    (inst, list)
}

/// Every adapter wgpu finds (Vulkan, Metal, DX12), in a stable order.
pub fn adapters() -> Vec<AdapterDesc> {
    let (_inst, list) = enumerate();
    list.iter()
        .enumerate()
        .map(|(i, a)| describe(i, a))
        .collect()
}

/// Which adapter to run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdapterChoice {
    /// A discrete GPU, else an integrated one, else none (the caller uses the CPU). Software
    /// adapters (lavapipe, WARP, SwiftShader: type CPU) are never taken: they are slower than the
    /// CPU backend.
    Auto,
    /// The GPU: adapter `i` of [`adapters`], or with `None` the best one of any type (discrete,
    /// integrated, virtual, then software).
    Gpu(Option<usize>),
}

fn rank(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Cpu => 3,
        wgpu::DeviceType::Other => 4,
    }
}

/// The index of the adapter `choice` selects among `list`; `Ok(None)` when `Auto` finds no
/// hardware GPU (use the CPU).
pub fn choose_adapter(
    list: &[AdapterDesc],
    choice: AdapterChoice,
) -> Result<Option<usize>, GpuError> {
    let best = |ok: &dyn Fn(&AdapterDesc) -> bool| {
        list.iter()
            .filter(|a| ok(a))
            .min_by_key(|a| (rank(a.device_type), a.index))
            .map(|a| a.index)
    };
    match choice {
        AdapterChoice::Auto => Ok(best(&|a| a.is_hardware_gpu())),
        AdapterChoice::Gpu(None) => best(&|_| true).map(Some).ok_or(GpuError::NoAdapter {
            reason: "wgpu found no Vulkan, Metal or DX12 adapter".into(),
            hint: "install the GPU's Vulkan driver (on Linux without a GPU: mesa-vulkan-drivers and libvulkan1 give lavapipe), or use --device cpu",
        }),
        AdapterChoice::Gpu(Some(i)) if i < list.len() => Ok(Some(i)),
        AdapterChoice::Gpu(Some(i)) => Err(GpuError::NoAdapter {
            reason: format!("adapter {i} requested, {} found", list.len()),
            hint: "`moshi-native devices` lists the adapters and their numbers",
        }),
    }
}

/// Options of [`GpuContext::new`].
#[derive(Debug, Clone, Copy, Default)]
pub struct GpuOptions {
    /// Largest buffer binding the backend uses, in bytes (`None`: the device's limit). Weights
    /// larger than this are split by rows across several bindings; tests set it small to
    /// exercise the split.
    pub max_binding_bytes: Option<u64>,
    /// Device memory the backend may use, in bytes (`None`: unknown, only the device's own
    /// allocation failure stops a load). wgpu offers no portable query of free device memory.
    pub memory_budget: Option<u64>,
    /// Time every kernel launch on the device ([`crate::profile`]): requests the timestamp
    /// features when the adapter has them. Off, the launches cost nothing extra.
    pub profile: bool,
}

struct Inner {
    adapter: AdapterDesc,
    device: wgpu::Device,
    queue: wgpu::Queue,
    limits: wgpu::Limits,
    opts: GpuOptions,
    /// The device has subgroup operations and the matmul uses them (see [`GpuContext::subgroups`]).
    subgroups: std::sync::atomic::AtomicBool,
    pipelines: Mutex<HashMap<Module, Arc<wgpu::ComputePipeline>>>,
    layouts: Mutex<HashMap<&'static [Access], Arc<wgpu::BindGroupLayout>>>,
    buffers: AtomicU64,
    bind_groups: AtomicU64,
    allocated: AtomicU64,
    /// Command buffers submitted through [`GpuContext::submit`].
    submits: AtomicU64,
    /// Host waits on the device ([`GpuContext::wait`], [`GpuContext::wait_for`]).
    waits: AtomicU64,
    /// The profiler, when [`GpuOptions::profile`] asked for one.
    profiler: Option<Arc<Profiler>>,
}

/// One device and queue, the kernels compiled on it, and counters of what was created.
/// Cheap to clone (shared).
#[derive(Clone)]
pub struct GpuContext {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for GpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuContext")
            .field("adapter", &self.inner.adapter)
            .finish()
    }
}

impl GpuContext {
    /// Opens a device on the adapter `choice` selects. `Auto` finding no hardware GPU is an
    /// error here (callers that fall back to the CPU check [`choose_adapter`] first).
    pub fn new(choice: AdapterChoice, opts: GpuOptions) -> Result<GpuContext, GpuError> {
        let (_inst, list) = enumerate();
        let descs: Vec<AdapterDesc> = list
            .iter()
            .enumerate()
            .map(|(i, a)| describe(i, a))
            .collect();
        let idx = choose_adapter(&descs, choice)?.ok_or(GpuError::NoAdapter {
            reason: "no discrete or integrated GPU (software adapters are not taken by auto)"
                .into(),
            hint: "use --device gpu to run on a software adapter anyway, or --device cpu",
        })?;
        let adapter = &list[idx];
        let desc = descs[idx].clone();
        // The adapter's own limits: real GPUs bind far more than wgpu's portable defaults.
        let limits = adapter.limits();
        // Timestamps only when profiling: a feature requested is a feature the driver may have
        // to keep ready on every command buffer.
        let timestamps =
            wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        let timed = opts.profile && adapter.features().contains(timestamps);
        let mut features = wgpu::Features::empty();
        if timed {
            features |= timestamps;
        }
        // Subgroup shuffles speed up the matmul's reduction; requested only where offered.
        let subgroups = adapter.features() & wgpu::Features::SUBGROUP;
        features |= subgroups;
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("moshi"),
            required_features: features,
            required_limits: limits.clone(),
            ..Default::default()
        }))
        .map_err(|e| GpuError::Device {
            adapter: desc.name.clone(),
            message: e.to_string(),
        })?;
        tracing::info!(adapter = %desc, "GPU device opened");
        let profiler = opts.profile.then(|| Profiler::new(&device, &queue, timed));
        Ok(GpuContext {
            inner: Arc::new(Inner {
                adapter: desc,
                device,
                queue,
                limits,
                opts,
                subgroups: std::sync::atomic::AtomicBool::new(!subgroups.is_empty()),
                pipelines: Mutex::new(HashMap::new()),
                layouts: Mutex::new(HashMap::new()),
                buffers: AtomicU64::new(0),
                bind_groups: AtomicU64::new(0),
                allocated: AtomicU64::new(0),
                submits: AtomicU64::new(0),
                waits: AtomicU64::new(0),
                profiler,
            }),
        })
    }

    /// The adapter the device runs on.
    pub fn adapter(&self) -> &AdapterDesc {
        &self.inner.adapter
    }

    /// Whether the matmul kernels recorded from now on reduce with subgroup shuffles (the device
    /// has `wgpu::Features::SUBGROUP`). Either way the results are the same bits.
    pub fn subgroups(&self) -> bool {
        self.inner.subgroups.load(Ordering::Relaxed)
    }

    /// Turns the subgroup reduction off (`false`) for dispatches created after the call, or back
    /// on where the device has it (tests force the shared-memory fallback with it).
    pub fn set_subgroups(&self, on: bool) {
        let has = self.device().features().contains(wgpu::Features::SUBGROUP);
        self.inner.subgroups.store(on && has, Ordering::Relaxed);
    }

    /// Buffers created through this context so far (all at load / warm-up).
    pub fn buffers_created(&self) -> u64 {
        self.inner.buffers.load(Ordering::Relaxed)
    }

    /// Bind groups created through this context so far.
    pub fn bind_groups_created(&self) -> u64 {
        self.inner.bind_groups.load(Ordering::Relaxed)
    }

    /// Bytes of buffers allocated through this context.
    pub fn bytes_allocated(&self) -> u64 {
        self.inner.allocated.load(Ordering::Relaxed)
    }

    /// Command buffers submitted through this context so far (every submission of the backend's
    /// frames; the profiler's own resolve is not counted).
    pub fn submissions(&self) -> u64 {
        self.inner.submits.load(Ordering::Relaxed)
    }

    /// Host waits on the device through this context so far.
    pub fn waits(&self) -> u64 {
        self.inner.waits.load(Ordering::Relaxed)
    }

    /// Submits one command buffer (counted in [`GpuContext::submissions`]); the index is what
    /// [`GpuContext::wait_for`] waits on.
    pub(crate) fn submit(&self, cb: wgpu::CommandBuffer) -> wgpu::SubmissionIndex {
        self.inner.submits.fetch_add(1, Ordering::Relaxed);
        self.queue().submit([cb])
    }

    pub(crate) fn device(&self) -> &wgpu::Device {
        &self.inner.device
    }

    pub(crate) fn queue(&self) -> &wgpu::Queue {
        &self.inner.queue
    }

    /// Largest binding the backend uses (a multiple of 4).
    pub(crate) fn max_binding(&self) -> u64 {
        let dev = self
            .inner
            .limits
            .max_storage_buffer_binding_size
            .min(self.inner.limits.max_buffer_size);
        self.inner
            .opts
            .max_binding_bytes
            .map_or(dev, |m| m.min(dev))
            & !3
    }

    fn check_alloc(&self, what: &str, size: u64) -> Result<(), GpuError> {
        let max_buf = self.inner.limits.max_buffer_size;
        if size > max_buf {
            return Err(GpuError::DoesNotFit {
                what: what.to_string(),
                needed: size,
                available: max_buf,
            });
        }
        if let Some(budget) = self.inner.opts.memory_budget {
            let used = self.bytes_allocated();
            if used + size > budget {
                return Err(GpuError::DoesNotFit {
                    what: what.to_string(),
                    needed: used + size,
                    available: budget,
                });
            }
        }
        Ok(())
    }

    /// Checks that `needed` more bytes fit the memory budget (before a load starts).
    pub(crate) fn check_total(&self, what: &str, needed: u64) -> Result<(), GpuError> {
        if let Some(budget) = self.inner.opts.memory_budget {
            if needed > budget {
                return Err(GpuError::DoesNotFit {
                    what: what.to_string(),
                    needed,
                    available: budget,
                });
            }
        }
        Ok(())
    }

    fn count(&self, size: u64) {
        self.inner.buffers.fetch_add(1, Ordering::Relaxed);
        self.inner.allocated.fetch_add(size, Ordering::Relaxed);
    }

    /// A storage buffer holding `data` (padded to 4 bytes, at least 4).
    pub(crate) fn storage_init(&self, label: &str, data: &[u8]) -> Result<wgpu::Buffer, GpuError> {
        let mut padded;
        let bytes = if !data.len().is_multiple_of(4) || data.is_empty() {
            padded = data.to_vec();
            padded.resize(data.len().div_ceil(4).max(1) * 4, 0);
            &padded[..]
        } else {
            data
        };
        self.check_alloc(label, bytes.len() as u64)?;
        self.count(bytes.len() as u64);
        Ok(self
            .device()
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: bytes,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            }))
    }

    /// A zeroed buffer of `size` bytes (at least 4) with `usage`.
    pub(crate) fn buffer(
        &self,
        label: &str,
        size: u64,
        usage: wgpu::BufferUsages,
    ) -> Result<wgpu::Buffer, GpuError> {
        let size = size.max(4).div_ceil(4) * 4;
        self.check_alloc(label, size)?;
        self.count(size);
        Ok(self.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage,
            mapped_at_creation: false,
        }))
    }

    /// A uniform buffer holding `data`.
    pub(crate) fn uniform(&self, label: &str, data: &[u8]) -> wgpu::Buffer {
        self.count(data.len() as u64);
        self.device()
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: data,
                usage: wgpu::BufferUsages::UNIFORM,
            })
    }

    /// The bind group layout of a kernel binding buffers as `access` (one per access list).
    pub(crate) fn layout(&self, access: &'static [Access]) -> Arc<wgpu::BindGroupLayout> {
        let mut map = self.inner.layouts.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(access)
            .or_insert_with(|| {
                let entries: Vec<wgpu::BindGroupLayoutEntry> = access
                    .iter()
                    .enumerate()
                    .map(|(i, a)| wgpu::BindGroupLayoutEntry {
                        binding: i as u32,
                        visibility: wgpu::ShaderStages::COMPUTE,
                        ty: wgpu::BindingType::Buffer {
                            ty: match a {
                                Access::Uniform => wgpu::BufferBindingType::Uniform,
                                Access::Read => {
                                    wgpu::BufferBindingType::Storage { read_only: true }
                                }
                                Access::Write => {
                                    wgpu::BufferBindingType::Storage { read_only: false }
                                }
                            },
                            has_dynamic_offset: false,
                            min_binding_size: None,
                        },
                        count: None,
                    })
                    .collect();
                Arc::new(
                    self.device()
                        .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                            label: None,
                            entries: &entries,
                        }),
                )
            })
            .clone()
    }

    /// The compute pipeline of `module` (compiled once per context).
    pub(crate) fn pipeline(&self, module: Module) -> Arc<wgpu::ComputePipeline> {
        let mut map = self
            .inner
            .pipelines
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        map.entry(module)
            .or_insert_with(|| {
                let label = format!("{module:?}");
                Arc::new(self.compile(&label, module.access(), &module.source()))
            })
            .clone()
    }

    /// A compute pipeline of WGSL `source` (entry point `main`) over one bind group of the layout
    /// of `access`.
    pub(crate) fn compile(
        &self,
        label: &str,
        access: &'static [Access],
        source: &str,
    ) -> wgpu::ComputePipeline {
        let layout = self.layout(access);
        let device = self.device();
        // Runtime checks: bounds checks stay on, so a shader still cannot read or write outside
        // the buffers bound to it, whatever its indices. Two checks go: the loop counter wgpu
        // adds to every loop (`force_loop_bounding`) and the guard around every integer `/`
        // and `%` (`int_div_checks`). They sit inside our hottest serial loops (attention's key
        // loop, the matvec's column loop): on an H200 turning them off took the LM frame at
        // KV position 3000 from 139 to 68 ms and Mimi encode + decode from 49.7 to 35.5 ms.
        // wgpu 30's `ShaderRuntimeChecks` states what the caller must then guarantee, and our
        // WGSL does, by construction:
        // * no infinite loop (else the driver's compiler may treat it as unreachable): every
        //   loop is a `for` whose bound is a constant (the workgroup reductions) or a count
        //   read from a uniform that the host wrote from the model's shapes (columns, keys,
        //   channels, taps); no loop waits on a value another invocation writes.
        // * no integer division by zero and no signed `INT_MIN / -1`: every divisor is a
        //   constant or a shape from a uniform (columns, group size, context length, output
        //   length, heads), all non-zero once a model is loaded; the only signed `%` divides
        //   by the constant 4. (The Mimi kernels divide a flat index by an output shape only
        //   after checking the index against the total, so a zero shape never divides.) wgpu
        //   makes non-zero divisors the caller's obligation rather than promising a value; the
        //   bounds checks kept above still confine any index computed from such a value to
        //   the bound buffers.
        // SAFETY: the two guarantees above hold for every module this crate compiles (all of
        // them come from `shaders`, `sample`, `probe` and `mimi`, none from outside input); a
        // kernel added or rewritten later must keep both.
        let checks = wgpu::ShaderRuntimeChecks {
            bounds_checks: true,
            force_loop_bounding: false,
            int_div_checks: false,
            ..wgpu::ShaderRuntimeChecks::checked()
        };
        let shader = unsafe {
            device.create_shader_module_trusted(
                wgpu::ShaderModuleDescriptor {
                    label: Some(label),
                    source: wgpu::ShaderSource::Wgsl(source.into()),
                },
                checks,
            )
        };
        let pl = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: None,
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(label),
            layout: Some(&pl),
            module: &shader,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        if let Some(p) = &self.inner.profiler {
            p.register_pipeline(&pipeline, label);
        }
        pipeline
    }

    /// A bind group of `module`'s layout over `buffers` (binding `i` = `buffers[i]`, whole).
    pub(crate) fn bind(&self, module: Module, buffers: &[&wgpu::Buffer]) -> wgpu::BindGroup {
        let layout = self.layout(module.access());
        self.bind_layout(&layout, buffers)
    }

    /// A bind group of `layout` over `buffers` (binding `i` = `buffers[i]`, whole), counted in
    /// [`GpuContext::bind_groups_created`].
    pub(crate) fn bind_layout(
        &self,
        layout: &wgpu::BindGroupLayout,
        buffers: &[&wgpu::Buffer],
    ) -> wgpu::BindGroup {
        self.inner.bind_groups.fetch_add(1, Ordering::Relaxed);
        let entries: Vec<wgpu::BindGroupEntry> = buffers
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: b.as_entire_binding(),
            })
            .collect();
        let bind = self.device().create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout,
            entries: &entries,
        });
        if let Some(p) = &self.inner.profiler {
            let storage = buffers
                .iter()
                .filter(|b| b.usage().contains(wgpu::BufferUsages::STORAGE))
                .map(|b| b.size())
                .sum();
            p.set_bytes(&bind, storage);
        }
        bind
    }

    /// Waits for the queue's most recent submission (with one queue: everything submitted,
    /// whoever submitted it) and returns the first error the device reported since the last
    /// call. Callers that share the context with other drivers wait with
    /// [`GpuContext::wait_for`] instead.
    pub(crate) fn wait(&self) -> Result<(), GpuError> {
        self.poll(wgpu::PollType::wait_indefinitely())
    }

    /// Waits for submission `index` only: work other drivers submitted to the shared queue after
    /// it is not waited for (the one-submission frame, [`crate::GpuDuplex`]).
    pub(crate) fn wait_for(&self, index: wgpu::SubmissionIndex) -> Result<(), GpuError> {
        self.poll(wgpu::PollType::Wait {
            submission_index: Some(index),
            timeout: None,
        })
    }

    fn poll(&self, how: wgpu::PollType) -> Result<(), GpuError> {
        self.inner.waits.fetch_add(1, Ordering::Relaxed);
        let t0 = self.inner.profiler.as_ref().map(|p| p.wait_begins());
        let r = self
            .device()
            .poll(how)
            .map(|_| ())
            .map_err(|e| GpuError::Runtime(e.to_string()));
        if let (Some(p), Some(t0)) = (&self.inner.profiler, t0) {
            p.wait_ends(t0);
        }
        r
    }

    /// Whether this context profiles its launches ([`GpuOptions::profile`]).
    pub fn profiling(&self) -> bool {
        self.inner.profiler.is_some()
    }

    /// Ends a profiled frame: resolves the timestamps of every launch recorded since the last
    /// call (one resolve, one readback) and adds them to the report. Call it after the frame's
    /// last wait, outside the timed span. A no-op without profiling.
    pub fn profile_frame(&self) -> Result<(), GpuError> {
        match &self.inner.profiler {
            Some(p) => p.collect(self.device(), self.queue()),
            None => Ok(()),
        }
    }

    /// Clears the profile (after warm-up, or between cells of a bench).
    pub fn profile_reset(&self) {
        if let Some(p) = &self.inner.profiler {
            p.reset();
        }
    }

    /// What the profiler gathered since its last reset (`None` without profiling).
    pub fn profile_report(&self) -> Option<ProfileReport> {
        self.inner.profiler.as_ref().map(|p| p.report())
    }

    /// States the bytes a launch over `bind` moves, for the profile's `bytes` and `gbps` (by
    /// default: every storage buffer bound). A no-op without profiling.
    pub fn set_dispatch_bytes(&self, bind: &wgpu::BindGroup, bytes: u64) {
        if let Some(p) = &self.inner.profiler {
            p.set_bytes(bind, bytes);
        }
    }
}

/// Maps `rb`, copies its first `out.len()` f32 into `out`, unmaps.
pub(crate) fn read_mapped(
    ctx: &GpuContext,
    rb: &wgpu::Buffer,
    out: &mut [f32],
) -> Result<(), GpuError> {
    read_mapped_as(ctx, rb, out, f32::from_le_bytes)
}

/// Maps `rb`, decodes its first `out.len()` little-endian 4-byte words into `out` with `decode`
/// (`f32::from_le_bytes`, `u32::from_le_bytes`), unmaps.
pub(crate) fn read_mapped_as<T>(
    ctx: &GpuContext,
    rb: &wgpu::Buffer,
    out: &mut [T],
    decode: fn([u8; 4]) -> T,
) -> Result<(), GpuError> {
    let bytes = (out.len() * 4) as u64;
    let slice = rb.slice(..bytes.max(4));
    slice.map_async(wgpu::MapMode::Read, |_| {});
    ctx.wait()?;
    {
        let view = slice
            .get_mapped_range()
            .map_err(|e| GpuError::Runtime(format!("readback: {e:?}")))?;
        for (o, c) in out.iter_mut().zip(view.chunks_exact(4)) {
            *o = decode([c[0], c[1], c[2], c[3]]);
        }
    }
    rb.unmap();
    Ok(())
}
