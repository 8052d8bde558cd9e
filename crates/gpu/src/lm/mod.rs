//! The LM on the device: [`GpuLmWeights`] (every weight, uploaded once per engine) and [`GpuLm`]
//! (one batch's KV rings, work buffers and recorded dispatches; an
//! [`LmBackend`](model::lm::LmBackend)). The files, by job: this one (upload, the recorded
//! dispatches), `stepping` (the steps), `attention` (one attention layer alone, for tests).

use std::sync::Arc;

use kernels::{CheckpointParts, WeightFormat};
use model::lm::{KvDtype, LmModel, LmSpec, LmTensors, MatrixRef, Projections, TensorSource};

use crate::context::GpuContext;
use crate::dispatch::{Dispatch, Grid};
use crate::matrix::{f32_bytes, GpuMatrix, Op};
use crate::sample::SampleStage;
use crate::shaders::{step, Fuse, Module, MAX_ROWS};
use crate::uniforms::{MatParams, Misc};
use crate::GpuError;

/// Every LM weight in device memory, in its checkpoint format; shared (behind an `Arc`) by the
/// backends of one engine. Built from the model's weight table ([`LmTensors::table`]): matrices as
/// [`GpuMatrix`], RMS-norm weights as offsets into one buffer.
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
        let result = t.try_map(
            |m| {
                let u = parts(m)?;
                let (rows, cols) = (u.entry.rows(), u.entry.cols());
                // What the weights need so far, checked against a known budget before this
                // matrix is allocated.
                let bytes = (u.parts.codes.len()
                    + 2 * (u.parts.scales.len() + u.parts.biases.len()))
                    as u64;
                ctx.check_total("the LM weights", ctx.bytes_allocated() - before + bytes)?;
                GpuMatrix::upload_parts(
                    ctx,
                    &u.entry.name,
                    u.format,
                    rows,
                    cols,
                    u.parts,
                    u.entry.gated,
                )
            },
            |v| {
                // Each norm starts on a 16-byte boundary (the fused matmul reads it as `vec4<f32>`).
                let o = norms.len();
                norms.extend_from_slice(&vector(v)?);
                norms.resize(norms.len().div_ceil(4) * 4, 0.0);
                Ok(o)
            },
        );
        let result = result.and_then(|w| {
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
    hidden: usize,
    ctx: usize,
    eps: f32,
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

/// Everything a stack's layer dispatches bind besides its weights.
struct LayerBinds<'a> {
    ctx: &'a GpuContext,
    work: &'a Work,
    norms: &'a wgpu::Buffer,
    step: &'a wgpu::Buffer,
    rope: &'a wgpu::Buffer,
    partials: &'a wgpu::Buffer,
    stack: Stack,
}

impl LayerBinds<'_> {
    fn simple(&self, module: Module, m: Misc, bufs: &[&wgpu::Buffer], grid: Grid) -> Dispatch {
        misc_dispatch(self.ctx, module, m, bufs, grid)
    }

    fn norm(&self, from: &wgpu::Buffer, to: &wgpu::Buffer, w_off: usize) -> Dispatch {
        let s = self.stack;
        let m = Misc {
            d: s.d as u32,
            w_off: w_off as u32,
            eps: s.eps,
            ..Default::default()
        };
        self.simple(
            Module::RmsNorm,
            m,
            &[from, self.norms, to, self.step],
            Grid::PerRow(1),
        )
    }

    /// The dispatches of one layer: x += attn(norm1 x); x += ffn(norm2 x), 5 launches (6 with
    /// the attention's merge): the norms run inside `in_proj` and `lin_in` ([`Fuse::Norm`]), the
    /// gated SiLU in `lin_in`'s epilogue ([`Fuse::NormGate`]), the residual adds in `out_proj`'s
    /// and `lin_out`'s (`accumulate`). `fixed_slot` is the Depformer step (its ring slot; no
    /// RoPE), `None` for the temporal stack.
    fn layer(
        &self,
        (norm1, norm2, w): (usize, usize, &Projections<GpuMatrix>),
        kc: &wgpu::Buffer,
        vc: &wgpu::Buffer,
        fixed_slot: Option<usize>,
        out: &mut Vec<Dispatch>,
    ) {
        let (s, wk, ctx) = (self.stack, self.work, self.ctx);
        // `y (+)= W f(x)` over the step's rows of `x` (stride `ld_x`) and `y` (stride `ld_y`),
        // `f` the fused norm of weights at `norm` (and gate) or nothing.
        let matmul = |m: &GpuMatrix,
                      (fuse, norm): (Fuse, usize),
                      x: &wgpu::Buffer,
                      y: &wgpu::Buffer,
                      (ld_x, ld_y): (usize, usize),
                      accumulate: bool| {
            let p = MatParams {
                ld_x: ld_x as u32,
                ld_y: ld_y as u32,
                accumulate,
                norm_off: norm as u32,
                eps: s.eps,
                ..Default::default()
            };
            m.dispatches(ctx, Op::Matmul(fuse), x, y, self.step, self.norms, &p)
        };
        let plain = (Fuse::Plain, 0);
        let misc = Misc {
            d: s.d as u32,
            heads: s.heads as u32,
            head_dim: s.head_dim as u32,
            ctx: s.ctx as u32,
            fixed_slot: fixed_slot.map_or(-1, |k| k as i32),
            rope: fixed_slot.is_none(),
            kv16: s.attn.kv16,
            chunk: s.attn.chunk as u32,
            nchunks: s.attn.nchunks as u32,
            direct: s.attn.nchunks == 1,
            ..Default::default()
        };
        out.extend(matmul(
            &w.in_proj,
            (Fuse::Norm, norm1),
            &wk.x,
            &wk.qkv,
            (s.d, 3 * s.d),
            false,
        ));
        let bufs = AttnBufs {
            qkv: &wk.qkv,
            kc,
            vc,
            step: self.step,
            rope: self.rope,
            partials: self.partials,
            dst: &wk.attn,
        };
        attention_dispatches(ctx, misc, &bufs, out);
        out.extend(matmul(
            &w.out_proj,
            plain,
            &wk.attn,
            &wk.x,
            (s.d, s.d),
            true,
        ));
        out.extend(matmul(
            &w.lin_in,
            (Fuse::NormGate, norm2),
            &wk.x,
            &wk.u,
            (s.d, s.hidden),
            false,
        ));
        out.extend(matmul(
            &w.lin_out,
            plain,
            &wk.u,
            &wk.x,
            (s.hidden, s.d),
            true,
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
    temporal: Vec<Dispatch>,
    dep: Vec<Vec<Dispatch>>,
    x: wgpu::Buffer,
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
        let s = w.spec.clone();
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
            hidden: s.hidden,
            ctx: s.context,
            eps: s.eps,
            attn: t_attn,
        };
        let dep_stack = Stack {
            d: s.dep_dim,
            heads: s.dep_heads,
            head_dim: s.dep_head_dim,
            hidden: s.dep_hidden,
            ctx: s.dep_q,
            eps: s.eps,
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
        let dummy = ctx.buffer("dummy", 4, storage)?;
        let mut keep = Vec::new();

        // Temporal step.
        let mut temporal = Vec::new();
        let tb = LayerBinds {
            ctx: &ctx,
            work: &tw,
            norms: &w.norms,
            step: &step_buf,
            rope: &rope,
            partials: &partials,
            stack: temporal_stack,
        };
        let emb_p = |slot: usize, ld: usize| MatParams {
            ld_y: ld as u32,
            tok_base: step::TOKENS as u32,
            tok_stride: k_streams as u32,
            tok_slot: slot as u32,
            ..Default::default()
        };
        // Python order: audio tables, then text (the sum is rounded in this order).
        let ww = &w.w;
        for (i, m) in ww.audio_emb.iter().enumerate() {
            temporal.extend(m.dispatches(
                &ctx,
                Op::Embed,
                &dummy,
                &tw.x,
                &step_buf,
                &dummy,
                &emb_p(1 + i, s.dim),
            ));
        }
        temporal.extend(ww.text_emb.dispatches(
            &ctx,
            Op::Embed,
            &dummy,
            &tw.x,
            &step_buf,
            &dummy,
            &emb_p(0, s.dim),
        ));
        for l in &ww.layers {
            let kc = ctx.buffer("k_ring", kv_bytes, storage)?;
            let vc = ctx.buffer("v_ring", kv_bytes, storage)?;
            tb.layer((l.norm1, l.norm2, &l.proj), &kc, &vc, None, &mut temporal);
            keep.push(kc);
            keep.push(vc);
        }
        temporal.push(tb.norm(&tw.x, &tout, ww.out_norm));
        let head_p = |ld_x: usize, ld_y: usize| MatParams {
            ld_x: ld_x as u32,
            ld_y: ld_y as u32,
            ..Default::default()
        };
        temporal.extend(ww.text_linear.dispatches(
            &ctx,
            Op::Matmul(Fuse::Plain),
            &tout,
            &text_logits_dev,
            &step_buf,
            &w.norms,
            &head_p(s.dim, s.text_card),
        ));

        // Depformer steps.
        let db = LayerBinds {
            ctx: &ctx,
            work: &dw,
            stack: dep_stack,
            ..tb
        };
        let dep_kv = (0..s.dep_layers)
            .map(|_| {
                let n = (rows * s.dep_q * s.dep_dim * 4) as u64;
                Ok((
                    ctx.buffer("dep_k", n, storage)?,
                    ctx.buffer("dep_v", n, storage)?,
                ))
            })
            .collect::<Result<Vec<_>, GpuError>>()?;
        let prev_base = step::TOKENS + MAX_ROWS * k_streams;
        let mut dep = Vec::with_capacity(s.dep_q);
        for k in 0..s.dep_q {
            let mut d = Vec::new();
            d.extend(ww.dep_in[k].dispatches(
                &ctx,
                Op::Matmul(Fuse::Plain),
                &tout,
                &dw.x,
                &step_buf,
                &w.norms,
                &head_p(s.dim, s.dep_dim),
            ));
            let p = MatParams {
                ld_y: s.dep_dim as u32,
                tok_base: prev_base as u32,
                tok_stride: 1,
                tok_slot: 0,
                ..Default::default()
            };
            d.extend(ww.dep_token_emb[k].dispatches(
                &ctx,
                Op::Embed,
                &dummy,
                &dw.x,
                &step_buf,
                &dummy,
                &p,
            ));
            for (j, l) in ww.dep_layers.iter().enumerate() {
                let weights = (l.norm1, l.norm2, &l.steps[k]);
                db.layer(weights, &dep_kv[j].0, &dep_kv[j].1, Some(k), &mut d);
            }
            d.extend(ww.dep_linear[k].dispatches(
                &ctx,
                Op::Matmul(Fuse::Plain),
                &dw.x,
                &dep_logits_dev,
                &step_buf,
                &w.norms,
                &head_p(s.dep_dim, s.card),
            ));
            dep.push(d);
        }
        for (k, v) in dep_kv {
            keep.push(k);
            keep.push(v);
        }
        keep.push(partials);
        keep.push(dummy);

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
            x: tw.x.clone(),
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
        (self.temporal.len(), self.dep.first().map_or(0, |d| d.len()))
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
mod stepping;

pub use attention::{AttentionRow, AttentionShape, GpuAttention};
