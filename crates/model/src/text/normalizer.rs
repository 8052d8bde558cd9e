//! SentencePiece's text normalizer: the precompiled character map (e.g. `nmt_nfkc`), user-defined
//! symbols kept verbatim, whitespace clean-up, the dummy prefix and the `▁` escape.
//!
//! The precompiled character map is a double-array trie (darts-clone layout) over UTF-8 byte strings
//! plus a blob of NUL-terminated replacement strings; the longest matching prefix of the input is
//! replaced. This covers every rule of the built-in normalizers (`nmt_nfkc`, `nfkc`, `nmt_nfkc_cf`,
//! `nfkc_cf`, `identity`) and of custom rule files, because SentencePiece compiles them all into this
//! map at training time. Not implemented: `TrainerSpec.treat_whitespace_as_suffix` (the space is
//! always treated as a prefix) and the optional denormalizer spec.

use super::TextError;

/// The word-boundary symbol SentencePiece uses in place of a space, U+2581.
pub const SPACE_SYMBOL: &str = "\u{2581}";

/// The replacement character used for invalid UTF-8.
const REPLACEMENT: &str = "\u{FFFD}";

/// The compiled character map: a darts-clone double array plus the replacement strings.
#[derive(Debug, Clone, Default)]
pub(crate) struct CharsMap {
    units: Vec<u32>,
    normalized: Vec<u8>,
}

impl CharsMap {
    /// Parses `precompiled_charsmap`: `u32` LE trie size in bytes, the trie, then the strings.
    pub(crate) fn parse(blob: &[u8]) -> Result<Option<CharsMap>, TextError> {
        if blob.is_empty() {
            return Ok(None);
        }
        let bad = |what: &'static str| TextError::BadCharsMap(what);
        let header: [u8; 4] = blob
            .get(..4)
            .and_then(|h| h.try_into().ok())
            .ok_or(bad("shorter than its 4-byte header"))?;
        let trie_size = u32::from_le_bytes(header) as usize;
        let rest = &blob[4..];
        if trie_size > rest.len() || !trie_size.is_multiple_of(4) || trie_size == 0 {
            return Err(bad("trie size does not fit the blob"));
        }
        let units = rest[..trie_size]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok(Some(CharsMap {
            units,
            normalized: rest[trie_size..].to_vec(),
        }))
    }

    /// The longest key that is a prefix of `key`: `(length in bytes, replacement string)`.
    fn longest_prefix(&self, key: &[u8]) -> Option<(usize, &[u8])> {
        // Unit layout (darts-clone): bit 8 = has_leaf, low byte = label (bit 31 marks a value unit),
        // offset = (u >> 10) << ((u & 512) >> 6), value = u & 0x7fff_ffff.
        fn offset(u: u32) -> usize {
            ((u >> 10) << ((u & (1 << 9)) >> 6)) as usize
        }
        let mut pos = offset(*self.units.first()?);
        let mut best = None;
        for (i, &c) in key.iter().enumerate() {
            pos ^= c as usize;
            let Some(&unit) = self.units.get(pos) else {
                break;
            };
            if unit & ((1 << 31) | 0xff) != u32::from(c) {
                break;
            }
            pos ^= offset(unit);
            if (unit >> 8) & 1 == 1 {
                let Some(&leaf) = self.units.get(pos) else {
                    break;
                };
                best = Some((i + 1, (leaf & 0x7fff_ffff) as usize));
            }
        }
        let (len, value) = best?;
        let tail = self.normalized.get(value..)?;
        let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
        Some((len, &tail[..end]))
    }
}

/// The normalizer of one model (its `NormalizerSpec` plus the user-defined symbols).
#[derive(Debug, Clone)]
pub(crate) struct Normalizer {
    pub(crate) charsmap: Option<CharsMap>,
    pub(crate) add_dummy_prefix: bool,
    pub(crate) remove_extra_whitespaces: bool,
    pub(crate) escape_whitespaces: bool,
    /// User-defined symbols, copied verbatim by the normalizer (longest match first).
    pub(crate) user_defined: Vec<String>,
}

impl Normalizer {
    /// Length of the longest user-defined symbol that prefixes `s`, if any.
    pub(crate) fn user_defined_prefix(&self, s: &[u8]) -> Option<usize> {
        self.user_defined
            .iter()
            .filter(|u| !u.is_empty() && s.starts_with(u.as_bytes()))
            .map(|u| u.len())
            .max()
    }

    /// Normalizes the first unit of `input`: `(replacement, bytes consumed)`.
    fn normalize_prefix<'a>(&'a self, input: &'a [u8]) -> (&'a [u8], usize) {
        if let Some(n) = self.user_defined_prefix(input) {
            return (&input[..n], n);
        }
        if let Some(map) = &self.charsmap {
            if let Some((len, repl)) = map.longest_prefix(input) {
                return (repl, len);
            }
        }
        match utf8_char_len(input) {
            Some(n) => (&input[..n], n),
            None => (REPLACEMENT.as_bytes(), 1),
        }
    }

    /// Normalizes `text` the way `SentencePieceProcessor::Normalize` does.
    pub(crate) fn normalize(&self, text: &str) -> String {
        let space: &[u8] = if self.escape_whitespaces {
            SPACE_SYMBOL.as_bytes()
        } else {
            b" "
        };
        let mut input = text.as_bytes();
        let mut out: Vec<u8> = Vec::with_capacity(text.len() * 3 / 2 + 4);
        if self.remove_extra_whitespaces {
            while !input.is_empty() {
                let (norm, consumed) = self.normalize_prefix(input);
                if norm != b" " {
                    break;
                }
                input = &input[consumed..];
            }
        }
        if input.is_empty() {
            return String::new();
        }
        if self.add_dummy_prefix {
            out.extend_from_slice(space);
        }
        let mut is_prev_space = self.remove_extra_whitespaces;
        while !input.is_empty() {
            let (mut norm, consumed) = self.normalize_prefix(input);
            while is_prev_space && norm.first() == Some(&b' ') {
                norm = &norm[1..];
            }
            if let Some(&last) = norm.last() {
                for &b in norm {
                    if self.escape_whitespaces && b == b' ' {
                        out.extend_from_slice(SPACE_SYMBOL.as_bytes());
                    } else {
                        out.push(b);
                    }
                }
                is_prev_space = last == b' ';
            }
            input = &input[consumed..];
            if !self.remove_extra_whitespaces {
                is_prev_space = false;
            }
        }
        if self.remove_extra_whitespaces {
            while out.ends_with(space) {
                out.truncate(out.len() - space.len());
            }
        }
        // Replacement strings from a malformed character map may not be UTF-8.
        match String::from_utf8(out) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }
}

/// Length of the valid UTF-8 character at the start of `s`, `None` if it is not valid.
pub(crate) fn utf8_char_len(s: &[u8]) -> Option<usize> {
    let n = match *s.first()? {
        0x00..=0x7f => 1,
        0xc2..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf4 => 4,
        _ => return None,
    };
    std::str::from_utf8(s.get(..n)?).ok().map(|_| n)
}
