//! The GPU profiler: device timestamps around every kernel launch, aggregated per kernel.
//!
//! Asked for with [`GpuOptions::profile`](crate::GpuOptions::profile). When the adapter has
//! `TIMESTAMP_QUERY` and `TIMESTAMP_QUERY_INSIDE_PASSES` (every Vulkan adapter wgpu 30 opens: it
//! reports the three timestamp features together), the context requests them and every launch
//! recorded through `Dispatch::record` or Mimi's `dispatch` is
//! bracketed by two timestamps written inside its compute pass. Without them (some Metal and DX12
//! adapters) the launches are still counted, with their workgroups and bytes, but untimed
//! ([`ProfileMode::CountsOnly`]): a pass-level timestamp needs the pass descriptor, which the
//! profiler does not own.
//!
//! How a launch finds its profiler without a change to any launch's constructor: the context
//! registers every pipeline it compiles (name = the pipeline's label) and every bind group it
//! creates (bytes = the storage buffers bound) in a process-wide map from pipeline to profiler.
//! With no profiler alive in the process, the hook is one relaxed atomic load and returns: no
//! buffer, lock or allocation per frame when profiling is off.
//!
//! A frame's timestamps are resolved once, by [`GpuContext::profile_frame`](crate::GpuContext):
//! one resolve into one buffer, one copy into one readback buffer (both created with the
//! context), one submission and one map. The host phases come from the same hooks: `record` is
//! the span from the first to the last launch recorded before a wait, `submit` from that last
//! launch to the start of the wait (finishing the encoder, copies, the submission, the map
//! request), `wait` the wait on the device itself.
//!
//! `bytes` of a launch is the size of every storage buffer bound to it: exact for a matrix
//! product (its weights and vectors are read whole), an upper bound for kernels that bind a
//! ring and touch a window of it (attention at an early KV position binds the whole ring).
//! Kernel owners can state the exact figure with
//! [`GpuContext::set_dispatch_bytes`](crate::GpuContext::set_dispatch_bytes).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use crate::GpuError;

/// Launches one frame may time before [`Profiler::collect`] (more are counted, untimed).
pub(crate) const MAX_TIMED: u32 = 8192;
/// Queries per query set (wgpu's limit).
const SET_QUERIES: u32 = wgpu::QUERY_SET_MAX_QUERIES;

/// Profilers alive in the process: the hooks return at once when there are none.
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// Pipeline → (its profiler, kernel name index), for every pipeline compiled by a profiling
/// context.
type Registry = HashMap<wgpu::ComputePipeline, (Weak<Profiler>, u32)>;
static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(|| Mutex::new(HashMap::new()));

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How the profiler measures the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProfileMode {
    /// Two timestamps inside the compute pass around every launch.
    PerDispatch,
    /// The adapter has no timestamps inside passes: launches are counted, not timed.
    CountsOnly,
}

impl ProfileMode {
    fn name(self) -> &'static str {
        match self {
            ProfileMode::PerDispatch => "per-dispatch",
            ProfileMode::CountsOnly => "counts-only",
        }
    }
}

/// One kernel at one launch grid, summed over the profiled frames.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelProfile {
    /// The kernel (its pipeline label, spaces as `_`: `Matmul(Q8_0)`, `mimi_Conv`).
    pub kernel: String,
    /// Workgroups per launch, x × y × z.
    pub grid: [u32; 3],
    /// Launches.
    pub calls: u64,
    /// Device time of those launches, ns (0 in [`ProfileMode::CountsOnly`]).
    pub ns: f64,
    /// Bytes of the storage bound to those launches (see the module docs).
    pub bytes: u64,
}

/// Host time per phase, summed over the profiled frames (module docs: what each covers).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct HostPhases {
    /// First to last launch recorded before each wait.
    pub record: Duration,
    /// Last launch recorded to the start of the wait.
    pub submit: Duration,
    /// Waiting on the device.
    pub wait: Duration,
}

/// What the profiler gathered since its last reset.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileReport {
    /// How the device was measured.
    pub mode: ProfileMode,
    /// Frames resolved ([`crate::GpuContext::profile_frame`] calls that found launches).
    pub frames: u64,
    /// Per kernel and grid, largest device time first.
    pub kernels: Vec<KernelProfile>,
    /// Host phases.
    pub host: HostPhases,
    /// Launches counted but not timed (beyond `MAX_TIMED` in one frame).
    pub untimed: u64,
}

impl ProfileReport {
    /// An empty report (to [`merge`](ProfileReport::merge) frames into).
    pub fn empty(mode: ProfileMode) -> ProfileReport {
        ProfileReport {
            mode,
            frames: 0,
            kernels: Vec::new(),
            host: HostPhases::default(),
            untimed: 0,
        }
    }

    /// Adds `other`'s frames, launches and host phases to this report.
    pub fn merge(&mut self, other: &ProfileReport) {
        self.frames += other.frames;
        self.untimed += other.untimed;
        self.host.record += other.host.record;
        self.host.submit += other.host.submit;
        self.host.wait += other.host.wait;
        for k in &other.kernels {
            match self
                .kernels
                .iter_mut()
                .find(|m| m.kernel == k.kernel && m.grid == k.grid)
            {
                Some(m) => {
                    m.calls += k.calls;
                    m.ns += k.ns;
                    m.bytes += k.bytes;
                }
                None => self.kernels.push(k.clone()),
            }
        }
        self.kernels.sort_by(|a, b| {
            b.ns.total_cmp(&a.ns)
                .then_with(|| a.kernel.cmp(&b.kernel))
                .then_with(|| a.grid.cmp(&b.grid))
        });
    }

    /// Launches per frame.
    pub fn calls_per_frame(&self) -> f64 {
        let calls: u64 = self.kernels.iter().map(|k| k.calls).sum();
        calls as f64 / self.frames.max(1) as f64
    }

    /// Device time per frame over all launches, µs.
    pub fn gpu_us_per_frame(&self) -> f64 {
        self.kernels.iter().map(|k| k.ns).sum::<f64>() / 1e3 / self.frames.max(1) as f64
    }

    /// The report as text lines, every figure per frame: one `profile frames=…` header, one
    /// `profile kernel=NAME shape=XxYxZ calls=N us=T bytes=B gbps=G` line per kernel and grid
    /// (`shape` = workgroups per launch; `gbps` = bytes ÷ device time), one
    /// `profile host phase=P us=T` line per host phase. `tag` (e.g. `what=lm pos=0`) goes after
    /// `profile` on every line, so lines of several cells can be told apart.
    pub fn lines(&self, tag: &str) -> Vec<String> {
        let f = self.frames.max(1) as f64;
        let tag = if tag.is_empty() {
            String::new()
        } else {
            format!(" {tag}")
        };
        let mut out = vec![format!(
            "profile{tag} frames={} mode={} calls={:.1} gpu_us={:.1} untimed={}",
            self.frames,
            self.mode.name(),
            self.calls_per_frame(),
            self.gpu_us_per_frame(),
            self.untimed,
        )];
        for k in &self.kernels {
            let us = k.ns / 1e3 / f;
            let bytes = k.bytes as f64 / f;
            let gbps = if k.ns > 0.0 {
                k.bytes as f64 / k.ns
            } else {
                0.0
            };
            out.push(format!(
                "profile{tag} kernel={} shape={}x{}x{} calls={} us={us:.1} bytes={bytes:.0} gbps={gbps:.1}",
                k.kernel,
                k.grid[0],
                k.grid[1],
                k.grid[2],
                fmt_calls(k.calls as f64 / f),
            ));
        }
        for (phase, d) in [
            ("record", self.host.record),
            ("submit", self.host.submit),
            ("wait", self.host.wait),
        ] {
            out.push(format!(
                "profile{tag} host phase={phase} us={:.1}",
                d.as_secs_f64() * 1e6 / f
            ));
        }
        out
    }
}

/// A count per frame: an integer when every frame launched the same, else one decimal.
fn fmt_calls(c: f64) -> String {
    if c.fract() == 0.0 {
        format!("{c:.0}")
    } else {
        format!("{c:.1}")
    }
}

/// One launch of the current frame.
#[derive(Debug, Clone, Copy)]
struct Pending {
    kernel: u32,
    grid: [u32; 3],
    bytes: u64,
    /// Its first query (the second follows), or none when untimed.
    query: Option<u32>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Total {
    calls: u64,
    ns: f64,
    bytes: u64,
}

struct State {
    names: Vec<String>,
    bytes: HashMap<wgpu::BindGroup, u64>,
    next_query: u32,
    pending: Vec<Pending>,
    totals: HashMap<(u32, [u32; 3]), Total>,
    frames: u64,
    untimed: u64,
    /// First and last launch recorded since the last wait.
    segment: Option<(Instant, Instant)>,
    host: HostPhases,
}

/// The profiler of one context (created with it when profiling is asked for).
pub(crate) struct Profiler {
    mode: ProfileMode,
    sets: Vec<wgpu::QuerySet>,
    resolve: Option<wgpu::Buffer>,
    readback: Option<wgpu::Buffer>,
    /// Nanoseconds per timestamp tick.
    period: f64,
    state: Mutex<State>,
    /// Pipelines this profiler registered (removed from the registry when it drops).
    pipelines: Mutex<Vec<wgpu::ComputePipeline>>,
}

impl Profiler {
    /// A profiler on `device`; `timed` when the device has the timestamp features.
    pub(crate) fn new(device: &wgpu::Device, queue: &wgpu::Queue, timed: bool) -> Arc<Profiler> {
        let (sets, resolve, readback) = if timed {
            let n_sets = (2 * MAX_TIMED).div_ceil(SET_QUERIES);
            let sets = (0..n_sets)
                .map(|_| {
                    device.create_query_set(&wgpu::QuerySetDescriptor {
                        label: Some("profile"),
                        ty: wgpu::QueryType::Timestamp,
                        count: SET_QUERIES,
                    })
                })
                .collect();
            let size = u64::from(n_sets * SET_QUERIES) * 8;
            let buf = |label, usage| {
                device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(label),
                    size,
                    usage,
                    mapped_at_creation: false,
                })
            };
            (
                sets,
                Some(buf(
                    "profile resolve",
                    wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                )),
                Some(buf(
                    "profile readback",
                    wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                )),
            )
        } else {
            (Vec::new(), None, None)
        };
        LIVE.fetch_add(1, Ordering::SeqCst);
        Arc::new(Profiler {
            mode: if timed {
                ProfileMode::PerDispatch
            } else {
                ProfileMode::CountsOnly
            },
            sets,
            resolve,
            readback,
            period: f64::from(queue.get_timestamp_period()),
            state: Mutex::new(State {
                names: Vec::new(),
                bytes: HashMap::new(),
                next_query: 0,
                pending: Vec::with_capacity(MAX_TIMED as usize),
                totals: HashMap::new(),
                frames: 0,
                untimed: 0,
                segment: None,
                host: HostPhases::default(),
            }),
            pipelines: Mutex::new(Vec::new()),
        })
    }

    /// Names `pipeline` `label` and routes its launches to this profiler.
    pub(crate) fn register_pipeline(
        self: &Arc<Self>,
        pipeline: &wgpu::ComputePipeline,
        label: &str,
    ) {
        let name = label.replace(' ', "_");
        let idx = {
            let mut st = lock(&self.state);
            match st.names.iter().position(|n| *n == name) {
                Some(i) => i,
                None => {
                    st.names.push(name);
                    st.names.len() - 1
                }
            }
        } as u32;
        lock(&REGISTRY).insert(pipeline.clone(), (Arc::downgrade(self), idx));
        lock(&self.pipelines).push(pipeline.clone());
    }

    /// Sets the bytes a launch over `bind` counts.
    pub(crate) fn set_bytes(&self, bind: &wgpu::BindGroup, bytes: u64) {
        lock(&self.state).bytes.insert(bind.clone(), bytes);
    }

    /// Closes the host segment of the launches recorded since the last wait; returns when the
    /// wait starts.
    pub(crate) fn wait_begins(&self) -> Instant {
        let now = Instant::now();
        let mut st = lock(&self.state);
        if let Some((first, last)) = st.segment.take() {
            st.host.record += last - first;
            st.host.submit += now - last;
        }
        now
    }

    /// Adds a wait that began at `t0`.
    pub(crate) fn wait_ends(&self, t0: Instant) {
        lock(&self.state).host.wait += t0.elapsed();
    }

    /// Resolves the timestamps of the launches since the last call (one resolve, one copy, one
    /// submission, one map) and adds them to the totals.
    pub(crate) fn collect(
        &self,
        device: &wgpu::Device,
        queue: &wgpu::Queue,
    ) -> Result<(), GpuError> {
        let mut st = lock(&self.state);
        if st.pending.is_empty() {
            return Ok(());
        }
        let n = st.next_query;
        if let (Some(resolve), Some(readback), true) = (&self.resolve, &self.readback, n > 0) {
            let mut enc =
                device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
            for (s, set) in self.sets.iter().enumerate() {
                let first = s as u32 * SET_QUERIES;
                if first >= n {
                    break;
                }
                let count = (n - first).min(SET_QUERIES);
                enc.resolve_query_set(set, 0..count, resolve, u64::from(first) * 8);
            }
            let len = u64::from(n) * 8;
            enc.copy_buffer_to_buffer(resolve, 0, readback, 0, len);
            let index = queue.submit([enc.finish()]);
            let slice = readback.slice(..len);
            slice.map_async(wgpu::MapMode::Read, |_| {});
            device
                .poll(wgpu::PollType::Wait {
                    submission_index: Some(index),
                    timeout: None,
                })
                .map_err(|e| GpuError::Runtime(e.to_string()))?;
            {
                let view = slice
                    .get_mapped_range()
                    .map_err(|e| GpuError::Runtime(format!("profile readback: {e:?}")))?;
                let tick = |q: u32| {
                    let o = q as usize * 8;
                    u64::from_le_bytes(view[o..o + 8].try_into().unwrap_or([0; 8]))
                };
                let State {
                    pending, totals, ..
                } = &mut *st;
                for p in pending.iter() {
                    let t = totals.entry((p.kernel, p.grid)).or_default();
                    if let Some(q) = p.query {
                        // A later timestamp can read lower on some drivers when the two land on
                        // different engines' clocks: count it as zero rather than wrap.
                        t.ns += tick(q + 1).saturating_sub(tick(q)) as f64 * self.period;
                    }
                }
            }
            readback.unmap();
        }
        let State {
            pending,
            totals,
            frames,
            next_query,
            ..
        } = &mut *st;
        for p in pending.iter() {
            let t = totals.entry((p.kernel, p.grid)).or_default();
            t.calls += 1;
            t.bytes += p.bytes;
        }
        pending.clear();
        *next_query = 0;
        *frames += 1;
        Ok(())
    }

    /// Clears the totals and host phases (e.g. after warm-up); launches not yet collected are
    /// dropped.
    pub(crate) fn reset(&self) {
        let mut st = lock(&self.state);
        st.pending.clear();
        st.next_query = 0;
        st.totals.clear();
        st.frames = 0;
        st.untimed = 0;
        st.segment = None;
        st.host = HostPhases::default();
    }

    /// The totals since the last reset.
    pub(crate) fn report(&self) -> ProfileReport {
        let st = lock(&self.state);
        let mut kernels: Vec<KernelProfile> = st
            .totals
            .iter()
            .map(|(&(k, grid), t)| KernelProfile {
                kernel: st.names[k as usize].clone(),
                grid,
                calls: t.calls,
                ns: t.ns,
                bytes: t.bytes,
            })
            .collect();
        kernels.sort_by(|a, b| {
            b.ns.total_cmp(&a.ns)
                .then_with(|| a.kernel.cmp(&b.kernel))
                .then_with(|| a.grid.cmp(&b.grid))
        });
        ProfileReport {
            mode: self.mode,
            frames: st.frames,
            kernels,
            host: st.host,
            untimed: st.untimed,
        }
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        let mine = std::mem::take(&mut *lock(&self.pipelines));
        let mut reg = lock(&REGISTRY);
        for p in &mine {
            reg.remove(p);
        }
        drop(reg);
        LIVE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A launch being timed: its second query.
pub(crate) struct Mark {
    profiler: Arc<Profiler>,
    query: u32,
}

/// Called by every launch right before its `dispatch_workgroups`: with a profiler alive for
/// `pipeline`, counts the launch and writes its first timestamp. Returns at once (one atomic
/// load) when no profiler is alive in the process.
#[inline]
pub(crate) fn before(
    pass: &mut wgpu::ComputePass<'_>,
    pipeline: &wgpu::ComputePipeline,
    bind: &wgpu::BindGroup,
    grid: [u32; 3],
) -> Option<Mark> {
    if LIVE.load(Ordering::Relaxed) == 0 {
        return None;
    }
    before_slow(pass, pipeline, bind, grid)
}

#[cold]
fn before_slow(
    pass: &mut wgpu::ComputePass<'_>,
    pipeline: &wgpu::ComputePipeline,
    bind: &wgpu::BindGroup,
    grid: [u32; 3],
) -> Option<Mark> {
    let (weak, kernel) = lock(&REGISTRY).get(pipeline).cloned()?;
    let profiler = weak.upgrade()?;
    let query = {
        let mut st = lock(&profiler.state);
        let now = Instant::now();
        st.segment = Some(match st.segment {
            Some((first, _)) => (first, now),
            None => (now, now),
        });
        let bytes = st.bytes.get(bind).copied().unwrap_or(0);
        let query = (profiler.mode == ProfileMode::PerDispatch
            && st.next_query + 2 <= 2 * MAX_TIMED)
            .then_some(st.next_query);
        match query {
            Some(q) => st.next_query = q + 2,
            None if profiler.mode == ProfileMode::PerDispatch => st.untimed += 1,
            None => {}
        }
        st.pending.push(Pending {
            kernel,
            grid,
            bytes,
            query,
        });
        query?
    };
    pass.write_timestamp(
        &profiler.sets[(query / SET_QUERIES) as usize],
        query % SET_QUERIES,
    );
    Some(Mark {
        profiler,
        query: query + 1,
    })
}

/// Called right after the launch's `dispatch_workgroups` with what [`before`] returned.
#[inline]
pub(crate) fn after(pass: &mut wgpu::ComputePass<'_>, mark: Option<Mark>) {
    if let Some(m) = mark {
        pass.write_timestamp(
            &m.profiler.sets[(m.query / SET_QUERIES) as usize],
            m.query % SET_QUERIES,
        );
    }
}
