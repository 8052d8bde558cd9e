//! [`GpuDuplexBatch`]: the duplex frames of up to [`MAX_ROWS`] conversation slots in **one
//! submission per tick**, whatever the number of slots a tick lists: Mimi encode of the listed
//! slots → the LM step over their rows, each row's input column gathered from its own delay ring
//! on the device → sampling on the device, each row with its own sampler's record → each row's
//! tokens into its ring → decode of the listed slots whose delays make a frame ready → one
//! readback, waited for by its own submission index. A lone conversation ([`crate::GpuDuplex`])
//! is a batch of one slot.
//!
//! # The delay ring
//!
//! Each slot's ring is [`model::lm::Generator`]'s token cache moved to the device, with the same
//! rules (`lm/gen.rs`'s module docs): `K = 1 + n_q` streams × `CT = max_delay + 2` positions,
//! stored position-major (`[CT][K]` shader tokens, the rings of all slots in one buffer,
//! `[slots][CT][K]`) so that the streams of one position are adjacent. At a slot's call `offset`
//! the host, which knows `offset`, records copies between device buffers at offsets it computes:
//!
//! 1. user code `i` (the encoder's output) to stream `k = 1 + dep_q + i`, position
//!    `(offset + delay_k) mod CT`;
//! 2. stream `k`'s position `offset mod CT` to the LM's input column of the slot's row, for every
//!    `k` with `offset > delay_k`; the others read the initial token, which the host writes with
//!    the step buffer (at call 0 every stream is initial, so call 0's user codes are never seen);
//! 3. after the LM step and its sampling, the sampled text token and codes to streams `0..=dep_q`,
//!    position `(offset + 1) mod CT`;
//! 4. when `offset + 1 > max_delay`, stream `k ∈ 0..=dep_q`'s position
//!    `(offset + 1 − max_delay + delay_k) mod CT` to the decoder's input (the codes) and to the
//!    readback (the whole un-delayed frame, for the caller's [`LmFrame`]).
//!
//! Runs of streams that share a position move in one copy (for Moshi, about seven copies a frame
//! per slot). A position is never read before a call wrote it (the same argument as the CPU
//! cache's, whose [`UNGENERATED`](model::lm::UNGENERATED) fill is never read either), so a ring
//! needs no clearing on reset. Each slot has its own call count and its own pending codec reset,
//! so slots join late, skip ticks and reset alone.
//!
//! # One launch per kernel for all listed slots
//!
//! The Mimi kernels run once per direction for all the slots listed ([`crate::GpuMimi`]'s slot
//! list); the encoder's list is the tick's, the decoder's only the slots with a frame ready, each
//! copied into the codec's list buffer just before its pass, in the same command buffer. The LM
//! step runs once for the listed rows ([`crate::GpuLm`] with one row per slot; row `b` is slot
//! `b`), each row sampled from its own record (`samplers[slot]`). Launches per tick are those of
//! one conversation (each launch's grid carries the listed rows or slots); the copies (a handful
//! per slot) grow with the slots, the launches do not.
//!
//! # What comes back
//!
//! One mapped buffer: the listed rows' sampling records (their tokens and the advanced random
//! streams, which the host samplers must have), then per listed slot its encoder codes and proof
//! flag (see below), its un-delayed frame's `1 + dep_q` tokens and its decoded PCM. About 8 KB per
//! slot at Moshi's sizes.
//!
//! Arithmetic at Moshi's shapes (an estimate at 3.3 TB/s; no GPU measured it): the LM's weights
//! (~12.5 GB in q8_0, ~3.8 ms) are read once per tick whatever the rows; each row adds its KV
//! ring (nothing at position 0; at position 3000 ~1.55 GB in bf16, +0.5 ms, or ~3.1 GB in f32,
//! +0.95 ms); Mimi reads 363 MB for one slot and 576 MB for 8. So 8 slots move ~1.0x one slot's
//! bytes at position 0, ~1.8x with bf16 KV and ~2.8x with f32 KV at 3000 (BENCHMARKS.md, "GPU
//! batch").
//!
//! # Exact codes and the replay
//!
//! The encoder's split-RVQ search proves its codes on the device in nearly every frame
//! ([`crate::GpuMimi`]'s docs); when it cannot, the host decides them exactly after the
//! submission. If the host's codes differ from the device's for any listed slot, the LM step and
//! the decode ran on wrong user codes, and the tick is replayed in a second submission: the exact
//! codes written over those slots' encoder outputs, every ready slot's decoder state restored
//! from the copy taken just before the decode (its convolution histories, transposed-convolution
//! tails and position; the K/V rings need no copy, see `mimi::record::Direction::rings`), and the
//! LM step, the ring copies and the decode recorded again for every listed slot from the same
//! positions (the sampling records uploaded again from the host samplers, which only move after
//! the final readback; the other slots' steps run again on the same inputs and give the same
//! results). The encoder does not run again. [`GpuDuplexBatch::replays`] counts replayed ticks.

use std::sync::Arc;

use model::lm::{FrameStep, LmBackend, LmError, LmFrame, LmSpec};
use model::mimi::CodecBackend;
use model::sampling::{Sampler, SamplingError};

use crate::context::GpuContext;
use crate::lm::{GpuLm, GpuLmOptions, GpuLmWeights};
use crate::mimi::{bytes_of_f32, GpuMimi, GpuMimiWeights};
use crate::sample::rec;
use crate::shaders::{step, MAX_ROWS};
use crate::GpuError;

/// The Mimi streams, LM rows and delay rings of several conversation slots on the device, stepped
/// one tick per submission for every listed slot (module docs).
pub struct GpuDuplexBatch {
    ctx: GpuContext,
    lm: GpuLm,
    mimi: GpuMimi,
    spec: LmSpec,
    slots: usize,
    /// Slots of each delay ring (`max_delay + 2`).
    ct: usize,
    /// Each slot's calls since creation or its reset.
    offset: Vec<usize>,
    /// `[slots][CT][K]` shader tokens.
    ring: wgpu::Buffer,
    /// Each slot's decoder state, as a replay restores it.
    shadows: Vec<wgpu::Buffer>,
    /// The encoder's slot list, then the decoder's (`slots + 1` words each).
    lists: wgpu::Buffer,
    list_bytes: Vec<u8>,
    readback: wgpu::Buffer,
    layout: Layout,
    /// Each stream's initial token.
    initial: Vec<u32>,
    /// The host's input columns of the listed rows (initial tokens; the device overwrites the
    /// others).
    column: Vec<u32>,
    /// Per listed slot: its encoder codes and proof flag, then its frame's tokens (read back).
    codes_words: Vec<u32>,
    frame_words: Vec<u32>,
    /// Per listed slot: whether a frame is ready, and whether a replay rewrites its codes.
    ready: Vec<bool>,
    redo: Vec<bool>,
    /// Per listed slot: the exact codes of a replay.
    exact: Vec<u32>,
    exact_bytes: Vec<u8>,
    forced: Vec<Option<u32>>,
    text: Vec<u32>,
    audio: Vec<u32>,
    errors: Vec<Option<SamplingError>>,
    /// Bytes of the rings filled with initial tokens ([`GpuDuplexBatch::seek_for_bench`]).
    ring_initial: Vec<u8>,
    /// Per slot: a codec reset to record at the start of its next frame.
    reset_pending: Vec<bool>,
    /// Scratch of the distinctness check.
    listed: Vec<bool>,
    spoil: bool,
    replays: u64,
    host_decisions: u64,
}

impl std::fmt::Debug for GpuDuplexBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuDuplexBatch")
            .field("adapter", self.ctx.adapter())
            .field("slots", &self.slots)
            .field("offset", &self.offset)
            .finish()
    }
}

/// Word offsets of the readback buffer's parts.
#[derive(Debug, Clone, Copy)]
struct Layout {
    /// Words of one row's sampling record (the listed rows' records from word 0).
    stride: usize,
    /// Where the listed slots' parts start (after `slots` records).
    base: usize,
    /// Words of one listed slot's part: codes and proof flag (`nq + 1`), frame (`1 + dep_q`),
    /// PCM (`frame_size`).
    per: usize,
    nq: usize,
    dq: usize,
}

impl Layout {
    fn codes(&self, i: usize) -> usize {
        self.base + i * self.per
    }
    fn frame(&self, i: usize) -> usize {
        self.codes(i) + self.nq + 1
    }
    fn pcm(&self, i: usize) -> usize {
        self.frame(i) + 1 + self.dq
    }
}

impl GpuDuplexBatch {
    /// `slots` conversations (1 to [`MAX_ROWS`]) over the uploaded weights (both on one
    /// context): the LM's rows with `opts`, Mimi's streams, the delay rings, the decoders'
    /// shadow copies, the slot lists and the readback buffer.
    pub fn new(
        lm: Arc<GpuLmWeights>,
        mimi: Arc<GpuMimiWeights>,
        opts: GpuLmOptions,
        slots: usize,
    ) -> Result<GpuDuplexBatch, GpuError> {
        if slots == 0 || slots > MAX_ROWS {
            return Err(GpuError::Unsupported {
                format: format!("a duplex batch of {slots} slots"),
                why: format!("the LM steps 1 to {MAX_ROWS} rows at once"),
            });
        }
        let ctx = lm.context().clone();
        let spec = lm.spec().clone();
        let lm = GpuLm::with_options(lm, slots, opts)?;
        let mimi = GpuMimi::new(mimi, slots)?;
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
        let ring = ctx.buffer("delay rings", (slots * ct * k * 4) as u64, storage)?;
        let snap = mimi.decoder_snapshot_bytes().max(4);
        let shadows = (0..slots)
            .map(|_| ctx.buffer("decoder shadow", snap, storage))
            .collect::<Result<Vec<_>, _>>()?;
        let copy = wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        let lists = ctx.buffer("duplex slot lists", (2 * (slots + 1) * 4) as u64, copy)?;
        let (_, stride) = lm.records();
        let layout = Layout {
            stride,
            base: slots * stride,
            per: nq + 1 + 1 + spec.dep_q + fs,
            nq,
            dq: spec.dep_q,
        };
        let readback = ctx.buffer(
            "duplex batch readback",
            (layout.codes(slots) * 4) as u64,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?;
        let mut initial = vec![spec.card as u32; k];
        initial[0] = spec.text_card as u32;
        let ring_initial = (0..slots * ct)
            .flat_map(|_| initial.iter().flat_map(|t| t.to_le_bytes()))
            .collect();
        Ok(GpuDuplexBatch {
            column: vec![0; slots * k],
            initial,
            codes_words: vec![0; slots * (nq + 1)],
            frame_words: vec![0; slots * (1 + spec.dep_q)],
            ready: vec![false; slots],
            redo: vec![false; slots],
            exact: vec![0; slots * nq],
            exact_bytes: Vec::with_capacity(nq * 4),
            forced: vec![None; slots],
            text: vec![0; slots],
            audio: vec![0; slots * spec.dep_q],
            errors: vec![None; slots],
            ring_initial,
            reset_pending: vec![false; slots],
            listed: vec![false; slots],
            list_bytes: vec![0; 2 * (slots + 1) * 4],
            offset: vec![0; slots],
            ctx,
            lm,
            mimi,
            spec,
            slots,
            ct,
            ring,
            shadows,
            lists,
            readback,
            layout,
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

    /// The number of slots.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// `slot`'s calls since creation or its last reset (0 for a slot out of range).
    pub fn offset(&self, slot: usize) -> usize {
        self.offset.get(slot).copied().unwrap_or(0)
    }

    /// Ticks replayed because the host's exact codes differed from the device's for a listed
    /// slot (module docs).
    pub fn replays(&self) -> u64 {
        self.replays
    }

    /// Slot frames whose codes the host decided.
    pub fn host_decisions(&self) -> u64 {
        self.host_decisions
    }

    /// Makes every frame's codes the host's decision (tests of the replay path).
    pub fn force_host_decision(&mut self, on: bool) {
        self.mimi.force_host_decision(on);
    }

    /// Tests of the replay: zero the device's first code of every listed slot after the encode
    /// (its proof flag untouched), so that with [`GpuDuplexBatch::force_host_decision`] the
    /// host's exact codes differ from the device's whenever the true first code is not 0.
    #[doc(hidden)]
    pub fn spoil_device_codes(&mut self, on: bool) {
        self.spoil = on;
    }

    /// Mimi's samples per frame.
    pub fn frame_size(&self) -> usize {
        self.mimi.frame_size()
    }

    /// Whether `sampler` can run on the device (a tick refuses one that cannot).
    pub fn samples(&self, sampler: &Sampler) -> bool {
        crate::sample::device_samples(sampler, self.spec.text_card, self.spec.card)
    }

    /// `slot`'s LM row and delay ring back to call 0 (the caller resets its sampler). Host state
    /// only: nothing is submitted. A slot out of range: nothing.
    pub fn reset_lm(&mut self, slot: usize) {
        if slot < self.slots {
            self.lm.reset_row(slot);
            self.offset[slot] = 0;
        }
    }

    /// `slot`'s Mimi streams back to fresh, recorded at the start of its next frame (no
    /// submission of its own). A slot out of range: nothing.
    pub fn reset_codec(&mut self, slot: usize) {
        if let Some(p) = self.reset_pending.get_mut(slot) {
            *p = true;
        }
    }

    /// Benchmark helper: every slot at call `offset`, its KV ring holding `min(offset, context)`
    /// meaningless entries and its delay ring initial tokens, as
    /// [`model::lm::Generator::seek_for_bench`] leaves the CPU's.
    pub fn seek_for_bench(&mut self, offset: usize) {
        self.lm.seek_for_bench(offset);
        self.ctx
            .queue()
            .write_buffer(&self.ring, 0, &self.ring_initial);
        self.offset.fill(offset);
    }

    /// Decodes `codes` through `slot`'s decoder in a submission of its own (the runtime's warm-up
    /// decodes placeholder codes to time the decode path: call 0 has no frame).
    pub fn decode_only(
        &mut self,
        slot: usize,
        codes: &[u32],
        out: &mut [f32],
    ) -> Result<(), GpuError> {
        if slot >= self.slots {
            return Err(GpuError::Runtime(format!(
                "slot {slot} out of range ({} slots)",
                self.slots
            )));
        }
        if std::mem::take(&mut self.reset_pending[slot]) {
            self.mimi.reset(slot);
        }
        self.mimi
            .decode_frames(&[slot], codes, out)
            .map_err(|e| GpuError::Runtime(e.to_string()))
    }

    /// Refuses repeated or out-of-range slots and inconsistent lengths, before anything moves.
    fn check(
        &mut self,
        slots: &[usize],
        pcm: usize,
        opts: &[FrameStep],
        samplers: &[Sampler],
        out: usize,
        results: usize,
    ) -> Result<(), LmError> {
        let n = slots.len();
        let fs = self.frame_size();
        let mut bad = None;
        for &s in slots {
            match self.listed.get_mut(s) {
                Some(l) if !*l => *l = true,
                _ => {
                    bad = Some(s);
                    break;
                }
            }
        }
        for &s in slots {
            if let Some(l) = self.listed.get_mut(s) {
                *l = false;
            }
        }
        if let Some(s) = bad {
            return Err(LmError::Config(format!(
                "slot {s} listed twice or out of range ({} slots)",
                self.slots
            )));
        }
        for (what, expected, got) in [
            ("frame samples (input)", n * fs, pcm),
            ("frame samples (output)", n * fs, out),
            ("frame options", n, opts.len()),
            ("samplers", self.slots, samplers.len()),
            ("results", n, results),
        ] {
            if expected != got {
                return Err(LmError::Length {
                    what,
                    expected,
                    got,
                });
            }
        }
        for o in opts {
            if let Some(t) = o.force_text {
                if t as usize > self.spec.text_card {
                    return Err(LmError::Token {
                        stream: 0,
                        token: i64::from(t),
                        max: self.spec.text_card as i64,
                    });
                }
            }
        }
        if !slots.iter().all(|&s| self.samples(&samplers[s])) {
            return Err(LmError::Config(
                "the one-submission frame samples on the device; a sampler's settings need the host"
                    .into(),
            ));
        }
        Ok(())
    }

    /// One tick for the listed `slots` (distinct, in any order): slot `slots[i]` encodes
    /// `pcm[i·fs..(i+1)·fs]`, steps its LM row with `samplers[slots[i]]` (one sampler per slot,
    /// indexed by slot) and `opts[i]`, decodes the frame its delays make ready into
    /// `out[i·fs..(i+1)·fs]` (left as it is when none is ready), and `results[i]` gets that frame
    /// (`None` during the slot's first `max_delay` calls) or the row's sampling error
    /// (non-finite logits: the call is committed, as the generator reports it; that frame's
    /// tokens are 0 and the decoder has decoded them). All in one submission and one wait
    /// on it (two when a replay is due, module docs). Unlisted slots do not move. An argument
    /// error is returned before anything moves; an empty list does nothing.
    pub fn tick(
        &mut self,
        slots: &[usize],
        pcm: &[f32],
        opts: &[FrameStep],
        samplers: &mut [Sampler],
        out: &mut [f32],
        results: &mut [Result<Option<LmFrame>, LmError>],
    ) -> Result<(), LmError> {
        self.check(slots, pcm.len(), opts, samplers, out.len(), results.len())?;
        let n = slots.len();
        if n == 0 {
            return Ok(());
        }
        let (fs, k_all) = (self.frame_size(), self.spec.num_streams());
        for (i, &s) in slots.iter().enumerate() {
            for k in 0..k_all {
                self.column[i * k_all + k] = if self.offset[s] <= self.spec.delays[k] {
                    self.initial[k]
                } else {
                    // Overwritten on the device.
                    0
                };
            }
            self.forced[i] = opts[i].force_text;
            self.ready[i] = self.offset[s] + 1 > self.spec.max_delay();
        }
        if !self.lm.sampled_begin(
            slots,
            &self.column[..n * k_all],
            samplers,
            &self.forced[..n],
        )? {
            return Err(LmError::Config("the device refused a sampler".into()));
        }
        for (i, &s) in slots.iter().enumerate() {
            let (buf, at, _) = self.mimi.io(true, true, s);
            self.ctx
                .queue()
                .write_buffer(buf, at, bytes_of_f32(&pcm[i * fs..(i + 1) * fs]));
        }
        self.write_lists(slots);
        let mut enc = self.encoder();
        for &s in slots {
            if std::mem::take(&mut self.reset_pending[s]) {
                self.mimi.record_reset_slot(&mut enc, s);
            }
        }
        enc.copy_buffer_to_buffer(&self.lists, 0, self.mimi.list(), 0, ((n + 1) * 4) as u64);
        self.mimi.record_direction_listed(&mut enc, true, n);
        let nq = self.layout.nq;
        for (i, &s) in slots.iter().enumerate() {
            let (buf, at, _) = self.mimi.io(true, false, s);
            if self.spoil {
                enc.clear_buffer(buf, at, Some(4));
            }
            // The codes and the proof flag.
            enc.copy_buffer_to_buffer(
                buf,
                at,
                &self.readback,
                (self.layout.codes(i) * 4) as u64,
                ((nq + 1) * 4) as u64,
            );
        }
        for (i, &s) in slots.iter().enumerate() {
            if opts[i].reset_codec_after_encode {
                self.mimi.record_reset_slot(&mut enc, s);
            }
        }
        self.record_step(&mut enc, slots);
        self.finish_and_read(enc, n)?;

        let nu = self.spec.n_user();
        let mut replay = false;
        for (i, &s) in slots.iter().enumerate() {
            let words = &self.codes_words[i * (nq + 1)..(i + 1) * (nq + 1)];
            let (codes, decided) = self.mimi.decide_slot(s, words)?;
            self.redo[i] = decided && codes[..nu] != words[..nu];
            if self.redo[i] {
                self.exact[i * nq..(i + 1) * nq].copy_from_slice(codes);
                replay = true;
            }
            if decided {
                self.host_decisions += 1;
            }
        }
        if replay {
            self.replay(slots, samplers)?;
        }

        let (dq, stride) = (self.layout.dq, self.layout.stride);
        {
            let slice = self.readback.slice(..);
            let view = slice
                .get_mapped_range()
                .map_err(|e| GpuError::Runtime(format!("readback: {e:?}")))?;
            self.lm.sampled_end(
                &view[..n * stride * 4],
                slots,
                samplers,
                &mut self.text[..n],
                &mut self.audio[..n * dq],
                &mut self.errors[..n],
            );
            for i in (0..n).filter(|&i| self.ready[i]) {
                let at = self.layout.pcm(i) * 4;
                let o = &mut out[i * fs..(i + 1) * fs];
                for (o, c) in o.iter_mut().zip(view[at..at + fs * 4].chunks_exact(4)) {
                    *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
        }
        self.readback.unmap();
        for (i, &s) in slots.iter().enumerate() {
            samplers[s].record_text(self.text[i]);
            self.offset[s] += 1;
            results[i] = match self.errors[i].take() {
                Some(e) => Err(e.into()),
                None if self.ready[i] => {
                    let f = &self.frame_words[i * (1 + dq)..(i + 1) * (1 + dq)];
                    Ok(LmFrame::from_parts(f[0], &f[1..]))
                }
                None => Ok(None),
            };
        }
        Ok(())
    }

    /// The second submission of a tick whose exact codes differ from the device's for some
    /// listed slots (module docs).
    fn replay(&mut self, slots: &[usize], samplers: &mut [Sampler]) -> Result<(), LmError> {
        let (n, nq, k_all) = (slots.len(), self.layout.nq, self.spec.num_streams());
        self.readback.unmap();
        for (i, &s) in slots.iter().enumerate() {
            if !self.redo[i] {
                continue;
            }
            self.exact_bytes.clear();
            for c in &self.exact[i * nq..(i + 1) * nq] {
                self.exact_bytes.extend_from_slice(&c.to_le_bytes());
            }
            let (buf, at, _) = self.mimi.io(true, false, s);
            self.ctx.queue().write_buffer(buf, at, &self.exact_bytes);
        }
        self.lm.sampled_begin(
            slots,
            &self.column[..n * k_all],
            samplers,
            &self.forced[..n],
        )?;
        let mut enc = self.encoder();
        for (i, &s) in slots.iter().enumerate() {
            if self.ready[i] {
                self.mimi
                    .record_decoder_copy(&mut enc, s, &self.shadows[s], true);
            }
        }
        self.record_step(&mut enc, slots);
        self.finish_and_read(enc, n)?;
        self.replays += 1;
        Ok(())
    }

    /// The encoder's list (the tick's slots) and the decoder's (the slots with a frame ready),
    /// written for the tick's copies into the codec's list buffer.
    fn write_lists(&mut self, slots: &[usize]) {
        let m = self.slots + 1;
        let mut put = |at: usize, v: usize| {
            self.list_bytes[at * 4..at * 4 + 4].copy_from_slice(&(v as u32).to_le_bytes());
        };
        put(0, slots.len());
        let mut ready = 0;
        for (i, &s) in slots.iter().enumerate() {
            put(1 + i, s);
            if self.ready[i] {
                ready += 1;
                put(m + ready, s);
            }
        }
        put(m, ready);
        self.ctx
            .queue()
            .write_buffer(&self.lists, 0, &self.list_bytes);
    }

    fn encoder(&self) -> wgpu::CommandEncoder {
        self.ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
    }

    /// Records, for every listed slot from its own offset, the ring copies around one sampled LM
    /// step of all listed rows (steps 1 to 4 of the module docs), the rows' records into the
    /// readback, then the ready slots' snapshots, one decode for them all, and their PCM into the
    /// readback.
    fn record_step(&self, enc: &mut wgpu::CommandEncoder, slots: &[usize]) {
        let s = &self.spec;
        let (k_all, ct, dq) = (s.num_streams(), self.ct, s.dep_q);
        let word = |slot: usize, at: usize, k: usize| (((slot * ct + at) * k_all + k) * 4) as u64;
        let first_user = 1 + dq;
        let step = self.lm.step_buffer();
        for (i, &b) in slots.iter().enumerate() {
            let o = self.offset[b];
            let (codes_out, codes_at, _) = self.mimi.io(true, false, b);
            // 1. User codes into their delayed slots.
            copy_runs(
                enc,
                first_user..k_all,
                |k| (o + s.delays[k]) % ct,
                |k, len| {
                    (
                        codes_out,
                        codes_at + ((k - first_user) * 4) as u64,
                        &self.ring,
                        word(b, (o + s.delays[k]) % ct, k),
                        len,
                    )
                },
            );
            // 2. The input column of the streams past their delay, into row i's column.
            let tokens = |k: usize| ((step::TOKENS + i * k_all + k) * 4) as u64;
            copy_runs(
                enc,
                (0..k_all).filter(|&k| o > s.delays[k]),
                |_| 0,
                |k, len| (&self.ring, word(b, o % ct, k), step, tokens(k), len),
            );
        }
        self.lm.record_sampled(enc, slots.len());
        let (records, stride) = self.lm.records();
        for (i, &b) in slots.iter().enumerate() {
            // 3. Row i's tokens (text, then the codes) into its slot's ring at offset + 1.
            enc.copy_buffer_to_buffer(
                records,
                ((i * stride + rec::OUT) * 4) as u64,
                &self.ring,
                word(b, (self.offset[b] + 1) % ct, 0),
                ((1 + dq) * 4) as u64,
            );
        }
        enc.copy_buffer_to_buffer(
            records,
            0,
            &self.readback,
            0,
            (slots.len() * stride * 4) as u64,
        );
        let mut ready = 0;
        for (i, &b) in slots.iter().enumerate() {
            if !self.ready[i] {
                continue;
            }
            ready += 1;
            // 4. The un-delayed frame: to the readback, and its codes to the slot's decoder.
            let base = self.offset[b] + 1 - s.max_delay();
            let at = |k: usize| (base + s.delays[k]) % ct;
            let frame_at = (self.layout.frame(i) * 4) as u64;
            copy_runs(enc, 0..=dq, at, |k, len| {
                (
                    &self.ring,
                    word(b, at(k), k),
                    &self.readback,
                    frame_at + (k * 4) as u64,
                    len,
                )
            });
            let (codes_in, in_at, _) = self.mimi.io(false, true, b);
            copy_runs(enc, 1..=dq, at, |k, len| {
                (
                    &self.ring,
                    word(b, at(k), k),
                    codes_in,
                    in_at + ((k - 1) * 4) as u64,
                    len,
                )
            });
            self.mimi
                .record_decoder_copy(enc, b, &self.shadows[b], false);
        }
        if ready == 0 {
            return;
        }
        let list_bytes = ((self.slots + 1) * 4) as u64;
        enc.copy_buffer_to_buffer(
            &self.lists,
            list_bytes,
            self.mimi.list(),
            0,
            ((ready + 1) * 4) as u64,
        );
        self.mimi.record_direction_listed(enc, false, ready);
        for (i, &b) in slots.iter().enumerate() {
            if self.ready[i] {
                let (pcm_out, at, bytes) = self.mimi.io(false, false, b);
                enc.copy_buffer_to_buffer(
                    pcm_out,
                    at,
                    &self.readback,
                    (self.layout.pcm(i) * 4) as u64,
                    bytes,
                );
            }
        }
    }

    /// Submits `enc`, waits for that submission only, and reads the `n` listed slots' encoder
    /// words and their frames' tokens out of the mapped readback (left mapped for the caller).
    fn finish_and_read(&mut self, enc: wgpu::CommandEncoder, n: usize) -> Result<(), GpuError> {
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
        let (nq, dq) = (self.layout.nq, self.layout.dq);
        for i in 0..n {
            words(
                self.layout.codes(i),
                &mut self.codes_words[i * (nq + 1)..(i + 1) * (nq + 1)],
            );
            if self.ready[i] {
                words(
                    self.layout.frame(i),
                    &mut self.frame_words[i * (1 + dq)..(i + 1) * (1 + dq)],
                );
            }
        }
        drop(view);
        Ok(())
    }
}

/// Records one copy per run of consecutive items of `items` that share a `slot`: `copy(first,
/// bytes)` gives (source, source offset, destination, destination offset, bytes) of the run that
/// starts at item `first` (the items of a run are adjacent words on both sides).
fn copy_runs<'b>(
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
