//! Load and fault tests on loopback, bounded in count and time: every slot busy at once on the
//! tiny real model, a client that stops reading (bounded outgoing queue, drops counted, other
//! sessions unaffected, shutdown not held up), and connection churn (clients vanishing at every
//! stage of a conversation). SIGTERM to a real `moshi-native serve` process is in
//! `crates/cli/tests/serve_sigterm.rs` (it needs the binary).

mod common;

use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use futures_util::{SinkExt, StreamExt};
use server::backend::{BackendInfo, RuntimeBackend};
use server::testing::EchoBackend;
use server::ServeConfig;
use tokio_tungstenite::tungstenite::Message;

fn cfg(max_sessions: usize, max_queue: usize) -> ServeConfig {
    ServeConfig {
        max_sessions,
        max_queue,
        ..ServeConfig::default()
    }
}

fn tiny_backend() -> Arc<RuntimeBackend> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/lm");
    let engine =
        runtime::Engine::open(&dir, runtime::EngineOptions::default()).expect("tiny bundle");
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

/// A WebSocket client whose socket receive buffer is 4 KiB.
async fn stalled_connect(
    srv: &Running,
) -> tokio_tungstenite::WebSocketStream<tokio::net::TcpStream> {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let tcp = sock.connect(srv.addr).await.unwrap();
    let (ws, _) = tokio_tungstenite::client_async(srv.url(""), tcp)
        .await
        .unwrap();
    ws
}

/// A client that streams audio as fast as it can and never reads a byte (4 KiB socket receive
/// buffer): the server's per-client outgoing queue stays bounded (excess messages dropped and
/// counted), a second client keeps its real-time conversation, the stalled client's session is
/// released when it goes away, and a shutdown with a stalled client still connected completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_that_stops_reading_is_bounded() {
    let echo = EchoBackend {
        step_time: Duration::from_micros(500),
        max_queued_frames: 4,
        text_every: 1,
    };
    let srv = start(cfg(2, 0), Arc::new(echo)).await;
    let rss0 = rss();

    let mut stalled = stalled_connect(&srv).await;
    // Read only up to the handshake, then never again.
    loop {
        match stalled.next().await {
            Some(Ok(Message::Binary(b))) if b.first() == Some(&0) => break,
            Some(Ok(_)) => {}
            other => panic!("no handshake: {other:?}"),
        }
    }
    // A well-behaved client on the other slot.
    let mut good = connect(&srv.url("")).await;
    expect_ready(&mut good).await;
    let good_task = tokio::spawn(converse(
        good,
        40,
        Duration::from_millis(80),
        false,
        Duration::from_millis(500),
    ));

    // 2,000 frames (160 s of audio) in ~4 s, all echoed back into a socket nobody reads.
    let mut enc = server::codec::OggOpusEncoder::new().unwrap();
    let start_t = Instant::now();
    for i in 0..2000usize {
        let mut m = vec![1u8];
        enc.push(&tone(1920, i * 1920, 300.0), &mut m).unwrap();
        if stalled.send(Message::Binary(m.into())).await.is_err() {
            panic!("server stopped reading the stalled client's input at frame {i}");
        }
        if i % 8 == 7 {
            tokio::time::sleep(Duration::from_millis(16)).await;
        }
    }
    let elapsed = start_t.elapsed();
    assert!(
        eventually(10, || srv.metrics.messages_dropped.load(Relaxed) > 0).await,
        "outgoing queue never overflowed (processed {})",
        srv.metrics.frames_processed.load(Relaxed)
    );
    let dropped = srv.metrics.messages_dropped.load(Relaxed);
    let sent =
        srv.metrics.audio_messages_out.load(Relaxed) + srv.metrics.text_messages_out.load(Relaxed);
    eprintln!(
        "stalled client: 2000 frames in {elapsed:?}; {sent} messages queued/sent, {dropped} dropped, \
         {} frames processed, rss growth {} KiB",
        srv.metrics.frames_processed.load(Relaxed),
        rss().saturating_sub(rss0) / 1024
    );
    // Far fewer messages than produced ever got past the bounded queue.
    assert!(dropped > 1000, "{dropped} dropped");
    assert!(
        rss().saturating_sub(rss0) < 64 << 20,
        "rss grew by {} bytes",
        rss().saturating_sub(rss0)
    );

    // The real-time client was not starved by its stalled neighbour.
    let r = tokio::time::timeout(Duration::from_secs(30), good_task)
        .await
        .unwrap()
        .unwrap();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert!(
        r.audio_messages >= 30,
        "{} audio messages",
        r.audio_messages
    );

    // Dropping the stalled client frees its slot.
    drop(stalled);
    assert!(eventually(10, || srv.metrics.sessions_active.load(Relaxed) == 0).await);

    // A new stalled client still connected at shutdown does not hold the server.
    let mut stalled2 = stalled_connect(&srv).await;
    let _ = stalled2.next().await;
    let mut enc = server::codec::OggOpusEncoder::new().unwrap();
    for i in 0..400usize {
        let mut m = vec![1u8];
        enc.push(&tone(1920, i * 1920, 300.0), &mut m).unwrap();
        let _ = stalled2.send(Message::Binary(m.into())).await;
    }
    let metrics = srv.metrics.clone();
    let t = Instant::now();
    srv.shutdown().await.expect("clean shutdown");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
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
