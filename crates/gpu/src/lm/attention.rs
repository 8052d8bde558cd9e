//! [`GpuAttention`]: one attention layer on its own over the LM's kernels (the property tests' entry point).

use super::{attention_dispatches, AttnBufs, AttnPlan};
use crate::context::GpuContext;
use crate::dispatch::Dispatch;
use crate::matrix::{f32_bytes, i32_bytes};
use crate::shaders::{step, MAX_ROWS};
use crate::uniforms::Misc;
use crate::GpuError;
use model::lm::KvDtype;

/// The shape of a standalone attention layer ([`GpuAttention`]).
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    /// Heads.
    pub heads: usize,
    /// Values per head (even, at most 256).
    pub head_dim: usize,
    /// Ring capacity per session.
    pub context: usize,
    /// Sessions (rings).
    pub sessions: usize,
    /// Element type of the rings.
    pub kv_dtype: KvDtype,
    /// Most keys per attention workgroup (1 to 64).
    pub chunk: usize,
    /// The Depformer's mode: every row writes slot `k` and attends to slots `0..=k` (no RoPE
    /// either way here).
    pub fixed_slot: Option<usize>,
}

/// One active row of a [`GpuAttention::step`]: its session, the ring slot its new key and value
/// go to, and how many entries it attends to (the newest being that slot).
#[derive(Debug, Clone, Copy)]
pub struct AttentionRow {
    /// Session (ring) of the row.
    pub session: usize,
    /// Ring slot written this step.
    pub slot: usize,
    /// Entries attended (1 to the context).
    pub count: usize,
}

/// The LM's attention kernels on their own (KV store, split-K pass, merge) over rings this
/// object owns: what the property tests compare with a reference at any shape, Moshi's
/// included, without a whole model.
#[derive(Debug)]
pub struct GpuAttention {
    ctx: GpuContext,
    shape: AttentionShape,
    plan: AttnPlan,
    qkv: wgpu::Buffer,
    kc: wgpu::Buffer,
    vc: wgpu::Buffer,
    step: wgpu::Buffer,
    dst: wgpu::Buffer,
    readback: wgpu::Buffer,
    dispatches: Vec<Dispatch>,
    _keep: Vec<wgpu::Buffer>,
}

impl GpuAttention {
    /// The kernels and rings (zeroed) of `shape` on `ctx`.
    pub fn new(ctx: &GpuContext, shape: AttentionShape) -> Result<GpuAttention, GpuError> {
        let plan = AttnPlan::new(
            shape.heads,
            shape.head_dim,
            shape.context,
            shape.chunk,
            shape.kv_dtype == KvDtype::Bf16,
        )?;
        if shape.sessions == 0 || shape.fixed_slot.is_some_and(|k| k >= shape.context) {
            return Err(GpuError::Unsupported {
                format: format!("attention of shape {shape:?}"),
                why: "at least one session, and a fixed slot inside the ring".into(),
            });
        }
        let d = shape.heads * shape.head_dim;
        let storage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC;
        let ring = (shape.sessions * shape.context * plan.entry_words(d) * 4) as u64;
        if ring > ctx.max_binding() {
            return Err(GpuError::DoesNotFit {
                what: format!("the KV ring of {} sessions", shape.sessions),
                needed: ring,
                available: ctx.max_binding(),
            });
        }
        let b = |label: &str, n: u64| ctx.buffer(label, n, storage);
        let qkv = b("qkv", (MAX_ROWS * 3 * d * 4) as u64)?;
        let kc = b("k_ring", ring)?;
        let vc = b("v_ring", ring)?;
        let step = b("step", (step::TOKENS * 4) as u64)?;
        let rope = b("rope", 4)?;
        let partials = b(
            "attention_partials",
            (MAX_ROWS * plan.partial_floats(shape.heads, shape.head_dim) * 4) as u64,
        )?;
        let dst = b("attn", (MAX_ROWS * d * 4) as u64)?;
        let readback = ctx.buffer(
            "readback",
            (MAX_ROWS * d * 4) as u64,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?;
        let m = Misc {
            d: d as u32,
            heads: shape.heads as u32,
            head_dim: shape.head_dim as u32,
            ctx: shape.context as u32,
            fixed_slot: shape.fixed_slot.map_or(-1, |k| k as i32),
            rope: false,
            kv16: plan.kv16,
            chunk: plan.chunk as u32,
            nchunks: plan.nchunks as u32,
            direct: plan.nchunks == 1,
            ..Default::default()
        };
        let bufs = AttnBufs {
            qkv: &qkv,
            kc: &kc,
            vc: &vc,
            step: &step,
            rope: &rope,
            partials: &partials,
            dst: &dst,
        };
        let mut dispatches = Vec::new();
        attention_dispatches(ctx, m, &bufs, &mut dispatches);
        Ok(GpuAttention {
            ctx: ctx.clone(),
            shape,
            plan,
            qkv,
            kc,
            vc,
            step,
            dst,
            readback,
            dispatches,
            _keep: vec![rope, partials],
        })
    }

    /// Kernel launches of one step (split-K pass with the store, merge unless one chunk covers the
    /// ring).
    pub fn dispatches(&self) -> usize {
        self.dispatches.len()
    }

    /// Key chunks of a full ring (workgroups of the split-K pass per head and row).
    pub fn chunks(&self) -> usize {
        self.plan.nchunks
    }

    /// Writes the whole ring of `session`: `k` and `v` hold `context × heads · head_dim` values,
    /// entry by entry (bf16 rings store them rounded to nearest even, as the device's store does).
    pub fn fill(&self, session: usize, k: &[f32], v: &[f32]) -> Result<(), GpuError> {
        let s = self.shape;
        let n = s.context * s.heads * s.head_dim;
        if session >= s.sessions || k.len() != n || v.len() != n {
            return Err(GpuError::Runtime(format!(
                "attention fill: session {session} of {}, {} and {} values for {n}",
                s.sessions,
                k.len(),
                v.len()
            )));
        }
        let words = |x: &[f32]| -> Vec<u8> {
            if self.plan.kv16 {
                let mut h = vec![0u16; x.len()];
                kernels::attention::to_bf16_reference(x, &mut h);
                h.iter().flat_map(|v| v.to_le_bytes()).collect()
            } else {
                f32_bytes(x)
            }
        };
        let off = (session * self.plan.entry_words(s.heads * s.head_dim) * s.context * 4) as u64;
        let q = self.ctx.queue();
        q.write_buffer(&self.kc, off, &words(k));
        q.write_buffer(&self.vc, off, &words(v));
        Ok(())
    }

    /// One step of `rows` (1 to 8): row `i`'s fused `qkv[i · 3d ..][.. 3d]` (q, k, v; `d =
    /// heads · head_dim`) stores its k and v at its slot, then attends with its q; `out[i · d ..]`
    /// receives its attention output.
    pub fn step(
        &mut self,
        rows: &[AttentionRow],
        qkv: &[f32],
        out: &mut [f32],
    ) -> Result<(), GpuError> {
        let s = self.shape;
        let (n, d) = (rows.len(), s.heads * s.head_dim);
        let bad_row = |r: &AttentionRow| {
            r.session >= s.sessions || r.slot >= s.context || r.count == 0 || r.count > s.context
        };
        if n == 0 || n > MAX_ROWS || qkv.len() != n * 3 * d || out.len() != n * d {
            return Err(GpuError::Runtime(format!(
                "attention step: {n} rows, {} qkv and {} output values",
                qkv.len(),
                out.len()
            )));
        }
        if let Some(r) = rows.iter().find(|r| bad_row(r)) {
            return Err(GpuError::Runtime(format!(
                "attention step: row {r:?} outside a ring of {} entries",
                s.context
            )));
        }
        let mut st = vec![0i32; step::TOKENS];
        st[0] = n as i32;
        for (i, r) in rows.iter().enumerate() {
            st[step::SESS + i] = r.session as i32;
            st[step::SLOT + i] = r.slot as i32;
            st[step::COUNT + i] = r.count as i32;
        }
        let q = self.ctx.queue();
        q.write_buffer(&self.step, 0, &i32_bytes(&st));
        q.write_buffer(&self.qkv, 0, &f32_bytes(qkv));
        let mut enc = self
            .ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            for disp in &self.dispatches {
                disp.record(&mut pass, n as u32);
            }
        }
        enc.copy_buffer_to_buffer(&self.dst, 0, &self.readback, 0, (n * d * 4) as u64);
        self.ctx.submit(enc.finish());
        crate::context::read_mapped(&self.ctx, &self.readback, out)
    }
}
