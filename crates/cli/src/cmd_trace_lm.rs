//! `moshi-native trace lm`: run the LM generator on recorded user codes and dump every
//! intermediate the oracle dumps, for parity checks against Kyutai's Python `LMGen`.
//!
//! ```text
//! moshi-native trace lm --model-dir DIR --user-codes CODES.safetensors --out OUT.safetensors
//!                       [--steps N] [--greedy | --seed S] [--kv-dtype f32|bf16] [--threads T]
//! ```
//!
//! `CODES.safetensors` holds `codes` (i64 `[8, T]`): the user stream, one column per `LMGen` call.
//! The output holds, per step: `input_tokens` (i64 `[S, 17]`), `text_logits` (f32
//! `[S, text_card]`), `depformer_logits` (f32 `[S, 8, card]`), `transformer_out` (f32 `[S, dim]`),
//! and what the generator returned: `out_text` (i64 `[S']`), `out_audio` (i64 `[8, S']`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use kernels::Pool;
use model::checkpoint::Bundle;
use model::lm::{Generator, KvDtype, LmModel, LmRecorder, StepOptions};
use model::sampling::{Sampler, SamplerConfig};

use crate::common::DeviceArgs;

/// Flags of `moshi-native trace lm`.
#[derive(Args, Debug, Clone)]
pub struct TraceLmArgs {
    /// Bundle directory (config.json + LM weights; any supported weight format).
    #[arg(long, value_name = "DIR")]
    pub model_dir: PathBuf,
    /// safetensors file with `codes` (i64 [8, T]): the user stream, one column per call.
    #[arg(long, value_name = "CODES.safetensors")]
    pub user_codes: PathBuf,
    /// Output safetensors file.
    #[arg(long, value_name = "OUT.safetensors")]
    pub out: PathBuf,
    /// Number of calls (default: every column of the codes).
    #[arg(long)]
    pub steps: Option<usize>,
    /// Argmax for text and audio (the default).
    #[arg(long, conflicts_with = "seed")]
    pub greedy: bool,
    /// Sample with Python LMGen's defaults (text 0.7/25, audio 0.8/250) from this seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Storage of the temporal KV cache: f32 (parity) or bf16.
    #[arg(long, default_value = "f32")]
    pub kv_dtype: String,
    /// Threads for the matrix products.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Where the LM runs.
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// One tensor read from a safetensors file.
struct RawTensor {
    dtype: String,
    shape: Vec<usize>,
    data: Vec<u8>,
}

/// Minimal safetensors reader (header JSON + raw little-endian data).
fn read_safetensors(path: &Path) -> Result<BTreeMap<String, RawTensor>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let bad = || anyhow!("{}: not a safetensors file", path.display());
    let n = u64::from_le_bytes(bytes.get(..8).ok_or_else(bad)?.try_into()?) as usize;
    let header = bytes
        .get(8..8usize.checked_add(n).ok_or_else(bad)?)
        .ok_or_else(bad)?;
    let header: serde_json::Value = serde_json::from_slice(header).map_err(|_| bad())?;
    let data = &bytes[8 + n..];
    let mut out = BTreeMap::new();
    for (name, v) in header.as_object().ok_or_else(bad)? {
        if name == "__metadata__" {
            continue;
        }
        let dtype = v["dtype"].as_str().ok_or_else(bad)?.to_string();
        let shape = v["shape"]
            .as_array()
            .ok_or_else(bad)?
            .iter()
            .map(|d| d.as_u64().map(|d| d as usize).ok_or_else(bad))
            .collect::<Result<Vec<_>>>()?;
        let offs = v["data_offsets"].as_array().ok_or_else(bad)?;
        let (a, b) = (
            offs.first().and_then(|x| x.as_u64()).ok_or_else(bad)? as usize,
            offs.get(1).and_then(|x| x.as_u64()).ok_or_else(bad)? as usize,
        );
        let slice = data.get(a..b).ok_or_else(bad)?;
        out.insert(
            name.clone(),
            RawTensor {
                dtype,
                shape,
                data: slice.to_vec(),
            },
        );
    }
    Ok(out)
}

/// A tensor to write.
enum OutTensor {
    F32(Vec<usize>, Vec<f32>),
    I64(Vec<usize>, Vec<i64>),
}

/// Writes the trace through the CLI's one safetensors writer (tensors in name order).
fn write_safetensors(
    path: &Path,
    tensors: &BTreeMap<&str, OutTensor>,
    meta: &BTreeMap<&str, String>,
) -> Result<()> {
    use crate::cmd_mimi::{f32_bytes, i64_bytes};
    let out: Vec<crate::cmd_mimi::OutTensor> = tensors
        .iter()
        .map(|(name, t)| match t {
            OutTensor::F32(s, v) => (name.to_string(), "F32", s.clone(), f32_bytes(v)),
            OutTensor::I64(s, v) => (
                name.to_string(),
                "I64",
                s.clone(),
                i64_bytes(v.iter().copied()),
            ),
        })
        .collect();
    let meta: BTreeMap<String, String> = meta
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    crate::cmd_mimi::write_safetensors(path, &out, Some(&meta))
}

/// Runs `trace lm`.
pub fn run(args: &TraceLmArgs) -> Result<()> {
    let bundle = Bundle::open(&args.model_dir)
        .with_context(|| format!("opening bundle {}", args.model_dir.display()))?;
    let cfg = bundle.config.lm.clone();
    let weights = bundle.lm_weights()?;
    let model = LmModel::load(&weights, &cfg)?;
    let spec = model.spec().clone();

    let codes_file = read_safetensors(&args.user_codes)?;
    let codes = codes_file
        .get("codes")
        .ok_or_else(|| anyhow!("{}: no tensor `codes`", args.user_codes.display()))?;
    if codes.dtype != "I64" || codes.shape.len() != 2 || codes.shape[0] < spec.n_user() {
        bail!(
            "`codes` must be i64 [{}, T], got {} {:?}",
            spec.n_user(),
            codes.dtype,
            codes.shape
        );
    }
    let t_total = codes.shape[1];
    let codes: Vec<i64> = codes
        .data
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    let steps = args.steps.unwrap_or(t_total);
    if steps > t_total {
        bail!("--steps {steps} but the codes have only {t_total} columns");
    }
    let kv = match args.kv_dtype.as_str() {
        "f32" => KvDtype::F32,
        "bf16" => KvDtype::Bf16,
        o => bail!("unknown --kv-dtype `{o}` (f32, bf16)"),
    };
    let sampler_cfg = match args.seed {
        Some(s) if !args.greedy => SamplerConfig::seeded(s),
        _ => SamplerConfig::greedy(),
    };
    let mut sampler = Sampler::new(sampler_cfg, spec.text_card, spec.card)?;
    // One row of the LM on the chosen device, whichever it is (`runtime::lm_backend`).
    let threads = args.threads.max(1);
    let device = args.device.resolve(threads)?;
    let model = std::sync::Arc::new(model);
    let backend = runtime::lm_backend(
        device,
        &model,
        1,
        kv,
        std::sync::Arc::new(Pool::new(threads)),
    )?;
    eprintln!("trace lm: the LM runs on the {}", device.name());
    let mut gen = Generator::new(backend)?;
    let mut rec = LmRecorder::default();
    let n_user = spec.n_user();
    let mut user = vec![0i64; n_user];
    for t in 0..steps {
        for (k, u) in user.iter_mut().enumerate() {
            *u = codes[k * t_total + t];
        }
        let opts = StepOptions::default();
        let frame = gen.step_raw(
            0,
            &user,
            std::slice::from_mut(&mut sampler),
            &opts,
            &mut rec,
        );
        if let Some(frame) = frame.with_context(|| format!("step {t}"))? {
            rec.record_frame(&frame);
        }
    }

    let frames = rec.out_text.len();
    let dq = spec.dep_q;
    let out_audio: Vec<i64> = (0..dq)
        .flat_map(|k| (0..frames).map(move |f| (k, f)))
        .map(|(k, f)| rec.out_audio[f * dq + k])
        .collect();
    let mut tensors = BTreeMap::new();
    tensors.insert(
        "input_tokens",
        OutTensor::I64(vec![steps, spec.num_streams()], rec.input_tokens),
    );
    tensors.insert(
        "text_logits",
        OutTensor::F32(vec![steps, spec.text_card], rec.text_logits),
    );
    tensors.insert(
        "depformer_logits",
        OutTensor::F32(vec![steps, dq, spec.card], rec.depformer_logits),
    );
    tensors.insert(
        "transformer_out",
        OutTensor::F32(vec![steps, spec.dim], rec.transformer_out),
    );
    tensors.insert("out_text", OutTensor::I64(vec![frames], rec.out_text));
    tensors.insert("out_audio", OutTensor::I64(vec![dq, frames], out_audio));
    let mut meta = BTreeMap::new();
    meta.insert("steps", steps.to_string());
    meta.insert(
        "sampling",
        match args.seed {
            Some(s) if !args.greedy => format!("seed {s}"),
            _ => "greedy".into(),
        },
    );
    meta.insert("kv_dtype", args.kv_dtype.clone());
    meta.insert("weights", weights.path().display().to_string());
    write_safetensors(&args.out, &tensors, &meta)?;
    eprintln!(
        "trace lm: {steps} steps, {frames} frames -> {}",
        args.out.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use testkit::compare::max_abs_diff;
    use testkit::ScratchDir;

    use super::*;

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/lm")
    }

    fn args(out: &Path, seed: Option<u64>) -> TraceLmArgs {
        TraceLmArgs {
            model_dir: fixtures(),
            user_codes: fixtures().join("CODES.safetensors"),
            out: out.to_path_buf(),
            steps: None,
            greedy: seed.is_none(),
            seed,
            kv_dtype: "f32".into(),
            threads: 2,
            device: DeviceArgs::default(),
        }
    }

    fn f32s(t: &RawTensor) -> Vec<f32> {
        t.data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    /// Asserts that two LM traces agree: the same shapes, tokens and codes identical, logits and
    /// transformer outputs within 1e-4 (`what` names the comparison in the failure messages).
    fn assert_traces_agree(
        ours: &BTreeMap<String, RawTensor>,
        theirs: &BTreeMap<String, RawTensor>,
        what: &str,
    ) {
        for name in ["input_tokens", "out_text", "out_audio"] {
            assert_eq!(ours[name].shape, theirs[name].shape, "{what} {name}");
            assert_eq!(ours[name].data, theirs[name].data, "{what} {name}");
        }
        for name in ["text_logits", "depformer_logits", "transformer_out"] {
            assert_eq!(ours[name].shape, theirs[name].shape, "{what} {name}");
            let d = max_abs_diff(&f32s(&ours[name]), &f32s(&theirs[name]));
            assert!(d < 1e-4, "{what} {name}: max diff {d}");
        }
    }

    #[test]
    fn greedy_trace_matches_oracle_fixture() {
        let dir = ScratchDir::new("trace-lm-greedy");
        let out = dir.join("greedy.safetensors");
        run(&args(&out, None)).unwrap();
        let ours = read_safetensors(&out).unwrap();
        let theirs = read_safetensors(&fixtures().join("trace.safetensors")).unwrap();
        assert_traces_agree(&ours, &theirs, "oracle");
    }

    /// `--device gpu` writes the CPU's file: the same tensors, tokens identical, floats within
    /// 1e-4 (any adapter: lavapipe here; skipped without one unless `MOSHI_REQUIRE_GPU=1`).
    #[test]
    fn gpu_trace_matches_cpu_trace() {
        if gpu::skip_test_without_adapter() {
            return;
        }
        let dir = ScratchDir::new("trace-lm-gpu");
        for seed in [None, Some(77)] {
            let (c, g) = (dir.join("cpu.safetensors"), dir.join("gpu.safetensors"));
            run(&args(&c, seed)).unwrap();
            run(&TraceLmArgs {
                device: DeviceArgs::gpu(),
                ..args(&g, seed)
            })
            .unwrap();
            let (tc, tg) = (read_safetensors(&c).unwrap(), read_safetensors(&g).unwrap());
            assert_eq!(tc.keys().collect::<Vec<_>>(), tg.keys().collect::<Vec<_>>());
            assert_traces_agree(&tg, &tc, &format!("gpu vs cpu, seed {seed:?}"));
        }
    }

    /// The device reaches the LM: a GPU adapter that does not exist fails the trace (it never falls back
    /// to the CPU), on any machine.
    #[test]
    fn a_missing_adapter_fails_the_trace() {
        let dir = ScratchDir::new("trace-lm-no-adapter");
        let e = run(&TraceLmArgs {
            device: DeviceArgs {
                device: Some(crate::common::DeviceArg::Gpu),
                gpu: Some(4095),
            },
            ..args(&dir.join("t.safetensors"), None)
        })
        .expect_err("adapter 4095 does not exist");
        assert!(format!("{e:#}").contains("adapter 4095"), "{e:#}");
    }

    #[test]
    fn seeded_trace_is_reproducible() {
        let dir = ScratchDir::new("trace-lm-seeded");
        let (a, b, c) = (
            dir.join("s1.safetensors"),
            dir.join("s2.safetensors"),
            dir.join("s3.safetensors"),
        );
        run(&args(&a, Some(1234))).unwrap();
        run(&args(&b, Some(1234))).unwrap();
        run(&args(&c, Some(4321))).unwrap();
        let (ra, rb, rc) = (
            std::fs::read(&a).unwrap(),
            std::fs::read(&b).unwrap(),
            std::fs::read(&c).unwrap(),
        );
        assert_eq!(ra, rb, "same seed, same bytes");
        assert_ne!(ra, rc, "different seed, different run");
        let (ta, tc) = (read_safetensors(&a).unwrap(), read_safetensors(&c).unwrap());
        assert_ne!(ta["out_audio"].data, tc["out_audio"].data, "seed matters");
    }
}
