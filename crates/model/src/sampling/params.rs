//! Sampling settings as flat values: what the front ends take (the CLI's flags, the C ABI's
//! `MnSessionOptions`, the Python package's keyword arguments, the server's `/api/chat` query) and
//! turn into a [`SamplerConfig`]. Their defaults are [`SamplerConfig::default`]'s, read, not written
//! again.

use super::{RepetitionPenalty, SamplerConfig, TokenSampling};

/// Flat sampling settings; [`SamplingParams::config`] turns them into the model's [`SamplerConfig`].
/// Out-of-range values (NaN temperatures, a penalty <= 0) are refused when a session is created.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// Argmax for both streams (the temperatures are ignored).
    pub greedy: bool,
    /// Seed of the random streams.
    pub seed: u64,
    /// Text temperature (<= 0 = argmax).
    pub text_temperature: f32,
    /// Text top-k (0 = all).
    pub text_top_k: usize,
    /// Audio temperature (<= 0 = argmax).
    pub audio_temperature: f32,
    /// Audio top-k (0 = all).
    pub audio_top_k: usize,
    /// Multiply the text PAD probability by `exp(pad_mult)`; None = off.
    pub pad_mult: Option<f32>,
    /// Repetition penalty on recent text tokens; None = off.
    pub repetition_penalty: Option<f32>,
    /// Recent text tokens the penalty looks at.
    pub repetition_penalty_context: usize,
}

impl Default for SamplingParams {
    /// Kyutai's `LMGen` defaults, seeded like its server.
    fn default() -> Self {
        let c = SamplerConfig::default();
        SamplingParams {
            greedy: false,
            seed: c.text_seed,
            text_temperature: c.text.temperature,
            text_top_k: c.text.top_k,
            audio_temperature: c.audio.temperature,
            audio_top_k: c.audio.top_k,
            pad_mult: None,
            repetition_penalty: None,
            repetition_penalty_context: RepetitionPenalty::DEFAULT_CONTEXT,
        }
    }
}

impl SamplingParams {
    /// The sampler configuration these settings describe.
    pub fn config(&self) -> SamplerConfig {
        let mut c = SamplerConfig::seeded(self.seed);
        let temp = |t: f32| if self.greedy { 0.0 } else { t };
        c.text = TokenSampling {
            temperature: temp(self.text_temperature),
            top_k: self.text_top_k,
        };
        c.audio = TokenSampling {
            temperature: temp(self.audio_temperature),
            top_k: self.audio_top_k,
        };
        c.pad_mult = self.pad_mult;
        c.repetition_penalty = self.repetition_penalty.map(|penalty| RepetitionPenalty {
            penalty,
            context: self.repetition_penalty_context,
        });
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_greedy_match_the_model_presets() {
        assert_eq!(SamplingParams::default().config(), SamplerConfig::default());
        let greedy = SamplingParams {
            greedy: true,
            seed: super::super::DEFAULT_SEED,
            ..Default::default()
        };
        assert_eq!(greedy.config(), SamplerConfig::greedy());
        let p = SamplingParams {
            pad_mult: Some(0.5),
            repetition_penalty: Some(1.1),
            repetition_penalty_context: 32,
            ..Default::default()
        };
        let c = p.config();
        assert_eq!(c.pad_mult, Some(0.5));
        assert_eq!(
            c.repetition_penalty.map(|r| (r.penalty, r.context)),
            Some((1.1, 32))
        );
    }
}
