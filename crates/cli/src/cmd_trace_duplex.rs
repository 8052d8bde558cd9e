//! `moshi-native trace duplex`: run the full-duplex frame loop exactly as Kyutai's Python server drives it
//! (`moshi/server.py`, moshi 0.2.13: 1920-sample frames, first frame encoded then Mimi reset, its codes passed to
//! LMGen call 0, every LM output decoded) on a WAV file, and dump what it produced for parity checks.
//!
//! ```text
//! moshi-native trace duplex --model-dir DIR --input IN.wav --out OUT.safetensors
//!                           [--greedy | --seed S] [--chunk N] [--threads T] [--kv-dtype f32|bf16]
//! ```
//!
//! `IN.wav` must be 24 kHz mono (16-bit PCM or 32-bit float); a trailing partial frame is dropped, as the
//! server does. The output holds `text_tokens` (i64 `[S']`, the text token of every LM output step, PAD and
//! EPAD included), `audio_tokens` (i64 `[8, S']`) and `pcm` (f32 `[S' · 1920]`, the decoded output), where
//! S' = frames − 1 (LMGen returns nothing at call 0). Compare with the oracle's `fixtures/duplex/trace.safetensors`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use clap::Args;
use model::sampling::SamplerConfig;
use runtime::{Engine, EngineOptions, Session, SessionOptions, Step, FRAME_SIZE, N_AUDIO};

use crate::cmd_trace_mimi::TraceFiles;
use crate::common::DeviceArgs;

/// Flags of `moshi-native trace duplex`.
#[derive(Args, Debug, Clone)]
pub struct TraceDuplexArgs {
    /// Bundle (config.json + LM + Mimi weights + tokenizer), input and output.
    #[command(flatten)]
    pub files: TraceFiles,
    /// Argmax for text and audio (the default).
    #[arg(long, conflicts_with = "seed")]
    pub greedy: bool,
    /// Sample with Python LMGen's defaults (text 0.7/25, audio 0.8/250) from this seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Size of the input chunks pushed into the session (any size; the session frames them).
    #[arg(long, default_value_t = FRAME_SIZE)]
    pub chunk: usize,
    /// Threads for the matrix products.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Storage of the temporal KV cache: f32 (parity) or bf16.
    #[arg(long, default_value = "f32")]
    pub kv_dtype: String,
    /// Where the LM runs (Mimi stays on the CPU).
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// What the server-style loop produced.
#[derive(Debug, Clone, PartialEq)]
pub struct DuplexTrace {
    /// Text token of every LM output step.
    pub text_tokens: Vec<i64>,
    /// Audio tokens, `[8, S']` row-major (codebook-major).
    pub audio_tokens: Vec<i64>,
    /// Decoded output PCM, 24 kHz.
    pub pcm: Vec<f32>,
    /// Whole input frames fed (LM calls).
    pub frames_in: usize,
}

/// Run the server loop over `input` (24 kHz mono), pushing it in `chunk`-sample pieces.
pub fn trace(
    engine: std::sync::Arc<Engine>,
    sampling: SamplerConfig,
    input: &[f32],
    chunk: usize,
) -> Result<DuplexTrace> {
    if chunk == 0 {
        bail!("--chunk must be at least 1");
    }
    let frames = input.len() / FRAME_SIZE;
    // A queue that holds the whole input: the trace must never drop a frame.
    let opts = SessionOptions {
        sampling,
        max_queued_frames: frames.max(1) + 1,
        ..SessionOptions::default()
    };
    let mut s = Session::new(engine, opts).context("cannot create a session")?;
    let (mut text, mut audio, mut pcm, mut calls) = (Vec::new(), Vec::new(), Vec::new(), 0usize);
    for piece in input.chunks(chunk) {
        s.push_pcm(piece)?;
        loop {
            match s.step().context("frame pass failed")? {
                Step::Frame(f) => {
                    calls += 1;
                    if let (Some(t), Some(a)) = (f.text_token, f.audio_tokens) {
                        text.push(i64::from(t));
                        audio.push(a);
                        pcm.extend_from_slice(&f.pcm);
                    }
                }
                Step::Idle => break,
                other => bail!("unexpected session state {other:?}"),
            }
        }
    }
    let k = s.counters();
    if k.frames_dropped != 0 || calls != frames {
        bail!(
            "internal: {calls} LM calls for {frames} input frames ({} dropped)",
            k.frames_dropped
        );
    }
    let n = text.len();
    let mut audio_tokens = vec![0i64; N_AUDIO * n];
    for (t, frame) in audio.iter().enumerate() {
        for (cb, &code) in frame.iter().enumerate() {
            audio_tokens[cb * n + t] = i64::from(code);
        }
    }
    Ok(DuplexTrace {
        text_tokens: text,
        audio_tokens,
        pcm,
        frames_in: frames,
    })
}

/// A tensor to write.
enum Data<'a> {
    I64(&'a [i64]),
    F32(&'a [f32]),
}

/// Writes the trace through the CLI's one safetensors writer.
fn write_safetensors(
    path: &Path,
    tensors: &[(&str, Vec<usize>, Data<'_>)],
    meta: &BTreeMap<String, String>,
) -> Result<()> {
    use crate::cmd_mimi::{f32_bytes, i64_bytes};
    let out: Vec<crate::cmd_mimi::OutTensor> = tensors
        .iter()
        .map(|(name, shape, d)| match d {
            Data::I64(v) => (
                name.to_string(),
                "I64",
                shape.clone(),
                i64_bytes(v.iter().copied()),
            ),
            Data::F32(v) => (name.to_string(), "F32", shape.clone(), f32_bytes(v)),
        })
        .collect();
    crate::cmd_mimi::write_safetensors(path, &out, Some(meta))
}

/// `moshi-native trace duplex`.
pub fn run(args: &TraceDuplexArgs) -> Result<()> {
    let kv_dtype = match args.kv_dtype.as_str() {
        "f32" => model::lm::KvDtype::F32,
        "bf16" => model::lm::KvDtype::Bf16,
        other => bail!("--kv-dtype must be f32 or bf16 (got {other})"),
    };
    if args.threads == 0 {
        bail!("--threads must be at least 1");
    }
    let engine = Engine::open(
        &args.files.model_dir,
        EngineOptions {
            device: args.device.resolve(args.threads)?,
            kv_dtype,
        },
    )
    .with_context(|| {
        format!(
            "cannot open the model bundle {}",
            args.files.model_dir.display()
        )
    })?;
    let input = runtime::audio::read_wav_strict(&args.files.input)
        .with_context(|| format!("cannot read {}", args.files.input.display()))?;
    let sampling = match args.seed {
        Some(seed) => SamplerConfig::seeded(seed),
        None => SamplerConfig::greedy(),
    };
    let t = trace(engine, sampling, &input, args.chunk)?;
    let n = t.text_tokens.len();
    let mut meta = BTreeMap::new();
    meta.insert(
        "producer".to_string(),
        format!("moshi-native {} trace duplex", env!("CARGO_PKG_VERSION")),
    );
    meta.insert("frames_in".to_string(), t.frames_in.to_string());
    meta.insert(
        "dropped_tail_samples".to_string(),
        (input.len() % FRAME_SIZE).to_string(),
    );
    meta.insert(
        "sampling".to_string(),
        args.seed
            .map_or("greedy".to_string(), |s| format!("seed {s}")),
    );
    write_safetensors(
        &args.files.out,
        &[
            ("text_tokens", vec![n], Data::I64(&t.text_tokens)),
            ("audio_tokens", vec![N_AUDIO, n], Data::I64(&t.audio_tokens)),
            ("pcm", vec![t.pcm.len()], Data::F32(&t.pcm)),
        ],
        &meta,
    )?;
    eprintln!(
        "{} frames in, {n} LM outputs, {} samples out → {}",
        t.frames_in,
        t.pcm.len(),
        args.files.out.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use testkit::compare::max_abs_diff;
    use testkit::TensorFile;

    use super::*;

    fn root() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
    }

    #[test]
    fn trace_duplex_matches_the_python_server_emulation() {
        check_against_emulation(DeviceArgs::default());
    }

    /// The same file with the LM on the GPU (any adapter: lavapipe here); skipped without one
    /// unless `MOSHI_REQUIRE_GPU=1`.
    #[test]
    fn gpu_trace_duplex_matches_the_python_server_emulation() {
        if gpu::skip_test_without_adapter() {
            return;
        }
        check_against_emulation(DeviceArgs::gpu());
    }

    fn check_against_emulation(device: DeviceArgs) {
        let dir = testkit::ScratchDir::new(&format!("trace-duplex-{:?}", device.device));
        let out = dir.join("trace.safetensors");
        let args = TraceDuplexArgs {
            files: TraceFiles {
                model_dir: root().join("fixtures/lm"),
                input: root().join("fixtures/duplex/input.wav"),
                out: out.clone(),
            },
            greedy: true,
            seed: None,
            chunk: 1500,
            threads: 1,
            kv_dtype: "f32".into(),
            device,
        };
        run(&args).unwrap();
        let got = TensorFile::open(&out);
        let want = TensorFile::open(root().join("fixtures/duplex/trace.safetensors"));
        for name in ["text_tokens", "audio_tokens"] {
            assert_eq!(got.i64(name), want.i64(name), "{name} must match exactly");
        }
        let ((gp, gs), (wp, ws)) = (got.f32("pcm"), want.f32("pcm"));
        assert_eq!(gs, ws);
        let max_err = max_abs_diff(&gp, &wp);
        assert!(max_err <= 1e-4, "pcm max abs error {max_err}");
    }
}
