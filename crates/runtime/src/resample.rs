//! Streaming output resampler: 24 kHz model audio → the consumer's rate, continuous across frames.

use crate::audio::StreamResampler;
use crate::{RuntimeError, FRAME_SIZE, SAMPLE_RATE};

/// Per-session output resampler (state kept across frames so chunked output is continuous). A thin wrapper
/// over [`StreamResampler`]; 24 kHz passes samples through untouched.
pub(crate) struct OutputResampler {
    inner: StreamResampler,
}

impl OutputResampler {
    pub(crate) fn new(rate: u32) -> Result<OutputResampler, RuntimeError> {
        if !(8_000..=192_000).contains(&rate) {
            return Err(RuntimeError::InvalidOption(format!(
                "output_rate {rate} outside 8000..=192000"
            )));
        }
        // One model frame per internal chunk: the least CPU, and at most one frame of added latency.
        let inner = StreamResampler::with_chunk(SAMPLE_RATE, rate, FRAME_SIZE)
            .map_err(|e| RuntimeError::InvalidOption(format!("output_rate {rate}: {e}")))?;
        Ok(OutputResampler { inner })
    }

    /// Capacity to reserve for the output of one frame so that `process` never reallocates.
    pub(crate) fn frame_capacity(&self) -> usize {
        // Pending input is below one internal chunk, so one frame can complete at most two chunks.
        self.inner.max_output_len(FRAME_SIZE).max(1) * 2 + FRAME_SIZE * 8 + 64
    }

    /// Resample `input` (24 kHz) and append what is ready to `out`.
    pub(crate) fn process(
        &mut self,
        input: &[f32],
        out: &mut Vec<f32>,
    ) -> Result<(), RuntimeError> {
        self.inner
            .process(input, out)
            .map_err(RuntimeError::Resample)
    }

    /// Forget the history (new stream / interrupt).
    pub(crate) fn reset(&mut self) {
        self.inner.reset();
    }
}
