//! The HTTP application: routes, static files, admission state, startup and graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::{ConnectInfo, RawQuery, State, WebSocketUpgrade};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::sync::{watch, Semaphore};

use crate::auth::{exposure_warning, is_authorized};
use crate::backend::Backend;
use crate::error::ServerError;
use crate::metrics::Metrics;
use crate::socket::tune_socket;
use crate::state::AppState;

/// Largest client WebSocket message accepted (bytes). A browser page of 40 ms of Opus is ~200 B.
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;

/// Server configuration (what `moshi-native serve` parses).
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Address to bind.
    pub host: String,
    /// Port to bind (0 = any free port).
    pub port: u16,
    /// Serve this directory at `/` (with `index.html` fallback) instead of the built-in page.
    pub static_dir: Option<PathBuf>,
    /// Conversations served at once.
    pub max_sessions: usize,
    /// Clients allowed to wait for a slot; more are refused.
    pub max_queue: usize,
    /// TLS certificate and key (PEM files). `None` = plain HTTP.
    pub tls: Option<crate::tls::TlsFiles>,
    /// Secret a client must present to open `/api/chat` (`Authorization: Bearer` or the
    /// `worker_auth_id` query parameter); `None` = open to anyone who can connect.
    pub auth_token: Option<String>,
    /// Close a session whose client sent no audio for this long, freeing its slot (`None` = never).
    pub idle_timeout: Option<Duration>,
}

/// Default of [`ServeConfig::idle_timeout`]: a browser whose microphone runs sends a packet every
/// 20 to 80 ms, so a minute without one is a client gone or stuck, not a pause in speech.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 8998,
            static_dir: None,
            max_sessions: 1,
            max_queue: 8,
            tls: None,
            auth_token: None,
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
        }
    }
}

/// The listening socket and the TLS configuration of a server, made before anything expensive:
/// `serve` binds its port and reads its certificate and key before it loads the model, so a port in
/// use or a bad key fails in milliseconds, not after the weights are read. Until a [`Server`] runs
/// on it, connections wait in the kernel's backlog.
pub struct Listener {
    socket: std::net::TcpListener,
    addr: SocketAddr,
    tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
}

impl Listener {
    /// Binds `host:port` (0 = any free port) and reads the TLS files, if any.
    pub fn bind(
        host: &str,
        port: u16,
        tls: Option<&crate::tls::TlsFiles>,
    ) -> Result<Listener, ServerError> {
        // The certificate first: it is the cheaper mistake to report, and nothing is bound yet.
        let tls = tls.map(crate::tls::server_config).transpose()?;
        let socket =
            std::net::TcpListener::bind((host, port)).map_err(|source| ServerError::Io {
                context: format!("binding {host}:{port}"),
                source,
            })?;
        // tokio takes the socket over in [`Server::on`]; it must not block.
        socket
            .set_nonblocking(true)
            .map_err(|source| ServerError::Io {
                context: "making the listening socket non-blocking".into(),
                source,
            })?;
        let addr = socket.local_addr().map_err(|source| ServerError::Io {
            context: "local address".into(),
            source,
        })?;
        Ok(Listener { socket, addr, tls })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether it serves HTTPS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }
}

/// A bound, not yet running server.
pub struct Server {
    listener: tokio::net::TcpListener,
    addr: SocketAddr,
    state: Arc<AppState>,
    shutdown_tx: watch::Sender<bool>,
    tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
}

impl Server {
    /// Validates the configuration and binds the listening socket (and reads the TLS files).
    pub async fn bind(
        config: ServeConfig,
        backend: Arc<dyn Backend>,
    ) -> Result<Server, ServerError> {
        validate(&config)?;
        let listener = Listener::bind(&config.host, config.port, config.tls.as_ref())?;
        Server::on(listener, config, backend)
    }

    /// A server on a socket bound earlier ([`Listener::bind`]); `config.host`, `config.port` and
    /// `config.tls` are not used (the listener has them). Must be called inside a tokio runtime.
    pub fn on(
        listener: Listener,
        config: ServeConfig,
        backend: Arc<dyn Backend>,
    ) -> Result<Server, ServerError> {
        validate(&config)?;
        if let Some(w) = exposure_warning(
            &config.host,
            config.auth_token.is_some(),
            listener.tls.is_some(),
        ) {
            tracing::warn!("{w}");
        }
        let Listener { socket, addr, tls } = listener;
        let listener =
            tokio::net::TcpListener::from_std(socket).map_err(|source| ServerError::Io {
                context: "listening socket".into(),
                source,
            })?;
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let metrics = Arc::new(Metrics::default());
        metrics
            .sessions_max
            .store(config.max_sessions as u64, Relaxed);
        if let Some(r) = backend.info().realtime {
            metrics.set_realtime(r);
        }
        let state = Arc::new(AppState {
            backend,
            metrics,
            slots: Arc::new(Semaphore::new(config.max_sessions)),
            max_queue: config.max_queue,
            shutdown: shutdown_rx,
            tracker: Arc::new(()),
            static_dir: config.static_dir,
            auth_token: config.auth_token,
            idle_timeout: config.idle_timeout,
            asr: None,
            chat: true,
        });
        Ok(Server {
            listener,
            addr,
            state,
            shutdown_tx,
            tls,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Also serves `asr` at `/api/asr-streaming`; with `chat` false, `/api/chat` is not mounted (a
    /// speech-to-text-only server). Call before [`Server::run_until`].
    pub fn with_asr(mut self, asr: Arc<crate::asr::AsrService>, chat: bool) -> Server {
        self.state
            .metrics
            .stt
            .streams_max
            .store(asr.max_streams() as u64, Relaxed);
        if !chat {
            self.state.metrics.sessions_max.store(0, Relaxed);
        }
        // Nothing else holds the state before the server runs.
        if let Some(st) = Arc::get_mut(&mut self.state) {
            st.asr = Some(asr);
            st.chat = chat;
        }
        self
    }

    /// The server's counters.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.state.metrics.clone()
    }

    /// Serves until `signal` completes, then closes every session (clients get a close frame,
    /// workers are joined, slots freed) and returns.
    pub async fn run_until(
        self,
        signal: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        let Server {
            listener,
            addr,
            state,
            shutdown_tx,
            tls,
        } = self;
        let app = router(state.clone());
        let tx = shutdown_tx.clone();
        let graceful = async move {
            signal.await;
            tracing::info!("shutting down");
            let _ = tx.send(true);
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        tracing::info!("listening on {scheme}://{addr}");
        let served = match tls {
            None => serve_with(PlainListener(listener), app, graceful).await,
            Some(files) => {
                let tls_listener = crate::tls::TlsListener::with_config(listener, files)?;
                serve_with(tls_listener, app, graceful).await
            }
        };
        let _ = shutdown_tx.send(true);
        // Wait for the WebSocket tasks (they run detached from the HTTP connections).
        let deadline = Instant::now() + Duration::from_secs(10);
        while Arc::strong_count(&state.tracker) > 1 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let left = Arc::strong_count(&state.tracker) - 1;
        if left > 0 {
            tracing::warn!("{left} connections still open at exit");
        }
        served
    }
}

/// The checks of a configuration that need no socket (also run by `serve` before it loads the model).
pub fn validate(config: &ServeConfig) -> Result<(), ServerError> {
    if config.max_sessions == 0 {
        return Err(ServerError::Config(
            "--max-sessions must be at least 1".into(),
        ));
    }
    if let Some(d) = &config.static_dir {
        if !d.join("index.html").is_file() {
            return Err(ServerError::Config(format!(
                "--static {}: no index.html there",
                d.display()
            )));
        }
    }
    if config.auth_token.as_deref() == Some("") {
        return Err(ServerError::Config("--auth-token must not be empty".into()));
    }
    if config.idle_timeout == Some(Duration::ZERO) {
        return Err(ServerError::Config(
            "--idle-timeout must be at least 1 s (or off)".into(),
        ));
    }
    Ok(())
}

/// Completes on ctrl-c or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// Worker threads of the tokio runtime that [`run_blocking`] builds (the connections' socket tasks;
/// the model and the Opus encoding have threads of their own).
pub const WORKER_THREADS: usize = 2;

/// Builds a multi-threaded tokio runtime, serves until ctrl-c/SIGTERM, and returns.
pub fn run_blocking(config: ServeConfig, backend: Arc<dyn Backend>) -> Result<(), ServerError> {
    validate(&config)?;
    let listener = Listener::bind(&config.host, config.port, config.tls.as_ref())?;
    run_blocking_on(listener, config, backend)
}

/// [`run_blocking`] on a socket bound earlier ([`Listener::bind`]).
pub fn run_blocking_on(
    listener: Listener,
    config: ServeConfig,
    backend: Arc<dyn Backend>,
) -> Result<(), ServerError> {
    block_on_http(async move {
        let server = Server::on(listener, config, backend)?;
        server.run_until(shutdown_signal()).await
    })
}

/// [`run_blocking_on`] with the speech-to-text service `asr` at `/api/asr-streaming`, beside
/// `/api/chat` on `backend` when one is given (one process serving both), else alone.
pub fn run_blocking_asr(
    listener: Listener,
    config: ServeConfig,
    backend: Option<Arc<dyn Backend>>,
    asr: Arc<crate::asr::AsrService>,
) -> Result<(), ServerError> {
    let chat = backend.is_some();
    let backend = backend.unwrap_or_else(|| Arc::new(crate::asr::NoChat));
    block_on_http(async move {
        let server = Server::on(listener, config, backend)?.with_asr(asr, chat);
        server.run_until(shutdown_signal()).await
    })
}

/// Runs `serve` to its end on a multi-threaded tokio runtime of [`WORKER_THREADS`] threads.
fn block_on_http(
    serve: impl std::future::Future<Output = Result<(), ServerError>>,
) -> Result<(), ServerError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKER_THREADS)
        .enable_all()
        .thread_name("moshi-http")
        .build()
        .map_err(|source| ServerError::Io {
            context: "starting tokio".into(),
            source,
        })?;
    rt.block_on(serve)
}

/// Serves `app` on `listener` (plain or TLS) until `graceful` resolves and the open HTTP
/// connections have ended.
async fn serve_with<L>(
    listener: L,
    app: Router,
    graceful: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
    Peer: for<'a> axum::extract::connect_info::Connected<axum::serve::IncomingStream<'a, L>>,
{
    axum::serve(listener, app.into_make_service_with_connect_info::<Peer>())
        .with_graceful_shutdown(graceful)
        .await
        .map_err(|source| ServerError::Io {
            context: "serving".into(),
            source,
        })
}

fn router(state: Arc<AppState>) -> Router {
    let mut r = Router::new();
    if state.chat {
        r = r.route("/api/chat", get(chat));
    }
    if state.asr.is_some() {
        r = r.route("/api/asr-streaming", get(asr_streaming));
    }
    let r = r
        .route("/api/info", get(info))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics));
    let r = if state.static_dir.is_some() {
        r.fallback(get(static_file))
    } else {
        r.route("/", get(|| async { embedded("index.html") }))
            .route("/index.html", get(|| async { embedded("index.html") }))
            .route("/moshi.js", get(|| async { embedded("moshi.js") }))
            .route(
                "/moshi-worklet.js",
                get(|| async { embedded("moshi-worklet.js") }),
            )
    };
    r.with_state(state)
}

/// The address of a connection's peer, for the session logs (the plain and the TLS listener both
/// accept with a socket address).
#[derive(Clone, Copy, Debug)]
struct Peer(SocketAddr);

/// The plain listener: every accepted socket tuned ([`tune_socket`]).
struct PlainListener(tokio::net::TcpListener);

impl axum::serve::Listener for PlainListener {
    type Io = tokio::net::TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.0.accept().await {
                Ok((tcp, peer)) => {
                    tune_socket(&tcp);
                    return (tcp, peer);
                }
                // Out of file descriptors and the like: wait instead of spinning.
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, PlainListener>>
    for Peer
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, PlainListener>) -> Self {
        Peer(*stream.remote_addr())
    }
}

impl
    axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, crate::tls::TlsListener>>
    for Peer
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, crate::tls::TlsListener>) -> Self {
        Peer(*stream.remote_addr())
    }
}

async fn chat(
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
    ConnectInfo(Peer(peer)): ConnectInfo<Peer>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
    State(state): State<Arc<AppState>>,
) -> Response {
    let ws = match checked_upgrade(
        ws,
        &state,
        |token| is_authorized(token, &headers, query.as_deref()),
        &state.metrics.unauthorized,
        "missing or wrong token (Authorization: Bearer, or worker_auth_id)\n",
    ) {
        Ok(ws) => ws,
        Err(refused) => return refused,
    };
    // Behind a proxy the socket's peer is the proxy: the logs name the client it forwarded.
    let peer = match headers
        .get("x-forwarded-for")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .filter(|c| c.len() <= 64)
    {
        Some(client) => format!("{} via {peer}", client.trim()),
        None => peer.to_string(),
    };
    ws.on_upgrade(move |socket| crate::ws::handle_socket(socket, query, state, peer))
}

/// What both WebSocket routes check before the upgrade, so that a refused client costs no model
/// work: the token, when the server has one (`authorized` accepts it where the route's clients put
/// it; a refusal counts in `refused` and answers 401 with `hint`), then the upgrade request itself.
/// The upgrade comes back with the message size limits set.
// The refusal goes straight back to axum, once per refused request: boxing it would buy nothing.
#[allow(clippy::result_large_err)]
fn checked_upgrade(
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
    state: &AppState,
    authorized: impl FnOnce(&str) -> bool,
    refused: &AtomicU64,
    hint: &'static str,
) -> Result<WebSocketUpgrade, Response> {
    if let Some(token) = &state.auth_token {
        if !authorized(token) {
            refused.fetch_add(1, Relaxed);
            return Err((
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                hint,
            )
                .into_response());
        }
    }
    let ws = ws.map_err(IntoResponse::into_response)?;
    Ok(ws
        .max_message_size(MAX_MESSAGE_BYTES)
        .max_frame_size(MAX_MESSAGE_BYTES))
}

/// `/api/asr-streaming`: the token (Kyutai's header or query parameter, or `/api/chat`'s) is checked
/// before the upgrade, as on `/api/chat`.
async fn asr_streaming(
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
    ConnectInfo(Peer(peer)): ConnectInfo<Peer>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
    State(state): State<Arc<AppState>>,
) -> Response {
    let Some(asr) = state.asr.clone() else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let ws = match checked_upgrade(
        ws,
        &state,
        |token| crate::asr::asr_authorized(token, &headers, query.as_deref()),
        &state.metrics.stt.unauthorized,
        "missing or wrong token (kyutai-api-key, auth_id, Authorization: Bearer or worker_auth_id)\n",
    ) {
        Ok(ws) => ws,
        Err(refused) => return refused,
    };
    let peer = peer.to_string();
    ws.on_upgrade(move |socket| crate::asr::handle_socket(socket, state, asr, peer))
}

/// Readiness for a load balancer: 200 while a conversation would be admitted at once (a slot is
/// free), 503 when every slot is taken or the server is shutting down. `/healthz` is liveness only.
async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    let free = state.slots.available_permits();
    let max = state.metrics.sessions_max.load(Relaxed);
    if *state.shutdown.borrow() {
        return (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n").into_response();
    }
    if let Some(asr) = &state.asr {
        // Ready while either service would admit a client at once.
        let stt_free = asr.free_streams();
        let chat_free = if state.chat { free } else { 0 };
        let status = if stt_free + chat_free > 0 {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        let chat = if state.chat {
            format!("{free} of {max} slots free, ")
        } else {
            String::new()
        };
        let body = format!(
            "{chat}{stt_free} of {} speech-to-text streams free\n",
            asr.max_streams()
        );
        return (status, body).into_response();
    }
    let status = if free > 0 {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, format!("{free} of {max} slots free\n")).into_response()
}

/// `GET /api/info`: what the page shows before a conversation starts (the model, where it runs, the
/// real-time verdict, whether a token is needed). Holds no secret: the token itself is never sent.
async fn info(State(state): State<Arc<AppState>>) -> Response {
    #[derive(serde::Serialize)]
    struct Info {
        instance_name: String,
        lm_model_file: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        model: Option<crate::protocol::ServedModel>,
        #[serde(skip_serializing_if = "Option::is_none")]
        realtime: Option<crate::protocol::RealtimeNotice>,
        token_required: bool,
    }
    let b = state.backend.info();
    let body = Info {
        instance_name: b.instance_name,
        lm_model_file: b.lm_model_file,
        model: b.model,
        realtime: b.realtime,
        token_required: state.auth_token.is_some(),
    };
    (
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        serde_json::to_string(&body).unwrap_or_else(|_| "{}".into()),
    )
        .into_response()
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

const INDEX_HTML: &str = include_str!("../web/index.html");
const MOSHI_JS: &str = include_str!("../web/moshi.js");
const WORKLET_JS: &str = include_str!("../web/moshi-worklet.js");

fn embedded(name: &str) -> Response {
    let (body, ty) = match name {
        "index.html" => (INDEX_HTML, "text/html; charset=utf-8"),
        "moshi.js" => (MOSHI_JS, "text/javascript; charset=utf-8"),
        _ => (WORKLET_JS, "text/javascript; charset=utf-8"),
    };
    (
        [
            (header::CONTENT_TYPE, ty),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

fn content_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "html" | "htm" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" | "map" => "application/json",
        "wasm" => "application/wasm",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "svg" => "image/svg+xml",
        "ico" => "image/x-icon",
        "woff2" => "font/woff2",
        "woff" => "font/woff",
        "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// Maps a request path into `root`, refusing anything that would leave it.
fn safe_join(root: &Path, uri_path: &str) -> Option<PathBuf> {
    let decoded = crate::protocol::percent_decode(uri_path.trim_start_matches('/'));
    let mut p = root.to_path_buf();
    for c in Path::new(&decoded).components() {
        match c {
            Component::Normal(s) => p.push(s),
            Component::CurDir => {}
            _ => return None,
        }
    }
    Some(p)
}

async fn static_file(State(state): State<Arc<AppState>>, uri: Uri) -> Response {
    let Some(root) = state.static_dir.as_deref() else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let Some(mut path) = safe_join(root, uri.path()) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    if path.is_dir() {
        path.push("index.html");
    }
    let (path, bytes) = match tokio::fs::read(&path).await {
        Ok(b) => (path, b),
        // SPA fallback: unknown paths get the index page.
        Err(_) => {
            let index = root.join("index.html");
            match tokio::fs::read(&index).await {
                Ok(b) => (index, b),
                Err(_) => return StatusCode::NOT_FOUND.into_response(),
            }
        }
    };
    let mut resp = Response::new(Body::from(bytes));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(content_type(&path)),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_join_stays_inside() {
        let root = Path::new("/srv/dist");
        assert_eq!(
            safe_join(root, "/assets/a.js"),
            Some(PathBuf::from("/srv/dist/assets/a.js"))
        );
        assert_eq!(safe_join(root, "/"), Some(PathBuf::from("/srv/dist")));
        assert_eq!(safe_join(root, "/../etc/passwd"), None);
        assert_eq!(safe_join(root, "/a/%2e%2e/%2e%2e/x"), None);
    }
}

#[cfg(all(test, unix))]
mod signal_tests {
    #[tokio::test]
    async fn sigterm_is_caught() {
        let h = tokio::spawn(super::shutdown_signal());
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let st = std::process::Command::new("kill")
            .args(["-TERM", &std::process::id().to_string()])
            .status()
            .unwrap();
        assert!(st.success());
        tokio::time::timeout(std::time::Duration::from_secs(5), h)
            .await
            .expect("SIGTERM completes shutdown_signal")
            .unwrap();
    }
}
