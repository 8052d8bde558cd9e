//! A streaming front end that accepts PCM in chunks of any length and emits whole frames.

use super::{MimiEncoder, MimiError};

/// Buffers PCM until a whole frame is available, then encodes it (allocation-free).
#[derive(Debug)]
pub struct StreamEncoder {
    enc: MimiEncoder,
    buf: Vec<f32>,
    fill: usize,
}

impl StreamEncoder {
    /// Wraps a streaming encoder.
    pub fn new(enc: MimiEncoder) -> Self {
        let fs = enc.mimi().frame_size();
        StreamEncoder {
            enc,
            buf: vec![0.0; fs],
            fill: 0,
        }
    }

    /// Samples waiting for the next frame.
    pub fn pending(&self) -> usize {
        self.fill
    }

    /// Feeds `pcm` (any length, possibly empty); calls `on_frame` with the codes of every
    /// frame completed, in order. Returns the number of frames emitted.
    pub fn push(
        &mut self,
        mut pcm: &[f32],
        mut on_frame: impl FnMut(&[u32]),
    ) -> Result<usize, MimiError> {
        let fs = self.buf.len();
        let mut n = 0;
        while !pcm.is_empty() {
            if self.fill == 0 && pcm.len() >= fs {
                let codes = self.enc.encode_frame(&pcm[..fs])?;
                on_frame(codes);
                pcm = &pcm[fs..];
                n += 1;
                continue;
            }
            let take = (fs - self.fill).min(pcm.len());
            self.buf[self.fill..self.fill + take].copy_from_slice(&pcm[..take]);
            self.fill += take;
            pcm = &pcm[take..];
            if self.fill == fs {
                self.fill = 0;
                let codes = self.enc.encode_frame(&self.buf)?;
                on_frame(codes);
                n += 1;
            }
        }
        Ok(n)
    }

    /// Pads the pending partial frame with zeros and encodes it (if any samples are pending).
    pub fn flush(&mut self, mut on_frame: impl FnMut(&[u32])) -> Result<usize, MimiError> {
        if self.fill == 0 {
            return Ok(0);
        }
        self.buf[self.fill..].fill(0.0);
        self.fill = 0;
        let codes = self.enc.encode_frame(&self.buf)?;
        on_frame(codes);
        Ok(1)
    }

    /// Drops pending samples and resets the encoder.
    pub fn reset(&mut self) {
        self.fill = 0;
        self.enc.reset();
    }

    /// The wrapped encoder.
    pub fn encoder(&mut self) -> &mut MimiEncoder {
        &mut self.enc
    }
}
