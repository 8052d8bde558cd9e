//! The LM's plan ([`LmPlan`](model::lm::LmPlan), `model/src/lm/plan.rs`) recorded as kernel
//! launches, once, when a [`GpuLm`](super::GpuLm) is built: the layer sequence is the model's; this
//! file only says how each op (or fused group of ops) becomes launches.
//!
//! The plan is written unfused; the recorder fuses by pattern over its intermediates ([`Buf::H`],
//! [`Buf::G`], [`Buf::Tmp`]: each read by the next op alone, so the device never stores them):
//!
//! * `RmsNorm → H → MatMul` is one product with the norm computed inside it ([`Fuse::Norm`]);
//! * `RmsNorm → H → MatMul → G → SiluGate` is that product with the gated SiLU as its epilogue
//!   ([`Fuse::NormGate`]; the matrix's halves interleaved at upload, so it must be a gated one);
//! * `MatMul → Tmp → AddInto` is a product that accumulates into the residual.
//!
//! An intermediate left unfused, or a gated matrix outside its epilogue, is refused
//! ([`GpuError::Unsupported`]): this device has no buffer for it. A layer is then 5 launches (6
//! with the attention's merge), as before the plan existed. A [`Op::Zero`] becomes a clear of the
//! buffer by the encoder before the pass's compute pass, so it must precede the pass's launches.

use model::lm::{AttendAt, Buf, LmSpec, LmTensors, MatrixRef, Op, Pass, Token, VectorRef};

use super::embed::{embed_sum, Entry};
use super::{attention_dispatches, misc_dispatch, AttnBufs, Stack, Work};
use crate::context::GpuContext;
use crate::dispatch::{Dispatch, Grid};
use crate::matrix::{GpuMatrix, Op as MatOp};
use crate::shaders::{step, Fuse, Module};
use crate::uniforms::{MatParams, Misc};
use crate::GpuError;

/// One pass recorded: the buffers the encoder clears before it, then its launches.
#[derive(Debug, Default)]
pub(super) struct Recorded {
    /// Cleared (zeroed) before the pass's launches.
    pub(super) clears: Vec<wgpu::Buffer>,
    /// The launches, in order.
    pub(super) dispatches: Vec<Dispatch>,
    /// Buffers only the launches read (the embedding sums' maps).
    pub(super) keep: Vec<wgpu::Buffer>,
}

/// What every pass binds besides its stack's buffers.
pub(super) struct Shared<'a> {
    pub(super) ctx: &'a GpuContext,
    pub(super) spec: &'a LmSpec,
    /// The device weights (matrices, norm offsets into `norms`).
    pub(super) w: &'a LmTensors<GpuMatrix, usize>,
    /// The weight table (which matrices are gated).
    pub(super) table: &'a LmTensors<MatrixRef, VectorRef>,
    pub(super) norms: &'a wgpu::Buffer,
    pub(super) step: &'a wgpu::Buffer,
    pub(super) rope: &'a wgpu::Buffer,
    pub(super) partials: &'a wgpu::Buffer,
    /// `transformer_out`.
    pub(super) out: &'a wgpu::Buffer,
    /// Where the step buffer holds the Depformer's previous tokens.
    pub(super) prev_base: usize,
}

/// One stack's device side: sizes, work buffers, the logits the pass writes, the KV rings of
/// its layers.
pub(super) struct StackBufs<'a> {
    pub(super) dims: Stack,
    pub(super) work: &'a Work,
    pub(super) logits: &'a wgpu::Buffer,
    pub(super) rings: &'a [(wgpu::Buffer, wgpu::Buffer)],
}

impl Shared<'_> {
    /// The launches of `pass` on stack `sb`.
    pub(super) fn record(&self, pass: &Pass, sb: &StackBufs<'_>) -> Result<Recorded, GpuError> {
        let refuse = |op: &Op, why: &str| GpuError::Unsupported {
            format: format!("the LM plan's op {op:?}"),
            why: why.into(),
        };
        let buf = |op: &Op, b: Buf| -> Result<&wgpu::Buffer, GpuError> {
            match b {
                Buf::X => Ok(&sb.work.x),
                Buf::Qkv => Ok(&sb.work.qkv),
                Buf::Attn => Ok(&sb.work.attn),
                Buf::U => Ok(&sb.work.u),
                Buf::Out => Ok(self.out),
                Buf::Logits => Ok(sb.logits),
                Buf::H | Buf::G | Buf::Tmp => Err(refuse(op, "an intermediate left unfused")),
            }
        };
        let width = |b: Buf| pass.width(b, self.spec);
        let gated = |m: model::lm::Mat| m.of(self.table).gated;
        let mut rec = Recorded::default();
        let ops = &pass.ops;
        let mut i = 0;
        while i < ops.len() {
            let op = &ops[i];
            let next = |j: usize| ops.get(i + j).copied();
            match *op {
                Op::Zero { to } => {
                    if !rec.dispatches.is_empty() {
                        return Err(refuse(op, "a buffer zeroed after the pass's first launch"));
                    }
                    rec.clears.push(buf(op, to)?.clone());
                    i += 1;
                }
                Op::Embed { table, to, .. } => {
                    // The run of embeddings into `to` whose tables share planes (the arena's, in
                    // its order: a split arena's chunks then add each entry once, in order) is
                    // one sum (`embed.rs`).
                    let first = table.of(self.w);
                    let mut entries = Vec::new();
                    for op in &ops[i..] {
                        let Op::Embed {
                            table: m,
                            token,
                            to: t,
                        } = *op
                        else {
                            break;
                        };
                        let m = m.of(self.w);
                        let in_order = entries
                            .last()
                            .is_none_or(|e: &Entry<'_>| e.table.base() < m.base());
                        if t != to || !m.same_planes(first) || !in_order {
                            break;
                        }
                        let (tok_off, tok_stride) = match token {
                            Token::Input(s) => (step::TOKENS + s, self.spec.num_streams()),
                            Token::Previous(_) => (self.prev_base, 1),
                        };
                        entries.push(Entry {
                            table: m,
                            tok_off,
                            tok_stride,
                        });
                    }
                    let (d, map) =
                        embed_sum(self.ctx, &entries, buf(op, to)?, self.step, width(to))?;
                    rec.dispatches.extend(d);
                    rec.keep.push(map);
                    i += entries.len();
                }
                Op::RmsNorm { weight, from, to } if to.is_intermediate() => {
                    // The norm inside the product that reads it, and the gated SiLU inside that
                    // product when the product's output is the gate's input.
                    let Some(Op::MatMul {
                        weight: m,
                        from: h,
                        to: y,
                    }) = next(1)
                    else {
                        return Err(refuse(op, "a norm into an intermediate no product reads"));
                    };
                    if h != to {
                        return Err(refuse(op, "a norm into an intermediate no product reads"));
                    }
                    let (fuse, out, len) = match next(2) {
                        Some(Op::SiluGate { from: g, to: u }) if g == y && y.is_intermediate() => {
                            (Fuse::NormGate, u, 3)
                        }
                        _ => (Fuse::Norm, y, 2),
                    };
                    if gated(m) != (fuse == Fuse::NormGate) {
                        return Err(refuse(op, "a gated matrix outside its gated SiLU"));
                    }
                    let norm = *weight.of(self.w);
                    self.matmul(
                        &mut rec,
                        m.of(self.w),
                        (fuse, norm),
                        (buf(op, from)?, width(from)),
                        (buf(op, out)?, width(out)),
                        false,
                    );
                    i += len;
                }
                Op::RmsNorm { weight, from, to } => {
                    let m = Misc {
                        d: width(from) as u32,
                        w_off: *weight.of(self.w) as u32,
                        eps: self.spec.eps,
                        ..Default::default()
                    };
                    let bufs = [buf(op, from)?, self.norms, buf(op, to)?, self.step];
                    rec.dispatches.push(misc_dispatch(
                        self.ctx,
                        Module::RmsNorm,
                        m,
                        &bufs,
                        Grid::PerRow(1),
                    ));
                    i += 1;
                }
                Op::MatMul { weight, from, to } => {
                    // A product into an intermediate accumulates into what the add writes.
                    let (out, accumulate, len) = match (to.is_intermediate(), next(1)) {
                        (false, _) => (to, false, 1),
                        (true, Some(Op::AddInto { from: t, to: x })) if t == to => (x, true, 2),
                        (true, _) => {
                            return Err(refuse(op, "a product into an intermediate no add reads"))
                        }
                    };
                    if gated(weight) {
                        return Err(refuse(op, "a gated matrix outside its gated SiLU"));
                    }
                    let plain = (Fuse::Plain, 0);
                    self.matmul(
                        &mut rec,
                        weight.of(self.w),
                        plain,
                        (buf(op, from)?, width(from)),
                        (buf(op, out)?, width(out)),
                        accumulate,
                    );
                    i += len;
                }
                Op::Attend { layer, at } => {
                    let s = sb.dims;
                    let m = Misc {
                        d: s.d as u32,
                        heads: s.heads as u32,
                        head_dim: s.head_dim as u32,
                        ctx: s.ctx as u32,
                        fixed_slot: match at {
                            AttendAt::Rotary => -1,
                            AttendAt::Step(k) => k as i32,
                        },
                        rope: at == AttendAt::Rotary,
                        kv16: s.attn.kv16,
                        chunk: s.attn.chunk as u32,
                        nchunks: s.attn.nchunks as u32,
                        direct: s.attn.nchunks == 1,
                        ..Default::default()
                    };
                    let (kc, vc) = &sb.rings[layer];
                    let bufs = AttnBufs {
                        qkv: &sb.work.qkv,
                        kc,
                        vc,
                        step: self.step,
                        rope: self.rope,
                        partials: self.partials,
                        dst: &sb.work.attn,
                    };
                    attention_dispatches(self.ctx, m, &bufs, &mut rec.dispatches);
                    i += 1;
                }
                Op::SiluGate { .. } | Op::AddInto { .. } => {
                    return Err(refuse(op, "runs only fused into the product before it"));
                }
            }
        }
        Ok(rec)
    }

    /// `y (+)= W f(x)` over the step's rows of `x` and `y` (with their row strides), `f` the fused
    /// norm of weights at `norm` (and gate) or nothing.
    fn matmul(
        &self,
        rec: &mut Recorded,
        m: &GpuMatrix,
        (fuse, norm): (Fuse, usize),
        (x, ld_x): (&wgpu::Buffer, usize),
        (y, ld_y): (&wgpu::Buffer, usize),
        accumulate: bool,
    ) {
        let p = MatParams {
            ld_x: ld_x as u32,
            ld_y: ld_y as u32,
            accumulate,
            norm_off: norm as u32,
            eps: self.spec.eps,
            ..Default::default()
        };
        let d = m.dispatches(
            self.ctx,
            MatOp::Matmul(fuse),
            x,
            y,
            self.step,
            self.norms,
            &p,
        );
        rec.dispatches.extend(d);
    }
}
