//! Ogg/Opus at 24 kHz mono, the audio framing of Kyutai's `/api/chat` protocol.
//!
//! * [`OggOpusDecoder`] takes whatever byte chunks a client sends (whole pages, several pages, half
//!   a page, garbage) and returns decoded PCM. It has its own incremental Ogg page reader so that a
//!   page split across two WebSocket messages is reassembled, and bad data is skipped by
//!   resynchronising on the next `OggS` capture pattern with a valid CRC.
//! * [`OggOpusEncoder`] buffers PCM and emits 960-sample (40 ms) Opus packets, one packet per Ogg
//!   page, with the OpusHead and OpusTags pages first (the same framing as Kyutai's servers).

use std::collections::VecDeque;

/// Sample rate of every PCM buffer on the wire (Hz).
pub const SAMPLE_RATE: u32 = 24_000;
/// Samples per outgoing Opus packet (40 ms at 24 kHz).
pub const OPUS_FRAME: usize = 960;
/// Ogg stream serial number of the outgoing stream (Kyutai uses 42 as well).
pub const OGG_SERIAL: u32 = 42;
/// Largest number of bytes buffered while waiting for the end of an Ogg page. A legal page is at most
/// 27 + 255 + 255·255 = 65 307 bytes.
const MAX_PENDING_BYTES: usize = 2 * 65_307;
/// Largest Opus packet accepted (a legal one is at most 1275 bytes per frame × 48 frames).
const MAX_PACKET_BYTES: usize = 61_440;
/// Longest Opus packet is 120 ms; at 24 kHz that is 2880 samples.
const MAX_DECODED: usize = 2_880;

/// Errors of the Ogg/Opus layer.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The Opus codec refused to create an encoder or decoder, or to encode a frame.
    #[error("opus: {0}")]
    Opus(&'static str),
    /// Writing an Ogg page failed (only possible on allocation failure in practice).
    #[error("ogg: {0}")]
    Ogg(#[from] std::io::Error),
}

/// Counters of what the decoder had to skip; all monotonically increasing.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DecodeStats {
    /// Complete pages accepted.
    pub pages: u64,
    /// Opus packets decoded successfully.
    pub packets: u64,
    /// Bytes skipped while searching for a capture pattern, or pages with a bad CRC/header.
    pub skipped_bytes: u64,
    /// Packets the Opus decoder refused (garbage), or oversized packets.
    pub bad_packets: u64,
}

// ---------------------------------------------------------------------------------------------
// CRC-32 of Ogg: polynomial 0x04c11db7, MSB first, initial value 0, no final xor.

const fn crc_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut r = (i as u32) << 24;
        let mut j = 0;
        while j < 8 {
            r = if r & 0x8000_0000 != 0 {
                (r << 1) ^ 0x04c1_1db7
            } else {
                r << 1
            };
            j += 1;
        }
        table[i] = r;
        i += 1;
    }
    table
}

static CRC_TABLE: [u32; 256] = crc_table();

fn crc_update(mut crc: u32, data: &[u8]) -> u32 {
    for &b in data {
        crc = (crc << 8) ^ CRC_TABLE[(((crc >> 24) as u8) ^ b) as usize];
    }
    crc
}

/// CRC of a whole page, computed with the checksum field (bytes 22..26) read as zero.
fn page_crc(page: &[u8]) -> u32 {
    let crc = crc_update(0, &page[..22]);
    let crc = crc_update(crc, &[0, 0, 0, 0]);
    crc_update(crc, &page[26..])
}

// ---------------------------------------------------------------------------------------------

/// Incremental Ogg demultiplexer: push bytes, pop complete packets.
///
/// Only the first logical stream seen is followed; pages of other serials are skipped. Packets
/// spanning several pages are reassembled.
#[derive(Debug, Default)]
pub struct OggReader {
    pending: Vec<u8>,
    partial: Vec<u8>,
    partial_valid: bool,
    serial: Option<u32>,
    packets: VecDeque<Vec<u8>>,
    /// Emptied packet buffers given back by [`OggReader::recycle`], reused for the next packets.
    spare: Vec<Vec<u8>>,
    stats: DecodeStats,
}

/// Packet buffers [`OggReader::recycle`] keeps (more than a page's worth of packets in flight).
const MAX_SPARE: usize = 8;

impl OggReader {
    /// A reader with empty buffers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counters of accepted and skipped data.
    pub fn stats(&self) -> DecodeStats {
        self.stats
    }

    /// Appends bytes and demultiplexes every complete page they finish.
    pub fn push(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
        self.parse_pages();
        if self.pending.len() > MAX_PENDING_BYTES {
            // Cannot be the start of a legal page: drop it and keep looking.
            let drop = self.pending.len() - MAX_PENDING_BYTES / 2;
            self.stats.skipped_bytes += drop as u64;
            self.pending.drain(..drop);
            self.parse_pages();
        }
    }

    /// Next complete packet, if any.
    pub fn pop_packet(&mut self) -> Option<Vec<u8>> {
        self.packets.pop_front()
    }

    /// Gives back a packet from [`OggReader::pop_packet`]: its memory holds a later packet, so a
    /// stream whose callers recycle every packet allocates nothing per page after its first ones.
    pub fn recycle(&mut self, mut packet: Vec<u8>) {
        if self.spare.len() < MAX_SPARE {
            packet.clear();
            self.spare.push(packet);
        }
    }

    fn parse_pages(&mut self) {
        // Taken out of `self` while packets are assembled, so pages are read in place (no copy).
        let pending = std::mem::take(&mut self.pending);
        let mut pos = 0usize;
        loop {
            let buf = &pending[pos..];
            // Find the capture pattern.
            let Some(start) = find_capture(buf) else {
                // Keep up to 3 trailing bytes that may begin "OggS".
                let keep = buf.len().min(3);
                let skip = buf.len() - keep;
                self.stats.skipped_bytes += skip as u64;
                pos += skip;
                break;
            };
            if start > 0 {
                self.stats.skipped_bytes += start as u64;
                pos += start;
                continue;
            }
            if buf.len() >= 6 && (buf[4] != 0 || buf[5] > 7) {
                // Bad version or flags: not a page.
                self.stats.skipped_bytes += 1;
                pos += 1;
                continue;
            }
            let complete = page_len(buf);
            let Some(page_len) = complete else {
                // Incomplete. If a complete, valid page starts later in the buffer, this capture
                // pattern was garbage (or a truncated page): skip to the valid one instead of
                // waiting for up to 64 KiB of data that would never form this page.
                match next_valid_page(buf) {
                    Some(off) => {
                        self.stats.skipped_bytes += off as u64;
                        pos += off;
                        continue;
                    }
                    None => break,
                }
            };
            let n_seg = buf[26] as usize;
            let lacing = &buf[27..27 + n_seg];
            let page = &buf[..page_len];
            let stored_crc = u32::from_le_bytes([page[22], page[23], page[24], page[25]]);
            if page[4] != 0 || page_crc(page) != stored_crc {
                // Not a real page (or corrupted): skip the capture pattern and resync.
                self.stats.skipped_bytes += 1;
                pos += 1;
                continue;
            }
            let header_type = page[5];
            let serial = u32::from_le_bytes([page[14], page[15], page[16], page[17]]);
            self.stats.pages += 1;
            pos += page_len;
            match self.serial {
                None => self.serial = Some(serial),
                Some(s) if s != serial => {
                    if header_type & 0x02 != 0 {
                        // A new stream started (e.g. the client restarted its recorder): follow it.
                        self.serial = Some(serial);
                        self.partial.clear();
                        self.partial_valid = false;
                    } else {
                        continue;
                    }
                }
                Some(_) => {}
            }
            let body = &page[27 + n_seg..];
            let continued = header_type & 0x01 != 0;
            if !continued && !self.partial.is_empty() {
                // The previous packet was never finished.
                self.partial.clear();
                self.stats.bad_packets += 1;
            }
            if continued && self.partial.is_empty() {
                // Continuation of a packet we never saw the start of: drop its tail.
                self.partial_valid = false;
            } else if !continued {
                self.partial_valid = true;
            }
            let mut off = 0usize;
            for &l in lacing {
                let l = l as usize;
                if self.partial_valid {
                    if self.partial.len() + l > MAX_PACKET_BYTES {
                        self.partial_valid = false;
                        self.partial.clear();
                        self.stats.bad_packets += 1;
                    } else {
                        self.partial.extend_from_slice(&body[off..off + l]);
                    }
                }
                off += l;
                if l < 255 {
                    if self.partial_valid {
                        let next = self.spare.pop().unwrap_or_default();
                        self.packets
                            .push_back(std::mem::replace(&mut self.partial, next));
                    }
                    self.partial.clear();
                    self.partial_valid = true;
                }
            }
        }
        self.pending = pending;
        self.pending.drain(..pos);
    }
}

/// Length of the page at the start of `buf` if all of it is there.
fn page_len(buf: &[u8]) -> Option<usize> {
    if buf.len() < 27 {
        return None;
    }
    let n_seg = buf[26] as usize;
    if buf.len() < 27 + n_seg {
        return None;
    }
    let body: usize = buf[27..27 + n_seg].iter().map(|&l| l as usize).sum();
    let len = 27 + n_seg + body;
    (buf.len() >= len).then_some(len)
}

/// Offset (> 0) of the first complete page with a valid CRC after the start of `buf`.
fn next_valid_page(buf: &[u8]) -> Option<usize> {
    let mut off = 1;
    while off < buf.len() {
        let rest = &buf[off..];
        let start = find_capture(rest)?;
        let cand = &rest[start..];
        if let Some(len) = page_len(cand) {
            let page = &cand[..len];
            let stored = u32::from_le_bytes([page[22], page[23], page[24], page[25]]);
            if page[4] == 0 && page_crc(page) == stored {
                return Some(off + start);
            }
        }
        off += start + 1;
    }
    None
}

fn find_capture(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"OggS")
}

// ---------------------------------------------------------------------------------------------

/// Stateful Ogg/Opus → PCM decoder for one client stream (24 kHz mono float).
pub struct OggOpusDecoder {
    reader: OggReader,
    decoder: opus_rs::OpusDecoder,
    scratch: Vec<f32>,
    bad_packets: u64,
    packets: u64,
}

impl OggOpusDecoder {
    /// A decoder at 24 kHz mono.
    pub fn new() -> Result<Self, CodecError> {
        Ok(Self {
            reader: OggReader::new(),
            decoder: opus_rs::OpusDecoder::new(SAMPLE_RATE as i32, 1).map_err(CodecError::Opus)?,
            scratch: vec![0.0; MAX_DECODED],
            bad_packets: 0,
            packets: 0,
        })
    }

    /// Feeds a chunk of Ogg bytes and appends every sample it completes to `out`.
    pub fn push(&mut self, bytes: &[u8], out: &mut Vec<f32>) {
        self.reader.push(bytes);
        while let Some(packet) = self.reader.pop_packet() {
            let headers = packet.starts_with(b"OpusHead") || packet.starts_with(b"OpusTags");
            if headers || packet.is_empty() {
                self.reader.recycle(packet);
                continue;
            }
            match self.decoder.decode(&packet, MAX_DECODED, &mut self.scratch) {
                Ok(n) => {
                    self.packets += 1;
                    out.extend_from_slice(&self.scratch[..n]);
                }
                Err(e) => {
                    self.bad_packets += 1;
                    tracing::debug!(
                        "dropping undecodable opus packet ({} bytes): {e}",
                        packet.len()
                    );
                }
            }
            self.reader.recycle(packet);
        }
    }

    /// Counters: pages, decoded packets, skipped bytes and bad packets.
    pub fn stats(&self) -> DecodeStats {
        let mut s = self.reader.stats();
        s.packets = self.packets;
        s.bad_packets += self.bad_packets;
        s
    }
}

// ---------------------------------------------------------------------------------------------

/// PCM → Ogg/Opus encoder for one outgoing stream.
///
/// Granule positions follow RFC 7845 (48 kHz units, pre-skip in 48 kHz units); Kyutai's servers
/// write 24 kHz sample counts instead. Decoders used by the clients ignore granules, so both work.
pub struct OggOpusEncoder {
    encoder: opus_rs::OpusEncoder,
    /// Sequence number of the next Ogg page.
    page_seq: u32,
    pending: Vec<f32>,
    packet: Vec<u8>,
    granule: u64,
    headers_written: bool,
    pre_skip: u16,
}

/// Bitrate of the outgoing stream: what libopus chooses when left on auto for one channel of
/// 40 ms frames at 24 kHz (60·rate/frame + rate), so the traffic matches Kyutai's servers.
const DEFAULT_BITRATE: i32 = (60 * SAMPLE_RATE as usize / OPUS_FRAME + SAMPLE_RATE as usize) as i32;
/// Encoder lookahead at 24 kHz in samples: 2.5 ms of analysis plus 4 ms of delay compensation.
const ENCODER_LOOKAHEAD: u32 = SAMPLE_RATE / 400 + SAMPLE_RATE / 250;

/// Ogg page header flag: first page of a logical stream.
const OGG_BOS: u8 = 0x02;

/// Appends one Ogg page holding exactly `packet` (one packet per page, as Kyutai's servers send)
/// to `out`; allocation-free when `out` has room. Packets must be shorter than 255 × 255 bytes.
fn write_page(out: &mut Vec<u8>, header_type: u8, granule: u64, seq: u32, packet: &[u8]) {
    debug_assert!(packet.len() < 255 * 255);
    let start = out.len();
    let full = packet.len() / 255;
    out.extend_from_slice(b"OggS");
    out.push(0); // version
    out.push(header_type);
    out.extend_from_slice(&granule.to_le_bytes());
    out.extend_from_slice(&OGG_SERIAL.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&[0; 4]); // checksum, filled below
    out.push((full + 1) as u8);
    out.extend(std::iter::repeat_n(255u8, full));
    out.push((packet.len() % 255) as u8);
    out.extend_from_slice(packet);
    let crc = page_crc(&out[start..]);
    out[start + 22..start + 26].copy_from_slice(&crc.to_le_bytes());
}

impl OggOpusEncoder {
    /// An encoder at 24 kHz mono in the VoIP application mode (as Kyutai's servers), at the
    /// bitrate libopus picks by default for that stream.
    pub fn new() -> Result<Self, CodecError> {
        let mut encoder =
            opus_rs::OpusEncoder::new(SAMPLE_RATE as i32, 1, opus_rs::Application::Voip)
                .map_err(CodecError::Opus)?;
        encoder.bitrate_bps = DEFAULT_BITRATE;
        // Lookahead at the encoder rate; OpusHead wants 48 kHz units.
        let lookahead = ENCODER_LOOKAHEAD;
        Ok(Self {
            encoder,
            page_seq: 0,
            pending: Vec::with_capacity(4 * OPUS_FRAME),
            packet: vec![0u8; 4000],
            granule: 0,
            headers_written: false,
            pre_skip: (lookahead * 2).min(u16::MAX as u32) as u16,
        })
    }

    fn page(&mut self, out: &mut Vec<u8>, header_type: u8, granule: u64, len: usize) {
        write_page(
            out,
            header_type,
            granule,
            self.page_seq,
            &self.packet[..len],
        );
        self.page_seq += 1;
    }

    /// Writes the OpusHead and OpusTags pages (once) into `out`.
    pub fn write_headers(&mut self, out: &mut Vec<u8>) -> Result<(), CodecError> {
        if self.headers_written {
            return Ok(());
        }
        let mut head = Vec::with_capacity(19);
        head.extend_from_slice(b"OpusHead");
        head.push(1); // version
        head.push(1); // channels
        head.extend_from_slice(&self.pre_skip.to_le_bytes());
        head.extend_from_slice(&SAMPLE_RATE.to_le_bytes()); // original input rate
        head.extend_from_slice(&0i16.to_le_bytes()); // output gain
        head.push(0); // mapping family
        let vendor = b"moshi-native";
        let mut tags = Vec::with_capacity(16 + vendor.len());
        tags.extend_from_slice(b"OpusTags");
        tags.extend_from_slice(&(vendor.len() as u32).to_le_bytes());
        tags.extend_from_slice(vendor);
        tags.extend_from_slice(&0u32.to_le_bytes());
        self.packet[..head.len()].copy_from_slice(&head);
        self.page(out, OGG_BOS, 0, head.len());
        self.packet[..tags.len()].copy_from_slice(&tags);
        self.page(out, 0, 0, tags.len());
        self.headers_written = true;
        Ok(())
    }

    /// Queues PCM and appends one Ogg page to `out` for every complete 960-sample frame. The
    /// headers are written before the first page. Returns the number of packets written.
    /// Allocation-free once `out` and the internal buffers have grown.
    pub fn push(&mut self, pcm: &[f32], out: &mut Vec<u8>) -> Result<usize, CodecError> {
        self.write_headers(out)?;
        self.pending.extend_from_slice(pcm);
        let mut n = 0;
        let mut consumed = 0;
        while self.pending.len() - consumed >= OPUS_FRAME {
            let frame = &self.pending[consumed..consumed + OPUS_FRAME];
            let len = self
                .encoder
                .encode(frame, OPUS_FRAME, &mut self.packet)
                .map_err(CodecError::Opus)?;
            consumed += OPUS_FRAME;
            self.granule += 2 * OPUS_FRAME as u64;
            self.page(out, 0, self.granule, len);
            n += 1;
        }
        self.pending.drain(..consumed);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(n: usize, f: f32) -> Vec<f32> {
        (0..n)
            .map(|i| 0.3 * (2.0 * std::f32::consts::PI * f * i as f32 / SAMPLE_RATE as f32).sin())
            .collect()
    }

    fn encode(pcm: &[f32]) -> Vec<u8> {
        let mut enc = OggOpusEncoder::new().unwrap();
        let mut out = Vec::new();
        enc.push(pcm, &mut out).unwrap();
        out
    }

    /// Splits an Ogg byte stream into its pages (by header lengths) for tests.
    fn pages(bytes: &[u8]) -> Vec<&[u8]> {
        let mut v = Vec::new();
        let mut p = 0;
        while p < bytes.len() {
            let n = bytes[p + 26] as usize;
            let body: usize = bytes[p + 27..p + 27 + n].iter().map(|&x| x as usize).sum();
            v.push(&bytes[p..p + 27 + n + body]);
            p += 27 + n + body;
        }
        v
    }

    #[test]
    fn pages_are_byte_identical_to_the_ogg_crate_writer() {
        let pcm = tone(1920 * 5, 330.0);
        let ours = encode(&pcm);
        let mut w = ogg::PacketWriter::new(Vec::new());
        let mut r = ogg::PacketReader::new(std::io::Cursor::new(ours.clone()));
        let mut granules = pages(&ours)
            .into_iter()
            .map(|p| u64::from_le_bytes(p[6..14].try_into().unwrap()));
        while let Some(p) = r.read_packet().unwrap() {
            let g = granules.next().unwrap();
            w.write_packet(p.data, OGG_SERIAL, ogg::PacketWriteEndInfo::EndPage, g)
                .unwrap();
        }
        assert_eq!(w.into_inner(), ours);
    }

    #[test]
    fn crc_matches_ogg_crate_pages() {
        let bytes = encode(&tone(4800, 440.0));
        for page in pages(&bytes) {
            let stored = u32::from_le_bytes([page[22], page[23], page[24], page[25]]);
            assert_eq!(page_crc(page), stored);
        }
    }

    #[test]
    fn encoder_framing_headers_then_one_packet_per_page() {
        let bytes = encode(&tone(1920 * 3, 440.0));
        let ps = pages(&bytes);
        assert_eq!(ps.len(), 2 + 6);
        assert_eq!(&ps[0][28..36], b"OpusHead");
        assert_eq!(&ps[1][28..36], b"OpusTags");
        // Granules: 48 kHz units.
        let g = |p: &[u8]| u64::from_le_bytes(p[6..14].try_into().unwrap());
        assert_eq!(g(ps[2]), 1920);
        assert_eq!(g(ps[7]), 6 * 1920);
        // The ogg crate's reader agrees on the packets.
        let mut r = ogg::PacketReader::new(std::io::Cursor::new(bytes.clone()));
        let mut n = 0;
        while let Some(p) = r.read_packet().unwrap() {
            assert_eq!(p.stream_serial(), OGG_SERIAL);
            n += 1;
        }
        assert_eq!(n, 8);
    }

    #[test]
    fn round_trip_any_chunking() {
        let pcm = tone(24_000, 440.0);
        let bytes = encode(&pcm);
        for chunk in [1usize, 7, 100, 4096, bytes.len()] {
            let mut dec = OggOpusDecoder::new().unwrap();
            let mut out = Vec::new();
            for c in bytes.chunks(chunk) {
                dec.push(c, &mut out);
            }
            assert_eq!(out.len(), 24_000, "chunk {chunk}");
            assert_eq!(dec.stats().bad_packets, 0);
            assert_eq!(dec.stats().skipped_bytes, 0);
            // Energy of the tone survives (SILK at ~20 dB is not waveform-exact; compare RMS).
            let rms = |x: &[f32]| (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32).sqrt();
            let r_in = rms(&pcm[4800..]);
            let r_out = rms(&out[4800..]);
            assert!((r_out / r_in - 1.0).abs() < 0.3, "{r_in} vs {r_out}");
        }
    }

    #[test]
    fn garbage_and_truncation_are_skipped() {
        let pcm = tone(9600, 300.0);
        let bytes = encode(&pcm);
        let ps = pages(&bytes);
        let mut dec = OggOpusDecoder::new().unwrap();
        let mut out = Vec::new();
        dec.push(
            b"hello, this is not ogg at all OggS but not a page either",
            &mut out,
        );
        dec.push(ps[0], &mut out);
        dec.push(ps[1], &mut out);
        // A truncated page followed by a full one: the truncated one is lost, the next is decoded.
        dec.push(&ps[2][..ps[2].len() / 2], &mut out);
        for p in &ps[3..] {
            dec.push(p, &mut out);
        }
        assert_eq!(out.len(), 9600 - 960);
        assert!(dec.stats().skipped_bytes > 0);
        // Random bytes in a well-formed page: the decoder rejects or decodes noise, never panics.
        let mut w = ogg::PacketWriter::new(Vec::new());
        for i in 0..50u32 {
            let junk: Vec<u8> = (0..(i * 37 % 300 + 1))
                .map(|j| (j.wrapping_mul(2654435761u32.wrapping_add(i)) >> 7) as u8)
                .collect();
            w.write_packet(junk, 7, ogg::PacketWriteEndInfo::EndPage, 0)
                .unwrap();
        }
        let mut dec = OggOpusDecoder::new().unwrap();
        let mut out = Vec::new();
        dec.push(&w.into_inner(), &mut out);
        assert!(out.len() <= 50 * MAX_DECODED);
    }

    #[test]
    fn huge_garbage_is_bounded() {
        let mut r = OggReader::new();
        let junk = vec![0xabu8; 1 << 20];
        r.push(&junk);
        assert!(r.pending.len() <= MAX_PENDING_BYTES);
        assert!(r.pop_packet().is_none());
    }

    fn make_page(header_type: u8, serial: u32, seq: u32, lacing: &[u8], body: &[u8]) -> Vec<u8> {
        let mut p = Vec::new();
        p.extend_from_slice(b"OggS");
        p.push(0);
        p.push(header_type);
        p.extend_from_slice(&0u64.to_le_bytes());
        p.extend_from_slice(&serial.to_le_bytes());
        p.extend_from_slice(&seq.to_le_bytes());
        p.extend_from_slice(&[0; 4]);
        p.push(lacing.len() as u8);
        p.extend_from_slice(lacing);
        p.extend_from_slice(body);
        let crc = page_crc(&p);
        p[22..26].copy_from_slice(&crc.to_le_bytes());
        p
    }

    #[test]
    fn packet_spanning_pages() {
        let big: Vec<u8> = (0..600u32).map(|i| i as u8).collect();
        let small = vec![9u8; 10];
        // Page 1: first 510 bytes of the big packet (unfinished). Page 2 (continued): 90 more bytes,
        // then a 10-byte packet.
        let p1 = make_page(0x02, 5, 0, &[255, 255], &big[..510]);
        let mut body2 = big[510..].to_vec();
        body2.extend_from_slice(&small);
        let p2 = make_page(0x01, 5, 1, &[90, 10], &body2);
        let mut bytes = p1.clone();
        bytes.extend_from_slice(&p2);
        let mut r = OggReader::new();
        for c in bytes.chunks(13) {
            r.push(c);
        }
        assert_eq!(r.pop_packet().unwrap(), big);
        assert_eq!(r.pop_packet().unwrap(), small);
        assert!(r.pop_packet().is_none());
        // Losing page 1 drops the head-less tail but keeps the next packet.
        let mut r = OggReader::new();
        r.push(&p2);
        assert_eq!(r.pop_packet().unwrap(), small);
        assert!(r.pop_packet().is_none());
        // A corrupted CRC drops the page.
        let mut bad = p2.clone();
        bad[30] ^= 0xff;
        let mut r = OggReader::new();
        r.push(&bad);
        assert!(r.pop_packet().is_none());
        assert!(r.stats().skipped_bytes > 0);
    }
}
