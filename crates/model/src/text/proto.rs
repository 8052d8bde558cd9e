//! A hand-written reader for the protobuf wire format, just enough for SentencePiece's `ModelProto`.
//!
//! The reader never panics: every length is checked against the bytes that remain before anything is
//! sliced or allocated, varints longer than 10 bytes are refused, and the deprecated group wire types
//! are refused.

use super::TextError;

/// The protobuf field numbers of `sentencepiece_model.proto` that this crate reads.
pub(crate) mod field {
    /// `ModelProto.pieces` (repeated `SentencePiece`).
    pub const MODEL_PIECES: u32 = 1;
    /// `ModelProto.trainer_spec`.
    pub const MODEL_TRAINER_SPEC: u32 = 2;
    /// `ModelProto.normalizer_spec`.
    pub const MODEL_NORMALIZER_SPEC: u32 = 3;

    /// `SentencePiece.piece`.
    pub const PIECE_PIECE: u32 = 1;
    /// `SentencePiece.score`.
    pub const PIECE_SCORE: u32 = 2;
    /// `SentencePiece.type`.
    pub const PIECE_TYPE: u32 = 3;

    /// `TrainerSpec.model_type`.
    pub const TRAINER_MODEL_TYPE: u32 = 3;
    /// `TrainerSpec.treat_whitespace_as_suffix`.
    pub const TRAINER_WS_AS_SUFFIX: u32 = 24;
    /// `TrainerSpec.byte_fallback`.
    pub const TRAINER_BYTE_FALLBACK: u32 = 35;
    /// `TrainerSpec.unk_surface`.
    pub const TRAINER_UNK_SURFACE: u32 = 44;

    /// `NormalizerSpec.name`.
    pub const NORM_NAME: u32 = 1;
    /// `NormalizerSpec.precompiled_charsmap`.
    pub const NORM_CHARSMAP: u32 = 2;
    /// `NormalizerSpec.add_dummy_prefix`.
    pub const NORM_ADD_DUMMY_PREFIX: u32 = 3;
    /// `NormalizerSpec.remove_extra_whitespaces`.
    pub const NORM_REMOVE_EXTRA_WS: u32 = 4;
    /// `NormalizerSpec.escape_whitespaces`.
    pub const NORM_ESCAPE_WS: u32 = 5;
}

/// The value of one field as found on the wire.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Value<'a> {
    /// Wire type 0.
    Varint(u64),
    /// Wire type 1.
    Fixed64(u64),
    /// Wire type 2.
    Bytes(&'a [u8]),
    /// Wire type 5.
    Fixed32(u32),
}

impl Value<'_> {
    /// A varint as a bool (`!= 0`), or `None` for another wire type.
    pub(crate) fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Varint(v) => Some(v != 0),
            _ => None,
        }
    }

    /// A varint as a protobuf `int32`/`enum` (truncated to the low 32 bits, as protobuf does).
    pub(crate) fn as_i32(&self) -> Option<i32> {
        match *self {
            Value::Varint(v) => Some(v as u32 as i32),
            _ => None,
        }
    }

    /// A fixed32 as an IEEE `float`.
    pub(crate) fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::Fixed32(v) => Some(f32::from_bits(v)),
            _ => None,
        }
    }

    /// A length-delimited payload.
    pub(crate) fn as_bytes(&self) -> Option<&[u8]> {
        match *self {
            Value::Bytes(b) => Some(b),
            _ => None,
        }
    }
}

/// Iterates over the `(field number, value)` pairs of one encoded message.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Absolute offset of `buf[0]` in the file, for error messages.
    base: usize,
}

impl<'a> Reader<'a> {
    /// A reader over `buf`, which starts at byte `base` of the file.
    pub(crate) fn new(buf: &'a [u8], base: usize) -> Self {
        Reader { buf, pos: 0, base }
    }

    /// Absolute file offset of the next byte to read.
    pub(crate) fn offset(&self) -> usize {
        self.base + self.pos
    }

    fn malformed(&self, what: &'static str) -> TextError {
        TextError::Malformed {
            offset: self.offset(),
            what,
        }
    }

    fn varint(&mut self) -> Result<u64, TextError> {
        let mut value: u64 = 0;
        for i in 0..10 {
            let Some(&byte) = self.buf.get(self.pos) else {
                return Err(self.malformed("truncated varint"));
            };
            self.pos += 1;
            if i == 9 && byte > 1 {
                return Err(self.malformed("varint overflows 64 bits"));
            }
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(self.malformed("varint longer than 10 bytes"))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], TextError> {
        let remaining = self.buf.len() - self.pos;
        if n > remaining {
            return Err(self.malformed("length exceeds the remaining bytes"));
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    /// The next field, `Ok(None)` at the end of the message.
    ///
    /// For a length-delimited field the returned offset is where its payload starts in the file.
    pub(crate) fn next_field(&mut self) -> Result<Option<(u32, Value<'a>, usize)>, TextError> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let number = key >> 3;
        if number == 0 || number > u64::from(u32::MAX >> 3) {
            return Err(self.malformed("invalid field number"));
        }
        let value = match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 => {
                let b = self.take(8)?;
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                Value::Fixed64(u64::from_le_bytes(a))
            }
            2 => {
                let len = self.varint()?;
                let len = usize::try_from(len).map_err(|_| self.malformed("length too large"))?;
                let start = self.offset();
                let bytes = self.take(len)?;
                return Ok(Some((number as u32, Value::Bytes(bytes), start)));
            }
            5 => {
                let b = self.take(4)?;
                let mut a = [0u8; 4];
                a.copy_from_slice(b);
                Value::Fixed32(u32::from_le_bytes(a))
            }
            _ => return Err(self.malformed("unsupported wire type")),
        };
        Ok(Some((number as u32, value, self.offset())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_wire_type() {
        // field 1 varint 300, field 2 fixed64, field 3 bytes "ab", field 4 fixed32 1.5f
        let mut buf = vec![0x08, 0xac, 0x02, 0x11];
        buf.extend_from_slice(&7u64.to_le_bytes());
        buf.extend_from_slice(&[0x1a, 2, b'a', b'b', 0x25]);
        buf.extend_from_slice(&1.5f32.to_bits().to_le_bytes());
        let mut r = Reader::new(&buf, 0);
        assert_eq!(r.next_field().unwrap().unwrap().1, Value::Varint(300));
        assert_eq!(r.next_field().unwrap().unwrap().1, Value::Fixed64(7));
        let (n, v, at) = r.next_field().unwrap().unwrap();
        assert_eq!((n, v.as_bytes(), at), (3, Some(&b"ab"[..]), 14));
        assert_eq!(r.next_field().unwrap().unwrap().1.as_f32(), Some(1.5));
        assert!(r.next_field().unwrap().is_none());
    }

    #[test]
    fn negative_int32_is_a_ten_byte_varint() {
        let buf = [
            0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ];
        let mut r = Reader::new(&buf, 0);
        assert_eq!(r.next_field().unwrap().unwrap().1.as_i32(), Some(-1));
    }

    #[test]
    fn refuses_bad_input() {
        for bad in [
            &[0x0a, 0x05, b'a'][..], // length past the end
            &[0x08, 0x80][..],       // truncated varint
            &[
                0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f,
            ][..], // overflow
            &[0x0b][..],             // group start
            &[0x00, 0x00][..],       // field 0
            &[0x0d, 1, 2][..],       // short fixed32
        ] {
            let mut r = Reader::new(bad, 0);
            assert!(r.next_field().is_err(), "{bad:?}");
        }
    }
}
