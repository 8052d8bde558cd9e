//! The codec backend seam: where the streaming Mimi encoders and decoders of a set of
//! conversation slots run. A session is a backend of one slot, a batch driver's has one slot per
//! conversation, as the LM's [`LmBackend`](crate::lm::LmBackend) has one row per conversation.
//!
//! The drivers above it (the runtime's stepper) are written once against [`CodecBackend`]; a
//! backend only computes. [`CpuMimi`] is the CPU backend: [`MimiBatchEncoder`] and
//! [`MimiBatchDecoder`] over `slots` streams and the worker pool their matrix products are split
//! over.

use std::sync::Arc;

use kernels::Pool;

use super::{Mimi, MimiBatchDecoder, MimiBatchEncoder, MimiError};

/// The streaming codecs of `slots()` conversation slots: PCM frames in, codes out (encoder);
/// codes in, PCM frames out (decoder). Each call codes one frame of every listed slot, so a
/// backend reads the codec's weights once per call for all of them. A slot's two directions keep
/// separate streaming state.
///
/// What a backend must guarantee:
/// * **No allocation, lock or syscall per call** once built: every buffer (streaming state, work
///   buffers, outputs) is allocated by its constructor for `slots()` slots.
/// * **Determinism per slot:** the same frames from a fresh (or reset) slot give the same codes
///   (exactly) and samples (equal as numbers), whatever the other slots do: which ones are listed
///   with it, in which order, when they start or reset. A slot of a backend of many slots gives
///   what it gives in a backend of one.
/// * **Slots not listed do not move:** a call changes the state of its listed slots only; a reset
///   that of its one slot.
/// * **Arguments are checked first:** repeated or out-of-range slots, wrong lengths and codes at or
///   above the codebook size are refused before any slot moves.
/// * **Where data lives:** PCM and codes cross the seam in host memory (one frame each way per
///   slot per 80 ms); intermediate activations and streaming state stay in the backend.
pub trait CodecBackend: Send {
    /// Samples per frame (1920 at 24 kHz for the released Mimi).
    fn frame_size(&self) -> usize;

    /// Codebooks produced (and consumed) per frame.
    fn n_codebooks(&self) -> usize;

    /// Number of slots the backend holds streams for (at least one).
    fn slots(&self) -> usize;

    /// Encodes one frame of each slot in `slots` (distinct, each below [`CodecBackend::slots`]):
    /// `pcm` holds their frames ([`CodecBackend::frame_size`] samples each) one after the other.
    /// Returns [`CodecBackend::n_codebooks`] codes per slot in the same order (borrowed until the
    /// next call).
    fn encode_frames(&mut self, slots: &[usize], pcm: &[f32]) -> Result<&[u32], MimiError>;

    /// Decodes one frame of each slot in `slots`: `codes` holds [`CodecBackend::n_codebooks`]
    /// codes per slot, `out` receives [`CodecBackend::frame_size`] samples per slot, both in the
    /// order of `slots`.
    fn decode_frames(
        &mut self,
        slots: &[usize],
        codes: &[u32],
        out: &mut [f32],
    ) -> Result<(), MimiError>;

    /// Both streams of `slot` back to fresh (bit-identical to a new backend's); the other slots
    /// are untouched, a slot out of range is ignored. Allocates nothing.
    fn reset(&mut self, slot: usize);
}

/// The CPU codec: [`MimiBatchEncoder`] and [`MimiBatchDecoder`] over `slots` streams, with their
/// matrix products split over a worker pool (the pool of the driver's LM, which runs at other
/// times of the frame). With one slot it runs the same code as [`super::MimiEncoder`] and
/// [`super::MimiDecoder`] (one core, one stream), so a session's codes and samples are theirs bit
/// for bit.
#[derive(Debug)]
pub struct CpuMimi {
    enc: MimiBatchEncoder,
    dec: MimiBatchDecoder,
    pool: Arc<Pool>,
}

impl CpuMimi {
    /// Fresh streams of `mimi` for `slots` slots (at least one), running on `pool`.
    pub fn new(mimi: Arc<Mimi>, slots: usize, pool: Arc<Pool>) -> CpuMimi {
        CpuMimi {
            enc: MimiBatchEncoder::new(mimi.clone(), slots),
            dec: MimiBatchDecoder::new(mimi, slots),
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
