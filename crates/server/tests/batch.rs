//! `RuntimeBackend::batch`: concurrent conversations share one batched runner and each gets exactly the
//! frames it gets from its own unbatched session (same input, same seeds), over real WebSockets and Opus.

mod common;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use server::backend::RuntimeBackend;
use server::ServeConfig;

fn backend(batch: usize) -> Arc<RuntimeBackend> {
    let mut b = tiny_backend("test");
    b.batch = batch;
    // Room for the whole input: no frame may be dropped, or the runs could not be compared.
    b.max_queued_frames = 64;
    Arc::new(b)
}

const FRAMES: usize = 30;

/// Two concurrent conversations with different seeds; returns (decoded PCM, text) of each.
async fn two_conversations(backend: Arc<RuntimeBackend>) -> Vec<(Vec<f32>, String)> {
    let srv = start(
        ServeConfig {
            max_sessions: 2,
            max_queue: 0,
            ..ServeConfig::default()
        },
        backend,
    )
    .await;
    let q = |seed: u64| {
        format!(
            "?text_temperature=0.7&text_topk=25&audio_temperature=0.8&audio_topk=250&pad_mult=0\
             &repetition_penalty_context=64&repetition_penalty=1.0&text_seed={seed}&audio_seed={}",
            seed + 1
        )
    };
    let mut a = connect(&srv.url(&q(1))).await;
    let mut b = connect(&srv.url(&q(7))).await;
    expect_ready(&mut a).await;
    expect_ready(&mut b).await;
    let pace = Duration::from_millis(40);
    let tail = Duration::from_millis(1500);
    let (ra, rb) = tokio::join!(
        converse(a, FRAMES, pace, true, tail),
        converse(b, FRAMES, pace, false, tail)
    );
    assert_eq!(srv.metrics.frames_dropped.load(Relaxed), 0);
    let mut out = Vec::new();
    for r in [ra, rb] {
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        let (pcm, _) = decode_all(&r.audio_bytes);
        out.push((pcm, r.text));
    }
    assert!(eventually(5, || srv.metrics.sessions_active.load(Relaxed) == 0).await);
    srv.shutdown().await.unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_conversations_in_one_batch_get_their_own_frames() {
    let batched = backend(2);
    let got = two_conversations(batched.clone()).await;
    assert_eq!(
        batched.batch_runners(),
        1,
        "both conversations in one runner"
    );
    let want = two_conversations(backend(1)).await;
    for (i, ((gp, gt), (wp, wt))) in got.iter().zip(&want).enumerate() {
        // Every input frame but the last partial Opus page was processed: frame 0 gives no audio.
        assert!(
            gp.len() >= (FRAMES - 3) * 1920,
            "conversation {i}: {} samples",
            gp.len()
        );
        assert_eq!(gp.len(), wp.len(), "conversation {i}: output length");
        let d = testkit::compare::max_abs_diff(gp, wp);
        assert!(d <= 1e-4, "conversation {i}: pcm differs by {d}");
        assert_eq!(gt, wt, "conversation {i}: text");
    }
    assert_ne!(
        got[0].0, got[1].0,
        "different seeds, different conversations"
    );
}
