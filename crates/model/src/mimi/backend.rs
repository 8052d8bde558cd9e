//! The codec backend seam: where one conversation's streaming Mimi encoder and decoder run.

use std::sync::Arc;

use kernels::Pool;

use super::{Mimi, MimiBatchDecoder, MimiBatchEncoder, MimiDecoder, MimiEncoder, MimiError};

/// A streaming codec for one conversation: PCM frames in, codes out (encoder); codes in, PCM
/// frames out (decoder). The two directions keep separate streaming state.
///
/// What a backend must guarantee:
/// * **No allocation, lock or syscall per frame** once built (every buffer is allocated by its
///   constructor).
/// * **Determinism:** the same frames from a fresh (or reset) state give the same codes and samples.
/// * **Where data lives:** PCM and codes cross the seam in host memory (one frame each way per
///   80 ms); intermediate activations stay in the backend.
pub trait CodecBackend: Send {
    /// Samples per frame (1920 at 24 kHz for the released Mimi).
    fn frame_size(&self) -> usize;

    /// Codebooks produced per frame.
    fn n_codebooks(&self) -> usize;

    /// Encode one frame of [`CodecBackend::frame_size`] samples; returns its codes (borrowed until
    /// the next call).
    fn encode_frame(&mut self, pcm: &[f32]) -> Result<&[u32], MimiError>;

    /// Decode one frame of codes (at least the codebooks the decoder was built for) into `out`
    /// ([`CodecBackend::frame_size`] samples).
    fn decode_frame(&mut self, codes: &[u32], out: &mut [f32]) -> Result<(), MimiError>;

    /// Both streams back to fresh (bit-identical to a new backend). Allocates nothing.
    fn reset(&mut self);
}

/// The CPU codec: Mimi's streaming encoder and decoder with their matrix products split over a
/// worker pool (the same pool as the conversation's LM, which runs at other times of the frame).
#[derive(Debug)]
pub struct CpuMimi {
    enc: MimiEncoder,
    dec: MimiDecoder,
    pool: Arc<Pool>,
}

impl CpuMimi {
    /// Fresh streams of `mimi` running on `pool`.
    pub fn new(mimi: Arc<Mimi>, pool: Arc<Pool>) -> CpuMimi {
        CpuMimi {
            enc: MimiEncoder::new(mimi.clone()),
            dec: MimiDecoder::new(mimi),
            pool,
        }
    }

    /// The pool the codec runs on.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }
}

impl CodecBackend for CpuMimi {
    fn frame_size(&self) -> usize {
        self.enc.mimi().frame_size()
    }
    fn n_codebooks(&self) -> usize {
        self.enc.mimi().n_codebooks()
    }
    fn encode_frame(&mut self, pcm: &[f32]) -> Result<&[u32], MimiError> {
        self.enc.encode_frame_with(pcm, Some(&self.pool), None)
    }
    fn decode_frame(&mut self, codes: &[u32], out: &mut [f32]) -> Result<(), MimiError> {
        self.dec
            .decode_frame_with(codes, out, Some(&self.pool), None)
    }
    fn reset(&mut self) {
        self.enc.reset();
        self.dec.reset();
    }
}

/// The streaming codecs of a set of conversation slots, run together: each call encodes (or
/// decodes) one frame of every listed slot, so a device reads the codec's weights once per
/// tick for all of them. Slots not listed do not move; each slot's results are those a
/// [`CodecBackend`] of its own gives for the same frames (codes identical, samples equal).
///
/// The guarantees of [`CodecBackend`] hold per call (no allocation, lock or syscall once built;
/// determinism per slot; PCM and codes in host memory).
pub trait BatchCodecBackend: Send {
    /// Samples per frame.
    fn frame_size(&self) -> usize;

    /// Codebooks produced (and consumed) per frame.
    fn n_codebooks(&self) -> usize;

    /// Number of slots.
    fn slots(&self) -> usize;

    /// Encode one frame of each slot in `slots` (distinct, below [`BatchCodecBackend::slots`]):
    /// `pcm` holds their frames one after the other; returns
    /// [`BatchCodecBackend::n_codebooks`] codes per slot in the same order (borrowed until the
    /// next call).
    fn encode_frames(&mut self, slots: &[usize], pcm: &[f32]) -> Result<&[u32], MimiError>;

    /// Decode one frame of each slot in `slots`: `codes` holds
    /// [`BatchCodecBackend::n_codebooks`] codes per slot, `out` receives
    /// [`BatchCodecBackend::frame_size`] samples per slot, both in the order of `slots`.
    fn decode_frames(
        &mut self,
        slots: &[usize],
        codes: &[u32],
        out: &mut [f32],
    ) -> Result<(), MimiError>;

    /// Both streams of `slot` back to fresh; the other slots are untouched. Allocates nothing.
    fn reset(&mut self, slot: usize);
}

/// The CPU batch codec: [`MimiBatchEncoder`] and [`MimiBatchDecoder`] on a worker pool (the
/// pool of the batch's LM, which runs at other times of the tick).
#[derive(Debug)]
pub struct CpuMimiBatch {
    enc: MimiBatchEncoder,
    dec: MimiBatchDecoder,
    pool: Arc<Pool>,
}

impl CpuMimiBatch {
    /// Fresh streams of `mimi` for `slots` slots, running on `pool`.
    pub fn new(mimi: Arc<Mimi>, slots: usize, pool: Arc<Pool>) -> CpuMimiBatch {
        CpuMimiBatch {
            enc: MimiBatchEncoder::new(mimi.clone(), slots),
            dec: MimiBatchDecoder::new(mimi, slots),
            pool,
        }
    }
}

impl BatchCodecBackend for CpuMimiBatch {
    fn frame_size(&self) -> usize {
        self.enc.mimi().frame_size()
    }
    fn n_codebooks(&self) -> usize {
        self.enc.mimi().n_codebooks()
    }
    fn slots(&self) -> usize {
        self.enc.streams()
    }
    fn encode_frames(&mut self, slots: &[usize], pcm: &[f32]) -> Result<&[u32], MimiError> {
        self.enc.encode_frames(slots, pcm, Some(&self.pool))
    }
    fn decode_frames(
        &mut self,
        slots: &[usize],
        codes: &[u32],
        out: &mut [f32],
    ) -> Result<(), MimiError> {
        self.dec.decode_frames(slots, codes, out, Some(&self.pool))
    }
    fn reset(&mut self, slot: usize) {
        self.enc.reset(slot);
        self.dec.reset(slot);
    }
}
