//! Load and fault tests on loopback, bounded in count and time: every slot busy at once on the
//! tiny real model and connection churn (clients vanishing at every stage of a conversation). The
//! client that stops reading is in `stalled_client.rs` (alone in its binary: it measures the
//! process's memory). SIGTERM to a real `moshi-native serve` process is in
//! `crates/cli/tests/serve_sigterm.rs` (it needs the binary).

mod common;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use server::backend::{BackendInfo, RuntimeBackend};

/// All `--max-sessions` slots busy at once on the real tiny model, one more client queued and one
/// refused: every admitted conversation gets its audio, the queued one is admitted when a slot
/// frees, and every slot is released at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_slot_busy_on_the_tiny_model() {
    let slots = 3;
    let srv = start(cfg(slots, 1), Arc::new(tiny_backend("faults"))).await;
    let mut clients = Vec::new();
    for _ in 0..slots {
        let ws = ready(&srv, "").await;
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
    let mut audio_total = 0;
    for t in tasks {
        let r = tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .expect("conversation finished")
            .unwrap();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        // One audio message per processed frame, except the first step (no output yet).
        assert!(
            r.audio_messages < frames,
            "{} audio messages for {frames} frames",
            r.audio_messages
        );
        audio_total += r.audio_messages;
        let (pcm, _) = decode_all(&r.audio_bytes);
        assert!(pcm.iter().all(|x| x.is_finite()));
    }
    // Every input frame was either answered or dropped by the input queue (and counted): measured
    // 39 of 40 per client, none dropped.
    let dropped = srv.metrics.frames_dropped.load(Relaxed) as usize;
    assert_eq!(
        audio_total + dropped,
        slots * (frames - 1),
        "{audio_total} audio messages, {dropped} input frames dropped"
    );
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

/// 30 clients vanish at every stage (right after the upgrade, after metadata, after the
/// handshake, mid-Ogg-page, mid-conversation, while queued) against 2 slots: afterwards no slot,
/// waiting place or connection is left behind and a new client is served at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_churn_leaks_nothing() {
    let srv = start_echo(2, 2).await;
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
                let other = ready(&srv, "").await;
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
    let a = ready(&srv, "").await;
    let b = ready(&srv, "").await;
    drop((a, b));
    srv.shutdown().await.unwrap();
}

/// A bundle whose text head holds a NaN: the server loads it, and the client gets a kind-5 error
/// message and a close instead of audio or text sampled from garbage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nan_weights_reach_the_client_as_an_error() {
    let dir = testkit::lm_bundle_copy("faults-nan");
    testkit::poke_f32(
        &dir.join("model.safetensors"),
        "text_linear.weight",
        0,
        f32::NAN,
    );
    let engine = runtime::Engine::open(&dir, runtime::EngineOptions::default()).expect("loads");
    drop(dir);
    let backend = Arc::new(RuntimeBackend::new(engine, BackendInfo::default()));
    let srv = start(cfg(1, 0), backend).await;
    let ws = ready(&srv, "").await;
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
