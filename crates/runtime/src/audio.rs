//! Audio I/O and resampling: WAV reading/writing for the CLI (`hound`) and a streaming resampler
//! (`rubato`'s synchronous FFT resampler) between the model's 24 kHz and any other rate.
//!
//! * [`read_wav`] accepts any common WAV (8/16/24/32-bit integer PCM or 32-bit float, any channel
//!   count, any rate) and returns 24 kHz mono `f32`; [`read_wav_strict`] accepts only what the model
//!   takes as is (24 kHz mono, 16-bit PCM or 32-bit float), for `trace` commands.
//! * [`write_wav_mono`] / [`write_wav_stereo`] write `f32` or 16-bit PCM files.
//! * [`StreamResampler`] converts a stream chunk by chunk with state carried between calls; the
//!   output does not depend on how the input is split, and after construction it does not allocate.
//!
//! Session output at the consumer's rate, one 80 ms model frame at a time:
//!
//! ```no_run
//! # use runtime::audio::StreamResampler;
//! let mut rs = StreamResampler::new(24_000, 48_000)?;
//! let mut out = Vec::with_capacity(rs.max_output_len(1920) + rs.max_flush_len());
//! let frame = [0.0f32; 1920]; // decoded Mimi frame
//! out.clear();
//! rs.process(&frame, &mut out)?; // no allocation: `out` has room
//! // ... send `out`; on interrupt/reset call `rs.reset()`, at the end of a stream `rs.flush(&mut out)`.
//! # Ok::<(), runtime::audio::AudioError>(())
//! ```

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, Write};
use std::path::Path;

use rubato::audioadapter_buffers::direct::InterleavedSlice;
use rubato::{Fft, FixedSync, Resampler};

use crate::SAMPLE_RATE;

/// Errors from WAV I/O and resampling.
#[derive(Debug, thiserror::Error)]
pub enum AudioError {
    /// The file could not be opened, read or written.
    #[error("audio I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// The input is not a WAV file, or its header is malformed.
    #[error("not a valid WAV file: {0}")]
    NotWav(String),
    /// The WAV holds no audio: its data is empty (or ends before the first sample).
    #[error("the WAV file is empty: it holds no audio samples")]
    Empty,
    /// The file ends before the sample data its header announces.
    #[error("truncated WAV file: the data ends before the length given in its header")]
    Truncated,
    /// A WAV encoding this crate does not read (e.g. 64-bit float, A-law, 12-bit in 16).
    #[error("unsupported WAV format: {0}")]
    Unsupported(String),
    /// Strict mode: the file is valid but not 24 kHz mono 16-bit PCM / 32-bit float.
    #[error("trace input must be 24000 Hz mono, 16-bit PCM or 32-bit float; got {0}")]
    NotModelFormat(String),
    /// Invalid arguments (rates, lengths, buffer sizes).
    #[error("invalid audio argument: {0}")]
    Invalid(String),
    /// The resampler could not be built or failed.
    #[error("resampler error: {0}")]
    Resample(String),
}

fn map_hound(e: hound::Error) -> AudioError {
    match e {
        hound::Error::IoError(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            AudioError::Truncated
        }
        // hound reports a short read of a header field this way.
        hound::Error::IoError(e) if e.to_string().contains("enough bytes") => AudioError::Truncated,
        hound::Error::IoError(e) => AudioError::Io(e),
        hound::Error::FormatError(msg) => AudioError::NotWav(msg.to_string()),
        hound::Error::UnfinishedSample => AudioError::Truncated,
        hound::Error::Unsupported => AudioError::Unsupported("encoding not supported".into()),
        hound::Error::TooWide | hound::Error::InvalidSampleFormat => {
            AudioError::Unsupported("sample format not supported".into())
        }
    }
}

/// [`map_hound`], except that a file whose data ends before its first sample is empty, not truncated
/// (a recording that was started and never written to).
fn empty_if_first(index: usize, e: hound::Error) -> AudioError {
    match map_hound(e) {
        AudioError::Truncated if index == 0 => AudioError::Empty,
        other => other,
    }
}

/// The sample encoding of a WAV file to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WavFormat {
    /// 32-bit IEEE float.
    F32,
    /// 16-bit signed PCM (samples are clamped to [-1, 1] and rounded).
    I16,
}

/// What a WAV header said about the file that was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WavInfo {
    /// Sample rate of the file (Hz).
    pub sample_rate: u32,
    /// Number of interleaved channels in the file.
    pub channels: u16,
    /// Bits per sample.
    pub bits_per_sample: u16,
    /// Whether samples are IEEE floats (else signed integer PCM).
    pub float: bool,
}

impl std::fmt::Display for WavInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.float { "float" } else { "PCM" };
        write!(
            f,
            "{} Hz, {} channel(s), {}-bit {}",
            self.sample_rate, self.channels, self.bits_per_sample, kind
        )
    }
}

/// Decoded audio: mono `f32` samples in [-1, 1] at the model rate (24 kHz), plus the source format.
#[derive(Debug, Clone)]
pub struct WavAudio {
    /// Mono samples at [`SAMPLE_RATE`].
    pub samples: Vec<f32>,
    /// The format of the file they came from.
    pub source: WavInfo,
}

/// Reads interleaved samples as `f32` and mixes them down to mono (mean of the channels).
fn decode_mono<R: Read>(
    mut reader: hound::WavReader<R>,
) -> Result<(Vec<f32>, WavInfo), AudioError> {
    let spec = reader.spec();
    let info = WavInfo {
        sample_rate: spec.sample_rate,
        channels: spec.channels,
        bits_per_sample: spec.bits_per_sample,
        float: spec.sample_format == hound::SampleFormat::Float,
    };
    if spec.channels == 0 || spec.sample_rate == 0 {
        return Err(AudioError::NotWav(format!("invalid header: {info}")));
    }
    if !RATE_RANGE.contains(&spec.sample_rate) {
        return Err(AudioError::Unsupported(format!(
            "{info} (sample rates from {} to {} Hz are supported)",
            RATE_RANGE.start(),
            RATE_RANGE.end()
        )));
    }
    let channels = usize::from(spec.channels);
    // The header's length may lie (truncated or hostile files): cap the up-front reservation.
    let frames_hint = (reader.len() as usize / channels).min(1 << 22);
    let mut mono = Vec::with_capacity(frames_hint);
    let scale = 1.0 / channels as f32;
    let mut acc = 0.0f32;
    let mut k = 0;
    let mut push = |x: f32| {
        acc += x;
        k += 1;
        if k == channels {
            mono.push(acc * scale);
            acc = 0.0;
            k = 0;
        }
    };
    match (spec.sample_format, spec.bits_per_sample) {
        (hound::SampleFormat::Float, 32) => {
            for (i, s) in reader.samples::<f32>().enumerate() {
                push(s.map_err(|e| empty_if_first(i, e))?);
            }
        }
        (hound::SampleFormat::Int, bits @ (8 | 16 | 24 | 32)) => {
            let norm = 1.0 / (1u64 << (bits - 1)) as f64;
            for (i, s) in reader.samples::<i32>().enumerate() {
                push((f64::from(s.map_err(|e| empty_if_first(i, e))?) * norm) as f32);
            }
        }
        _ => {
            return Err(AudioError::Unsupported(format!(
                "{info} (expected 8/16/24/32-bit PCM or 32-bit float)"
            )))
        }
    }
    if k != 0 {
        return Err(AudioError::Truncated);
    }
    if mono.is_empty() {
        return Err(AudioError::Empty);
    }
    Ok((mono, info))
}

/// Reads a WAV from any reader: mixed down to mono and resampled to 24 kHz.
pub fn read_wav_from<R: Read>(reader: R) -> Result<WavAudio, AudioError> {
    let reader = hound::WavReader::new(reader).map_err(map_hound)?;
    let (mono, source) = decode_mono(reader)?;
    let samples = if source.sample_rate == SAMPLE_RATE {
        mono
    } else {
        StreamResampler::new(source.sample_rate, SAMPLE_RATE)?.process_all(&mono)?
    };
    Ok(WavAudio { samples, source })
}

/// Reads a WAV file (any common format, see the module docs) as 24 kHz mono.
pub fn read_wav(path: impl AsRef<Path>) -> Result<WavAudio, AudioError> {
    let file = File::open(path.as_ref())?;
    read_wav_from(BufReader::new(file))
}

/// Strict reader for `trace` commands: only 24 kHz mono 16-bit PCM or 32-bit float is accepted,
/// so the samples reach the model bit for bit as stored; anything else is
/// [`AudioError::NotModelFormat`].
pub fn read_wav_strict_from<R: Read>(reader: R) -> Result<Vec<f32>, AudioError> {
    let reader = hound::WavReader::new(reader).map_err(map_hound)?;
    let spec = reader.spec();
    let ok_format = matches!(
        (spec.sample_format, spec.bits_per_sample),
        (hound::SampleFormat::Int, 16) | (hound::SampleFormat::Float, 32)
    );
    if spec.sample_rate != SAMPLE_RATE || spec.channels != 1 || !ok_format {
        let info = WavInfo {
            sample_rate: spec.sample_rate,
            channels: spec.channels,
            bits_per_sample: spec.bits_per_sample,
            float: spec.sample_format == hound::SampleFormat::Float,
        };
        return Err(AudioError::NotModelFormat(info.to_string()));
    }
    Ok(decode_mono(reader)?.0)
}

/// [`read_wav_strict_from`] on a file.
pub fn read_wav_strict(path: impl AsRef<Path>) -> Result<Vec<f32>, AudioError> {
    let file = File::open(path.as_ref())?;
    read_wav_strict_from(BufReader::new(file))
}

fn to_i16(x: f32) -> i16 {
    if x.is_nan() {
        return 0;
    }
    (x.clamp(-1.0, 1.0) * 32767.0).round() as i16
}

fn write_interleaved<W: Write + Seek>(
    writer: W,
    channels: &[&[f32]],
    sample_rate: u32,
    format: WavFormat,
) -> Result<(), AudioError> {
    if sample_rate == 0 {
        return Err(AudioError::Invalid("sample rate 0".into()));
    }
    let spec = hound::WavSpec {
        channels: channels.len() as u16,
        sample_rate,
        bits_per_sample: match format {
            WavFormat::F32 => 32,
            WavFormat::I16 => 16,
        },
        sample_format: match format {
            WavFormat::F32 => hound::SampleFormat::Float,
            WavFormat::I16 => hound::SampleFormat::Int,
        },
    };
    let frames = channels.iter().map(|c| c.len()).max().unwrap_or(0);
    let mut w = hound::WavWriter::new(writer, spec).map_err(map_hound)?;
    for i in 0..frames {
        for c in channels {
            let x = c.get(i).copied().unwrap_or(0.0);
            match format {
                WavFormat::F32 => w.write_sample(x),
                WavFormat::I16 => w.write_sample(to_i16(x)),
            }
            .map_err(map_hound)?;
        }
    }
    w.finalize().map_err(map_hound)
}

/// Writes mono samples to any seekable writer.
pub fn write_wav_mono_to<W: Write + Seek>(
    writer: W,
    samples: &[f32],
    sample_rate: u32,
    format: WavFormat,
) -> Result<(), AudioError> {
    write_interleaved(writer, &[samples], sample_rate, format)
}

/// Writes a mono WAV file.
pub fn write_wav_mono(
    path: impl AsRef<Path>,
    samples: &[f32],
    sample_rate: u32,
    format: WavFormat,
) -> Result<(), AudioError> {
    let file = BufWriter::new(File::create(path.as_ref())?);
    write_wav_mono_to(file, samples, sample_rate, format)
}

/// Writes a stereo file to any seekable writer: `left` (the user) and `right` (Moshi); the shorter
/// channel is padded with silence.
pub fn write_wav_stereo_to<W: Write + Seek>(
    writer: W,
    left: &[f32],
    right: &[f32],
    sample_rate: u32,
    format: WavFormat,
) -> Result<(), AudioError> {
    write_interleaved(writer, &[left, right], sample_rate, format)
}

/// Writes a stereo WAV file (`--stereo`: user on the left, Moshi on the right).
pub fn write_wav_stereo(
    path: impl AsRef<Path>,
    left: &[f32],
    right: &[f32],
    sample_rate: u32,
    format: WavFormat,
) -> Result<(), AudioError> {
    let file = BufWriter::new(File::create(path.as_ref())?);
    write_wav_stereo_to(file, left, right, sample_rate, format)
}

/// Sample rates the resampler accepts (Hz). The bound keeps FFT sizes sane for hostile headers: for
/// coprime rates the FFT block is a multiple of the whole input rate.
pub const RATE_RANGE: std::ops::RangeInclusive<u32> = 1_000..=768_000;

/// Largest internal chunk hint accepted by [`StreamResampler::with_chunk`] (input samples).
pub const MAX_CHUNK: usize = 1 << 20;

fn gcd(mut a: u32, mut b: u32) -> u32 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The FFT resampler with its fixed chunk sizes and preallocated buffers.
struct FftState {
    fft: Fft<f32>,
    chunk_in: usize,
    chunk_out: usize,
    /// Input samples waiting for a full chunk (capacity `chunk_in`).
    pending: Vec<f32>,
    /// One chunk of resampler output (length `chunk_out`).
    out: Vec<f32>,
    /// Leading output samples still to drop (the resampler's delay).
    skip: usize,
    delay: usize,
}

/// A mono streaming resampler between two fixed rates (e.g. 48 kHz → 24 kHz for user audio,
/// 24 kHz → 48/44.1/16 kHz for Moshi's voice).
///
/// Input may be pushed in chunks of any size; it is buffered into the fixed chunks of `rubato`'s
/// synchronous FFT resampler, so the output is **identical** (bit for bit) however the input is
/// split. The resampler's own delay is trimmed, so output sample `j` corresponds to time
/// `j / to_rate` of the input (aligned, not delayed); the price is latency: output lags input by
/// up to one internal chunk plus the FFT delay (see [`StreamResampler::latency_frames`]). Equal
/// rates pass samples through untouched.
///
/// [`process`](StreamResampler::process) appends to a caller `Vec`; it does not allocate when that
/// `Vec` has room for [`max_output_len`](StreamResampler::max_output_len) more samples.
pub struct StreamResampler {
    from: u32,
    to: u32,
    state: Option<FftState>,
    /// Input samples received since construction or the last reset/flush.
    consumed: u64,
    /// Output samples emitted since construction or the last reset/flush.
    produced: u64,
}

impl std::fmt::Debug for StreamResampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamResampler")
            .field("from", &self.from)
            .field("to", &self.to)
            .field("chunk_in", &self.state.as_ref().map(|s| s.chunk_in))
            .field("chunk_out", &self.state.as_ref().map(|s| s.chunk_out))
            .finish()
    }
}

impl StreamResampler {
    /// A resampler from `from` Hz to `to` Hz with internal chunks of about 10 ms of input, and at
    /// least 256 input samples (shorter FFT blocks widen the filter's transition band: at 8 kHz,
    /// 10 ms blocks attenuate 3 kHz by 1.5%).
    pub fn new(from: u32, to: u32) -> Result<StreamResampler, AudioError> {
        Self::with_chunk(from, to, (from as usize / 100).max(256))
    }

    /// A resampler whose internal chunk is about `chunk_hint` input samples (rubato rounds it to
    /// fit the exact rate ratio). Larger chunks cost more latency and less CPU per sample.
    pub fn with_chunk(
        from: u32,
        to: u32,
        chunk_hint: usize,
    ) -> Result<StreamResampler, AudioError> {
        if !RATE_RANGE.contains(&from) || !RATE_RANGE.contains(&to) {
            return Err(AudioError::Invalid(format!(
                "sample rates {from} → {to} (supported: {} to {} Hz)",
                RATE_RANGE.start(),
                RATE_RANGE.end()
            )));
        }
        if chunk_hint == 0 || chunk_hint > MAX_CHUNK {
            return Err(AudioError::Invalid(format!(
                "chunk size {chunk_hint} (supported: 1 to {MAX_CHUNK})"
            )));
        }
        let state = if from == to {
            None
        } else {
            // rubato's FFT blocks are whole multiples of the minimal blocks `rate / gcd`. Its delay,
            // trimmed below, is `fft_size_out / 2` frames: an odd block size would leave a
            // half-sample misalignment, so use an even number of minimal blocks when needed.
            let g = gcd(from, to) as usize;
            let (min_in, min_out) = (from as usize / g, to as usize / g);
            let mut blocks = chunk_hint.div_ceil(min_in).max(1);
            if (min_in * blocks) % 2 == 1 || (min_out * blocks) % 2 == 1 {
                blocks += 1;
            }
            let fft = Fft::<f32>::new_custom(
                from as usize,
                to as usize,
                blocks * min_in,
                1,
                1,
                rubato::WindowFunction::BlackmanHarris2,
                FixedSync::Both,
            )
            .map_err(|e| AudioError::Resample(e.to_string()))?;
            let chunk_in = fft.input_frames_next();
            let chunk_out = fft.output_frames_next();
            let delay = fft.output_delay();
            Some(FftState {
                fft,
                chunk_in,
                chunk_out,
                pending: Vec::with_capacity(chunk_in),
                out: vec![0.0; chunk_out],
                skip: delay,
                delay,
            })
        };
        Ok(StreamResampler {
            from,
            to,
            state,
            consumed: 0,
            produced: 0,
        })
    }

    /// Input rate (Hz).
    pub fn from_rate(&self) -> u32 {
        self.from
    }

    /// Output rate (Hz).
    pub fn to_rate(&self) -> u32 {
        self.to
    }

    /// Worst-case lag of the output behind the input, in output samples (0 for equal rates).
    pub fn latency_frames(&self) -> usize {
        self.state.as_ref().map_or(0, |s| s.chunk_out + s.delay)
    }

    /// An upper bound on the samples one `process` call with `input_len` samples appends.
    pub fn max_output_len(&self, input_len: usize) -> usize {
        match &self.state {
            None => input_len,
            Some(s) => (s.pending.len() + input_len) / s.chunk_in * s.chunk_out,
        }
    }

    /// An upper bound on the samples [`flush`](StreamResampler::flush) appends.
    pub fn max_flush_len(&self) -> usize {
        self.state
            .as_ref()
            .map_or(0, |s| (s.delay / s.chunk_out + 2) * s.chunk_out)
    }

    /// Runs one full internal chunk and appends its (delay-trimmed) output, at most `limit` samples.
    fn run_chunk(s: &mut FftState, output: &mut Vec<f32>, limit: u64) -> Result<u64, AudioError> {
        let input = InterleavedSlice::new(&s.pending[..], 1, s.chunk_in)
            .map_err(|e| AudioError::Resample(e.to_string()))?;
        let mut out = InterleavedSlice::new_mut(&mut s.out[..], 1, s.chunk_out)
            .map_err(|e| AudioError::Resample(e.to_string()))?;
        let (_, written) = s
            .fft
            .process_into_buffer(&input, &mut out, None)
            .map_err(|e| AudioError::Resample(e.to_string()))?;
        s.pending.clear();
        let drop = s.skip.min(written);
        s.skip -= drop;
        let avail = (written - drop) as u64;
        let n = avail.min(limit) as usize;
        output.extend_from_slice(&s.out[drop..drop + n]);
        Ok(n as u64)
    }

    /// Feeds `input` and appends every output sample that is ready to `output`. Non-finite input
    /// samples are resampled as silence (0.0).
    pub fn process(&mut self, mut input: &[f32], output: &mut Vec<f32>) -> Result<(), AudioError> {
        self.consumed += input.len() as u64;
        let Some(s) = &mut self.state else {
            output.extend_from_slice(input);
            self.produced += input.len() as u64;
            return Ok(());
        };
        while !input.is_empty() {
            let take = (s.chunk_in - s.pending.len()).min(input.len());
            // rubato's inverse FFT fails (and its caller unwraps) on non-finite input: feed
            // NaN/Inf as silence. Found by the `wav_read` fuzz target (fuzz/regressions/wav_read).
            s.pending.extend(
                input[..take]
                    .iter()
                    .map(|&x| if x.is_finite() { x } else { 0.0 }),
            );
            input = &input[take..];
            if s.pending.len() == s.chunk_in {
                self.produced += Self::run_chunk(s, output, u64::MAX)?;
            }
        }
        Ok(())
    }

    /// Ends the stream: pads with silence to push out the remaining samples, so that in total
    /// `ceil(inputs × to / from)` samples were produced, then resets for a new stream.
    pub fn flush(&mut self, output: &mut Vec<f32>) -> Result<(), AudioError> {
        let expected = (self.consumed * u64::from(self.to)).div_ceil(u64::from(self.from));
        if let Some(s) = &mut self.state {
            while self.produced < expected {
                s.pending.resize(s.chunk_in, 0.0);
                self.produced += Self::run_chunk(s, output, expected - self.produced)?;
            }
        }
        self.reset();
        Ok(())
    }

    /// Forgets all state (pending input, filter history) and starts a new stream.
    pub fn reset(&mut self) {
        if let Some(s) = &mut self.state {
            s.fft.reset();
            s.pending.clear();
            s.skip = s.delay;
        }
        self.consumed = 0;
        self.produced = 0;
    }

    /// Resamples a whole clip: `process` then `flush`, into a new `Vec`.
    pub fn process_all(&mut self, input: &[f32]) -> Result<Vec<f32>, AudioError> {
        self.reset();
        let mut out = Vec::with_capacity(self.max_output_len(input.len()) + self.max_flush_len());
        self.process(input, &mut out)?;
        self.flush(&mut out)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
