//! The two released speech-to-text models as facts (`docs/stt.md`, "The two released models"):
//! their names, repositories, tokenizers and full-size configurations, for the tools that download,
//! recognise or synthesise them.

use crate::checkpoint::{LmConfig, SttConfig};

/// Kyutai's released speech-to-text models.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum SttRelease {
    /// `kyutai/stt-1b-en_fr`: English and French, 0.5 s delay, 4 voice-activity heads.
    Stt1b,
    /// `kyutai/stt-2.6b-en`: English, 2.5 s delay, no extra heads.
    Stt2b6,
}

impl SttRelease {
    /// Both releases, smaller first.
    pub const ALL: [SttRelease; 2] = [SttRelease::Stt1b, SttRelease::Stt2b6];

    /// The short name the tools take (`stt-1b`, `stt-2.6b`), or `None` for any other name.
    pub fn parse(name: &str) -> Option<Self> {
        SttRelease::ALL.into_iter().find(|v| v.name() == name)
    }

    /// The short name (`stt-1b`, `stt-2.6b`).
    pub fn name(self) -> &'static str {
        match self {
            SttRelease::Stt1b => "stt-1b",
            SttRelease::Stt2b6 => "stt-2.6b",
        }
    }

    /// The PyTorch repository; the candle and MLX ones add `-candle` / `-mlx`.
    pub fn repo(self) -> &'static str {
        match self {
            SttRelease::Stt1b => "kyutai/stt-1b-en_fr",
            SttRelease::Stt2b6 => "kyutai/stt-2.6b-en",
        }
    }

    /// The SentencePiece file its `config.json` names (`tokenizer_name`).
    pub fn tokenizer(self) -> &'static str {
        match self {
            SttRelease::Stt1b => "tokenizer_en_fr_audio_8000.model",
            SttRelease::Stt2b6 => "tokenizer_en_audio_4000.model",
        }
    }

    /// The temporal transformer: Moshi's LM code with `dep_q = 0`, 32 audio codebooks in, all
    /// delays 0; dim 2048, gated SiLU FFN 5632 (`hidden_scale` 4.125), RoPE period 100000.
    pub fn lm_config(self) -> LmConfig {
        let (num_heads, num_layers, context, text_card, heads) = match self {
            SttRelease::Stt1b => (16, 16, 750, 8000, 4),
            SttRelease::Stt2b6 => (32, 48, 375, 4000, 0),
        };
        let n_q = 32;
        LmConfig {
            dim: 2048,
            num_heads,
            num_layers,
            max_period: 100_000.0,
            context: Some(context),
            text_card,
            text_card_out: text_card,
            n_q,
            dep_q: 0,
            delays: vec![0; n_q + 1],
            extra_heads_num_heads: heads,
            extra_heads_dim: 6,
            ..LmConfig::moshiko_v0_1()
        }
    }

    /// Its `stt_config`: audio delay 0.5 s / 2.5 s, silence prefix 0 / 1 s.
    pub fn stt_config(self) -> SttConfig {
        match self {
            SttRelease::Stt1b => SttConfig {
                audio_delay_seconds: 0.5,
                audio_silence_prefix_seconds: 0.0,
            },
            SttRelease::Stt2b6 => SttConfig {
                audio_delay_seconds: 2.5,
                audio_silence_prefix_seconds: 1.0,
            },
        }
    }

    /// The release whose full-size dimensions `lm` has, if any (extra heads and context included).
    pub fn matching(lm: &LmConfig) -> Option<Self> {
        SttRelease::ALL.into_iter().find(|r| {
            let c = r.lm_config();
            (
                c.dim,
                c.num_heads,
                c.num_layers,
                c.n_q,
                c.dep_q,
                c.text_card,
            ) == (
                lm.dim,
                lm.num_heads,
                lm.num_layers,
                lm.n_q,
                lm.dep_q,
                lm.text_card,
            ) && c.extra_heads_num_heads == lm.extra_heads_num_heads
        })
    }
}

impl std::fmt::Display for SttRelease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stt::SttPlan;

    /// The sizes `docs/stt.md` states (Kyutai's configs and the facts), recomputed from
    /// the configurations: FFN hidden, head width, plan.
    #[test]
    fn released_configs_have_the_documented_sizes() {
        let one = SttRelease::Stt1b.lm_config();
        assert_eq!(one.ffn_hidden(), 5632);
        assert_eq!(one.dim / one.num_heads, 128);
        let big = SttRelease::Stt2b6.lm_config();
        assert_eq!(big.ffn_hidden(), 5632);
        assert_eq!(big.dim / big.num_heads, 64);
        for r in SttRelease::ALL {
            let c = r.lm_config();
            c.validate().unwrap();
            assert_eq!(c.delays.len(), 33);
            assert_eq!(SttRelease::matching(&c), Some(r));
            assert_eq!(SttRelease::parse(r.name()), Some(r));
        }
        let p1 = SttPlan::from_config(&SttRelease::Stt1b.stt_config());
        assert_eq!(
            (p1.prefix_frames, p1.delay_tokens, p1.flush_frames),
            (0, 6, 19)
        );
        let p2 = SttPlan::from_config(&SttRelease::Stt2b6.stt_config());
        assert_eq!(
            (p2.prefix_frames, p2.delay_tokens, p2.flush_frames),
            (13, 31, 44)
        );
        assert_eq!(SttRelease::matching(&LmConfig::moshiko_v0_1()), None);
    }
}
