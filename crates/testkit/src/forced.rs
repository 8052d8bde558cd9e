//! Forced runs of the tiny LM (`fixtures/lm`): the token streams the bf16-KV tests feed the CPU and
//! the device alike, so both measure the same run.

use crate::{fixtures_dir, TensorFile};

/// A forced run: at step t the user codes `user[t]`, the text token `text[t]` and the audio tokens
/// `audio[t]` (one per generated codebook).
pub struct Forced {
    /// The user's 8 codebooks per step.
    pub user: Vec<[i64; 8]>,
    /// The forced text token per step.
    pub text: Vec<u32>,
    /// The forced audio tokens per step.
    pub audio: Vec<[u32; 8]>,
}

impl Forced {
    /// The oracle's own forced run (`fixtures/lm/trace_forced.safetensors`: `forced_text`,
    /// `forced_audio`, codebook-major) with the user codes of `CODES.safetensors`, and the trace
    /// itself (for its logits).
    pub fn oracle() -> (Forced, TensorFile) {
        let trace = TensorFile::open(fixtures_dir("lm").join("trace_forced.safetensors"));
        let (ft, _) = trace.i64("forced_text");
        let (fa, _) = trace.i64("forced_audio");
        let (codes, cs) =
            TensorFile::open(fixtures_dir("lm").join("CODES.safetensors")).i64("codes");
        let steps = ft.len();
        let forced = Forced::from_trace(&codes, cs[1], &ft, |k, t| fa[k * steps + t] as u32);
        (forced, trace)
    }

    /// A run of `text.len()` steps from an oracle trace's tensors: the user codes codebook-major
    /// (`user[k · user_stride + t]`), the text tokens, and `audio(k, t)` the audio token of
    /// codebook `k` at step `t`.
    pub fn from_trace(
        user: &[i64],
        user_stride: usize,
        text: &[i64],
        audio: impl Fn(usize, usize) -> u32,
    ) -> Forced {
        let steps = text.len();
        Forced {
            user: (0..steps)
                .map(|t| std::array::from_fn(|k| user[k * user_stride + t]))
                .collect(),
            text: text.iter().map(|&x| x as u32).collect(),
            audio: (0..steps)
                .map(|t| std::array::from_fn(|k| audio(k, t)))
                .collect(),
        }
    }

    /// A seeded stream of `steps` steps (xorshift64*, a fixed, dependency-free stream): text 30 %
    /// PAD (3) like the oracle's forced trace, other text tokens uniform below `text_card`, user
    /// and audio tokens uniform below `card`.
    pub fn seeded(steps: usize, card: u64, text_card: u64) -> Forced {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) % n
        };
        let mut f = Forced {
            user: Vec::with_capacity(steps),
            text: Vec::with_capacity(steps),
            audio: Vec::with_capacity(steps),
        };
        for _ in 0..steps {
            f.user.push(std::array::from_fn(|_| next(card) as i64));
            f.text.push(if next(10) < 3 {
                3
            } else {
                next(text_card) as u32
            });
            f.audio.push(std::array::from_fn(|_| next(card) as u32));
        }
        f
    }

    /// The number of steps.
    pub fn steps(&self) -> usize {
        self.text.len()
    }
}
