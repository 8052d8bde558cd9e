//! Streaming output resampler: 24 kHz model audio → the consumer's rate, continuous across frames.

use crate::{RuntimeError, SAMPLE_RATE};

/// Per-session output resampler (state kept across frames so chunked output is continuous).
pub(crate) struct OutputResampler {
    rate: u32,
}

impl OutputResampler {
    pub(crate) fn new(rate: u32) -> Result<OutputResampler, RuntimeError> {
        if rate != SAMPLE_RATE {
            return Err(RuntimeError::InvalidOption(format!(
                "output_rate {rate} is not supported yet (only {SAMPLE_RATE})"
            )));
        }
        Ok(OutputResampler { rate })
    }

    /// Largest number of output samples for `n` input samples.
    pub(crate) fn max_output(&self, n: usize) -> usize {
        (n as u64 * self.rate as u64).div_ceil(SAMPLE_RATE as u64) as usize + 64
    }

    /// Resample `input` (24 kHz) and append to `out` (which has `max_output` capacity).
    pub(crate) fn process(&mut self, input: &[f32], out: &mut Vec<f32>) {
        out.extend_from_slice(input);
    }

    /// Forget the history (new stream / interrupt).
    pub(crate) fn reset(&mut self) {}
}
