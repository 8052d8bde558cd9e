//! `moshi-native serve`: the WebSocket server (Kyutai's `/api/chat` protocol) and the web page.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use server::backend::{BackendInfo, RuntimeBackend};
use server::ServeConfig;

use crate::common::EngineArgs;

/// Flags of `serve`.
#[derive(Args, Clone, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Address to listen on (use 0.0.0.0 to accept remote browsers; they need --self-signed or
    /// --tls-cert/--tls-key, since microphones only work over HTTPS or on localhost).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 8998)]
    pub port: u16,
    /// Serve this web client build (e.g. Kyutai's `dist/`) instead of the built-in page.
    #[arg(long = "static", value_name = "DIR")]
    pub static_dir: Option<PathBuf>,
    /// TLS certificate chain (PEM).
    #[arg(
        long,
        value_name = "FILE",
        requires = "tls_key",
        conflicts_with = "self_signed"
    )]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Serve HTTPS with a self-signed certificate (generated once into the cache folder).
    #[arg(long)]
    pub self_signed: bool,
    /// Conversations served at once (default: CPU cores / --threads, at least 1, times --batch).
    #[arg(long)]
    pub max_sessions: Option<usize>,
    /// Conversations stepped together by one worker (one batched LM step reads each weight once
    /// for all of them). 1 (default) = one worker thread per conversation. With N > 1,
    /// conversations share batched runners of N slots, each with --threads threads; the LM KV
    /// caches of all N slots are allocated when a runner starts.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub batch: usize,
    /// Clients allowed to wait for a free slot; later ones get an error.
    #[arg(long, default_value_t = 8)]
    pub max_queue: usize,
    /// Require this secret from every client of /api/chat, as `Authorization: Bearer TOKEN` or as
    /// the `worker_auth_id` query parameter (which Kyutai's web client sends); others get HTTP 401.
    /// The built-in page passes on the `worker_auth_id` of its own address.
    #[arg(
        long,
        env = "MOSHI_AUTH_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub auth_token: Option<String>,
    /// Input frames (80 ms) a session may queue when the model falls behind before the oldest
    /// are dropped.
    #[arg(long, default_value_t = 4)]
    pub max_queued_frames: usize,
}

fn cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("moshi-native")
}

/// Runs the server until ctrl-c or SIGTERM.
pub fn run(a: &ServeArgs) -> Result<()> {
    if a.max_queued_frames == 0 {
        bail!("--max-queued-frames must be at least 1");
    }
    let cores = runtime::physical_cores();
    let threads = a.engine.threads(1);
    if a.batch == 0 {
        bail!("--batch must be at least 1");
    }
    let max_sessions = a
        .max_sessions
        .unwrap_or((cores / threads.max(1)).max(1) * a.batch);
    if max_sessions == 0 {
        bail!("--max-sessions must be at least 1");
    }
    // A runner never needs more slots than conversations admitted at once.
    let batch = a.batch.min(max_sessions);
    let tls = if a.self_signed {
        let names = if a.host == "0.0.0.0" || a.host == "::" {
            vec![]
        } else {
            vec![a.host.clone()]
        };
        Some(server::tls::self_signed(&cache_dir().join("tls"), &names)?)
    } else {
        match (&a.tls_cert, &a.tls_key) {
            (Some(cert), Some(key)) => Some(server::tls::TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
            }),
            _ => None,
        }
    };
    let opened = a.engine.open(1)?;
    let measured = crate::realtime::measure(&opened.engine)?;
    let notice = crate::realtime::notice(&measured);
    eprintln!("moshi-native serve: {notice}");
    let file_name = |p: &std::path::Path| {
        p.file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let info = BackendInfo {
        lm_model_file: if opened.demo {
            "demo (random weights)".into()
        } else {
            file_name(&opened.dir)
        },
        mimi_model_file: String::new(),
        instance_name: format!("moshi-native {}", env!("CARGO_PKG_VERSION")),
        realtime: Some(server::protocol::RealtimeNotice {
            frame_ms: f64::from(measured.frame.total_us) / 1e3,
            holds: runtime::realtime::RealtimeCheck::new(&measured.frame).holds(),
            text: notice,
        }),
    };
    let mut backend = RuntimeBackend::new(opened.engine, info);
    backend.max_queued_frames = a.max_queued_frames;
    backend.batch = batch;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let batching = if batch > 1 {
        format!(", batched {batch} per worker")
    } else {
        String::new()
    };
    let auth = if a.auth_token.is_some() {
        ", token required"
    } else {
        ""
    };
    eprintln!(
        "moshi-native serve: {scheme}://{}:{}/ ({max_sessions} concurrent sessions{batching}, queue {}{auth})",
        a.host, a.port, a.max_queue
    );
    let config = ServeConfig {
        host: a.host.clone(),
        port: a.port,
        static_dir: a.static_dir.clone(),
        max_sessions,
        max_queue: a.max_queue,
        tls,
        auth_token: a.auth_token.clone(),
    };
    server::run_blocking(config, Arc::new(backend)).context("server failed")?;
    eprintln!("moshi-native serve: stopped");
    Ok(())
}
