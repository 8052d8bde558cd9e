//! [`GpuMimiBatch`]: the streaming codecs of several conversation slots on the device, each call
//! one submission for every listed slot.

use std::sync::Arc;

use model::mimi::{BatchCodecBackend, MimiError};

use super::record::dispatch;
use super::streams::{Decider, Streams};
use super::weights::GpuMimiWeights;
use super::{bytes_of_f32, check_code_range, read_words};
use crate::{GpuContext, GpuError};

/// The device codecs of `slots` conversation slots over one engine's uploaded weights: every
/// slot's streaming state (convolution histories, transposed-convolution tails, K/V rings,
/// positions) in device buffers made by [`GpuMimiBatch::new`], and a
/// [`BatchCodecBackend`].
///
/// An [`BatchCodecBackend::encode_frames`] (or `decode_frames`) call is one submission for all
/// listed slots: one `Queue::write_buffer` of the slot list and one of their inputs (back to
/// back, in the order of the list) into a staging buffer, copies from there into each slot's
/// region of the input buffer, the direction's recorded launches once in one compute pass
/// (each launch's grid one layer per listed slot, so each kernel runs once per call and its
/// workgroups of every slot read the same weights), copies of each slot's output into one
/// readback buffer, one map. An encoder level the device cannot prove costs that slot one more
/// submission (the host's exact decision, as in [`super::GpuMimi`]).
pub struct GpuMimiBatch {
    w: Arc<GpuMimiWeights>,
    streams: Streams,
    /// The slot list's bytes (the number listed, then the slots).
    list_bytes: Vec<u8>,
    /// The listed slots' inputs, back to back (PCM or codes).
    staging: wgpu::Buffer,
    readback: wgpu::Buffer,
    codes_bytes: Vec<u8>,
    /// Per listed slot: its codes, then its number of unproven levels (as read back).
    words: Vec<u32>,
    codes: Vec<u32>,
    /// Scratch of the distinctness check.
    listed: Vec<bool>,
    d: Decider,
}

impl std::fmt::Debug for GpuMimiBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuMimiBatch")
            .field("adapter", self.w.ctx.adapter())
            .field("slots", &self.streams.slots)
            .finish()
    }
}

device_codec_accessors!(GpuMimiBatch);

impl GpuMimiBatch {
    /// Fresh streams of `slots` slots (at least one) over the uploaded weights: allocates every
    /// state, work, staging and readback buffer and records the launches of both directions
    /// over all slots.
    pub fn new(w: Arc<GpuMimiWeights>, slots: usize) -> Result<GpuMimiBatch, GpuError> {
        if slots == 0 {
            return Err(GpuError::Unsupported {
                format: "Mimi batch".into(),
                why: "zero slots".into(),
            });
        }
        let m = &w.mimi;
        let (fs, nq, cb) = (m.frame_size(), m.n_codebooks(), w.cb_dim);
        let streams = Streams::new(&w, slots)?;
        let ctx = &w.ctx;
        let staging = ctx.buffer(
            "mimi batch staging",
            (slots * fs.max(nq) * 4) as u64,
            wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
        )?;
        let readback = ctx.buffer(
            "mimi batch readback",
            (slots * fs.max(nq + 1)).max(2 * cb) as u64 * 4,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?;
        Ok(GpuMimiBatch {
            streams,
            list_bytes: vec![0; (slots + 1) * 4],
            staging,
            readback,
            codes_bytes: vec![0; slots * nq * 4],
            words: vec![0; slots * (nq + 1)],
            codes: vec![0; slots * nq],
            listed: vec![false; slots],
            d: Decider::new(cb),
            w,
        })
    }

    /// Kernel launches of a decoder call and of an encoder call, whatever the number of listed
    /// slots (each launch runs for all of them).
    pub fn launches_per_call(&self) -> (usize, usize) {
        let s = &self.streams;
        (s.dec.launches.len(), s.enc.launches.len())
    }

    /// Refuses repeated or out-of-range slots and a wrong input length, before anything moves.
    fn check(
        &mut self,
        slots: &[usize],
        got: usize,
        per_slot: usize,
        what: &str,
    ) -> Result<(), MimiError> {
        let n = self.streams.slots;
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
    /// region of the direction's input buffer, the direction's launches once in one pass for
    /// all listed slots, each slot's output region copied into the readback buffer in list
    /// order.
    fn run(&mut self, slots: &[usize], encoder_side: bool) {
        let ctx = &self.w.ctx;
        let words = std::iter::once(slots.len()).chain(slots.iter().copied());
        for (b, v) in self.list_bytes.chunks_exact_mut(4).zip(words) {
            b.copy_from_slice(&(v as u32).to_le_bytes());
        }
        let list = &self.list_bytes[..(slots.len() + 1) * 4];
        ctx.queue().write_buffer(&self.streams.list, 0, list);
        let mut enc = ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        let (d, input, output) = self.streams.side(encoder_side);
        for (i, &s) in slots.iter().enumerate() {
            let (at, bytes) = input.region(s);
            enc.copy_buffer_to_buffer(&self.staging, i as u64 * bytes, &input.buf, at, bytes);
        }
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            dispatch(&mut pass, &d.launches, slots.len());
        }
        for (i, &s) in slots.iter().enumerate() {
            let (at, bytes) = output.region(s);
            enc.copy_buffer_to_buffer(&output.buf, at, &self.readback, i as u64 * bytes, bytes);
        }
        ctx.submit(enc.finish());
        self.d.submissions += 1;
    }

    fn encode(&mut self, slots: &[usize], pcm: &[f32]) -> Result<(), GpuError> {
        let nq = self.n_codebooks();
        let k = slots.len();
        self.w
            .ctx
            .queue()
            .write_buffer(&self.staging, 0, bytes_of_f32(pcm));
        self.run(slots, true);
        let words = &mut self.words[..k * (nq + 1)];
        read_words(&self.w.ctx, &self.readback, words)?;
        for (i, &s) in slots.iter().enumerate() {
            let words = &self.words[i * (nq + 1)..(i + 1) * (nq + 1)];
            let codes = &mut self.codes[i * nq..(i + 1) * nq];
            self.d
                .decide(&self.w, (&self.streams, s), &self.readback, words, codes)?;
        }
        Ok(())
    }

    fn decode(&mut self, slots: &[usize], codes: &[u32], out: &mut [f32]) -> Result<(), GpuError> {
        let bytes = &mut self.codes_bytes[..codes.len() * 4];
        for (b, c) in bytes.chunks_exact_mut(4).zip(codes) {
            b.copy_from_slice(&c.to_le_bytes());
        }
        self.w.ctx.queue().write_buffer(&self.staging, 0, bytes);
        self.run(slots, false);
        crate::context::read_mapped(&self.w.ctx, &self.readback, out)
    }
}

impl BatchCodecBackend for GpuMimiBatch {
    fn frame_size(&self) -> usize {
        self.w.mimi.frame_size()
    }

    fn n_codebooks(&self) -> usize {
        self.w.mimi.n_codebooks()
    }

    fn slots(&self) -> usize {
        self.streams.slots
    }

    fn encode_frames(&mut self, slots: &[usize], pcm: &[f32]) -> Result<&[u32], MimiError> {
        let fs = self.frame_size();
        self.check(slots, pcm.len(), fs, "encode_frames")?;
        if slots.is_empty() {
            return Ok(&[]);
        }
        self.encode(slots, pcm)?;
        Ok(&self.codes[..slots.len() * self.n_codebooks()])
    }

    fn decode_frames(
        &mut self,
        slots: &[usize],
        codes: &[u32],
        out: &mut [f32],
    ) -> Result<(), MimiError> {
        let (fs, nq) = (self.frame_size(), self.n_codebooks());
        self.check(slots, codes.len(), nq, "decode_frames (codes)")?;
        self.check(slots, out.len(), fs, "decode_frames (samples)")?;
        check_code_range(codes, self.w.mimi.cardinality())?;
        if slots.is_empty() {
            return Ok(());
        }
        Ok(self.decode(slots, codes, out)?)
    }

    /// Zeroes `slot`'s streaming buffers in one submission (a slot out of range: nothing).
    fn reset(&mut self, slot: usize) {
        if slot >= self.streams.slots {
            return;
        }
        let ctx = &self.w.ctx;
        let mut enc = ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        self.streams.clear(&mut enc, slot);
        ctx.submit(enc.finish());
        self.d.submissions += 1;
    }
}
