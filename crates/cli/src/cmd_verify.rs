//! `moshi-native verify`: the first thing to run after `fetch`. Opens the bundle, checks its
//! schema inventory and the values of every tensor, runs full duplex on a short spoken clip
//! shipped with the binary and checks the answer, round-trips the clip through Mimi, and prints
//! one screen with a verdict per check. Exits non-zero when a check fails.
//!
//! Bundles with random weights (the demo model, `synth` bundles) get every check that does not
//! need a trained model; the speech checks are reported but marked "random weights".
//!
//! A speech-to-text bundle (`model_type` "stt": `--model demo-stt|stt-1b|stt-2.6b`, or a
//! `--model-dir` holding one) gets the same static checks, then the clip is transcribed instead
//! of answered (words, and the extra heads' voice-activity probabilities when it has them).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use model::checkpoint::Bundle;
use model::checkpoint::Weights;
use model::tensor_stats::{audit, AuditReport};
use model::text::{SentencePiece, EPAD_ID, PAD_ID};
use runtime::{Session, SessionOptions, Step, FRAME_SIZE, SAMPLE_RATE};

use crate::common::EngineArgs;
use crate::verify_report::{db, mimi_check, rms, Report, Verdict};

/// The bundled clip: espeak-ng 1.51, voice en-us, 150 words/min, saying "Hello Moshi. Can you
/// hear me? Tell me something about the weather today.", resampled to 24 kHz 16-bit mono with
/// sox and normalised to -3 dBFS.
const SPEECH_CLIP: &[u8] = include_bytes!("../assets/verify-speech.wav");
/// Silence appended after the clip so that Moshi has time to answer (seconds).
const ANSWER_SECONDS: f32 = 2.0;
/// Output quieter than this RMS (-60 dBFS) counts as silence.
const SILENCE_RMS: f64 = 1e-3;

/// Flags of `moshi-native verify`.
#[derive(Args, Debug, Clone)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Treat the weights as random (mark the speech checks instead of failing them). Automatic for
    /// the demo model and for bundles whose tokenizer is not a trained one (`synth` bundles).
    #[arg(long)]
    pub random_weights: bool,
    /// Speak this WAV to the model instead of the bundled clip.
    #[arg(long, value_name = "WAV")]
    pub clip: Option<PathBuf>,
}

/// Runs `verify`: prints the report, and fails when a check failed.
pub fn run(a: &VerifyArgs) -> Result<()> {
    let report = verify(a)?;
    report.print();
    let failed = report.failures();
    if !failed.is_empty() {
        let causes: Vec<String> = failed
            .iter()
            .map(|c| format!("{}: {}", c.name, c.detail))
            .collect();
        bail!("verify failed: {}", causes.join("; "));
    }
    Ok(())
}

/// Whether a tokenizer looks trained: a released Moshi tokenizer has tens of thousands of
/// pieces; `synth` bundles carry a generated one whose pieces are `▁w<number>`.
fn trained_tokenizer(tok: &SentencePiece) -> bool {
    let n = tok.vocab_size();
    let generated = (0..n as u32)
        .filter_map(|i| tok.id_to_piece(i))
        .filter(|p| {
            p.strip_prefix("\u{2581}w")
                .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
        })
        .count();
    n >= 1000 && generated * 2 < n
}

/// Builds the report; an error here means the model could not even be located.
pub fn verify(a: &VerifyArgs) -> Result<Report> {
    let (dir, demo) = match a.engine.model.model.as_deref() {
        Some(m) if crate::models::is_stt_name(m) => crate::models::resolve_stt(
            Some(m),
            None,
            a.engine.model.preset,
            &crate::models::hub_cache_dir(),
        )?,
        _ => a.engine.locate()?,
    };
    let mut r = Report {
        dir: dir.clone(),
        format: "?".into(),
        variant: "?".into(),
        random: demo || a.random_weights,
        ..Report::default()
    };
    let clip = match &a.clip {
        Some(p) => {
            runtime::audio::read_wav(p)
                .with_context(|| format!("cannot read --clip {}", p.display()))?
                .samples
        }
        None => {
            runtime::audio::read_wav_from(std::io::Cursor::new(SPEECH_CLIP))
                .context("the bundled speech clip")?
                .samples
        }
    };
    let Some(bundle) = static_checks(&mut r, &dir, demo) else {
        return Ok(r);
    };
    if bundle.config.stt.is_some() {
        crate::common::warn_threads(a.engine.threads(1));
        return Ok(crate::verify_stt::stt_checks(
            r,
            &bundle,
            &clip,
            a.engine.threads(1),
        ));
    }
    let t = Instant::now();
    let opened = match a.engine.open(1) {
        Ok(o) => o,
        Err(e) => {
            r.push("engine", Verdict::Fail, format!("{e:#}"));
            return Ok(r);
        }
    };
    r.load_s = Some(t.elapsed().as_secs_f64());
    r.push(
        "engine",
        Verdict::Pass,
        format!("loaded with {} thread(s)", a.engine.threads(1)),
    );
    if let Err(e) = duplex_checks(&mut r, &opened.engine, &clip) {
        r.push("full duplex", Verdict::Fail, format!("{e:#}"));
    }
    if let Err(e) = mimi_check(&mut r, opened.engine.mimi(), &clip) {
        r.push("Mimi round trip", Verdict::Fail, format!("{e:#}"));
    }
    Ok(r)
}

/// Bundle files, schema inventory and tensor statistics. Returns the bundle when the model can be
/// run.
fn static_checks(r: &mut Report, dir: &Path, demo: bool) -> Option<Bundle> {
    let bundle = match Bundle::open(dir) {
        Ok(b) => b,
        Err(e) => {
            r.push("bundle files", Verdict::Fail, e.to_string());
            return None;
        }
    };
    let tok = match SentencePiece::load(&bundle.files.tokenizer) {
        Ok(t) => t,
        Err(e) => {
            r.push(
                "bundle files",
                Verdict::Fail,
                format!("tokenizer {}: {e}", bundle.files.tokenizer.display()),
            );
            return None;
        }
    };
    let trained = trained_tokenizer(&tok);
    if !trained && !demo {
        r.random = true;
    }
    r.push(
        "bundle files",
        Verdict::Pass,
        format!(
            "config {}, tokenizer {} pieces{}",
            if bundle.files.config.is_some() {
                "config.json"
            } else {
                "released default"
            },
            tok.vocab_size(),
            if trained {
                ""
            } else {
                " (not a released tokenizer: random weights)"
            }
        ),
    );
    let lm = match bundle.lm_weights() {
        Ok(w) => w,
        Err(e) => {
            r.push(
                "schema inventory",
                Verdict::Fail,
                format!("LM weights: {e}"),
            );
            return None;
        }
    };
    let mimi = match bundle.mimi_weights() {
        Ok(w) => w,
        Err(e) => {
            r.push(
                "schema inventory",
                Verdict::Fail,
                format!("Mimi weights: {e}"),
            );
            return None;
        }
    };
    r.format = format!("LM {}, Mimi {}", lm.format(), mimi.format());
    r.variant = embed::variant(&lm);
    r.push(
        "schema inventory",
        Verdict::Pass,
        format!(
            "LM {} tensors, Mimi {} tensors, as the configuration asks",
            lm.len(),
            mimi.len()
        ),
    );
    match audit_both(&lm, &mimi) {
        Ok((a, b)) => {
            let problems: Vec<String> = a
                .problems
                .iter()
                .chain(&b.problems)
                .map(|p| format!("{} ({}): {}", p.name, p.kind.name(), p.reason))
                .collect();
            let detail = format!(
                "{} tensors, {} values",
                a.tensors + b.tensors,
                a.values + b.values
            );
            if problems.is_empty() {
                r.push(
                    "tensor statistics",
                    Verdict::Pass,
                    format!("{detail}: finite, scales plausible per kind"),
                );
            } else {
                let more = if problems.len() > 3 {
                    format!(" and {} more", problems.len() - 3)
                } else {
                    String::new()
                };
                r.push(
                    "tensor statistics",
                    Verdict::Fail,
                    format!("{}{more}", problems[..problems.len().min(3)].join("; ")),
                );
                return None;
            }
        }
        Err(e) => {
            r.push("tensor statistics", Verdict::Fail, e.to_string());
            return None;
        }
    }
    Some(bundle)
}

fn audit_both(lm: &Weights, mimi: &Weights) -> Result<(AuditReport, AuditReport)> {
    Ok((audit(lm)?, audit(mimi)?))
}

/// Full duplex on the clip followed by silence: the reply must not be silent and the text stream
/// must hold words of the tokenizer.
fn duplex_checks(
    r: &mut Report,
    engine: &std::sync::Arc<runtime::Engine>,
    clip: &[f32],
) -> Result<()> {
    let mut user = clip.to_vec();
    user.extend(std::iter::repeat_n(
        0.0,
        (ANSWER_SECONDS * SAMPLE_RATE as f32) as usize,
    ));
    let frames = user.len().div_ceil(FRAME_SIZE);
    user.resize(frames * FRAME_SIZE, 0.0);
    let opts = SessionOptions {
        max_queued_frames: 4,
        output_rate: SAMPLE_RATE,
        max_steps: Some(frames as u64 + 1),
        ..SessionOptions::default()
    };
    let mut session = Session::new(engine.clone(), opts).context("cannot create a session")?;
    let mut reply = Vec::with_capacity(user.len());
    let mut tokens = Vec::new();
    let (mut lm_us, mut mimi_us, mut timed) = (0u64, 0u64, 0usize);
    for frame in user.chunks_exact(FRAME_SIZE) {
        session.push_pcm(frame).context("pushing input audio")?;
        loop {
            match session.step().context("frame pass failed")? {
                Step::Frame(out) => {
                    reply.extend_from_slice(&out.pcm);
                    if let Some(t) = out.text_token {
                        tokens.push(t);
                    }
                    // The first frames include one-time warm-up; the mean is over the rest.
                    if out.frame_index >= 2 {
                        lm_us += u64::from(out.timings.lm_us);
                        mimi_us +=
                            u64::from(out.timings.encode_us) + u64::from(out.timings.decode_us);
                        timed += 1;
                    }
                }
                Step::Idle => break,
                Step::Paused => bail!("session paused unexpectedly"),
                Step::Stopped(reason) => bail!("session stopped unexpectedly ({reason:?})"),
            }
        }
    }
    if timed > 0 {
        r.per_frame_ms = Some((
            lm_us as f64 / timed as f64 / 1e3,
            mimi_us as f64 / timed as f64 / 1e3,
            timed,
        ));
    }
    r.push(
        "full duplex",
        Verdict::Pass,
        format!(
            "{frames} frames ({:.1} s) in, {:.1} s of reply out",
            frames as f64 * 0.08,
            reply.len() as f64 / SAMPLE_RATE as f64
        ),
    );
    let rms = rms(&reply);
    r.speech(
        "reply is not silence",
        rms > SILENCE_RMS,
        format!("reply level {:.1} dBFS (silence below -60)", db(rms)),
    );
    let words: Vec<u32> = tokens
        .iter()
        .copied()
        .filter(|&t| t != PAD_ID && t != EPAD_ID)
        .collect();
    r.speech(
        "text is not all padding",
        !words.is_empty(),
        format!(
            "{} of {} text tokens are not padding",
            words.len(),
            tokens.len()
        ),
    );
    let decoded = match engine.tokenizer() {
        Some(tok) => tok.decode(&words).unwrap_or_default(),
        None => String::new(),
    };
    let word_count = decoded
        .split_whitespace()
        .filter(|w| w.chars().filter(|c| c.is_alphabetic()).count() >= 2)
        .count();
    let shown: String = decoded.trim().chars().take(60).collect();
    r.speech(
        "text decodes to words",
        word_count > 0,
        format!("{word_count} words: \"{shown}\""),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use testkit::ScratchDir;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: VerifyArgs,
    }

    fn args(flags: &[&str]) -> VerifyArgs {
        let mut v = vec!["verify"];
        v.extend_from_slice(flags);
        Cli::parse_from(v).args
    }

    fn fixtures() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
    }

    /// A real copy of the tiny oracle bundle (its Mimi and tokenizer are symlinks).
    fn copy_bundle(tag: &str) -> ScratchDir {
        let src = fixtures().join("lm");
        let dst = ScratchDir::new(&format!("verify-{tag}"));
        for name in [
            "config.json",
            "model.safetensors",
            model::checkpoint::TOKENIZER_NAME,
            model::checkpoint::MIMI_NAME,
            "mimi_config.json",
        ] {
            std::fs::copy(src.join(name), dst.join(name)).unwrap();
        }
        dst
    }

    /// The `(name, dtype, shape, data offset range)` of every tensor of a safetensors file.
    fn tensors(bytes: &[u8]) -> Vec<(String, String, Vec<usize>, std::ops::Range<usize>)> {
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        let mut v = Vec::new();
        for (name, t) in header.as_object().unwrap() {
            if name == "__metadata__" {
                continue;
            }
            let off: Vec<usize> = t["data_offsets"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as usize)
                .collect();
            v.push((
                name.clone(),
                t["dtype"].as_str().unwrap().to_string(),
                t["shape"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u64().unwrap() as usize)
                    .collect(),
                8 + n + off[0]..8 + n + off[1],
            ));
        }
        v
    }

    fn model_dir_args(dir: &Path) -> VerifyArgs {
        args(&["--model-dir", dir.to_str().unwrap()])
    }

    /// The error `verify` exits with on the bundle in `dir`.
    fn verify_error(dir: &Path) -> String {
        format!("{:#}", run(&model_dir_args(dir)).unwrap_err())
    }

    #[test]
    fn demo_model_passes_with_speech_checks_marked() {
        let a = args(&["--model", "demo"]);
        let r = verify(&a).unwrap();
        r.print();
        assert!(r.random);
        assert!(r.failures().is_empty(), "{:?}", r.failures());
        let pass = [
            "bundle files",
            "schema inventory",
            "tensor statistics",
            "engine",
            "full duplex",
        ];
        let random = [
            "reply is not silence",
            "text is not all padding",
            "text decodes to words",
            "Mimi round trip",
        ];
        for (names, verdict) in [
            (&pass[..], Verdict::Pass),
            (&random, Verdict::RandomWeights),
        ] {
            for &name in names {
                let c = r.checks.iter().find(|c| c.name == name).expect(name);
                assert_eq!(c.verdict, verdict, "{c:?}");
            }
        }
        let (lm, mimi, n) = r.per_frame_ms.unwrap();
        assert!(lm > 0.0 && mimi > 0.0 && n > 50, "{lm} {mimi} {n}");
        assert!(r.load_s.is_some());
        run(&a).unwrap();
    }

    #[test]
    fn synth_bundle_passes_as_random_weights() {
        let tiny = Bundle::open(&fixtures().join("lm")).unwrap();
        let dir = ScratchDir::new("verify-synth");
        bench::synth::write_bundle(
            &dir,
            bench::synth::SynthFormat::Q8Gguf,
            &tiny.config.lm,
            &tiny.mimi_config,
            7,
        )
        .unwrap();
        let a = model_dir_args(&dir);
        let r = verify(&a).unwrap();
        r.print();
        assert!(r.random, "a synth bundle is random weights");
        assert!(r.failures().is_empty(), "{:?}", r.failures());
        assert!(r.variant.contains("q8"), "{}", r.variant);
        run(&a).unwrap();
    }

    #[test]
    fn one_nan_weight_fails_naming_the_tensor() {
        let dir = copy_bundle("nan");
        let name = "transformer.layers.1.gating.linear_in.weight";
        testkit::poke_f32(&dir.join("model.safetensors"), name, 17, f32::NAN);
        let e = verify_error(&dir);
        assert!(e.contains(name) && e.contains("1 NaN"), "{e}");
        assert!(e.contains("tensor statistics"), "{e}");
    }

    #[test]
    fn missing_tensor_fails_naming_it() {
        let dir = copy_bundle("missing");
        let path = dir.join("model.safetensors");
        let bytes = std::fs::read(&path).unwrap();
        let gone = "depformer_text_emb.weight";
        let kept: Vec<(String, &str, Vec<usize>, Vec<u8>)> = tensors(&bytes)
            .into_iter()
            .filter(|t| t.0 != gone)
            .map(|(n, d, s, r)| {
                let d: &str = if d == "F32" { "F32" } else { panic!("{d}") };
                (n, d, s, bytes[r].to_vec())
            })
            .collect();
        std::fs::write(&path, model::checkpoint::safetensors::to_bytes(&kept)).unwrap();
        let e = verify_error(&dir);
        assert!(e.contains("schema inventory") && e.contains(gone), "{e}");
    }

    #[test]
    fn truncated_file_fails_with_the_cause() {
        let dir = copy_bundle("trunc");
        let path = dir.join(model::checkpoint::MIMI_NAME);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() * 2 / 3]).unwrap();
        let e = verify_error(&dir);
        assert!(e.contains("schema inventory") && e.contains("Mimi"), "{e}");
        assert!(e.to_lowercase().contains("trunc"), "{e}");
    }

    // The speech-to-text checks (verify_stt) through the same `verify`.
    #[test]
    fn demo_stt_passes_with_speech_checks_marked() {
        let r = verify(&args(&["--model", "demo-stt"])).unwrap();
        r.print();
        assert!(r.random);
        assert!(r.failures().is_empty(), "{:?}", r.failures());
        for (name, verdict) in [
            ("bundle files", Verdict::Pass),
            ("schema inventory", Verdict::Pass),
            ("tensor statistics", Verdict::Pass),
            ("engine", Verdict::Pass),
            ("transcription", Verdict::Pass),
            ("voice activity", Verdict::Pass),
            ("text decodes to words", Verdict::RandomWeights),
            ("end of turn after the clip", Verdict::RandomWeights),
            ("Mimi round trip", Verdict::RandomWeights),
        ] {
            let c = r.checks.iter().find(|c| c.name == name).expect(name);
            assert_eq!(c.verdict, verdict, "{c:?}");
        }
        assert!(r.variant.contains("f32"), "{}", r.variant);
        let (ms, n) = r.stt_frame_ms.unwrap();
        assert!(ms > 0.0 && n > 50, "{ms} {n}");
    }

    #[test]
    fn stt_model_not_in_cache_names_fetch() {
        let cache = testkit::ScratchDir::new("verify-stt-cache");
        let e = crate::models::resolve_stt(Some("stt-1b"), None, None, &cache)
            .unwrap_err()
            .to_string();
        assert!(e.contains("moshi-native fetch --model stt-1b"), "{e}");
    }

    #[test]
    fn nan_in_an_extra_head_fails_the_statistics() {
        let src = testkit::fixtures_dir("stt").join("1b");
        let dir = testkit::ScratchDir::new("verify-stt-nan");
        for f in std::fs::read_dir(&src).unwrap() {
            let f = f.unwrap();
            std::fs::copy(f.path(), dir.join(f.file_name())).unwrap();
        }
        testkit::poke_f32(
            &dir.join("model.safetensors"),
            "extra_heads.2.weight",
            5,
            f32::NAN,
        );
        let r = verify(&args(&["--model-dir", dir.to_str().unwrap()])).unwrap();
        let c = r
            .checks
            .iter()
            .find(|c| c.name == "tensor statistics")
            .unwrap();
        assert_eq!(c.verdict, Verdict::Fail, "{c:?}");
        assert!(c.detail.contains("extra_heads.2.weight"), "{c:?}");
    }
}
