//! SentencePiece tokenizer: a native reader of `.model` files, text encoding (unigram, BPE, char and
//! word models, byte fallback) and a streaming, UTF-8-safe detokenizer for Moshi's text stream.
//!
//! No C++ library and no protobuf crate: the `ModelProto` is read by a small hand-written wire-format
//! reader (`proto`) that validates every length and never panics on malformed input.
//!
//! Parity target: the Python `sentencepiece` 0.2 package (`encode`, `decode`, `normalize`), checked by
//! the vectors in `fixtures/spm/` (see `tools/oracle/spm/`). Normalization implements the
//! precompiled character map (which is how SentencePiece stores `nmt_nfkc` and every other rule set),
//! user-defined symbols, `add_dummy_prefix`, `remove_extra_whitespaces` and `escape_whitespaces`.
//! Not implemented: `treat_whitespace_as_suffix`, the denormalizer spec, sampling / n-best encoding.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use model::text::{Detokenizer, SentencePiece};
//! let sp = Arc::new(SentencePiece::load("tokenizer_spm_32k_3.model")?);
//! let prompt_ids = sp.encode("Hello, Moshi!");
//! let mut detok = Detokenizer::new(sp.clone());
//! for id in [3, 0, 4521, 3] {
//!     print!("{}", detok.push(id)); // PAD (3) and EPAD (0) print nothing
//! }
//! # Ok::<(), model::text::TextError>(())
//! ```

mod detok;
mod encode;
mod normalizer;
mod proto;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub use detok::Detokenizer;
pub use normalizer::SPACE_SYMBOL;

use normalizer::{CharsMap, Normalizer};
use proto::{field, Reader, Value};

/// Moshi's "end of padding" text token (EPAD), never printed.
pub const EPAD_ID: u32 = 0;
/// Moshi's text padding token (PAD), emitted between words and never printed.
pub const PAD_ID: u32 = 3;

/// Errors from loading or using a SentencePiece model.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    /// The model file could not be read.
    #[error("cannot read SentencePiece model {path}: {source}")]
    Io {
        /// The file that failed.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The protobuf wire format is malformed.
    #[error("malformed SentencePiece model at byte {offset}: {what}")]
    Malformed {
        /// Byte offset in the file where the problem was found.
        offset: usize,
        /// What is wrong.
        what: &'static str,
    },
    /// A field has the wrong wire type or an invalid value.
    #[error("invalid SentencePiece model: {0}")]
    Invalid(String),
    /// The precompiled character map of the normalizer is malformed.
    #[error("malformed precompiled character map: {0}")]
    BadCharsMap(&'static str),
    /// An id is outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab_size} pieces")]
    IdOutOfRange {
        /// The offending id.
        id: u32,
        /// The number of pieces.
        vocab_size: usize,
    },
}

/// The type of one vocabulary piece (`ModelProto.SentencePiece.Type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PieceType {
    /// An ordinary piece (1).
    Normal,
    /// The unknown piece, e.g. `<unk>` (2).
    Unknown,
    /// A control symbol such as `<s>`, `</s>`, `<pad>` (3); never produced by encoding, invisible in
    /// decoding.
    Control,
    /// A user-defined symbol (4): always kept whole when encoding.
    UserDefined,
    /// An unused piece (5): never produced by encoding.
    Unused,
    /// A byte piece `<0xNN>` (6), used by byte fallback.
    Byte,
}

impl PieceType {
    fn from_proto(v: i32) -> Option<PieceType> {
        Some(match v {
            1 => PieceType::Normal,
            2 => PieceType::Unknown,
            3 => PieceType::Control,
            4 => PieceType::UserDefined,
            5 => PieceType::Unused,
            6 => PieceType::Byte,
            _ => return None,
        })
    }
}

/// The segmentation algorithm of a model (`TrainerSpec.model_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelType {
    /// Unigram language model: Viterbi segmentation maximising the total piece score (1).
    Unigram,
    /// Byte-pair encoding: greedy merges by piece score (2).
    Bpe,
    /// Whitespace-delimited words (3).
    Word,
    /// Single characters (4).
    Char,
}

/// The normalizer settings read from the model (`ModelProto.normalizer_spec`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NormalizerInfo {
    /// Rule set name, e.g. `nmt_nfkc` or `identity`.
    pub name: String,
    /// Whether a precompiled character map is present (and applied).
    pub has_charsmap: bool,
    /// Prepend a space (`▁`) to the text.
    pub add_dummy_prefix: bool,
    /// Strip leading/trailing whitespace and collapse runs of spaces.
    pub remove_extra_whitespaces: bool,
    /// Replace spaces by `▁` (U+2581).
    pub escape_whitespaces: bool,
}

#[derive(Debug, Clone)]
struct Piece {
    text: String,
    score: f32,
    kind: PieceType,
}

/// How the detokenizer shows one id.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Display {
    /// Text in `SentencePiece::display_text[start..end]` (`▁` already replaced by a space).
    Text { start: u32, end: u32 },
    /// A raw byte of a byte-fallback sequence.
    Byte(u8),
    /// Nothing (control and unknown pieces).
    Hidden,
}

/// A loaded SentencePiece model.
#[derive(Debug, Clone)]
pub struct SentencePiece {
    pieces: Vec<Piece>,
    piece_to_id: HashMap<String, u32>,
    model_type: ModelType,
    byte_fallback: bool,
    unk_id: u32,
    unk_surface: String,
    byte_ids: [Option<u32>; 256],
    normalizer: Normalizer,
    normalizer_name: String,
    /// Minimum and maximum score over normal pieces (SentencePiece's unigram `min_score_`/`max_score_`;
    /// the maximum starts at `FLT_MIN`, as there).
    min_score: f32,
    max_score: f32,
    /// Longest piece (bytes) that the segmenters may match.
    max_piece_len: usize,
    display: Vec<Display>,
    display_text: String,
    max_display_len: usize,
}

fn invalid(msg: impl Into<String>) -> TextError {
    TextError::Invalid(msg.into())
}

/// The bytes of a length-delimited field; `what` names the field in the error.
fn bytes_of<'v>(v: &'v Value<'_>, what: &str) -> Result<&'v [u8], TextError> {
    v.as_bytes()
        .ok_or_else(|| invalid(format!("{what}: wrong wire type")))
}

fn parse_byte_piece(s: &str) -> Option<u8> {
    let hex = s.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

impl SentencePiece {
    /// Reads a `.model` file.
    pub fn load(path: impl AsRef<Path>) -> Result<SentencePiece, TextError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| TextError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_bytes(&bytes)
    }

    /// Parses a serialized `ModelProto`.
    pub fn from_bytes(bytes: &[u8]) -> Result<SentencePiece, TextError> {
        let mut pieces = Vec::new();
        let mut model_type = ModelType::Unigram;
        let mut byte_fallback = false;
        let mut unk_surface = " \u{2047} ".to_string();
        let mut norm = Normalizer {
            charsmap: None,
            add_dummy_prefix: true,
            remove_extra_whitespaces: true,
            escape_whitespaces: true,
            user_defined: Vec::new(),
        };
        let mut normalizer_name = String::new();

        let mut top = Reader::new(bytes, 0);
        while let Some((num, value, at)) = top.next_field()? {
            match num {
                field::MODEL_PIECES => {
                    let body = bytes_of(&value, "pieces")?;
                    pieces.push(Self::parse_piece(body, at, pieces.len())?);
                }
                field::MODEL_TRAINER_SPEC => {
                    let body = bytes_of(&value, "trainer_spec")?;
                    let mut r = Reader::new(body, at);
                    while let Some((n, v, _)) = r.next_field()? {
                        match n {
                            field::TRAINER_MODEL_TYPE => {
                                model_type = match v.as_i32() {
                                    Some(1) => ModelType::Unigram,
                                    Some(2) => ModelType::Bpe,
                                    Some(3) => ModelType::Word,
                                    Some(4) => ModelType::Char,
                                    other => {
                                        return Err(invalid(format!("model_type {other:?}")));
                                    }
                                }
                            }
                            field::TRAINER_BYTE_FALLBACK => {
                                byte_fallback = v
                                    .as_bool()
                                    .ok_or_else(|| invalid("byte_fallback: wrong wire type"))?;
                            }
                            field::TRAINER_UNK_SURFACE => {
                                let b = bytes_of(&v, "unk_surface")?;
                                unk_surface = std::str::from_utf8(b)
                                    .map_err(|_| invalid("unk_surface is not UTF-8"))?
                                    .to_string();
                            }
                            field::TRAINER_WS_AS_SUFFIX if v.as_bool() == Some(true) => {
                                tracing::warn!(
                                    "treat_whitespace_as_suffix is not implemented; \
                                     encoding treats the space as a prefix"
                                );
                            }
                            _ => {}
                        }
                    }
                }
                field::MODEL_NORMALIZER_SPEC => {
                    let body = bytes_of(&value, "normalizer_spec")?;
                    let mut r = Reader::new(body, at);
                    while let Some((n, v, _)) = r.next_field()? {
                        let flag = |what: &str| {
                            v.as_bool()
                                .ok_or_else(|| invalid(format!("{what}: wrong wire type")))
                        };
                        match n {
                            field::NORM_NAME => {
                                let b = bytes_of(&v, "normalizer name")?;
                                normalizer_name = String::from_utf8_lossy(b).into_owned();
                            }
                            field::NORM_CHARSMAP => {
                                let b = bytes_of(&v, "charsmap")?;
                                norm.charsmap = CharsMap::parse(b)?;
                            }
                            field::NORM_ADD_DUMMY_PREFIX => {
                                norm.add_dummy_prefix = flag("add_dummy_prefix")?
                            }
                            field::NORM_REMOVE_EXTRA_WS => {
                                norm.remove_extra_whitespaces = flag("remove_extra_whitespaces")?
                            }
                            field::NORM_ESCAPE_WS => {
                                norm.escape_whitespaces = flag("escape_whitespaces")?
                            }
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        Self::build(
            pieces,
            model_type,
            byte_fallback,
            unk_surface,
            norm,
            normalizer_name,
        )
    }

    fn parse_piece(body: &[u8], at: usize, index: usize) -> Result<Piece, TextError> {
        let mut r = Reader::new(body, at);
        let mut text = None;
        let mut score = 0.0f32;
        let mut kind = PieceType::Normal;
        while let Some((n, v, _)) = r.next_field()? {
            match n {
                field::PIECE_PIECE => {
                    let b = v
                        .as_bytes()
                        .ok_or_else(|| invalid(format!("piece {index}: wrong wire type")))?;
                    let s = std::str::from_utf8(b)
                        .map_err(|_| invalid(format!("piece {index} is not UTF-8")))?;
                    text = Some(s.to_string());
                }
                field::PIECE_SCORE => {
                    score = v
                        .as_f32()
                        .ok_or_else(|| invalid(format!("piece {index}: score wire type")))?;
                }
                field::PIECE_TYPE => {
                    kind = v
                        .as_i32()
                        .and_then(PieceType::from_proto)
                        .ok_or_else(|| invalid(format!("piece {index}: invalid type")))?;
                }
                _ => {}
            }
        }
        let text = text.ok_or_else(|| invalid(format!("piece {index} has no text")))?;
        Ok(Piece { text, score, kind })
    }

    fn build(
        pieces: Vec<Piece>,
        model_type: ModelType,
        byte_fallback: bool,
        unk_surface: String,
        mut normalizer: Normalizer,
        normalizer_name: String,
    ) -> Result<SentencePiece, TextError> {
        if pieces.is_empty() {
            return Err(invalid("no pieces"));
        }
        if pieces.len() > u32::MAX as usize / 2 {
            return Err(invalid("too many pieces"));
        }
        let mut piece_to_id = HashMap::with_capacity(pieces.len());
        let mut unk_id = None;
        let mut byte_ids = [None; 256];
        let mut min_score = f32::MAX;
        let mut max_score = f32::MIN_POSITIVE;
        let mut max_piece_len = 0;
        for (i, p) in pieces.iter().enumerate() {
            let id = i as u32;
            if p.text.is_empty() {
                return Err(invalid(format!("piece {i} is empty")));
            }
            if piece_to_id.insert(p.text.clone(), id).is_some() {
                return Err(invalid(format!("piece {i} ({:?}) is duplicated", p.text)));
            }
            match p.kind {
                PieceType::Unknown => {
                    if unk_id.replace(id).is_some() {
                        return Err(invalid("more than one unknown piece"));
                    }
                }
                PieceType::Byte => {
                    let b = parse_byte_piece(&p.text).ok_or_else(|| {
                        invalid(format!("byte piece {i} ({:?}) is not <0xNN>", p.text))
                    })?;
                    byte_ids[b as usize] = Some(id);
                }
                PieceType::Normal => {
                    min_score = min_score.min(p.score);
                    max_score = max_score.max(p.score);
                }
                PieceType::UserDefined => normalizer.user_defined.push(p.text.clone()),
                PieceType::Control | PieceType::Unused => {}
            }
            if matches!(
                p.kind,
                PieceType::Normal | PieceType::UserDefined | PieceType::Unused
            ) {
                max_piece_len = max_piece_len.max(p.text.len());
            }
        }
        let unk_id = unk_id.ok_or_else(|| invalid("no unknown piece"))?;
        if byte_fallback {
            if let Some(b) = byte_ids.iter().position(|b| b.is_none()) {
                return Err(invalid(format!(
                    "byte_fallback is set but piece <0x{b:02X}> is missing"
                )));
            }
        }
        let mut display = Vec::with_capacity(pieces.len());
        let mut display_text = String::new();
        let mut max_display_len = 0;
        for p in &pieces {
            display.push(match p.kind {
                PieceType::Control | PieceType::Unknown => Display::Hidden,
                PieceType::Byte => match parse_byte_piece(&p.text) {
                    Some(b) => Display::Byte(b),
                    None => Display::Hidden,
                },
                PieceType::Normal | PieceType::UserDefined | PieceType::Unused => {
                    let start = display_text.len();
                    display_text.push_str(&p.text.replace(SPACE_SYMBOL, " "));
                    max_display_len = max_display_len.max(display_text.len() - start);
                    if display_text.len() > u32::MAX as usize {
                        return Err(invalid("vocabulary text too large"));
                    }
                    Display::Text {
                        start: start as u32,
                        end: display_text.len() as u32,
                    }
                }
            });
        }
        Ok(SentencePiece {
            pieces,
            piece_to_id,
            model_type,
            byte_fallback,
            unk_id,
            unk_surface,
            byte_ids,
            normalizer,
            normalizer_name,
            min_score,
            max_score,
            max_piece_len,
            display,
            display_text,
            max_display_len,
        })
    }

    /// Number of pieces in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// The piece string of `id` (with `▁` for spaces), `None` when out of range.
    pub fn id_to_piece(&self, id: u32) -> Option<&str> {
        self.pieces.get(id as usize).map(|p| p.text.as_str())
    }

    /// The id of a piece string, `None` if it is not in the vocabulary.
    pub fn piece_to_id(&self, piece: &str) -> Option<u32> {
        self.piece_to_id.get(piece).copied()
    }

    /// The type of piece `id`, `None` when out of range.
    pub fn piece_type(&self, id: u32) -> Option<PieceType> {
        self.pieces.get(id as usize).map(|p| p.kind)
    }

    /// The score (log probability for unigram, merge priority for BPE) of piece `id`.
    pub fn score(&self, id: u32) -> Option<f32> {
        self.pieces.get(id as usize).map(|p| p.score)
    }

    /// The segmentation algorithm.
    pub fn model_type(&self) -> ModelType {
        self.model_type
    }

    /// Whether characters outside the vocabulary are encoded as `<0xNN>` byte pieces.
    pub fn byte_fallback(&self) -> bool {
        self.byte_fallback
    }

    /// The id of the unknown piece.
    pub fn unk_id(&self) -> u32 {
        self.unk_id
    }

    /// The id of the byte piece `<0xNN>` for `byte`, if the model has it.
    pub fn byte_piece_id(&self, byte: u8) -> Option<u32> {
        self.byte_ids[byte as usize]
    }

    /// The normalizer settings.
    pub fn normalizer_info(&self) -> NormalizerInfo {
        NormalizerInfo {
            name: self.normalizer_name.clone(),
            has_charsmap: self.normalizer.charsmap.is_some(),
            add_dummy_prefix: self.normalizer.add_dummy_prefix,
            remove_extra_whitespaces: self.normalizer.remove_extra_whitespaces,
            escape_whitespaces: self.normalizer.escape_whitespaces,
        }
    }

    /// Normalizes `text` as SentencePiece does before segmentation (`▁` for spaces).
    pub fn normalize(&self, text: &str) -> String {
        self.normalizer.normalize(text)
    }

    /// Decodes ids the way the Python package's `decode` does: control pieces vanish, unknown pieces
    /// become the model's `unk_surface` (` ⁇ ` by default), runs of byte pieces are decoded as UTF-8
    /// with one U+FFFD per invalid byte, `▁` becomes a space, and the leading space of the first piece
    /// is dropped when the normalizer adds a dummy prefix or removes extra whitespace.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TextError> {
        let mut out = String::new();
        self.decode_into(ids, &mut out, &mut Vec::new())?;
        Ok(out)
    }

    /// [`SentencePiece::decode`] appended to `out` (the first piece's leading space dropped as if
    /// `out` were empty), with `bytes` as scratch for runs of byte pieces: allocates nothing when
    /// `out` and `bytes` have room (the speech-to-text transcriber decodes each word this way). An id
    /// outside the vocabulary is refused before anything is written.
    pub fn decode_into(
        &self,
        ids: &[u32],
        out: &mut String,
        bytes: &mut Vec<u8>,
    ) -> Result<(), TextError> {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.pieces.len()) {
            return Err(TextError::IdOutOfRange {
                id,
                vocab_size: self.pieces.len(),
            });
        }
        let strip_first =
            self.normalizer.add_dummy_prefix || self.normalizer.remove_extra_whitespaces;
        let start = out.len();
        bytes.clear();
        for &id in ids {
            let p = &self.pieces[id as usize];
            if let (PieceType::Byte, Some(b)) = (p.kind, parse_byte_piece(&p.text)) {
                bytes.push(b);
                continue;
            }
            detok::push_bytes_lossy(bytes, out);
            bytes.clear();
            match p.kind {
                PieceType::Control => {}
                PieceType::Unknown => out.push_str(&self.unk_surface),
                _ => {
                    let mut piece = p.text.as_str();
                    if strip_first && out.len() == start {
                        piece = piece.strip_prefix(SPACE_SYMBOL).unwrap_or(piece);
                    }
                    for (i, part) in piece.split(SPACE_SYMBOL).enumerate() {
                        if i > 0 {
                            out.push(' ');
                        }
                        out.push_str(part);
                    }
                }
            }
        }
        detok::push_bytes_lossy(bytes, out);
        bytes.clear();
        Ok(())
    }

    pub(crate) fn display(&self, id: u32) -> Display {
        self.display
            .get(id as usize)
            .copied()
            .unwrap_or(Display::Hidden)
    }

    pub(crate) fn display_str(&self, start: u32, end: u32) -> &str {
        self.display_text
            .get(start as usize..end as usize)
            .unwrap_or("")
    }

    pub(crate) fn max_display_len(&self) -> usize {
        self.max_display_len
    }
}
