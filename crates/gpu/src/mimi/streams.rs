//! [`Streams`]: the device state of a codec's slots (one region per slot in every buffer: the
//! convolution histories, transposed-convolution tails, K/V rings, counters, work buffers, inputs
//! and outputs), the recorded launches of both directions over all of them, and the host's part
//! in the encoder's code decisions ([`Decider`]).

use model::mimi::Stage;

use super::read_words;
use super::record::{ConvOut, Direction, Recorder, SlotBuf};
use super::shaders::MimiKernel;
use super::weights::{DecoderGpu, EncoderGpu, GpuMimiWeights};
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
        let d = m.dimension();
        let s = m.config().resample_stride();
        let t2 = s;
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

        // Decoder: codes → latent [d, 1] → upsample [d, s] → transformer → SEANet → PCM.
        let dec = {
            let g = &w.dec;
            let mut r = Recorder::new(w, slots, &counters, &list)?;
            let lat = r.buffer("dec latent", d)?;
            let emb = r.buffer("dec emb", d * t2)?;
            r.rvq_decode(&codes_in, &lat);
            r.tap(Stage::DecLatent, &lat, d);
            r.conv_tr(&g.upsample, &lat, 1, ConvOut::Raw(&emb))?;
            r.tap(Stage::DecUpsample, &emb, d * t2);
            r.transformer(&g.transformer, &emb, t2, DEC_POS)?;
            r.tap(Stage::DecTransformer, &emb, d * t2);
            let mut sn = Seanet::new(&r, "dec", seanet_dec_sizes(g, t2))?;
            let mut t = t2;
            r.conv(&g.conv0, &emb, t, ConvOut::Dual(&sn.a, &sn.ea), false, 0)?;
            for (up, res) in &g.stages {
                r.conv_tr(up, &sn.ea, t, ConvOut::Dual(&sn.b, &sn.eb))?;
                t *= up.shape.stride;
                sn.next_stage();
                for blk in res {
                    r.res(blk, (&sn.a, &sn.ea), &sn.h, t)?;
                }
            }
            if t != fs {
                return Err(GpuError::Unsupported {
                    format: "Mimi".into(),
                    why: format!("the decoder gives {t} samples per frame, not {fs}"),
                });
            }
            r.conv(&g.last, &sn.ea, t, ConvOut::Raw(&pcm_out), false, 0)?;
            r.finish()?
        };

        // Encoder: PCM → SEANet [d, s] → transformer → downsample [d, 1] → projections → search.
        let enc = {
            let g = &w.enc;
            let mut r = Recorder::new(w, slots, &counters, &list)?;
            let mut sn = Seanet::new(&r, "enc", seanet_enc_sizes(g, fs))?;
            let emb = r.buffer("enc emb", d * t2)?;
            let lat = r.buffer("enc latent", d)?;
            let mut t = fs;
            r.conv(&g.conv0, &pcm_in, t, ConvOut::Dual(&sn.a, &sn.ea), false, 0)?;
            for (res, down) in &g.stages {
                for blk in res {
                    r.res(blk, (&sn.a, &sn.ea), &sn.h, t)?;
                }
                r.conv(down, &sn.ea, t, ConvOut::Dual(&sn.b, &sn.eb), false, 0)?;
                t /= down.shape.stride;
                sn.next_stage();
            }
            if t != t2 {
                return Err(GpuError::Unsupported {
                    format: "Mimi".into(),
                    why: format!("the encoder gives {t} steps per frame, not {t2}"),
                });
            }
            r.conv(&g.last, &sn.ea, t, ConvOut::Raw(&emb), false, 0)?;
            r.tap(Stage::EncSeanet, &emb, d * t2);
            r.transformer(&g.transformer, &emb, t2, ENC_POS)?;
            r.tap(Stage::EncTransformer, &emb, d * t2);
            r.conv(
                &g.downsample,
                &emb,
                t2,
                ConvOut::Raw(&lat),
                false,
                ENC_FRAMES,
            )?;
            r.tap(Stage::Latent, &lat, d);
            // [d, 1] is also the row [1, d].
            // (The stats only fill the unread LayerScale binding.)
            r.linear(&lat, &g.first_input_proj, &u_first, &g.stats, (1, d, cb), 0);
            r.linear(&lat, &g.rest_input_proj, &u_rest, &g.stats, (1, d, cb), 0);
            r.rvq_search(&u_first, &u_rest, &codes_out)?;
            r.launch_grid(
                MimiKernel::Advance,
                &[ENC_FRAMES, 1],
                &[&counters],
                1,
                (1, 1),
            );
            r.finish()?
        };
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

/// Largest activation (`[C, T]`) and hidden buffer of the SEANet decoder for `t` latent steps.
fn seanet_dec_sizes(g: &DecoderGpu, t: usize) -> (usize, usize) {
    let mut t = t;
    let mut amax = g.conv0.shape.cout * t;
    let mut hmax = 1;
    for (up, res) in &g.stages {
        t *= up.shape.stride;
        amax = amax.max(up.shape.cout * t);
        for r in res {
            hmax = hmax.max(r.c1.shape.cout * t);
        }
    }
    (amax, hmax)
}

/// Largest activation and hidden buffer of the SEANet encoder for `t` samples.
fn seanet_enc_sizes(g: &EncoderGpu, t: usize) -> (usize, usize) {
    let mut t = t;
    let mut amax = g.conv0.shape.cout * t;
    let mut hmax = 1;
    for (res, down) in &g.stages {
        for r in res {
            hmax = hmax.max(r.c1.shape.cout * t);
        }
        t /= down.shape.stride;
        amax = amax.max(down.shape.cout * t);
    }
    (amax, hmax)
}
