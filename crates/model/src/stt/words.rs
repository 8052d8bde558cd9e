//! Word assembly: Kyutai's streaming word rules (moshi-server's ASR step, `docs/stt.md`) over the text
//! tokens of one stream.
//!
//! A word's tokens travel inside its event, in a fixed-capacity inline list ([`WordTokens`], at most
//! [`MAX_WORD_TOKENS`] ids), not in a heap list or a range into a per-batch arena: events outlive the
//! step that made them (the runner sends them to another thread, the transcriber queues them), and a
//! lent range would make every such consumer copy the tokens into an arena of its own, while an inline
//! list makes [`SttEvent`] `Copy` and every consumer allocation-free as it is. The price is a fixed
//! event size (272 bytes) and a cap on a word's length, which the pending word needs anyway (a model
//! that never closes a word must not grow a buffer without bound).
//!
//! The cap is 64 tokens: a word here is a run of text tokens with no PAD or EPAD between them, and
//! at 12.5 steps per second a run of 64 is 5.12 s of text without one padding token, far beyond a
//! word of the released 4000- and 8000-piece vocabularies (a few pieces each). The oracle's tiny
//! random models do make long runs (their fixtures' longest closed word is 12 tokens, and the 2.6b
//! fixture ends in an unclosed run of 36), so the cap sits above what the parity fixtures reach. A
//! longer run is emitted as a word of its first 64 tokens on the step its 65th arrives, and the run
//! goes on as a new word with the same start time (nothing is dropped; a consumer sees two `Word`s
//! before the `EndWord`, as it does when a PAD separates two words). Kyutai's server has no cap: a
//! stream that reaches it is the one place these rules and Kyutai's differ.

/// Largest number of extra (voice-activity) heads a [`SttEvent::Step`] carries (Kyutai's stt-1b has 4).
pub const MAX_EXTRA_HEADS: usize = 8;

/// Most text tokens one [`SttEvent::Word`] carries; a longer run of tokens is split (module docs).
pub const MAX_WORD_TOKENS: usize = 64;

// The event's size, as the module docs give it.
const _: () = assert!(std::mem::size_of::<SttEvent>() == 272);

/// The text tokens of one word: up to [`MAX_WORD_TOKENS`] ids held inline (no heap), read as a
/// slice through `Deref`.
#[derive(Clone, Copy)]
pub struct WordTokens {
    len: u32,
    ids: [u32; MAX_WORD_TOKENS],
}

impl WordTokens {
    /// No tokens.
    pub const fn new() -> Self {
        WordTokens {
            len: 0,
            ids: [0; MAX_WORD_TOKENS],
        }
    }

    /// The tokens of `ids`, or `None` when there are more than [`MAX_WORD_TOKENS`].
    pub fn from_slice(ids: &[u32]) -> Option<Self> {
        let mut w = WordTokens::new();
        w.ids.get_mut(..ids.len())?.copy_from_slice(ids);
        w.len = ids.len() as u32;
        Some(w)
    }

    /// The tokens.
    pub fn as_slice(&self) -> &[u32] {
        &self.ids[..self.len as usize]
    }

    /// Whether the list holds [`MAX_WORD_TOKENS`] tokens.
    pub fn is_full(&self) -> bool {
        self.len as usize == MAX_WORD_TOKENS
    }

    /// Appends `id`; false (and nothing changes) when the list is full.
    pub fn push(&mut self, id: u32) -> bool {
        match self.ids.get_mut(self.len as usize) {
            Some(slot) => {
                *slot = id;
                self.len += 1;
                true
            }
            None => false,
        }
    }

    /// Empties the list.
    pub fn clear(&mut self) {
        self.len = 0;
    }
}

impl Default for WordTokens {
    fn default() -> Self {
        WordTokens::new()
    }
}

impl std::ops::Deref for WordTokens {
    type Target = [u32];
    fn deref(&self) -> &[u32] {
        self.as_slice()
    }
}

impl PartialEq for WordTokens {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl std::fmt::Debug for WordTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

/// What one stream's step produced, in Kyutai's order: the `Step` (when the model has extra heads)
/// first, then a `Word` and/or an `EndWord`.
#[derive(Debug, Clone, Copy, PartialEq)]
#[allow(clippy::large_enum_variant)] // the word inline, not boxed: no allocation per word (module docs)
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
        /// SentencePiece ids of the word (a run longer than [`MAX_WORD_TOKENS`] comes as several
        /// words: module docs).
        tokens: WordTokens,
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
/// ends the last emitted word ([`SttEvent::EndWord`]) if one is open. A token that finds the pending
/// word full ([`MAX_WORD_TOKENS`]) first emits it as a word, then starts the next one (module docs).
/// Allocates nothing.
#[derive(Debug, Clone)]
pub struct WordAssembler {
    skip: usize,
    frame_rate: f64,
    pad: u32,
    epad: u32,
    step_idx: usize,
    word: WordTokens,
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
            word: WordTokens::new(),
            unended: false,
            last_stop: 0.0,
        }
    }

    /// Back to the start of a stream.
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
            self.close_word(&mut emit);
        } else {
            if self.word.is_full() {
                self.close_word(&mut emit);
            }
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

    /// Emits the pending word, if any, starting at the last stop time.
    fn close_word(&mut self, emit: &mut impl FnMut(SttEvent)) {
        if !self.word.is_empty() {
            emit(SttEvent::Word {
                tokens: self.word,
                start_time: self.last_stop,
            });
            self.word.clear();
            self.unended = true;
        }
    }
}
