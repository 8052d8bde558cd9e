//! `moshi-native serve`: the WebSocket server (Kyutai's `/api/chat` protocol) and the web page.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use server::backend::{BackendInfo, RuntimeBackend};

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
    /// Conversations served at once (default: 4, lowered to what fits in half the memory left after
    /// loading when the KV caches of 4 would not; with --batch N and no --max-sessions: 4 too, in
    /// ceil(4 / N) workers). Admission beyond it waits in the queue.
    #[arg(long)]
    pub max_sessions: Option<usize>,
    /// Conversations stepped together by one worker: one batched step reads each weight once for all
    /// of them, so they share the machine instead of each getting a fixed slice. Default: all of
    /// --max-sessions in ONE worker that owns every core (a lone conversation gets all the threads;
    /// others join its step). With N < --max-sessions, ceil(max-sessions / N) workers split the cores
    /// (--threads each, default cores / workers); --batch 1 = one worker per conversation, the old
    /// fixed-slice mode. The LM KV caches of all N slots of a worker are allocated at start-up.
    #[arg(long, value_name = "N")]
    pub batch: Option<usize>,
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
    /// Close a conversation whose client sent no audio for this many seconds (its slot is freed and
    /// the close counted in /metrics as moshi_sessions_idle_closed_total); 0 = never.
    #[arg(long, default_value_t = 60, value_name = "SECS")]
    pub idle_timeout: u64,
    /// Input frames (80 ms) a session may queue when the model falls behind before the oldest
    /// are dropped.
    #[arg(long, default_value_t = 4)]
    pub max_queued_frames: usize,
}

pub(crate) fn cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("moshi-native")
}

/// Conversations `serve` admits when `--max-sessions` is not given, before the memory cap: what one
/// batched worker on a 16-core host holds in real time with q4_0 weights (issue 30's measurements), and
/// 4 slots' KV caches (1.6 GB each at full size in bf16, 3.2 GB in f32) still fit beside the weights of
/// a 32 GB machine.
pub const DEFAULT_MAX_SESSIONS: usize = 4;

/// How `serve` spreads conversations over workers and cores ([`plan`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Conversations admitted at once.
    pub max_sessions: usize,
    /// Slots of each worker (conversations stepped together).
    pub batch: usize,
    /// Workers (batched runners, or single-session runners when `batch` is 1).
    pub workers: usize,
    /// CPU threads of each worker.
    pub threads: usize,
    /// Physical cores of the machine.
    pub cores: usize,
    /// Whether `--max-sessions` was given (then no memory cap lowers it).
    pub sessions_given: bool,
}

/// The thread policy of `serve` from its flags (`None` = not given) on a machine of `cores`
/// physical cores. With no flags: [`DEFAULT_MAX_SESSIONS`] conversations in ONE batched worker that owns
/// every core, so a lone conversation gets the whole machine and others join its step (each weight read
/// once per tick for all of them). `--batch N` splits the conversations over `ceil(sessions / N)`
/// workers that share the cores; `--threads` overrides the threads per worker.
pub fn plan(
    cores: usize,
    threads: Option<usize>,
    batch: Option<usize>,
    max_sessions: Option<usize>,
) -> Result<Plan> {
    let cores = cores.max(1);
    if max_sessions == Some(0) {
        bail!("--max-sessions must be at least 1");
    }
    if batch == Some(0) {
        bail!("--batch must be at least 1");
    }
    if let Some(t) = threads {
        if t == 0 || t > 256 {
            bail!("--threads must be between 1 and 256 (got {t})");
        }
    }
    let mut p = Plan {
        max_sessions: max_sessions.unwrap_or(DEFAULT_MAX_SESSIONS),
        batch: 1,
        workers: 1,
        threads: 1,
        cores,
        sessions_given: max_sessions.is_some(),
    };
    p.shape(batch, threads);
    Ok(p)
}

impl Plan {
    /// Batch, workers and threads for the current `max_sessions`.
    fn shape(&mut self, batch: Option<usize>, threads: Option<usize>) {
        // A worker never needs more slots than conversations admitted at once.
        self.batch = batch.unwrap_or(self.max_sessions).min(self.max_sessions);
        self.workers = self.max_sessions.div_ceil(self.batch);
        // Workers step at the same time, so each gets an equal share of the cores.
        self.threads = threads.unwrap_or((self.cores / self.workers).max(1));
    }

    /// Lowers the session limit to `fit` (at least 1) unless `--max-sessions` was given: the slots of
    /// a batched worker allocate their KV caches at start-up, and a default must not exhaust memory.
    /// The threads per worker stay as planned. Returns whether it lowered it.
    pub fn cap_sessions(&mut self, fit: usize, batch: Option<usize>) -> bool {
        let fit = fit.max(1);
        if self.sessions_given || fit >= self.max_sessions {
            return false;
        }
        let threads = self.threads;
        self.max_sessions = fit;
        self.shape(batch, Some(threads));
        true
    }

    /// Whether the workers together run more threads than the machine has cores.
    pub fn oversubscribed(&self) -> bool {
        self.workers * self.threads > self.cores
    }

    /// The start-up line: what one conversation gets and how others share.
    pub fn line(&self) -> String {
        let t = |n: usize| format!("{n} thread{}", if n == 1 { "" } else { "s" });
        let head = format!("1 conversation gets {}", t(self.threads));
        if self.batch == 1 {
            return format!(
                "{head}; up to {} conversations, each in its own worker of {} ({} physical cores)",
                self.max_sessions,
                t(self.threads),
                self.cores
            );
        }
        if self.workers == 1 {
            return format!(
                "{head}; up to {} share the batched step (one worker, {} physical cores)",
                self.max_sessions, self.cores
            );
        }
        format!(
            "{head}; up to {} share each batched step, in {} workers of {} ({} conversations in all, {} \
             physical cores)",
            self.batch,
            self.workers,
            t(self.threads),
            self.max_sessions,
            self.cores
        )
    }
}

/// Bytes of the LM's temporal KV caches of one conversation slot (keys and values of every layer over
/// the whole context): what each slot of a batched worker allocates at start-up.
fn kv_bytes_per_slot(engine: &runtime::Engine) -> u64 {
    let s = engine.lm_spec();
    let elem = match engine.options().kv_dtype {
        model::lm::KvDtype::F32 => 4,
        model::lm::KvDtype::Bf16 => 2,
    };
    2 * (s.num_layers * s.context * s.dim) as u64 * elem
}

/// `MemAvailable` of `/proc/meminfo` in bytes (Linux; `None` elsewhere).
fn memory_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// Slots whose KV caches fit in half of `available` bytes (the other half is left to the rest of the
/// machine and to the conversations' other buffers).
pub fn slots_fitting(kv_per_slot: u64, available: u64) -> usize {
    (available / 2 / kv_per_slot.max(1)) as usize
}

/// Checks `config` and binds its socket before the model loads (seconds to minutes at full size),
/// so that a bad setting, TLS file or busy port fails at once; says where it listens.
pub(crate) fn bind_before_loading(config: &server::ServeConfig) -> Result<server::Listener> {
    server::validate(config)?;
    let listener = server::Listener::bind(&config.host, config.port, config.tls.as_ref())?;
    eprintln!(
        "moshi-native serve: listening on {} (connections wait until the model is loaded)",
        listener.local_addr()
    );
    Ok(listener)
}

/// The server configuration of `serve`'s flags (TLS files made or read, the idle timeout).
pub(crate) fn serve_config(a: &ServeArgs, max_sessions: usize) -> Result<server::ServeConfig> {
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
    Ok(server::ServeConfig {
        host: a.host.clone(),
        port: a.port,
        static_dir: a.static_dir.clone(),
        max_sessions,
        max_queue: a.max_queue,
        tls,
        auth_token: a.auth_token.clone(),
        idle_timeout: (a.idle_timeout > 0).then(|| std::time::Duration::from_secs(a.idle_timeout)),
    })
}

/// Runs the conversation server (a Moshi bundle) until ctrl-c or SIGTERM; `main` sends speech-to-text
/// bundles to `serve_stt::run` instead.
pub fn run(a: &ServeArgs) -> Result<()> {
    if a.max_queued_frames == 0 {
        bail!("--max-queued-frames must be at least 1");
    }
    let mut plan = plan(
        runtime::physical_cores(),
        a.engine.threads,
        a.batch,
        a.max_sessions,
    )?;
    let mut config = serve_config(a, plan.max_sessions)?;
    // Everything that can fail without the model is checked before it loads (seconds to minutes at
    // full size): flags, the device, the TLS files and the port.
    a.engine.check(plan.threads)?;
    let listener = bind_before_loading(&config)?;
    let scheme = if listener.is_tls() { "https" } else { "http" };
    let port = listener.local_addr().port();
    let opened = a.engine.open(plan.threads)?;
    if opened.engine.gpu_adapter().is_none() {
        let kv = kv_bytes_per_slot(&opened.engine);
        if let Some(avail) = memory_available() {
            let fit = slots_fitting(kv, avail);
            if plan.cap_sessions(fit, a.batch) {
                eprintln!(
                    "moshi-native serve: {} conversation(s) at most: each slot's KV cache takes {:.2} GB and \
                     {:.1} GB of memory is available (--max-sessions overrides)",
                    plan.max_sessions,
                    kv as f64 / 1e9,
                    avail as f64 / 1e9
                );
            }
        }
    }
    if plan.oversubscribed() {
        eprintln!(
            "moshi-native serve: warning: {} workers of {} threads on {} physical cores: they will contend \
             for the cores (lower --threads or raise --batch)",
            plan.workers, plan.threads, plan.cores
        );
    }
    let max_sessions = plan.max_sessions;
    let batch = plan.batch;
    // Timed before the workers allocate their KV caches: the probe's own full-context caches (one
    // worker's slots) are freed when it returns.
    let measured = crate::realtime::measure(&opened.engine, batch, plan.workers)?;
    let verdict = crate::realtime::verdict(&measured);
    eprintln!("moshi-native serve: {}", verdict.text);
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
        model: Some(server::protocol::ServedModel {
            name: crate::models::bundle_name(&opened.dir, opened.demo),
            format: crate::realtime::format_name(measured.format),
            device: match opened.engine.gpu_adapter() {
                Some(a) => format!("gpu ({a})"),
                None => crate::models::count(measured.threads, "cpu thread"),
            },
            demo: opened.demo,
        }),
        realtime: Some(server::protocol::RealtimeNotice {
            frame_ms: verdict.start_ms,
            frame_full_ms: verdict.full_ms,
            holds: verdict.holds,
            conversations: verdict
                .capacity
                .iter()
                .map(|c| server::protocol::RealtimeCapacity {
                    format: c.format.clone(),
                    basis: if c.measured { "measured" } else { "estimated" },
                    at_start: c.at_start,
                    at_full: c.at_full,
                })
                .collect(),
            text: verdict.text,
        }),
    };
    let mut backend = RuntimeBackend::new(opened.engine, info);
    backend.max_queued_frames = a.max_queued_frames;
    backend.batch = batch;
    if batch > 1 {
        // Every worker's slots (KV caches) are allocated now, not when the first client arrives.
        backend
            .start_runners(plan.workers)
            .context("starting the batched workers")?;
    }
    eprintln!("moshi-native serve: {}", plan.line());
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
        "moshi-native serve: {scheme}://{}:{}/ ({}{batching}, queue {}{auth})",
        a.host,
        port,
        crate::models::count(max_sessions, "concurrent session"),
        a.max_queue
    );
    config.max_sessions = max_sessions;
    server::run_blocking_on(listener, config, Arc::new(backend)).context("server failed")?;
    eprintln!("moshi-native serve: stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_no_flags_one_worker_owns_every_core() {
        for cores in [1, 2, 16] {
            let p = plan(cores, None, None, None).unwrap();
            assert_eq!(
                (p.max_sessions, p.batch, p.workers, p.threads),
                (DEFAULT_MAX_SESSIONS, DEFAULT_MAX_SESSIONS, 1, cores),
                "{p:?}"
            );
            assert!(!p.oversubscribed());
            let line = p.line();
            assert!(
                line.starts_with(&format!("1 conversation gets {cores} thread"))
                    && line.contains("up to 4 share the batched step"),
                "{line}"
            );
        }
        // The 2-core CI machine's wording.
        assert_eq!(
            plan(2, None, None, None).unwrap().line(),
            "1 conversation gets 2 threads; up to 4 share the batched step (one worker, 2 physical cores)"
        );
    }

    #[test]
    fn overrides_and_their_interactions() {
        // --threads alone: the one worker gets that many; the session limit does not move.
        let p = plan(16, Some(8), None, None).unwrap();
        assert_eq!((p.max_sessions, p.workers, p.threads), (4, 1, 8));
        // --max-sessions alone: one worker of that many slots, every core.
        let p = plan(16, None, None, Some(6)).unwrap();
        assert_eq!((p.batch, p.workers, p.threads), (6, 1, 16));
        // --batch N: ceil(sessions / N) workers share the cores.
        let p = plan(16, None, Some(2), Some(6)).unwrap();
        assert_eq!((p.batch, p.workers, p.threads), (2, 3, 5));
        assert!(
            p.line().contains("in 3 workers of 5 threads"),
            "{}",
            p.line()
        );
        // --batch 1: the fixed-slice mode, one worker per conversation.
        let p = plan(16, None, Some(1), Some(16)).unwrap();
        assert_eq!((p.batch, p.workers, p.threads), (1, 16, 1));
        assert!(p.line().contains("each in its own worker"), "{}", p.line());
        // A batch larger than the session limit is cut to it.
        let p = plan(4, None, Some(8), Some(2)).unwrap();
        assert_eq!((p.batch, p.workers), (2, 1));
        // Explicit threads on many workers: said to contend.
        let p = plan(4, Some(4), Some(1), Some(4)).unwrap();
        assert!(p.oversubscribed());
        for bad in [
            plan(4, Some(0), None, None),
            plan(4, None, Some(0), None),
            plan(4, None, None, Some(0)),
        ] {
            assert!(bad.is_err());
        }
    }

    #[test]
    fn the_memory_cap_lowers_only_a_default_limit() {
        // 3.2 GB per slot, 8 GB available: half of it holds one slot.
        let kv = 3_200_000_000;
        assert_eq!(slots_fitting(kv, 8_000_000_000), 1);
        assert_eq!(slots_fitting(kv, 100_000_000_000), 15);
        let mut p = plan(16, None, None, None).unwrap();
        assert!(p.cap_sessions(slots_fitting(kv, 8_000_000_000), None));
        assert_eq!(
            (p.max_sessions, p.batch, p.workers, p.threads),
            (1, 1, 1, 16)
        );
        // Never below one conversation.
        let mut p = plan(16, None, None, None).unwrap();
        assert!(p.cap_sessions(0, None));
        assert_eq!(p.max_sessions, 1);
        // Given explicitly: the user's call.
        let mut p = plan(16, None, None, Some(8)).unwrap();
        assert!(!p.cap_sessions(1, None));
        assert_eq!(p.max_sessions, 8);
    }
}
