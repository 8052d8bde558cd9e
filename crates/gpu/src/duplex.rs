//! [`GpuDuplex`]: one conversation's whole duplex frame on the device in **one submission** —
//! a [`GpuDuplexBatch`] of one slot, as the codec and the LM treat a lone conversation (a batch of
//! one). `duplex_batch.rs`'s module docs give the delay ring, what comes back and the replay.

use std::sync::Arc;

use model::lm::{FrameStep, LmError, LmFrame, LmSpec};
use model::sampling::Sampler;

use crate::context::GpuContext;
use crate::duplex_batch::GpuDuplexBatch;
use crate::lm::{GpuLmOptions, GpuLmWeights};
use crate::mimi::GpuMimiWeights;
use crate::GpuError;

/// One conversation's Mimi streams and LM row on the device, stepped one frame per submission.
pub struct GpuDuplex {
    batch: GpuDuplexBatch,
    /// The one slot's result of a tick.
    result: [Result<Option<LmFrame>, LmError>; 1],
}

impl std::fmt::Debug for GpuDuplex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuDuplex")
            .field("adapter", self.batch.context().adapter())
            .field("offset", &self.offset())
            .finish()
    }
}

impl GpuDuplex {
    /// One conversation over the uploaded weights (both on one context): the LM row with
    /// `opts`, Mimi's streams, the delay ring, the decoder's shadow copy and the readback buffer.
    pub fn new(
        lm: Arc<GpuLmWeights>,
        mimi: Arc<GpuMimiWeights>,
        opts: GpuLmOptions,
    ) -> Result<GpuDuplex, GpuError> {
        Ok(GpuDuplex {
            batch: GpuDuplexBatch::new(lm, mimi, opts, 1)?,
            result: [Ok(None)],
        })
    }

    /// The device context.
    pub fn context(&self) -> &GpuContext {
        self.batch.context()
    }

    /// The LM's sizes.
    pub fn spec(&self) -> &LmSpec {
        self.batch.spec()
    }

    /// Calls since creation or the last reset.
    pub fn offset(&self) -> usize {
        self.batch.offset(0)
    }

    /// Frames replayed because the host's exact codes differed from the device's.
    pub fn replays(&self) -> u64 {
        self.batch.replays()
    }

    /// Frames whose codes the host decided (a level the device could not prove, or
    /// [`GpuDuplex::force_host_decision`]).
    pub fn host_decisions(&self) -> u64 {
        self.batch.host_decisions()
    }

    /// Makes every frame's codes the host's decision (tests of the replay path).
    pub fn force_host_decision(&mut self, on: bool) {
        self.batch.force_host_decision(on);
    }

    /// Tests of the replay: zero the device's first code of every frame after the encode (its
    /// proof flag untouched), so that with [`GpuDuplex::force_host_decision`] the host's exact
    /// codes differ from the device's whenever the true first code is not 0.
    #[doc(hidden)]
    pub fn spoil_device_codes(&mut self, on: bool) {
        self.batch.spoil_device_codes(on);
    }

    /// Mimi's samples per frame.
    pub fn frame_size(&self) -> usize {
        self.batch.frame_size()
    }

    /// Whether `sampler` can run on the device (the frame refuses one that cannot; see
    /// [`crate::sample::device_samples`]).
    pub fn samples(&self, sampler: &Sampler) -> bool {
        self.batch.samples(sampler)
    }

    /// The LM row and the delay ring back to call 0 (the caller resets its sampler). Host state
    /// only: nothing is submitted.
    pub fn reset_lm(&mut self) {
        self.batch.reset_lm(0);
    }

    /// Both Mimi directions back to fresh streams, recorded at the start of the next frame (no
    /// submission of its own).
    pub fn reset_codec(&mut self) {
        self.batch.reset_codec(0);
    }

    /// Benchmark helper: the LM at call `offset` with its KV ring holding `min(offset, context)`
    /// meaningless entries and the delay ring holding initial tokens, as
    /// [`model::lm::Generator::seek_for_bench`] leaves the CPU's.
    pub fn seek_for_bench(&mut self, offset: usize) {
        self.batch.seek_for_bench(offset);
    }

    /// Decodes `codes` through the conversation's decoder in a submission of its own (the
    /// runtime's warm-up decodes placeholder codes to time the decode path; call 0 has no frame).
    pub fn decode_only(&mut self, codes: &[u32], out: &mut [f32]) -> Result<(), GpuError> {
        self.batch.decode_only(0, codes, out)
    }

    /// One frame: encodes `pcm` (`frame_size` samples), runs the LM step with `sampler` and
    /// `opts`, decodes the frame the delays make ready into `out` (`frame_size` samples; left as
    /// it is when none is ready) and returns that frame (`None` during the first `max_delay`
    /// calls), all in one submission and one wait on it (two when a replay is due). The
    /// sampler's random streams and text history move as the host's generator would move them.
    ///
    /// A sampling error (non-finite logits) comes back after the call is committed, as the
    /// generator reports it; that frame's tokens are 0 and the decoder has decoded them (the
    /// caller resets the conversation). An argument error is returned before anything moves.
    pub fn frame(
        &mut self,
        pcm: &[f32],
        sampler: &mut Sampler,
        opts: FrameStep,
        out: &mut [f32],
    ) -> Result<Option<LmFrame>, LmError> {
        self.batch.tick(
            &[0],
            pcm,
            &[opts],
            std::slice::from_mut(sampler),
            out,
            &mut self.result,
        )?;
        std::mem::replace(&mut self.result[0], Ok(None))
    }
}
