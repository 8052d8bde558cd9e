//! End-to-end tests on the real runtime with the oracle's tiny Moshi bundle (`fixtures/lm`: exact
//! architecture, random weights): real WebSocket client, real Opus both ways.

mod common;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_conversation_on_tiny_model() {
    let srv = start(cfg(2, 2), Arc::new(tiny_backend("test"))).await;
    let mut ws = connect(&srv.url("?text_temperature=0.7&text_topk=25&audio_temperature=0.8&audio_topk=250&pad_mult=0&repetition_penalty_context=64&repetition_penalty=1.0&text_seed=1&audio_seed=2")).await;
    let meta = expect_ready(&mut ws).await;
    assert_eq!(meta["instance_name"], "test");
    let frames = 120;
    let r = converse(
        ws,
        frames,
        Duration::from_millis(80),
        true,
        Duration::from_millis(1500),
    )
    .await;
    let (pcm, packets) = decode_all(&r.audio_bytes);
    let processed = srv.metrics.frames_processed.load(Relaxed) as usize;
    let dropped = srv.metrics.frames_dropped.load(Relaxed) as usize;
    // Frame 0 returns nothing (LMGen call 0); every other processed frame returns 1920 samples.
    assert!(
        processed + dropped >= frames - 1,
        "{processed} processed + {dropped} dropped"
    );
    assert!(processed >= 100, "{processed} frames processed");
    assert_eq!(
        packets,
        2 * (processed - 1),
        "two 960-sample packets per output frame"
    );
    assert_eq!(pcm.len(), packets * 960);
    assert!(pcm.iter().all(|x| x.is_finite()));
    assert!(r.text_messages > 0, "the tiny model produced some text");
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert!(eventually(5, || srv.metrics.sessions_active.load(Relaxed) == 0).await);
    srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_and_disconnect_on_tiny_model() {
    let srv = start(cfg(1, 1), Arc::new(tiny_backend("test"))).await;
    let mut a = ready(&srv, "").await;
    // A streams a little, then vanishes in the middle of an Ogg page.
    let mut enc = BrowserEncoder::new(3);
    let bytes = enc.push(&tone(1920 * 6, 0, 220.0));
    let pages = split_pages(&bytes);
    for p in &pages[..pages.len() - 1] {
        assert!(send_bin(&mut a, 1, p).await);
    }
    let last = pages[pages.len() - 1];
    assert!(send_bin(&mut a, 1, &last[..last.len() / 2]).await);
    // B waits, C is refused.
    let mut b = connect(&srv.url("")).await;
    assert_eq!(
        next_bin(&mut b, Duration::from_secs(5)).await.unwrap()[0],
        4
    );
    assert!(eventually(5, || srv.metrics.sessions_waiting.load(Relaxed) == 1).await);
    let mut c = connect(&srv.url("")).await;
    assert_eq!(
        next_bin(&mut c, Duration::from_secs(5)).await.unwrap()[0],
        4
    );
    assert_eq!(
        next_bin(&mut c, Duration::from_secs(5)).await.unwrap()[0],
        5
    );
    drop(a);
    let h = next_bin(&mut b, Duration::from_secs(15))
        .await
        .expect("B admitted");
    assert_eq!(h, vec![0u8; 9]);
    let r = converse(
        b,
        20,
        Duration::from_millis(80),
        false,
        Duration::from_millis(800),
    )
    .await;
    assert!(r.audio_messages > 5, "{}", r.audio_messages);
    assert!(eventually(5, || srv.metrics.sessions_active.load(Relaxed) == 0).await);
    srv.shutdown().await.unwrap();
}

/// Value of the exposition line `name` (labels included) in a `/metrics` body.
fn metric(body: &str, name: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no `{name}` in /metrics:\n{body}"))
}

/// `/metrics` after a conversation: the frame-pass, per-phase and lag histograms each counted every
/// processed frame exactly once, their buckets are cumulative up to the count, and the lag (arrival to
/// answer) is never shorter than the pass it contains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_histograms_count_every_frame() {
    let srv = start(cfg(1, 1), Arc::new(tiny_backend("test"))).await;
    let ws = connect(&srv.url("")).await;
    let mut ws = ws;
    expect_ready(&mut ws).await;
    let r = converse(
        ws,
        12,
        Duration::from_millis(20),
        true,
        Duration::from_millis(800),
    )
    .await;
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert!(eventually(5, || srv.metrics.sessions_active.load(Relaxed) == 0).await);
    let (status, body) = http_get(srv.addr, "/metrics").await;
    assert_eq!(status, 200);
    let processed = metric(&body, "moshi_frames_processed_total");
    assert!(processed >= 5.0, "{processed} frames processed");
    let histograms = [
        ("moshi_step_seconds", ""),
        ("moshi_phase_seconds", "phase=\"encode\""),
        ("moshi_phase_seconds", "phase=\"lm\""),
        ("moshi_phase_seconds", "phase=\"decode\""),
        ("moshi_frame_lag_seconds", ""),
    ];
    for (name, labels) in histograms {
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let sep = if labels.is_empty() { "" } else { "," };
        let count = metric(&body, &format!("{name}_count{braces}"));
        assert_eq!(count, processed, "{name}{braces}");
        let inf = metric(&body, &format!("{name}_bucket{{{labels}{sep}le=\"+Inf\"}}"));
        assert_eq!(inf, count, "{name}{braces}");
        let buckets: Vec<f64> = body
            .lines()
            .filter(|l| l.starts_with(&format!("{name}_bucket{{{labels}")))
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
            .collect();
        assert!(
            buckets.windows(2).all(|w| w[0] <= w[1]),
            "{name}: {buckets:?}"
        );
    }
    let step_sum = metric(&body, "moshi_step_seconds_sum");
    let lag_sum = metric(&body, "moshi_frame_lag_seconds_sum");
    assert!(step_sum > 0.0);
    assert!(lag_sum >= step_sum, "lag {lag_sum} < pass {step_sum}");
    let phases: f64 = ["encode", "lm", "decode"]
        .iter()
        .map(|p| metric(&body, &format!("moshi_phase_seconds_sum{{phase=\"{p}\"}}")))
        .sum();
    // The pass is the sum of its phases, each rounded down to whole µs (so at most 2 µs per frame
    // apart; the f64 sums add their own rounding, far below that).
    assert!(
        (phases - step_sum).abs() <= 3e-6 * processed,
        "phases {phases} vs pass {step_sum}"
    );
    srv.shutdown().await.unwrap();
}
