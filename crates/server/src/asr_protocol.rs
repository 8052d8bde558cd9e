//! The messages of `/api/asr-streaming` (Kyutai's `moshi-server` speech-to-text route): MessagePack maps
//! tagged by a `type` key, written here by hand (the format is small and fixed; no dependency).
//!
//! Server → client, each field in this order, as `moshi-server` writes them (serde's internally tagged
//! enums through `rmp_serde` with struct maps): `{type: "Ready"}`, `{type: "Word", text, start_time}`,
//! `{type: "EndWord", stop_time}`, `{type: "Step", step_idx, prs, buffered_pcm}`, `{type: "Marker", id}`,
//! `{type: "Error", message}`. Times are float64, `prs` float32, integers in their shortest encoding.
//!
//! Client → server: `{type: "Audio", pcm: [f32...]}` (24 kHz mono), `{type: "Marker", id}`,
//! `{type: "OggOpus", data: bin}` and `{type: "Init"}` (ignored: the stream starts at the upgrade), in any
//! key order; numbers of any MessagePack kind are accepted where a number is expected.

/// A decoded client message. Audio samples go to the caller's buffer ([`parse_client`]).
#[derive(Debug, Clone, PartialEq)]
pub enum AsrClientMessage<'a> {
    /// `Audio`: its samples were appended to the caller's buffer.
    Audio,
    /// `Marker {id}`: echo `id` once the audio sent before it is transcribed.
    Marker(i64),
    /// `OggOpus {data}`: a chunk of an Ogg/Opus stream.
    OggOpus(&'a [u8]),
    /// `Init` (Kyutai's batched server uses it internally; nothing to do).
    Init,
    /// A well-formed map of another `type`.
    Other(String),
}

/// A message that is not what the protocol allows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad MessagePack message: {0}")]
pub struct AsrProtocolError(pub String);

fn bad(what: impl Into<String>) -> AsrProtocolError {
    AsrProtocolError(what.into())
}

/// A cursor over MessagePack bytes.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Result<u8, AsrProtocolError> {
        let v = *self.b.get(self.at).ok_or_else(|| bad("truncated"))?;
        self.at += 1;
        Ok(v)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], AsrProtocolError> {
        let end = self
            .at
            .checked_add(n)
            .ok_or_else(|| bad("length overflow"))?;
        let s = self.b.get(self.at..end).ok_or_else(|| bad("truncated"))?;
        self.at = end;
        Ok(s)
    }

    fn be(&mut self, n: usize) -> Result<u64, AsrProtocolError> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |a, &x| (a << 8) | u64::from(x)))
    }

    fn map_len(&mut self) -> Result<usize, AsrProtocolError> {
        match self.byte()? {
            m @ 0x80..=0x8f => Ok((m & 0x0f) as usize),
            0xde => Ok(self.be(2)? as usize),
            0xdf => Ok(self.be(4)? as usize),
            m => Err(bad(format!("expected a map, found marker 0x{m:02x}"))),
        }
    }

    fn array_len(&mut self) -> Result<usize, AsrProtocolError> {
        match self.byte()? {
            m @ 0x90..=0x9f => Ok((m & 0x0f) as usize),
            0xdc => Ok(self.be(2)? as usize),
            0xdd => Ok(self.be(4)? as usize),
            m => Err(bad(format!("expected an array, found marker 0x{m:02x}"))),
        }
    }

    fn str(&mut self) -> Result<&'a str, AsrProtocolError> {
        let n = match self.byte()? {
            m @ 0xa0..=0xbf => (m & 0x1f) as usize,
            0xd9 => self.be(1)? as usize,
            0xda => self.be(2)? as usize,
            0xdb => self.be(4)? as usize,
            m => return Err(bad(format!("expected a string, found marker 0x{m:02x}"))),
        };
        std::str::from_utf8(self.take(n)?).map_err(|_| bad("string is not UTF-8"))
    }

    /// Any number, as f64 (the client's samples may be float32, float64 or integers).
    fn number(&mut self) -> Result<f64, AsrProtocolError> {
        Ok(match self.byte()? {
            m @ 0x00..=0x7f => f64::from(m),
            m @ 0xe0..=0xff => f64::from(m as i8),
            0xca => f64::from(f32::from_bits(self.be(4)? as u32)),
            0xcb => f64::from_bits(self.be(8)?),
            0xcc => self.be(1)? as f64,
            0xcd => self.be(2)? as f64,
            0xce => self.be(4)? as f64,
            0xcf => self.be(8)? as f64,
            0xd0 => f64::from(self.be(1)? as u8 as i8),
            0xd1 => f64::from(self.be(2)? as u16 as i16),
            0xd2 => f64::from(self.be(4)? as u32 as i32),
            0xd3 => self.be(8)? as i64 as f64,
            m => return Err(bad(format!("expected a number, found marker 0x{m:02x}"))),
        })
    }

    fn int(&mut self) -> Result<i64, AsrProtocolError> {
        Ok(match self.byte()? {
            m @ 0x00..=0x7f => i64::from(m),
            m @ 0xe0..=0xff => i64::from(m as i8),
            0xcc => self.be(1)? as i64,
            0xcd => self.be(2)? as i64,
            0xce => self.be(4)? as i64,
            0xcf => i64::try_from(self.be(8)?).map_err(|_| bad("integer out of range"))?,
            0xd0 => i64::from(self.be(1)? as u8 as i8),
            0xd1 => i64::from(self.be(2)? as u16 as i16),
            0xd2 => i64::from(self.be(4)? as u32 as i32),
            0xd3 => self.be(8)? as i64,
            m => return Err(bad(format!("expected an integer, found marker 0x{m:02x}"))),
        })
    }

    /// Bytes given as `bin` or as an array of small integers.
    fn bytes(&mut self, out: &mut Vec<u8>) -> Result<Option<&'a [u8]>, AsrProtocolError> {
        let n = match self.b.get(self.at) {
            Some(0xc4) => {
                self.at += 1;
                self.be(1)? as usize
            }
            Some(0xc5) => {
                self.at += 1;
                self.be(2)? as usize
            }
            Some(0xc6) => {
                self.at += 1;
                self.be(4)? as usize
            }
            _ => {
                let n = self.array_len()?;
                for _ in 0..n {
                    let v = self.int()?;
                    out.push(u8::try_from(v).map_err(|_| bad("byte out of range"))?);
                }
                return Ok(None);
            }
        };
        self.take(n).map(Some)
    }

    /// Skips one value of any kind (nesting bounded by the message's length).
    fn skip(&mut self, depth: usize) -> Result<(), AsrProtocolError> {
        if depth > 32 {
            return Err(bad("nested too deep"));
        }
        let m = self.byte()?;
        let (n, items) = match m {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (0, 0),
            0x80..=0x8f => (0, 2 * (m & 0x0f) as usize),
            0x90..=0x9f => (0, (m & 0x0f) as usize),
            0xa0..=0xbf => ((m & 0x1f) as usize, 0),
            0xc4 | 0xd9 => (self.be(1)? as usize, 0),
            0xc5 | 0xda => (self.be(2)? as usize, 0),
            0xc6 | 0xdb => (self.be(4)? as usize, 0),
            0xc7 => (self.be(1)? as usize + 1, 0),
            0xc8 => (self.be(2)? as usize + 1, 0),
            0xc9 => (self.be(4)? as usize + 1, 0),
            0xca | 0xce | 0xd2 => (4, 0),
            0xcb | 0xcf | 0xd3 => (8, 0),
            0xcc | 0xd0 => (1, 0),
            0xcd | 0xd1 => (2, 0),
            0xd4 => (2, 0),
            0xd5 => (3, 0),
            0xd6 => (5, 0),
            0xd7 => (9, 0),
            0xd8 => (17, 0),
            0xdc => (0, self.be(2)? as usize),
            0xdd => (0, self.be(4)? as usize),
            0xde => (0, 2 * self.be(2)? as usize),
            0xdf => (0, 2 * self.be(4)? as usize),
            0xc1 => return Err(bad("reserved marker 0xc1")),
        };
        self.take(n)?;
        for _ in 0..items {
            self.skip(depth + 1)?;
        }
        Ok(())
    }
}

/// Decodes one client message. `Audio` samples are appended to `pcm` (as f32), `OggOpus` data given as
/// an array of integers to `scratch` (the borrowed slice then points into it).
pub fn parse_client<'a>(
    msg: &'a [u8],
    pcm: &mut Vec<f32>,
    scratch: &'a mut Vec<u8>,
) -> Result<AsrClientMessage<'a>, AsrProtocolError> {
    let mut r = Reader { b: msg, at: 0 };
    let n = r.map_len()?;
    let start = pcm.len();
    let mut ty: Option<&str> = None;
    let mut id = None;
    let mut has_pcm = false;
    let mut data: Option<Option<&'a [u8]>> = None;
    scratch.clear();
    // `scratch` is only filled here; it is borrowed for the result after the loop.
    let mut bytes_out = Vec::new();
    for _ in 0..n {
        match r.str()? {
            "type" => ty = Some(r.str()?),
            "pcm" => {
                let len = r.array_len()?;
                // A sample is at least one byte: a length beyond the message is a lie, not a reason to reserve.
                if len > msg.len() {
                    return Err(bad("pcm array longer than the message"));
                }
                pcm.reserve(len);
                for _ in 0..len {
                    pcm.push(r.number()? as f32);
                }
                has_pcm = true;
            }
            "id" => id = Some(r.int()?),
            "data" => data = Some(r.bytes(&mut bytes_out)?),
            _ => r.skip(0)?,
        }
    }
    if r.at != msg.len() {
        return Err(bad("bytes after the map"));
    }
    let ty = ty.ok_or_else(|| bad("no type"))?;
    if ty != "Audio" {
        pcm.truncate(start);
    }
    Ok(match ty {
        "Audio" if has_pcm => AsrClientMessage::Audio,
        "Audio" => return Err(bad("Audio without pcm")),
        "Marker" => AsrClientMessage::Marker(id.ok_or_else(|| bad("Marker without id"))?),
        "OggOpus" => match data {
            Some(Some(d)) => AsrClientMessage::OggOpus(d),
            Some(None) => {
                *scratch = bytes_out;
                AsrClientMessage::OggOpus(scratch.as_slice())
            }
            None => return Err(bad("OggOpus without data")),
        },
        "Init" => AsrClientMessage::Init,
        other => AsrClientMessage::Other(other.to_string()),
    })
}

// ---- encoding (server → client)

fn put_map(out: &mut Vec<u8>, n: u8) {
    debug_assert!(n < 16);
    out.push(0x80 | n);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    let n = s.len();
    if n < 32 {
        out.push(0xa0 | n as u8);
    } else if n < 256 {
        out.extend_from_slice(&[0xd9, n as u8]);
    } else if n < 65536 {
        out.push(0xda);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0xdb);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
    out.extend_from_slice(s.as_bytes());
}

/// An unsigned integer in its shortest form (`rmp`'s `write_uint`).
fn put_uint(out: &mut Vec<u8>, v: u64) {
    if v < 128 {
        out.push(v as u8);
    } else if v < 256 {
        out.extend_from_slice(&[0xcc, v as u8]);
    } else if v < 65536 {
        out.push(0xcd);
        out.extend_from_slice(&(v as u16).to_be_bytes());
    } else if v < 1 << 32 {
        out.push(0xce);
        out.extend_from_slice(&(v as u32).to_be_bytes());
    } else {
        out.push(0xcf);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

/// A signed integer in its shortest form (`rmp`'s `write_sint`: non-negative values as unsigned).
fn put_sint(out: &mut Vec<u8>, v: i64) {
    if v >= 0 {
        put_uint(out, v as u64);
    } else if v >= -32 {
        out.push(v as i8 as u8);
    } else if v >= -128 {
        out.extend_from_slice(&[0xd0, v as i8 as u8]);
    } else if v >= -32768 {
        out.push(0xd1);
        out.extend_from_slice(&(v as i16).to_be_bytes());
    } else if v >= i64::from(i32::MIN) {
        out.push(0xd2);
        out.extend_from_slice(&(v as i32).to_be_bytes());
    } else {
        out.push(0xd3);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

fn put_f64(out: &mut Vec<u8>, v: f64) {
    out.push(0xcb);
    out.extend_from_slice(&v.to_bits().to_be_bytes());
}

fn put_f32(out: &mut Vec<u8>, v: f32) {
    out.push(0xca);
    out.extend_from_slice(&v.to_bits().to_be_bytes());
}

fn put_type(out: &mut Vec<u8>, fields: u8, ty: &str) {
    put_map(out, fields + 1);
    put_str(out, "type");
    put_str(out, ty);
}

/// `{type: "Ready"}`.
pub fn ready(out: &mut Vec<u8>) {
    put_type(out, 0, "Ready");
}

/// `{type: "Word", text, start_time}`.
pub fn word(out: &mut Vec<u8>, text: &str, start_time: f64) {
    put_type(out, 2, "Word");
    put_str(out, "text");
    put_str(out, text);
    put_str(out, "start_time");
    put_f64(out, start_time);
}

/// `{type: "EndWord", stop_time}`.
pub fn end_word(out: &mut Vec<u8>, stop_time: f64) {
    put_type(out, 1, "EndWord");
    put_str(out, "stop_time");
    put_f64(out, stop_time);
}

/// `{type: "Step", step_idx, prs, buffered_pcm}`.
pub fn step(out: &mut Vec<u8>, step_idx: u64, prs: &[f32], buffered_pcm: u64) {
    put_type(out, 3, "Step");
    put_str(out, "step_idx");
    put_uint(out, step_idx);
    put_str(out, "prs");
    // At most MAX_EXTRA_HEADS (8) entries: a fixarray.
    out.push(0x90 | prs.len().min(15) as u8);
    for &p in prs.iter().take(15) {
        put_f32(out, p);
    }
    put_str(out, "buffered_pcm");
    put_uint(out, buffered_pcm);
}

/// `{type: "Marker", id}`.
pub fn marker(out: &mut Vec<u8>, id: i64) {
    put_type(out, 1, "Marker");
    put_str(out, "id");
    put_sint(out, id);
}

/// `{type: "Error", message}`.
pub fn error(out: &mut Vec<u8>, message: &str) {
    put_type(out, 1, "Error");
    put_str(out, "message");
    put_str(out, message);
}

/// A client message, as Kyutai's scripts write them (`msgpack.packb(..., use_single_float=True)`): for
/// tests and tools that play a client.
pub mod client {
    use super::{put_f32, put_sint, put_str, put_type};

    /// `{type: "Audio", pcm: [float32...]}`.
    pub fn audio(out: &mut Vec<u8>, pcm: &[f32]) {
        put_type(out, 1, "Audio");
        put_str(out, "pcm");
        let n = pcm.len();
        if n < 16 {
            out.push(0x90 | n as u8);
        } else if n < 65536 {
            out.push(0xdc);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            out.push(0xdd);
            out.extend_from_slice(&(n as u32).to_be_bytes());
        }
        for &x in pcm {
            put_f32(out, x);
        }
    }

    /// `{type: "Marker", id}`.
    pub fn marker(out: &mut Vec<u8>, id: i64) {
        put_type(out, 1, "Marker");
        put_str(out, "id");
        put_sint(out, id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_messages_round_trip() {
        let mut b = Vec::new();
        client::audio(&mut b, &[0.5, -0.25, 0.0]);
        let (mut pcm, mut s) = (Vec::new(), Vec::new());
        assert_eq!(
            parse_client(&b, &mut pcm, &mut s),
            Ok(AsrClientMessage::Audio)
        );
        assert_eq!(pcm, [0.5, -0.25, 0.0]);
        b.clear();
        client::marker(&mut b, -7);
        assert_eq!(
            parse_client(&b, &mut pcm, &mut s),
            Ok(AsrClientMessage::Marker(-7))
        );
        // Keys in another order, a float64 sample, an integer sample, an unknown key skipped.
        let msg = [
            0x83, 0xa3, b'p', b'c', b'm', 0x92, 0xcb, 0x3f, 0xe0, 0, 0, 0, 0, 0, 0, 0x01, 0xa1,
            b'x', 0x91, 0xc0, 0xa4, b't', b'y', b'p', b'e', 0xa5, b'A', b'u', b'd', b'i', b'o',
        ];
        pcm.clear();
        assert_eq!(
            parse_client(&msg, &mut pcm, &mut s),
            Ok(AsrClientMessage::Audio)
        );
        assert_eq!(pcm, [0.5, 1.0]);
        for broken in [&msg[..msg.len() - 1], &[0x91, 0x00][..], &[0x80][..]] {
            assert!(parse_client(broken, &mut pcm, &mut s).is_err());
        }
    }

    #[test]
    fn integers_take_their_shortest_form() {
        let enc = |v: i64| {
            let mut b = Vec::new();
            put_sint(&mut b, v);
            b
        };
        assert_eq!(enc(5), [5]);
        assert_eq!(enc(200), [0xcc, 200]);
        assert_eq!(enc(-1), [0xff]);
        assert_eq!(enc(-100), [0xd0, 0x9c]);
        assert_eq!(enc(70_000), [0xce, 0, 1, 0x11, 0x70]);
        for v in [
            0i64,
            127,
            128,
            255,
            256,
            -33,
            -129,
            -40_000,
            i64::MIN,
            i64::MAX,
        ] {
            let b = enc(v);
            assert_eq!(Reader { b: &b, at: 0 }.int(), Ok(v), "{v}");
        }
    }
}
