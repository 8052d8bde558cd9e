//! Mimi's stage list, written once: the encoder's and the decoder's steps over weights named by
//! their place in the codec.
//!
//! [`MimiPlan::new`] reads like the codec it describes (architecture reference §1.8). Encoder:
//! SEANet (`conv0`, per ratio its residual units then its strided convolution, ELU + `last`) →
//! tap `enc_seanet` → the encoder transformer's layers → tap `enc_transformer` → the learnt
//! stride-2 downsample → tap `latent` → split RVQ. Decoder: RVQ decode → tap `dec_latent` → the
//! depthwise transposed-convolution upsample → tap `dec_upsample` → the decoder transformer's
//! layers → tap `dec_transformer` → SEANet (`conv0`, per ratio ELU + its transposed convolution
//! then its residual units, ELU + `last`). It is plain data built once from a [`MimiConfig`];
//! the backends do not restate it:
//!
//! * the CPU ([`MimiEncoder`](super::MimiEncoder) and the other streaming types, `walk.rs`)
//!   *walks* it every call, one `match` arm per step, nothing allocated;
//! * the GPU (`moshi-gpu`, `gpu/src/mimi/streams.rs`) *records* it once, when a codec is made, as
//!   its list of kernel launches.
//!
//! **Granularity.** A step is one layer as the checkpoint names it: a convolution, a transposed
//! convolution, a residual unit (`x + conv_1(ELU(conv_k(ELU(x))))`: its two convolutions and its
//! skip are one unit in the checkpoint and in every SEANet implementation), one transformer
//! layer, the RVQ. That is the level at which a reader checks the codec against Kyutai's code, and
//! the level at which a plan can be broken in a way no backend notices (a unit dropped, two
//! layers swapped: `broken_plans`). Two things are *not* steps, because no device runs them
//! alone:
//!
//! * **ELU** is a flag of the step that reads it ([`Step::Conv`]'s `elu`): the CPU applies it as
//!   the convolution gathers its input, the GPU once per value in the *producer's* epilogue (a
//!   second output buffer every ELU reader reads), a fusion the plan leaves to the device;
//! * a transformer's entry and exit (the transposes to rows and back, the RoPE angles, the
//!   position's advance) belong to a *run* of consecutive [`Step::Layer`]s of one side, which
//!   each device opens and closes itself.
//!
//! Likewise the CPU runs the SEANet's high-rate steps stream by stream (`walk.rs`) and the GPU
//! gives every slot a region of each buffer: how a device groups the steps is its business.
//!
//! **Taps** ([`Step::Tap`]) name the points whose activations the parity tests compare with the
//! oracle's traces ([`Stage`]); a traced call reports them, an untraced one skips them.
//!
//! [`MimiPlan::flow`] walks a side against a model and gives what each step reads and writes
//! per frame ([`Flow`]); it is also the check that refuses, with a typed error, a plan that does
//! not fit the weights (a convolution whose input channels differ from what reaches it, a layer
//! named twice, a side that does not end in codes or samples).

use super::conv::{Conv1d, ConvTr1d};
use super::seanet::ResBlock;
use super::transformer::Transformer;
use super::{Mimi, MimiError, Stage};
use crate::checkpoint::MimiConfig;

/// The encoder or the decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// PCM → codes.
    Encoder,
    /// Codes → PCM.
    Decoder,
}

/// A convolution of the codec, by place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConvAt {
    /// The first convolution of a side's SEANet.
    Conv0(Side),
    /// The strided convolution closing encoder SEANet stage `i` (`i` counts from the input).
    Down(usize),
    /// The last convolution of a side's SEANet.
    Last(Side),
    /// The encoder's learnt downsample to the frame rate (replicate padding).
    Downsample,
}

/// A transposed convolution of the codec, by place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConvTrAt {
    /// The transposed convolution opening decoder SEANet stage `i` (`i` counts from the latent).
    Up(usize),
    /// The decoder's depthwise upsample from the frame rate.
    Upsample,
}

/// A residual unit of a side's SEANet: unit `block` of stage `stage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ResAt {
    /// The side.
    pub side: Side,
    /// The stage (as in [`ConvAt::Down`] / [`ConvTrAt::Up`]).
    pub stage: usize,
    /// The unit within the stage.
    pub block: usize,
}

/// One step of a side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// A causal convolution; with `elu`, of the ELU of its input.
    Conv {
        /// Which convolution.
        at: ConvAt,
        /// ELU applied to the input first.
        elu: bool,
    },
    /// A causal transposed convolution; with `elu`, of the ELU of its input.
    ConvTr {
        /// Which transposed convolution.
        at: ConvTrAt,
        /// ELU applied to the input first.
        elu: bool,
    },
    /// A residual unit, in place.
    Res(ResAt),
    /// Layer `layer` of a side's transformer, in place (see the module docs on runs).
    Layer {
        /// Whose transformer.
        side: Side,
        /// The layer.
        layer: usize,
    },
    /// The split RVQ's search: latent `[dim, 1]` per frame → codes.
    RvqEncode,
    /// The split RVQ's decode: codes → latent `[dim, 1]` per frame.
    RvqDecode,
    /// The activation here is the oracle's `stage` tensor.
    Tap(Stage),
}

impl Step {
    /// Whether the step reads the ELU of its input (a device that computes the ELU in the
    /// producer asks this of the next step).
    pub fn reads_elu(&self) -> bool {
        match *self {
            Step::Conv { elu, .. } | Step::ConvTr { elu, .. } => elu,
            Step::Res(_) => true,
            _ => false,
        }
    }
}

/// What flows between two steps, per frame and stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// The frame's codes (`n_codebooks`).
    Codes,
    /// Activations `[channels, steps]` (channel-major).
    Act {
        /// Channels.
        channels: usize,
        /// Time steps per frame.
        steps: usize,
    },
}

impl Flow {
    /// Values of an activation (0 for codes).
    pub fn values(self) -> usize {
        match self {
            Flow::Codes => 0,
            Flow::Act { channels, steps } => channels * steps,
        }
    }
}

/// The encoder's and the decoder's steps (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MimiPlan {
    /// PCM → codes.
    pub encoder: Vec<Step>,
    /// Codes → PCM.
    pub decoder: Vec<Step>,
}

impl MimiPlan {
    /// The codec's plan for `config`.
    pub fn new(config: &MimiConfig) -> MimiPlan {
        let stages = config.seanet.ratios.len();
        let units = config.seanet.n_residual_layers;
        let layers = config.transformer.num_layers;
        let res =
            |side, stage| (0..units).map(move |block| Step::Res(ResAt { side, stage, block }));
        let transformer = |side| (0..layers).map(move |layer| Step::Layer { side, layer });
        let (enc, dec) = (Side::Encoder, Side::Decoder);

        let mut encoder = vec![Step::Conv {
            at: ConvAt::Conv0(enc),
            elu: false,
        }];
        for i in 0..stages {
            encoder.extend(res(enc, i));
            encoder.push(Step::Conv {
                at: ConvAt::Down(i),
                elu: true,
            });
        }
        encoder.push(Step::Conv {
            at: ConvAt::Last(enc),
            elu: true,
        });
        encoder.push(Step::Tap(Stage::EncSeanet));
        encoder.extend(transformer(enc));
        encoder.extend([
            Step::Tap(Stage::EncTransformer),
            Step::Conv {
                at: ConvAt::Downsample,
                elu: false,
            },
            Step::Tap(Stage::Latent),
            Step::RvqEncode,
        ]);

        let mut decoder = vec![
            Step::RvqDecode,
            Step::Tap(Stage::DecLatent),
            Step::ConvTr {
                at: ConvTrAt::Upsample,
                elu: false,
            },
            Step::Tap(Stage::DecUpsample),
        ];
        decoder.extend(transformer(dec));
        decoder.push(Step::Tap(Stage::DecTransformer));
        decoder.push(Step::Conv {
            at: ConvAt::Conv0(dec),
            elu: false,
        });
        for i in 0..stages {
            decoder.push(Step::ConvTr {
                at: ConvTrAt::Up(i),
                elu: true,
            });
            decoder.extend(res(dec, i));
        }
        decoder.push(Step::Conv {
            at: ConvAt::Last(dec),
            elu: true,
        });
        MimiPlan { encoder, decoder }
    }

    /// A side's steps.
    pub fn side(&self, side: Side) -> &[Step] {
        match side {
            Side::Encoder => &self.encoder,
            Side::Decoder => &self.decoder,
        }
    }

    /// Checks both sides against `mimi` ([`MimiPlan::flow`]).
    pub fn check(&self, mimi: &Mimi) -> Result<(), MimiError> {
        self.flow(mimi, Side::Encoder)?;
        self.flow(mimi, Side::Decoder).map(|_| ())
    }

    /// What each step of `side` reads and writes per frame of `mimi` (`(in, out)` per step), or
    /// why the side does not fit `mimi`: a weight it names is absent, a step gets what it cannot
    /// read, a transformer layer of the other side or one named twice, or the side does not end
    /// in codes (encoder) or `frame_size` samples (decoder).
    pub fn flow(&self, mimi: &Mimi, side: Side) -> Result<Vec<(Flow, Flow)>, MimiError> {
        let cfg = mimi.config();
        let d = mimi.dimension();
        let (start, end) = (
            Flow::Act {
                channels: cfg.channels,
                steps: mimi.frame_size(),
            },
            Flow::Codes,
        );
        let (start, end) = match side {
            Side::Encoder => (start, end),
            Side::Decoder => (end, start),
        };
        let steps = self.side(side);
        let mut out = Vec::with_capacity(steps.len());
        let mut layers = Vec::new();
        let mut f = start;
        for (i, step) in steps.iter().enumerate() {
            let bad =
                |why: String| MimiError::Config(format!("{side:?} step {i} ({step:?}): {why}"));
            let act = |f: Flow| match f {
                Flow::Act { channels, steps } => Ok((channels, steps)),
                Flow::Codes => Err(bad("reads codes".into())),
            };
            let missing = || bad("no such weight".into());
            let next = match *step {
                Step::Conv { at, .. } => {
                    let c = mimi.conv_at(at).ok_or_else(missing)?;
                    let (ch, t) = act(f)?;
                    if ch != c.cin || !t.is_multiple_of(c.stride) {
                        return Err(bad(format!("gets [{ch}, {t}] per frame")));
                    }
                    Flow::Act {
                        channels: c.cout,
                        steps: t / c.stride,
                    }
                }
                Step::ConvTr { at, .. } => {
                    let c = mimi.conv_tr_at(at).ok_or_else(missing)?;
                    let (ch, t) = act(f)?;
                    if ch != c.cin {
                        return Err(bad(format!("gets [{ch}, {t}] per frame")));
                    }
                    Flow::Act {
                        channels: c.cout,
                        steps: t * c.stride,
                    }
                }
                Step::Res(at) => {
                    let r = mimi.res_at(at).ok_or_else(missing)?;
                    let (ch, _) = act(f)?;
                    if ch != r.c1.cin || r.c2.cout != ch {
                        return Err(bad(format!("gets {ch} channels")));
                    }
                    f
                }
                Step::Layer { side: s, layer } => {
                    let tr = mimi.transformer(s);
                    let (ch, _) = act(f)?;
                    if s != side || layer >= tr.layers.len() || layers.contains(&layer) {
                        return Err(bad("not a layer of this side's transformer, once".into()));
                    }
                    if ch != tr.d {
                        return Err(bad(format!("gets {ch} channels")));
                    }
                    layers.push(layer);
                    f
                }
                Step::RvqEncode => match act(f)? {
                    (ch, 1) if ch == d => Flow::Codes,
                    (ch, t) => return Err(bad(format!("gets [{ch}, {t}] per frame"))),
                },
                Step::RvqDecode => match f {
                    Flow::Codes => Flow::Act {
                        channels: d,
                        steps: 1,
                    },
                    Flow::Act { .. } => return Err(bad("reads activations".into())),
                },
                Step::Tap(_) => f,
            };
            out.push((f, next));
            f = next;
        }
        if f != end {
            return Err(MimiError::Config(format!(
                "the {side:?} ends in {f:?}, not {end:?}"
            )));
        }
        Ok(out)
    }
}

/// Plans that are not the codec, each broken in one way a backend could not notice by itself,
/// for the tests that show the plan is what runs: each must fail parity with the oracle on every
/// backend, and each is one a device can still record. Needs three SEANet stages and two
/// transformer layers.
#[cfg(any(test, feature = "testing"))]
pub fn broken_plans(config: &MimiConfig) -> Vec<(&'static str, MimiPlan)> {
    let good = MimiPlan::new(config);
    let find = |steps: &[Step], s: Step| steps.iter().position(|&x| x == s).expect("in the plan");
    let unit = |side, stage, block| Step::Res(ResAt { side, stage, block });
    let layer = |side, layer| Step::Layer { side, layer };
    let mut out = vec![];

    let mut p = good.clone();
    let i = find(&p.encoder, unit(Side::Encoder, 1, 0));
    p.encoder.remove(i);
    out.push(("encoder stage 1's first residual unit dropped", p));

    let mut p = good.clone();
    let i = find(&p.decoder, unit(Side::Decoder, 2, 0));
    p.decoder.remove(i);
    out.push(("decoder stage 2's first residual unit dropped", p));

    let mut p = good.clone();
    let i = find(&p.encoder, layer(Side::Encoder, 0));
    p.encoder.swap(i, i + 1);
    out.push(("encoder transformer layers 0 and 1 swapped", p));

    let mut p = good;
    let i = find(&p.decoder, layer(Side::Decoder, 0));
    p.decoder.swap(i, i + 1);
    out.push(("decoder transformer layers 0 and 1 swapped", p));
    out
}

/// The weights a plan names, resolved against the CPU model.
impl Mimi {
    /// The convolution at `at`.
    pub(crate) fn conv_at(&self, at: ConvAt) -> Option<&Conv1d> {
        match at {
            ConvAt::Conv0(Side::Encoder) => Some(&self.encoder.conv0),
            ConvAt::Conv0(Side::Decoder) => Some(&self.decoder.conv0),
            ConvAt::Down(i) => self.encoder.stages.get(i).map(|s| &s.1),
            ConvAt::Last(Side::Encoder) => Some(&self.encoder.last),
            ConvAt::Last(Side::Decoder) => Some(&self.decoder.last),
            ConvAt::Downsample => Some(&self.down),
        }
    }

    /// The transposed convolution at `at`.
    pub(crate) fn conv_tr_at(&self, at: ConvTrAt) -> Option<&ConvTr1d> {
        match at {
            ConvTrAt::Up(i) => self.decoder.stages.get(i).map(|s| &s.0),
            ConvTrAt::Upsample => Some(&self.up),
        }
    }

    /// The residual unit at `at`.
    pub(crate) fn res_at(&self, at: ResAt) -> Option<&ResBlock> {
        match at.side {
            Side::Encoder => self.encoder.stages.get(at.stage)?.0.get(at.block),
            Side::Decoder => self.decoder.stages.get(at.stage)?.1.get(at.block),
        }
    }

    /// A side's transformer.
    pub(crate) fn transformer(&self, side: Side) -> &Transformer {
        match side {
            Side::Encoder => &self.enc_tr,
            Side::Decoder => &self.dec_tr,
        }
    }
}
