//! [`GpuMimi`]: the device codec of one conversation (a [`CodecBackend`]), the recorded
//! launches of [`Streams`] over one slot.

use std::sync::Arc;

use model::mimi::{CodecBackend, MimiError, Stage};

use super::record::dispatch;
use super::streams::{Decider, Streams};
use super::weights::GpuMimiWeights;
use super::{bytes_of_f32, check_code_range, read_words};
use crate::context::GpuContext;
use crate::GpuError;

/// The device codec of one conversation: its streaming state in device memory and every launch
/// of an encoder frame and of a decoder frame recorded at construction.
pub struct GpuMimi {
    w: Arc<GpuMimiWeights>,
    s: Streams,
    readback: wgpu::Buffer,
    /// Where a traced frame's intermediates land (see [`GpuMimi::encode_frame_traced`]).
    trace_readback: wgpu::Buffer,
    codes_bytes: Vec<u8>,
    /// Codes of every level, then the number of unproven levels (as read back).
    words: Vec<u32>,
    codes: Vec<u32>,
    d: Decider,
}

impl std::fmt::Debug for GpuMimi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuMimi")
            .field("adapter", self.w.ctx.adapter())
            .finish()
    }
}

device_codec_accessors!(GpuMimi);

impl GpuMimi {
    /// Fresh streams over the uploaded weights: allocates the state, work and readback buffers
    /// and records both directions' launches.
    pub fn new(w: Arc<GpuMimiWeights>) -> Result<GpuMimi, GpuError> {
        let s = Streams::new(&w, 1)?;
        // The slot list of every call: one slot, slot 0 (written once).
        let list: Vec<u8> = [1u32, 0].iter().flat_map(|v| v.to_le_bytes()).collect();
        w.ctx.queue().write_buffer(&s.list, 0, &list);
        let m = &w.mimi;
        let (fs, nq, cb) = (m.frame_size(), m.n_codebooks(), w.cb_dim);
        let rb_bytes = (fs.max(nq + 1).max(2 * cb) * 4) as u64;
        let read = wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST;
        let readback = w.ctx.buffer("mimi readback", rb_bytes, read)?;
        let tap_floats = s.enc.tap_floats().max(s.dec.tap_floats());
        let trace_readback = w
            .ctx
            .buffer("mimi trace readback", (tap_floats * 4) as u64, read)?;
        Ok(GpuMimi {
            s,
            readback,
            trace_readback,
            codes_bytes: vec![0; nq * 4],
            words: vec![0; nq + 1],
            codes: vec![0; nq],
            d: Decider::new(cb),
            w,
        })
    }

    /// Kernel launches of a decoder frame and of an encoder frame.
    pub fn launches_per_frame(&self) -> (usize, usize) {
        (self.s.dec.launches.len(), self.s.enc.launches.len())
    }

    /// Records one direction's frame in one submission: its launches (split into one compute
    /// pass per tap when `traced`, each tap's buffer copied to the trace readback), then
    /// `copies` to the readback buffer, back to back.
    fn run(&mut self, encoder_side: bool, traced: bool, copies: &[(&wgpu::Buffer, u64)]) {
        let ctx = &self.w.ctx;
        let (d, _, _) = self.s.side(encoder_side);
        let mut enc = ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        let mut from = 0;
        if traced {
            let mut off = 0;
            for tap in &d.taps {
                {
                    let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
                    dispatch(&mut pass, &d.launches[from..tap.after], 1);
                }
                let bytes = (tap.floats * 4) as u64;
                enc.copy_buffer_to_buffer(&tap.buffer.buf, 0, &self.trace_readback, off, bytes);
                off += bytes;
                from = tap.after;
            }
        }
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            dispatch(&mut pass, &d.launches[from..], 1);
        }
        let mut off = 0;
        for (b, len) in copies {
            enc.copy_buffer_to_buffer(b, 0, &self.readback, off, *len);
            off += len;
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

    fn encode(&mut self, pcm: &[f32], traced: bool) -> Result<(), GpuError> {
        let nq = self.codes.len();
        self.w
            .ctx
            .queue()
            .write_buffer(&self.s.pcm_in.buf, 0, bytes_of_f32(pcm));
        let codes_out = self.s.codes_out.buf.clone();
        self.run(true, traced, &[(&codes_out, ((nq + 1) * 4) as u64)]);
        read_words(&self.w.ctx, &self.readback, &mut self.words)?;
        self.d.decide(
            &self.w,
            (&self.s, 0),
            &self.readback,
            &self.words,
            &mut self.codes,
        )?;
        Ok(())
    }

    fn decode(&mut self, codes: &[u32], out: &mut [f32], traced: bool) -> Result<(), GpuError> {
        let nq = self.codes.len();
        for (b, c) in self.codes_bytes.chunks_exact_mut(4).zip(&codes[..nq]) {
            b.copy_from_slice(&c.to_le_bytes());
        }
        self.w
            .ctx
            .queue()
            .write_buffer(&self.s.codes_in.buf, 0, &self.codes_bytes);
        let bytes = (out.len() * 4) as u64;
        let pcm_out = self.s.pcm_out.buf.clone();
        self.run(false, traced, &[(&pcm_out, bytes)]);
        crate::context::read_mapped(&self.w.ctx, &self.readback, out)
    }

    fn check_pcm(&self, pcm: &[f32]) -> Result<(), MimiError> {
        let fs = self.frame_size();
        if pcm.len() != fs {
            return Err(MimiError::Input(format!(
                "encode_frame needs {fs} samples, got {}",
                pcm.len()
            )));
        }
        Ok(())
    }

    fn check_codes(&self, codes: &[u32], out: &[f32]) -> Result<(), MimiError> {
        let (fs, nq) = (self.frame_size(), self.n_codebooks());
        if out.len() != fs {
            return Err(MimiError::Input(format!(
                "decode_frame writes {fs} samples, buffer has {}",
                out.len()
            )));
        }
        if codes.len() < nq {
            return Err(MimiError::Input(format!(
                "decode_frame needs {nq} codes, got {}",
                codes.len()
            )));
        }
        check_code_range(&codes[..nq], self.w.mimi.cardinality())
    }

    /// [`CodecBackend::encode_frame`], also reporting the frame's encoder intermediates
    /// ([`Stage::EncSeanet`], [`Stage::EncTransformer`], [`Stage::Latent`], each `[dim, t]`
    /// channel-major) to `trace`, as the CPU encoder's traced frame does. For parity tooling:
    /// the frame is split into one compute pass per stage and the intermediates are read back
    /// into a vector allocated per call.
    pub fn encode_frame_traced(
        &mut self,
        pcm: &[f32],
        trace: &mut dyn FnMut(Stage, &[f32]),
    ) -> Result<&[u32], MimiError> {
        self.check_pcm(pcm)?;
        self.encode(pcm, true)?;
        self.report_taps(true, trace)?;
        Ok(&self.codes)
    }

    /// [`CodecBackend::decode_frame`], also reporting the decoder intermediates
    /// ([`Stage::DecLatent`], [`Stage::DecUpsample`], [`Stage::DecTransformer`]) to `trace`
    /// (see [`GpuMimi::encode_frame_traced`]).
    pub fn decode_frame_traced(
        &mut self,
        codes: &[u32],
        out: &mut [f32],
        trace: &mut dyn FnMut(Stage, &[f32]),
    ) -> Result<(), MimiError> {
        self.check_codes(codes, out)?;
        self.decode(codes, out, true)?;
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

    fn encode_frame(&mut self, pcm: &[f32]) -> Result<&[u32], MimiError> {
        self.check_pcm(pcm)?;
        self.encode(pcm, false)?;
        Ok(&self.codes)
    }

    fn decode_frame(&mut self, codes: &[u32], out: &mut [f32]) -> Result<(), MimiError> {
        self.check_codes(codes, out)?;
        Ok(self.decode(codes, out, false)?)
    }

    fn reset(&mut self) {
        let ctx = &self.w.ctx;
        let mut enc = ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        self.s.clear(&mut enc, 0);
        ctx.submit(enc.finish());
        self.d.submissions += 1;
    }
}

/// The parts of a frame the one-submission duplex frame ([`crate::GpuDuplex`]) records into its
/// own command buffer.
impl GpuMimi {
    /// Records one direction's launches (the encoder's when `encoder_side`) in one compute pass.
    pub(crate) fn record_direction(&self, enc: &mut wgpu::CommandEncoder, encoder_side: bool) {
        let (d, _, _) = self.s.side(encoder_side);
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
        dispatch(&mut pass, &d.launches, 1);
    }

    /// Records the reset of both directions' streams ([`CodecBackend::reset`] inside a frame).
    pub(crate) fn record_reset(&self, enc: &mut wgpu::CommandEncoder) {
        self.s.clear(enc, 0);
    }

    /// The encoder's input (`frame_size` f32).
    pub(crate) fn pcm_in(&self) -> &wgpu::Buffer {
        &self.s.pcm_in.buf
    }

    /// The encoder's output: `n_codebooks` codes, then the number of levels it could not prove.
    pub(crate) fn codes_out(&self) -> &wgpu::Buffer {
        &self.s.codes_out.buf
    }

    /// The decoder's input (`n_codebooks` codes).
    pub(crate) fn codes_in(&self) -> &wgpu::Buffer {
        &self.s.codes_in.buf
    }

    /// The decoder's output (`frame_size` f32).
    pub(crate) fn pcm_out(&self) -> &wgpu::Buffer {
        &self.s.pcm_out.buf
    }

    /// Bytes of decoder state a replayed decoder frame needs restored.
    pub(crate) fn decoder_snapshot_bytes(&self) -> u64 {
        self.s.decoder_snapshot_bytes()
    }

    /// Records the copy of the decoder state into `shadow`, or back with `restore`.
    pub(crate) fn record_decoder_copy(
        &self,
        enc: &mut wgpu::CommandEncoder,
        shadow: &wgpu::Buffer,
        restore: bool,
    ) {
        self.s.record_decoder_copy(enc, 0, shadow, restore);
    }

    /// The exact codes of an encoded frame from its read-back `words` (`n_codebooks` codes, then
    /// the unproven count): the device's when proven, else the host's decision (one more
    /// submission, the latents read back), as [`CodecBackend::encode_frame`] decides them.
    /// Returns the codes and whether the host decided them.
    pub(crate) fn decide(&mut self, words: &[u32]) -> Result<(&[u32], bool), GpuError> {
        let before = self.d.host_decisions;
        self.d.decide(
            &self.w,
            (&self.s, 0),
            &self.readback,
            words,
            &mut self.codes,
        )?;
        Ok((&self.codes, self.d.host_decisions != before))
    }
}
