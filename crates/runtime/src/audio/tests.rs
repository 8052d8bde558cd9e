//! Tests of WAV I/O and the streaming resampler. Expected values come from hound-written files with
//! known samples and from analytic sine waves, never from this module itself.

use std::io::Cursor;

use proptest::prelude::*;

use super::*;

/// Writes interleaved integer samples with hound into an in-memory WAV.
fn wav_int(rate: u32, channels: u16, bits: u16, samples: &[i32]) -> Vec<u8> {
    let spec = hound::WavSpec {
        channels,
        sample_rate: rate,
        bits_per_sample: bits,
        sample_format: hound::SampleFormat::Int,
    };
    let mut cur = Cursor::new(Vec::new());
    let mut w = hound::WavWriter::new(&mut cur, spec).unwrap();
    for &s in samples {
        if bits == 8 {
            w.write_sample(s as i8).unwrap();
        } else {
            w.write_sample(s).unwrap();
        }
    }
    w.finalize().unwrap();
    cur.into_inner()
}

fn wav_f32(rate: u32, channels: u16, samples: &[f32]) -> Vec<u8> {
    let spec = hound::WavSpec {
        channels,
        sample_rate: rate,
        bits_per_sample: 32,
        sample_format: hound::SampleFormat::Float,
    };
    let mut cur = Cursor::new(Vec::new());
    let mut w = hound::WavWriter::new(&mut cur, spec).unwrap();
    for &s in samples {
        w.write_sample(s).unwrap();
    }
    w.finalize().unwrap();
    cur.into_inner()
}

/// A hand-made canonical WAV (44-byte header) for formats hound will not write.
fn raw_wav(format_tag: u16, channels: u16, rate: u32, bits: u16, data: &[u8]) -> Vec<u8> {
    let block = u32::from(channels) * u32::from(bits) / 8;
    let mut w = Vec::new();
    w.extend_from_slice(b"RIFF");
    w.extend_from_slice(&(36 + data.len() as u32).to_le_bytes());
    w.extend_from_slice(b"WAVEfmt ");
    w.extend_from_slice(&16u32.to_le_bytes());
    w.extend_from_slice(&format_tag.to_le_bytes());
    w.extend_from_slice(&channels.to_le_bytes());
    w.extend_from_slice(&rate.to_le_bytes());
    w.extend_from_slice(&rate.wrapping_mul(block).to_le_bytes());
    w.extend_from_slice(&(block as u16).to_le_bytes());
    w.extend_from_slice(&bits.to_le_bytes());
    w.extend_from_slice(b"data");
    w.extend_from_slice(&(data.len() as u32).to_le_bytes());
    w.extend_from_slice(data);
    w
}

fn sine(rate: u32, freq: f64, n: usize, amp: f64) -> Vec<f32> {
    (0..n)
        .map(|i| {
            (amp * (2.0 * std::f64::consts::PI * freq * i as f64 / f64::from(rate)).sin()) as f32
        })
        .collect()
}

#[test]
fn reads_every_integer_width_at_24k() {
    for bits in [8u16, 16, 24, 32] {
        let full = (1i64 << (bits - 1)) as f64;
        let raw: Vec<i32> = [0.0, 0.5, -0.5, -1.0, 0.25]
            .iter()
            .map(|&x: &f64| (x * full) as i32)
            .collect();
        let audio = read_wav_from(Cursor::new(wav_int(24_000, 1, bits, &raw))).unwrap();
        assert_eq!(audio.source.bits_per_sample, bits);
        assert!(!audio.source.float);
        assert_eq!(
            audio.samples,
            vec![0.0, 0.5, -0.5, -1.0, 0.25],
            "{bits} bits"
        );
    }
}

#[test]
fn reads_float_and_downmixes_channels() {
    // Three channels: mean of (a, b, c).
    let frames = [
        (0.3f32, 0.6f32, -0.3f32),
        (1.0, -1.0, 0.5),
        (-0.9, -0.9, -0.9),
    ];
    let inter: Vec<f32> = frames.iter().flat_map(|&(a, b, c)| [a, b, c]).collect();
    let audio = read_wav_from(Cursor::new(wav_f32(24_000, 3, &inter))).unwrap();
    assert_eq!(audio.source.channels, 3);
    assert_eq!(audio.samples.len(), 3);
    for (got, &(a, b, c)) in audio.samples.iter().zip(&frames) {
        assert!((got - (a + b + c) / 3.0).abs() < 1e-7);
    }
    // Stereo 16-bit.
    let audio = read_wav_from(Cursor::new(wav_int(
        24_000,
        2,
        16,
        &[16384, 0, -32768, -32768],
    )))
    .unwrap();
    assert_eq!(audio.samples, vec![0.25, -1.0]);
}

#[test]
fn resamples_any_rate_to_24k_on_read() {
    for rate in [8_000u32, 16_000, 22_050, 44_100, 48_000, 96_000] {
        let n = rate as usize / 2; // 0.5 s
        let x = sine(rate, 440.0, n, 0.5);
        let pcm: Vec<i32> = x.iter().map(|&v| (v * 32767.0).round() as i32).collect();
        let audio = read_wav_from(Cursor::new(wav_int(rate, 1, 16, &pcm))).unwrap();
        assert_eq!(audio.source.sample_rate, rate);
        assert_eq!(
            audio.samples.len(),
            (n as u64 * 24_000).div_ceil(u64::from(rate)) as usize
        );
        let want = sine(24_000, 440.0, audio.samples.len(), 0.5);
        // Away from the edges (where the clip starts/ends abruptly) the waveform is preserved.
        let err = max_err(&audio.samples[1000..11_000], &want[1000..11_000]);
        // 16-bit quantization (1.5e-5) plus resampling error.
        assert!(err < 1e-4, "{rate} Hz: max error {err}");
    }
}

fn max_err(a: &[f32], b: &[f32]) -> f32 {
    testkit::compare::max_abs_diff(a, b)
}

#[test]
fn typed_errors_for_bad_input() {
    assert!(matches!(
        read_wav_from(Cursor::new(b"this is not a wav file at all".to_vec())),
        Err(AudioError::NotWav(_))
    ));
    let err = read_wav_from(Cursor::new(Vec::new())).unwrap_err();
    assert!(matches!(err, AudioError::Truncated), "{err:?}");
    // Cut in the middle of the sample data.
    let full = wav_int(24_000, 1, 16, &[1000; 100]);
    let cut = full[..full.len() - 51].to_vec();
    assert!(matches!(
        read_wav_from(Cursor::new(cut)),
        Err(AudioError::Truncated)
    ));
    // The header alone (a recording never written to), and a data chunk of length 0: empty, not
    // truncated.
    let header_only = full[..full.len() - 200].to_vec();
    let err = read_wav_from(Cursor::new(header_only)).unwrap_err();
    assert!(matches!(err, AudioError::Empty), "{err:?}");
    let err = read_wav_from(Cursor::new(wav_int(24_000, 1, 16, &[]))).unwrap_err();
    assert!(matches!(err, AudioError::Empty), "{err:?}");
    // Cut inside the header.
    assert!(read_wav_from(Cursor::new(full[..20].to_vec())).is_err());
    // 64-bit float: a valid WAV that hound does not read.
    let f64wav = raw_wav(3, 1, 24_000, 64, &[0; 16]);
    let err = read_wav_from(Cursor::new(f64wav)).unwrap_err();
    assert!(
        matches!(err, AudioError::Unsupported(_) | AudioError::NotWav(_)),
        "{err}"
    );
    // A header with an absurd sample rate is refused before any resampler is built.
    let absurd = raw_wav(1, 1, 2_000_000, 16, &[0; 16]);
    let err = read_wav_from(Cursor::new(absurd)).unwrap_err();
    assert!(matches!(err, AudioError::Unsupported(_)), "{err:?}");
    // A rate whose byte rate overflows 32 bits: hound refuses the header.
    let err = read_wav_from(Cursor::new(raw_wav(1, 1, 4_000_000_000, 16, &[0; 16]))).unwrap_err();
    assert!(
        matches!(err, AudioError::NotWav(_) | AudioError::Unsupported(_)),
        "{err:?}"
    );
    assert!(matches!(
        read_wav("/nonexistent/file.wav"),
        Err(AudioError::Io(_))
    ));
}

#[test]
fn strict_mode_accepts_only_the_model_format() {
    let ok16 = wav_int(24_000, 1, 16, &[16384, -16384]);
    assert_eq!(
        read_wav_strict_from(Cursor::new(ok16)).unwrap(),
        vec![0.5, -0.5]
    );
    let okf = wav_f32(24_000, 1, &[0.1, -0.7]);
    assert_eq!(
        read_wav_strict_from(Cursor::new(okf)).unwrap(),
        vec![0.1, -0.7]
    );
    for bad in [
        wav_int(48_000, 1, 16, &[0; 4]),
        wav_int(24_000, 2, 16, &[0; 4]),
        wav_int(24_000, 1, 24, &[0; 4]),
        wav_int(24_000, 1, 8, &[0; 4]),
        wav_f32(16_000, 1, &[0.0; 4]),
    ] {
        let err = read_wav_strict_from(Cursor::new(bad)).unwrap_err();
        assert!(matches!(err, AudioError::NotModelFormat(_)), "{err}");
    }
    assert!(matches!(
        read_wav_strict_from(Cursor::new(b"RIFX".to_vec())),
        Err(AudioError::NotWav(_) | AudioError::Truncated)
    ));
}

#[test]
fn writes_mono_and_stereo() {
    let x = [0.0f32, 0.5, -0.5, 1.5, -2.0, f32::NAN];
    let mut cur = Cursor::new(Vec::new());
    write_wav_mono_to(&mut cur, &x, 24_000, WavFormat::I16).unwrap();
    let mut r = hound::WavReader::new(Cursor::new(cur.into_inner())).unwrap();
    assert_eq!(r.spec().bits_per_sample, 16);
    assert_eq!(r.spec().channels, 1);
    let got: Vec<i16> = r.samples::<i16>().map(|s| s.unwrap()).collect();
    assert_eq!(got, vec![0, 16384, -16384, 32767, -32767, 0]);

    let mut cur = Cursor::new(Vec::new());
    write_wav_mono_to(&mut cur, &x[..5], 48_000, WavFormat::F32).unwrap();
    let mut r = hound::WavReader::new(Cursor::new(cur.into_inner())).unwrap();
    assert_eq!(r.spec().sample_rate, 48_000);
    let got: Vec<f32> = r.samples::<f32>().map(|s| s.unwrap()).collect();
    assert_eq!(got, x[..5].to_vec());

    // Stereo: user left, Moshi right; the shorter side is padded with silence.
    let mut cur = Cursor::new(Vec::new());
    write_wav_stereo_to(
        &mut cur,
        &[0.25, 0.5, 0.75],
        &[-0.25],
        24_000,
        WavFormat::F32,
    )
    .unwrap();
    let mut r = hound::WavReader::new(Cursor::new(cur.into_inner())).unwrap();
    assert_eq!(r.spec().channels, 2);
    let got: Vec<f32> = r.samples::<f32>().map(|s| s.unwrap()).collect();
    assert_eq!(got, vec![0.25, -0.25, 0.5, 0.0, 0.75, 0.0]);
    assert!(write_wav_mono_to(Cursor::new(Vec::new()), &x, 0, WavFormat::F32).is_err());
}

#[test]
fn file_round_trip() {
    let dir = testkit::ScratchDir::new("audio-test");
    let path = dir.join("x.wav");
    let x = sine(24_000, 300.0, 2400, 0.3);
    write_wav_mono(&path, &x, 24_000, WavFormat::F32).unwrap();
    assert_eq!(read_wav_strict(&path).unwrap(), x);
    assert_eq!(read_wav(&path).unwrap().samples, x);
    write_wav_stereo(&path, &x, &x, 24_000, WavFormat::I16).unwrap();
    assert!(matches!(
        read_wav_strict(&path),
        Err(AudioError::NotModelFormat(_))
    ));
    let back = read_wav(&path).unwrap().samples;
    assert!(max_err(&back, &x) < 1.0 / 32767.0);
}

const PAIRS: [(u32, u32); 8] = [
    (24_000, 48_000),
    (24_000, 44_100),
    (24_000, 16_000),
    (48_000, 24_000),
    (44_100, 24_000),
    (16_000, 24_000),
    (8_000, 24_000),
    (24_000, 24_000),
];

#[test]
fn resampled_sine_matches_analytic_sine() {
    for (from, to) in PAIRS {
        for freq in [440.0, 3000.0, 0.35 * f64::from(from.min(to))] {
            let n = from as usize; // 1 s
            let x = sine(from, freq, n, 0.8);
            let mut r = StreamResampler::new(from, to).unwrap();
            let y = r.process_all(&x).unwrap();
            assert_eq!(
                y.len() as u64,
                (n as u64 * u64::from(to)).div_ceil(u64::from(from))
            );
            let want = sine(to, freq, y.len(), 0.8);
            let lo = to as usize / 20;
            let hi = y.len() - lo;
            let err = max_err(&y[lo..hi], &want[lo..hi]);
            // Measured: at most 2e-6 for these pairs (f32 FFT rounding).
            assert!(err < 1e-4, "{from}->{to} {freq} Hz: max error {err}");
        }
    }
}

#[test]
fn frequencies_above_the_output_nyquist_are_removed() {
    // 10 kHz at 48 kHz, resampled to 16 kHz (Nyquist 8 kHz): nothing should survive.
    let x = sine(48_000, 10_000.0, 48_000, 0.8);
    let y = StreamResampler::new(48_000, 16_000)
        .unwrap()
        .process_all(&x)
        .unwrap();
    let peak = y[1600..14_400].iter().fold(0.0f32, |m, v| m.max(v.abs()));
    assert!(peak < 0.01, "aliased peak {peak}");
}

fn chunked(from: u32, to: u32, x: &[f32], sizes: &[usize]) -> Vec<f32> {
    let mut r = StreamResampler::new(from, to).unwrap();
    let mut out = Vec::new();
    let mut pos = 0;
    let mut k = 0;
    while pos < x.len() {
        let n = sizes[k % sizes.len()].min(x.len() - pos);
        r.process(&x[pos..pos + n], &mut out).unwrap();
        pos += n;
        k += 1;
    }
    r.flush(&mut out).unwrap();
    out
}

#[test]
fn chunked_equals_one_shot_for_frame_sized_chunks() {
    for (from, to) in PAIRS {
        let x = sine(from, 1000.0, from as usize / 3, 0.5);
        let one = StreamResampler::new(from, to)
            .unwrap()
            .process_all(&x)
            .unwrap();
        // 80 ms model frames, 20 ms browser packets, single samples.
        for sizes in [
            vec![from as usize * 2 / 25],
            vec![from as usize / 50],
            vec![1],
        ] {
            assert_eq!(chunked(from, to, &x, &sizes), one, "{from}->{to} {sizes:?}");
        }
    }
}

#[test]
fn reuse_after_flush_and_reset() {
    let x = sine(48_000, 700.0, 5000, 0.5);
    let mut r = StreamResampler::new(48_000, 24_000).unwrap();
    let a = r.process_all(&x).unwrap();
    let mut b = Vec::new();
    r.process(&x[..1234], &mut b).unwrap();
    r.reset();
    b.clear();
    r.process(&x, &mut b).unwrap();
    r.flush(&mut b).unwrap();
    assert_eq!(a, b);
    assert!(StreamResampler::new(0, 24_000).is_err());
    assert!(StreamResampler::new(24_000, 999).is_err());
    assert!(StreamResampler::new(4_000_000_007, 24_000).is_err());
    assert!(StreamResampler::with_chunk(24_000, 48_000, MAX_CHUNK + 1).is_err());
    // Coprime rates are fine (the FFT block spans a whole second of input).
    let x = sine(22_051, 440.0, 22_051, 0.5);
    let y = StreamResampler::new(22_051, 24_000)
        .unwrap()
        .process_all(&x)
        .unwrap();
    let want = sine(24_000, 440.0, y.len(), 0.5);
    assert!(max_err(&y[2400..21_600], &want[2400..21_600]) < 1e-4);
    assert!(StreamResampler::with_chunk(24_000, 48_000, 0).is_err());
}

#[test]
fn max_output_len_bounds_hold() {
    for (from, to) in PAIRS {
        let x = sine(from, 500.0, 20_000, 0.5);
        let mut r = StreamResampler::new(from, to).unwrap();
        let mut out = Vec::new();
        for chunk in x.chunks(777) {
            let bound = r.max_output_len(chunk.len());
            let before = out.len();
            r.process(chunk, &mut out).unwrap();
            assert!(out.len() - before <= bound);
        }
        let bound = r.max_flush_len();
        let before = out.len();
        r.flush(&mut out).unwrap();
        assert!(out.len() - before <= bound, "{from}->{to}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Any chunking gives exactly the one-shot result (tolerance: 0, bit for bit).
    #[test]
    fn arbitrary_chunking_is_bit_exact(
        pair in 0usize..PAIRS.len(),
        sizes in proptest::collection::vec(1usize..3000, 1..12),
        len in 0usize..12_000,
    ) {
        let (from, to) = PAIRS[pair];
        let x: Vec<f32> = (0..len).map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0).collect();
        let one = StreamResampler::new(from, to).unwrap().process_all(&x).unwrap();
        prop_assert_eq!(chunked(from, to, &x, &sizes), one);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    /// Hostile headers (random format fields, lengths, data) give errors, never panics.
    #[test]
    fn hostile_wav_headers_never_panic(
        tag in prop_oneof![Just(1u16), Just(3u16), Just(0xfffeu16), any::<u16>()],
        channels in prop_oneof![0u16..4, any::<u16>()],
        rate in prop_oneof![Just(24_000u32), 0u32..2_000_000, any::<u32>()],
        bits in prop_oneof![Just(8u16), Just(16u16), Just(24u16), Just(32u16), any::<u16>()],
        data in proptest::collection::vec(any::<u8>(), 0..64),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = raw_wav(tag, channels, rate, bits, &data);
        for (at, b) in edits {
            let i = at.index(bytes.len());
            bytes[i] = b;
        }
        let keep = bytes.len() - cut.index(bytes.len() / 4 + 1);
        bytes.truncate(keep);
        let _ = read_wav_from(Cursor::new(&bytes));
        let _ = read_wav_strict_from(Cursor::new(&bytes));
    }
}

/// Regression (fuzz target `wav_read`): a float WAV at 155,072 Hz holding a NaN sample made rubato's
/// inverse FFT fail inside an `unwrap` (abort). Non-finite input is now resampled as silence.
#[test]
fn non_finite_samples_do_not_crash_the_resampler() {
    let crash = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fuzz/regressions/wav_read/nan-sample-155khz-float.wav"),
    )
    .unwrap();
    let _ = read_wav_from(std::io::Cursor::new(&crash[..]));
    for (from, to) in [(155_072, 24_000), (24_000, 48_000), (44_100, 24_000)] {
        let mut x = vec![0.25f32; 5000];
        x[10] = f32::NAN;
        x[20] = f32::INFINITY;
        x[30] = f32::NEG_INFINITY;
        let y = StreamResampler::new(from, to)
            .unwrap()
            .process_all(&x)
            .unwrap();
        assert!(y.iter().all(|v| v.is_finite()), "{from} -> {to}");
    }
}
