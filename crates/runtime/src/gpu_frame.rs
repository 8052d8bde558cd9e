//! The GPU's frame-level backend ([`crate::fused::FrameBackend`]): `gpu::GpuDuplexBatch`, the
//! encode, LM step (delay rings and sampling on the device) and decode of every listed slot in one
//! submission per tick, waited for alone; a session's is the batch of one slot.

use std::sync::Arc;

use model::lm::{FrameStep, KvDtype, LmError, LmFrame};
use model::sampling::Sampler;

use crate::fused::FrameBackend;
use crate::{RuntimeError, N_AUDIO};

/// `gpu::GpuDuplexBatch` as the runtime's frame backend.
struct GpuFrames {
    batch: gpu::GpuDuplexBatch,
}

impl FrameBackend for GpuFrames {
    fn tick(
        &mut self,
        slots: &[usize],
        pcm: &[f32],
        steps: &[FrameStep],
        samplers: &mut [Sampler],
        decoded: &mut [f32],
        results: &mut [Result<Option<LmFrame>, LmError>],
    ) -> Result<(), LmError> {
        self.batch
            .tick(slots, pcm, steps, samplers, decoded, results)
    }

    fn reset_lm(&mut self, slot: usize) {
        self.batch.reset_lm(slot);
    }

    fn reset_codec(&mut self, slot: usize) {
        self.batch.reset_codec(slot);
    }

    fn decode_only(
        &mut self,
        slot: usize,
        codes: &[u32; N_AUDIO],
        decoded: &mut [f32],
    ) -> Result<(), RuntimeError> {
        Ok(self.batch.decode_only(slot, codes, decoded)?)
    }
}

/// Whether `sampler` runs on the device of an LM of `spec` (else a session runs the split pass
/// and a fused batch refuses the conversation).
pub(crate) fn device_samples(spec: &model::lm::LmSpec, sampler: &Sampler) -> bool {
    gpu::sample::device_samples(sampler, spec.text_card, spec.card)
}

/// The one-submission frames of `slots` conversation slots over the engine's uploaded weights,
/// or `None` when `sampler` (a session's, when given) needs the host (top-k above the device's
/// limit, say): the session then runs the split pass.
pub(crate) fn open(
    lm: &Arc<gpu::GpuLmWeights>,
    mimi: &Arc<gpu::GpuMimiWeights>,
    kv_dtype: KvDtype,
    slots: usize,
    sampler: Option<&Sampler>,
) -> Result<Option<Box<dyn FrameBackend>>, RuntimeError> {
    if sampler.is_some_and(|s| !device_samples(lm.spec(), s)) {
        tracing::info!(
            "the session's sampler runs on the host: encode, LM and decode submitted apart"
        );
        return Ok(None);
    }
    let opts = gpu::GpuLmOptions {
        kv_dtype,
        ..Default::default()
    };
    let batch = gpu::GpuDuplexBatch::new(lm.clone(), mimi.clone(), opts, slots)?;
    Ok(Some(Box::new(GpuFrames { batch })))
}
