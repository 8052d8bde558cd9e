//! `moshi-native trace mimi --model-dir DIR --input IN.wav --out OUT.safetensors`: streaming
//! Mimi encode then decode with every intermediate dumped, for external parity checks.
//!
//! The input (24 kHz mono, 16-bit PCM or 32-bit float WAV) is right-padded with zeros to a
//! multiple of the frame size and encoded frame by frame; the codes are then decoded frame by
//! frame by a fresh decoder. Output tensors (channel-major `[C, time]`):
//! `codes` i64 `[n_codebooks, T]`, `pcm` f32 `[T * frame_size]`, `enc_seanet` `[C, 2T]`,
//! `enc_transformer` `[C, 2T]`, `latent` `[C, T]`, `dec_latent` `[C, T]`,
//! `dec_upsample` `[C, 2T]`, `dec_transformer` `[C, 2T]` (2 = encoder steps per frame).
//!
//! With `--device gpu` (`--gpu N`) the codec runs on the adapter ([`gpu::GpuMimi`]) and the file
//! holds the same tensors: the intermediates are read back from device memory at each stage
//! ([`gpu::GpuMimi::encode_frame_traced`]).

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use clap::Args;
use model::mimi::{MimiDecoder, MimiEncoder, Stage};

use crate::cmd_mimi::{
    f32_bytes, i64_bytes, open_mimi, read_wav_24k_mono, write_safetensors, OutTensor,
};
use crate::common::DeviceArgs;

/// The files of `trace mimi` and `trace duplex`.
#[derive(Args, Debug, Clone)]
pub struct TraceFiles {
    /// Bundle directory: `config.json` naming the weights (`trace mimi` reads only `mimi_name` and
    /// the optional `mimi_config_name`).
    #[arg(long, value_name = "DIR")]
    pub model_dir: PathBuf,
    /// Input WAV, 24 kHz mono, 16-bit PCM or 32-bit float.
    #[arg(long, value_name = "IN.wav")]
    pub input: PathBuf,
    /// Output safetensors file.
    #[arg(long, value_name = "OUT.safetensors")]
    pub out: PathBuf,
}

/// Flags of `moshi-native trace mimi`.
#[derive(Args, Debug, Clone)]
pub struct TraceMimiArgs {
    /// Bundle, input and output.
    #[command(flatten)]
    pub files: TraceFiles,
    /// Number of codebooks.
    #[arg(long, default_value_t = 8)]
    pub codebooks: usize,
    /// Where the codec runs.
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// Per-stage accumulation of `[C, t]` chunks into `[C, total]`.
struct Acc {
    chunks: Vec<Vec<Vec<f32>>>,
}

impl Acc {
    fn push(&mut self, s: Stage, x: &[f32]) {
        if let Some(i) = Stage::ALL.iter().position(|&st| st == s) {
            self.chunks[i].push(x.to_vec());
        }
    }

    fn join(&self, i: usize, c: usize) -> (Vec<f32>, usize) {
        let total: usize = self.chunks[i].iter().map(|p| p.len() / c).sum();
        let mut out = vec![0.0; c * total];
        let mut t0 = 0;
        for p in &self.chunks[i] {
            let t = p.len() / c;
            for ch in 0..c {
                out[ch * total + t0..ch * total + t0 + t].copy_from_slice(&p[ch * t..(ch + 1) * t]);
            }
            t0 += t;
        }
        (out, total)
    }
}

/// Runs `trace mimi`.
pub fn run(args: &TraceMimiArgs) -> Result<()> {
    let f = &args.files;
    let gpu = match args.device.resolve(1)? {
        runtime::Device::Cpu { .. } => None,
        runtime::Device::Gpu { adapter, .. } => Some(adapter),
    };
    trace_on(&f.model_dir, &f.input, &f.out, args.codebooks, gpu)
}

/// The streaming codec a trace runs: the CPU's encoder and decoder, or the device's.
enum Codec {
    Cpu(Box<(MimiEncoder, MimiDecoder)>),
    Gpu(Box<gpu::GpuMimi>),
}

impl Codec {
    fn encode(&mut self, pcm: &[f32], cb: &mut dyn FnMut(Stage, &[f32])) -> Result<&[u32]> {
        Ok(match self {
            Codec::Cpu(c) => c.0.encode_frame_with(pcm, None, Some(cb))?,
            Codec::Gpu(g) => g.encode_frame_traced(pcm, cb)?,
        })
    }

    fn decode(
        &mut self,
        codes: &[u32],
        out: &mut [f32],
        cb: &mut dyn FnMut(Stage, &[f32]),
    ) -> Result<()> {
        match self {
            Codec::Cpu(c) => c.1.decode_frame_with(codes, out, None, Some(cb))?,
            Codec::Gpu(g) => g.decode_frame_traced(codes, out, cb)?,
        }
        Ok(())
    }
}

/// The trace itself (also callable from tests), on the CPU (`gpu` = `None`) or on GPU adapter `gpu` (`Some(None)`: the best
/// adapter of any type). The decoder starts fresh either way (a [`gpu::GpuMimi`] keeps its
/// encoder and decoder streams apart).
pub fn trace_on(
    model_dir: &Path,
    input: &Path,
    out: &Path,
    codebooks: usize,
    gpu: Option<Option<usize>>,
) -> Result<()> {
    let pcm = read_wav_24k_mono(input)?;
    if pcm.is_empty() {
        bail!("{}: no samples", input.display());
    }
    let mimi = open_mimi(model_dir, codebooks)?;
    let mut codec = match gpu {
        None => Codec::Cpu(Box::new((
            MimiEncoder::new(mimi.clone()),
            MimiDecoder::new(mimi.clone()),
        ))),
        Some(adapter) => {
            let ctx =
                gpu::GpuContext::new(gpu::AdapterChoice::Gpu(adapter), gpu::GpuOptions::default())?;
            eprintln!("trace mimi: the codec runs on {}", ctx.adapter());
            let w = gpu::GpuMimiWeights::upload(&ctx, mimi.clone())?;
            Codec::Gpu(Box::new(gpu::GpuMimi::new(w, 1)?))
        }
    };
    let fs = mimi.frame_size();
    let nq = mimi.n_codebooks();
    let d = mimi.dimension();
    let t = pcm.len().div_ceil(fs);
    let mut padded = pcm;
    padded.resize(t * fs, 0.0);
    let mut acc = Acc {
        chunks: vec![Vec::new(); Stage::ALL.len()],
    };
    let mut codes = vec![0u32; nq * t];
    for f in 0..t {
        let mut cb = |s: Stage, x: &[f32]| acc.push(s, x);
        let c = codec.encode(&padded[f * fs..(f + 1) * fs], &mut cb)?;
        for q in 0..nq {
            codes[q * t + f] = c[q];
        }
    }
    let mut out_pcm = vec![0.0f32; t * fs];
    let mut col = vec![0u32; nq];
    for f in 0..t {
        for q in 0..nq {
            col[q] = codes[q * t + f];
        }
        let mut cb = |s: Stage, x: &[f32]| acc.push(s, x);
        codec.decode(&col, &mut out_pcm[f * fs..(f + 1) * fs], &mut cb)?;
    }
    let mut tensors: Vec<OutTensor> = vec![
        (
            "codes".into(),
            "I64",
            vec![nq, t],
            i64_bytes(codes.iter().map(|&c| c as i64)),
        ),
        ("pcm".into(), "F32", vec![t * fs], f32_bytes(&out_pcm)),
    ];
    for (i, name) in Stage::ALL.map(Stage::name).iter().enumerate() {
        let (v, total) = acc.join(i, d);
        tensors.push((name.to_string(), "F32", vec![d, total], f32_bytes(&v)));
    }
    write_safetensors(out, &tensors, None)?;
    eprintln!(
        "trace mimi: {t} frames, {nq} codebooks -> {}",
        out.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use testkit::compare::max_abs_diff;
    use testkit::TensorFile;

    use super::*;

    /// `--device gpu` writes the CPU's file: the same tensors and shapes, codes identical, every
    /// float within 1e-4 (any adapter: lavapipe here; skipped without one unless
    /// `MOSHI_REQUIRE_GPU=1`).
    #[test]
    fn gpu_trace_matches_cpu_trace() {
        if gpu::skip_test_without_adapter() {
            return;
        }
        let (dir, fx) = testkit::mimi_bundle("gpu");
        let (c, g) = (dir.join("cpu.safetensors"), dir.join("gpu.safetensors"));
        trace_on(&dir, &fx.join("input.wav"), &c, 8, None).unwrap();
        run(&TraceMimiArgs {
            files: TraceFiles {
                model_dir: dir.to_path_buf(),
                input: fx.join("input.wav"),
                out: g.clone(),
            },
            codebooks: 8,
            device: DeviceArgs::gpu(),
        })
        .unwrap();
        let (tc, tg) = (TensorFile::open(&c), TensorFile::open(&g));
        let (mut nc, mut ng) = (tc.names(), tg.names());
        nc.sort();
        ng.sort();
        assert_eq!(ng, nc, "tensor names");
        let (cc, cshape) = tc.i64("codes");
        let (gc, gshape) = tg.i64("codes");
        assert_eq!(gshape, cshape);
        assert_eq!(gc, cc, "GPU codes differ from the CPU's");
        for name in ["pcm"].into_iter().chain(Stage::ALL.map(Stage::name)) {
            let ((gv, gs), (cv, cs)) = (tg.f32(name), tc.f32(name));
            assert_eq!(gs, cs, "{name}");
            let err = max_abs_diff(&gv, &cv);
            eprintln!("{name}: GPU vs CPU max abs diff {err:e}");
            assert!(err < 1e-4, "{name}: {err}");
        }
    }

    #[test]
    fn trace_matches_oracle_fixture() {
        let (dir, fx) = testkit::mimi_bundle("cpu");
        let out = dir.join("trace.safetensors");
        trace_on(&dir, &fx.join("input.wav"), &out, 8, None).unwrap();
        let got = TensorFile::open(&out);
        let want = TensorFile::open(fx.join("trace.safetensors"));
        assert_eq!(got.i64("codes"), want.i64("codes"));
        for name in ["pcm"].into_iter().chain(Stage::ALL.map(Stage::name)) {
            let (g, w) = (got.f32(name).0, want.f32(name).0);
            assert_eq!(g.len(), w.len(), "{name}");
            let err = max_abs_diff(&g, &w);
            assert!(err < 1e-4, "{name}: {err}");
        }
        // refusals: stereo / wrong rate
        let bad = dir.join("bad.wav");
        // `samples` silent 16-bit samples at `channels` × `sample_rate` into `bad`.
        let silence = |channels, sample_rate, samples| {
            let spec = hound::WavSpec {
                channels,
                sample_rate,
                bits_per_sample: 16,
                sample_format: hound::SampleFormat::Int,
            };
            let mut w = hound::WavWriter::create(&bad, spec).unwrap();
            for _ in 0..samples {
                w.write_sample(0i16).unwrap();
            }
            w.finalize().unwrap();
        };
        silence(2, 24000, 100);
        assert!(trace_on(&dir, &bad, &out, 8, None).is_err());
        silence(1, 16000, 1);
        assert!(trace_on(&dir, &bad, &out, 8, None).is_err());
    }
}
