//! Word assembly: Kyutai's streaming word rules (moshi-server's ASR step, `docs/stt.md`) over the text
//! tokens of one stream.

/// Largest number of extra (voice-activity) heads a [`SttEvent::Step`] carries (Kyutai's stt-1b has 4).
pub const MAX_EXTRA_HEADS: usize = 8;

/// What one stream's step produced, in Kyutai's order: the `Step` (when the model has extra heads)
/// first, then a `Word` and/or an `EndWord`.
#[derive(Debug, Clone, PartialEq)]
pub enum SttEvent {
    /// A model step ran (only sent by models with extra heads, as Kyutai's server does).
    Step {
        /// Steps run so far by this stream, this one included (1 for the first).
        step_idx: usize,
        /// Number of valid entries in `prs`.
        n_heads: usize,
        /// Each extra head's class-0 probability (Kyutai: the probability of no voice activity
        /// over that head's horizon; stt-1b's four horizons are 0.5, 1, 2 and 3 s).
        prs: [f32; MAX_EXTRA_HEADS],
    },
    /// A word: its text tokens (PAD / EPAD excluded) and its start time in seconds from the start
    /// of the audio (the stop time of the previous word boundary).
    Word {
        /// SentencePiece ids of the word.
        tokens: Vec<u32>,
        /// Start time, seconds.
        start_time: f64,
    },
    /// The last word ended (an end-of-padding token), at `stop_time` seconds.
    EndWord {
        /// Stop time, seconds.
        stop_time: f64,
    },
}

impl SttEvent {
    /// The extra heads' class-0 probabilities of a `Step` event (empty for other events).
    pub fn prs(&self) -> &[f32] {
        match self {
            SttEvent::Step { n_heads, prs, .. } => &prs[..*n_heads],
            _ => &[],
        }
    }
}

/// The word rules of one stream.
///
/// Per step, with `skip` = audio delay in tokens + silence-prefix frames: steps before `skip` are
/// ignored; a PAD or EPAD token closes the pending word (a [`SttEvent::Word`] that starts at the last
/// stop time); any other token extends it; an EPAD sets the stop time to `(step − skip) / 12.5` s and
/// ends the last emitted word ([`SttEvent::EndWord`]) if one is open.
#[derive(Debug, Clone)]
pub struct WordAssembler {
    skip: usize,
    frame_rate: f64,
    pad: u32,
    epad: u32,
    step_idx: usize,
    word: Vec<u32>,
    unended: bool,
    last_stop: f64,
}

impl WordAssembler {
    /// Rules skipping `skip` steps, with the PAD / EPAD ids of the model, at `frame_rate` steps per
    /// second (12.5).
    pub fn new(skip: usize, pad: u32, epad: u32, frame_rate: f64) -> Self {
        WordAssembler {
            skip,
            frame_rate,
            pad,
            epad,
            step_idx: 0,
            word: Vec::with_capacity(64),
            unended: false,
            last_stop: 0.0,
        }
    }

    /// Back to the start of a stream (keeps its buffer).
    pub fn reset(&mut self) {
        self.step_idx = 0;
        self.word.clear();
        self.unended = false;
        self.last_stop = 0.0;
    }

    /// Steps seen so far.
    pub fn step_idx(&self) -> usize {
        self.step_idx
    }

    /// Tokens of the word not yet closed.
    pub fn pending(&self) -> &[u32] {
        &self.word
    }

    /// The text token of the next step; `prs` (the extra heads' class-0 probabilities, empty for a
    /// model without extra heads) first gives a [`SttEvent::Step`]. Events go to `emit`, in order.
    pub fn push(&mut self, token: u32, prs: &[f32], mut emit: impl FnMut(SttEvent)) {
        self.step_idx += 1;
        if !prs.is_empty() {
            let mut p = [0f32; MAX_EXTRA_HEADS];
            let n = prs.len().min(MAX_EXTRA_HEADS);
            p[..n].copy_from_slice(&prs[..n]);
            emit(SttEvent::Step {
                step_idx: self.step_idx,
                n_heads: n,
                prs: p,
            });
        }
        if self.step_idx < self.skip {
            return;
        }
        if token == self.pad || token == self.epad {
            if !self.word.is_empty() {
                // A copy leaves with the event (the step's one allocation, once per word); the
                // buffer stays, so the next word's tokens are pushed without allocating.
                emit(SttEvent::Word {
                    tokens: self.word.clone(),
                    start_time: self.last_stop,
                });
                self.word.clear();
                self.unended = true;
            }
        } else {
            self.word.push(token);
        }
        if token == self.epad {
            let stop_time = (self.step_idx - self.skip) as f64 / self.frame_rate;
            if self.unended {
                self.unended = false;
                emit(SttEvent::EndWord { stop_time });
            }
            self.last_stop = stop_time;
        }
    }
}
