//! Text → ids: normalization, then segmentation by the model's algorithm, then merging of runs of
//! unknown characters and byte fallback (`<0xNN>` pieces for each UTF-8 byte of an unknown span).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::normalizer::{utf8_char_len, SPACE_SYMBOL};
use super::{ModelType, PieceType, SentencePiece};

/// Score penalty of an unknown character below the lowest piece score (SentencePiece's `kUnkPenalty`).
const UNK_PENALTY: f32 = 10.0;

/// Length in bytes of the character starting at `s[0]` as SentencePiece's `OneCharLen` sees it
/// (from the lead byte only), clamped to the input.
fn one_char_len(s: &[u8]) -> usize {
    let n = match s.first() {
        Some(&b) => match b >> 4 {
            0xc | 0xd => 2,
            0xe => 3,
            0xf => 4,
            _ => 1,
        },
        None => 0,
    };
    n.min(s.len())
}

impl SentencePiece {
    /// Encodes `text` into ids like the Python package's `encode(text)` (no BOS/EOS added).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let normalized = self.normalizer.normalize(text);
        let spans = match self.model_type {
            ModelType::Unigram => self.segment_unigram(&normalized),
            ModelType::Bpe => self.segment_bpe(&normalized),
            ModelType::Char => self.segment_char(&normalized),
            ModelType::Word => self.segment_word(&normalized),
        };
        self.finish(&normalized, &spans)
    }

    /// Merges consecutive unknown spans and applies byte fallback.
    fn finish(&self, normalized: &str, spans: &[(usize, usize, u32)]) -> Vec<u32> {
        let mut ids = Vec::with_capacity(spans.len());
        let mut i = 0;
        while i < spans.len() {
            let (start, mut end, id) = spans[i];
            i += 1;
            if id != self.unk_id {
                ids.push(id);
                continue;
            }
            while i < spans.len() && spans[i].2 == self.unk_id && spans[i].0 == end {
                end = spans[i].1;
                i += 1;
            }
            if self.byte_fallback {
                for &b in &normalized.as_bytes()[start..end] {
                    ids.push(self.byte_ids[b as usize].unwrap_or(self.unk_id));
                }
            } else {
                ids.push(self.unk_id);
            }
        }
        ids
    }

    /// Looks a piece up among those the segmenters may produce (normal, user-defined, unused).
    fn matchable(&self, s: &str) -> Option<(u32, PieceType)> {
        let id = *self.piece_to_id.get(s)?;
        let kind = self.pieces[id as usize].kind;
        match kind {
            PieceType::Normal | PieceType::UserDefined | PieceType::Unused => Some((id, kind)),
            _ => None,
        }
    }

    /// Any piece, including control and byte pieces, or the unknown id.
    fn piece_or_unk(&self, s: &str) -> u32 {
        self.piece_to_id.get(s).copied().unwrap_or(self.unk_id)
    }

    /// Unigram segmentation: the path of maximum total score (SentencePiece's optimized Viterbi,
    /// including its tie-breaking and its float/double arithmetic).
    #[allow(clippy::needless_range_loop)] // `end` is both a slice bound and a lattice index
    fn segment_unigram(&self, s: &str) -> Vec<(usize, usize, u32)> {
        #[derive(Clone, Copy)]
        struct Best {
            id: u32,
            score: f32,
            start: Option<usize>,
        }
        let bytes = s.as_bytes();
        let size = bytes.len();
        let unk_score = self.min_score - UNK_PENALTY;
        let mut best = vec![
            Best {
                id: self.unk_id,
                score: 0.0,
                start: None,
            };
            size + 1
        ];
        let mut start = 0;
        while start < size {
            let till_here = best[start].score;
            let mblen = one_char_len(&bytes[start..]);
            let mut has_single = false;
            let max_end = size.min(start + self.max_piece_len);
            for end in start + 1..=max_end {
                let Some(candidate) = s.get(start..end) else {
                    continue;
                };
                let Some((id, kind)) = self.matchable(candidate) else {
                    continue;
                };
                if kind == PieceType::Unused {
                    continue;
                }
                let length = end - start;
                let score: f64 = if kind == PieceType::UserDefined {
                    f64::from(length as f32 * self.max_score) - 0.1
                } else {
                    f64::from(self.pieces[id as usize].score)
                };
                let cand = score + f64::from(till_here);
                let target = &mut best[end];
                if target.start.is_none() || cand > f64::from(target.score) {
                    *target = Best {
                        id,
                        score: cand as f32,
                        start: Some(start),
                    };
                }
                if length == mblen {
                    has_single = true;
                }
            }
            if !has_single {
                let cand = f64::from(unk_score) + f64::from(till_here);
                let target = &mut best[start + mblen];
                if target.start.is_none() || cand > f64::from(target.score) {
                    *target = Best {
                        id: self.unk_id,
                        score: cand as f32,
                        start: Some(start),
                    };
                }
            }
            start += mblen;
        }
        let mut spans = Vec::new();
        let mut end = size;
        while end > 0 {
            let node = best[end];
            let Some(begin) = node.start else {
                break; // unreachable for valid UTF-8 input
            };
            spans.push((begin, end, node.id));
            end = begin;
        }
        spans.reverse();
        spans
    }

    /// Initial symbols for BPE and char models: user-defined symbols whole, otherwise one character.
    fn initial_symbols(&self, s: &str) -> Vec<(usize, usize, bool)> {
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(s.len());
        let mut pos = 0;
        while pos < bytes.len() {
            let (len, frozen) = match self.normalizer.user_defined_prefix(&bytes[pos..]) {
                Some(n) => (n, true),
                None => (utf8_char_len(&bytes[pos..]).unwrap_or(1), false),
            };
            out.push((pos, pos + len, frozen));
            pos += len;
        }
        out
    }

    /// BPE segmentation: repeatedly merge the adjacent pair whose concatenation is the vocabulary
    /// piece with the highest score (leftmost first on ties).
    fn segment_bpe(&self, s: &str) -> Vec<(usize, usize, u32)> {
        struct Sym {
            start: usize,
            end: usize,
            frozen: bool,
            prev: Option<usize>,
            next: Option<usize>,
        }
        struct Pair {
            score: f32,
            left: usize,
            right: usize,
            size: usize,
        }
        impl PartialEq for Pair {
            fn eq(&self, other: &Self) -> bool {
                self.cmp(other) == Ordering::Equal
            }
        }
        impl Eq for Pair {}
        impl PartialOrd for Pair {
            fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
                Some(self.cmp(other))
            }
        }
        impl Ord for Pair {
            fn cmp(&self, other: &Self) -> Ordering {
                // Highest score first; on ties the leftmost pair first.
                self.score
                    .total_cmp(&other.score)
                    .then(other.left.cmp(&self.left))
            }
        }
        let init = self.initial_symbols(s);
        let n = init.len();
        let mut syms: Vec<Sym> = init
            .iter()
            .enumerate()
            .map(|(i, &(start, end, frozen))| Sym {
                start,
                end,
                frozen,
                prev: i.checked_sub(1),
                next: (i + 1 < n).then_some(i + 1),
            })
            .collect();
        let mut agenda = BinaryHeap::new();
        let try_pair =
            |syms: &[Sym], agenda: &mut BinaryHeap<Pair>, l: Option<usize>, r: Option<usize>| {
                let (Some(l), Some(r)) = (l, r) else { return };
                if syms[l].frozen || syms[r].frozen {
                    return;
                }
                let piece = &s[syms[l].start..syms[r].end];
                if let Some((id, _)) = self.matchable(piece) {
                    agenda.push(Pair {
                        score: self.pieces[id as usize].score,
                        left: l,
                        right: r,
                        size: piece.len(),
                    });
                }
            };
        for i in 1..n {
            try_pair(&syms, &mut agenda, Some(i - 1), Some(i));
        }
        while let Some(top) = agenda.pop() {
            let (l, r) = (top.left, top.right);
            let l_len = syms[l].end - syms[l].start;
            let r_len = syms[r].end - syms[r].start;
            if l_len == 0 || r_len == 0 || l_len + r_len != top.size {
                continue;
            }
            syms[l].end = syms[r].end;
            syms[l].next = syms[r].next;
            if let Some(nx) = syms[r].next {
                syms[nx].prev = Some(l);
            }
            syms[r].start = syms[r].end;
            let prev = syms[l].prev;
            let next = syms[l].next;
            try_pair(&syms, &mut agenda, prev, Some(l));
            try_pair(&syms, &mut agenda, Some(l), next);
        }
        let mut spans = Vec::new();
        let mut cur = (n > 0).then_some(0);
        while let Some(i) = cur {
            let sym = &syms[i];
            spans.push((
                sym.start,
                sym.end,
                self.piece_or_unk(&s[sym.start..sym.end]),
            ));
            cur = sym.next;
        }
        spans
    }

    /// Char model: one piece per character (user-defined symbols whole).
    fn segment_char(&self, s: &str) -> Vec<(usize, usize, u32)> {
        self.initial_symbols(s)
            .into_iter()
            .map(|(a, b, _)| (a, b, self.piece_or_unk(&s[a..b])))
            .collect()
    }

    /// Word model: a new word starts at the beginning and at every `▁`.
    fn segment_word(&self, s: &str) -> Vec<(usize, usize, u32)> {
        let mut starts: Vec<usize> = s.match_indices(SPACE_SYMBOL).map(|(i, _)| i).collect();
        if starts.first() != Some(&0) {
            starts.insert(0, 0);
        }
        if s.is_empty() {
            return Vec::new();
        }
        let mut spans = Vec::with_capacity(starts.len());
        for (k, &a) in starts.iter().enumerate() {
            let b = starts.get(k + 1).copied().unwrap_or(s.len());
            spans.push((a, b, self.piece_or_unk(&s[a..b])));
        }
        spans
    }
}
