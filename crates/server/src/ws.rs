//! One `/api/chat` connection: parameters, admission, handshake, audio in, audio and text out.
//!
//! Threads per active session: the backend's worker (frame passes) and one output thread that
//! receives frames and does the Opus encoding. One tokio task per connection owns the socket: it
//! reads and writes it (and decodes the client's Opus, which costs microseconds per packet), so the
//! two directions never contend for the socket.

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use bytes::{BufMut, Bytes, BytesMut};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::{mpsc, OwnedSemaphorePermit};

use crate::backend::{Event, EventSource, StopReason};
use crate::codec::{OggOpusDecoder, OggOpusEncoder};
use crate::metrics::{Gauge, Metrics};
use crate::protocol::{self, ClientMessage, Metadata, SessionCommand, SessionParams};
use crate::state::AppState;

/// Outgoing messages buffered per client before audio/text starts being dropped (≈ 2.5 s of
/// output at one audio and one text message per 80 ms frame).
pub const OUT_QUEUE: usize = 64;
/// Interval of keep-alive pings (kind 6) sent to clients waiting for a slot. Kyutai's web client
/// closes the socket after 10 s without any message.
const WAIT_PING: Duration = Duration::from_secs(3);

pub(crate) enum Out {
    Bin(Bytes),
    Close(u16, String),
}

/// Close codes (RFC 6455).
pub(crate) const CLOSE_NORMAL: u16 = 1000;
pub(crate) const CLOSE_GOING_AWAY: u16 = 1001;
pub(crate) const CLOSE_POLICY: u16 = 1008;
pub(crate) const CLOSE_TRY_AGAIN: u16 = 1013;
pub(crate) const CLOSE_ERROR: u16 = 1011;

/// The client's socket and the queue of messages for it, owned by the connection's one task.
///
/// Incoming messages are read on demand ([`Conn::recv`]); queued outgoing ones are written whenever
/// the task waits, on anything ([`Conn::recv`], [`Conn::drive`]). Reading and writing one socket from
/// one task needs no lock (splitting it into halves polled by two tasks does: a lock whose waiting
/// side boxes a waker, an allocation whenever the two meet), and a client that stops reading still
/// has its input read, while its output queue fills and drops.
pub(crate) struct Conn {
    socket: WebSocket,
    queue: mpsc::Receiver<Out>,
    /// A message taken from the queue that the socket had no room for yet.
    pending: Option<Message>,
    /// A message was handed to the socket and not flushed yet.
    unflushed: bool,
    /// The close frame was taken from the queue (or made when the queue closed): nothing follows it.
    closing: bool,
    /// The socket failed on a write: nothing more can be written.
    broken: bool,
}

impl Conn {
    pub(crate) fn new(socket: WebSocket, queue: mpsc::Receiver<Out>) -> Self {
        Conn {
            socket,
            queue,
            pending: None,
            unflushed: false,
            closing: false,
            broken: false,
        }
    }

    /// Writes queued messages as far as the socket takes them, each flushed before the next is taken:
    /// the socket's write buffer never holds more than one message, so it stops growing once it held
    /// the largest. Ready once writing is over: the close frame is flushed (the queue closes with a
    /// normal close when its senders are gone without one), or the socket failed.
    fn poll_write(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if self.broken {
                return Poll::Ready(());
            }
            if let Some(m) = self.pending.take() {
                match self.socket.poll_ready_unpin(cx) {
                    Poll::Ready(Ok(())) => {
                        self.broken = self.socket.start_send_unpin(m).is_err();
                        self.unflushed = true;
                    }
                    Poll::Ready(Err(_)) => self.broken = true,
                    Poll::Pending => {
                        self.pending = Some(m);
                        return Poll::Pending;
                    }
                }
            } else if self.unflushed {
                match self.socket.poll_flush_unpin(cx) {
                    Poll::Ready(Ok(())) => self.unflushed = false,
                    Poll::Ready(Err(_)) => self.broken = true,
                    Poll::Pending => return Poll::Pending,
                }
            } else if self.closing {
                return Poll::Ready(());
            } else {
                let (code, reason) = match self.queue.poll_recv(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Some(Out::Bin(b))) => {
                        self.pending = Some(Message::Binary(b));
                        continue;
                    }
                    Poll::Ready(Some(Out::Close(code, reason))) => (code, reason),
                    Poll::Ready(None) => (CLOSE_NORMAL, String::new()),
                };
                self.closing = true;
                self.pending = Some(Message::Close(Some(CloseFrame {
                    code,
                    reason: reason.into(),
                })));
            }
        }
    }

    /// The next message from the client (`None` once the socket is closed), writing meanwhile.
    /// Cancel-safe: a message is either returned or left in the socket.
    pub(crate) async fn recv(&mut self) -> Option<Result<Message, axum::Error>> {
        poll_fn(|cx| {
            let _ = self.poll_write(cx);
            self.socket.poll_next_unpin(cx)
        })
        .await
    }

    /// Runs `work` to completion, writing meanwhile (the client is not read).
    pub(crate) async fn drive<F: Future>(&mut self, work: F) -> F::Output {
        let mut work = pin!(work);
        poll_fn(|cx| {
            let _ = self.poll_write(cx);
            work.as_mut().poll(cx)
        })
        .await
    }

    /// Queues a message that must not be dropped (metadata, handshake, error, close), waiting a
    /// bounded time for room: a client that stopped reading cannot hold its connection task.
    pub(crate) async fn send_ctrl(&mut self, out: &mpsc::Sender<Out>, m: Out) {
        let _ = self
            .drive(tokio::time::timeout(Duration::from_secs(1), out.send(m)))
            .await;
    }

    async fn send_error(&mut self, out: &mpsc::Sender<Out>, text: &str) {
        let m = protocol::message(protocol::KIND_ERROR, text.as_bytes());
        self.send_ctrl(out, Out::Bin(m.into())).await;
    }

    /// Writes out the queue and the close frame once every sender is gone (bounded: a client that
    /// never reads cannot hold the task).
    pub(crate) async fn finish(mut self) {
        let _ =
            tokio::time::timeout(Duration::from_secs(2), poll_fn(|cx| self.poll_write(cx))).await;
    }
}

/// Serves one upgraded WebSocket until it closes, the session ends or the server shuts down.
pub(crate) async fn handle_socket(
    socket: WebSocket,
    query: Option<String>,
    state: Arc<AppState>,
    peer: String,
) {
    let metrics = state.metrics.clone();
    let _open = Gauge::inc(&metrics.connections_open);
    let _conn = state.tracker.clone();
    let (out_tx, out_rx) = mpsc::channel::<Out>(OUT_QUEUE);
    let mut conn = Conn::new(socket, out_rx);
    let end = run_connection(&mut conn, &out_tx, query, &state, &peer).await;
    if let Some((code, reason)) = end {
        conn.send_ctrl(&out_tx, Out::Close(code, reason)).await;
    }
    drop(out_tx);
    conn.finish().await;
}

/// Returns the close frame to send, if any.
async fn run_connection(
    conn: &mut Conn,
    out: &mpsc::Sender<Out>,
    query: Option<String>,
    state: &Arc<AppState>,
    peer: &str,
) -> Option<(u16, String)> {
    let metrics = &state.metrics;
    let mut shutdown = state.shutdown.clone();
    let params = match SessionParams::from_query(query.as_deref()) {
        Ok(p) => p,
        Err(e) => {
            metrics.sessions_rejected.fetch_add(1, Relaxed);
            tracing::info!("refusing client: {e}");
            conn.send_error(out, &e.to_string()).await;
            return Some((CLOSE_POLICY, "invalid query parameter".into()));
        }
    };
    let info = state.backend.info();
    conn.send_ctrl(
        out,
        Out::Bin(Metadata::new(&params, &info).to_message().into()),
    )
    .await;

    // ---- admission
    let permit: OwnedSemaphorePermit = match state.slots.clone().try_acquire_owned() {
        Ok(p) => p,
        Err(_) => {
            // Reserve a place in the waiting queue (bounded).
            let (_waiting, waiting) = Gauge::join(&metrics.sessions_waiting);
            if waiting as usize >= state.max_queue {
                metrics.sessions_rejected.fetch_add(1, Relaxed);
                conn.send_error(out, "server busy: all slots taken and the queue is full")
                    .await;
                return Some((CLOSE_TRY_AGAIN, "server busy".into()));
            }
            let acquire = state.slots.clone().acquire_owned();
            tokio::pin!(acquire);
            // The page shows the place in the queue. Admission is first come, first served, so the
            // place is at most the one taken on arrival and at most the number still waiting (an
            // upper bound when someone ahead leaves and someone behind arrives).
            let arrival = waiting + 1;
            let place = || {
                let p = arrival.min(metrics.sessions_waiting.load(Relaxed)).max(1);
                Out::Bin(protocol::message(protocol::KIND_PING, p.to_string().as_bytes()).into())
            };
            let _ = out.try_send(place());
            let mut tick = tokio::time::interval(WAIT_PING);
            tick.tick().await;
            loop {
                tokio::select! {
                    p = &mut acquire => match p {
                        Ok(p) => break p,
                        Err(_) => return Some((CLOSE_GOING_AWAY, "server shutting down".into())),
                    },
                    _ = tick.tick() => {
                        let _ = out.try_send(place());
                    }
                    m = conn.recv() => match m {
                        None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return None,
                        Some(Ok(_)) => {} // audio before the handshake is discarded
                    },
                    _ = shutdown.changed() => {
                        return Some((CLOSE_GOING_AWAY, "server shutting down".into()));
                    }
                }
            }
        }
    };
    if *shutdown.borrow() {
        return Some((CLOSE_GOING_AWAY, "server shutting down".into()));
    }

    // ---- open the conversation (allocation-heavy: off the async workers)
    let backend = state.backend.clone();
    let p2 = params.clone();
    let opened = match conn
        .drive(tokio::task::spawn_blocking(move || backend.open(&p2)))
        .await
    {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            metrics.sessions_rejected.fetch_add(1, Relaxed);
            let e = runtime::one_line(&e);
            tracing::warn!("cannot open a session: {e}");
            conn.send_error(out, &format!("cannot open a session: {e}"))
                .await;
            return Some((CLOSE_ERROR, "session error".into()));
        }
        Err(_) => {
            conn.send_error(out, "cannot open a session").await;
            return Some((CLOSE_ERROR, "session error".into()));
        }
    };
    let _active = Gauge::inc(&metrics.sessions_active);
    metrics.sessions_total.fetch_add(1, Relaxed);
    let started = std::time::Instant::now();
    let counts = Arc::new(SessionCounts::default());
    let (mut frames_in, mut frames_dropped) = (0u64, 0u64);
    let mut input = opened.input;
    let mut stopper = opened.stopper;
    let (ended_tx, mut ended_rx) = tokio::sync::oneshot::channel::<Option<(u16, String)>>();
    let out_thread = {
        let out = out.clone();
        let metrics = metrics.clone();
        let events = opened.events;
        let counts = counts.clone();
        std::thread::Builder::new()
            .name("moshi-ws-out".into())
            .spawn(move || output_loop(events, out, metrics, counts, ended_tx))
    };
    let out_thread = match out_thread {
        Ok(t) => t,
        Err(e) => {
            stopper.stop();
            conn.send_error(out, &format!("cannot start a session thread: {e}"))
                .await;
            return Some((CLOSE_ERROR, "session error".into()));
        }
    };
    conn.send_ctrl(out, Out::Bin(protocol::handshake().into()))
        .await;
    tracing::info!(
        "session started: peer {peer}, {} of {} slots taken",
        metrics.sessions_active.load(Relaxed),
        metrics.sessions_max.load(Relaxed)
    );

    // ---- input loop
    let mut decoder = match OggOpusDecoder::new() {
        Ok(d) => Some(d),
        Err(e) => {
            tracing::error!("opus decoder: {e}");
            None
        }
    };
    let mut pcm = Vec::with_capacity(4 * 1920);
    let mut last_stats = crate::codec::DecodeStats::default();
    // Re-armed by every audio message (a timer reset, no allocation); fires once the client has sent
    // no audio for the idle timeout. Without a timeout it never fires.
    let idle_limit = state.idle_timeout;
    let idle = tokio::time::sleep(idle_limit.unwrap_or(Duration::from_secs(86_400 * 365)));
    tokio::pin!(idle);
    let end = loop {
        tokio::select! {
            () = &mut idle, if idle_limit.is_some() => {
                let secs = idle_limit.map_or(0, |d| d.as_secs());
                metrics.sessions_idle_closed.fetch_add(1, Relaxed);
                let why = format!("idle: no audio for {secs} s");
                conn.send_error(out, &why).await;
                break Some((CLOSE_POLICY, why));
            }
            m = conn.recv() => match m {
                None | Some(Ok(Message::Close(_))) => break None,
                Some(Err(e)) => {
                    tracing::info!("client stream error: {e}");
                    conn.send_error(out, &format!("protocol error: {e}")).await;
                    break Some((CLOSE_POLICY, "protocol error".into()));
                }
                Some(Ok(Message::Binary(data))) => match protocol::parse_client_message(&data) {
                    ClientMessage::Audio(bytes) => {
                        if let Some(d) = idle_limit {
                            idle.as_mut().reset(tokio::time::Instant::now() + d);
                        }
                        if let Some(dec) = decoder.as_mut() {
                            dec.push(bytes, &mut pcm);
                            let st = dec.stats();
                            metrics.bad_opus_packets.fetch_add(st.bad_packets - last_stats.bad_packets, Relaxed);
                            metrics.ogg_bytes_skipped.fetch_add(st.skipped_bytes - last_stats.skipped_bytes, Relaxed);
                            last_stats = st;
                        }
                        if !pcm.is_empty() {
                            let r = input.push(&pcm);
                            pcm.clear();
                            metrics.frames_in.fetch_add(u64::from(r.frames_completed), Relaxed);
                            metrics.frames_dropped.fetch_add(u64::from(r.frames_dropped), Relaxed);
                            frames_in += u64::from(r.frames_completed);
                            frames_dropped += u64::from(r.frames_dropped);
                        }
                    }
                    ClientMessage::Control(code) => {
                        if let Some(c) = code.and_then(SessionCommand::from_byte) {
                            metrics.commands[c.index()].fetch_add(1, Relaxed);
                            if !stopper.command(c) {
                                tracing::debug!("backend ignores {}", c.name());
                            }
                        }
                    }
                    ClientMessage::Ping => {}
                    ClientMessage::Empty | ClientMessage::Unknown(_) => {
                        metrics.messages_ignored.fetch_add(1, Relaxed);
                    }
                },
                Some(Ok(Message::Text(_))) => {
                    metrics.messages_ignored.fetch_add(1, Relaxed);
                }
                Some(Ok(_)) => {} // WebSocket ping/pong: answered by the library
            },
            e = &mut ended_rx => break e.unwrap_or(None),
            _ = shutdown.changed() => break Some((CLOSE_GOING_AWAY, "server shutting down".into())),
        }
    };

    // ---- teardown: stop the worker (joins it), then the output thread ends on its own.
    let _ = conn
        .drive(tokio::task::spawn_blocking(move || {
            stopper.stop();
            let _ = out_thread.join();
        }))
        .await;
    drop(input);
    drop(permit);
    let why = match &end {
        None => "client closed".to_string(),
        Some((_, reason)) => reason.clone(),
    };
    tracing::info!(
        "session ended: peer {peer}, {:.1} s, frames in {frames_in} / out {} / dropped {frames_dropped}, \
         messages dropped {}, {why}",
        started.elapsed().as_secs_f64(),
        counts.frames_out.load(Relaxed),
        counts.messages_dropped.load(Relaxed)
    );
    end
}

/// What one session's output thread counted, for its end-of-session log line.
#[derive(Default)]
struct SessionCounts {
    frames_out: std::sync::atomic::AtomicU64,
    messages_dropped: std::sync::atomic::AtomicU64,
}

/// Size of the output thread's message buffer (≈ 250 frames of audio and text messages).
pub const WIRE_BUFFER: usize = 64 * 1024;

/// One protocol message (`kind` + the concatenated `parts`) cut from `wire`.
fn carve(wire: &mut BytesMut, kind: u8, parts: &[&[u8]]) -> Bytes {
    let len = 1 + parts.iter().map(|p| p.len()).sum::<usize>();
    if wire.capacity() < len {
        wire.reserve(len.max(WIRE_BUFFER));
    }
    wire.put_u8(kind);
    for p in parts {
        wire.put_slice(p);
    }
    wire.split().freeze()
}

/// Output thread: frames → Ogg/Opus + text messages, never blocking on the client.
fn output_loop(
    mut events: Box<dyn EventSource>,
    out: mpsc::Sender<Out>,
    metrics: Arc<Metrics>,
    counts: Arc<SessionCounts>,
    ended: tokio::sync::oneshot::Sender<Option<(u16, String)>>,
) {
    let mut encoder = match OggOpusEncoder::new() {
        Ok(e) => e,
        Err(e) => {
            let _ = out.try_send(Out::Bin(
                protocol::message(
                    protocol::KIND_ERROR,
                    format!("opus encoder: {e}").as_bytes(),
                )
                .into(),
            ));
            let _ = ended.send(Some((CLOSE_ERROR, "encoder error".into())));
            return;
        }
    };
    let mut headers = Vec::new();
    if let Err(e) = encoder.write_headers(&mut headers) {
        tracing::error!("ogg headers: {e}");
    }
    let mut headers_sent = false;
    let mut bytes = Vec::with_capacity(1024);
    // Outgoing messages are carved out of one buffer (`split().freeze()`); once the WebSocket writer
    // has sent and dropped them, `reserve` reuses the same memory, so a frame allocates nothing.
    let mut wire = BytesMut::with_capacity(WIRE_BUFFER);
    let mut end = None;
    while let Some(ev) = events.recv() {
        match ev {
            Event::Frame(f) => {
                metrics.frames_processed.fetch_add(1, Relaxed);
                counts.frames_out.fetch_add(1, Relaxed);
                metrics.observe_frame(&f);
                metrics.observe_lag(f.counters.queued as u64);
                bytes.clear();
                if let Err(e) = encoder.push(&f.pcm, &mut bytes) {
                    tracing::warn!("opus encode: {e}");
                }
                if !bytes.is_empty() {
                    let hdr = if headers_sent { &[][..] } else { &headers[..] };
                    let msg = carve(&mut wire, protocol::KIND_AUDIO, &[hdr, &bytes]);
                    match out.try_send(Out::Bin(msg)) {
                        Ok(()) => {
                            headers_sent = true;
                            metrics.audio_messages_out.fetch_add(1, Relaxed);
                        }
                        Err(mpsc::error::TrySendError::Full(_)) => {
                            metrics.messages_dropped.fetch_add(1, Relaxed);
                            counts.messages_dropped.fetch_add(1, Relaxed);
                        }
                        Err(mpsc::error::TrySendError::Closed(_)) => break,
                    }
                }
                if !f.text.is_empty() {
                    let msg = carve(&mut wire, protocol::KIND_TEXT, &[f.text.as_bytes()]);
                    match out.try_send(Out::Bin(msg)) {
                        Ok(()) => {
                            metrics.text_messages_out.fetch_add(1, Relaxed);
                        }
                        Err(mpsc::error::TrySendError::Full(_)) => {
                            metrics.messages_dropped.fetch_add(1, Relaxed);
                            counts.messages_dropped.fetch_add(1, Relaxed);
                        }
                        Err(mpsc::error::TrySendError::Closed(_)) => break,
                    }
                }
                events.recycle(f);
            }
            Event::Stopped(reason) => {
                let why = match reason {
                    StopReason::MaxSteps => "max_steps reached",
                    StopReason::Requested => "session stopped",
                };
                end = Some((CLOSE_NORMAL, why.into()));
                break;
            }
            Event::Error(e) => {
                // The protocol carries a message: the typed error becomes one here, at the edge.
                let e = e.message();
                tracing::error!("session failed: {e}");
                // Never block here: a client that stopped reading must not hold this thread.
                let _ = out.try_send(Out::Bin(
                    protocol::message(protocol::KIND_ERROR, format!("model error: {e}").as_bytes())
                        .into(),
                ));
                end = Some((CLOSE_ERROR, "model error".into()));
                break;
            }
        }
    }
    let _ = ended.send(end);
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use model::lm::LmError;
    use runtime::RuntimeError;

    use super::*;

    /// A conversation whose events are given in advance.
    struct Scripted(VecDeque<Event>);

    impl EventSource for Scripted {
        fn recv(&mut self) -> Option<Event> {
            self.0.pop_front()
        }
    }

    /// A device's error as a GPU backend reports it inside the LM.
    #[derive(Debug, thiserror::Error)]
    #[error("device lost (injected)")]
    struct DeviceLost;

    /// The messages the output thread queued for the client and the close it asked for, after one
    /// frame and then `last`.
    fn output_of(last: Event) -> (Vec<Out>, Option<(u16, String)>) {
        let frame = Event::Frame(runtime::FrameEvent {
            text: "hi".into(),
            ..Default::default()
        });
        let (tx, mut rx) = mpsc::channel(16);
        let (ended, mut end) = tokio::sync::oneshot::channel();
        output_loop(
            Box::new(Scripted(VecDeque::from([frame, last]))),
            tx,
            Arc::new(Metrics::default()),
            Arc::new(SessionCounts::default()),
            ended,
        );
        let mut out = Vec::new();
        while let Ok(m) = rx.try_recv() {
            out.push(m);
        }
        (out, end.try_recv().unwrap())
    }

    /// The stop reason reaches the close frame as itself: `max_steps` and a stop request close with
    /// different reasons (both normal closes), and neither sends an error message.
    #[test]
    fn max_steps_and_a_stop_request_close_differently() {
        let (out_max, max) = output_of(Event::Stopped(StopReason::MaxSteps));
        let (out_req, req) = output_of(Event::Stopped(StopReason::Requested));
        assert_eq!(max, Some((CLOSE_NORMAL, "max_steps reached".to_string())));
        assert_eq!(req, Some((CLOSE_NORMAL, "session stopped".to_string())));
        for out in [out_max, out_req] {
            // The frame's text only.
            assert_eq!(out.len(), 1);
            assert!(matches!(&out[0], Out::Bin(b) if b[0] == protocol::KIND_TEXT));
        }
    }

    /// A typed frame-pass error becomes the protocol's error message (kind 5, its text) and an error
    /// close, here at the edge.
    #[test]
    fn a_device_error_becomes_the_error_message() {
        let e = RuntimeError::Lm(LmError::Backend(Box::new(DeviceLost)));
        let (out, end) = output_of(Event::Error(e));
        assert_eq!(end, Some((CLOSE_ERROR, "model error".to_string())));
        let Some(Out::Bin(b)) = out.last() else {
            panic!("no error message");
        };
        assert_eq!(b[0], protocol::KIND_ERROR);
        assert_eq!(&b[1..], b"model error: device lost (injected)");
    }
}
