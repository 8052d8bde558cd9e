//! [`GpuMimi`]: the device codec of a set of conversation slots (a [`CodecBackend`]; a session's
//! has one slot), the recorded launches of [`Streams`] over all of them, each call one
//! submission for every listed slot.

use std::sync::Arc;

use model::mimi::{CodecBackend, MimiError, Stage};

use super::record::dispatch;
use super::streams::{Decider, Streams};
use super::weights::GpuMimiWeights;
use super::{bytes_of_f32, check_code_range, read_words};
use crate::context::GpuContext;
use crate::GpuError;

/// The device codecs of `slots` conversation slots over one engine's uploaded weights: every
/// slot's streaming state (convolution histories, transposed-convolution tails, K/V rings,
/// positions) in device buffers made by [`GpuMimi::new`], and every launch of an encoder call
/// and of a decoder call recorded there.
///
/// An [`CodecBackend::encode_frames`] (or `decode_frames`) call is one submission for all listed
/// slots: one `Queue::write_buffer` of the slot list and one of their inputs (back to back, in
/// the order of the list) into a staging buffer, copies from there into each slot's region of
/// the input buffer, the direction's recorded launches once in one compute pass (each launch's
/// grid one layer per listed slot, so each kernel runs once per call and its workgroups of every
/// slot read the same weights), copies of each slot's output into one readback buffer, one map.
/// An encoder level the device cannot prove costs that slot one more submission (the host's
/// exact decision, module docs).
pub struct GpuMimi {
    w: Arc<GpuMimiWeights>,
    s: Streams,
    /// The slot list's bytes (the number listed, then the slots).
    list_bytes: Vec<u8>,
    /// The listed slots' inputs, back to back (PCM or codes).
    staging: wgpu::Buffer,
    readback: wgpu::Buffer,
    /// Where a traced frame's intermediates land (see [`GpuMimi::encode_frame_traced`]).
    trace_readback: wgpu::Buffer,
    codes_bytes: Vec<u8>,
    /// Per listed slot: its codes, then its number of unproven levels (as read back).
    words: Vec<u32>,
    codes: Vec<u32>,
    /// Scratch of the distinctness check.
    listed: Vec<bool>,
    d: Decider,
}

impl std::fmt::Debug for GpuMimi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuMimi")
            .field("adapter", self.w.ctx.adapter())
            .field("slots", &self.s.slots)
            .finish()
    }
}

/// The one slot a traced frame runs (see [`GpuMimi::encode_frame_traced`]).
const SLOT0: [usize; 1] = [0];

impl GpuMimi {
    /// Fresh streams of `slots` slots (at least one) over the uploaded weights: allocates every
    /// state, work, staging and readback buffer and records the launches of both directions
    /// over all slots.
    pub fn new(w: Arc<GpuMimiWeights>, slots: usize) -> Result<GpuMimi, GpuError> {
        if slots == 0 {
            return Err(GpuError::Unsupported {
                format: "Mimi codec".into(),
                why: "zero slots".into(),
            });
        }
        let m = &w.mimi;
        let (fs, nq, cb) = (m.frame_size(), m.n_codebooks(), w.cb_dim);
        let s = Streams::new(&w, slots)?;
        let ctx = &w.ctx;
        // Until the first call writes its own: slot 0 alone (what the one-submission duplex
        // frame, which records the launches into its own submission, runs).
        let list: Vec<u8> = [1u32, 0].iter().flat_map(|v| v.to_le_bytes()).collect();
        ctx.queue().write_buffer(&s.list, 0, &list);
        let staging = ctx.buffer(
            "mimi staging",
            (slots * fs.max(nq) * 4) as u64,
            wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
        )?;
        let read = wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST;
        let readback = ctx.buffer(
            "mimi readback",
            (slots * fs.max(nq + 1)).max(2 * cb) as u64 * 4,
            read,
        )?;
        let tap_floats = s.enc.tap_floats().max(s.dec.tap_floats());
        let trace_readback = ctx.buffer("mimi trace readback", (tap_floats * 4) as u64, read)?;
        Ok(GpuMimi {
            s,
            list_bytes: vec![0; (slots + 1) * 4],
            staging,
            readback,
            trace_readback,
            codes_bytes: vec![0; slots * nq * 4],
            words: vec![0; slots * (nq + 1)],
            codes: vec![0; slots * nq],
            listed: vec![false; slots],
            d: Decider::new(cb),
            w,
        })
    }

    /// The device context.
    pub fn context(&self) -> &GpuContext {
        &self.w.ctx
    }

    /// Queue submissions so far: one per call that runs frames (one for all its listed slots),
    /// one more per encoded frame whose codes the host decided, one per reset.
    pub fn submissions(&self) -> u64 {
        self.d.submissions
    }

    /// Encoded frames whose codes the host decided (a level the device's bound could not prove,
    /// or `force_host_decision`).
    pub fn host_decisions(&self) -> u64 {
        self.d.host_decisions
    }

    /// Makes every encoded frame take the host's exact decision path (tests compare it with the
    /// device's proven codes).
    pub fn force_host_decision(&mut self, on: bool) {
        self.d.force_host = on;
    }

    /// Kernel launches of a decoder call and of an encoder call, whatever the number of listed
    /// slots (each launch runs for all of them).
    pub fn launches_per_call(&self) -> (usize, usize) {
        (self.s.dec.launches.len(), self.s.enc.launches.len())
    }

    /// Refuses repeated or out-of-range slots and a wrong input length, before anything moves.
    fn check(
        &mut self,
        slots: &[usize],
        got: usize,
        per_slot: usize,
        what: &str,
    ) -> Result<(), MimiError> {
        let n = self.s.slots;
        let mut bad = None;
        for &s in slots {
            match self.listed.get_mut(s) {
                Some(l) if !*l => *l = true,
                Some(_) => {
                    bad = Some(format!("slot {s} listed twice"));
                    break;
                }
                None => {
                    bad = Some(format!("slot {s} out of range ({n} slots)"));
                    break;
                }
            }
        }
        for &s in slots {
            if let Some(l) = self.listed.get_mut(s) {
                *l = false;
            }
        }
        if bad.is_none() && got != slots.len() * per_slot {
            bad = Some(format!(
                "{} values for {} slots, expected {}",
                got,
                slots.len(),
                slots.len() * per_slot
            ));
        }
        match bad {
            Some(b) => Err(MimiError::Input(format!("{what}: {b}"))),
            None => Ok(()),
        }
    }

    /// One submission: the slot list written, the staged inputs copied to each listed slot's
    /// region of the direction's input buffer, the direction's launches once for all listed
    /// slots (split into one compute pass per tap when `traced`, each tap's buffer copied to the
    /// trace readback), each slot's output region copied into the readback buffer in list order.
    fn run(&mut self, slots: &[usize], encoder_side: bool, traced: bool) {
        let ctx = &self.w.ctx;
        let words = std::iter::once(slots.len()).chain(slots.iter().copied());
        for (b, v) in self.list_bytes.chunks_exact_mut(4).zip(words) {
            b.copy_from_slice(&(v as u32).to_le_bytes());
        }
        let list = &self.list_bytes[..(slots.len() + 1) * 4];
        ctx.queue().write_buffer(&self.s.list, 0, list);
        let mut enc = ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        let (d, input, output) = self.s.side(encoder_side);
        for (i, &s) in slots.iter().enumerate() {
            let (at, bytes) = input.region(s);
            enc.copy_buffer_to_buffer(&self.staging, i as u64 * bytes, &input.buf, at, bytes);
        }
        let mut from = 0;
        if traced {
            let mut off = 0;
            for tap in &d.taps {
                {
                    let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
                    dispatch(&mut pass, &d.launches[from..tap.after], slots.len());
                }
                let bytes = (tap.floats * 4) as u64;
                enc.copy_buffer_to_buffer(&tap.buffer.buf, 0, &self.trace_readback, off, bytes);
                off += bytes;
                from = tap.after;
            }
        }
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            dispatch(&mut pass, &d.launches[from..], slots.len());
        }
        for (i, &s) in slots.iter().enumerate() {
            let (at, bytes) = output.region(s);
            enc.copy_buffer_to_buffer(&output.buf, at, &self.readback, i as u64 * bytes, bytes);
        }
        ctx.submit(enc.finish());
        self.d.submissions += 1;
    }

    /// Reads a traced frame's intermediates back and reports each to `trace`.
    fn report_taps(
        &self,
        encoder_side: bool,
        trace: &mut dyn FnMut(Stage, &[f32]),
    ) -> Result<(), GpuError> {
        let (d, _, _) = self.s.side(encoder_side);
        let mut all = vec![0.0f32; d.tap_floats()];
        crate::context::read_mapped(&self.w.ctx, &self.trace_readback, &mut all)?;
        let mut off = 0;
        for tap in &d.taps {
            trace(tap.stage, &all[off..off + tap.floats]);
            off += tap.floats;
        }
        Ok(())
    }

    fn encode(&mut self, slots: &[usize], pcm: &[f32], traced: bool) -> Result<(), GpuError> {
        let nq = self.w.mimi.n_codebooks();
        let k = slots.len();
        self.w
            .ctx
            .queue()
            .write_buffer(&self.staging, 0, bytes_of_f32(pcm));
        self.run(slots, true, traced);
        let words = &mut self.words[..k * (nq + 1)];
        read_words(&self.w.ctx, &self.readback, words)?;
        for (i, &s) in slots.iter().enumerate() {
            let words = &self.words[i * (nq + 1)..(i + 1) * (nq + 1)];
            let codes = &mut self.codes[i * nq..(i + 1) * nq];
            self.d
                .decide(&self.w, (&self.s, s), &self.readback, words, codes)?;
        }
        Ok(())
    }

    fn decode(
        &mut self,
        slots: &[usize],
        codes: &[u32],
        out: &mut [f32],
        traced: bool,
    ) -> Result<(), GpuError> {
        let bytes = &mut self.codes_bytes[..codes.len() * 4];
        for (b, c) in bytes.chunks_exact_mut(4).zip(codes) {
            b.copy_from_slice(&c.to_le_bytes());
        }
        self.w.ctx.queue().write_buffer(&self.staging, 0, bytes);
        self.run(slots, false, traced);
        crate::context::read_mapped(&self.w.ctx, &self.readback, out)
    }

    /// Checks a decoder call's arguments (see [`CodecBackend::decode_frames`]).
    fn check_decode(
        &mut self,
        slots: &[usize],
        codes: &[u32],
        out: &[f32],
    ) -> Result<(), MimiError> {
        let (fs, nq) = (self.frame_size(), self.n_codebooks());
        self.check(slots, codes.len(), nq, "decode_frames (codes)")?;
        self.check(slots, out.len(), fs, "decode_frames (samples)")?;
        check_code_range(codes, self.w.mimi.cardinality())
    }

    /// [`CodecBackend::encode_frames`] of slot 0 alone, also reporting the frame's encoder
    /// intermediates ([`Stage::EncSeanet`], [`Stage::EncTransformer`], [`Stage::Latent`], each
    /// `[dim, t]` channel-major) to `trace`, as the CPU encoder's traced frame does. For parity
    /// tooling: the frame is split into one compute pass per stage and the intermediates are
    /// read back into a vector allocated per call.
    pub fn encode_frame_traced(
        &mut self,
        pcm: &[f32],
        trace: &mut dyn FnMut(Stage, &[f32]),
    ) -> Result<&[u32], MimiError> {
        let fs = self.frame_size();
        self.check(&SLOT0, pcm.len(), fs, "encode_frames")?;
        self.encode(&SLOT0, pcm, true)?;
        self.report_taps(true, trace)?;
        Ok(&self.codes[..self.n_codebooks()])
    }

    /// [`CodecBackend::decode_frames`] of slot 0 alone, also reporting the decoder
    /// intermediates ([`Stage::DecLatent`], [`Stage::DecUpsample`], [`Stage::DecTransformer`]) to
    /// `trace` (see [`GpuMimi::encode_frame_traced`]).
    pub fn decode_frame_traced(
        &mut self,
        codes: &[u32],
        out: &mut [f32],
        trace: &mut dyn FnMut(Stage, &[f32]),
    ) -> Result<(), MimiError> {
        self.check_decode(&SLOT0, codes, out)?;
        self.decode(&SLOT0, codes, out, true)?;
        Ok(self.report_taps(false, trace)?)
    }
}

impl CodecBackend for GpuMimi {
    fn frame_size(&self) -> usize {
        self.w.mimi.frame_size()
    }

    fn n_codebooks(&self) -> usize {
        self.w.mimi.n_codebooks()
    }

    fn slots(&self) -> usize {
        self.s.slots
    }

    fn encode_frames(&mut self, slots: &[usize], pcm: &[f32]) -> Result<&[u32], MimiError> {
        let fs = self.frame_size();
        self.check(slots, pcm.len(), fs, "encode_frames")?;
        if slots.is_empty() {
            return Ok(&[]);
        }
        self.encode(slots, pcm, false)?;
        Ok(&self.codes[..slots.len() * self.n_codebooks()])
    }

    fn decode_frames(
        &mut self,
        slots: &[usize],
        codes: &[u32],
        out: &mut [f32],
    ) -> Result<(), MimiError> {
        self.check_decode(slots, codes, out)?;
        if slots.is_empty() {
            return Ok(());
        }
        Ok(self.decode(slots, codes, out, false)?)
    }

    /// Zeroes `slot`'s streaming buffers in one submission (a slot out of range: nothing).
    fn reset(&mut self, slot: usize) {
        if slot >= self.s.slots {
            return;
        }
        let ctx = &self.w.ctx;
        let mut enc = ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        self.s.clear(&mut enc, slot);
        ctx.submit(enc.finish());
        self.d.submissions += 1;
    }
}

/// The parts of a frame the one-submission duplex frames ([`crate::GpuDuplexBatch`], the slots it
/// lists; [`crate::GpuDuplex`] is its batch of one) record into their own command buffers.
impl GpuMimi {
    /// The slot list every kernel reads (the number listed, then the slots); a batched frame copies
    /// its list into it before each direction's pass.
    pub(crate) fn list(&self) -> &wgpu::Buffer {
        &self.s.list
    }

    /// Records one direction's launches for the `listed` slots of the list (one compute pass).
    pub(crate) fn record_direction_listed(
        &self,
        enc: &mut wgpu::CommandEncoder,
        encoder_side: bool,
        listed: usize,
    ) {
        let (d, _, _) = self.s.side(encoder_side);
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
        dispatch(&mut pass, &d.launches, listed);
    }

    /// Records the reset of `slot`'s streams (both directions).
    pub(crate) fn record_reset_slot(&self, enc: &mut wgpu::CommandEncoder, slot: usize) {
        self.s.clear(enc, slot);
    }

    /// `slot`'s region of an input or output buffer, as (buffer, byte offset, bytes): the
    /// encoder's PCM in and codes out (codes, then the unproven count) when `encoder_side`, else
    /// the decoder's codes in and PCM out; `input` picks the direction's input.
    pub(crate) fn io(
        &self,
        encoder_side: bool,
        input: bool,
        slot: usize,
    ) -> (&wgpu::Buffer, u64, u64) {
        let (_, i, o) = self.s.side(encoder_side);
        let b = if input { i } else { o };
        let (at, bytes) = b.region(slot);
        (&b.buf, at, bytes)
    }

    /// Bytes of one slot's decoder state a replayed decoder frame needs restored.
    pub(crate) fn decoder_snapshot_bytes(&self) -> u64 {
        self.s.decoder_snapshot_bytes()
    }

    /// Records the copy of `slot`'s decoder state into `shadow`, or back with `restore`.
    pub(crate) fn record_decoder_copy(
        &self,
        enc: &mut wgpu::CommandEncoder,
        slot: usize,
        shadow: &wgpu::Buffer,
        restore: bool,
    ) {
        self.s.record_decoder_copy(enc, slot, shadow, restore);
    }

    /// The exact codes of `slot`'s encoded frame from its read-back `words` (`n_codebooks` codes,
    /// then the unproven count): the device's when proven, else the host's decision (one more
    /// submission, the latents read back), as [`CodecBackend::encode_frames`] decides them.
    /// Returns the codes and whether the host decided them.
    pub(crate) fn decide_slot(
        &mut self,
        slot: usize,
        words: &[u32],
    ) -> Result<(&[u32], bool), GpuError> {
        let before = self.d.host_decisions;
        let nq = self.w.mimi.n_codebooks();
        let codes = &mut self.codes[..nq];
        self.d
            .decide(&self.w, (&self.s, slot), &self.readback, words, codes)?;
        Ok((&self.codes[..nq], self.d.host_decisions != before))
    }
}
