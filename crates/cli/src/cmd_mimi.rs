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
//! Input WAVs must be 24 kHz mono, 16-bit PCM or 32-bit float; output WAVs are 32-bit float.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use kernels::Pool;
use model::mimi::{Mimi, MimiDecoder, MimiEncoder};

/// Flags shared by the Mimi commands.
#[derive(Args, Debug, Clone)]
pub struct MimiModelArgs {
    /// Bundle directory: `config.json` naming `mimi_name` (and optionally
    /// `mimi_config_name`), or the released Mimi file name in the directory.
    #[arg(long, value_name = "DIR")]
    pub model_dir: PathBuf,
    /// Number of codebooks (Moshi uses 8).
    #[arg(long, default_value_t = 8)]
    pub codebooks: usize,
    /// Threads for the matrix products.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
}

/// `moshi-native mimi ...`
#[derive(Subcommand, Debug)]
pub enum MimiCmd {
    /// Encode a 24 kHz mono WAV into a `.codes` file.
    Encode {
        /// Input WAV (24 kHz mono, 16-bit PCM or 32-bit float).
        input: PathBuf,
        /// Output `.codes` (safetensors with `codes` i64 [n_codebooks, T]).
        output: PathBuf,
        #[command(flatten)]
        model: MimiModelArgs,
    },
    /// Decode a `.codes` file into a 24 kHz mono 32-bit float WAV.
    Decode {
        /// Input `.codes`.
        input: PathBuf,
        /// Output WAV.
        output: PathBuf,
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

/// Writes a 24 kHz mono 32-bit float WAV.
pub fn write_wav_f32(path: &Path, pcm: &[f32], sample_rate: u32) -> Result<()> {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate,
        bits_per_sample: 32,
        sample_format: hound::SampleFormat::Float,
    };
    let mut w = hound::WavWriter::create(path, spec)
        .with_context(|| format!("creating {}", path.display()))?;
    for &s in pcm {
        w.write_sample(s)?;
    }
    w.finalize()?;
    Ok(())
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
            model,
        } => decode(input, output, model),
    }
}

fn encode(input: &Path, output: &Path, m: &MimiModelArgs) -> Result<()> {
    let pcm = read_wav_24k_mono(input)?;
    let mimi = open_mimi(&m.model_dir, m.codebooks)?;
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
        "{}: {t} frames x {nq} codebooks -> {}",
        input.display(),
        output.display()
    );
    Ok(())
}

/// Reads `codes` (i64 [n_q, T]) and the optional `num_samples` from a `.codes` file.
pub fn read_codes(path: &Path) -> Result<(Vec<u32>, usize, usize, Option<usize>)> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let hdr = model::checkpoint::safetensors::parse(&bytes)
        .map_err(|e| anyhow!("{}: {e}", path.display()))?;
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

fn decode(input: &Path, output: &Path, m: &MimiModelArgs) -> Result<()> {
    let (codes, nq, t, ns) = read_codes(input)?;
    let mimi = open_mimi(&m.model_dir, nq)?;
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
    write_wav_f32(output, &pcm, mimi.config().sample_rate as u32)?;
    eprintln!(
        "{}: {t} frames -> {} ({} samples)",
        input.display(),
        output.display(),
        pcm.len()
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
            model_dir: dir.to_path_buf(),
            codebooks: 8,
            threads: 1,
        };
        let codes_path = dir.join("x.codes");
        let wav_path = dir.join("x.wav");
        encode(&fx.join("input.wav"), &codes_path, &model).unwrap();
        decode(&codes_path, &wav_path, &model).unwrap();
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
