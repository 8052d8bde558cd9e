//! A step of [`GpuLm`]: the step buffer's upload, the piecewise and the sampled step of
//! [`LmBackend`], and the parts of the sampled step the one-submission frame records
//! ([`crate::GpuDuplex`]).

use model::lm::{
    check_active_rows, check_lengths, LmBackend, LmError, LmSpec, NO_TOKEN, UNGENERATED,
};
use model::sampling::{Sampler, SamplingError};

use super::GpuLm;
use crate::context::GpuContext;
use crate::sample::device_samples;
use crate::shaders::{step, MAX_ROWS};
use crate::GpuError;

impl GpuLm {
    /// Writes the step buffer (rows, ring slots, tokens) and the RoPE angles of a temporal step.
    fn upload_step(&mut self, rows: &[usize], tokens: &[u32]) {
        let s = &self.w.spec;
        let n = rows.len();
        let (ctx_len, half) = (s.context, s.head_dim / 2);
        self.step_host.fill(0);
        self.step_host[0] = n as i32;
        for (i, &b) in rows.iter().enumerate() {
            let pos = self.pos[b];
            self.step_host[step::SESS + i] = b as i32;
            self.step_host[step::SLOT + i] = (pos % ctx_len) as i32;
            self.step_host[step::COUNT + i] = (pos + 1).min(ctx_len) as i32;
            for (f, &freq) in self.freqs.iter().enumerate() {
                let (sn, c) = (freq as f64 * pos as f64).sin_cos();
                self.rope_host[(i * half + f) * 2] = c as f32;
                self.rope_host[(i * half + f) * 2 + 1] = sn as f32;
            }
        }
        for (i, &t) in tokens.iter().enumerate() {
            self.step_host[step::TOKENS + i] = shader_token(t);
        }
        let q = self.w.ctx.queue();
        fill_bytes(
            &mut self.bytes_host,
            self.step_host.iter().map(|v| v.to_le_bytes()),
        );
        q.write_buffer(&self.step, 0, &self.bytes_host);
        let rope = &self.rope_host[..n * half * 2];
        fill_bytes(&mut self.bytes_host, rope.iter().map(|v| v.to_le_bytes()));
        q.write_buffer(&self.rope, 0, &self.bytes_host);
    }

    /// Records `dispatches` for `n` rows, copies `copies` (device buffer, bytes) into the next
    /// readback buffer back to back, submits, waits and maps.
    fn run(
        &mut self,
        temporal: bool,
        k: usize,
        n: usize,
        copies: &[(&wgpu::Buffer, usize)],
    ) -> Result<usize, GpuError> {
        let ctx = &self.w.ctx;
        let used = self.next_readback;
        let rb = &self.readback[used];
        self.next_readback = (used + 1) % self.readback.len();
        let mut enc = ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        let rec = if temporal {
            &self.temporal
        } else {
            &self.dep[k]
        };
        for b in &rec.clears {
            enc.clear_buffer(b, 0, None);
        }
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            for d in &rec.dispatches {
                d.record(&mut pass, n as u32);
            }
        }
        let mut off = 0u64;
        for (b, len) in copies {
            enc.copy_buffer_to_buffer(b, 0, rb, off, *len as u64);
            off += *len as u64;
        }
        ctx.submit(enc.finish());
        self.submissions += 1;
        Ok(used)
    }
}

/// Maps `rb` and splits its content into `outs` (back to back).
fn read_split(
    ctx: &GpuContext,
    rb: &wgpu::Buffer,
    outs: &mut [&mut [f32]],
) -> Result<(), GpuError> {
    let total: usize = outs.iter().map(|o| o.len()).sum();
    let slice = rb.slice(..(total * 4) as u64);
    slice.map_async(wgpu::MapMode::Read, |_| {});
    ctx.wait()?;
    {
        let view = slice
            .get_mapped_range()
            .map_err(|e| GpuError::Runtime(format!("readback: {e:?}")))?;
        let mut words = view.chunks_exact(4);
        for o in outs.iter_mut() {
            for (v, c) in o.iter_mut().zip(&mut words) {
                *v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
    }
    rb.unmap();
    Ok(())
}

/// A token as the shaders read it: −1 ([`NO_TOKEN`]) embeds as zeros; [`UNGENERATED`] reads row 0
/// (as on the CPU).
fn shader_token(t: u32) -> i32 {
    match t {
        NO_TOKEN => -1,
        UNGENERATED => 0,
        t => t as i32,
    }
}

impl LmBackend for GpuLm {
    fn spec(&self) -> &LmSpec {
        &self.w.spec
    }

    fn batch_size(&self) -> usize {
        self.rows
    }

    fn temporal_step(&mut self, rows: &[usize], tokens: &[u32]) -> Result<(), LmError> {
        check_active_rows(rows, self.rows)?;
        let n = rows.len();
        self.w.spec.check_input_tokens(n, tokens)?;
        self.upload_step(rows, tokens);
        let ctx = self.w.ctx.clone();
        let s = &self.w.spec;
        let (tl, td) = (n * s.text_card, n * s.dim);
        let (a, b) = (self.text_logits_dev.clone(), self.tout.clone());
        let i = self.run(true, 0, n, &[(&a, tl * 4), (&b, td * 4)])?;
        let rb = self.readback[i].clone();
        read_split(
            &ctx,
            &rb,
            &mut [&mut self.text_logits[..tl], &mut self.tout_host[..td]],
        )?;
        self.readbacks += 1;
        for &b in rows {
            self.pos[b] += 1;
        }
        self.n_active = n;
        self.dep_next = 0;
        Ok(())
    }

    fn text_logits(&self) -> &[f32] {
        &self.text_logits
    }

    fn transformer_out(&self) -> &[f32] {
        &self.tout_host
    }

    fn depformer_step(
        &mut self,
        rows: &[usize],
        k: usize,
        prev_tokens: &[u32],
    ) -> Result<&[f32], LmError> {
        check_active_rows(rows, self.rows)?;
        let s = &self.w.spec;
        let n = rows.len();
        check_lengths(&[("previous tokens", n, prev_tokens.len())])?;
        if n != self.n_active || k >= s.dep_q || (k != 0 && k != self.dep_next) {
            return Err(LmError::Config(format!(
                "depformer step {k} out of order (expected {})",
                self.dep_next
            )));
        }
        let max = if k == 0 { s.text_card } else { s.card };
        let mut prev = [0i32; MAX_ROWS];
        for (i, &t) in prev_tokens.iter().enumerate() {
            if t != NO_TOKEN && t != UNGENERATED && t as usize > max {
                return Err(LmError::Token {
                    stream: k,
                    token: i64::from(t),
                    max: max as i64,
                });
            }
            prev[i] = shader_token(t);
        }
        let prev_base = step::TOKENS + MAX_ROWS * s.num_streams();
        let ctx = self.w.ctx.clone();
        fill_bytes(
            &mut self.bytes_host,
            prev[..n].iter().map(|v| v.to_le_bytes()),
        );
        ctx.queue()
            .write_buffer(&self.step, (prev_base * 4) as u64, &self.bytes_host);
        let len = n * s.card;
        let dl = self.dep_logits_dev.clone();
        let i = self.run(false, k, n, &[(&dl, len * 4)])?;
        let rb = self.readback[i].clone();
        read_split(&ctx, &rb, &mut [&mut self.dep_logits[..len]])?;
        self.readbacks += 1;
        self.dep_next = k + 1;
        Ok(&self.dep_logits)
    }

    fn sampled_step(
        &mut self,
        rows: &[usize],
        tokens: &[u32],
        samplers: &mut [Sampler],
        force_text: &[Option<u32>],
        text: &mut [u32],
        audio: &mut [u32],
        errors: &mut [Option<SamplingError>],
    ) -> Result<bool, LmError> {
        let n = rows.len();
        let dq = self.w.spec.dep_q;
        check_lengths(&[
            ("text tokens", n, text.len()),
            ("audio tokens", n * dq, audio.len()),
            ("sampling errors", n, errors.len()),
        ])?;
        if !self.sampled_begin(rows, tokens, samplers, force_text)? {
            return Ok(false);
        }
        let ctx = self.w.ctx.clone();
        let rb = self.readback[self.next_readback].clone();
        self.next_readback = (self.next_readback + 1) % self.readback.len();
        let mut enc = ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        self.record_sampled(&mut enc, n);
        let len = (n * self.sample.stride * 4) as u64;
        enc.copy_buffer_to_buffer(&self.sample.records, 0, &rb, 0, len);
        let index = ctx.submit(enc.finish());
        self.submissions += 1;
        let slice = rb.slice(..len);
        slice.map_async(wgpu::MapMode::Read, |_| {});
        ctx.wait_for(index)?;
        {
            let view = slice
                .get_mapped_range()
                .map_err(|e| GpuError::Runtime(format!("readback: {e:?}")))?;
            self.sampled_end(&view, rows, samplers, text, audio, errors);
        }
        rb.unmap();
        self.readbacks += 1;
        Ok(true)
    }

    fn reset_row(&mut self, b: usize) {
        // The ring needs no clearing: a fresh row attends only to entries written since.
        if b < self.rows {
            self.pos[b] = 0;
        }
    }

    fn seek_for_bench(&mut self, offset: usize) {
        self.pos.fill(offset);
    }
}

/// Replaces `out` with the concatenated little-endian words (no allocation once `out` has grown
/// to the largest size, at construction).
fn fill_bytes(out: &mut Vec<u8>, words: impl Iterator<Item = [u8; 4]>) {
    out.clear();
    for w in words {
        out.extend_from_slice(&w);
    }
}

impl GpuLm {
    /// The first part of a sampled step (what [`LmBackend::sampled_step`] and the one-submission
    /// frame share): checks the arguments, and writes the step buffer (`tokens`: the host's
    /// column; the frame overwrites it on the device before the launches run) and the rows'
    /// sampling records. `Ok(false)`, having written nothing, when a sampler is beyond the
    /// device ([`device_samples`]).
    pub(crate) fn sampled_begin(
        &mut self,
        rows: &[usize],
        tokens: &[u32],
        samplers: &[Sampler],
        force_text: &[Option<u32>],
    ) -> Result<bool, LmError> {
        check_active_rows(rows, self.rows)?;
        let n = rows.len();
        let s = &self.w.spec;
        let vocab = (s.text_card, s.card);
        s.check_input_tokens(n, tokens)?;
        check_lengths(&[
            ("samplers", self.rows, samplers.len()),
            ("forced text tokens", n, force_text.len()),
        ])?;
        if !rows
            .iter()
            .all(|&b| device_samples(&samplers[b], vocab.0, vocab.1))
        {
            return Ok(false);
        }
        self.upload_step(rows, tokens);
        let ctx = self.w.ctx.clone();
        self.sample.upload(&ctx, rows, samplers, force_text, vocab);
        Ok(true)
    }

    /// Records the launches of a sampled step of `n` rows into `enc`: the temporal step, text
    /// sampling, then each Depformer step and its sampling (one compute pass).
    pub(crate) fn record_sampled(&self, enc: &mut wgpu::CommandEncoder, n: usize) {
        let m = n as u32;
        let parts = std::iter::once((&self.temporal, &self.sample.text))
            .chain(self.dep.iter().map(|d| (d, &self.sample.audio)));
        // One compute pass for the whole step; a pass whose plan zeroes a buffer ends it for the
        // encoder's clear (the temporal pass, before anything is recorded).
        let mut pass: Option<wgpu::ComputePass<'static>> = None;
        for (rec, sample) in parts {
            if !rec.clears.is_empty() {
                drop(pass.take());
                for b in &rec.clears {
                    enc.clear_buffer(b, 0, None);
                }
            }
            let p = pass.get_or_insert_with(|| {
                enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default())
                    .forget_lifetime()
            });
            for d in &rec.dispatches {
                d.record(p, m);
            }
            sample.record(p, m);
        }
    }

    /// The rows' sampling records on the device (`[rows, stride]` words; a row's tokens at
    /// [`crate::sample::rec::OUT`]: text, then the codes) and their stride in words.
    pub(crate) fn records(&self) -> (&wgpu::Buffer, usize) {
        (&self.sample.records, self.sample.stride)
    }

    /// The step buffer (its input column at [`step::TOKENS`], `1 + n_q` shader tokens per row).
    pub(crate) fn step_buffer(&self) -> &wgpu::Buffer {
        &self.step
    }

    /// The last part of a sampled step: parses the mapped records of the `rows` (`mapped`, from
    /// their first word) into the samplers' streams, `text`, `audio` and `errors`, and advances
    /// the rows' positions. The caller records the text tokens ([`Sampler::record_text`]).
    pub(crate) fn sampled_end(
        &mut self,
        mapped: &[u8],
        rows: &[usize],
        samplers: &mut [Sampler],
        text: &mut [u32],
        audio: &mut [u32],
        errors: &mut [Option<SamplingError>],
    ) {
        let n = rows.len();
        let dq = self.w.spec.dep_q;
        // Tokens per row: text, then the dep_q codes; split into the caller's slices.
        let per_row = 1 + dq;
        let mut all = [0u32; (1 + model::lm::MAX_AUDIO_CODEBOOKS) * MAX_ROWS];
        self.sample.download(
            mapped,
            rows,
            samplers,
            &mut all[..n * per_row],
            per_row,
            errors,
        );
        for i in 0..n {
            text[i] = all[i * per_row];
            audio[i * dq..(i + 1) * dq].copy_from_slice(&all[i * per_row + 1..(i + 1) * per_row]);
        }
        for &b in rows {
            self.pos[b] += 1;
        }
        self.n_active = n;
        // The Depformer of this step has run: a piecewise depformer_step must follow a new
        // temporal step.
        self.dep_next = dq;
    }
}
