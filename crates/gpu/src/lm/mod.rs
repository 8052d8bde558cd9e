//! The LM on the device: [`GpuLmWeights`] (every weight, uploaded once per engine) and [`GpuLm`]
//! (one batch's KV rings, work buffers and recorded dispatches; an
//! [`LmBackend`](model::lm::LmBackend)). The files, by job: this one (upload, buffers),
//! `record` (the model's [`LmPlan`] recorded as launches: the layer sequence is not restated
//! here), `embed` (the input embeddings' arena and their one-launch sum), `stepping` (the
//! steps), `attention` (one attention layer alone, for tests).

use std::sync::Arc;

use kernels::{CheckpointParts, WeightFormat};
use model::lm::{KvDtype, LmModel, LmPlan, LmSpec, LmTensors, MatrixRef, TensorSource};

use crate::context::GpuContext;
use crate::dispatch::{Dispatch, Grid};
use crate::matrix::{f32_bytes, GpuMatrix};
use crate::sample::SampleStage;
use crate::shaders::{step, Module, MAX_ROWS};
use crate::uniforms::Misc;
use crate::GpuError;
use embed::Arena;
use record::{Recorded, Shared, StackBufs};

/// Every LM weight in device memory, in its checkpoint format; shared (behind an `Arc`) by the
/// backends of one engine. Built from the model's weight table ([`LmTensors::table`]): matrices as
/// [`GpuMatrix`] (the temporal input embedding tables as rows of one arena, `embed.rs`), RMS-norm
/// weights as offsets into one buffer.
#[derive(Debug)]
pub struct GpuLmWeights {
    ctx: GpuContext,
    spec: LmSpec,
    w: LmTensors<GpuMatrix, usize>,
    /// Every RMS-norm weight, concatenated (offsets in `w`).
    norms: wgpu::Buffer,
}

/// One matrix to upload: its table entry and its checkpoint bytes.
struct Upload<'a> {
    entry: &'a MatrixRef,
    format: WeightFormat,
    parts: CheckpointParts,
}

impl GpuLmWeights {
    /// Uploads every weight of the table of `spec` read from `src` (a checkpoint, synthetic weights,
    /// a test's source), each matrix in its checkpoint layout
    /// ([`TensorSource::checkpoint_parts`]: from a checkpoint's bytes directly, no CPU matrix built)
    /// and uploaded before the next is read, so the host holds one matrix at a time. Refuses, with a
    /// typed error, a tensor the source cannot give, a format the kernels do not read or a model
    /// that does not fit (checked against the memory budget before each matrix is allocated).
    pub fn from_source<S: TensorSource + ?Sized>(
        ctx: &GpuContext,
        src: &S,
        spec: LmSpec,
    ) -> Result<Arc<GpuLmWeights>, GpuError> {
        let table = LmTensors::table(&spec);
        Self::build(
            ctx,
            spec,
            &table,
            |entry| {
                let (format, parts) = src.checkpoint_parts(entry)?;
                Ok(Upload {
                    entry,
                    format,
                    parts,
                })
            },
            |v| Ok(src.vector(&v.name, v.len)?),
        )
    }

    /// Uploads the weights of a CPU model already in memory (tests and tools that hold one; the
    /// engine loads from the checkpoint with [`GpuLmWeights::from_source`]). Each matrix is
    /// un-packed from the CPU's layout ([`kernels::Matrix::checkpoint_parts`]).
    pub fn upload(ctx: &GpuContext, model: &LmModel) -> Result<Arc<GpuLmWeights>, GpuError> {
        let spec = model.spec().clone();
        let table = LmTensors::table(&spec);
        let pairs = table
            .zip(model.tensors())
            .ok_or_else(|| GpuError::Unsupported {
                format: "an LM model".into(),
                why: "its tensors do not match the weight table of its spec".into(),
            })?;
        Self::build(
            ctx,
            spec.clone(),
            &pairs,
            |&(entry, m)| {
                Ok(Upload {
                    entry,
                    format: m.format(),
                    parts: m.checkpoint_parts(),
                })
            },
            |&(_, v)| Ok(v.clone()),
        )
    }

    /// The upload of every matrix `parts` gives and every vector `vector` gives, in the table's
    /// load order, inside an out-of-memory scope.
    fn build<'a, M, V>(
        ctx: &GpuContext,
        spec: LmSpec,
        t: &'a LmTensors<M, V>,
        mut parts: impl FnMut(&'a M) -> Result<Upload<'a>, GpuError>,
        mut vector: impl FnMut(&'a V) -> Result<Vec<f32>, GpuError>,
    ) -> Result<Arc<GpuLmWeights>, GpuError> {
        let scope = ctx
            .device()
            .push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let before = ctx.bytes_allocated();
        let mut norms: Vec<f32> = Vec::new();
        // The input embedding tables, in the plan's order, go to one arena (`embed.rs`).
        let names = LmTensors::table(&spec);
        let mut arena = Arena::new(names.audio_emb.iter().chain([&names.text_emb]));
        let result = t.try_map(
            |m| {
                let u = parts(m)?;
                let (rows, cols) = (u.entry.rows(), u.entry.cols());
                // What the weights need so far (the arena's size once a table joined it),
                // checked against a known budget before this matrix is allocated.
                let need = |bytes: u64| {
                    let total = ctx.bytes_allocated() - before + bytes;
                    ctx.check_total("the LM weights", total)
                };
                match arena.take(u.entry, u.format, u.parts) {
                    Ok(member) => need(arena.bytes()).map(|()| member),
                    Err(p) => {
                        need(
                            arena.bytes()
                                + (p.codes.len() + 2 * (p.scales.len() + p.biases.len())) as u64,
                        )?;
                        GpuMatrix::upload_parts(
                            ctx,
                            &u.entry.name,
                            u.format,
                            rows,
                            cols,
                            p,
                            u.entry.gated,
                        )
                    }
                }
            },
            |v| {
                // Each norm starts on a 16-byte boundary (the fused matmul reads it as `vec4<f32>`).
                let o = norms.len();
                norms.extend_from_slice(&vector(v)?);
                norms.resize(norms.len().div_ceil(4) * 4, 0.0);
                Ok(o)
            },
        );
        let result = result.and_then(|mut w| {
            arena.finish(ctx, w.audio_emb.iter_mut().chain([&mut w.text_emb]))?;
            Ok(GpuLmWeights {
                norms: ctx.storage_init("norms", &f32_bytes(&norms))?,
                ctx: ctx.clone(),
                spec,
                w,
            })
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(GpuError::DoesNotFit {
                what: format!("the LM weights ({e})"),
                needed: ctx.bytes_allocated() - before,
                available: ctx.bytes_allocated() - before,
            });
        }
        result.map(Arc::new)
    }

    /// The device.
    pub fn context(&self) -> &GpuContext {
        &self.ctx
    }

    /// The model's sizes.
    pub fn spec(&self) -> &LmSpec {
        &self.spec
    }

    /// The format that names the model's weights: the one its [`LmTensors::format_matrix`] was
    /// uploaded in (as a CPU model's `weight_format` tells).
    pub fn format(&self) -> WeightFormat {
        self.w.format_matrix().format()
    }

    /// Bytes of the matrices one frame streams ([`LmTensors::streamed`]) as uploaded: codes,
    /// scales and biases in 16 bits (as a CPU model's `streamed_weight_bytes` counts them).
    pub fn streamed_bytes(&self) -> usize {
        self.w.streamed().iter().map(|m| m.bytes()).sum()
    }
}

/// Buffers of one transformer stack (temporal or Depformer) for `rows` activation rows.
#[derive(Debug)]
struct Work {
    x: wgpu::Buffer,
    qkv: wgpu::Buffer,
    attn: wgpu::Buffer,
    u: wgpu::Buffer,
}

impl Work {
    fn new(ctx: &GpuContext, rows: usize, d: usize, hidden: usize) -> Result<Work, GpuError> {
        let b = |label: &str, n: usize| {
            ctx.buffer(
                label,
                (rows * n * 4) as u64,
                wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_DST
                    | wgpu::BufferUsages::COPY_SRC,
            )
        };
        Ok(Work {
            x: b("x", d)?,
            qkv: b("qkv", 3 * d)?,
            attn: b("attn", d)?,
            u: b("u", hidden)?,
        })
    }
}

/// Sizes of one stack.
#[derive(Debug, Clone, Copy)]
struct Stack {
    d: usize,
    heads: usize,
    head_dim: usize,
    ctx: usize,
    attn: AttnPlan,
}

/// How a stack's attention runs: the ring's element type and its split into key chunks.
#[derive(Debug, Clone, Copy)]
struct AttnPlan {
    kv16: bool,
    chunk: usize,
    nchunks: usize,
}

impl AttnPlan {
    /// The plan of `heads` heads of `head_dim` over a ring of `ctx` entries, chunks of at most
    /// `chunk` keys; refuses what the kernels cannot run.
    fn new(
        heads: usize,
        head_dim: usize,
        ctx: usize,
        chunk: usize,
        kv16: bool,
    ) -> Result<AttnPlan, GpuError> {
        let bad = |why: String| GpuError::Unsupported {
            format: format!("attention of {heads} heads x {head_dim} over {ctx} entries"),
            why,
        };
        if !(1..=MAX_CHUNK).contains(&chunk) {
            return Err(bad(format!("key chunks of 1 to {MAX_CHUNK}, not {chunk}")));
        }
        if head_dim == 0 || head_dim > MAX_HEAD_DIM || !head_dim.is_multiple_of(2) || ctx == 0 {
            return Err(bad(format!(
                "even head sizes up to {MAX_HEAD_DIM} and a non-empty ring"
            )));
        }
        let chunk = chunk.min(ctx);
        let nchunks = ctx.div_ceil(chunk);
        if heads * nchunks > 65535 {
            return Err(bad(format!(
                "at most 65535 workgroups per row, not {} (use longer chunks)",
                heads * nchunks
            )));
        }
        Ok(AttnPlan {
            kv16,
            chunk,
            nchunks,
        })
    }

    /// 32-bit words of one ring entry of `d` values.
    fn entry_words(&self, d: usize) -> usize {
        if self.kv16 {
            d / 2
        } else {
            d
        }
    }

    /// Floats of the split-K partials of one row (`[m, l, acc[head_dim]]` per head and chunk).
    fn partial_floats(&self, heads: usize, head_dim: usize) -> usize {
        heads * self.nchunks * (head_dim + 2)
    }
}

/// Most keys one attention workgroup scores (one per thread of the 64).
const MAX_CHUNK: usize = 64;
/// Largest head size of the attention kernel (its workgroup copy of the query).
const MAX_HEAD_DIM: usize = 256;

/// A kernel launch of a non-weight module: its uniform block `m`, its buffers after the uniform.
fn misc_dispatch(
    ctx: &GpuContext,
    module: Module,
    m: Misc,
    bufs: &[&wgpu::Buffer],
    grid: Grid,
) -> Dispatch {
    let uni = ctx.uniform("misc", &m.bytes());
    let mut all = vec![&uni];
    all.extend_from_slice(bufs);
    Dispatch {
        pipeline: ctx.pipeline(module),
        bind: ctx.bind(module, &all),
        grid,
        _uniform: uni,
    }
}

/// The buffers of one attention layer.
struct AttnBufs<'a> {
    qkv: &'a wgpu::Buffer,
    kc: &'a wgpu::Buffer,
    vc: &'a wgpu::Buffer,
    step: &'a wgpu::Buffer,
    rope: &'a wgpu::Buffer,
    partials: &'a wgpu::Buffer,
    dst: &'a wgpu::Buffer,
}

/// The dispatches of one attention layer over `m`'s shape: the split-K pass with RoPE and the KV
/// store (`heads × nchunks` workgroups per row), and the merge (`heads` per row) unless one chunk
/// covers the ring.
fn attention_dispatches(ctx: &GpuContext, m: Misc, b: &AttnBufs<'_>, out: &mut Vec<Dispatch>) {
    out.push(misc_dispatch(
        ctx,
        Module::Attention,
        m,
        &[b.qkv, b.kc, b.vc, b.partials, b.dst, b.step, b.rope],
        Grid::HeadsPerRow(m.heads * m.nchunks),
    ));
    if !m.direct {
        out.push(misc_dispatch(
            ctx,
            Module::AttentionMerge,
            m,
            &[b.partials, b.dst, b.step],
            Grid::HeadsPerRow(m.heads),
        ));
    }
}

/// The GPU LM backend of `rows` sessions: their KV rings and work buffers in device memory, every
/// dispatch of a temporal step and of each Depformer step recorded at construction (pipelines,
/// bind groups, uniforms), a readback ring for the logits, and the host copies the seam returns.
///
/// A generator step without an observer runs as [`LmBackend::sampled_step`](model::lm::LmBackend::sampled_step): temporal transformer,
/// text head, text sampling and the Depformer steps each sampling its code on the device
/// ([`crate::sample`]), one submission and one readback of the rows' sampling records (tokens
/// and generator states). With an observer (tracing) it runs piecewise, the logits of each part
/// read back and sampled on the host.
pub struct GpuLm {
    w: Arc<GpuLmWeights>,
    rows: usize,
    /// The plan's temporal pass and Depformer passes, recorded (`record.rs`).
    temporal: Recorded,
    dep: Vec<Recorded>,
    tout: wgpu::Buffer,
    text_logits_dev: wgpu::Buffer,
    dep_logits_dev: wgpu::Buffer,
    step: wgpu::Buffer,
    rope: wgpu::Buffer,
    readback: [wgpu::Buffer; 2],
    next_readback: usize,
    sample: SampleStage,
    submissions: u64,
    readbacks: u64,
    // Buffers only the dispatches reference (kept alive with them).
    _keep: Vec<wgpu::Buffer>,
    _work: [Work; 2],
    // Host side.
    pos: Vec<usize>,
    dep_next: usize,
    n_active: usize,
    freqs: Vec<f32>,
    step_host: Vec<i32>,
    rope_host: Vec<f32>,
    bytes_host: Vec<u8>,
    text_logits: Vec<f32>,
    tout_host: Vec<f32>,
    dep_logits: Vec<f32>,
}

impl std::fmt::Debug for GpuLm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuLm")
            .field("rows", &self.rows)
            .field("adapter", self.w.ctx.adapter())
            .finish()
    }
}

/// Options of a [`GpuLm`].
#[derive(Debug, Clone, Copy)]
pub struct GpuLmOptions {
    /// Element type of the temporal transformer's KV rings on the device: f32, or bf16 (two per
    /// 32-bit word, rounded to nearest even as the CPU's [`KvDtype::Bf16`] rounds; half the KV
    /// bytes attention reads). The Depformer's rings (a handful of entries) stay f32, as on the
    /// CPU.
    pub kv_dtype: KvDtype,
    /// Most keys one attention workgroup scores (1 to 64; see [`crate::shaders`]' attention
    /// arithmetic for why 64). Smaller values only serve tests: they make the short rings of the
    /// fixtures run the split-K merge.
    pub attention_chunk: usize,
}

impl Default for GpuLmOptions {
    fn default() -> Self {
        GpuLmOptions {
            kv_dtype: KvDtype::F32,
            attention_chunk: MAX_CHUNK,
        }
    }
}

impl GpuLm {
    /// A backend for `rows` sessions (1..=[`MAX_ROWS`]) over the uploaded weights, its KV rings in
    /// f32 ([`GpuLmOptions::default`]).
    pub fn new(w: Arc<GpuLmWeights>, rows: usize) -> Result<GpuLm, GpuError> {
        Self::with_options(w, rows, GpuLmOptions::default())
    }

    /// A backend for `rows` sessions (1..=[`MAX_ROWS`]) over the uploaded weights, with `opts`.
    pub fn with_options(
        w: Arc<GpuLmWeights>,
        rows: usize,
        opts: GpuLmOptions,
    ) -> Result<GpuLm, GpuError> {
        let plan = LmPlan::new(&w.spec);
        Self::with_plan(w, rows, opts, &plan)
    }

    /// [`GpuLm::with_options`] running `plan` instead of the model's own ([`LmPlan::new`]): a
    /// model whose layers are these ops in another order, or a test's broken plan. Refused, with a
    /// typed error, when the plan does not fit the weights' model ([`LmPlan::check`]) or leaves an
    /// op this device does not run alone (`record.rs`).
    pub fn with_plan(
        w: Arc<GpuLmWeights>,
        rows: usize,
        opts: GpuLmOptions,
        plan: &LmPlan,
    ) -> Result<GpuLm, GpuError> {
        let s = w.spec.clone();
        plan.check(&s).map_err(|e| GpuError::Unsupported {
            format: "an LM plan".into(),
            why: e.to_string(),
        })?;
        if rows == 0 || rows > MAX_ROWS {
            return Err(GpuError::Unsupported {
                format: format!("a batch of {rows} rows"),
                why: format!("the GPU backend steps 1 to {MAX_ROWS} rows"),
            });
        }
        if s.dep_q > model::lm::MAX_AUDIO_CODEBOOKS {
            return Err(GpuError::Unsupported {
                format: format!("{} Depformer codebooks", s.dep_q),
                why: format!(
                    "the GPU backend samples at most {}",
                    model::lm::MAX_AUDIO_CODEBOOKS
                ),
            });
        }
        let ctx = w.ctx.clone();
        let k_streams = s.num_streams();
        let storage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC;
        let kv16 = opts.kv_dtype == KvDtype::Bf16;
        let t_attn = AttnPlan::new(
            s.num_heads,
            s.head_dim,
            s.context,
            opts.attention_chunk,
            kv16,
        )?;
        // No Depformer (speech-to-text models): no Depformer attention to plan.
        let d_attn = if s.dep_q == 0 {
            AttnPlan {
                kv16: false,
                chunk: 1,
                nchunks: 1,
            }
        } else {
            AttnPlan::new(
                s.dep_heads,
                s.dep_head_dim,
                s.dep_q,
                opts.attention_chunk,
                false,
            )?
        };
        let kv_bytes = (rows * s.context * t_attn.entry_words(s.dim) * 4) as u64;
        if kv_bytes > ctx.max_binding() {
            return Err(GpuError::DoesNotFit {
                what: format!("the KV ring of one layer for {rows} sessions"),
                needed: kv_bytes,
                available: ctx.max_binding(),
            });
        }
        let kv_total = 2 * kv_bytes * s.num_layers as u64;
        ctx.check_total("the KV rings", ctx.bytes_allocated() + kv_total)?;
        let step_len = step::TOKENS + MAX_ROWS * k_streams + MAX_ROWS;
        let step_buf = ctx.buffer("step", (step_len * 4) as u64, storage)?;
        let half = s.head_dim / 2;
        let rope = ctx.buffer("rope", (MAX_ROWS * half * 2 * 4) as u64, storage)?;
        let temporal_stack = Stack {
            d: s.dim,
            heads: s.num_heads,
            head_dim: s.head_dim,
            ctx: s.context,
            attn: t_attn,
        };
        let dep_stack = Stack {
            d: s.dep_dim,
            heads: s.dep_heads,
            head_dim: s.dep_head_dim,
            ctx: s.dep_q,
            attn: d_attn,
        };
        let partials = ctx.buffer(
            "attention_partials",
            (rows
                * t_attn
                    .partial_floats(s.num_heads, s.head_dim)
                    .max(d_attn.partial_floats(s.dep_heads, s.dep_head_dim))
                * 4) as u64,
            storage,
        )?;
        let tw = Work::new(&ctx, rows, s.dim, s.hidden)?;
        let dw = Work::new(&ctx, rows, s.dep_dim, s.dep_hidden)?;
        let tout = ctx.buffer("tout", (rows * s.dim * 4) as u64, storage)?;
        let text_logits_dev =
            ctx.buffer("text_logits", (rows * s.text_card * 4) as u64, storage)?;
        let dep_logits_dev = ctx.buffer("dep_logits", (rows * s.card * 4) as u64, storage)?;
        let rings = |n: usize, bytes: u64, k: &str, v: &str| {
            (0..n)
                .map(|_| {
                    Ok((
                        ctx.buffer(k, bytes, storage)?,
                        ctx.buffer(v, bytes, storage)?,
                    ))
                })
                .collect::<Result<Vec<_>, GpuError>>()
        };
        let t_rings = rings(s.num_layers, kv_bytes, "k_ring", "v_ring")?;
        let dep_kv_bytes = (rows * s.dep_q * s.dep_dim * 4) as u64;
        let dep_rings = rings(s.dep_layers, dep_kv_bytes, "dep_k", "dep_v")?;
        let prev_base = step::TOKENS + MAX_ROWS * k_streams;
        let table = LmTensors::table(&s);
        let shared = Shared {
            ctx: &ctx,
            spec: &s,
            w: &w.w,
            table: &table,
            norms: &w.norms,
            step: &step_buf,
            rope: &rope,
            partials: &partials,
            out: &tout,
            prev_base,
        };
        let t_stack = StackBufs {
            dims: temporal_stack,
            work: &tw,
            logits: &text_logits_dev,
            rings: &t_rings,
        };
        let temporal = shared.record(&plan.temporal, &t_stack)?;
        let d_stack = StackBufs {
            dims: dep_stack,
            work: &dw,
            logits: &dep_logits_dev,
            rings: &dep_rings,
        };
        let dep = plan
            .depformer
            .iter()
            .map(|p| shared.record(p, &d_stack))
            .collect::<Result<Vec<_>, _>>()?;
        let mut keep: Vec<wgpu::Buffer> = t_rings
            .into_iter()
            .chain(dep_rings)
            .flat_map(|(k, v)| [k, v])
            .collect();
        keep.push(partials);

        let sample = SampleStage::new(
            &ctx,
            rows,
            1 + s.dep_q,
            s.text_card,
            s.card,
            &text_logits_dev,
            &dep_logits_dev,
            &step_buf,
            prev_base,
        )?;
        let rb_len = (rows * (s.text_card + s.dim).max(s.card).max(sample.stride) * 4) as u64;
        let rb = || {
            ctx.buffer(
                "readback",
                rb_len,
                wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            )
        };
        let readback = [rb()?, rb()?];
        let kf = (-(s.max_period as f64).ln() * 2.0 / s.head_dim as f64) as f32;
        // The CPU's frequencies (ops::rope_interleaved): exp in f32, the angle in f64.
        let freqs = (0..half).map(|i| (i as f32 * kf).exp()).collect();
        ctx.wait()?;
        Ok(GpuLm {
            tout,
            text_logits_dev,
            dep_logits_dev,
            step: step_buf,
            rope,
            readback,
            next_readback: 0,
            sample,
            submissions: 0,
            readbacks: 0,
            _keep: keep,
            _work: [tw, dw],
            temporal,
            dep,
            pos: vec![0; rows],
            dep_next: 0,
            n_active: 0,
            freqs,
            step_host: vec![0; step_len],
            rope_host: vec![0.0; MAX_ROWS * half * 2],
            bytes_host: Vec::with_capacity(4 * step_len.max(MAX_ROWS * half * 2)),
            text_logits: vec![0.0; rows * s.text_card],
            tout_host: vec![0.0; rows * s.dim],
            dep_logits: vec![0.0; rows * s.card],
            rows,
            w,
        })
    }

    /// The device context.
    pub fn context(&self) -> &GpuContext {
        &self.w.ctx
    }

    /// Number of kernel launches of a temporal step and of one Depformer step.
    pub fn dispatches_per_step(&self) -> (usize, usize) {
        let dep = self.dep.first().map_or(0, |d| d.dispatches.len());
        (self.temporal.dispatches.len(), dep)
    }

    /// Kernel launches of a whole sampled frame ([`LmBackend::sampled_step`](model::lm::LmBackend::sampled_step)).
    pub fn dispatches_per_frame(&self) -> usize {
        let (t, d) = self.dispatches_per_step();
        t + 1 + self.w.spec.dep_q * (d + 1)
    }

    /// Command buffers submitted since construction.
    pub fn submissions(&self) -> u64 {
        self.submissions
    }

    /// Readback buffers mapped since construction.
    pub fn readbacks(&self) -> u64 {
        self.readbacks
    }
}

mod attention;
mod embed;
mod record;
mod stepping;

pub use attention::{AttentionRow, AttentionShape, GpuAttention};
