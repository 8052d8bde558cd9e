//! The LM's layer sequence, written once: a plan of ops over named weights and named buffers.
//!
//! [`LmPlan::new`] reads like the forward pass it describes (embedding sum → per layer RMS norm →
//! `in_proj` → RoPE, KV push and attention → `out_proj` → residual → RMS norm → `lin_in` → gated
//! SiLU → `lin_out` → residual → out norm → text head; then each Depformer step: `depformer_in`,
//! the previous token's embedding, its layers with that step's projections, its codebook head).
//! It is plain data built once from an [`LmSpec`]; the backends do not restate it:
//!
//! * the CPU ([`LmModel`](super::LmModel)) *executes* it, op by op, every frame (`lm/model.rs`:
//!   one `match` per op, nothing allocated);
//! * the GPU (`moshi-gpu`, `gpu/src/lm/record.rs`) *records* it once, at construction, as its
//!   list of kernel launches.
//!
//! A model whose layers are these ops (speech-to-text: `dep_q = 0`, no Depformer passes) needs a
//! different plan, not a different backend.
//!
//! **Weights** are named by their place in the weight table ([`Mat`], [`Vector`]), resolved against
//! any [`LmTensors`] — the CPU's matrices or a device's buffers — with [`Mat::of`] /
//! [`Vector::of`]. **Buffers** ([`Buf`]) are per-row activations of the pass's stack (the temporal
//! transformer or the Depformer, [`Stack`]); [`Pass::width`] gives each one's width.
//!
//! **Fusion is the device's business, made safe by the plan.** The plan is written at the CPU's
//! granularity, unfused (a norm, then a product; a product, then a residual add), because that is
//! the architecture as a reader checks it against the paper or Kyutai's code. A device may fuse
//! adjacent ops by pattern; three buffers, [`Buf::H`], [`Buf::G`] and [`Buf::Tmp`], are
//! *intermediates*: each is written by one op and read by the next op alone (a test checks it for
//! every plan), so a device that fuses the pair never needs to store them. The GPU fuses
//! `RmsNorm → H → MatMul` into one product with the norm inside (`Fuse::Norm`), `… → G → SiluGate`
//! into that product's epilogue (`Fuse::NormGate`), and `MatMul → Tmp → AddInto` into an
//! accumulating product, and refuses a plan that leaves an intermediate unfused (it has no buffer
//! for it). Naming the fused pairs in the plan instead would have written one device's kernel
//! boundaries into the model's description.

use super::spec::LmSpec;
use super::table::{LmTensors, MatrixRef, Projections, VectorRef};
use super::LmError;

/// Which transformer a pass runs (its widths and its work buffers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stack {
    /// The temporal transformer (`dim` wide, `num_layers` layers, RoPE, a ring of `context`).
    Temporal,
    /// The Depformer (`dep_dim` wide, `dep_layers` layers, one ring slot per step).
    Depformer,
}

/// A buffer of a pass: `[rows, width]` row-major, the width from [`Pass::width`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Buf {
    /// The residual stream of the pass's stack.
    X,
    /// A block's normalised input (an intermediate: see the module docs).
    H,
    /// Fused Q, K, V (`3·width`).
    Qkv,
    /// Attention output.
    Attn,
    /// A block's output before its residual add (an intermediate).
    Tmp,
    /// The gated FFN's input, gate half first (`2·hidden`; an intermediate).
    G,
    /// The gated FFN's activation (`hidden`).
    U,
    /// The temporal transformer's normalised output (`transformer_out`, `dim`): the text head's
    /// input and every Depformer step's.
    Out,
    /// The pass's logits: text (`text_card`) for the temporal pass, codebook `k` (`card`) for
    /// Depformer step `k`.
    Logits,
}

impl Buf {
    /// Every buffer, in declaration order.
    pub const ALL: [Buf; 9] = [
        Buf::X,
        Buf::H,
        Buf::Qkv,
        Buf::Attn,
        Buf::Tmp,
        Buf::G,
        Buf::U,
        Buf::Out,
        Buf::Logits,
    ];

    /// An intermediate: written by one op and read by the next op alone, so a device may fuse
    /// the two and never store it.
    pub fn is_intermediate(self) -> bool {
        matches!(self, Buf::H | Buf::G | Buf::Tmp)
    }
}

/// One of a layer's four projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proj {
    /// Fused Q, K, V `[3·d, d]`.
    InProj,
    /// Attention output `[d, d]`.
    OutProj,
    /// Gated FFN input `[2·hidden, d]` (gate half first).
    LinIn,
    /// FFN output `[d, hidden]`.
    LinOut,
}

impl Proj {
    fn of<M>(self, p: &Projections<M>) -> &M {
        match self {
            Proj::InProj => &p.in_proj,
            Proj::OutProj => &p.out_proj,
            Proj::LinIn => &p.lin_in,
            Proj::LinOut => &p.lin_out,
        }
    }
}

/// A matrix of the weight table, by place ([`LmTensors`]' fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mat {
    /// Text embedding table.
    TextEmb,
    /// Audio embedding table `i` (`0..n_q`).
    AudioEmb(usize),
    /// Projection of temporal layer `l`.
    Temporal(usize, Proj),
    /// Text head.
    TextLinear,
    /// Depformer input projection of step `k`.
    DepIn(usize),
    /// Embedding of Depformer step `k`'s previous token.
    DepTokenEmb(usize),
    /// Projection of Depformer layer `layer` at step `step`.
    Dep {
        /// The layer.
        layer: usize,
        /// The step (each step has its own projections).
        step: usize,
        /// Which projection.
        proj: Proj,
    },
    /// Codebook head of Depformer step `k`.
    DepLinear(usize),
}

impl Mat {
    /// The matrix in `t`, if `t` has it.
    pub fn get<M, V>(self, t: &LmTensors<M, V>) -> Option<&M> {
        match self {
            Mat::TextEmb => Some(&t.text_emb),
            Mat::AudioEmb(i) => t.audio_emb.get(i),
            Mat::Temporal(l, p) => t.layers.get(l).map(|l| p.of(&l.proj)),
            Mat::TextLinear => Some(&t.text_linear),
            Mat::DepIn(k) => t.dep_in.get(k),
            Mat::DepTokenEmb(k) => t.dep_token_emb.get(k),
            Mat::Dep { layer, step, proj } => {
                let l = t.dep_layers.get(layer)?;
                l.steps.get(step).map(|p| proj.of(p))
            }
            Mat::DepLinear(k) => t.dep_linear.get(k),
        }
    }

    /// The matrix in `t`, the tensors of a model whose spec the plan passed
    /// ([`LmPlan::check`]; a plan built by [`LmPlan::new`] passes its own spec's).
    ///
    /// # Panics
    /// When `t` does not have it (a plan not checked against `t`'s spec).
    pub fn of<M, V>(self, t: &LmTensors<M, V>) -> &M {
        self.get(t)
            .expect("the plan was checked against the model's spec")
    }
}

/// An RMS-norm weight of the table, by place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vector {
    /// Attention-block norm of layer `l` of a stack.
    Norm1(Stack, usize),
    /// Feed-forward-block norm of layer `l` of a stack.
    Norm2(Stack, usize),
    /// The temporal transformer's final norm.
    OutNorm,
}

impl Vector {
    /// The vector in `t`, if `t` has it.
    pub fn get<M, V>(self, t: &LmTensors<M, V>) -> Option<&V> {
        match self {
            Vector::Norm1(Stack::Temporal, l) => t.layers.get(l).map(|l| &l.norm1),
            Vector::Norm2(Stack::Temporal, l) => t.layers.get(l).map(|l| &l.norm2),
            Vector::Norm1(Stack::Depformer, l) => t.dep_layers.get(l).map(|l| &l.norm1),
            Vector::Norm2(Stack::Depformer, l) => t.dep_layers.get(l).map(|l| &l.norm2),
            Vector::OutNorm => Some(&t.out_norm),
        }
    }

    /// The vector in `t` (see [`Mat::of`]).
    ///
    /// # Panics
    /// When `t` does not have it (a plan not checked against `t`'s spec).
    pub fn of<M, V>(self, t: &LmTensors<M, V>) -> &V {
        self.get(t)
            .expect("the plan was checked against the model's spec")
    }
}

/// The token an [`Op::Embed`] looks up for each row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Token {
    /// Stream `s` of the row's input column (0 text, `1..=n_q` audio).
    Input(usize),
    /// The token before Depformer step `k` (this frame's text token for `k = 0`, else the code
    /// of step `k − 1`).
    Previous(usize),
}

/// Which positions an attention layer sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttendAt {
    /// The temporal stack: queries and keys rotated (RoPE) at the row's position, the keys and
    /// values pushed into the layer's ring of `context` entries, attention over the ring.
    Rotary,
    /// Depformer step `k`: no rotation; the keys and values go to slot `k` of the layer's ring
    /// (emptied at step 0), attention over slots `0..=k`.
    Step(usize),
}

/// One op of a pass, over every row of the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `to = 0`.
    Zero {
        /// Destination.
        to: Buf,
    },
    /// `to += table[token]` (no row for [`NO_TOKEN`](super::NO_TOKEN), row 0 for
    /// [`UNGENERATED`](super::UNGENERATED)).
    Embed {
        /// The embedding table.
        table: Mat,
        /// Which token each row looks up.
        token: Token,
        /// Destination.
        to: Buf,
    },
    /// `to = rms_norm(from) · weight`.
    RmsNorm {
        /// The norm's weight.
        weight: Vector,
        /// Source.
        from: Buf,
        /// Destination.
        to: Buf,
    },
    /// `to = weight · from`.
    MatMul {
        /// The matrix.
        weight: Mat,
        /// Source.
        from: Buf,
        /// Destination.
        to: Buf,
    },
    /// Attention of layer `layer` of the pass's stack, from Q, K, V in [`Buf::Qkv`] (rotated in
    /// place by [`AttendAt::Rotary`]) to [`Buf::Attn`].
    Attend {
        /// The layer (its KV ring).
        layer: usize,
        /// Positions and ring use.
        at: AttendAt,
    },
    /// `to = silu(gate half of from) · value half`.
    SiluGate {
        /// Source (`2·hidden`).
        from: Buf,
        /// Destination (`hidden`).
        to: Buf,
    },
    /// `to += from`.
    AddInto {
        /// Source.
        from: Buf,
        /// Destination.
        to: Buf,
    },
}

impl Op {
    /// The buffers the op reads (`to` too where it accumulates).
    pub fn reads(&self) -> impl Iterator<Item = Buf> {
        let (a, b) = match *self {
            Op::Zero { .. } => (None, None),
            Op::Embed { to, .. } => (Some(to), None),
            Op::Attend { .. } => (Some(Buf::Qkv), None),
            Op::RmsNorm { from, .. } | Op::MatMul { from, .. } | Op::SiluGate { from, .. } => {
                (Some(from), None)
            }
            Op::AddInto { from, to } => (Some(from), Some(to)),
        };
        a.into_iter().chain(b)
    }

    /// The buffer the op writes.
    pub fn writes(&self) -> Buf {
        match *self {
            Op::Zero { to }
            | Op::Embed { to, .. }
            | Op::RmsNorm { to, .. }
            | Op::MatMul { to, .. }
            | Op::SiluGate { to, .. }
            | Op::AddInto { to, .. } => to,
            Op::Attend { .. } => Buf::Attn,
        }
    }
}

/// One pass: the ops of a temporal step or of one Depformer step, in order, on one stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pass {
    /// The stack whose buffers and rings the ops use.
    pub stack: Stack,
    /// The ops.
    pub ops: Vec<Op>,
}

impl Pass {
    /// Width (values per row) of buffer `b` in this pass under `spec`.
    pub fn width(&self, b: Buf, spec: &LmSpec) -> usize {
        let (d, hidden, logits) = match self.stack {
            Stack::Temporal => (spec.dim, spec.hidden, spec.text_card),
            Stack::Depformer => (spec.dep_dim, spec.dep_hidden, spec.card),
        };
        match b {
            Buf::X | Buf::H | Buf::Attn | Buf::Tmp => d,
            Buf::Qkv => 3 * d,
            Buf::G => 2 * hidden,
            Buf::U => hidden,
            Buf::Out => spec.dim,
            Buf::Logits => logits,
        }
    }
}

/// The plan of one LM: its temporal pass and its `dep_q` Depformer passes (none for
/// speech-to-text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LmPlan {
    /// Input column → [`Buf::Out`] (`transformer_out`) and [`Buf::Logits`] (text logits).
    pub temporal: Pass,
    /// Step `k`: [`Buf::Out`] and [`Token::Previous`] → [`Buf::Logits`] (codebook `k`).
    pub depformer: Vec<Pass>,
}

impl LmPlan {
    /// The plan of the Moshi architecture at the sizes of `spec`.
    pub fn new(spec: &LmSpec) -> LmPlan {
        use Buf::*;
        // Temporal step: the embedding sum in Python's order (audio tables, then text; the sum is
        // rounded in this order), the layers, the out norm and the text head.
        let mut t = vec![Op::Zero { to: X }];
        for i in 0..spec.n_q {
            t.push(Op::Embed {
                table: Mat::AudioEmb(i),
                token: Token::Input(1 + i),
                to: X,
            });
        }
        t.push(Op::Embed {
            table: Mat::TextEmb,
            token: Token::Input(0),
            to: X,
        });
        for l in 0..spec.num_layers {
            let proj = |p| Mat::Temporal(l, p);
            layer(&mut t, Stack::Temporal, l, proj, AttendAt::Rotary);
        }
        t.push(Op::RmsNorm {
            weight: Vector::OutNorm,
            from: X,
            to: Out,
        });
        t.push(Op::MatMul {
            weight: Mat::TextLinear,
            from: Out,
            to: Logits,
        });

        // Depformer step k: its input projection of the temporal output plus the previous token's
        // embedding, the layers with step k's projections, step k's codebook head.
        let depformer = (0..spec.dep_q)
            .map(|k| {
                let mut d = vec![
                    Op::MatMul {
                        weight: Mat::DepIn(k),
                        from: Out,
                        to: X,
                    },
                    Op::Embed {
                        table: Mat::DepTokenEmb(k),
                        token: Token::Previous(k),
                        to: X,
                    },
                ];
                for j in 0..spec.dep_layers {
                    let proj = |proj| Mat::Dep {
                        layer: j,
                        step: k,
                        proj,
                    };
                    layer(&mut d, Stack::Depformer, j, proj, AttendAt::Step(k));
                }
                d.push(Op::MatMul {
                    weight: Mat::DepLinear(k),
                    from: X,
                    to: Logits,
                });
                Pass {
                    stack: Stack::Depformer,
                    ops: d,
                }
            })
            .collect();
        LmPlan {
            temporal: Pass {
                stack: Stack::Temporal,
                ops: t,
            },
            depformer,
        }
    }
}

impl LmPlan {
    /// Refuses a plan the model of `spec` cannot run: a weight, layer, stream or step outside the
    /// model; a pass on the wrong stack; an op whose widths do not match its weight or whose source
    /// is its destination; not one Depformer pass per generated codebook.
    pub fn check(&self, spec: &LmSpec) -> Result<(), LmError> {
        let bad = |what: String| Err(LmError::Config(format!("LM plan: {what}")));
        if self.depformer.len() != spec.dep_q {
            return bad(format!(
                "{} Depformer passes for {} codebooks",
                self.depformer.len(),
                spec.dep_q
            ));
        }
        let table = LmTensors::table(spec);
        let passes = std::iter::once((Stack::Temporal, &self.temporal))
            .chain(self.depformer.iter().map(|p| (Stack::Depformer, p)));
        for (stack, pass) in passes {
            if pass.stack != stack {
                return bad(format!("a {stack:?} pass on the {:?} stack", pass.stack));
            }
            for op in &pass.ops {
                if let Err(why) = pass.check_op(op, spec, &table) {
                    return bad(format!("{op:?}: {why}"));
                }
            }
        }
        Ok(())
    }
}

impl Pass {
    /// Why `op` cannot run in this pass of the model of `spec` (its weight table `t`), if it cannot.
    fn check_op(
        &self,
        op: &Op,
        spec: &LmSpec,
        t: &LmTensors<MatrixRef, VectorRef>,
    ) -> Result<(), String> {
        let w = |b: Buf| self.width(b, spec);
        let layers = match self.stack {
            Stack::Temporal => spec.num_layers,
            Stack::Depformer => spec.dep_layers,
        };
        let same = |a: usize, b: usize, what: &str| match a == b {
            true => Ok(()),
            false => Err(format!("{what}: {a} against {b}")),
        };
        let distinct = |from: Buf, to: Buf| match from == to {
            true => Err("source and destination are one buffer".to_string()),
            false => Ok(()),
        };
        match *op {
            Op::Zero { .. } => Ok(()),
            Op::Embed { table, token, to } => {
                let m = table.get(t).ok_or("no such table")?;
                match token {
                    Token::Input(i) if i < spec.num_streams() => {}
                    Token::Previous(k) if k < spec.dep_q => {}
                    _ => return Err("no such token".into()),
                }
                same(m.cols(), w(to), "table width")
            }
            Op::RmsNorm { weight, from, to } => {
                distinct(from, to)?;
                let v = weight.get(t).ok_or("no such norm")?;
                same(v.len, w(from), "norm width")?;
                same(w(from), w(to), "widths")
            }
            Op::MatMul { weight, from, to } => {
                distinct(from, to)?;
                let m = weight.get(t).ok_or("no such matrix")?;
                same(m.cols(), w(from), "matrix columns")?;
                same(m.rows(), w(to), "matrix rows")
            }
            Op::Attend { layer, at } => {
                let at_ok = match at {
                    AttendAt::Rotary => self.stack == Stack::Temporal,
                    AttendAt::Step(k) => self.stack == Stack::Depformer && k < spec.dep_q,
                };
                if layer >= layers || !at_ok {
                    return Err("no such attention layer or step on this stack".into());
                }
                Ok(())
            }
            Op::SiluGate { from, to } => {
                distinct(from, to)?;
                same(w(from), 2 * w(to), "gate width")
            }
            Op::AddInto { from, to } => {
                distinct(from, to)?;
                same(w(from), w(to), "widths")
            }
        }
    }
}

/// One pre-norm transformer layer, in place on the residual stream [`Buf::X`]: the attention
/// block, then the gated SiLU feed-forward block, each added to the residual.
fn layer(ops: &mut Vec<Op>, stack: Stack, l: usize, proj: impl Fn(Proj) -> Mat, at: AttendAt) {
    use Buf::*;
    ops.extend([
        Op::RmsNorm {
            weight: Vector::Norm1(stack, l),
            from: X,
            to: H,
        },
        Op::MatMul {
            weight: proj(Proj::InProj),
            from: H,
            to: Qkv,
        },
        Op::Attend { layer: l, at },
        Op::MatMul {
            weight: proj(Proj::OutProj),
            from: Attn,
            to: Tmp,
        },
        Op::AddInto { from: Tmp, to: X },
        Op::RmsNorm {
            weight: Vector::Norm2(stack, l),
            from: X,
            to: H,
        },
        Op::MatMul {
            weight: proj(Proj::LinIn),
            from: H,
            to: G,
        },
        Op::SiluGate { from: G, to: U },
        Op::MatMul {
            weight: proj(Proj::LinOut),
            from: U,
            to: Tmp,
        },
        Op::AddInto { from: Tmp, to: X },
    ]);
}

/// Plans that are not the model, each broken in one way a backend could not notice by itself,
/// for the tests that show the plan is what runs: each must fail parity with the oracle on every
/// backend, and each is one a device can still record (so the device runs it rather than
/// refusing it). Needs 2 temporal layers and 2 Depformer steps.
#[cfg(any(test, feature = "testing"))]
pub fn broken_plans(spec: &LmSpec) -> Vec<(&'static str, LmPlan)> {
    let good = LmPlan::new(spec);
    let ops_per_layer = 10;
    let first_layer = 2 + spec.n_q;
    let mut out = vec![];

    let mut p = good.clone();
    p.temporal.ops.retain(|op| {
        !matches!(
            op,
            Op::Embed {
                table: Mat::TextEmb,
                ..
            }
        )
    });
    out.push(("text embedding dropped", p));

    // The feed-forward block of layer 0 before its attention block.
    let mut p = good.clone();
    let l0 = &mut p.temporal.ops[first_layer..first_layer + ops_per_layer];
    l0.rotate_left(ops_per_layer / 2);
    out.push(("layer 0's two blocks swapped", p));

    // Layers 0 and 1 in the other order (each keeps its weights and KV ring).
    let mut p = good.clone();
    let l01 = &mut p.temporal.ops[first_layer..first_layer + 2 * ops_per_layer];
    l01.rotate_left(ops_per_layer);
    out.push(("temporal layers 0 and 1 swapped", p));

    let mut p = good;
    p.depformer[1]
        .ops
        .retain(|op| !matches!(op, Op::Embed { .. }));
    out.push(("Depformer step 1's previous token dropped", p));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plans() -> Vec<(String, LmPlan, LmSpec)> {
        let mut out = vec![];
        let moshiko = LmSpec::moshiko();
        out.push(("moshiko".into(), LmPlan::new(&moshiko), moshiko.clone()));
        let tiny = LmSpec::from_config(&super::super::tests::tiny_config()).unwrap();
        out.push(("tiny".into(), LmPlan::new(&tiny), tiny.clone()));
        let mut stt = tiny;
        (stt.dep_q, stt.dep_layers) = (0, 0);
        out.push(("dep_q 0".into(), LmPlan::new(&stt), stt));
        out
    }

    /// Every intermediate is read by the op right after the one that writes it, and by no other:
    /// what lets a device fuse the pair (the module docs).
    #[test]
    fn intermediates_are_read_by_the_next_op_alone() {
        for (name, plan, _) in plans() {
            for pass in std::iter::once(&plan.temporal).chain(&plan.depformer) {
                let ops = &pass.ops;
                for (i, op) in ops.iter().enumerate() {
                    for b in op.reads().filter(|b| b.is_intermediate()) {
                        let prev = i.checked_sub(1).map(|p| ops[p].writes());
                        assert_eq!(prev, Some(b), "{name}: op {i} {op:?} reads {b:?}");
                    }
                    let w = op.writes();
                    if w.is_intermediate() {
                        let next = ops.get(i + 1).map(|n| n.reads().any(|r| r == w));
                        assert_eq!(next, Some(true), "{name}: op {i} {op:?}: {w:?} unread");
                        let later = ops[i + 2..]
                            .iter()
                            .take_while(|o| o.writes() != w)
                            .any(|o| o.reads().any(|r| r == w));
                        assert!(!later, "{name}: op {i}'s {w:?} read again later");
                    }
                    // No op reads what it writes, except the accumulating ones.
                    let acc = matches!(op, Op::Embed { .. } | Op::AddInto { .. });
                    let own = op.reads().filter(|&r| r == w).count();
                    assert_eq!(own, usize::from(acc), "{name}: op {i} {op:?}");
                }
            }
        }
    }

    /// The CPU runs its plan: each broken plan fails the oracle's greedy trace (the model's own
    /// plan passes it: `lm::tests::greedy_parity_with_oracle`), and an unfit plan is refused.
    #[test]
    fn a_broken_plan_fails_parity_on_the_cpu() {
        use crate::lm::{KvDtype, LmModel};
        use crate::sampling::{Sampler, SamplerConfig};
        let dir = super::super::tests::fixture_dir();
        let trace = testkit::TensorFile::open(dir.join("trace.safetensors"));
        let codes = testkit::TensorFile::open(dir.join("CODES.safetensors"))
            .i64("codes")
            .0;
        let steps = trace.i64("input_tokens").1[0];
        // The largest distance of the three traced tensors from the oracle's.
        let run = |m: &LmModel| {
            let mut sampler = Sampler::new(SamplerConfig::greedy(), 128, 64).unwrap();
            let rec = super::super::tests::run(m, &codes, steps, None, &mut sampler, KvDtype::F32);
            let d = |got: &[f32], name| testkit::compare::max_abs_diff(got, &trace.f32(name).0);
            d(&rec.transformer_out, "transformer_out")
                .max(d(&rec.text_logits, "text_logits"))
                .max(d(&rec.depformer_logits, "depformer_logits"))
        };
        let model = || super::super::tests::tiny_model("model.safetensors");
        assert!(run(&model()) < 1e-4);
        for (name, plan) in broken_plans(model().spec()) {
            let d = run(&model().with_plan(plan).unwrap());
            eprintln!("{name}: {d:e} from the oracle");
            assert!(d > 1e-2, "{name}: {d}");
        }
        let mut unfit = LmPlan::new(model().spec());
        unfit.depformer.pop();
        assert!(matches!(model().with_plan(unfit), Err(LmError::Config(_))));
        let mut unfit = LmPlan::new(model().spec());
        unfit.temporal.ops[1] = Op::MatMul {
            weight: Mat::TextLinear,
            from: Buf::X,
            to: Buf::Qkv,
        };
        assert!(matches!(model().with_plan(unfit), Err(LmError::Config(_))));
    }

    /// Every weight the plan names exists in the table of its spec, and every matrix and vector
    /// of the table is read by the plan exactly as often as the frame reads it (once, the
    /// Depformer's norms once per step).
    #[test]
    fn the_plan_reads_every_weight_of_the_table() {
        for (name, plan, spec) in plans() {
            let table = LmTensors::table(&spec);
            let mut mats = std::collections::HashMap::<String, usize>::new();
            let mut vecs = std::collections::HashMap::<String, usize>::new();
            for pass in std::iter::once(&plan.temporal).chain(&plan.depformer) {
                for op in &pass.ops {
                    match *op {
                        Op::Embed { table: m, .. } | Op::MatMul { weight: m, .. } => {
                            let r = m.of(&table);
                            let key = format!("{}{:?}", r.name, r.take);
                            *mats.entry(key).or_default() += 1;
                        }
                        Op::RmsNorm { weight, .. } => {
                            *vecs.entry(weight.of(&table).name.clone()).or_default() += 1;
                        }
                        _ => {}
                    }
                }
            }
            for m in table.matrices() {
                let key = format!("{}{:?}", m.name, m.take);
                assert_eq!(mats.remove(&key), Some(1), "{name}: {key}");
            }
            assert!(mats.is_empty(), "{name}: {mats:?}");
            for v in table.vectors() {
                let per_frame = if v.name.starts_with("depformer") {
                    spec.dep_q
                } else {
                    1
                };
                assert_eq!(vecs.remove(&v.name), Some(per_frame), "{name}: {}", v.name);
            }
            assert!(vecs.is_empty(), "{name}: {vecs:?}");
            assert_eq!(plan.depformer.len(), spec.dep_q, "{name}");
        }
    }
}
