//! Load and fault tests on loopback, bounded in count and time: every slot busy at once on the
//! tiny real model, a client that stops reading (bounded outgoing queue, drops counted, memory
//! flat, shutdown not held up), and connection churn (clients vanishing at every
//! stage of a conversation). SIGTERM to a real `moshi-native serve` process is in
//! `crates/cli/tests/serve_sigterm.rs` (it needs the binary).

mod common;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use server::backend::{
    AudioInput, Backend, BackendError, BackendEvent, BackendInfo, EventSource, FrameOut,
    InputReport, OpenSession, RuntimeBackend, Stopper,
};
use server::protocol::SessionParams;
use server::testing::EchoBackend;
use server::ServeConfig;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

fn cfg(max_sessions: usize, max_queue: usize) -> ServeConfig {
    ServeConfig {
        max_sessions,
        max_queue,
        ..ServeConfig::default()
    }
}

fn tiny_backend() -> Arc<RuntimeBackend> {
    let engine = tiny_engine();
    Arc::new(RuntimeBackend::new(
        engine,
        BackendInfo {
            lm_model_file: "model.safetensors".into(),
            mimi_model_file: "mimi".into(),
            instance_name: "faults".into(),
        },
    ))
}

/// All `--max-sessions` slots busy at once on the real tiny model, one more client queued and one
/// refused: every admitted conversation gets its audio, the queued one is admitted when a slot
/// frees, and every slot is released at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_slot_busy_on_the_tiny_model() {
    let slots = 3;
    let srv = start(cfg(slots, 1), tiny_backend()).await;
    let mut clients = Vec::new();
    for _ in 0..slots {
        let mut ws = connect(&srv.url("")).await;
        expect_ready(&mut ws).await;
        clients.push(ws);
    }
    assert_eq!(srv.metrics.sessions_active.load(Relaxed), slots as u64);
    // One waits, one is refused with an error message.
    let mut waiting = connect(&srv.url("")).await;
    assert_eq!(
        next_bin(&mut waiting, Duration::from_secs(5))
            .await
            .unwrap()[0],
        4
    );
    assert!(eventually(5, || srv.metrics.sessions_waiting.load(Relaxed) == 1).await);
    let mut refused = connect(&srv.url("")).await;
    assert_eq!(
        next_bin(&mut refused, Duration::from_secs(5))
            .await
            .unwrap()[0],
        4
    );
    assert_eq!(
        next_bin(&mut refused, Duration::from_secs(5))
            .await
            .unwrap()[0],
        5
    );
    let frames = 40;
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, ws)| {
            tokio::spawn(converse(
                ws,
                frames,
                Duration::from_millis(80),
                i % 2 == 0,
                Duration::from_millis(800),
            ))
        })
        .collect();
    for t in tasks {
        let r = tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .expect("conversation finished")
            .unwrap();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert!(
            r.audio_messages >= frames / 2,
            "{} audio messages for {frames} frames",
            r.audio_messages
        );
        let (pcm, _) = decode_all(&r.audio_bytes);
        assert!(pcm.iter().all(|x| x.is_finite()));
    }
    // The queued client gets a slot as soon as one frees.
    let h = next_bin(&mut waiting, Duration::from_secs(15))
        .await
        .expect("queued client admitted");
    assert_eq!(h, vec![0u8; 9]);
    drop(waiting);
    assert!(eventually(10, || srv.metrics.sessions_active.load(Relaxed) == 0).await);
    assert_eq!(srv.metrics.sessions_rejected.load(Relaxed), 1);
    srv.shutdown().await.unwrap();
}

/// Resident set size of this process (server and clients), bytes.
fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Test backend whose sessions talk without listening: `frames` frames, each with 80 ms of audio
/// and `text_bytes` of text, produced as fast as the server takes them (input is ignored).
struct Chatty {
    frames: u64,
    text_bytes: usize,
    produced: Arc<AtomicU64>,
}

struct NullInput;
impl AudioInput for NullInput {
    fn push(&mut self, _pcm: &[f32]) -> InputReport {
        InputReport::default()
    }
}

struct ChattyEvents {
    left: u64,
    text: String,
    produced: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}
impl EventSource for ChattyEvents {
    fn recv(&mut self) -> Option<BackendEvent> {
        if self.left == 0 {
            // Done talking: wait for the stop request like an idle session.
            while !self.stop.load(Relaxed) {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        if self.stop.load(Relaxed) {
            return None;
        }
        self.left -= 1;
        self.produced.fetch_add(1, Relaxed);
        Some(BackendEvent::Frame(FrameOut {
            pcm: vec![0.0; 1920],
            text: self.text.clone(),
            step_us: 100,
            queued: 0,
        }))
    }
}

struct ChattyStop(Arc<AtomicBool>);
impl Stopper for ChattyStop {
    fn stop(&mut self) {
        self.0.store(true, Relaxed);
    }
}

impl Backend for Chatty {
    fn info(&self) -> BackendInfo {
        BackendInfo::default()
    }
    fn open(&self, _params: &SessionParams) -> Result<OpenSession, BackendError> {
        let stop = Arc::new(AtomicBool::new(false));
        Ok(OpenSession {
            input: Box::new(NullInput),
            events: Box::new(ChattyEvents {
                left: self.frames,
                text: "x".repeat(self.text_bytes),
                produced: self.produced.clone(),
                stop: stop.clone(),
            }),
            stopper: Box::new(ChattyStop(stop)),
        })
    }
}

/// A WebSocket client whose socket receive buffer is 4 KiB.
async fn stalled_connect(srv: &Running) -> tokio_tungstenite::WebSocketStream<TcpStream> {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let tcp = sock.connect(srv.addr).await.unwrap();
    let (mut ws, _) = tokio_tungstenite::client_async(srv.url(""), tcp)
        .await
        .unwrap();
    // Read up to the handshake, then never again.
    loop {
        match ws.next().await {
            Some(Ok(Message::Binary(b))) if b.first() == Some(&0) => return ws,
            Some(Ok(_)) => {}
            other => panic!("no handshake: {other:?}"),
        }
    }
}

/// A client that never reads while its session produces ~62 MiB of output (1,000 frames with
/// 64 KiB of text each): the server's per-client outgoing queue stays bounded (excess messages
/// dropped and counted), the process's memory does not grow with the output, the session is
/// released when the client goes away, and a shutdown with a stalled client still connected
/// completes promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_that_stops_reading_is_bounded() {
    let frames = 1000u64;
    let text_bytes = 64 << 10;
    let produced = Arc::new(AtomicU64::new(0));
    let backend = Chatty {
        frames,
        text_bytes,
        produced: produced.clone(),
    };
    let srv = start(cfg(2, 0), Arc::new(backend)).await;
    let rss0 = rss();
    let stalled = stalled_connect(&srv).await;
    let t = Instant::now();
    assert!(
        eventually(30, || produced.load(Relaxed) == frames).await,
        "only {} frames produced",
        produced.load(Relaxed)
    );
    // Let the output thread finish handing the last frames to the queue.
    assert!(
        eventually(10, || {
            let m = &srv.metrics;
            m.messages_dropped.load(Relaxed)
                + m.audio_messages_out.load(Relaxed)
                + m.text_messages_out.load(Relaxed)
                >= 2 * frames
        })
        .await
    );
    let dropped = srv.metrics.messages_dropped.load(Relaxed);
    let queued_or_sent =
        srv.metrics.audio_messages_out.load(Relaxed) + srv.metrics.text_messages_out.load(Relaxed);
    let growth = rss().saturating_sub(rss0);
    eprintln!(
        "stalled client: {frames} frames ({} MiB of text) in {:?}; {queued_or_sent} messages \
         queued/sent, {dropped} dropped; rss growth {} KiB",
        (frames as usize * text_bytes) >> 20,
        t.elapsed(),
        growth >> 10
    );
    // The kernel's socket buffers take a few MiB; everything beyond the 64-message queue is dropped.
    assert!(
        dropped >= frames,
        "{dropped} of {} messages dropped",
        2 * frames
    );
    assert!(growth < 32 << 20, "rss grew by {growth} bytes");
    assert_eq!(srv.metrics.sessions_active.load(Relaxed), 1);

    // Dropping the stalled client frees its slot.
    drop(stalled);
    assert!(eventually(10, || srv.metrics.sessions_active.load(Relaxed) == 0).await);

    // A new stalled client still connected at shutdown does not hold the server.
    let stalled2 = stalled_connect(&srv).await;
    assert!(eventually(10, || produced.load(Relaxed) >= frames + 200).await);
    let metrics = srv.metrics.clone();
    let t = Instant::now();
    srv.shutdown().await.expect("clean shutdown");
    eprintln!("shutdown with a stalled client: {:?}", t.elapsed());
    // Typically 3 s (the writer's 2 s flush bound). `run_until` stops waiting for connection
    // tasks after 10 s, so >= 10 s means a task ignored the shutdown (as the close-frame send on a
    // full queue did before ca14ae0).
    assert!(t.elapsed() < Duration::from_secs(9), "{:?}", t.elapsed());
    assert_eq!(metrics.sessions_active.load(Relaxed), 0);
    assert_eq!(metrics.connections_open.load(Relaxed), 0);
    drop(stalled2);
}

/// 30 clients vanish at every stage (right after the upgrade, after metadata, after the
/// handshake, mid-Ogg-page, mid-conversation, while queued) against 2 slots: afterwards no slot,
/// waiting place or connection is left behind and a new client is served at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_churn_leaks_nothing() {
    let srv = start(cfg(2, 2), Arc::new(EchoBackend::default())).await;
    for round in 0..30usize {
        let mut ws = connect(&srv.url("")).await;
        match round % 6 {
            0 => {}
            1 => {
                let _ = next_bin(&mut ws, Duration::from_secs(5)).await;
            }
            2 => {
                expect_ready(&mut ws).await;
            }
            3 => {
                expect_ready(&mut ws).await;
                let mut enc = BrowserEncoder::new(round as u32);
                let bytes = enc.push(&tone(1920 * 2, 0, 250.0));
                let pages = split_pages(&bytes);
                for p in &pages[..2] {
                    send_bin(&mut ws, 1, p).await;
                }
                send_bin(&mut ws, 1, &pages[2][..pages[2].len() / 2]).await;
            }
            4 => {
                expect_ready(&mut ws).await;
                let mut enc = server::codec::OggOpusEncoder::new().unwrap();
                for i in 0..10 {
                    let mut b = Vec::new();
                    enc.push(&tone(1920, i * 1920, 250.0), &mut b).unwrap();
                    send_bin(&mut ws, 1, &b).await;
                }
                let _ = next_bin(&mut ws, Duration::from_secs(2)).await;
            }
            _ => {
                // Occupy both slots, then a third client waits and vanishes while queued.
                expect_ready(&mut ws).await;
                let mut other = connect(&srv.url("")).await;
                expect_ready(&mut other).await;
                let mut queued = connect(&srv.url("")).await;
                let _ = next_bin(&mut queued, Duration::from_secs(5)).await;
                assert!(
                    eventually(5, || srv.metrics.sessions_waiting.load(Relaxed) == 1).await,
                    "round {round}: not queued"
                );
                drop(queued);
                drop(other);
            }
        }
        drop(ws);
        assert!(
            eventually(10, || srv.metrics.sessions_active.load(Relaxed) == 0
                && srv.metrics.sessions_waiting.load(Relaxed) == 0)
            .await,
            "round {round}: slot or waiting place not released"
        );
    }
    assert!(
        eventually(10, || {
            srv.metrics.sessions_active.load(Relaxed) == 0
                && srv.metrics.sessions_waiting.load(Relaxed) == 0
                && srv.metrics.connections_open.load(Relaxed) == 0
        })
        .await,
        "left behind: active {}, waiting {}, connections {}",
        srv.metrics.sessions_active.load(Relaxed),
        srv.metrics.sessions_waiting.load(Relaxed),
        srv.metrics.connections_open.load(Relaxed)
    );
    // Both slots are free: two new clients are admitted immediately.
    let mut a = connect(&srv.url("")).await;
    expect_ready(&mut a).await;
    let mut b = connect(&srv.url("")).await;
    expect_ready(&mut b).await;
    drop((a, b));
    srv.shutdown().await.unwrap();
}

/// A bundle whose text head holds a NaN: the server loads it, and the client gets a kind-5 error
/// message and a close instead of audio or text sampled from garbage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nan_weights_reach_the_client_as_an_error() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/lm");
    let dir = std::env::temp_dir().join(format!("moshi-faults-nan-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        if !name.starts_with("trace") {
            std::fs::copy(e.path(), dir.join(&name)).unwrap();
        }
    }
    let file = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    let h = model::checkpoint::safetensors::parse(&bytes).unwrap();
    let t = h
        .tensors
        .iter()
        .find(|t| t.name == "text_linear.weight")
        .unwrap();
    bytes[t.offset..t.offset + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&file, bytes).unwrap();
    let engine = runtime::Engine::open(&dir, runtime::EngineOptions::default()).expect("loads");
    std::fs::remove_dir_all(&dir).ok();
    let backend = Arc::new(RuntimeBackend::new(engine, BackendInfo::default()));
    let srv = start(cfg(1, 0), backend).await;
    let mut ws = connect(&srv.url("")).await;
    expect_ready(&mut ws).await;
    let r = converse(
        ws,
        5,
        Duration::from_millis(20),
        false,
        Duration::from_millis(1500),
    )
    .await;
    assert_eq!(r.audio_messages, 0);
    assert_eq!(r.text_messages, 0);
    assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
    assert!(r.errors[0].contains("not finite"), "{:?}", r.errors);
    assert!(r.closed);
    assert!(eventually(10, || srv.metrics.sessions_active.load(Relaxed) == 0).await);
    srv.shutdown().await.unwrap();
}
