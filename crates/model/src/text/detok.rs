//! Streaming detokenizer for Moshi's inner-monologue text stream.

use std::sync::Arc;

use super::{Display, SentencePiece, EPAD_ID, PAD_ID};

/// Appends `bytes` to `out` as UTF-8, replacing each byte that does not start a valid character by
/// U+FFFD (one replacement per byte, as SentencePiece's decoder does).
pub(crate) fn push_bytes_lossy(mut bytes: &[u8], out: &mut String) {
    while !bytes.is_empty() {
        match std::str::from_utf8(bytes) {
            Ok(s) => {
                out.push_str(s);
                return;
            }
            Err(e) => {
                let (valid, rest) = bytes.split_at(e.valid_up_to());
                // `valid` is valid UTF-8 by construction; the fallback is never taken.
                out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                out.push('\u{FFFD}');
                bytes = &rest[1..];
            }
        }
    }
}

/// Turns text token ids into text, one token at a time, for the frame loop.
///
/// * `▁` becomes a space (Moshi prints each word with its leading space);
/// * byte pieces `<0xNN>` are held until they form a complete UTF-8 character, so a multi-byte
///   character is never emitted broken; a byte that cannot start or continue a valid character is
///   shown as U+FFFD, and bytes still pending when a text piece arrives (or at [`flush`]) too;
/// * control and unknown pieces, ids [`EPAD_ID`] (0) and [`PAD_ID`] (3), and ids outside the
///   vocabulary produce nothing and leave pending bytes pending.
///
/// After construction, [`push`] does not allocate: it writes into an internal buffer sized for the
/// longest piece and returns a `&str` into it.
///
/// [`push`]: Detokenizer::push
/// [`flush`]: Detokenizer::flush
#[derive(Debug, Clone)]
pub struct Detokenizer {
    sp: Arc<SentencePiece>,
    pub(super) out: String,
    pending: [u8; 4],
    n_pending: usize,
    strip_leading_space: bool,
    emitted_any: bool,
}

impl Detokenizer {
    /// A detokenizer over `sp`'s vocabulary.
    pub fn new(sp: Arc<SentencePiece>) -> Detokenizer {
        // Worst case of one push: pending bytes flushed as U+FFFD (3 × 3 bytes) plus the piece.
        let capacity = sp.max_display_len() + 16;
        Detokenizer {
            sp,
            out: String::with_capacity(capacity),
            pending: [0; 4],
            n_pending: 0,
            strip_leading_space: false,
            emitted_any: false,
        }
    }

    /// Drop the leading space of the first text emitted (as SentencePiece's `decode` does for a
    /// model with a dummy prefix). Off by default: Moshi's own clients print it.
    pub fn with_strip_leading_space(mut self, strip: bool) -> Detokenizer {
        self.strip_leading_space = strip;
        self
    }

    /// The vocabulary.
    pub fn sentence_piece(&self) -> &Arc<SentencePiece> {
        &self.sp
    }

    /// Forget pending bytes and start a new stream.
    pub fn reset(&mut self) {
        self.n_pending = 0;
        self.emitted_any = false;
        self.out.clear();
    }

    /// Feeds one token id and returns the text it completes (often empty).
    pub fn push(&mut self, id: u32) -> &str {
        self.out.clear();
        if id == EPAD_ID || id == PAD_ID {
            return &self.out;
        }
        match self.sp.display(id) {
            Display::Hidden => {}
            Display::Byte(b) => {
                if self.n_pending < self.pending.len() {
                    self.pending[self.n_pending] = b;
                    self.n_pending += 1;
                }
                self.drain_pending(false);
            }
            Display::Text { start, end } => {
                self.drain_pending(true);
                let mut text = self.sp.display_str(start, end);
                if self.strip_leading_space && !self.emitted_any && self.out.is_empty() {
                    text = text.strip_prefix(' ').unwrap_or(text);
                }
                self.out.push_str(text);
            }
        }
        if !self.out.is_empty() {
            self.emitted_any = true;
        }
        &self.out
    }

    /// Ends the stream: pending bytes of an incomplete character come out as U+FFFD each.
    pub fn flush(&mut self) -> &str {
        self.out.clear();
        self.drain_pending(true);
        if !self.out.is_empty() {
            self.emitted_any = true;
        }
        &self.out
    }

    /// Moves complete characters (and, when `all`, everything) from `pending` to `out`.
    fn drain_pending(&mut self, all: bool) {
        while self.n_pending > 0 {
            let bytes = &self.pending[..self.n_pending];
            let consumed = match std::str::from_utf8(bytes) {
                Ok(s) => {
                    self.out.push_str(s);
                    bytes.len()
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    if valid > 0 {
                        self.out
                            .push_str(std::str::from_utf8(&bytes[..valid]).unwrap_or_default());
                        valid
                    } else if e.error_len().is_none() && !all {
                        // An incomplete but so far valid character: wait for more bytes.
                        return;
                    } else {
                        self.out.push('\u{FFFD}');
                        1
                    }
                }
            };
            self.pending.copy_within(consumed..self.n_pending, 0);
            self.n_pending -= consumed;
        }
    }
}
