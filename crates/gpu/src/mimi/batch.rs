//! [`GpuMimiBatch`]: the streaming codecs of several conversation slots on the device, each call
//! one submission for every listed slot.

use std::sync::Arc;

use model::mimi::{BatchCodecBackend, MimiError};

use super::GpuMimiWeights;
use super::{bytes_of_f32, check_code_range, dispatch, read_words, Decider, Streams};
use crate::{GpuContext, GpuError};

/// The device codecs of `slots` conversation slots over one engine's uploaded weights: every
/// slot's streaming state (convolution histories, transposed-convolution tails, K/V rings,
/// positions) in device buffers made by [`GpuMimiBatch::new`], and a
/// [`BatchCodecBackend`].
///
/// An [`BatchCodecBackend::encode_frames`] (or `decode_frames`) call is one submission for all
/// listed slots: one `Queue::write_buffer` of their inputs (back to back, in the order of the
/// list) into a staging buffer, copies from there into each slot's input buffer, every listed
/// slot's recorded launches in one compute pass, copies of each slot's output into one
/// readback buffer, one map. An encoder level the device cannot prove costs that slot one more
/// submission (the host's exact decision, as in [`super::GpuMimi`]).
///
/// The kernels run per slot: a tick reads the codec's weights once per listed slot (a slot
/// dimension in the kernels, reading each weight once per tick, is not done yet).
pub struct GpuMimiBatch {
    w: Arc<GpuMimiWeights>,
    streams: Vec<Streams>,
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
            .field("slots", &self.streams.len())
            .finish()
    }
}

device_codec_accessors!(GpuMimiBatch);

impl GpuMimiBatch {
    /// Fresh streams of `slots` slots (at least one) over the uploaded weights: allocates every
    /// state, work, staging and readback buffer and records each slot's launches.
    pub fn new(w: Arc<GpuMimiWeights>, slots: usize) -> Result<GpuMimiBatch, GpuError> {
        if slots == 0 {
            return Err(GpuError::Unsupported {
                format: "Mimi batch".into(),
                why: "zero slots".into(),
            });
        }
        let m = &w.mimi;
        let (fs, nq, cb) = (m.frame_size(), m.n_codebooks(), w.cb_dim);
        let streams = (0..slots)
            .map(|_| Streams::new(&w))
            .collect::<Result<Vec<_>, GpuError>>()?;
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

    /// Kernel launches of one slot's decoder frame and encoder frame (a call runs those of
    /// every listed slot).
    pub fn launches_per_slot(&self) -> (usize, usize) {
        let s = &self.streams[0];
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
        let n = self.streams.len();
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

    /// One submission: the staged inputs copied to each listed slot's `input` buffer (`in_bytes`
    /// each), every listed slot's launches of one direction in one pass, each slot's `output`
    /// (`out_bytes`) copied into the readback buffer in list order.
    fn run(&mut self, slots: &[usize], encoder_side: bool, in_bytes: u64, out_bytes: u64) {
        let ctx = &self.w.ctx;
        let mut enc = ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        for (i, &s) in slots.iter().enumerate() {
            let (_, input, _) = self.streams[s].side(encoder_side);
            enc.copy_buffer_to_buffer(&self.staging, i as u64 * in_bytes, input, 0, in_bytes);
        }
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            for &s in slots {
                let (d, _, _) = self.streams[s].side(encoder_side);
                dispatch(&mut pass, &d.launches);
            }
        }
        for (i, &s) in slots.iter().enumerate() {
            let (_, _, output) = self.streams[s].side(encoder_side);
            enc.copy_buffer_to_buffer(output, 0, &self.readback, i as u64 * out_bytes, out_bytes);
        }
        ctx.queue().submit([enc.finish()]);
        self.d.submissions += 1;
    }

    fn encode(&mut self, slots: &[usize], pcm: &[f32]) -> Result<(), GpuError> {
        let (fs, nq) = (self.frame_size(), self.n_codebooks());
        let k = slots.len();
        self.w
            .ctx
            .queue()
            .write_buffer(&self.staging, 0, bytes_of_f32(pcm));
        self.run(slots, true, (fs * 4) as u64, ((nq + 1) * 4) as u64);
        let words = &mut self.words[..k * (nq + 1)];
        read_words(&self.w.ctx, &self.readback, words)?;
        for (i, &s) in slots.iter().enumerate() {
            let words = &self.words[i * (nq + 1)..(i + 1) * (nq + 1)];
            let codes = &mut self.codes[i * nq..(i + 1) * nq];
            self.d
                .decide(&self.w, &self.streams[s], &self.readback, words, codes)?;
        }
        Ok(())
    }

    fn decode(&mut self, slots: &[usize], codes: &[u32], out: &mut [f32]) -> Result<(), GpuError> {
        let (fs, nq) = (self.frame_size(), self.n_codebooks());
        let bytes = &mut self.codes_bytes[..codes.len() * 4];
        for (b, c) in bytes.chunks_exact_mut(4).zip(codes) {
            b.copy_from_slice(&c.to_le_bytes());
        }
        self.w.ctx.queue().write_buffer(&self.staging, 0, bytes);
        self.run(slots, false, (nq * 4) as u64, (fs * 4) as u64);
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
        self.streams.len()
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
        let Some(st) = self.streams.get(slot) else {
            return;
        };
        let ctx = &self.w.ctx;
        let mut enc = ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        st.clear(&mut enc);
        ctx.queue().submit([enc.finish()]);
        self.d.submissions += 1;
    }
}
