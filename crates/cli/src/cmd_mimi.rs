//! `moshi-native mimi encode IN.wav OUT.codes` / `mimi decode IN.codes OUT.wav`: run the Mimi
//! codec on files (streaming, frame by frame, allocation-free per frame).
//!
//! ## The `.codes` format
//! A safetensors file holding
//! * `codes`: i64 `[n_codebooks, T]`, one column per 80 ms frame (values `0..cardinality`);
//! * `num_samples`: i64 `[1]`, the length of the encoded signal before right-padding to whole
//!   frames (decode trims its output to it);
//!
//! and `__metadata__` with `format = "moshi-native-mimi-codes"`, `sample_rate`, `frame_size`.
//! `decode` also accepts a file with only `codes` (as written by `trace mimi`), then writes all
//! `T · frame_size` samples.
//!
//! `encode` reads any WAV `duplex` reads (8/16/24/32-bit PCM or 32-bit float, any rate, any channel
//! count: resampled to 24 kHz and mixed down to mono, as `duplex` does); `decode` writes 16-bit PCM
//! (what every audio tool opens), or 32-bit float with `--float`. The model is chosen as everywhere
//! else (`--model demo`, `--model-dir`, `MOSHI_MODEL_DIR`, `--variant`/`--preset` in the Hugging
//! Face cache): every bundle carries the same Mimi.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use kernels::Pool;
use model::mimi::{Mimi, MimiDecoder, MimiEncoder};
use runtime::audio::WavFormat;

use crate::models::{count, ModelArgs};

/// Flags shared by the Mimi commands.
#[derive(Args, Debug, Clone)]
pub struct MimiModelArgs {
    /// Which bundle's Mimi to use (they are all the same codec).
    #[command(flatten)]
    pub model: ModelArgs,
    /// Number of codebooks (Moshi uses 8).
    #[arg(long, default_value_t = 8)]
    pub codebooks: usize,
    /// Threads for the matrix products.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
}

impl MimiModelArgs {
    /// The bundle directory the flags name (the demo bundle is written to its cache folder first).
    fn dir(&self) -> Result<PathBuf> {
        crate::common::warn_threads(self.threads);
        Ok(match self.model.resolve()? {
            crate::models::ModelSource::Demo => embed::demo::materialize()?,
            crate::models::ModelSource::Dir(d) => d,
        })
    }
}

/// `moshi-native mimi ...`
#[derive(Subcommand, Debug)]
pub enum MimiCmd {
    /// Encode a WAV into a `.codes` file (any WAV `duplex` takes: resampled to 24 kHz, mixed down
    /// to mono).
    Encode {
        /// Input WAV (8/16/24/32-bit PCM or 32-bit float, any rate, mono or more channels).
        input: PathBuf,
        /// Output `.codes` (safetensors with `codes` i64 [n_codebooks, T]).
        output: PathBuf,
        #[command(flatten)]
        model: MimiModelArgs,
    },
    /// Decode a `.codes` file into a 24 kHz mono WAV (16-bit PCM, or 32-bit float with --float).
    Decode {
        /// Input `.codes` (as written by `mimi encode`).
        input: PathBuf,
        /// Output WAV.
        output: PathBuf,
        /// Write 32-bit float samples instead of 16-bit PCM.
        #[arg(long)]
        float: bool,
        #[command(flatten)]
        model: MimiModelArgs,
    },
}

/// Opens the Mimi of a bundle directory with `n_codebooks` codebooks.
pub fn open_mimi(dir: &Path, n_codebooks: usize) -> Result<Arc<Mimi>> {
    Ok(embed::open_mimi(dir, None, n_codebooks)?)
}

/// Reads a 24 kHz mono WAV (16-bit PCM or 32-bit float) as f32 samples.
pub fn read_wav_24k_mono(path: &Path) -> Result<Vec<f32>> {
    let mut r =
        hound::WavReader::open(path).with_context(|| format!("opening WAV {}", path.display()))?;
    let spec = r.spec();
    if spec.channels != 1 {
        bail!(
            "{}: {} channels; Mimi needs mono",
            path.display(),
            spec.channels
        );
    }
    if spec.sample_rate != 24000 {
        bail!(
            "{}: sample rate {} Hz; Mimi needs 24000 Hz (resample first)",
            path.display(),
            spec.sample_rate
        );
    }
    let expected = r.len() as usize;
    let samples: Vec<f32> = match (spec.sample_format, spec.bits_per_sample) {
        (hound::SampleFormat::Int, 16) => r
            .samples::<i16>()
            .map(|s| s.map(|v| v as f32 / 32768.0))
            .collect::<Result<_, _>>()
            .with_context(|| format!("reading {} (truncated?)", path.display()))?,
        (hound::SampleFormat::Float, 32) => r
            .samples::<f32>()
            .collect::<Result<_, _>>()
            .with_context(|| format!("reading {} (truncated?)", path.display()))?,
        (f, b) => bail!(
            "{}: unsupported WAV encoding ({b}-bit {f:?}); use 16-bit PCM or 32-bit float",
            path.display()
        ),
    };
    if samples.len() != expected {
        bail!(
            "{}: truncated WAV ({} of {expected} samples)",
            path.display(),
            samples.len()
        );
    }
    Ok(samples)
}

/// A tensor to write: name, safetensors dtype, shape, little-endian bytes.
pub type OutTensor = (String, &'static str, Vec<usize>, Vec<u8>);

/// Writes tensors (plus optional metadata) as safetensors.
pub fn write_safetensors(
    path: &Path,
    tensors: &[OutTensor],
    metadata: Option<&BTreeMap<String, String>>,
) -> Result<()> {
    let hdr: Vec<(String, &str, Vec<usize>, usize)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), *d, s.clone(), b.len()))
        .collect();
    let mut out = model::checkpoint::safetensors::header_bytes(&hdr, metadata);
    for t in tensors {
        out.extend_from_slice(&t.3);
    }
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
}

/// f32 tensor bytes.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// i64 tensor bytes.
pub fn i64_bytes(v: impl Iterator<Item = i64>) -> Vec<u8> {
    v.flat_map(|x| x.to_le_bytes()).collect()
}

fn progress(frames: u64, what: &str) -> indicatif::ProgressBar {
    let pb = if frames >= 250 {
        indicatif::ProgressBar::new(frames)
    } else {
        indicatif::ProgressBar::hidden()
    };
    if let Ok(style) = indicatif::ProgressStyle::with_template(&format!(
        "{what} {{bar:40}} {{pos}}/{{len}} frames ({{per_sec}}, eta {{eta}})"
    )) {
        pb.set_style(style);
    }
    pb
}

fn pool(threads: usize) -> Option<Pool> {
    (threads > 1).then(|| Pool::new(threads))
}

/// Runs `mimi encode` / `mimi decode`.
pub fn run(cmd: &MimiCmd) -> Result<()> {
    match cmd {
        MimiCmd::Encode {
            input,
            output,
            model,
        } => encode(input, output, model),
        MimiCmd::Decode {
            input,
            output,
            float,
            model,
        } => decode(
            input,
            output,
            model,
            if *float {
                WavFormat::F32
            } else {
                WavFormat::I16
            },
        ),
    }
}

fn encode(input: &Path, output: &Path, m: &MimiModelArgs) -> Result<()> {
    let wav = runtime::audio::read_wav(input).with_context(|| {
        format!(
            "cannot read {}\nhint: mimi encode takes a WAV file (8/16/24/32-bit PCM or 32-bit float, any rate, mono or stereo)",
            input.display()
        )
    })?;
    let src = wav.source;
    if src.sample_rate != 24_000 || src.channels != 1 {
        eprintln!(
            "{}: {src}, converted to 24000 Hz mono as duplex does",
            input.display()
        );
    }
    let pcm = wav.samples;
    let mimi = open_mimi(&m.dir()?, m.codebooks)?;
    let fs = mimi.frame_size();
    let nq = mimi.n_codebooks();
    let t = pcm.len().div_ceil(fs);
    let pool = pool(m.threads);
    let mut enc = MimiEncoder::new(mimi.clone());
    let mut codes = vec![0i64; nq * t];
    let mut frame = vec![0.0f32; fs];
    let pb = progress(t as u64, "encoding");
    for f in 0..t {
        let src = &pcm[f * fs..((f + 1) * fs).min(pcm.len())];
        frame[..src.len()].copy_from_slice(src);
        frame[src.len()..].fill(0.0);
        let c = enc.encode_frame_with(&frame, pool.as_ref(), None)?;
        for q in 0..nq {
            codes[q * t + f] = c[q] as i64;
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    let mut meta = BTreeMap::new();
    meta.insert("format".to_string(), "moshi-native-mimi-codes".to_string());
    meta.insert(
        "sample_rate".to_string(),
        mimi.config().sample_rate.to_string(),
    );
    meta.insert("frame_size".to_string(), fs.to_string());
    write_safetensors(
        output,
        &[
            (
                "codes".into(),
                "I64",
                vec![nq, t],
                i64_bytes(codes.into_iter()),
            ),
            (
                "num_samples".into(),
                "I64",
                vec![1],
                i64_bytes(std::iter::once(pcm.len() as i64)),
            ),
        ],
        Some(&meta),
    )?;
    eprintln!(
        "{}: {} x {} -> {}",
        input.display(),
        count(t, "frame"),
        count(nq, "codebook"),
        output.display()
    );
    Ok(())
}

/// Reads `codes` (i64 [n_q, T]) and the optional `num_samples` from a `.codes` file.
pub fn read_codes(path: &Path) -> Result<(Vec<u32>, usize, usize, Option<usize>)> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if bytes.starts_with(b"RIFF") || bytes.starts_with(b"RIFX") || bytes.starts_with(b"RF64") {
        bail!(
            "{} is a WAV file, not Mimi codes\nhint: `mimi encode IN.wav OUT.codes` turns audio into codes; `mimi decode` takes the .codes file it writes",
            path.display()
        );
    }
    let hdr = model::checkpoint::safetensors::parse(&bytes).map_err(|e| {
        anyhow!(
            "{} is not a .codes file ({e})\nhint: `mimi decode` takes the .codes file `mimi encode` writes",
            path.display()
        )
    })?;
    let find = |n: &str| hdr.tensors.iter().find(|t| t.name == n);
    let ct = find("codes").ok_or_else(|| anyhow!("{}: no `codes` tensor", path.display()))?;
    if !ct.dtype.name().eq_ignore_ascii_case("i64") || ct.shape.len() != 2 {
        bail!(
            "{}: `codes` must be i64 [n_codebooks, T], found {} {:?}",
            path.display(),
            ct.dtype.name(),
            ct.shape
        );
    }
    let (nq, t) = (ct.shape[0], ct.shape[1]);
    let data = &bytes[ct.offset..ct.offset + ct.len];
    let mut codes = Vec::with_capacity(nq * t);
    for c in data.chunks_exact(8) {
        let v = i64::from_le_bytes(c.try_into().expect("8 bytes"));
        if v < 0 || v > u32::MAX as i64 {
            bail!("{}: code {v} out of range", path.display());
        }
        codes.push(v as u32);
    }
    let ns = match find("num_samples") {
        Some(t) if t.dtype.name().eq_ignore_ascii_case("i64") && t.len == 8 => Some(
            i64::from_le_bytes(bytes[t.offset..t.offset + 8].try_into().expect("8 bytes")).max(0)
                as usize,
        ),
        _ => None,
    };
    Ok((codes, nq, t, ns))
}

fn decode(input: &Path, output: &Path, m: &MimiModelArgs, format: WavFormat) -> Result<()> {
    let (codes, nq, t, ns) = read_codes(input)?;
    let mimi = open_mimi(&m.dir()?, nq)?;
    let fs = mimi.frame_size();
    let pool = pool(m.threads);
    let mut dec = MimiDecoder::new(mimi.clone());
    let mut pcm = vec![0.0f32; t * fs];
    let mut col = vec![0u32; nq];
    let pb = progress(t as u64, "decoding");
    for f in 0..t {
        for q in 0..nq {
            col[q] = codes[q * t + f];
        }
        dec.decode_frame_with(&col, &mut pcm[f * fs..(f + 1) * fs], pool.as_ref(), None)
            .with_context(|| format!("frame {f}"))?;
        pb.inc(1);
    }
    pb.finish_and_clear();
    if let Some(n) = ns {
        pcm.truncate(n.min(pcm.len()));
    }
    runtime::audio::write_wav_mono(output, &pcm, mimi.config().sample_rate as u32, format)
        .with_context(|| format!("cannot write {}", output.display()))?;
    eprintln!(
        "{}: {} -> {} ({})",
        input.display(),
        count(t, "frame"),
        output.display(),
        count(pcm.len(), "sample")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use testkit::compare::max_abs_diff;
    use testkit::TensorFile;

    use super::*;

    #[test]
    fn encode_decode_round_trip_matches_oracle_trace() {
        let fx = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/mimi");
        let dir = testkit::ScratchDir::new("mimi-codes");
        let cfg = format!(
            r#"{{"mimi_name": "{}", "mimi_config_name": "file://{}"}}"#,
            fx.join("mimi_hf.safetensors").display(),
            fx.join("mimi_hf_config.json").display()
        );
        std::fs::write(dir.join("config.json"), cfg).unwrap();
        let model = MimiModelArgs {
            model: ModelArgs {
                model_dir: Some(dir.to_path_buf()),
                ..Default::default()
            },
            codebooks: 8,
            threads: 1,
        };
        let codes_path = dir.join("x.codes");
        let wav_path = dir.join("x.wav");
        encode(&fx.join("input.wav"), &codes_path, &model).unwrap();
        decode(&codes_path, &wav_path, &model, WavFormat::F32).unwrap();
        let (codes, nq, t, ns) = read_codes(&codes_path).unwrap();
        let input = read_wav_24k_mono(&fx.join("input.wav")).unwrap();
        assert_eq!(
            (nq, t, ns),
            (8, input.len().div_ceil(1920), Some(input.len()))
        );
        // oracle streaming codes and PCM
        let trace = TensorFile::open(fx.join("trace.safetensors"));
        let want: Vec<u32> = trace.i64("codes").0.iter().map(|&c| c as u32).collect();
        assert_eq!(codes, want);
        let (want_pcm, _) = trace.f32("pcm");
        let got = read_wav_24k_mono(&wav_path).unwrap();
        assert_eq!(got.len(), input.len());
        let err = max_abs_diff(&got, &want_pcm[..got.len()]);
        assert!(err < 1e-4, "round-trip pcm {err}");
    }
}
