//! [`GpuDuplex`]: one conversation's whole duplex frame on the device in **one submission**:
//! Mimi encode of the user's frame → the LM step, its input column gathered on the device from a
//! delay ring → sampling on the device → Moshi's tokens written into the ring → Mimi decode of the
//! frame the delays make ready → one readback, waited for by its own submission index.
//!
//! # The delay ring
//!
//! The ring is [`model::lm::Generator`]'s token cache moved to the device, with the same rules
//! (`lm/gen.rs`'s module docs): `K = 1 + n_q` streams × `CT = max_delay + 2` slots, stored slot-major
//! (`[CT][K]` shader tokens) so that the streams of one slot are adjacent. At call `offset` the
//! host, which knows `offset`, records copies between device buffers at offsets it computes:
//!
//! 1. user code `i` (the encoder's output) to stream `k = 1 + dep_q + i`, slot `(offset + delay_k) mod CT`;
//! 2. stream `k`'s slot `offset mod CT` to the LM's input column, for every `k` with
//!    `offset > delay_k`; the others read the initial token, which the host writes with the step
//!    buffer (at call 0 every stream is initial, so call 0's user codes are never seen);
//! 3. after the LM step and its sampling, the sampled text token and codes to streams `0..=dep_q`,
//!    slot `(offset + 1) mod CT`;
//! 4. when `offset + 1 > max_delay`, stream `k ∈ 0..=dep_q`'s slot
//!    `(offset + 1 − max_delay + delay_k) mod CT` to the decoder's input (the codes) and to the
//!    readback (the whole un-delayed frame, for the caller's [`LmFrame`]).
//!
//! Runs of streams that share a slot move in one copy (for Moshi, about seven copies a frame). A
//! slot is never read before a call wrote it (the same argument as the CPU cache's, whose
//! [`UNGENERATED`](model::lm::UNGENERATED) fill is never read either), so the ring needs no
//! clearing on reset.
//!
//! # What comes back
//!
//! One mapped buffer: the row's sampling record (its tokens and the advanced random streams,
//! which the host sampler must have), the encoder's codes and its proof flag (see below), the
//! un-delayed frame's `1 + dep_q` tokens, and the decoded PCM. About 8 KB at Moshi's sizes.
//!
//! # Exact codes and the replay
//!
//! The encoder's split-RVQ search proves its codes on the device in nearly every frame
//! ([`crate::GpuMimi`]'s docs); when it cannot, the host decides them exactly after the
//! submission. If the host's codes differ from the device's, the LM step and the decode ran on
//! wrong user codes, and the frame is replayed in a second submission: the exact codes written
//! over the encoder's output, the decoder state restored from a copy taken just before the
//! decode (its convolution histories, transposed-convolution tails and position; the K/V rings
//! need no copy, see `mimi::record::Direction::rings`), and the LM step recorded again from the
//! same position (its KV ring slot and the delay ring's slots are rewritten, the sampling records
//! uploaded again from the host samplers, which only move after the final readback). The encoder
//! does not run again. [`GpuDuplex::replays`] counts them.

use std::sync::Arc;

use model::lm::{LmBackend, LmError, LmFrame, LmSpec};
use model::mimi::CodecBackend;
use model::sampling::Sampler;

use crate::context::GpuContext;
use crate::lm::{GpuLm, GpuLmOptions, GpuLmWeights};
use crate::mimi::{GpuMimi, GpuMimiWeights};
use crate::sample::rec;
use crate::shaders::step;
use crate::GpuError;

/// One conversation's Mimi streams and LM row on the device, stepped one frame per submission.
pub struct GpuDuplex {
    ctx: GpuContext,
    lm: GpuLm,
    mimi: GpuMimi,
    spec: LmSpec,
    /// Slots of the delay ring (`max_delay + 2`).
    ct: usize,
    /// Calls since creation or reset (the CPU generator's `offset`).
    offset: usize,
    /// `[CT][K]` shader tokens.
    ring: wgpu::Buffer,
    /// The decoder state a replay restores.
    shadow: wgpu::Buffer,
    readback: wgpu::Buffer,
    layout: Layout,
    /// Each stream's initial token.
    initial: Vec<u32>,
    /// The host's input column (initial tokens; the device overwrites the others).
    column: Vec<u32>,
    /// Read-back words: the encoder's codes and proof flag, then the frame's tokens.
    codes_words: Vec<u32>,
    frame_words: Vec<u32>,
    /// Bytes of the ring filled with initial tokens ([`GpuDuplex::seek_for_bench`]).
    ring_initial: Vec<u8>,
    /// The exact codes of a replay, as bytes.
    exact_bytes: Vec<u8>,
    /// A codec reset to record at the start of the next frame.
    reset_pending: bool,
    /// Tests: zero the device's first code after the encode (see [`GpuDuplex::spoil_device_codes`]).
    spoil: bool,
    replays: u64,
    host_decisions: u64,
}

impl std::fmt::Debug for GpuDuplex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuDuplex")
            .field("adapter", self.ctx.adapter())
            .field("offset", &self.offset)
            .finish()
    }
}

/// Word offsets of the readback buffer's parts.
#[derive(Debug, Clone, Copy)]
struct Layout {
    /// The row's sampling record, `stride` words from 0.
    stride: usize,
    /// The encoder's codes and proof flag (`nq + 1` words).
    codes: usize,
    /// The un-delayed frame (`1 + dep_q` tokens).
    frame: usize,
    /// The decoded PCM (`frame_size` f32).
    pcm: usize,
    /// Words in all.
    total: usize,
}

/// What [`GpuDuplex::frame`] is asked to do besides the frame itself.
#[derive(Debug, Clone, Copy, Default)]
pub struct DuplexStep {
    /// The text token to force at this call (see [`model::lm::StepOptions::force_text`]).
    pub force_text: Option<u32>,
    /// Reset both Mimi directions right after this frame's encode (Python's server does so after
    /// encoding the first frame: the runtime's first-frame rule), inside the same submission.
    pub reset_codec_after_encode: bool,
}

impl GpuDuplex {
    /// One conversation over the uploaded weights (both on one context): the LM row with
    /// `opts`, Mimi's streams, the delay ring, the decoder's shadow copy and the readback buffer.
    pub fn new(
        lm: Arc<GpuLmWeights>,
        mimi: Arc<GpuMimiWeights>,
        opts: GpuLmOptions,
    ) -> Result<GpuDuplex, GpuError> {
        let ctx = lm.context().clone();
        let spec = lm.spec().clone();
        let lm = GpuLm::with_options(lm, 1, opts)?;
        let mimi = GpuMimi::new(mimi, 1)?;
        let (nq, fs) = (mimi.n_codebooks(), mimi.frame_size());
        if nq != spec.dep_q || spec.n_user() > nq || spec.dep_q == 0 {
            return Err(GpuError::Unsupported {
                format: format!(
                    "an LM of {} generated and {} user codebooks with a Mimi of {nq}",
                    spec.dep_q,
                    spec.n_user()
                ),
                why: "the one-submission frame decodes the LM's codes as they are".into(),
            });
        }
        let k = spec.num_streams();
        let ct = spec.max_delay() + 2;
        let storage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC;
        let ring = ctx.buffer("delay ring", (ct * k * 4) as u64, storage)?;
        let shadow = ctx.buffer(
            "decoder shadow",
            mimi.decoder_snapshot_bytes().max(4),
            storage,
        )?;
        let (_, stride) = lm.records();
        let codes = stride;
        let frame = codes + nq + 1;
        let pcm = frame + 1 + spec.dep_q;
        let layout = Layout {
            stride,
            codes,
            frame,
            pcm,
            total: pcm + fs,
        };
        let readback = ctx.buffer(
            "duplex readback",
            (layout.total * 4) as u64,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?;
        let mut initial = vec![spec.card as u32; k];
        initial[0] = spec.text_card as u32;
        let ring_initial = (0..ct)
            .flat_map(|_| initial.iter().flat_map(|t| t.to_le_bytes()))
            .collect();
        Ok(GpuDuplex {
            column: initial.clone(),
            initial,
            codes_words: vec![0; nq + 1],
            frame_words: vec![0; 1 + spec.dep_q],
            ring_initial,
            ctx,
            lm,
            mimi,
            spec,
            ct,
            offset: 0,
            ring,
            shadow,
            readback,
            layout,
            exact_bytes: Vec::with_capacity(nq * 4),
            reset_pending: false,
            spoil: false,
            replays: 0,
            host_decisions: 0,
        })
    }

    /// The device context.
    pub fn context(&self) -> &GpuContext {
        &self.ctx
    }

    /// The LM's sizes.
    pub fn spec(&self) -> &LmSpec {
        &self.spec
    }

    /// Calls since creation or the last reset.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Frames replayed because the host's exact codes differed from the device's (module docs).
    pub fn replays(&self) -> u64 {
        self.replays
    }

    /// Frames whose codes the host decided (a level the device could not prove, or
    /// [`GpuDuplex::force_host_decision`]).
    pub fn host_decisions(&self) -> u64 {
        self.host_decisions
    }

    /// Makes every frame's codes the host's decision (tests of the replay path).
    pub fn force_host_decision(&mut self, on: bool) {
        self.mimi.force_host_decision(on);
    }

    /// Tests of the replay: zero the device's first code of every frame after the encode (its
    /// proof flag untouched), so that with [`GpuDuplex::force_host_decision`] the host's exact
    /// codes differ from the device's whenever the true first code is not 0.
    #[doc(hidden)]
    pub fn spoil_device_codes(&mut self, on: bool) {
        self.spoil = on;
    }

    /// Mimi's samples per frame.
    pub fn frame_size(&self) -> usize {
        self.mimi.frame_size()
    }

    /// Whether `sampler` can run on the device (the frame refuses one that cannot; see
    /// [`crate::sample::device_samples`]).
    pub fn samples(&self, sampler: &Sampler) -> bool {
        crate::sample::device_samples(sampler, self.spec.text_card, self.spec.card)
    }

    /// The LM row and the delay ring back to call 0 (the caller resets its sampler). Host state
    /// only: nothing is submitted.
    pub fn reset_lm(&mut self) {
        self.lm.reset_row(0);
        self.offset = 0;
    }

    /// Both Mimi directions back to fresh streams, recorded at the start of the next frame (no
    /// submission of its own).
    pub fn reset_codec(&mut self) {
        self.reset_pending = true;
    }

    /// Benchmark helper: the LM at call `offset` with its KV ring holding `min(offset, context)`
    /// meaningless entries and the delay ring holding initial tokens, as
    /// [`model::lm::Generator::seek_for_bench`] leaves the CPU's.
    pub fn seek_for_bench(&mut self, offset: usize) {
        self.lm.seek_for_bench(offset);
        self.ctx
            .queue()
            .write_buffer(&self.ring, 0, &self.ring_initial);
        self.offset = offset;
    }

    /// Decodes `codes` through the conversation's decoder in a submission of its own (the
    /// runtime's warm-up decodes placeholder codes to time the decode path; call 0 has no frame).
    pub fn decode_only(&mut self, codes: &[u32], out: &mut [f32]) -> Result<(), GpuError> {
        if std::mem::take(&mut self.reset_pending) {
            self.mimi.reset(0);
        }
        self.mimi
            .decode_frames(&[0], codes, out)
            .map_err(|e| GpuError::Runtime(e.to_string()))
    }

    /// One frame: encodes `pcm` (`frame_size` samples), runs the LM step with `sampler` and
    /// `opts`, decodes the frame the delays make ready into `out` (`frame_size` samples; left as
    /// it is when none is ready) and returns that frame (`None` during the first `max_delay`
    /// calls), all in one submission and one wait on it (two when a replay is due, module
    /// docs). The sampler's random streams and text history move as the host's generator would
    /// move them.
    ///
    /// A sampling error (non-finite logits) comes back after the call is committed, as the
    /// generator reports it; that frame's tokens are 0 and the decoder has decoded them (the
    /// caller resets the conversation). An argument error is returned before anything moves.
    pub fn frame(
        &mut self,
        pcm: &[f32],
        sampler: &mut Sampler,
        opts: DuplexStep,
        out: &mut [f32],
    ) -> Result<Option<LmFrame>, LmError> {
        let fs = self.mimi.frame_size();
        if pcm.len() != fs || out.len() != fs {
            return Err(LmError::Length {
                what: "frame samples (input, output)",
                expected: fs,
                got: if pcm.len() != fs {
                    pcm.len()
                } else {
                    out.len()
                },
            });
        }
        if let Some(t) = opts.force_text {
            if t as usize > self.spec.text_card {
                return Err(LmError::Token {
                    stream: 0,
                    token: i64::from(t),
                    max: self.spec.text_card as i64,
                });
            }
        }
        if !self.samples(sampler) {
            return Err(LmError::Config(
                "the one-submission frame samples on the device; this sampler's settings need the host"
                    .into(),
            ));
        }
        let s = &self.spec;
        for k in 0..s.num_streams() {
            self.column[k] = if self.offset <= s.delays[k] {
                self.initial[k]
            } else {
                // Overwritten on the device (step 2 of the module docs).
                0
            };
        }
        let samplers = std::slice::from_mut(sampler);
        let forced = [opts.force_text];
        if !self
            .lm
            .sampled_begin(&[0], &self.column, samplers, &forced)?
        {
            return Err(LmError::Config("the device refused the sampler".into()));
        }
        self.ctx
            .queue()
            .write_buffer(self.mimi.pcm_in(), 0, crate::mimi::bytes_of_f32(pcm));
        let ready = self.offset + 1 > s.max_delay();
        let mut enc = self.encoder();
        if std::mem::take(&mut self.reset_pending) {
            self.mimi.record_reset(&mut enc);
        }
        self.mimi.record_direction(&mut enc, true);
        if self.spoil {
            enc.clear_buffer(self.mimi.codes_out(), 0, Some(4));
        }
        // The codes and the proof flag.
        enc.copy_buffer_to_buffer(
            self.mimi.codes_out(),
            0,
            &self.readback,
            (self.layout.codes * 4) as u64,
            (self.codes_words.len() * 4) as u64,
        );
        if opts.reset_codec_after_encode {
            self.mimi.record_reset(&mut enc);
        }
        self.record_step(&mut enc, ready);
        self.finish_and_read(enc, ready)?;

        let (codes, decided) = self.mimi.decide(&self.codes_words)?;
        if decided {
            self.host_decisions += 1;
        }
        let nu = self.spec.n_user();
        if decided && codes[..nu] != self.codes_words[..nu] {
            // Replay from the same state with the exact codes (module docs).
            self.readback.unmap();
            self.exact_bytes.clear();
            for c in codes {
                self.exact_bytes.extend_from_slice(&c.to_le_bytes());
            }
            self.ctx
                .queue()
                .write_buffer(self.mimi.codes_out(), 0, &self.exact_bytes);
            let samplers = std::slice::from_mut(sampler);
            self.lm
                .sampled_begin(&[0], &self.column, samplers, &forced)?;
            let mut enc = self.encoder();
            if ready {
                self.mimi
                    .record_decoder_copy(&mut enc, 0, &self.shadow, true);
            }
            self.record_step(&mut enc, ready);
            self.finish_and_read(enc, ready)?;
            self.replays += 1;
        }

        let mut text = [0u32];
        let mut audio = [0u32; model::lm::MAX_AUDIO_CODEBOOKS];
        let mut errors = [None];
        let dq = self.spec.dep_q;
        {
            let slice = self.readback.slice(..);
            let view = slice
                .get_mapped_range()
                .map_err(|e| GpuError::Runtime(format!("readback: {e:?}")))?;
            let samplers = std::slice::from_mut(sampler);
            self.lm.sampled_end(
                &view[..self.layout.stride * 4],
                &[0],
                samplers,
                &mut text,
                &mut audio[..dq],
                &mut errors,
            );
            if ready {
                let at = self.layout.pcm * 4;
                for (o, c) in out.iter_mut().zip(view[at..at + fs * 4].chunks_exact(4)) {
                    *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
        }
        self.readback.unmap();
        sampler.record_text(text[0]);
        self.offset += 1;
        if let Some(e) = errors[0].take() {
            return Err(e.into());
        }
        Ok(if ready {
            LmFrame::from_parts(self.frame_words[0], &self.frame_words[1..])
        } else {
            None
        })
    }

    fn encoder(&self) -> wgpu::CommandEncoder {
        self.ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
    }

    /// Records steps 1 to 4 of the module docs around the LM's sampled step, then (when a frame
    /// is `ready`) the decoder's snapshot, the decode, and the copies of the row's sampling
    /// record and the PCM into the readback buffer.
    fn record_step(&self, enc: &mut wgpu::CommandEncoder, ready: bool) {
        let s = &self.spec;
        let (k_all, ct, o, dq) = (s.num_streams(), self.ct, self.offset, s.dep_q);
        let word = |slot: usize, k: usize| ((slot * k_all + k) * 4) as u64;
        // 1. User codes into their delayed slots.
        let first_user = 1 + dq;
        copy_runs(
            enc,
            first_user..k_all,
            |k| (o + s.delays[k]) % ct,
            |k, len| {
                (
                    self.mimi.codes_out(),
                    ((k - first_user) * 4) as u64,
                    &self.ring,
                    word((o + s.delays[k]) % ct, k),
                    len,
                )
            },
        );
        // 2. The input column of the streams past their delay.
        let step = self.lm.step_buffer();
        let tokens = |k: usize| ((step::TOKENS + k) * 4) as u64;
        copy_runs(
            enc,
            (0..k_all).filter(|&k| o > s.delays[k]),
            |_| 0,
            |k, len| (&self.ring, word(o % ct, k), step, tokens(k), len),
        );
        self.lm.record_sampled(enc, 1);
        // 3. This call's tokens (text, then the codes) into slot offset + 1.
        let (records, _) = self.lm.records();
        enc.copy_buffer_to_buffer(
            records,
            (rec::OUT * 4) as u64,
            &self.ring,
            word((o + 1) % ct, 0),
            ((1 + dq) * 4) as u64,
        );
        enc.copy_buffer_to_buffer(
            records,
            0,
            &self.readback,
            0,
            (self.layout.stride * 4) as u64,
        );
        if !ready {
            return;
        }
        // 4. The un-delayed frame: to the readback, and its codes to the decoder.
        let base = o + 1 - s.max_delay();
        let slot = |k: usize| (base + s.delays[k]) % ct;
        let frame_at = (self.layout.frame * 4) as u64;
        copy_runs(enc, 0..=dq, slot, |k, len| {
            (
                &self.ring,
                word(slot(k), k),
                &self.readback,
                frame_at + (k * 4) as u64,
                len,
            )
        });
        copy_runs(enc, 1..=dq, slot, |k, len| {
            (
                &self.ring,
                word(slot(k), k),
                self.mimi.codes_in(),
                ((k - 1) * 4) as u64,
                len,
            )
        });
        self.mimi.record_decoder_copy(enc, 0, &self.shadow, false);
        self.mimi.record_direction(enc, false);
        let fs = self.mimi.frame_size();
        enc.copy_buffer_to_buffer(
            self.mimi.pcm_out(),
            0,
            &self.readback,
            (self.layout.pcm * 4) as u64,
            (fs * 4) as u64,
        );
    }

    /// Submits `enc`, waits for that submission only, and reads the encoder's words and the
    /// frame's tokens out of the mapped readback (left mapped for the caller's PCM and record).
    fn finish_and_read(&mut self, enc: wgpu::CommandEncoder, ready: bool) -> Result<(), GpuError> {
        let index = self.ctx.submit(enc.finish());
        let slice = self.readback.slice(..);
        slice.map_async(wgpu::MapMode::Read, |_| {});
        self.ctx.wait_for(index)?;
        let view = slice
            .get_mapped_range()
            .map_err(|e| GpuError::Runtime(format!("readback: {e:?}")))?;
        let words = |at: usize, out: &mut [u32]| {
            for (o, c) in out.iter_mut().zip(view[at * 4..].chunks_exact(4)) {
                *o = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        };
        words(self.layout.codes, &mut self.codes_words);
        if ready {
            words(self.layout.frame, &mut self.frame_words);
        }
        drop(view);
        Ok(())
    }
}

/// Records one copy per run of consecutive items of `items` that share a `slot`: `copy(first,
/// bytes)` gives (source, source offset, destination, destination offset, bytes) of the run that
/// starts at item `first` (the items of a run are adjacent words on both sides).
pub(crate) fn copy_runs<'b>(
    enc: &mut wgpu::CommandEncoder,
    items: impl Iterator<Item = usize>,
    slot: impl Fn(usize) -> usize,
    copy: impl Fn(usize, u64) -> (&'b wgpu::Buffer, u64, &'b wgpu::Buffer, u64, u64),
) {
    let mut run: Option<(usize, usize)> = None;
    let flush = |enc: &mut wgpu::CommandEncoder, run: Option<(usize, usize)>| {
        if let Some((first, n)) = run {
            let (src, at, dst, to, bytes) = copy(first, (n * 4) as u64);
            enc.copy_buffer_to_buffer(src, at, dst, to, bytes);
        }
    };
    for k in items {
        run = match run {
            Some((first, n)) if first + n == k && slot(first) == slot(k) => Some((first, n + 1)),
            other => {
                flush(enc, other);
                Some((k, 1))
            }
        };
    }
    flush(enc, run);
}
