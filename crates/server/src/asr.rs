//! `/api/asr-streaming`: Kyutai's streaming speech-to-text WebSocket (`moshi-server`'s route, so that
//! Kyutai's clients such as `stt_from_file_rust_server.py` work unchanged), over the batched STT driver
//! of the runtime ([`runtime::SttRunner`]). Messages: [`crate::asr_protocol`]; facts: `docs/stt.md`.
//!
//! One tokio task per connection owns its socket (the `Conn` of `/api/chat`). Flow control never drops
//! audio or words: while the stream's input ring lacks room for a message's samples the task keeps the
//! rest and stops reading the client (TCP then holds the client back), and the driver skips a stream
//! whose output queue is full, so a client that does not read stops being transcribed instead of losing
//! words. A marker is echoed after the step that has consumed every whole frame received before it plus
//! the model's delay (the rule of Kyutai's batched server), after that step's messages.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket};
use axum::http::HeaderMap;
use bytes::BytesMut;
use runtime::{SttOutput, SttSession, FRAME_SIZE};
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit};

use crate::asr_protocol::{self as wire, AsrClientMessage};
pub use crate::asr_service::AsrService;
use crate::auth::{is_authorized, same_secret};
use crate::backend::{Backend, BackendError, BackendInfo, OpenSession};
use crate::codec::OggOpusDecoder;
use crate::metrics::Gauge;
use crate::protocol::{percent_decode, SessionParams};
use crate::state::AppState;
use crate::ws::{Conn, Out, CLOSE_ERROR, CLOSE_GOING_AWAY, CLOSE_POLICY, CLOSE_TRY_AGAIN};

/// Header that carries the token on `/api/asr-streaming` (Kyutai's clients), besides `Authorization`.
pub const API_KEY_HEADER: &str = "kyutai-api-key";
/// Query parameter that carries the token on `/api/asr-streaming` (Kyutai's), besides `worker_auth_id`.
pub const AUTH_ID_PARAM: &str = "auth_id";
/// Markers a stream may have waiting for their echo; one more is a protocol error.
pub const MAX_PENDING_MARKERS: usize = 4096;
/// How long a message for a client that does not read may wait for room before the connection closes.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether the request carries `expected`: the `kyutai-api-key` header or the `auth_id` query parameter
/// (Kyutai's), or what `/api/chat` accepts (`Authorization: Bearer`, `worker_auth_id`).
pub fn asr_authorized(expected: &str, headers: &HeaderMap, query: Option<&str>) -> bool {
    let mut ok = is_authorized(expected, headers, query);
    for v in headers.get_all(API_KEY_HEADER) {
        ok |= same_secret(expected.as_bytes(), v.as_bytes().trim_ascii());
    }
    for pair in query.unwrap_or("").split('&') {
        if let Some((name, value)) = pair.split_once('=') {
            if percent_decode(name) == AUTH_ID_PARAM {
                ok |= same_secret(expected.as_bytes(), percent_decode(value).as_bytes());
            }
        }
    }
    ok
}

/// The `/api/chat` backend of a server that runs only a speech-to-text model: it refuses every
/// conversation (the route is not even mounted; this keeps the server's state uniform).
pub struct NoChat;

impl Backend for NoChat {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            lm_model_file: String::new(),
            mimi_model_file: String::new(),
            instance_name: format!("moshi-native {}", env!("CARGO_PKG_VERSION")),
            realtime: None,
            model: None,
        }
    }

    fn open(&self, _: &SessionParams) -> Result<OpenSession, BackendError> {
        Err(BackendError::Unavailable(
            "this server runs a speech-to-text model only (/api/asr-streaming)".into(),
        ))
    }
}

/// Serves one upgraded `/api/asr-streaming` socket until it closes.
pub(crate) async fn handle_socket(
    socket: WebSocket,
    state: Arc<AppState>,
    asr: Arc<AsrService>,
    peer: String,
) {
    let _open = Gauge::inc(&state.metrics.connections_open);
    let _conn = state.tracker.clone();
    let (out_tx, out_rx) = mpsc::channel::<Out>(crate::ws::OUT_QUEUE);
    let mut conn = Conn::new(socket, out_rx);
    let mut a = Stream {
        conn: &mut conn,
        out: &out_tx,
        state: &state,
        asr: &asr,
        buf: Vec::with_capacity(256),
        wire: BytesMut::with_capacity(crate::ws::WIRE_BUFFER),
    };
    let end = a.run(&peer).await;
    if let Some((code, reason)) = end {
        conn.send_ctrl(&out_tx, Out::Close(code, reason)).await;
    }
    drop(out_tx);
    conn.finish().await;
}

/// One connection's state while it runs.
struct Stream<'a> {
    conn: &'a mut Conn,
    out: &'a mpsc::Sender<Out>,
    state: &'a Arc<AppState>,
    asr: &'a Arc<AsrService>,
    /// Where outgoing messages are encoded.
    buf: Vec<u8>,
    /// Outgoing messages are cut from this buffer: once the socket has sent and dropped them, its
    /// memory is reused, so a step allocates nothing here.
    wire: BytesMut,
}

/// What woke the connection task.
enum Wake {
    Client(Option<Result<Message, axum::Error>>),
    Driver,
    Idle,
    Shutdown,
}

impl Stream<'_> {
    /// Queues the message in `buf` for the client, waiting (while writing) for room; false when the
    /// client has not read for [`SEND_TIMEOUT`] or is gone.
    async fn send(&mut self) -> bool {
        let m = Out::Bin(self.carve());
        self.buf.clear();
        matches!(
            self.conn
                .drive(tokio::time::timeout(SEND_TIMEOUT, self.out.send(m)))
                .await,
            Ok(Ok(()))
        )
    }

    /// The message in `buf`, cut from `wire`.
    fn carve(&mut self) -> bytes::Bytes {
        if self.wire.capacity() < self.buf.len() {
            self.wire
                .reserve(self.buf.len().max(crate::ws::WIRE_BUFFER));
        }
        self.wire.extend_from_slice(&self.buf);
        self.wire.split().freeze()
    }

    async fn send_error(&mut self, message: &str) {
        self.buf.clear();
        wire::error(&mut self.buf, message);
        let m = Out::Bin(self.carve());
        self.buf.clear();
        self.conn.send_ctrl(self.out, m).await;
    }

    async fn admit(&mut self) -> Result<OwnedSemaphorePermit, (u16, String)> {
        let m = &self.state.metrics.stt;
        if let Ok(p) = self.asr.slots.clone().try_acquire_owned() {
            return Ok(p);
        }
        let (_w, waiting) = Gauge::join(&m.streams_waiting);
        if waiting as usize >= self.state.max_queue {
            m.streams_rejected.fetch_add(1, Relaxed);
            self.send_error("server busy: all slots taken and the queue is full")
                .await;
            return Err((CLOSE_TRY_AGAIN, "server busy".into()));
        }
        // The client is not read while it waits: its audio stays in TCP's buffers, nothing is lost, and
        // `Ready` tells it when transcription starts.
        let mut shutdown = self.state.shutdown.clone();
        let slots = self.asr.slots.clone();
        let got = self
            .conn
            .drive(async move {
                tokio::select! {
                    p = slots.acquire_owned() => p.ok(),
                    _ = shutdown.changed() => None,
                }
            })
            .await;
        got.ok_or((CLOSE_GOING_AWAY, "server shutting down".into()))
    }

    async fn run(&mut self, peer: &str) -> Option<(u16, String)> {
        let metrics = self.state.metrics.clone();
        let m = &metrics.stt;
        let permit = match self.admit().await {
            Ok(p) => p,
            Err(end) => return Some(end),
        };
        if *self.state.shutdown.borrow() {
            return Some((CLOSE_GOING_AWAY, "server shutting down".into()));
        }
        let notify = Arc::new(Notify::new());
        let n2 = notify.clone();
        let mut session = match self.asr.runner.open(Arc::new(move || n2.notify_one())) {
            Ok(s) => s,
            Err(e) => {
                m.streams_rejected.fetch_add(1, Relaxed);
                self.send_error(&format!("cannot open a stream: {e}")).await;
                return Some((CLOSE_ERROR, "stream error".into()));
            }
        };
        let _active = Gauge::inc(&m.streams_active);
        m.streams_total.fetch_add(1, Relaxed);
        tracing::info!(
            "speech-to-text stream started: peer {peer}, slot {}",
            session.slot()
        );
        wire::ready(&mut self.buf);
        if !self.send().await {
            return None;
        }
        let end = self.stream(&mut session, &notify).await;
        drop(session);
        drop(permit);
        tracing::info!(
            "speech-to-text stream ended: peer {peer}, {}",
            end.as_ref().map_or("client closed", |e| e.1.as_str())
        );
        end
    }

    /// The stream's loop: client messages in, driver output out.
    async fn stream(&mut self, session: &mut SttSession, notify: &Notify) -> Option<(u16, String)> {
        let metrics = self.state.metrics.clone();
        let mut shutdown = self.state.shutdown.clone();
        let plan = self.asr.plan;
        let mut decoder = OggOpusDecoder::new().ok();
        let mut incoming: Vec<f32> = Vec::with_capacity(48_000);
        let mut scratch = Vec::new();
        // Samples received and not yet handed to the driver (it had no room), from `pending_at`.
        let mut pending: Vec<f32> = Vec::with_capacity(48_000);
        let mut pending_at = 0;
        let mut received: u64 = 0;
        let mut steps: u64 = 0;
        let mut markers: VecDeque<(u64, i64)> = VecDeque::new();
        let idle_limit = self.state.idle_timeout;
        let idle = tokio::time::sleep(idle_limit.unwrap_or(Duration::from_secs(86_400 * 365)));
        tokio::pin!(idle);
        loop {
            let wake = if pending_at == pending.len() {
                tokio::select! {
                    m = self.conn.recv() => Wake::Client(m),
                    _ = notify.notified() => Wake::Driver,
                    () = &mut idle, if idle_limit.is_some() => Wake::Idle,
                    _ = shutdown.changed() => Wake::Shutdown,
                }
            } else {
                tokio::select! {
                    _ = self.conn.drive(notify.notified()) => Wake::Driver,
                    _ = shutdown.changed() => Wake::Shutdown,
                }
            };
            match wake {
                Wake::Shutdown => return Some((CLOSE_GOING_AWAY, "server shutting down".into())),
                Wake::Idle => {
                    let secs = idle_limit.map_or(0, |d| d.as_secs());
                    let why = format!("idle: no audio for {secs} s");
                    self.send_error(&why).await;
                    return Some((CLOSE_POLICY, why));
                }
                Wake::Client(None) => return None,
                Wake::Client(Some(Ok(Message::Close(_)))) => {
                    // The socket answers a client's close by itself, on its next read: read once
                    // more (bounded) so the answer is written before the connection is dropped.
                    let _ = tokio::time::timeout(Duration::from_secs(1), self.conn.recv()).await;
                    return None;
                }
                Wake::Client(Some(Err(e))) => {
                    tracing::info!("speech-to-text client stream error: {e}");
                    return Some((CLOSE_POLICY, "protocol error".into()));
                }
                Wake::Client(Some(Ok(Message::Binary(data)))) => {
                    incoming.clear();
                    match wire::parse_client(&data, &mut incoming, &mut scratch) {
                        Ok(AsrClientMessage::Audio) => {}
                        Ok(AsrClientMessage::OggOpus(bytes)) => {
                            if let Some(d) = decoder.as_mut() {
                                d.push(bytes, &mut incoming);
                            }
                        }
                        Ok(AsrClientMessage::Marker(id)) => {
                            if markers.len() >= MAX_PENDING_MARKERS {
                                self.send_error("too many markers waiting").await;
                                return Some((CLOSE_POLICY, "too many markers".into()));
                            }
                            // Kyutai's rule: every whole frame received so far, then the delay.
                            let due = (plan.prefix_frames + plan.delay_tokens) as u64
                                + received / FRAME_SIZE as u64;
                            markers.push_back((due, id));
                        }
                        Ok(AsrClientMessage::Init) => {}
                        Ok(AsrClientMessage::Other(_)) => {
                            metrics.messages_ignored.fetch_add(1, Relaxed);
                        }
                        Err(e) => {
                            metrics.stt.streams_rejected.fetch_add(1, Relaxed);
                            self.send_error(&e.to_string()).await;
                            return Some((CLOSE_POLICY, "bad message".into()));
                        }
                    }
                    if !incoming.is_empty() {
                        if let Some(d) = idle_limit {
                            idle.as_mut().reset(tokio::time::Instant::now() + d);
                        }
                        received += incoming.len() as u64;
                        metrics
                            .frames_in
                            .fetch_add(incoming.len() as u64 / FRAME_SIZE as u64, Relaxed);
                        pending.clear();
                        pending_at = 0;
                        std::mem::swap(&mut pending, &mut incoming);
                    }
                    if !self.echo_markers(&mut markers, steps).await {
                        return None;
                    }
                }
                Wake::Client(Some(Ok(_))) => {} // text, ping, pong
                Wake::Driver => {
                    while let Some(o) = session.try_recv() {
                        let s = match o {
                            SttOutput::Step(s) => s,
                            SttOutput::Error(e) => {
                                metrics.stt.streams_rejected.fetch_add(1, Relaxed);
                                self.send_error(&format!("model error: {e}")).await;
                                return Some((CLOSE_ERROR, "model error".into()));
                            }
                        };
                        steps = s.step_idx as u64;
                        let m = &metrics.stt;
                        m.steps.fetch_add(1, Relaxed);
                        m.tick.observe_us(s.tick_us);
                        if s.n_heads > 0 {
                            // Audio held by the server: received, not yet stepped (the prefix is ours).
                            let stepped =
                                steps.saturating_sub(plan.prefix_frames as u64) * FRAME_SIZE as u64;
                            wire::step(
                                &mut self.buf,
                                steps,
                                s.prs(),
                                received.saturating_sub(stepped),
                            );
                            if !self.send().await {
                                return None;
                            }
                        }
                        if let Some((tokens, start)) = &s.word {
                            let text = self.asr.spm.decode(tokens).unwrap_or_default();
                            wire::word(&mut self.buf, &text, *start);
                            if !self.send().await {
                                return None;
                            }
                            m.words.fetch_add(1, Relaxed);
                        }
                        if let Some(stop) = s.end_word {
                            wire::end_word(&mut self.buf, stop);
                            if !self.send().await {
                                return None;
                            }
                        }
                        if !self.echo_markers(&mut markers, steps).await {
                            return None;
                        }
                    }
                }
            }
            // Hand the driver what it has room for; the rest waits (and the client is not read).
            let room = session.room().min(pending.len() - pending_at);
            if room > 0 {
                session.push(&pending[pending_at..pending_at + room]);
                pending_at += room;
            }
        }
    }

    /// Echoes every marker due at `steps`; false when the client is gone.
    async fn echo_markers(&mut self, markers: &mut VecDeque<(u64, i64)>, steps: u64) -> bool {
        while let Some(&(due, id)) = markers.front() {
            if due > steps {
                break;
            }
            markers.pop_front();
            wire::marker(&mut self.buf, id);
            if !self.send().await {
                return false;
            }
            self.state.metrics.stt.markers.fetch_add(1, Relaxed);
        }
        true
    }
}
