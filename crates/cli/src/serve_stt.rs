//! `serve` with a speech-to-text model (issue 32): `--model demo-stt` or `--model-dir <STT bundle>` serves
//! Kyutai's `/api/asr-streaming` (alone, or beside `/api/chat` with `--stt-model-dir` on a Moshi serve;
//! `docs/stt.md`). The streams of one process share one batched driver (`runtime::SttRunner`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use kernels::Pool;
use model::checkpoint::Bundle;
use model::stt::SttModel;
use model::text::SentencePiece;
use server::asr::AsrService;

use crate::cmd_serve::ServeArgs;
use crate::common::KvDtypeArg;

/// Speech-to-text model names `serve --model` knows.
const STT_NAMES: [&str; 3] = ["demo-stt", "stt-1b", "stt-2.6b"];

/// Whether `dir` holds a speech-to-text bundle (`model_type` "stt" in its `config.json`).
fn is_stt_bundle(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .is_some_and(|v| v.get("model_type").and_then(|m| m.as_str()) == Some("stt"))
}

/// The speech-to-text bundle `serve`'s own model flags name (`--model demo-stt|stt-…`, or a
/// `--model-dir` holding one), with whether it is the demo; `None` for a Moshi model.
pub fn stt_model(a: &ServeArgs) -> Result<Option<(PathBuf, bool)>> {
    let m = &a.engine.model;
    if let Some(name) = m.model.as_deref() {
        if STT_NAMES.contains(&name) {
            return locate(Some(name), None).map(Some);
        }
        return Ok(None);
    }
    match &m.model_dir {
        Some(d) if is_stt_bundle(d) => locate(None, Some(d)).map(Some),
        _ => Ok(None),
    }
}

/// The bundle directory of a speech-to-text model name or folder.
pub fn locate(name: Option<&str>, dir: Option<&Path>) -> Result<(PathBuf, bool)> {
    match (name, dir) {
        (Some("demo-stt"), _) => Ok((embed::demo_stt::materialize()?, true)),
        (Some(other), _) => bail!(
            "--model {other}: the released speech-to-text weights are not fetched by name yet\nhint: \
             download kyutai/{other}-… and pass its folder with --model-dir, or try --model demo-stt"
        ),
        (None, Some(d)) => {
            if !is_stt_bundle(d) {
                bail!(
                    "{} is not a speech-to-text bundle (its config.json has no model_type \"stt\")",
                    d.display()
                );
            }
            Ok((d.to_path_buf(), false))
        }
        (None, None) => bail!("no speech-to-text model given"),
    }
}

/// Loads the model and starts the driver: `streams` slots on `threads` threads, the LM step on
/// `device`.
pub fn start(
    dir: &Path,
    demo: bool,
    streams: usize,
    (threads, device): (usize, runtime::Device),
    queued_frames: usize,
    kv: KvDtypeArg,
) -> Result<Arc<AsrService>> {
    if demo {
        eprintln!("{}", embed::demo_stt::LABEL);
    }
    let bundle = Bundle::open(dir).with_context(|| format!("opening {}", dir.display()))?;
    let pool = Pool::new(threads);
    let model = Arc::new(SttModel::load(&bundle, &pool)?);
    let spm = SentencePiece::load(&bundle.files.tokenizer)?;
    let plan = model.plan();
    let heads = model.n_heads();
    let runner = runtime::SttRunner::spawn(
        model,
        runtime::SttRunnerOptions {
            slots: streams,
            threads,
            // Kyutai's clients send a second at a time: room for a few of them.
            max_queued_frames: queued_frames.max(64),
            output_capacity: 16,
            kv_dtype: match kv {
                KvDtypeArg::F32 => model::lm::KvDtype::F32,
                KvDtypeArg::Bf16 => model::lm::KvDtype::Bf16,
            },
            device,
        },
    )
    .context("starting the speech-to-text driver")?;
    let name = if demo {
        "demo-stt".to_string()
    } else {
        crate::models::bundle_name(dir, false)
    };
    let description = format!(
        "{name} (speech-to-text: delay {} steps, prefix {} frames, {heads} voice-activity heads)",
        plan.delay_tokens, plan.prefix_frames
    );
    Ok(Arc::new(AsrService::new(runner, spm, description)))
}

/// `serve` of a speech-to-text model alone.
pub fn run(a: &ServeArgs, dir: PathBuf, demo: bool) -> Result<()> {
    let streams = a
        .max_sessions
        .unwrap_or(crate::cmd_serve::DEFAULT_MAX_SESSIONS);
    if streams == 0 {
        bail!("--max-sessions must be at least 1");
    }
    let threads = a.engine.threads(runtime::physical_cores());
    // Thread count and device checked before the socket is bound and the weights are read.
    let device = a.engine.check(threads)?;
    let config = crate::cmd_serve::serve_config(a, streams)?;
    let listener = crate::cmd_serve::bind_before_loading(&config)?;
    let scheme = if listener.is_tls() { "wss" } else { "ws" };
    let port = listener.local_addr().port();
    let asr = start(
        &dir,
        demo,
        streams,
        (threads, device),
        a.max_queued_frames,
        a.engine.kv_dtype,
    )?;
    let on = match device {
        runtime::Device::Gpu { .. } => format!(
            "the GPU (Mimi on {})",
            crate::models::count(threads, "thread")
        ),
        runtime::Device::Cpu { .. } => crate::models::count(threads, "thread"),
    };
    eprintln!(
        "moshi-native serve: {}; up to {streams} streams share one batched step on {on}",
        asr.description
    );
    eprintln!(
        "moshi-native serve: {scheme}://{}:{port}/api/asr-streaming (queue {}{})",
        a.host,
        a.max_queue,
        if a.auth_token.is_some() {
            ", token required"
        } else {
            ""
        }
    );
    let served = server::run_blocking_asr(listener, config, None, asr.clone());
    asr.stop();
    served.context("server failed")?;
    eprintln!("moshi-native serve: stopped");
    Ok(())
}
