//! The GPU's frame-level backend ([`crate::fused::FrameBackend`]): `gpu::GpuDuplex`, one
//! conversation's encode, LM step (delay ring and sampling on the device) and decode in one
//! submission, waited for alone.

use std::sync::Arc;

use model::lm::{KvDtype, LmError, LmFrame};
use model::sampling::Sampler;

use crate::fused::FrameBackend;
use crate::{RuntimeError, N_AUDIO};

impl FrameBackend for gpu::GpuDuplex {
    fn frame(
        &mut self,
        input: &[f32],
        sampler: &mut Sampler,
        force_text: Option<u32>,
        reset_after_encode: bool,
        decoded: &mut [f32],
    ) -> Result<Option<LmFrame>, LmError> {
        let opts = gpu::DuplexStep {
            force_text,
            reset_codec_after_encode: reset_after_encode,
        };
        gpu::GpuDuplex::frame(self, input, sampler, opts, decoded)
    }

    fn reset_lm(&mut self) {
        gpu::GpuDuplex::reset_lm(self);
    }

    fn reset_codec(&mut self) {
        gpu::GpuDuplex::reset_codec(self);
    }

    fn decode_only(
        &mut self,
        codes: &[u32; N_AUDIO],
        decoded: &mut [f32],
    ) -> Result<(), RuntimeError> {
        Ok(gpu::GpuDuplex::decode_only(self, codes, decoded)?)
    }
}

/// The one-submission frame of a session over the engine's uploaded weights, or `None` when
/// `sampler`'s settings need the host (top-k above the device's limit, say): the session then runs
/// the split pass.
pub(crate) fn open(
    lm: &Arc<gpu::GpuLmWeights>,
    mimi: &Arc<gpu::GpuMimiWeights>,
    kv_dtype: KvDtype,
    sampler: &Sampler,
) -> Result<Option<Box<dyn FrameBackend>>, RuntimeError> {
    let spec = lm.spec();
    if !gpu::sample::device_samples(sampler, spec.text_card, spec.card) {
        tracing::info!(
            "the session's sampler runs on the host: encode, LM and decode submitted apart"
        );
        return Ok(None);
    }
    let opts = gpu::GpuLmOptions {
        kv_dtype,
        ..Default::default()
    };
    Ok(Some(Box::new(gpu::GpuDuplex::new(
        lm.clone(),
        mimi.clone(),
        opts,
    )?)))
}
