//! [`Streams`]: the device state of a codec's slots (one region per slot in every buffer: the
//! convolution histories, transposed-convolution tails, K/V rings, counters, work buffers, inputs
//! and outputs), the launches of both directions over all of them recorded from the model's plan
//! ([`record_side`]), and the host's part in the encoder's code decisions ([`Decider`]).

use model::mimi::{ConvAt, Flow, Side, Step};

use super::read_words;
use super::record::{ConvOut, Direction, Recorder, SlotBuf, TrBufs};
use super::shaders::MimiKernel;
use super::weights::GpuMimiWeights;
use super::{storage_usage, COUNTERS, DEC_POS, ENC_FRAMES, ENC_POS};
use crate::GpuError;

/// The streaming state of `slots` conversations in device memory and the recorded launches of
/// an encoder frame and of a decoder frame over all of them: the device part of a
/// [`super::GpuMimi`]. A call writes its slot list
/// to `list` and replays one direction's launches once, for every listed slot together.
#[derive(Debug)]
pub(super) struct Streams {
    pub(super) slots: usize,
    /// The call's slot list: the number of listed slots, then the slots in list order.
    pub(super) list: wgpu::Buffer,
    counters: SlotBuf,
    pub(super) dec: Direction,
    pub(super) enc: Direction,
    pub(super) codes_in: SlotBuf,
    pub(super) pcm_out: SlotBuf,
    pub(super) pcm_in: SlotBuf,
    /// Codes of every level, then the number of levels the device could not prove.
    pub(super) codes_out: SlotBuf,
    /// The projected latents of the last encoder frame (semantic, acoustic).
    u_first: SlotBuf,
    u_rest: SlotBuf,
}

/// The SEANet work buffers of one direction, `amax` floats each but `h`: a stage reads `a` (its
/// ELU in `ea`, written by the producer) and writes `b` and its ELU `eb`, which become the next
/// stage's `a` and `ea` ([`Seanet::next_stage`]); `h` (`hmax` floats) is a residual block's
/// hidden activation.
struct Seanet {
    a: SlotBuf,
    ea: SlotBuf,
    b: SlotBuf,
    eb: SlotBuf,
    h: SlotBuf,
}

impl Seanet {
    /// The buffers of direction `dir` ("enc", "dec": their labels' prefix).
    fn new(r: &Recorder<'_>, dir: &str, (amax, hmax): (usize, usize)) -> Result<Seanet, GpuError> {
        let buf = |what: &str, floats| r.buffer(&format!("{dir} {what}"), floats);
        Ok(Seanet {
            a: buf("a", amax)?,
            ea: buf("elu a", amax)?,
            b: buf("b", amax)?,
            eb: buf("elu b", amax)?,
            h: buf("h", hmax)?,
        })
    }

    /// The stage's output becomes the next stage's input.
    fn next_stage(&mut self) {
        std::mem::swap(&mut self.a, &mut self.b);
        std::mem::swap(&mut self.ea, &mut self.eb);
    }
}

impl Streams {
    /// One direction's recorded frame with its input and output buffers: the encoder's (PCM in,
    /// codes out) when `encoder_side`, else the decoder's (codes in, PCM out).
    pub(super) fn side(&self, encoder_side: bool) -> (&Direction, &SlotBuf, &SlotBuf) {
        if encoder_side {
            (&self.enc, &self.pcm_in, &self.codes_out)
        } else {
            (&self.dec, &self.codes_in, &self.pcm_out)
        }
    }

    /// Fresh streams of `slots` slots (at least one) over the uploaded weights: allocates the
    /// state and work buffers and records both directions' launches.
    pub(super) fn new(w: &GpuMimiWeights, slots: usize) -> Result<Streams, GpuError> {
        let ctx = &w.ctx;
        let m = &w.mimi;
        let fs = m.frame_size();
        let nq = m.n_codebooks();
        let list = ctx.buffer("mimi slot list", ((slots + 1) * 4) as u64, storage_usage())?;
        let io = |label: &str, stride: usize| -> Result<SlotBuf, GpuError> {
            Ok(SlotBuf {
                buf: ctx.buffer(label, (slots * stride * 4) as u64, storage_usage())?,
                stride,
            })
        };
        let counters = io("mimi counters", COUNTERS)?;
        let codes_in = io("codes in", nq)?;
        let pcm_out = io("pcm out", fs)?;
        let pcm_in = io("pcm in", fs)?;
        let codes_out = io("codes out", nq + 1)?;
        let cb = w.cb_dim;
        let u_first = io("u first", cb)?;
        let u_rest = io("u rest", cb)?;

        let rec = |side, input: &SlotBuf, output: &SlotBuf| {
            let mut r = Recorder::new(w, slots, &counters, &list)?;
            let latents = (&u_first, &u_rest);
            record_side(&mut r, side, (input, output), latents)?;
            if side == Side::Encoder {
                // The downsample's frames seen (its replicate padding's first frame).
                r.launch_grid(
                    MimiKernel::Advance,
                    &[ENC_FRAMES, 1],
                    &[&counters],
                    1,
                    (1, 1),
                );
            }
            r.finish()
        };
        let dec = rec(Side::Decoder, &codes_in, &pcm_out)?;
        let enc = rec(Side::Encoder, &pcm_in, &codes_out)?;
        Ok(Streams {
            slots,
            list,
            counters,
            dec,
            enc,
            codes_in,
            pcm_out,
            pcm_in,
            codes_out,
            u_first,
            u_rest,
        })
    }

    /// Records the zeroing of `slot`'s region of every streaming buffer (back to a fresh
    /// stream; the other slots' regions are left as they are).
    pub(super) fn clear(&self, enc: &mut wgpu::CommandEncoder, slot: usize) {
        let state = self.dec.state.iter().chain(&self.enc.state);
        for b in std::iter::once(&self.counters).chain(state) {
            let (at, bytes) = b.region(slot);
            enc.clear_buffer(&b.buf, at, Some(bytes));
        }
    }
}

impl Streams {
    /// The pieces of `slot`'s decoder state a replayed decoder frame needs restored, as (buffer,
    /// byte offset, bytes): the counters' decoder words (`DEC_POS` up to the encoder's) and every
    /// decoder state buffer but the K/V rings (see [`super::record::Direction::rings`]).
    fn decoder_pieces(&self, slot: usize) -> impl Iterator<Item = (&wgpu::Buffer, u64, u64)> {
        let (at, _) = self.counters.region(slot);
        let counters = (
            &self.counters.buf,
            at + u64::from(DEC_POS) * 4,
            u64::from(ENC_POS - DEC_POS) * 4,
        );
        let rings = &self.dec.rings;
        let rest = self
            .dec
            .state
            .iter()
            .enumerate()
            .filter(move |(i, _)| !rings.contains(i))
            .map(move |(_, b)| {
                let (at, bytes) = b.region(slot);
                (&b.buf, at, bytes)
            });
        std::iter::once(counters).chain(rest)
    }

    /// Bytes [`Streams::record_decoder_copy`] moves each way.
    pub(super) fn decoder_snapshot_bytes(&self) -> u64 {
        self.decoder_pieces(0).map(|(_, _, n)| n).sum()
    }

    /// Records the copy of `slot`'s decoder state into `shadow` (back to back), or, with
    /// `restore`, back from it: a decoder frame recorded after a snapshot can be replayed from
    /// the same state after a restore.
    pub(super) fn record_decoder_copy(
        &self,
        enc: &mut wgpu::CommandEncoder,
        slot: usize,
        shadow: &wgpu::Buffer,
        restore: bool,
    ) {
        let mut off = 0;
        for (buf, at, bytes) in self.decoder_pieces(slot) {
            if restore {
                enc.copy_buffer_to_buffer(shadow, off, buf, at, bytes);
            } else {
                enc.copy_buffer_to_buffer(buf, at, shadow, off, bytes);
            }
            off += bytes;
        }
    }
}

/// A device codec's submission count and the host's part in the encoder's code decisions: its
/// scratch, how many frames it decided, and whether it decides every frame.
#[derive(Debug)]
pub(super) struct Decider {
    lat_words: Vec<u32>,
    latents: Vec<f32>,
    pub(super) host_decisions: u64,
    pub(super) submissions: u64,
    pub(super) force_host: bool,
}

impl Decider {
    /// Counters at zero and the scratch of a codec whose latents have `cb` values per
    /// projection.
    pub(super) fn new(cb: usize) -> Decider {
        Decider {
            lat_words: vec![0; 2 * cb],
            latents: vec![0.0; 2 * cb],
            host_decisions: 0,
            submissions: 0,
            force_host: false,
        }
    }

    /// The codes of one encoder frame from its readback words (`nq` codes, then the number of
    /// levels the device could not prove): the device's when proven, else the host's exact
    /// decision on the frame's latents (read back from `slot` of `s` through `readback` in one
    /// more submission).
    pub(super) fn decide(
        &mut self,
        w: &GpuMimiWeights,
        (s, slot): (&Streams, usize),
        readback: &wgpu::Buffer,
        words: &[u32],
        codes: &mut [u32],
    ) -> Result<(), GpuError> {
        let nq = codes.len();
        codes.copy_from_slice(&words[..nq]);
        if words[nq] == 0 && !self.force_host {
            return Ok(());
        }
        self.decide_on_host(w, (s, slot), readback, codes)?;
        self.host_decisions += 1;
        Ok(())
    }

    fn decide_on_host(
        &mut self,
        w: &GpuMimiWeights,
        (s, slot): (&Streams, usize),
        readback: &wgpu::Buffer,
        codes: &mut [u32],
    ) -> Result<(), GpuError> {
        let (lat_words, latents) = (&mut self.lat_words, &mut self.latents);
        // The exact decision on the host, from the latents still in device memory.
        let cb = latents.len() / 2;
        let ctx = &w.ctx;
        let mut enc = ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        let (at, bytes) = s.u_first.region(slot);
        enc.copy_buffer_to_buffer(&s.u_first.buf, at, readback, 0, bytes);
        let (at, bytes) = s.u_rest.region(slot);
        enc.copy_buffer_to_buffer(&s.u_rest.buf, at, readback, bytes, bytes);
        ctx.submit(enc.finish());
        self.submissions += 1;
        read_words(ctx, readback, lat_words)?;
        for (v, b) in latents.iter_mut().zip(lat_words.iter()) {
            *v = f32::from_bits(*b);
        }
        let (first, rest) = latents.split_at_mut(cb);
        w.mimi.rvq_codes_exact(first, rest, codes);
        Ok(())
    }
}

/// Records the steps of `side` of the model's plan (`model::mimi::MimiPlan`, one frame): the
/// side's `input` (PCM, or codes for the RVQ decode) to its `output` (codes, or PCM), the
/// encoder's projected latents into `latents` (what the host's exact decision reads back).
///
/// The activations move through the SEANet buffers ([`Seanet`]): a step reads `a` (or the
/// side's input before any step ran) and leaves its output in `a`. The device's fusion: a step
/// whose next step reads the ELU of its output (a SEANet convolution, a residual unit) writes
/// that ELU too, once, into `ea`; a plan asking for an ELU where the producer could not write
/// it is refused. The decoder's last step writes the PCM buffer directly.
fn record_side(
    r: &mut Recorder<'_>,
    side: Side,
    (input, output): (&SlotBuf, &SlotBuf),
    (u_first, u_rest): (&SlotBuf, &SlotBuf),
) -> Result<(), GpuError> {
    let w = r.w;
    let m = &w.mimi;
    let steps = m.plan().side(side);
    let refuse = |why: String| GpuError::Unsupported {
        format: "Mimi plan".into(),
        why,
    };
    let flows = m.plan().flow(m, side).map_err(|e| refuse(e.to_string()))?;
    let per_frame = |f: Flow| match f {
        Flow::Act { channels, steps } => (channels, steps),
        Flow::Codes => (0, 1),
    };
    let amax = flows.iter().map(|(i, o)| i.values().max(o.values())).max();
    let hmax = steps
        .iter()
        .zip(&flows)
        .filter_map(|(s, (fin, _))| match s {
            Step::Res(at) => Some(w.res.get(at)?.c1.shape.cout * per_frame(*fin).1),
            _ => None,
        });
    let dir = if side == Side::Encoder { "enc" } else { "dec" };
    let sizes = (amax.unwrap_or(1), hmax.max().unwrap_or(1));
    let mut sn = Seanet::new(r, dir, sizes)?;
    let last = steps.iter().rposition(|s| !matches!(s, Step::Tap(_)));
    let mut from_input = side == Side::Encoder;
    let mut elu_ready = false;
    let mut run: Option<TrBufs> = None;
    let mut wrote_output = false;
    let absent = |s: &Step| refuse(format!("{s:?}: its weights were not uploaded"));
    for (i, step) in steps.iter().enumerate() {
        let (c, t) = per_frame(flows[i].0);
        let next_elu = steps[i + 1..]
            .iter()
            .find(|s| !matches!(s, Step::Tap(_)))
            .is_some_and(Step::reads_elu);
        let to_output = side == Side::Decoder && Some(i) == last;
        let out = if to_output {
            ConvOut::Raw(output)
        } else if next_elu {
            ConvOut::Dual(&sn.b, &sn.eb)
        } else {
            ConvOut::Raw(&sn.b)
        };
        // What a step reads: the side's input, or `a`, or its ELU `ea`.
        let x = match step.reads_elu() {
            true if from_input || !elu_ready => {
                return Err(refuse(format!("{step:?} reads an ELU no step wrote")))
            }
            true => &sn.ea,
            false if from_input => input,
            false => &sn.a,
        };
        let moved = match *step {
            Step::Conv { at, .. } => {
                let conv = w.convs.get(&at).ok_or_else(|| absent(step))?;
                let counter = if at == ConvAt::Downsample {
                    ENC_FRAMES
                } else {
                    0
                };
                r.conv(conv, x, t, out, false, counter)?;
                true
            }
            Step::ConvTr { at, .. } => {
                let conv = w.conv_trs.get(&at).ok_or_else(|| absent(step))?;
                r.conv_tr(conv, x, t, out)?;
                true
            }
            Step::Res(at) => {
                let blk = w.res.get(&at).ok_or_else(|| absent(step))?;
                r.res(blk, (&sn.a, &sn.ea), &sn.h, t)?;
                elu_ready = true;
                false
            }
            Step::Layer { side: s, layer } => {
                if from_input {
                    return Err(refuse(format!("{step:?} reads the side's input")));
                }
                let tr = w.transformers.get(&s).ok_or_else(|| absent(step))?;
                let pos = if s == Side::Encoder { ENC_POS } else { DEC_POS };
                let b = match run.take() {
                    Some(b) => b,
                    None => r.transformer_enter(tr, &sn.a, t)?,
                };
                r.transformer_layer(tr, &b, layer, t, pos)?;
                if matches!(steps.get(i + 1), Some(Step::Layer { .. })) {
                    run = Some(b);
                } else {
                    r.transformer_leave(tr, &b, &sn.a, t, pos);
                }
                elu_ready = false;
                false
            }
            Step::RvqEncode => {
                let (d, cb) = (m.dimension(), w.cb_dim);
                // [d, 1] is also the row [1, d]. (The stats only fill the unread LayerScale
                // binding.)
                let g = &w.rvq;
                r.linear(x, &g.first_input_proj, u_first, &g.stats, (1, d, cb), 0);
                r.linear(x, &g.rest_input_proj, u_rest, &g.stats, (1, d, cb), 0);
                r.rvq_search(u_first, u_rest, output)?;
                false
            }
            Step::RvqDecode => {
                r.rvq_decode(input, &sn.b);
                true
            }
            Step::Tap(stage) => {
                r.tap(stage, x, c * t);
                false
            }
        };
        if moved {
            sn.next_stage();
            elu_ready = next_elu;
            from_input = false;
            wrote_output |= to_output;
        }
    }
    if side == Side::Decoder && !wrote_output {
        // The plan ends in a step that works in place: the samples are in `a`.
        let n = m.frame_size() * m.config().channels;
        r.launch(MimiKernel::Transpose, &[n as u32, 1], &[&sn.a, output], n);
    }
    Ok(())
}
